//! Fault injection with the in-memory file system: torn writes, failed fsync and write
//! (fail-stop), crash after every operation against a model, corruption before the tail.

mod common;

use std::time::Duration;

use common::*;
use lanemq_store::{
    record::encode_record, verify_with, Faults, FsyncPolicy, MemFs, Store, StoreError,
    SEGMENT_HEADER_LEN,
};

/// Builds a store on a fresh MemFs holding records 0..n, durably.
fn store_with(n: u64) -> (MemFs, Store) {
    let fs = MemFs::new();
    let mut o = mem_opts(&fs);
    o.segment_bytes_max = 1 << 20;
    let (s, _) = Store::open(o).expect("open");
    for i in 0..n {
        append_wait(&s, rec(i)).expect("append");
    }
    (fs, s)
}

#[test]
fn torn_write_at_every_byte_of_the_last_record_is_cut_and_reported() {
    let n = 5;
    let last = rec(n);
    let last_len = encode_record(n, 0, last.clone()).expect("encode").len();
    let (_, probe) = store_with(n);
    drop(probe);
    for keep in 0..last_len {
        let (fs, s) = store_with(n);
        let tail_len = fs.read_file(&seg_path(0)).expect("seg").len() as u64;
        fs.set_faults(Faults {
            torn_write: Some((1, keep)),
            ..Faults::default()
        });
        let (cb, rx) = chan();
        let off = s.append(last.clone(), cb).expect("append");
        assert_eq!(off, n);
        let r = rx.recv_timeout(Duration::from_secs(5)).expect("callback");
        assert!(
            matches!(r, Err(StoreError::Failed(_))),
            "keep {keep}: {r:?}"
        );
        // Fail-stop: later appends are refused at once.
        assert!(matches!(
            s.append(rec(99), ignore()),
            Err(StoreError::Failed(_))
        ));
        let crashed = fs.crash();
        drop(s);
        let (s2, rep) = Store::open(mem_opts(&crashed)).expect("reopen");
        assert_eq!(rep.next_offset, n, "keep {keep}");
        if keep == 0 {
            assert!(rep.torn_tail.is_none(), "keep 0: {rep:?}");
        } else {
            let cut = rep.torn_tail.clone().expect("torn tail reported");
            assert_eq!(cut.segment, seg_path(0));
            assert_eq!(cut.position, tail_len, "keep {keep}");
            assert_eq!(cut.bytes_cut, keep as u64, "keep {keep}");
        }
        let all = read_all(&s2);
        assert_eq!(all.len() as u64, n);
        for (i, r) in all.iter().enumerate() {
            assert!(same(r, &rec(i as u64)));
        }
        // The store works again after the cut, and the next open finds nothing to cut.
        assert_eq!(append_wait(&s2, last.clone()).expect("append"), n);
        s2.close().expect("close");
        drop(s2);
        let (s3, rep) = Store::open(mem_opts(&crashed.crash())).expect("reopen");
        assert!(rep.torn_tail.is_none());
        assert_eq!(rep.next_offset, n + 1);
        assert!(same(&s3.read(n).expect("read"), &last));
    }
}

#[test]
fn zero_filled_tail_is_a_torn_tail() {
    let (fs, s) = store_with(10);
    s.close().expect("close");
    drop(s);
    let mut bytes = fs.read_file(&seg_path(0)).expect("seg");
    let len = bytes.len() as u64;
    bytes.extend_from_slice(&[0u8; 100]);
    assert!(fs.write_file(&seg_path(0), &bytes));
    let (s, rep) = Store::open(mem_opts(&fs)).expect("open");
    let cut = rep.torn_tail.expect("cut");
    assert_eq!((cut.position, cut.bytes_cut), (len, 100));
    assert_eq!(s.committed_offset(), 10);
}

