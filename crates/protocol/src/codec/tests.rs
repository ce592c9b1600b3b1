//! Hand-written byte vectors: every packet type, both versions, every validation rule.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::packets::*;
use bytes::{Bytes, BytesMut};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;
const V31: ProtocolVersion = ProtocolVersion::V31;

fn dec(bytes: &[u8], v: ProtocolVersion) -> Result<Option<Packet>, DecodeError> {
    let mut b = BytesMut::from(bytes);
    decode(&mut b, v, 0)
}

/// Every proper prefix is incomplete and leaves the buffer untouched.
fn check_prefixes(bytes: &[u8], v: ProtocolVersion) {
    for i in 0..bytes.len() {
        let mut b = BytesMut::from(&bytes[..i]);
        assert_eq!(
            decode(&mut b, v, 0),
            Ok(None),
            "prefix of length {i} of {bytes:02x?}"
        );
        assert_eq!(&b[..], &bytes[..i]);
    }
}

/// Decodes a complete valid packet (checking all prefixes and full consumption).
fn ok(bytes: &[u8], v: ProtocolVersion) -> Packet {
    check_prefixes(bytes, v);
    let mut b = BytesMut::from(bytes);
    b.extend_from_slice(&[0xC0, 0x00]);
    let p = decode(&mut b, v, 0).unwrap().unwrap();
    assert_eq!(&b[..], &[0xC0, 0x00], "exactly the packet consumed");
    p
}

fn err(bytes: &[u8], v: ProtocolVersion) -> DecodeError {
    match dec(bytes, v) {
        Err(e) => e,
        other => panic!("expected an error for {bytes:02x?}, got {other:?}"),
    }
}

fn malformed(bytes: &[u8], v: ProtocolVersion) {
    let e = err(bytes, v);
    assert!(
        matches!(e, DecodeError::Malformed(_)),
        "{bytes:02x?}: {e:?}"
    );
    assert_eq!(e.reason_code(), 0x81);
}

fn protocol(bytes: &[u8], v: ProtocolVersion) {
    let e = err(bytes, v);
    assert!(matches!(e, DecodeError::Protocol(_)), "{bytes:02x?}: {e:?}");
    assert_eq!(e.reason_code(), 0x82);
}

fn invalid_topic(bytes: &[u8], v: ProtocolVersion) {
    let e = err(bytes, v);
    assert!(
        matches!(e, DecodeError::InvalidTopic(_)),
        "{bytes:02x?}: {e:?}"
    );
    assert_eq!(e.reason_code(), 0x90);
}

fn enc(p: &Packet, v: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(p, v, &mut out);
    assert_eq!(out.len(), encoded_len(p, v));
    out.to_vec()
}

/// Builds a packet: first byte, then the body with its remaining length prepended.
fn pkt(first: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![first];
    let mut n = body.len();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            v.push(b);
            break;
        }
        v.push(b | 0x80);
    }
    v.extend_from_slice(body);
    v
}

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

// ---------------------------------------------------------------- fixed header

#[test]
fn reserved_packet_type_0() {
    for v in [V5, V311] {
        malformed(&[0x00, 0x00], v);
    }
}

