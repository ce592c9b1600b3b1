//! Lane consumer groups: the dispatcher of the lite-topic layer (`docs/lanes.md`).
//!
//! A group is an MQTT shared subscription `$share/<group>/<filter>` whose filter lies inside
//! a lite parent; a plain subscription to one lane with the user property `lane-offset` is a
//! private group of one member. Group subscriptions never enter the router: one dispatcher
//! thread owns every group and is driven by events (new durable lane entries, acks,
//! members joining, leaving, going offline or online, timers). Per (group, lane) at most one
//! batch is in flight, to one member; the group offset (the first unacknowledged lane
//! offset) is stored in sled. A lane with news goes into its group's ready set, so the cost
//! of a delivery does not depend on the number of idle lanes.
//!
//! Acks (PUBACK of a lane delivery): 0x00 commits; 0x00 with `lane-suspend-ms=N` pauses the
//! lane for N ms (no commit, no attempt); `lane-retry-ms=N` the same, counting an attempt
//! (at `max_attempts` the message is dead-lettered); >= 0x80 dead-letters it to
//! `$dlq/<group>/<topic>` and commits. Redelivery follows MQTT-4.4.0-1: never on a timer to
//! the same connected client. The batch of a member whose connection is gone is handed to
//! another online member as new PUBLISH packets, or resent with DUP=1 when the member resumes.
//! A batch not fully acknowledged within the parent's `ack_timeout_ms` of being handed to a
//! member's session is taken back from that (still connected) member and handed to another
//! online member with DUP=1, counting one attempt (at `max_attempts`: dead-lettered); the
//! holder is marked stuck (no new batches) until it sends a PUBACK or connects again. With no
//! other member to take it, the batch stays where it is (nothing is resent to the holder).
//! Ack deadlines sit in a heap like the pause timers: no scan of the batches.

use crate::message::{Delivery, Message, NOT_STORED};
use crate::session::Session;
use lanemq_lite::engine::Pending;
use lanemq_lite::journal::RunMark;
use lanemq_lite::{Engine, LaneSel, Mode};
use lanemq_protocol::{topic, QoS};
use lanemq_store::Store;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Lane messages of one member queued or in flight at most (per group).
const MEMBER_WINDOW_DEFAULT: usize = 1024;
/// Ready lanes handled before events are looked at again.
const DISPATCH_BUDGET: usize = 2048;
/// Newest entries kept in memory per lane (the live path).
const RECENT_PER_LANE: usize = 64;
/// Lanes with entries kept in memory at most (beyond: cleared, reads go to sled).
const RECENT_LANES_MAX: usize = 262_144;
/// Shortest pause of `lane-suspend-ms` / `lane-retry-ms`.
pub const SUSPEND_MIN_MS: u64 = 50;
/// Ack deadline entries kept before stale ones are compacted away (at least).
const DEADLINES_MIN_CAP: usize = 4096;

pub use crate::message::LaneTag;
pub use cluster::LaneOp;

#[path = "lite_cluster.rs"]
mod cluster;

/// What the dispatcher needs of the broker besides the log: to route a stored message (a
/// dead letter, once durable). The broker implements it; the dispatcher holds it weakly
/// (it never keeps the broker alive).
pub trait Ingest: Send + Sync {
    fn ingest_stored(&self, msg: Arc<Message>);
    /// Cluster mode: publish a message of the dispatcher's own (a dead letter) through the
    /// cluster's log and return true; false on a single node (the caller appends it).
    fn publish_clustered(&self, msg: &Message) -> bool;
    /// Cluster mode: this node's id (`None`: a single node).
    fn cluster_node(&self) -> Option<String>;
    /// Cluster mode: write a lane record to the cluster's log (in the order of the calls).
    fn lane_op(&self, op: LaneOp);
}

/// Where a new group starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    /// Only messages stored at or after this log position.
    Latest(u64),
    /// From this lane offset on.
    Offset(u64),
}

impl Start {
    fn encode(self) -> [u8; 9] {
        let (t, v) = match self {
            Start::Earliest => (0u8, 0u64),
            Start::Latest(p) => (1, p),
            Start::Offset(o) => (2, o),
        };
        let mut b = [0u8; 9];
        b[0] = t;
        b[1..].copy_from_slice(&v.to_be_bytes());
        b
    }

    fn decode(v: &[u8]) -> Start {
        let n = v
            .get(1..9)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_be_bytes);
        match v.first() {
            Some(1) => Start::Latest(n),
            Some(2) => Start::Offset(n),
            _ => Start::Earliest,
        }
    }

    /// The `lane-offset` user property of a SUBSCRIBE: `earliest`, `latest` or `<n>`.
    pub fn from_user_properties(
        props: &[(String, String)],
        log_next: u64,
    ) -> Result<Option<Start>, String> {
        let Some((_, v)) = props.iter().rev().find(|(k, _)| k == "lane-offset") else {
            return Ok(None);
        };
        match v.trim() {
            "earliest" => Ok(Some(Start::Earliest)),
            "latest" => Ok(Some(Start::Latest(log_next))),
            n => n
                .parse::<u64>()
                .map(|n| Some(Start::Offset(n)))
                .map_err(|_| {
                    format!("lane-offset {v:?}: expected earliest, latest or a lane offset")
                }),
        }
    }
}

/// A member joining a group.
pub struct Join {
    pub session: Arc<Session>,
    /// The full filter as subscribed.
    pub filter: String,
    /// The group name (`None`: a private group of a plain one-lane subscription).
    pub group: Option<String>,
    pub parent: u32,
    pub sel: LaneSel,
    /// The filter without `$share/<group>/`.
    pub inner: String,
    pub qos: QoS,
    pub sub_id: Option<u32>,
    /// The start of a new group (None: stored, else earliest).
    pub start: Option<Start>,
    /// Keep the group's position, deliveries and pauses across restarts. Always for a named
    /// group; for a private one-lane replay when its session outlives the connection.
    pub stored: bool,
}

/// A dispatcher query (REST): runs on the dispatcher thread.
pub type Query = Box<dyn FnOnce(&Dispatcher) + Send>;

pub enum Event {
    Poke,
    Join(Box<Join>),
    Leave {
        client: Arc<str>,
        filter: String,
    },
    Offline(Arc<Session>),
    Online(Arc<Session>),
    /// A member marked stuck sent a PUBACK (the connection cleared the mark).
    Alive(Arc<Session>),
    Ended(Arc<Session>),
    Ack {
        tag: LaneTag,
        code: u8,
        suspend_ms: Option<u64>,
        retry_ms: Option<u64>,
    },
    DlqDurable(Arc<Message>),
    LanesRemoved(Vec<u64>),
    /// Cluster mode: a lane record of the cluster's log at offset `at` (`replay`: read
    /// again at start).
    Remote {
        op: LaneOp,
        at: u64,
        replay: bool,
    },
    Query(Query),
    Stop,
}

/// Settings of the dispatcher (`[lite]`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub sweep_interval: Duration,
    pub flush_interval: Duration,
    pub max_suspend_ms: u64,
    pub member_window: usize,
}

/// The lite layer as the broker sees it: the engine and the dispatcher's mailbox.
pub struct Lite {
    pub engine: Arc<Engine>,
    tx: mpsc::Sender<Event>,
    rx: Mutex<Option<mpsc::Receiver<Event>>>,
    poked: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The lane index checkpoints (fsyncs) run on a thread of their own, off the dispatcher.
    checkpointer: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
    settings: Settings,
    /// Cluster mode: the nodes in some group's member set (`crate::lite_cluster`).
    cluster_members: Arc<Mutex<BTreeSet<String>>>,
}

