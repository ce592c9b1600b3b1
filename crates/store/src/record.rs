//! The record: what one accepted PUBLISH becomes in the log, and its byte encoding.
//!
//! Layout (all integers big-endian; the byte tables are in `docs/storage-format.md`):
//!
//! ```text
//! header (9 bytes)  magic_version u8 = 0xA1 | body_len u32 | crc32c u32
//! body              offset u64 | timestamp_us u64 | flags u8
//!                   | topic_len u16 | topic | client_len u16 | client_id
//!                   | props_len u32 | properties | payload_len u32 | payload
//!                   | hint_count u8 | hint_count x (kind u8, id u64, seq u64)
//! ```
//!
//! Invariants:
//! - the CRC32C covers the 4 bytes of `body_len` followed by the whole body, so a damaged
//!   length is caught as surely as a damaged payload;
//! - the body is exactly `body_len` bytes: every length inside it must add up, and trailing
//!   bytes are corruption;
//! - the flags' reserved bits (3..=7) are zero; DUP is never stored (it is a property of
//!   one delivery, not of the message);
//! - the index hints come last so that they can be filled in under the append lock (the
//!   lite-topic layer assigns a lane's offset there) without re-encoding the payload.

use bytes::Bytes;
use std::sync::Arc;

/// First byte of every record: high nibble `0xA` says "lanemq record", low nibble the
/// record format version (1).
pub const RECORD_MAGIC: u8 = 0xA1;
/// Bytes before the body: magic, body length, CRC32C.
pub const RECORD_HEADER_LEN: usize = 9;
/// Smallest possible body: offset, timestamp, flags, empty topic and client id, a properties
/// block with nothing present (3 bytes), empty payload, zero hints.
pub const RECORD_BODY_MIN: usize = 8 + 8 + 1 + 2 + 2 + (4 + 3) + 4 + 1;
/// Largest `body_len` the decoder accepts at all (MQTT's 256 MiB packet limit plus room for
/// the framing); the configured `record_bytes_max` is normally far below.
pub const RECORD_BODY_HARD_MAX: usize = 268_435_455 + 4096;
/// Bytes of one encoded index hint.
pub const INDEX_HINT_LEN: usize = 17;
/// Most index hints one record may carry.
pub const INDEX_HINTS_MAX: usize = 255;

const FLAG_QOS_MASK: u8 = 0b0000_0011;
const FLAG_RETAIN: u8 = 0b0000_0100;
const FLAG_RESERVED: u8 = 0b1111_1000;

const PROP_PAYLOAD_FORMAT: u8 = 1 << 0;
const PROP_MESSAGE_EXPIRY: u8 = 1 << 1;
const PROP_CONTENT_TYPE: u8 = 1 << 2;
const PROP_RESPONSE_TOPIC: u8 = 1 << 3;
const PROP_CORRELATION_DATA: u8 = 1 << 4;
const PROP_USERNAME: u8 = 1 << 5;
const PROP_RESERVED: u8 = 0b1100_0000;

/// Byte position of the offset inside an encoded record.
const POS_OFFSET: usize = RECORD_HEADER_LEN;
/// Byte position of the timestamp inside an encoded record.
const POS_TIMESTAMP: usize = RECORD_HEADER_LEN + 8;

/// The MQTT 5 properties of a PUBLISH that belong to the message (not to one delivery:
/// topic alias and subscription identifiers are not stored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// Payload Format Indicator (0x01).
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval (0x02) in seconds, as received; the remaining lifetime is
    /// this minus the time since [`Record::timestamp_us`].
    pub message_expiry_interval: Option<u32>,
    /// Content Type (0x03).
    pub content_type: Option<String>,
    /// Response Topic (0x08).
    pub response_topic: Option<String>,
    /// Correlation Data (0x09).
    pub correlation_data: Option<Bytes>,
    /// User Properties (0x26), in the order received, duplicates kept.
    pub user_properties: Vec<(String, String)>,
    /// The publisher's authenticated user name (not an MQTT message property: kept for
    /// stream key expressions such as `message.username`; never forwarded to subscribers).
    pub username: Option<String>,
}

