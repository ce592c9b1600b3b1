//! The `lanemq` binary: `serve`, `generate-config`, `check-config`, `bench`, `streams`, `lanes`, ...

mod admin_client;
mod alloc;
mod disk_space;
mod fd_limit;
mod lanes_cli;
mod streams_cli;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use lanemq_broker::{Config, Server, DEFAULT_CONFIG_TOML};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::{info, warn};

#[derive(Parser)]
#[command(
    name = "lanemq",
    version,
    about = "MQTT 5 broker with durable named streams and lite-topic lanes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker (with no flags and no file: 127.0.0.1:1883, embedded default config).
    Serve(ServeArgs),
    /// Print the commented default configuration (etc/lanemq.toml).
    GenerateConfig,
    /// Check a configuration file; prints every error and exits non-zero if there is any.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Load generator: publishers and subscribers against an MQTT broker.
    Bench(lanemq_bench::BenchOpts),
    /// Add or update a user in a mosquitto_passwd-compatible password file (the password is
    /// read from the terminal without echo, or from stdin).
    Passwd {
        /// The password file (created if missing).
        file: PathBuf,
        /// The user name.
        user: String,
        /// Remove the user instead.
        #[arg(long)]
        delete: bool,
        /// Store a SCRAM-SHA-256 entry (`SCRAM-SHA-256$...`, lanemq only) instead of `$7$`:
        /// usable for MQTT 5 SCRAM-SHA-256 and for CONNECT passwords; mosquitto cannot read it.
        #[arg(long, conflicts_with = "delete")]
        scram_sha_256: bool,
    },
    /// ACL tools.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Manage named streams through the REST admin API of a running broker.
    Streams(streams_cli::StreamsArgs),
    /// Lite parents, lanes, groups and lane metrics through the REST admin API.
    Lanes(lanes_cli::LanesArgs),
    /// Offline tools for the shared log (run them while the broker is stopped).
    Log {
        #[command(subcommand)]
        command: LogCommand,
    },
}

#[derive(Subcommand)]
enum AclCommand {
    /// Print the decision of an ACL file for one request and the rule (file:line) that made
    /// it; exit status 0 allow, 1 deny.
    Check {
        /// ACL file (default: the embedded acl/default.acl).
        #[arg(long)]
        file: Option<PathBuf>,
        #[arg(long)]
        user: Option<String>,
        #[arg(long, default_value = "")]
        client: String,
        #[arg(long, default_value = "127.0.0.1")]
        ip: std::net::IpAddr,
        /// publish, subscribe or create.
        #[arg(long)]
        action: lanemq_acl::Action,
        #[arg(long)]
        topic: String,
        /// The subscription would auto-create a stream.
        #[arg(long)]
        auto_create: bool,
    },
}

#[derive(Subcommand)]
enum LogCommand {
    /// Check every record of the log (length, CRC32C, sequence) and the lane index against it
    /// (entries, chains, the lane table journal); exit status 1 on any problem.
    Verify {
        /// Data directory (the log is in DIR/log).
        #[arg(long, env = "LANEMQ_DATA_DIR", default_value = "data")]
        data_dir: PathBuf,
    },
    /// Print records: offset, time, QoS, retain, topic, payload size.
    Dump {
        #[arg(long, env = "LANEMQ_DATA_DIR", default_value = "data")]
        data_dir: PathBuf,
        /// First offset to print.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most records to print.
        #[arg(long, default_value_t = 100)]
        limit: u64,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML). Without it the embedded default is used.
    #[arg(long, short, env = "LANEMQ_CONFIG")]
    config: Option<PathBuf>,
    /// Replace the listeners with one plain MQTT listener on this address.
    #[arg(long, env = "LANEMQ_MQTT")]
    mqtt: Option<SocketAddr>,
    /// Data directory (overrides server.data_dir).
    #[arg(long, env = "LANEMQ_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Accept clients without credentials (overrides server.allow_anonymous).
    #[arg(long)]
    allow_anonymous: bool,
    /// ACL file (overrides server.acl_file).
    #[arg(long, env = "LANEMQ_ACL")]
    acl: Option<PathBuf>,
    /// Password file (overrides server.password_file).
    #[arg(long, env = "LANEMQ_PASSWD")]
    passwd: Option<PathBuf>,
    /// Serve the REST admin API on this address (overrides admin.bind and enables it), or
    /// `off` to disable it.
    #[arg(long, env = "LANEMQ_HTTP", value_name = "ADDR|off")]
    http: Option<HttpArg>,
    /// Cluster mode on NATS JetStream: the servers, comma-separated (overrides
    /// cluster.servers; docs/cluster.md).
    #[arg(
        long,
        env = "LANEMQ_CLUSTER",
        value_name = "nats://HOST:PORT[,...]",
        value_delimiter = ','
    )]
    cluster: Option<Vec<String>>,
    /// This node's name in the cluster (overrides cluster.node_id).
    #[arg(long, env = "LANEMQ_NODE_ID")]
    node_id: Option<String>,
    /// Log lines as text (coloured only on a terminal, never with NO_COLOR set) or as one
    /// JSON object per line, for log shippers.
    #[arg(long, env = "LANEMQ_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `--http`: an address, or `off`.
