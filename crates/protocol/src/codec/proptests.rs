//! Property tests: round trip of arbitrary valid packets for every version, exact
//! `encoded_len`, incomplete prefixes, and no panic on arbitrary or mutated input.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::packets::*;
use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;
const V31: ProtocolVersion = ProtocolVersion::V31;

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 /_.:\u{e9}\u{20ac}\u{1F600}+#$-]{0,10}"
}
fn topic() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 /_.\u{e9}\u{20ac}$-]{1,12}"
}
fn blob() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}
fn users() -> impl Strategy<Value = UserProperties> {
    vec((text(), text()), 0..3)
}
fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}
fn pid() -> impl Strategy<Value = u16> {
    1..=u16::MAX
}
fn code(codes: &'static [u8]) -> impl Strategy<Value = u8> {
    proptest::sample::select(codes)
}
fn bit() -> impl Strategy<Value = u8> {
    0..=1u8
}

fn will() -> impl Strategy<Value = Will> {
    (
        topic(),
        blob(),
        qos(),
        any::<bool>(),
        (
            of(any::<u32>()),
            of(bit()),
            of(any::<u32>()),
            of(text()),
            of(topic()),
            of(blob()),
            users(),
        ),
    )
        .prop_map(|(topic, payload, qos, retain, p)| Will {
            topic,
            payload,
            qos,
            retain,
            properties: WillProperties {
                will_delay_interval: p.0,
                payload_format_indicator: p.1,
                message_expiry_interval: p.2,
                content_type: p.3,
                response_topic: p.4,
                correlation_data: p.5,
                user_properties: p.6,
            },
        })
}

fn connect() -> impl Strategy<Value = Packet> {
    let props = (
        of(any::<u32>()),
        of(1..=u16::MAX),
        of(1..=u32::MAX),
        of(any::<u16>()),
        of(any::<bool>()),
        of(any::<bool>()),
        users(),
        of(text()),
        of(blob()),
    )
        .prop_map(|p| ConnectProperties {
            session_expiry_interval: p.0,
            receive_maximum: p.1,
            maximum_packet_size: p.2,
            topic_alias_maximum: p.3,
            request_response_information: p.4,
            request_problem_information: p.5,
            user_properties: p.6,
            authentication_data: if p.7.is_some() { p.8 } else { None },
            authentication_method: p.7,
        });
    (
        any::<bool>(),
        any::<u16>(),
        text(),
        of(will()),
        of(text()),
        of(blob()),
        props,
    )
        .prop_map(
            |(clean_start, keep_alive, client_id, will, username, password, properties)| {
                Packet::Connect(Box::new(Connect {
                    protocol: V5,
                    clean_start,
                    keep_alive,
                    client_id,
                    will,
                    username,
                    password,
                    properties,
                }))
            },
        )
}

fn connack() -> impl Strategy<Value = Packet> {
    let a = (
        of(any::<u32>()),
        of(1..=u16::MAX),
        of(bit()),
        of(any::<bool>()),
        of(1..=u32::MAX),
        of(text()),
        of(any::<u16>()),
        of(text()),
        users(),
    );
    let b = (
        of(any::<bool>()),
        of(any::<bool>()),
        of(any::<bool>()),
        of(any::<u16>()),
        of(text()),
        of(text()),
        of(text()),
        of(blob()),
    );
    (any::<bool>(), code(props::codes::CONNACK), a, b).prop_map(|(sp, reason_code, a, b)| {
        Packet::ConnAck(ConnAck {
            session_present: sp && reason_code == 0,
            reason_code,
            properties: ConnAckProperties {
                session_expiry_interval: a.0,
                receive_maximum: a.1,
                maximum_qos: a.2,
                retain_available: a.3,
                maximum_packet_size: a.4,
                assigned_client_identifier: a.5,
                topic_alias_maximum: a.6,
                reason_string: a.7,
                user_properties: a.8,
                wildcard_subscription_available: b.0,
                subscription_identifiers_available: b.1,
                shared_subscription_available: b.2,
                server_keep_alive: b.3,
                response_information: b.4,
                server_reference: b.5,
                authentication_method: b.6,
                authentication_data: b.7,
            },
        })
    })
}