impl Lite {
    pub fn new(engine: Arc<Engine>, cfg: &crate::config::LiteConfig) -> Lite {
        let (tx, rx) = mpsc::channel();
        Lite {
            engine,
            tx,
            rx: Mutex::new(Some(rx)),
            poked: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            checkpointer: Mutex::new(None),
            cluster_members: Arc::new(Mutex::new(BTreeSet::new())),
            settings: Settings {
                sweep_interval: Duration::from_millis(cfg.sweep_interval_ms.max(10)),
                flush_interval: Duration::from_millis(cfg.flush_interval_ms.max(1)),
                max_suspend_ms: cfg.max_suspend_ms.max(SUSPEND_MIN_MS),
                member_window: if cfg.member_window == 0 {
                    MEMBER_WINDOW_DEFAULT
                } else {
                    cfg.member_window
                },
            },
        }
    }

    /// Start the dispatcher thread (events sent before are kept).
    pub fn start(&self, host: Weak<dyn Ingest>, store: Store) -> std::io::Result<()> {
        let Some(rx) = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let mut d = Dispatcher {
            host,
            store,
            engine: self.engine.clone(),
            settings: self.settings.clone(),
            tx: self.tx.clone(),
            poked: self.poked.clone(),
            groups: HashMap::new(),
            by_name: HashMap::new(),
            next_group: 1,
            next_epoch: 1,
            timers: BinaryHeap::new(),
            deadlines: BinaryHeap::new(),
            deadlines_cap: DEADLINES_MIN_CAP,
            dirty: Vec::new(),
            recent: HashMap::new(),
            unflushed: false,
            dead_letters: HashMap::new(),
            cluster: None,
            cluster_members: self.cluster_members.clone(),
        };
        let h = std::thread::Builder::new()
            .name("lite-dispatch".into())
            .spawn(move || d.run(rx))?;
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        let stop = Arc::new(AtomicBool::new(false));
        let (engine, flag) = (self.engine.clone(), stop.clone());
        let c = std::thread::Builder::new()
            .name("lane-checkpoint".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                    if let Err(e) = engine.checkpoint_if_due() {
                        warn!(error = %e, "cannot checkpoint the lane index");
                    }
                }
            })?;
        *self.checkpointer.lock().unwrap_or_else(|e| e.into_inner()) = Some((stop, c));
        Ok(())
    }

    /// Cluster mode: the nodes that are in some group's member set now.
    pub fn cluster_members(&self) -> Vec<String> {
        self.cluster_members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    pub fn send(&self, e: Event) {
        let _ = self.tx.send(e);
    }

    /// New records are durable: index their lane entries (coalesced).
    pub fn poke(&self) {
        if self.engine.active() && !self.poked.swap(true, Ordering::AcqRel) {
            let _ = self.tx.send(Event::Poke);
        }
    }

    /// Run `f` on the dispatcher and wait (bounded) for its answer.
    pub fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Dispatcher) -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        self.send(Event::Query(Box::new(move |d| {
            let _ = tx.send(f(d));
        })));
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// Stop the dispatcher; flushes the group offsets.
    pub fn stop(&self) {
        self.send(Event::Stop);
        if let Some((stop, h)) = self
            .checkpointer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            stop.store(true, Ordering::Release);
            let _ = h.join();
        }
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }

    /// The parent and lane selection of an inner filter, if it lies inside a lite parent.
    pub fn lane_filter(&self, inner: &str) -> Option<(u32, LaneSel)> {
        if !self.engine.active() {
            return None;
        }
        self.engine
            .parents()
            .iter()
            .find_map(|p| p.pattern.lane_sel(inner).map(|s| (p.id, s)))
    }

    /// The PUBACK of a lane delivery.
    pub fn ack(&self, tag: LaneTag, code: u8, props: &[(String, String)]) {
        let num = |name: &str| {
            props
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        };
        let (suspend_ms, retry_ms) = if code < 0x80 {
            (num("lane-suspend-ms"), num("lane-retry-ms"))
        } else {
            (None, None)
        };
        self.send(Event::Ack {
            tag,
            code,
            suspend_ms,
            retry_ms,
        });
    }

    /// A member marked stuck showed life (a PUBACK, whatever its packet id).
    pub fn alive(&self, s: Arc<Session>) {
        self.send(Event::Alive(s));
    }

    /// A lane delivery finished without a PUBACK (QoS 0 written, expired, too large).
    pub fn done(&self, tag: LaneTag) {
        self.send(Event::Ack {
            tag,
            code: 0,
            suspend_ms: None,
            retry_ms: None,
        });
    }
}

struct Member {
    session: Arc<Session>,
    client: Arc<str>,
    filter: String,
    inner: String,
    sel: LaneSel,
    qos: QoS,
    sub_id: Option<u32>,
    joined: u64,
}

#[derive(Default)]
struct Run {
    batch: Option<Batch>,
    paused_until: Option<Instant>,
    attempts: HashMap<u64, u32>,
    /// Offsets above the committed one already finished.
    done: BTreeSet<u64>,
    /// Offsets taken back at the ack timeout (or delivered before a restart): their next
    /// delivery carries DUP=1.
    redo: BTreeSet<u64>,
    /// Offsets below this were delivered at least once (journaled with the group offsets,
    /// so a redelivery after a restart carries DUP=1).
    sent_to: u64,
    /// The client the last batch went to.
    holder: Option<Arc<str>>,
    /// Rebuilt after a restart: the offsets in `redo` carry DUP=1 only when they go to this
    /// client again (to another session they are a first delivery).
    redo_for: Option<Arc<str>>,
}

impl Run {
    fn idle(&self) -> bool {
        self.batch.is_none()
            && self.paused_until.is_none()
            && self.attempts.is_empty()
            && self.done.is_empty()
            && self.redo.is_empty()
    }
}

struct Batch {
    holder: Arc<str>,
    session: Arc<Session>,
    epoch: u64,
    /// Offsets delivered and not yet answered.
    open: Vec<u64>,
    /// Its ack deadline passed while no other member could take it: it moves as soon as one
    /// can (a member joins, comes online or shows life).
    overdue: bool,
}

struct Group {
    id: u64,
    parent: u32,
    name: Arc<str>,
    private: bool,
    /// Its offsets, run marks and start are stored (every named group; a private replay of
    /// a persistent session).
    stored: bool,
    start: Start,
    members: Vec<Member>,
    committed: HashMap<u64, u64>,
    runs: HashMap<u64, Run>,
    owners: HashMap<u64, Arc<str>>,
    ready: VecDeque<u64>,
    in_ready: HashSet<u64>,
    /// Lanes that found no member with room.
    blocked: HashSet<u64>,
    outstanding: HashMap<Arc<str>, usize>,
    /// Round-robin position among members with equal load.
    rr: usize,
}

/// Per-lane figures of one group, for the REST API.
#[derive(Debug, Clone, Serialize)]
pub struct GroupLane {
    pub lane: String,
    pub committed: u64,
    pub next_offset: u64,
    pub lag: u64,
    pub inflight: usize,
    pub paused_for_ms: Option<u64>,
    pub holder: Option<String>,
}

/// A group's figures for metrics ([`Dispatcher::group_figures`]).
#[derive(Debug, Clone, Default)]
pub struct GroupFigures {
    pub group: String,
    pub members_online: u64,
    pub inflight: u64,
    /// Where the group starts on a lane it has no stored offset for: that offset, and the
    /// log position of a `latest` start.
    pub default: u64,
    pub since: Option<u64>,
    /// Messages dead-lettered since start.
    pub dead_letters: u64,
    /// The `$private` row (private replays' dead letters): no backlog.
    pub private: bool,
}

/// A group, for the REST API.
#[derive(Debug, Clone, Serialize)]
pub struct GroupInfo {
    pub group: String,
    pub members: Vec<String>,
    pub online_members: usize,
    /// Members marked stuck (a batch not acknowledged within `ack_timeout_ms`, no PUBACK
    /// or new connection since).
    pub stuck_members: Vec<String>,
    pub active_lanes: usize,
    pub inflight: usize,
}

