//! Encoding. The body writer is generic over a [`Sink`]: run against a [`Counter`] it yields
//! the exact length, run against `BytesMut` it writes; both use the same code path.

use super::props::*;
use crate::packets::*;
use crate::reason;
use bytes::{BufMut, BytesMut};

pub(super) trait Sink {
    fn put(&mut self, b: &[u8]);
    fn u8(&mut self, v: u8);
    fn u16(&mut self, v: u16);
    fn u32(&mut self, v: u32);

    fn varint(&mut self, mut v: usize) {
        debug_assert!(v <= 268_435_455, "variable byte integer out of range");
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.u8(b);
                return;
            }
            self.u8(b | 0x80);
        }
    }

    fn bin(&mut self, b: &[u8]) {
        debug_assert!(
            b.len() <= usize::from(u16::MAX),
            "string or binary longer than 65535"
        );
        self.u16(b.len() as u16);
        self.put(b);
    }

    fn str(&mut self, s: &str) {
        self.bin(s.as_bytes());
    }

    fn p_u8(&mut self, id: u8, v: Option<u8>) {
        if let Some(v) = v {
            self.u8(id);
            self.u8(v);
        }
    }
    fn p_bool(&mut self, id: u8, v: Option<bool>) {
        self.p_u8(id, v.map(u8::from));
    }
    fn p_u16(&mut self, id: u8, v: Option<u16>) {
        if let Some(v) = v {
            self.u8(id);
            self.u16(v);
        }
    }
    fn p_u32(&mut self, id: u8, v: Option<u32>) {
        if let Some(v) = v {
            self.u8(id);
            self.u32(v);
        }
    }
    fn p_str(&mut self, id: u8, v: &Option<String>) {
        if let Some(v) = v {
            self.u8(id);
            self.str(v);
        }
    }
    /// A Reason String: the server's own diagnostic, cut at a character boundary to what a
    /// string can hold (it may quote client input, such as a 64 KiB topic filter).
    fn p_reason(&mut self, v: &Option<String>) {
        if let Some(v) = v {
            let mut end = v.len().min(usize::from(u16::MAX));
            while !v.is_char_boundary(end) {
                end -= 1;
            }
            self.u8(REASON_STRING);
            self.str(&v[..end]);
        }
    }
    fn p_bin(&mut self, id: u8, v: &Option<bytes::Bytes>) {
        if let Some(v) = v {
            self.u8(id);
            self.bin(v);
        }
    }
    fn p_users(&mut self, users: &UserProperties) {
        for (k, v) in users {
            self.u8(USER_PROPERTY);
            self.str(k);
            self.str(v);
        }
    }
}

/// Counts bytes instead of writing them.
pub(super) struct Counter(pub usize);