#[test]
fn reserved_flag_bits() {
    for v in [V5, V311] {
        malformed(&[0x62 & 0xf0, 0x02, 0x00, 0x01], v); // PUBREL 0000
        malformed(&[0x63, 0x02, 0x00, 0x01], v);
        malformed(&[0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00], v); // SUBSCRIBE 0000
        malformed(&[0xA0, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'], v); // UNSUBSCRIBE 0000
        malformed(&[0xC1, 0x00], v); // PINGREQ
        malformed(&[0xD8, 0x00], v); // PINGRESP
        malformed(&[0x42, 0x02, 0x00, 0x01], v); // PUBACK 0010
        malformed(&[0xE1, 0x00], v); // DISCONNECT
        malformed(&[0x11, 0x00], v); // CONNECT
        malformed(&[0x24, 0x02, 0x00, 0x00], v); // CONNACK
        malformed(&[0x92, 0x03, 0x00, 0x01, 0x00], v); // SUBACK
    }
    malformed(&[0xF2, 0x00], V5); // AUTH
                                  // The flags are checked from the first byte alone.
    malformed(&[0xC1], V5);
}

/// MQTT 3.1 sets DUP on a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE (flags 1010); 3.1.1 and 5
/// refuse it (mosquitto's `03-publish-c2b-disconnect-qos2`, protocol level 3).
#[test]
fn dup_on_pubrel_subscribe_unsubscribe_only_in_3_1() {
    let pubrel = [0x6A, 0x02, 0x00, 0x01];
    let sub = [0x8A, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x01];
    let unsub = [0xAA, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'];
    assert!(matches!(ok(&pubrel, V31), Packet::PubRel(_)));
    assert!(matches!(ok(&sub, V31), Packet::Subscribe(_)));
    assert!(matches!(ok(&unsub, V31), Packet::Unsubscribe(_)));
    for v in [V5, V311] {
        malformed(&pubrel, v);
        malformed(&sub, v);
        malformed(&unsub, v);
    }
    malformed(&[0x6E, 0x02, 0x00, 0x01], V31); // 1110: QoS 3
}

#[test]
fn auth_in_v311_is_malformed() {
    malformed(&[0xF0, 0x00], V311);
    malformed(&[0xF0, 0x00], V31);
    assert_eq!(ok(&[0xF0, 0x00], V5), Packet::Auth(Auth::default()));
}

#[test]
fn remaining_length_varint() {
    // Five bytes: malformed, detected as soon as the fourth byte has a continuation bit.
    malformed(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x7f], V5);
    malformed(&[0x30, 0xff, 0xff, 0xff, 0xff], V311);
    // Four continuation-free bytes, incomplete: wait.
    assert_eq!(dec(&[0x30, 0xff, 0xff, 0xff], V5), Ok(None));
    assert_eq!(dec(&[0x30, 0xff, 0xff, 0xff, 0x7f], V5), Ok(None));
    // Non-minimal encodings are accepted.
    assert_eq!(ok(&[0xC0, 0x80, 0x00], V5), Packet::PingReq);
    assert_eq!(ok(&[0xC0, 0x80, 0x80, 0x80, 0x00], V311), Packet::PingReq);
}

#[test]
fn packet_too_large_is_checked_from_the_fixed_header() {
    // 2,097,151 bytes announced, only the fixed header present.
    let mut b = BytesMut::from(&[0x30, 0xff, 0xff, 0x7f][..]);
    let e = decode(&mut b, V5, 1000).unwrap_err();
    assert_eq!(
        e,
        DecodeError::PacketTooLarge {
            size: 2_097_155,
            max: 1000
        }
    );
    assert_eq!(e.reason_code(), 0x95);
    // The limit covers the whole packet, fixed header included.
    let p = pkt(0x30, &cat(&[&s("a/b"), b"hello"]));
    assert_eq!(p.len(), 12);
    assert!(decode(&mut BytesMut::from(&p[..]), V311, 12)
        .unwrap()
        .is_some());
    let e = decode(&mut BytesMut::from(&p[..]), V311, 11).unwrap_err();
    assert_eq!(e, DecodeError::PacketTooLarge { size: 12, max: 11 });
    // 0 means no limit.
    assert!(decode(&mut BytesMut::from(&p[..]), V311, 0)
        .unwrap()
        .is_some());
}

#[test]
fn peek() {
    assert_eq!(peek_fixed_header(&[]), Ok(None));
    assert_eq!(peek_fixed_header(&[0x30]), Ok(None));
    assert_eq!(peek_fixed_header(&[0x30, 0x80]), Ok(None));
    assert_eq!(peek_fixed_header(&[0x30, 0x05]), Ok(Some((0x30, 7))));
    assert_eq!(
        peek_fixed_header(&[0x32, 0x80, 0x01, 0xAA]),
        Ok(Some((0x32, 131)))
    );
    assert!(peek_fixed_header(&[0x00, 0x00]).is_err());
    assert!(peek_fixed_header(&[0x36, 0x00]).is_err());
    assert!(peek_fixed_header(&[0x30, 0xff, 0xff, 0xff, 0xff]).is_err());
}

// ---------------------------------------------------------------- PUBLISH

#[test]
fn publish_v311() {
    let b = pkt(0x31, &cat(&[&s("a/b"), b"hi"]));
    let expect = Publish {
        retain: true,
        topic: "a/b".into(),
        payload: Bytes::from_static(b"hi"),
        ..Default::default()
    };
    assert_eq!(ok(&b, V311), Packet::Publish(expect.clone()));
    assert_eq!(enc(&Packet::Publish(expect), V311), b);

    let b = pkt(0x3C, &cat(&[&s("x"), &[0x12, 0x34], b""])); // DUP, QoS 2
    let expect = Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        topic: "x".into(),
        packet_id: 0x1234,
        ..Default::default()
    };
    assert_eq!(ok(&b, V311), Packet::Publish(expect.clone()));
    assert_eq!(enc(&Packet::Publish(expect), V311), b);
}

#[test]
fn publish_v5_with_properties() {
    let props: &[u8] = &[
        0x01, 0x01, // payload format indicator 1
        0x02, 0, 0, 0, 60, // message expiry 60
        0x23, 0, 7, // topic alias 7
        0x0B, 0x81, 0x01, // subscription identifier 129
        0x0B, 0x02, // subscription identifier 2 (may repeat)
        0x26, 0, 1, b'k', 0, 1, b'v', // user property
        0x26, 0, 1, b'k', 0, 1, b'w', // user property again
    ];
    let b = pkt(
        0x32,
        &cat(&[&s("t"), &[0, 10], &[props.len() as u8], props, b"payload"]),
    );
    let expect = Publish {
        qos: QoS::AtLeastOnce,
        topic: "t".into(),
        packet_id: 10,
        properties: PublishProperties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(60),
            topic_alias: Some(7),
            subscription_identifiers: vec![129, 2],
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
            ..Default::default()
        },
        payload: Bytes::from_static(b"payload"),
        ..Default::default()
    };
    assert_eq!(ok(&b, V5), Packet::Publish(expect.clone()));
    assert_eq!(
        decode(
            &mut BytesMut::from(&enc(&Packet::Publish(expect.clone()), V5)[..]),
            V5,
            0
        ),
        Ok(Some(Packet::Publish(expect)))
    );
}

#[test]
fn publish_payload_is_zero_copy() {
    let b = pkt(0x30, &cat(&[&s("t"), &[0], &[7u8; 100]]));
    let mut buf = BytesMut::from(&b[..]);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let Some(Packet::Publish(p)) = decode(&mut buf, V5, 0).unwrap() else {
        panic!()
    };
    assert_eq!(p.payload.len(), 100);
    assert!(range.contains(&(p.payload.as_ptr() as usize)));
}

#[test]
fn publish_qos_and_dup() {
    for v in [V5, V311] {
        malformed(&pkt(0x36, &cat(&[&s("t"), &[0, 1]])), v); // QoS 3
        malformed(&pkt(0x38, &s("t")), v); // DUP with QoS 0 [MQTT-3.3.1-2]
        malformed(&pkt(0x39, &s("t")), v);
    }
}

