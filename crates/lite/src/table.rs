//! The lane table: every live lane by id, and the key index `(parent, key) -> lane id`.
//!
//! Memory is what this module is about: a lane must be cheap enough to give one to every agent
//! session. The key is stored once, in the lane. The key index is a hash table of lane ids per
//! parent that hashes and compares keys through the lane table, so it costs one `u64` and a
//! control byte per lane instead of a second copy of the key in an ordered map (the ordered
//! map cost ~60 B per lane at 1 M lanes, and sorting it was a sixth of a restart). Listing
//! lanes in key order (REST pagination) selects the page from the parent's lanes on demand.
//!
//! Invariants:
//! - every id in a parent's key index names a lane of `lanes` with that parent, and no two
//!   ids in one parent's index have the same key;
//! - every lane is in its parent's key index exactly once, except between
//!   [`LaneTable::insert_unindexed`] and [`LaneTable::index_keys`] while a restart loads the
//!   journal (the journal can name a lane that a later record removes);
//! - a lane's parent and key never change while it is in the table (callers change `next`,
//!   `last_pub_us` and `last_entry` only).

use hashbrown::HashTable;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

/// A lane in the table.
#[derive(Debug)]
pub struct Lane {
    pub parent: u32,
    pub key: Box<str>,
    pub next: u64,
    pub last_pub_us: u64,
    /// Index of the newest indexed entry ([`crate::entries::NONE`] before the first).
    pub last_entry: u64,
}

/// Lanes by id, and by `(parent, key)`.
#[derive(Default)]
pub struct LaneTable {
    lanes: HashMap<u64, Lane>,
    keys: HashMap<u32, HashTable<u64>>,
    hasher: RandomState,
}

fn key_hash(hasher: &RandomState, key: &str) -> u64 {
    hasher.hash_one(key)
}

/// The hash of a lane id's key (for the key index's rehashing): 0 for an id that is not in
/// the table, which the invariants rule out.
fn id_hash<'a>(
    hasher: &'a RandomState,
    lanes: &'a HashMap<u64, Lane>,
) -> impl Fn(&u64) -> u64 + 'a {
    move |id| lanes.get(id).map_or(0, |l| key_hash(hasher, &l.key))
}

impl LaneTable {
    /// Number of lanes.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Make room for `n` more lanes in the id map (a restart knows the count up front).
    pub fn reserve(&mut self, n: usize) {
        self.lanes.reserve(n);
    }

    pub fn get(&self, id: u64) -> Option<&Lane> {
        self.lanes.get(&id)
    }

    /// The lane to update its offsets and times (never its parent or key).
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Lane> {
        self.lanes.get_mut(&id)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.lanes.contains_key(&id)
    }

