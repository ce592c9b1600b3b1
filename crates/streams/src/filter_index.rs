//! Which stream filters match a topic: a topic trie over MQTT filters.
//!
//! Each node is one filter level; literal levels are children in a `HashMap`, `+` has its own
//! slot and the values of a filter ending in `#` sit in the `#` list of the node of the level
//! before it. Matching a topic walks only the trie paths the topic can take, so its cost depends
//! on the topic's depth and on the number of matching filters, not on the number of filters.
//!
//! Semantics (MQTT 5 4.7): `+` matches exactly one level, `#` matches its parent level and every
//! level below (`a/#` matches `a`, `a/` and `a/b/c`), empty levels are levels, and a filter whose
//! first level is `+` or `#` never matches a topic beginning with `$` [MQTT-4.7.2-1].
//! Filters are expected to be valid (`lanemq_protocol::topic::valid_filter`); as in
//! `lanemq_protocol::topic::matches`, a `#` level ends the filter wherever it appears.

use std::collections::HashMap;
use std::fmt;

struct Node<T> {
    children: HashMap<String, Node<T>>,
    plus: Option<Box<Node<T>>>,
    /// Values of filters ending here (`a/b` for the node of `b`).
    values: Vec<T>,
    /// Values of filters ending in `#` below here (`a/b/#` for the node of `b`).
    hash: Vec<T>,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node {
            children: HashMap::new(),
            plus: None,
            values: Vec::new(),
            hash: Vec::new(),
        }
    }
}

/// Dropping a node drops its subtree iteratively: a filter may have tens of thousands of
/// levels, and the derived recursive drop would overflow the stack.
impl<T> Drop for Node<T> {
    fn drop(&mut self) {
        let mut stack: Vec<Node<T>> = self.children.drain().map(|(_, n)| n).collect();
        stack.extend(self.plus.take().map(|p| *p));
        while let Some(mut n) = stack.pop() {
            stack.extend(n.children.drain().map(|(_, c)| c));
            stack.extend(n.plus.take().map(|p| *p));
        }
    }
}

impl<T> Node<T> {
    /// Number of edges below this node.
    fn edges(&self) -> usize {
        self.children.len() + usize::from(self.plus.is_some())
    }

    fn child(&self, level: Step<'_>) -> Option<&Node<T>> {
        match level {
            Step::Plus => self.plus.as_deref(),
            Step::Literal(l) => self.children.get(l),
        }
    }

    fn child_mut(&mut self, level: Step<'_>) -> Option<&mut Node<T>> {
        match level {
            Step::Plus => self.plus.as_deref_mut(),
            Step::Literal(l) => self.children.get_mut(l),
        }
    }

    fn child_or_insert(&mut self, level: Step<'_>) -> &mut Node<T> {
        match level {
            Step::Plus => self.plus.get_or_insert_with(Box::default),
            Step::Literal(l) => self.children.entry(l.to_string()).or_default(),
        }
    }

    fn remove_child(&mut self, level: Step<'_>) {
        match level {
            Step::Plus => self.plus = None,
            Step::Literal(l) => {
                self.children.remove(l);
            }
        }
    }
}

/// One non-`#` level of a filter.
#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Plus,
    Literal(&'a str),
}

/// A filter as a path in the trie: its levels up to (not including) `#`, and whether it ends
/// in `#`.
fn filter_path(filter: &str) -> (Vec<Step<'_>>, bool) {
    let mut steps = Vec::new();
    for level in filter.split('/') {
        match level {
            "#" => return (steps, true),
            "+" => steps.push(Step::Plus),
            l => steps.push(Step::Literal(l)),
        }
    }
    (steps, false)
}

/// Maps MQTT topic filters to values; [`FilterIndex::for_each_match`] finds every value whose
/// filter matches a topic, in time independent of the number of filters that do not.
///
/// `Clone` and `Debug` walk the trie iteratively (deep filters do not overflow the stack).
pub struct FilterIndex<T> {
    root: Node<T>,
    len: usize,
}