#[test]
fn publish_packet_id_0() {
    protocol(&pkt(0x32, &cat(&[&s("t"), &[0, 0]])), V311);
    protocol(&pkt(0x34, &cat(&[&s("t"), &[0, 0], &[0]])), V5);
}

#[test]
fn publish_topic_rules() {
    for v in [V5, V311] {
        invalid_topic(&pkt(0x30, &cat(&[&s("a/+"), b"x"])), v);
        invalid_topic(&pkt(0x30, &cat(&[&s("a/#"), &[0]])), v);
        invalid_topic(&pkt(0x30, &cat(&[&s("#"), &[0]])), v);
        malformed(&pkt(0x30, &[0, 2, 0xC3, 0x28, 0]), v); // invalid UTF-8
        malformed(&pkt(0x30, &[0, 2, b'a', 0, 0]), v); // U+0000
        malformed(&pkt(0x30, &[0, 5, b'a']), v); // string longer than the packet
        malformed(&pkt(0x30, &[0]), v); // no room for the length
        malformed(&pkt(0x32, &cat(&[&s("t"), &[0]])), v); // packet id truncated
    }
    // Empty topic: allowed by the decoder in v5 (topic alias), invalid in 3.1.1.
    let b = pkt(0x30, &cat(&[&s(""), &[3, 0x23, 0, 1], b"x"]));
    let Packet::Publish(p) = ok(&b, V5) else {
        panic!()
    };
    assert_eq!((p.topic.as_str(), p.properties.topic_alias), ("", Some(1)));
    invalid_topic(&pkt(0x30, &cat(&[&s(""), b"x"])), V311);
    // Surrogates encoded in UTF-8 are invalid.
    malformed(&pkt(0x30, &[0, 3, 0xED, 0xA0, 0x80]), V311);
}

#[test]
fn publish_property_rules() {
    let with = |props: &[u8]| pkt(0x30, &cat(&[&s("t"), &[props.len() as u8], props, b"x"]));
    protocol(&with(&[0x23, 0, 0]), V5); // topic alias 0
    protocol(&with(&[0x01, 2]), V5); // payload format indicator 2
    protocol(&with(&[0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 1]), V5); // duplicate expiry
    protocol(&with(&[0x23, 0, 1, 0x23, 0, 2]), V5); // duplicate topic alias
    protocol(&with(&[0x0B, 0x00]), V5); // subscription identifier 0
    malformed(&with(&[0x11, 0, 0, 0, 1]), V5); // session expiry not allowed in PUBLISH
    malformed(&with(&[0x1F, 0, 1, b'r']), V5); // reason string not allowed in PUBLISH
    protocol(&with(&[0x08, 0, 3, b'a', b'/', b'#']), V5); // response topic with wildcard
    malformed(&with(&[0x05, 0]), V5); // unknown property
    malformed(&with(&[0x80, 0x01, 0]), V5); // unknown multi-byte identifier
    malformed(&with(&[0x02, 0, 0]), V5); // value truncated inside the property block
    malformed(&with(&[0x03, 0, 1, 0xff]), V5); // content type not UTF-8
    malformed(&with(&[0x26, 0, 1, b'k']), V5); // user property without value
    malformed(&with(&[0x0B, 0xff, 0xff, 0xff, 0xff]), V5); // sub id varint too long
                                                           // Property length longer than the rest of the packet.
    malformed(&pkt(0x30, &cat(&[&s("t"), &[9, 0x01, 0]])), V5);
    malformed(&pkt(0x30, &s("t")), V5); // no property length at all
    let Packet::Publish(p) = ok(&with(&[0x0B, 0xff, 0xff, 0xff, 0x7f]), V5) else {
        panic!()
    };
    assert_eq!(p.properties.subscription_identifiers, vec![268_435_455]);
}

// ---------------------------------------------------------------- CONNECT

fn connect_v311_bytes() -> Vec<u8> {
    pkt(
        0x10,
        &cat(&[
            &s("MQTT"),
            &[4, 0b1110_1110, 0, 60], // user, password, will retain, will QoS 1, will, clean
            &s("cid"),
            &s("w/t"),
            &s("bye"),
            &s("user"),
            &s("pw"),
        ]),
    )
}

#[test]
fn connect_v311() {
    let b = connect_v311_bytes();
    let expect = Connect {
        protocol: V311,
        clean_start: true,
        keep_alive: 60,
        client_id: "cid".into(),
        will: Some(Will {
            topic: "w/t".into(),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: WillProperties::default(),
        }),
        username: Some("user".into()),
        password: Some(Bytes::from_static(b"pw")),
        properties: ConnectProperties::default(),
    };
    let p = Packet::Connect(Box::new(expect));
    assert_eq!(ok(&b, V311), p);
    assert_eq!(enc(&p, V311), b);
    // CONNECT is decoded per its own level whatever the connection version says.
    assert_eq!(ok(&b, V5), p);
    // Minimal, empty client id.
    let b = pkt(0x10, &cat(&[&s("MQTT"), &[4, 0x02, 0, 0], &s("")]));
    let Packet::Connect(c) = ok(&b, V311) else {
        panic!()
    };
    assert_eq!(
        (c.client_id.as_str(), c.will.is_none(), c.username.is_none()),
        ("", true, true)
    );
}

#[test]
fn connect_v31() {
    let b = pkt(0x10, &cat(&[&s("MQIsdp"), &[3, 0x02, 0, 10], &s("old")]));
    let Packet::Connect(c) = ok(&b, V5) else {
        panic!()
    };
    assert_eq!(c.protocol, V31);
    assert_eq!(enc(&Packet::Connect(c), V311), b);
}