/// The dispatcher's state (only its thread touches it).
pub struct Dispatcher {
    /// The broker, for dead letters (gone: the dispatcher has nothing left to do).
    host: Weak<dyn Ingest>,
    /// The shared log.
    store: Store,
    engine: Arc<Engine>,
    settings: Settings,
    tx: mpsc::Sender<Event>,
    poked: Arc<AtomicBool>,
    groups: HashMap<u64, Group>,
    by_name: HashMap<(u32, Arc<str>), u64>,
    next_group: u64,
    next_epoch: u64,
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    /// Ack deadlines of batches: (deadline, group, lane, batch epoch). An entry of a batch
    /// answered in time is dropped when it comes up, or by a compaction once the heap holds
    /// more stale entries than `deadlines_cap` allows.
    deadlines: BinaryHeap<Reverse<(Instant, u64, u64, u64)>>,
    deadlines_cap: usize,
    dirty: Vec<(u64, Arc<str>, u64)>,
    /// The newest indexed entries of lanes that groups consume: the live path reads them here
    /// instead of from sled.
    recent: HashMap<u64, VecDeque<(u64, u64, u64)>>,
    unflushed: bool,
    /// Messages dead-lettered since start, by (parent, group) (`$private` for replays).
    dead_letters: HashMap<(u32, Arc<str>), u64>,
    /// Cluster mode: which lanes this node dispatches (`crate::lite_cluster`).
    cluster: Option<cluster::ClusterLanes>,
    cluster_members: Arc<Mutex<BTreeSet<String>>>,
}