fn publish() -> impl Strategy<Value = Packet> {
    let props = (
        of(bit()),
        of(any::<u32>()),
        of(1..=u16::MAX),
        of(topic()),
        of(blob()),
        users(),
        vec(1..=268_435_455u32, 0..3),
        of(text()),
    );
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![9 => topic(), 1 => Just(String::new())],
        pid(),
        props,
        vec(any::<u8>(), 0..300),
    )
        .prop_map(|(qos, dup, retain, topic, packet_id, p, payload)| {
            Packet::Publish(Publish {
                dup: dup && qos != QoS::AtMostOnce,
                qos,
                retain,
                topic,
                packet_id: if qos == QoS::AtMostOnce { 0 } else { packet_id },
                properties: PublishProperties {
                    payload_format_indicator: p.0,
                    message_expiry_interval: p.1,
                    topic_alias: p.2,
                    response_topic: p.3,
                    correlation_data: p.4,
                    user_properties: p.5,
                    subscription_identifiers: p.6,
                    content_type: p.7,
                },
                payload: Bytes::from(payload),
            })
        })
}

fn ack_props() -> impl Strategy<Value = AckProperties> {
    prop_oneof![
        Just(AckProperties::default()),
        (of(text()), users()).prop_map(|(reason_string, user_properties)| AckProperties {
            reason_string,
            user_properties
        }),
    ]
}

fn pub_resp(codes: &'static [u8]) -> impl Strategy<Value = PubResp> {
    (pid(), prop_oneof![Just(0u8), code(codes)], ack_props()).prop_map(
        |(packet_id, reason_code, properties)| PubResp {
            packet_id,
            reason_code,
            properties,
        },
    )
}

fn subscribe() -> impl Strategy<Value = Packet> {
    let opts = (qos(), any::<bool>(), any::<bool>(), 0..=2u8).prop_map(|(qos, nl, rap, rh)| {
        SubscriptionOptions {
            qos,
            no_local: nl,
            retain_as_published: rap,
            retain_handling: rh,
        }
    });
    let filter = (text(), opts).prop_map(|(filter, options)| SubscribeFilter { filter, options });
    (pid(), vec(filter, 1..4), of(1..=268_435_455u32), users()).prop_map(
        |(packet_id, filters, subscription_identifier, user_properties)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                filters,
                properties: SubscribeProperties {
                    subscription_identifier,
                    user_properties,
                },
            })
        },
    )
}

fn suback() -> impl Strategy<Value = Packet> {
    (pid(), vec(code(props::codes::SUBACK), 1..5), ack_props()).prop_map(
        |(packet_id, reason_codes, properties)| {
            Packet::SubAck(SubAck {
                packet_id,
                reason_codes,
                properties,
            })
        },
    )
}

fn unsubscribe() -> impl Strategy<Value = Packet> {
    (pid(), vec(text(), 1..4), users()).prop_map(|(packet_id, filters, user_properties)| {
        Packet::Unsubscribe(Unsubscribe {
            packet_id,
            filters,
            user_properties,
        })
    })
}

fn unsuback() -> impl Strategy<Value = Packet> {
    (pid(), vec(code(props::codes::UNSUBACK), 1..5), ack_props()).prop_map(
        |(packet_id, reason_codes, properties)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                reason_codes,
                properties,
            })
        },
    )
}

fn disconnect() -> impl Strategy<Value = Packet> {
    let props = prop_oneof![
        Just(DisconnectProperties::default()),
        (of(any::<u32>()), of(text()), users(), of(text())).prop_map(|p| DisconnectProperties {
            session_expiry_interval: p.0,
            reason_string: p.1,
            user_properties: p.2,
            server_reference: p.3,
        }),
    ];
    (
        prop_oneof![Just(0u8), code(props::codes::DISCONNECT)],
        props,
    )
        .prop_map(|(reason_code, properties)| {
            Packet::Disconnect(Disconnect {
                reason_code,
                properties,
            })
        })
}

