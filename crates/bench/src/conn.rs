//! Connection set-up shared by publishers, subscribers and idle clients.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};

use crate::mqtt::{self, Frame, Version};

pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

pub struct Conn {
    pub rd: OwnedReadHalf,
    pub wr: OwnedWriteHalf,
    pub rbuf: BytesMut,
    pub version: Version,
    /// Server's Receive Maximum from CONNACK (v5 only).
    pub receive_max: Option<u16>,
    read_chunk: usize,
}

/// TCP connect to `addr`, from `source` when given: the socket is bound to (`source`, any
/// port) first. Each local address has its own ephemeral ports (~28k on Linux), so spreading
/// connections over 127.0.0.1, 127.0.0.2, … (all of 127.0.0.0/8 is loopback on Linux) lets
/// one generator open more connections to one broker port than one address allows.
pub async fn tcp_connect(addr: &str, source: Option<IpAddr>) -> anyhow::Result<TcpStream> {
    let Some(src) = source else {
        return TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"));
    };
    let target = tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("resolve {addr}"))?
        .find(|a| a.is_ipv4() == src.is_ipv4())
        .with_context(|| format!("{addr}: no address of the family of {src}"))?;
    let socket = if src.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket
        .bind(SocketAddr::new(src, 0))
        .with_context(|| format!("bind {src}"))?;
    socket
        .connect(target)
        .await
        .with_context(|| format!("connect to {addr} from {src}"))
}

/// Parse `--source-addrs`: a comma-separated list of addresses and inclusive IPv4 ranges,
/// e.g. `127.0.0.1-127.0.0.8` or `127.0.0.1,127.0.0.2`.
pub fn parse_source_addrs(s: &str) -> anyhow::Result<Vec<IpAddr>> {
    const MAX: u32 = 4096;
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: std::net::Ipv4Addr = a
                .trim()
                .parse()
                .with_context(|| format!("bad address in range {part:?}"))?;
            let b: std::net::Ipv4Addr = b
                .trim()
                .parse()
                .with_context(|| format!("bad address in range {part:?}"))?;
            let (a, b) = (u32::from(a), u32::from(b));
            if b < a || b - a >= MAX {
                bail!("range {part:?} must be ascending and hold at most {MAX} addresses");
            }
            out.extend((a..=b).map(|v| IpAddr::V4(v.into())));
        } else {
            out.push(
                part.parse()
                    .with_context(|| format!("bad source address {part:?}"))?,
            );
        }
    }
    if out.is_empty() {
        bail!("--source-addrs: no address in {s:?}");
    }
    Ok(out)
}

impl Conn {
    /// TCP connect + CONNECT/CONNACK, bounded by [`HANDSHAKE_TIMEOUT`].
    pub async fn open(
        addr: &str,
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
    ) -> anyhow::Result<Conn> {
        Self::open_with_expiry(addr, version, client_id, keepalive, read_chunk, 0).await
    }