#[test]
fn failed_fsync_is_fail_stop() {
    let (fs, s) = store_with(3);
    fs.set_faults(Faults {
        fail_sync: Some(1),
        ..Faults::default()
    });
    let (cb, rx) = chan();
    s.append(rec(3), cb).expect("append");
    let r = rx.recv_timeout(Duration::from_secs(5)).expect("callback");
    match r {
        Err(StoreError::Failed(inner)) => assert!(inner.to_string().contains("fsync"), "{inner}"),
        other => panic!("expected Failed, got {other:?}"),
    }
    // Sticky: every later append, try_append, batch and sync fails at once, even though
    // the file system works again.
    fs.set_faults(Faults::default());
    assert!(matches!(
        s.append(rec(4), ignore()),
        Err(StoreError::Failed(_))
    ));
    assert!(s.try_append(rec(4), Some(ignore())).is_err());
    assert!(matches!(
        s.append_batch(vec![rec(4)], ignore()),
        Err(StoreError::Failed(_))
    ));
    assert!(matches!(s.sync(), Err(StoreError::Failed(_))));
    assert!(s.failure().is_some());
    assert_eq!(
        s.committed_offset(),
        3,
        "nothing after the failure became readable"
    );
    assert!(matches!(s.close(), Err(StoreError::Failed(_))));
    // After a crash, what was acknowledged is there.
    let (s2, rep) = Store::open(mem_opts(&fs.crash())).expect("reopen");
    assert!(rep.next_offset >= 3);
    for (i, r) in read_all(&s2).iter().enumerate().take(3) {
        assert!(same(r, &rec(i as u64)));
    }
}

#[test]
fn failed_write_fails_every_callback_of_the_batch_and_later_ones() {
    let (fs, s) = store_with(2);
    fs.hold_syncs(true);
    s.append(rec(2), ignore()).expect("append");
    while s.queued_records() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Records 3..10 queue behind the blocked fsync; the write of that batch fails.
    fs.set_faults(Faults {
        fail_write: Some(1),
        ..Faults::default()
    });
    let rxs: Vec<_> = (3..10)
        .map(|i| {
            let (cb, rx) = chan();
            s.append(rec(i), cb).expect("append");
            rx
        })
        .collect();
    fs.hold_syncs(false);
    for rx in rxs {
        let r = rx.recv_timeout(Duration::from_secs(5)).expect("callback");
        assert!(matches!(r, Err(StoreError::Failed(_))), "{r:?}");
    }
    assert!(matches!(
        s.append(rec(10), ignore()),
        Err(StoreError::Failed(_))
    ));
    assert_eq!(s.committed_offset(), 3);
}

/// The scenario run by the crash test: two store lifetimes, each appending and waiting for
/// every acknowledgement; rolls segments. Returns the offsets acknowledged durable.
fn scenario(fs: &MemFs) -> Vec<u64> {
    let mut acked = Vec::new();
    let mut o = mem_opts(fs);
    o.segment_bytes_max = 1024;
    o.index_interval_bytes = 128;
    for life in 0..2u64 {
        let s = match Store::open(o.clone()) {
            Ok((s, _)) => s,
            Err(e) => {
                if !fs.is_dead() {
                    panic!("open failed on a live fs: {e}");
                }
                return acked;
            }
        };
        let start = s.next_offset();
        for i in start..start + 12 {
            match append_wait(&s, rec(i)) {
                Ok(off) => {
                    assert_eq!(off, i);
                    acked.push(off);
                }
                Err(e) => {
                    if !fs.is_dead() {
                        panic!("append failed on a live fs: {e}");
                    }
                    return acked;
                }
            }
        }
        if life == 0 && s.close().is_err() {
            return acked;
        }
    }
    acked
}

/// Recovery after a crash at any point: every acknowledged record is present, and what is
/// present is exactly a prefix of what was appended, byte for byte.
fn check_after_crash(crashed: &MemFs, acked: &[u64], what: &str) {
    let (s, rep) = match Store::open(mem_opts(crashed)) {
        Ok(x) => x,
        Err(e) => panic!("{what}: recovery failed: {e}"),
    };
    let all = read_all(&s);
    assert_eq!(all.len() as u64, rep.next_offset, "{what}");
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64, "{what}");
        assert!(same(r, &rec(i as u64)), "{what}: record {i} differs");
    }
    if let Some(&max) = acked.iter().max() {
        assert!(
            rep.next_offset > max,
            "{what}: acked {max} lost (recovered {})",
            rep.next_offset
        );
    }
    // Recovered store is consistent: verify passes after a clean close.
    let n = rep.next_offset;
    assert_eq!(
        append_wait(&s, rec(n)).expect("append after recovery"),
        n,
        "{what}"
    );
    s.close().expect("close");
    drop(s);
    let v = verify_with(crashed, &data_dir()).expect("verify");
    assert!(v.is_ok() && v.torn_tail.is_none(), "{what}: {v:?}");
}

