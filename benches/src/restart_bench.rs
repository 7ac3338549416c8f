//! What a scheduler restart costs a running `resident embed`: the same job on a scheduler
//! and two agents (real processes, MiniLM on CPU), run without a restart, with the scheduler
//! killed (-9) mid-job and restarted a second later, and the same again with agents that
//! drop their actors when the scheduler goes away (`--actor-grace 0s`, what agents did
//! before they kept them). Prints a markdown table: wall time, time from the kill to the
//! first chunk answered by the restarted scheduler, and model loads after the kill.
//! `cargo build --release --workspace --bins && target/release/restart-bench --docs 2000`

mod cpu_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use cpu_model::cpu_model;
use resident_tests::{
    Proc, actor_model_loads, free_port, resident_bin, spawn_agent_with, spawn_scheduler,
};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: PathBuf,
    #[arg(long, default_value = "data/wiki_vital.jsonl")]
    data: PathBuf,
    /// Documents embedded per run.
    #[arg(long, default_value_t = 2000)]
    docs: usize,
    #[arg(long, default_value_t = 16)]
    chunk_size: usize,
    /// The share of chunks written when the scheduler is killed.
    #[arg(long, default_value_t = 0.4)]
    kill_at: f64,
    /// How long the scheduler stays down.
    #[arg(long, default_value_t = 1000)]
    down_ms: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    NoRestart,
    Restart,
    RestartAgentsDropActors,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::NoRestart => "no restart",
            Scenario::Restart => "kill -9 + restart, agents keep actors",
            Scenario::RestartAgentsDropActors => "kill -9 + restart, agents drop actors (grace 0)",
        }
    }
}

struct Measured {
    wall: Duration,
    kill_to_first_result: Option<Duration>,
    loads_after_kill: u64,
    same_actors: bool,
}

fn chunks_written(out: &Path) -> usize {
    resident_jobs::corpus_job::manifest_store::finished_chunks_blocking(out)
        .map(|chunks| chunks.len())
        .unwrap_or(0)
}

fn spawn_agents(url: &str, scenario: Scenario) -> Vec<Proc> {
    let grace: Vec<std::ffi::OsString> = match scenario {
        Scenario::RestartAgentsDropActors => vec!["--actor-grace".into(), "0s".into()],
        _ => Vec::new(),
    };
    ["node-a", "node-b"]
        .iter()
        .map(|node| spawn_agent_with(url, node, "T4:16GiB", "", &grace, Stdio::null()))
        .collect()
}

/// `resident embed` of `input` into `out` on the cluster at `url`: two GPU actors, chunks
/// of `--chunk-size`.
fn spawn_embed(
    args: &Args,
    input: &Path,
    out: &Path,
    url: &str,
) -> std::io::Result<std::process::Child> {
    let chunk_size = args.chunk_size.to_string();
    let extra = [
        "--cluster",
        url,
        "--chunk-size",
        chunk_size.as_str(),
        "--gpus-per-actor",
        "1",
        "--replicas",
        "2",
    ];
    Command::new(resident_bin())
        .args(["embed", "--model"])
        .arg(&args.model)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out)
        .args(extra)
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
}

async fn run(args: &Args, input: &Path, scenario: Scenario) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    let (state, out) = (dir.path().join("state"), dir.path().join("out"));
    let port = free_port();
    let (mut scheduler, url) = spawn_scheduler(port, &state);
    let _agents = spawn_agents(&url, scenario);
    resident_sdk::Cluster::connect(&url)
        .await?
        .wait_for_nodes(2, Duration::from_secs(20))
        .await?;
    let total_chunks = args.docs.div_ceil(args.chunk_size);
    let began = Instant::now();
    let mut child = spawn_embed(args, input, &out, &url)?;
    let mut kill_to_first_result = None;
    let mut before = Vec::new();
    if scenario != Scenario::NoRestart {
        let kill_at = ((total_chunks as f64) * args.kill_at).ceil() as usize;
        while chunks_written(&out) < kill_at {
            anyhow::ensure!(child.try_wait()?.is_none(), "the job ended before the kill");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        before = actor_model_loads(&url);
        scheduler.kill9();
        let killed = Instant::now();
        tokio::time::sleep(Duration::from_millis(args.down_ms)).await;
        let written_while_down = chunks_written(&out);
        scheduler = spawn_scheduler(port, &state).0;
        while chunks_written(&out) <= written_while_down && child.try_wait()?.is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        kill_to_first_result = Some(killed.elapsed());
    }
    let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    anyhow::ensure!(
        status.status.success(),
        "embed failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let wall = began.elapsed();
    let after = actor_model_loads(&url);
    let same_actors = before.is_empty()
        || before
            .iter()
            .map(|(id, _)| id)
            .eq(after.iter().map(|(id, _)| id));
    let loads_after_kill = if before.is_empty() {
        0
    } else if same_actors {
        after.iter().map(|(_, l)| l).sum::<u64>() - before.iter().map(|(_, l)| l).sum::<u64>()
    } else {
        after.iter().map(|(_, l)| l).sum()
    };
    drop(scheduler);
    Ok(Measured {
        wall,
        kill_to_first_result,
        loads_after_kill,
        same_actors,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.data)?;
    let lines: Vec<&str> = text.lines().take(args.docs).collect();
    anyhow::ensure!(
        lines.len() == args.docs,
        "{} has fewer lines",
        args.data.display()
    );
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n")?;
    println!(
        "restart-bench: {}, {} documents of {}, chunks of {}, 2 agents (CPU actors), scheduler down {} ms, killed at {:.0}% of chunks; {} ({} cores)\n",
        args.model.display(),
        args.docs,
        args.data.display(),
        args.chunk_size,
        args.down_ms,
        args.kill_at * 100.0,
        cpu_model(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "| run | wall s | vs no restart | kill -> first new result s | model loads after the kill | same actor ids |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    let mut baseline = None;
    for scenario in [
        Scenario::NoRestart,
        Scenario::Restart,
        Scenario::RestartAgentsDropActors,
    ] {
        let measured = run(&args, &input, scenario).await?;
        let base = *baseline.get_or_insert(measured.wall);
        println!(
            "| {} | {:.2} | {:+.2} s | {} | {} | {} |",
            scenario.label(),
            measured.wall.as_secs_f64(),
            measured.wall.as_secs_f64() - base.as_secs_f64(),
            measured
                .kill_to_first_result
                .map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64())),
            measured.loads_after_kill,
            if measured.same_actors { "yes" } else { "no" }
        );
    }
    Ok(())
}
