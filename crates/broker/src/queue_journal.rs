//! Persisted session queues and outbound inflight state: one append-only journal of small
//! records (`<data_dir>/queues/queues.qj`) instead of one sled entry per queued or inflight
//! message.
//!
//! A message queued for a persistent session is a position in the log; the journal records
//! the positions: a publish to N offline sessions is one log record plus N 30-byte journal
//! records written sequentially, and a delivered message one removal. A QoS 1/2 delivery in
//! flight is one 24-byte record (packet id, queue seq, stage) and its acknowledgement one
//! 15-byte removal. Nothing per queued message is kept in memory here (the sessions hold
//! their queues); the packet ids in flight are (bounded by the sessions' windows).
//!
//! # Format
//!
//! Frames: `len u32 | crc32c u32 (of the payload) | payload`, all integers big-endian.
//! Payloads:
//!
//! | tag | fields | meaning |
//! |---|---|---|
//! | 1 | id u32, client id bytes | the session `client id` is called `id` from here on |
//! | 2 | id u32, seq u64, offset u64, flags u8 (QoS in bits 0-1, retain bit 2) | queue entry `seq` refers to log `offset` |
//! | 3 | id u32, seq u64 | queue entry `seq` is gone (delivered, dropped) |
//! | 4 | id u32 | every queue entry and inflight record of the session is gone (session ended) |
//! | 5 | id u32, pid u16, seq u64, stage u8 | packet id `pid` carries queue entry `seq` at `stage` (1 PUBLISH sent, 2 PUBREL sent) |
//! | 6 | id u32, pid u16 | packet id `pid` is free again |
//!
//! # Invariants
//!
//! - Records are applied in the order they were appended; replaying the file gives the live
//!   entries of every session, in seq order.
//! - A frame that does not check (torn tail after a crash) ends the journal: the file is cut
//!   there at open. Whatever was written in the frames before is kept.
//! - [`QueueJournal::commit`] writes the batch (and fsyncs it when asked) before the caller
//!   makes anything that depends on it durable in sled (the `b_routed` markers and the index
//!   watermark): a queue entry is never missing while the marker that says "routed" is there.
//! - Compaction rewrites the live entries into a new file, fsyncs it and renames it over the
//!   old one (then fsyncs the directory): a crash leaves either file whole.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const FILE: &str = "queues.qj";
const TMP: &str = "queues.qj.tmp";
const TAG_NAME: u8 = 1;
const TAG_PUSH: u8 = 2;
const TAG_REMOVE: u8 = 3;
const TAG_DROP: u8 = 4;
const TAG_INFLIGHT: u8 = 5;
const TAG_INFLIGHT_FREE: u8 = 6;
/// Longest payload accepted when reading (a client id is at most 65,535 bytes).
const PAYLOAD_MAX: usize = 70_000;
/// The journal is rewritten when it is larger than this and than four times its live size.
const COMPACT_MIN_BYTES: u64 = 64 << 20;
/// Bytes of a push frame (8 framing + 22 payload).
const PUSH_FRAME: u64 = 30;

/// One live queue entry found at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalEntry {
    pub seq: u64,
    pub offset: u64,
    pub qos: u8,
    pub retain: bool,
}

/// Live entries by client id, each in seq order.
pub type Queues = HashMap<String, Vec<JournalEntry>>;

/// Inflight records by client id: (packet id, seq, stage), in packet id order.
pub type Inflights = HashMap<String, Vec<(u16, u64, u8)>>;

pub struct QueueJournal {
    dir: PathBuf,
    file: BufWriter<File>,
    /// Bytes in the file (what was written, committed or not).
    len: u64,
    ids: HashMap<Arc<str>, u32>,
    next_id: u32,
    /// Live entries: pushes minus removals (a removal of an entry that is not there would
    /// make it low; the next rewrite makes it exact again).
    live: i64,
    /// Live entries per session id (so a dropped session's entries leave `live`).
    counts: HashMap<u32, i64>,
    /// Packet ids in flight per session id (exact: a stage change replaces its record).
    inflight: HashMap<u32, std::collections::HashSet<u16>>,
    fsync: bool,
    dirty: bool,
}

impl std::fmt::Debug for QueueJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueJournal")
            .field("dir", &self.dir)
            .field("len", &self.len)
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
}

fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(0..4)?.try_into().ok()?))
}
fn be64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(0..8)?.try_into().ok()?))
}

