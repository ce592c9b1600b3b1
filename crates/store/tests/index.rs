//! The sled index: typed trees, watermark, catch-up from the log.

mod common;

use std::time::Duration;

use common::*;
use lanemq_store::{catch_up, Index, InflightEntry, InflightStage, MemFs, Store, Will};

#[test]
fn typed_trees_round_trip_and_survive_reopen() {
    let dir = temp_dir("index");
    {
        let ix = Index::open(&dir).expect("open");
        ix.put_session("c1", b"state-1").expect("put");
        ix.put_session("c2", b"state-2").expect("put");
        ix.put_subscription("c1", "a/#", &[1]).expect("sub");
        ix.put_subscription("c1", "b/+", &[2]).expect("sub");
        ix.put_subscription("c10", "z", &[3]).expect("sub"); // c1 is a string prefix of c10
        ix.put_inflight(
            "c1",
            7,
            InflightEntry {
                offset: 42,
                qos: 2,
                stage: InflightStage::AwaitPubrec,
            },
        )
        .expect("inflight");
        for seq in [5u64, 1, 300, 2] {
            ix.offline_push("c1", seq, seq * 10).expect("push");
        }
        ix.offline_push("c10", 1, 1).expect("push");
        ix.put_retained("t/1", 11).expect("retained");
        ix.put_inbound_qos2("c1", 9).expect("qos2");
        ix.put_will(
            "c2",
            &Will {
                fire_at_us: 123,
                message: rec(3),
            },
        )
        .expect("will");
        ix.set_watermark(77).expect("wm");
        ix.flush().expect("flush");
    }
    let ix = Index::open(&dir).expect("reopen");
    assert_eq!(
        ix.get_session("c1").expect("get"),
        Some(b"state-1".to_vec())
    );
    assert_eq!(ix.sessions().expect("list").len(), 2);
    assert_eq!(
        ix.subscriptions("c1").expect("subs"),
        vec![("a/#".to_string(), vec![1]), ("b/+".to_string(), vec![2])]
    );
    assert_eq!(ix.inflight("c1").expect("inflight")[0].1.offset, 42);
    assert_eq!(
        ix.offline_range("c1", 0, 10).expect("range"),
        vec![(1, 10), (2, 20), (5, 50), (300, 3000)]
    );
    assert_eq!(ix.offline_range("c1", 3, 1).expect("range"), vec![(5, 50)]);
    assert_eq!(ix.offline_remove_through("c1", 5).expect("rm"), 3);
    assert_eq!(
        ix.offline_range("c1", 0, 10).expect("range"),
        vec![(300, 3000)]
    );
    assert_eq!(ix.get_retained("t/1").expect("get"), Some(11));
    assert!(ix.has_inbound_qos2("c1", 9).expect("has"));
    let wills = ix.wills().expect("wills");
    assert_eq!(wills.len(), 1);
    let mut want = rec(3);
    want.timestamp_us = None;
    assert_eq!(
        wills[0].1,
        Will {
            fire_at_us: 123,
            message: want
        }
    );
    assert_eq!(ix.watermark().expect("wm"), 77);

    ix.remove_session("c1").expect("rm");
    assert!(ix.get_session("c1").expect("get").is_none());
    assert!(ix.subscriptions("c1").expect("subs").is_empty());
    assert!(ix.inflight("c1").expect("inflight").is_empty());
    assert!(ix.offline_range("c1", 0, 10).expect("range").is_empty());
    assert!(ix.inbound_qos2("c1").expect("ids").is_empty());
    assert_eq!(
        ix.subscriptions("c10").expect("subs").len(),
        1,
        "other clients untouched"
    );
    assert_eq!(ix.offline_range("c10", 0, 10).expect("range").len(), 1);
    drop(ix);
    rm(&dir);
}

#[test]
fn catch_up_replays_the_log_after_the_watermark() {
    let fs = MemFs::new();
    let (s, _) = Store::open(mem_opts(&fs)).expect("open");
    let ix = Index::temporary().expect("index");
    for i in 0..50 {
        s.append(rec(i), ignore()).expect("append");
    }
    s.sync().expect("sync");
    // Index the first 20 "live", as the broker would after each durable ack.
    for o in 0..20 {
        let r = s.read(o).expect("read");
        if r.retain {
            ix.put_retained(&r.topic, r.offset).expect("retained");
        }
    }
    ix.set_watermark(20).expect("wm");
    let mut seen = Vec::new();
    let rep = catch_up(&s, &ix, |r| {
        seen.push(r.offset);
        if r.retain {
            ix.put_retained(&r.topic, r.offset)?;
        }
        Ok(())
    })
    .expect("catch up");
    assert_eq!(
        (rep.from, rep.to, rep.records, rep.index_ahead),
        (20, 50, 30, false)
    );
    assert_eq!(seen, (20..50).collect::<Vec<_>>());
    assert_eq!(ix.watermark().expect("wm"), 50);
    // rec(i) retains when i % 5 == 0, topic t/{i % 7}/x: the newest wins.
    assert_eq!(ix.get_retained("t/0/x").expect("get"), Some(35));
    // Nothing left to replay.
    let rep = catch_up(&s, &ix, |_| Ok(())).expect("again");
    assert_eq!(rep.records, 0);
    // An index ahead of the log is reported, not replayed.
    ix.set_watermark(1000).expect("wm");
    assert!(catch_up(&s, &ix, |_| Ok(())).expect("ahead").index_ahead);
    let _ = Duration::ZERO;
}
