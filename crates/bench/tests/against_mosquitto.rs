//! End-to-end checks of the generator against a real broker: Debian's
//! mosquitto on a free 127.0.0.1 port. Skipped (passing) when
//! /usr/sbin/mosquitto is not installed.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lanemq_bench::{run, BenchOpts, TopicMode};

const MOSQUITTO: &str = "/usr/sbin/mosquitto";

struct Broker {
    child: Child,
    port: u16,
    _dir: std::path::PathBuf,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn mosquitto() -> Option<Broker> {
    if !Path::new(MOSQUITTO).exists() {
        eprintln!("skipping: {MOSQUITTO} not installed");
        return None;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("lanemq-bench-test-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
             max_queued_messages 1000000\nmax_inflight_messages 100\n"
        ),
    )
    .unwrap();
    let child = Command::new(MOSQUITTO)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mosquitto did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Broker {
        child,
        port,
        _dir: dir,
    })
}

fn opts(port: u16) -> BenchOpts {
    BenchOpts {
        port,
        count: Some(2_000),
        duration: Some(10.0),
        timeout: Some(30.0),
        drain: 2.0,
        quiet: true,
        ..BenchOpts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_levels_versions_and_modes_deliver_everything() {
    let Some(b) = mosquitto() else { return };
    for (qos, v, mode, pubs, subs) in [
        (0, 5, TopicMode::FanIn, 2, 1),
        (1, 5, TopicMode::FanIn, 3, 2),
        (2, 5, TopicMode::Pairs, 2, 2),
        (1, 3, TopicMode::FanOut, 1, 3),
        (2, 3, TopicMode::FanIn, 2, 1),
    ] {
        let o = BenchOpts {
            qos,
            mqtt_version: v,
            topic_mode: mode,
            publishers: pubs,
            subscribers: subs,
            broker_pid: Some(b.child.id()),
            ..opts(b.port)
        };
        let r = run(o).await.unwrap();
        let what = format!("qos{qos} v{v} {mode:?}: {r}");
        assert!(r.errors.is_empty(), "{what}");
        assert!(!r.timed_out, "{what}");
        assert_eq!(r.published, 2_000 * pubs as u64, "{what}");
        let per_msg = if mode == TopicMode::Pairs {
            1
        } else {
            subs as u64
        };
        assert_eq!(r.expected, r.published * per_msg, "{what}");
        assert_eq!(r.received, r.expected, "{what}");
        assert_eq!(r.loss, 0, "{what}");
        if qos > 0 {
            assert_eq!(r.acked, r.published, "{what}");
        }
        let lat = r.latency.as_ref().unwrap();
        assert_eq!(lat.samples, r.received, "{what}");
        assert!(
            lat.p50_us > 0.0 && lat.p50_us <= lat.p99_us && lat.p99_us <= lat.max_us,
            "{what}"
        );
        assert!(r.broker_rss_max_kb.unwrap() > 0, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_is_paced_and_duration_bounds_the_run() {
    let Some(b) = mosquitto() else { return };
    let o = BenchOpts {
        publishers: 4,
        rate: 2_000,
        count: None,
        duration: Some(1.5),
        warmup: 0.5,
        ..opts(b.port)
    };
    let t = Instant::now();
    let r = run(o).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{r}");
    // 2000 msg/s for 1.5 s measured
    assert!((2_700..=3_300).contains(&r.published), "{r}");
    assert!((r.msgs_per_sec_in - 2_000.0).abs() < 200.0, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_report_rss() {
    let Some(b) = mosquitto() else { return };
    let o = BenchOpts {
        idle_connections: 200,
        duration: Some(1.0),
        count: None,
        broker_pid: Some(b.child.id()),
        ..opts(b.port)
    };
    let r = run(o).await.unwrap();
    let idle = r.idle.as_ref().unwrap();
    assert_eq!(idle.connected, 200, "{r}");
    assert_eq!(idle.failed, 0, "{r}");
    assert!(idle.rss_per_connection_bytes.is_some(), "{r}");
}

#[tokio::test]
async fn refused_connection_is_an_error_not_a_hang() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    assert!(run(opts(port)).await.is_err());
    assert!(t.elapsed() < Duration::from_secs(5));
}
