//! The server side of SCRAM (RFC 5802) with SHA-256 (RFC 7677) and SHA-512, the mechanisms
//! MQTT 5 enhanced authentication (§4.12) carries as `SCRAM-SHA-256` and `SCRAM-SHA-512`.
//!
//! This module owns the message grammar and the proofs; it does no I/O and keeps no state
//! between exchanges. One exchange is [`ServerFirst::start`] (client-first-message in,
//! server-first-message out) then [`ServerFirst::finish`] (client-final-message in,
//! server-final-message out, or an error).
//!
//! Invariants:
//! * A [`Credentials`] holds StoredKey and ServerKey, never the password. Credentials made for
//!   an unknown user ([`Credentials::unknown`]) carry a salt that is stable per user name and
//!   can never verify, so an unknown user and a wrong password look the same on the wire and
//!   in the work done.
//! * Proofs are compared in constant time.
//! * Channel binding is not offered: a client that requires it (`p=`) is refused; `y` (the
//!   client could bind but believes the server cannot) and `n` are accepted. An authorization
//!   identity (`a=`) is accepted only when it names the authenticating user.
//! * Passwords are used as their UTF-8 bytes, without SASLprep normalisation (as
//!   `mosquitto_passwd` hashes them): identical for printable ASCII.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use std::fmt;
use subtle::ConstantTimeEq;

/// Iterations of new SCRAM-SHA-256 entries (RFC 7677 asks for at least 4096).
pub const SCRAM_SHA256_ITERATIONS: u32 = 4096;
/// Length of the server's part of the nonce, in random bytes (base64 makes 24 characters).
const SERVER_NONCE_BYTES: usize = 18;
/// Longest SCRAM message accepted (a user name, a nonce and a proof fit many times over).
const MAX_MESSAGE: usize = 4096;

/// A SCRAM hash function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// `SCRAM-SHA-256` (RFC 7677).
    Sha256,
    /// `SCRAM-SHA-512`: its SaltedPassword is exactly what a mosquitto `$7$` entry stores.
    Sha512,
}

impl Mechanism {
    /// Every mechanism, in the order they are advertised.
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha512, Mechanism::Sha256];

    /// The SASL / MQTT Authentication Method name.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism named `name` (exact, as SASL names are case-sensitive upper case).
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Output length of the hash, in bytes.
    pub fn hash_len(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        match self {
            Mechanism::Sha256 => {
                let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut m = <Hmac<Sha512> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    /// `Hi(password, salt, i)`: PBKDF2 with this hash, one block long (the SaltedPassword).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.hash_len()];
        match self {
            Mechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out)
            }
            Mechanism::Sha512 => {
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out)
            }
        }
        out
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the server keeps for one user and one mechanism (RFC 5802 §3).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub salt: Vec<u8>,
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
    /// False for [`Credentials::unknown`]: such credentials never verify.
    known: bool,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are password equivalents for SCRAM: never print them.
        write!(
            f,
            "Credentials({}, i={}, …)",
            self.mechanism, self.iterations
        )
    }
}

