//! Operating a live cluster from another terminal, with TLS and tokens on: `resident pools`,
//! `resident jobs`, `resident job cancel` and `resident pool delete` against scheduler and
//! agent processes, checked against what the SDK client saw.

use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{Bytes, PoolSpec};
use resident_tests::secure::SecureSetup;
use resident_tests::{init_logging, wait_until};
use serde_json::Value;

/// `resident ARGS --cluster URL --json` as `token`; the parsed output, or the stderr of a
/// refusal.
fn cli(setup: &SecureSetup, url: &str, token: &str, args: &[&str]) -> Result<Value, String> {
    let output = Command::new(resident_tests::resident_bin())
        .args(args)
        .args(["--cluster", url, "--json"])
        .env("RESIDENT_CA", setup.ca())
        .env("RESIDENT_TOKEN", token)
        .env("RESIDENT_LOG", "warn")
        .output()
        .expect("run resident");
    match output.status.success() {
        true => Ok(serde_json::from_slice(&output.stdout).expect("JSON output")),
        false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_pools_are_listed_cancelled_and_deleted_from_the_cli() {
    init_logging();
    let setup = SecureSetup::new(&[("ops", "admin"), ("viewer", "read"), ("node", "agent")]);
    let (_scheduler, url) = setup.spawn_scheduler();
    let _agent = setup.spawn_agent(
        &url,
        "node-1",
        "T4:16GiB x2",
        Some("node"),
        &[],
        std::process::Stdio::inherit(),
    );
    let client = setup.connect_as(&url, "ops").await.unwrap();
    client
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();

    // A finished job on one pool, and a slow one still running on another.
    let fast = client
        .create_pool(PoolSpec::new("fast", "echo"))
        .await
        .unwrap();
    fast.wait_ready(Duration::from_secs(10)).await.unwrap();
    let payloads: Vec<Bytes> = (0..5).map(|i| Bytes::from(format!("doc {i}"))).collect();
    let delivered = fast.map(payloads).await.unwrap();
    assert_eq!(delivered.len(), 5);
    let slow = client
        .create_pool(
            PoolSpec::new("slow", "echo").config_json(&serde_json::json!({"delay_ms": 200})),
        )
        .await
        .unwrap();
    slow.wait_ready(Duration::from_secs(10)).await.unwrap();
    let inputs = futures::stream::iter((0..100).map(|i| Bytes::from(format!("slow {i}"))));
    let mut running = slow.submit("slow-job", inputs).await.unwrap();
    running.next().await.expect("a first result").unwrap();

    // `status --watch --json` prints a line per interval, with the running job.
    let mut watch = Command::new(resident_tests::resident_bin())
        .args(["status", "--cluster", &url, "--json", "--watch", "300ms"])
        .env("RESIDENT_CA", setup.ca())
        .env("RESIDENT_TOKEN", setup.token("viewer"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read its first two lines as they come (a deadline, not a sleep), then stop it.
    let stdout = watch.stdout.take().expect("piped stdout");
    let first_two = tokio::task::spawn_blocking(move || {
        std::io::BufRead::lines(std::io::BufReader::new(stdout))
            .take(2)
            .collect::<Result<Vec<String>, _>>()
    });
    let first_two = tokio::time::timeout(Duration::from_secs(20), first_two).await;
    watch.kill().unwrap();
    watch.wait().unwrap();
    let lines: Vec<Value> = first_two
        .expect("status --watch printed two lines within 20 s")
        .unwrap()
        .unwrap()
        .iter()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["nodes"][0]["node_id"], "node-1");
    assert_eq!(
        lines.last().unwrap()["jobs"][0]["job_id"],
        running.job_id.as_str()
    );

    // A read token lists pools and jobs.
    let pools = cli(&setup, &url, setup.token("viewer"), &["pools"]).unwrap();
    let names: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fast", "slow"], "{pools}");
    assert_eq!(pools["pools"][0]["ready_actors"], 1);
    assert_eq!(pools["pools"][0]["model_loads"], 1);
    // What its CPU actor has held so far, counted by the scheduler.
    let usage = &pools["pools"][0]["usage"];
    assert_eq!(usage[0]["gpu_name"], "", "{pools}");
    assert!(
        usage[0]["cpu_core_seconds"].as_f64().unwrap() > 0.0,
        "{pools}"
    );
    assert_eq!(usage[0]["gpu_seconds"].as_f64(), Some(0.0), "{pools}");
    let jobs = cli(&setup, &url, setup.token("viewer"), &["jobs"]).unwrap();
    let jobs = jobs["jobs"].as_array().unwrap().clone();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let finished = jobs.iter().find(|j| j["pool"] == "fast").unwrap();
    assert_eq!(finished["state"], "succeeded");
    assert_eq!(
        finished["succeeded"],
        delivered.len(),
        "what the client got"
    );
    assert_eq!(finished["progress"], 1.0);
    assert_eq!(finished["owner"], "ops");
    assert_eq!(
        (
            finished["items_done"].as_u64(),
            finished["items_running"].as_u64()
        ),
        (Some(delivered.len() as u64), Some(0)),
        "one item a task, none left running: {finished}"
    );
    resident_tests::assert_has_fields(
        finished,
        &[
            "expected_tasks",
            "items_per_second",
            "elapsed_seconds",
            "gpu_seconds",
            "cost_usd",
        ],
        "resident jobs --json",
    );
    let live = jobs.iter().find(|j| j["pool"] == "slow").unwrap();
    assert_eq!(live["state"], "running");
    assert_eq!(live["job_id"], running.job_id.as_str());

    // It cannot cancel or delete; the admin can.
    let job_id = running.job_id.to_string();
    let refused = cli(
        &setup,
        &url,
        setup.token("viewer"),
        &["job", "cancel", &job_id],
    )
    .expect_err("read cannot cancel");
    assert!(refused.contains("has role read"), "{refused}");
    let cancelled = cli(
        &setup,
        &url,
        setup.token("ops"),
        &["job", "cancel", &job_id],
    )
    .unwrap();
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    let mut after_cancel = 0;
    while let Some(result) = running.next().await {
        after_cancel += usize::from(result.is_ok_and(|r| r.output.is_ok()));
    }
    assert!(after_cancel < 99, "the job stopped early");

    let refused = cli(
        &setup,
        &url,
        setup.token("viewer"),
        &["pool", "delete", "slow"],
    )
    .expect_err("read cannot delete");
    assert!(refused.contains("has role read"), "{refused}");
    for name in ["slow", "fast"] {
        let deleted = cli(&setup, &url, setup.token("ops"), &["pool", "delete", name]).unwrap();
        assert_eq!(deleted["deleted"], name);
    }
    let pools = cli(&setup, &url, setup.token("viewer"), &["pools"]).unwrap();
    assert_eq!(pools["pools"], serde_json::json!([]));
    // Their actors stop and free the node.
    wait_until(
        "the deleted pools' actors are gone",
        Duration::from_secs(10),
        || async { client.list_actors().await.unwrap().is_empty().then_some(()) },
    )
    .await;
}

/// `resident embed ARGS` against the secure cluster as `ops`; its exit status.
fn embed(
    setup: &SecureSetup,
    url: &str,
    input: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) {
    let output =
        resident_tests::embed_command(input, out, &["--cluster", url, "--chunk-size", "10"])
            .args(extra)
            .env("RESIDENT_CA", setup.ca())
            .env("RESIDENT_TOKEN", setup.token("ops"))
            .output()
            .expect("run resident embed");
    assert!(
        output.status.success(),
        "embed failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_deletes_its_pool_at_the_end_unless_kept_and_a_kept_one_expires_when_idle() {
    init_logging();
    let setup = SecureSetup::new(&[("ops", "admin"), ("node", "agent")]);
    let (_scheduler, url) = setup.spawn_scheduler();
    let _agent = setup.spawn_agent(
        &url,
        "node-1",
        "T4:16GiB",
        Some("node"),
        &[],
        std::process::Stdio::inherit(),
    );
    let dir = tempfile::tempdir().unwrap();
    let input = resident_tests::sample(dir.path(), 30);
    let pools = || cli(&setup, &url, setup.token("ops"), &["pools"]).unwrap()["pools"].clone();

    embed(
        &setup,
        &url,
        &input,
        &dir.path().join("a"),
        &["--replicas", "1"],
    );
    assert_eq!(
        pools(),
        serde_json::json!([]),
        "no --keep-pool: the pool is gone"
    );

    embed(
        &setup,
        &url,
        &input,
        &dir.path().join("b"),
        &["--replicas", "1", "--keep-pool", "--idle-ttl", "3s"],
    );
    let kept = pools();
    assert_eq!(kept.as_array().unwrap().len(), 1, "{kept}");
    assert_eq!(kept[0]["idle_ttl_seconds"], 3.0, "{kept}");
    assert_eq!(kept[0]["ready_actors"], 1, "its actor stays loaded");
    wait_until(
        "the kept pool is deleted once idle past its TTL",
        Duration::from_secs(20),
        || async { (pools() == serde_json::json!([])).then_some(()) },
    )
    .await;
}