impl Dispatcher {
    fn run(&mut self, rx: mpsc::Receiver<Event>) {
        self.cluster_start();
        let mut last_sweep = Instant::now();
        let mut last_flush = Instant::now();
        loop {
            let now = Instant::now();
            let mut wait = self
                .settings
                .sweep_interval
                .min(self.settings.flush_interval);
            if let Some(Reverse((t, _, _))) = self.timers.peek() {
                wait = wait.min(t.saturating_duration_since(now));
            }
            if let Some(Reverse((t, _, _, _))) = self.deadlines.peek() {
                wait = wait.min(t.saturating_duration_since(now));
            }
            if self.engine.has_pending() {
                wait = wait.min(Duration::from_millis(2));
            }
            if self.groups.values().any(|g| !g.ready.is_empty()) {
                wait = Duration::ZERO;
            }
            let first = match rx.recv_timeout(wait) {
                Ok(e) => Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut events: Vec<Event> = first.into_iter().collect();
            while events.len() < 4096 {
                match rx.try_recv() {
                    Ok(e) => events.push(e),
                    Err(_) => break,
                }
            }
            for e in events {
                if matches!(e, Event::Stop) {
                    self.index();
                    self.persist_commits();
                    self.cluster_stop();
                    let _ = self.engine.flush();
                    if let Err(e) = self.engine.checkpoint() {
                        warn!(error = %e, "cannot checkpoint the lane index");
                    }
                    return;
                }
                self.handle(e);
            }
            self.cluster_announce();
            self.index();
            self.cluster_handoffs();
            self.fire_timers();
            self.fire_deadlines();
            self.dispatch_ready();
            if last_flush.elapsed() >= self.settings.flush_interval {
                last_flush = Instant::now();
                self.persist_commits();
                if self.unflushed || self.engine.has_unjournaled() {
                    self.unflushed = false;
                    if let Err(e) = self.engine.flush() {
                        warn!(error = %e, "cannot flush the lane group offsets");
                    }
                }
            }
            if last_sweep.elapsed() >= self.settings.sweep_interval {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
    }

    fn handle(&mut self, e: Event) {
        match e {
            Event::Poke => self.poked.store(false, Ordering::Release),
            Event::Join(j) => self.join(*j),
            Event::Leave { client, filter } => self.leave(&client, Some(&filter)),
            Event::Offline(s) => self.offline(&s),
            Event::Online(s) => self.online(&s),
            Event::Alive(s) => self.alive(&s),
            Event::Ended(s) => self.leave(&s.client_id, None),
            Event::Ack {
                tag,
                code,
                suspend_ms,
                retry_ms,
            } => self.ack(tag, code, suspend_ms, retry_ms),
            Event::DlqDurable(m) => {
                if let Some(h) = self.host.upgrade() {
                    h.ingest_stored(m);
                }
            }
            Event::LanesRemoved(ids) => {
                for id in ids {
                    self.forget_lane(id);
                }
                let alive: HashSet<u32> = self.engine.parents().iter().map(|p| p.id).collect();
                self.groups.retain(|_, g| alive.contains(&g.parent));
                self.by_name.retain(|(p, _), _| alive.contains(p));
            }
            Event::Remote { op, at, replay } => self.remote(op, at, replay),
            Event::Query(f) => f(self),
            Event::Stop => {}
        }
    }

    /// The group of a join, created if needed; and whether it is new (no stored start).
    fn group_id(&mut self, j: &Join) -> (u64, bool) {
        let name: Arc<str> = match &j.group {
            Some(g) => g.as_str().into(),
            None => format!("\u{1}{}\u{1}{}", j.session.client_id, j.filter).into(),
        };
        if let Some(&id) = self.by_name.get(&(j.parent, name.clone())) {
            return (id, false);
        }
        let private = j.group.is_none();
        let keep = !private || j.stored;
        // A private replay subscribed again starts where the SUBSCRIBE says: its stored
        // position is replaced (below); one restored with its session reads it back.
        let stored = if !keep || (private && j.start.is_some()) {
            None
        } else {
            self.engine
                .group_meta(j.parent, &name)
                .unwrap_or_else(|e| {
                    warn!(error = %e, "cannot read a lane group");
                    None
                })
                .map(|v| Start::decode(&v))
        };
        let new = stored.is_none();
        let start = match stored {
            Some(s) => s,
            None => {
                let s = j.start.unwrap_or(Start::Earliest);
                if keep {
                    if let Err(e) = self.engine.put_group_meta(j.parent, &name, &s.encode()) {
                        warn!(error = %e, "cannot store a lane group");
                    }
                    self.unflushed = true;
                }
                if keep && private {
                    self.reset_private(j, &name, s);
                }
                s
            }
        };
        let id = self.next_group;
        self.next_group += 1;
        self.groups.insert(
            id,
            Group {
                id,
                parent: j.parent,
                name: name.clone(),
                private,
                stored: keep,
                start,
                members: Vec::new(),
                committed: HashMap::new(),
                runs: HashMap::new(),
                owners: HashMap::new(),
                ready: VecDeque::new(),
                in_ready: HashSet::new(),
                blocked: HashSet::new(),
                outstanding: HashMap::new(),
                rr: 0,
            },
        );
        self.by_name.insert((j.parent, name), id);
        (id, new)
    }

    /// A stored private replay subscribed with a new `lane-offset`: its lane's position is
    /// where the offset says, and nothing of the previous replay is redelivered.
    fn reset_private(&mut self, j: &Join, name: &Arc<str>, start: Start) {
        let LaneSel::One(key) = &j.sel else {
            return;
        };
        let Some(lane) = self.engine.lane_id(j.parent, key) else {
            return;
        };
        let from = match start {
            Start::Offset(n) => n,
            Start::Earliest => 0,
            Start::Latest(_) => self.engine.next_offset(lane),
        };
        if let Err(e) = self.engine.put_commits(&[(lane, name.clone(), from)]) {
            warn!(error = %e, "cannot store a lane replay's position");
        }
        self.engine.put_run_mark(lane, name, RunMark::default());
    }

    fn join(&mut self, j: Join) {
        if j.group.is_none() && j.start.is_some() {
            // A plain subscription with `lane-offset` again: start over from the new offset.
            let client = j.session.client_id.clone();
            self.leave(&client, Some(&j.filter));
        }
        let fresh = !self.by_name.contains_key(&(
            j.parent,
            match &j.group {
                Some(g) => Arc::from(g.as_str()),
                None => format!("\u{1}{}\u{1}{}", j.session.client_id, j.filter).into(),
            },
        ));
        let (gid, new) = self.group_id(&j);
        let client = j.session.client_id.clone();
        let joined = self.next_epoch;
        self.next_epoch += 1;
        let sel = j.sel.clone();
        let mode = self
            .engine
            .parent_by_id(j.parent)
            .map_or(Mode::Shared, |p| p.def.mode);
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let existing = g
            .members
            .iter()
            .position(|m| m.client == client && m.filter == j.filter);
        let m = Member {
            session: j.session.clone(),
            client: client.clone(),
            filter: j.filter,
            inner: j.inner,
            sel: j.sel,
            qos: j.qos,
            sub_id: j.sub_id,
            joined,
        };
        match existing {
            Some(i) => g.members[i] = m,
            None => g.members.push(m),
        }
        if let (Mode::Exclusive, LaneSel::One(key)) = (mode, &sel) {
            if let Some(lane) = self.engine.lane_id(j.parent, key) {
                let old = g.owners.insert(lane, client.clone());
                if let Some(old) = old.filter(|o| *o != client) {
                    // The newest explicit subscriber wins: the old owner gets no more of it.
                    let revoked = revoke_queued(g, lane, &old);
                    if revoked > 0 {
                        debug!(lane, %old, revoked, "exclusive lane taken over");
                    }
                }
            }
        }
        // Lanes to look at: all of the member's for a new group, the one lane of a one-lane
        // member; a member joining a running group takes lanes from its ready set (the cost
        // of a join does not grow with the idle lanes).
        // A group created just now at `latest` has nothing to catch up on: its lanes are not
        // even listed (millions of idle lanes cost nothing to a new group).
        let latest = self
            .groups
            .get(&gid)
            .is_some_and(|g| matches!(g.start, Start::Latest(_)))
            && new;
        let look = !latest && (fresh || (existing.is_none() && matches!(sel, LaneSel::One(_))));
        // Only the lanes with messages after the group's offset become ready.
        let behind = match self.groups.get(&gid) {
            Some(g) if look => {
                let (default, since) = match g.start {
                    Start::Offset(n) => (n, None),
                    Start::Latest(pos) => (0, Some(pos)),
                    Start::Earliest => (0, None),
                };
                let name = g.stored.then_some(&*g.name);
                let mut lanes = self
                    .engine
                    .lanes_behind(j.parent, &sel, name, default, since)
                    .unwrap_or_else(|e| {
                        warn!(error = %e, "cannot list the lanes of a joining group");
                        Vec::new()
                    });
                // Offsets this dispatcher holds but has not stored yet win.
                lanes.retain(|lane| {
                    g.committed.get(lane).is_none_or(|&c| {
                        self.engine
                            .lane(*lane)
                            .is_some_and(|(_, _, next, _)| next > c)
                    })
                });
                lanes
            }
            _ => Vec::new(),
        };
        let g = match self.groups.get_mut(&gid) {
            Some(g) => g,
            None => return,
        };
        for lane in behind {
            push_ready(g, lane);
        }
        for lane in std::mem::take(&mut g.blocked) {
            push_ready(g, lane);
        }
        self.reclaim_offline(gid);
    }

    /// Remove a member (one filter) or every member of a client (`filter` None).
    fn leave(&mut self, client: &Arc<str>, filter: Option<&str>) {
        let gids: Vec<u64> = self.groups.keys().copied().collect();
        for gid in gids {
            let Some(g) = self.groups.get_mut(&gid) else {
                continue;
            };
            let before = g.members.len();
            g.members
                .retain(|m| !(m.client == *client && filter.is_none_or(|f| f == m.filter)));
            if g.members.len() == before {
                continue;
            }
            let still = g.members.iter().any(|m| m.client == *client);
            if !still {
                let lanes: Vec<u64> = g
                    .runs
                    .iter()
                    .filter(|(_, r)| r.batch.as_ref().is_some_and(|b| b.holder == *client))
                    .map(|(l, _)| *l)
                    .collect();
                for lane in lanes {
                    release(g, lane, true, &self.engine);
                }
                g.owners.retain(|_, o| o != client);
                g.outstanding.remove(client);
            }
            if g.private && g.stored && g.members.is_empty() {
                // The replay ended (unsubscribed, or its session ended): nothing of it is
                // restored again. Its lane's offset stays in the journal until the lane goes.
                for lane in g.committed.keys().chain(g.runs.keys()) {
                    self.engine.put_run_mark(*lane, &g.name, RunMark::default());
                }
                if let Err(e) = self.engine.remove_group_meta(g.parent, &g.name) {
                    warn!(error = %e, "cannot forget a lane replay");
                }
                self.unflushed = true;
            }
            let g = match self.groups.get_mut(&gid) {
                Some(g) => g,
                None => continue,
            };
            if g.members.is_empty() && g.runs.values().all(|r| r.batch.is_none()) {
                self.persist_commits();
                if let Some(g) = self.groups.remove(&gid) {
                    self.by_name.remove(&(g.parent, g.name.clone()));
                }
            } else {
                let g = match self.groups.get_mut(&gid) {
                    Some(g) => g,
                    None => continue,
                };
                for lane in std::mem::take(&mut g.blocked) {
                    push_ready(g, lane);
                }
            }
        }
    }

    /// A member's connection is gone: hand its batches to another online member, if any.
    fn offline(&mut self, s: &Arc<Session>) {
        let gids: Vec<u64> = self.groups.keys().copied().collect();
        for gid in gids {
            let Some(g) = self.groups.get_mut(&gid) else {
                continue;
            };
            let other_online = g
                .members
                .iter()
                .any(|m| m.client != s.client_id && m.session.is_online());
            if !other_online {
                continue;
            }
            let lanes: Vec<u64> = g
                .runs
                .iter()
                .filter(|(_, r)| {
                    r.batch
                        .as_ref()
                        .is_some_and(|b| b.holder == s.client_id && !b.session.is_online())
                })
                .map(|(l, _)| *l)
                .collect();
            for lane in lanes {
                release(g, lane, true, &self.engine);
            }
        }
    }

    /// A member came (back) online: a new connection clears its stuck mark, and batches held
    /// by offline members (or overdue ones) can move to it.
    fn online(&mut self, s: &Arc<Session>) {
        s.set_lane_stuck(false);
        self.alive(s);
    }

    /// A member can take batches again (online, or its stuck mark cleared): batches held by
    /// offline members or overdue, and lanes that found no member, can go to it.
    fn alive(&mut self, s: &Arc<Session>) {
        let gids: Vec<u64> = self
            .groups
            .values()
            .filter(|g| g.members.iter().any(|m| m.client == s.client_id))
            .map(|g| g.id)
            .collect();
        for gid in gids {
            self.reclaim_offline(gid);
            if let Some(g) = self.groups.get_mut(&gid) {
                for lane in std::mem::take(&mut g.blocked) {
                    push_ready(g, lane);
                }
            }
        }
    }

    fn reclaim_offline(&mut self, gid: u64) {
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if !g.members.iter().any(|m| m.session.is_online()) {
            return;
        }
        let mut overdue = Vec::new();
        let mut lanes = Vec::new();
        for (l, r) in &g.runs {
            match &r.batch {
                Some(b) if !b.session.is_online() => lanes.push(*l),
                Some(b) if b.overdue => overdue.push(*l),
                _ => {}
            }
        }
        for lane in lanes {
            release(g, lane, true, &self.engine);
        }
        for lane in overdue {
            self.take_back(gid, lane);
        }
    }

    /// The ack deadlines that passed: take those batches back.
    fn fire_deadlines(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((t, gid, lane, epoch))) = self.deadlines.peek().copied() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            self.ack_timeout(gid, lane, epoch);
        }
    }

    /// Remember the ack deadline of a batch; compacts stale entries (batches answered in
    /// time) so the heap stays in proportion to the batches in flight.
    fn push_deadline(&mut self, t: Instant, gid: u64, lane: u64, epoch: u64) {
        self.deadlines.push(Reverse((t, gid, lane, epoch)));
        if self.deadlines.len() <= self.deadlines_cap {
            return;
        }
        let groups = &self.groups;
        self.deadlines.retain(|Reverse((_, g, l, e))| {
            groups
                .get(g)
                .and_then(|g| g.runs.get(l))
                .and_then(|r| r.batch.as_ref())
                .is_some_and(|b| b.epoch == *e && !b.overdue)
        });
        self.deadlines_cap = (self.deadlines.len() * 2).max(DEADLINES_MIN_CAP);
    }

    /// The batch `epoch` of `lane` was not fully acknowledged in time: mark its holder stuck
    /// and hand the batch to another member if one can take it.
    fn ack_timeout(&mut self, gid: u64, lane: u64, epoch: u64) {
        let Some(b) = self
            .groups
            .get_mut(&gid)
            .and_then(|g| g.runs.get_mut(&lane))
            .and_then(|r| r.batch.as_mut())
            .filter(|b| b.epoch == epoch && !b.open.is_empty() && !b.overdue)
        else {
            return;
        };
        b.overdue = true;
        self.engine
            .counters
            .ack_timeouts
            .fetch_add(1, Ordering::Relaxed);
        if b.session.is_online() {
            b.session.set_lane_stuck(true);
        }
        debug!(lane, holder = %b.holder, open = b.open.len(), "lane batch not acknowledged in time");
        self.take_back(gid, lane);
    }

    /// Hand the overdue batch of `lane` to another member of the group if one is online, not
    /// stuck and takes the lane: revoke it from the holder (queued and in flight), count one
    /// attempt per unanswered message (at `max_attempts`: dead-lettered), and make the lane
    /// ready; its next delivery carries DUP=1. Otherwise the batch stays with its holder.
    fn take_back(&mut self, gid: u64, lane: u64) {
        let Some((_, key, _, _)) = self.engine.lane(lane) else {
            return;
        };
        let max_attempts = self
            .groups
            .get(&gid)
            .and_then(|g| self.engine.parent_by_id(g.parent))
            .map_or(16, |p| p.def.max_attempts);
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let Some(b) = g.runs.get(&lane).and_then(|r| r.batch.as_ref()) else {
            return;
        };
        let holder = b.holder.clone();
        let open = b.open.clone();
        let other = g.members.iter().any(|m| {
            m.client != holder
                && fits(&m.sel, &key)
                && m.session.is_online()
                && !m.session.is_lane_stuck()
        });
        if !other {
            return;
        }
        release(g, lane, true, &self.engine);
        // Exclusive mode: the stuck owner loses the lane.
        if g.owners.get(&lane).is_some_and(|o| *o == holder) {
            g.owners.remove(&lane);
        }
        let Some(run) = g.runs.get_mut(&lane) else {
            return;
        };
        let mut dead = Vec::new();
        for off in open {
            let attempts = run.attempts.get(&off).copied().unwrap_or(0);
            if attempts >= max_attempts {
                run.done.insert(off);
                dead.push((off, attempts));
            } else {
                run.redo.insert(off);
                // Taken back at the ack timeout: DUP=1 to whichever member gets it.
                run.redo_for = None;
            }
        }
        if dead.is_empty() {
            return;
        }
        let (name, private) = (g.name.clone(), g.private);
        for (offset, attempts) in dead {
            let tag = LaneTag {
                group: gid,
                lane,
                offset,
                epoch: 0,
                dup: false,
            };
            self.dead_letter(&name, private, tag, attempts, "max_attempts");
        }
        if let Some(g) = self.groups.get_mut(&gid) {
            advance(g, lane, &mut self.dirty, &self.engine);
        }
    }

    fn ack(&mut self, tag: LaneTag, code: u8, suspend_ms: Option<u64>, retry_ms: Option<u64>) {
        let Some(g) = self.groups.get_mut(&tag.group) else {
            return;
        };
        let Some(run) = g.runs.get_mut(&tag.lane) else {
            return;
        };
        let Some(batch) = run.batch.as_mut().filter(|b| b.epoch == tag.epoch) else {
            return;
        };
        let Some(i) = batch.open.iter().position(|&o| o == tag.offset) else {
            return;
        };
        batch.open.swap_remove(i);
        let holder = batch.holder.clone();
        let finished = batch.open.is_empty();
        if let Some(n) = g.outstanding.get_mut(&holder) {
            *n = n.saturating_sub(1);
        }
        let max_attempts = self
            .engine
            .parent_by_id(g.parent)
            .map_or(16, |p| p.def.max_attempts);
        let clamp = |n: u64| n.clamp(SUSPEND_MIN_MS, self.settings.max_suspend_ms);
        let c = &self.engine.counters;
        let mut dlq = None;
        if code >= 0x80 {
            dlq = Some(format!("0x{code:02X}"));
        } else if let Some(n) = retry_ms {
            let a = run.attempts.entry(tag.offset).or_insert(0);
            *a += 1;
            c.retried.fetch_add(1, Ordering::Relaxed);
            if *a >= max_attempts {
                dlq = Some("max_attempts".into());
            } else {
                let until = Instant::now() + Duration::from_millis(clamp(n));
                run.paused_until = Some(run.paused_until.map_or(until, |p| p.max(until)));
            }
        } else if let Some(n) = suspend_ms {
            c.suspended.fetch_add(1, Ordering::Relaxed);
            let until = Instant::now() + Duration::from_millis(clamp(n));
            run.paused_until = Some(run.paused_until.map_or(until, |p| p.max(until)));
        } else {
            run.done.insert(tag.offset);
        }
        if let Some(reason) = dlq {
            let attempts = run.attempts.get(&tag.offset).copied().unwrap_or(0);
            run.done.insert(tag.offset);
            let group = g.name.clone();
            let private = g.private;
            self.dead_letter(&group, private, tag, attempts, &reason);
        }
        let Some(g) = self.groups.get_mut(&tag.group) else {
            return;
        };
        // The group offset moves with every acknowledgement (the first unacknowledged one).
        advance(g, tag.lane, &mut self.dirty, &self.engine);
        if finished {
            if let Some(run) = g.runs.get_mut(&tag.lane) {
                run.batch = None;
            }
            advance(g, tag.lane, &mut self.dirty, &self.engine);
            let paused = g
                .runs
                .get(&tag.lane)
                .and_then(|r| r.paused_until)
                .filter(|t| *t > Instant::now());
            match paused {
                Some(t) => self.timers.push(Reverse((t, tag.group, tag.lane))),
                None => push_ready(g, tag.lane),
            }
        }
        for lane in std::mem::take(&mut g.blocked) {
            push_ready(g, lane);
        }
    }

    fn dead_letter(
        &mut self,
        group: &str,
        private: bool,
        tag: LaneTag,
        attempts: u32,
        reason: &str,
    ) {
        if self.host.strong_count() == 0 {
            return;
        }
        let Some((_, key, _, _)) = self.engine.lane(tag.lane) else {
            return;
        };
        let Ok(entries) = self.engine.read_lane(tag.lane, tag.offset, 1) else {
            return;
        };
        let Some(&(seq, pos, _)) = entries.first().filter(|e| e.0 == tag.offset) else {
            return;
        };
        let rec = match self.store.read(pos) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "dead letter: lane message not in the log");
                return;
            }
        };
        self.engine
            .counters
            .dead_lettered
            .fetch_add(1, Ordering::Relaxed);
        let group_name = if private { "$private" } else { group };
        if let Some((parent, ..)) = self.engine.lane(tag.lane) {
            *self
                .dead_letters
                .entry((parent, Arc::from(group_name)))
                .or_default() += 1;
        }
        let topic = format!("$dlq/{group_name}/{}", rec.topic);
        let orig = Message::from_record(&rec);
        let mut props = orig.properties.clone();
        props
            .user_properties
            .push(("original-topic".into(), rec.topic.clone()));
        props.user_properties.push(("lane".into(), key.to_string()));
        props
            .user_properties
            .push(("lane-offset".into(), seq.to_string()));
        props
            .user_properties
            .push(("attempts".into(), attempts.to_string()));
        props
            .user_properties
            .push(("reason".into(), reason.to_string()));
        let mut msg = Message::new(
            topic.into(),
            rec.payload.clone(),
            QoS::AtLeastOnce,
            false,
            props,
            "$lanemq".into(),
        );
        if self
            .host
            .upgrade()
            .is_some_and(|h| h.publish_clustered(&msg))
        {
            return;
        }
        let rec_in = crate::persist::record_in(&msg, None);
        let tx = self.tx.clone();
        let (otx, orx) = mpsc::channel::<Result<(), ()>>();
        let cb: lanemq_store::Callback = Box::new(move |r| {
            let _ = otx.send(r.map(|_| ()).map_err(|_| ()));
        });
        match self.store.append(rec_in, cb) {
            Ok(off) => {
                msg.offset = off;
                let msg = Arc::new(msg);
                std::thread::spawn(move || {
                    if let Ok(Ok(())) = orx.recv_timeout(Duration::from_secs(30)) {
                        let _ = tx.send(Event::DlqDurable(msg));
                    }
                });
            }
            Err(e) => warn!(error = %e, "cannot store a dead letter"),
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((t, gid, lane))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if let Some(g) = self.groups.get_mut(&gid) {
                if let Some(r) = g.runs.get_mut(&lane) {
                    if r.paused_until.is_some_and(|p| p <= now) {
                        r.paused_until = None;
                    }
                }
                push_ready(g, lane);
            }
        }
    }

    fn index(&mut self) {
        let mut entries: Vec<Pending> = Vec::new();
        // A backlog is indexed in bounded batches, then dispatch gets its turn.
        for _ in 0..8 {
            match self.engine.index_durable() {
                Ok(e) => {
                    let full = e.len() >= lanemq_lite::engine::INDEX_BATCH_MAX;
                    entries.extend(e);
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot index lane entries");
                    break;
                }
            }
        }
        if entries.is_empty() || self.groups.is_empty() {
            return;
        }
        if self.recent.len() > RECENT_LANES_MAX {
            self.recent.clear();
        }
        for p in &entries {
            let q = self.recent.entry(p.lane).or_default();
            if q.back().is_some_and(|b| b.0 + 1 != p.seq) {
                q.clear();
            }
            q.push_back((p.seq, p.pos, p.ts_us));
            if q.len() > RECENT_PER_LANE {
                q.pop_front();
            }
        }
        let mut lanes: Vec<u64> = entries.iter().map(|p| p.lane).collect();
        lanes.sort_unstable();
        lanes.dedup();
        for lane in lanes {
            let Some((parent, key, _, _)) = self.engine.lane(lane) else {
                continue;
            };
            for g in self.groups.values_mut() {
                if g.parent != parent {
                    continue;
                }
                let wanted = g.members.iter().any(|m| match &m.sel {
                    LaneSel::All => true,
                    LaneSel::One(k) => **k == *key,
                });
                if wanted {
                    push_ready(g, lane);
                }
            }
        }
    }

    fn dispatch_ready(&mut self) {
        let mut budget = DISPATCH_BUDGET;
        let gids: Vec<u64> = self.groups.keys().copied().collect();
        while budget > 0 {
            let mut any = false;
            for &gid in &gids {
                let lane = match self.groups.get_mut(&gid) {
                    Some(g) => match g.ready.pop_front() {
                        Some(l) => {
                            g.in_ready.remove(&l);
                            l
                        }
                        None => continue,
                    },
                    None => continue,
                };
                any = true;
                budget -= 1;
                self.dispatch(gid, lane);
                if budget == 0 {
                    break;
                }
            }
            if !any {
                break;
            }
        }
    }

    fn committed(&mut self, gid: u64, lane: u64) -> u64 {
        let Some(g) = self.groups.get_mut(&gid) else {
            return 0;
        };
        if let Some(&c) = g.committed.get(&lane) {
            return c;
        }
        let stored = if g.stored {
            self.engine.load_commit(lane, &g.name).unwrap_or(None)
        } else {
            None
        };
        let c = stored.unwrap_or(match g.start {
            Start::Offset(n) => n,
            _ => 0,
        });
        g.committed.insert(lane, c);
        c
    }

    fn dispatch(&mut self, gid: u64, lane: u64) {
        let Some((_, key, next, _)) = self.engine.lane(lane) else {
            self.forget_lane(lane);
            return;
        };
        let Some(parent) = self
            .groups
            .get(&gid)
            .and_then(|g| self.engine.parent_by_id(g.parent))
        else {
            return;
        };
        if !self.cluster_allows(gid, &parent.def.name, &key) {
            return; // another node dispatches it (it is rescanned when that changes)
        }
        let from = self.committed(gid, lane);
        if self.host.strong_count() == 0 {
            return;
        }
        let window = self.settings.member_window;
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.stored && !g.runs.contains_key(&lane) {
            // What the group had done with the lane before a restart: delivered offsets come
            // again with DUP=1, attempts count on, a pause holds.
            if let Some(mark) = self.engine.run_mark(lane, &g.name) {
                let (run, pause) = restore_run(mark, from);
                g.runs.insert(lane, run);
                if let Some(t) = pause {
                    self.timers.push(Reverse((t, gid, lane)));
                }
            }
        }
        if let Some(r) = g.runs.get(&lane) {
            if r.batch.is_some() || r.paused_until.is_some_and(|t| t > Instant::now()) {
                return;
            }
        }
        if from >= next {
            return;
        }
        let Some(mi) = choose(g, lane, &key, parent.def.mode, window) else {
            g.blocked.insert(lane);
            return;
        };
        let (client, session, inner, qos, sub_id) = {
            let m = &g.members[mi];
            (
                m.client.clone(),
                m.session.clone(),
                m.inner.clone(),
                m.qos,
                m.sub_id,
            )
        };
        let room = window.saturating_sub(g.outstanding.get(&client).copied().unwrap_or(0));
        let want = (parent.def.batch as usize).min(room).max(1);
        let latest = match g.start {
            Start::Latest(p) => Some(p),
            _ => None,
        };
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let entries = match recent_entries(&self.recent, lane, from, want * 2 + 8) {
            Some(e) => e,
            None => match self.engine.read_lane(lane, from, want * 2 + 8) {
                Ok(e) => e,
                Err(e) => {
                    warn!(error = %e, lane, "cannot read a lane");
                    return;
                }
            },
        };
        let run = g.runs.entry(lane).or_default();
        let mut out = Vec::new();
        let mut skipped = false;
        let now = Instant::now();
        for (seq, pos, _) in entries {
            if out.len() >= want {
                break;
            }
            if run.done.contains(&seq) {
                continue;
            }
            if latest.is_some_and(|l| pos < l) {
                // The group started at `latest`: messages stored before it are not its.
                run.done.insert(seq);
                skipped = true;
                continue;
            }
            let rec = match self.store.read(pos) {
                Ok(r) => r,
                Err(e) => {
                    debug!(error = %e, lane, seq, "lane message no longer in the log; skipped");
                    run.done.insert(seq);
                    skipped = true;
                    continue;
                }
            };
            if !topic::matches(&inner, &rec.topic) {
                run.done.insert(seq);
                skipped = true;
                continue;
            }
            let mut msg = Message::from_record(&rec);
            if msg.is_expired(now) {
                run.done.insert(seq);
                skipped = true;
                continue;
            }
            msg.offset = NOT_STORED;
            msg.properties
                .user_properties
                .push(("lane".into(), key.to_string()));
            msg.properties
                .user_properties
                .push(("lane-offset".into(), seq.to_string()));
            let q = if msg.qos.as_u8() < qos.as_u8() {
                msg.qos
            } else {
                qos
            };
            out.push((
                seq,
                Delivery {
                    msg: Arc::new(msg),
                    qos: q,
                    retain: false,
                    sub_ids: sub_id.into_iter().collect(),
                    share: None,
                    seq: 0,
                    stream: None,
                    lane: Some(LaneTag {
                        group: gid,
                        lane,
                        offset: seq,
                        epoch,
                        dup: run.redo.remove(&seq)
                            && run.redo_for.as_ref().is_none_or(|h| *h == client),
                    }),
                },
            ));
        }
        if out.is_empty() {
            if skipped {
                advance(g, lane, &mut self.dirty, &self.engine);
                push_ready(g, lane);
            }
            return;
        }
        let open: Vec<u64> = out.iter().map(|(s, _)| *s).collect();
        if let Some(&hi) = open.iter().max() {
            run.sent_to = run.sent_to.max(hi + 1);
        }
        run.holder = Some(client.clone());
        let n = open.len();
        run.batch = Some(Batch {
            holder: client.clone(),
            session: session.clone(),
            epoch,
            open,
            overdue: false,
        });
        if parent.def.mode == Mode::Exclusive {
            g.owners.insert(lane, client.clone());
        }
        *g.outstanding.entry(client).or_insert(0) += n;
        if skipped {
            advance(g, lane, &mut self.dirty, &self.engine);
        }
        save_mark(g, lane, &self.engine);
        let ok = session.push_lane(out.into_iter().map(|(_, d)| d).collect());
        if !ok {
            // The session ended under us: the batch goes back.
            release(g, lane, false, &self.engine);
        } else if parent.def.ack_timeout_ms > 0 {
            let t = Instant::now() + Duration::from_millis(parent.def.ack_timeout_ms);
            self.push_deadline(t, gid, lane, epoch);
        }
    }

    /// A lane is gone (expired, parent deleted): forget its group state and revoke it.
    fn forget_lane(&mut self, lane: u64) {
        for g in self.groups.values_mut() {
            if let Some(r) = g.runs.remove(&lane) {
                if let Some(b) = r.batch {
                    let n = b.session.revoke_lane(|t| t.group == g.id && t.lane == lane);
                    if let Some(o) = g.outstanding.get_mut(&b.holder) {
                        *o = o.saturating_sub(b.open.len().max(n));
                    }
                }
            }
            g.committed.remove(&lane);
            g.owners.remove(&lane);
            g.blocked.remove(&lane);
            if g.in_ready.remove(&lane) {
                g.ready.retain(|l| *l != lane);
            }
        }
        self.dirty.retain(|(l, _, _)| *l != lane);
        self.recent.remove(&lane);
    }

    fn sweep(&mut self) {
        match self.engine.sweep(self.engine.clock_us()) {
            Ok(expired) => {
                if !expired.is_empty() {
                    debug!(lanes = expired.len(), "lanes expired");
                }
                for e in expired {
                    self.forget_lane(e.lane);
                }
            }
            Err(e) => warn!(error = %e, "lane TTL sweep failed"),
        }
    }

    fn persist_commits(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        // Many acks of a lane between two flushes: only the last offset is written.
        let mut latest: HashMap<(u64, Arc<str>), u64> = HashMap::new();
        for (lane, group, off) in std::mem::take(&mut self.dirty) {
            let e = latest.entry((lane, group)).or_insert(off);
            *e = (*e).max(off);
        }
        let commits: Vec<(u64, Arc<str>, u64)> =
            latest.into_iter().map(|((l, g), o)| (l, g, o)).collect();
        if let Err(e) = self.engine.put_commits(&commits) {
            warn!(error = %e, "cannot store lane group offsets");
        }
        self.cluster_commits(&commits);
        self.unflushed = true;
    }

    /// Groups of a parent.
    pub fn groups_of(&self, parent: u32) -> Vec<GroupInfo> {
        let mut v: Vec<GroupInfo> = self
            .groups
            .values()
            .filter(|g| g.parent == parent && !g.private)
            .map(|g| GroupInfo {
                group: g.name.to_string(),
                members: g.members.iter().map(|m| m.client.to_string()).collect(),
                online_members: g.members.iter().filter(|m| m.session.is_online()).count(),
                stuck_members: g
                    .members
                    .iter()
                    .filter(|m| m.session.is_lane_stuck())
                    .map(|m| m.client.to_string())
                    .collect(),
                active_lanes: g.runs.values().filter(|r| r.batch.is_some()).count(),
                inflight: g.outstanding.values().sum(),
            })
            .collect();
        let known: HashSet<String> = v.iter().map(|g| g.group.clone()).collect();
        for name in self.engine.groups_of(parent).unwrap_or_default() {
            // Private replays (named "\u{1}client\u{1}filter") are not groups to list.
            if !known.contains(&name) && !name.starts_with('\u{1}') {
                v.push(GroupInfo {
                    group: name,
                    members: Vec::new(),
                    online_members: 0,
                    stuck_members: Vec::new(),
                    active_lanes: 0,
                    inflight: 0,
                });
            }
        }
        v.sort_by(|a, b| a.group.cmp(&b.group));
        v
    }

    /// Per parent: the lanes some live group can take now (its ready or blocked set).
    pub fn ready_lanes(&self) -> HashMap<u32, u64> {
        let mut sets: HashMap<u32, HashSet<u64>> = HashMap::new();
        for g in self.groups.values() {
            let set = sets.entry(g.parent).or_default();
            set.extend(g.ready.iter().copied());
            set.extend(g.blocked.iter().copied());
        }
        sets.into_iter().map(|(p, s)| (p, s.len() as u64)).collect()
    }

    /// The figures of every named group of `parent` (live or stored) for metrics, without
    /// the backlog: the caller computes it off this thread with
    /// [`Engine::group_backlogs`] from `default` and `since`.
    pub fn group_figures(&self, parent: u32) -> Vec<GroupFigures> {
        let mut out: Vec<GroupFigures> = Vec::new();
        for info in self.groups_of(parent) {
            let live = self
                .by_name
                .get(&(parent, Arc::from(info.group.as_str())))
                .and_then(|id| self.groups.get(id));
            let start = live.map(|g| g.start).or_else(|| {
                self.engine
                    .group_meta(parent, &info.group)
                    .ok()
                    .flatten()
                    .map(|v| Start::decode(&v))
            });
            let (default, since) = match start {
                Some(Start::Offset(n)) => (n, None),
                Some(Start::Latest(pos)) => (0, Some(pos)),
                _ => (0, None),
            };
            let dead_letters = self
                .dead_letters
                .get(&(parent, Arc::from(info.group.as_str())))
                .copied()
                .unwrap_or(0);
            out.push(GroupFigures {
                members_online: info.online_members as u64,
                inflight: info.inflight as u64,
                default,
                since,
                dead_letters,
                group: info.group,
                private: false,
            });
        }
        if let Some(n) = self.dead_letters.get(&(parent, Arc::from("$private"))) {
            out.push(GroupFigures {
                group: "$private".into(),
                dead_letters: *n,
                private: true,
                ..Default::default()
            });
        }
        out
    }

    /// The figures of `group` on the lane `lane` (id, key, next offset).
    pub fn group_lane(
        &self,
        parent: u32,
        group: &str,
        lane: u64,
        key: &str,
        next: u64,
    ) -> GroupLane {
        let g = self
            .by_name
            .get(&(parent, Arc::from(group)))
            .and_then(|id| self.groups.get(id));
        let start = g.map(|g| g.start).or_else(|| {
            self.engine
                .group_meta(parent, group)
                .ok()
                .flatten()
                .map(|v| Start::decode(&v))
        });
        let committed = g
            .and_then(|g| g.committed.get(&lane).copied())
            .or_else(|| self.engine.load_commit(lane, group).ok().flatten())
            .unwrap_or_else(|| match start {
                Some(Start::Offset(n)) => n.min(next),
                // The first entry stored after the group was created.
                Some(Start::Latest(pos)) => self
                    .engine
                    .read_lane(lane, 0, 100_000)
                    .ok()
                    .and_then(|e| e.into_iter().find(|(_, p, _)| *p >= pos).map(|e| e.0))
                    .unwrap_or(next),
                _ => 0,
            });
        let run = g.and_then(|g| g.runs.get(&lane));
        let now = Instant::now();
        GroupLane {
            lane: key.to_string(),
            committed,
            next_offset: next,
            lag: next.saturating_sub(committed),
            inflight: run
                .and_then(|r| r.batch.as_ref())
                .map_or(0, |b| b.open.len()),
            paused_for_ms: run
                .and_then(|r| r.paused_until)
                .filter(|t| *t > now)
                .map(|t| (t - now).as_millis() as u64),
            holder: run
                .and_then(|r| r.batch.as_ref())
                .map(|b| b.holder.to_string()),
        }
    }
}

