#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use lanemq_store::{
    Callback, Fs, IndexHint, MemFs, Properties, RecordIn, Store, StoreError, StoreOptions,
    SEGMENT_HEADER_LEN,
};

pub fn data_dir() -> PathBuf {
    PathBuf::from("/data")
}

pub fn mem_opts(fs: &MemFs) -> StoreOptions {
    let mut o = StoreOptions::new(data_dir());
    o.fs = Arc::new(fs.clone());
    o.segment_bytes_max = 4096;
    o.index_interval_bytes = 256;
    o.read_buffer_bytes = 1024;
    o
}

/// A record whose size varies with `i`, with every kind of property.
pub fn rec(i: u64) -> RecordIn {
    let n = (i * 37 % 200) as usize;
    RecordIn {
        timestamp_us: Some(1_000_000 + i * 10),
        qos: (i % 3) as u8,
        retain: i % 5 == 0,
        topic: format!("t/{}/x", i % 7).into(),
        client_id: format!("c{}", i % 3).into(),
        properties: Properties {
            payload_format_indicator: (i % 2 == 0).then_some(1),
            message_expiry_interval: (i % 4 == 0).then_some(60),
            content_type: (i % 3 == 0).then(|| "text/plain".to_string()),
            response_topic: None,
            correlation_data: (i % 6 == 0).then(|| Bytes::from(vec![i as u8; 3])),
            user_properties: (0..(i % 3))
                .map(|k| (format!("k{k}"), format!("v{i}")))
                .collect(),
            username: (i % 4 == 1).then(|| format!("user{}", i % 3)),
        },
        index_hints: if i % 2 == 1 {
            vec![IndexHint {
                kind: IndexHint::KIND_LANE,
                id: i % 4,
                seq: i / 4,
            }]
        } else {
            Vec::new()
        },
        payload: Bytes::from((0..n).map(|k| (k as u64 ^ i) as u8).collect::<Vec<u8>>()),
    }
}

/// A callback that sends its result on a channel.
pub fn chan() -> (Callback, mpsc::Receiver<Result<u64, StoreError>>) {
    let (tx, rx) = mpsc::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

/// A callback that ignores its result.
pub fn ignore() -> Callback {
    Box::new(|_| {})
}

/// Appends and waits for durability.
pub fn append_wait(store: &Store, r: RecordIn) -> Result<u64, StoreError> {
    let (cb, rx) = chan();
    let off = store.append(r, cb)?;
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| StoreError::Closed)??;
    assert_eq!(got, off);
    Ok(off)
}

/// Callback results recorded by offset.
#[derive(Clone, Default)]
pub struct Acks(pub Arc<Mutex<Vec<(u64, bool)>>>);

impl Acks {
    pub fn cb(&self, off_hint: Arc<AtomicU64>) -> Callback {
        let a = self.0.clone();
        Box::new(move |r| {
            let ok = r.is_ok();
            let off = r.unwrap_or_else(|_| off_hint.load(Ordering::SeqCst));
            a.lock().expect("acks").push((off, ok));
        })
    }
}

/// Every record of the store, read one by one.
pub fn read_all(store: &Store) -> Vec<lanemq_store::Record> {
    (store.first_offset()..store.committed_offset())
        .map(|o| store.read(o).expect("read"))
        .collect()
}

/// The record as the store would return it for `rec(i)` at offset `i`.
pub fn same(r: &lanemq_store::Record, want: &RecordIn) -> bool {
    let mut got = r.to_record_in();
    got.timestamp_us = want.timestamp_us;
    &got == want
}

/// Byte positions of the records of a segment file (walks the length fields).
pub fn record_positions(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN as usize;
    while pos + 9 <= bytes.len() {
        let len = u32::from_be_bytes([
            bytes[pos + 1],
            bytes[pos + 2],
            bytes[pos + 3],
            bytes[pos + 4],
        ]) as usize;
        if pos + 9 + len > bytes.len() {
            break;
        }
        out.push(pos);
        pos += 9 + len;
    }
    out
}

pub fn seg_path(first: u64) -> PathBuf {
    data_dir()
        .join("log")
        .join(lanemq_store::segment_file_name(first))
}

pub fn list_segments(fs: &MemFs) -> Vec<String> {
    let mut v: Vec<String> = fs
        .list(&data_dir().join("log"))
        .expect("list")
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect();
    v.sort();
    v
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
        "lanemq-store-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&p);
    p
}

pub fn rm(p: &Path) {
    let _ = std::fs::remove_dir_all(p);
}