fn auth() -> impl Strategy<Value = Packet> {
    let props = prop_oneof![
        Just(AuthProperties::default()),
        (of(text()), of(blob()), of(text()), users()).prop_map(|p| AuthProperties {
            authentication_method: p.0,
            authentication_data: p.1,
            reason_string: p.2,
            user_properties: p.3,
        }),
    ];
    (code(props::codes::AUTH), props).prop_map(|(reason_code, properties)| {
        Packet::Auth(Auth {
            reason_code,
            properties,
        })
    })
}

/// Any valid MQTT 5 packet.
fn packet_v5() -> impl Strategy<Value = Packet> {
    prop_oneof![
        connect(),
        connack(),
        publish(),
        pub_resp(props::codes::PUBACK).prop_map(Packet::PubAck),
        pub_resp(props::codes::PUBACK).prop_map(Packet::PubRec),
        pub_resp(props::codes::PUBREL).prop_map(Packet::PubRel),
        pub_resp(props::codes::PUBREL).prop_map(Packet::PubComp),
        subscribe(),
        suback(),
        unsubscribe(),
        unsuback(),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect(),
        auth(),
    ]
}

/// What an MQTT 3.1.1 (or 3.1) peer sees of `p`: the v5-only fields dropped, exactly as the
/// encoder drops them. `None` if 3.1.1 cannot carry the packet.
fn to_v311(p: &Packet, protocol: ProtocolVersion) -> Option<Packet> {
    Some(match p.clone() {
        Packet::Connect(mut c) => {
            c.protocol = protocol;
            c.properties = ConnectProperties::default();
            if let Some(w) = &mut c.will {
                w.properties = WillProperties::default();
            }
            if c.username.is_none() {
                c.password = None;
            }
            Packet::Connect(c)
        }
        Packet::ConnAck(c) => {
            let code = read_connack_v311(crate::reason::connack_v311(c.reason_code));
            Packet::ConnAck(ConnAck {
                session_present: c.session_present,
                reason_code: code,
                properties: Default::default(),
            })
        }
        Packet::Publish(mut p) => {
            if p.topic.is_empty() {
                return None;
            }
            p.properties = PublishProperties::default();
            Packet::Publish(p)
        }
        Packet::PubAck(r) => Packet::PubAck(PubResp::new(r.packet_id, 0)),
        Packet::PubRec(r) => Packet::PubRec(PubResp::new(r.packet_id, 0)),
        Packet::PubRel(r) => Packet::PubRel(PubResp::new(r.packet_id, 0)),
        Packet::PubComp(r) => Packet::PubComp(PubResp::new(r.packet_id, 0)),
        Packet::Subscribe(mut s) => {
            s.properties = SubscribeProperties::default();
            for f in &mut s.filters {
                f.options = SubscriptionOptions {
                    qos: f.options.qos,
                    ..Default::default()
                };
            }
            Packet::Subscribe(s)
        }
        Packet::SubAck(a) => Packet::SubAck(SubAck {
            packet_id: a.packet_id,
            reason_codes: a
                .reason_codes
                .iter()
                .map(|&c| if c <= 2 { c } else { 0x80 })
                .collect(),
            properties: AckProperties::default(),
        }),
        Packet::Unsubscribe(u) => Packet::Unsubscribe(Unsubscribe {
            user_properties: Vec::new(),
            ..u
        }),
        Packet::UnsubAck(a) => Packet::UnsubAck(UnsubAck {
            packet_id: a.packet_id,
            ..Default::default()
        }),
        Packet::PingReq => Packet::PingReq,
        Packet::PingResp => Packet::PingResp,
        Packet::Disconnect(_) => Packet::Disconnect(Disconnect::new(0)),
        Packet::Auth(_) => return None,
    })
}

fn read_connack_v311(code: u8) -> u8 {
    let mut b = BytesMut::from(&[0x20, 0x02, 0x00, code][..]);
    match decode(&mut b, V311, 0).unwrap().unwrap() {
        Packet::ConnAck(c) => c.reason_code,
        other => panic!("not a CONNACK: {other:?}"),
    }
}

