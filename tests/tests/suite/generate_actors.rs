//! The built-in `generate@1` kind across real processes: a `resident scheduler`, a
//! `resident agent` hosting SmolLM2 (GGUF), and a Rust client calling it typed.

use std::time::Duration;

use resident_actor::generate::{
    FinishReason, Generate, GenerateConfig, GenerateParams, GenerateRequest, PromptParts,
};
use resident_sdk::PoolSpec;
use resident_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_client_completes_prompts_on_a_resident_generate_actor() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, _agent, cluster, _url) = scheduler_with_one_agent(state.path(), &[]).await;
    let config = GenerateConfig {
        model: smollm2_gguf(),
        max_sequences: Some(4),
        ..GenerateConfig::default()
    };
    let pool = cluster
        .create_pool(PoolSpec::typed::<Generate>("gen", &config).unwrap())
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(60)).await.unwrap();
    let request = GenerateRequest {
        prompts: vec![
            PromptParts::new(
                "france",
                "Answer in one sentence: ",
                "What is the capital of France?",
                "",
            ),
            PromptParts::new(
                "again",
                "Answer in one sentence: ",
                "What is the capital of France?",
                "",
            ),
        ],
        params: GenerateParams {
            max_new_tokens: 24,
            stop: vec!["Paris".into()],
            ..GenerateParams::default()
        },
    };
    let typed = pool.typed::<Generate>();
    let first = typed.call(&request).await.unwrap().unwrap();
    assert_eq!(first.completions.len(), 2);
    let completion = &first.completions[0];
    assert_eq!(completion.id, "france");
    assert_eq!(
        completion.finish_reason,
        FinishReason::Stop,
        "{completion:?}"
    );
    assert!(!completion.text.contains("Paris"), "{completion:?}");
    assert!(completion.prompt_tokens > 10 && completion.generated_tokens >= 1);
    // Decoded side by side in one batch, the same prompt gives the same text.
    assert_eq!(first.completions[1].text, completion.text);
    // The same call again: the actor kept its model (one load) and answers the same.
    let second = typed.call(&request).await.unwrap().unwrap();
    assert_eq!(second, first);
    let actors = pool.status().await.unwrap().actors;
    assert_eq!(actors.len(), 1);
    let model_loads: u64 = actors.iter().map(|a| a.model_loads).sum();
    assert_eq!(model_loads, 1);
}
