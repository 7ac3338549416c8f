//! The built-in `generate@1` kind across real processes: a `resident scheduler`, a
//! `resident agent` hosting SmolLM2 (GGUF), and a Rust client calling it typed.

use std::time::Duration;

use futures::StreamExt;

use resident_actor::generate::{
    FinishReason, Generate, GenerateConfig, GenerateParams, GenerateRequest, PromptParts,
};
use resident_sdk::{Pool, PoolSpec};
use resident_tests::*;

/// A `generate@1` pool of SmolLM2 (four sequences in flight), ready, on a scheduler and
/// an agent (real processes) that live as long as it.
struct RunningPool {
    pool: Pool,
    _processes: (Proc, Proc),
    _state: tempfile::TempDir,
}

/// [`RunningPool`] named `name`, its spec adjusted by `adjust`.
async fn smollm2_pool(name: &str, adjust: impl FnOnce(PoolSpec) -> PoolSpec) -> RunningPool {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (scheduler, agent, cluster, _url) = scheduler_with_one_agent(state.path(), &[]).await;
    let config = GenerateConfig {
        model: smollm2_gguf(),
        max_sequences: Some(4),
        ..GenerateConfig::default()
    };
    let spec = adjust(PoolSpec::typed::<Generate>(name, &config).unwrap());
    let pool = cluster.create_pool(spec).await.unwrap();
    pool.wait_ready(Duration::from_secs(60)).await.unwrap();
    RunningPool {
        pool,
        _processes: (scheduler, agent),
        _state: state,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_client_completes_prompts_on_a_resident_generate_actor() {
    let running = smollm2_pool("gen", |spec| spec).await;
    let pool = &running.pool;
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

/// The SDK's generation pool (what Python's `Cluster.generate` calls): device and actor
/// count chosen from the cluster (one agent with one simulated GPU: one actor holding that
/// GPU; the model itself runs on the CPU), prompts cut into tasks of twice the actor's
/// sequences on a GPU, completions back in input order with the prompts answered counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generate_pool_answers_more_prompts_than_a_task_holds_in_input_order() {
    use resident_sdk::GeneratePoolSpec;
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, _agent, cluster, _url) = scheduler_with_one_agent(state.path(), &[]).await;
    let config = GenerateConfig {
        model: smollm2_gguf(),
        max_sequences: Some(32),
        ..GenerateConfig::default()
    };
    let pool = cluster
        .create_generate_pool(
            GeneratePoolSpec::new("gen-pool", config),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let status = pool.pool.status().await.unwrap();
    assert_eq!(status.actors.len(), 1, "one GPU: one actor");
    assert_eq!(
        status.actors[0].gpu_fraction, 1.0,
        "the GPU is used by default"
    );
    assert_eq!(status.spec.idle_ttl_wanted(), None);
    let questions = ["What is 2 + 2?", "Name a colour.", "Say hello."];
    assert_eq!(pool.prompts_per_task(), 64, "twice 32 sequences, on a GPU");
    let total = pool.prompts_per_task() + 3;
    let prompts: Vec<PromptParts> = (0..total)
        .map(|i| PromptParts::new("", "", questions[i % questions.len()], ""))
        .collect();
    let params = GenerateParams {
        max_new_tokens: 3,
        ..GenerateParams::default()
    };
    let mut answered = Vec::new();
    let completions = pool
        .generate(&prompts, &params, |count| answered.push(count))
        .await
        .unwrap();
    assert_eq!(completions.len(), total);
    for (i, completion) in completions.iter().enumerate() {
        assert_eq!(completion.id, i.to_string(), "in input order");
        // Greedy: the same question gives the same text wherever it stands.
        assert_eq!(completion.text, completions[i % questions.len()].text);
    }
    assert_eq!(answered.len(), 2, "two tasks, one count each: {answered:?}");
    assert_eq!(answered.last(), Some(&total));
}

/// An actor's tasks share one continuous batch: a short task sent while a long one runs
/// on the same actor (its credit of 2 lets it wait there) joins the running batch and is
/// answered first, instead of waiting for the long one's last token. Both answers are
/// what each task gives alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_joins_the_batch_running_on_its_actor_and_is_answered_when_it_ends() {
    let running = smollm2_pool("gen-join", |spec| spec.max_in_flight_per_actor(2)).await;
    let pool = &running.pool;
    let request = |id: &str, text: &str, tokens: u32| GenerateRequest {
        prompts: vec![PromptParts::new(id, "", text, "")],
        params: GenerateParams {
            max_new_tokens: tokens,
            ignore_eos: true,
            ..GenerateParams::default()
        },
    };
    let long = request("long", "Tell me a long story about a fox.", 96);
    let short = request("short", "Name a colour.", 2);
    let typed = pool.typed::<Generate>();
    let requests = futures::stream::iter([long.clone(), short.clone()]);
    let stream = typed.submit("join", requests, 0).await.unwrap();
    let replies: Vec<_> = stream.map(|reply| reply.unwrap()).collect().await;
    let order: Vec<u64> = replies.iter().map(|r| r.seq).collect();
    assert_eq!(order, [1, 0], "the short task waited for the long one");
    let short_answer = replies[0].reply.clone().unwrap();
    let long_answer = replies[1].reply.clone().unwrap();
    assert_eq!(replies[0].actor_id, replies[1].actor_id, "one actor");
    assert_eq!(long_answer.completions[0].generated_tokens, 96);
    assert_eq!(short_answer.completions[0].generated_tokens, 2);
    // Greedy: each text is what the task gives alone.
    assert_eq!(typed.call(&short).await.unwrap().unwrap(), short_answer);
    assert_eq!(typed.call(&long).await.unwrap().unwrap(), long_answer);
}
