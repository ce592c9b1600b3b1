//! Log behaviour: append/read/reopen, segment roll, reader, retention, concurrency,
//! back-pressure, policies, offline tools.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use lanemq_store::{
    dump, dump_with, verify, verify_with, FsyncPolicy, IndexHint, MemFs, RecordIn, Store,
    StoreError, StoreOptions, TryAppendError,
};

#[test]
fn append_read_reopen_on_real_files() {
    let dir = temp_dir("real");
    let mut o = StoreOptions::new(&dir);
    o.segment_bytes_max = 8192;
    let (s, rep) = Store::open(o.clone()).expect("open");
    assert_eq!((rep.first_offset, rep.next_offset, rep.segments), (0, 0, 1));
    for i in 0..200 {
        assert_eq!(append_wait(&s, rec(i)).expect("append"), i);
    }
    assert!(s.segment_count() > 2, "rolled");
    s.close().expect("close");
    assert!(matches!(
        s.append(rec(0), ignore()),
        Err(StoreError::Closed)
    ));
    drop(s);

    let (s, rep) = Store::open(o).expect("reopen");
    assert_eq!(rep.next_offset, 200);
    assert_eq!(rep.scanned_segments, 1, "only the tail is scanned: {rep:?}");
    assert!(rep.torn_tail.is_none());
    for (i, r) in read_all(&s).iter().enumerate() {
        assert!(same(r, &rec(i as u64)), "record {i}");
        assert_eq!(r.offset, i as u64);
    }
    s.close().expect("close");

    let v = verify(&dir).expect("verify");
    assert!(v.is_ok(), "{v:?}");
    assert_eq!((v.records, v.first_offset, v.next_offset), (200, 0, 200));
    let mut out = Vec::new();
    assert_eq!(dump(&dir, 195, 10, &mut out).expect("dump"), 5);
    let text = String::from_utf8(out).expect("utf8");
    assert!(
        text.starts_with("195\t1970-01-01T00:00:01.001950Z\tqos=0\tretain=1\t"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 5);
    rm(&dir);
}

#[test]
fn segments_roll_by_size_and_the_reader_crosses_them() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    for i in 0..300 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.sync().expect("sync");
    let segs = list_segments(&fs);
    assert!(segs.len() >= 5, "{segs:?}");
    assert_eq!(segs[0], "00000000000000000000.seg");
    for name in &segs {
        let bytes = fs
            .read_file(&data_dir().join("log").join(name))
            .expect("file");
        assert!(
            bytes.len() as u64 <= 4096,
            "{name} is {} bytes",
            bytes.len()
        );
    }
    // Every sealed segment has an .idx, the active one has none.
    let names = lanemq_store::Fs::list(&fs, &data_dir().join("log")).expect("list");
    let idx = names.iter().filter(|n| n.ends_with(".idx")).count();
    assert_eq!(idx, segs.len() - 1);

    let all: Vec<_> = s.reader(0).collect::<Result<_, _>>().expect("reader");
    assert_eq!(all.len(), 300);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        assert!(same(r, &rec(i as u64)));
    }
    // From the middle, in bounded batches.
    let mut rd = s.reader(123);
    let mut got = Vec::new();
    loop {
        let b = rd.next_batch(17, 1 << 20).expect("batch");
        if b.is_empty() {
            break;
        }
        assert!(b.len() <= 17);
        got.extend(b);
    }
    assert_eq!(got.len(), 300 - 123);
    assert_eq!(got[0].offset, 123);
    // The reader follows the tail.
    s.append(rec(300), ignore()).expect("append");
    s.sync().expect("sync");
    assert_eq!(rd.next_record().expect("next").map(|r| r.offset), Some(300));
    assert!(rd.next_record().expect("next").is_none());
    // Random reads.
    for o in [0, 1, 77, 150, 299, 300] {
        assert_eq!(s.read(o).expect("read").offset, o);
    }
    assert!(matches!(
        s.read(301),
        Err(StoreError::OffsetOutOfRange { offset: 301, .. })
    ));
    s.close().expect("close");
}

#[test]
fn seek_timestamp_finds_the_first_record_at_or_after() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    for i in 0..200 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.sync().expect("sync");
    // rec(i) has timestamp 1_000_000 + 10 i.
    assert_eq!(s.seek_timestamp(0).expect("seek"), 0);
    assert_eq!(s.seek_timestamp(1_000_000 + 10 * 57).expect("seek"), 57);
    assert_eq!(s.seek_timestamp(1_000_000 + 10 * 57 + 1).expect("seek"), 58);
    assert_eq!(s.seek_timestamp(u64::MAX).expect("seek"), 200);
    // Timestamps never go backwards: an earlier one is raised.
    let mut r = rec(500);
    r.timestamp_us = Some(5);
    let o = append_wait(&s, r).expect("append");
    assert_eq!(s.read(o).expect("read").timestamp_us, 1_000_000 + 10 * 199);
}