impl Sink for Counter {
    fn put(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
    fn u8(&mut self, _: u8) {
        self.0 += 1;
    }
    fn u16(&mut self, _: u16) {
        self.0 += 2;
    }
    fn u32(&mut self, _: u32) {
        self.0 += 4;
    }
    fn varint(&mut self, v: usize) {
        self.0 += varint_len(v);
    }
}

impl Sink for BytesMut {
    fn put(&mut self, b: &[u8]) {
        self.put_slice(b);
    }
    fn u8(&mut self, v: u8) {
        self.put_u8(v);
    }
    fn u16(&mut self, v: u16) {
        self.put_u16(v);
    }
    fn u32(&mut self, v: u32) {
        self.put_u32(v);
    }
}

fn varint_len(v: usize) -> usize {
    match v {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// A property block's content.
trait Props {
    fn emit<S: Sink>(&self, s: &mut S);
}

fn props_len<P: Props>(p: &P) -> usize {
    let mut c = Counter(0);
    p.emit(&mut c);
    c.0
}

/// Property length varint, then the properties.
fn props<S: Sink, P: Props>(s: &mut S, p: &P) {
    s.varint(props_len(p));
    p.emit(s);
}

impl Props for ConnectProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_u32(SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.p_u16(RECEIVE_MAXIMUM, self.receive_maximum);
        s.p_u32(MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        s.p_u16(TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        s.p_bool(
            REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
        );
        s.p_bool(
            REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
        );
        s.p_users(&self.user_properties);
        s.p_str(AUTHENTICATION_METHOD, &self.authentication_method);
        s.p_bin(AUTHENTICATION_DATA, &self.authentication_data);
    }
}

impl Props for WillProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_u32(WILL_DELAY_INTERVAL, self.will_delay_interval);
        s.p_u8(PAYLOAD_FORMAT_INDICATOR, self.payload_format_indicator);
        s.p_u32(MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        s.p_str(CONTENT_TYPE, &self.content_type);
        s.p_str(RESPONSE_TOPIC, &self.response_topic);
        s.p_bin(CORRELATION_DATA, &self.correlation_data);
        s.p_users(&self.user_properties);
    }
}

impl Props for ConnAckProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_u32(SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.p_u16(RECEIVE_MAXIMUM, self.receive_maximum);
        s.p_u8(MAXIMUM_QOS, self.maximum_qos);
        s.p_bool(RETAIN_AVAILABLE, self.retain_available);
        s.p_u32(MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        s.p_str(ASSIGNED_CLIENT_IDENTIFIER, &self.assigned_client_identifier);
        s.p_u16(TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        s.p_reason(&self.reason_string);
        s.p_users(&self.user_properties);
        s.p_bool(
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
        );
        s.p_bool(
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifiers_available,
        );
        s.p_bool(
            SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
        );
        s.p_u16(SERVER_KEEP_ALIVE, self.server_keep_alive);
        s.p_str(RESPONSE_INFORMATION, &self.response_information);
        s.p_str(SERVER_REFERENCE, &self.server_reference);
        s.p_str(AUTHENTICATION_METHOD, &self.authentication_method);
        s.p_bin(AUTHENTICATION_DATA, &self.authentication_data);
    }
}

impl Props for PublishProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        publish_props(
            s,
            self,
            self.message_expiry_interval,
            self.topic_alias,
            &self.subscription_identifiers,
        );
    }
}

/// The properties of a PUBLISH: `p`'s own, with the three that differ per delivery given.
fn publish_props<S: Sink>(
    s: &mut S,
    p: &PublishProperties,
    message_expiry_interval: Option<u32>,
    topic_alias: Option<u16>,
    subscription_identifiers: &[u32],
) {
    s.p_u8(PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator);
    s.p_u32(MESSAGE_EXPIRY_INTERVAL, message_expiry_interval);
    s.p_u16(TOPIC_ALIAS, topic_alias);
    s.p_str(RESPONSE_TOPIC, &p.response_topic);
    s.p_bin(CORRELATION_DATA, &p.correlation_data);
    s.p_users(&p.user_properties);
    for &id in subscription_identifiers {
        s.u8(SUBSCRIPTION_IDENTIFIER);
        s.varint(id as usize);
    }
    s.p_str(CONTENT_TYPE, &p.content_type);
}

impl Props for AckProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_reason(&self.reason_string);
        s.p_users(&self.user_properties);
    }
}

impl Props for SubscribeProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        if let Some(id) = self.subscription_identifier {
            s.u8(SUBSCRIPTION_IDENTIFIER);
            s.varint(id as usize);
        }
        s.p_users(&self.user_properties);
    }
}

impl Props for UserProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_users(self);
    }
}

impl Props for DisconnectProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_u32(SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.p_reason(&self.reason_string);
        s.p_users(&self.user_properties);
        s.p_str(SERVER_REFERENCE, &self.server_reference);
    }
}

impl Props for AuthProperties {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.p_str(AUTHENTICATION_METHOD, &self.authentication_method);
        s.p_bin(AUTHENTICATION_DATA, &self.authentication_data);
        s.p_reason(&self.reason_string);
        s.p_users(&self.user_properties);
    }
}

