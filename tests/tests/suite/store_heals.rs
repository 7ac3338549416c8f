//! Issue 48, item 5: a store that heals. Before, one failed write left redb refusing every
//! later operation ("previous I/O error") until a restart, while health still said
//! SERVING; a pool create whose write failed had already started its actors. Now the test
//! gives the scheduler's state dir a disk it can fill: changes fail with UNAVAILABLE naming
//! the cause, the failed create left nothing behind, both health checks say the store
//! fails, and reads still answer. The test frees the space: the same process accepts
//! changes again within seconds, with no restart.
//!
//! The disk is a 4 MiB tmpfs in a mount namespace of the scheduler's own (`unshare -rm`),
//! filled with a file. Where no namespace can be made, the scheduler runs under a file-size
//! limit instead (`prlimit`, SIGXFSZ ignored): the limit drops to the database's size to
//! fill the disk and is lifted to free it. `RESIDENT_TEST_SMALL_DISK=fsize` picks that way.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use resident_proto::health::{ServingStatus, check_health};
use resident_sdk::{Cluster, PoolSpec, SdkError};
use resident_tests::*;

/// A disk the test fills and frees under a running scheduler.
enum SmallDisk {
    /// A tmpfs seen through `/proc/<pid>/root`; the filler file fills it.
    Tmpfs { filler: PathBuf },
    /// A file-size limit on the scheduler process, on its state dir's database.
    FileSizeLimit { pid: u32, database: PathBuf },
}

impl SmallDisk {
    fn fill(&self) {
        match self {
            Self::Tmpfs { filler } => {
                let filled = fill(filler);
                eprintln!("filled the state dir's tmpfs with {filled} bytes");
            }
            Self::FileSizeLimit { pid, database } => {
                let size = std::fs::metadata(database).expect("the database").len();
                set_file_size_limit(*pid, &size.to_string());
            }
        }
    }

    fn free(&self) {
        match self {
            Self::Tmpfs { filler } => std::fs::remove_file(filler).unwrap(),
            Self::FileSizeLimit { pid, .. } => set_file_size_limit(*pid, "unlimited"),
        }
    }

    /// What the operating system says when a write does not fit.
    fn error_text(&self) -> &'static str {
        match self {
            Self::Tmpfs { .. } => "No space left on device",
            Self::FileSizeLimit { .. } => "File too large",
        }
    }
}

fn set_file_size_limit(pid: u32, soft: &str) {
    let status = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--fsize={soft}:unlimited"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --fsize={soft} failed");
}

/// Whether this host lets the test mount a tmpfs in a namespace of its own.
fn can_mount_tmpfs() -> bool {
    if std::env::var("RESIDENT_TEST_SMALL_DISK").as_deref() == Ok("fsize") {
        return false;
    }
    let probe = tempfile::tempdir().unwrap();
    Command::new("unshare")
        .args([
            "-rm",
            "sh",
            "-c",
            r#"mount -t tmpfs -o size=1m tmpfs "$1""#,
            "sh",
        ])
        .arg(probe.path())
        .status()
        .is_ok_and(|s| s.success())
}

/// `resident scheduler` with its state dir on a small disk, with the HTTP port on
/// `http_port`.
fn spawn_scheduler_on_small_disk(dir: &Path, http_port: u16) -> (Proc, String, SmallDisk) {
    let args = r#"--listen 127.0.0.1:0 --state-dir "$2/state" --http-listen "127.0.0.1:$3" \
        --heartbeat-ms 100 --node-dead-ms 700"#;
    let tmpfs = can_mount_tmpfs();
    let script = if tmpfs {
        format!(r#"mount -t tmpfs -o size=4m tmpfs "$2" && exec "$1" scheduler {args}"#)
    } else {
        format!(r#"trap '' XFSZ; exec "$1" scheduler {args}"#)
    };
    let mut command = Command::new(if tmpfs { "unshare" } else { "sh" });
    if tmpfs {
        command.args(["-rm", "sh"]);
    }
    command
        .args(["-c", &script, "sh"])
        .arg(resident_bin())
        .arg(dir)
        .arg(http_port.to_string());
    let (scheduler, url) = spawn_scheduler_command(command);
    let disk = if tmpfs {
        // The scheduler's view of its own mount namespace.
        let root = PathBuf::from(format!("/proc/{}/root", scheduler.pid()));
        let inside = dir.strip_prefix("/").expect("an absolute temp dir");
        SmallDisk::Tmpfs {
            filler: root.join(inside).join("filler"),
        }
    } else {
        SmallDisk::FileSizeLimit {
            pid: scheduler.pid(),
            database: dir.join("state/scheduler.redb"),
        }
    };
    (scheduler, url, disk)
}

/// Writes zeros to `path` until the filesystem is full.
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(error) => {
                assert_eq!(error.raw_os_error(), Some(28), "ENOSPC expected: {error}");
                break;
            }
        }
    }
    written
}

