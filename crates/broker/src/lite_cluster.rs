//! Lanes across the nodes of a cluster (cluster mode, `docs/cluster.md`, "Lanes"): which
//! node dispatches a (group, lane), decided identically on every node from records of the
//! cluster's log, and the group offsets carried by the log.
//!
//! - A node **joins** a named group when it has an online member of it and **leaves** when
//!   it has none; each change is a [`LaneOp`] record of the log, so every node sees the same
//!   member sets at the same log offsets.
//! - The **owner** of a lane in a group is the member node with the highest rendezvous hash
//!   of (node, lane key): a join moves about 1/n of the lanes, a leave moves only the lanes
//!   of the node that left.
//! - A node that a join takes lanes from gives them up (their batches taken back, the group
//!   offsets written through the log) and then writes `Released`. A node leaving releases
//!   everything before it writes `Leave`.
//! - **Invariant**: a node dispatches a lane only if it owned it under every member set since
//!   the oldest change not yet released by every node it waits for. So one batch per (group,
//!   lane) is in flight cluster-wide, except while a node declared down is in fact alive
//!   (until it reads its own `Down`).
//! - Group offsets travel as `Commits` records; every node applies them (only forward), so
//!   they survive the loss of the node that dispatched the lane.
//! - A node not heard for a while is declared `Down` by the lowest live node
//!   (`crate::cluster::spawn_lane_watch`); a starting node declares itself down first (its
//!   earlier incarnation's lanes are free at once), and only then joins groups.
//!
//! Private groups (one client's lane replay) stay local to the node of their session.

use super::*;
use serde::Deserialize;

/// A lane membership change or group offsets, as a record of the cluster's log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum LaneOp {
    /// `node` has an online member of the group (`parent` is the parent's name).
    Join {
        parent: String,
        group: String,
        node: String,
    },
    /// `node` has no online member of the group left (and released its lanes).
    Leave {
        parent: String,
        group: String,
        node: String,
    },
    /// `node` gave up the lanes the change at log offset `at` took from it.
    Released {
        parent: String,
        group: String,
        node: String,
        at: u64,
    },
    /// `node` is gone (declared by another node), or started again (`boot`: its start time,
    /// 0 when declared by another node): it is in no group any more.
    Down { node: String, boot: u64 },
    /// Group offsets `(parent, lane key, group, first unacknowledged offset)` of lanes `node`
    /// dispatches.
    Commits {
        node: String,
        commits: Vec<(String, String, String, u64)>,
    },
}

impl LaneOp {
    /// A membership record (as opposed to group offsets): a starting node reads these again
    /// from the log to know the member sets.
    pub fn is_membership(&self) -> bool {
        !matches!(self, LaneOp::Commits { .. })
    }
}

/// A change of a group's member nodes that some node has not released yet.
#[derive(Debug)]
struct Change {
    at: u64,
    before: BTreeSet<Arc<str>>,
    waiting: BTreeSet<Arc<str>>,
}

#[derive(Debug, Default)]
struct Membership {
    nodes: BTreeSet<Arc<str>>,
    changes: VecDeque<Change>,
}

/// Lanes a join took from this node whose batches are still in flight here.
#[derive(Debug)]
struct Handoff {
    parent: Arc<str>,
    group: Arc<str>,
    /// The join's log offset.
    at: u64,
    lanes: Vec<u64>,
    /// Taken back from their members at this time if still unanswered.
    until: Instant,
}

/// How long a handoff waits for the batches in flight when the parent has no ack timeout.
const HANDOFF_WAIT_MS: u64 = 10_000;

/// The dispatcher's cluster state.
#[derive(Debug)]
pub(super) struct ClusterLanes {
    node: Arc<str>,
    boot: u64,
    /// This node's start record has come back through the log: it may join groups.
    live: bool,
    groups: HashMap<(Arc<str>, Arc<str>), Membership>,
    announced: HashSet<(Arc<str>, Arc<str>)>,
    handoffs: Vec<Handoff>,
    /// Every node in some group's member set (for the liveness watch).
    members: Arc<Mutex<BTreeSet<String>>>,
}

/// The rank of `node` for the lane `key` (FNV-1a, then a 64-bit finalizer): the same on
/// every node and every build.
fn rank(node: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0xff]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The key of a group's membership: (parent name, group name).
fn group_key(parent: &str, group: &str) -> (Arc<str>, Arc<str>) {
    (parent.into(), group.into())
}

