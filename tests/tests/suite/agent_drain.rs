//! An agent that gets SIGTERM in the middle of `resident embed` (a scale-in, a spot
//! interruption, an upgrade) drains: it takes no new tasks, finishes those in hand, leaves,
//! and exits 0. The job carries on on the other node and its output is exact: every input
//! once, in order, and no chunk run to completion twice. With no time to drain, the tasks in
//! hand go back to the queue at once, and the output is still exact.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use resident_tests::{
    Proc, agent_command, assert_embed_succeeds_exactly, embed_command, finished_chunks, free_port,
    init_logging, read_json, sample, spawn_agent, spawn_agent_with, spawn_scheduler, status_json,
    wait_until,
};

const DOCS: usize = 300;
const CHUNK: usize = 3;

struct Cluster {
    dir: tempfile::TempDir,
    _scheduler: Proc,
    url: String,
    input: PathBuf,
}

impl Cluster {
    fn start() -> Self {
        init_logging();
        let dir = tempfile::tempdir().unwrap();
        let input = sample(dir.path(), DOCS);
        let (scheduler, url) = spawn_scheduler(free_port(), &dir.path().join("state"));
        Self {
            dir,
            _scheduler: scheduler,
            url,
            input,
        }
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn embed(&self) -> std::process::Command {
        let chunk = CHUNK.to_string();
        embed_command(
            &self.input,
            &self.out(),
            &[
                "--cluster",
                &self.url,
                "--chunk-size",
                &chunk,
                "--gpus-per-actor",
                "1",
                "--replicas",
                "2",
                // Kept, so its actors' task counts can be read after the job.
                "--keep-pool",
            ],
        )
    }

    async fn wait_for_nodes(&self, count: usize) {
        resident_sdk::Cluster::connect(&self.url)
            .await
            .unwrap()
            .wait_for_nodes(count, Duration::from_secs(10))
            .await
            .unwrap();
    }
}

async fn chunks_done(out: &Path, count: usize) {
    wait_until("finished chunks", Duration::from_secs(120), || async {
        (finished_chunks(out).len() >= count).then_some(())
    })
    .await
}

fn node_state(url: &str, node: &str) -> String {
    status_json(url)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == node)
        .map(|n| n["state"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Runs the embed, SIGTERMs `draining` after two chunks, and checks the agent's exit and the
/// job's output. Returns how long the agent took to exit.
async fn sigterm_mid_embed(cluster: &Cluster, draining: &mut Proc) -> Duration {
    let child = cluster.embed().spawn().unwrap();
    chunks_done(&cluster.out(), 2).await;
    draining.signal("TERM");
    let signalled = Instant::now();
    let status = draining
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the agent exits by itself after draining");
    let took = signalled.elapsed();
    assert!(status.success(), "a drained agent exits 0: {status:?}");
    assert_eq!(node_state(&cluster.url, "node-a"), "dead");

    assert_embed_succeeds_exactly(child, &cluster.input, &cluster.out()).await;
    assert_eq!(read_json(&cluster.out().join("report.json"))["items"], DOCS);
    took
}

/// Tasks answered by every actor the scheduler knows (the drained node's actor included).
fn tasks_done(url: &str) -> u64 {
    status_json(url)["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["tasks_done"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_agent_mid_embed_and_the_output_is_exact() {
    let cluster = Cluster::start();
    let log_path = cluster.dir.path().join("node-a.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = agent_command(&cluster.url, "node-a", "T4:16GiB", "", &[])
        .env("RESIDENT_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut node_a = Proc::new("node-a", child);
    let _node_b = spawn_agent(&cluster.url, "node-b", "T4:16GiB", "");
    cluster.wait_for_nodes(2).await;

    let took = sigterm_mid_embed(&cluster, &mut node_a).await;
    eprintln!("node-a drained and exited {took:?} after SIGTERM");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("draining (no new tasks") && log.contains("drained; left the cluster"),
        "{log}"
    );
    assert!(
        log.contains("abandoned_tasks=0"),
        "the tasks in hand were finished, none handed back: {log}"
    );
    let chunks = finished_chunks(&cluster.out()).len() as u64;
    assert_eq!(chunks, (DOCS / CHUNK) as u64);
    // One more: `resident embed` first asks an actor for the vector dimension.
    assert_eq!(
        tasks_done(&cluster.url),
        chunks + 1,
        "each chunk answered once, by one actor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_no_time_to_drain_hands_its_tasks_back_and_the_output_is_exact() {
    let cluster = Cluster::start();
    let mut node_a = spawn_agent_with(
        &cluster.url,
        "node-a",
        "T4:16GiB",
        "",
        &["--drain-timeout".into(), "0s".into()],
        std::process::Stdio::inherit(),
    );
    let _node_b = spawn_agent(&cluster.url, "node-b", "T4:16GiB", "");
    cluster.wait_for_nodes(2).await;

    let took = sigterm_mid_embed(&cluster, &mut node_a).await;
    assert!(
        took < Duration::from_secs(10),
        "no drain time: the agent leaves at once ({took:?})"
    );
}
