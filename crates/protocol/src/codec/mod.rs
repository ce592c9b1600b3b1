//! The strict, two-phase MQTT 3.1.1 / 5.0 codec.
//!
//! # Decoding: two phases
//!
//! 1. **Fixed header** ([`peek_fixed_header`]): the first byte (packet type and its flag bits)
//!    and the remaining-length varint are checked as soon as they are available. The total
//!    packet size is compared with `max_packet_size` *before* the body is waited for or
//!    buffered, so an oversized packet is rejected after at most five bytes.
//! 2. **Body**: once the whole packet is in the buffer it is split off (`split_to(..).freeze()`,
//!    no copy) and parsed with every check the specification demands: UTF-8 rules, property
//!    tables (allowed per packet type, duplicates, value ranges), packet identifier 0,
//!    reserved bits, trailing bytes.
//!
//! # Invariants
//!
//! * `decode` never panics, whatever the input; every failure is a typed [`DecodeError`] that
//!   maps to one MQTT 5 reason code ([`DecodeError::reason_code`]).
//! * `Ok(None)` means "incomplete": the buffer is left untouched. `Ok(Some(_))` consumes exactly
//!   the packet's bytes. After `Err(_)` the buffer contents are unspecified (the connection is
//!   to be closed anyway).
//! * Byte fields (PUBLISH payload, will payload, password, correlation and authentication data)
//!   are zero-copy slices of the received frame; the only per-packet heap allocations are the
//!   `String`s and the `Vec`s of properties/filters that are actually present.
//! * `encode` appends exactly [`encoded_len`] bytes, after one `reserve` of that size. Lengths
//!   are computed by running the same writer code against a byte counter, so the two cannot
//!   diverge. For MQTT 3.1.1 the MQTT 5-only fields are dropped; AUTH is not representable
//!   in 3.1.1 and encodes to nothing.
//! * For every packet `p` a version can carry, `decode(encode(p)) == p`.
//!
//! CONNECT is always decoded according to its own protocol name and level; every other packet
//! according to the `version` negotiated for the connection.

mod props;
mod read;
mod write;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use read::{decode, peek_fixed_header};
pub use write::{encode, encoded_len, PublishOut};

use crate::reason;
use std::fmt;

/// Why a packet could not be decoded. Each variant maps to one MQTT 5 reason code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes do not form a valid packet (0x81).
    Malformed(&'static str),
    /// The packet is well-formed but violates a protocol rule (0x82).
    Protocol(&'static str),
    /// The packet (fixed header included) is larger than the allowed maximum (0x95).
    PacketTooLarge { size: usize, max: u32 },
    /// CONNECT with a known protocol name but an unsupported level (0x84; 3.1.1 code 0x01).
    UnsupportedProtocolVersion(u8),
    /// A topic name that is not allowed: wildcards, empty in 3.1.1 (0x90).
    InvalidTopic(&'static str),
}

impl DecodeError {
    /// The MQTT 5 reason code to report (in CONNACK or DISCONNECT) for this error.
    pub fn reason_code(&self) -> u8 {
        match self {
            DecodeError::Malformed(_) => reason::MALFORMED_PACKET,
            DecodeError::Protocol(_) => reason::PROTOCOL_ERROR,
            DecodeError::PacketTooLarge { .. } => reason::PACKET_TOO_LARGE,
            DecodeError::UnsupportedProtocolVersion(_) => reason::UNSUPPORTED_PROTOCOL_VERSION,
            DecodeError::InvalidTopic(_) => reason::TOPIC_NAME_INVALID,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed(m) => write!(f, "malformed packet: {m}"),
            DecodeError::Protocol(m) => write!(f, "protocol error: {m}"),
            DecodeError::PacketTooLarge { size, max } => {
                write!(
                    f,
                    "packet of {size} bytes exceeds the maximum packet size of {max} bytes"
                )
            }
            DecodeError::UnsupportedProtocolVersion(level) => {
                write!(f, "unsupported protocol version (level {level})")
            }
            DecodeError::InvalidTopic(m) => write!(f, "invalid topic name: {m}"),
        }
    }
}

impl std::error::Error for DecodeError {}