fn first_byte(p: &Packet) -> u8 {
    match p {
        Packet::Publish(p) => {
            0x30 | (u8::from(p.dup) << 3) | (p.qos.as_u8() << 1) | u8::from(p.retain)
        }
        Packet::PubRel(_) | Packet::Subscribe(_) | Packet::Unsubscribe(_) => {
            (p.type_id() << 4) | 0b0010
        }
        _ => p.type_id() << 4,
    }
}

/// PUBACK..PUBCOMP and DISCONNECT (v5): reason code and properties only when needed.
fn short_reason<S: Sink, P: Props>(s: &mut S, code: u8, p: &P) {
    let plen = props_len(p);
    if code != 0 || plen != 0 {
        s.u8(code);
    }
    if plen != 0 {
        s.varint(plen);
        p.emit(s);
    }
}

fn body<S: Sink>(packet: &Packet, version: ProtocolVersion, s: &mut S) {
    let v5 = version.is_v5();
    match packet {
        Packet::Connect(c) => connect(c, s),
        Packet::ConnAck(c) => {
            // MQTT 3.1 has no Session Present flag (the byte is reserved, 0); no version sets it
            // on a refusal (MQTT-3.2.2-4, MQTT-3.2.2-6).
            let present = c.session_present
                && c.reason_code == reason::SUCCESS
                && version != ProtocolVersion::V31;
            s.u8(u8::from(present));
            if v5 {
                s.u8(c.reason_code);
                props(s, &c.properties);
            } else {
                s.u8(reason::connack_v311(c.reason_code));
            }
        }
        Packet::Publish(p) => {
            s.str(&p.topic);
            if p.qos != QoS::AtMostOnce {
                s.u16(p.packet_id);
            }
            if v5 {
                props(s, &p.properties);
            }
            s.put(&p.payload);
        }
        Packet::PubAck(r) | Packet::PubRec(r) | Packet::PubRel(r) | Packet::PubComp(r) => {
            s.u16(r.packet_id);
            if v5 {
                short_reason(s, r.reason_code, &r.properties);
            }
        }
        Packet::Subscribe(sub) => {
            s.u16(sub.packet_id);
            if v5 {
                props(s, &sub.properties);
            }
            for f in &sub.filters {
                s.str(&f.filter);
                let o = &f.options;
                let mut b = o.qos.as_u8();
                if v5 {
                    b |= (u8::from(o.no_local) << 2)
                        | (u8::from(o.retain_as_published) << 3)
                        | ((o.retain_handling & 0x03) << 4);
                }
                s.u8(b);
            }
        }
        Packet::SubAck(a) => {
            s.u16(a.packet_id);
            if v5 {
                props(s, &a.properties);
                s.put(&a.reason_codes);
            } else {
                for &c in &a.reason_codes {
                    s.u8(if c <= 2 { c } else { reason::UNSPECIFIED_ERROR });
                }
            }
        }
        Packet::Unsubscribe(u) => {
            s.u16(u.packet_id);
            if v5 {
                props(s, &u.user_properties);
            }
            for f in &u.filters {
                s.str(f);
            }
        }
        Packet::UnsubAck(a) => {
            s.u16(a.packet_id);
            if v5 {
                props(s, &a.properties);
                s.put(&a.reason_codes);
            }
        }
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(d) => {
            if v5 {
                short_reason(s, d.reason_code, &d.properties);
            }
        }
        Packet::Auth(a) => {
            if v5 && (a.reason_code != 0 || props_len(&a.properties) != 0) {
                s.u8(a.reason_code);
                props(s, &a.properties);
            }
        }
    }
}

