//! Embedding throughput through the runtime: a local cluster, a pool of `embed` actors, a
//! JSONL corpus in chunks. Prints one markdown table row.
//! `cargo run --release -p resident-bench --bin embed-bench -- --limit 2000`

use std::io::BufRead;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use resident_sdk::{Cluster, EmbedPoolSpec, LocalConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: String,
    #[arg(long, default_value = "data/wiki_vital.jsonl")]
    data: String,
    /// Documents to embed (0 = all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Actors (default: one per core on CPU).
    #[arg(long)]
    replicas: Option<u32>,
    /// Compute threads per model op (RAYON_NUM_THREADS): 1 with one actor per core is fastest.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 256)]
    chunk_size: usize,
    /// Token budget per model batch (default: the kind's own, 1024 on CPU).
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    #[arg(long)]
    max_batch_size: Option<usize>,
    /// Cuts every text to this many tokens (the model's own limit otherwise).
    #[arg(long)]
    max_seq_length: Option<usize>,

    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Attention on a GPU in f16/bf16: the tensor-core flash kernel where it fits, or the
    /// materialised scores (to compare the two in one run).
    #[arg(long, default_value = "flash", value_parser = ["flash", "materialised"])]
    attention: String,
    /// GPUs per actor (needs a `cuda` build on a GPU machine).
    #[arg(long, default_value_t = 0.0)]
    gpus: f64,
    /// VRAM each GPU actor declares for placement, in GiB.
    #[arg(long, default_value_t = 2.0)]
    vram_gib: f64,
    #[arg(long)]
    label: Option<String>,
    /// Writes every vector, in input order, as little-endian f32 rows (for parity checks
    /// against `benches/embed_st.py --vectors-out`; `benches/compare_vectors.py` compares).
    #[arg(long)]
    vectors_out: Option<std::path::PathBuf>,
}

fn read_texts(path: &str, limit: usize) -> anyhow::Result<Vec<String>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut texts = Vec::new();
    for line in file.lines() {
        let record: serde_json::Value = serde_json::from_str(&line?)?;
        texts.push(record["text"].as_str().unwrap_or_default().to_owned());
        if limit > 0 && texts.len() >= limit {
            break;
        }
    }
    Ok(texts)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    resident_models::device::set_compute_threads(args.threads);
    resident_models::embed::allow_flash_attention(args.attention == "flash");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

/// The bench's pool as the flags describe it.
fn pool_spec(args: &Args, replicas: u32) -> EmbedPoolSpec {
    let mut spec = EmbedPoolSpec::new("bench", &args.model)
        .replicas(replicas)
        .gpus(args.gpus, if args.gpus > 0.0 { args.vram_gib } else { 0.0 })
        .dtype(&args.dtype);
    if let Some(tokens) = args.max_batch_tokens {
        spec = spec.max_batch_tokens(tokens);
    }
    if let Some(size) = args.max_batch_size {
        spec = spec.max_batch_size(size);
    }
    if let Some(tokens) = args.max_seq_length {
        spec = spec.max_seq_length(tokens);
    }
    spec
}

async fn run(args: Args) -> anyhow::Result<()> {
    let texts = read_texts(&args.data, args.limit)?;
    let cluster = Cluster::local(LocalConfig::default()).await?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let replicas = args
        .replicas
        .unwrap_or(if args.gpus > 0.0 { 1 } else { cores });
    let load_started = Instant::now();
    let pool = cluster
        .create_embed_pool(pool_spec(&args, replicas), Duration::from_secs(300))
        .await?;
    let load_s = load_started.elapsed().as_secs_f64();

    let started = Instant::now();
    let chunks: Vec<Vec<String>> = texts
        .chunks(args.chunk_size)
        .map(<[String]>::to_vec)
        .collect();
    let mut results = pool
        .embed_chunks(futures::stream::iter(chunks), false)
        .await?;
    let (mut docs, mut tokens, mut padded, mut tokenize_us, mut model_us) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut device = String::new();
    let mut kept: Vec<(u64, Vec<f32>)> = Vec::new();
    let (mut batches, mut budget) = (0u64, 0u64);
    while let Some(chunk) = results.next().await {
        let chunk = chunk?;
        if args.vectors_out.is_some() {
            kept.push((chunk.seq, chunk.values.clone()));
        }
        docs += u64::from(chunk.stats.count);
        tokens += chunk.stats.tokens;
        padded += chunk.stats.padded_tokens;
        tokenize_us += chunk.stats.tokenize_micros;
        model_us += chunk.stats.model_micros;
        batches += u64::from(chunk.stats.batches);
        budget = chunk.stats.max_batch_tokens;
        device = format!("{} {}", chunk.stats.device, chunk.stats.dtype);
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("{batches} model batches; token budget at the end: {budget}");
    if let Some(path) = &args.vectors_out {
        kept.sort_by_key(|(seq, _)| *seq);
        let bytes: Vec<u8> = kept
            .iter()
            .flat_map(|(_, values)| values.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        std::fs::write(path, bytes)?;
    }
    let label = args.label.unwrap_or_else(|| {
        format!(
            "resident: {} actor(s) x {} thread(s), chunk {}, budget {} tokens",
            replicas,
            args.threads,
            args.chunk_size,
            args.max_batch_tokens
                .map_or("default".to_owned(), |t| t.to_string())
        )
    });
    println!(
        "| {label} | {device} | {docs} | {seconds:.1} | {:.1} | {:.0} | {:.1}% | {:.1}% | {load_s:.2} |",
        docs as f64 / seconds,
        tokens as f64 / seconds,
        100.0 * (padded as f64 / tokens.max(1) as f64 - 1.0),
        100.0 * tokenize_us as f64 / (tokenize_us + model_us).max(1) as f64,
    );
    Ok(())
}
