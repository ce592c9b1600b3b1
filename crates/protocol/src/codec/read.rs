//! Decoding: fixed header first (phase 1), then the body of a complete packet (phase 2).

use super::props::{self, codes, Kind, Table};
use super::DecodeError::{self, Malformed, Protocol};
use crate::packets::*;
use bytes::{Buf, Bytes, BytesMut};

type Result<T> = std::result::Result<T, DecodeError>;

/// Internal error for a property/value combination that the table makes impossible.
const UNEXPECTED_PROPERTY: DecodeError = Malformed("unexpected property value type");

/// The parsed fixed header.
#[derive(Debug, Clone, Copy)]
struct FixedHeader {
    first: u8,
    header_len: usize,
    remaining: usize,
}

/// Peek at the fixed header at the front of `buf` without consuming anything.
///
/// Returns the first byte and the total packet length (fixed header included), `Ok(None)` if
/// the fixed header is not complete yet, or an error for an invalid first byte (reserved packet
/// type 0, wrong reserved flag bits, PUBLISH QoS 3 or DUP with QoS 0) or a remaining length
/// longer than four bytes. Version-dependent checks (AUTH in 3.1.1) and the size limit are left
/// to [`decode`].
pub fn peek_fixed_header(buf: &[u8]) -> Result<Option<(u8, usize)>> {
    Ok(fixed_header(buf)?.map(|h| (h.first, h.header_len + h.remaining)))
}

fn fixed_header(buf: &[u8]) -> Result<Option<FixedHeader>> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    check_first_byte(first)?;
    let mut remaining = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some(FixedHeader {
                first,
                header_len: 2 + i,
                remaining,
            }));
        }
    }
    Err(Malformed("remaining length longer than four bytes"))
}

fn check_first_byte(first: u8) -> Result<()> {
    let flags = first & 0x0f;
    match first >> 4 {
        0 => Err(Malformed("reserved packet type 0")),
        3 => {
            let qos = (flags >> 1) & 3;
            if qos == 3 {
                Err(Malformed("PUBLISH with QoS 3"))
            } else if qos == 0 && flags & 0x08 != 0 {
                Err(Malformed("PUBLISH with DUP set and QoS 0"))
            } else {
                Ok(())
            }
        }
        // MQTT 3.1 lets a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE carry DUP (1010); 3.1.1 and
        // 5 do not ([`decode`] checks that with the version).
        6 | 8 | 10 if flags != 0b0010 && flags != 0b1010 => {
            Err(Malformed("reserved fixed header flags must be 0010"))
        }
        6 | 8 | 10 => Ok(()),
        _ if flags != 0 => Err(Malformed("reserved fixed header flags must be 0000")),
        _ => Ok(()),
    }
}

