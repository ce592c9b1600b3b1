//! WebSocket listener. Filled in by the WebSocket work.
use crate::broker::Broker;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

pub async fn serve(_broker: Arc<Broker>, _stream: TcpStream, _peer: SocketAddr, _path: &str) {}
