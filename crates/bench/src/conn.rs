//! Connection set-up shared by publishers, subscribers and idle clients.

use std::time::Duration;

use anyhow::{bail, Context};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

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
        version: Version,
        client_id: &str,
        keepalive: u16,
        read_chunk: usize,
        (expiry_s, clean_start): (u32, bool),
    ) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
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
