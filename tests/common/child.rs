//! The child broker (the real `lanemq` binary) used by the kill -9 and restart tests.

use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The `lanemq` binary: `LANEMQ_BIN`, else the newest of target/{release,ci,debug}/lanemq.
pub fn lanemq_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LANEMQ_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "LANEMQ_BIN={} does not exist (build it: cargo build --release -p lanemq)",
            p.display()
        );
        return p;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut candidates = vec![
        root.join("target/release/lanemq"),
        root.join("target/ci/lanemq"),
        root.join("target/debug/lanemq"),
    ];
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        let t = PathBuf::from(t);
        candidates.push(t.join("release/lanemq"));
        candidates.push(t.join("ci/lanemq"));
        candidates.push(t.join("debug/lanemq"));
    }
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
        .max_by_key(|(m, _)| *m)
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "the lanemq binary is missing (looked for {}): build it first with \
                 `cargo build --release -p lanemq`, or set LANEMQ_BIN",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// A free port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// A temp directory, removed on drop unless the test panicked or `KEEP_TMP=1`.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("lanemq-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var("KEEP_TMP").as_deref() == Ok("1") {
            eprintln!("kept {} (broker.log, data/)", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A `lanemq serve` child process; killed (SIGKILL) and reaped on drop.
pub struct Broker {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    pub bin: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    pub starts: u32,
    // Last: dropped after the child is gone.
    pub dir: TempDir,
}

impl Broker {
    /// Write the config (`extra_toml` appended) and start the broker; returns once it
    /// accepts TCP connections.
    pub async fn start(tag: &str, extra_toml: &str) -> Broker {
        let dir = TempDir::new(tag);
        let data_dir = dir.0.join("data");
        let config_path = dir.0.join("lanemq.toml");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let toml = compose("", extra_toml);
        std::fs::write(&config_path, toml).expect("write config");
        let mut b = Broker {
            child: None,
            addr,
            data_dir,
            bin: lanemq_bin(),
            config_path,
            log_path: dir.0.join("broker.log"),
            starts: 0,
            dir,
        };
        b.spawn().await;
        b
    }

    async fn spawn(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open broker log");
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--mqtt")
            .arg(self.addr.to_string())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.starts += 1;
        self.wait_ready().await;
    }

    /// Until the port accepts connections; panics if the child exits or 20 s pass.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "broker (start #{}) exited with {status} before accepting connections \
                     on {}; broker log tail:\n{}",
                    self.starts,
                    self.addr,
                    self.log_tail(40)
                );
            }
            let probe = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(self.addr),
            )
            .await;
            // The port accepting is not enough: another test's process may have taken it
            // between `free_port` and our bind (then our broker exits with "address in use",
            // reported above). Ours logs "lanemq ready" once per start.
            if let Ok(Ok(s)) = probe {
                drop(s);
                let readies = std::fs::read_to_string(&self.log_path)
                    .map_or(0, |t| t.matches("lanemq ready").count());
                if readies >= self.starts as usize || std::env::var_os("RUST_LOG").is_some() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "broker (start #{}) did not accept on {} within 20 s; log tail:\n{}",
                self.starts,
                self.addr,
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("broker running").id()
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, wait for the exit (bounded); returns the exit status.
    pub async fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("broker running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "broker did not exit within 15 s of SIGTERM; log tail:\n{}",
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Start again on the same port, data dir and config.
    pub async fn restart(&mut self) {
        self.spawn().await;
    }

    /// The last `n` lines of the broker's stdout/stderr (all starts).
    pub fn log_tail(&self, n: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Broker {
    /// Like [`Broker::start`], with an ACL file (`acl_text`, written to the test's temp dir) as
    /// `server.acl_file`: `extra_toml` cannot hold it, as `[server]` is already in the config.
    pub async fn start_with_acl(tag: &str, acl_text: &str, extra_toml: &str) -> Broker {
        let dir = TempDir::new(tag);
        let acl_path = dir.0.join("test.acl");
        std::fs::write(&acl_path, acl_text).expect("write acl");
        let data_dir = dir.0.join("data");
        let config_path = dir.0.join("lanemq.toml");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let acl = format!("acl_file = {:?}\n", acl_path.display().to_string());
        let toml = compose(&acl, extra_toml);
        std::fs::write(&config_path, toml).expect("write config");
        let mut b = Broker {
            child: None,
            addr,
            data_dir,
            bin: lanemq_bin(),
            config_path,
            log_path: dir.0.join("broker.log"),
            starts: 0,
            dir,
        };
        b.spawn().await;
        b
    }
}

/// The test config: quiet `[server]` (plus `server_extra` lines), a large queue limit, the
/// REST API only where a test asks for it (`[admin]` in `extra_toml`), then `extra_toml`. A
/// test's own `[mqtt]` table gets the queue limit added instead of a second table.
fn compose(server_extra: &str, extra_toml: &str) -> String {
    let admin = if extra_toml.contains("[admin]") {
        ""
    } else {
        "[admin]\nenable = false\n\n"
    };
    let (mqtt, extra) = if extra_toml.contains("[mqtt]\n") {
        (
            "",
            extra_toml.replacen("[mqtt]\n", "[mqtt]\nmax_queued_messages = 1000000\n", 1),
        )
    } else {
        (
            "[mqtt]\nmax_queued_messages = 1000000\n\n",
            extra_toml.to_string(),
        )
    };
    format!(
        "[server]\nsys_interval_s = 0\nshutdown_grace_ms = 2000\n{server_extra}\n{mqtt}{admin}{extra}"
    )
}
