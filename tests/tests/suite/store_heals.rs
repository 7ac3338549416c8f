//! Issue 48, item 5: a store that heals. Before, one failed write left redb refusing every
//! later operation ("previous I/O error") until a restart, while health still said
//! SERVING; a pool create whose write failed had already started its actors. Now the
//! scheduler's state dir sits on a tiny tmpfs (its own mount namespace, `unshare -rm`),
//! the test fills that filesystem: changes fail with UNAVAILABLE naming the cause, the
//! failed create left nothing behind, both health checks say the store fails, and reads
//! still answer. The test frees the space: the same process accepts changes again within
//! seconds, with no restart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use resident_proto::health::{ServingStatus, check_health};
use resident_sdk::{Cluster, PoolSpec, SdkError};
use resident_tests::*;

/// `resident scheduler` with its state dir on a tmpfs of `size` mounted at `mount` in a
/// mount namespace of its own, with the HTTP port on `http_port`.
fn spawn_scheduler_on_tmpfs(mount: &Path, size: &str, http_port: u16) -> (Proc, String) {
    let script = r#"mount -t tmpfs -o "size=$1" tmpfs "$2" && exec "$3" scheduler \
        --listen 127.0.0.1:0 --state-dir "$2/state" --http-listen "127.0.0.1:$4" \
        --heartbeat-ms 100 --node-dead-ms 700"#;
    let mut command = Command::new("unshare");
    command
        .args(["-rm", "sh", "-c", script, "sh", size])
        .arg(mount)
        .arg(resident_bin())
        .arg(http_port.to_string());
    spawn_scheduler_command(command)
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

fn padded_pool(name: &str) -> PoolSpec {
    // Big enough that a few of them need pages the full filesystem cannot give.
    let note = "x".repeat(60_000);
    PoolSpec::new(name, "echo").config_json(&serde_json::json!({ "note": note }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_changes_clearly_and_they_succeed_once_it_frees_without_a_restart() {
    init_logging();
    let mount = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let (mut scheduler, url) = spawn_scheduler_on_tmpfs(mount.path(), "4m", http_port);
    // The scheduler's view of its own mount namespace.
    let tmpfs = PathBuf::from(format!("/proc/{}/root", scheduler.pid())).join(
        mount
            .path()
            .strip_prefix("/")
            .expect("an absolute temp dir"),
    );
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .create_pool(PoolSpec::new("before", "echo"))
        .await
        .unwrap();
    assert_eq!(health(&url).await, ServingStatus::Serving);

    let filler = tmpfs.join("filler");
    let filled = fill(&filler);
    eprintln!("filled the state dir's filesystem with {filled} bytes");
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
        matches!(&error, SdkError::Unavailable(m) if m.contains("No space left on device") && m.contains("changed nothing")),
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
    assert!(body.contains("No space left on device"), "{body}");
    let (_, metrics) = plain_get(http_port, "/metrics");
    assert!(metrics.contains("resident_store_failing 1"), "{metrics}");
    let listed: Vec<String> = cluster
        .list_pools()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.spec.name().to_owned())
        .collect();
    assert!(
        !listed.contains(&lost),
        "the failed create left {lost} behind: {listed:?}"
    );
    assert!(!listed.contains(&"during".to_owned()), "{listed:?}");
    for name in &saved {
        assert!(listed.contains(name), "{name} is missing: {listed:?}");
    }

    // The disk frees up: the same process heals by itself and takes changes again.
    std::fs::remove_file(&filler).unwrap();
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
    let listed: Vec<String> = cluster
        .list_pools()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.spec.name().to_owned())
        .collect();
    assert!(listed.contains(&"after".to_owned()), "{listed:?}");
    assert!(!listed.contains(&lost), "{listed:?}");
}