#[test]
fn concurrent_appenders_get_dense_unique_offsets() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.segment_bytes_max = 64 << 10;
    let (s, _) = Store::open(o.clone()).expect("open");
    let threads = 8;
    let per = 400u64;
    let acked = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let s = s.clone();
            let acked = acked.clone();
            std::thread::spawn(move || {
                let mut offs = Vec::new();
                for i in 0..per {
                    let mut r = rec(i);
                    r.client_id = format!("thread-{t}").into();
                    r.timestamp_us = None;
                    let a = acked.clone();
                    offs.push(
                        s.append(
                            r,
                            Box::new(move |r| {
                                assert!(r.is_ok());
                                a.fetch_add(1, Ordering::SeqCst);
                            }),
                        )
                        .expect("append"),
                    );
                }
                offs
            })
        })
        .collect();
    let mut all: Vec<u64> = hs
        .into_iter()
        .flat_map(|h| h.join().expect("join"))
        .collect();
    s.sync().expect("sync");
    assert_eq!(acked.load(Ordering::SeqCst), threads * per);
    all.sort_unstable();
    assert_eq!(all, (0..threads * per).collect::<Vec<_>>());
    // Per thread, offsets increase; content matches the thread.
    let recs = read_all(&s);
    let mut last = vec![None::<u64>; threads as usize];
    for r in &recs {
        let t: usize = r.client_id["thread-".len()..].parse().expect("thread");
        if let Some(prev) = last[t] {
            assert!(r.offset > prev);
        }
        last[t] = Some(r.offset);
    }
    // Group commit amortized the fsyncs.
    assert!(
        fs.syncs() < threads * per,
        "syncs {} for {} records",
        fs.syncs(),
        threads * per
    );
    s.close().expect("close");
    let (s, rep) = Store::open(o).expect("reopen");
    assert_eq!(rep.next_offset, threads * per);
    drop(s);
}

#[test]
fn group_commit_takes_everything_queued_in_one_fsync() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.segment_bytes_max = 1 << 20;
    let (s, _) = Store::open(o).expect("open");
    fs.hold_syncs(true);
    let first = s.append(rec(0), ignore()).expect("append");
    // Wait until the storage thread has taken record 0 and is blocked in fsync.
    while s.queued_records() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let syncs_before = fs.syncs();
    let (cb, rx) = chan();
    for i in 1..100 {
        s.append(rec(i), if i == 99 { Box::new(|_| {}) } else { ignore() })
            .expect("append");
    }
    s.append(rec(100), cb).expect("append");
    fs.hold_syncs(false);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("ack")
            .expect("ok"),
        100
    );
    assert_eq!(first, 0);
    assert!(
        fs.syncs() - syncs_before <= 2,
        "100 records took {} fsyncs",
        fs.syncs() - syncs_before
    );
}

#[test]
fn try_append_reports_full_and_append_blocks_until_space() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.queue_records_max = 4;
    o.segment_bytes_max = 1 << 20;
    let (s, _) = Store::open(o).expect("open");
    fs.hold_syncs(true);
    s.append(rec(0), ignore()).expect("append");
    while s.queued_records() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    for i in 1..=4 {
        s.try_append(rec(i), Some(ignore())).expect("room");
    }
    let back = match s.try_append(rec(5), Some(ignore())) {
        Err(TryAppendError::Full(r, _cb)) => r,
        other => panic!("expected Full, got {other:?}"),
    };
    assert_eq!(*back, rec(5));
    assert_eq!(s.stats().append_waits.load(Ordering::Relaxed), 1);
    // A blocking append waits until the storage thread takes the queue.
    let s2 = s.clone();
    let h = std::thread::spawn(move || s2.append(rec(5), ignore()));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !h.is_finished(),
        "append must block while the queue is full"
    );
    assert_eq!(s.stats().append_waits.load(Ordering::Relaxed), 2);
    fs.hold_syncs(false);
    assert_eq!(h.join().expect("join").expect("append"), 5);
    s.sync().expect("sync");
    assert_eq!(s.committed_offset(), 6);
}

