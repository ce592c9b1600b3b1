//! A tiny, self-contained MQTT 3.1.1 / 5 encoder and frame parser.
//!
//! Only what the load generator needs: CONNECT, SUBSCRIBE, PUBLISH and the
//! QoS 1/2 acknowledgements, PINGREQ and DISCONNECT, all without properties
//! on the way out. Incoming v5 properties are skipped, except the CONNACK
//! Receive Maximum, which bounds the publisher's inflight window.

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

/// A pre-encoded PUBLISH frame; per message only the packet id and the
/// first 16 payload bytes are patched.
#[derive(Clone, Debug)]
pub struct PublishTemplate {
    frame: Vec<u8>,
    pid_at: Option<usize>,
    payload_at: usize,
}

impl PublishTemplate {
    pub fn new(v: Version, topic: &str, qos: u8, payload_len: usize) -> Self {
        let pid = if qos > 0 { 2 } else { 0 };
        let props = usize::from(v.is_v5());
        let rl = 2 + topic.len() + pid + props + payload_len;
        let mut b = BytesMut::with_capacity(1 + varint_len(rl) + rl);
        b.put_u8((PUBLISH << 4) | ((qos & 0x03) << 1));
        put_varint(&mut b, rl);
        put_str(&mut b, topic.as_bytes());
        let pid_at = if qos > 0 {
            let at = b.len();
            b.put_u16(0);
            Some(at)
        } else {
            None
        };
        if v.is_v5() {
            b.put_u8(0);
        }
        let payload_at = b.len();
        // Recognisable filler after the 16-byte header.
        b.extend((0..payload_len).map(|i| b'a' + (i % 26) as u8));
        PublishTemplate {
            frame: b.to_vec(),
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
}

/// One parsed frame, borrowing nothing (the caller reads the payload
/// header fields it needs before the buffer is advanced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    ConnAck {
        reason: u8,
        receive_max: Option<u16>,
    },
    Publish {
        qos: u8,
        pid: u16,
        /// First 16 payload bytes when the payload is that long.
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

/// Skip a v5 property block at the start of `b`, returning the bytes used
/// and the Receive Maximum if present.
fn skip_props(b: &[u8]) -> anyhow::Result<(usize, Option<u16>)> {
    let (len, used) = get_varint(b)?.context("truncated property length")?;
    let end = used + len;
    if end > b.len() {
        bail!("truncated properties");
    }
    let mut p = &b[used..end];
    let mut receive_max = None;
    while !p.is_empty() {
        let (id, u) = get_varint(p)?.context("truncated property id")?;
        p = &p[u..];
        let need = match id {
            0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => 1,
            0x13 | 0x21 | 0x22 | 0x23 => 2,
            0x02 | 0x11 | 0x18 | 0x27 => 4,
            0x0B => get_varint(p)?.context("truncated varint property")?.1,
            0x03 | 0x08 | 0x09 | 0x12 | 0x15 | 0x16 | 0x1A | 0x1C | 0x1F => {
                if p.len() < 2 {
                    bail!("truncated property");
                }
                2 + usize::from(u16::from_be_bytes([p[0], p[1]]))
            }
            0x26 => {
                if p.len() < 2 {
                    bail!("truncated property");
                }
                let k = 2 + usize::from(u16::from_be_bytes([p[0], p[1]]));
                if p.len() < k + 2 {
                    bail!("truncated property");
                }
                k + 2 + usize::from(u16::from_be_bytes([p[k], p[k + 1]]))
            }
            other => bail!("unknown property id {other:#x}"),
        };
        if p.len() < need {
            bail!("truncated property");
        }
        if id == 0x21 {
            receive_max = Some(u16::from_be_bytes([p[0], p[1]]));
        }
        p = &p[need..];
    }
    Ok((end, receive_max))
}

/// Parse one complete frame from the front of `buf` and advance past it;
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &mut BytesMut, v: Version) -> anyhow::Result<Option<Frame>> {
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
            let qos = (header >> 1) & 0x03;
            if body.len() < 2 {
                bail!("short PUBLISH");
            }
            let tlen = usize::from(u16::from_be_bytes([body[0], body[1]]));
            let mut at = 2 + tlen;
            let mut pid = 0;
            if qos > 0 {
                if body.len() < at + 2 {
                    bail!("short PUBLISH");
                }
                pid = u16::from_be_bytes([body[at], body[at + 1]]);
                at += 2;
            }
            if v.is_v5() {
                if body.len() <= at {
                    bail!("short PUBLISH");
                }
                at += skip_props(&body[at..])?.0;
            }
            let payload = body.get(at..).unwrap_or_default();
            let ts = payload
                .get(0..8)
                .map(|b| u64::from_be_bytes(b.try_into().expect("slice of 8")));
            Frame::Publish { qos, pid, ts }
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
}
