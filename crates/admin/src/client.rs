//! A minimal blocking HTTP/1.1 client for the admin API (one request per connection).
//!
//! Used by the `lanemq streams ...` command line and by tests. It speaks just enough HTTP:
//! `Connection: close`, a `Content-Length` request body, and responses framed by
//! `Content-Length`, chunked transfer encoding, or the end of the connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connect, read and write timeout.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted.
const MAX_RESPONSE: usize = 64 << 20;
/// Longest status or header line accepted.
const MAX_LINE: usize = 16 << 10;

/// A response: status, headers (names lower-cased, in order) and the body as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Sends `method path` to `addr` (`host:port`) with `Authorization: Bearer <token>` and, when
/// given, a JSON body. Returns the status and the body.
pub fn request(
    addr: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<(u16, String)> {
    let auth = format!("Bearer {token}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let r = request_with_headers(addr, method, path, &headers, body.map(str::as_bytes))?;
    Ok((r.status, r.body))
}

/// Sends a request with exactly these extra headers (besides `Host`, `Content-Length`,
/// `Connection: close` and `Accept: application/json` unless `headers` has an `Accept`) and
/// returns the whole response.
pub fn request_with_headers(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<Response> {
    for (n, v) in headers {
        if [n, v].iter().any(|s| s.contains(['\r', '\n'])) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "header with a line break",
            ));
        }
    }
    if !path.starts_with('/') || path.contains([' ', '\r', '\n']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid request path {path:?}"),
        ));
    }
    let stream = connect(addr)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = body.unwrap_or(&[]);
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("accept"))
    {
        head.push_str("Accept: application/json\r\n");
    }
    head.push_str("Connection: close\r\n\r\n");

    let mut w = &stream;
    let sent = w
        .write_all(head.as_bytes())
        .and_then(|()| w.write_all(body))
        .and_then(|()| w.flush());
    // A server may answer (413, 401) and close before reading the whole body: the write then
    // fails, but the answer is still readable.
    match (read_response(&stream), sent) {
        (Ok(r), _) => Ok(r),
        (Err(e), Ok(())) => Err(e),
        (Err(_), Err(e)) => Err(e),
    }
}

fn connect(addr: &str) -> io::Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, TIMEOUT) {
            Ok(s) => {
                s.set_read_timeout(Some(TIMEOUT))?;
                s.set_write_timeout(Some(TIMEOUT))?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: no address"))
    }))
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut buf = Vec::new();
    let n = r.take(MAX_LINE as u64).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the response was complete",
        ));
    }
    if buf.last() != Some(&b'\n') {
        return Err(bad("response line too long"));
    }
    while matches!(buf.last(), Some(b'\n' | b'\r')) {
        buf.pop();
    }
    String::from_utf8(buf).map_err(|_| bad("response line is not UTF-8"))
}

fn read_head(r: &mut impl BufRead) -> io::Result<(u16, Vec<(String, String)>)> {
    let line = read_line(r)?;
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("not an HTTP/1 response: {line:?}")));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let h = read_line(r)?;
        if h.is_empty() {
            break;
        }
        let (n, v) = h
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header line {h:?}")))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        if headers.len() > 200 {
            return Err(bad("too many response headers"));
        }
    }
    Ok((status, headers))
}

fn read_response(stream: &TcpStream) -> io::Result<Response> {
    let mut r = BufReader::new(stream);
    let (mut status, mut headers) = read_head(&mut r)?;
    // Skip interim responses (100 Continue and the like).
    while (100..200).contains(&status) && status != 101 {
        (status, headers) = read_head(&mut r)?;
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let chunked =
        find("transfer-encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    let mut body = Vec::new();
    if status == 204 || status == 304 {
        // no body
    } else if chunked {
        read_chunked(&mut r, &mut body)?;
    } else if let Some(len) = find("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| bad(format!("bad Content-Length {len:?}")))?;
        if len > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else {
        r.take(MAX_RESPONSE as u64 + 1).read_to_end(&mut body)?;
        if body.len() > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
    }
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn read_chunked(r: &mut impl BufRead, body: &mut Vec<u8>) -> io::Result<()> {
    loop {
        let line = read_line(r)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size, 16).map_err(|_| bad(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(r)?.is_empty() {}
            return Ok(());
        }
        if body.len() + size > MAX_RESPONSE {
            return Err(bad("response body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        if !read_line(r)?.is_empty() {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A one-shot server answering `raw` and returning the request head it saw.
    fn one_shot(raw: &'static [u8]) -> (String, thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let h = thread::spawn(move || {
            let (s, _) = l.accept().expect("accept");
            let mut r = BufReader::new(&s);
            let mut head = String::new();
            loop {
                let line = read_line(&mut r).expect("line");
                if line.is_empty() {
                    break;
                }
                head.push_str(&line);
                head.push('\n');
            }
            let mut w = &s;
            w.write_all(raw).expect("write");
            head
        });
        (addr, h)
    }

    #[test]
    fn chunked_response_is_decoded() {
        let (addr, h) = one_shot(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
        );
        let (status, body) = request(&addr, "tok", "GET", "/x", None).expect("request");
        assert_eq!((status, body.as_str()), (200, "hello world"));
        let head = h.join().expect("server");
        assert!(head.starts_with("GET /x HTTP/1.1\n"));
        assert!(head.contains("Authorization: Bearer tok\n"));
        assert!(head.contains("Connection: close\n"));
    }

    #[test]
    fn content_length_and_interim_responses() {
        let (addr, h) = one_shot(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}trailing",
        );
        let (status, body) = request(&addr, "t", "POST", "/y", Some("{\"a\":1}")).expect("req");
        assert_eq!((status, body.as_str()), (201, "{}"));
        let head = h.join().expect("server");
        assert!(head.contains("Content-Length: 7\n"));
        assert!(head.contains("Content-Type: application/json\n"));
    }

    #[test]
    fn body_until_close() {
        let (addr, h) = one_shot(b"HTTP/1.0 200 OK\r\nX: y\r\n\r\nall of it");
        let r = request_with_headers(&addr, "GET", "/z", &[], None).expect("req");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("X"), Some("y"));
        assert_eq!(r.body, "all of it");
        h.join().expect("server");
    }

    #[test]
    fn header_injection_is_refused() {
        let e = request_with_headers("127.0.0.1:1", "GET", "/", &[("A", "b\r\nC: d")], None);
        assert!(e.is_err_and(|e| e.kind() == io::ErrorKind::InvalidInput));
    }
}
