//! Bad requests get clear errors and disturb nothing else.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{ActorState, Bytes, JobState, PoolSpec, SdkError, SubmitOptions};
use resident_tests::{AgentSpec, InProcessCluster, wait_until};

async fn cluster() -> InProcessCluster {
    InProcessCluster::start(vec![
        AgentSpec {
            node_id: "node-1".into(),
            gpus: Some("A6000:48GiB x2".into()),
            labels: "pool=onprem".into(),
        },
        AgentSpec {
            node_id: "node-2".into(),
            gpus: Some("H100:80GiB".into()),
            labels: "pool=cloud".into(),
        },
    ])
    .await
}

fn echo(name: &str) -> PoolSpec {
    PoolSpec::new(name, "echo")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_resources_are_refused_naming_the_blocker() {
    let test = cluster().await;
    let error = test
        .cluster
        .create_pool(echo("huge").gpus(1.0).vram_gib(200.0))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, SdkError::Unplaceable(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "cannot be placed: cannot place pool `huge`: needs 200.0 GiB on one GPU; largest free is 80.0 GiB (node-2 gpu 0)"
    );
    let error = test
        .cluster
        .create_pool(echo("many").gpus(4.0))
        .await
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .ends_with("needs 4 GPUs on one node; the largest eligible node has 2"),
        "{error}"
    );
    let error = test
        .cluster
        .create_pool(echo("nowhere").selector("pool", "mars"))
        .await
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .ends_with("no alive node has labels pool=mars"),
        "{error}"
    );
    let error = test
        .cluster
        .create_pool(echo("half").gpus(1.5))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, SdkError::InvalidArgument(_)), "{error:?}");
    assert!(
        test.cluster.list_actors().await.unwrap().is_empty(),
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kind_zero_replicas_and_bad_names_are_invalid() {
    let test = cluster().await;
    let error = test
        .cluster
        .create_pool(PoolSpec::new("p", "llama-magic"))
        .await
        .err()
        .unwrap();
    assert_eq!(
        error.to_string(),
        "invalid request: invalid argument: no alive agent offers actor kind `llama-magic`; alive \
         agents offer: echo, embed, generate@1, text-stats. A kind of your own runs on agents built with it \
         (see examples/custom-actor)"
    );
    let error = test
        .cluster
        .create_pool(echo("p").replicas(0))
        .await
        .err()
        .unwrap();
    assert_eq!(
        error.to_string(),
        "invalid request: invalid argument: replicas must be at least 1"
    );
    let error = test
        .cluster
        .create_pool(echo("bad name!"))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, SdkError::InvalidArgument(_)), "{error:?}");
    let error = test
        .cluster
        .pool("missing")
        .submit("x", futures::stream::empty::<Bytes>())
        .await
        .err()
        .unwrap();
    assert_eq!(error.to_string(), "not found: no pool named `missing`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_payloads_and_failing_tasks_fail_alone() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("p")
                .replicas(2)
                .max_task_attempts(3)
                .config_json(&serde_json::json!({"fail_prefix": "FAIL"})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let payloads = vec![
        Bytes::from("ok-0"),
        Bytes::new(),
        Bytes::from("FAIL-2"),
        Bytes::from("ok-3"),
    ];
    let outputs = pool.map(payloads).await.unwrap();
    assert_eq!(outputs[0].output.as_deref(), Ok(&b"ok-0"[..]));
    assert_eq!(
        outputs[1].output,
        Err("invalid argument: task payload is empty".to_owned())
    );
    assert_eq!(
        outputs[2].output,
        Err("failed after 3 attempts: payload starts with `FAIL`".to_owned())
    );
    assert_eq!(outputs[2].attempts, 3);
    assert_eq!(outputs[3].output.as_deref(), Ok(&b"ok-3"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_fails_to_load_is_reported() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("broken")
                .max_restarts(1)
                .config_json(&serde_json::json!({"fail_load": true})),
        )
        .await
        .unwrap();
    let error = pool
        .wait_ready(Duration::from_secs(10))
        .await
        .err()
        .unwrap();
    assert_eq!(
        error.to_string(),
        "every actor of pool `broken` failed: load failed: echo was configured to fail loading"
    );
    let actors = test.cluster.list_actors().await.unwrap();
    assert_eq!(actors[0].restarts, 1);
    let error = test
        .cluster
        .create_pool(echo("typo").config_json(&serde_json::json!({"delay": 1})))
        .await
        .unwrap();
    let error = error
        .wait_ready(Duration::from_secs(10))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("invalid actor config: unknown field `delay`"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_only_its_job() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("p")
                .replicas(2)
                .config_json(&serde_json::json!({"delay_ms": 2})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();

    let endless = futures::stream::iter((0u64..).map(|i| Bytes::from(i.to_string())));
    let mut doomed = pool.submit("doomed", endless).await.unwrap();
    let doomed_id = doomed.job_id.clone();
    for _ in 0..20 {
        doomed.next().await.unwrap().unwrap();
    }
    let steady = pool.submit(
        "steady",
        futures::stream::iter((0..200u32).map(|i| Bytes::from(i.to_string()))),
    );
    let mut steady = steady.await.unwrap();
    drop(doomed);

    let mut seen = BTreeSet::new();
    while let Some(result) = steady.next().await {
        let result = result.unwrap();
        assert!(result.output.is_ok());
        assert!(seen.insert(result.seq));
    }
    assert_eq!(seen.len(), 200, "the other job is untouched");
    let status = wait_until("doomed job cancelled", Duration::from_secs(5), || async {
        let status = test.cluster.job_status(&doomed_id).await.unwrap();
        (status.state == JobState::Cancelled).then_some(status)
    })
    .await;
    assert!(status.succeeded >= 20);
    let actors = wait_until("actors idle", Duration::from_secs(5), || async {
        let actors = test.cluster.list_actors().await.unwrap();
        actors.iter().all(|a| a.in_flight == 0).then_some(actors)
    })
    .await;
    assert!(actors.iter().all(|a| a.state == ActorState::Ready));
}

/// An input that crashes the model (the echo kind panics on it): the crashed actor
/// restarts with a fresh model, the input runs once more alone and then fails for good as
/// an input that crashes the model; every other task succeeds and the pool keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_input_fails_alone_and_the_job_completes() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("fragile")
                .replicas(2)
                .max_restarts(1)
                .config_json(&serde_json::json!({"panic_prefix": "PANIC"})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let inputs: Vec<String> = (0..40)
        .map(|i| {
            if i == 7 {
                "PANIC-7".to_owned()
            } else {
                format!("ok-{i}")
            }
        })
        .collect();
    let outputs = pool.map(inputs).await.unwrap();
    assert_eq!(outputs.len(), 40);
    let error = outputs[7].output.as_ref().unwrap_err();
    assert!(
        error.starts_with("this input crashes the model")
            && error.contains("actor panicked: payload starts with `PANIC`"),
        "{error}"
    );
    for (i, output) in outputs.iter().enumerate().filter(|(i, _)| *i != 7) {
        assert_eq!(output.output.as_deref(), Ok(format!("ok-{i}").as_bytes()));
    }
    // Two crashes, with one restart allowed per actor: the second, on the proven poison
    // input, spent none, so both actors come back and the pool keeps working. The job's
    // answer can come before the second actor's death is reported: wait for its reload.
    let actors = wait_until("both actors reloaded", Duration::from_secs(10), || async {
        let actors = test.cluster.list_actors().await.unwrap();
        let ready: Vec<_> = actors
            .into_iter()
            .filter(|a| a.pool == "fragile" && a.state == ActorState::Ready)
            .collect();
        let loads: u64 = ready.iter().map(|a| a.model_loads).sum();
        (ready.len() == 2 && loads >= 4).then_some(ready)
    })
    .await;
    let loads: u64 = actors.iter().map(|a| a.model_loads).sum();
    assert_eq!(loads, 4, "two fresh loads, one per crash: {actors:?}");
    let again = pool.map(["ok-after"]).await.unwrap();
    assert_eq!(again[0].output.as_deref(), Ok(&b"ok-after"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_the_kind_lacks_fails_at_once_naming_it() {
    let test = cluster().await;
    let pool = test.cluster.create_pool(echo("plain")).await.unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let options = SubmitOptions {
        method: "train".into(),
        ..SubmitOptions::default()
    };
    let outputs = pool.map_with(["x"], options).await.unwrap();
    assert_eq!(
        outputs[0].output,
        Err("bad task payload: actor kind `echo` has no method `train` (it has only its default method)".to_owned())
    );
    assert_eq!(
        outputs[0].attempts, 1,
        "not retried: another actor cannot help"
    );
}

/// A load that hangs is timed out (the pool's load timeout) and the actor is started again:
/// nothing stays Starting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_that_hangs_is_timed_out_and_started_again() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("hangs")
                .max_restarts(5)
                .load_timeout(Duration::from_millis(800))
                .config_json(&serde_json::json!({"load_delay_ms": 600_000})),
        )
        .await
        .unwrap();
    let actor = wait_until(
        "the hung load timed out",
        Duration::from_secs(30),
        || async {
            let actors = test.cluster.list_actors().await.unwrap();
            actors
                .into_iter()
                .find(|a| a.pool == "hangs" && a.restarts >= 1)
        },
    )
    .await;
    let error = actor.error.unwrap_or_default();
    assert!(error.contains("did not load within 800ms"), "{error}");
    assert!(
        matches!(actor.state, ActorState::Pending | ActorState::Starting),
        "{:?}",
        actor.state
    );
    pool.delete().await.unwrap();
}
