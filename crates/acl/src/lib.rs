//! lanemq authentication and authorization, as a pure library (no I/O beyond reading and
//! writing the files it is given, no async runtime).
//!
//! * [`PasswordFile`]: password files compatible with `mosquitto_passwd` (`$7$` PBKDF2-SHA512
//!   and `$6$` salted SHA-512 entries), constant-time verification, `$7$` entries for new or
//!   changed passwords, and `SCRAM-SHA-256$` entries.
//! * [`scram`]: the server side of SCRAM-SHA-256/-512 (RFC 5802/7677) for MQTT 5 enhanced
//!   authentication, on the credentials of a [`PasswordFile`].
//! * [`Acl`]: the line-oriented ACL format documented in `docs/security.md` and in
//!   [`acl`]: ordered `allow`/`deny` rules by username, client id, IP/CIDR or everyone;
//!   actions `publish`, `subscribe`, `create`; exact topics, MQTT filters and regular
//!   expressions, `%u`/`%c` placeholders; first match wins, `default allow|deny` otherwise.
//!
//! The `$`-topic rules that close the holes EMQX documents for its streams are built into the
//! matching itself: a rule filter whose first level is `+` or `#` never matches anything that
//! begins with `$`, and `$stream/...`/`$s/...` subscriptions are authorized on their full
//! string (see [`Acl::check_subscribe`] for auto-created streams).

pub mod acl;
mod error;
pub mod passwd;
pub mod scram;
mod topic;

pub use acl::{Acl, Action, DecidedBy, Decision, Request, RuleRef};
pub use error::{LoadError, ParseError};
pub use passwd::{PasswdError, PasswordFile, DEFAULT_ITERATIONS};
