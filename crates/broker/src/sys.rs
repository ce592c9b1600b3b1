//! `$SYS/broker/...` statistics, published as retained messages every `sys_interval_s`.

use crate::broker::Broker;
use crate::message::Message;
use bytes::Bytes;
use lanemq_protocol::{PublishProperties, QoS};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub fn spawn(broker: Arc<Broker>) {
    let secs = broker.config.server.sys_interval_s;
    if secs == 0 {
        return;
    }
    let weak: Weak<Broker> = Arc::downgrade(&broker);
    drop(broker);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(secs));
        loop {
            tick.tick().await;
            let Some(b) = weak.upgrade() else { return };
            if b.is_shutting_down() {
                return;
            }
            publish_all(&b);
        }
    });
}

/// Publish the current statistics once.
pub fn publish_all(b: &Broker) {
    let s = &b.stats;
    let items: [(&str, String); 10] = [
        (
            "$SYS/broker/version",
            format!("lanemq {}", env!("CARGO_PKG_VERSION")),
        ),
        (
            "$SYS/broker/uptime",
            format!("{} seconds", b.started.elapsed().as_secs()),
        ),
        (
            "$SYS/broker/clients/connected",
            s.clients_connected.load(Ordering::Relaxed).to_string(),
        ),
        ("$SYS/broker/sessions/count", b.session_count().to_string()),
        (
            "$SYS/broker/subscriptions/count",
            b.router
                .read()
                .map(|r| r.subscription_count())
                .unwrap_or(0)
                .to_string(),
        ),
        (
            "$SYS/broker/messages/received",
            s.messages_received.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/messages/sent",
            s.messages_sent.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/messages/dropped",
            s.messages_dropped.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/bytes/received",
            s.bytes_received.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/bytes/sent",
            s.bytes_sent.load(Ordering::Relaxed).to_string(),
        ),
    ];
    for (topic, value) in items {
        let msg = Message::new(
            topic.into(),
            Bytes::from(value),
            QoS::AtMostOnce,
            true,
            PublishProperties::default(),
            "$SYS".into(),
        );
        // $SYS updates are not client traffic: keep them out of the received counter.
        b.deliver(Arc::new(msg));
    }
}
