//! The API token: configured, or kept in `<data_dir>/admin.token`.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Name of the token file in the data directory.
pub const TOKEN_FILE: &str = "admin.token";

fn empty(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what}: the admin API token is empty"),
    )
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

fn read_token(path: &Path) -> io::Result<String> {
    let t = fs::read_to_string(path)?;
    let t = t.trim();
    if t.is_empty() {
        return Err(empty(&path.display().to_string()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(md) = fs::metadata(path) {
            if md.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    "the admin token file is readable by other users; chmod 600 it"
                );
            }
        }
    }
    Ok(t.to_string())
}

/// The admin API token and, when it lives in a file, that file's path.
///
/// - `configured` (trimmed) wins; the path is `None`.
/// - Otherwise `<data_dir>/admin.token` (trimmed) when it exists.
/// - Otherwise 32 random bytes, hex-encoded (64 characters), written to a new
///   `<data_dir>/admin.token` with mode 0600 (the directory is created if needed).
///
/// An empty token (configured or in the file) is an error.
pub fn load_or_create_token(
    data_dir: &Path,
    configured: Option<&str>,
) -> io::Result<(String, Option<PathBuf>)> {
    if let Some(c) = configured {
        let c = c.trim();
        if c.is_empty() {
            return Err(empty("configuration"));
        }
        return Ok((c.to_string(), None));
    }
    let path = data_dir.join(TOKEN_FILE);
    match read_token(&path) {
        Ok(t) => return Ok((t, Some(path))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::create_dir_all(data_dir)?;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| io::Error::other(format!("random token: {e}")))?;
    let token = hex(&raw);
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(&path) {
        Ok(mut f) => {
            f.write_all(token.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            Ok((token, Some(path)))
        }
        // Another process created it between our read and our create: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read_token(&path).map(|t| (t, Some(path)))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).expect("random");
        let d = std::env::temp_dir().join(format!("lanemq-admin-{tag}-{}", hex(&raw)));
        fs::create_dir_all(&d).expect("tmpdir");
        d
    }

    #[test]
    fn generated_token_is_64_hex_in_a_0600_file() {
        let d = tmpdir("gen");
        let (t, p) = load_or_create_token(&d, None).expect("token");
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        let p = p.expect("path");
        assert_eq!(p, d.join(TOKEN_FILE));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn existing_token_file_is_reused() {
        let d = tmpdir("reuse");
        let (t1, _) = load_or_create_token(&d, None).expect("first");
        let (t2, p) = load_or_create_token(&d, None).expect("second");
        assert_eq!(t1, t2);
        assert!(p.is_some());
        fs::write(d.join(TOKEN_FILE), "  handwritten\n").expect("write");
        assert_eq!(
            load_or_create_token(&d, None).expect("third").0,
            "handwritten"
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn configured_token_wins_and_writes_nothing() {
        let d = tmpdir("conf");
        let (t, p) = load_or_create_token(&d, Some("secret")).expect("token");
        assert_eq!(t, "secret");
        assert!(p.is_none());
        assert!(!d.join(TOKEN_FILE).exists());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn empty_tokens_are_refused() {
        let d = tmpdir("empty");
        assert!(load_or_create_token(&d, Some("  ")).is_err());
        fs::write(d.join(TOKEN_FILE), "\n").expect("write");
        assert!(load_or_create_token(&d, None).is_err());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn missing_data_dir_is_created() {
        let d = tmpdir("mk").join("sub");
        let (_, p) = load_or_create_token(&d, None).expect("token");
        assert!(p.is_some_and(|p| p.exists()));
        let _ = fs::remove_dir_all(d.parent().expect("parent"));
    }
}
