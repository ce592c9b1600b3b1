//! Offline tools over a log directory: [`verify`] checks every record, [`dump`] prints them,
//! [`walk_records`] hands them to a function (index checks use it). All open files read-only and change nothing (a torn tail is reported, not cut), so they
//! are safe to run next to a stopped broker; on a running one they may report the tail
//! being written as torn.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::StoreError;
use crate::fs::{Fs, StdFs};
use crate::log::list_dir;
use crate::record;
use crate::segment::{self, Cursor, HeaderState, Segment};

/// Per-segment result of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    /// The `.seg` file.
    pub path: PathBuf,
    /// First offset.
    pub first_offset: u64,
    /// Exclusive end offset of the valid records.
    pub next_offset: u64,
    /// Valid records.
    pub records: u64,
    /// File length.
    pub bytes: u64,
    /// State of its `.idx`: `"ok"`, `"missing"`, `"active"` (last segment, none expected)
    /// or why it does not match.
    pub idx: String,
}

/// A problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// File concerned.
    pub segment: PathBuf,
    /// Byte position.
    pub position: u64,
    /// What is wrong.
    pub reason: String,
}

/// Result of [`verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Every segment, in order.
    pub segments: Vec<SegmentSummary>,
    /// Valid records in total.
    pub records: u64,
    /// First offset.
    pub first_offset: u64,
    /// Exclusive end offset.
    pub next_offset: u64,
    /// A torn tail at the end of the last segment (would be cut at next open; not an error).
    pub torn_tail: Option<Problem>,
    /// Corruption, gaps, bad headers, mismatching `.idx` files.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// True when no problem was found (a torn tail is not a problem).
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every record of the log in `<data_dir>/log` (framing, CRC32C, dense offsets, every
/// field decodes), every segment header and every `.idx`.
pub fn verify(data_dir: &Path) -> Result<VerifyReport, StoreError> {
    verify_with(&StdFs, data_dir)
}

/// [`verify`] over any [`Fs`].
pub fn verify_with(fs: &dyn Fs, data_dir: &Path) -> Result<VerifyReport, StoreError> {
    let dir = data_dir.join("log");
    let listing = list_dir(fs, &dir)?;
    let mut rep = VerifyReport::default();
    let n = listing.segs.len();
    let mut expect: Option<u64> = None;
    for (i, (&first, path)) in listing.segs.iter().enumerate() {
        let is_last = i + 1 == n;
        if i == 0 {
            rep.first_offset = first;
        }
        if let Some(e) = expect {
            if e != first {
                rep.problems.push(Problem {
                    segment: path.clone(),
                    position: 0,
                    reason: format!("gap: segment starts at {first}, previous ends at {e}"),
                });
            }
        }
        let file = fs
            .open_read(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let len = file.size().map_err(|e| StoreError::io("stat", path, e))?;
        match segment::check_header(&*file, path, len, first)? {
            HeaderState::Ok => {}
            HeaderState::Torn if is_last => {
                rep.torn_tail = Some(Problem {
                    segment: path.clone(),
                    position: 0,
                    reason: "segment header torn".into(),
                });
                expect = Some(first);
                rep.next_offset = first;
                continue;
            }
            HeaderState::Torn => {
                rep.problems.push(Problem {
                    segment: path.clone(),
                    position: 0,
                    reason: "segment header torn".into(),
                });
                continue;
            }
            HeaderState::Bad(why) => {
                rep.problems.push(Problem {
                    segment: path.clone(),
                    position: 0,
                    reason: why.into(),
                });
                continue;
            }
        }
        let scan = segment::scan(&*file, path, first, len, 4096, true, true)?;
        if let Some(stop) = &scan.stop {
            let p = Problem {
                segment: path.clone(),
                position: stop.position,
                reason: match stop.valid_after {
                    Some(at) => format!("{} (a valid record follows at byte {at})", stop.reason),
                    None => stop.reason.to_string(),
                },
            };
            if is_last && stop.valid_after.is_none() {
                rep.torn_tail = Some(p);
            } else {
                rep.problems.push(p);
            }
        }
        let idx = if is_last {
            "active".to_string()
        } else {
            match listing.idxs.get(&first) {
                None => "missing".to_string(),
                Some(ip) => {
                    let f = fs
                        .open_read(ip)
                        .map_err(|e| StoreError::io("open", ip, e))?;
                    let l = f.size().map_err(|e| StoreError::io("stat", ip, e))?;
                    let mut b = vec![0u8; l as usize];
                    f.read_exact_at(&mut b, 0)
                        .map_err(|e| StoreError::io("read", ip, e))?;
                    match segment::decode_idx(&b, first) {
                        Err(why) => why.to_string(),
                        Ok(st) if st.len != len || st.next_offset != scan.state.next_offset => {
                            format!(
                                "idx says {} bytes / next {}, segment has {} / {}",
                                st.len, st.next_offset, len, scan.state.next_offset
                            )
                        }
                        Ok(_) => "ok".to_string(),
                    }
                }
            }
        };
        if idx != "ok" && idx != "missing" && idx != "active" {
            rep.problems.push(Problem {
                segment: listing
                    .idxs
                    .get(&first)
                    .cloned()
                    .unwrap_or_else(|| path.clone()),
                position: 0,
                reason: format!("index file: {idx}"),
            });
        }
        rep.records += scan.records;
        rep.next_offset = scan.state.next_offset;
        expect = Some(scan.state.next_offset);
        rep.segments.push(SegmentSummary {
            path: path.clone(),
            first_offset: first,
            next_offset: scan.state.next_offset,
            records: scan.records,
            bytes: len,
            idx,
        });
    }
    Ok(rep)
}

/// Formats µs since the epoch as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC).
pub fn format_timestamp_us(us: u64) -> String {
    let secs = us / 1_000_000;
    let micros = us % 1_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant), valid for the whole u64 µs range we care about.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Prints up to `limit` records from offset `from`, one line each:
/// `offset time qos retain size topic`. Returns the number printed. Read-only.
pub fn dump(
    data_dir: &Path,
    from: u64,
    limit: u64,
    out: &mut dyn Write,
) -> Result<u64, StoreError> {
    dump_with(&StdFs, data_dir, from, limit, out)
}

/// [`dump`] over any [`Fs`].
pub fn dump_with(
    fs: &dyn Fs,
    data_dir: &Path,
    from: u64,
    limit: u64,
    out: &mut dyn Write,
) -> Result<u64, StoreError> {
    if limit == 0 {
        return Ok(0);
    }
    let mut printed = 0u64;
    let mut failed = None;
    walk_with(fs, data_dir, from, &mut |w| {
        let r = match w {
            Walked::Record(r, size) => writeln!(
                out,
                "{}\t{}\tqos={}\tretain={}\tsize={}\t{}",
                r.offset,
                format_timestamp_us(r.timestamp_us),
                r.qos,
                u8::from(r.retain),
                size,
                r.topic
            )
            .map(|()| printed += 1),
            Walked::Stop(path, position, reason) => writeln!(
                out,
                "# {}: stops at byte {position}: {reason}",
                path.display()
            ),
        };
        match r {
            Ok(()) => printed < limit,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    match failed {
        Some(e) => Err(StoreError::io("write", "<output>", e)),
        None => Ok(printed),
    }
}

/// What [`walk_records`] hands over.
pub enum Walked<'a> {
    /// A record and its size in bytes.
    Record(&'a record::Record, usize),
    /// A segment's readable records end before its end: path, byte position, why.
    Stop(&'a Path, u64, &'a str),
}

/// Every record of the log in `<data_dir>/log` from offset `from`, in order, read-only, until
/// `f` returns false; returns the number of records handed over.
pub fn walk_records(
    data_dir: &Path,
    from: u64,
    f: &mut dyn FnMut(Walked<'_>) -> bool,
) -> Result<u64, StoreError> {
    walk_with(&StdFs, data_dir, from, f)
}

fn walk_with(
    fs: &dyn Fs,
    data_dir: &Path,
    from: u64,
    f: &mut dyn FnMut(Walked<'_>) -> bool,
) -> Result<u64, StoreError> {
    let dir = data_dir.join("log");
    let listing = list_dir(fs, &dir)?;
    let start_seg = listing
        .segs
        .range(..=from)
        .next_back()
        .map(|(&f, _)| f)
        .or_else(|| listing.segs.keys().next().copied());
    let Some(start_seg) = start_seg else {
        return Ok(0);
    };
    let mut n = 0u64;
    for (&first, path) in listing.segs.range(start_seg..) {
        let file = fs
            .open_read(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        let len = file.size().map_err(|e| StoreError::io("stat", path, e))?;
        if segment::check_header(&*file, path, len, first)? != HeaderState::Ok {
            return Err(StoreError::corrupt(path, 0, "bad segment header"));
        }
        // A scan without records decoded gives the readable extent; then a cursor reads.
        let scan = segment::scan(&*file, path, first, len, 4096, false, false)?;
        let seg = Arc::new(Segment::active(
            first,
            path.clone(),
            file,
            scan.state.clone(),
            None,
        ));
        if scan.state.next_offset <= from {
            continue;
        }
        let mut c = Cursor::seek(seg, from.max(first), 64 << 10)?;
        loop {
            let pos = c.pos;
            let Some(raw) = c.next_raw()? else { break };
            let size = raw.len();
            let r =
                record::decode_record(raw).map_err(|why| StoreError::corrupt(path, pos, why))?;
            n += 1;
            if !f(Walked::Record(&r, size)) {
                return Ok(n);
            }
        }
        if let Some(stop) = &scan.stop {
            if !f(Walked::Stop(path, stop.position, stop.reason)) {
                return Ok(n);
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::format_timestamp_us;

    #[test]
    fn timestamps_format_as_utc() {
        assert_eq!(format_timestamp_us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_timestamp_us(1_700_000_000_123_456),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(
            format_timestamp_us(951_782_400_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
    }
}
