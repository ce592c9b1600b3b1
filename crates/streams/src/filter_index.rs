//! Which stream filters match a topic (placeholder: the helper implementing this module
//! replaces it).

/// Maps MQTT topic filters to values; `matches(topic)` finds every value whose filter
/// matches, in time independent of the number of filters that do not.
#[derive(Debug, Clone)]
pub struct FilterIndex<T> {
    entries: Vec<(String, T)>,
}

impl<T> Default for FilterIndex<T> {
    fn default() -> Self {
        FilterIndex {
            entries: Vec::new(),
        }
    }
}

impl<T: Clone + PartialEq> FilterIndex<T> {
    pub fn new() -> Self {
        Self::default()
    }
    /// Add a value under a filter (the same value may be under several filters).
    pub fn insert(&mut self, filter: &str, value: T) {
        self.entries.push((filter.to_string(), value));
    }
    /// Remove one value from under a filter; true if it was there.
    pub fn remove(&mut self, filter: &str, value: &T) -> bool {
        let before = self.entries.len();
        self.entries.retain(|(f, v)| !(f == filter && v == value));
        before != self.entries.len()
    }
    /// Call `f` for each value whose filter matches `topic`.
    pub fn for_each_match(&self, topic: &str, mut f: impl FnMut(&T)) {
        for (flt, v) in &self.entries {
            if lanemq_protocol::topic::matches(flt, topic) {
                f(v);
            }
        }
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
