//! A tiny, self-contained MQTT 3.1.1 / 5 encoder and frame parser.
//!
//! Only what the load generator needs: CONNECT, SUBSCRIBE, PUBLISH and the
//! QoS 1/2 acknowledgements, PINGREQ and DISCONNECT, all without properties
//! on the way out (but a SUBSCRIBE's user property). Incoming v5 properties
//! are checked and skipped, except the CONNACK Receive Maximum, which bounds
//! the publisher's inflight window, and a PUBLISH's user properties, which
//! [`parse_with`] hands out with the rest of the PUBLISH ([`Publish`]).

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, BytesMut};

pub const CONNECT: u8 = 1;
pub const CONNACK: u8 = 2;
pub const PUBLISH: u8 = 3;
pub const PUBACK: u8 = 4;
pub const PUBREC: u8 = 5;
pub const PUBREL: u8 = 6;
pub const PUBCOMP: u8 = 7;
pub const SUBSCRIBE: u8 = 8;
pub const SUBACK: u8 = 9;
pub const PINGREQ: u8 = 12;
pub const PINGRESP: u8 = 13;
pub const DISCONNECT: u8 = 14;

/// Protocol level as sent in CONNECT: 4 = MQTT 3.1.1, 5 = MQTT 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V311,
    V5,
}

impl Version {
    pub fn is_v5(self) -> bool {
        self == Version::V5
    }
}

pub fn put_varint(buf: &mut BytesMut, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        buf.put_u8(b);
        if n == 0 {
            break;
        }
    }
}

#[cfg(test)]
fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

fn put_str(buf: &mut BytesMut, s: &[u8]) {
    buf.put_u16(s.len() as u16);
    buf.put_slice(s);
}

/// CONNECT with clean start, no will, no credentials, no properties.
pub fn connect(buf: &mut BytesMut, v: Version, client_id: &str, keepalive: u16) {
    connect_with_expiry(buf, v, client_id, keepalive, 0);
}

/// CONNECT with clean start and a Session Expiry Interval (MQTT 5; for 3.1.1 a non-zero
/// expiry means clean session 0), no will, no credentials.
pub fn connect_with_expiry(
    buf: &mut BytesMut,
    v: Version,
    client_id: &str,
    keepalive: u16,
    expiry_s: u32,
) {
    connect_session(buf, v, client_id, keepalive, expiry_s, true);
}

/// CONNECT with a Session Expiry Interval; `clean_start` false resumes the session (MQTT 5;
/// for 3.1.1 clean session is 0 whenever `expiry_s` > 0).
pub fn connect_session(
    buf: &mut BytesMut,
    v: Version,
    client_id: &str,
    keepalive: u16,
    expiry_s: u32,
    clean_start: bool,
) {
    let props = match (v.is_v5(), expiry_s) {
        (false, _) => 0,
        (true, 0) => 1,
        (true, _) => 6,
    };
    let rl = 6 + 1 + 1 + 2 + props + 2 + client_id.len();
    buf.put_u8(CONNECT << 4);
    put_varint(buf, rl);
    put_str(buf, b"MQTT");
    buf.put_u8(if v.is_v5() { 5 } else { 4 });
    // Clean start; 3.1.1 has no expiry: a persistent session is clean session 0.
    let clean = if (!v.is_v5() && expiry_s > 0) || !clean_start {
        0
    } else {
        0x02
    };
    buf.put_u8(clean);
    buf.put_u16(keepalive);
    if v.is_v5() {
        if expiry_s == 0 {
            buf.put_u8(0);
        } else {
            buf.put_u8(5);
            buf.put_u8(0x11); // Session Expiry Interval
            buf.put_u32(expiry_s);
        }
    }
    put_str(buf, client_id.as_bytes());
}

pub fn subscribe(buf: &mut BytesMut, v: Version, pid: u16, filter: &str, qos: u8) {
    let props = usize::from(v.is_v5());
    let rl = 2 + props + 2 + filter.len() + 1;
    buf.put_u8((SUBSCRIBE << 4) | 0x02);
    put_varint(buf, rl);
    buf.put_u16(pid);
    if v.is_v5() {
        buf.put_u8(0);
    }
    put_str(buf, filter.as_bytes());
    buf.put_u8(qos & 0x03);
}

