//! TLS listener (rustls). Filled in by the TLS work; until then a TLS listener fails to start.
use crate::broker::Broker;
use crate::listener::anyhow_lite;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

pub struct TlsAcceptor;
impl TlsAcceptor {
    pub fn new(_l: &crate::config::ListenerConfig) -> anyhow_lite::Result<TlsAcceptor> {
        Err(anyhow_lite::Error(
            "tls listeners are not available in this build".into(),
        ))
    }
    pub async fn serve(&self, _broker: Arc<Broker>, _stream: TcpStream, _peer: SocketAddr) {}
}
