//! The subscription trie: topic filter levels to subscribers, with `$share` groups.
//!
//! Matching walks the topic's levels once, following exact, `+` and `#` children; a topic
//! starting with `$` is not matched by a first-level wildcard [MQTT-4.7.2-1]. Several matching
//! subscriptions of one session are merged into one delivery (highest QoS, every
//! subscription identifier) as MQTT 5 section 3.3.4 allows.

use crate::message::{Delivery, SharedOrigin};
use crate::session::Session;
use lanemq_protocol::{QoS, SubscriptionOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Hits of one publish up to which targets are de-duplicated by a linear search.
const DEDUP_LINEAR_MAX: usize = 16;

#[derive(Clone)]
pub struct Subscriber {
    pub session: Arc<Session>,
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
}

#[derive(Default)]
struct SharedGroup {
    members: Vec<Subscriber>,
    next: AtomicUsize,
}

#[derive(Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    subscribers: HashMap<Arc<str>, Subscriber>,
    shared: HashMap<Arc<str>, SharedGroup>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.subscribers.is_empty() && self.shared.is_empty()
    }
}

/// One routing target for a message.
pub struct Target {
    pub session: Arc<Session>,
    pub qos: QoS,
    pub retain_as_published: bool,
    pub sub_ids: Vec<u32>,
    pub share: Option<Arc<SharedOrigin>>,
}

impl Target {
    /// The delivery of `msg` to this target, with this RETAIN flag.
    pub fn delivery(&self, msg: &Arc<crate::message::Message>, retain: bool) -> Delivery {
        Delivery {
            msg: msg.clone(),
            qos: self.qos,
            retain,
            sub_ids: self.sub_ids.clone(),
            share: self.share.clone(),
            seq: 0,
            stream: None,
            lane: None,
        }
    }
}

/// A matching subscriber, and the shared group it was chosen from.
type Hit<'a> = (&'a Subscriber, Option<Arc<SharedOrigin>>);

#[derive(Default)]
pub struct Router {
    root: Node,
    count: usize,
    /// Bumped by every change of the subscriptions: a [`RouteCache`] of an older generation
    /// is stale.
    generation: u64,
}

/// The targets of the last topic one publisher routed, reused while the router is unchanged
/// and the publisher sends the same topic at the same QoS again (a device or a load
/// generator publishing on its own topic: the trie walk, its hashing and its allocations then
/// happen once per change of the subscriptions, not once per message). Never holds the
/// targets of a shared subscription, whose member is chosen per message.
#[derive(Default)]
pub struct RouteCache {
    topic: Option<Arc<str>>,
    qos: QoS,
    generation: u64,
    targets: Vec<Target>,
}

impl Router {
    pub fn subscription_count(&self) -> usize {
        self.count
    }

