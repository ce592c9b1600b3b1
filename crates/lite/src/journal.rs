//! The lane table journal: what the lane table looked like at the last checkpoint.
//!
//! `<data_dir>/lanes/table.lj` is an append-only file of checksummed records. At every
//! checkpoint the engine appends one `Lane` record per lane whose indexed state changed since
//! the previous checkpoint (id, parent, key, newest entry, next offset, last publish time),
//! one `Gone` record per lane removed, then a `Checkpoint` record (the synced end of the lane
//! entry files, the log watermark below which every lane hint is in them, the next lane id),
//! and fsyncs. Group offsets (`Group` names a consumer group by a small id, `Commit` stores a
//! group's committed offset on a lane) are appended and fsynced on their own, every
//! flush interval of the dispatcher. When the file has grown well past the live table it is
//! rewritten whole (temporary file, fsync, rename).
//!
//! # Invariants
//!
//! - `Lane` and `Gone` records count only up to the last intact `Checkpoint` record: those of
//!   a torn checkpoint are ignored and cut at open, so the loaded table is exactly the table of
//!   a completed checkpoint. `Group` and `Commit` records count as soon as they are intact
//!   (they stand alone); those after the last checkpoint are kept across the cut.
//! - Record framing: `len u32 | crc32c(payload) u32 | payload`, `payload[0]` the kind.
//!   Integers are big-endian, like the log.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"LMQLJ1\n\0";
const FILE: &str = "table.lj";
const KIND_LANE: u8 = 1;
const KIND_GONE: u8 = 2;
const KIND_CHECKPOINT: u8 = 3;
const KIND_GROUP: u8 = 4;
const KIND_COMMIT: u8 = 5;
const KIND_RUN: u8 = 6;
/// Longest payload accepted when reading (a lane key is at most a topic).
const PAYLOAD_MAX: usize = 1 << 17;

/// One lane as journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneRecord {
    pub id: u64,
    pub parent: u32,
    /// Index of the lane's newest entry ([`crate::entries::NONE`] if none).
    pub last_entry: u64,
    /// Offset after the lane's newest indexed entry.
    pub next: u64,
    pub last_pub_us: u64,
    pub key: Box<str>,
}

/// The end of a completed checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// Synced end of the lane entry files.
    pub entries_end: u64,
    /// Every lane hint of a log record below this position is in the entry files.
    pub watermark: u64,
    /// Lane ids below this are used or were.
    pub next_id: u64,
    /// Live lanes after this checkpoint (to size the table when loading).
    pub lanes: u64,
}

/// What [`Journal::open`] found besides the records.
#[derive(Debug, Default)]
pub struct Loaded {
    /// None: no checkpoint was ever completed (a new data directory).
    pub checkpoint: Option<Checkpoint>,
    /// Bytes of a torn tail that were cut.
    pub cut: u64,
}

/// The open journal.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    file: File,
    len: u64,
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Append one framed `Lane` record to `out`.
pub fn encode_lane(out: &mut Vec<u8>, r: &LaneRecordRef<'_>) {
    let mut p = Vec::with_capacity(37 + r.key.len());
    p.push(KIND_LANE);
    put_u64(&mut p, r.id);
    p.extend_from_slice(&r.parent.to_be_bytes());
    put_u64(&mut p, r.last_entry);
    put_u64(&mut p, r.next);
    put_u64(&mut p, r.last_pub_us);
    p.extend_from_slice(r.key.as_bytes());
    frame(out, &p);
}

/// A lane record to write, borrowing its key from the table.
#[derive(Debug, Clone, Copy)]
pub struct LaneRecordRef<'a> {
    pub id: u64,
    pub parent: u32,
    pub last_entry: u64,
    pub next: u64,
    pub last_pub_us: u64,
    pub key: &'a str,
}

/// Append one framed `Group` record (a consumer group's name gets id `gid`).
pub fn encode_group(out: &mut Vec<u8>, gid: u32, name: &str) {
    let mut p = vec![KIND_GROUP];
    p.extend_from_slice(&gid.to_be_bytes());
    p.extend_from_slice(name.as_bytes());
    frame(out, &p);
}

/// Append one framed `Commit` record.
pub fn encode_commit(out: &mut Vec<u8>, lane: u64, gid: u32, offset: u64) {
    let mut p = vec![KIND_COMMIT];
    put_u64(&mut p, lane);
    p.extend_from_slice(&gid.to_be_bytes());
    put_u64(&mut p, offset);
    frame(out, &p);
}

fn encode_gone(out: &mut Vec<u8>, id: u64) {
    let mut p = vec![KIND_GONE];
    put_u64(&mut p, id);
    frame(out, &p);
}