impl Credentials {
    /// Derive the stored keys from a SaltedPassword.
    pub fn from_salted_password(
        mechanism: Mechanism,
        salt: Vec<u8>,
        iterations: u32,
        salted_password: &[u8],
    ) -> Credentials {
        let client_key = mechanism.hmac(salted_password, &[b"Client Key"]);
        Credentials {
            mechanism,
            salt,
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, &[b"Server Key"]),
            known: true,
        }
    }

    /// Credentials computed from a password.
    pub fn from_password(
        mechanism: Mechanism,
        password: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> Credentials {
        let salted = mechanism.salted_password(password, &salt, iterations);
        Credentials::from_salted_password(mechanism, salt, iterations, &salted)
    }

    /// Stored keys as they are.
    pub fn from_keys(
        mechanism: Mechanism,
        salt: Vec<u8>,
        iterations: u32,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    ) -> Credentials {
        Credentials {
            mechanism,
            salt,
            iterations,
            stored_key,
            server_key,
            known: true,
        }
    }

    /// Credentials for a user that does not exist (or has no entry usable with
    /// `mechanism`): the salt is `HMAC(secret, user)`, stable for as long as `secret` is, so
    /// asking twice cannot tell such a user from a real one; they never verify.
    pub fn unknown(
        mechanism: Mechanism,
        user: &str,
        secret: &[u8],
        iterations: u32,
    ) -> Credentials {
        let salt = mechanism.hmac(secret, &[b"salt\0", user.as_bytes()]);
        let key = mechanism.hmac(secret, &[b"key\0", user.as_bytes()]);
        Credentials {
            mechanism,
            salt: salt.get(..16).unwrap_or(&salt).to_vec(),
            iterations,
            stored_key: key.clone(),
            server_key: key,
            known: false,
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// The proof did not verify, or the user is unknown (indistinguishable on purpose).
    InvalidProof,
    /// A message does not follow RFC 5802's grammar (what is wrong is said).
    Malformed(String),
    /// The client asked for channel binding, which this server does not offer.
    ChannelBindingNotSupported,
    /// The client-final-message's nonce is not the one of this exchange.
    NonceMismatch,
    /// The channel binding echoed in `c=` is not the GS2 header of the first message.
    BindingMismatch,
    /// An authorization identity other than the authenticating user.
    AuthzidNotPermitted,
}

impl ScramError {
    /// Did the credentials fail (as opposed to the protocol)? MQTT maps these to 0x86 Bad User
    /// Name or Password, the others to 0x87 Not authorized.
    pub fn is_credentials(&self) -> bool {
        matches!(self, ScramError::InvalidProof)
    }
}

impl fmt::Display for ScramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScramError::InvalidProof => {
                f.write_str("invalid proof (unknown user or wrong password)")
            }
            ScramError::Malformed(m) => write!(f, "malformed SCRAM message: {m}"),
            ScramError::ChannelBindingNotSupported => {
                f.write_str("channel binding is not supported (use the gs2 flag n or y)")
            }
            ScramError::NonceMismatch => f.write_str("the nonce is not the one of this exchange"),
            ScramError::BindingMismatch => {
                f.write_str("c= does not repeat the gs2 header of the client-first-message")
            }
            ScramError::AuthzidNotPermitted => {
                f.write_str("an authorization identity other than the user is not permitted")
            }
        }
    }
}

impl std::error::Error for ScramError {}

fn malformed(m: impl Into<String>) -> ScramError {
    ScramError::Malformed(m.into())
}

/// Decode a `saslname` (`=2C` is `,`, `=3D` is `=`; any other `=` is an error).
fn decode_saslname(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let esc = rest.get(at..at + 3);
        match esc {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed("'=' in a name must be =2C or =3D")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(malformed("empty user name"));
    }
    Ok(out)
}

fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// The parsed client-first-message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The GS2 header, e.g. `n,,` (echoed base64-encoded in the client-final-message).
    gs2_header: String,
    /// The message without the GS2 header (part of the AuthMessage).
    bare: String,
    /// The user name, decoded.
    pub username: String,
    nonce: String,
}

impl ClientFirst {
    /// Parse a client-first-message.
    pub fn parse(msg: &[u8]) -> Result<ClientFirst, ScramError> {
        if msg.len() > MAX_MESSAGE {
            return Err(malformed("message too long"));
        }
        let msg = std::str::from_utf8(msg).map_err(|_| malformed("not UTF-8"))?;
        let mut parts = msg.splitn(3, ',');
        let (Some(flag), Some(authzid), Some(bare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed(
                "expected gs2-header and client-first-message-bare",
            ));
        };
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => return Err(ScramError::ChannelBindingNotSupported),
            _ => return Err(malformed("the gs2 channel binding flag must be n, y or p=")),
        }
        let authzid = match authzid {
            "" => None,
            a => Some(decode_saslname(
                a.strip_prefix("a=")
                    .ok_or_else(|| malformed("the authzid must be a=<name>"))?,
            )?),
        };
        let gs2_header = msg[..msg.len() - bare.len()].to_string();
        let mut attrs = bare.split(',');
        let first = attrs.next().unwrap_or_default();
        if first.starts_with("m=") {
            return Err(malformed("mandatory extensions (m=) are not supported"));
        }
        let username = decode_saslname(
            first
                .strip_prefix("n=")
                .ok_or_else(|| malformed("client-first-message-bare must start with n=<user>"))?,
        )?;
        let nonce = attrs
            .next()
            .and_then(|r| r.strip_prefix("r="))
            .ok_or_else(|| malformed("n=<user> must be followed by r=<nonce>"))?;
        if !valid_nonce(nonce) {
            return Err(malformed("the nonce must be printable ASCII without ','"));
        }
        if let Some(a) = authzid {
            if a != username {
                return Err(ScramError::AuthzidNotPermitted);
            }
        }
        Ok(ClientFirst {
            gs2_header,
            bare: bare.to_string(),
            username,
            nonce: nonce.to_string(),
        })
    }
}