#[derive(Clone, Copy, Debug)]
enum HttpArg {
    Off,
    Bind(SocketAddr),
}

impl std::str::FromStr for HttpArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<HttpArg, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(HttpArg::Off);
        }
        t.parse()
            .map(HttpArg::Bind)
            .map_err(|e| format!("{t:?}: expected host:port (e.g. 127.0.0.1:18083) or off: {e}"))
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::GenerateConfig => {
            print!("{DEFAULT_CONFIG_TOML}");
            Ok(())
        }
        Command::CheckConfig { file } => check_config(&file),
        Command::Serve(args) => serve(args),
        Command::Bench(opts) => bench(opts),
        Command::Log { command } => log_command(command),
        Command::Passwd {
            file,
            user,
            delete,
            scram_sha_256,
        } => passwd(&file, &user, delete, scram_sha_256),
        Command::Acl { command } => acl_command(command),
        Command::Streams(args) => streams_cli::run(args),
        Command::Lanes(args) => lanes_cli::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanemq: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<Config> {
    load_config_with(path, |_| {})
}

/// The configuration file (or the embedded default) with `adjust` applied before it is
/// validated: the command line's overrides are part of what is checked.
fn load_config_with(path: Option<&Path>, adjust: impl Fn(&mut Config)) -> Result<Config> {
    let text = match path {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?
        }
        None => DEFAULT_CONFIG_TOML.to_string(),
    };
    let origin = path.map_or_else(
        || "embedded default".to_string(),
        |p| p.display().to_string(),
    );
    Config::from_toml_with(&text, adjust).map_err(|e| anyhow::anyhow!("{origin}: {e}"))
}

