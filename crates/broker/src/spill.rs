//! A session's spilled deliveries — QoS 1/2 messages kept as log positions until the client
//! takes them — stored densely: 12 bytes a delivery, plus one run record per stretch of
//! consecutive queue sequence numbers.
//!
//! A session that is away can collect many of these (every publish to a topic it subscribed
//! adds one), so their size is what a million queued messages cost in memory.
//!
//! Invariants:
//! - entries leave in the order they came (front first);
//! - `runs` describes the sequence numbers of `entries` exactly: run `(first, n)` covers the
//!   next `n` entries, with seqs `first, first + 1, …` (or all 0 when `first` is 0: entries
//!   of a session that is not persisted);
//! - `extras` holds, by push number, the parts a few deliveries have (subscription ids,
//!   shared origin, carried message); the meta word of such an entry has [`HAS_EXTRA`].

use crate::message::{Delivery, Message, SharedOrigin};
use lanemq_protocol::QoS;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

const COST_MASK: u32 = (1 << 28) - 1;
const QOS_SHIFT: u32 = 28;
const RETAIN: u32 = 1 << 30;
const HAS_EXTRA: u32 = 1 << 31;

/// A queued QoS 1/2 delivery kept as a log position (its message is read back when sent).
#[derive(Debug, Clone)]
pub struct Spilled {
    pub offset: u64,
    /// Position in the session's persisted queue (0: not persisted).
    pub seq: u64,
    /// Subscription identifiers, shared origin, carried message: `None` when all are empty.
    pub extra: Option<Box<SpilledExtra>>,
    /// [`Message::cost`] of its message (0 when not known: restored).
    pub cost: u32,
    pub qos: QoS,
    pub retain: bool,
}

/// The parts of a [`Spilled`] delivery most deliveries do not have.
#[derive(Debug, Clone, Default)]
pub struct SpilledExtra {
    pub sub_ids: Box<[u32]>,
    pub share: Option<Arc<SharedOrigin>>,
    /// The message itself, kept once log retention carried it (its record may be gone).
    pub carried: Option<Arc<Message>>,
}

impl Spilled {
    /// A spilled entry for `d`; one whose record is below the carry `floor` keeps its message.
    pub fn of(d: &Delivery, floor: u64) -> Spilled {
        let carried = (d.msg.offset < floor).then(|| d.msg.clone());
        let extra = (!d.sub_ids.is_empty() || d.share.is_some() || carried.is_some()).then(|| {
            Box::new(SpilledExtra {
                sub_ids: d.sub_ids.clone().into_boxed_slice(),
                share: d.share.clone(),
                carried,
            })
        });
        Spilled {
            offset: d.msg.offset,
            seq: d.seq,
            extra,
            cost: u32::try_from(d.msg.cost()).unwrap_or(u32::MAX),
            qos: d.qos,
            retain: d.retain,
        }
    }

    /// A restored entry (nothing but its position and flags).
    pub fn restored(offset: u64, seq: u64, qos: QoS, retain: bool) -> Spilled {
        Spilled {
            offset,
            seq,
            extra: None,
            cost: 0,
            qos,
            retain,
        }
    }

    pub fn share(&self) -> Option<&Arc<SharedOrigin>> {
        self.extra.as_ref().and_then(|e| e.share.as_ref())
    }

    pub fn carried(&self) -> Option<&Arc<Message>> {
        self.extra.as_ref().and_then(|e| e.carried.as_ref())
    }

    /// The delivery again, with its message as read from the log.
    pub fn into_delivery(self, msg: Arc<Message>) -> Delivery {
        let (sub_ids, share) = match self.extra {
            Some(e) => (e.sub_ids.into_vec(), e.share),
            None => (Vec::new(), None),
        };
        Delivery {
            msg,
            qos: self.qos,
            retain: self.retain,
            sub_ids,
            share,
            seq: self.seq,
            stream: None,
            lane: None,
        }
    }
}

/// The dense queue of spilled deliveries (see the module doc). One pointer and no allocation
/// while empty (most sessions never spill; every session has one).
#[derive(Debug, Default)]
pub struct SpillQueue(Option<Box<Dense>>);

impl SpillQueue {
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push_back(&mut self, sp: Spilled) {
        self.0.get_or_insert_with(Default::default).push_back(sp);
    }

    /// Offset and seq of the front entry.
    pub fn front_key(&self) -> Option<(u64, u64)> {
        self.0.as_ref()?.front_key()
    }

    /// The front entry; the queue's memory goes with its last entry.
    pub fn pop_front(&mut self) -> Option<Spilled> {
        let d = self.0.as_mut()?;
        let sp = d.pop_front();
        if d.is_empty() {
            self.0 = None;
        }
        sp
    }