/// The node of `nodes` that owns the lane `key`.
fn owner<'a>(nodes: &'a BTreeSet<Arc<str>>, key: &str) -> Option<&'a Arc<str>> {
    nodes.iter().max_by_key(|n| (rank(n, key), Arc::clone(n)))
}

impl ClusterLanes {
    pub(super) fn new(node: Arc<str>, members: Arc<Mutex<BTreeSet<String>>>) -> ClusterLanes {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64)
            .max(1);
        ClusterLanes {
            node,
            boot,
            live: false,
            groups: HashMap::new(),
            announced: HashSet::new(),
            handoffs: Vec::new(),
            members,
        }
    }

    /// May this node dispatch the lane `key` of the group?
    fn may_dispatch(&self, parent: &str, group: &str, key: &str) -> bool {
        let Some(m) = self.groups.get(&(Arc::from(parent), Arc::from(group))) else {
            return false;
        };
        let mine = |s: &BTreeSet<Arc<str>>| owner(s, key).is_some_and(|o| *o == self.node);
        mine(&m.nodes) && m.changes.iter().all(|c| mine(&c.before))
    }

    fn publish_members(&self) {
        let all: BTreeSet<String> = self
            .groups
            .values()
            .flat_map(|m| m.nodes.iter().map(|n| n.to_string()))
            .collect();
        *self.members.lock().unwrap_or_else(|e| e.into_inner()) = all;
    }
}

impl Membership {
    /// A change of the member set at `at`, waiting for the releases of `waiting`.
    fn change(&mut self, at: u64, nodes: BTreeSet<Arc<str>>, waiting: BTreeSet<Arc<str>>) {
        let before = std::mem::replace(&mut self.nodes, nodes);
        self.changes.push_back(Change {
            at,
            before,
            waiting,
        });
        self.settle();
    }

    /// `node` released everything (it left, or is down): nothing more to wait for from it.
    fn released_all(&mut self, node: &str) {
        for c in &mut self.changes {
            c.waiting.remove(node);
        }
        self.settle();
    }

    fn settle(&mut self) {
        while self.changes.front().is_some_and(|c| c.waiting.is_empty()) {
            self.changes.pop_front();
        }
    }
}

impl Dispatcher {
    /// Cluster mode: start as a node that holds no lane (its earlier incarnation's are free).
    pub(super) fn cluster_start(&mut self) {
        let Some(node) = self.host.upgrade().and_then(|h| h.cluster_node()) else {
            return;
        };
        let c = ClusterLanes::new(node.into(), self.cluster_members.clone());
        let op = LaneOp::Down {
            node: c.node.to_string(),
            boot: c.boot,
        };
        self.cluster = Some(c);
        self.emit(op);
    }

    /// A node stopping leaves every group at once (the others need not wait for its
    /// heartbeat to stop).
    pub(super) fn cluster_stop(&mut self) {
        if let Some(c) = self.cluster.as_ref().filter(|c| c.live) {
            let op = LaneOp::Down {
                node: c.node.to_string(),
                boot: 0,
            };
            self.emit(op);
        }
    }

    fn emit(&self, op: LaneOp) {
        if let Some(h) = self.host.upgrade() {
            h.lane_op(op);
        }
    }

    /// May this node dispatch `key` of the group `gid` (always, outside cluster mode)?
    pub(super) fn cluster_allows(&self, gid: u64, parent: &str, key: &str) -> bool {
        let Some(c) = &self.cluster else {
            return true;
        };
        match self.groups.get(&gid) {
            Some(g) if !g.private => c.may_dispatch(parent, &g.name, key),
            _ => true,
        }
    }

    /// The parent's name of a parent id.
    fn parent_name(&self, id: u32) -> Option<Arc<str>> {
        self.engine
            .parent_by_id(id)
            .map(|p| Arc::from(p.def.name.as_str()))
    }