/// SUBSCRIBE (v5) with an optional user property.
pub fn subscribe_v5(
    buf: &mut BytesMut,
    pid: u16,
    filter: &str,
    qos: u8,
    prop: Option<(&str, &str)>,
) {
    let props_len = prop.map_or(0, |(k, v)| 1 + 2 + k.len() + 2 + v.len());
    let mut props_hdr = BytesMut::new();
    put_varint(&mut props_hdr, props_len);
    let rl = 2 + props_hdr.len() + props_len + 2 + filter.len() + 1;
    buf.put_u8((SUBSCRIBE << 4) | 0x02);
    put_varint(buf, rl);
    buf.put_u16(pid);
    buf.put_slice(&props_hdr);
    if let Some((k, v)) = prop {
        buf.put_u8(0x26);
        for s in [k, v] {
            buf.put_u16(s.len() as u16);
            buf.put_slice(s.as_bytes());
        }
    }
    buf.put_u16(filter.len() as u16);
    buf.put_slice(filter.as_bytes());
    buf.put_u8(qos & 0x03);
}

/// A 4-byte acknowledgement (PUBACK, PUBREC, PUBREL, PUBCOMP) with success
/// reason (the v5 short form omits the reason code).
pub fn ack(buf: &mut BytesMut, kind: u8, pid: u16) {
    let flags = if kind == PUBREL { 0x02 } else { 0 };
    buf.put_u8((kind << 4) | flags);
    buf.put_u8(2);
    buf.put_u16(pid);
}

pub fn pingreq(buf: &mut BytesMut) {
    buf.put_slice(&[PINGREQ << 4, 0]);
}

pub fn disconnect(buf: &mut BytesMut) {
    buf.put_slice(&[DISCONNECT << 4, 0]);
}

/// Payload bytes of the stamp every bench PUBLISH starts with: the send time
/// in nanoseconds since the run's base instant and a tag (u64 BE each).
pub const STAMP_LEN: usize = 16;

/// Append the start of a PUBLISH without properties: fixed header, topic,
/// packet id (QoS > 0) and, for MQTT 5, the empty property block;
/// `payload_len` payload bytes must follow.
fn put_publish_head(
    buf: &mut BytesMut,
    v: Version,
    qos: u8,
    topic: &[u8],
    pid: u16,
    payload_len: usize,
) {
    let pid_len = if qos > 0 { 2 } else { 0 };
    let rl = 2 + topic.len() + pid_len + usize::from(v.is_v5()) + payload_len;
    buf.put_u8((PUBLISH << 4) | ((qos & 0x03) << 1));
    put_varint(buf, rl);
    put_str(buf, topic);
    if qos > 0 {
        buf.put_u16(pid);
    }
    if v.is_v5() {
        buf.put_u8(0);
    }
}

/// A pre-encoded PUBLISH frame; per message only the packet id and the
/// stamp (the first [`STAMP_LEN`] payload bytes) are patched. The payload
/// after the stamp is filler; [`PublishTemplate::write_to`] sends the same
/// PUBLISH to another topic.
#[derive(Clone, Debug)]
pub struct PublishTemplate {
    frame: Vec<u8>,
    version: Version,
    qos: u8,
    pid_at: Option<usize>,
    payload_at: usize,
}

impl PublishTemplate {
    pub fn new(v: Version, topic: &str, qos: u8, payload_len: usize) -> Self {
        let qos = qos & 0x03;
        let mut b = BytesMut::new();
        put_publish_head(&mut b, v, qos, topic.as_bytes(), 0, payload_len);
        let payload_at = b.len();
        // The packet id is just before the (v5) property block.
        let pid_at = if qos > 0 {
            Some(payload_at - usize::from(v.is_v5()) - 2)
        } else {
            None
        };
        b.reserve(payload_len);
        // Recognisable filler after the stamp.
        b.extend((0..payload_len).map(|i| b'a' + (i % 26) as u8));
        PublishTemplate {
            frame: b.to_vec(),
            version: v,
            qos,
            pid_at,
            payload_at,
        }
    }

    pub fn frame_len(&self) -> usize {
        self.frame.len()
    }

    /// Append one PUBLISH: `ts` = send time in nanoseconds since the run's
    /// base instant, `tag` = publisher id << 32 | sequence (low bits).
    pub fn write(&self, buf: &mut BytesMut, pid: u16, ts: u64, tag: u64) {
        let start = buf.len();
        buf.extend_from_slice(&self.frame);
        let f = &mut buf[start..];
        if let Some(at) = self.pid_at {
            f[at..at + 2].copy_from_slice(&pid.to_be_bytes());
        }
        let p = self.payload_at;
        f[p..p + 8].copy_from_slice(&ts.to_be_bytes());
        f[p + 8..p + 16].copy_from_slice(&tag.to_be_bytes());
    }

