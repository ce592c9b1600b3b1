//! MQTT 5.0 sections 3.8 - 3.11, 4.7, 4.8: SUBSCRIBE options, subscription identifiers, topic
//! filters, `$` topics and retained messages.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, Publish, QoS, SubscriptionOptions};
use std::time::Duration;

fn opts(qos: QoS) -> SubscriptionOptions {
    sub_opts(qos)
}

async fn publish_retained(c: &mut RawClient, topic: &str, payload: &[u8], qos: QoS) {
    let pid = if qos == QoS::AtMostOnce {
        0
    } else {
        c.next_pid()
    };
    let mut p = publish(topic, qos, pid, payload);
    p.retain = true;
    c.publish_acked(p).await;
    if qos == QoS::AtMostOnce {
        // Make sure the QoS 0 publish was processed before going on.
        c.send(Packet::PingReq).await;
        assert_eq!(c.recv().await, Packet::PingResp);
    }
}

#[tokio::test]
async fn mqtt5_3_8_3_1_no_local() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("nl").await;
    let mut o = opts(QoS::AtLeastOnce);
    o.no_local = true;
    let ack = c.subscribe_with(&[("nl/t", o)], None).await;
    assert_eq!(ack.reason_codes, vec![1]);
    let mut other = srv.v5("other").await;
    other.subscribe("nl/t", QoS::AtLeastOnce).await;
    c.publish_qos1("nl/t", b"mine").await;
    // [MQTT-3.8.3-3] not forwarded to the publishing connection ...
    let got = other.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"mine");
    c.expect_nothing(QUIET_MS).await;
    // ... but messages of others are.
    other.publish_qos1("nl/t", b"theirs").await;
    let got = c.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"theirs");
}

#[tokio::test]
async fn mqtt5_3_8_3_1_without_no_local_own_messages_delivered() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("echo").await;
    c.subscribe("echo/t", QoS::AtMostOnce).await;
    c.publish_qos0("echo/t", b"me").await;
    let got = c.recv_publish().await;
    assert_eq!(&got.payload[..], b"me");
}