#[test]
fn crash_after_every_operation_keeps_every_acknowledged_record() {
    // Count the operations of a clean run.
    let fs = MemFs::new();
    fs.set_faults(Faults::default());
    let acked = scenario(&fs);
    assert_eq!(acked.len(), 24);
    assert!(list_segments(&fs).len() >= 3, "the scenario rolls segments");
    let total = fs.ops();
    assert!(total > 100, "{total}");
    for k in 1..=total {
        let fs = MemFs::new();
        fs.set_faults(Faults {
            stop_after_ops: Some(k),
            ..Faults::default()
        });
        let acked = scenario(&fs);
        check_after_crash(&fs.crash(), &acked, &format!("crash after op {k}/{total}"));
    }
}

#[test]
fn torn_write_at_every_write_keeps_every_acknowledged_record() {
    let fs = MemFs::new();
    assert_eq!(scenario(&fs).len(), 24);
    let writes = fs.writes();
    assert!(writes > 24, "{writes}");
    for w in 1..=writes {
        for keep in [1usize, 9, 40] {
            let fs = MemFs::new();
            fs.set_faults(Faults {
                torn_write: Some((w, keep)),
                ..Faults::default()
            });
            let acked = scenario(&fs);
            check_after_crash(
                &fs.crash(),
                &acked,
                &format!("torn write {w}/{writes} keeping {keep}"),
            );
        }
    }
}

