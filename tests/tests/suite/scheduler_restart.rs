//! The scheduler is killed with -9 in the middle of `resident embed` on a two-agent
//! cluster: the agents keep their actors (models loaded), the restarted scheduler adopts
//! them, and the command carries on to exit 0 by itself. A scheduler that stays away past
//! `--reconnect-timeout` makes the command exit with a clear message; a rerun resumes.
//! What a pool's GPU actors have held outlives the kill.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use resident_sdk::{Cluster, PoolSpec};
use resident_tests::{
    Proc, actor_model_loads, assert_embed_succeeds_exactly, finished_chunks, free_port,
    ids_in_jsonl, init_logging, pools_gpu_seconds, read_json, sample, signal_pid, spawn_scheduler,
    spawn_two_t4_agents, two_actor_embed, wait_until,
};
use serde_json::Value;

/// A scheduler on a fixed port (so it can come back on it) with its state directory, two
/// agents with a simulated T4 each, and a 300-article input.
struct TwoNodeCluster {
    dir: tempfile::TempDir,
    port: u16,
    scheduler: Proc,
    url: String,
    _agents: [Proc; 2],
    input: PathBuf,
}

impl TwoNodeCluster {
    async fn start() -> Self {
        init_logging();
        let dir = tempfile::tempdir().unwrap();
        let input = sample(dir.path(), 300);
        let port = free_port();
        let (scheduler, url) = spawn_scheduler(port, &dir.path().join("state"));
        let agents = spawn_two_t4_agents(&url).await;
        Self {
            dir,
            port,
            scheduler,
            url,
            _agents: agents,
            input,
        }
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `resident embed` over both nodes in small chunks, so the kill lands mid-job.
    fn embed(&self, extra: &[&str]) -> std::process::Command {
        two_actor_embed(&self.input, &self.out(), &self.url, extra)
    }

    /// Starts the scheduler again on the same port and state directory.
    fn restart_scheduler(&mut self) {
        let (scheduler, url) = spawn_scheduler(self.port, &self.dir.path().join("state"));
        assert_eq!(url, self.url);
        self.scheduler = scheduler;
    }
}

/// Waits until the job's manifest lists at least `count` finished chunks; returns how many.
async fn chunks_done(out: &Path, count: usize) -> usize {
    wait_until("finished chunks", Duration::from_secs(120), || async {
        let done = finished_chunks(out).len();
        (done >= count).then_some(done)
    })
    .await
}

fn ids_of(path: &Path) -> Vec<Value> {
    ids_in_jsonl(&std::fs::read_to_string(path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_scheduler_mid_embed_reloads_no_model_and_loses_no_document() {
    let mut cluster = TwoNodeCluster::start().await;
    let child = cluster.embed(&[]).spawn().unwrap();
    chunks_done(&cluster.out(), 2).await;
    let before = actor_model_loads(&cluster.url);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before.iter().all(|(_, loads)| *loads == 1), "{before:?}");

    // Frozen while the scheduler dies, the client records no chunk: the count read is the
    // count at the kill, whatever the host's speed. The scheduler comes back on its port and
    // state directory as soon as the old one is gone.
    signal_pid(child.id(), "STOP");
    cluster.scheduler.kill9();
    let killed_at = Instant::now();
    let done_at_kill = finished_chunks(&cluster.out()).len();
    signal_pid(child.id(), "CONT");
    assert!(
        done_at_kill < 100,
        "killed mid-job ({done_at_kill} of 100 chunks)"
    );
    cluster.restart_scheduler();

    assert_embed_succeeds_exactly(child, &cluster.input, &cluster.out()).await;
    eprintln!("embed finished {:?} after the kill", killed_at.elapsed());
    let report = read_json(&cluster.out().join("report.json"));
    assert_eq!(report["items"], 300);
    assert_eq!(
        actor_model_loads(&cluster.url),
        before,
        "the same actors, each with its one model load"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_away_past_the_reconnect_timeout_stops_the_job_and_a_rerun_resumes() {
    let mut cluster = TwoNodeCluster::start().await;
    let child = cluster
        .embed(&["--reconnect-timeout", "3s"])
        .spawn()
        .unwrap();
    chunks_done(&cluster.out(), 2).await;
    cluster.scheduler.kill9();
    let killed_at = Instant::now();
    let failed = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(
        stderr.contains("past the reconnect timeout") && stderr.contains("run the command again"),
        "{stderr}"
    );
    assert!(
        killed_at.elapsed() < Duration::from_secs(60),
        "gave up after {:?}",
        killed_at.elapsed()
    );
    let done = finished_chunks(&cluster.out()).len();

    cluster.restart_scheduler();
    let rerun = cluster.embed(&[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "the rerun failed: {stderr}");
    assert_eq!(
        ids_of(&cluster.out().join("ids.jsonl")),
        ids_of(&cluster.input),
        "every input id once, in order"
    );
    let report = read_json(&cluster.out().join("report.json"));
    assert_eq!(
        report["chunks"]["reused"].as_u64().unwrap() as usize,
        done,
        "the rerun resumed from the manifest"
    );
}

/// The GPU-seconds a pool's actors have held (what `report.json` bills, and `resident pools`
/// shows) outlive a kill -9 of the scheduler: it saves them every 5 s, so a reading taken a
/// period before the kill is still there after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_s_gpu_seconds_outlive_kill_9_of_the_scheduler() {
    let mut cluster = TwoNodeCluster::start().await;
    let client = Cluster::connect(&cluster.url).await.unwrap();
    let spec = PoolSpec::new("held", "echo").replicas(2).gpus(1.0);
    client.create_pool(spec).await.unwrap();
    let url = cluster.url.clone();
    // Both actors placed for 2 s: more than a restarted scheduler that forgot them would
    // count between their adoption and the reading after it.
    wait_until("4 GPU-seconds held", Duration::from_secs(30), || {
        let url = url.clone();
        async move { (pools_gpu_seconds(&url) >= 4.0).then_some(()) }
    })
    .await;
    let before_kill = pools_gpu_seconds(&cluster.url);
    std::thread::sleep(Duration::from_secs(6));
    cluster.scheduler.kill9();
    cluster.restart_scheduler();
    let after_restart = pools_gpu_seconds(&cluster.url);
    assert!(
        after_restart >= before_kill,
        "the pool's GPU-seconds went from {before_kill} before the kill to {after_restart} \
         after the restart"
    );
}
