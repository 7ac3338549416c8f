//! Issue 48, item 9: a hung task cannot hold its GPU forever. Before, a task that never
//! returned kept its actor busy for good, and a Draining actor behind it never stopped, so
//! its GPU stayed taken. Now a pool's `task_timeout_ms` takes the task back (retried, then
//! failed naming the timeout), stops the actor on its agent and frees the GPU.

use std::time::{Duration, Instant};

use resident_sdk::{ActorState, Bytes, PoolSpec};
use resident_tests::*;

const WHOLE_GPU_GIB: f64 = 20.0;

fn hanging_pool(name: &str) -> PoolSpec {
    PoolSpec::new(name, "echo")
        .gpus(1.0)
        .vram_gib(WHOLE_GPU_GIB)
        .config_json(&serde_json::json!({"hang_prefix": "HANG"}))
        .task_timeout(Duration::from_millis(1000))
        .max_task_attempts(2)
        // 0 asks for the scheduler's default; a timeout spends none of them (checked below).
        .max_restarts(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_task_is_retried_then_failed_and_its_gpu_freed() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    // One agent with one simulated 24 GiB GPU: every actor here needs all of it.
    let (_scheduler, mut agent, cluster, _url) = scheduler_with_one_agent(state.path(), &[]).await;

    let pool = cluster.create_pool(hanging_pool("hangs")).await.unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let started = Instant::now();
    let outputs = pool.map(vec![
        Bytes::from_static(b"ok-1"),
        Bytes::from_static(b"HANG"),
        Bytes::from_static(b"ok-2"),
    ]);
    let outputs = tokio::time::timeout(Duration::from_secs(60), outputs)
        .await
        .expect("a hung task ends once past its deadline")
        .unwrap();
    let took = started.elapsed();
    assert_eq!(outputs[0].output.as_deref(), Ok(&b"ok-1"[..]));
    assert_eq!(
        outputs[2].output.as_deref(),
        Ok(&b"ok-2"[..]),
        "a task queued behind the hung one runs again elsewhere, untouched"
    );
    let error = outputs[1].output.clone().unwrap_err();
    assert!(
        error.contains("failed after 2 attempts") && error.contains("task_timeout_ms (1000 ms)"),
        "{error}"
    );
    assert_eq!(outputs[1].attempts, 2);
    assert!(took < Duration::from_secs(30), "took {took:?}");

    // The stopped actor came back on the same (only) GPU: the agent let it go.
    let status = pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let actor = &status.actors[0];
    assert_eq!(actor.state, ActorState::Ready);
    assert_eq!(actor.restarts, 0, "a timeout spends no restart: {actor:?}");
    assert!(actor.model_loads >= 3, "{actor:?}");
    assert!(agent.is_running());

    // A Draining actor whose task hangs: the pool is deleted under a running job; once
    // the task's deadline passes the actor is stopped and its GPU placed again.
    let job = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.map(vec![Bytes::from_static(b"HANG again")]).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.status().await.unwrap().actors[0].in_flight == 0 {
        assert!(Instant::now() < deadline, "the hanging task never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.delete().await.unwrap();
    let _ = job.await;
    let next = cluster
        .create_pool(
            PoolSpec::new("next", "echo")
                .gpus(1.0)
                .vram_gib(WHOLE_GPU_GIB),
        )
        .await
        .unwrap();
    next.wait_ready(Duration::from_secs(15))
        .await
        .expect("the draining actor's GPU is freed once its task's deadline passes");
    let echoed = next.map(vec![Bytes::from_static(b"x")]).await.unwrap();
    assert_eq!(echoed[0].output.as_deref(), Ok(&b"x"[..]));
}
