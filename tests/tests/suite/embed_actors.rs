//! The `embed` actor kind with the real all-MiniLM-L6-v2 and all-mpnet-base-v2 weights
//! (scripts/fetch-model.sh): parity with sentence-transformers, loads once per actor, clear
//! errors for bad models.

use std::path::PathBuf;
use std::time::Duration;

use resident_sdk::{Cluster, EmbedPoolSpec, EmbeddedChunk, LocalConfig, SdkError, embed_request};
use resident_tests::{minilm_dir, mpnet_dir, repo_root};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    texts: Vec<String>,
    token_counts: Vec<usize>,
    max_seq_length: usize,
    vectors: Vec<Vec<f32>>,
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

async fn local() -> Cluster {
    resident_tests::init_logging();
    Cluster::local(LocalConfig::default()).await.unwrap()
}

/// Embeds the fixture's texts with `model` on two actors and checks every vector against
/// sentence-transformers' (cosine >= 0.999, unit norm, same order) and the truncation count.
async fn assert_parity_with_sentence_transformers(fixture: &str, model: String, dim: usize) {
    let fixture: Fixture = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures").join(fixture)).unwrap(),
    )
    .unwrap();
    assert!(
        fixture
            .token_counts
            .iter()
            .any(|&n| n > fixture.max_seq_length),
        "the fixture needs texts past max_seq_length"
    );
    let cluster = local().await;
    let pool = cluster
        .create_embed_pool(
            EmbedPoolSpec::new("parity", model)
                .replicas(2)
                .chunk_size(7),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let vectors = pool.embed(fixture.texts.clone()).await.unwrap();
    assert_eq!(vectors.len(), fixture.texts.len());
    for (i, (ours, theirs)) in vectors.iter().zip(&fixture.vectors).enumerate() {
        assert_eq!(ours.len(), dim);
        let similarity = cosine(ours, theirs);
        assert!(
            similarity >= 0.999,
            "text {i} ({} tokens, {:?}...): cosine {similarity}",
            fixture.token_counts[i],
            fixture.texts[i].chars().take(40).collect::<String>()
        );
        let norm = ours.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "text {i} norm {norm}");
    }

    // Truncation is counted per chunk, for exactly the texts over max_seq_length.
    let outputs = pool
        .pool
        .map(vec![embed_request(fixture.texts.clone(), false)])
        .await
        .unwrap();
    let chunk = EmbeddedChunk::from_output(outputs.into_iter().next().unwrap()).unwrap();
    let expected: Vec<u32> = (0..fixture.texts.len() as u32)
        .filter(|&i| fixture.token_counts[i as usize] > fixture.max_seq_length)
        .collect();
    assert_eq!(chunk.stats.truncated_rows, expected);
    assert!(chunk.stats.padded_tokens >= chunk.stats.tokens);
    assert!(chunk.stats.batches >= 1 && chunk.stats.model_micros > 0);
    assert_eq!(chunk.stats.dtype, "f32");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_match_sentence_transformers_in_order_with_unit_norms() {
    assert_parity_with_sentence_transformers("minilm_parity.json", minilm_dir(), 384).await;
}

/// MPNet: relative attention bias, positions after the padding id, max_seq_length 384.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpnet_vectors_match_sentence_transformers_short_and_past_384_tokens() {
    assert_parity_with_sentence_transformers("mpnet_parity.json", mpnet_dir(), 768).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tasks_through_two_actors_load_the_model_twice() {
    let cluster = local().await;
    let pool = cluster
        .create_embed_pool(
            EmbedPoolSpec::new("loads", minilm_dir())
                .replicas(2)
                .chunk_size(1),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let texts: Vec<String> = (0..100).map(|i| format!("document number {i}")).collect();
    let vectors = pool.embed(texts).await.unwrap();
    assert_eq!(vectors.len(), 100);
    let actors = cluster.list_actors().await.unwrap();
    assert_eq!(actors.len(), 2);
    assert_eq!(
        actors.iter().map(|a| a.model_loads).sum::<u64>(),
        2,
        "{actors:?}"
    );
    assert_eq!(actors.iter().map(|a| a.tasks_done).sum::<u64>(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_unsupported_models_fail_at_pool_creation() {
    let cluster = local().await;
    let missing = cluster
        .create_embed_pool(
            EmbedPoolSpec::new("missing", "/no/such/model"),
            Duration::from_secs(30),
        )
        .await
        .err()
        .unwrap();
    assert!(
        matches!(missing, SdkError::ActorsFailed { .. }),
        "{missing:?}"
    );
    assert!(
        missing
            .to_string()
            .ends_with("load failed: model directory /no/such/model does not exist"),
        "{missing}"
    );

    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(
            PathBuf::from(minilm_dir()).join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "t5", "architectures": ["T5EncoderModel"]}"#,
    )
    .unwrap();
    let spec = EmbedPoolSpec::new("t5", dir.path().to_string_lossy());
    let error = cluster
        .create_embed_pool(spec, Duration::from_secs(30))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("unsupported architecture `t5`"), "{error}");

    let bad = cluster.create_embed_pool(
        EmbedPoolSpec::new("dtype", minilm_dir()).dtype("f8"),
        Duration::from_secs(30),
    );
    let error = bad.await.err().unwrap().to_string();
    assert!(
        error.contains("dtype `f8` is not one of f32, f16, bf16"),
        "{error}"
    );

    // A payload that is not an EmbedRequest fails that task only.
    let pool = cluster
        .create_embed_pool(
            EmbedPoolSpec::new("ok", minilm_dir()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let outputs = pool
        .pool
        .map(vec![
            "not protobuf \u{1}\u{2}\u{3}".into(),
            embed_request(vec!["fine".into()], false),
        ])
        .await
        .unwrap();
    assert!(
        outputs[0]
            .output
            .as_ref()
            .unwrap_err()
            .starts_with("bad task payload: not an EmbedRequest"),
        "{:?}",
        outputs[0].output
    );
    assert_eq!(outputs[0].attempts, 1, "a bad payload is not retried");
    assert!(outputs[1].output.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_an_existing_embed_pool_resizes_it_but_never_swaps_its_model() {
    let cluster = local().await;
    let spec = |replicas| EmbedPoolSpec::new("shared", minilm_dir()).replicas(replicas);
    cluster
        .create_embed_pool(spec(1), Duration::from_secs(60))
        .await
        .unwrap();
    let pool = cluster
        .create_embed_pool(spec(2), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(pool.pool.status().await.unwrap().ready_actors, 2);
    let other = EmbedPoolSpec::new("shared", "/another/model");
    let error = cluster
        .create_embed_pool(other, Duration::from_secs(60))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, SdkError::AlreadyExists(_)), "{error:?}");
}