impl<T> Default for FilterIndex<T> {
    fn default() -> Self {
        FilterIndex {
            root: Node::default(),
            len: 0,
        }
    }
}

impl<T: Clone + PartialEq> FilterIndex<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a value under a filter (the same value may be under several filters; a value added
    /// twice under the same filter is there twice).
    pub fn insert(&mut self, filter: &str, value: T) {
        let (steps, hash) = filter_path(filter);
        let mut node = &mut self.root;
        for step in steps {
            node = node.child_or_insert(step);
        }
        if hash {
            node.hash.push(value);
        } else {
            node.values.push(value);
        }
        self.len += 1;
    }

    /// Remove one value from under a filter; true if it was there. Nodes left empty are pruned.
    pub fn remove(&mut self, filter: &str, value: &T) -> bool {
        let (steps, hash) = filter_path(filter);
        // Find the node and, on the way, the shallowest node from which the whole remaining
        // path would be empty once the value is gone (pruned by cutting the edge above it).
        let mut path: Vec<&Node<T>> = Vec::with_capacity(steps.len() + 1);
        let mut node = &self.root;
        path.push(node);
        for &step in &steps {
            match node.child(step) {
                Some(n) => node = n,
                None => return false,
            }
            path.push(node);
        }
        let list = if hash { &node.hash } else { &node.values };
        let Some(pos) = list.iter().position(|v| v == value) else {
            return false;
        };
        // After removal, is the end node empty?
        let end_empty = node.edges() == 0 && node.values.len() + node.hash.len() == 1;
        // cut = index in `path` of the shallowest node to drop (0 = nothing, the root stays).
        let mut cut = 0;
        if end_empty && !steps.is_empty() {
            cut = steps.len();
            while cut > 1 {
                let parent = path[cut - 1];
                if parent.edges() == 1 && parent.values.is_empty() && parent.hash.is_empty() {
                    cut -= 1;
                } else {
                    break;
                }
            }
        }
        drop(path);

        let mut node = &mut self.root;
        for (i, &step) in steps.iter().enumerate() {
            if cut != 0 && i + 1 == cut {
                node.remove_child(step);
                self.len -= 1;
                return true;
            }
            node = match node.child_mut(step) {
                Some(n) => n,
                None => return false,
            };
        }
        let list = if hash {
            &mut node.hash
        } else {
            &mut node.values
        };
        list.remove(pos);
        self.len -= 1;
        true
    }

    /// Call `f` for each value whose filter matches `topic` (once per (filter, value) entry).
    pub fn for_each_match(&self, topic: &str, mut f: impl FnMut(&T)) {
        let levels: Vec<&str> = topic.split('/').collect();
        let dollar = topic.starts_with('$');
        // Explicit stack: topics may have tens of thousands of levels.
        let mut stack: Vec<(&Node<T>, usize)> = vec![(&self.root, 0)];
        while let Some((node, depth)) = stack.pop() {
            let wildcards_ok = !(dollar && depth == 0);
            if wildcards_ok {
                node.hash.iter().for_each(&mut f);
            }
            let Some(level) = levels.get(depth) else {
                node.values.iter().for_each(&mut f);
                continue;
            };
            if let Some(child) = node.children.get(*level) {
                stack.push((child, depth + 1));
            }
            if wildcards_ok {
                if let Some(plus) = node.plus.as_deref() {
                    stack.push((plus, depth + 1));
                }
            }
        }
    }

    /// The values whose filter matches `topic` (one per matching entry).
    pub fn matching(&self, topic: &str) -> Vec<T> {
        let mut out = Vec::new();
        self.for_each_match(topic, |v| out.push(v.clone()));
        out
    }

    /// Every (filter, value) entry, filters in no particular order, values under one filter in
    /// insertion order.
    pub fn entries(&self) -> Vec<(String, T)> {
        let mut out = Vec::with_capacity(self.len);
        // (node, the filter levels leading to it)
        let mut stack: Vec<(&Node<T>, String)> = vec![(&self.root, String::new())];
        while let Some((node, prefix)) = stack.pop() {
            let join = |level: &str| {
                if prefix.is_empty() && std::ptr::eq(node, &self.root) {
                    level.to_string()
                } else {
                    format!("{prefix}/{level}")
                }
            };
            for v in &node.values {
                out.push((prefix.clone(), v.clone()));
            }
            if !node.hash.is_empty() {
                let f = join("#");
                for v in &node.hash {
                    out.push((f.clone(), v.clone()));
                }
            }
            for (level, child) in &node.children {
                stack.push((child, join(level)));
            }
            if let Some(plus) = node.plus.as_deref() {
                stack.push((plus, join("+")));
            }
        }
        out
    }

    /// Number of (filter, value) entries.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of trie nodes below the root (for tests of pruning).
    #[cfg(test)]
    fn node_count(&self) -> usize {
        let mut n = 0;
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            for c in node.children.values() {
                n += 1;
                stack.push(c);
            }
            if let Some(p) = node.plus.as_deref() {
                n += 1;
                stack.push(p);
            }
        }
        n
    }
}