/// A fresh server nonce part: 18 random bytes, base64 (24 printable characters, no ',').
pub fn server_nonce() -> Result<String, getrandom::Error> {
    let mut raw = [0u8; SERVER_NONCE_BYTES];
    getrandom::fill(&mut raw)?;
    Ok(B64.encode(raw))
}

/// An exchange after the server-first-message, waiting for the client-final-message.
#[derive(Clone)]
pub struct ServerFirst {
    client_first: ClientFirst,
    /// Client nonce followed by the server's.
    nonce: String,
    server_first: String,
    credentials: Credentials,
}

impl fmt::Debug for ServerFirst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ServerFirst({}, user {:?})",
            self.credentials.mechanism, self.client_first.username
        )
    }
}

/// A completed exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The authenticated user.
    pub username: String,
    /// The server-final-message (`v=<ServerSignature>`), for the client to verify the server.
    pub server_final: String,
}

impl ServerFirst {
    /// Answer a parsed client-first-message with `credentials` (the user's, or
    /// [`Credentials::unknown`]); `server_nonce` from [`server_nonce`] (fixed in tests).
    /// Returns the state and the server-first-message.
    pub fn start(
        client_first: ClientFirst,
        credentials: Credentials,
        server_nonce: &str,
    ) -> (ServerFirst, String) {
        let nonce = format!("{}{server_nonce}", client_first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credentials.salt),
            credentials.iterations
        );
        let state = ServerFirst {
            client_first,
            nonce,
            server_first: server_first.clone(),
            credentials,
        };
        (state, server_first)
    }

    /// The user named in the client-first-message.
    pub fn username(&self) -> &str {
        &self.client_first.username
    }

    /// The mechanism of this exchange.
    pub fn mechanism(&self) -> Mechanism {
        self.credentials.mechanism
    }

    /// Verify the client-final-message.
    pub fn finish(self, msg: &[u8]) -> Result<Verified, ScramError> {
        if msg.len() > MAX_MESSAGE {
            return Err(malformed("message too long"));
        }
        let msg = std::str::from_utf8(msg).map_err(|_| malformed("not UTF-8"))?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("client-final-message must end with p=<proof>"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs
            .next()
            .and_then(|c| c.strip_prefix("c="))
            .ok_or_else(|| malformed("client-final-message must start with c=<binding>"))?;
        let nonce = attrs
            .next()
            .and_then(|r| r.strip_prefix("r="))
            .ok_or_else(|| malformed("c=<binding> must be followed by r=<nonce>"))?;
        let binding = B64
            .decode(binding)
            .map_err(|_| malformed("c= is not base64"))?;
        if binding != self.client_first.gs2_header.as_bytes() {
            return Err(ScramError::BindingMismatch);
        }
        if nonce.as_bytes().ct_eq(self.nonce.as_bytes()).unwrap_u8() != 1 {
            return Err(ScramError::NonceMismatch);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| malformed("p= is not base64"))?;
        let mech = self.credentials.mechanism;
        if proof.len() != mech.hash_len() {
            return Err(ScramError::InvalidProof);
        }
        let auth_message = [
            self.client_first.bare.as_bytes(),
            b",",
            self.server_first.as_bytes(),
            b",",
            without_proof.as_bytes(),
        ];
        let signature = mech.hmac(&self.credentials.stored_key, &auth_message);
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let ok = mech.hash(&client_key).ct_eq(&self.credentials.stored_key);
        if !bool::from(ok) || !self.credentials.known {
            return Err(ScramError::InvalidProof);
        }
        let server_signature = mech.hmac(&self.credentials.server_key, &auth_message);
        Ok(Verified {
            username: self.client_first.username,
            server_final: format!("v={}", B64.encode(server_signature)),
        })
    }
}

