//! The sled index: named trees survive a flush and a reopen.

mod common;

use common::*;
use lanemq_store::Index;

#[test]
fn named_trees_survive_flush_and_reopen() {
    let dir = temp_dir("index");
    {
        let ix = Index::open(&dir).expect("open");
        let a = ix.tree("b_sessions").expect("tree");
        let b = ix.tree("b_subs").expect("tree");
        a.insert(b"c1", &b"state"[..]).expect("insert");
        assert_eq!(ix.watermark().expect("watermark"), 0);
        ix.set_watermark(42).expect("set");
        b.insert(b"c1\0a/#", &[1u8][..]).expect("insert");
        ix.flush().expect("flush");
    }
    let ix = Index::open_with_cache(&dir, 1 << 20).expect("reopen");
    let a = ix.tree("b_sessions").expect("tree");
    let b = ix.tree("b_subs").expect("tree");
    assert_eq!(a.get(b"c1").expect("get").as_deref(), Some(&b"state"[..]));
    assert_eq!(b.get(b"c1\0a/#").expect("get").as_deref(), Some(&[1u8][..]));
    assert!(
        ix.tree("other").expect("tree").is_empty(),
        "trees are separate"
    );
    assert_eq!(ix.watermark().expect("watermark"), 42);
}

#[test]
fn a_temporary_index_starts_empty() {
    let ix = Index::temporary().expect("temporary");
    assert!(ix.tree("b_sessions").expect("tree").is_empty());
}

#[test]
fn reopening_right_after_a_drop_waits_for_the_file_lock() {
    // sled releases its file lock only once its background threads are gone; a reopen at once
    // (an in-process restart) must wait for it, not fail with WouldBlock.
    let dir = temp_dir("index-reopen");
    for i in 0u64..20 {
        let ix = Index::open(&dir).expect("reopen at once");
        assert_eq!(ix.watermark().expect("watermark"), i);
        ix.set_watermark(i + 1).expect("set");
        ix.flush().expect("flush");
    }
}