fn connect<S: Sink>(c: &Connect, s: &mut S) {
    let v5 = c.protocol.is_v5();
    match c.protocol {
        ProtocolVersion::V31 => s.str("MQIsdp"),
        ProtocolVersion::V311 | ProtocolVersion::V5 => s.str("MQTT"),
    }
    s.u8(c.protocol.level());
    let mut flags = u8::from(c.clean_start) << 1;
    if let Some(w) = &c.will {
        flags |= 0x04 | (w.qos.as_u8() << 3) | (u8::from(w.retain) << 5);
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    s.u8(flags);
    s.u16(c.keep_alive);
    if v5 {
        props(s, &c.properties);
    }
    s.str(&c.client_id);
    if let Some(w) = &c.will {
        if v5 {
            props(s, &w.properties);
        }
        s.str(&w.topic);
        s.bin(&w.payload);
    }
    if let Some(u) = &c.username {
        s.str(u);
    }
    if let Some(p) = &c.password {
        s.bin(p);
    }
}

/// The remaining length, or `None` for a packet the version cannot carry (AUTH in 3.1.1).
fn remaining_len(packet: &Packet, version: ProtocolVersion) -> Option<usize> {
    if matches!(packet, Packet::Auth(_)) && !version.is_v5() {
        return None;
    }
    let mut c = Counter(0);
    body(packet, version, &mut c);
    Some(c.0)
}

/// Append the encoding of `packet` to `out` (one exact `reserve`). For MQTT 3.1.1 the MQTT
/// 5-only fields are dropped, CONNACK reason codes are mapped with
/// [`reason::connack_v311`] and SUBACK failure codes become 0x80; AUTH writes nothing.
/// CONNECT is encoded according to its own `protocol` field.
pub fn encode(packet: &Packet, version: ProtocolVersion, out: &mut BytesMut) {
    let Some(rl) = remaining_len(packet, version) else {
        return;
    };
    out.reserve(1 + varint_len(rl) + rl);
    out.put_u8(first_byte(packet));
    Sink::varint(out, rl);
    body(packet, version, out);
}

/// The exact number of bytes [`encode`] appends for `packet`.
pub fn encoded_len(packet: &Packet, version: ProtocolVersion) -> usize {
    remaining_len(packet, version).map_or(0, |rl| 1 + varint_len(rl) + rl)
}

/// An outbound PUBLISH assembled from borrowed parts: what a broker sends a subscriber is the
/// stored message's topic, properties and payload with a few fields of the delivery in place
/// of the stored ones. Encoding it copies nothing but the bytes onto the wire (no `Publish`
/// with an owned topic and cloned properties per delivery).
#[derive(Debug, Clone, Copy)]
pub struct PublishOut<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty when the topic alias stands for it.
    pub topic: &'a str,
    /// Ignored for QoS 0.
    pub packet_id: u16,
    /// The message's own properties: payload format, response topic, correlation data, user
    /// properties and content type are sent as they are; its message expiry, topic alias and
    /// subscription identifiers are replaced by the three fields below.
    pub properties: &'a PublishProperties,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub subscription_identifiers: &'a [u32],
    pub payload: &'a [u8],
}

impl Props for PublishOut<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        publish_props(
            s,
            self.properties,
            self.message_expiry_interval,
            self.topic_alias,
            self.subscription_identifiers,
        );
    }
}

impl PublishOut<'_> {
    fn body<S: Sink>(&self, version: ProtocolVersion, s: &mut S) {
        s.str(self.topic);
        if self.qos != QoS::AtMostOnce {
            s.u16(self.packet_id);
        }
        if version.is_v5() {
            props(s, self);
        }
        s.put(self.payload);
    }

    fn remaining_len(&self, version: ProtocolVersion) -> usize {
        let mut c = Counter(0);
        self.body(version, &mut c);
        c.0
    }

    /// The exact number of bytes [`PublishOut::encode`] appends.
    pub fn encoded_len(&self, version: ProtocolVersion) -> usize {
        let rl = self.remaining_len(version);
        1 + varint_len(rl) + rl
    }

    /// Append the PUBLISH to `out`: the same bytes [`encode`] writes for the equivalent
    /// [`Publish`] (MQTT 3.1.1 drops the properties).
    pub fn encode(&self, version: ProtocolVersion, out: &mut BytesMut) {
        let rl = self.remaining_len(version);
        out.reserve(1 + varint_len(rl) + rl);
        out.put_u8(
            0x30 | (u8::from(self.dup) << 3) | (self.qos.as_u8() << 1) | u8::from(self.retain),
        );
        Sink::varint(out, rl);
        self.body(version, out);
    }
}
