//! Job overhead at fleet scale: what `resident embed`'s own machinery costs (reading and
//! chunking the corpus, dispatch, shards, the manifest and its journal, the merge) on a
//! synthetic corpus, with a STAND-IN ENCODER in place of a model (`stand_in_encoder.rs`:
//! deterministic hash vectors, a few microseconds per document), so only the job is timed.
//! For each corpus size it runs the job in local mode and reports the manifest bytes
//! written, the peak RSS of the process, and the job-side CPU per chunk (the process's CPU
//! less the time spent inside the stand-in). Next to it, on corpora up to
//! `--rewrite-up-to`, the same job with the manifest policy from before the journal (the
//! whole manifest rewritten after every chunk), for comparison in the same run.
//!
//! `cargo build --release --workspace --bins && target/release/job-bench --docs 1000000,10000000`

mod stand_in_encoder;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use resident_jobs::corpus_job::journal::CompactionPolicy;
use resident_jobs::corpus_job::{EmbedJobConfig, run_embed_job};
use resident_sdk::{Cluster, LocalConfig};
use resident_tests::scale_run::process_cpu_seconds;
use stand_in_encoder::{StandInEncoderKind, registry_with_stand_in};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Corpus sizes in documents, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    docs: Vec<u64>,
    #[arg(long, default_value_t = 1000)]
    chunk_size: usize,
    /// Width of the stand-in's vectors (small, so 10M documents fit the disk; the
    /// manifest's cost does not depend on it).
    #[arg(long, default_value_t = 16)]
    dim: usize,
    /// Stand-in actors.
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Also run the old manifest policy (rewritten after every chunk) on corpora up to
    /// this many documents.
    #[arg(long, default_value_t = 1_000_000)]
    rewrite_up_to: u64,
    /// Where corpora (kept between runs) and outputs (removed after each) go.
    #[arg(long, default_value = "/tmp/resident-job-bench")]
    work_dir: PathBuf,
    /// Print the rows as one JSON array on the last line too.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    docs: u64,
    manifest_policy: &'static str,
    chunks: u64,
    wall_s: f64,
    docs_per_s: f64,
    manifest_bytes_written: u64,
    manifest_bytes_per_chunk: f64,
    compactions: u64,
    job_cpu_ms_per_chunk: f64,
    stand_in_cpu_s: f64,
    peak_rss_bytes: u64,
    merged: bool,
}

const WORDS: &[&str] = &[
    "river", "model", "cluster", "history", "language", "north", "station", "energy", "city",
    "paper", "season", "theory", "island", "music", "record", "county", "market", "winter",
    "church", "family", "bridge", "network", "player", "school", "border", "garden", "metal",
];