/// A position in some secondary index, stored in the record so the index can be rebuilt
/// from the log (RocketMQ stores the lite queue offset in the CommitLog record the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexHint {
    /// Which index: see the `HINT_*` constants; other values are free for later layers.
    pub kind: u8,
    /// The id inside that index (lane id, stream id).
    pub id: u64,
    /// The sequence number assigned in that index (the lane offset).
    pub seq: u64,
}

impl IndexHint {
    /// A lane (lite topic) offset.
    pub const KIND_LANE: u8 = 1;
    /// A named stream sequence.
    pub const KIND_STREAM: u8 = 2;
}

/// A message to append. The store assigns the offset (and the timestamp when none is given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordIn {
    /// Receive time in µs since the Unix epoch; `None` = now. The store keeps timestamps
    /// non-decreasing along the log: a value earlier than the previous record's is raised
    /// to it.
    pub timestamp_us: Option<u64>,
    /// QoS 0, 1 or 2.
    pub qos: u8,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name (after topic-alias resolution). Shared, so that a broker hands over the
    /// topic and client id it holds without copying them for every record.
    pub topic: Arc<str>,
    /// Publisher's client identifier.
    pub client_id: Arc<str>,
    /// MQTT 5 message properties.
    pub properties: Properties,
    /// Index hints known before the append (more can be added under the append lock with
    /// [`crate::Store::append_with`]).
    pub index_hints: Vec<IndexHint>,
    /// Application payload.
    pub payload: Bytes,
}

impl RecordIn {
    /// Bytes this record will take in the log (with its current hints).
    pub fn encoded_len(&self) -> usize {
        let p = &self.properties;
        let mut props = 0;
        props += p.payload_format_indicator.map_or(0, |_| 1);
        props += p.message_expiry_interval.map_or(0, |_| 4);
        props += p.content_type.as_ref().map_or(0, |s| 2 + s.len());
        props += p.response_topic.as_ref().map_or(0, |s| 2 + s.len());
        props += p.correlation_data.as_ref().map_or(0, |s| 2 + s.len());
        props += p.username.as_ref().map_or(0, |s| 2 + s.len());
        props += p
            .user_properties
            .iter()
            .map(|(k, v)| 4 + k.len() + v.len())
            .sum::<usize>();
        RECORD_HEADER_LEN
            + RECORD_BODY_MIN
            + self.topic.len()
            + self.client_id.len()
            + props
            + self.payload.len()
            + self.index_hints.len() * INDEX_HINT_LEN
    }
}

/// A record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Global offset: dense, starts at 0, assigned at append.
    pub offset: u64,
    /// µs since the Unix epoch; non-decreasing along the log.
    pub timestamp_us: u64,
    /// QoS 0, 1 or 2.
    pub qos: u8,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name.
    pub topic: String,
    /// Publisher's client identifier.
    pub client_id: String,
    /// MQTT 5 message properties.
    pub properties: Properties,
    /// Index hints, in the order appended.
    pub index_hints: Vec<IndexHint>,
    /// Application payload.
    pub payload: Bytes,
}

impl Record {
    /// The input that would encode to this record (offset and timestamp aside).
    pub fn to_record_in(&self) -> RecordIn {
        RecordIn {
            timestamp_us: Some(self.timestamp_us),
            qos: self.qos,
            retain: self.retain,
            topic: self.topic.as_str().into(),
            client_id: self.client_id.as_str().into(),
            properties: self.properties.clone(),
            index_hints: self.index_hints.clone(),
            payload: self.payload.clone(),
        }
    }
}

/// A record encoded except for its offset, timestamp, trailing hints and CRC, which are
/// filled in by [`PartialRecord::finish`] under the append lock.
#[derive(Debug)]
pub(crate) struct PartialRecord {
    buf: Vec<u8>,
    hints: Vec<IndexHint>,
}

