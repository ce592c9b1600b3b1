//! Segment files, their header, the sparse index (`.idx`) written when a segment is sealed,
//! the recovery scan and the read cursor.
//!
//! A segment `<first_offset:020>.seg` is a 24-byte header followed by records back to back
//! (no padding, no footer). Only the last segment of the log is ever written to; a segment
//! is *sealed* when the next one is created, and sealing is ordered:
//!
//! 1. `fdatasync` the segment (whatever the fsync policy: sealed segments are always durable);
//! 2. write `<first_offset:020>.idx` atomically (`.idx.tmp`, fsync, rename, fsync dir);
//! 3. create the next segment, write and fsync its header, fsync the directory.
//!
//! So at most the last segment can have a torn tail, and a sealed segment whose `.idx` says
//! the right length is trusted without reading its records (that is what makes opening a
//! big log fast). A missing or mismatching `.idx` is a cache miss: the segment is scanned
//! and the `.idx` rewritten.
//!
//! The sparse index holds one entry (offset, byte position, timestamp) every
//! `index_interval_bytes` of records, always including the first record, so a read seeks
//! to the nearest entry and scans at most one interval.
//!
//! Only the active segment and the one sealed last hold their files open; an older segment's
//! file is opened on demand and kept in the log's bounded cache of handles ([`crate::files`]),
//! so the open files do not grow with the number of segments.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::error::StoreError;
use crate::files::SegmentFiles;
use crate::fs::{Fs, LogFile};
use crate::record::{self, Peek, RECORD_HEADER_LEN, RECORD_MAGIC};

/// Bytes of the segment header.
pub const SEGMENT_HEADER_LEN: u64 = 24;
/// Segment header magic.
pub const SEGMENT_MAGIC: &[u8; 8] = b"LANEMQLG";
/// Segment format version.
pub const SEGMENT_VERSION: u16 = 1;
/// Sparse index magic.
pub const IDX_MAGIC: &[u8; 8] = b"LANEMQIX";
/// Sparse index format version.
pub const IDX_VERSION: u16 = 1;
/// Bytes of the sparse index header.
pub const IDX_HEADER_LEN: usize = 64;
/// Bytes of one sparse index entry.
pub const IDX_ENTRY_LEN: usize = 24;

/// Scan reads the file in chunks of this size.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// `<first_offset:020>.seg`
pub fn segment_file_name(first_offset: u64) -> String {
    format!("{first_offset:020}.seg")
}

/// `<first_offset:020>.idx`
pub fn idx_file_name(first_offset: u64) -> String {
    format!("{first_offset:020}.idx")
}

/// Parses `<20 digits>.<ext>`.
pub fn parse_file_name(name: &str, ext: &str) -> Option<u64> {
    let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Encodes a segment header.
pub fn encode_header(first_offset: u64) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&SEGMENT_VERSION.to_be_bytes());
    // 10..12 reserved, zero
    h[12..20].copy_from_slice(&first_offset.to_be_bytes());
    let crc = crc32c::crc32c(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_be_bytes());
    h
}

/// What the first bytes of a segment file are.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderState {
    /// A valid header for this first offset.
    Ok,
    /// Shorter than a header, or all zero bytes: a segment whose creation was torn.
    Torn,
    /// Something else.
    Bad(&'static str),
}