#[tokio::test]
async fn mqtt5_3_8_3_1_retain_as_published() {
    let srv = TestServer::default().await;
    let mut rap = srv.v5("rap").await;
    let mut plain = srv.v5("plain").await;
    let mut o = opts(QoS::AtMostOnce);
    o.retain_as_published = true;
    rap.subscribe_with(&[("rap/t", o)], None).await;
    plain.subscribe("rap/t", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    publish_retained(&mut publ, "rap/t", b"r", QoS::AtMostOnce).await;
    // [MQTT-3.3.1-13] RAP=1: RETAIN as published; [MQTT-3.3.1-12] RAP=0: RETAIN cleared.
    assert!(rap.recv_publish().await.retain);
    assert!(!plain.recv_publish().await.retain);
    publ.publish_qos0("rap/t", b"n").await;
    assert!(!rap.recv_publish().await.retain);
    assert!(!plain.recv_publish().await.retain);
}

#[tokio::test]
async fn mqtt5_3_8_3_1_retain_handling() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    publish_retained(&mut publ, "rh/t", b"kept", QoS::AtMostOnce).await;

    // 0: send retained at every subscribe.
    let mut c0 = srv.v5("rh0").await;
    for _ in 0..2 {
        c0.subscribe_with(&[("rh/t", opts(QoS::AtMostOnce))], None)
            .await;
        let got = c0.recv_publish().await;
        assert!(got.retain, "[MQTT-3.3.1-9] retained message has RETAIN=1");
        assert_eq!(&got.payload[..], b"kept");
    }
    c0.expect_nothing(QUIET_MS).await;

    // 1: only if the subscription did not exist [MQTT-3.3.1-10].
    let mut c1 = srv.v5("rh1").await;
    let mut o = opts(QoS::AtMostOnce);
    o.retain_handling = 1;
    c1.subscribe_with(&[("rh/t", o)], None).await;
    assert_eq!(&c1.recv_publish().await.payload[..], b"kept");
    c1.subscribe_with(&[("rh/t", o)], None).await;
    c1.expect_nothing(QUIET_MS).await;

    // 2: never [MQTT-3.3.1-11].
    let mut c2 = srv.v5("rh2").await;
    let mut o = opts(QoS::AtMostOnce);
    o.retain_handling = 2;
    c2.subscribe_with(&[("rh/t", o)], None).await;
    c2.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_8_2_1_2_subscription_identifier() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("sid").await;
    c.subscribe_with(&[("sid/a", opts(QoS::AtMostOnce))], Some(42))
        .await;
    c.subscribe("sid/b", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos0("sid/a", b"a").await;
    let got = c.recv_publish().await;
    assert_eq!(
        got.properties.subscription_identifiers,
        vec![42],
        "[MQTT-3.3.4-3]"
    );
    publ.publish_qos0("sid/b", b"b").await;
    let got = c.recv_publish().await;
    assert!(got.properties.subscription_identifiers.is_empty());
}

#[tokio::test]
async fn mqtt5_3_3_4_overlapping_subscriptions_one_message_all_ids() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("ov").await;
    c.subscribe_with(&[("ov/+", opts(QoS::AtLeastOnce))], Some(1))
        .await;
    c.subscribe_with(&[("ov/#", opts(QoS::AtMostOnce))], Some(2))
        .await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("ov/x", b"x").await;
    let got = c.recv_publish_ack().await;
    let mut ids = got.properties.subscription_identifiers.clone();
    ids.sort_unstable();
    // [MQTT-3.3.4-4] / [MQTT-3.3.4-5]: one PUBLISH carrying both identifiers, highest QoS.
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(got.qos, QoS::AtLeastOnce);
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_8_2_1_2_subscription_identifier_on_retained() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    publish_retained(&mut publ, "sidr/t", b"r", QoS::AtMostOnce).await;
    let mut c = srv.v5("sidr").await;
    c.subscribe_with(&[("sidr/#", opts(QoS::AtMostOnce))], Some(7))
        .await;
    let got = c.recv_publish().await;
    assert!(got.retain);
    assert_eq!(got.properties.subscription_identifiers, vec![7]);
}

#[tokio::test]
async fn mqtt5_3_9_3_invalid_filter_topic_filter_invalid() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("bad").await;
    let ack = c
        .subscribe_with(
            &[
                ("a/#/b", opts(QoS::AtMostOnce)),
                ("ok/+", opts(QoS::AtLeastOnce)),
                ("a+/b", opts(QoS::AtMostOnce)),
                ("$share/g", opts(QoS::AtMostOnce)),
            ],
            None,
        )
        .await;
    // [MQTT-3.9.3-1] one reason code per filter, in order.
    assert_eq!(
        ack.reason_codes,
        vec![
            rc::TOPIC_FILTER_INVALID,
            1,
            rc::TOPIC_FILTER_INVALID,
            rc::TOPIC_FILTER_INVALID
        ]
    );
    c.send(Packet::PingReq).await;
    assert_eq!(c.recv().await, Packet::PingResp, "connection stays open");
}