/// `docs` JSONL records of 8-20 words each, the same every time.
fn synthetic_corpus(dir: &Path, docs: u64) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("corpus-{docs}.jsonl"));
    if path.exists() {
        return Ok(path);
    }
    let started = Instant::now();
    let partial = path.with_extension("partial");
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&partial)?);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for id in 0..docs {
        write!(out, "{{\"id\":\"doc-{id:09}\",\"text\":\"")?;
        let words = 8 + next() % 13;
        for w in 0..words {
            let word = WORDS[(next() % WORDS.len() as u64) as usize];
            out.write_all(if w == 0 { b"" } else { b" " })?;
            out.write_all(word.as_bytes())?;
        }
        out.write_all(b"\"}\n")?;
    }
    out.into_inner()?.sync_all()?;
    std::fs::rename(&partial, &path)?;
    eprintln!(
        "generated {} ({docs} documents) in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}

/// Peak resident set since the last reset (`VmHWM`).
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Resets `VmHWM` to the current RSS (Linux: `5` to `/proc/self/clear_refs`).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

async fn run_one(
    cluster: &Cluster,
    args: &Args,
    corpus: &Path,
    docs: u64,
    rewrite: bool,
    busy_nanos: &AtomicU64,
) -> anyhow::Result<Row> {
    let policy = if rewrite {
        "rewrite every chunk"
    } else {
        "journal"
    };
    let out = args.work_dir.join(format!(
        "out-{docs}-{}",
        if rewrite { "rewrite" } else { "journal" }
    ));
    let _ = std::fs::remove_dir_all(&out);
    let mut config = EmbedJobConfig::new(corpus, "/stand-in-encoder-not-a-model", out.as_path());
    config.corpus.chunk_size = Some(args.chunk_size);
    config.corpus.replicas = Some(args.replicas);
    if rewrite {
        config.corpus.manifest_compaction = CompactionPolicy {
            min_entries: 1,
            fraction: 0.0,
        };
    }
    reset_peak_rss();
    let pid = std::process::id();
    let (cpu_before, busy_before) = (
        process_cpu_seconds(pid)?,
        busy_nanos.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let report = run_embed_job(cluster, &config, &mut |_| {}).await?;
    let wall = started.elapsed();
    let cpu = process_cpu_seconds(pid)? - cpu_before;
    let stand_in = (busy_nanos.load(Ordering::Relaxed) - busy_before) as f64 / 1e9;
    let peak = peak_rss_bytes();
    let _ = std::fs::remove_dir_all(&out);
    let writes = report.output.manifest_writes;
    let chunks = report.chunks.total.max(1);
    Ok(Row {
        docs,
        manifest_policy: policy,
        chunks: report.chunks.total,
        wall_s: wall.as_secs_f64(),
        docs_per_s: report.items as f64 / wall.as_secs_f64(),
        manifest_bytes_written: writes.bytes,
        manifest_bytes_per_chunk: writes.bytes as f64 / chunks as f64,
        compactions: writes.compactions,
        job_cpu_ms_per_chunk: (cpu - stand_in).max(0.0) * 1e3 / chunks as f64,
        stand_in_cpu_s: stand_in,
        peak_rss_bytes: peak,
        merged: report.output.merged,
    })
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

fn print_table(rows: &[Row]) {
    println!(
        "| documents | manifest policy | chunks | wall | docs/s | manifest bytes written | per chunk | compactions | job CPU per chunk | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {:.1} s | {:.0} | {} | {:.0} B | {} | {:.2} ms | {} |",
            row.docs,
            row.manifest_policy,
            row.chunks,
            row.wall_s,
            row.docs_per_s,
            mib(row.manifest_bytes_written as f64),
            row.manifest_bytes_per_chunk,
            row.compactions,
            row.job_cpu_ms_per_chunk,
            mib(row.peak_rss_bytes as f64),
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RESIDENT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    std::fs::create_dir_all(&args.work_dir)?;
    let busy_nanos = Arc::new(AtomicU64::new(0));
    let kinds = registry_with_stand_in(StandInEncoderKind {
        dim: args.dim,
        busy_nanos: busy_nanos.clone(),
    });
    let cluster = Cluster::local(LocalConfig::default().kinds(kinds)).await?;
    eprintln!(
        "job-bench: a STAND-IN ENCODER (hash vectors of {} dimensions, not a model) on {} actors, chunks of {}",
        args.dim, args.replicas, args.chunk_size
    );
    let mut rows = Vec::new();
    for &docs in &args.docs {
        let corpus = synthetic_corpus(&args.work_dir, docs)?;
        for rewrite in [false, true] {
            if rewrite && docs > args.rewrite_up_to {
                continue;
            }
            let row = run_one(&cluster, &args, &corpus, docs, rewrite, &busy_nanos).await?;
            eprintln!(
                "{docs} documents, {}: {:.1} s",
                row.manifest_policy, row.wall_s
            );
            rows.push(row);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    print_table(&rows);
    if args.json {
        println!("{}", serde_json::to_string(&rows)?);
    }
    Ok(())
}
