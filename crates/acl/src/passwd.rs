//! Password files compatible with `mosquitto_passwd` (mosquitto 2.x).
//!
//! One entry per line, `username:hash`, where `hash` is either
//!
//! * `$7$<iterations>$<base64 salt>$<base64 hash>`: PBKDF2-HMAC-SHA512 (mosquitto's default
//!   since 2.0; `mosquitto_passwd` uses 101 iterations, a 12-byte salt and a 64-byte hash), or
//! * `$6$<base64 salt>$<base64 hash>`: `SHA-512(password || salt)` (mosquitto 1.6 and earlier,
//!   `mosquitto_passwd -H sha512`), or
//! * `SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>`: a
//!   SCRAM-SHA-256 secret in PostgreSQL's notation (`lanemq passwd --scram-sha-256`; lanemq
//!   only, mosquitto cannot read such a line). It verifies a CONNECT password too.
//!
//! For MQTT 5 enhanced authentication ([`crate::scram`]), a `$7$` entry is SCRAM-SHA-512's
//! SaltedPassword as it stands, and a `SCRAM-SHA-256$` entry is SCRAM-SHA-256's stored keys.
//!
//! As in mosquitto, blank lines and lines beginning with `#` are ignored and blanks around the
//! username and the hash are trimmed. Unlike mosquitto, which skips them silently, a line
//! without `:`, a plain-text password, an unknown hash type or a duplicate username is a
//! [`ParseError`] with line and column, so a typo never silently removes or keeps a user.
//!
//! `PasswordFile::to_string()` (via `Display`) writes the file back with its comments and the
//! order of its entries preserved; changed entries are always written as `$7$`.

use crate::error::{read_file, LoadError, ParseError};
use crate::scram::{Credentials, Mechanism, SCRAM_SHA256_ITERATIONS};
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use sha2::{Digest, Sha256, Sha512};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use subtle::ConstantTimeEq;

/// PBKDF2 iterations of new entries: what `mosquitto_passwd` 2.0 writes.
pub const DEFAULT_ITERATIONS: u32 = 101;
/// Salt length of new entries, as `mosquitto_passwd` (12 bytes).
const SALT_LEN: usize = 12;
/// SHA-512 output length.
const HASH_LEN: usize = 64;
/// Upper bound on the iterations accepted from a file, so that a corrupted or hostile entry
/// cannot make every CONNECT cost minutes of CPU.
const MAX_ITERATIONS: u32 = 10_000_000;

/// Padded on output (as mosquitto/OpenSSL write it), padding optional on input.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A parsed password hash.
#[derive(Clone, PartialEq, Eq)]
enum Hash {
    /// `$6$`: SHA-512(password || salt).
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    /// `SCRAM-SHA-256$`: the stored keys of SCRAM-SHA-256 (RFC 5802 §3).
    Scram256 {
        iterations: u32,
        salt: Vec<u8>,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    },
}

