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
         agents offer: echo, embed, text-stats. A kind of your own runs on agents built with it \
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_that_panics_restarts_with_a_fresh_model_and_loses_no_other_task() {
    let test = cluster().await;
    let pool = test
        .cluster
        .create_pool(
            echo("fragile")
                .max_task_attempts(1)
                .max_restarts(3)
                .config_json(&serde_json::json!({"panic_prefix": "PANIC"})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let outputs = pool.map(["ok-0", "PANIC-1", "ok-2", "ok-3"]).await.unwrap();
    assert_eq!(outputs.len(), 4);
    let error = outputs[1].output.as_ref().unwrap_err();
    assert!(
        error.contains("actor panicked: payload starts with `PANIC`"),
        "{error}"
    );
    for i in [0, 2, 3] {
        assert_eq!(
            outputs[i].output.as_deref(),
            Ok(format!("ok-{i}").as_bytes())
        );
    }
    let actor = wait_until("the actor restarted", Duration::from_secs(10), || async {
        let actors = test.cluster.list_actors().await.unwrap();
        actors
            .into_iter()
            .find(|a| a.pool == "fragile" && a.state == ActorState::Ready && a.model_loads == 2)
    })
    .await;
    assert_eq!(actor.restarts, 1, "one restart, with a fresh load");
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
