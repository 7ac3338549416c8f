//! The README's SDK example, as written there (a test checks that the two match and runs
//! this binary). It runs on a machine without a GPU: the local cluster's agent reports a
//! simulated T4, so the pool's GPU request is placed and the work runs on CPU.
//!
//! `cargo run --release -p resident-examples --bin readme-sdk`

#[tokio::main]
async fn main() -> Result<(), resident_sdk::SdkError> {
    // README:begin
    use futures::StreamExt;
    use resident_sdk::{Cluster, LocalConfig, PoolSpec};

    // One process: a scheduler and an agent with a simulated 16 GiB T4 (the work runs on
    // CPU). On a cluster: `Cluster::connect("http://scheduler:50051").await?`.
    let cluster = Cluster::local(LocalConfig::default().simulate_gpus("T4:16GiB")).await?;
    let pool = cluster
        .create_pool(
            PoolSpec::new("stats", "text-stats")
                .replicas(2)
                .gpus(0.25)
                .vram_gib(2.0),
        )
        .await?;
    pool.wait_ready(std::time::Duration::from_secs(60)).await?;

    let texts = vec!["a resident actor", "keeps its model in memory"];
    let mut results = pool.submit("my-job", futures::stream::iter(texts)).await?; // stream in
    while let Some(result) = results.next().await {
        let task = result?; // stream out: each task once, as it finishes
        let output = task.output.map_err(resident_sdk::SdkError::TaskFailed)?;
        println!(
            "task {} on {}: {}",
            task.seq,
            task.actor_id,
            String::from_utf8_lossy(&output)
        );
    }
    let in_order = pool.map(["one", "two", "three"]).await?; // outputs in input order
    println!(
        "{} outputs, first from {}",
        in_order.len(),
        in_order[0].actor_id
    );
    // README:end
    Ok(())
}