fn put_str16(buf: &mut Vec<u8>, s: &[u8], what: &'static str) -> Result<(), &'static str> {
    let len = u16::try_from(s.len()).map_err(|_| what)?;
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(s);
    Ok(())
}

fn encode_properties(buf: &mut Vec<u8>, p: &Properties) -> Result<(), &'static str> {
    let mut present = 0u8;
    if p.payload_format_indicator.is_some() {
        present |= PROP_PAYLOAD_FORMAT;
    }
    if p.message_expiry_interval.is_some() {
        present |= PROP_MESSAGE_EXPIRY;
    }
    if p.content_type.is_some() {
        present |= PROP_CONTENT_TYPE;
    }
    if p.response_topic.is_some() {
        present |= PROP_RESPONSE_TOPIC;
    }
    if p.correlation_data.is_some() {
        present |= PROP_CORRELATION_DATA;
    }
    if p.username.is_some() {
        present |= PROP_USERNAME;
    }
    buf.push(present);
    if let Some(v) = p.payload_format_indicator {
        buf.push(v);
    }
    if let Some(v) = p.message_expiry_interval {
        buf.extend_from_slice(&v.to_be_bytes());
    }
    if let Some(v) = &p.content_type {
        put_str16(buf, v.as_bytes(), "content type longer than 65535 bytes")?;
    }
    if let Some(v) = &p.response_topic {
        put_str16(buf, v.as_bytes(), "response topic longer than 65535 bytes")?;
    }
    if let Some(v) = &p.correlation_data {
        put_str16(buf, v, "correlation data longer than 65535 bytes")?;
    }
    if let Some(v) = &p.username {
        put_str16(buf, v.as_bytes(), "user name longer than 65535 bytes")?;
    }
    let count =
        u16::try_from(p.user_properties.len()).map_err(|_| "more than 65535 user properties")?;
    buf.extend_from_slice(&count.to_be_bytes());
    for (k, v) in &p.user_properties {
        put_str16(
            buf,
            k.as_bytes(),
            "user property name longer than 65535 bytes",
        )?;
        put_str16(
            buf,
            v.as_bytes(),
            "user property value longer than 65535 bytes",
        )?;
    }
    Ok(())
}