fn check_config(file: &Path) -> Result<()> {
    load_config(Some(file))?;
    println!("{}: ok", file.display());
    Ok(())
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`). Text is coloured only when
/// stderr is a terminal and `NO_COLOR` is unset or empty (no-color.org); JSON is one object a
/// line with `timestamp`, `level`, `target` and `fields`.
fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            fmt.with_ansi(colour).init();
        }
        LogFormat::Json => fmt.json().with_ansi(false).init(),
    }
}

/// The command line's overrides of the configuration (`serve`'s flags).
fn apply_args(args: &ServeArgs, config: &mut Config) {
    if let Some(addr) = args.mqtt {
        config.listeners = vec![lanemq_broker::ListenerConfig {
            bind: addr,
            ..Default::default()
        }];
    }
    if let Some(dir) = &args.data_dir {
        config.server.data_dir = dir.clone();
    }
    if args.allow_anonymous {
        config.server.allow_anonymous = true;
    }
    if let Some(f) = &args.acl {
        config.server.acl_file = Some(f.clone());
    }
    if let Some(f) = &args.passwd {
        config.server.password_file = Some(f.clone());
    }
    match args.http {
        Some(HttpArg::Off) => config.admin.enable = false,
        Some(HttpArg::Bind(addr)) => {
            config.admin.enable = true;
            config.admin.bind = addr;
        }
        None => {}
    }
    if let Some(servers) = &args.cluster {
        config.cluster.servers = servers
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    if let Some(id) = &args.node_id {
        config.cluster.node_id = id.clone();
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    init_tracing(args.log_format);
    let config = load_config_with(args.config.as_deref(), |c| apply_args(&args, c))?;
    match fd_limit::raise() {
        Ok((before, after)) => {
            if after > before {
                info!(from = before, to = after, "open files limit raised");
            }
            // Every connection is a descriptor, and so is every open log segment: the
            // active one plus at most storage.open_segments_max sealed ones.
            let wanted = u64::try_from(config.mqtt.max_connections)
                .unwrap_or(u64::MAX)
                .saturating_add(u64::try_from(config.storage.open_segments_max).unwrap_or(0));
            if after < wanted.saturating_add(64) {
                warn!(
                    open_files_limit = after,
                    max_connections = config.mqtt.max_connections,
                    open_segments_max = config.storage.open_segments_max,
                    "the open files limit (ulimit -Hn) is below mqtt.max_connections + storage.open_segments_max: connections beyond it are refused at accept"
                );
            }
        }
        Err(e) => warn!(error = %e, "cannot raise the open files limit"),
    }
    disk_space::check(&config.server.data_dir, &config.storage);
    alloc::configure();
    alloc::start_upkeep();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lanemq")
        .on_thread_park(alloc::collect_if_due)
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let grace = Duration::from_millis(config.server.shutdown_grace_ms);
        // Installed before the listeners accept: a SIGTERM during the start is a graceful stop
        // once the start is done, never the default action (an abrupt exit).
        let mut signals = Signals::install()?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot install SIGHUP handler")?;
        let server = Server::start(config)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        info!(
            version = env!("CARGO_PKG_VERSION"),
            addrs = ?server.local_addrs(),
            admin = ?server.admin_addr(),
            "lanemq ready"
        );
        let broker = server.broker().clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match broker.reload_auth() {
                    Ok(revoked) => {
                        info!(revoked, "SIGHUP: password file and ACL reloaded; subscriptions the new rules deny were revoked")
                    }
                    Err(e) => {
                        warn!(error = %e, "SIGHUP: reload failed, the previous rules stay in force")
                    }
                }
            }
        });
        signals.next().await;
        info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down (a second signal quits at once)"
        );
        tokio::select! {
            _ = server.shutdown(grace) => {}
            _ = signals.next() => {
                warn!("second signal: quitting now");
                std::process::exit(130);
            }
        }
        info!("stopped");
        Ok::<(), anyhow::Error>(())
    })?;
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

/// SIGTERM and SIGINT, received from the moment `install` returns.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

fn read_password() -> Result<String> {
    use std::io::{BufRead, IsTerminal, Write};
    let tty = std::io::stdin().is_terminal();
    let echo_off = |on: bool| {
        let _ = std::process::Command::new("stty")
            .arg(if on { "echo" } else { "-echo" })
            .stdin(std::process::Stdio::inherit())
            .status();
    };
    let mut line = String::new();
    if tty {
        eprint!("Password: ");
        let _ = std::io::stderr().flush();
        echo_off(false);
        let r = std::io::stdin().lock().read_line(&mut line);
        echo_off(true);
        eprintln!();
        r?;
    } else {
        std::io::stdin().lock().read_line(&mut line)?;
    }
    let pw = line.trim_end_matches(['\n', '\r']).to_string();
    if pw.is_empty() {
        anyhow::bail!("empty password");
    }
    Ok(pw)
}

fn passwd(file: &Path, user: &str, delete: bool, scram_sha_256: bool) -> Result<()> {
    let mut pf = if file.exists() {
        lanemq_acl::PasswordFile::load(file).map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        lanemq_acl::PasswordFile::new()
    };
    if delete {
        if !pf.remove(user) {
            anyhow::bail!("{user}: no such user in {}", file.display());
        }
    } else {
        let pw = read_password()?;
        if scram_sha_256 {
            pf.upsert_scram_sha256(user, pw.as_bytes())
        } else {
            pf.upsert(user, pw.as_bytes())
        }
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    pf.save(file)
        .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(())
}

fn acl_command(command: AclCommand) -> Result<()> {
    let AclCommand::Check {
        file,
        user,
        client,
        ip,
        action,
        topic,
        auto_create,
    } = command;
    let acl = match &file {
        Some(f) => lanemq_acl::Acl::load(f).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => lanemq_acl::Acl::embedded_default(),
    };
    let req = lanemq_acl::Request {
        username: user.as_deref(),
        client_id: &client,
        ip,
        action,
        topic: &topic,
    };
    let d = match action {
        lanemq_acl::Action::Subscribe => acl.check_subscribe(&req, auto_create),
        _ => acl.check(&req),
    };
    println!("{d}");
    if d.allowed {
        Ok(())
    } else {
        std::process::exit(1);
    }
}

fn log_command(command: LogCommand) -> Result<()> {
    match command {
        LogCommand::Verify { data_dir } => {
            let report = lanemq_store::verify(&data_dir).with_context(|| {
                format!("cannot read the log in {}", data_dir.join("log").display())
            })?;
            println!(
                "{}: {} records in {} segments, offsets {}..{}",
                data_dir.join("log").display(),
                report.records,
                report.segments.len(),
                report.first_offset,
                report.next_offset
            );
            if let Some(t) = &report.torn_tail {
                println!(
                    "torn tail (cut at the next start): {} at byte {}: {}",
                    t.segment.display(),
                    t.position,
                    t.reason
                );
            }
            for p in &report.problems {
                println!(
                    "problem: {} at byte {}: {}",
                    p.segment.display(),
                    p.position,
                    p.reason
                );
            }
            let lanes = lanemq_lite::verify::verify(&data_dir).with_context(|| {
                format!(
                    "cannot read the lane index in {}",
                    data_dir.join("lanes").display()
                )
            })?;
            if lanes.present {
                println!(
                    "{}: {} lanes, {} entries, {} matched with their records' lane hints; \
                     {} entries of records retention removed, {} past the last checkpoint \
                     (indexed again at start), {} hints after the watermark, {} hints of \
                     removed lanes",
                    data_dir.join("lanes").display(),
                    lanes.lanes,
                    lanes.entries,
                    lanes.matched,
                    lanes.of_deleted_records,
                    lanes.past_end,
                    lanes.not_indexed_yet,
                    lanes.hints_without_entry
                );
                for p in &lanes.problems {
                    println!("problem: lane index: {p}");
                }
            }
            let streams = lanemq_streams::verify::verify(&data_dir).with_context(|| {
                format!(
                    "cannot read the stream index in {}",
                    data_dir.join("streams").display()
                )
            })?;
            if streams.streams > 0 {
                println!(
                    "{}: {} regular streams, {} entries, {} matched with their records; {} \
                     entries of records retention removed, {} past the last checkpoint \
                     (indexed again at start), {} matching records after the watermark",
                    data_dir.join("streams").display(),
                    streams.streams,
                    streams.entries,
                    streams.matched,
                    streams.of_deleted_records,
                    streams.past_end,
                    streams.not_indexed_yet
                );
                for p in &streams.problems {
                    println!("problem: stream index: {p}");
                }
            }
            if report.is_ok() && lanes.is_ok() && streams.is_ok() {
                println!("ok");
                Ok(())
            } else {
                anyhow::bail!(
                    "{} problem(s) found",
                    report.problems.len() + lanes.problems.len() + streams.problems.len()
                )
            }
        }
        LogCommand::Dump {
            data_dir,
            from,
            limit,
        } => {
            let mut out = std::io::stdout().lock();
            lanemq_store::dump(&data_dir, from, limit, &mut out).with_context(|| {
                format!("cannot read the log in {}", data_dir.join("log").display())
            })?;
            Ok(())
        }
    }
}

fn bench(opts: lanemq_bench::BenchOpts) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(lanemq_bench::run(opts))?;
    Ok(())
}
