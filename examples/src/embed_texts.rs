//! Embeds a few sentences with resident all-MiniLM-L6-v2 actors in a local cluster.
//!
//! `scripts/fetch-model.sh && cargo run --release -p resident-examples --bin embed-texts`

use std::time::Duration;

use resident_sdk::{Cluster, EmbedPoolSpec, LocalConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cluster = Cluster::local(LocalConfig::default()).await?;
    let spec = EmbedPoolSpec::new("minilm", "models/all-MiniLM-L6-v2").replicas(2);
    let pool = cluster
        .create_embed_pool(spec, Duration::from_secs(120))
        .await?;

    let texts = [
        "The cat sits on the mat.",
        "A feline rests on a rug.",
        "Stock markets fell today.",
    ];
    let vectors = pool
        .embed(texts.iter().map(ToString::to_string).collect())
        .await?;

    let cosine = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    println!("dimension {}", vectors[0].len());
    println!("cat ~ feline: {:.3}", cosine(&vectors[0], &vectors[1]));
    println!("cat ~ stocks: {:.3}", cosine(&vectors[0], &vectors[2]));
    Ok(())
}