fn encode_checkpoint(out: &mut Vec<u8>, c: &Checkpoint) {
    let mut p = vec![KIND_CHECKPOINT];
    put_u64(&mut p, c.entries_end);
    put_u64(&mut p, c.watermark);
    put_u64(&mut p, c.next_id);
    put_u64(&mut p, c.lanes);
    frame(out, &p);
}

/// A journal record, as [`Journal::open`] hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    Lane(LaneRecord),
    Gone(u64),
    Checkpoint(Checkpoint),
    /// First, before any other record: how many lanes the table will hold.
    Expect(u64),
    Group(u32, Box<str>),
    Commit(u64, u32, u64),
    /// A group's delivery state of a lane that must outlive a restart (lane, group id, mark);
    /// an empty mark clears it.
    Run(u64, u32, RunMark),
}

/// What a consumer group had done with a lane beyond its committed offset: offsets below
/// `sent_to` were delivered at least once to `holder` (a redelivery to it after a restart
/// carries DUP=1),
/// `attempts` per offset (dead-lettered at the parent's `max_attempts`), and a pause
/// (`lane-suspend-ms` / `lane-retry-ms`) until `paused_until_us` (µs since the epoch; 0: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunMark {
    pub sent_to: u64,
    pub paused_until_us: u64,
    pub attempts: Vec<(u64, u32)>,
    /// The client the delivered offsets went to (DUP=1 only for a redelivery to it).
    pub holder: Box<str>,
}

impl RunMark {
    /// Nothing to keep (the holder alone is not state).
    pub fn is_empty(&self) -> bool {
        self.sent_to == 0 && self.paused_until_us == 0 && self.attempts.is_empty()
    }
}

/// Append one framed `Run` record.
pub fn encode_run(out: &mut Vec<u8>, lane: u64, gid: u32, m: &RunMark) {
    let mut p = vec![KIND_RUN];
    put_u64(&mut p, lane);
    p.extend_from_slice(&gid.to_be_bytes());
    put_u64(&mut p, m.sent_to);
    put_u64(&mut p, m.paused_until_us);
    p.extend_from_slice(&(m.attempts.len().min(u32::MAX as usize) as u32).to_be_bytes());
    for (off, n) in m.attempts.iter().take(u32::MAX as usize) {
        put_u64(&mut p, *off);
        p.extend_from_slice(&n.to_be_bytes());
    }
    p.extend_from_slice(m.holder.as_bytes());
    frame(out, &p);
}