/// Entries of `lane` from `from` out of the in-memory tail, if it covers `from`.
fn recent_entries(
    recent: &HashMap<u64, VecDeque<(u64, u64, u64)>>,
    lane: u64,
    from: u64,
    max: usize,
) -> Option<Vec<(u64, u64, u64)>> {
    let q = recent.get(&lane)?;
    let first = q.front()?.0;
    if from < first {
        return None;
    }
    let skip = usize::try_from(from - first).ok()?;
    Some(q.iter().skip(skip).take(max).copied().collect())
}

fn push_ready(g: &mut Group, lane: u64) {
    if g.in_ready.insert(lane) {
        g.ready.push_back(lane);
    }
}

/// Move the committed offset over the finished offsets.
fn advance(g: &mut Group, lane: u64, dirty: &mut Vec<(u64, Arc<str>, u64)>, engine: &Engine) {
    let Some(run) = g.runs.get_mut(&lane) else {
        return;
    };
    let Some(c0) = g.committed.get(&lane).copied() else {
        return;
    };
    let mut c = c0;
    // Offsets below the first entry (a gap left by a refused append) are skipped by reads.
    while let Some(&first) = run.done.first() {
        if first < c {
            run.done.pop_first();
        } else if first == c {
            run.done.pop_first();
            run.attempts.remove(&c);
            c += 1;
        } else {
            break;
        }
    }
    if !run.redo.is_empty() {
        run.redo = run.redo.split_off(&c);
    }
    if c != c0 {
        engine
            .counters
            .committed
            .fetch_add(c - c0, Ordering::Relaxed);
        g.committed.insert(lane, c);
        if g.stored {
            dirty.push((lane, g.name.clone(), c));
        }
    }
    if run.idle() {
        g.runs.remove(&lane);
    }
    save_mark(g, lane, engine);
}

