//! Deduplicates a JSONL corpus on a Resident cluster with the MinHash kind: creates a pool
//! of it, sends the texts in chunks through the typed API, groups near-duplicates, and
//! prints a JSON object as the last line of stdout:
//! `{"docs": N, "duplicate_groups": G, "duplicate_docs": D, "ok": true}`
//! (on failure `{"ok": false, "error": "..."}`, exit status 1).

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use custom_actor::{MinHash, MinHashConfig, MinHashRequest, group_near_duplicates};
use futures::StreamExt;
use resident_sdk::{Cluster, PoolSpec, SdkError};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "custom-client",
    about = "Find near-duplicate documents with MinHash actors"
)]
struct Args {
    /// Scheduler URL (`https://` for TLS).
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: String,
    /// A JSONL file with one document per line.
    #[arg(long)]
    input: PathBuf,
    /// The JSON field holding each document's text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// The JSON field holding each document's id (written to --groups-out).
    #[arg(long, default_value = "id")]
    id_field: String,
    /// Documents per call.
    #[arg(long, default_value_t = 256)]
    chunk_size: usize,
    /// MinHash actors.
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Signatures that agree on this fraction of positions are near-duplicates.
    #[arg(long, default_value_t = 0.8)]
    threshold: f64,
    /// The pool's name; it is deleted at the end unless --keep-pool.
    #[arg(long, default_value = "minhash-dedup")]
    pool: String,
    #[arg(long)]
    keep_pool: bool,
    /// Write the groups here, one JSON array of ids per line.
    #[arg(long)]
    groups_out: Option<PathBuf>,
    /// CA certificate (PEM) of the scheduler's TLS certificate.
    #[arg(long, env = "RESIDENT_CA")]
    ca: Option<PathBuf>,
    /// Token for a cluster with auth on.
    #[arg(long, env = "RESIDENT_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

struct Corpus {
    ids: Vec<Value>,
    texts: Vec<String>,
}

fn read_corpus(args: &Args) -> anyhow::Result<Corpus> {
    let file = std::fs::File::open(&args.input)
        .with_context(|| format!("--input {}", args.input.display()))?;
    let mut corpus = Corpus {
        ids: Vec::new(),
        texts: Vec::new(),
    };
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let place = || format!("{}:{}", args.input.display(), number + 1);
        let record: Value = serde_json::from_str(&line).with_context(place)?;
        let Some(text) = record.get(&args.text_field).and_then(Value::as_str) else {
            bail!(
                "{}: no string field `{}` (use --text-field)",
                place(),
                args.text_field
            );
        };
        corpus.texts.push(text.to_owned());
        corpus
            .ids
            .push(record.get(&args.id_field).cloned().unwrap_or(json!(number)));
    }
    Ok(corpus)
}

async fn deduplicate(args: &Args) -> anyhow::Result<Value> {
    if args.chunk_size == 0 {
        bail!("--chunk-size must be at least 1");
    }
    let corpus = read_corpus(args)?;
    let mut credentials = resident_sdk::ClientCredentials::default().with_token(args.token.clone());
    if let Some(ca) = &args.ca {
        credentials = credentials.with_ca_file(ca).context("--ca")?;
    }
    let cluster = Cluster::connect_with(&args.cluster, credentials).await?;
    let config = MinHashConfig::default();
    let spec = PoolSpec::typed::<MinHash>(&args.pool, &config)?.replicas(args.replicas);
    let pool = match cluster.create_pool(spec).await {
        Ok(pool) => pool,
        // A kept pool of an earlier run: reuse its loaded actors.
        Err(SdkError::AlreadyExists(_)) => cluster.pool(&args.pool),
        Err(error) => return Err(error.into()),
    };
    pool.wait_ready(Duration::from_secs(120)).await?;
    let minhash = pool.typed::<MinHash>();
    let chunks: Vec<MinHashRequest> = corpus
        .texts
        .chunks(args.chunk_size)
        .map(|texts| MinHashRequest {
            texts: texts.to_vec(),
        })
        .collect();
    let chunk_count = chunks.len();
    let window = args.replicas * 2;
    let mut replies = minhash
        .submit("minhash", futures::stream::iter(chunks), window)
        .await?;
    let mut by_chunk = vec![None; chunk_count];
    while let Some(output) = replies.next().await {
        let output = output?;
        let signatures = output
            .reply
            .map_err(|refusal| anyhow::anyhow!("chunk {}: {refusal}", output.seq))?;
        let slot = by_chunk
            .get_mut(output.seq as usize)
            .with_context(|| format!("a reply for chunk {}, past the last", output.seq))?;
        *slot = Some(signatures);
    }
    let signatures: Vec<Vec<u64>> = by_chunk
        .into_iter()
        .enumerate()
        .map(|(chunk, s)| s.with_context(|| format!("chunk {chunk} got no reply")))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    if !args.keep_pool {
        pool.delete().await?;
    }
    let groups = group_near_duplicates(&signatures, 32, args.threshold);
    if let Some(path) = &args.groups_out {
        let lines: String = groups
            .iter()
            .map(|g| {
                json!(g.iter().map(|&d| &corpus.ids[d]).collect::<Vec<_>>()).to_string() + "\n"
            })
            .collect();
        std::fs::write(path, lines).with_context(|| format!("--groups-out {}", path.display()))?;
    }
    Ok(json!({
        "docs": corpus.texts.len(),
        "duplicate_groups": groups.len(),
        "duplicate_docs": groups.iter().map(Vec::len).sum::<usize>(),
        "ok": true,
    }))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match deduplicate(&args).await {
        Ok(summary) => {
            println!("{summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            println!("{}", json!({"ok": false, "error": format!("{error:#}")}));
            std::process::ExitCode::FAILURE
        }
    }
}