/// The state replayed from a journal file.
#[derive(Default)]
struct Replayed {
    names: HashMap<u32, String>,
    queues: HashMap<u32, BTreeMap<u64, (u64, u8)>>,
    inflight: HashMap<u32, BTreeMap<u16, (u64, u8)>>,
    /// Bytes of whole, valid frames.
    good_len: u64,
}

fn replay(path: &Path) -> io::Result<Replayed> {
    let mut r = Replayed::default();
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(r),
        Err(e) => return Err(e),
    };
    let mut rd = BufReader::with_capacity(1 << 20, f);
    let mut head = [0u8; 8];
    let mut payload = Vec::new();
    loop {
        if rd.read_exact(&mut head).is_err() {
            break;
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 || len > PAYLOAD_MAX {
            break;
        }
        payload.resize(len, 0);
        if rd.read_exact(&mut payload).is_err() || crc32c::crc32c(&payload) != crc {
            break;
        }
        if !apply(&mut r, &payload) {
            break;
        }
        r.good_len += 8 + len as u64;
    }
    Ok(r)
}

/// Apply one payload; false if it does not decode (treated like a torn frame).
fn apply(r: &mut Replayed, p: &[u8]) -> bool {
    let (Some(&tag), Some(id)) = (p.first(), p.get(1..).and_then(be32)) else {
        return false;
    };
    match tag {
        TAG_NAME => match std::str::from_utf8(&p[5..]) {
            Ok(s) => {
                r.names.insert(id, s.to_string());
            }
            Err(_) => return false,
        },
        TAG_PUSH => {
            let (Some(seq), Some(offset), Some(&flags)) = (
                p.get(5..).and_then(be64),
                p.get(13..).and_then(be64),
                p.get(21),
            ) else {
                return false;
            };
            r.queues.entry(id).or_default().insert(seq, (offset, flags));
        }
        TAG_REMOVE => {
            let Some(seq) = p.get(5..).and_then(be64) else {
                return false;
            };
            if let Some(q) = r.queues.get_mut(&id) {
                q.remove(&seq);
            }
        }
        TAG_DROP => {
            r.queues.remove(&id);
            r.inflight.remove(&id);
        }
        TAG_INFLIGHT => {
            let (Some(pid), Some(seq), Some(&stage)) = (
                p.get(5..7).map(|b| u16::from_be_bytes([b[0], b[1]])),
                p.get(7..).and_then(be64),
                p.get(15),
            ) else {
                return false;
            };
            r.inflight.entry(id).or_default().insert(pid, (seq, stage));
        }
        TAG_INFLIGHT_FREE => {
            let Some(pid) = p.get(5..7).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                return false;
            };
            if let Some(m) = r.inflight.get_mut(&id) {
                m.remove(&pid);
            }
        }
        _ => return false,
    }
    true
}

fn push_payload(id: u32, seq: u64, offset: u64, flags: u8) -> [u8; 22] {
    let mut p = [0u8; 22];
    p[0] = TAG_PUSH;
    p[1..5].copy_from_slice(&id.to_be_bytes());
    p[5..13].copy_from_slice(&seq.to_be_bytes());
    p[13..21].copy_from_slice(&offset.to_be_bytes());
    p[21] = flags;
    p
}

fn inflight_payload(id: u32, pid: u16, seq: u64, stage: u8) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[0] = TAG_INFLIGHT;
    p[1..5].copy_from_slice(&id.to_be_bytes());
    p[5..7].copy_from_slice(&pid.to_be_bytes());
    p[7..15].copy_from_slice(&seq.to_be_bytes());
    p[15] = stage;
    p
}

fn name_payload(id: u32, client: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + client.len());
    p.push(TAG_NAME);
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(client.as_bytes());
    p
}

