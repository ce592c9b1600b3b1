//! Fuzz the SCRAM messages a client controls (MQTT 5 enhanced authentication): the input is a
//! client-first-message and a client-final-message separated by a NUL byte (the first byte
//! picks SHA-256 or SHA-512). Parsing and verifying never panic; a proof made without the
//! password never verifies; the client side never panics on any server-first-message either.
#![no_main]

use lanemq_acl::scram::{Client, ClientFirst, Credentials, Mechanism, ServerFirst};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let mech = if pick & 1 == 0 {
        Mechanism::Sha256
    } else {
        Mechanism::Sha512
    };
    let (first, last) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    // The client side, fed the input as a server-first-message (at most 64 iterations, so
    // one input stays cheap; the default cap is tested in the crate).
    let (client, _) = Client::start(mech, "u", b"pw", "cnonce");
    let client = client.max_iterations(64);
    if let Ok(text) = std::str::from_utf8(first) {
        let _ = client.finish(text);
    }
    let Ok(cf) = ClientFirst::parse(first) else {
        return;
    };
    // Credentials for a password the input cannot know, at the lowest cost.
    let creds = Credentials::from_password(mech, b"not in the input", b"salt".to_vec(), 1);
    let (state, _) = ServerFirst::start(cf, creds, "snonce");
    assert!(state.finish(last).is_err(), "a proof verified without the password");
});