/// Encode a user name as a `saslname`.
fn encode_saslname(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

/// The client side of an exchange (RFC 5802 §3), for tools and tests that talk to a SCRAM
/// server: [`Client::start`], then [`Client::finish`] on the server-first-message, then
/// [`ClientFinal::verify_server`] on the server-final-message.
#[derive(Clone)]
pub struct Client {
    mechanism: Mechanism,
    password: Vec<u8>,
    bare: String,
    nonce: String,
    max_iterations: u32,
}

/// Most PBKDF2 iterations a [`Client`] accepts from a server by default: a server (or a
/// man in the middle) that asks for billions would otherwise keep the client busy for hours.
pub const CLIENT_MAX_ITERATIONS: u32 = 1_000_000;

/// A client waiting for the server-final-message.
#[derive(Debug, Clone)]
pub struct ClientFinal {
    server_signature: Vec<u8>,
}

impl Client {
    /// Begin: returns the state and the client-first-message (`n,,n=<user>,r=<nonce>`).
    pub fn start(
        mechanism: Mechanism,
        user: &str,
        password: &[u8],
        nonce: &str,
    ) -> (Client, String) {
        let bare = format!("n={},r={nonce}", encode_saslname(user));
        let first = format!("n,,{bare}");
        let c = Client {
            mechanism,
            password: password.to_vec(),
            bare,
            nonce: nonce.to_string(),
            max_iterations: CLIENT_MAX_ITERATIONS,
        };
        (c, first)
    }

    /// Refuse a server-first-message that asks for more than `n` iterations.
    pub fn max_iterations(mut self, n: u32) -> Client {
        self.max_iterations = n;
        self
    }

    /// Answer the server-first-message: returns the state and the client-final-message.
    pub fn finish(self, server_first: &str) -> Result<(ClientFinal, String), ScramError> {
        let mut attrs = server_first.split(',');
        let nonce = attrs
            .next()
            .and_then(|r| r.strip_prefix("r="))
            .ok_or_else(|| malformed("server-first-message must start with r=<nonce>"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramError::NonceMismatch);
        }
        let salt = attrs
            .next()
            .and_then(|s| s.strip_prefix("s="))
            .and_then(|s| B64.decode(s).ok())
            .ok_or_else(|| malformed("r=<nonce> must be followed by s=<base64 salt>"))?;
        let iterations: u32 = attrs
            .next()
            .and_then(|i| i.strip_prefix("i="))
            .and_then(|i| i.parse().ok())
            .filter(|&i| i > 0)
            .ok_or_else(|| malformed("s=<salt> must be followed by i=<iterations>"))?;
        if iterations > self.max_iterations {
            return Err(malformed(format!(
                "the server asks for {iterations} iterations, more than {}",
                self.max_iterations
            )));
        }
        let mech = self.mechanism;
        let salted = mech.salted_password(&self.password, &salt, iterations);
        let client_key = mech.hmac(&salted, &[b"Client Key"]);
        let stored_key = mech.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode("n,,"));
        let auth = [
            self.bare.as_bytes(),
            b",",
            server_first.as_bytes(),
            b",",
            without_proof.as_bytes(),
        ];
        let signature = mech.hmac(&stored_key, &auth);
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = mech.hmac(&salted, &[b"Server Key"]);
        let server_signature = mech.hmac(&server_key, &auth);
        Ok((
            ClientFinal { server_signature },
            format!("{without_proof},p={}", B64.encode(proof)),
        ))
    }
}