    /// [`Conn::open`] from a given local address (`None`: the kernel's choice).
    pub async fn open_from(
        addr: &str,
        source: Option<IpAddr>,
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
    ) -> anyhow::Result<Conn> {
        tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            Self::open_inner(
                addr,
                source,
                version,
                client_id,
                keepalive,
                read_chunk,
                (0, true),
            ),
        )
        .await
        .with_context(|| format!("{client_id}: connect timed out"))?
    }

    /// [`Conn::open`] with a Session Expiry Interval (> 0: a persistent session).
    pub async fn open_with_expiry(
        addr: &str,
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
        expiry_s: u32,
    ) -> anyhow::Result<Conn> {
        Self::open_session(
            addr, version, client_id, keepalive, read_chunk, expiry_s, true,
        )
        .await
    }

    /// [`Conn::open_with_expiry`]; `clean_start` false resumes an existing session.
    pub async fn open_session(
        addr: &str,
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
        expiry_s: u32,
        clean_start: bool,
    ) -> anyhow::Result<Conn> {
        tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            Self::open_inner(
                addr,
                None,
                version,
                client_id,
                keepalive,
                read_chunk,
                (expiry_s, clean_start),
            ),
        )
        .await
        .with_context(|| format!("{client_id}: connect timed out"))?
    }

    async fn open_inner(
        addr: &str,
        source: Option<IpAddr>,
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
        (expiry_s, clean_start): (u32, bool),
    ) -> anyhow::Result<Conn> {
        let stream = tcp_connect(addr, source).await?;
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        let mut c = Conn {
            rd,
            wr,
            rbuf: BytesMut::with_capacity(read_chunk),
            version,
            receive_max: None,
            read_chunk,
        };
        let mut out = BytesMut::new();
        mqtt::connect_session(
            &mut out,
            version,
            client_id,
            keepalive,
            expiry_s,
            clean_start,
        );
        c.wr.write_all(&out).await?;
        match c.next_frame().await? {
            Frame::ConnAck {
                reason: 0,
                receive_max,
            } => {
                c.receive_max = receive_max;
                Ok(c)
            }
            Frame::ConnAck { reason, .. } => {
                bail!("{client_id}: CONNACK refused, reason {reason:#x}")
            }
            other => bail!("{client_id}: expected CONNACK, got {other:?}"),
        }
    }

    /// SUBSCRIBE and wait for a successful SUBACK.
    pub async fn subscribe(&mut self, filter: &str, qos: u8) -> anyhow::Result<()> {
        let mut out = BytesMut::new();
        mqtt::subscribe(&mut out, self.version, 1, filter, qos);
        self.wr.write_all(&out).await?;
        self.expect_suback(filter).await.map(drop)
    }

    /// SUBSCRIBE (MQTT 5) with one user property and wait for a successful SUBACK.
    pub async fn subscribe_with_property(
        &mut self,
        filter: &str,
        qos: u8,
        key: &str,
        value: &str,
    ) -> anyhow::Result<()> {
        self.subscribe_v5(filter, qos, Some((key, value)))
            .await
            .map(drop)
    }

    /// SUBSCRIBE (MQTT 5) with an optional user property and wait for a
    /// successful SUBACK: the granted QoS.
    pub async fn subscribe_v5(
        &mut self,
        filter: &str,
        qos: u8,
        prop: Option<(&str, &str)>,
    ) -> anyhow::Result<u8> {
        let mut out = BytesMut::new();
        mqtt::subscribe_v5(&mut out, 1, filter, qos, prop);
        self.wr.write_all(&out).await?;
        self.expect_suback(filter).await
    }

    /// The SUBACK (before any delivery of the subscription): the granted QoS.
    async fn expect_suback(&mut self, filter: &str) -> anyhow::Result<u8> {
        let f = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.next_frame())
            .await
            .context("SUBACK timed out")??;
        match f {
            Frame::SubAck { worst_reason, .. } if worst_reason < 0x80 => Ok(worst_reason),
            Frame::SubAck { worst_reason, .. } => {
                bail!("subscribe to {filter} refused: {worst_reason:#x}")
            }
            other => bail!("expected SUBACK, got {other:?}"),
        }
    }

    /// The inflight window of a publisher: `inflight`, at most the broker's
    /// Receive Maximum (MQTT 5) or else 65,000, at least 1.
    pub fn window(&self, inflight: usize) -> usize {
        match self.receive_max {
            Some(m) => inflight.min(usize::from(m)).max(1),
            None => inflight.min(65_000),
        }
    }

    /// Read until one full frame is buffered (used only during set-up).
    pub async fn next_frame(&mut self) -> anyhow::Result<Frame> {
        loop {
            if let Some(f) = mqtt::parse(&mut self.rbuf, self.version)? {
                return Ok(f);
            }
            if self.rd.read_buf(&mut self.rbuf).await? == 0 {
                bail!("connection closed by broker");
            }
        }
    }

    /// Called after parsing: once the consumed prefix is dropped, make sure
    /// the next `read_buf` has room for a large read (BytesMut would
    /// otherwise grow in tiny steps).
    pub fn ensure_read_space_later(&mut self) {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(self.read_chunk);
        }
    }

    /// Best-effort DISCONNECT.
    pub async fn close(mut self) {
        let mut out = BytesMut::new();
        mqtt::disconnect(&mut out);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = self.wr.write_all(&out).await;
            let _ = self.wr.shutdown().await;
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn source_addrs_parse() {
        let v = parse_source_addrs("127.0.0.1-127.0.0.3, 127.0.1.9").unwrap();
        let s: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(s, ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.1.9"]);
        assert!(parse_source_addrs("127.0.0.3-127.0.0.1").is_err());
        assert!(parse_source_addrs("x").is_err());
        assert!(parse_source_addrs("").is_err());
    }

    #[tokio::test]
    async fn connects_from_the_given_source_address() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let src: IpAddr = "127.0.0.2".parse().unwrap();
        let (c, accepted) = tokio::join!(tcp_connect(&addr, Some(src)), l.accept());
        let c = c.unwrap();
        assert_eq!(c.local_addr().unwrap().ip(), src);
        assert_eq!(accepted.unwrap().1.ip(), src);
    }
}
