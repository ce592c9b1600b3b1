//! Placeholder: the strict codec is being written (see crate docs).
use crate::{Packet, ProtocolVersion};
use bytes::BytesMut;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Malformed(&'static str),
}
impl DecodeError {
    pub fn reason_code(&self) -> u8 {
        crate::reason::MALFORMED_PACKET
    }
}
pub fn decode(
    _buf: &mut BytesMut,
    _version: ProtocolVersion,
    _max_packet_size: u32,
) -> Result<Option<Packet>, DecodeError> {
    Ok(None)
}
pub fn encode(_packet: &Packet, _version: ProtocolVersion, _out: &mut BytesMut) {}
pub fn encoded_len(_packet: &Packet, _version: ProtocolVersion) -> usize {
    0
}