    /// Join the groups this node has an online member of, leave the others (once live).
    pub(super) fn cluster_announce(&mut self) {
        let Some(c) = &self.cluster else {
            return;
        };
        if !c.live {
            return;
        }
        let mut want: HashMap<(Arc<str>, Arc<str>), u64> = HashMap::new();
        for g in self.groups.values() {
            if g.private || !g.members.iter().any(|m| m.session.is_online()) {
                continue;
            }
            if let Some(p) = self.parent_name(g.parent) {
                want.insert((p, g.name.clone()), g.id);
            }
        }
        let node = c.node.to_string();
        let joins: Vec<(Arc<str>, Arc<str>)> = want
            .keys()
            .filter(|k| !c.announced.contains(*k))
            .cloned()
            .collect();
        let leaves: Vec<(Arc<str>, Arc<str>)> = c
            .announced
            .iter()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for (parent, group) in leaves {
            // Its batches go back first; the offsets reach the log before the leave.
            self.release_group(&parent, &group, |_, _| true);
            self.persist_commits();
            self.emit(LaneOp::Leave {
                parent: parent.to_string(),
                group: group.to_string(),
                node: node.clone(),
            });
            if let Some(c) = &mut self.cluster {
                c.announced.remove(&(parent, group));
            }
        }
        for (parent, group) in joins {
            self.emit(LaneOp::Join {
                parent: parent.to_string(),
                group: group.to_string(),
                node: node.clone(),
            });
            if let Some(c) = &mut self.cluster {
                c.announced.insert((parent, group));
            }
        }
    }

    /// Take back the batches of the lanes of a local group for which `lose(lane, key)`.
    fn release_group(&mut self, parent: &str, group: &str, lose: impl Fn(u64, &str) -> bool) {
        let Some(pid) = self.engine.parent(parent).map(|p| p.id) else {
            return;
        };
        let Some(&gid) = self.by_name.get(&(pid, Arc::from(group))) else {
            return;
        };
        let engine = self.engine.clone();
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        let lanes: Vec<u64> = g
            .runs
            .iter()
            .filter(|(_, r)| r.batch.is_some())
            .map(|(l, _)| *l)
            .filter(|l| engine.lane(*l).is_some_and(|(_, key, _, _)| lose(*l, &key)))
            .collect();
        for lane in lanes {
            release(g, lane, false, &engine);
        }
    }

    /// Lanes of a local group with messages after its offsets become ready again (this node
    /// may own more of them now).
    fn rescan(&mut self, parent: &str, group: &str) {
        let Some(pid) = self.engine.parent(parent).map(|p| p.id) else {
            return;
        };
        let Some(&gid) = self.by_name.get(&(pid, Arc::from(group))) else {
            return;
        };
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        let (default, since) = match g.start {
            Start::Offset(n) => (n, None),
            Start::Latest(pos) => (0, Some(pos)),
            Start::Earliest => (0, None),
        };
        let sels: Vec<LaneSel> = if g.members.iter().any(|m| matches!(m.sel, LaneSel::All)) {
            vec![LaneSel::All]
        } else {
            g.members.iter().map(|m| m.sel.clone()).collect()
        };
        let mut lanes = Vec::new();
        for sel in &sels {
            match self
                .engine
                .lanes_behind(pid, sel, Some(&g.name), default, since)
            {
                Ok(l) => lanes.extend(l),
                Err(e) => warn!(error = %e, "cannot list the lanes of a group"),
            }
        }
        if let Some(g) = self.groups.get_mut(&gid) {
            for lane in lanes {
                push_ready(g, lane);
            }
            for lane in std::mem::take(&mut g.blocked) {
                push_ready(g, lane);
            }
        }
    }

