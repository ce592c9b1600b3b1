//! Store benchmarks (not part of `cargo test`).
//!
//! ```text
//! cargo run --release -p lanemq-store --example store_bench -- append [DIR] [APPENDERS] [SECONDS] [PAYLOAD] [POLICY]
//! cargo run --release -p lanemq-store --example store_bench -- open [DIR] [RECORDS] [PAYLOAD]
//! ```
//!
//! `append`: APPENDERS threads (default 10) each append one record and wait for its
//! durability callback before the next (a QoS 1 publisher with one message in flight), for
//! SECONDS (default 5); POLICY is `always` (default), `never` or `interval:MS`.
//!
//! `open`: fills DIR with RECORDS small records (default 10 000 000) if it holds fewer, then
//! times `Store::open`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanemq_store::{FsyncPolicy, RecordIn, Store, StoreError, StoreOptions};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn record(payload: usize, i: u64) -> RecordIn {
    RecordIn {
        qos: 1,
        topic: format!("bench/{}", i % 16).into(),
        client_id: "bench".into(),
        payload: Bytes::from(vec![i as u8; payload]),
        ..RecordIn::default()
    }
}

fn main() -> Result<(), StoreError> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("append");
    let dir = PathBuf::from(arg(&args, 2, "/tmp/lanemq-store-bench".to_string()));
    match mode {
        "append" => {
            let appenders: u64 = arg(&args, 3, 10);
            let seconds: u64 = arg(&args, 4, 5);
            let payload: usize = arg(&args, 5, 64);
            let policy = match args.get(6).map(String::as_str).unwrap_or("always") {
                "never" => FsyncPolicy::Never,
                p if p.starts_with("interval:") => {
                    FsyncPolicy::Interval(Duration::from_millis(p[9..].parse().unwrap_or(10)))
                }
                _ => FsyncPolicy::Always,
            };
            let _ = std::fs::remove_dir_all(&dir);
            let mut o = StoreOptions::new(&dir);
            o.fsync = policy;
            let (store, _) = Store::open(o)?;
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let lat_us = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let hs: Vec<_> = (0..appenders)
                .map(|t| {
                    let (store, stop, done, lat_us) =
                        (store.clone(), stop.clone(), done.clone(), lat_us.clone());
                    std::thread::spawn(move || -> Result<(), StoreError> {
                        let mut i = t;
                        while !stop.load(Ordering::Relaxed) {
                            let (tx, rx) = mpsc::sync_channel(1);
                            let t0 = Instant::now();
                            store.append(
                                record(payload, i),
                                Box::new(move |r| {
                                    let _ = tx.send(r);
                                }),
                            )?;
                            rx.recv().map_err(|_| StoreError::Closed)??;
                            lat_us.fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                            done.fetch_add(1, Ordering::Relaxed);
                            i += appenders;
                        }
                        Ok(())
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_secs(seconds));
            stop.store(true, Ordering::Relaxed);
            for h in hs {
                h.join().map_err(|_| StoreError::Closed)??;
            }
            let el = started.elapsed().as_secs_f64();
            let n = done.load(Ordering::Relaxed);
            println!(
                "append: policy={policy:?} appenders={appenders} payload={payload}B records={n} \
                 elapsed={el:.2}s rate={:.0}/s mean_latency={:.0}us log_bytes={}",
                n as f64 / el,
                lat_us.load(Ordering::Relaxed) as f64 / n.max(1) as f64,
                store.size_bytes()
            );
            store.close()?;
            let _ = std::fs::remove_dir_all(&dir);
        }
        "open" => {
            let records: u64 = arg(&args, 3, 10_000_000);
            let payload: usize = arg(&args, 4, 16);
            let mut o = StoreOptions::new(&dir);
            o.fsync = FsyncPolicy::Never;
            let (store, _) = Store::open(o.clone())?;
            let have = store.next_offset();
            if have < records {
                let t0 = Instant::now();
                let mut next = have;
                while next < records {
                    let n = (records - next).min(4096);
                    let batch = (next..next + n).map(|i| record(payload, i)).collect();
                    store.append_batch(batch, Box::new(|_| {}))?;
                    next += n;
                }
                store.sync()?;
                println!(
                    "filled {} records in {:.1}s ({} bytes, {} segments)",
                    records - have,
                    t0.elapsed().as_secs_f64(),
                    store.size_bytes(),
                    store.segment_count()
                );
            }
            store.close()?;
            drop(store);
            o.fsync = FsyncPolicy::Always;
            let t0 = Instant::now();
            let (store, rep) = Store::open(o)?;
            let el = t0.elapsed();
            println!(
                "open: records={} segments={} scanned_segments={} scanned_bytes={} elapsed={:.3}s",
                rep.next_offset,
                rep.segments,
                rep.scanned_segments,
                rep.scanned_bytes,
                el.as_secs_f64()
            );
            let t0 = Instant::now();
            let r = store.read(rep.next_offset / 2)?;
            println!("random read of offset {} took {:?}", r.offset, t0.elapsed());
            store.close()?;
        }
        other => {
            eprintln!("unknown mode {other}: use append or open");
        }
    }
    Ok(())
}