/// Decode one packet from the front of `buf`.
///
/// `Ok(None)`: incomplete, `buf` untouched. `Ok(Some(_))`: the packet's bytes were consumed.
/// CONNECT is decoded according to its own protocol level whatever `version` says; every other
/// packet according to `version`. `max_packet_size` limits the whole packet (fixed header
/// included) and is checked from the fixed header alone; 0 means no limit.
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<Packet>> {
    let Some(h) = fixed_header(buf)? else {
        return Ok(None);
    };
    let packet_type = h.first >> 4;
    if packet_type == 15 && !version.is_v5() {
        return Err(Malformed("AUTH packet in MQTT 3.1.1"));
    }
    if matches!(packet_type, 6 | 8 | 10)
        && h.first & 0x0f != 0b0010
        && version != ProtocolVersion::V31
    {
        return Err(Malformed("reserved fixed header flags must be 0010"));
    }
    let total = h.header_len + h.remaining;
    if max_packet_size != 0 && total > max_packet_size as usize {
        return Err(DecodeError::PacketTooLarge {
            size: total,
            max: max_packet_size,
        });
    }
    if buf.len() < total {
        return Ok(None);
    }
    let frame = buf.split_to(total).freeze();
    let mut r = Reader {
        data: &frame,
        pos: h.header_len,
        end: total,
    };
    let v5 = version.is_v5();
    let packet = match packet_type {
        1 => Packet::Connect(Box::new(connect(&mut r)?)),
        2 => Packet::ConnAck(connack(&mut r, v5)?),
        3 => {
            let mut publish = publish(&mut r, h.first, v5)?;
            // The payload is the rest of the frame: reuse the frame's own handle instead of
            // slicing it (saves a reference-count increment and decrement per PUBLISH).
            let start = r.pos;
            let mut payload = frame;
            payload.advance(start);
            publish.payload = payload;
            return Ok(Some(Packet::Publish(publish)));
        }
        4 => Packet::PubAck(pub_resp(&mut r, v5, codes::PUBACK)?),
        5 => Packet::PubRec(pub_resp(&mut r, v5, codes::PUBACK)?),
        6 => Packet::PubRel(pub_resp(&mut r, v5, codes::PUBREL)?),
        7 => Packet::PubComp(pub_resp(&mut r, v5, codes::PUBREL)?),
        8 => Packet::Subscribe(subscribe(&mut r, v5)?),
        9 => Packet::SubAck(suback(&mut r, v5)?),
        10 => Packet::Unsubscribe(unsubscribe(&mut r, v5)?),
        11 => Packet::UnsubAck(unsuback(&mut r, v5)?),
        12 => {
            r.finish()?;
            Packet::PingReq
        }
        13 => {
            r.finish()?;
            Packet::PingResp
        }
        14 => Packet::Disconnect(disconnect(&mut r, v5)?),
        _ => Packet::Auth(auth(&mut r)?),
    };
    Ok(Some(packet))
}

