//! The bound on open segment files (`StoreOptions::open_segments_max`, `src/files.rs`): a
//! log of many segments keeps the active one open plus at most that many sealed ones,
//! whatever is read, in whatever order; closed segments reopen transparently; retention
//! closes what it deletes. Counted both ways: the store's own counter and the entries of
//! /proc/self/fd that point into this test's log directory (what the kernel holds).

mod common;

use std::path::Path;

use common::*;
use lanemq_store::{FsyncPolicy, Store, StoreError, StoreOptions};

const SEGMENTS_MIN: usize = 10;
const OPEN_MAX: usize = 2;

/// Descriptors of this process open on a `.seg` file of `log_dir`: (live files, deleted files).
fn open_seg_fds(log_dir: &Path) -> (usize, usize) {
    let (mut live, mut deleted) = (0, 0);
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return (0, 0);
    };
    for e in rd.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if !t.starts_with(&*log_dir.to_string_lossy()) || !t.contains(".seg") {
            continue;
        }
        if t.ends_with(" (deleted)") {
            deleted += 1;
        } else {
            live += 1;
        }
    }
    (live, deleted)
}

/// A deterministic permutation of `0..n` (no RNG dependency needed for a shuffle).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn opts(dir: &Path) -> StoreOptions {
    let mut o = StoreOptions::new(dir);
    o.segment_bytes_max = 4096;
    o.index_interval_bytes = 256;
    o.read_buffer_bytes = 1024;
    o.fsync = FsyncPolicy::Never;
    o.open_segments_max = OPEN_MAX;
    o
}

/// Fills a log until it has more than `SEGMENTS_MIN` segments; returns the record count.
fn fill(dir: &Path) -> u64 {
    let (s, _) = Store::open(opts(dir)).expect("open");
    let mut n = 0;
    while s.segment_count() <= SEGMENTS_MIN {
        s.append(rec(n), ignore()).expect("append");
        n += 1;
        if n % 16 == 0 {
            s.sync().expect("sync"); // the writer rolls asynchronously: do not overshoot
        }
    }
    s.sync().expect("sync");
    s.close().expect("close");
    n
}

#[test]
fn random_reads_of_every_segment_stay_within_the_bound() {
    let dir = temp_dir("open-files");
    let log_dir = dir.join("log");
    let n = fill(&dir);
    // After the writer closed, nothing of this log is open.
    assert_eq!(open_seg_fds(&log_dir), (0, 0));

    // Recovery checks every segment, one at a time.
    let (s, rep) = Store::open(opts(&dir)).expect("reopen");
    assert!(rep.segments > SEGMENTS_MIN, "{rep:?}");
    assert_eq!(rep.next_offset, n);
    let check = |what: &str| {
        let (live, deleted) = open_seg_fds(&log_dir);
        assert!(
            live <= OPEN_MAX + 2,
            "{what}: {live} segment files open (bound {OPEN_MAX} + the active one + the one sealed last)"
        );
        assert_eq!(deleted, 0, "{what}: a deleted segment is still open");
        assert!(s.open_segment_files() <= OPEN_MAX, "{what}");
    };
    check("after open");

    // Every record, in random order, twice (different orders).
    for seed in [0x9e37_79b9_7f4a_7c15, 42] {
        for o in shuffled(n, seed) {
            let r = s.read(o).expect("read");
            assert_eq!(r.offset, o);
            assert!(same(&r, &rec(o)), "record {o} reads back as written");
            check("random read");
        }
    }
    // Reading everything with 2 slots for 10 sealed segments reopened closed files.
    assert!(
        s.segment_files_opened() > SEGMENTS_MIN as u64,
        "{} opens",
        s.segment_files_opened()
    );

    // Readers parked in different segments, advanced in turn: none of them pins a file.
    let starts: Vec<u64> = (0..6).map(|k| k * n / 6).collect();
    let mut readers: Vec<_> = starts.iter().map(|&o| s.reader(o)).collect();
    let mut next: Vec<u64> = starts.clone();
    let mut live = readers.len();
    while live > 0 {
        live = 0;
        for (rd, want) in readers.iter_mut().zip(next.iter_mut()) {
            for _ in 0..7 {
                match rd.next_record().expect("reader") {
                    Some(r) => {
                        assert_eq!(r.offset, *want);
                        assert!(same(&r, &rec(r.offset)), "reader record {}", r.offset);
                        *want += 1;
                    }
                    None => break,
                }
            }
            if *want < n {
                live += 1;
            }
            check("interleaved readers");
        }
    }

    // A time seek walks the segments too.
    assert_eq!(
        s.seek_timestamp(rec(n / 2).timestamp_us.unwrap_or(0))
            .expect("seek"),
        n / 2
    );
    check("seek_timestamp");

    // Appends keep rolling segments: each sealed one goes to the cache, which stays bounded.
    let segs_before = s.segment_count();
    let mut i = n;
    while s.segment_count() < segs_before + 4 {
        s.append(rec(i), ignore()).expect("append");
        i += 1;
        if i % 16 == 0 {
            s.sync().expect("sync"); // the writer rolls asynchronously: do not overshoot
        }
    }
    s.sync().expect("sync");
    check("after rolls");
    for o in shuffled(i, 7).into_iter().take(200) {
        assert!(same(&s.read(o).expect("read"), &rec(o)));
    }
    check("after rolls and reads");
    s.close().expect("close");
    drop((s, readers)); // a reader holds the log too
    assert_eq!(open_seg_fds(&log_dir), (0, 0), "close releases every file");
    rm(&dir);
}