#[test]
fn connect_v5() {
    let props: &[u8] = &[
        0x11, 0, 0, 0, 30, // session expiry
        0x21, 0, 10, // receive maximum
        0x27, 0, 0, 1, 0, // maximum packet size 256
        0x22, 0, 5, // topic alias maximum
        0x19, 1, // request response information
        0x17, 0, // request problem information
        0x15, 0, 2, b'm', b'1', // authentication method
        0x16, 0, 1, 9, // authentication data
    ];
    let will_props: &[u8] = &[0x18, 0, 0, 0, 5, 0x01, 1, 0x09, 0, 1, 7];
    let b = pkt(
        0x10,
        &cat(&[
            &s("MQTT"),
            &[5, 0b0100_0100, 0, 30], // password (no user name: allowed in v5), will QoS 0
            &[props.len() as u8],
            props,
            &s("c"),
            &[will_props.len() as u8],
            will_props,
            &s("w"),
            &s(""),
            &s("secret"),
        ]),
    );
    let Packet::Connect(c) = ok(&b, V311) else {
        panic!()
    };
    assert_eq!(c.protocol, V5);
    assert_eq!(c.properties.session_expiry_interval, Some(30));
    assert_eq!(c.properties.receive_maximum, Some(10));
    assert_eq!(c.properties.maximum_packet_size, Some(256));
    assert_eq!(c.properties.topic_alias_maximum, Some(5));
    assert_eq!(c.properties.request_response_information, Some(true));
    assert_eq!(c.properties.request_problem_information, Some(false));
    assert_eq!(c.properties.authentication_method.as_deref(), Some("m1"));
    assert_eq!(
        c.properties.authentication_data.as_deref(),
        Some(&[9u8][..])
    );
    let w = c.will.as_ref().unwrap();
    assert_eq!(w.properties.will_delay_interval, Some(5));
    assert_eq!(w.properties.payload_format_indicator, Some(1));
    assert_eq!(w.properties.correlation_data.as_deref(), Some(&[7u8][..]));
    assert_eq!(
        (c.username.as_deref(), c.password.as_deref()),
        (None, Some(&b"secret"[..]))
    );
    assert_eq!(enc(&Packet::Connect(c), V5), b);
}

fn connect_with(name: &str, level: u8, flags: u8) -> Vec<u8> {
    pkt(0x10, &cat(&[&s(name), &[level, flags, 0, 0], &s("c")]))
}

#[test]
fn connect_protocol_name_and_level() {
    let e = err(&connect_with("MQTT", 6, 2), V5);
    assert_eq!(e, DecodeError::UnsupportedProtocolVersion(6));
    assert_eq!(e.reason_code(), 0x84);
    assert_eq!(
        err(&connect_with("MQTT", 3, 2), V5),
        DecodeError::UnsupportedProtocolVersion(3)
    );
    assert_eq!(
        err(&connect_with("MQIsdp", 4, 2), V5),
        DecodeError::UnsupportedProtocolVersion(4)
    );
    malformed(&connect_with("MQTX", 4, 2), V5);
    malformed(&connect_with("mqtt", 4, 2), V5);
    malformed(&connect_with("", 4, 2), V5);
}

#[test]
fn connect_flags() {
    for level in [4, 5] {
        malformed(&connect_with("MQTT", level, 0x03), V5); // reserved bit 0
        malformed(&connect_with("MQTT", level, 0x0A), V5); // will QoS without will flag
        malformed(&connect_with("MQTT", level, 0x22), V5); // will retain without will flag
        malformed(&connect_with("MQTT", level, 0x1E), V5); // will QoS 3
    }
    // 3.1.1: password without user name is malformed; v5 allows it.
    let b = pkt(
        0x10,
        &cat(&[&s("MQTT"), &[4, 0x42, 0, 0], &s("c"), &s("pw")]),
    );
    malformed(&b, V311);
    let b = pkt(
        0x10,
        &cat(&[&s("MQTT"), &[5, 0x42, 0, 0, 0], &s("c"), &s("pw")]),
    );
    assert!(matches!(ok(&b, V5), Packet::Connect(c) if c.password.is_some()));
}

#[test]
fn connect_payload_rules() {
    // Trailing bytes.
    let mut b = connect_v311_bytes();
    b[1] += 1;
    b.push(0);
    malformed(&b, V311);
    // Missing password.
    let b = pkt(
        0x10,
        &cat(&[&s("MQTT"), &[4, 0xC2, 0, 0], &s("c"), &s("u")]),
    );
    malformed(&b, V311);
    // Client id not UTF-8.
    let b = pkt(0x10, &cat(&[&s("MQTT"), &[4, 0x02, 0, 0], &[0, 1, 0xfe]]));
    malformed(&b, V311);
    // Will topic with a wildcard, or empty.
    let b = pkt(
        0x10,
        &cat(&[&s("MQTT"), &[4, 0x06, 0, 0], &s("c"), &s("a/+"), &s("x")]),
    );
    invalid_topic(&b, V311);
    let b = pkt(
        0x10,
        &cat(&[&s("MQTT"), &[4, 0x06, 0, 0], &s("c"), &s(""), &s("x")]),
    );
    invalid_topic(&b, V311);
}