    /// A lane record of the log, at offset `at` (`replay`: read again at start, already acted
    /// on by this node's earlier incarnation).
    pub(super) fn remote(&mut self, op: LaneOp, at: u64, replay: bool) {
        let Some(c) = &mut self.cluster else {
            return;
        };
        let me = c.node.clone();
        match op {
            LaneOp::Join {
                parent,
                group,
                node,
            } => {
                let key = group_key(&parent, &group);
                let m = c.groups.entry(key).or_default();
                if m.nodes.contains(node.as_str()) {
                    return;
                }
                let waiting: BTreeSet<Arc<str>> = m.nodes.clone();
                let mut nodes = m.nodes.clone();
                nodes.insert(node.as_str().into());
                let held = waiting.contains(&me) && node.as_str() != &*me;
                m.change(at, nodes, waiting);
                c.publish_members();
                if held && !replay {
                    // Give up what the newcomer owns now: no new batch of those lanes, the
                    // batches in flight are answered first (or taken back at the parent's
                    // ack timeout), then say so (`cluster_handoffs`).
                    let lost: Vec<u64> = match self.cluster.as_ref() {
                        Some(c) => self
                            .held_lanes(&parent, &group)
                            .into_iter()
                            .filter(|(_, k)| !c.may_dispatch(&parent, &group, k))
                            .map(|(l, _)| l)
                            .collect(),
                        None => Vec::new(),
                    };
                    let wait_ms = self
                        .engine
                        .parent(&parent)
                        .map_or(0, |p| p.def.ack_timeout_ms);
                    let wait_ms = if wait_ms == 0 {
                        HANDOFF_WAIT_MS
                    } else {
                        wait_ms
                    };
                    if let Some(c) = &mut self.cluster {
                        c.handoffs.push(Handoff {
                            parent: parent.as_str().into(),
                            group: group.as_str().into(),
                            at,
                            lanes: lost,
                            until: Instant::now() + Duration::from_millis(wait_ms),
                        });
                    }
                    self.cluster_handoffs();
                }
                self.rescan(&parent, &group);
            }
            LaneOp::Leave {
                parent,
                group,
                node,
            } => {
                let key = group_key(&parent, &group);
                let m = c.groups.entry(key).or_default();
                if m.nodes.contains(node.as_str()) {
                    let mut nodes = m.nodes.clone();
                    nodes.remove(node.as_str());
                    m.change(at, nodes, BTreeSet::new());
                }
                m.released_all(&node);
                c.publish_members();
                self.rescan(&parent, &group);
            }
            LaneOp::Released {
                parent,
                group,
                node,
                at: change,
            } => {
                let key = group_key(&parent, &group);
                if let Some(m) = c.groups.get_mut(&key) {
                    if let Some(ch) = m.changes.iter_mut().find(|ch| ch.at == change) {
                        ch.waiting.remove(node.as_str());
                    }
                    m.settle();
                }
                self.rescan(&parent, &group);
            }
            LaneOp::Down { node, boot } => {
                let mut touched = Vec::new();
                for ((p, g), m) in &mut c.groups {
                    if m.nodes.contains(node.as_str()) {
                        let mut nodes = m.nodes.clone();
                        nodes.remove(node.as_str());
                        m.change(at, nodes, BTreeSet::new());
                        touched.push((p.clone(), g.clone()));
                    }
                    m.released_all(&node);
                }
                c.publish_members();
                let mut reset = None;
                if node.as_str() == &*me && !replay {
                    if boot == c.boot {
                        c.live = true;
                    } else if c.live {
                        reset = Some(c.announced.drain().collect::<Vec<_>>());
                    }
                }
                if let Some(groups) = reset {
                    // Declared down while alive: give everything up, join again.
                    for (p, g) in groups {
                        self.release_group(&p, &g, |_, _| true);
                    }
                    self.persist_commits();
                    warn!("cluster: this node was declared down by another node; its lanes were given up and it joins its groups again");
                }
                for (p, g) in touched {
                    self.rescan(&p, &g);
                }
            }
            LaneOp::Commits { node, commits } => {
                if node.as_str() != &*me {
                    self.apply_commits(commits);
                }
            }
        }
    }

    /// Handoffs whose batches are all answered (or whose wait is over: taken back now):
    /// their offsets go to the log, then `Released`.
    pub(super) fn cluster_handoffs(&mut self) {
        let Some(c) = &mut self.cluster else {
            return;
        };
        if c.handoffs.is_empty() {
            return;
        }
        let now = Instant::now();
        let handoffs = std::mem::take(&mut c.handoffs);
        let mut keep = Vec::new();
        for h in handoffs {
            let open: HashSet<u64> = self
                .held_lanes(&h.parent, &h.group)
                .into_iter()
                .map(|(l, _)| l)
                .filter(|l| h.lanes.contains(l))
                .collect();
            if !open.is_empty() && now < h.until {
                keep.push(h);
                continue;
            }
            self.release_group(&h.parent, &h.group, |l, _| open.contains(&l));
            self.persist_commits();
            if let Some(c) = &self.cluster {
                self.emit(LaneOp::Released {
                    parent: h.parent.to_string(),
                    group: h.group.to_string(),
                    node: c.node.to_string(),
                    at: h.at,
                });
            }
        }
        if let Some(c) = &mut self.cluster {
            keep.append(&mut c.handoffs);
            c.handoffs = keep;
        }
    }

    /// The lanes (and keys) of a local group with a batch in flight.
    fn held_lanes(&self, parent: &str, group: &str) -> Vec<(u64, String)> {
        let Some(pid) = self.engine.parent(parent).map(|p| p.id) else {
            return Vec::new();
        };
        let Some(g) = self
            .by_name
            .get(&(pid, Arc::from(group)))
            .and_then(|gid| self.groups.get(gid))
        else {
            return Vec::new();
        };
        g.runs
            .iter()
            .filter(|(_, r)| r.batch.is_some())
            .filter_map(|(l, _)| self.engine.lane(*l).map(|(_, k, _, _)| (*l, k.to_string())))
            .collect()
    }