    /// Append the template's PUBLISH (version, QoS, payload length) to `topic`
    /// instead of its own: packet id `pid`, payload = the stamp (`ts`, `tag`),
    /// then `extra`, then the rest of the filler (the payload grows when the
    /// template's is shorter than the stamp and `extra`).
    pub fn write_to(
        &self,
        buf: &mut BytesMut,
        topic: &str,
        pid: u16,
        ts: u64,
        tag: u64,
        extra: &[u8],
    ) {
        let filler = self
            .frame
            .get(self.payload_at + STAMP_LEN + extra.len()..)
            .unwrap_or_default();
        let payload_len = STAMP_LEN + extra.len() + filler.len();
        put_publish_head(
            buf,
            self.version,
            self.qos,
            topic.as_bytes(),
            pid,
            payload_len,
        );
        buf.put_u64(ts);
        buf.put_u64(tag);
        buf.put_slice(extra);
        buf.put_slice(filler);
    }
}

/// The u64 (big endian) at `at` in `b`, if `b` is that long.
pub fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
}

/// A PUBLISH as read, borrowing the receive buffer (see [`parse_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publish<'a> {
    pub qos: u8,
    pub dup: bool,
    pub pid: u16,
    pub topic: &'a [u8],
    /// The part of the (checked) v5 property block from its first user
    /// property to the end of its last; empty when there is none.
    user_props: &'a [u8],
    pub payload: &'a [u8],
}

impl<'a> Publish<'a> {
    /// Decode the body (after the fixed header) of a PUBLISH; the v5
    /// properties are checked.
    fn decode(header: u8, body: &'a [u8], v: Version) -> anyhow::Result<Self> {
        let qos = (header >> 1) & 0x03;
        let tlen = usize::from(u16_at(body, 0).context("short PUBLISH")?);
        let topic = body.get(2..2 + tlen).context("short PUBLISH")?;
        let mut at = 2 + tlen;
        let mut pid = 0;
        if qos > 0 {
            pid = u16_at(body, at).context("short PUBLISH")?;
            at += 2;
        }
        let mut user_props: &[u8] = &[];
        if v.is_v5() {
            if body.len() <= at {
                bail!("short PUBLISH");
            }
            let (props, used) = prop_block(&body[at..])?;
            user_props = check_props(props)?;
            at += used;
        }
        Ok(Publish {
            qos,
            dup: header & 0x08 != 0,
            pid,
            topic,
            user_props,
            payload: body.get(at..).unwrap_or_default(),
        })
    }

    /// The send time of the stamp (first 8 payload bytes), if the payload is that long.
    pub fn ts(&self) -> Option<u64> {
        be_u64(self.payload, 0)
    }

    /// The tag of the stamp (payload bytes 8..16), if the payload is that long.
    pub fn tag(&self) -> Option<u64> {
        be_u64(self.payload, 8)
    }

    /// The user properties (name, value), in order.
    pub fn user_properties(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        Props(self.user_props)
            .filter(|&(id, _)| id == USER_PROPERTY)
            .filter_map(|(_, v)| {
                let k = usize::from(u16_at(v, 0)?);
                Some((v.get(2..2 + k)?, v.get(4 + k..)?))
            })
    }
}

/// One parsed frame, borrowing nothing (a caller that needs more of a
/// PUBLISH reads it in [`parse_with`]'s `inspect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    ConnAck {
        reason: u8,
        receive_max: Option<u16>,
    },
    Publish {
        qos: u8,
        pid: u16,
        /// The stamp's send time when the payload is that long.
        ts: Option<u64>,
    },
    /// PUBACK / PUBREC / PUBREL / PUBCOMP
    Ack {
        kind: u8,
        pid: u16,
        reason: u8,
    },
    SubAck {
        pid: u16,
        worst_reason: u8,
    },
    PingResp,
    Disconnect {
        reason: u8,
    },
    Other(u8),
}

/// Decode a variable byte integer at the start of `b`: (value, bytes used),
/// `Ok(None)` when incomplete.
fn get_varint(b: &[u8]) -> anyhow::Result<Option<(usize, usize)>> {
    let mut n = 0usize;
    let mut mul = 1usize;
    for (i, &byte) in b.iter().enumerate().take(4) {
        n += usize::from(byte & 0x7f) * mul;
        if byte & 0x80 == 0 {
            return Ok(Some((n, i + 1)));
        }
        mul *= 128;
    }
    if b.len() >= 4 {
        bail!("malformed remaining length");
    }
    Ok(None)
}