#[tokio::test]
async fn mqtt5_3_9_3_deny_subscribe_not_authorized() {
    let mut cfg = config();
    cfg.mqtt.deny_subscribe = vec!["secret/#".into()];
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("deny").await;
    let ack = c
        .subscribe_with(
            &[
                ("secret/#", opts(QoS::AtMostOnce)),
                ("public/#", opts(QoS::AtMostOnce)),
            ],
            None,
        )
        .await;
    assert_eq!(ack.reason_codes, vec![rc::NOT_AUTHORIZED, 0]);
    let mut publ = srv.v5("pub").await;
    publ.publish_qos0("secret/x", b"s").await;
    publ.publish_qos0("public/x", b"p").await;
    let got = c.recv_publish().await;
    assert_eq!(got.topic, "public/x");
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_10_4_unsubscribe() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("unsub").await;
    c.subscribe("us/t", QoS::AtMostOnce).await;
    let ack = c.unsubscribe("us/t").await;
    assert_eq!(ack.reason_codes, vec![rc::SUCCESS]);
    let ack = c.unsubscribe("us/t").await;
    assert_eq!(ack.reason_codes, vec![rc::NO_SUBSCRIPTION_EXISTED]);
    let mut publ = srv.v5("pub").await;
    publ.publish_qos0("us/t", b"x").await;
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_8_4_resubscribe_replaces_subscription() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("resub").await;
    c.subscribe_with(&[("rs/t", opts(QoS::AtMostOnce))], Some(3))
        .await;
    c.subscribe_with(&[("rs/t", opts(QoS::AtLeastOnce))], Some(4))
        .await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("rs/t", b"x").await;
    // [MQTT-3.8.4-3] the new subscription replaces the old one: one copy, new QoS and id.
    let got = c.recv_publish_ack().await;
    assert_eq!(got.qos, QoS::AtLeastOnce);
    assert_eq!(got.properties.subscription_identifiers, vec![4]);
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_7_2_1_wildcards_do_not_match_dollar_topics() {
    let mut cfg = config();
    cfg.server.sys_interval_s = 1;
    // The default ACL keeps clients off `$`-topics other than `$SYS` reads; open `$app/`.
    std::fs::create_dir_all(&cfg.server.data_dir).unwrap();
    let acl = cfg.server.data_dir.join("dollar.acl");
    std::fs::write(
        &acl,
        "default deny\nallow all publish,subscribe filter:$app/#\nallow all subscribe filter:$SYS/#\nallow all publish,subscribe filter:#\n",
    )
    .unwrap();
    cfg.server.acl_file = Some(acl);
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("dollar").await;
    c.subscribe("#", QoS::AtMostOnce).await;
    c.subscribe("+/broker/uptime", QoS::AtMostOnce).await;
    c.subscribe("+/x", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos0("$app/x", b"dollar").await;
    publ.publish_qos0("plain/x", b"plain").await;
    // Only plain/x (matched by "#" and "+/x": one message).
    let got = c.recv_publish().await;
    assert_eq!(got.topic, "plain/x");
    // $SYS updates arrive every second and must not reach these subscriptions.
    match c.try_recv(Duration::from_millis(1_300)).await {
        Err(RecvError::Timeout) => {}
        other => panic!("[MQTT-4.7.2-1] got {other:?}"),
    }
    let mut s = srv.v5("sys").await;
    s.subscribe("$app/+", QoS::AtMostOnce).await;
    publ.publish_qos0("$app/x", b"dollar").await;
    assert_eq!(s.recv_publish().await.topic, "$app/x");
}

#[tokio::test]
async fn mqtt5_3_3_1_3_retained_set_replace_clear() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    publish_retained(&mut publ, "ret/t", b"v1", QoS::AtLeastOnce).await;
    publish_retained(&mut publ, "ret/t", b"v2", QoS::AtLeastOnce).await;
    let mut a = srv.v5("a").await;
    a.subscribe("ret/#", QoS::AtLeastOnce).await;
    let got = a.recv_publish_ack().await;
    // [MQTT-3.3.1-5] the new retained message replaces the old one.
    assert_eq!((&got.payload[..], got.retain), (&b"v2"[..], true));
    assert_eq!(got.qos, QoS::AtLeastOnce);
    a.expect_nothing(QUIET_MS).await;
    // [MQTT-3.3.1-6] [MQTT-3.3.1-7] an empty retained payload clears it (and is forwarded
    // normally).
    publish_retained(&mut publ, "ret/t", b"", QoS::AtMostOnce).await;
    let got = a.recv_publish().await;
    assert!(got.payload.is_empty());
    let mut b = srv.v5("b").await;
    b.subscribe("ret/#", QoS::AtLeastOnce).await;
    b.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_3_1_3_retained_qos_is_min_of_published_and_granted() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    publish_retained(&mut publ, "rq/t", b"r", QoS::ExactlyOnce).await;
    let mut a = srv.v5("a").await;
    a.subscribe("rq/t", QoS::AtLeastOnce).await;
    let got: Publish = a.recv_publish_ack().await;
    assert_eq!(got.qos, QoS::AtLeastOnce);
    assert!(got.retain);
}

#[tokio::test]
async fn mqtt5_3_3_2_3_3_retained_message_expiry() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    let mut p = publish("rexp/short", QoS::AtMostOnce, 0, b"s");
    p.retain = true;
    p.properties.message_expiry_interval = Some(1);
    publ.send(Packet::Publish(p)).await;
    let mut p = publish("rexp/long", QoS::AtMostOnce, 0, b"l");
    p.retain = true;
    p.properties.message_expiry_interval = Some(30);
    publ.send(Packet::Publish(p)).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let mut a = srv.v5("a").await;
    a.subscribe("rexp/#", QoS::AtMostOnce).await;
    let got = a.recv_publish().await;
    assert_eq!(
        got.topic, "rexp/long",
        "[MQTT-3.3.2-5] expired retained message not sent"
    );
    let left = got.properties.message_expiry_interval.unwrap();
    assert!((28..=29).contains(&left), "remaining {left}");
    a.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_3_3_1_3_retained_publish_racing_a_subscribe_arrives_once() {
    use lanemq_protocol::{Subscribe, SubscribeFilter, SubscribeProperties};
    let srv = TestServer::default().await;
    let mut publ = srv.v5("race-pub").await;
    for i in 0..150u32 {
        let topic = format!("race/{i}");
        let mut sub = srv.v5(&format!("race-sub-{i}")).await;
        let mut p = publish(&topic, QoS::AtMostOnce, 0, b"r");
        p.retain = true;
        let s = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: topic.clone(),
                options: sub_opts(QoS::AtMostOnce),
            }],
            properties: SubscribeProperties::default(),
        });
        // The retained PUBLISH and the SUBSCRIBE reach the broker at the same moment: the
        // subscription gets the message once, as the retained copy or live, never both.
        tokio::join!(publ.send(Packet::Publish(p)), sub.send(s));
        // Until the SUBACK and a first copy came (a hibernating connection on a busy machine
        // may take a while), then a quiet spell in which a second copy would show.
        let (mut copies, mut subacks) = (0, 0);
        loop {
            let wait = if subacks == 1 && copies > 0 {
                100
            } else {
                3_000
            };
            match sub.try_recv(Duration::from_millis(wait)).await {
                Ok(Packet::Publish(_)) => copies += 1,
                Ok(Packet::SubAck(_)) => subacks += 1,
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => break,
            }
        }
        assert_eq!(subacks, 1, "round {i}");
        assert_eq!(
            copies, 1,
            "round {i}: the retained message arrived {copies} times"
        );
        sub.disconnect().await;
    }
}