impl ClientFinal {
    /// Check the server-final-message: the server proved it knows the user's keys.
    pub fn verify_server(&self, server_final: &str) -> Result<(), ScramError> {
        let v = server_final
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or_else(|| malformed("server-final-message must be v=<base64 signature>"))?;
        if bool::from(v.ct_eq(&self.server_signature)) {
            Ok(())
        } else {
            Err(ScramError::InvalidProof)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SCRAM client, written from RFC 5802 §3, to drive the server in tests.
    fn client_final(
        mech: Mechanism,
        password: &[u8],
        client_first_bare: &str,
        gs2: &str,
        server_first: &str,
    ) -> (String, String) {
        let mut nonce = "";
        let mut salt = Vec::new();
        let mut iterations = 0;
        for a in server_first.split(',') {
            if let Some(v) = a.strip_prefix("r=") {
                nonce = v;
            } else if let Some(v) = a.strip_prefix("s=") {
                salt = B64.decode(v).expect("salt");
            } else if let Some(v) = a.strip_prefix("i=") {
                iterations = v.parse().expect("i");
            }
        }
        let salted = mech.salted_password(password, &salt, iterations);
        let client_key = mech.hmac(&salted, &[b"Client Key"]);
        let stored_key = mech.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode(gs2));
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = mech.hmac(&stored_key, &[auth.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let server_key = mech.hmac(&salted, &[b"Server Key"]);
        let v = mech.hmac(&server_key, &[auth.as_bytes()]);
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            format!("v={}", B64.encode(v)),
        )
    }

    /// RFC 7677 §3's example exchange, byte for byte.
    #[test]
    fn rfc7677_example() {
        let cf = ClientFirst::parse(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").expect("parse");
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let creds = Credentials::from_password(Mechanism::Sha256, b"pencil", salt, 4096);
        let (state, sf) = ServerFirst::start(cf, creds, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
        assert_eq!(
            sf,
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let v = state
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .expect("verified");
        assert_eq!(v.username, "user");
        assert_eq!(
            v.server_final,
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    fn run(
        mech: Mechanism,
        stored_pw: &[u8],
        client_pw: &[u8],
        first: &str,
    ) -> Result<Verified, ScramError> {
        let cf = ClientFirst::parse(first.as_bytes())?;
        let creds = Credentials::from_password(mech, stored_pw, b"salty".to_vec(), 64);
        let gs2 = cf.gs2_header.clone();
        let bare = cf.bare.clone();
        let (state, sf) = ServerFirst::start(cf, creds, "srv");
        let (cfinal, expect_v) = client_final(mech, client_pw, &bare, &gs2, &sf);
        let v = state.finish(cfinal.as_bytes())?;
        assert_eq!(v.server_final, expect_v);
        Ok(v)
    }

    #[test]
    fn both_mechanisms_verify_and_reject() {
        for mech in Mechanism::ALL {
            let v = run(mech, b"pw", b"pw", "n,,n=alice,r=abc").expect("ok");
            assert_eq!(v.username, "alice");
            assert_eq!(
                run(mech, b"pw", b"wrong", "n,,n=alice,r=abc"),
                Err(ScramError::InvalidProof)
            );
            // authzid equal to the user, and the `y` flag, are fine.
            run(mech, b"pw", b"pw", "y,a=alice,n=alice,r=abc").expect("authzid");
        }
    }

    #[test]
    fn client_side_against_server_side() {
        for mech in Mechanism::ALL {
            let (client, first) = Client::start(mech, "a,b=c", b"pw", "cnonce");
            let cf = ClientFirst::parse(first.as_bytes()).expect("parse");
            assert_eq!(cf.username, "a,b=c");
            let creds = Credentials::from_password(mech, b"pw", b"salt".to_vec(), 8);
            let (state, sf) = ServerFirst::start(cf, creds, "snonce");
            let (fin, cfinal) = client.finish(&sf).expect("client final");
            let v = state.finish(cfinal.as_bytes()).expect("verified");
            fin.verify_server(&v.server_final).expect("server verified");
            assert_eq!(
                fin.verify_server("v=AAAA"),
                Err(ScramError::InvalidProof),
                "a wrong server signature"
            );
        }
    }

    /// Found by fuzzing: a server-first-message with `i=4294967295` kept the client in PBKDF2
    /// for hours. It is refused at once.
    #[test]
    fn client_refuses_a_huge_iteration_count() {
        let (client, _) = Client::start(Mechanism::Sha512, "u", b"pw", "cn");
        let t = std::time::Instant::now();
        let e = client
            .clone()
            .finish("r=cnXX,s=c2FsdA==,i=4294967295")
            .expect_err("refused");
        assert!(matches!(e, ScramError::Malformed(_)), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(client
            .max_iterations(4)
            .finish("r=cnXX,s=c2FsdA==,i=5")
            .is_err());
    }

    #[test]
    fn mosquitto_7_entry_is_the_salted_password() {
        // What `$7$` stores: PBKDF2-HMAC-SHA512(password, salt, i, 64).
        let salt = b"0123456789ab".to_vec();
        let mut stored = vec![0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(b"secret", &salt, 101, &mut stored);
        let a = Credentials::from_salted_password(Mechanism::Sha512, salt.clone(), 101, &stored);
        let b = Credentials::from_password(Mechanism::Sha512, b"secret", salt, 101);
        assert!(a == b);
    }

    #[test]
    fn unknown_user_is_stable_and_never_verifies() {
        let a = Credentials::unknown(Mechanism::Sha512, "bob", b"secret", 101);
        let b = Credentials::unknown(Mechanism::Sha512, "bob", b"secret", 101);
        let c = Credentials::unknown(Mechanism::Sha512, "eve", b"secret", 101);
        assert_eq!(a.salt, b.salt);
        assert_ne!(a.salt, c.salt);
        let cf = ClientFirst::parse(b"n,,n=bob,r=x").expect("parse");
        let (state, sf) = ServerFirst::start(cf, a, "y");
        // Even a proof made with the fake keys does not pass.
        let (cfinal, _) = client_final(Mechanism::Sha512, b"anything", "n=bob,r=x", "n,,", &sf);
        assert_eq!(
            state.finish(cfinal.as_bytes()),
            Err(ScramError::InvalidProof)
        );
    }

    #[test]
    fn grammar_errors() {
        let bad = |m: &str| ClientFirst::parse(m.as_bytes()).expect_err(m);
        assert_eq!(
            bad("p=tls-unique,,n=a,r=b"),
            ScramError::ChannelBindingNotSupported
        );
        assert_eq!(bad("n,a=bob,n=alice,r=b"), ScramError::AuthzidNotPermitted);
        assert!(matches!(bad("n,,n=a"), ScramError::Malformed(_)));
        assert!(matches!(bad("n,,r=b,n=a"), ScramError::Malformed(_)));
        assert!(matches!(bad("n,,m=x,n=a,r=b"), ScramError::Malformed(_)));
        assert!(matches!(bad("n,,n=a=b,r=c"), ScramError::Malformed(_)));
        assert!(matches!(bad("x,,n=a,r=c"), ScramError::Malformed(_)));
        assert!(matches!(bad("n,,n=,r=c"), ScramError::Malformed(_)));
        let cf = ClientFirst::parse(b"n,,n=a=2Cb=3Dc,r=xyz").expect("escapes");
        assert_eq!(cf.username, "a,b=c");

        let creds = Credentials::from_password(Mechanism::Sha256, b"pw", b"s".to_vec(), 2);
        let start = || {
            let cf = ClientFirst::parse(b"n,,n=a,r=xyz").expect("parse");
            ServerFirst::start(cf, creds.clone(), "S").0
        };
        let fin = |m: &str| start().finish(m.as_bytes()).expect_err(m);
        assert_eq!(fin("c=biws,r=xyzT,p=AAAA"), ScramError::NonceMismatch);
        assert_eq!(fin("c=eSws,r=xyzS,p=AAAA"), ScramError::BindingMismatch);
        assert_eq!(fin("c=biws,r=xyzS,p=AAAA"), ScramError::InvalidProof);
        assert!(matches!(fin("c=biws,r=xyzS"), ScramError::Malformed(_)));
        assert!(matches!(
            fin("c=!!,r=xyzS,p=AAAA"),
            ScramError::Malformed(_)
        ));
    }
}