const USER_PROPERTY: u8 = 0x26;
const RECEIVE_MAXIMUM: u8 = 0x21;

/// The u16 (big endian) at `at` in `b`, if `b` is that long.
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|x| u16::from_be_bytes([x[0], x[1]]))
}

/// The v5 property block at the start of `b`: (its properties without the
/// length, bytes used in all).
fn prop_block(b: &[u8]) -> anyhow::Result<(&[u8], usize)> {
    let (len, used) = get_varint(b)?.context("truncated property length")?;
    let end = used + len;
    let props = b.get(used..end).context("truncated properties")?;
    Ok((props, end))
}

/// A malformed property.
#[derive(Debug)]
enum BadProperty {
    Unknown(u8),
    Truncated,
}

/// The first property of `p`: (id, value bytes, rest).
#[inline]
fn next_prop(p: &[u8]) -> Result<(u8, &[u8], &[u8]), BadProperty> {
    // Every property id is below 0x80: a one-byte variable byte integer.
    let (&id, p) = p.split_first().ok_or(BadProperty::Truncated)?;
    let str_len = |at: usize| u16_at(p, at).map(usize::from).ok_or(BadProperty::Truncated);
    let need = match id {
        0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => 1,
        0x13 | 0x21 | 0x22 | 0x23 => 2,
        0x02 | 0x11 | 0x18 | 0x27 => 4,
        0x0B => match get_varint(p) {
            Ok(Some((_, used))) => used,
            _ => return Err(BadProperty::Truncated),
        },
        0x03 | 0x08 | 0x09 | 0x12 | 0x15 | 0x16 | 0x1A | 0x1C | 0x1F => 2 + str_len(0)?,
        USER_PROPERTY => {
            let k = 2 + str_len(0)?;
            k + 2 + str_len(k)?
        }
        other => return Err(BadProperty::Unknown(other)),
    };
    match (p.get(..need), p.get(need..)) {
        (Some(value), Some(rest)) => Ok((id, value, rest)),
        _ => Err(BadProperty::Truncated),
    }
}

/// Check every property of a property block (without its length); the
/// part from its first user property to the end of its last (empty when
/// there is none).
fn check_props(props: &[u8]) -> anyhow::Result<&[u8]> {
    let (mut first, mut end) = (None, 0);
    let mut p = props;
    while !p.is_empty() {
        let (id, _, rest) = next_prop(p).map_err(|e| match e {
            BadProperty::Unknown(id) => anyhow::anyhow!("unknown property id {id:#x}"),
            BadProperty::Truncated => anyhow::anyhow!("truncated property"),
        })?;
        if id == USER_PROPERTY {
            first.get_or_insert(props.len() - p.len());
            end = props.len() - rest.len();
        }
        p = rest;
    }
    Ok(first.map_or(&[][..], |f| &props[f..end]))
}

/// The properties of a checked property block: (id, value bytes).
struct Props<'a>(&'a [u8]);

impl<'a> Iterator for Props<'a> {
    type Item = (u8, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (id, value, rest) = next_prop(self.0).ok()?;
        self.0 = rest;
        Some((id, value))
    }
}

/// Skip a v5 property block at the start of `b`, returning the bytes used
/// and the Receive Maximum if present.
fn skip_props(b: &[u8]) -> anyhow::Result<(usize, Option<u16>)> {
    let (props, used) = prop_block(b)?;
    check_props(props)?;
    let receive_max = Props(props)
        .filter(|&(id, _)| id == RECEIVE_MAXIMUM)
        .filter_map(|(_, value)| u16_at(value, 0))
        .last();
    Ok((used, receive_max))
}

/// Parse one complete frame from the front of `buf` and advance past it;
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &mut BytesMut, v: Version) -> anyhow::Result<Option<Frame>> {
    parse_with(buf, v, |_| {})
}

