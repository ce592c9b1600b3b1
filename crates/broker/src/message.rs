//! An accepted application message, shared by every delivery of it.

use bytes::Bytes;
use lanemq_protocol::{PublishProperties, QoS};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub struct Message {
    pub topic: Arc<str>,
    pub payload: Bytes,
    /// QoS as published.
    pub qos: QoS,
    /// RETAIN flag as published.
    pub retain: bool,
    /// Properties to forward (topic alias and subscription identifiers removed).
    pub properties: PublishProperties,
    /// When the Message Expiry Interval runs out.
    pub expires_at: Option<Instant>,
    /// Client id of the publisher (for No Local).
    pub publisher: Arc<str>,
    /// Arrival time, Unix microseconds.
    pub timestamp_us: u64,
}

impl Message {
    pub fn new(
        topic: Arc<str>,
        payload: Bytes,
        qos: QoS,
        retain: bool,
        mut properties: PublishProperties,
        publisher: Arc<str>,
    ) -> Message {
        properties.topic_alias = None;
        properties.subscription_identifiers.clear();
        let expires_at = properties
            .message_expiry_interval
            .map(|s| Instant::now() + std::time::Duration::from_secs(u64::from(s)));
        Message {
            topic,
            payload,
            qos,
            retain,
            properties,
            expires_at,
            publisher,
            timestamp_us: now_us(),
        }
    }

    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Remaining Message Expiry Interval to forward, in whole seconds (rounded up, at least 1
    /// while not expired). `None` when the message has no expiry.
    pub fn remaining_expiry_s(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|t| {
            let left = t.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
        })
    }

    /// Bytes this message accounts for in queue budgets.
    pub fn cost(&self) -> usize {
        self.payload.len() + self.topic.len() + 64
    }
}

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One message on its way to one session.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub msg: Arc<Message>,
    /// QoS of this delivery: min(published, granted).
    pub qos: QoS,
    /// RETAIN flag to send.
    pub retain: bool,
    /// Subscription identifiers of the matching subscriptions.
    pub sub_ids: Vec<u32>,
    /// `group` and inner filter when delivered through a shared subscription (for redelivery
    /// to another member if this session ends).
    pub share: Option<Arc<SharedOrigin>>,
}

/// The shared subscription a delivery came through.
#[derive(Debug, PartialEq, Eq)]
pub struct SharedOrigin {
    pub group: Arc<str>,
    /// The inner filter (without `$share/<group>/`).
    pub filter: Arc<str>,
}
