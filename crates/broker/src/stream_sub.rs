//! A session's stream subscription as state: [`StreamSub`] (position, outstanding
//! positions, the feeder's owner), its stored form [`StoredStreamSub`] and a delivery's link
//! back to it, [`StreamTag`]. The feeder that moves it lives in [`crate::streams`].
//!
//! Invariants: positions are log offsets; the acknowledged position is the highest offset
//! below which everything delivered was acknowledged (`acked_of`); `outstanding` holds the
//! positions pushed and not yet acknowledged. Low level: imports only [`crate::sub_codec`].

use lanemq_protocol::SubscriptionOptions;
use lanemq_streams::engine::{Engine, StreamHandle};
use lanemq_streams::subscribe::StartFrom;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::warn;

/// The acknowledged position is stored at most this often while messages flow.
const SAVE_INTERVAL: Duration = Duration::from_millis(200);

/// One stream subscription of a session.
#[derive(Debug)]
pub struct StreamSub {
    /// The filter as subscribed (`$stream/...` or `$s/...`).
    pub filter: String,
    /// The stream's name (`/<filter>` for the legacy `$s/` form).
    pub name: String,
    /// Options with the granted QoS.
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
    /// Where a subscription without a stored position starts.
    pub start: StartFrom,
    pub(crate) state: Mutex<SubState>,
    /// Signalled when acknowledgements make room, and when the subscription ends.
    pub space: Notify,
    pub(crate) ended: AtomicBool,
    /// Generation of the connection whose feeder may push (older feeders stop).
    pub(crate) owner: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct SubState {
    /// Stream the position belongs to (a stream deleted and created again starts afresh).
    pub(crate) stream_id: Option<u64>,
    /// Next position to read; `None` until resolved against the stream.
    pub(crate) next: Option<u64>,
    /// Positions pushed and not yet acknowledged.
    pub(crate) outstanding: BTreeSet<u64>,
    /// Highest position pushed.
    pub(crate) pushed: Option<u64>,
    /// Position last stored.
    pub(crate) saved: Option<u64>,
    pub(crate) saved_at: Option<Instant>,
}

/// What a persisted stream subscription holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredStreamSub {
    pub name: String,
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
    pub start: StartFrom,
    pub stream_id: Option<u64>,
    /// Acknowledged position: resume after it.
    pub position: Option<u64>,
}

impl StoredStreamSub {
    /// `v1 | qos u8, flags u8 | sub_id u32 (0 = none) | start tag u8 | start u64 | stream id u64 (0 =
    /// none) | has position u8 | position u64 | name`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32 + self.name.len());
        v.push(1);
        let o = crate::sub_codec::encode_sub(&self.options, None);
        v.extend_from_slice(&o[..2]);
        v.extend_from_slice(&self.sub_id.unwrap_or(0).to_be_bytes());
        let (tag, val) = match self.start {
            StartFrom::Earliest => (0u8, 0u64),
            StartFrom::Latest => (1, 0),
            StartFrom::TimestampUs(t) => (2, t),
            StartFrom::After(o) => (3, o),
        };
        v.push(tag);
        v.extend_from_slice(&val.to_be_bytes());
        v.extend_from_slice(&self.stream_id.unwrap_or(0).to_be_bytes());
        v.push(u8::from(self.position.is_some()));
        v.extend_from_slice(&self.position.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    pub fn decode(v: &[u8]) -> Option<StoredStreamSub> {
        if *v.first()? != 1 {
            return None;
        }
        let be32 = |r: std::ops::Range<usize>| -> Option<u32> {
            Some(u32::from_be_bytes(v.get(r)?.try_into().ok()?))
        };
        let be64 = |r: std::ops::Range<usize>| -> Option<u64> {
            Some(u64::from_be_bytes(v.get(r)?.try_into().ok()?))
        };
        let mut opts = [0u8; 6];
        opts[..2].copy_from_slice(v.get(1..3)?);
        let (options, _) = crate::sub_codec::decode_sub(&opts);
        let sub_id = be32(3..7).filter(|&i| i != 0);
        let val = be64(8..16)?;
        let start = match *v.get(7)? {
            0 => StartFrom::Earliest,
            1 => StartFrom::Latest,
            2 => StartFrom::TimestampUs(val),
            3 => StartFrom::After(val),
            _ => return None,
        };
        let stream_id = be64(16..24).filter(|&i| i != 0);
        let has_pos = *v.get(24)? != 0;
        let position = be64(25..33).filter(|_| has_pos);
        let name = std::str::from_utf8(v.get(33..)?).ok()?.to_string();
        Some(StoredStreamSub {
            name,
            options,
            sub_id,
            start,
            stream_id,
            position,
        })
    }
}

impl StreamSub {
    pub fn new(
        filter: String,
        name: String,
        options: SubscriptionOptions,
        sub_id: Option<u32>,
        start: StartFrom,
    ) -> Arc<StreamSub> {
        Arc::new(StreamSub {
            filter,
            name,
            options,
            sub_id,
            start,
            state: Mutex::new(SubState::default()),
            space: Notify::new(),
            ended: AtomicBool::new(false),
            owner: AtomicU64::new(0),
        })
    }

