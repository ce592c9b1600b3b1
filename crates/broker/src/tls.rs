//! TLS listener: rustls (ring provider) via tokio-rustls.
//!
//! [`TlsAcceptor::new`] loads the PEM certificate chain and private key once, when the server
//! starts, so a bad file stops `Server::start` with a message naming it. [`TlsAcceptor::serve`]
//! runs the handshake under `mqtt.connect_timeout_ms` and hands the decrypted byte stream to
//! [`serve_connection`].
//!
//! [`EagerFlush`] is shared with the WebSocket listener: `serve_connection` never calls
//! `flush`, which is right for a TCP socket but not for a stream that buffers (rustls keeps
//! records it could not write, tungstenite keeps whole messages), so the wrapper flushes after
//! every write and keeps flushing from the read side, which the connection always polls.

use crate::anyhow_lite;
use crate::broker::Broker;
use crate::config::ListenerConfig;
use crate::connection::serve_connection;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::debug;

/// How long the final close_notify / WebSocket Close may take after the connection ends.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// A TLS listener's server configuration (certificate chain and key loaded at start).
pub struct TlsAcceptor {
    inner: tokio_rustls::TlsAcceptor,
}

impl TlsAcceptor {
    /// Load `cert_path` and `key_path` (PEM) and build the rustls server configuration.
    pub fn new(l: &ListenerConfig) -> anyhow_lite::Result<TlsAcceptor> {
        let err = |msg: String| anyhow_lite::Error(format!("tls listener {}: {msg}", l.bind));
        let cert_path = l
            .cert_path
            .as_deref()
            .ok_or_else(|| err("cert_path is not set".into()))?;
        let key_path = l
            .key_path
            .as_deref()
            .ok_or_else(|| err("key_path is not set".into()))?;
        let certs = load_certs(cert_path).map_err(&err)?;
        let key = load_key(key_path).map_err(&err)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err(format!("rustls: {e}")))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                err(format!(
                    "certificate {} and key {} cannot be used together: {e}",
                    cert_path.display(),
                    key_path.display()
                ))
            })?;
        Ok(TlsAcceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// TLS handshake (bounded by `mqtt.connect_timeout_ms`), then MQTT over the TLS stream.
    pub async fn serve(&self, broker: Arc<Broker>, stream: TcpStream, peer: SocketAddr) {
        let timeout = Duration::from_millis(broker.config.mqtt.connect_timeout_ms);
        let tls = match tokio::time::timeout(timeout, self.inner.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "tls handshake failed");
                return;
            }
            Err(_) => {
                debug!(%peer, "tls handshake timed out");
                return;
            }
        };
        let (mut r, mut w) = tokio::io::split(EagerFlush::new(tls));
        serve_connection(broker, &mut r, &mut w, peer).await;
        // Sends close_notify if the connection did not already shut down.
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, w.shutdown()).await;
    }
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<rustls_pemfile::Item>, String> {
    let data =
        std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    rustls_pemfile::read_all(&mut data.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {} is not valid PEM: {e}", path.display()))
}

fn describe(items: &[rustls_pemfile::Item]) -> String {
    use rustls_pemfile::Item;
    let kinds: Vec<&str> = items
        .iter()
        .map(|i| match i {
            Item::X509Certificate(_) => "certificate",
            Item::Pkcs1Key(_) | Item::Pkcs8Key(_) | Item::Sec1Key(_) => "private key",
            Item::Crl(_) => "CRL",
            Item::Csr(_) => "certificate request",
            Item::SubjectPublicKeyInfo(_) => "public key",
            _ => "other PEM section",
        })
        .collect();
    if kinds.is_empty() {
        "no PEM sections that rustls understands".into()
    } else {
        format!("only: {}", kinds.join(", "))
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let items = read_pem(path, "cert_path")?;
    let certs: Vec<CertificateDer<'static>> = items
        .iter()
        .filter_map(|i| match i {
            rustls_pemfile::Item::X509Certificate(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(format!(
            "cert_path {} contains no PEM certificate (\"BEGIN CERTIFICATE\"); found {}",
            path.display(),
            describe(&items)
        ));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let items = read_pem(path, "key_path")?;
    let mut keys = items.iter().filter_map(|i| match i {
        rustls_pemfile::Item::Pkcs1Key(k) => Some(PrivateKeyDer::Pkcs1(k.clone_key())),
        rustls_pemfile::Item::Pkcs8Key(k) => Some(PrivateKeyDer::Pkcs8(k.clone_key())),
        rustls_pemfile::Item::Sec1Key(k) => Some(PrivateKeyDer::Sec1(k.clone_key())),
        _ => None,
    });
    let Some(key) = keys.next() else {
        let encrypted = std::fs::read_to_string(path)
            .map(|s| s.contains("ENCRYPTED"))
            .unwrap_or(false);
        return Err(format!(
            "key_path {} contains no unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1); found {}{}",
            path.display(),
            describe(&items),
            if encrypted {
                " (encrypted keys are not supported: decrypt it with `openssl pkey`)"
            } else {
                ""
            }
        ));
    };
    if keys.next().is_some() {
        return Err(format!(
            "key_path {} contains more than one private key",
            path.display()
        ));
    }
    Ok(key)
}

/// Flushes after every write, and keeps driving an unfinished flush from `poll_read`.
///
/// `serve_connection` writes with `write_buf`/`write_all` and never calls `flush`. A buffering
/// stream (rustls, tungstenite) may accept bytes it could not yet put on the socket; without a
/// flush they would sit there until the next write. Both halves of the `tokio::io::split` run in
/// the connection's task and the read half is always polled, so retrying the flush there gets
/// woken when the socket becomes writable. At most one write is left unflushed: the next
/// `poll_write` waits for it, which keeps the buffering bounded and passes back-pressure on.
pub(crate) struct EagerFlush<S> {
    inner: S,
    unflushed: bool,
}

impl<S> EagerFlush<S> {
    pub(crate) fn new(inner: S) -> Self {
        EagerFlush {
            inner,
            unflushed: false,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for EagerFlush<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.unflushed {
            if let Poll::Ready(res) = Pin::new(&mut this.inner).poll_flush(cx) {
                this.unflushed = false;
                res?;
            }
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for EagerFlush<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.unflushed {
            ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
            this.unflushed = false;
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(res) => res?,
            Poll::Pending => this.unflushed = true,
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        this.unflushed = false;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.unflushed = false;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