/// Journal what a shared group did with `lane` past its committed offset (delivered
/// offsets, attempts, a pause), or clear it: see [`lanemq_lite::journal::RunMark`].
fn save_mark(g: &Group, lane: u64, engine: &Engine) {
    if !g.stored {
        return;
    }
    let committed = g.committed.get(&lane).copied().unwrap_or(0);
    let mark = match g.runs.get(&lane) {
        None => RunMark::default(),
        Some(run) => {
            let now = Instant::now();
            let mut attempts: Vec<(u64, u32)> = run
                .attempts
                .iter()
                .filter(|(o, _)| **o >= committed)
                .map(|(o, n)| (*o, *n))
                .collect();
            attempts.sort_unstable();
            RunMark {
                sent_to: if run.sent_to > committed {
                    run.sent_to
                } else {
                    0
                },
                // Whole milliseconds, so the same pause gives the same record.
                paused_until_us: run.paused_until.filter(|t| *t > now).map_or(0, |t| {
                    let us = lanemq_lite::engine::now_us()
                        + u64::try_from((t - now).as_micros()).unwrap_or(u64::MAX / 2);
                    us / 1000 * 1000
                }),
                attempts,
                holder: run.holder.as_deref().unwrap_or("").into(),
            }
        }
    };
    engine.put_run_mark(lane, &g.name, mark);
}

