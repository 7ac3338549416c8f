//! The scheduler's HTTP port under slow clients (slowloris): clients that trickle a TLS
//! handshake or a request's headers one byte at a time. They do not block the dashboard,
//! and the port cuts them off after `--http-header-timeout-ms`. Past
//! `--http-max-connections`, new connections wait until a slot frees. Run with TLS and
//! tokens on, and on plaintext loopback. The gRPC port has its own cap and handshake
//! deadline (`--grpc-max-connections`, `--grpc-handshake-timeout-ms`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use resident_tests::secure::SecureSetup;
use resident_tests::{free_port, https_get, plain_get, spawn_scheduler_with};

/// A client that sends `prefix`, then one more byte every 100 ms, until the server closes
/// the connection. It says whether it is still open, and when it was cut off.
struct SlowClient {
    open: Arc<AtomicBool>,
    /// When the server cut it off; `None` if it never did within a minute.
    thread: JoinHandle<Option<Instant>>,
}

impl SlowClient {
    fn start(port: u16, prefix: &'static [u8], drip: u8) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(prefix).unwrap();
        stream.set_nonblocking(true).unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let flag = open.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut buffer = [0u8; 256];
            let mut cut = None;
            while started.elapsed() < Duration::from_secs(60) {
                let closed = match stream.read(&mut buffer) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
                    Err(_) => true,
                };
                if closed || stream.write_all(&[drip]).is_err() {
                    cut = Some(Instant::now());
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            flag.store(false, Ordering::SeqCst);
            cut
        });
        Self { open, thread }
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until the server cuts it off; panics if it never does within a minute.
    fn cut_off(self) -> Instant {
        self.thread
            .join()
            .unwrap()
            .expect("the server left a slow client connected for a minute")
    }
}

/// A TLS record header announcing a 16 KiB handshake message: at one byte per 100 ms it
/// would take half an hour to complete.
const TLS_HELLO_START: &[u8] = &[0x16, 0x03, 0x01, 0x40, 0x00];
/// A request whose headers never end.
const HEADERS_START: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";

#[test]
fn slow_tls_handshakes_do_not_block_the_dashboard_and_are_cut_off() {
    let setup = SecureSetup::new(&[("viewer", "read")]);
    let http_port = free_port();
    let (_scheduler, _url) = setup.spawn_scheduler_with(&[
        "--http-listen".into(),
        format!("127.0.0.1:{http_port}").into(),
        "--http-header-timeout-ms".into(),
        "5000".into(),
    ]);
    let slow: Vec<SlowClient> = (0..40)
        .map(|_| SlowClient::start(http_port, TLS_HELLO_START, 0))
        .collect();
    let url = format!("https://127.0.0.1:{http_port}");
    let (status, body) = https_get(&format!("{url}/"), &setup.ca(), Some(setup.token("viewer")));
    assert_eq!(status, 200, "{body}");
    let (status, _) = https_get(
        &format!("{url}/metrics"),
        &setup.ca(),
        Some(setup.token("viewer")),
    );
    assert_eq!(status, 200);
    let still_open = slow.iter().filter(|c| c.is_open()).count();
    assert!(
        still_open > 0,
        "the dashboard answered while slow handshakes held their connections"
    );
    let started = Instant::now();
    for client in slow {
        client.cut_off();
    }
    eprintln!(
        "slow handshakes cut off {:?} after the check",
        started.elapsed()
    );
}

#[test]
fn trickled_headers_are_cut_off_and_the_connection_cap_holds_the_rest_back() {
    let (_dir, _scheduler, http_port) = scheduler_with_http_limits(1500, 4);
    let slow_since = Instant::now();
    let slow: Vec<SlowClient> = (0..4)
        .map(|_| SlowClient::start(http_port, HEADERS_START, b'a'))
        .collect();
    // Four slow clients hold every slot: a fifth connection waits until one is cut off,
    // which is no sooner than the header timeout.
    let (status, body) = plain_get(http_port, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let waited = slow_since.elapsed();
    assert!(
        waited >= Duration::from_millis(1400),
        "a fifth connection was served after {waited:?}, while four slow ones held every slot"
    );
    for client in slow {
        client.cut_off();
    }
    // With the slots free, the port answers at once.
    assert_eq!(plain_get(http_port, "/healthz").0, 200);
}

/// Issue 48: sixteen connections that send nothing at all, holding all sixteen slots, are
/// cut off at the header timeout like slow ones (before, the timeout started only with a
/// first byte and they held every slot forever): `/healthz` answers.
#[test]
fn silent_connections_are_cut_off_and_do_not_lock_the_port() {
    let (_dir, _scheduler, http_port) = scheduler_with_http_limits(1500, 16);
    let silent: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(("127.0.0.1", http_port)).unwrap())
        .collect();
    let since = Instant::now();
    let (status, body) = plain_get(http_port, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    eprintln!(
        "/healthz answered {:?} after 16 silent connections",
        since.elapsed()
    );
    for stream in silent {
        assert_closed_by_server(stream);
    }
}

/// Issue 48: the gRPC port (TLS and tokens on) with every one of its 16 slots held by
/// connections that send nothing or trickle a TLS handshake: each is cut off at the
/// handshake deadline, and a real client gets through.
#[tokio::test]
async fn silent_and_slow_grpc_connections_do_not_lock_out_clients() {
    let setup = SecureSetup::new(&[("viewer", "read")]);
    let (_scheduler, url) = setup.spawn_scheduler_with(&[
        "--grpc-max-connections".into(),
        "16".into(),
        "--grpc-handshake-timeout-ms".into(),
        "1500".into(),
    ]);
    let grpc_port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let silent: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", grpc_port)).unwrap())
        .collect();
    let slow: Vec<SlowClient> = (0..8)
        .map(|_| SlowClient::start(grpc_port, TLS_HELLO_START, 0))
        .collect();
    let since = Instant::now();
    let cluster =
        resident_sdk::Cluster::connect_with(&url, setup.credentials(Some(setup.token("viewer"))))
            .await
            .expect("a real client connects");
    cluster.list_nodes().await.expect("and is answered");
    eprintln!(
        "a client got through {:?} after 16 stuck connections",
        since.elapsed()
    );
    for client in slow {
        client.cut_off();
    }
    for stream in silent {
        assert_closed_by_server(stream);
    }
}

/// A plaintext scheduler whose HTTP port has these limits, once the port is open: its state
/// directory, the process and the HTTP port.
fn scheduler_with_http_limits(
    header_timeout_ms: u64,
    max_connections: usize,
) -> (tempfile::TempDir, resident_tests::Proc, u16) {
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let (scheduler, _url) = spawn_scheduler_with(
        free_port(),
        dir.path(),
        &[
            "--http-listen".into(),
            format!("127.0.0.1:{http_port}").into(),
            "--http-header-timeout-ms".into(),
            header_timeout_ms.to_string().into(),
            "--http-max-connections".into(),
            max_connections.to_string().into(),
        ],
    );
    wait_for_port(http_port);
    (dir, scheduler, http_port)
}

/// Waits (up to 30 s) for the server to close a connection that never sent anything.
fn assert_closed_by_server(mut stream: TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let read = stream.read(&mut [0u8; 1]);
    let closed = match &read {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(closed, "the server closes a silent connection: {read:?}");
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the HTTP port never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
}