/// Checks the header of a segment file of `len` bytes.
pub fn check_header(
    file: &dyn LogFile,
    path: &Path,
    len: u64,
    first_offset: u64,
) -> Result<HeaderState, StoreError> {
    let n = len.min(SEGMENT_HEADER_LEN) as usize;
    let mut h = vec![0u8; n];
    file.read_exact_at(&mut h, 0)
        .map_err(|e| StoreError::io("read segment header", path, e))?;
    if n < SEGMENT_HEADER_LEN as usize || h.iter().all(|&b| b == 0) {
        return Ok(HeaderState::Torn);
    }
    if &h[0..8] != SEGMENT_MAGIC {
        return Ok(HeaderState::Bad("bad segment magic"));
    }
    let crc = u32::from_be_bytes([h[20], h[21], h[22], h[23]]);
    if crc != crc32c::crc32c(&h[0..20]) {
        return Ok(HeaderState::Bad("segment header CRC32C mismatch"));
    }
    if u16::from_be_bytes([h[8], h[9]]) != SEGMENT_VERSION {
        return Ok(HeaderState::Bad("unknown segment format version"));
    }
    let mut f = [0u8; 8];
    f.copy_from_slice(&h[12..20]);
    if u64::from_be_bytes(f) != first_offset {
        return Ok(HeaderState::Bad(
            "header first offset differs from the file name",
        ));
    }
    Ok(HeaderState::Ok)
}

/// One sparse index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Record offset.
    pub offset: u64,
    /// Byte position of the record in the segment file.
    pub position: u64,
    /// Record timestamp.
    pub timestamp_us: u64,
}

/// The readable state of a segment. For the last segment it grows as records meet the
/// durability policy; for a sealed one it never changes.
#[derive(Debug, Clone, Default)]
pub struct SegState {
    /// Exclusive end offset of readable records.
    pub next_offset: u64,
    /// Bytes of header + readable records.
    pub len: u64,
    /// Sparse index.
    pub entries: Vec<Entry>,
    /// Timestamp of the first record (0 when empty).
    pub min_ts: u64,
    /// Timestamp of the last record (0 when empty).
    pub max_ts: u64,
}

impl SegState {
    /// Adds a record at `position` to the state (called in offset order).
    pub fn push(&mut self, offset: u64, position: u64, len: u64, ts: u64, interval: u64) {
        debug_assert_eq!(offset, self.next_offset, "records must be dense");
        debug_assert_eq!(position, self.len, "records must be back to back");
        let need_entry = match self.entries.last() {
            None => true,
            Some(e) => position - e.position >= interval,
        };
        if need_entry {
            self.entries.push(Entry {
                offset,
                position,
                timestamp_us: ts,
            });
        }
        if position == SEGMENT_HEADER_LEN {
            self.min_ts = ts;
        }
        self.max_ts = self.max_ts.max(ts);
        self.next_offset = offset + 1;
        self.len = position + len;
    }
}

/// A segment of the open log.
///
/// The active (last) segment, and the one sealed last, hold their files open; an older one
/// asks the log's [`SegmentFiles`] cache for it at every read (`crate::files` has the rules).
#[derive(Debug)]
pub struct Segment {
    /// Offset of its first record (also in its name and header).
    pub first_offset: u64,
    /// Path of the `.seg` file.
    pub path: PathBuf,
    /// The handle held while the segment is active (written by the storage thread, read by
    /// readers of the tail) and while it is the segment sealed last; `None` after that.
    pinned: RwLock<Option<Arc<dyn LogFile>>>,
    /// Where a sealed segment's handle comes from (`None` for a standalone segment of the
    /// offline tools, which stays pinned).
    files: Option<Arc<SegmentFiles>>,
    /// Set by retention before it removes the file.
    deleted: AtomicBool,
    /// Readable state.
    pub state: RwLock<SegState>,
}

impl Segment {
    /// A segment whose handle stays open until [`Segment::unpin`]: the active one, or a
    /// standalone segment (`files` `None`).
    pub fn active(
        first_offset: u64,
        path: PathBuf,
        file: Arc<dyn LogFile>,
        state: SegState,
        files: Option<Arc<SegmentFiles>>,
    ) -> Segment {
        Segment {
            first_offset,
            path,
            pinned: RwLock::new(Some(file)),
            files,
            deleted: AtomicBool::new(false),
            state: RwLock::new(state),
        }
    }

