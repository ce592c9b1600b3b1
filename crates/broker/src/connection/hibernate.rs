//! Plain-TCP connections, which hibernate when idle: after `mqtt.idle_hibernate_ms` with
//! nothing to do, the socket loop returns [`Exit::Park`]; the socket leaves tokio's reactor
//! and the connection's state ([`Conn`], the socket, its listener's guard, its keep-alive
//! deadline) goes into the broker's parking lot ([`crate::park`]) as one box, and the task
//! ends. The lot resumes it as a new task on its first input, wake-up or keep-alive
//! deadline; from the client's side nothing changed.
//!
//! Invariant: the connection is in exactly one place — its task, or the lot — and its
//! listener guard goes with it, so a broker shutdown waits for parked connections too (the
//! shutdown's kick wakes them).

use super::{accept_connect, Close, Conn, Exit, Hibernate};
use crate::broker::Broker;
use crate::park::Parked;
use bytes::BytesMut;
use futures_util::future::{Either, FutureExt};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, debug_span, Instrument};

/// How long a connection back from the parking lot may be idle before it hibernates again
/// (at most `mqtt.idle_hibernate_ms`): a keep-alive ping or a delivery rarely has a
/// follow-up, and a connection busy again stays until it is idle for the full period.
const REPARK_AFTER: Duration = Duration::from_millis(500);

/// Serve one plain-TCP connection until it ends or hibernates. `guard` (the listener's count
/// of open connections) is held for the connection's whole life, parked or not.
///
/// Two stages chained, not one `async` block: the CONNECT stage is boxed (short-lived) and
/// gives the socket and the connection to [`live`], so the task's future is the size of the
/// live stage alone (a block would keep its own copy of the socket and the guard beside it).
pub fn serve_tcp<G: Send + 'static>(
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    guard: G,
) -> impl Future<Output = ()> + Send {
    let span = debug_span!("conn", %peer, client_id = tracing::field::Empty);
    let enabled = !span.is_disabled();
    let run = Box::pin(accept_tcp(broker, stream, peer, guard)).then(|accepted| match accepted {
        Some((conn, rbuf, stream, guard)) => {
            Either::Left(live(conn, rbuf, stream, guard, None, false))
        }
        None => Either::Right(std::future::ready(())),
    });
    if enabled {
        Either::Right(Box::pin(run.instrument(span)))
    } else {
        Either::Left(run)
    }
}

/// The CONNECT stage of a plain-TCP connection: the established connection with what it
/// needs to go on, or `None` when it ended there.
#[allow(clippy::manual_async_fn, clippy::type_complexity)]
fn accept_tcp<G: Send + 'static>(
    broker: Arc<Broker>,
    mut stream: TcpStream,
    peer: SocketAddr,
    guard: G,
) -> impl Future<Output = Option<(Conn, BytesMut, TcpStream, G)>> + Send {
    async move {
        let mut rbuf = BytesMut::new();
        let conn = {
            let (mut r, mut w) = stream.split();
            accept_connect(&broker, &mut r, &mut w, &mut rbuf, peer).await
        };
        match conn {
            Some(conn) => Some((conn, rbuf, stream, guard)),
            None => {
                let _ = stream.shutdown().await;
                None
            }
        }
    }
}

/// An established connection's life on its socket: the socket loop, then the close or the
/// parking lot. A function returning an `async move` block rather than an `async fn`, whose
/// future would hold a second copy of every argument.
#[allow(clippy::manual_async_fn)]
fn live<G: Send + 'static>(
    mut conn: Conn,
    mut rbuf: BytesMut,
    mut stream: TcpStream,
    guard: G,
    keep_alive_at: Option<tokio::time::Instant>,
    resumed: bool,
) -> impl Future<Output = ()> + Send {
    async move {
        let after = Duration::from_millis(conn.broker.config.mqtt.idle_hibernate_ms);
        let hibernate = (!after.is_zero()).then(|| Hibernate {
            after,
            first: if resumed {
                after.min(REPARK_AFTER)
            } else {
                after
            },
        });
        let exit = {
            let (mut r, mut w) = stream.split();
            conn.run_loop(&mut r, &mut w, &mut rbuf, keep_alive_at, hibernate)
                .await
        };
        drop(rbuf);
        match exit {
            Exit::Close(close) => {
                {
                    let (mut r, mut w) = stream.split();
                    Box::pin(conn.close_down(close, &mut r, &mut w)).await;
                }
                // As an owned write half does on drop (the connection normally shut down already).
                let _ = stream.shutdown().await;
            }
            Exit::Park(keep_alive_at) => match stream.into_std() {
                Ok(stream) => {
                    let broker = conn.broker.clone();
                    let waker = conn.waker.clone();
                    let parked = Box::new(ParkedTcp {
                        conn,
                        stream,
                        guard,
                        keep_alive_at: keep_alive_at.map(tokio::time::Instant::into_std),
                    });
                    if let Err((parked, e)) = broker.lot.park(parked, &waker) {
                        debug!(error = %e, "could not hibernate; going on");
                        parked.resume(&tokio::runtime::Handle::current());
                    }
                    return;
                }
                Err(e) => {
                    debug!(error = %e, "could not take the socket off the reactor");
                    let (mut r, mut w) = (tokio::io::empty(), tokio::io::sink());
                    Box::pin(conn.close_down(Close::silent(true), &mut r, &mut w)).await;
                }
            },
        }
        drop(guard);
    }
}

/// A hibernating connection, as the parking lot holds it.
struct ParkedTcp<G> {
    conn: Conn,
    stream: std::net::TcpStream,
    guard: G,
    keep_alive_at: Option<std::time::Instant>,
}

impl<G: Send + 'static> Parked for ParkedTcp<G> {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn deadline(&self) -> Option<std::time::Instant> {
        self.keep_alive_at
    }

    fn resume(self: Box<Self>, handle: &tokio::runtime::Handle) {
        let ParkedTcp {
            conn,
            stream,
            guard,
            keep_alive_at,
        } = *self;
        handle.spawn(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    let at = keep_alive_at.map(tokio::time::Instant::from_std);
                    live(conn, BytesMut::new(), stream, guard, at, true).await;
                }
                Err(e) => {
                    debug!(error = %e, "could not put the socket back on the reactor");
                    let (mut r, mut w) = (tokio::io::empty(), tokio::io::sink());
                    Box::pin(conn.close_down(Close::silent(true), &mut r, &mut w)).await;
                    drop(guard);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hibernating connection's box is most of its memory besides its session
    /// (docs/benchmarks.md, idle connections): keep it within the allocator's 320-byte class.
    #[test]
    fn a_parked_connection_fits_320_bytes() {
        let size = std::mem::size_of::<ParkedTcp<crate::listener::ConnGuard>>();
        eprintln!(
            "parked connection: {size} B (Conn {} B)",
            std::mem::size_of::<Conn>()
        );
        assert!(size <= 320, "a parked connection is {size} B");
    }
}