impl QueueJournal {
    /// Open (or create) the journal in `dir`; returns it with every live entry and inflight
    /// record. A torn tail is cut. `fsync`: [`QueueJournal::commit`] fsyncs.
    pub fn open(dir: &Path, fsync: bool) -> io::Result<(QueueJournal, Queues, Inflights)> {
        std::fs::create_dir_all(dir)?;
        let _ = std::fs::remove_file(dir.join(TMP));
        let path = dir.join(FILE);
        let r = replay(&path)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let on_disk = file.metadata()?.len();
        if on_disk > r.good_len {
            tracing::warn!(
                path = %path.display(),
                bytes_cut = on_disk - r.good_len,
                "session queue journal: torn tail cut"
            );
            file.set_len(r.good_len)?;
            file.sync_all()?;
        }
        let mut file = file;
        io::Seek::seek(&mut file, io::SeekFrom::Start(r.good_len))?;
        let mut queues = Queues::new();
        let mut live = 0i64;
        let mut counts = HashMap::new();
        for (id, q) in &r.queues {
            let Some(name) = r.names.get(id) else {
                continue;
            };
            if q.is_empty() {
                continue;
            }
            live += q.len() as i64;
            counts.insert(*id, q.len() as i64);
            queues.insert(
                name.clone(),
                q.iter()
                    .map(|(&seq, &(offset, flags))| JournalEntry {
                        seq,
                        offset,
                        qos: flags & 3,
                        retain: flags & 4 != 0,
                    })
                    .collect(),
            );
        }
        let mut inflights = Inflights::new();
        let mut inflight = HashMap::new();
        for (id, m) in &r.inflight {
            let Some(name) = r.names.get(id) else {
                continue;
            };
            if m.is_empty() {
                continue;
            }
            live += m.len() as i64;
            inflight.insert(*id, m.keys().copied().collect());
            inflights.insert(
                name.clone(),
                m.iter()
                    .map(|(&pid, &(seq, stage))| (pid, seq, stage))
                    .collect(),
            );
        }
        let ids: HashMap<Arc<str>, u32> = r
            .names
            .iter()
            .map(|(&id, n)| (Arc::from(n.as_str()), id))
            .collect();
        let next_id = r.names.keys().max().map_or(0, |m| m + 1);
        Ok((
            QueueJournal {
                dir: dir.to_path_buf(),
                file: BufWriter::with_capacity(256 << 10, file),
                len: r.good_len,
                ids,
                next_id,
                live,
                counts,
                inflight,
                fsync,
                dirty: false,
            },
            queues,
            inflights,
        ))
    }

    fn write(&mut self, payload: &[u8]) -> io::Result<()> {
        let mut f = Vec::with_capacity(8 + payload.len());
        frame(&mut f, payload);
        self.file.write_all(&f)?;
        self.len += f.len() as u64;
        self.dirty = true;
        Ok(())
    }

