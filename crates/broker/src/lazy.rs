//! A map, a set and a deque that cost one pointer and no allocation while empty.
//!
//! Every connection and every session carries several maps and sets that most of them never
//! fill (topic aliases, stream feeders, stream subscriptions, packet identifiers in use, …).
//! A `std` `HashMap` is 48 bytes even when empty; these are 8 and allocate their table on the
//! first insert, and give it back when they become empty again. The methods are those of
//! `HashMap` / `HashSet` that the broker uses, with the same meaning.

use std::borrow::Borrow;
use std::collections::{hash_map, hash_set, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;

/// A `HashMap` allocated on first insert (see the module doc).
#[allow(clippy::box_collection)] // boxed on purpose: 8 bytes while empty
pub struct LazyMap<K, V>(Option<Box<HashMap<K, V>>>);

impl<K, V> Default for LazyMap<K, V> {
    fn default() -> Self {
        LazyMap(None)
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for LazyMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K, V> LazyMap<K, V> {
    pub fn new() -> Self {
        LazyMap(None)
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> LazyMapIter<'_, K, V> {
        self.into_iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Every entry, leaving the map empty (and its table freed).
    pub fn drain(&mut self) -> impl Iterator<Item = (K, V)> {
        self.0.take().into_iter().flat_map(|m| m.into_iter())
    }

    /// Every entry, leaving the map empty (and its table freed).
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

impl<K: Hash + Eq, V> LazyMap<K, V> {
    pub fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref()?.get(k)
    }

    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.get_mut(k)
    }

    pub fn contains_key<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        self.0.get_or_insert_with(Default::default).insert(k, v)
    }

    /// Remove an entry; the table is freed with the last one.
    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let m = self.0.as_mut()?;
        let v = m.remove(k);
        if m.is_empty() {
            self.0 = None;
        }
        v
    }
}

/// Iterator over a [`LazyMap`]'s entries.
pub type LazyMapIter<'a, K, V> =
    std::iter::Flatten<std::option::IntoIter<hash_map::Iter<'a, K, V>>>;

impl<'a, K, V> IntoIterator for &'a LazyMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = LazyMapIter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.as_ref().map(|m| m.iter()).into_iter().flatten()
    }
}

/// A `HashSet` allocated on first insert (see the module doc).
#[allow(clippy::box_collection)] // boxed on purpose: 8 bytes while empty
pub struct LazySet<T>(Option<Box<HashSet<T>>>);

impl<T> Default for LazySet<T> {
    fn default() -> Self {
        LazySet(None)
    }
}

impl<T: fmt::Debug> fmt::Debug for LazySet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<T> LazySet<T> {
    pub fn new() -> Self {
        LazySet(None)
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity of the table (0 while none is allocated).
    pub fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.capacity())
    }

    /// Remove everything and free the table.
    pub fn clear(&mut self) {
        self.0 = None;
    }

    pub fn iter(&self) -> std::iter::Flatten<std::option::IntoIter<hash_set::Iter<'_, T>>> {
        self.0.as_ref().map(|s| s.iter()).into_iter().flatten()
    }
}

impl<T: Hash + Eq> LazySet<T> {
    pub fn contains<Q>(&self, v: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref().is_some_and(|s| s.contains(v))
    }

    pub fn insert(&mut self, v: T) -> bool {
        self.0.get_or_insert_with(Default::default).insert(v)
    }

    /// Remove a value; the table is freed with the last one.
    pub fn remove<Q>(&mut self, v: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(s) = self.0.as_mut() else {
            return false;
        };
        let removed = s.remove(v);
        if s.is_empty() {
            self.0 = None;
        }
        removed
    }

    pub fn shrink_to_fit(&mut self) {
        match &mut self.0 {
            Some(s) if s.is_empty() => self.0 = None,
            Some(s) => s.shrink_to_fit(),
            None => {}
        }
    }
}

/// A `VecDeque` allocated on first push (see the module doc). Unlike the map and the set it
/// keeps its allocation when emptied (it may be refilled at once); [`LazyDeque::clear`]
/// frees it.
#[allow(clippy::box_collection)] // boxed on purpose: 8 bytes while empty
pub struct LazyDeque<T>(Option<Box<VecDeque<T>>>);

impl<T> Default for LazyDeque<T> {
    fn default() -> Self {
        LazyDeque(None)
    }
}

impl<T: fmt::Debug> fmt::Debug for LazyDeque<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().flat_map(|d| d.iter()))
            .finish()
    }
}

impl<T> LazyDeque<T> {
    pub fn new() -> Self {
        LazyDeque(None)
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push_back(&mut self, v: T) {
        self.0.get_or_insert_with(Default::default).push_back(v);
    }

    pub fn front(&self) -> Option<&T> {
        self.0.as_ref()?.front()
    }

    pub fn pop_front(&mut self) -> Option<T> {
        self.0.as_mut()?.pop_front()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.0.iter().flat_map(|d| d.iter())
    }

    /// Remove everything and free the allocation.
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_allocates_on_insert_and_frees_when_empty() {
        let mut m: LazyMap<String, u32> = LazyMap::new();
        assert!(m.is_empty() && m.0.is_none() && m.get("a").is_none());
        assert_eq!(m.insert("a".into(), 1), None);
        assert_eq!(m.insert("b".into(), 2), None);
        assert_eq!(m.insert("a".into(), 3), Some(1));
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("a"), Some(&3));
        if let Some(v) = m.get_mut("b") {
            *v = 4;
        }
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(m.values().sum::<u32>(), 7);
        assert_eq!((&m).into_iter().count(), 2);
        assert_eq!(m.remove("a"), Some(3));
        assert!(m.contains_key("b") && !m.contains_key("a"));
        assert_eq!(m.remove("b"), Some(4));
        assert!(m.0.is_none());
        m.insert("c".into(), 5);
        assert_eq!(m.drain().collect::<Vec<_>>(), [("c".to_string(), 5)]);
        assert!(m.0.is_none());
        assert_eq!(std::mem::size_of::<LazyMap<String, u32>>(), 8);
    }

    #[test]
    fn set_allocates_on_insert_and_frees_when_empty() {
        let mut s: LazySet<u16> = LazySet::new();
        assert!(!s.contains(&1) && !s.remove(&1) && s.capacity() == 0);
        assert!(s.insert(1) && !s.insert(1) && s.insert(2));
        assert_eq!(s.len(), 2);
        assert!(s.contains(&2));
        assert!(s.remove(&1) && s.remove(&2));
        assert!(s.0.is_none());
        s.insert(3);
        s.clear();
        assert!(s.0.is_none() && s.is_empty());
        s.insert(4);
        s.remove(&4);
        s.shrink_to_fit();
        assert!(s.0.is_none());
        assert_eq!(s.iter().count(), 0);
    }

    #[test]
    fn deque_allocates_on_push_and_frees_on_clear() {
        let mut d: LazyDeque<(u64, u64)> = LazyDeque::new();
        assert!(d.is_empty() && d.front().is_none() && d.pop_front().is_none());
        d.push_back((1, 2));
        d.push_back((3, 4));
        assert_eq!(d.len(), 2);
        assert_eq!(d.front(), Some(&(1, 2)));
        assert_eq!(d.pop_front(), Some((1, 2)));
        assert_eq!(d.pop_front(), Some((3, 4)));
        assert!(d.is_empty() && d.0.is_some());
        d.clear();
        assert!(d.0.is_none());
    }
}