/// A cursor over one complete frame; every read is bounds-checked.
struct Reader<'a> {
    data: &'a Bytes,
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    fn finish(&self) -> Result<()> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(Malformed("trailing bytes after the packet content"))
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Malformed(what));
        }
        let data: &'a [u8] = self.data.as_ref();
        let s = data.get(self.pos..self.pos + n).ok_or(Malformed(what))?;
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1, "packet too short")?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2, "packet too short")?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4, "packet too short")?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn varint(&mut self) -> Result<u32> {
        let mut value = 0u32;
        for i in 0..4 {
            let b = self.take(1, "variable byte integer truncated")?[0];
            value |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Malformed("variable byte integer longer than four bytes"))
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes> {
        if n > self.remaining() {
            return Err(Malformed(what));
        }
        let b = self.data.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// Binary data: two-byte length, then the bytes (zero-copy).
    fn binary(&mut self) -> Result<Bytes> {
        let n = usize::from(self.u16()?);
        self.bytes(n, "binary data longer than the packet")
    }

    /// A UTF-8 encoded string, borrowed: valid UTF-8 and no U+0000 [MQTT-1.5.4-1/2].
    fn str(&mut self) -> Result<&'a str> {
        let n = usize::from(self.u16()?);
        let b = self.take(n, "string longer than the packet")?;
        let s = std::str::from_utf8(b).map_err(|_| Malformed("string is not valid UTF-8"))?;
        if b.contains(&0) {
            return Err(Malformed("string contains U+0000"));
        }
        Ok(s)
    }

    fn string(&mut self) -> Result<String> {
        self.str().map(str::to_owned)
    }

    fn rest_vec(&mut self) -> Vec<u8> {
        let data: &[u8] = self.data.as_ref();
        let v = data
            .get(self.pos..self.end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        self.pos = self.end;
        v
    }

    /// A reader over the next `n` bytes; `self` skips them.
    fn sub(&mut self, n: usize, what: &'static str) -> Result<Reader<'a>> {
        if n > self.remaining() {
            return Err(Malformed(what));
        }
        let sub = Reader {
            data: self.data,
            pos: self.pos,
            end: self.pos + n,
        };
        self.pos += n;
        Ok(sub)
    }

    fn packet_id(&mut self) -> Result<u16> {
        match self.u16()? {
            0 => Err(Protocol("packet identifier 0")),
            id => Ok(id),
        }
    }
}

/// A decoded property value.
enum Val {
    Byte(u8),
    U16(u16),
    U32(u32),
    Str(String),
    Bin(Bytes),
    Pair(String, String),
}

/// Parse a property block (length varint + properties) per `table`, handing each validated
/// property to `set`.
fn properties(
    r: &mut Reader<'_>,
    table: Table,
    mut set: impl FnMut(u8, Val) -> Result<()>,
) -> Result<()> {
    let len = r.varint()? as usize;
    let mut p = r.sub(len, "property length longer than the packet")?;
    let mut seen = 0u64;
    while !p.is_empty() {
        let raw_id = p.varint()?;
        let kind = props::kind(raw_id).ok_or(Malformed("unknown property identifier"))?;
        // kind() only knows identifiers below 0x2B.
        let id = raw_id as u8;
        let bit = 1u64 << id;
        if table.allowed & bit == 0 {
            return Err(Malformed(
                "property not allowed in this packet type (2.2.2.2)",
            ));
        }
        if seen & bit != 0 && table.repeatable & bit == 0 {
            return Err(Protocol("property included more than once"));
        }
        seen |= bit;
        let val = match kind {
            Kind::Byte => {
                let v = p.u8()?;
                if v > 1 {
                    return Err(Protocol(if id == props::MAXIMUM_QOS {
                        "Maximum QoS must be 0 or 1"
                    } else {
                        "byte property must be 0 or 1"
                    }));
                }
                Val::Byte(v)
            }
            Kind::U16 => {
                let v = p.u16()?;
                if v == 0 && id == props::RECEIVE_MAXIMUM {
                    return Err(Protocol("Receive Maximum 0"));
                }
                if v == 0 && id == props::TOPIC_ALIAS {
                    return Err(Protocol("Topic Alias 0"));
                }
                Val::U16(v)
            }
            Kind::U32 => {
                let v = p.u32()?;
                if v == 0 && id == props::MAXIMUM_PACKET_SIZE {
                    return Err(Protocol("Maximum Packet Size 0"));
                }
                Val::U32(v)
            }
            Kind::VarInt => {
                // Subscription Identifier, the only varint property: 1..=268,435,455.
                let v = p.varint()?;
                if v == 0 {
                    return Err(Protocol("Subscription Identifier 0"));
                }
                Val::U32(v)
            }
            Kind::Str => {
                let s = p.str()?;
                if id == props::RESPONSE_TOPIC && !crate::topic::valid_topic_name(s) {
                    return Err(Protocol("Response Topic is not a valid topic name"));
                }
                Val::Str(s.to_owned())
            }
            Kind::Bin => Val::Bin(p.binary()?),
            Kind::Pair => {
                let k = p.string()?;
                Val::Pair(k, p.string()?)
            }
        };
        set(id, val)?;
    }
    Ok(())
}

fn bool_of(v: u8) -> bool {
    v == 1
}

fn connect_properties(r: &mut Reader<'_>) -> Result<ConnectProperties> {
    use props::*;
    let mut p = ConnectProperties::default();
    properties(r, CONNECT, |id, v| {
        match (id, v) {
            (SESSION_EXPIRY_INTERVAL, Val::U32(x)) => p.session_expiry_interval = Some(x),
            (RECEIVE_MAXIMUM, Val::U16(x)) => p.receive_maximum = Some(x),
            (MAXIMUM_PACKET_SIZE, Val::U32(x)) => p.maximum_packet_size = Some(x),
            (TOPIC_ALIAS_MAXIMUM, Val::U16(x)) => p.topic_alias_maximum = Some(x),
            (REQUEST_RESPONSE_INFORMATION, Val::Byte(x)) => {
                p.request_response_information = Some(bool_of(x))
            }
            (REQUEST_PROBLEM_INFORMATION, Val::Byte(x)) => {
                p.request_problem_information = Some(bool_of(x))
            }
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            (AUTHENTICATION_METHOD, Val::Str(x)) => p.authentication_method = Some(x),
            (AUTHENTICATION_DATA, Val::Bin(x)) => p.authentication_data = Some(x),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return Err(Protocol(
            "Authentication Data without Authentication Method",
        ));
    }
    Ok(p)
}

fn will_properties(r: &mut Reader<'_>) -> Result<WillProperties> {
    use props::*;
    let mut p = WillProperties::default();
    properties(r, WILL, |id, v| {
        match (id, v) {
            (WILL_DELAY_INTERVAL, Val::U32(x)) => p.will_delay_interval = Some(x),
            (PAYLOAD_FORMAT_INDICATOR, Val::Byte(x)) => p.payload_format_indicator = Some(x),
            (MESSAGE_EXPIRY_INTERVAL, Val::U32(x)) => p.message_expiry_interval = Some(x),
            (CONTENT_TYPE, Val::Str(x)) => p.content_type = Some(x),
            (RESPONSE_TOPIC, Val::Str(x)) => p.response_topic = Some(x),
            (CORRELATION_DATA, Val::Bin(x)) => p.correlation_data = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn connack_properties(r: &mut Reader<'_>) -> Result<ConnAckProperties> {
    use props::*;
    let mut p = ConnAckProperties::default();
    properties(r, CONNACK, |id, v| {
        match (id, v) {
            (SESSION_EXPIRY_INTERVAL, Val::U32(x)) => p.session_expiry_interval = Some(x),
            (RECEIVE_MAXIMUM, Val::U16(x)) => p.receive_maximum = Some(x),
            (MAXIMUM_QOS, Val::Byte(x)) => p.maximum_qos = Some(x),
            (RETAIN_AVAILABLE, Val::Byte(x)) => p.retain_available = Some(bool_of(x)),
            (MAXIMUM_PACKET_SIZE, Val::U32(x)) => p.maximum_packet_size = Some(x),
            (ASSIGNED_CLIENT_IDENTIFIER, Val::Str(x)) => p.assigned_client_identifier = Some(x),
            (TOPIC_ALIAS_MAXIMUM, Val::U16(x)) => p.topic_alias_maximum = Some(x),
            (REASON_STRING, Val::Str(x)) => p.reason_string = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            (WILDCARD_SUBSCRIPTION_AVAILABLE, Val::Byte(x)) => {
                p.wildcard_subscription_available = Some(bool_of(x))
            }
            (SUBSCRIPTION_IDENTIFIER_AVAILABLE, Val::Byte(x)) => {
                p.subscription_identifiers_available = Some(bool_of(x))
            }
            (SHARED_SUBSCRIPTION_AVAILABLE, Val::Byte(x)) => {
                p.shared_subscription_available = Some(bool_of(x))
            }
            (SERVER_KEEP_ALIVE, Val::U16(x)) => p.server_keep_alive = Some(x),
            (RESPONSE_INFORMATION, Val::Str(x)) => p.response_information = Some(x),
            (SERVER_REFERENCE, Val::Str(x)) => p.server_reference = Some(x),
            (AUTHENTICATION_METHOD, Val::Str(x)) => p.authentication_method = Some(x),
            (AUTHENTICATION_DATA, Val::Bin(x)) => p.authentication_data = Some(x),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn publish_properties(r: &mut Reader<'_>) -> Result<PublishProperties> {
    use props::*;
    let mut p = PublishProperties::default();
    properties(r, PUBLISH, |id, v| {
        match (id, v) {
            (PAYLOAD_FORMAT_INDICATOR, Val::Byte(x)) => p.payload_format_indicator = Some(x),
            (MESSAGE_EXPIRY_INTERVAL, Val::U32(x)) => p.message_expiry_interval = Some(x),
            (TOPIC_ALIAS, Val::U16(x)) => p.topic_alias = Some(x),
            (RESPONSE_TOPIC, Val::Str(x)) => p.response_topic = Some(x),
            (CORRELATION_DATA, Val::Bin(x)) => p.correlation_data = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            (SUBSCRIPTION_IDENTIFIER, Val::U32(x)) => p.subscription_identifiers.push(x),
            (CONTENT_TYPE, Val::Str(x)) => p.content_type = Some(x),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn ack_properties(r: &mut Reader<'_>) -> Result<AckProperties> {
    use props::*;
    let mut p = AckProperties::default();
    properties(r, ACK, |id, v| {
        match (id, v) {
            (REASON_STRING, Val::Str(x)) => p.reason_string = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn subscribe_properties(r: &mut Reader<'_>) -> Result<SubscribeProperties> {
    use props::*;
    let mut p = SubscribeProperties::default();
    properties(r, SUBSCRIBE, |id, v| {
        match (id, v) {
            (SUBSCRIPTION_IDENTIFIER, Val::U32(x)) => p.subscription_identifier = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn user_properties(r: &mut Reader<'_>) -> Result<UserProperties> {
    let mut p = UserProperties::new();
    properties(r, props::UNSUBSCRIBE, |id, v| {
        match (id, v) {
            (props::USER_PROPERTY, Val::Pair(k, v)) => p.push((k, v)),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn disconnect_properties(r: &mut Reader<'_>) -> Result<DisconnectProperties> {
    use props::*;
    let mut p = DisconnectProperties::default();
    properties(r, DISCONNECT, |id, v| {
        match (id, v) {
            (SESSION_EXPIRY_INTERVAL, Val::U32(x)) => p.session_expiry_interval = Some(x),
            (REASON_STRING, Val::Str(x)) => p.reason_string = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            (SERVER_REFERENCE, Val::Str(x)) => p.server_reference = Some(x),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn auth_properties(r: &mut Reader<'_>) -> Result<AuthProperties> {
    use props::*;
    let mut p = AuthProperties::default();
    properties(r, AUTH, |id, v| {
        match (id, v) {
            (AUTHENTICATION_METHOD, Val::Str(x)) => p.authentication_method = Some(x),
            (AUTHENTICATION_DATA, Val::Bin(x)) => p.authentication_data = Some(x),
            (REASON_STRING, Val::Str(x)) => p.reason_string = Some(x),
            (USER_PROPERTY, Val::Pair(k, v)) => p.user_properties.push((k, v)),
            _ => return Err(UNEXPECTED_PROPERTY),
        }
        Ok(())
    })?;
    Ok(p)
}

fn reason_code(r: &mut Reader<'_>, allowed: &[u8]) -> Result<u8> {
    let code = r.u8()?;
    if allowed.contains(&code) {
        Ok(code)
    } else {
        Err(Protocol("reason code not allowed in this packet"))
    }
}

/// A topic name in PUBLISH or the will: no wildcards; empty only where `allow_empty`.
fn topic_name(r: &mut Reader<'_>, allow_empty: bool) -> Result<String> {
    let t = r.str()?;
    if t.is_empty() {
        if !allow_empty {
            return Err(DecodeError::InvalidTopic("empty topic name"));
        }
    } else if t.bytes().any(|b| b == b'+' || b == b'#') {
        return Err(DecodeError::InvalidTopic("wildcard in topic name"));
    }
    Ok(t.to_owned())
}

fn connect(r: &mut Reader<'_>) -> Result<Connect> {
    let name = {
        let n = usize::from(r.u16()?);
        r.take(n, "protocol name longer than the packet")?
    };
    let level = r.u8()?;
    let protocol = match (name, level) {
        (b"MQTT", 4) => ProtocolVersion::V311,
        (b"MQTT", 5) => ProtocolVersion::V5,
        (b"MQIsdp", 3) => ProtocolVersion::V31,
        (b"MQTT", l) | (b"MQIsdp", l) => return Err(DecodeError::UnsupportedProtocolVersion(l)),
        _ => return Err(Malformed("unknown protocol name")),
    };
    let v5 = protocol.is_v5();
    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(Malformed("CONNECT reserved flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(Malformed("will QoS or retain set without the will flag"));
    }
    let will_qos = QoS::from_u8(will_qos).ok_or(Malformed("will QoS 3"))?;
    if !v5 && password_flag && !username_flag {
        return Err(Malformed("password flag without user name flag"));
    }
    let keep_alive = r.u16()?;
    let properties = if v5 {
        connect_properties(r)?
    } else {
        ConnectProperties::default()
    };
    let client_id = r.string()?;
    let will = if will_flag {
        let properties = if v5 {
            will_properties(r)?
        } else {
            WillProperties::default()
        };
        let topic = topic_name(r, false)?;
        let payload = r.binary()?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    let username = if username_flag {
        Some(r.string()?)
    } else {
        None
    };
    let password = if password_flag {
        Some(r.binary()?)
    } else {
        None
    };
    r.finish()?;
    Ok(Connect {
        protocol,
        clean_start,
        keep_alive,
        client_id,
        will,
        username,
        password,
        properties,
    })
}

/// MQTT 3.1.1 CONNACK return code -> the MQTT 5 reason code the packet types carry.
fn connack_from_v311(code: u8) -> Result<u8> {
    use crate::reason::*;
    Ok(match code {
        v311::ACCEPTED => SUCCESS,
        v311::UNACCEPTABLE_PROTOCOL_VERSION => UNSUPPORTED_PROTOCOL_VERSION,
        v311::IDENTIFIER_REJECTED => CLIENT_IDENTIFIER_NOT_VALID,
        v311::SERVER_UNAVAILABLE => SERVER_UNAVAILABLE,
        v311::BAD_USER_NAME_OR_PASSWORD => BAD_USER_NAME_OR_PASSWORD,
        v311::NOT_AUTHORIZED => NOT_AUTHORIZED,
        _ => return Err(Protocol("reserved CONNACK return code")),
    })
}

fn connack(r: &mut Reader<'_>, v5: bool) -> Result<ConnAck> {
    let flags = r.u8()?;
    if flags & 0xfe != 0 {
        return Err(Malformed("CONNACK reserved flags set"));
    }
    let session_present = flags & 0x01 != 0;
    let reason_code = if v5 {
        reason_code(r, codes::CONNACK)?
    } else {
        connack_from_v311(r.u8()?)?
    };
    if session_present && reason_code != 0 {
        return Err(Protocol("session present with a non-zero CONNACK code"));
    }
    let properties = if v5 {
        connack_properties(r)?
    } else {
        ConnAckProperties::default()
    };
    r.finish()?;
    Ok(ConnAck {
        session_present,
        reason_code,
        properties,
    })
}

fn publish(r: &mut Reader<'_>, first: u8, v5: bool) -> Result<Publish> {
    // The fixed header check already rejected QoS 3.
    let qos = QoS::from_u8((first >> 1) & 0x03).ok_or(Malformed("PUBLISH with QoS 3"))?;
    let topic = topic_name(r, v5)?;
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        r.packet_id()?
    };
    let properties = if v5 {
        publish_properties(r)?
    } else {
        PublishProperties::default()
    };
    Ok(Publish {
        dup: first & 0x08 != 0,
        qos,
        retain: first & 0x01 != 0,
        topic,
        packet_id,
        properties,
        // Filled in by `decode` with the rest of the frame.
        payload: Bytes::new(),
    })
}

fn pub_resp(r: &mut Reader<'_>, v5: bool, allowed: &[u8]) -> Result<PubResp> {
    let packet_id = r.packet_id()?;
    if !v5 {
        r.finish()?;
        return Ok(PubResp::new(packet_id, 0));
    }
    let reason_code = if r.is_empty() {
        0
    } else {
        reason_code(r, allowed)?
    };
    let properties = if r.is_empty() {
        AckProperties::default()
    } else {
        ack_properties(r)?
    };
    r.finish()?;
    Ok(PubResp {
        packet_id,
        reason_code,
        properties,
    })
}

fn subscribe(r: &mut Reader<'_>, v5: bool) -> Result<Subscribe> {
    let packet_id = r.packet_id()?;
    let properties = if v5 {
        subscribe_properties(r)?
    } else {
        SubscribeProperties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        let o = r.u8()?;
        if o & if v5 { 0xc0 } else { 0xfc } != 0 {
            return Err(Malformed("subscription options reserved bits set"));
        }
        // QoS 3: malformed in 3.1.1 [MQTT-3-8.3-4], a protocol error in MQTT 5 (3.8.3.1).
        let qos = QoS::from_u8(o & 0x03).ok_or(if v5 {
            Protocol("subscription with QoS 3")
        } else {
            Malformed("subscription with QoS 3")
        })?;
        let retain_handling = (o >> 4) & 0x03;
        if retain_handling == 3 {
            return Err(Protocol("retain handling 3"));
        }
        let options = SubscriptionOptions {
            qos,
            no_local: o & 0x04 != 0,
            retain_as_published: o & 0x08 != 0,
            retain_handling,
        };
        filters.push(SubscribeFilter { filter, options });
    }
    if filters.is_empty() {
        return Err(Protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

fn suback(r: &mut Reader<'_>, v5: bool) -> Result<SubAck> {
    let packet_id = r.packet_id()?;
    let properties = if v5 {
        ack_properties(r)?
    } else {
        AckProperties::default()
    };
    let reason_codes = r.rest_vec();
    if reason_codes.is_empty() {
        return Err(Protocol("SUBACK without reason codes"));
    }
    let allowed = if v5 {
        codes::SUBACK
    } else {
        codes::SUBACK_V311
    };
    if reason_codes.iter().any(|c| !allowed.contains(c)) {
        return Err(Protocol("reason code not allowed in SUBACK"));
    }
    Ok(SubAck {
        packet_id,
        reason_codes,
        properties,
    })
}

fn unsubscribe(r: &mut Reader<'_>, v5: bool) -> Result<Unsubscribe> {
    let packet_id = r.packet_id()?;
    let user_properties = if v5 {
        user_properties(r)?
    } else {
        UserProperties::new()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(Protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe {
        packet_id,
        filters,
        user_properties,
    })
}

fn unsuback(r: &mut Reader<'_>, v5: bool) -> Result<UnsubAck> {
    let packet_id = r.packet_id()?;
    if !v5 {
        r.finish()?;
        return Ok(UnsubAck {
            packet_id,
            ..UnsubAck::default()
        });
    }
    let properties = ack_properties(r)?;
    let reason_codes = r.rest_vec();
    if reason_codes.is_empty() {
        return Err(Protocol("UNSUBACK without reason codes"));
    }
    if reason_codes.iter().any(|c| !codes::UNSUBACK.contains(c)) {
        return Err(Protocol("reason code not allowed in UNSUBACK"));
    }
    Ok(UnsubAck {
        packet_id,
        reason_codes,
        properties,
    })
}

fn disconnect(r: &mut Reader<'_>, v5: bool) -> Result<Disconnect> {
    if !v5 {
        r.finish()?;
        return Ok(Disconnect::new(0));
    }
    // Remaining length 0: reason 0x00; below 2: no properties (3.14.2.1, 3.14.2.2.1).
    let reason_code = if r.is_empty() {
        0
    } else {
        reason_code(r, codes::DISCONNECT)?
    };
    let properties = if r.is_empty() {
        DisconnectProperties::default()
    } else {
        disconnect_properties(r)?
    };
    r.finish()?;
    Ok(Disconnect {
        reason_code,
        properties,
    })
}

fn auth(r: &mut Reader<'_>) -> Result<Auth> {
    // Remaining length 0: reason 0x00 and no properties (3.15.2.1); otherwise both present.
    if r.is_empty() {
        return Ok(Auth::default());
    }
    let reason_code = reason_code(r, codes::AUTH)?;
    let properties = auth_properties(r)?;
    r.finish()?;
    Ok(Auth {
        reason_code,
        properties,
    })
}