#[test]
fn connect_property_rules() {
    let with = |props: &[u8]| {
        pkt(
            0x10,
            &cat(&[
                &s("MQTT"),
                &[5, 0x02, 0, 0],
                &[props.len() as u8],
                props,
                &s("c"),
            ]),
        )
    };
    protocol(&with(&[0x21, 0, 0]), V5); // receive maximum 0
    protocol(&with(&[0x27, 0, 0, 0, 0]), V5); // maximum packet size 0
    protocol(&with(&[0x17, 2]), V5); // request problem information 2
    protocol(&with(&[0x19, 2]), V5); // request response information 2
    protocol(&with(&[0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 1]), V5); // duplicate
    malformed(&with(&[0x23, 0, 1]), V5); // topic alias not allowed in CONNECT
    malformed(&with(&[0x18, 0, 0, 0, 1]), V5); // will delay belongs to the will properties
    protocol(&with(&[0x16, 0, 0]), V5); // authentication data without method
    malformed(&with(&[0x00]), V5); // unknown identifier 0
    let ok_b = with(&[0x26, 0, 0, 0, 0, 0x26, 0, 0, 0, 0]);
    assert!(matches!(ok(&ok_b, V5), Packet::Connect(c) if c.properties.user_properties.len() == 2));
    // Will properties use their own table.
    let b = pkt(
        0x10,
        &cat(&[
            &s("MQTT"),
            &[5, 0x06, 0, 0, 0],
            &s("c"),
            &[3, 0x21, 0, 1],
            &s("w"),
            &s(""),
        ]),
    );
    malformed(&b, V5);
    let b = pkt(
        0x10,
        &cat(&[
            &s("MQTT"),
            &[5, 0x06, 0, 0, 0],
            &s("c"),
            &[2, 0x01, 5],
            &s("w"),
            &s(""),
        ]),
    );
    protocol(&b, V5);
}

// ---------------------------------------------------------------- CONNACK

#[test]
fn connack_v311() {
    assert_eq!(
        ok(&[0x20, 2, 0, 0], V311),
        Packet::ConnAck(ConnAck::default())
    );
    let p = ok(&[0x20, 2, 1, 0], V311);
    assert_eq!(
        p,
        Packet::ConnAck(ConnAck {
            session_present: true,
            ..Default::default()
        })
    );
    assert_eq!(enc(&p, V311), [0x20, 2, 1, 0]);
    for (rc, v5) in [(1, 0x84), (2, 0x85), (3, 0x88), (4, 0x86), (5, 0x87)] {
        let p = ok(&[0x20, 2, 0, rc], V311);
        assert_eq!(
            p,
            Packet::ConnAck(ConnAck {
                reason_code: v5,
                ..Default::default()
            })
        );
        assert_eq!(enc(&p, V311), [0x20, 2, 0, rc]);
    }
    protocol(&[0x20, 2, 0, 6], V311); // reserved return code
    protocol(&[0x20, 2, 1, 5], V311); // session present with an error
    malformed(&[0x20, 2, 2, 0], V311); // reserved acknowledge flags
    malformed(&[0x20, 3, 0, 0, 0], V311); // trailing
    malformed(&[0x20, 1, 0], V311);
}

#[test]
fn connack_session_present_is_never_set_for_mqtt31_or_on_a_refusal() {
    let present = ConnAck {
        session_present: true,
        ..Default::default()
    };
    // MQTT 3.1 (protocol level 3): the acknowledge flags byte is reserved.
    assert_eq!(enc(&Packet::ConnAck(present.clone()), V31), [0x20, 2, 0, 0]);
    assert_eq!(
        enc(&Packet::ConnAck(present.clone()), V311),
        [0x20, 2, 1, 0]
    );
    // A refusal never says a session is present (MQTT-3.2.2-4, MQTT-3.2.2-6).
    let refused = ConnAck {
        reason_code: 0x87,
        ..present
    };
    assert_eq!(
        enc(&Packet::ConnAck(refused.clone()), V311),
        [0x20, 2, 0, 5]
    );
    assert_eq!(enc(&Packet::ConnAck(refused), V5)[2], 0);
}

#[test]
fn connack_v311_encoding_maps_reason_codes_and_drops_properties() {
    let mut c = ConnAck {
        reason_code: 0x8A,
        ..Default::default()
    }; // banned
    c.properties.reason_string = Some("no".into());
    c.properties.maximum_qos = Some(1);
    assert_eq!(enc(&Packet::ConnAck(c.clone()), V311), [0x20, 2, 0, 5]);
    c.reason_code = 0x8C; // bad authentication method
    assert_eq!(enc(&Packet::ConnAck(c.clone()), V311), [0x20, 2, 0, 4]);
    c.reason_code = 0x97; // quota exceeded: server unavailable
    assert_eq!(enc(&Packet::ConnAck(c), V311), [0x20, 2, 0, 3]);
}

#[test]
fn connack_v5() {
    let props: &[u8] = &[0x24, 1, 0x25, 0, 0x12, 0, 1, b'a', 0x2A, 1, 0x13, 0, 30];
    let b = pkt(0x20, &cat(&[&[0, 0], &[props.len() as u8], props]));
    let Packet::ConnAck(c) = ok(&b, V5) else {
        panic!()
    };
    assert_eq!(c.properties.maximum_qos, Some(1));
    assert_eq!(c.properties.retain_available, Some(false));
    assert_eq!(
        c.properties.assigned_client_identifier.as_deref(),
        Some("a")
    );
    assert_eq!(c.properties.server_keep_alive, Some(30));
    assert_eq!(c.properties.shared_subscription_available, Some(true));
    assert_eq!(enc(&Packet::ConnAck(c), V5), b);
    assert_eq!(
        enc(&Packet::ConnAck(ConnAck::default()), V5),
        [0x20, 3, 0, 0, 0]
    );
    let with = |props: &[u8]| pkt(0x20, &cat(&[&[0, 0], &[props.len() as u8], props]));
    protocol(&with(&[0x24, 2]), V5); // maximum QoS 2
    for id in [0x25, 0x28, 0x29, 0x2A] {
        protocol(&with(&[id, 2]), V5);
    }
    protocol(&with(&[0x21, 0, 0]), V5);
    protocol(&with(&[0x27, 0, 0, 0, 0]), V5);
    malformed(&with(&[0x17, 1]), V5); // request problem information: CONNECT only
    protocol(&[0x20, 3, 0, 0x01, 0], V5); // reason code not allowed in CONNACK
    malformed(&[0x20, 2, 0, 0], V5); // missing property length
}

