//! A TCP proxy whose connections a test can cut, as a broken network does to a client, while
//! the server behind it and the client's process both live on. Before a cut it can also lose
//! what the server sends, so that the server has sent replies the client never gets. It can
//! also go silent, as a black-holed link does: open connections carry nothing either way and
//! no close is seen, and new connections are dropped at once, until the link comes back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// A TCP proxy on loopback in front of a server: a test cuts its connections, makes it lose
/// what the server sends, or makes it go silent, and heals it.
pub struct CutProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    connections: Mutex<Vec<AbortHandle>>,
    accepted: AtomicU64,
    /// Bytes from the server are read and dropped, not passed on.
    losing_replies: AtomicBool,
    /// Bytes both ways are read and dropped, and new connections closed at once.
    silent: AtomicBool,
}

impl CutProxy {
    /// Forwards every connection made to it to `target`, byte for byte.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if state.silent.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                state.accepted.fetch_add(1, Ordering::SeqCst);
                let forward = tokio::spawn(forward(client, target, state.clone()));
                let mut open = state.connections.lock().expect("proxy connections");
                open.retain(|c| !c.is_finished());
                open.push(forward.abort_handle());
            }
        });
        Self {
            addr,
            shared,
            accept,
        }
    }

    /// `http://` and the proxy's address, for a client to dial instead of the server's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections made through the proxy so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// From now until the next cut, what the server sends is lost on the way.
    pub fn lose_replies(&self) {
        self.shared.losing_replies.store(true, Ordering::SeqCst);
    }

    /// From now until [`Self::restore`], the link is black-holed: nothing passes either way
    /// on open connections (no close is sent), and new connections are closed at once.
    pub fn go_silent(&self) {
        self.shared.silent.store(true, Ordering::SeqCst);
    }

    /// The link is back: new connections are forwarded; the ones it silenced are closed
    /// (their ends gave up on them meanwhile).
    pub fn restore(&self) {
        self.cut();
        self.shared.silent.store(false, Ordering::SeqCst);
    }

    /// Closes every connection open through the proxy now, both ways; new ones are
    /// forwarded as before. Returns how many were open.
    pub fn cut(&self) -> usize {
        let open = std::mem::take(&mut *self.shared.connections.lock().expect("connections"));
        let live = open.iter().filter(|c| !c.is_finished()).count();
        for connection in open {
            connection.abort();
        }
        self.shared.losing_replies.store(false, Ordering::SeqCst);
        live
    }
}

/// Passes bytes both ways until either side closes (or the task is aborted: a cut).
async fn forward(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = client_read.read(&mut buffer).await?;
            if read == 0 {
                return std::io::Result::Ok(());
            }
            if !shared.silent.load(Ordering::SeqCst) {
                server_write.write_all(&buffer[..read]).await?;
            }
        }
    };
    let replies = async {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = server_read.read(&mut buffer).await?;
            if read == 0 {
                return std::io::Result::Ok(());
            }
            let lost = shared.losing_replies.load(Ordering::SeqCst)
                || shared.silent.load(Ordering::SeqCst);
            if !lost {
                client_write.write_all(&buffer[..read]).await?;
            }
        }
    };
    let _ = tokio::try_join!(requests, replies);
    // A silenced link shows no close either: held until `restore` cuts it.
    while shared.silent.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