    /// Add or replace a subscription. `group` is the `$share` group, `filter` the inner filter.
    pub fn subscribe(&mut self, group: Option<&str>, filter: &str, sub: Subscriber) {
        self.generation += 1;
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.entry(level.into()).or_default();
        }
        let client = sub.session.client_id.clone();
        let added = match group {
            None => node.subscribers.insert(client, sub).is_none(),
            Some(g) => {
                let grp = node.shared.entry(g.into()).or_default();
                if let Some(m) = grp
                    .members
                    .iter_mut()
                    .find(|m| m.session.client_id == client)
                {
                    *m = sub;
                    false
                } else {
                    grp.members.push(sub);
                    true
                }
            }
        };
        if added {
            self.count += 1;
        }
    }

    /// Remove a subscription; true if it existed.
    pub fn unsubscribe(&mut self, group: Option<&str>, filter: &str, client_id: &str) -> bool {
        self.generation += 1;
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = remove(&mut self.root, &levels, group, client_id);
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Other members of a shared group, for redelivery when a member's session ends.
    pub fn pick_shared(&self, group: &str, filter: &str, exclude: &str) -> Option<Subscriber> {
        let mut node = &self.root;
        for level in filter.split('/') {
            node = node.children.get(level)?;
        }
        let grp = node.shared.get(group)?;
        choose(grp, Some(exclude)).cloned()
    }

    /// [`Router::route`] through the publisher's `cache`: the targets of `topic`, computed
    /// again only if the topic, the QoS or the subscriptions changed since the last call.
    pub fn route_cached<'c>(
        &self,
        topic: &Arc<str>,
        publisher: &str,
        published_qos: QoS,
        cache: &'c mut RouteCache,
    ) -> &'c [Target] {
        let hit = cache.generation == self.generation
            && cache.qos == published_qos
            && cache.topic.as_deref() == Some(&**topic);
        if !hit {
            cache.targets.clear();
            self.route(topic, publisher, published_qos, &mut cache.targets);
            let shared = cache.targets.iter().any(|t| t.share.is_some());
            cache.topic = (!shared).then(|| topic.clone());
            cache.qos = published_qos;
            cache.generation = self.generation;
        }
        &cache.targets
    }

    /// Every session that should receive a message published on `topic` by `publisher`.
    pub fn route(&self, topic: &str, publisher: &str, published_qos: QoS, out: &mut Vec<Target>) {
        let levels: Vec<&str> = topic.split('/').collect();
        let dollar = topic.starts_with('$');
        let mut hits: Vec<Hit<'_>> = Vec::new();
        collect(&self.root, &levels, 0, dollar, &mut Vec::new(), &mut hits);
        let start = out.len();
        // A session that matches through several filters gets one target: a linear search
        // for a few hits, a map by session for many (a topic with thousands of subscribers
        // would otherwise cost hits² comparisons per publish).
        let mut by_session: Option<HashMap<usize, usize>> =
            (hits.len() > DEDUP_LINEAR_MAX).then(|| HashMap::with_capacity(hits.len()));
        for (sub, share) in hits {
            if share.is_none() && sub.options.no_local && &*sub.session.client_id == publisher {
                continue;
            }
            let qos = published_qos.min(sub.options.qos);
            if share.is_none() {
                let found = match &mut by_session {
                    Some(m) => {
                        let key = Arc::as_ptr(&sub.session) as usize;
                        match m.get(&key) {
                            Some(&i) => Some(i),
                            None => {
                                m.insert(key, out.len());
                                None
                            }
                        }
                    }
                    None => out[start..]
                        .iter()
                        .position(|t| t.share.is_none() && Arc::ptr_eq(&t.session, &sub.session))
                        .map(|i| start + i),
                };
                if let Some(i) = found {
                    let t = &mut out[i];
                    t.qos = t.qos.max(qos);
                    t.retain_as_published |= sub.options.retain_as_published;
                    t.sub_ids.extend(sub.sub_id);
                    continue;
                }
            }
            out.push(Target {
                session: sub.session.clone(),
                qos,
                retain_as_published: sub.options.retain_as_published,
                sub_ids: sub.sub_id.into_iter().collect(),
                share,
            });
        }
    }
}

fn choose<'a>(grp: &'a SharedGroup, exclude: Option<&str>) -> Option<&'a Subscriber> {
    let n = grp.members.len();
    if n == 0 {
        return None;
    }
    let start = grp.next.fetch_add(1, Ordering::Relaxed);
    let eligible = |m: &Subscriber| exclude.is_none_or(|e| &*m.session.client_id != e);
    // Prefer a connected member; fall back to any (its session queues the message).
    (0..n)
        .map(|i| &grp.members[(start + i) % n])
        .find(|m| eligible(m) && m.session.is_online())
        .or_else(|| {
            (0..n)
                .map(|i| &grp.members[(start + i) % n])
                .find(|m| eligible(m))
        })
}

fn collect<'a>(
    node: &'a Node,
    levels: &[&str],
    depth: usize,
    dollar: bool,
    path: &mut Vec<&'a str>,
    hits: &mut Vec<Hit<'a>>,
) {
    let wildcard_ok = !(dollar && depth == 0);
    if wildcard_ok {
        if let Some(h) = node.children.get("#") {
            path.push("#");
            emit(h, path, hits);
            path.pop();
        }
    }
    let Some((level, rest)) = levels.split_first() else {
        emit(node, path, hits);
        return;
    };
    if let Some((key, child)) = node.children.get_key_value(*level) {
        path.push(key);
        if rest.is_empty() {
            emit_end(child, path, hits);
        } else {
            collect(child, rest, depth + 1, dollar, path, hits);
        }
        path.pop();
    }
    if wildcard_ok {
        if let Some(child) = node.children.get("+") {
            path.push("+");
            if rest.is_empty() {
                emit_end(child, path, hits);
            } else {
                collect(child, rest, depth + 1, dollar, path, hits);
            }
            path.pop();
        }
    }
}

