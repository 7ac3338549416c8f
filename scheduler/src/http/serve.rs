//! The HTTP port's connections, on hyper's server stack (`hyper-util`: the connection
//! builder and graceful shutdown that axum's own `serve` is made of). axum's `serve` has no
//! TLS and no limits, so the accept loop is ours. It adds what a port that browsers and
//! scrapers reach needs:
//! - a connection cap: past it, new connections wait in the kernel's backlog;
//! - a TLS handshake timeout;
//! - a first-byte deadline and an HTTP/1 header timeout, so a client that sends nothing, or
//!   trickles its headers (slowloris), cannot hold a connection slot past them;
//! - HTTP/2 keep-alive pings, so a dead peer is dropped;
//! - a graceful drain on shutdown: requests in flight finish, then idle connections close.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::connections::{Deadlined, Established};

/// The limits of the HTTP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// The longest a client may take over its TLS handshake, or to send a request's
    /// headers once it has started one.
    pub header_timeout: Duration,
    /// How long a shutdown waits for requests in flight.
    pub drain_timeout: Duration,
}

/// [`HttpLimits::max_connections`] by default (`--http-max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// [`HttpLimits::header_timeout`] by default (`--http-header-timeout-ms`).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

type Service = TowerToHyperService<axum::Router>;

/// Accepts and serves connections on `listener` until `cancel` fires, then drains.
pub(super) async fn serve_connections(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: HttpLimits,
    cancel: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        // A slot first: past the cap, connections wait unaccepted.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore stays open"),
            _ = cancel.cancelled() => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = cancel.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "HTTP port: accept failed");
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = permit;
            match tls {
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(limits.header_timeout, handshake).await {
                        Ok(Ok(stream)) => serve_one(stream, service, watcher, limits, peer).await,
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "HTTP port: TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "HTTP port: TLS handshake timed out");
                        }
                    }
                }
                None => serve_one(stream, service, watcher, limits, peer).await,
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::debug!("HTTP port drained"),
        _ = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!(
                timeout = ?limits.drain_timeout,
                "HTTP port: requests still running at shutdown were cut"
            );
        }
    }
}

/// Serves one connection (HTTP/1 or HTTP/2) until it ends or the drain closes it.
async fn serve_one<I>(
    io: I,
    service: Service,
    watcher: Watcher,
    limits: HttpLimits,
    peer: std::net::SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.header_timeout)
        .keep_alive_timeout(limits.header_timeout);
    let io = Deadlined::new(io, limits.header_timeout, Established::FirstByte);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    if let Err(error) = watcher.watch(connection).await {
        tracing::debug!(%peer, %error, "HTTP connection ended with an error");
    }
}