    /// Group offsets another node committed: stored here too (only forward).
    fn apply_commits(&mut self, commits: Vec<(String, String, String, u64)>) {
        let mut store = Vec::new();
        for (parent, key, group, off) in commits {
            let Some(pid) = self.engine.parent(&parent).map(|p| p.id) else {
                continue;
            };
            let Some(lane) = self.engine.lane_id(pid, &key) else {
                continue;
            };
            let group: Arc<str> = group.into();
            if let Some(g) = self
                .by_name
                .get(&(pid, group.clone()))
                .and_then(|gid| self.groups.get_mut(gid))
            {
                if g.runs.get(&lane).is_some_and(|r| r.batch.is_some()) {
                    continue; // this node holds the lane: its own offsets count
                }
                if let Some(c) = g.committed.get_mut(&lane) {
                    if *c >= off {
                        continue;
                    }
                    *c = off;
                }
                g.runs.remove(&lane);
            }
            let known = self.engine.load_commit(lane, &group).unwrap_or(None);
            if known.is_none_or(|k| k < off) {
                store.push((lane, group, off));
            }
        }
        if !store.is_empty() {
            if let Err(e) = self.engine.put_commits(&store) {
                warn!(error = %e, "cannot store lane group offsets of another node");
            }
            self.unflushed = true;
        }
    }

    /// Cluster mode: group offsets just stored locally go to the log too.
    pub(super) fn cluster_commits(&self, commits: &[(u64, Arc<str>, u64)]) {
        let Some(c) = &self.cluster else {
            return;
        };
        let mut out = Vec::new();
        for (lane, group, off) in commits {
            if group.starts_with('\u{1}') {
                continue; // a private replay
            }
            let Some((pid, key, _, _)) = self.engine.lane(*lane) else {
                continue;
            };
            let Some(parent) = self.parent_name(pid) else {
                continue;
            };
            out.push((parent.to_string(), key.to_string(), group.to_string(), *off));
        }
        if !out.is_empty() {
            self.emit(LaneOp::Commits {
                node: c.node.to_string(),
                commits: out,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<Arc<str>> {
        v.iter().map(|s| Arc::from(*s)).collect()
    }

    #[test]
    fn a_join_moves_a_share_of_the_lanes_and_a_leave_only_the_leavers() {
        let two = set(&["a", "b"]);
        let three = set(&["a", "b", "c"]);
        let keys: Vec<String> = (0..3000).map(|i| format!("s-{i}")).collect();
        let mut moved = 0;
        for k in &keys {
            let before = owner(&two, k).cloned();
            let after = owner(&three, k).cloned();
            if before != after {
                // Only ever to the newcomer.
                assert_eq!(after.as_deref(), Some("c"));
                moved += 1;
            }
            // Without c again: exactly the old owner.
            assert_eq!(owner(&two, k), before.as_ref());
        }
        assert!((800..1200).contains(&moved), "{moved} of 3000 moved");
        assert!(owner(&BTreeSet::new(), "x").is_none());
    }

    #[test]
    fn a_node_waits_for_the_releases_of_a_join() {
        let mut m = Membership::default();
        m.change(1, set(&["a"]), BTreeSet::new());
        assert!(m.changes.is_empty());
        m.change(5, set(&["a", "b"]), set(&["a"]));
        assert_eq!(m.changes.len(), 1);
        // A later leave is remembered behind the pending join.
        m.change(7, set(&["b"]), BTreeSet::new());
        assert_eq!(m.changes.len(), 2);
        m.changes[0].waiting.remove("a");
        m.settle();
        assert!(m.changes.is_empty());
        // A node that leaves or is down releases everything it was waited for.
        m.change(9, set(&["b", "c"]), set(&["b"]));
        m.released_all("b");
        assert!(m.changes.is_empty());
    }

    #[test]
    fn lane_ops_round_trip() {
        let op = LaneOp::Commits {
            node: "n1".into(),
            commits: vec![("agents".into(), "s-1".into(), "workers".into(), 7)],
        };
        let v = serde_json::to_vec(&op).unwrap_or_default();
        assert_eq!(serde_json::from_slice::<LaneOp>(&v).ok(), Some(op));
        assert!(!LaneOp::Commits {
            node: String::new(),
            commits: vec![]
        }
        .is_membership());
    }
}