/// [`parse`], handing a PUBLISH to `inspect` before the buffer advances past
/// it: the way to read its topic, user properties or payload.
pub fn parse_with(
    buf: &mut BytesMut,
    v: Version,
    inspect: impl FnOnce(&Publish<'_>),
) -> anyhow::Result<Option<Frame>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let Some((rl, used)) = get_varint(&buf[1..])? else {
        return Ok(None);
    };
    let total = 1 + used + rl;
    if buf.len() < total {
        return Ok(None);
    }
    let header = buf[0];
    let body = &buf[1 + used..total];
    let kind = header >> 4;
    let frame = match kind {
        PUBLISH => {
            let p = Publish::decode(header, body, v)?;
            inspect(&p);
            Frame::Publish {
                qos: p.qos,
                pid: p.pid,
                ts: p.ts(),
            }
        }
        PUBACK | PUBREC | PUBREL | PUBCOMP => {
            if body.len() < 2 {
                bail!("short ack");
            }
            let pid = u16::from_be_bytes([body[0], body[1]]);
            let reason = body.get(2).copied().unwrap_or(0);
            Frame::Ack { kind, pid, reason }
        }
        CONNACK => {
            if body.len() < 2 {
                bail!("short CONNACK");
            }
            let reason = body[1];
            let receive_max = if v.is_v5() && body.len() > 2 {
                skip_props(&body[2..])?.1
            } else {
                None
            };
            Frame::ConnAck {
                reason,
                receive_max,
            }
        }
        SUBACK => {
            if body.len() < 3 {
                bail!("short SUBACK");
            }
            let pid = u16::from_be_bytes([body[0], body[1]]);
            let mut at = 2;
            if v.is_v5() {
                at += skip_props(&body[2..])?.0;
            }
            let worst_reason = body
                .get(at..)
                .unwrap_or_default()
                .iter()
                .copied()
                .max()
                .unwrap_or(0x80);
            Frame::SubAck { pid, worst_reason }
        }
        PINGRESP => Frame::PingResp,
        DISCONNECT => Frame::Disconnect {
            reason: body.first().copied().unwrap_or(0),
        },
        other => Frame::Other(other),
    };
    buf.advance(total);
    Ok(Some(frame))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn varint_roundtrip() {
        for n in [
            0usize,
            1,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            268_435_455,
        ] {
            let mut b = BytesMut::new();
            put_varint(&mut b, n);
            assert_eq!(b.len(), varint_len(n));
            assert_eq!(get_varint(&b).unwrap(), Some((n, b.len())));
        }
    }

    #[test]
    fn publish_roundtrip_both_versions() {
        for v in [Version::V311, Version::V5] {
            for qos in 0..=2 {
                let t = PublishTemplate::new(v, "bench/t", qos, 200);
                let mut b = BytesMut::new();
                t.write(&mut b, 7, 123_456_789, 42);
                t.write(&mut b, 8, 5, 43);
                assert_eq!(b.len(), 2 * t.frame_len());
                let f = parse(&mut b, v).unwrap().unwrap();
                let pid = if qos > 0 { 7 } else { 0 };
                assert_eq!(
                    f,
                    Frame::Publish {
                        qos,
                        pid,
                        ts: Some(123_456_789)
                    }
                );
                assert!(matches!(
                    parse(&mut b, v).unwrap(),
                    Some(Frame::Publish { ts: Some(5), .. })
                ));
                assert!(b.is_empty());
            }
        }
    }

    #[test]
    fn partial_frames_wait() {
        let t = PublishTemplate::new(Version::V5, "a", 1, 16);
        let mut full = BytesMut::new();
        t.write(&mut full, 1, 9, 0);
        for cut in 0..full.len() {
            let mut part = BytesMut::from(&full[..cut]);
            assert_eq!(parse(&mut part, Version::V5).unwrap(), None);
        }
    }

    #[test]
    fn connack_v5_receive_max() {
        // CONNACK, flags 0, reason 0, props: receive max 20, topic alias max 10
        let mut b = BytesMut::from(&[0x20, 9, 0, 0, 6, 0x21, 0, 20, 0x22, 0, 10][..]);
        assert_eq!(
            parse(&mut b, Version::V5).unwrap(),
            Some(Frame::ConnAck {
                reason: 0,
                receive_max: Some(20)
            })
        );
    }

    #[test]
    fn large_payload_length() {
        let t = PublishTemplate::new(Version::V311, "x/y", 0, 70_000);
        let mut b = BytesMut::new();
        t.write(&mut b, 0, 1, 2);
        assert!(matches!(
            parse(&mut b, Version::V311).unwrap(),
            Some(Frame::Publish { ts: Some(1), .. })
        ));
    }

    #[test]
    fn subscribe_frame_with_property() {
        let mut b = BytesMut::new();
        subscribe_v5(
            &mut b,
            1,
            "$share/g/agents/+/#",
            1,
            Some(("lane-offset", "latest")),
        );
        let (rl, used) = get_varint(&b[1..]).unwrap().unwrap();
        assert_eq!(b.len(), 1 + used + rl);
        assert_eq!(b[0], 0x82);
    }

    /// Parse one PUBLISH, returning what `inspect` saw: (dup, topic, user properties, payload).
    #[allow(clippy::type_complexity)]
    fn inspect(
        b: &mut BytesMut,
        v: Version,
    ) -> (Frame, bool, Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>) {
        let mut seen = None;
        let f = parse_with(b, v, |p| {
            let props = p
                .user_properties()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            seen = Some((p.dup, p.topic.to_vec(), props, p.payload.to_vec()));
        })
        .unwrap()
        .unwrap();
        let (dup, topic, props, payload) = seen.unwrap();
        (f, dup, topic, props, payload)
    }

    #[test]
    fn write_to_another_topic() {
        for v in [Version::V311, Version::V5] {
            for qos in 0..=2 {
                let t = PublishTemplate::new(v, "x", qos, 30);
                let mut b = BytesMut::new();
                t.write_to(&mut b, "a/longer/topic", 7, 11, 12, b"nonce-08");
                t.write(&mut b, 8, 13, 14);
                let (f, dup, topic, props, payload) = inspect(&mut b, v);
                let pid = if qos > 0 { 7 } else { 0 };
                assert_eq!(
                    f,
                    Frame::Publish {
                        qos,
                        pid,
                        ts: Some(11)
                    }
                );
                assert!(!dup);
                assert_eq!(topic, b"a/longer/topic");
                assert!(props.is_empty());
                assert_eq!(payload.len(), 30);
                assert_eq!(be_u64(&payload, 8), Some(12));
                assert_eq!(&payload[16..24], b"nonce-08");
                // The template's own frame follows intact.
                let (_, _, topic, _, payload) = inspect(&mut b, v);
                assert_eq!(topic, b"x");
                assert_eq!(
                    (be_u64(&payload, 0), be_u64(&payload, 8)),
                    (Some(13), Some(14))
                );
                assert!(b.is_empty());
            }
        }
        // A template payload shorter than stamp + extra: the payload grows.
        let t = PublishTemplate::new(Version::V5, "x", 1, 16);
        let mut b = BytesMut::new();
        t.write_to(&mut b, "y", 1, 2, 3, b"12345678");
        let (_, _, _, _, payload) = inspect(&mut b, Version::V5);
        assert_eq!(payload.len(), 24);
    }

    #[test]
    fn publish_user_properties_and_dup() {
        // DUP=1 QoS 1 PUBLISH to "t", pid 5; props: user (k, v), subscription id 3,
        // user (lane, l-1); payload "pl".
        let mut props = BytesMut::new();
        for (k, v) in [("k", "v"), ("lane", "l-1")] {
            props.put_u8(0x26);
            put_str(&mut props, k.as_bytes());
            put_str(&mut props, v.as_bytes());
            if k == "k" {
                props.put_slice(&[0x0B, 3]);
            }
        }
        let mut body = BytesMut::new();
        put_str(&mut body, b"t");
        body.put_u16(5);
        put_varint(&mut body, props.len());
        body.put_slice(&props);
        body.put_slice(b"pl");
        let mut b = BytesMut::new();
        b.put_u8(0x3a);
        put_varint(&mut b, body.len());
        b.put_slice(&body);
        let (f, dup, topic, props, payload) = inspect(&mut b.clone(), Version::V5);
        assert_eq!(
            f,
            Frame::Publish {
                qos: 1,
                pid: 5,
                ts: None
            }
        );
        assert!(dup);
        assert_eq!(topic, b"t");
        assert_eq!(
            props,
            [
                (b"k".to_vec(), b"v".to_vec()),
                (b"lane".to_vec(), b"l-1".to_vec())
            ]
        );
        assert_eq!(payload, b"pl");

        // A truncated user property is an error, not a shorter list.
        let mut bad = b.clone();
        // Frame: header, length, topic length + "t", pid, property length, then the first
        // property: id at 8, key length at 9..11.
        bad[10] = 0x7f;
        assert!(parse(&mut bad, Version::V5).is_err());
        // An unknown property id too.
        let mut bad = b;
        bad[8] = 0x7e;
        assert!(parse(&mut bad, Version::V5).is_err());
    }
}