// ---------------------------------------------------------------- PUBACK .. PUBCOMP

#[test]
fn pub_resp_v5_short_forms() {
    for (first, make) in [
        (0x40, Packet::PubAck as fn(PubResp) -> Packet),
        (0x50, Packet::PubRec),
        (0x62, Packet::PubRel),
        (0x70, Packet::PubComp),
    ] {
        let p = ok(&[first, 2, 0, 7], V5);
        assert_eq!(p, make(PubResp::new(7, 0)));
        assert_eq!(enc(&p, V5), [first, 2, 0, 7]);
        assert_eq!(ok(&[first, 4, 0, 7, 0, 0], V5), p);
        protocol(&[first, 2, 0, 0], V5); // packet id 0
        protocol(&[first, 2, 0, 0], V311);
        malformed(&[first, 1, 0], V5);
        malformed(&[first, 0], V311);
        malformed(&[first, 3, 0, 7, 0], V311); // 3.1.1: exactly two bytes
        assert_eq!(ok(&[first, 2, 0, 7], V311), p);
        // v5 fields dropped for 3.1.1.
        let mut r = PubResp::new(
            7,
            if first == 0x62 || first == 0x70 {
                0x92
            } else {
                0x10
            },
        );
        r.properties.reason_string = Some("x".into());
        assert_eq!(enc(&make(r), V311), [first, 2, 0, 7]);
    }
    let p = ok(&[0x40, 3, 0, 7, 0x10], V5);
    assert_eq!(p, Packet::PubAck(PubResp::new(7, 0x10)));
    assert_eq!(enc(&p, V5), [0x40, 3, 0, 7, 0x10]);
    let b = pkt(0x50, &cat(&[&[0, 7, 0x80, 4, 0x1F, 0, 1, b'r']]));
    let p = ok(&b, V5);
    let Packet::PubRec(r) = &p else { panic!() };
    assert_eq!(
        (r.reason_code, r.properties.reason_string.as_deref()),
        (0x80, Some("r"))
    );
    assert_eq!(enc(&p, V5), b);
    protocol(&[0x62, 3, 0, 7, 0x10], V5); // 0x10 is not a PUBREL reason code
    protocol(&[0x40, 3, 0, 7, 0x92], V5); // 0x92 is not a PUBACK reason code
    malformed(&[0x40, 6, 0, 7, 0, 2, 0x01, 0], V5); // property not allowed
    malformed(&[0x40, 5, 0, 7, 0, 1, 0x1F], V5); // truncated property
    malformed(&[0x40, 5, 0, 7, 0, 0, 0], V5); // trailing
}

// ---------------------------------------------------------------- SUBSCRIBE / SUBACK

#[test]
fn subscribe_v311() {
    let b = pkt(
        0x82,
        &cat(&[&[0, 1], &s("a/#"), &[1], &s("bad/#/filter"), &[2]]),
    );
    let p = ok(&b, V311);
    let Packet::Subscribe(sub) = &p else { panic!() };
    assert_eq!(sub.packet_id, 1);
    assert_eq!(sub.filters.len(), 2);
    // The decoder does not validate filter syntax (the broker answers per filter).
    assert_eq!(sub.filters[1].filter, "bad/#/filter");
    assert_eq!(sub.filters[1].options.qos, QoS::ExactlyOnce);
    assert_eq!(enc(&p, V311), b);
    malformed(&pkt(0x82, &cat(&[&[0, 1], &s("a"), &[0x04]])), V311); // bits 2-7 reserved
    malformed(&pkt(0x82, &cat(&[&[0, 1], &s("a"), &[0x03]])), V311); // QoS 3
    malformed(&pkt(0x82, &cat(&[&[0, 1], &s("a")])), V311); // missing options
    malformed(&pkt(0x82, &cat(&[&[0, 1], &[0, 1, 0xff], &[0]])), V311); // not UTF-8
    protocol(&pkt(0x82, &[0, 1]), V311); // no filters
    protocol(&pkt(0x82, &cat(&[&[0, 0], &s("a"), &[0]])), V311); // packet id 0
}

#[test]
fn subscribe_v5() {
    let b = pkt(
        0x82,
        &cat(&[
            &[0, 9],
            &[2, 0x0B, 5],
            &s("$share/g/a"),
            &[0x2D],
            &s(""),
            &[0],
        ]),
    );
    let p = ok(&b, V5);
    let Packet::Subscribe(sub) = &p else { panic!() };
    assert_eq!(sub.properties.subscription_identifier, Some(5));
    assert_eq!(
        sub.filters[0].options,
        SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            no_local: true,
            retain_as_published: true,
            retain_handling: 2
        }
    );
    assert_eq!(sub.filters[1].filter, "");
    assert_eq!(enc(&p, V5), b);
    let with = |opts: u8| pkt(0x82, &cat(&[&[0, 1, 0], &s("a"), &[opts]]));
    malformed(&with(0x40), V5); // reserved bits 6-7
    malformed(&with(0x80), V5);
    protocol(&with(0x03), V5); // QoS 3: a protocol error in MQTT 5 (3.8.3.1)
    protocol(&with(0x30), V5); // retain handling 3
    protocol(&pkt(0x82, &[0, 1, 0]), V5); // no filters
    protocol(&pkt(0x82, &cat(&[&[0, 0, 0], &s("a"), &[0]])), V5); // packet id 0
    protocol(&pkt(0x82, &cat(&[&[0, 1, 2, 0x0B, 0], &s("a"), &[0]])), V5); // sub id 0
    protocol(
        &pkt(0x82, &cat(&[&[0, 1, 4, 0x0B, 1, 0x0B, 2], &s("a"), &[0]])),
        V5,
    ); // twice
    malformed(
        &pkt(0x82, &cat(&[&[0, 1, 4, 0x1F, 0, 1, b'r'], &s("a"), &[0]])),
        V5,
    );
    // 3.1.1 encoding keeps only the QoS bits.
    assert_eq!(
        enc(&p, V311),
        pkt(0x82, &cat(&[&[0, 9], &s("$share/g/a"), &[1], &s(""), &[0]]))
    );
}

