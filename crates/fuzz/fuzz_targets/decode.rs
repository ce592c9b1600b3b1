//! Fuzz the strict decoder: for every protocol version, decode packets from the input until it
//! is exhausted or an error occurs; every decoded packet must re-encode to exactly
//! `encoded_len` bytes and decode back to an equal packet. `decode` must never panic, and
//! `Ok(None)` must leave the buffer untouched.
#![no_main]

use bytes::BytesMut;
use lanemq_protocol::{decode, encode, encoded_len, peek_fixed_header, ProtocolVersion};
use libfuzzer_sys::fuzz_target;

fn run(data: &[u8], version: ProtocolVersion, max: u32) {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        let peeked = peek_fixed_header(&buf);
        match decode(&mut buf, version, max) {
            Ok(Some(packet)) => {
                let Ok(Some((_, total))) = peeked else {
                    panic!("decoded a packet that peek_fixed_header did not see: {peeked:?}");
                };
                assert_eq!(
                    before.len() - buf.len(),
                    total,
                    "consumed exactly the packet"
                );
                let mut out = BytesMut::new();
                encode(&packet, version, &mut out);
                assert_eq!(out.len(), encoded_len(&packet, version), "encoded_len");
                let again = decode(&mut out, version, 0);
                assert_eq!(again, Ok(Some(packet)), "re-decode");
                assert!(out.is_empty(), "re-decode consumed everything");
            }
            Ok(None) => {
                assert_eq!(buf, before, "Ok(None) leaves the buffer untouched");
                return;
            }
            Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    for version in [
        ProtocolVersion::V5,
        ProtocolVersion::V311,
        ProtocolVersion::V31,
    ] {
        run(data, version, 0);
        run(data, version, 256);
    }
});