    /// The entries front first, as values (extras cloned).
    pub fn iter(&self) -> impl Iterator<Item = Spilled> + '_ {
        self.0.iter().flat_map(|d| d.iter())
    }

    /// Offset and seq of every entry, front first (no extras).
    pub fn keys(&self) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.0.iter().flat_map(|d| d.keys())
    }

    /// Give entries of a session that is not persisted (seq 0) their message, where `f`
    /// has one for the offset; returns how many.
    pub fn carry_unpersisted(&mut self, f: impl Fn(u64) -> Option<Arc<Message>>) -> u64 {
        self.0.as_mut().map_or(0, |d| d.carry_unpersisted(f))
    }

    /// Give back spare capacity (a session that drained a burst and went idle).
    pub fn shrink(&mut self) {
        match &mut self.0 {
            Some(d) if d.is_empty() => self.0 = None,
            Some(d) => d.shrink(),
            None => {}
        }
    }

    /// Remove and return every entry.
    pub fn take_all(&mut self) -> Vec<Spilled> {
        self.0.take().map_or_else(Vec::new, |mut d| d.take_all())
    }
}

/// The entries of a [`SpillQueue`] that has some.
#[derive(Debug, Default)]
struct Dense {
    /// offset (two u32, high first) and the meta word (cost, QoS, retain, has-extra).
    entries: VecDeque<[u32; 3]>,
    /// (first seq, count) per stretch of consecutive seqs.
    runs: VecDeque<(u64, u32)>,
    /// Extras by push number.
    extras: HashMap<u64, Box<SpilledExtra>>,
    /// Push number of the front entry.
    popped: u64,
}

impl Dense {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn push_back(&mut self, sp: Spilled) {
        let n = self.popped + self.entries.len() as u64;
        let mut meta = sp.cost.min(COST_MASK) | (u32::from(sp.qos.as_u8() & 3) << QOS_SHIFT);
        if sp.retain {
            meta |= RETAIN;
        }
        if let Some(e) = sp.extra {
            meta |= HAS_EXTRA;
            self.extras.insert(n, e);
        }
        self.entries
            .push_back([(sp.offset >> 32) as u32, sp.offset as u32, meta]);
        match self.runs.back_mut() {
            Some((first, count))
                if *count < u32::MAX
                    && ((*first == 0 && sp.seq == 0)
                        || (*first != 0 && sp.seq == *first + u64::from(*count))) =>
            {
                *count += 1;
            }
            _ => self.runs.push_back((sp.seq, 1)),
        }
    }

    fn decode(&self, i: usize, e: &[u32; 3], seq: u64, extra: bool) -> Spilled {
        let n = self.popped + i as u64;
        Spilled {
            offset: (u64::from(e[0]) << 32) | u64::from(e[1]),
            seq,
            extra: if extra && e[2] & HAS_EXTRA != 0 {
                self.extras.get(&n).cloned()
            } else {
                None
            },
            cost: e[2] & COST_MASK,
            qos: QoS::from_u8(((e[2] >> QOS_SHIFT) & 3) as u8).unwrap_or(QoS::AtLeastOnce),
            retain: e[2] & RETAIN != 0,
        }
    }

    /// Offset and seq of the front entry.
    fn front_key(&self) -> Option<(u64, u64)> {
        let e = self.entries.front()?;
        let seq = self.runs.front().map_or(0, |r| r.0);
        Some(((u64::from(e[0]) << 32) | u64::from(e[1]), seq))
    }

    fn pop_front(&mut self) -> Option<Spilled> {
        let e = self.entries.pop_front()?;
        let seq = match self.runs.front_mut() {
            Some(r) => {
                let seq = r.0;
                if r.0 != 0 {
                    r.0 += 1;
                }
                r.1 -= 1;
                if r.1 == 0 {
                    self.runs.pop_front();
                }
                seq
            }
            None => 0,
        };
        let n = self.popped;
        self.popped += 1;
        let extra = if e[2] & HAS_EXTRA != 0 {
            self.extras.remove(&n)
        } else {
            None
        };
        let mut sp = self.decode(0, &e, seq, false);
        sp.extra = extra;
        Some(sp)
    }

