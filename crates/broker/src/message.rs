//! An accepted application message, shared by every delivery of it.

use bytes::Bytes;
use lanemq_protocol::{PublishProperties, QoS};
use std::sync::Arc;
use std::time::Instant;

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
    /// Position in the shared log ([`NOT_STORED`] for `$SYS` and replayed copies not in it).
    pub offset: u64,
    /// The publisher's user name (stored for stream key expressions; never forwarded).
    pub username: Option<Arc<str>>,
    /// Stored in a lane (its groups consume it later: a publisher is not told 0x10).
    pub in_lane: bool,
    /// Cluster mode: handed to the cluster's log; every node (this one too) delivers it
    /// when it reads it back (`crate::cluster`), so the publisher's side does not route it.
    pub forwarded: bool,
}

/// `Message::offset` of a message that is not in the log.
pub const NOT_STORED: u64 = u64::MAX;

impl Message {
    pub fn new(
        topic: Arc<str>,
        payload: Bytes,
        qos: QoS,
        retain: bool,
        properties: PublishProperties,
        publisher: Arc<str>,
    ) -> Message {
        Message::received_at(now_us(), topic, payload, qos, retain, properties, publisher)
    }

    /// [`Message::new`] received at `timestamp_us` (the messages of one read share one
    /// clock reading).
    pub fn received_at(
        timestamp_us: u64,
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
            timestamp_us,
            offset: NOT_STORED,
            username: None,
            in_lane: false,
            forwarded: false,
        }
    }

    /// The message of a log record.
    pub fn from_record(r: &lanemq_store::Record) -> Message {
        let properties = from_store_properties(&r.properties);
        // The expiry runs from the arrival time, not from the restart.
        let expires_at = properties.message_expiry_interval.map(|s| {
            let age_us = now_us().saturating_sub(r.timestamp_us);
            let total_us = u64::from(s) * 1_000_000;
            Instant::now() + std::time::Duration::from_micros(total_us.saturating_sub(age_us))
        });
        Message {
            topic: r.topic.as_str().into(),
            payload: r.payload.clone(),
            qos: QoS::from_u8(r.qos).unwrap_or(QoS::AtMostOnce),
            retain: r.retain,
            properties,
            expires_at,
            publisher: r.client_id.as_str().into(),
            timestamp_us: r.timestamp_us,
            offset: r.offset,
            username: r.properties.username.as_deref().map(Arc::from),
            in_lane: false,
            forwarded: false,
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

pub use lanemq_store::now_us;

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
    /// Position in the session's persisted queue (0: not persisted).
    pub seq: u64,
    /// Set for a message of a stream subscription (never persisted in the queue: the
    /// subscription's acknowledged position is).
    pub stream: Option<crate::stream_sub::StreamTag>,
    /// Set for a message of a lane group (never persisted in the queue: the group offset is).
    pub lane: Option<LaneTag>,
}

/// The shared subscription a delivery came through.
#[derive(Debug, PartialEq, Eq)]
pub struct SharedOrigin {
    pub group: Arc<str>,
    /// The inner filter (without `$share/<group>/`).
    pub filter: Arc<str>,
}

/// A lane delivery's link back to its group, lane, offset and batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneTag {
    pub group: u64,
    pub lane: u64,
    pub offset: u64,
    pub epoch: u64,
    /// Sent with DUP=1: taken back from a member that did not acknowledge it in time.
    pub dup: bool,
}

/// The log record's properties of a PUBLISH's.
pub fn to_store_properties(p: &PublishProperties) -> lanemq_store::Properties {
    lanemq_store::Properties {
        payload_format_indicator: p.payload_format_indicator,
        message_expiry_interval: p.message_expiry_interval,
        content_type: p.content_type.clone(),
        response_topic: p.response_topic.clone(),
        correlation_data: p.correlation_data.clone(),
        user_properties: p.user_properties.clone(),
        username: None,
    }
}

/// A PUBLISH's properties from a log record's.
pub fn from_store_properties(p: &lanemq_store::Properties) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: p.payload_format_indicator,
        message_expiry_interval: p.message_expiry_interval,
        content_type: p.content_type.clone(),
        response_topic: p.response_topic.clone(),
        correlation_data: p.correlation_data.clone(),
        user_properties: p.user_properties.clone(),
        ..Default::default()
    }
}
