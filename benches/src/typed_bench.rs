//! What typed calls cost against raw bytes: the same requests through the built-in `echo`
//! kind (bytes in, the same bytes out) and through a typed echo kind (a struct in, the same
//! struct out, postcard on the wire, decoded on both sides), one after the other on one
//! `Cluster::local()`. Prints a markdown table.
//! `cargo run --release -p resident-bench --bin typed-bench`

mod call_counts;

use std::time::Instant;

use clap::Parser;
use futures::StreamExt;
use resident_sdk::actor::{BackendError, Kind, LoadContext, Reply, TypedActor};
use resident_sdk::{Bytes, Cluster, LocalConfig, PoolSpec};
use serde::{Deserialize, Serialize};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    calls: call_counts::CallCounts,
    /// Words in each request's text.
    #[arg(long, default_value_t = 16)]
    words: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Document {
    id: u64,
    text: String,
}

struct TypedEcho;
impl Kind for TypedEcho {
    const NAME: &'static str = "typed-echo";
    const VERSION: u32 = 1;
    type Config = ();
    type Request = Document;
    type Response = Document;
    type Error = String;
}

struct TypedEchoActor;
impl TypedActor for TypedEchoActor {
    type Kind = TypedEcho;
    fn load(_config: (), _context: &LoadContext) -> Result<Self, BackendError> {
        Ok(Self)
    }
    fn handle(&mut self, request: Document) -> Reply<TypedEcho> {
        Ok(request)
    }
}

fn document(id: u64, words: usize) -> Document {
    Document {
        id,
        text: vec!["resident"; words].join(" "),
    }
}

fn rate(calls: u32, started: Instant) -> f64 {
    f64::from(calls) / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut local = LocalConfig::default();
    local.kinds.register_actor::<TypedEchoActor>();
    let cluster = Cluster::local(local).await?;
    let raw = cluster.create_pool(PoolSpec::new("raw", "echo")).await?;
    let typed_pool = cluster
        .create_pool(PoolSpec::typed::<TypedEcho>("typed", &())?)
        .await?;
    for pool in [&raw, &typed_pool] {
        pool.wait_ready(std::time::Duration::from_secs(30)).await?;
    }
    let typed = typed_pool.typed::<TypedEcho>();
    // Raw callers send what the typed ones would: the same document, encoded once.
    let words = args.words;
    let bytes = move |id: u64| -> Bytes {
        let doc = document(id, words);
        Bytes::from(resident_sdk::actor::encode_request::<TypedEcho>(&doc).expect("encodes"))
    };
    let payload_bytes = bytes(0).len();

    // Warm both paths.
    let mut session = raw.session().await?;
    for i in 0..200 {
        session.call(bytes(i)).await?;
        typed
            .call(&document(i, args.words))
            .await?
            .map_err(anyhow::Error::msg)?;
    }

    let started = Instant::now();
    for i in 0..args.calls.sync_calls {
        session.call(bytes(u64::from(i))).await?;
    }
    let raw_sync = rate(args.calls.sync_calls, started);
    let started = Instant::now();
    for i in 0..args.calls.sync_calls {
        let echoed = typed
            .call(&document(u64::from(i), args.words))
            .await?
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(echoed.id == u64::from(i), "wrong reply");
    }
    let typed_sync = rate(args.calls.sync_calls, started);

    let calls = args.calls.pipelined_calls;
    let started = Instant::now();
    let inputs = futures::stream::iter((0..calls).map(move |i| bytes(u64::from(i))));
    let mut job = raw.submit("raw", inputs).await?;
    while let Some(result) = job.next().await {
        result?.output.map_err(anyhow::Error::msg)?;
    }
    let raw_pipelined = rate(calls, started);
    let started = Instant::now();
    let inputs = futures::stream::iter((0..calls).map(move |i| document(u64::from(i), words)));
    let mut job = typed.submit("typed", inputs, 0).await?;
    let mut answered = 0u32;
    while let Some(result) = job.next().await {
        result?.reply.map_err(anyhow::Error::msg)?;
        answered += 1;
    }
    anyhow::ensure!(answered == calls, "{answered} of {calls} answered");
    let typed_pipelined = rate(calls, started);

    println!(
        "| calls ({payload_bytes}-byte request, {} words) | raw bytes (`echo`), calls/s | typed (`typed-echo`), calls/s | typed / raw |",
        args.words
    );
    println!("|---|---:|---:|---:|");
    for (name, raw, typed) in [
        ("one at a time", raw_sync, typed_sync),
        ("pipelined (one job)", raw_pipelined, typed_pipelined),
    ] {
        println!("| {name} | {raw:.0} | {typed:.0} | {:.3} |", typed / raw);
    }
    Ok(())
}