async fn health(url: &str) -> ServingStatus {
    let addr = url.trim_start_matches("http://");
    check_health(addr, "", Duration::from_secs(5))
        .await
        .expect("the health service answers")
}

async fn pool_names(cluster: &Cluster) -> Vec<String> {
    let pools = cluster.list_pools().await.unwrap().into_iter();
    pools.map(|p| p.spec.name().to_owned()).collect()
}

fn padded_pool(name: &str) -> PoolSpec {
    // Big enough that a few of them need pages the full filesystem cannot give.
    let note = "x".repeat(60_000);
    PoolSpec::new(name, "echo").config_json(&serde_json::json!({ "note": note }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_changes_clearly_and_they_succeed_once_it_frees_without_a_restart() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let (mut scheduler, url, disk) = spawn_scheduler_on_small_disk(dir.path(), http_port);
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .create_pool(PoolSpec::new("before", "echo"))
        .await
        .unwrap();
    assert_eq!(health(&url).await, ServingStatus::Serving);

    disk.fill();
    let mut saved = vec!["before".to_owned()];
    let mut failure = None;
    for i in 0..200 {
        let name = format!("big-{i}");
        match cluster.create_pool(padded_pool(&name)).await {
            Ok(_) => saved.push(name),
            Err(error) => {
                failure = Some((name, error));
                break;
            }
        }
    }
    let (lost, error) = failure.expect("a write fails on a full filesystem");
    assert!(
        matches!(&error, SdkError::Unavailable(m) if m.contains(disk.error_text()) && m.contains("changed nothing")),
        "{error}"
    );
    eprintln!("pools saved before the disk ran out: {}", saved.len());

    // While the disk is full: changes are refused at once and say why, both health checks
    // say so, and reads still answer with what was saved (not the failed create).
    let asked = Instant::now();
    let refused = cluster
        .create_pool(PoolSpec::new("during", "echo"))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&refused, SdkError::Unavailable(m) if m.contains("cannot write") && m.contains("--state-dir")),
        "{refused}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(health(&url).await, ServingStatus::NotServing);
    let (status, body) = plain_get(http_port, "/healthz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(disk.error_text()), "{body}");
    let (_, metrics) = plain_get(http_port, "/metrics");
    assert!(metrics.contains("resident_store_failing 1"), "{metrics}");
    let listed = pool_names(&cluster).await;
    assert!(
        !listed.contains(&lost),
        "the failed create left {lost} behind: {listed:?}"
    );
    assert!(!listed.contains(&"during".to_owned()), "{listed:?}");
    for name in &saved {
        assert!(listed.contains(name), "{name} is missing: {listed:?}");
    }

    // The disk frees up: the same process heals by itself and takes changes again.
    disk.free();
    let freed = Instant::now();
    while health(&url).await != ServingStatus::Serving {
        assert!(
            freed.elapsed() < Duration::from_secs(15),
            "the store did not heal within 15 s of the disk freeing up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("healed {:?} after the disk freed up", freed.elapsed());
    cluster
        .create_pool(PoolSpec::new("after", "echo"))
        .await
        .expect("a change succeeds once the disk has room");
    assert_eq!(plain_get(http_port, "/healthz"), (200, "ok\n".to_owned()));
    assert!(scheduler.is_running(), "healed without a restart");
    let listed = pool_names(&cluster).await;
    assert!(listed.contains(&"after".to_owned()), "{listed:?}");
    assert!(!listed.contains(&lost), "{listed:?}");
}
