//! The network between `resident embed` and a live scheduler breaks mid-job, twice (once
//! after losing results the scheduler sent): the scheduler keeps the job for
//! `--detach-grace-ms`, the client reattaches to it, and the job ends with every document
//! once, each task counted once, on the same actors.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use resident_tests::cut_proxy::CutProxy;
use resident_tests::{
    actor_model_loads, assert_embed_succeeds_exactly, finished_chunks, init_logging, resident_bin,
    sample, spawn_scheduler, spawn_two_t4_agents, two_actor_embed, wait_until,
};
use serde_json::Value;

/// Waits until the embed's manifest lists more than `count` finished chunks; fails at once,
/// with what it printed, if the embed ended.
async fn chunks_past(embed: &mut Child, out: &Path, count: usize) -> usize {
    let done = wait_until("more finished chunks", Duration::from_secs(120), || {
        let exited = embed.try_wait().expect("poll embed").is_some();
        let done = finished_chunks(out).len();
        async move { (exited || done > count).then_some(done) }
    })
    .await;
    if embed.try_wait().expect("poll embed").is_some() {
        let mut stderr = String::new();
        let _ = embed
            .stderr
            .take()
            .map(|mut e| e.read_to_string(&mut stderr));
        panic!("embed ended mid-job ({done} chunks): {stderr}");
    }
    done
}

/// Waits until the client dialled the proxy again after a cut (it does once it sees its
/// stream broken) and the manifest grew past `seen` chunks since; returns the count.
async fn reattached(
    proxy: &CutProxy,
    before: u64,
    embed: &mut Child,
    out: &Path,
    seen: usize,
) -> usize {
    wait_until(
        "the client to dial again",
        Duration::from_secs(60),
        || async { (proxy.accepted() > before).then_some(()) },
    )
    .await;
    let now = finished_chunks(out).len().max(seen);
    chunks_past(embed, out, now).await
}

/// `resident jobs --json` straight from the scheduler.
fn jobs(url: &str) -> Vec<Value> {
    let output = std::process::Command::new(resident_bin())
        .args(["jobs", "--cluster", url, "--json"])
        .output()
        .expect("run resident jobs");
    assert!(output.status.success(), "{output:?}");
    let listed: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    listed["jobs"].as_array().expect("jobs").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embed_whose_connection_breaks_twice_reattaches_and_counts_each_chunk_once() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let (mut scheduler, url) = spawn_scheduler(0, &dir.path().join("state"));
    let _agents = spawn_two_t4_agents(&url).await;
    let target: SocketAddr = url.trim_start_matches("http://").parse().expect("address");
    let proxy = CutProxy::start(target).await;

    let mut child = two_actor_embed(&input, &out, &proxy.url(), &[])
        .spawn()
        .unwrap();
    let mut seen = chunks_past(&mut child, &out, 1).await;
    // First, results the scheduler sends are lost on the way for a while, then the
    // connection breaks: results sent that the client never reads.
    proxy.lose_replies();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = proxy.accepted();
    proxy.cut();
    seen = reattached(&proxy, before, &mut child, &out, seen).await;
    // Then a cut with the client reading.
    let before = proxy.accepted();
    proxy.cut();
    seen = reattached(&proxy, before, &mut child, &out, seen).await;
    assert!(
        seen < 100,
        "both cuts landed mid-job ({seen} of 100 chunks)"
    );
    let stderr = assert_embed_succeeds_exactly(child, &input, &out).await;
    // A cut can also land while the client is still attaching again after the first; it
    // retries that quietly. Either way it dialled again after each cut (`reattached`).
    let breaks = stderr.matches("job stream broke; resuming").count();
    assert!(
        (1..=2).contains(&breaks),
        "the job stream broke and was resumed: {stderr}"
    );

    assert!(scheduler.is_running(), "the scheduler lived through it");
    let jobs = jobs(&url);
    assert!(
        jobs.iter().all(|j| j["state"] == "succeeded"),
        "no job was cancelled by the broken streams: {jobs:?}"
    );
    let embed = jobs
        .iter()
        .find(|j| j["name"] == "embed")
        .unwrap_or_else(|| panic!("the embed job among {jobs:?}"));
    let count = |field: &str| embed[field].as_u64().unwrap();
    assert_eq!(
        (count("submitted"), count("succeeded"), count("items_done")),
        (100, 100, 300),
        "one job, each chunk and document counted once: {embed}"
    );
    let loads = actor_model_loads(&url);
    assert_eq!(loads.len(), 2, "{loads:?}");
    assert!(
        loads.iter().all(|(_, loads)| *loads == 1),
        "the same actors, each loaded once: {loads:?}"
    );
}