fn decode_run(p: &[u8]) -> Option<Rec> {
    let lane = u64_at(p, 1)?;
    let gid = u32::from_be_bytes(p.get(9..13)?.try_into().ok()?);
    let sent_to = u64_at(p, 13)?;
    let paused_until_us = u64_at(p, 21)?;
    let n = u32::from_be_bytes(p.get(29..33)?.try_into().ok()?) as usize;
    let holder_at = n.checked_mul(12)?.checked_add(33)?;
    let holder = std::str::from_utf8(p.get(holder_at..)?).ok()?.into();
    let attempts = (0..n)
        .map(|i| {
            let at = 33 + i * 12;
            Some((
                u64_at(p, at)?,
                u32::from_be_bytes(p.get(at + 8..at + 12)?.try_into().ok()?),
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Rec::Run(
        lane,
        gid,
        RunMark {
            sent_to,
            paused_until_us,
            attempts,
            holder,
        },
    ))
}

fn decode(p: &[u8]) -> Option<Rec> {
    match *p.first()? {
        KIND_LANE => Some(Rec::Lane(LaneRecord {
            id: u64_at(p, 1)?,
            parent: u32::from_be_bytes(p.get(9..13)?.try_into().ok()?),
            last_entry: u64_at(p, 13)?,
            next: u64_at(p, 21)?,
            last_pub_us: u64_at(p, 29)?,
            key: std::str::from_utf8(p.get(37..)?).ok()?.into(),
        })),
        KIND_GONE => Some(Rec::Gone(u64_at(p, 1)?)),
        KIND_CHECKPOINT => Some(Rec::Checkpoint(Checkpoint {
            entries_end: u64_at(p, 1)?,
            watermark: u64_at(p, 9)?,
            next_id: u64_at(p, 17)?,
            lanes: u64_at(p, 25)?,
        })),
        KIND_GROUP => Some(Rec::Group(
            u32::from_be_bytes(p.get(1..5)?.try_into().ok()?),
            std::str::from_utf8(p.get(5..)?).ok()?.into(),
        )),
        KIND_COMMIT => Some(Rec::Commit(
            u64_at(p, 1)?,
            u32::from_be_bytes(p.get(9..13)?.try_into().ok()?),
            u64_at(p, 13)?,
        )),
        KIND_RUN => decode_run(p),
        _ => None,
    }
}

/// Intact framed records from the start of a journal file, read through a buffer.
struct Frames<'a> {
    r: std::io::BufReader<&'a File>,
}

fn frames(file: &File) -> io::Result<Frames<'_>> {
    use std::io::Seek;
    let mut f = file;
    f.seek(io::SeekFrom::Start(MAGIC.len() as u64))?;
    Ok(Frames {
        r: std::io::BufReader::with_capacity(1 << 20, f),
    })
}

impl Frames<'_> {
    /// The next intact record's payload into `payload`; None at the end or at the first
    /// torn or corrupt record.
    fn next(&mut self, payload: &mut Vec<u8>) -> io::Result<Option<usize>> {
        let mut head = [0u8; 8];
        if !read_full(&mut self.r, &mut head)? {
            return Ok(None);
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if len > PAYLOAD_MAX || len == 0 {
            return Ok(None);
        }
        payload.resize(len, 0);
        if !read_full(&mut self.r, payload)? || crc32c::crc32c(payload) != crc {
            return Ok(None);
        }
        if decode(payload).is_none() {
            return Ok(None);
        }
        Ok(Some(len))
    }
}

/// Fill `buf`; false if the stream ended first.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Both passes of [`Journal::open`] over `file`, changing nothing: the end of the last
/// checkpoint (0 for an empty file), the group and commit records after it (framed), the
/// last checkpoint.
fn load(
    file: &File,
    path: &Path,
    apply: &mut dyn FnMut(Rec),
) -> io::Result<(u64, Vec<u8>, Option<Checkpoint>)> {
    let size = file.metadata()?.len();
    let mut magic = [0u8; MAGIC.len()];
    let has_magic = size >= MAGIC.len() as u64 && {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut magic, 0)?;
        &magic == MAGIC
    };
    if !has_magic && size > 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a lane table journal", path.display()),
        ));
    }
    let mut keep: Vec<u8> = Vec::new();
    let mut checkpoint = None;
    if !has_magic {
        return Ok((0, keep, checkpoint));
    }
    // Pass 1: where the last checkpoint ends; the group and commit records after it.
    let mut r = frames(file)?;
    let mut good = MAGIC.len() as u64;
    let mut at = good;
    let mut payload = Vec::new();
    let mut expect = 0;
    while let Some(len) = r.next(&mut payload)? {
        at += 8 + len as u64;
        match payload.first() {
            Some(&KIND_CHECKPOINT) => {
                good = at;
                keep.clear();
                if let Some(Rec::Checkpoint(c)) = decode(&payload) {
                    expect = c.lanes;
                }
            }
            Some(&KIND_GROUP) | Some(&KIND_COMMIT) | Some(&KIND_RUN) => frame(&mut keep, &payload),
            _ => {}
        }
    }
    // Pass 2: apply, up to the end of the last checkpoint.
    apply(Rec::Expect(expect));
    let mut r = frames(file)?;
    let mut at = MAGIC.len() as u64;
    let mut batch: Vec<Rec> = Vec::new();
    while at < good {
        let Some(len) = r.next(&mut payload)? else {
            break;
        };
        at += 8 + len as u64;
        let Some(rec) = decode(&payload) else {
            continue;
        };
        match rec {
            Rec::Checkpoint(c) => {
                for x in batch.drain(..) {
                    apply(x);
                }
                checkpoint = Some(c);
            }
            Rec::Lane(_) | Rec::Gone(_) => batch.push(rec),
            rec => apply(rec),
        }
    }
    let mut at = 0;
    while let Some(h) = keep.get(at..at + 8) {
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if let Some(rec) = keep.get(at + 8..at + 8 + len).and_then(decode) {
            apply(rec);
        }
        at += 8 + len;
    }
    Ok((good, keep, checkpoint))
}