impl PartialRecord {
    /// Encodes everything but the offset, timestamp, hints and CRC. The expensive part
    /// (copying the payload) happens here, outside any lock.
    pub(crate) fn encode(rec: &RecordIn) -> Result<PartialRecord, &'static str> {
        if rec.qos > 2 {
            return Err("QoS above 2");
        }
        let mut buf = Vec::with_capacity(
            RECORD_HEADER_LEN
                + RECORD_BODY_MIN
                + rec.topic.len()
                + rec.client_id.len()
                + rec.payload.len()
                + 64,
        );
        buf.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
        buf.extend_from_slice(&0u64.to_be_bytes()); // offset, patched in finish
        buf.extend_from_slice(&0u64.to_be_bytes()); // timestamp, patched in finish
        let mut flags = rec.qos & FLAG_QOS_MASK;
        if rec.retain {
            flags |= FLAG_RETAIN;
        }
        buf.push(flags);
        put_str16(
            &mut buf,
            rec.topic.as_bytes(),
            "topic longer than 65535 bytes",
        )?;
        put_str16(
            &mut buf,
            rec.client_id.as_bytes(),
            "client id longer than 65535 bytes",
        )?;
        let props_at = buf.len();
        buf.extend_from_slice(&0u32.to_be_bytes());
        encode_properties(&mut buf, &rec.properties)?;
        let props_len =
            u32::try_from(buf.len() - props_at - 4).map_err(|_| "properties too long")?;
        buf[props_at..props_at + 4].copy_from_slice(&props_len.to_be_bytes());
        let payload_len =
            u32::try_from(rec.payload.len()).map_err(|_| "payload longer than 4 GiB")?;
        buf.extend_from_slice(&payload_len.to_be_bytes());
        buf.extend_from_slice(&rec.payload);
        Ok(PartialRecord {
            buf,
            hints: rec.index_hints.clone(),
        })
    }

    /// Length the finished record will have with `extra_hints` more hints.
    pub(crate) fn finished_len(&self, extra_hints: usize) -> usize {
        self.buf.len() + 1 + (self.hints.len() + extra_hints) * INDEX_HINT_LEN
    }

    /// Hints given in the [`RecordIn`]; more can be pushed before [`Self::finish`].
    pub(crate) fn hints_mut(&mut self) -> &mut Vec<IndexHint> {
        &mut self.hints
    }

    /// Fills in offset, timestamp, hints, length and CRC. Returns the complete record.
    pub(crate) fn finish(
        mut self,
        offset: u64,
        timestamp_us: u64,
    ) -> Result<Vec<u8>, &'static str> {
        if self.hints.len() > INDEX_HINTS_MAX {
            return Err("more than 255 index hints");
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf[POS_OFFSET..POS_OFFSET + 8].copy_from_slice(&offset.to_be_bytes());
        buf[POS_TIMESTAMP..POS_TIMESTAMP + 8].copy_from_slice(&timestamp_us.to_be_bytes());
        // The count fits: checked against INDEX_HINTS_MAX (255) above.
        buf.push(self.hints.len() as u8);
        for h in &self.hints {
            buf.push(h.kind);
            buf.extend_from_slice(&h.id.to_be_bytes());
            buf.extend_from_slice(&h.seq.to_be_bytes());
        }
        let body_len =
            u32::try_from(buf.len() - RECORD_HEADER_LEN).map_err(|_| "record too long")?;
        buf[0] = RECORD_MAGIC;
        buf[1..5].copy_from_slice(&body_len.to_be_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[1..5]), &buf[RECORD_HEADER_LEN..]);
        buf[5..9].copy_from_slice(&crc.to_be_bytes());
        debug_assert_eq!(check_header(&buf), Peek::Complete { len: buf.len() });
        Ok(buf)
    }
}

/// Encodes a complete record in one go (tests, tools, the will table).
pub fn encode_record(
    offset: u64,
    timestamp_us: u64,
    rec: RecordIn,
) -> Result<Vec<u8>, &'static str> {
    PartialRecord::encode(&rec)?.finish(offset, timestamp_us)
}

/// What the bytes at a position look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peek {
    /// Fewer bytes than the header or than `body_len` says: a record cut short.
    Incomplete,
    /// Not a record: bad magic, impossible length or CRC mismatch.
    Bad(&'static str),
    /// A whole record of `len` bytes whose CRC matches.
    Complete { len: usize },
}

/// Checks framing and CRC of the record starting at `buf[0]` (buf may extend beyond it).
pub(crate) fn check_header(buf: &[u8]) -> Peek {
    if buf.is_empty() {
        return Peek::Incomplete;
    }
    if buf[0] != RECORD_MAGIC {
        return Peek::Bad("bad magic/version byte");
    }
    if buf.len() < RECORD_HEADER_LEN {
        return Peek::Incomplete;
    }
    let body_len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if !(RECORD_BODY_MIN..=RECORD_BODY_HARD_MAX).contains(&body_len) {
        return Peek::Bad("impossible body length");
    }
    let len = RECORD_HEADER_LEN + body_len;
    if buf.len() < len {
        return Peek::Incomplete;
    }
    let want = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
    let got = crc32c::crc32c_append(crc32c::crc32c(&buf[1..5]), &buf[RECORD_HEADER_LEN..len]);
    if want != got {
        return Peek::Bad("CRC32C mismatch");
    }
    Peek::Complete { len }
}