impl Hash {
    fn compute(&self, password: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha512 { salt, .. } => {
                let mut d = Sha512::new();
                d.update(password);
                d.update(salt);
                d.finalize().to_vec()
            }
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => {
                let mut out = vec![0u8; hash.len()];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut out);
                out
            }
            Hash::Scram256 {
                iterations, salt, ..
            } => {
                Credentials::from_password(Mechanism::Sha256, password, salt.clone(), *iterations)
                    .stored_key
            }
        }
    }

    fn expected(&self) -> &[u8] {
        match self {
            Hash::Sha512 { hash, .. } | Hash::Pbkdf2 { hash, .. } => hash,
            Hash::Scram256 { stored_key, .. } => stored_key,
        }
    }

    /// The SCRAM credentials this entry holds for `mechanism`, if any.
    fn scram(&self, mechanism: Mechanism) -> Option<Credentials> {
        match (self, mechanism) {
            (
                Hash::Pbkdf2 {
                    iterations,
                    salt,
                    hash,
                },
                Mechanism::Sha512,
            ) => Some(Credentials::from_salted_password(
                mechanism,
                salt.clone(),
                *iterations,
                hash,
            )),
            (
                Hash::Scram256 {
                    iterations,
                    salt,
                    stored_key,
                    server_key,
                },
                Mechanism::Sha256,
            ) => Some(Credentials::from_keys(
                mechanism,
                salt.clone(),
                *iterations,
                stored_key.clone(),
                server_key.clone(),
            )),
            _ => None,
        }
    }

    fn encode(&self) -> String {
        match self {
            Hash::Sha512 { salt, hash } => {
                format!("$6${}${}", B64.encode(salt), B64.encode(hash))
            }
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => format!("$7${iterations}${}${}", B64.encode(salt), B64.encode(hash)),
            Hash::Scram256 {
                iterations,
                salt,
                stored_key,
                server_key,
            } => format!(
                "SCRAM-SHA-256${iterations}:{}${}:{}",
                B64.encode(salt),
                B64.encode(stored_key),
                B64.encode(server_key)
            ),
        }
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print hashes or salts in logs.
        match self {
            Hash::Sha512 { .. } => f.write_str("$6$…"),
            Hash::Pbkdf2 { iterations, .. } => write!(f, "$7${iterations}$…"),
            Hash::Scram256 { iterations, .. } => write!(f, "SCRAM-SHA-256${iterations}:…"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    /// A comment or blank line, kept verbatim.
    Other(String),
    /// An entry; the original text is kept so an untouched file round-trips byte for byte.
    Entry {
        user: String,
        hash: Hash,
        text: String,
    },
}

/// A password file in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PasswordFile {
    lines: Vec<Line>,
    /// username -> index into `lines`.
    index: HashMap<String, usize>,
    /// Keys the salts of unknown users in SCRAM exchanges: a digest of the file as read, so
    /// it is stable across restarts and unknown to whoever cannot read the file.
    scram_secret: [u8; 32],
}

/// Why a password file could not be changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswdError {
    /// The username is empty or contains `:`, a control character, or blanks at either end
    /// (mosquitto could not read it back).
    InvalidUsername(String),
    /// The operating system's random number generator failed.
    Random(String),
}

impl fmt::Display for PasswdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswdError::InvalidUsername(u) => write!(
                f,
                "invalid username {u:?}: must be non-empty, without ':', control characters or surrounding blanks"
            ),
            PasswdError::Random(e) => write!(f, "random number generator failed: {e}"),
        }
    }
}

impl std::error::Error for PasswdError {}

fn is_blank(c: char) -> bool {
    c.is_ascii_whitespace()
}

/// Is `user` a username that can be stored in (and read back from) a password file?
pub fn valid_username(user: &str) -> bool {
    !user.is_empty()
        && !user.contains(':')
        && !user.chars().any(char::is_control)
        && !user.starts_with(is_blank)
        && !user.ends_with(is_blank)
}

/// A dummy `$7$` entry verified against when the user is unknown, so that an unknown user
/// costs as much as a wrong password.
fn dummy_hash() -> Hash {
    Hash::Pbkdf2 {
        iterations: DEFAULT_ITERATIONS,
        salt: vec![0x5a; SALT_LEN],
        hash: vec![0; HASH_LEN],
    }
}

fn err(file: &str, line: usize, column: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        file: file.to_string(),
        line,
        column,
        message: message.into(),
    }
}

/// Column (1-based, in characters) of byte offset `at` in `line`.
fn col(line: &str, at: usize) -> usize {
    line.get(..at).map_or(1, |s| s.chars().count() + 1)
}