/// At the node of the topic's last level: its subscribers, and `x/#` also matches `x`.
fn emit_end<'a>(node: &'a Node, path: &mut Vec<&'a str>, hits: &mut Vec<Hit<'a>>) {
    emit(node, path, hits);
    if let Some(h) = node.children.get("#") {
        path.push("#");
        emit(h, path, hits);
        path.pop();
    }
}

fn emit<'a>(node: &'a Node, path: &[&'a str], hits: &mut Vec<Hit<'a>>) {
    hits.extend(node.subscribers.values().map(|s| (s, None)));
    for (group, grp) in &node.shared {
        if let Some(m) = choose(grp, None) {
            let share = Arc::new(SharedOrigin {
                group: group.clone(),
                filter: Arc::<str>::from(path.join("/")),
            });
            hits.push((m, Some(share)));
        }
    }
}

fn remove(node: &mut Node, levels: &[&str], group: Option<&str>, client_id: &str) -> bool {
    let Some((level, rest)) = levels.split_first() else {
        return match group {
            None => node.subscribers.remove(client_id).is_some(),
            Some(g) => {
                let Some(grp) = node.shared.get_mut(g) else {
                    return false;
                };
                let before = grp.members.len();
                grp.members.retain(|m| &*m.session.client_id != client_id);
                let removed = grp.members.len() != before;
                if grp.members.is_empty() {
                    node.shared.remove(g);
                }
                removed
            }
        };
    };
    let Some(child) = node.children.get_mut(*level) else {
        return false;
    };
    let removed = remove(child, rest, group, client_id);
    if child.is_empty() {
        node.children.remove(*level);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanemq_protocol::ProtocolVersion;

    fn sess(id: &str) -> Arc<Session> {
        Arc::new(Session::new(
            id.into(),
            ProtocolVersion::V5,
            Arc::new(crate::session::QueueLimits::simple(10, 1 << 20)),
        ))
    }
    fn sub(s: &Arc<Session>, qos: QoS, id: Option<u32>) -> Subscriber {
        Subscriber {
            session: s.clone(),
            options: SubscriptionOptions {
                qos,
                ..Default::default()
            },
            sub_id: id,
        }
    }

    #[test]
    fn wildcards_and_dollar() {
        let mut r = Router::default();
        let a = sess("a");
        r.subscribe(None, "#", sub(&a, QoS::AtMostOnce, None));
        r.subscribe(None, "x/+/z", sub(&a, QoS::AtLeastOnce, Some(7)));
        let mut out = Vec::new();
        r.route("x/y/z", "p", QoS::ExactlyOnce, &mut out);
        assert_eq!(out.len(), 1, "overlapping subscriptions merge");
        assert_eq!(out[0].qos, QoS::AtLeastOnce);
        assert_eq!(out[0].sub_ids, vec![7]);
        out.clear();
        r.route("$SYS/x", "p", QoS::AtMostOnce, &mut out);
        assert!(out.is_empty());
        out.clear();
        r.subscribe(None, "x/#", sub(&a, QoS::AtMostOnce, None));
        assert!(r.unsubscribe(None, "#", "a"));
        r.route("x", "p", QoS::AtMostOnce, &mut out);
        assert_eq!(out.len(), 1, "x/# matches x");
    }

    #[test]
    fn shared_round_robin() {
        let mut r = Router::default();
        let (a, b) = (sess("a"), sess("b"));
        r.subscribe(Some("g"), "t/#", sub(&a, QoS::AtLeastOnce, None));
        r.subscribe(Some("g"), "t/#", sub(&b, QoS::AtLeastOnce, None));
        let mut seen = Vec::new();
        for _ in 0..4 {
            let mut out = Vec::new();
            r.route("t/1", "p", QoS::AtLeastOnce, &mut out);
            assert_eq!(out.len(), 1);
            seen.push(out[0].session.client_id.to_string());
        }
        assert!(seen.contains(&"a".to_string()) && seen.contains(&"b".to_string()));
        assert!(r.unsubscribe(Some("g"), "t/#", "a"));
        assert_eq!(r.subscription_count(), 1);
    }
}