impl<T: Clone + PartialEq> Clone for FilterIndex<T> {
    fn clone(&self) -> Self {
        let mut out = FilterIndex::new();
        for (f, v) in self.entries() {
            out.insert(&f, v);
        }
        out
    }
}

impl<T: Clone + PartialEq + fmt::Debug> fmt::Debug for FilterIndex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilterIndex")
            .field("len", &self.len)
            .field("entries", &self.entries())
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use lanemq_protocol::topic::{matches, valid_filter};
    use proptest::prelude::*;

    fn sorted(idx: &FilterIndex<u32>, topic: &str) -> Vec<u32> {
        let mut v = idx.matching(topic);
        v.sort_unstable();
        v
    }

    #[test]
    fn empty_index() {
        let idx: FilterIndex<u32> = FilterIndex::new();
        assert!(idx.is_empty());
        assert_eq!(idx.len(), 0);
        assert!(idx.matching("a").is_empty());
        let d: FilterIndex<u32> = FilterIndex::default();
        assert!(d.is_empty());
    }

    #[test]
    fn basic_matching() {
        let mut idx = FilterIndex::new();
        idx.insert("a/b", 1);
        idx.insert("a/+", 2);
        idx.insert("a/#", 3);
        idx.insert("#", 4);
        idx.insert("+/b", 5);
        idx.insert("a/b/c", 6);
        idx.insert("+", 7);
        assert_eq!(idx.len(), 7);
        assert_eq!(sorted(&idx, "a/b"), vec![1, 2, 3, 4, 5]);
        assert_eq!(sorted(&idx, "a"), vec![3, 4, 7]);
        assert_eq!(sorted(&idx, "a/b/c"), vec![3, 4, 6]);
        assert_eq!(sorted(&idx, "x/b"), vec![4, 5]);
        assert_eq!(sorted(&idx, "x"), vec![4, 7]);
        assert_eq!(sorted(&idx, "a/c"), vec![2, 3, 4]);
    }

    #[test]
    fn hash_matches_parent() {
        let mut idx = FilterIndex::new();
        idx.insert("sport/tennis/#", 1);
        assert_eq!(sorted(&idx, "sport/tennis"), vec![1]);
        assert_eq!(sorted(&idx, "sport/tennis/"), vec![1]);
        assert_eq!(sorted(&idx, "sport/tennis/x/y"), vec![1]);
        assert!(sorted(&idx, "sport").is_empty());
        assert!(sorted(&idx, "sport/tennisx").is_empty());
    }

    #[test]
    fn empty_levels_are_levels() {
        let mut idx = FilterIndex::new();
        idx.insert("/", 1);
        idx.insert("+/+", 2);
        idx.insert("/+", 3);
        idx.insert("a//b", 4);
        idx.insert("a/+/b", 5);
        idx.insert("+", 6);
        assert_eq!(sorted(&idx, "/"), vec![1, 2, 3]);
        assert_eq!(sorted(&idx, "/a"), vec![2, 3]);
        assert_eq!(sorted(&idx, "a//b"), vec![4, 5]);
        assert_eq!(sorted(&idx, "a/b/"), Vec::<u32>::new());
        assert_eq!(sorted(&idx, ""), vec![6]);
    }

    #[test]
    fn dollar_topics() {
        let mut idx = FilterIndex::new();
        idx.insert("#", 1);
        idx.insert("+/x", 2);
        idx.insert("$SYS/#", 3);
        idx.insert("$SYS/+", 4);
        idx.insert("+", 5);
        idx.insert("$SYS/x/#", 6);
        assert_eq!(sorted(&idx, "$SYS/x"), vec![3, 4, 6]);
        assert_eq!(sorted(&idx, "$SYS"), vec![3]);
        assert_eq!(sorted(&idx, "$stream/events"), Vec::<u32>::new());
        assert_eq!(sorted(&idx, "a/x"), vec![1, 2]);
        // Only the first level is special.
        assert_eq!(sorted(&idx, "a/$x"), vec![1]);
    }

    #[test]
    fn duplicates_and_remove() {
        let mut idx = FilterIndex::new();
        idx.insert("a/+", 1);
        idx.insert("a/+", 1);
        idx.insert("a/#", 1);
        idx.insert("a/+", 2);
        assert_eq!(idx.len(), 4);
        assert_eq!(sorted(&idx, "a/b"), vec![1, 1, 1, 2]);
        assert!(idx.remove("a/+", &1));
        assert_eq!(sorted(&idx, "a/b"), vec![1, 1, 2]);
        assert!(idx.remove("a/+", &1));
        assert!(!idx.remove("a/+", &1));
        assert_eq!(sorted(&idx, "a/b"), vec![1, 2]);
        assert!(!idx.remove("a/b", &2));
        assert!(!idx.remove("x/y/z", &2));
        assert!(!idx.remove("a/#", &2));
        assert!(idx.remove("a/#", &1));
        assert!(idx.remove("a/+", &2));
        assert!(idx.is_empty());
        assert_eq!(idx.node_count(), 0);
    }

    #[test]
    fn remove_prunes_only_empty_nodes() {
        let mut idx = FilterIndex::new();
        idx.insert("a/b/c/d", 1);
        idx.insert("a/b", 2);
        idx.insert("a/+/x", 3);
        assert_eq!(idx.node_count(), 6); // a, b, c, d, +, x
        assert!(idx.remove("a/b/c/d", &1));
        assert_eq!(idx.node_count(), 4); // a, b, +, x
        assert_eq!(sorted(&idx, "a/b"), vec![2]);
        assert!(idx.remove("a/+/x", &3));
        assert_eq!(idx.node_count(), 2);
        assert!(idx.remove("a/b", &2));
        assert_eq!(idx.node_count(), 0);
        assert!(idx.is_empty());
        // Root-level filters leave no nodes.
        idx.insert("#", 9);
        assert_eq!(idx.node_count(), 0);
        assert!(idx.remove("#", &9));
        idx.insert("a/#", 9);
        idx.insert("a", 8);
        assert!(idx.remove("a/#", &9));
        assert_eq!(idx.node_count(), 1);
        assert_eq!(sorted(&idx, "a"), vec![8]);
        assert!(idx.remove("a", &8));
        assert_eq!(idx.node_count(), 0);
    }

    #[test]
    fn many_filters_one_match() {
        let mut idx = FilterIndex::new();
        for i in 0..10_000u32 {
            idx.insert(&format!("s/{i}/#"), i);
        }
        assert_eq!(idx.len(), 10_000);
        assert_eq!(sorted(&idx, "s/4242/x/y"), vec![4242]);
        assert_eq!(sorted(&idx, "s/9999"), vec![9999]);
        assert!(sorted(&idx, "s/10000").is_empty());
        assert!(sorted(&idx, "t/1").is_empty());
        for i in 0..10_000u32 {
            assert!(idx.remove(&format!("s/{i}/#"), &i));
        }
        assert!(idx.is_empty());
        assert_eq!(idx.node_count(), 0);
    }

    #[test]
    fn very_deep_topic() {
        let mut idx = FilterIndex::new();
        idx.insert("#", 1);
        idx.insert("+/#", 2);
        let topic = "/".repeat(100_000);
        assert_eq!(sorted(&idx, &topic), vec![1, 2]);
        let filter = "+/".repeat(50_000) + "#";
        idx.insert(&filter, 3);
        assert_eq!(sorted(&idx, &topic), vec![1, 2, 3]);
        assert!(idx.remove(&filter, &3));
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn entries_clone_and_debug() {
        let mut idx = FilterIndex::new();
        for (i, f) in ["a/b", "#", "+", "/", "", "a//#", "+/+/#", "$x/+", "a/b"]
            .iter()
            .enumerate()
        {
            idx.insert(f, i);
        }
        let mut e = idx.entries();
        e.sort();
        let mut want: Vec<(String, usize)> =
            ["a/b", "#", "+", "/", "", "a//#", "+/+/#", "$x/+", "a/b"]
                .iter()
                .enumerate()
                .map(|(i, f)| (f.to_string(), i))
                .collect();
        want.sort();
        assert_eq!(e, want);
        let c = idx.clone();
        assert_eq!(c.len(), idx.len());
        for t in ["a/b", "a//x", "$x/y", "", "/", "q/r/s"] {
            assert_eq!(c.matching(t), idx.matching(t), "{t:?}");
        }
        let dbg = format!("{idx:?}");
        assert!(dbg.contains("a//#"), "{dbg}");
    }

    const LEVELS: &[&str] = &["", "a", "b", "$x", "+", "#"];
    const TOPIC_LEVELS: &[&str] = &["", "a", "b", "$x"];

    fn filter_strategy() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(LEVELS), 1..5)
            .prop_map(|v| v.join("/"))
            .prop_filter("valid filter", |f| valid_filter(f))
    }

    fn topic_strategy() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(TOPIC_LEVELS), 1..6).prop_map(|v| v.join("/"))
    }

    proptest! {
        #[test]
        fn agrees_with_matches(
            filters in prop::collection::vec(filter_strategy(), 0..30),
            topics in prop::collection::vec(topic_strategy(), 1..20),
            removals in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let mut idx = FilterIndex::new();
            let mut live: Vec<(String, usize)> = Vec::new();
            for (i, f) in filters.iter().enumerate() {
                idx.insert(f, i);
                live.push((f.clone(), i));
            }
            for r in &removals {
                if live.is_empty() {
                    break;
                }
                let (f, v) = live.remove(r.index(live.len()));
                prop_assert!(idx.remove(&f, &v));
                prop_assert!(!idx.remove(&f, &v));
            }
            prop_assert_eq!(idx.len(), live.len());
            let mut entries = idx.entries();
            entries.sort();
            let mut want_entries = live.clone();
            want_entries.sort();
            prop_assert_eq!(entries, want_entries);
            for t in &topics {
                let mut got = idx.matching(t);
                got.sort_unstable();
                let mut want: Vec<usize> = live
                    .iter()
                    .filter(|(f, _)| matches(f, t))
                    .map(|(_, v)| *v)
                    .collect();
                want.sort_unstable();
                prop_assert_eq!(got, want, "topic {:?}", t);
            }
            for (f, v) in &live {
                prop_assert!(idx.remove(f, v));
            }
            prop_assert!(idx.is_empty());
            prop_assert_eq!(idx.node_count(), 0);
        }
    }
}