/// Offset and timestamp of a complete, CRC-checked record (cheap: no field decoding).
pub(crate) fn offset_and_timestamp(rec: &[u8]) -> (u64, u64) {
    debug_assert!(rec.len() >= RECORD_HEADER_LEN + RECORD_BODY_MIN);
    let mut o = [0u8; 8];
    o.copy_from_slice(&rec[POS_OFFSET..POS_OFFSET + 8]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&rec[POS_TIMESTAMP..POS_TIMESTAMP + 8]);
    (u64::from_be_bytes(o), u64::from_be_bytes(t))
}

struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, &'static str> {
        if self.end - self.pos < n {
            return Err("field runs past the end of the record");
        }
        let r = self.pos..self.pos + n;
        self.pos += n;
        Ok(r)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        let r = self.take(1)?;
        Ok(self.buf[r.start])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let r = self.take(2)?;
        Ok(u16::from_be_bytes([
            self.buf[r.start],
            self.buf[r.start + 1],
        ]))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        let r = self.take(4)?;
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buf[r]);
        Ok(u32::from_be_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        let r = self.take(8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[r]);
        Ok(u64::from_be_bytes(b))
    }
    fn bytes16(&mut self) -> Result<Bytes, &'static str> {
        let n = self.u16()? as usize;
        let r = self.take(n)?;
        Ok(self.buf.slice(r))
    }
    fn str16(&mut self) -> Result<String, &'static str> {
        let b = self.bytes16()?;
        String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8")
    }
}

fn decode_properties(c: &mut Cursor<'_>) -> Result<Properties, &'static str> {
    let present = c.u8()?;
    if present & PROP_RESERVED != 0 {
        return Err("reserved property bits set");
    }
    let mut p = Properties::default();
    if present & PROP_PAYLOAD_FORMAT != 0 {
        p.payload_format_indicator = Some(c.u8()?);
    }
    if present & PROP_MESSAGE_EXPIRY != 0 {
        p.message_expiry_interval = Some(c.u32()?);
    }
    if present & PROP_CONTENT_TYPE != 0 {
        p.content_type = Some(c.str16()?);
    }
    if present & PROP_RESPONSE_TOPIC != 0 {
        p.response_topic = Some(c.str16()?);
    }
    if present & PROP_CORRELATION_DATA != 0 {
        p.correlation_data = Some(c.bytes16()?);
    }
    if present & PROP_USERNAME != 0 {
        p.username = Some(c.str16()?);
    }
    let n = c.u16()? as usize;
    let mut ups = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let k = c.str16()?;
        let v = c.str16()?;
        ups.push((k, v));
    }
    p.user_properties = ups;
    Ok(p)
}