/// Waits (at most 10 s) until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < until, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn quiet_records_share_the_next_fsync_and_are_readable_only_once_fsynced() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    // Right after an fsync, a record nobody waits for is written but not fsynced...
    s.append(rec(0), ignore()).expect("append");
    s.sync().expect("sync");
    let syncs = fs.syncs();
    let quiet = s.try_append(rec(1), None).expect("append");
    assert_eq!(quiet, 1);
    // ...and the next record someone waits for takes it along in one fsync.
    let (tx, rx) = std::sync::mpsc::channel();
    s.append(
        rec(2),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )
    .expect("append");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10))
            .expect("ack")
            .expect("ok"),
        2
    );
    assert_eq!(s.committed_offset(), 3);
    assert!(fs.syncs() - syncs <= 2, "{} fsyncs", fs.syncs() - syncs);
    // Alone, a quiet record is fsynced (and readable) within QUIET_SYNC_MAX of the last fsync.
    let before = fs.syncs();
    s.try_append(rec(3), None).expect("append");
    eventually("the quiet record is fsynced", || s.committed_offset() == 4);
    assert!(fs.syncs() > before);
    assert_eq!(s.read(3).expect("read").offset, 3);
}

#[test]
fn append_with_assigns_hints_in_log_order() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    let lane_seq = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            let seq = lane_seq.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let seq = seq.clone();
                    s.append_with(
                        rec(i * 2),
                        move |_off, hints| {
                            hints.push(IndexHint {
                                kind: IndexHint::KIND_LANE,
                                id: 9,
                                seq: seq.fetch_add(1, Ordering::SeqCst),
                            })
                        },
                        ignore(),
                    )
                    .expect("append");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("join");
    }
    s.sync().expect("sync");
    let lane: Vec<u64> = read_all(&s)
        .iter()
        .filter_map(|r| r.index_hints.iter().find(|h| h.id == 9).map(|h| h.seq))
        .collect();
    assert_eq!(
        lane,
        (0..400).collect::<Vec<_>>(),
        "lane offsets follow log order"
    );
}

#[test]
fn retention_deletes_only_unpinned_front_segments() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.retention_max_bytes = Some(3 * 4096);
    let (s, _) = Store::open(o.clone()).expect("open");
    for i in 0..400 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.sync().expect("sync");
    let before = list_segments(&fs);
    assert!(before.len() > 5);
    // Pinned at 0: nothing goes.
    let r = s.apply_retention(u64::MAX, 0).expect("retention");
    assert!(r.deleted.is_empty() && r.blocked_by_pin);
    // Pinned in the middle of the third segment: the first two go.
    let third_first: u64 = before[2][..20].parse().expect("name");
    let r = s.apply_retention(0, third_first + 1).expect("retention");
    assert_eq!(r.deleted.len(), 2, "{r:?}");
    assert!(r.blocked_by_pin);
    assert_eq!(r.first_offset, third_first);
    assert_eq!(s.first_offset(), third_first);
    assert!(matches!(
        s.read(0),
        Err(StoreError::OffsetOutOfRange { .. })
    ));
    assert_eq!(s.read(third_first).expect("read").offset, third_first);
    // Unpinned: down to max_bytes, never the active segment.
    let r = s.apply_retention(0, u64::MAX).expect("retention");
    assert!(!r.blocked_by_pin);
    assert!(s.size_bytes() <= 3 * 4096, "{}", s.size_bytes());
    let after = list_segments(&fs);
    assert_eq!(after.last(), before.last(), "active segment kept");
    let idx = lanemq_store::Fs::list(&fs, &data_dir().join("log"))
        .expect("list")
        .iter()
        .filter(|n| n.ends_with(".idx"))
        .count();
    assert_eq!(idx, after.len() - 1, ".idx files go with their segments");
    // A reader positioned before the new first offset is told so; a new one starts at it.
    let first = s.first_offset();
    let rd = s.reader(0);
    assert_eq!(rd.next_offset(), first);
    s.close().expect("close");
    let (s, rep) = Store::open(o).expect("reopen");
    assert_eq!((rep.first_offset, rep.next_offset), (first, 400));
    drop(s);
}