/// A run rebuilt from its journaled mark after a restart (and when its pause ends, if any).
fn restore_run(mark: RunMark, committed: u64) -> (Run, Option<Instant>) {
    let now_us = lanemq_lite::engine::now_us();
    let pause = (mark.paused_until_us > now_us)
        .then(|| Instant::now() + Duration::from_micros(mark.paused_until_us - now_us));
    // A delivered range is at most a few batches; bound it against a damaged record.
    let redo_to = mark.sent_to.min(committed.saturating_add(1 << 16));
    let run = Run {
        paused_until: pause,
        attempts: mark
            .attempts
            .into_iter()
            .filter(|(o, _)| *o >= committed)
            .collect(),
        redo: (committed..redo_to).collect(),
        sent_to: mark.sent_to,
        holder: (!mark.holder.is_empty()).then(|| Arc::from(&*mark.holder)),
        redo_for: Some(Arc::from(&*mark.holder)),
        ..Run::default()
    };
    (run, pause)
}

/// End a lane's batch without answers: revoke what the holder still has (queued or in
/// flight), count the redelivery, make the lane ready again.
fn release(g: &mut Group, lane: u64, count_attempt: bool, engine: &Engine) {
    let Some(run) = g.runs.get_mut(&lane) else {
        return;
    };
    let Some(b) = run.batch.take() else {
        return;
    };
    let gid = g.id;
    b.session.revoke_lane(|t| t.group == gid && t.lane == lane);
    if let Some(o) = g.outstanding.get_mut(&b.holder) {
        *o = o.saturating_sub(b.open.len());
    }
    if count_attempt && !b.open.is_empty() {
        engine
            .counters
            .redelivered
            .fetch_add(b.open.len() as u64, Ordering::Relaxed);
        for off in &b.open {
            *run.attempts.entry(*off).or_insert(0) += 1;
        }
    }
    if g.owners.get(&lane).is_some_and(|o| *o == b.holder) && !b.session.is_online() {
        g.owners.remove(&lane);
    }
    push_ready(g, lane);
    save_mark(g, lane, engine);
}

