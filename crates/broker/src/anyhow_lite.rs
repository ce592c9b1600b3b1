//! The error of starting a server ([`crate::Server::start`]) and of building listeners: one
//! message, no backtrace; a tiny type so the broker library does not pull in anyhow.
//! Low level: imports nothing of the crate.

#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
