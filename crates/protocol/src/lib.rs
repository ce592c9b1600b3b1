//! MQTT 3.1.1 and 5.0 packets for lanemq.
//!
//! One set of packet types serves both protocol versions: fields that only exist in MQTT 5
//! (properties, reason codes on acknowledgements) are simply absent on the wire for 3.1.1.
//! The codec ([`decode`], [`encode`]) is two-phase and never panics on input: it first checks
//! the fixed header (remaining length, `maximum_packet_size`) before touching the body, then
//! parses the body with the strict checks the specification demands (reserved flags, UTF-8
//! rules, duplicate or misplaced properties, packet identifier 0, trailing bytes ...). Every
//! decode error maps to one MQTT 5 reason code ([`DecodeError::reason_code`]).
//!
//! See `docs/codec.md` for why lanemq carries its own codec instead of `mqttbytes`.

mod codec;
mod packets;
pub mod reason;
pub mod topic;
pub mod validation;

pub use codec::{decode, encode, encoded_len, peek_fixed_header, DecodeError, PublishOut};
pub use packets::*;
pub use validation::ValidationError;
