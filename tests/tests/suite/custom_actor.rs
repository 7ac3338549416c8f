//! A user's own actor kind across processes: `examples/custom-actor`'s `custom-agent` (the
//! whole `resident agent` command line plus a MinHash kind) and `custom-client` (typed calls
//! from the SDK) against a real scheduler; a pool of the kind is refused, naming it, until
//! an agent that has it joins.

use std::process::{Command, Stdio};
use std::time::Duration;

use resident_sdk::Cluster;
use resident_tests::{
    Proc, free_port, init_logging, spawn_agent, spawn_scheduler, wait_until, wiki_sample_lines,
    workspace_bin,
};
use serde_json::Value;

/// 40 Wikipedia leads, then 8 of them again with a word changed.
fn corpus_with_near_duplicates(dir: &std::path::Path) -> std::path::PathBuf {
    let mut lines = wiki_sample_lines(40);
    for i in 0..8 {
        let mut record: Value = serde_json::from_str(&lines[i * 5]).unwrap();
        let text = record["text"].as_str().unwrap().replacen(" the ", " a ", 1);
        record["text"] = Value::from(text);
        record["id"] = Value::from(format!("copy-{i}"));
        lines.push(record.to_string());
    }
    let path = dir.join("corpus.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Runs `custom-client` and returns its exit status and the JSON of its last stdout line.
fn run_client(url: &str, input: &std::path::Path, groups: &std::path::Path) -> (bool, Value) {
    let output = Command::new(workspace_bin("custom-client"))
        .args(["--cluster", url, "--replicas", "2", "--chunk-size", "7"])
        .arg("--input")
        .arg(input)
        .arg("--groups-out")
        .arg(groups)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let last = stdout.lines().last().unwrap_or_default();
    let summary = serde_json::from_str(last).unwrap_or_else(|e| panic!("{last:?}: {e}"));
    (output.status.success(), summary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_agent_and_client_deduplicate_against_a_real_scheduler() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler(free_port(), &dir.path().join("state"));
    let _plain = spawn_agent(&url, "plain", "T4:16GiB", "");
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .unwrap();
    let input = corpus_with_near_duplicates(dir.path());
    let groups_file = dir.path().join("groups.jsonl");

    // Only built-in kinds so far: refused, naming the kind.
    let (ok, summary) = run_client(&url, &input, &groups_file);
    assert!(!ok && summary["ok"] == false, "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(
        error.contains("no alive agent offers actor kind `minhash@1`"),
        "{error}"
    );

    let custom = Command::new(workspace_bin("custom-agent"))
        .args(["--scheduler", &url, "--node-id", "custom"])
        .args(["--simulate-gpus", "T4:16GiB", "--reconnect-max-ms", "300"])
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _custom = Proc::new("custom", custom);
    cluster
        .wait_for_nodes(2, Duration::from_secs(20))
        .await
        .unwrap();

    let (ok, summary) = run_client(&url, &input, &groups_file);
    assert!(ok, "{summary}");
    assert_eq!(summary["docs"], 48, "{summary}");
    assert_eq!(summary["duplicate_groups"], 8, "{summary}");
    assert_eq!(summary["duplicate_docs"], 16, "{summary}");
    let groups: Vec<Vec<Value>> = std::fs::read_to_string(&groups_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, group) in groups.iter().enumerate() {
        assert_eq!(group[1], Value::from(format!("copy-{i}")), "{groups:?}");
    }
    // The actors ran on the custom agent, and the pool is gone afterwards.
    wait_until("the pool deleted", Duration::from_secs(10), || async {
        cluster.list_pools().await.unwrap().is_empty().then_some(())
    })
    .await;
}