    /// The segment's file: the pinned handle while active, else the cache's (opened again
    /// if it was closed).
    pub fn file(&self) -> Result<Arc<dyn LogFile>, StoreError> {
        if let Some(f) = &*self.pinned.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(f.clone());
        }
        let Some(files) = &self.files else {
            return Err(StoreError::io(
                "open",
                &self.path,
                std::io::Error::other("segment closed"),
            ));
        };
        files
            .get(self.first_offset, &self.path)
            .map_err(|e| StoreError::io("open", &self.path, e))
    }

    /// Drops the pinned handle (the file closes once the writer and any read in progress
    /// dropped their clones); later reads open it through the cache. Called on the segment
    /// sealed before the last one, and by retention on a segment it deletes. No-op for a
    /// segment without a cache (a standalone one stays pinned).
    pub fn unpin(&self) {
        if self.files.is_some() {
            self.pinned
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
    }

    /// Retention is deleting the file: reads that cannot reopen it report the record gone.
    pub fn set_deleted(&self, deleted: bool) {
        self.deleted.store(deleted, Ordering::Release);
    }

    /// True once retention deleted (or is deleting) the file.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Snapshot of the readable state.
    pub fn state(&self) -> SegState {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// (next_offset, len) without cloning the entries.
    pub fn bounds(&self) -> (u64, u64) {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        (s.next_offset, s.len)
    }

    /// Byte position and offset of the sparse entry at or before `offset`.
    pub fn locate(&self, offset: u64) -> (u64, u64) {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        let i = s.entries.partition_point(|e| e.offset <= offset);
        if i == 0 {
            (SEGMENT_HEADER_LEN, self.first_offset)
        } else {
            let e = s.entries[i - 1];
            (e.position, e.offset)
        }
    }

    /// Byte position and offset of the sparse entry before the first record with a
    /// timestamp at or after `ts` (the scan continues from there).
    pub fn locate_time(&self, ts: u64) -> (u64, u64) {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        let i = s.entries.partition_point(|e| e.timestamp_us < ts);
        if i == 0 {
            (SEGMENT_HEADER_LEN, self.first_offset)
        } else {
            let e = s.entries[i - 1];
            (e.position, e.offset)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sparse index file
// ---------------------------------------------------------------------------------------

/// Encodes the `.idx` of a sealed segment.
pub fn encode_idx(first_offset: u64, st: &SegState) -> Vec<u8> {
    let mut b = Vec::with_capacity(IDX_HEADER_LEN + st.entries.len() * IDX_ENTRY_LEN + 4);
    b.extend_from_slice(IDX_MAGIC);
    b.extend_from_slice(&IDX_VERSION.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    // Entry count: a 64 MiB segment with a 4 KiB interval has 16 Ki entries; u32 is plenty
    // and the count is bounded by the segment length anyway.
    b.extend_from_slice(&(st.entries.len() as u32).to_be_bytes());
    b.extend_from_slice(&first_offset.to_be_bytes());
    b.extend_from_slice(&st.next_offset.to_be_bytes());
    b.extend_from_slice(&st.len.to_be_bytes());
    b.extend_from_slice(&st.min_ts.to_be_bytes());
    b.extend_from_slice(&st.max_ts.to_be_bytes());
    b.extend_from_slice(&0u64.to_be_bytes());
    debug_assert_eq!(b.len(), IDX_HEADER_LEN);
    for e in &st.entries {
        b.extend_from_slice(&e.offset.to_be_bytes());
        b.extend_from_slice(&e.position.to_be_bytes());
        b.extend_from_slice(&e.timestamp_us.to_be_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_be_bytes());
    b
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// Decodes a `.idx`; `Err(reason)` when it cannot be trusted.
pub fn decode_idx(b: &[u8], first_offset: u64) -> Result<SegState, &'static str> {
    if b.len() < IDX_HEADER_LEN + 4 {
        return Err("index file too short");
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32c::crc32c(body) {
        return Err("index file CRC32C mismatch");
    }
    if &body[0..8] != IDX_MAGIC || u16::from_be_bytes([body[8], body[9]]) != IDX_VERSION {
        return Err("bad index magic or version");
    }
    let count = u32::from_be_bytes([body[12], body[13], body[14], body[15]]) as usize;
    if body.len() != IDX_HEADER_LEN + count * IDX_ENTRY_LEN {
        return Err("index entry count does not match its length");
    }
    if be64(body, 16) != first_offset {
        return Err("index first offset differs from the segment");
    }
    let mut st = SegState {
        next_offset: be64(body, 24),
        len: be64(body, 32),
        entries: Vec::with_capacity(count),
        min_ts: be64(body, 40),
        max_ts: be64(body, 48),
    };
    for i in 0..count {
        let at = IDX_HEADER_LEN + i * IDX_ENTRY_LEN;
        st.entries.push(Entry {
            offset: be64(body, at),
            position: be64(body, at + 8),
            timestamp_us: be64(body, at + 16),
        });
    }
    if st.next_offset < first_offset
        || (st.next_offset > first_offset
            && st.entries.first().map(|e| e.offset) != Some(first_offset))
    {
        return Err("index entries inconsistent");
    }
    Ok(st)
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync the directory.
pub fn write_atomically(
    fs: &dyn Fs,
    dir: &Path,
    path: &Path,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let tmp = path.with_extension("idx.tmp");
    let f = fs
        .open(&tmp, true)
        .map_err(|e| StoreError::io("create", &tmp, e))?;
    f.set_len(0)
        .map_err(|e| StoreError::io("truncate", &tmp, e))?;
    f.write_all_at(bytes, 0)
        .map_err(|e| StoreError::io("write", &tmp, e))?;
    f.sync_data()
        .map_err(|e| StoreError::io("fsync", &tmp, e))?;
    fs.rename(&tmp, path)
        .map_err(|e| StoreError::io("rename", &tmp, e))?;
    fs.sync_dir(dir)
        .map_err(|e| StoreError::io("fsync directory", dir, e))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Scan
// ---------------------------------------------------------------------------------------

/// Where and why a scan stopped before the end of the file.
#[derive(Debug, Clone)]
pub struct Stop {
    /// Byte position of the first byte that is not a valid record.
    pub position: u64,
    /// Why.
    pub reason: &'static str,
    /// Position of a later valid record (then this is corruption, not a torn tail).
    pub valid_after: Option<u64>,
}

/// Result of scanning a segment.
#[derive(Debug, Clone)]
pub struct Scan {
    /// State made of every valid record.
    pub state: SegState,
    /// Valid records seen.
    pub records: u64,
    /// Set when the scan met something that is not a valid next record.
    pub stop: Option<Stop>,
}

/// Reads `[pos, pos + n)` of a file through a chunk buffer.
struct ChunkReader<'a> {
    file: &'a dyn LogFile,
    path: &'a Path,
    file_len: u64,
    buf: Vec<u8>,
    buf_start: u64,
}

impl ChunkReader<'_> {
    /// Returns up to `n` bytes at `pos` (fewer only at the end of the file).
    fn get(&mut self, pos: u64, n: usize) -> Result<&[u8], StoreError> {
        let want_end = (pos + n as u64).min(self.file_len);
        let buf_end = self.buf_start + self.buf.len() as u64;
        if pos < self.buf_start || want_end > buf_end {
            let read_len = (self.file_len - pos).min(n.max(SCAN_CHUNK_BYTES) as u64) as usize;
            self.buf.resize(read_len, 0);
            self.file
                .read_exact_at(&mut self.buf, pos)
                .map_err(|e| StoreError::io("read", self.path, e))?;
            self.buf_start = pos;
        }
        let from = (pos - self.buf_start) as usize;
        let to = (want_end - self.buf_start) as usize;
        Ok(&self.buf[from..to])
    }
}

/// Scans the records of a segment from its header to `file_len`, checking framing, CRC
/// and offset sequence (and, with `decode`, every field). With `find_valid_after`, a stop
/// also searches the rest of the file for a later valid record, which tells a torn tail
/// (nothing valid after) from corruption (valid records after).
pub fn scan(
    file: &dyn LogFile,
    path: &Path,
    first_offset: u64,
    file_len: u64,
    interval: u64,
    decode: bool,
    find_valid_after: bool,
) -> Result<Scan, StoreError> {
    let mut st = SegState {
        next_offset: first_offset,
        len: SEGMENT_HEADER_LEN,
        ..SegState::default()
    };
    let mut r = ChunkReader {
        file,
        path,
        file_len,
        buf: Vec::new(),
        buf_start: 0,
    };
    let mut pos = SEGMENT_HEADER_LEN;
    let mut records = 0u64;
    let mut stop = None;
    while pos < file_len {
        let head = r.get(pos, RECORD_HEADER_LEN)?;
        let need = if head.len() == RECORD_HEADER_LEN && head[0] == RECORD_MAGIC {
            let body = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            (RECORD_HEADER_LEN + body).min(record::RECORD_BODY_HARD_MAX + RECORD_HEADER_LEN)
        } else {
            RECORD_HEADER_LEN
        };
        let bytes = r.get(pos, need)?;
        let verdict = match record::check_header(bytes) {
            Peek::Complete { len } => {
                let (off, ts) = record::offset_and_timestamp(&bytes[..len]);
                if off != st.next_offset {
                    Err("record offset out of sequence")
                } else if decode {
                    match record::decode_record(Bytes::copy_from_slice(&bytes[..len])) {
                        Ok(_) => Ok((len, off, ts)),
                        Err(why) => Err(why),
                    }
                } else {
                    Ok((len, off, ts))
                }
            }
            Peek::Incomplete => Err("record cut short at the end of the file"),
            Peek::Bad(why) => Err(why),
        };
        match verdict {
            Ok((len, off, ts)) => {
                st.push(off, pos, len as u64, ts, interval);
                records += 1;
                pos += len as u64;
            }
            Err(reason) => {
                stop = Some(Stop {
                    position: pos,
                    reason,
                    valid_after: None,
                });
                break;
            }
        }
    }
    if let (Some(s), true) = (stop.as_mut(), find_valid_after) {
        s.valid_after = find_valid_record(file, path, s.position + 1, file_len, st.next_offset)?;
    }
    Ok(Scan {
        state: st,
        records,
        stop,
    })
}

/// Looks for any valid record (magic, length, CRC, offset ≥ `min_offset`) starting in
/// `[from, file_len)`. Reads the rest of the file in one buffer (bounded by the segment).
fn find_valid_record(
    file: &dyn LogFile,
    path: &Path,
    from: u64,
    file_len: u64,
    min_offset: u64,
) -> Result<Option<u64>, StoreError> {
    if from >= file_len {
        return Ok(None);
    }
    let mut rest = vec![0u8; (file_len - from) as usize];
    file.read_exact_at(&mut rest, from)
        .map_err(|e| StoreError::io("read", path, e))?;
    let mut i = 0;
    while let Some(k) = rest[i..].iter().position(|&b| b == RECORD_MAGIC) {
        let at = i + k;
        if let Peek::Complete { len } = record::check_header(&rest[at..]) {
            let (off, _) = record::offset_and_timestamp(&rest[at..at + len]);
            if off >= min_offset {
                return Ok(Some(from + at as u64));
            }
        }
        i = at + 1;
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------
// Read cursor
// ---------------------------------------------------------------------------------------

/// Reads records of one segment in offset order through a bounded buffer.
#[derive(Debug)]
pub struct Cursor {
    /// The segment.
    pub seg: Arc<Segment>,
    /// Byte position of the next record.
    pub pos: u64,
    /// Offset of the next record.
    pub offset: u64,
    buf: Vec<u8>,
    buf_start: u64,
    buffer_bytes: usize,
}

impl Cursor {
    /// A cursor positioned at `target` (which must be in the segment's readable range).
    pub fn seek(seg: Arc<Segment>, target: u64, buffer_bytes: usize) -> Result<Cursor, StoreError> {
        let (pos, offset) = seg.locate(target);
        let mut c = Cursor {
            seg,
            pos,
            offset,
            buf: Vec::new(),
            buf_start: 0,
            buffer_bytes,
        };
        while c.offset < target {
            if c.next_raw()?.is_none() {
                break;
            }
        }
        Ok(c)
    }

    /// A cursor at the first record whose timestamp is `>= ts`, or at the end.
    pub fn seek_time(
        seg: Arc<Segment>,
        ts: u64,
        buffer_bytes: usize,
    ) -> Result<Cursor, StoreError> {
        let (pos, offset) = seg.locate_time(ts);
        let mut c = Cursor {
            seg,
            pos,
            offset,
            buf: Vec::new(),
            buf_start: 0,
            buffer_bytes,
        };
        loop {
            let save = (c.pos, c.offset);
            match c.next_raw()? {
                None => return Ok(c),
                Some(raw) => {
                    let (_, t) = record::offset_and_timestamp(&raw);
                    if t >= ts {
                        (c.pos, c.offset) = save;
                        return Ok(c);
                    }
                }
            }
        }
    }

    fn fill(&mut self, pos: u64, n: usize, end: u64) -> Result<&[u8], StoreError> {
        let want_end = (pos + n as u64).min(end);
        let buf_end = self.buf_start + self.buf.len() as u64;
        if pos < self.buf_start || want_end > buf_end {
            let read_len = (end - pos).min(n.max(self.buffer_bytes) as u64) as usize;
            self.buf.resize(read_len, 0);
            if self.buf.capacity() > 2 * read_len.max(self.buffer_bytes) {
                // A huge record passed through: give the memory back.
                self.buf.shrink_to(read_len.max(self.buffer_bytes));
            }
            // Borrowed for this read only: a cursor pins no file between fills.
            self.seg
                .file()?
                .read_exact_at(&mut self.buf, pos)
                .map_err(|e| StoreError::io("read", &self.seg.path, e))?;
            self.buf_start = pos;
        }
        let from = (pos - self.buf_start) as usize;
        let to = (want_end - self.buf_start) as usize;
        Ok(&self.buf[from..to])
    }

    /// The next raw (CRC-checked) record, or `None` at the readable end of the segment.
    pub fn next_raw(&mut self) -> Result<Option<Bytes>, StoreError> {
        let (next_offset, end) = self.seg.bounds();
        if self.offset >= next_offset || self.pos >= end {
            return Ok(None);
        }
        let pos = self.pos;
        let head = self.fill(pos, RECORD_HEADER_LEN, end)?;
        let need = if head.len() == RECORD_HEADER_LEN {
            RECORD_HEADER_LEN + u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize
        } else {
            RECORD_HEADER_LEN
        };
        let need = need.min(record::RECORD_BODY_HARD_MAX + RECORD_HEADER_LEN);
        let path = self.seg.path.clone();
        let expect = self.offset;
        let bytes = self.fill(pos, need, end)?;
        match record::check_header(bytes) {
            Peek::Complete { len } => {
                let raw = Bytes::copy_from_slice(&bytes[..len]);
                let (off, _) = record::offset_and_timestamp(&raw);
                if off != expect {
                    return Err(StoreError::corrupt(
                        path,
                        pos,
                        "record offset out of sequence",
                    ));
                }
                self.pos += len as u64;
                self.offset += 1;
                Ok(Some(raw))
            }
            Peek::Incomplete => Err(StoreError::corrupt(
                path,
                pos,
                "record runs past the segment",
            )),
            Peek::Bad(why) => Err(StoreError::corrupt(path, pos, why)),
        }
    }
}