#[test]
fn suback() {
    let p = ok(&[0x90, 5, 0, 3, 0, 1, 0x80], V311);
    assert_eq!(
        p,
        Packet::SubAck(SubAck {
            packet_id: 3,
            reason_codes: vec![0, 1, 0x80],
            ..Default::default()
        })
    );
    protocol(&[0x90, 3, 0, 3, 0x87], V311); // 3.1.1 knows 0, 1, 2, 0x80 only
    protocol(&[0x90, 3, 0, 3, 0x03], V311);
    protocol(&[0x90, 2, 0, 3], V311); // no return codes
    let v5 = ok(&[0x90, 5, 0, 3, 0, 0x87, 0xA2], V5);
    let Packet::SubAck(a) = &v5 else { panic!() };
    assert_eq!(a.reason_codes, vec![0x87, 0xA2]);
    assert_eq!(enc(&v5, V311), [0x90, 4, 0, 3, 0x80, 0x80]); // failures map to 0x80
    assert_eq!(enc(&v5, V5), [0x90, 5, 0, 3, 0, 0x87, 0xA2]);
    protocol(&[0x90, 4, 0, 3, 0, 0x11], V5);
    protocol(&[0x90, 3, 0, 3, 0], V5);
}

/// A Reason String longer than a string can hold (it may quote a 64 KiB filter) is cut at a
/// character boundary, and the packet stays well formed.
#[test]
fn an_overlong_reason_string_is_cut_to_fit() {
    let long = "é".repeat(40_000); // 80,000 bytes
    let p = Packet::SubAck(SubAck {
        packet_id: 7,
        reason_codes: vec![0x8F],
        properties: AckProperties {
            reason_string: Some(long.clone()),
            ..Default::default()
        },
    });
    let bytes = enc(&p, V5);
    assert_eq!(bytes.len(), encoded_len(&p, V5));
    let Packet::SubAck(a) = dec(&bytes, V5).unwrap().unwrap() else {
        panic!("not a SUBACK")
    };
    let got = a.properties.reason_string.unwrap();
    assert_eq!(got.len(), 65_534); // 32,767 two-byte characters
    assert!(long.starts_with(&got));
}

// ---------------------------------------------------------------- UNSUBSCRIBE / UNSUBACK

#[test]
fn unsubscribe() {
    let b = pkt(0xA2, &cat(&[&[0, 4], &s("a/+"), &s("b")]));
    let p = ok(&b, V311);
    assert_eq!(
        p,
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 4,
            filters: vec!["a/+".into(), "b".into()],
            user_properties: vec![]
        })
    );
    assert_eq!(enc(&p, V311), b);
    protocol(&pkt(0xA2, &[0, 4]), V311);
    protocol(&pkt(0xA2, &cat(&[&[0, 0], &s("a")])), V311);
    malformed(&pkt(0xA2, &cat(&[&[0, 4], &[0, 3, b'a']])), V311);
    let b = pkt(0xA2, &cat(&[&[0, 4, 5, 0x26, 0, 0, 0, 0], &s("a")]));
    let p = ok(&b, V5);
    assert!(matches!(&p, Packet::Unsubscribe(u) if u.user_properties.len() == 1));
    assert_eq!(enc(&p, V5), b);
    protocol(&pkt(0xA2, &[0, 4, 0]), V5);
    malformed(&pkt(0xA2, &cat(&[&[0, 4, 2, 0x0B, 1], &s("a")])), V5); // sub id not allowed
}

#[test]
fn unsuback() {
    let p = ok(&[0xB0, 2, 0, 4], V311);
    assert_eq!(
        p,
        Packet::UnsubAck(UnsubAck {
            packet_id: 4,
            ..Default::default()
        })
    );
    malformed(&[0xB0, 3, 0, 4, 0], V311); // 3.1.1 UNSUBACK has no payload
    protocol(&[0xB0, 2, 0, 0], V311);
    let p5 = ok(&[0xB0, 5, 0, 4, 0, 0x00, 0x11], V5);
    let Packet::UnsubAck(a) = &p5 else { panic!() };
    assert_eq!(a.reason_codes, vec![0, 0x11]);
    assert_eq!(enc(&p5, V5), [0xB0, 5, 0, 4, 0, 0x00, 0x11]);
    assert_eq!(enc(&p5, V311), [0xB0, 2, 0, 4]);
    protocol(&[0xB0, 3, 0, 4, 0], V5); // no reason codes
    protocol(&[0xB0, 4, 0, 4, 0, 0x10], V5);
}

// ---------------------------------------------------------------- PING, DISCONNECT, AUTH

