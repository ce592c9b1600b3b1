//! WebSocket listener: MQTT over binary WebSocket messages (MQTT 5.0 §6, MQTT 3.1.1 §6).
//!
//! The HTTP/1.1 upgrade is parsed here (httparse), so every request gets a real HTTP answer:
//! 404 off the configured path, 405 for a method other than GET, 400 for a request that is not
//! a WebSocket upgrade or offers no MQTT subprotocol, 426 for a WebSocket version other than 13,
//! 431 for an oversized request head. The whole upgrade must finish within
//! `mqtt.connect_timeout_ms`. After the `101 Switching Protocols` the socket is framed by
//! tokio-tungstenite and [`WsIo`] turns it into the byte stream `serve_connection` expects.

use crate::broker::Broker;
use crate::connection::serve_connection;
use crate::tls::{EagerFlush, CLOSE_TIMEOUT};
use bytes::Bytes;
use futures_util::{Sink, Stream};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Message, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

/// Subprotocols accepted, answered with the one the client offered first.
/// `mqtt` is the MQTT 3.1.1 / 5.0 name (MQTT.js, paho, mosquitto); `mqttv3.1` is what
/// MQTT 3.1 clients (MQTT.js with `protocolId: 'MQIsdp'`, old paho) offer.
pub const SUBPROTOCOLS: &[&str] = &["mqtt", "mqttv3.1"];

/// Largest HTTP request head accepted before the upgrade.
const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;
const MAX_HEADERS: usize = 64;
/// Room above `max_packet_size_bytes` in one WebSocket message, for clients that put a large
/// packet and a few small ones in the same message.
const MESSAGE_SLACK_BYTES: usize = 64 * 1024;

/// Serve one WebSocket connection: HTTP upgrade on `path`, then MQTT.
pub async fn serve(broker: Arc<Broker>, mut stream: TcpStream, peer: SocketAddr, path: &str) {
    let timeout = Duration::from_millis(broker.config.mqtt.connect_timeout_ms);
    let leftover = match tokio::time::timeout(timeout, handshake(&mut stream, path)).await {
        Ok(Ok(leftover)) => leftover,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "websocket upgrade refused");
            return;
        }
        Err(_) => {
            debug!(%peer, "websocket upgrade timed out");
            return;
        }
    };
    let max_message = broker.config.mqtt.max_packet_size_bytes as usize + MESSAGE_SLACK_BYTES;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message));
    let ws =
        WebSocketStream::from_partially_read(stream, leftover, Role::Server, Some(config)).await;
    let (mut r, mut w) = tokio::io::split(EagerFlush::new(WsIo::new(ws, max_message)));
    serve_connection(broker, &mut r, &mut w, peer).await;
    // Sends the WebSocket Close if the connection did not already shut down.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, w.shutdown()).await;
}

/// Why an upgrade was refused (also written to the client as an HTTP response).
#[derive(Debug)]
struct Refused {
    status: &'static str,
    reason: String,
    extra_headers: &'static str,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.reason)
    }
}

fn refuse(status: &'static str, reason: impl Into<String>) -> Refused {
    Refused {
        status,
        reason: reason.into(),
        extra_headers: "",
    }
}

/// Read and answer the upgrade request. Returns the bytes read past the request head.
async fn handshake(stream: &mut TcpStream, path: &str) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(1024);
    let (outcome, head_len) = loop {
        if buf.len() >= MAX_REQUEST_HEAD_BYTES {
            break (
                Err(refuse(
                    "431 Request Header Fields Too Large",
                    "request head too large",
                )),
                0,
            );
        }
        let mut chunk = [0u8; 1024];
        let room = (MAX_REQUEST_HEAD_BYTES - buf.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed during the HTTP request",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Partial) => continue,
            Ok(httparse::Status::Complete(len)) => break (check_request(&req, path), len),
            Err(e) => {
                break (
                    Err(refuse("400 Bad Request", format!("bad HTTP request: {e}"))),
                    0,
                )
            }
        }
    };
    match outcome {
        Ok(response) => {
            stream.write_all(response.as_bytes()).await?;
            Ok(buf.split_off(head_len))
        }
        Err(refused) => {
            let body = format!("{}\n", refused.reason);
            let connection = if refused.extra_headers.starts_with("Upgrade:") {
                "Upgrade, close"
            } else {
                "close"
            };
            let response = format!(
                "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{}Connection: {connection}\r\n\r\n{body}",
                refused.status,
                body.len(),
                refused.extra_headers,
            );
            stream.write_all(response.as_bytes()).await?;
            let _ = stream.shutdown().await;
            // Lingering close: read (and drop) what the client still sends, so closing with
            // unread data does not reset the connection before the client reads the answer.
            let linger = async {
                let mut scratch = [0u8; 4096];
                let mut left = 64 * 1024usize;
                while left > 0 {
                    match stream.read(&mut scratch).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
            };
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, linger).await;
            Err(io::Error::other(refused.to_string()))
        }
    }
}

/// Comma-separated tokens of every instance of header `name`.
fn header_tokens<'a>(req: &'a httparse::Request<'_, '_>, name: &str) -> Vec<&'a str> {
    req.headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// Validate an upgrade request; the `101` response on success.