/// Parse the hash part of an entry; `Err((byte offset within hash, message))`.
fn parse_hash(text: &str) -> Result<Hash, (usize, String)> {
    let decode = |field: &str, at: usize, what: &str| -> Result<Vec<u8>, (usize, String)> {
        B64.decode(field)
            .map_err(|e| (at, format!("{what} is not valid base64: {e}")))
    };
    if let Some(rest) = text.strip_prefix("$7$") {
        let mut parts = rest.split('$');
        let (Some(iter), Some(salt), Some(hash), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err((
                0,
                "a $7$ entry is $7$<iterations>$<base64 salt>$<base64 hash>".into(),
            ));
        };
        let iterations: u32 = iter
            .parse()
            .ok()
            .filter(|n| (1..=MAX_ITERATIONS).contains(n))
            .ok_or_else(|| {
                (
                    3,
                    format!("iterations must be an integer from 1 to {MAX_ITERATIONS}"),
                )
            })?;
        let salt_at = 3 + iter.len() + 1;
        let salt = decode(salt, salt_at, "salt")?;
        let hash_at = 3 + parts_len(rest, 1) + 1;
        let hash = decode(hash, hash_at, "hash")?;
        if salt.is_empty() {
            return Err((salt_at, "empty salt".into()));
        }
        if hash.len() != HASH_LEN {
            return Err((
                hash_at,
                format!(
                    "hash is {} bytes, PBKDF2-SHA512 makes {HASH_LEN}",
                    hash.len()
                ),
            ));
        }
        Ok(Hash::Pbkdf2 {
            iterations,
            salt,
            hash,
        })
    } else if let Some(rest) = text.strip_prefix("$6$") {
        let mut parts = rest.split('$');
        let (Some(salt), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err((0, "a $6$ entry is $6$<base64 salt>$<base64 hash>".into()));
        };
        let salt_at = 3;
        let salt = decode(salt, salt_at, "salt")?;
        let hash_at = salt_at + parts_len(rest, 0) + 1;
        let hash = decode(hash, hash_at, "hash")?;
        if salt.is_empty() {
            return Err((salt_at, "empty salt".into()));
        }
        if hash.len() != HASH_LEN {
            return Err((
                hash_at,
                format!("hash is {} bytes, SHA-512 makes {HASH_LEN}", hash.len()),
            ));
        }
        Ok(Hash::Sha512 { salt, hash })
    } else if let Some(rest) = text.strip_prefix("SCRAM-SHA-256$") {
        const PREFIX: usize = "SCRAM-SHA-256$".len();
        let shape = "a SCRAM-SHA-256 entry is SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>";
        let Some((params, keys)) = rest.split_once('$') else {
            return Err((0, shape.into()));
        };
        let (Some((iter, salt)), Some((stored, server))) =
            (params.split_once(':'), keys.split_once(':'))
        else {
            return Err((0, shape.into()));
        };
        let iterations: u32 = iter
            .parse()
            .ok()
            .filter(|n| (1..=MAX_ITERATIONS).contains(n))
            .ok_or_else(|| {
                (
                    PREFIX,
                    format!("iterations must be an integer from 1 to {MAX_ITERATIONS}"),
                )
            })?;
        let salt_at = PREFIX + iter.len() + 1;
        let salt = decode(salt, salt_at, "salt")?;
        if salt.is_empty() {
            return Err((salt_at, "empty salt".into()));
        }
        let stored_at = PREFIX + params.len() + 1;
        let stored_key = decode(stored, stored_at, "StoredKey")?;
        let server_at = stored_at + stored.len() + 1;
        let server_key = decode(server, server_at, "ServerKey")?;
        for (key, at) in [(&stored_key, stored_at), (&server_key, server_at)] {
            if key.len() != 32 {
                return Err((at, format!("key is {} bytes, SHA-256 makes 32", key.len())));
            }
        }
        Ok(Hash::Scram256 {
            iterations,
            salt,
            stored_key,
            server_key,
        })
    } else {
        Err((
            0,
            "expected a $7$ (PBKDF2-SHA512), $6$ (SHA-512) or SCRAM-SHA-256$ hash; plain-text passwords are not accepted (hash them with `lanemq passwd` or `mosquitto_passwd -U`)".into(),
        ))
    }
}

/// Byte offset just past the `$`-separated field `n` of `s`.
fn parts_len(s: &str, n: usize) -> usize {
    s.split('$').take(n + 1).map(|p| p.len() + 1).sum::<usize>() - 1
}

impl PasswordFile {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse the text of a password file (errors name the file `<passwd>`).
    pub fn parse(text: &str) -> Result<PasswordFile, ParseError> {
        Self::parse_named(text, "<passwd>")
    }