/// Packets of one connection take effect in the order they were sent: retained QoS 0 and QoS 1
/// PUBLISHes written together with a SUBSCRIBE (Retain Handling 1) on the same topic are in
/// the retained table before the subscription exists, so the subscriber gets the newest one
/// once, as a retained message, and no live copy of any (mosquitto's
/// `02-subpub-qos0-send-retain.py` found the second and third live; the second publish waits
/// for the first one's fsync, and the SUBSCRIBE used to overtake it).
#[tokio::test]
async fn publishes_before_a_subscribe_on_one_connection_take_effect_first() {
    let srv = TestServer::default().await;
    for round in 0..8 {
        let topic = format!("order/{round}");
        let mut c = srv.v5(&format!("order-{round}")).await;
        let mut bytes = Vec::new();
        for (i, qos) in [
            QoS::AtMostOnce,
            QoS::AtMostOnce,
            QoS::AtLeastOnce,
            QoS::AtMostOnce,
        ]
        .into_iter()
        .enumerate()
        {
            let pid = if qos == QoS::AtMostOnce {
                0
            } else {
                c.next_pid()
            };
            let mut p = publish(&topic, qos, pid, format!("m{i}").as_bytes());
            p.retain = true;
            bytes.extend(bytes_of(&Packet::Publish(p), c.version));
        }
        let mut o = opts(QoS::AtLeastOnce);
        o.retain_handling = 1;
        let sub_pid = c.next_pid();
        bytes.extend(bytes_of(
            &Packet::Subscribe(lanemq_protocol::Subscribe {
                packet_id: sub_pid,
                filters: vec![lanemq_protocol::SubscribeFilter {
                    filter: topic.clone(),
                    options: o,
                }],
                properties: Default::default(),
            }),
            c.version,
        ));
        // One write: the broker reads them together.
        c.send_raw(&bytes).await;
        let mut got = Vec::new();
        let mut subacked = false;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(RECV_MS);
        while tokio::time::Instant::now() < deadline {
            match c.try_recv(Duration::from_millis(QUIET_MS)).await {
                Ok(Packet::SubAck(a)) => {
                    assert_eq!(a.packet_id, sub_pid);
                    subacked = true;
                }
                Ok(Packet::PubAck(_)) => {}
                Ok(Packet::Publish(p)) => {
                    if p.qos != QoS::AtMostOnce {
                        c.send(Packet::PubAck(lanemq_protocol::PubResp::new(
                            p.packet_id,
                            0,
                        )))
                        .await;
                    }
                    got.push((String::from_utf8_lossy(&p.payload).into_owned(), p.retain));
                }
                Ok(other) => panic!("round {round}: unexpected {other:?}"),
                Err(RecvError::Timeout) if subacked => break,
                Err(RecvError::Timeout) => {}
                Err(e) => panic!("round {round}: {e:?}"),
            }
        }
        assert!(subacked, "round {round}: no SUBACK");
        assert_eq!(
            got,
            vec![("m3".to_string(), true)],
            "round {round}: the newest retained message once, as retained, and nothing live"
        );
    }
}

