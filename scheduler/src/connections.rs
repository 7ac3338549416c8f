//! Connection caps and deadlines shared by both ports. A port reachable by anyone must not
//! let connections that send nothing, or trickle a TLS handshake, hold its slots: each
//! connection gets a deadline by which it must be established, and a port serves at most
//! so many connections at once (past the cap, new ones wait in the kernel's backlog).
//!
//! - The HTTP port counts a connection established at its first byte; hyper's header
//!   timeout covers the rest of the request, and TLS has its own handshake timeout there.
//! - The gRPC port counts one established once bytes went both ways past the TLS handshake
//!   or HTTP/2 preface: the server writes only after a complete ClientHello (TLS) and
//!   reads the client's preface (plaintext), so a silent or trickling peer never gets there.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The gRPC port's limits (`--grpc-max-connections`, `--grpc-handshake-timeout-ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Connections served at once (agents and clients together); more wait to be accepted.
    pub max_connections: usize,
    /// The longest a connection may take to complete its TLS handshake and HTTP/2 preface.
    pub handshake_timeout: Duration,
}

/// [`GrpcLimits::max_connections`] by default: a fleet of 10,000 agents plus its clients.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 16_384;
/// [`GrpcLimits::handshake_timeout`] by default.
pub const DEFAULT_GRPC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_GRPC_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_GRPC_HANDSHAKE_TIMEOUT,
        }
    }
}

/// When a connection counts as established, ending its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Established {
    /// At its first byte read.
    FirstByte,
    /// Once it has read a byte and written one.
    BothWays,
}

/// A connection that must be established (see [`Established`]) before a deadline, or its
/// reads fail with `TimedOut` and the server drops it. After that it is the connection
/// itself.
pub struct Deadlined<I> {
    io: I,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    established: Established,
    has_read: bool,
    has_written: bool,
    /// The port's connection slot, held until the connection closes.
    _slot: Option<OwnedSemaphorePermit>,
}

impl<I> Deadlined<I> {
    /// `io`, cut unless `established` says its handshake finished within `within`.
    pub fn new(io: I, within: Duration, established: Established) -> Self {
        Self {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            established,
            has_read: false,
            has_written: false,
            _slot: None,
        }
    }

    /// The same, holding `slot` of its port's cap until it closes.
    fn holding(mut self, slot: OwnedSemaphorePermit) -> Self {
        self._slot = Some(slot);
        self
    }

    fn settle(&mut self) {
        let done = match self.established {
            Established::FirstByte => self.has_read,
            Established::BothWays => self.has_read && self.has_written,
        };
        if done {
            self.deadline = None;
        }
    }

    /// The deadline's error once it passed; registers the waker otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let deadline = self.deadline.as_mut()?;
        deadline.as_mut().poll(cx).is_ready().then(|| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the connection was not established within its deadline",
            )
        })
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Deadlined<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.has_read = true;
                self.settle();
            }
            Poll::Pending => {
                if let Some(error) = self.expired(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            Poll::Ready(_) => {}
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Deadlined<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.has_written = true;
            self.settle();
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.has_written = true;
            self.settle();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A gRPC connection: deadlined, holding one of the port's slots until it closes.
pub type GrpcConnection = Deadlined<TcpStream>;

impl tonic::transport::server::Connected for GrpcConnection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The gRPC port's accepted connections: a slot first (past the cap, connections wait
/// unaccepted), then the connection with its handshake deadline. Accept errors (a full
/// file table, say) are logged and the loop goes on after a short pause.
pub fn grpc_incoming(
    listener: TcpListener,
    limits: GrpcLimits,
) -> impl Stream<Item = Result<GrpcConnection, std::io::Error>> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    futures::stream::unfold((listener, slots), move |(listener, slots)| async move {
        loop {
            let slot = slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore stays open");
            match listener.accept().await {
                Ok((stream, _peer)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "gRPC port: could not set TCP_NODELAY");
                    }
                    let connection =
                        Deadlined::new(stream, limits.handshake_timeout, Established::BothWays)
                            .holding(slot);
                    return Some((Ok(connection), (listener, slots)));
                }
                Err(error) => {
                    tracing::warn!(%error, "gRPC port: accept failed");
                    drop(slot);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn a_silent_connection_fails_its_read_at_the_deadline() {
        let (_client, server) = pair().await;
        let mut server = Deadlined::new(server, Duration::from_millis(100), Established::FirstByte);
        let started = tokio::time::Instant::now();
        let read = server.read(&mut [0u8; 8]).await;
        assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn an_established_connection_outlives_the_deadline() {
        let (mut client, server) = pair().await;
        let mut server = Deadlined::new(server, Duration::from_millis(100), Established::BothWays);
        client.write_all(b"x").await.unwrap();
        assert_eq!(server.read(&mut [0u8; 8]).await.unwrap(), 1);
        // Read but not yet written: still on its deadline.
        assert!(server.deadline.is_some());
        server.write_all(b"y").await.unwrap();
        assert!(server.deadline.is_none());
        tokio::time::sleep(Duration::from_millis(150)).await;
        client.write_all(b"z").await.unwrap();
        assert_eq!(server.read(&mut [0u8; 8]).await.unwrap(), 1);
    }
}