    /// Parse the text of a password file; `source_name` names it in errors.
    pub fn parse_named(text: &str, source_name: &str) -> Result<PasswordFile, ParseError> {
        let mut file = PasswordFile::default();
        let mut d = Sha256::new();
        d.update(b"lanemq scram unknown-user salt\0");
        d.update(text.as_bytes());
        file.scram_secret = d.finalize().into();
        for (i, raw) in text.lines().enumerate() {
            let lineno = i + 1;
            let trimmed = raw.trim_matches(is_blank);
            if trimmed.is_empty() || raw.starts_with('#') {
                file.lines.push(Line::Other(raw.to_string()));
                continue;
            }
            let Some(colon) = raw.find(':') else {
                return Err(err(
                    source_name,
                    lineno,
                    col(raw, raw.len() - raw.trim_start_matches(is_blank).len()),
                    "expected `username:hash`",
                ));
            };
            let user_raw = &raw[..colon];
            let user = user_raw.trim_matches(is_blank);
            let user_at = user_raw.len() - user_raw.trim_start_matches(is_blank).len();
            if user.is_empty() {
                return Err(err(source_name, lineno, col(raw, colon), "empty username"));
            }
            if user.chars().any(char::is_control) {
                return Err(err(
                    source_name,
                    lineno,
                    col(raw, user_at),
                    "control character in username",
                ));
            }
            let hash_raw = &raw[colon + 1..];
            let hash_at =
                colon + 1 + (hash_raw.len() - hash_raw.trim_start_matches(is_blank).len());
            let hash_text = hash_raw.trim_matches(is_blank);
            let hash = parse_hash(hash_text).map_err(|(at, message)| {
                err(source_name, lineno, col(raw, hash_at + at), message)
            })?;
            if let Some(&prev) = file.index.get(user) {
                return Err(err(
                    source_name,
                    lineno,
                    col(raw, user_at),
                    format!("duplicate username {user:?} (first on line {})", prev + 1),
                ));
            }
            file.index.insert(user.to_string(), file.lines.len());
            file.lines.push(Line::Entry {
                user: user.to_string(),
                hash,
                text: raw.to_string(),
            });
        }
        Ok(file)
    }

