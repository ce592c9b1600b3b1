//! Listeners (TCP, TLS, WebSocket) and the server lifecycle.

use crate::anyhow_lite;
use crate::broker::Broker;
use crate::config::{Config, ListenerKind};
use crate::connection::serve_tcp;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Live connection tasks, so shutdown can wait for them to drain.
#[derive(Default)]
pub struct ConnTracker {
    active: AtomicUsize,
    idle: Notify,
}

impl ConnTracker {
    fn enter(self: &Arc<Self>) -> ConnGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        ConnGuard(self.clone())
    }
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

pub struct ConnGuard(Arc<ConnTracker>);
impl Drop for ConnGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A running broker.
pub struct Server {
    broker: Arc<Broker>,
    addrs: Vec<SocketAddr>,
    accept_tasks: Vec<JoinHandle<()>>,
    tracker: Arc<ConnTracker>,
    /// The REST admin API (`admin.enable`): its bound address and its task.
    admin_addr: Option<SocketAddr>,
    admin_task: Option<JoinHandle<()>>,
}

impl Server {
    /// Bind every configured listener and start serving.
    pub async fn start(config: Config) -> anyhow_lite::Result<Server> {
        // Listeners first (bind, certificates): a bad listener fails before storage is opened.
        let mut bound = Vec::new();
        for l in &config.listeners {
            let acceptor = crate::listener::Acceptor::new(l)?;
            let listener = TcpListener::bind(l.bind).await.map_err(|e| {
                anyhow_lite::Error(format!(
                    "cannot bind {:?} listener on {}: {e}",
                    l.kind, l.bind
                ))
            })?;
            let addr = listener
                .local_addr()
                .map_err(|e| anyhow_lite::Error(e.to_string()))?;
            bound.push((l.kind, addr, listener, acceptor));
        }
        // The admin API: bound and its token loaded before storage, like the listeners.
        let admin = if config.admin.enable {
            Some(
                crate::admin::prepare(&config)
                    .await
                    .map_err(anyhow_lite::Error)?,
            )
        } else {
            None
        };
        let auth = crate::broker::Auth::load(&config.server).map_err(anyhow_lite::Error)?;
        // Cluster mode: the NATS servers and the log stream before storage (an empty local
        // log starts where the cluster's log starts).
        let cluster = if config.cluster.enabled() {
            let c = crate::cluster_state::Cluster::connect(&config.cluster)
                .await
                .map_err(|e| anyhow_lite::Error(format!("cluster: {e}")))?;
            let state = c
                .link
                .state()
                .await
                .map_err(|e| anyhow_lite::Error(format!("cluster: {e}")))?;
            // The newest offset mark (JetStream may still be electing the stream's leader).
            let deadline = tokio::time::Instant::now()
                + std::time::Duration::from_millis(config.cluster.connect_timeout_ms);
            let mark = loop {
                match c.link.last_mark().await {
                    Ok(m) => break m,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(error = %e, "cluster: offset mark not read yet; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    }
                    Err(e) => return Err(anyhow_lite::Error(format!("cluster: {e}"))),
                }
            };
            let version = c.link.server_version();
            info!(node = %config.cluster.node_id, stream = %config.cluster.stream,
                first_seq = state.first_seq, last_seq = state.last_seq, nats_server = %version, "cluster: joined");
            match lanemq_cluster::can_sync_always(&version) {
                Some(false) => tracing::warn!(nats_server = %version,
                    "cluster: this nats-server cannot fsync before it acknowledges (jetstream sync_interval: always needs 2.10 or later): \
                     an acknowledged message is lost if a majority of the nats-servers lose power, or are all killed, before they flush it (docs/cluster.md, Durability)"),
                Some(true) => info!(nats_server = %version,
                    "cluster: acknowledged messages survive a power loss of the nats-servers only with jetstream {{ sync_interval: always }} in their configuration (docs/cluster.md, Durability)"),
                None => {}
            }
            Some((c, state, crate::cluster::join_point(state, mark)))
        } else {
            None
        };
        let base = cluster
            .as_ref()
            .and_then(|(_, _, join)| join.as_ref().ok())
            .map_or(0, |p| p.offset);
        let data_dir = config.server.data_dir.clone();
        let storage = config.storage.clone();
        let persist = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&data_dir).map_err(|e| {
                anyhow_lite::Error(format!(
                    "cannot create data dir {}: {e}",
                    data_dir.display()
                ))
            })?;
            crate::persist::Persist::open_at(&data_dir, &storage, base).map_err(|e| {
                anyhow_lite::Error(format!(
                    "cannot open storage in {}: {e}",
                    data_dir.display()
                ))
            })
        })
        .await
        .map_err(|e| anyhow_lite::Error(e.to_string()))??;
        let mut cluster_start = None;
        if let Some((_, state, join)) = &cluster {
            let start = crate::cluster::resume_point(&persist.store).and_then(|p| match p {
                Some(p) => crate::cluster::check_alignment(p, *state).map(|()| p),
                None => join.clone(),
            });
            match start {
                Ok(p) => cluster_start = Some(p),
                Err(why) => {
                    persist.close();
                    return Err(anyhow_lite::Error(format!("cluster: {why}")));
                }
            }
        }
        let streams = {
            let p = persist.clone();
            let settings = config.streams_config.clone();
            // Cluster mode: the declared streams and parents go through the log instead
            // (`crate::cluster::declare_configured`), so every node has them from one offset.
            let defs = if cluster.is_some() {
                Vec::new()
            } else {
                config.streams.clone()
            };
            tokio::task::spawn_blocking(move || {
                let r = lanemq_streams::engine::Engine::open(
                    p.store.clone(),
                    &p.index,
                    settings,
                    &defs,
                );
                if r.is_err() {
                    p.close();
                }
                r
            })
            .await
            .map_err(|e| anyhow_lite::Error(e.to_string()))?
            .map_err(|e| anyhow_lite::Error(format!("cannot open the stream registry: {e}")))?
        };
        streams
            .start()
            .map_err(|e| anyhow_lite::Error(format!("cannot start the stream indexer: {e}")))?;
        let lite = {
            let p = persist.clone();
            let parents = if cluster.is_some() {
                Vec::new()
            } else {
                config.lite.parents.clone()
            };
            tokio::task::spawn_blocking(move || {
                let r = lanemq_lite::Engine::open(p.store.clone(), &p.index, &parents);
                if r.is_err() {
                    p.close();
                }
                r
            })
            .await
            .map_err(|e| anyhow_lite::Error(e.to_string()))?
            .map_err(|e| anyhow_lite::Error(format!("cannot open the lite layer: {e}")))?
        };
        lite.warn_overlaps();
        if cluster.is_some() {
            lite.use_log_time();
        }
        let lite = Arc::new(crate::lite::Lite::new(lite, &config.lite));
        let broker = Broker::new(config, persist, auth, streams, lite);
        if let Some((c, _, _)) = cluster {
            let _ = broker.cluster.set(c);
        }
        let weak: std::sync::Weak<Broker> = Arc::downgrade(&broker);
        let host: std::sync::Weak<dyn crate::lite::Ingest> = weak;
        broker
            .lite
            .start(host, broker.persist.store.clone())
            .map_err(|e| anyhow_lite::Error(format!("cannot start the lane dispatcher: {e}")))?;
        let restored = {
            let b = broker.clone();
            tokio::task::spawn_blocking(move || {
                let r = b.restore();
                if r.is_err() {
                    b.persist.close();
                }
                r
            })
            .await
            .map_err(|e| anyhow_lite::Error(e.to_string()))?
            .map_err(|e| anyhow_lite::Error(format!("cannot restore state: {e}")))?
        };
        info!(
            sessions = restored.sessions,
            sessions_expired = restored.sessions_expired,
            queued = restored.queued,
            retained = restored.retained,
            replayed = restored.replayed,
            "state restored"
        );
        crate::connection::start_restored_timers(&broker, restored);
        if broker.clustered() {
            if let Some(start) = cluster_start {
                crate::cluster::spawn_replicator(broker.clone(), start);
            }
            crate::cluster_sessions::spawn_takeover_server(broker.clone());
            crate::cluster_sessions::spawn_sync(broker.clone());
            crate::cluster_sessions::spawn_positions(broker.clone());
            crate::cluster::spawn_lane_watch(broker.clone());
            // Declared streams and parents this node does not have yet exist before it
            // listens; when it has them all (a restart), a changed definition goes out in the
            // background and the listeners open at once.
            let missing = broker
                .config
                .streams
                .iter()
                .any(|d| broker.streams.get(&d.name).is_err())
                || broker
                    .config
                    .lite
                    .parents
                    .iter()
                    .any(|d| broker.lite.engine.get_parent(&d.name).is_err());
            let b = broker.clone();
            let declare =
                tokio::task::spawn_blocking(move || crate::cluster::declare_configured(&b));
            if missing {
                declare
                    .await
                    .map_err(|e| anyhow_lite::Error(e.to_string()))?;
            }
        }
        crate::retention::spawn(broker.clone());
        spawn_stream_gc(broker.clone());
        let tracker = Arc::new(ConnTracker::default());
        let mut addrs = Vec::new();
        let mut accept_tasks = Vec::new();
        for (kind, addr, listener, acceptor) in bound {
            info!(?kind, %addr, "listening");
            addrs.push(addr);
            accept_tasks.push(tokio::spawn(accept_loop(
                broker.clone(),
                listener,
                acceptor,
                tracker.clone(),
            )));
        }
        let admin_addr = admin.as_ref().map(crate::admin::Prepared::addr);
        let admin_task = admin.map(|a| crate::admin::spawn(broker.clone(), a));
        crate::sys::spawn(broker.clone());
        Ok(Server {
            broker,
            addrs,
            accept_tasks,
            tracker,
            admin_addr,
            admin_task,
        })
    }

    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Bound addresses, in listener order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The bound address of the REST admin API, when it is enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Stop accepting, send DISCONNECT 0x8B to every client and wait up to `grace` for the
    /// connections to close.
    pub async fn shutdown(self, grace: Duration) {
        for t in &self.accept_tasks {
            t.abort();
        }
        self.broker.begin_shutdown();
        let wait = async {
            loop {
                let idle = self.tracker.idle.notified();
                if self.tracker.active() == 0 {
                    return;
                }
                idle.await;
            }
        };
        if tokio::time::timeout(grace, wait).await.is_err() {
            warn!(
                remaining = self.tracker.active(),
                "grace period over, dropping connections"
            );
        }
        // The admin API stopped accepting at begin_shutdown; running requests get a moment.
        if let Some(mut t) = self.admin_task {
            let left = grace.clamp(Duration::from_millis(100), Duration::from_secs(1));
            if tokio::time::timeout(left, &mut t).await.is_err() {
                t.abort();
            }
        }
        let persist = self.broker.persist.clone();
        let streams = self.broker.streams.clone();
        let lite = self.broker.lite.clone();
        let _ = tokio::task::spawn_blocking(move || {
            lite.stop();
            streams.close();
            persist.close();
        })
        .await;
    }
}