fn round_trip(p: &Packet, v: ProtocolVersion) -> Result<(), TestCaseError> {
    let mut out = BytesMut::new();
    out.extend_from_slice(b"xy");
    encode(p, v, &mut out);
    let _ = out.split_to(2);
    prop_assert_eq!(out.len(), encoded_len(p, v));
    let bytes = out.clone();
    // Every proper prefix is incomplete and left untouched.
    for cut in 0..bytes.len() {
        let mut prefix = BytesMut::from(&bytes[..cut]);
        prop_assert_eq!(decode(&mut prefix, v, 0), Ok(None));
        prop_assert_eq!(&prefix[..], &bytes[..cut]);
    }
    // A following packet stays in the buffer.
    out.extend_from_slice(&[0xC0, 0x00]);
    let decoded = decode(&mut out, v, bytes.len() as u32);
    prop_assert_eq!(decoded, Ok(Some(p.clone())));
    prop_assert_eq!(&out[..], &[0xC0, 0x00][..]);
    if bytes.len() > 2 {
        let mut again = bytes.clone();
        let too_large = decode(&mut again, v, bytes.len() as u32 - 1);
        let is_too_large = matches!(too_large, Err(DecodeError::PacketTooLarge { .. }));
        prop_assert!(is_too_large);
    }
    Ok(())
}

fn decode_all(data: &[u8], v: ProtocolVersion, max: u32) {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(p)) = decode(&mut buf, v, max) {
        let mut out = BytesMut::new();
        encode(&p, v, &mut out);
        assert_eq!(out.len(), encoded_len(&p, v));
        let again = decode(&mut out, v, 0);
        // CONNECT is re-encoded per its own protocol; compare with that.
        assert_eq!(again, Ok(Some(p)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_v5(p in packet_v5()) {
        round_trip(&p, V5)?;
    }

    #[test]
    fn round_trip_v311(p in packet_v5(), old in any::<bool>()) {
        let proto = if old { V31 } else { V311 };
        let Some(q) = to_v311(&p, proto) else { return Ok(()) };
        round_trip(&q, V311)?;
        // MQTT 3.1 has no Session Present flag: its CONNACK carries 0 there.
        let q31 = match &q {
            Packet::ConnAck(c) => Packet::ConnAck(ConnAck { session_present: false, ..c.clone() }),
            other => other.clone(),
        };
        round_trip(&q31, V31)?;
        // The encoder drops the v5-only fields itself: same bytes as the stripped packet.
        if !matches!(p, Packet::Connect(_)) {
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            encode(&p, V311, &mut a);
            encode(&q, V311, &mut b);
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn publish_out_writes_the_bytes_of_the_publish(p in publish(), base_alias in any::<Option<u16>>(), base_expiry in any::<Option<u32>>()) {
        let Packet::Publish(p) = p else { unreachable!() };
        // The stored message's own alias, expiry and ids are replaced, never sent.
        let mut base = p.properties.clone();
        base.topic_alias = base_alias;
        base.message_expiry_interval = base_expiry;
        base.subscription_identifiers = vec![7];
        let out = PublishOut {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: &p.topic,
            packet_id: p.packet_id,
            properties: &base,
            message_expiry_interval: p.properties.message_expiry_interval,
            topic_alias: p.properties.topic_alias,
            subscription_identifiers: &p.properties.subscription_identifiers,
            payload: &p.payload,
        };
        for v in [V5, V311] {
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            out.encode(v, &mut a);
            encode(&Packet::Publish(p.clone()), v, &mut b);
            prop_assert_eq!(out.encoded_len(v), a.len());
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..400)) {
        for v in [V5, V311, V31] {
            decode_all(&data, v, 0);
            decode_all(&data, v, 64);
        }
    }

    #[test]
    fn mutated_packets_never_panic(p in packet_v5(), flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        for v in [V5, V311] {
            let mut out = BytesMut::new();
            encode(&p, v, &mut out);
            if out.is_empty() {
                continue;
            }
            let mut data = out.to_vec();
            for (i, x) in &flips {
                let i = i.index(data.len());
                data[i] ^= *x;
            }
            decode_all(&data, v, 0);
            data.truncate(data.len() / 2 + 1);
            decode_all(&data, v, 0);
        }
    }
}