#[test]
fn retention_closes_what_it_deletes_and_readers_see_the_records_gone() {
    let dir = temp_dir("open-files-retention");
    let log_dir = dir.join("log");
    let n = fill(&dir);
    let mut o = opts(&dir);
    o.retention_max_bytes = Some(1);
    let (s, _) = Store::open(o).expect("reopen");
    // A reader in the first segment, and the first segments in the cache.
    let mut rd = s.reader(0);
    assert_eq!(rd.next_record().expect("read").map(|r| r.offset), Some(0));
    s.read(1).expect("read");
    s.read(n / 3).expect("read");
    let segs = s.segment_count();
    // The size limit wants everything but the active segment; the pin keeps n / 2 on.
    let r = s.apply_retention(0, n / 2).expect("retention");
    assert!(!r.deleted.is_empty());
    assert!(s.segment_count() < segs);
    let (live, deleted) = open_seg_fds(&log_dir);
    assert_eq!(deleted, 0, "a deleted segment's file was closed");
    assert!(live <= OPEN_MAX + 2);
    // The reader's position is gone: it is told so (not an I/O error), and a reader
    // started again from the first offset reads on.
    let mut hit_gone = false;
    for _ in 0..n {
        match rd.next_record() {
            Ok(Some(r)) => assert!(same(&r, &rec(r.offset))),
            Ok(None) => break,
            Err(StoreError::OffsetOutOfRange { first, .. }) => {
                assert_eq!(first, s.first_offset());
                hit_gone = true;
                break;
            }
            Err(e) => panic!("reader: {e}"),
        }
    }
    assert!(
        hit_gone,
        "the reader learnt that retention removed its records"
    );
    assert!(matches!(
        s.read(0),
        Err(StoreError::OffsetOutOfRange { .. })
    ));
    let first = s.first_offset();
    assert!(same(&s.read(first).expect("read"), &rec(first)));
    let mut rd = s.reader(first);
    assert_eq!(
        rd.next_record().expect("read").map(|r| r.offset),
        Some(first)
    );
    s.close().expect("close");
    rm(&dir);
}

#[test]
fn a_log_read_at_its_tail_holds_two_segments_open() {
    // The steady-load case: records appended, read back by readers that follow the tail
    // (stream indexer, lanes), old segments kept for retention and never read.
    let dir = temp_dir("open-files-tail");
    let log_dir = dir.join("log");
    let (s, _) = Store::open(opts(&dir)).expect("open");
    let mut rd = s.reader(0);
    let mut i = 0;
    while s.segment_count() < 3 * SEGMENTS_MIN {
        s.append(rec(i), ignore()).expect("append");
        i += 1;
        if i % 16 == 0 {
            s.sync().expect("sync");
            while let Some(r) = rd.next_record().expect("tail reader") {
                assert!(same(&r, &rec(r.offset)));
            }
            let (live, deleted) = open_seg_fds(&log_dir);
            assert!(
                live <= 2 && deleted == 0,
                "only the active segment and the one sealed last: {live}"
            );
        }
    }
    assert_eq!(s.open_segment_files(), 0);
    assert_eq!(
        s.segment_files_opened(),
        0,
        "no sealed segment was opened again"
    );
    s.close().expect("close");
    drop((s, rd));
    rm(&dir);
}

#[test]
fn zero_open_segments_is_refused() {
    let dir = temp_dir("open-files-zero");
    let mut o = opts(&dir);
    o.open_segments_max = 0;
    assert!(matches!(
        Store::open(o),
        Err(StoreError::InvalidOptions(m)) if m.contains("open_segments_max")
    ));
    rm(&dir);
}