/// Decodes a whole record (framing, CRC and every field). `buf` holds exactly one record.
pub fn decode_record(buf: Bytes) -> Result<Record, &'static str> {
    match check_header(&buf) {
        Peek::Complete { len } if len == buf.len() => {}
        Peek::Complete { .. } => return Err("bytes after the record"),
        Peek::Incomplete => return Err("record cut short"),
        Peek::Bad(why) => return Err(why),
    }
    let mut c = Cursor {
        buf: &buf,
        pos: RECORD_HEADER_LEN,
        end: buf.len(),
    };
    let offset = c.u64()?;
    let timestamp_us = c.u64()?;
    let flags = c.u8()?;
    if flags & FLAG_RESERVED != 0 {
        return Err("reserved flag bits set");
    }
    let qos = flags & FLAG_QOS_MASK;
    if qos > 2 {
        return Err("QoS 3 in flags");
    }
    let topic = c.str16()?;
    let client_id = c.str16()?;
    let props_len = c.u32()? as usize;
    let props_range = c.take(props_len)?;
    let properties = {
        let mut pc = Cursor {
            buf: &buf,
            pos: props_range.start,
            end: props_range.end,
        };
        let p = decode_properties(&mut pc)?;
        if pc.pos != pc.end {
            return Err("properties block length does not add up");
        }
        p
    };
    let payload_len = c.u32()? as usize;
    let payload = buf.slice(c.take(payload_len)?);
    let hint_count = c.u8()? as usize;
    let mut index_hints = Vec::with_capacity(hint_count);
    for _ in 0..hint_count {
        let kind = c.u8()?;
        let id = c.u64()?;
        let seq = c.u64()?;
        index_hints.push(IndexHint { kind, id, seq });
    }
    if c.pos != c.end {
        return Err("body length does not add up");
    }
    Ok(Record {
        offset,
        timestamp_us,
        qos,
        retain: flags & FLAG_RETAIN != 0,
        topic,
        client_id,
        properties,
        index_hints,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> RecordIn {
        RecordIn {
            timestamp_us: None,
            qos: 1,
            retain: true,
            topic: "a/b/c".into(),
            client_id: "pub-1".into(),
            properties: Properties {
                payload_format_indicator: Some(1),
                message_expiry_interval: Some(60),
                content_type: Some("text/plain".into()),
                response_topic: Some("r/t".into()),
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
                username: Some("alice".into()),
            },
            index_hints: vec![IndexHint {
                kind: IndexHint::KIND_LANE,
                id: 7,
                seq: 42,
            }],
            payload: Bytes::from_static(b"hello"),
        }
    }

    #[test]
    fn round_trip_all_fields() {
        let r = sample();
        let enc = encode_record(5, 1_700_000_000_000_000, r.clone()).expect("encode");
        let dec = decode_record(Bytes::from(enc)).expect("decode");
        assert_eq!(dec.offset, 5);
        assert_eq!(dec.timestamp_us, 1_700_000_000_000_000);
        let mut back = dec.to_record_in();
        back.timestamp_us = None;
        assert_eq!(back, r);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let enc = encode_record(9, 10, sample()).expect("encode");
        for i in 0..enc.len() {
            for bit in 0..8 {
                let mut b = enc.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode_record(Bytes::from(b)).is_err(),
                    "flip at byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_incomplete() {
        let enc = encode_record(9, 10, sample()).expect("encode");
        for cut in 1..enc.len() {
            assert_eq!(check_header(&enc[..cut]), Peek::Incomplete, "cut {cut}");
        }
        assert_eq!(check_header(&[]), Peek::Incomplete);
    }

    #[test]
    fn minimal_record_has_min_body() {
        let enc = encode_record(0, 0, RecordIn::default()).expect("encode");
        assert_eq!(enc.len(), RECORD_HEADER_LEN + RECORD_BODY_MIN);
        assert_eq!(enc.len(), RecordIn::default().encoded_len());
        let s = sample();
        assert_eq!(
            s.encoded_len(),
            encode_record(0, 0, s.clone()).expect("encode").len()
        );
    }

    proptest! {
        #[test]
        fn prop_round_trip(
            offset in any::<u64>(), ts in any::<u64>(), qos in 0u8..3, retain in any::<bool>(),
            topic in ".{0,40}", client in "[a-z0-9]{0,23}",
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            ups in proptest::collection::vec((".{0,8}", ".{0,8}"), 0..5),
            expiry in proptest::option::of(any::<u32>()),
            ct in proptest::option::of(".{0,10}"),
            hints in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 0..4),
        ) {
            let r = RecordIn {
                timestamp_us: None, qos, retain, topic: topic.into(), client_id: client.into(),
                properties: Properties { message_expiry_interval: expiry, content_type: ct,
                    user_properties: ups, ..Properties::default() },
                index_hints: hints.into_iter().map(|(kind, id, seq)| IndexHint { kind, id, seq }).collect(),
                payload: Bytes::from(payload),
            };
            let enc = encode_record(offset, ts, r.clone()).expect("encode");
            let dec = decode_record(Bytes::from(enc)).expect("decode");
            prop_assert_eq!(dec.offset, offset);
            prop_assert_eq!(dec.timestamp_us, ts);
            let mut back = dec.to_record_in();
            back.timestamp_us = None;
            prop_assert_eq!(back, r);
        }
    }
}