#[test]
fn corruption_before_the_tail_is_an_error_naming_segment_and_offset() {
    let (fs, s) = store_with(10);
    s.close().expect("close");
    drop(s);
    let mut bytes = fs.read_file(&seg_path(0)).expect("seg");
    let pos = record_positions(&bytes);
    assert_eq!(pos.len(), 10);
    bytes[pos[4] + 20] ^= 0x40;
    assert!(fs.write_file(&seg_path(0), &bytes));
    let err = Store::open(mem_opts(&fs)).expect_err("must refuse");
    match &err {
        StoreError::Corrupt {
            segment,
            position,
            reason,
        } => {
            assert_eq!(segment, &seg_path(0));
            assert_eq!(*position, pos[4] as u64);
            assert!(reason.contains("valid record follows"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("00000000000000000000.seg") && msg.contains(&pos[4].to_string()),
        "{msg}"
    );
    let v = verify_with(&fs, &data_dir()).expect("verify");
    assert!(!v.is_ok());
    assert_eq!(v.problems[0].position, pos[4] as u64);

    // The operator flag truncates there.
    let mut o = mem_opts(&fs);
    o.truncate_corrupt = true;
    let (s, rep) = Store::open(o).expect("open with truncate_corrupt");
    let cut = rep.corruption_cut.expect("cut reported");
    assert_eq!(cut.position, pos[4] as u64);
    assert_eq!(cut.bytes_cut, (bytes.len() - pos[4]) as u64);
    assert_eq!(s.committed_offset(), 4);
    assert_eq!(append_wait(&s, rec(4)).expect("append"), 4);
}

#[test]
fn corruption_in_a_sealed_segment() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    for i in 0..200 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.close().expect("close");
    drop(s);
    let segs = list_segments(&fs);
    assert!(segs.len() >= 3);
    let p1 = data_dir().join("log").join(&segs[1]);
    let mut bytes = fs.read_file(&p1).expect("seg");
    let pos = record_positions(&bytes);
    let last = *pos.last().expect("records");
    bytes[last + 12] ^= 1; // even the last record of a sealed segment is not a torn tail
    assert!(fs.write_file(&p1, &bytes));
    let first1: u64 = segs[1][..20].parse().expect("name");
    let bad_offset = first1 + pos.len() as u64 - 1;

    // With its .idx the sealed segment is trusted at open (fast); a read detects the damage.
    let (s, _) = Store::open(mem_opts(&fs)).expect("open trusts .idx");
    match s.read(bad_offset) {
        Err(StoreError::Corrupt {
            segment, position, ..
        }) => {
            assert_eq!(segment, p1);
            assert_eq!(position, last as u64);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(s);
    assert!(!verify_with(&fs, &data_dir()).expect("verify").is_ok());

    // Without its .idx it is scanned: a hard error naming it.
    let idx = data_dir()
        .join("log")
        .join(lanemq_store::idx_file_name(first1));
    lanemq_store::Fs::remove(&fs, &idx).expect("rm idx");
    match Store::open(mem_opts(&fs)) {
        Err(StoreError::Corrupt {
            segment, position, ..
        }) => {
            assert_eq!(segment, p1);
            assert_eq!(position, last as u64);
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|x| x.1)),
    }
    // truncate_corrupt cuts there and drops the later segments.
    let mut o = mem_opts(&fs);
    o.truncate_corrupt = true;
    let (s, rep) = Store::open(o).expect("open");
    assert_eq!(rep.next_offset, bad_offset);
    assert_eq!(rep.segments_removed.len(), segs.len() - 2);
    assert_eq!(list_segments(&fs).len(), 2);
    assert_eq!(
        append_wait(&s, rec(bad_offset)).expect("append"),
        bad_offset
    );
}

#[test]
fn a_missing_segment_is_a_gap_error() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    for i in 0..200 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.close().expect("close");
    drop(s);
    let segs = list_segments(&fs);
    lanemq_store::Fs::remove(&fs, &data_dir().join("log").join(&segs[1])).expect("rm");
    let err = Store::open(mem_opts(&fs)).expect_err("gap");
    assert!(err.to_string().contains("previous one ends"), "{err}");
}

#[test]
fn stale_idx_is_rebuilt() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    for i in 0..100 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.close().expect("close");
    drop(s);
    let idx = data_dir().join("log").join(lanemq_store::idx_file_name(0));
    let mut b = fs.read_file(&idx).expect("idx");
    b[30] ^= 1;
    assert!(fs.write_file(&idx, &b));
    let (s, rep) = Store::open(mem_opts(&fs)).expect("open");
    assert_eq!(rep.rebuilt_indexes, vec![idx]);
    assert_eq!(rep.scanned_segments, 2);
    assert_eq!(read_all(&s).len(), 100);
    let _ = (FsyncPolicy::Always, SEGMENT_HEADER_LEN);
}

#[test]
fn crash_during_retention_never_leaves_a_gap() {
    let build = || {
        let fs = MemFs::new();
        let mut o = mem_opts(&fs);
        o.retention_max_bytes = Some(1);
        let (s, _) = Store::open(o).expect("open");
        for i in 0..300 {
            s.append(rec(i), ignore()).expect("append");
        }
        s.sync().expect("sync");
        (fs, s)
    };
    let (fs, s) = build();
    fs.set_faults(Faults::default());
    let r = s.apply_retention(0, 200).expect("retention");
    assert!(r.deleted.len() >= 2);
    let total = fs.ops();
    for k in 1..=total {
        let (fs, s) = build();
        fs.set_faults(Faults {
            stop_after_ops: Some(k),
            ..Faults::default()
        });
        let _ = s.apply_retention(0, 200);
        let crashed = fs.crash();
        drop(s);
        let (s2, rep) = Store::open(mem_opts(&crashed)).unwrap_or_else(|e| panic!("op {k}: {e}"));
        assert_eq!(rep.next_offset, 300, "op {k}");
        let all = read_all(&s2);
        assert_eq!(all.len() as u64, 300 - rep.first_offset);
        assert!(same(&all[0], &rec(rep.first_offset)));
    }
}