/// Revoke the not yet sent deliveries of `lane` from `client` (exclusive takeover).
fn revoke_queued(g: &mut Group, lane: u64, client: &Arc<str>) -> usize {
    let gid = g.id;
    let Some(run) = g.runs.get_mut(&lane) else {
        return 0;
    };
    let Some(b) = run.batch.as_mut().filter(|b| b.holder == *client) else {
        return 0;
    };
    let removed = b
        .session
        .revoke_queued_lane(|t| t.group == gid && t.lane == lane);
    b.open.retain(|o| !removed.contains(o));
    let n = removed.len();
    if let Some(o) = g.outstanding.get_mut(client) {
        *o = o.saturating_sub(n);
    }
    if b.open.is_empty() {
        run.batch = None;
    }
    n
}

/// Does a member's lane selection take the lane `key`?
fn fits(sel: &LaneSel, key: &str) -> bool {
    match sel {
        LaneSel::All => true,
        LaneSel::One(k) => k == key,
    }
}

/// The member to take the next batch of `lane`.
fn choose(g: &mut Group, lane: u64, key: &str, mode: Mode, window: usize) -> Option<usize> {
    let takes = |m: &Member| fits(&m.sel, key);
    // Online and not marked stuck (a batch of it timed out and it has not shown life since).
    let able = |m: &Member| m.session.is_online() && !m.session.is_lane_stuck();
    let room = |g: &Group, m: &Member| g.outstanding.get(&m.client).copied().unwrap_or(0) < window;
    if mode == Mode::Exclusive {
        if let Some(owner) = g.owners.get(&lane).cloned() {
            let owned = g
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.client == owner && takes(m))
                .max_by_key(|(_, m)| m.joined);
            if let Some((i, m)) = owned {
                if able(m) {
                    return room(g, m).then_some(i);
                }
            }
            g.owners.remove(&lane);
        }
        // An explicit subscriber of this lane first (the newest), then the least loaded.
        if let Some((i, m)) = g
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(&m.sel, LaneSel::One(k) if k == key) && able(m))
            .max_by_key(|(_, m)| m.joined)
        {
            return room(g, m).then_some(i);
        }
    }
    // The least loaded member; ties go round-robin, so lanes spread across the members even
    // when every batch is answered before the next one is chosen.
    let n = g.members.len().max(1);
    let rr = g.rr % n;
    g.rr = g.rr.wrapping_add(1);
    g.members
        .iter()
        .enumerate()
        .filter(|(_, m)| takes(m) && able(m) && room(g, m))
        .min_by_key(|(i, m)| {
            (
                g.outstanding.get(&m.client).copied().unwrap_or(0),
                (i + n - rr) % n,
            )
        })
        .map(|(i, _)| i)
}