/// A topic filter deeper than `mqtt.max_topic_levels` (256) is refused with 0x8F, shared or
/// not; one at the limit works end to end. Before the limit a filter of 65,535 levels (valid
/// MQTT) was accepted and removing it overflowed the broker's stack.
#[tokio::test]
async fn a_filter_deeper_than_max_topic_levels_is_refused_and_one_at_it_works() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("deep").await;
    let at_limit = vec!["d"; 256].join("/");
    let over = vec!["d"; 257].join("/");
    let huge = "/".repeat(65_534); // 65,535 empty levels: one valid filter of 64 KiB
    let shared = format!("$share/g/{over}");
    let ack = c
        .subscribe_with(
            &[
                (over.as_str(), opts(QoS::AtLeastOnce)),
                (huge.as_str(), opts(QoS::AtLeastOnce)),
                (shared.as_str(), opts(QoS::AtLeastOnce)),
                (at_limit.as_str(), opts(QoS::AtLeastOnce)),
            ],
            None,
        )
        .await;
    assert_eq!(
        ack.reason_codes,
        vec![
            rc::TOPIC_FILTER_INVALID,
            rc::TOPIC_FILTER_INVALID,
            rc::TOPIC_FILTER_INVALID,
            1
        ]
    );
    let mut p = srv.v5("deep-pub").await;
    let pid = p.next_pid();
    p.publish_acked(publish(&at_limit, QoS::AtLeastOnce, pid, b"deep"))
        .await;
    match c.recv().await {
        Packet::Publish(m) => {
            assert_eq!(m.topic, at_limit);
            assert_eq!(&m.payload[..], b"deep");
            c.send(Packet::PubAck(lanemq_protocol::PubResp::new(
                m.packet_id,
                0,
            )))
            .await;
        }
        other => panic!("expected the PUBLISH, got {other:?}"),
    }
    c.unsubscribe(&huge).await;
    c.unsubscribe(&at_limit).await;
    c.disconnect().await;
    // The broker still serves.
    let mut again = srv.v5("deep-again").await;
    again.subscribe("x/y", QoS::AtMostOnce).await;
}