    /// Read and parse the password file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<PasswordFile, LoadError> {
        let path = path.as_ref();
        let text = read_file(path)?;
        Ok(Self::parse_named(&text, &path.display().to_string())?)
    }

    /// Write the file to `path` atomically (a temporary file in the same directory, then
    /// rename), readable and writable by its owner only on Unix.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        use std::io::Write;
        let path = path.as_ref();
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        {
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&tmp)?;
            f.write_all(self.to_string().as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }

    /// Does `password` match the entry of `user`? An unknown user costs one PBKDF2 computation
    /// like a known one; the comparison of the hashes is constant-time.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        let entry = self.index.get(user).and_then(|&i| match self.lines.get(i) {
            Some(Line::Entry { hash, .. }) => Some(hash),
            _ => None,
        });
        match entry {
            Some(hash) => {
                let got = hash.compute(password);
                bool::from(got.as_slice().ct_eq(hash.expected()))
            }
            None => {
                let dummy = dummy_hash();
                let got = dummy.compute(password);
                // Compare anyway so the unknown-user path does the same work.
                let _ = bool::from(got.as_slice().ct_eq(dummy.expected()));
                false
            }
        }
    }

    /// The SCRAM credentials of `user` for `mechanism`: from a `$7$` entry for SCRAM-SHA-512,
    /// from a `SCRAM-SHA-256$` entry for SCRAM-SHA-256. A user without a usable entry gets
    /// [`Credentials::unknown`], which never verifies but looks like a real user's.
    pub fn scram_credentials(&self, user: &str, mechanism: Mechanism) -> Credentials {
        let entry = self.index.get(user).and_then(|&i| match self.lines.get(i) {
            Some(Line::Entry { hash, .. }) => hash.scram(mechanism),
            _ => None,
        });
        entry.unwrap_or_else(|| {
            let iterations = match mechanism {
                Mechanism::Sha512 => DEFAULT_ITERATIONS,
                Mechanism::Sha256 => SCRAM_SHA256_ITERATIONS,
            };
            Credentials::unknown(mechanism, user, &self.scram_secret, iterations)
        })
    }

    /// Add `user` or replace its password, as a `SCRAM-SHA-256$` entry (4096 iterations, a
    /// fresh random 16-byte salt). Such an entry serves SCRAM-SHA-256 and CONNECT passwords.
    pub fn upsert_scram_sha256(&mut self, user: &str, password: &[u8]) -> Result<(), PasswdError> {
        if !valid_username(user) {
            return Err(PasswdError::InvalidUsername(user.to_string()));
        }
        let mut salt = vec![0u8; 16];
        getrandom::fill(&mut salt).map_err(|e| PasswdError::Random(e.to_string()))?;
        let c =
            Credentials::from_password(Mechanism::Sha256, password, salt, SCRAM_SHA256_ITERATIONS);
        self.put(
            user,
            Hash::Scram256 {
                iterations: c.iterations,
                salt: c.salt,
                stored_key: c.stored_key,
                server_key: c.server_key,
            },
        );
        Ok(())
    }

    /// Add `user` or replace its password, as a `$7$` entry with [`DEFAULT_ITERATIONS`] and a
    /// fresh random 12-byte salt. An existing entry keeps its place in the file.
    pub fn upsert(&mut self, user: &str, password: &[u8]) -> Result<(), PasswdError> {
        self.upsert_with_iterations(user, password, DEFAULT_ITERATIONS)
    }

    /// [`upsert`](Self::upsert) with a chosen iteration count (clamped to 1..=10,000,000).
    pub fn upsert_with_iterations(
        &mut self,
        user: &str,
        password: &[u8],
        iterations: u32,
    ) -> Result<(), PasswdError> {
        if !valid_username(user) {
            return Err(PasswdError::InvalidUsername(user.to_string()));
        }
        let mut salt = vec![0u8; SALT_LEN];
        getrandom::fill(&mut salt).map_err(|e| PasswdError::Random(e.to_string()))?;
        let iterations = iterations.clamp(1, MAX_ITERATIONS);
        let mut hash = Hash::Pbkdf2 {
            iterations,
            salt,
            hash: vec![0; HASH_LEN],
        };
        let computed = hash.compute(password);
        if let Hash::Pbkdf2 { hash: h, .. } = &mut hash {
            *h = computed;
        }
        self.put(user, hash);
        Ok(())
    }

    /// Set the entry of a valid `user`, in place if it exists, else at the end.
    fn put(&mut self, user: &str, hash: Hash) {
        let text = format!("{user}:{}", hash.encode());
        let line = Line::Entry {
            user: user.to_string(),
            hash,
            text,
        };
        match self.index.get(user) {
            Some(&i) => {
                if let Some(slot) = self.lines.get_mut(i) {
                    *slot = line;
                }
            }
            None => {
                self.index.insert(user.to_string(), self.lines.len());
                self.lines.push(line);
            }
        }
    }

    /// Remove `user`; false if there was no such entry.
    pub fn remove(&mut self, user: &str) -> bool {
        let Some(i) = self.index.remove(user) else {
            return false;
        };
        self.lines.remove(i);
        for v in self.index.values_mut() {
            if *v > i {
                *v -= 1;
            }
        }
        true
    }

    /// Is there an entry for `user`?
    pub fn contains(&self, user: &str) -> bool {
        self.index.contains_key(user)
    }

    /// The usernames, in file order.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().filter_map(|l| match l {
            Line::Entry { user, .. } => Some(user.as_str()),
            Line::Other(_) => None,
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// No entries?
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

impl fmt::Display for PasswordFile {
    /// The file's text: comments and untouched entries verbatim, one line each, `\n`-terminated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            match line {
                Line::Other(s) => writeln!(f, "{s}")?,
                Line::Entry { text, .. } => writeln!(f, "{text}")?,
            }
        }
        Ok(())
    }
}
