//! Comparison probe: the same QoS 0 fan-in load (N publishers → 1 subscriber,
//! 64-byte payloads) driven through rumqttc's v5 client instead of the
//! built-in raw-TCP client. Kept to document why lanemq-bench uses the raw
//! client (see docs/benchmarks.md). Usage:
//!
//! cargo run --release -p lanemq-bench --example rumqttc_probe -- PORT [PUBS] [SECS]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

fn opts(id: &str, port: u16) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(60));
    o.set_request_channel_capacity(10_000);
    o
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().context("PORT")?.parse()?;
    let pubs: usize = args.next().map_or(Ok(10), |s| s.parse())?;
    let secs: f64 = args.next().map_or(Ok(5.0), |s| s.parse())?;
    let topic = format!("rumqttc-probe/{}", std::process::id());

    let received = Arc::new(AtomicU64::new(0));
    let (sub, mut sub_loop) = AsyncClient::new(opts("probe-sub", port), 10_000);
    sub.subscribe(topic.clone(), QoS::AtMostOnce).await?;
    let r = received.clone();
    let sub_task = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs_f64(secs + 10.0);
        while Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(2), sub_loop.poll()).await {
                Ok(Ok(Event::Incoming(rumqttc::v5::Incoming::Publish(_)))) => {
                    r.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => break,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for i in 0..pubs {
        let (client, mut ev) = AsyncClient::new(opts(&format!("probe-pub{i}"), port), 10_000);
        let poller = tokio::spawn(async move {
            while Instant::now() < end + Duration::from_secs(2) {
                match tokio::time::timeout(Duration::from_secs(2), ev.poll()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) | Err(_) => break,
                }
            }
        });
        let (topic, sent) = (topic.clone(), sent.clone());
        let payload = Bytes::from(vec![b'x'; 64]);
        let publisher = tokio::spawn(async move {
            while Instant::now() < end {
                if client
                    .publish_bytes(topic.clone(), QoS::AtMostOnce, false, payload.clone())
                    .await
                    .is_err()
                {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            let _ = client.disconnect().await;
        });
        tasks.push((publisher, poller));
    }
    for (p, e) in tasks {
        let _ = p.await;
        let _ = e.await;
    }
    let pub_secs = start.elapsed().as_secs_f64();
    let _ = sub_task.await;
    let s = sent.load(Ordering::Relaxed);
    let r = received.load(Ordering::Relaxed);
    println!(
        "rumqttc v5 qos0 fan-in {pubs}->1: sent {s} ({:.0} msg/s), received {r} ({:.0} msg/s over the publish window)",
        s as f64 / secs,
        r as f64 / pub_secs
    );
    Ok(())
}