    /// Every lane, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Lane)> {
        self.lanes.iter().map(|(id, l)| (*id, l))
    }

    /// Highest lane id in the table.
    pub fn max_id(&self) -> Option<u64> {
        self.lanes.keys().max().copied()
    }

    /// The lane id of `key` in `parent`.
    pub fn find(&self, parent: u32, key: &str) -> Option<u64> {
        let index = self.keys.get(&parent)?;
        let h = key_hash(&self.hasher, key);
        index
            .find(h, |id| self.lanes.get(id).is_some_and(|l| &*l.key == key))
            .copied()
    }

    /// Number of lanes of `parent`.
    pub fn count_of(&self, parent: u32) -> usize {
        self.keys.get(&parent).map_or(0, |m| m.len())
    }

    /// The lane ids of `parent`, in no order.
    pub fn ids_of(&self, parent: u32) -> impl Iterator<Item = u64> + '_ {
        self.keys
            .get(&parent)
            .into_iter()
            .flat_map(|m| m.iter().copied())
    }

    /// Add a lane under a new id. A lane with the same parent and key must not exist
    /// (callers look it up with [`Self::find`] first); if it does, the old one is replaced
    /// in the key index and stays reachable by id only.
    pub fn insert(&mut self, id: u64, lane: Lane) {
        let parent = lane.parent;
        let h = key_hash(&self.hasher, &lane.key);
        if let Some(old) = self.lanes.insert(id, lane) {
            self.unindex(id, &old);
        }
        let Self {
            lanes,
            keys,
            hasher,
        } = self;
        let index = keys.entry(parent).or_default();
        let key = lanes.get(&id).map(|l| &*l.key).unwrap_or_default();
        match index.find_entry(h, |x| {
            *x != id && lanes.get(x).is_some_and(|l| &*l.key == key)
        }) {
            Ok(mut e) => *e.get_mut() = id,
            Err(_) => {
                index.insert_unique(h, id, id_hash(hasher, lanes));
            }
        }
    }

    /// Add a lane to the id map only (a restart loading the journal, whose later records can
    /// remove it again); [`Self::index_keys`] builds the key index afterwards.
    pub fn insert_unindexed(&mut self, id: u64, lane: Lane) {
        self.lanes.insert(id, lane);
    }

    /// Remove a lane from the id map only (the journal loader's counterpart of
    /// [`Self::insert_unindexed`]).
    pub fn remove_unindexed(&mut self, id: u64) {
        self.lanes.remove(&id);
    }

    /// Build the key index of every lane whose parent is in `parents`; lanes of any other
    /// parent are removed and their ids returned. If two lanes share a parent and key (a
    /// damaged journal), the higher id wins the key and the other is returned as well.
    pub fn index_keys(&mut self, parents: &HashSet<u32>) -> Vec<u64> {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        let mut orphans = Vec::new();
        for (id, l) in &self.lanes {
            if parents.contains(&l.parent) {
                *counts.entry(l.parent).or_default() += 1;
            } else {
                orphans.push(*id);
            }
        }
        for id in &orphans {
            self.lanes.remove(id);
        }
        let Self {
            lanes,
            keys,
            hasher,
        } = self;
        keys.clear();
        for (p, n) in counts {
            keys.insert(p, HashTable::with_capacity(n));
        }
        let mut dups = Vec::new();
        for (id, l) in lanes.iter() {
            let Some(index) = keys.get_mut(&l.parent) else {
                continue;
            };
            let h = key_hash(hasher, &l.key);
            match index.find_entry(h, |x| lanes.get(x).is_some_and(|o| o.key == l.key)) {
                Ok(mut e) => {
                    let other = *e.get();
                    if other < *id {
                        *e.get_mut() = *id;
                        dups.push(other);
                    } else {
                        dups.push(*id);
                    }
                }
                Err(_) => {
                    index.insert_unique(h, *id, id_hash(hasher, lanes));
                }
            }
        }
        for id in &dups {
            lanes.remove(id);
        }
        orphans.extend(dups);
        orphans
    }

    fn unindex(&mut self, id: u64, lane: &Lane) {
        let h = key_hash(&self.hasher, &lane.key);
        if let Some(index) = self.keys.get_mut(&lane.parent) {
            if let Ok(e) = index.find_entry(h, |x| *x == id) {
                e.remove();
            }
            if index.is_empty() {
                self.keys.remove(&lane.parent);
            }
        }
    }

    /// Remove a lane; returns it.
    pub fn remove(&mut self, id: u64) -> Option<Lane> {
        let lane = self.lanes.remove(&id)?;
        self.unindex(id, &lane);
        Some(lane)
    }

    /// Remove every lane of `parent`; returns their ids.
    pub fn remove_parent(&mut self, parent: u32) -> Vec<u64> {
        let ids: Vec<u64> = self
            .keys
            .remove(&parent)
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        for id in &ids {
            self.lanes.remove(id);
        }
        ids
    }

    /// Remove every lane (a rebuild from the log).
    pub fn clear(&mut self) {
        self.lanes.clear();
        self.keys.clear();
    }

    /// Up to `limit` lane ids of `parent` whose keys come strictly after `after`, in key
    /// order. Costs one pass over the lane map (a bounded heap of `limit` keys).
    pub fn page(&self, parent: u32, after: Option<&str>, limit: usize) -> Vec<u64> {
        if limit == 0 {
            return Vec::new();
        }
        let mut heap: BinaryHeap<(&str, u64)> = BinaryHeap::with_capacity(limit + 1);
        // One sequential pass over the lane map (no lookup per id).
        for (&id, l) in &self.lanes {
            if l.parent != parent {
                continue;
            }
            let key = &*l.key;
            if after.is_some_and(|a| key <= a) {
                continue;
            }
            if heap.len() < limit {
                heap.push((key, id));
            } else if heap.peek().is_some_and(|top| key < top.0) {
                heap.pop();
                heap.push((key, id));
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::entries::NONE;

    fn lane(parent: u32, key: &str) -> Lane {
        Lane {
            parent,
            key: key.into(),
            next: 0,
            last_pub_us: 0,
            last_entry: NONE,
        }
    }

    #[test]
    fn find_insert_remove_and_page_in_key_order() {
        let mut t = LaneTable::default();
        for i in 0..1000u64 {
            t.insert(i, lane((i % 2) as u32, &format!("k{:04}", 999 - i)));
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.count_of(0), 500);
        assert_eq!(t.find(1, "k0998"), Some(1));
        assert_eq!(t.find(0, "k0998"), None);
        assert_eq!(t.find(0, "k0999"), Some(0));
        let page = t.page(0, Some("k0100"), 3);
        let keys: Vec<&str> = page.iter().map(|id| &*t.get(*id).unwrap().key).collect();
        assert_eq!(keys, ["k0101", "k0103", "k0105"]);
        let all = t.page(1, None, 10_000);
        assert_eq!(all.len(), 500);
        assert!(all
            .windows(2)
            .all(|w| t.get(w[0]).unwrap().key < t.get(w[1]).unwrap().key));
        let removed = t.remove(1).unwrap();
        assert_eq!(&*removed.key, "k0998");
        assert_eq!(t.find(1, "k0998"), None);
        assert_eq!(t.count_of(1), 499);
        let ids = t.remove_parent(1);
        assert_eq!(ids.len(), 499);
        assert_eq!(t.len(), 500);
        assert_eq!(t.ids_of(1).count(), 0);
    }

    #[test]
    fn index_keys_drops_orphans_and_duplicates() {
        let mut t = LaneTable::default();
        t.insert_unindexed(1, lane(7, "a"));
        t.insert_unindexed(2, lane(7, "b"));
        t.insert_unindexed(3, lane(8, "c"));
        t.insert_unindexed(4, lane(7, "a"));
        t.remove_unindexed(2);
        let parents: HashSet<u32> = [7].into_iter().collect();
        let mut gone = t.index_keys(&parents);
        gone.sort_unstable();
        assert_eq!(gone, [1, 3]);
        assert_eq!(t.find(7, "a"), Some(4));
        assert_eq!(t.find(7, "b"), None);
        assert_eq!(t.len(), 1);
        // Growing far past the reserved size rehashes through the lane table.
        for i in 10..5000u64 {
            t.insert(i, lane(7, &format!("x{i}")));
        }
        for i in 10..5000u64 {
            assert_eq!(t.find(7, &format!("x{i}")), Some(i));
        }
    }
}
