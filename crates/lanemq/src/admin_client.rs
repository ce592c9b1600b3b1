//! The REST admin API as the command line uses it (`lanemq streams`, `lanemq lanes`): the
//! connection options, the token lookup, requests whose HTTP errors become the server's
//! message, and small output helpers. Imports nothing of the other CLI modules.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use std::path::PathBuf;

/// Where the admin API is and how to authenticate (valid before or after the subcommand;
/// flattened into `lanemq streams` and `lanemq lanes`).
#[derive(Args)]
pub struct ConnArgs {
    /// Admin API address: `host:port` or `http://host:port`.
    #[arg(
        long,
        visible_alias = "addr",
        env = "LANEMQ_ADMIN_ADDR",
        default_value = "127.0.0.1:18083",
        global = true
    )]
    url: String,
    /// Bearer token (else --token-file, else <data-dir>/admin.token).
    #[arg(
        long,
        env = "LANEMQ_ADMIN_TOKEN",
        global = true,
        hide_env_values = true
    )]
    token: Option<String>,
    /// File holding the token.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// Data directory of the broker, where it keeps admin.token.
    #[arg(long, env = "LANEMQ_DATA_DIR", default_value = "data", global = true)]
    data_dir: PathBuf,
}

impl ConnArgs {
    /// The endpoint and the token these options give.
    pub(crate) fn api(&self) -> Result<Api> {
        Ok(Api {
            addr: host_port(&self.url)?,
            token: resolve_token(
                self.token.as_deref(),
                self.token_file.as_deref(),
                &self.data_dir,
            )?,
        })
    }
}

/// The admin API endpoint and token.
pub(crate) struct Api {
    pub(crate) addr: String,
    pub(crate) token: String,
}

/// `host:port` from `host:port`, `http://host:port` or `http://host:port/`.
pub(crate) fn host_port(url: &str) -> Result<String> {
    let u = url.trim();
    if u.starts_with("https://") {
        bail!("--url {u}: https is not supported (the admin API speaks plain HTTP on loopback)");
    }
    let u = u.strip_prefix("http://").unwrap_or(u);
    let u = u.trim_end_matches('/');
    if u.is_empty() || u.contains('/') {
        bail!("--url {url:?}: expected host:port or http://host:port");
    }
    Ok(u.to_string())
}

/// The token: `--token`, else `--token-file`, else `<data-dir>/admin.token`.
pub(crate) fn resolve_token(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
    data_dir: &std::path::Path,
) -> Result<String> {
    if let Some(t) = token {
        let t = t.trim();
        if t.is_empty() {
            bail!("--token / LANEMQ_ADMIN_TOKEN is empty");
        }
        return Ok(t.to_string());
    }
    let path = token_file
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| data_dir.join("admin.token"));
    let t = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no admin API token: cannot read {} (pass --token, set LANEMQ_ADMIN_TOKEN, \
             or point --token-file / --data-dir at the broker's token)",
            path.display()
        )
    })?;
    let t = t.trim();
    if t.is_empty() {
        bail!("{}: the token file is empty", path.display());
    }
    Ok(t.to_string())
}

/// Percent-encodes a path segment (stream names are plain, but be safe).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// Sends a request; an HTTP status >= 400 becomes an error with the server's message.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let body = body.map(Value::to_string);
        let (status, text) =
            lanemq_admin::client::request(&self.addr, &self.token, method, path, body.as_deref())
                .with_context(|| {
                format!(
                    "cannot reach the admin API at {} (is the broker running with \
                         [admin] enable = true?)",
                    self.addr
                )
            })?;
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
        };
        if status >= 400 {
            let code = value.get("code").and_then(Value::as_str).unwrap_or("");
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| text.trim().to_string());
            bail!("{method} {path}: HTTP {status} {code}: {message}");
        }
        Ok((status, value))
    }
}

pub(crate) fn print_pretty(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_become_host_port() {
        assert_eq!(host_port("127.0.0.1:18083").unwrap(), "127.0.0.1:18083");
        assert_eq!(host_port("http://localhost:1/").unwrap(), "localhost:1");
        assert!(host_port("https://x:1").is_err());
        assert!(host_port("http://x:1/api").is_err());
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(segment("a.b-c_d"), "a.b-c_d");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