/// Stream retention every `streams_config.gc_interval`: expired entries, count and byte limits,
/// deleted streams' leftovers.
fn spawn_stream_gc(broker: Arc<Broker>) {
    tokio::spawn(async move {
        loop {
            let every =
                Duration::from_millis(broker.streams.settings().gc_interval.as_millis().max(1000));
            tokio::time::sleep(every).await;
            if broker.is_shutting_down() {
                return;
            }
            let s = broker.streams.clone();
            match tokio::task::spawn_blocking(move || s.gc()).await {
                Ok(n) if n > 0 => tracing::debug!(removed = n, "stream retention"),
                _ => {}
            }
        }
    });
}

/// Turns an accepted TCP stream into an MQTT byte stream (plain, TLS or WebSocket).
pub enum Acceptor {
    Tcp,
    Tls(crate::tls::TlsAcceptor),
    Ws { path: String },
}

async fn accept_loop(
    broker: Arc<Broker>,
    listener: TcpListener,
    acceptor: Acceptor,
    tracker: Arc<ConnTracker>,
) {
    let acceptor = Arc::new(acceptor);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let guard = tracker.enter();
        let broker = broker.clone();
        // A plain TCP connection's task is its future alone (each level of futures keeps its
        // own copy of the arguments); the guard goes with the connection, which may hibernate
        // (leave its task). TLS and WebSocket connections are boxed: their futures are larger.
        match &*acceptor {
            Acceptor::Tcp => {
                tokio::spawn(serve_tcp(broker, stream, peer, guard));
            }
            Acceptor::Tls(_) | Acceptor::Ws { .. } => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match &*acceptor {
                        Acceptor::Tls(tls) => Box::pin(tls.serve(broker, stream, peer)).await,
                        Acceptor::Ws { path } => {
                            Box::pin(crate::ws::serve(broker, stream, peer, path)).await
                        }
                        Acceptor::Tcp => {}
                    }
                    drop(guard);
                });
            }
        }
    }
}

impl Acceptor {
    fn new(l: &crate::config::ListenerConfig) -> anyhow_lite::Result<Acceptor> {
        Ok(match l.kind {
            ListenerKind::Tcp => Acceptor::Tcp,
            ListenerKind::Tls => Acceptor::Tls(crate::tls::TlsAcceptor::new(l)?),
            ListenerKind::Ws => Acceptor::Ws {
                path: l.path.clone(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    /// Size of the future a function-like `f` returns, without calling it.
    fn output_size<A, B, C, D, F>(_: impl FnOnce(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// The future of a plain TCP connection's task is most of the memory of a connection
    /// that has not hibernated yet (docs/benchmarks.md, idle connections): keep it from growing
    /// back unnoticed.
    #[test]
    fn connection_task_future_is_small() {
        let task = output_size(
            |b: Arc<Broker>, s: TcpStream, p: SocketAddr, g: ConnGuard| serve_tcp(b, s, p, g),
        );
        eprintln!("connection task future: {task} B");
        assert!(task <= 800, "connection task future is {task} B");
    }
}