    /// The session's journal id (a name record is written the first time).
    fn id(&mut self, client: &Arc<str>) -> io::Result<u32> {
        if let Some(&id) = self.ids.get(client) {
            return Ok(id);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.write(&name_payload(id, client))?;
        self.ids.insert(client.clone(), id);
        Ok(id)
    }

    pub fn push(
        &mut self,
        client: &Arc<str>,
        seq: u64,
        offset: u64,
        qos: u8,
        retain: bool,
    ) -> io::Result<()> {
        let id = self.id(client)?;
        let flags = (qos & 3) | if retain { 4 } else { 0 };
        self.write(&push_payload(id, seq, offset, flags))?;
        self.live += 1;
        *self.counts.entry(id).or_default() += 1;
        Ok(())
    }

    pub fn remove(&mut self, client: &Arc<str>, seq: u64) -> io::Result<()> {
        let Some(&id) = self.ids.get(client) else {
            return Ok(());
        };
        let mut p = [0u8; 13];
        p[0] = TAG_REMOVE;
        p[1..5].copy_from_slice(&id.to_be_bytes());
        p[5..13].copy_from_slice(&seq.to_be_bytes());
        self.write(&p)?;
        self.live -= 1;
        *self.counts.entry(id).or_default() -= 1;
        Ok(())
    }

    /// Every entry of the session is gone.
    pub fn drop_session(&mut self, client: &Arc<str>) -> io::Result<()> {
        let Some(&id) = self.ids.get(client) else {
            return Ok(());
        };
        let mut p = [0u8; 5];
        p[0] = TAG_DROP;
        p[1..5].copy_from_slice(&id.to_be_bytes());
        self.live -= self.counts.remove(&id).unwrap_or(0);
        self.live -= self.inflight.remove(&id).map_or(0, |s| s.len() as i64);
        self.write(&p)
    }

    /// Packet id `pid` of the session carries queue entry `seq` at `stage`.
    pub fn inflight_put(
        &mut self,
        client: &Arc<str>,
        pid: u16,
        seq: u64,
        stage: u8,
    ) -> io::Result<()> {
        let id = self.id(client)?;
        self.write(&inflight_payload(id, pid, seq, stage))?;
        if self.inflight.entry(id).or_default().insert(pid) {
            self.live += 1;
        }
        Ok(())
    }

    /// Packet id `pid` of the session is free again.
    pub fn inflight_free(&mut self, client: &Arc<str>, pid: u16) -> io::Result<()> {
        let Some(&id) = self.ids.get(client) else {
            return Ok(());
        };
        let mut p = [0u8; 7];
        p[0] = TAG_INFLIGHT_FREE;
        p[1..5].copy_from_slice(&id.to_be_bytes());
        p[5..7].copy_from_slice(&pid.to_be_bytes());
        self.write(&p)?;
        if let Some(set) = self.inflight.get_mut(&id) {
            if set.remove(&pid) {
                self.live -= 1;
            }
            if set.is_empty() {
                self.inflight.remove(&id);
            }
        }
        Ok(())
    }

    /// Write what was appended since the last commit (and fsync it if configured). Call
    /// before anything that depends on it becomes durable elsewhere.
    pub fn commit(&mut self) -> io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        self.file.flush()?;
        if self.fsync {
            self.file.get_ref().sync_data()?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rewrite the file with only the live entries when it has grown past
    /// [`COMPACT_MIN_BYTES`] and four times its live size. Blocking: reads the whole file.
    pub fn maybe_compact(&mut self) -> io::Result<bool> {
        let live_bytes = (self.live.max(0) as u64) * PUSH_FRAME;
        if self.len < COMPACT_MIN_BYTES || self.len < live_bytes.saturating_mul(4) {
            return Ok(false);
        }
        self.compact()?;
        Ok(true)
    }

    /// Rewrite the file with only the live entries (see the module invariants).
    pub fn compact(&mut self) -> io::Result<()> {
        self.commit()?;
        self.file.get_ref().sync_data()?;
        let path = self.dir.join(FILE);
        let r = replay(&path)?;
        let tmp = self.dir.join(TMP);
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let mut ids = HashMap::new();
        let mut counts = HashMap::new();
        let mut len = 0u64;
        let mut live = 0i64;
        let mut inflight = HashMap::new();
        let mut buf = Vec::with_capacity(64);
        let empty_q = BTreeMap::new();
        let empty_f = BTreeMap::new();
        let live_ids: std::collections::BTreeSet<u32> = r
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(id, _)| *id)
            .chain(
                r.inflight
                    .iter()
                    .filter(|(_, m)| !m.is_empty())
                    .map(|(id, _)| *id),
            )
            .collect();
        for id in live_ids {
            let Some(name) = r.names.get(&id) else {
                continue;
            };
            let q = r.queues.get(&id).unwrap_or(&empty_q);
            let f = r.inflight.get(&id).unwrap_or(&empty_f);
            buf.clear();
            frame(&mut buf, &name_payload(id, name));
            let pushes = q
                .iter()
                .map(|(&seq, &(offset, flags))| push_payload(id, seq, offset, flags).to_vec());
            let puts = f
                .iter()
                .map(|(&pid, &(seq, stage))| inflight_payload(id, pid, seq, stage).to_vec());
            for p in pushes.chain(puts) {
                frame(&mut buf, &p);
                live += 1;
                if buf.len() >= 64 << 10 {
                    w.write_all(&buf)?;
                    len += buf.len() as u64;
                    buf.clear();
                }
            }
            w.write_all(&buf)?;
            len += buf.len() as u64;
            ids.insert(Arc::<str>::from(name.as_str()), id);
            if !q.is_empty() {
                counts.insert(id, q.len() as i64);
            }
            if !f.is_empty() {
                inflight.insert(id, f.keys().copied().collect());
            }
        }
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        std::fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()?;
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        io::Seek::seek(&mut file, io::SeekFrom::End(0))?;
        let before = self.len;
        self.file = BufWriter::with_capacity(256 << 10, file);
        self.len = len;
        self.live = live;
        self.counts = counts;
        self.inflight = inflight;
        // Ids of ended sessions are forgotten; live ones keep theirs.
        self.ids = ids;
        tracing::info!(before, after = len, live, "session queue journal rewritten");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lanemq-qj-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn replay_gives_live_entries_in_order() {
        let d = dir("replay");
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        {
            let (mut j, q, _) = QueueJournal::open(&d, true).unwrap();
            assert!(q.is_empty());
            for seq in 1..=5 {
                j.push(&a, seq, 100 + seq, 1, seq == 2).unwrap();
                j.push(&b, seq, 200 + seq, 2, false).unwrap();
            }
            j.remove(&a, 1).unwrap();
            j.remove(&a, 3).unwrap();
            j.drop_session(&b).unwrap();
            j.push(&b, 9, 999, 1, false).unwrap();
            j.commit().unwrap();
        }
        let (_, q, _) = QueueJournal::open(&d, true).unwrap();
        let a_q: Vec<(u64, u64, u8, bool)> = q["a"]
            .iter()
            .map(|e| (e.seq, e.offset, e.qos, e.retain))
            .collect();
        assert_eq!(
            a_q,
            vec![(2, 102, 1, true), (4, 104, 1, false), (5, 105, 1, false)]
        );
        assert_eq!(q["b"].len(), 1);
        assert_eq!(q["b"][0].offset, 999);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let d = dir("torn");
        let a: Arc<str> = "a".into();
        {
            let (mut j, _, _) = QueueJournal::open(&d, true).unwrap();
            j.push(&a, 1, 10, 1, false).unwrap();
            j.push(&a, 2, 20, 1, false).unwrap();
            j.commit().unwrap();
        }
        // Half a frame at the end, as a crash mid-write leaves it.
        let path = d.join(FILE);
        let full = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[0, 0, 0, 22, 1, 2])
            .unwrap();
        {
            let (mut j, q, _) = QueueJournal::open(&d, true).unwrap();
            assert_eq!(q["a"].len(), 2);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), full);
            j.push(&a, 3, 30, 1, false).unwrap();
            j.commit().unwrap();
        }
        let (_, q, _) = QueueJournal::open(&d, true).unwrap();
        assert_eq!(
            q["a"].iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![10, 20, 30]
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn compaction_keeps_exactly_the_live_entries() {
        let d = dir("compact");
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        {
            let (mut j, _, _) = QueueJournal::open(&d, false).unwrap();
            for seq in 0..10_000u64 {
                j.push(&a, seq, seq, 1, false).unwrap();
                if seq >= 5 {
                    j.remove(&a, seq - 5).unwrap();
                }
                j.push(&b, seq, seq, 1, false).unwrap();
            }
            j.drop_session(&b).unwrap();
            let before = j.len();
            j.compact().unwrap();
            assert!(j.len() < before / 100, "{} vs {before}", j.len());
            j.push(&a, 10_000, 10_000, 2, true).unwrap();
            j.commit().unwrap();
        }
        let (_, q, _) = QueueJournal::open(&d, false).unwrap();
        assert!(!q.contains_key("b"));
        assert_eq!(
            q["a"].iter().map(|e| e.seq).collect::<Vec<_>>(),
            (9_995..=10_000).collect::<Vec<_>>()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn inflight_records_replay_and_survive_compaction() {
        let d = dir("inflight");
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        {
            let (mut j, _, f) = QueueJournal::open(&d, true).unwrap();
            assert!(f.is_empty());
            j.push(&a, 1, 10, 2, false).unwrap();
            j.inflight_put(&a, 7, 1, 1).unwrap();
            j.inflight_put(&a, 8, 2, 1).unwrap();
            // QoS 2: PUBREC received, PUBREL sent: the same packet id at stage 2.
            j.inflight_put(&a, 7, 1, 2).unwrap();
            j.inflight_free(&a, 8).unwrap();
            j.inflight_put(&b, 1, 5, 1).unwrap();
            j.drop_session(&b).unwrap();
            j.commit().unwrap();
        }
        let (mut j, q, f) = QueueJournal::open(&d, true).unwrap();
        assert_eq!(f.get("a"), Some(&vec![(7, 1, 2)]));
        assert!(!f.contains_key("b"));
        assert_eq!(q["a"].len(), 1);
        // 1 queue entry + 1 inflight record are live.
        assert_eq!(j.live, 2);
        j.compact().unwrap();
        assert_eq!(j.live, 2);
        j.inflight_free(&a, 7).unwrap();
        assert_eq!(j.live, 1);
        j.commit().unwrap();
        drop(j);
        let (_, q, f) = QueueJournal::open(&d, true).unwrap();
        assert!(f.is_empty());
        assert_eq!(q["a"][0].offset, 10);
        let _ = std::fs::remove_dir_all(&d);
    }
}