#[test]
fn ping() {
    for v in [V5, V311] {
        assert_eq!(ok(&[0xC0, 0], v), Packet::PingReq);
        assert_eq!(ok(&[0xD0, 0], v), Packet::PingResp);
        assert_eq!(enc(&Packet::PingReq, v), [0xC0, 0]);
        assert_eq!(enc(&Packet::PingResp, v), [0xD0, 0]);
        malformed(&[0xC0, 1, 0], v);
        malformed(&[0xD0, 1, 0], v);
    }
}

#[test]
fn disconnect() {
    // Remaining length 0 means reason 0x00 (rumqttc rejects this).
    assert_eq!(ok(&[0xE0, 0], V5), Packet::Disconnect(Disconnect::new(0)));
    assert_eq!(
        ok(&[0xE0, 1, 0x04], V5),
        Packet::Disconnect(Disconnect::new(0x04))
    );
    assert_eq!(
        ok(&[0xE0, 2, 0x00, 0], V5),
        Packet::Disconnect(Disconnect::new(0))
    );
    let b = [0xE0, 7, 0x8E, 5, 0x11, 0, 0, 0, 9];
    let p = ok(&b, V5);
    let Packet::Disconnect(d) = &p else { panic!() };
    assert_eq!(
        (d.reason_code, d.properties.session_expiry_interval),
        (0x8E, Some(9))
    );
    assert_eq!(enc(&p, V5), b);
    assert_eq!(enc(&p, V311), [0xE0, 0]);
    assert_eq!(enc(&Packet::Disconnect(Disconnect::new(0)), V5), [0xE0, 0]);
    assert_eq!(
        enc(&Packet::Disconnect(Disconnect::new(0x8B)), V5),
        [0xE0, 1, 0x8B]
    );
    protocol(&[0xE0, 1, 0x01], V5); // not a DISCONNECT reason code
    malformed(&[0xE0, 4, 0, 2, 0x24, 1], V5); // maximum QoS not allowed
    malformed(&[0xE0, 3, 0, 0, 0], V5); // trailing
    assert_eq!(ok(&[0xE0, 0], V311), Packet::Disconnect(Disconnect::new(0)));
    malformed(&[0xE0, 1, 0], V311);
}

#[test]
fn auth() {
    assert_eq!(ok(&[0xF0, 0], V5), Packet::Auth(Auth::default()));
    assert_eq!(enc(&Packet::Auth(Auth::default()), V5), [0xF0, 0]);
    let b = pkt(
        0xF0,
        &cat(&[&[0x18, 8, 0x15, 0, 2, b'm', b'1', 0x16, 0, 0]]),
    );
    let p = ok(&b, V5);
    let Packet::Auth(a) = &p else { panic!() };
    assert_eq!(a.reason_code, 0x18);
    assert_eq!(a.properties.authentication_method.as_deref(), Some("m1"));
    assert_eq!(enc(&p, V5), b);
    assert_eq!(
        ok(&[0xF0, 2, 0x19, 0], V5),
        Packet::Auth(Auth {
            reason_code: 0x19,
            ..Default::default()
        })
    );
    malformed(&[0xF0, 1, 0x18], V5); // property length required
    protocol(&[0xF0, 2, 0x04, 0], V5); // not an AUTH reason code
    malformed(&[0xF0, 4, 0x18, 2, 0x11, 0], V5);
    // 3.1.1 cannot carry AUTH: nothing is written.
    assert_eq!(enc(&p, V311), Vec::<u8>::new());
    assert_eq!(encoded_len(&p, V311), 0);
}

// ---------------------------------------------------------------- misc

#[test]
fn several_packets_in_one_buffer() {
    let mut b = BytesMut::new();
    b.extend_from_slice(&connect_v311_bytes());
    b.extend_from_slice(&pkt(0x30, &cat(&[&s("t"), b"1"])));
    b.extend_from_slice(&[0xC0, 0x00, 0xE0]);
    assert!(matches!(
        decode(&mut b, V311, 0),
        Ok(Some(Packet::Connect(_)))
    ));
    assert!(matches!(
        decode(&mut b, V311, 0),
        Ok(Some(Packet::Publish(_)))
    ));
    assert_eq!(decode(&mut b, V311, 0), Ok(Some(Packet::PingReq)));
    assert_eq!(decode(&mut b, V311, 0), Ok(None));
    assert_eq!(&b[..], &[0xE0]);
}

#[test]
fn encode_appends_and_reserves_exactly() {
    let p = Packet::Publish(Publish {
        topic: "a/b".into(),
        payload: Bytes::from(vec![1u8; 300]),
        ..Default::default()
    });
    let mut out = BytesMut::from(&b"prefix"[..]);
    encode(&p, V5, &mut out);
    assert_eq!(&out[..6], b"prefix");
    assert_eq!(out.len() - 6, encoded_len(&p, V5));
    assert_eq!(&out[6..9], &[0x30, 0xB2, 0x02]); // 2 + 3 + 1 + 300 = 306
    let mut fresh = BytesMut::new();
    encode(&p, V5, &mut fresh);
    assert_eq!(fresh.capacity(), fresh.len());
}

#[test]
fn error_display_and_codes() {
    let e: Box<dyn std::error::Error> = Box::new(DecodeError::Malformed("x"));
    assert_eq!(e.to_string(), "malformed packet: x");
    assert_eq!(DecodeError::Protocol("y").to_string(), "protocol error: y");
    assert_eq!(
        DecodeError::UnsupportedProtocolVersion(7).reason_code(),
        0x84
    );
    assert_eq!(DecodeError::InvalidTopic("z").reason_code(), 0x90);
    assert!(DecodeError::PacketTooLarge { size: 10, max: 5 }
        .to_string()
        .contains("10"));
}