#[test]
fn retention_by_age_keeps_segments_with_recent_records() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.retention_max_age = Some(Duration::from_secs(60));
    let (s, _) = Store::open(o).expect("open");
    let base = 1_000_000_000u64;
    for i in 0..300u64 {
        let mut r = rec(i);
        r.timestamp_us = Some(base + i * 1_000_000); // one per second
        s.append(r, ignore()).expect("append");
    }
    s.sync().expect("sync");
    let now = base + 300 * 1_000_000;
    let r = s.apply_retention(now, u64::MAX).expect("retention");
    assert!(!r.deleted.is_empty());
    // Every record newer than now - 60 s is kept, and the first kept segment holds one.
    let cutoff = now - 60_000_000;
    let first = s.first_offset();
    assert!(first <= 240, "{first}");
    let segs = list_segments(&fs);
    let second_first: u64 = segs[1][..20].parse().expect("name");
    assert!(s.read(second_first - 1).expect("read").timestamp_us >= cutoff);
    assert!(s.read(first).is_ok());
}

#[test]
fn interval_and_never_policies_ack_without_fsync_and_sync_forces_it() {
    for policy in [
        FsyncPolicy::Never,
        FsyncPolicy::Interval(Duration::from_secs(3600)),
    ] {
        let fs = MemFs::new();
        let mut o = mem_opts(&fs);
        o.fsync = policy;
        o.segment_bytes_max = 1 << 20;
        let (s, _) = Store::open(o.clone()).expect("open");
        let base = fs.syncs();
        for i in 0..50 {
            append_wait(&s, rec(i)).expect("append");
        }
        assert_eq!(fs.syncs(), base, "{policy:?}: no fsync per append");
        // A crash now loses what was only written.
        let crashed = fs.crash();
        let (s2, rep) = Store::open(mem_opts(&crashed)).expect("open");
        assert_eq!(rep.next_offset, 0, "{policy:?}");
        drop(s2);
        drop(s);

        let fs = MemFs::new();
        let mut o = mem_opts(&fs);
        o.fsync = policy;
        let (s, _) = Store::open(o).expect("open");
        for i in 0..50 {
            append_wait(&s, rec(i)).expect("append");
        }
        s.sync().expect("sync");
        let crashed = fs.crash();
        let (s2, rep) = Store::open(mem_opts(&crashed)).expect("open");
        assert_eq!(rep.next_offset, 50, "{policy:?}: sync makes it durable");
        drop(s2);
        drop(s);
    }
    // Interval actually fsyncs on its timer.
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.fsync = FsyncPolicy::Interval(Duration::from_millis(20));
    let (s, _) = Store::open(o).expect("open");
    let base = fs.syncs();
    append_wait(&s, rec(0)).expect("append");
    std::thread::sleep(Duration::from_millis(150));
    assert!(fs.syncs() > base, "interval fsync ran");
    let (s2, rep) = Store::open(mem_opts(&fs.crash())).expect("open");
    assert_eq!(rep.next_offset, 1);
    drop((s, s2));
}

#[test]
fn oversized_and_invalid_records_are_refused() {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.record_bytes_max = 1000;
    let (s, _) = Store::open(o).expect("open");
    let mut r = rec(1);
    r.payload = Bytes::from(vec![0u8; 2000]);
    assert!(matches!(
        s.append(r, ignore()),
        Err(StoreError::RecordTooLarge { .. })
    ));
    let mut r = rec(1);
    r.qos = 3;
    assert!(matches!(
        s.append(r, ignore()),
        Err(StoreError::InvalidRecord(_))
    ));
    // Nothing consumed an offset.
    assert_eq!(append_wait(&s, rec(2)).expect("append"), 0);
}

#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    append_wait(&s, rec(1)).expect("append");
    let mut big = rec(2);
    big.payload = Bytes::from(vec![7u8; 10_000]);
    append_wait(&s, big.clone()).expect("append");
    append_wait(&s, rec(3)).expect("append");
    assert!(same(&s.read(1).expect("read"), &big));
    assert_eq!(list_segments(&fs).len(), 3);
    s.close().expect("close");
    let v = verify_with(&fs, &data_dir()).expect("verify");
    assert!(v.is_ok(), "{v:?}");
    let mut out = Vec::new();
    assert_eq!(
        dump_with(&fs, &data_dir(), 0, 100, &mut out).expect("dump"),
        3
    );
}

#[test]
fn append_batch_assigns_consecutive_offsets_with_one_callback() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    append_wait(&s, rec(0)).expect("append");
    let (cb, rx) = chan();
    let range = s
        .append_batch((1..=20).map(rec).collect(), cb)
        .expect("batch");
    assert_eq!(range, 1..21);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5))
            .expect("ack")
            .expect("ok"),
        20
    );
    let all = read_all(&s);
    assert_eq!(all.len(), 21);
    assert!(same(&all[7], &rec(7)));
    let _ = RecordIn::default();
}
