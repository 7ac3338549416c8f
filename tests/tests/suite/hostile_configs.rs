//! Issue 48: no pool config can take an agent down. Before, an `echo` pool asking for an
//! absurd `repeat` made its actor allocate 10^15 bytes: the allocation aborted the agent,
//! the scheduler placed the actor and the task on the next agent, which died too, and the
//! task stayed queued for whatever agent joined next. Now the config is refused at pool
//! creation naming the field and its limit, a config within the bounds whose output would
//! still be too large fails its task with a clear error, and both agents stay up.

use std::time::Duration;

use resident_sdk::{Bytes, PoolSpec, SdkError};
use resident_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_sized_config_is_refused_and_no_agent_dies() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, mut first, cluster, url) = scheduler_with_one_agent(state.path(), &[]).await;
    let mut second = spawn_agent(&url, "node-2", "A10G:24GiB", "");
    cluster
        .wait_for_nodes(2, Duration::from_secs(20))
        .await
        .unwrap();

    let refused = cluster
        .create_pool(
            PoolSpec::new("abort", "echo")
                .config_json(&serde_json::json!({"repeat": 1_000_000_000_000_000u64})),
        )
        .await
        .err()
        .expect("an absurd repeat is refused");
    assert!(
        matches!(&refused, SdkError::InvalidArgument(m) if m.contains("`repeat`") && m.contains("65536")),
        "{refused}"
    );
    for (field, config) in [
        (
            "max_sequences",
            serde_json::json!({"model": "m", "max_sequences": 1u64 << 40}),
        ),
        (
            "threads",
            serde_json::json!({"model": "m", "threads": 1_000_000}),
        ),
    ] {
        let refused = cluster
            .create_pool(PoolSpec::new("gen", "generate@1").config_json(&config))
            .await
            .err()
            .expect("refused");
        assert!(
            refused.to_string().contains(&format!("`{field}`")),
            "{refused}"
        );
    }

    // Within the bounds, but 1 MiB x 65,536 is 64 GiB: the task fails, saying so, on the
    // first actor that runs it; no agent dies and nothing is retried onto the next.
    let pool = cluster
        .create_pool(
            PoolSpec::new("big", "echo")
                .replicas(2)
                .config_json(&serde_json::json!({"repeat": 65536})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let outputs = pool
        .map(vec![
            Bytes::from(vec![1u8; 1 << 20]),
            Bytes::from_static(b"small"),
        ])
        .await
        .unwrap();
    let error = outputs[0].output.clone().unwrap_err();
    assert!(
        error.contains("68719476736 bytes") && error.contains("`repeat` is 65536"),
        "{error}"
    );
    assert_eq!(
        outputs[0].attempts, 1,
        "a result too large fails for good, not retried"
    );
    assert_eq!(outputs[1].output.as_ref().unwrap().len(), 5 * 65536);
    assert!(
        first.is_running() && second.is_running(),
        "both agents are alive"
    );
    let nodes = cluster.list_nodes().await.unwrap();
    assert!(nodes.iter().all(|n| n.alive), "{nodes:?}");
}

/// A model whose `config.json` declares absurd dimensions (a corrupt download, a hostile
/// upload) is refused at load naming the field, before anything is sized from it; the
/// agent stays up and loads a sound model next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_absurd_dimensions_fails_to_load_and_the_agent_lives() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let corrupt = tempfile::tempdir().unwrap();
    let sound = std::path::PathBuf::from(minilm_dir());
    for entry in std::fs::read_dir(&sound).unwrap() {
        let entry = entry.unwrap();
        let to = corrupt.path().join(entry.file_name());
        if entry.file_name() != "config.json" {
            std::os::unix::fs::symlink(entry.path(), to).unwrap();
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sound.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = serde_json::json!(1_000_000_000u64);
    std::fs::write(corrupt.path().join("config.json"), config.to_string()).unwrap();

    let (_scheduler, url) = spawn_scheduler_with(0, state.path(), &[]);
    let roots: Vec<std::ffi::OsString> = vec![
        "--model-root".into(),
        corrupt.path().into(),
        "--model-root".into(),
        repo_root().join("models").into(),
    ];
    let mut agent = spawn_agent_with(
        &url,
        "node-1",
        "A10G:24GiB",
        "",
        &roots,
        std::process::Stdio::inherit(),
    );
    let cluster = resident_sdk::Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .unwrap();
    let failed = cluster
        .create_embed_pool(
            resident_sdk::EmbedPoolSpec::new("corrupt", corrupt.path().to_str().unwrap()),
            Duration::from_secs(60),
        )
        .await
        .err()
        .expect("a model with a billion layers does not load");
    let text = failed.to_string();
    assert!(
        text.contains("num_hidden_layers is 1000000000") && text.contains("corrupt"),
        "{text}"
    );
    assert!(agent.is_running(), "the agent is alive");
    let pool = cluster
        .create_embed_pool(
            resident_sdk::EmbedPoolSpec::new("sound", minilm_dir()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let vectors = pool.embed(vec!["still here".into()]).await.unwrap();
    assert_eq!(vectors[0].len(), 384);
}