    /// A subscription restored from the index.
    pub fn restored(filter: String, s: StoredStreamSub) -> Arc<StreamSub> {
        let sub = StreamSub::new(filter, s.name, s.options, s.sub_id, s.start);
        {
            let mut st = sub.lock();
            st.stream_id = s.stream_id;
            st.next = s.position.map(|p| p.saturating_add(1));
            st.saved = s.position;
        }
        sub
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, SubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolve the start position now (at SUBSCRIBE: `latest` means "from now on").
    pub fn bind_now(&self, engine: &Engine, h: &StreamHandle) {
        let pos = engine.start_position(h, self.start).unwrap_or_else(|e| {
            warn!(stream = %h.name, error = %e, "cannot resolve the stream offset; from the start");
            0
        });
        let mut st = self.lock();
        st.stream_id = Some(h.id);
        st.next = Some(pos);
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.space.notify_waiters();
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// A pushed message is finished (acknowledged, or discarded as if delivered).
    pub fn ack(&self, offset: u64) {
        let mut st = self.lock();
        if st.outstanding.remove(&offset) {
            drop(st);
            self.space.notify_waiters();
        }
    }

    /// The acknowledged position: everything delivered up to it was acknowledged.
    pub fn acked_position(&self) -> Option<u64> {
        let st = self.lock();
        Self::acked_of(&st)
    }

    fn acked_of(st: &SubState) -> Option<u64> {
        match st.outstanding.first() {
            Some(&o) => o.checked_sub(1).or(st.saved),
            // Everything before the read position was delivered and acknowledged, or skipped.
            None => match st.next {
                Some(n) => n.checked_sub(1).or(st.saved),
                None => st.pushed.or(st.saved),
            },
        }
    }

    pub fn stored(&self) -> StoredStreamSub {
        let st = self.lock();
        StoredStreamSub {
            name: self.name.clone(),
            options: self.options,
            sub_id: self.sub_id,
            start: self.start,
            stream_id: st.stream_id,
            position: Self::acked_of(&st),
        }
    }

    /// The value to store if the acknowledged position moved (and `force` or the save
    /// interval passed).
    pub(crate) fn save_due(&self, force: bool) -> Option<Vec<u8>> {
        let (pos, due) = {
            let st = self.lock();
            let pos = Self::acked_of(&st);
            let idle = st.outstanding.is_empty();
            let due = pos != st.saved
                && (force || idle || st.saved_at.is_none_or(|t| t.elapsed() >= SAVE_INTERVAL));
            (pos, due)
        };
        if !due {
            return None;
        }
        let v = self.stored().encode();
        let mut st = self.lock();
        st.saved = pos;
        st.saved_at = Some(Instant::now());
        Some(v)
    }
}

/// A delivery's link back to its stream subscription.
#[derive(Debug, Clone)]
pub struct StreamTag {
    pub sub: Arc<StreamSub>,
    pub offset: u64,
}

impl StreamTag {
    pub fn done(&self) {
        self.sub.ack(self.offset);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lanemq_protocol::QoS;

    #[test]
    fn stored_stream_sub_round_trips() {
        let options = SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..Default::default()
        };
        for (start, position, sub_id) in [
            (StartFrom::Earliest, None, None),
            (StartFrom::Latest, Some(0), Some(7)),
            (
                StartFrom::TimestampUs(1_700_000_000_000_000),
                Some(42),
                None,
            ),
            (StartFrom::After(9), Some(u64::MAX - 1), Some(268_435_455)),
        ] {
            let s = StoredStreamSub {
                name: "events.v1".into(),
                options,
                sub_id,
                start,
                stream_id: Some(3),
                position,
            };
            assert_eq!(StoredStreamSub::decode(&s.encode()), Some(s));
        }
        assert_eq!(StoredStreamSub::decode(&[]), None);
        assert_eq!(StoredStreamSub::decode(&[2, 0, 0]), None);
    }

    #[test]
    fn acked_position_is_below_the_oldest_outstanding_message() {
        let sub = StreamSub::new(
            "$stream/s".into(),
            "s".into(),
            SubscriptionOptions::default(),
            None,
            StartFrom::Earliest,
        );
        assert_eq!(sub.acked_position(), None);
        {
            let mut st = sub.lock();
            for o in [10, 11, 15] {
                st.outstanding.insert(o);
            }
            st.pushed = Some(15);
            st.next = Some(16);
        }
        assert_eq!(sub.acked_position(), Some(9));
        sub.ack(11);
        assert_eq!(sub.acked_position(), Some(9));
        sub.ack(10);
        assert_eq!(sub.acked_position(), Some(14));
        sub.ack(15);
        assert_eq!(sub.acked_position(), Some(15));
    }
}
