//! A real S3-compatible server (s3s-fs, installed by `scripts/install-s3-server.sh`) on a
//! free loopback port, with its own data directory and credentials.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use resident_jobs::storage::S3Options;

use crate::{Proc, free_port, repo_root};

/// The access key the test S3 server takes.
pub const ACCESS_KEY: &str = "resident-test";
/// Its secret key.
pub const SECRET_KEY: &str = "resident-test-secret";

/// A real S3-compatible server on loopback (from `scripts/install-s3-server.sh`), its data
/// in a temporary directory; stopped when dropped.
pub struct S3Server {
    /// Its URL.
    pub endpoint: String,
    /// Where it keeps the objects.
    pub data_dir: tempfile::TempDir,
    _process: Proc,
}

fn s3s_fs_bin() -> PathBuf {
    let bin = std::env::var_os("RESIDENT_S3S_FS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/tools/bin/s3s-fs"));
    assert!(
        bin.exists(),
        "{} is missing: run scripts/install-s3-server.sh (scripts/test.sh does)",
        bin.display()
    );
    bin
}

impl S3Server {
    /// Starts the server and creates `buckets` (a bucket is a directory of its data dir).
    pub fn start(buckets: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().expect("s3 data dir");
        for bucket in buckets {
            std::fs::create_dir(data_dir.path().join(bucket)).expect("bucket dir");
        }
        let port = free_port();
        let child = Command::new(s3s_fs_bin())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(data_dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        let process = Proc {
            name: "s3s-fs".into(),
            child,
        };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "s3s-fs did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            data_dir,
            _process: process,
        }
    }

    /// Options for the SDK's S3 client pointed at this server.
    pub fn options(&self) -> S3Options {
        S3Options {
            endpoint: Some(self.endpoint.clone()),
            static_credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
            ..S3Options::default()
        }
    }

    /// The environment a `resident` process needs to reach this server.
    pub fn env(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("RESIDENT_S3_ENDPOINT", self.endpoint.clone()),
        ]
    }
}