fn check_request(req: &httparse::Request<'_, '_>, path: &str) -> Result<String, Refused> {
    let target = req.path.unwrap_or("");
    let req_path = target.split(['?', '#']).next().unwrap_or("");
    if req_path != path {
        return Err(refuse(
            "404 Not Found",
            format!("no WebSocket endpoint at {req_path:?}; MQTT is served on {path:?}"),
        ));
    }
    if req.method != Some("GET") {
        return Err(Refused {
            status: "405 Method Not Allowed",
            reason: "the WebSocket upgrade must be a GET".into(),
            extra_headers: "Allow: GET\r\n",
        });
    }
    if req.version != Some(1) {
        return Err(refuse(
            "400 Bad Request",
            "the WebSocket upgrade needs HTTP/1.1",
        ));
    }
    let has = |name: &str, token: &str| {
        header_tokens(req, name)
            .iter()
            .any(|t| t.eq_ignore_ascii_case(token))
    };
    if !has("upgrade", "websocket") || !has("connection", "upgrade") {
        return Err(Refused {
            status: "426 Upgrade Required",
            reason: "this endpoint only serves MQTT over WebSocket".into(),
            // An Upgrade header is hop-by-hop: Connection names it (see `handshake`).
            extra_headers: "Upgrade: websocket\r\n",
        });
    }
    if header_tokens(req, "sec-websocket-version") != ["13"] {
        return Err(Refused {
            status: "426 Upgrade Required",
            reason: "only WebSocket version 13 is supported".into(),
            extra_headers: "Sec-WebSocket-Version: 13\r\n",
        });
    }
    let key = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("sec-websocket-key"))
        .map(|h| h.value.trim_ascii())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| refuse("400 Bad Request", "missing Sec-WebSocket-Key"))?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    let offered = header_tokens(req, "sec-websocket-protocol");
    let protocol_line = if offered.is_empty() {
        // RFC 6455 lets the server pick none; clients that did not ask are served anyway.
        String::new()
    } else {
        let chosen = offered
            .iter()
            .find(|p| SUBPROTOCOLS.contains(p))
            .ok_or_else(|| {
                refuse(
                    "400 Bad Request",
                    format!(
                        "no supported subprotocol offered ({}); expected one of: {}",
                        offered.join(", "),
                        SUBPROTOCOLS.join(", ")
                    ),
                )
            })?;
        format!("Sec-WebSocket-Protocol: {chosen}\r\n")
    };
    Ok(format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{protocol_line}\r\n"
    ))
}

fn to_io(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            io::Error::new(io::ErrorKind::NotConnected, e)
        }
        other => io::Error::other(other),
    }
}

/// A WebSocket connection as a byte stream: reads concatenate the payloads of binary messages
/// (an MQTT packet may span messages, and a message may hold several packets), each write is
/// sent as one binary message, shutdown sends Close. A text message ends the stream with an
/// error and Close 1003; pings are answered by tungstenite, pongs ignored.
///
/// Writes are queued, not flushed: wrap in [`EagerFlush`] for `serve_connection`.
pub struct WsIo<S> {
    ws: WebSocketStream<S>,
    /// Unread rest of the current binary message.
    rbuf: Bytes,
    /// Largest message written.
    max_message: usize,
    /// Close frame to send at shutdown after a protocol problem found while reading.
    close_frame: Option<CloseFrame>,
    eof: bool,
}

impl<S> WsIo<S> {
    pub fn new(ws: WebSocketStream<S>, max_message: usize) -> Self {
        WsIo {
            ws,
            rbuf: Bytes::new(),
            max_message: max_message.max(1),
            close_frame: None,
            eof: false,
        }
    }

    fn fail(&mut self, code: CloseCode, reason: &'static str) -> io::Error {
        self.close_frame = Some(CloseFrame {
            code,
            reason: reason.into(),
        });
        io::Error::new(io::ErrorKind::InvalidData, reason)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.rbuf.is_empty() {
                let n = this.rbuf.len().min(buf.remaining());
                buf.put_slice(&this.rbuf.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                None | Some(Ok(Message::Close(_))) => {
                    // tungstenite queues the Close reply; shutdown flushes it.
                    this.eof = true;
                }
                Some(Ok(Message::Binary(b))) => this.rbuf = b,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(this.fail(
                        CloseCode::Unsupported,
                        "MQTT over WebSocket uses binary messages",
                    )));
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Err(WsError::Capacity(e))) => {
                    debug!(error = %e, "websocket message too large");
                    return Poll::Ready(Err(
                        this.fail(CloseCode::Size, "WebSocket message too large")
                    ));
                }
                Some(Err(WsError::Protocol(e))) => {
                    debug!(error = %e, "websocket protocol error");
                    return Poll::Ready(Err(
                        this.fail(CloseCode::Protocol, "WebSocket protocol error")
                    ));
                }
                Some(Err(e)) => return Poll::Ready(Err(to_io(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(to_io)?;
        let n = buf.len().min(this.max_message);
        Pin::new(&mut this.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_flush(cx)
            .map_err(to_io)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.close_frame.is_some() {
            ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(to_io)?;
            let frame = this.close_frame.take();
            Pin::new(&mut this.ws)
                .start_send(Message::Close(frame))
                .map_err(to_io)?;
        }
        Pin::new(&mut this.ws).poll_close(cx).map_err(to_io)
    }
}