/// Read the journal in `dir` like [`Journal::open`], without creating or changing anything
/// (for offline checks). None: there is no journal.
pub fn read_only(dir: &Path, mut apply: impl FnMut(Rec)) -> io::Result<Option<Checkpoint>> {
    let path = dir.join(FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(load(&file, &path, &mut apply)?.2)
}

impl Journal {
    /// Open (or create) the journal in `dir` and hand `apply` the records that count, in file
    /// order: the `Lane` and `Gone` records of completed checkpoints (a `Gone` removes the
    /// lane and its group offsets), every intact `Group`, `Commit` and `Run` record. The file is read
    /// twice as a stream (find the last checkpoint, then apply), never held in memory.
    pub fn open(dir: &Path, mut apply: impl FnMut(Rec)) -> io::Result<(Journal, Loaded)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let size = file.metadata()?.len();
        let mut loaded = Loaded::default();
        let (good, keep, checkpoint) = load(&file, &path, &mut apply)?;
        loaded.checkpoint = checkpoint;
        loaded.cut = size.saturating_sub(good);
        let mut j = Journal {
            dir: dir.to_path_buf(),
            file,
            len: good,
        };
        if good == 0 {
            j.file.set_len(0)?;
            {
                use std::os::unix::fs::FileExt;
                j.file.write_all_at(MAGIC, 0)?;
            }
            j.file.sync_all()?;
            File::open(dir)?.sync_all()?;
            j.len = MAGIC.len() as u64;
        } else if loaded.cut > 0 {
            j.file.set_len(good)?;
            j.file.sync_all()?;
            if !keep.is_empty() {
                j.append_commits(&keep)?;
                loaded.cut -= keep.len() as u64;
            }
        }
        Ok((j, loaded))
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len <= MAGIC.len() as u64
    }

    /// Append a checkpoint: `lanes` (already framed with [`encode_lane`]), the removed lanes,
    /// the checkpoint record; fsync.
    pub fn append(&mut self, mut lanes: Vec<u8>, gone: &[u64], c: &Checkpoint) -> io::Result<()> {
        for id in gone {
            encode_gone(&mut lanes, *id);
        }
        encode_checkpoint(&mut lanes, c);
        use std::io::Seek;
        self.file.seek(io::SeekFrom::Start(self.len))?;
        self.file.write_all(&lanes)?;
        self.file.sync_data()?;
        self.len += lanes.len() as u64;
        Ok(())
    }

    /// Append framed `Group` and `Commit` records; fsync.
    pub fn append_commits(&mut self, records: &[u8]) -> io::Result<()> {
        use std::io::Seek;
        self.file.seek(io::SeekFrom::Start(self.len))?;
        self.file.write_all(records)?;
        self.file.sync_data()?;
        self.len += records.len() as u64;
        Ok(())
    }

    /// Replace the file with the whole table (`lanes`, framed) and the checkpoint record.
    pub fn rewrite(&mut self, lanes: Vec<u8>, c: &Checkpoint) -> io::Result<()> {
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let mut bytes = Vec::with_capacity(lanes.len() + 64);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&lanes);
        encode_checkpoint(&mut bytes, c);
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(FILE))?;
        File::open(&self.dir)?.sync_all()?;
        self.file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join(FILE))?;
        self.len = bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct T {
        lanes: HashMap<u64, LaneRecord>,
        groups: Vec<(u32, Box<str>)>,
        commits: HashMap<(u64, u32), u64>,
        runs: HashMap<(u64, u32), RunMark>,
    }

    fn load(d: &Path) -> (Journal, Loaded, T) {
        let mut t = T::default();
        let (j, l) = Journal::open(d, |r| match r {
            Rec::Lane(x) => {
                t.lanes.insert(x.id, x);
            }
            Rec::Gone(id) => {
                t.lanes.remove(&id);
                for (g, _) in &t.groups {
                    t.commits.remove(&(id, *g));
                }
            }
            Rec::Group(g, n) => t.groups.push((g, n)),
            Rec::Commit(lane, g, o) => {
                t.commits.insert((lane, g), o);
            }
            Rec::Run(lane, g, m) => {
                if m.is_empty() {
                    t.runs.remove(&(lane, g));
                } else {
                    t.runs.insert((lane, g), m);
                }
            }
            Rec::Checkpoint(_) | Rec::Expect(_) => {}
        })
        .unwrap();
        (j, l, t)
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "lanemq-lane-journal-{tag}-{}-{}",
            std::process::id(),
            lanemq_store::now_us()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn lane(id: u64, next: u64, key: &str) -> Vec<u8> {
        let mut b = Vec::new();
        encode_lane(
            &mut b,
            &LaneRecordRef {
                id,
                parent: 3,
                last_entry: next * 2,
                next,
                last_pub_us: 77,
                key,
            },
        );
        b
    }

    #[test]
    fn the_table_of_the_last_complete_checkpoint_is_loaded_and_a_torn_tail_cut() {
        let d = dir("torn");
        let (mut j, l, t) = load(&d);
        assert!(l.checkpoint.is_none() && t.lanes.is_empty());
        let c1 = Checkpoint {
            entries_end: 10,
            watermark: 100,
            next_id: 3,
            lanes: 1,
        };
        let mut b = lane(1, 4, "a");
        b.extend(lane(2, 1, "b"));
        j.append(b, &[], &c1).unwrap();
        let c2 = Checkpoint {
            entries_end: 12,
            watermark: 120,
            next_id: 3,
            lanes: 1,
        };
        j.append(lane(1, 6, "a"), &[2], &c2).unwrap();
        let complete = j.len();
        // A torn third checkpoint: a lane record without its checkpoint record.
        j.file.write_all(&lane(9, 1, "zz")).unwrap();
        j.file.write_all(&[1, 2, 3]).unwrap();
        drop(j);
        let (j, l, t) = load(&d);
        assert_eq!(l.checkpoint, Some(c2));
        assert_eq!(t.lanes.len(), 1);
        let a = &t.lanes[&1];
        assert_eq!((a.next, a.last_entry, &*a.key, a.parent), (6, 12, "a", 3));
        assert!(l.cut > 0);
        assert_eq!(j.len(), complete);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn commits_count_without_a_checkpoint_and_survive_the_cut_of_a_torn_one() {
        let d = dir("commits");
        let (mut j, _, _) = load(&d);
        let c = Checkpoint {
            entries_end: 1,
            watermark: 2,
            next_id: 9,
            lanes: 1,
        };
        j.append(lane(1, 4, "a"), &[], &c).unwrap();
        let mut b = Vec::new();
        encode_group(&mut b, 0, "workers");
        encode_commit(&mut b, 1, 0, 3);
        j.append_commits(&b).unwrap();
        // A torn checkpoint after the commits, then another commit.
        j.file.write_all(&lane(2, 1, "b")).unwrap();
        let mut b = Vec::new();
        encode_commit(&mut b, 1, 0, 4);
        j.file.write_all(&b).unwrap();
        drop(j);
        let (j, _, t) = load(&d);
        assert_eq!(t.groups, vec![(0, "workers".into())]);
        assert_eq!(t.commits.get(&(1, 0)), Some(&4));
        assert_eq!(t.lanes.len(), 1, "the torn checkpoint's lane is not loaded");
        drop(j);
        // The commits kept across the cut are there at the next open too.
        let (_, _, t) = load(&d);
        assert_eq!(t.commits.get(&(1, 0)), Some(&4));
        assert_eq!(t.lanes.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn run_marks_round_trip_and_an_empty_one_clears() {
        let d = dir("runs");
        let (mut j, _, _) = load(&d);
        let c = Checkpoint {
            entries_end: 1,
            watermark: 2,
            next_id: 9,
            lanes: 1,
        };
        j.append(lane(5, 4, "a"), &[], &c).unwrap();
        let m = RunMark {
            sent_to: 12,
            paused_until_us: 1_800_000_000_000_000,
            attempts: vec![(9, 1), (11, 3)],
            holder: "worker-1".into(),
        };
        let mut b = Vec::new();
        encode_group(&mut b, 0, "workers");
        encode_run(&mut b, 5, 0, &m);
        encode_run(
            &mut b,
            6,
            0,
            &RunMark {
                sent_to: 2,
                ..RunMark::default()
            },
        );
        encode_run(&mut b, 6, 0, &RunMark::default());
        j.append_commits(&b).unwrap();
        drop(j);
        let (_, _, t) = load(&d);
        assert_eq!(t.runs.len(), 1);
        assert_eq!(t.runs.get(&(5, 0)), Some(&m));
        // A count larger than the record is not a record.
        let mut b = Vec::new();
        encode_run(
            &mut b,
            5,
            0,
            &RunMark {
                holder: "".into(),
                ..m.clone()
            },
        );
        let payload = &b[8..];
        assert!(decode(payload).is_some());
        assert!(decode(&payload[..payload.len() - 1]).is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_rewrite_keeps_only_the_live_table() {
        let d = dir("rewrite");
        let (mut j, _, _) = load(&d);
        let c = Checkpoint {
            entries_end: 1,
            watermark: 2,
            next_id: 9,
            lanes: 1,
        };
        for n in 0..50 {
            j.append(lane(5, n, "k"), &[], &c).unwrap();
        }
        let before = j.len();
        j.rewrite(lane(5, 50, "k"), &c).unwrap();
        assert!(j.len() < before / 10, "{} vs {before}", j.len());
        drop(j);
        let (_, l, t) = load(&d);
        assert_eq!(t.lanes[&5].next, 50);
        assert_eq!(l.checkpoint, Some(c));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