    /// The seq of every entry, front first (from the runs).
    fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs.iter().flat_map(|&(first, n)| {
            (0..u64::from(n)).map(move |k| if first == 0 { 0 } else { first + k })
        })
    }

    /// The entries front first, as values (extras cloned).
    fn iter(&self) -> impl Iterator<Item = Spilled> + '_ {
        self.entries
            .iter()
            .zip(self.seqs())
            .enumerate()
            .map(|(i, (e, seq))| self.decode(i, e, seq, true))
    }

    /// Offset and seq of every entry, front first (no extras).
    fn keys(&self) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.entries
            .iter()
            .zip(self.seqs())
            .enumerate()
            .map(|(i, (e, seq))| {
                let carried = e[2] & HAS_EXTRA != 0
                    && self
                        .extras
                        .get(&(self.popped + i as u64))
                        .is_some_and(|x| x.carried.is_some());
                ((u64::from(e[0]) << 32) | u64::from(e[1]), seq, carried)
            })
    }

    /// Give entries of a session that is not persisted (seq 0) their message, where `f`
    /// has one for the offset; returns how many.
    fn carry_unpersisted(&mut self, f: impl Fn(u64) -> Option<Arc<Message>>) -> u64 {
        let mut done = 0;
        let zero_runs: Vec<(usize, usize)> = {
            let mut at = 0usize;
            let mut v = Vec::new();
            for &(first, n) in &self.runs {
                if first == 0 {
                    v.push((at, at + n as usize));
                }
                at += n as usize;
            }
            v
        };
        for (from, to) in zero_runs {
            for i in from..to {
                let Some(e) = self.entries.get_mut(i) else {
                    break;
                };
                let offset = (u64::from(e[0]) << 32) | u64::from(e[1]);
                let n = self.popped + i as u64;
                if self.extras.get(&n).is_some_and(|x| x.carried.is_some()) {
                    continue;
                }
                if let Some(m) = f(offset) {
                    e[2] |= HAS_EXTRA;
                    self.extras.entry(n).or_default().carried = Some(m);
                    done += 1;
                }
            }
        }
        done
    }

    /// Give back spare capacity (a session that drained a burst and went idle).
    fn shrink(&mut self) {
        shrink_deque(&mut self.entries);
        shrink_deque(&mut self.runs);
        if self.extras.capacity() > 2 * self.extras.len() + 8 {
            self.extras.shrink_to_fit();
        }
    }

    /// Remove and return every entry.
    fn take_all(&mut self) -> Vec<Spilled> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(sp) = self.pop_front() {
            out.push(sp);
        }
        self.entries = VecDeque::new();
        self.runs = VecDeque::new();
        out
    }
}

/// Shrink a deque whose capacity is far above its length (keeps a little room).
pub fn shrink_deque<T>(d: &mut VecDeque<T>) {
    if d.capacity() > 2 * d.len() + 16 {
        d.shrink_to(d.len() + 8);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sp(offset: u64, seq: u64, extra: bool) -> Spilled {
        Spilled {
            offset,
            seq,
            extra: extra.then(|| {
                Box::new(SpilledExtra {
                    sub_ids: vec![7, 9].into_boxed_slice(),
                    ..Default::default()
                })
            }),
            cost: 100 + offset as u32,
            qos: if seq.is_multiple_of(2) {
                QoS::AtLeastOnce
            } else {
                QoS::ExactlyOnce
            },
            retain: offset.is_multiple_of(3),
        }
    }

    fn same(a: &Spilled, b: &Spilled) -> bool {
        a.offset == b.offset
            && a.seq == b.seq
            && a.cost == b.cost
            && a.qos == b.qos
            && a.retain == b.retain
            && a.extra.as_ref().map(|e| e.sub_ids.clone())
                == b.extra.as_ref().map(|e| e.sub_ids.clone())
    }

    #[test]
    fn entries_come_back_as_pushed_in_order() {
        let mut q = SpillQueue::default();
        // Consecutive seqs, a gap, unpersisted entries, then seqs again.
        let input: Vec<Spilled> = (1..=5)
            .map(|s| sp(1000 + s, s, s == 3))
            .chain((9..=10).map(|s| sp(1 << 40 | s, s, false)))
            .chain((0..3).map(|k| sp(50 + k, 0, k == 1)))
            .chain((11..=12).map(|s| sp(2000 + s, s, false)))
            .collect();
        for s in &input {
            q.push_back(s.clone());
        }
        assert_eq!(q.len(), input.len());
        let listed: Vec<Spilled> = q.iter().collect();
        assert!(listed.iter().zip(&input).all(|(a, b)| same(a, b)));
        assert_eq!(q.front_key(), Some((1001, 1)));
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(q.pop_front().unwrap());
        }
        q.push_back(sp(3000, 13, true));
        out.extend(q.take_all());
        let want: Vec<Spilled> = input.iter().cloned().chain([sp(3000, 13, true)]).collect();
        assert_eq!(out.len(), want.len());
        assert!(out.iter().zip(&want).all(|(a, b)| same(a, b)));
        assert!(q.is_empty() && q.0.is_none());
    }

    #[test]
    fn entry_is_twelve_bytes() {
        assert_eq!(std::mem::size_of::<[u32; 3]>(), 12);
    }
}
