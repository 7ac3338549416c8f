//! A GPU that fails while the agent runs (`GpuFailed`, HD-6 of `core/host_deaths.rs`): it
//! leaves placement, listed as unavailable with the agent's reason; the actors placed on it
//! are lost as a sudden host death loses a node's (their running tasks count a crash, each
//! spends a restart), the node's other GPUs and their actors go on, and the job ends with
//! every task answered once.

use resident_proto::{ActorId, TaskId};

use super::*;
use crate::state::ActorState;

fn whole_gpu_pool(name: &str, replicas: u32) -> pb::PoolSpec {
    let mut spec = cpu_pool(name, replicas, 1);
    spec.resources = Some(pb::ResourceRequest {
        gpus: 1.0,
        vram_bytes: 8 << 30,
        ..Default::default()
    });
    spec
}

fn gpu_failed(index: u32, reason: &str) -> pb::agent_message::Body {
    pb::agent_message::Body::GpuFailed(pb::GpuFailed {
        gpu: Some(pb::UnavailableGpu {
            index,
            reason: reason.into(),
        }),
    })
}

/// The GPUs each actor start sent to `node` names.
fn started_on(h: &mut Harness, node: &str) -> Vec<Vec<u32>> {
    sent(h.agent(node))
        .into_iter()
        .filter_map(|message| match message {
            pb::scheduler_message::Body::StartActor(start) => Some(start.gpu_indices),
            _ => None,
        })
        .collect()
}

const XID: &str = "its CUDA context failed and stays failed (CUDA_ERROR_ILLEGAL_ADDRESS)";

#[tokio::test(start_paused = true)]
async fn a_failed_gpu_leaves_placement_and_its_actors_tasks_finish_on_the_others() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    h.create_pool(whole_gpu_pool("p", 2));
    let mut placed: Vec<(pb::StartActor, u32)> = sent(h.agent("g1"))
        .into_iter()
        .filter_map(|message| match message {
            pb::scheduler_message::Body::StartActor(start) => {
                let gpu = start.gpu_indices[0];
                Some((start, gpu))
            }
            _ => None,
        })
        .collect();
    placed.sort_by_key(|(_, gpu)| *gpu);
    assert_eq!(
        placed.iter().map(|(_, gpu)| *gpu).collect::<Vec<_>>(),
        [0, 1]
    );
    for (start, _) in &placed {
        let report = pb::ActorReport {
            actor_id: start.actor_id.clone(),
            incarnation: start.incarnation,
            state: pb::ActorState::Ready as i32,
            model_loads: 1,
            ..Default::default()
        };
        h.send("g1", pb::agent_message::Body::ActorReport(report));
    }
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..4);
    let running = run_tasks(&sent(h.agent("g1")));
    assert_eq!(running.len(), 2, "one task on each actor");
    let on_gpu1 = &placed[1].0.actor_id;
    let (broken, healthy): (Vec<_>, Vec<_>) =
        running.into_iter().partition(|t| &t.actor_id == on_gpu1);

    h.send("g1", gpu_failed(1, XID));
    let node = h.core.node_infos().pop().expect("the node");
    assert_eq!(node.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0]);
    assert_eq!(node.unavailable_gpus.len(), 1);
    assert_eq!(node.unavailable_gpus[0].index, 1);
    assert!(node.unavailable_gpus[0].reason.contains("ILLEGAL_ADDRESS"));
    let lost = &h.core.actors[&ActorId::new(on_gpu1.clone())];
    assert_ne!(
        lost.state,
        ActorState::Ready,
        "the actor on the failed GPU is lost"
    );
    assert_eq!(lost.restarts.used, 1, "and spends a restart (HD-2)");
    assert!(
        lost.error.contains("GPU 1 of node g1 failed"),
        "{}",
        lost.error
    );
    let kept = &h.core.actors[&ActorId::new(placed[0].0.actor_id.clone())];
    assert_eq!(
        kept.state,
        ActorState::Ready,
        "the other GPU's actor goes on"
    );
    assert_eq!(kept.restarts.used, 0);
    let task = &h.core.tasks[&TaskId(broken[0].task_id)];
    assert_eq!(task.crashes, 1, "its running task counts a crash (HD-1)");

    // Nothing goes back to GPU 1, and a repeated or unknown failure changes nothing.
    h.tick();
    h.send("g1", gpu_failed(1, XID));
    h.send("g1", gpu_failed(7, XID));
    assert!(
        started_on(&mut h, "g1")
            .iter()
            .all(|gpus| !gpus.contains(&1))
    );
    assert_eq!(h.core.node_infos()[0].unavailable_gpus.len(), 1);

    // The failed actor's late answer is dropped; everything else is answered once, on GPU 0.
    h.outcome("g1", &broken[0], Err("CUDA_ERROR_ILLEGAL_ADDRESS"));
    h.outcome("g1", &healthy[0], Ok("fine"));
    for _ in 0..3 {
        h.tick();
        let next = run_tasks(&sent(h.agent("g1")));
        assert_eq!(next.len(), 1, "one task at a time on the one actor left");
        assert_eq!(next[0].actor_id, placed[0].0.actor_id);
        h.outcome("g1", &next[0], Ok("fine"));
    }
    let answered = results(&mut rx);
    let mut seqs: Vec<u64> = answered.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [0, 1, 2, 3], "every task answered, once");
    assert!(
        answered
            .iter()
            .all(|r| matches!(r.result, Some(pb::task_result::Result::Output(_)))),
        "{answered:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn actors_sharing_a_failed_gpu_are_all_placed_again_on_the_gpu_left() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    let mut spec = gpu_pool("p", 8);
    spec.replicas = 2;
    h.create_pool(spec);
    let first = started_on(&mut h, "g1");
    assert_eq!(first.len(), 2);
    let shared = first[0][0];
    assert!(
        first.iter().all(|gpus| gpus == &[shared]),
        "packed: {first:?}"
    );
    h.load_actors("g1");
    h.send("g1", gpu_failed(shared, XID));
    h.tick();
    let other = 1 - shared;
    assert_eq!(started_on(&mut h, "g1"), [vec![other], vec![other]]);
}

#[tokio::test(start_paused = true)]
async fn a_failure_reason_past_the_limit_is_cut_on_a_character_boundary() {
    use crate::policy::field_limits::MAX_GPU_REASON_BYTES;
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    h.send("g1", gpu_failed(0, &"é".repeat(MAX_GPU_REASON_BYTES)));
    let reason = h.core.node_infos()[0].unavailable_gpus[0].reason.clone();
    assert!(reason.len() <= MAX_GPU_REASON_BYTES);
    assert!(reason.len() >= MAX_GPU_REASON_BYTES - 1);
}

/// The tasks a lost host held go to an idle actor elsewhere at once, not at the next event:
/// with every other actor idle, nothing else would send them.
#[tokio::test(start_paused = true)]
async fn a_lost_hosts_tasks_go_at_once_to_an_idle_actor() {
    for gpu_fails in [true, false] {
        let mut h = Harness::new(CoreConfig::for_test());
        h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
        h.create_pool(whole_gpu_pool("p", 2));
        h.load_actors("g1");
        let (job, mut rx) = h.open_job("p");
        h.submit(&job, 0..2);
        let running = run_tasks(&sent(h.agent("g1")));
        assert_eq!(running.len(), 2);
        let gpu_of = |h: &Harness, task: &pb::RunTask| {
            h.core.actors[&ActorId::new(task.actor_id.clone())]
                .assignment
                .as_ref()
                .unwrap()
                .gpus[0]
        };
        let (on1, on0): (Vec<_>, Vec<_>) = running.into_iter().partition(|t| gpu_of(&h, t) == 1);
        h.outcome("g1", &on0[0], Ok("fine"));
        assert_eq!(results(&mut rx).len(), 1);
        if gpu_fails {
            h.send("g1", gpu_failed(1, XID));
        } else {
            // The same through a lost dispatch: the agent answers that the actor is gone.
            let outcome = pb::TaskOutcome {
                task_id: on1[0].task_id,
                dispatch: on1[0].dispatch,
                actor_id: on1[0].actor_id.clone(),
                result: Some(pb::task_outcome::Result::Error("gone".into())),
                not_run: true,
                ..Default::default()
            };
            h.send("g1", pb::agent_message::Body::TaskOutcome(outcome));
        }
        let again = run_tasks(&sent(h.agent("g1")));
        assert_eq!(again.len(), 1, "gpu fails: {gpu_fails}");
        assert_eq!(again[0].key, on1[0].key);
        assert_eq!(again[0].actor_id, on0[0].actor_id);
    }
}

/// What a pool's actors held, in GPU-seconds, as `PoolStatus.usage` says.
fn gpu_seconds_used(h: &Harness, pool: &str) -> f64 {
    let status = h.core.pool_status(&PoolName::from(pool)).expect("pool");
    status.usage.iter().map(|u| u.gpu_seconds).sum()
}

/// What `report.json` bills: an actor whose GPU failed counts until then, its replacement
/// from its placement on, whatever stands at the end of the job.
#[tokio::test(start_paused = true)]
async fn a_pool_s_usage_counts_a_lost_actor_until_it_was_lost_and_its_replacement_from_then() {
    // Nodes stay alive through the test's silent minutes.
    let mut config = CoreConfig::for_test();
    config.node_dead_after = Duration::from_secs(3600);
    let mut h = Harness::new(config);
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    h.create_pool(whole_gpu_pool("p", 2));
    h.load_actors("g1");
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!((gpu_seconds_used(&h, "p") - 20.0).abs() < 1e-6);

    // GPU 1 fails at 10 s: its actor stops counting; nowhere is free for it.
    h.send("g1", gpu_failed(1, XID));
    tokio::time::advance(Duration::from_secs(20)).await;
    h.tick();
    assert!((gpu_seconds_used(&h, "p") - 40.0).abs() < 1e-6);

    // A node joins at 30 s and the lost actor takes its place there.
    h.add_node("g2", vec![gpu(0, 24)]);
    h.tick();
    assert_eq!(started_on(&mut h, "g2"), [vec![0]]);
    tokio::time::advance(Duration::from_secs(5)).await;
    let status = h.core.pool_status(&PoolName::from("p")).expect("pool");
    assert_eq!(status.usage.len(), 1, "{:?}", status.usage);
    assert_eq!(status.usage[0].gpu_name, "A10G");
    assert_eq!(status.usage[0].node_pool_label, "");
    assert!(
        (status.usage[0].gpu_seconds - 50.0).abs() < 1e-6,
        "{:?}",
        status.usage
    );
    assert_eq!(status.usage[0].cpu_core_seconds, 0.0);
}

/// A restarted scheduler takes back what its pools had held: a kill -9 forgets at most the
/// save period, a clean stop nothing, and the time it was down is not counted. The usage
/// keeps the start it was counted from, so a job reading it before and after the restart
/// can take the difference.
#[tokio::test(start_paused = true)]
async fn a_pool_s_usage_outlives_a_restart_short_of_the_unsaved_seconds() {
    let mut config = CoreConfig::for_test();
    config.node_dead_after = Duration::from_secs(3600);
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(config.clone(), store.clone());
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    h.create_pool(whole_gpu_pool("p", 2));
    h.load_actors("g1");
    let since = h
        .core
        .pool_status(&PoolName::from("p"))
        .unwrap()
        .usage_since_unix_ms;
    assert!(since > 0);
    // Saved at 12 s (the tick's period is due); 3 s more are held but not saved when the
    // process dies.
    tokio::time::advance(Duration::from_secs(12)).await;
    h.tick();
    tokio::time::advance(Duration::from_secs(3)).await;
    h.tick();
    assert!((gpu_seconds_used(&h, "p") - 30.0).abs() < 1e-6);
    h.core.store.flush(1).await.unwrap();

    let restarted = |store: &Arc<MemoryStore>| {
        let mut h = Harness::with_store(config.clone(), store.clone());
        h.core.restore(store.as_ref()).unwrap();
        h
    };
    let mut h = restarted(&store);
    let status = h.core.pool_status(&PoolName::from("p")).unwrap();
    assert_eq!(
        status.usage_since_unix_ms, since,
        "counted from the pool's creation"
    );
    assert_eq!(status.usage.len(), 1, "{:?}", status.usage);
    assert_eq!(status.usage[0].gpu_name, "A10G");
    assert!(
        (status.usage[0].gpu_seconds - 24.0).abs() < 1e-6,
        "{:?}",
        status.usage
    );

    // Down for a minute: not counted. The node comes back and its actors are placed again;
    // they count from then. A clean stop saves everything up to it.
    tokio::time::advance(Duration::from_secs(60)).await;
    h.add_node("g1", vec![gpu(0, 24), gpu(1, 24)]);
    h.tick();
    h.load_actors("g1");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!((gpu_seconds_used(&h, "p") - 28.0).abs() < 1e-6);
    h.core.save_pool_usage(Instant::now());
    h.core.store.flush(1).await.unwrap();
    let h = restarted(&store);
    assert!((gpu_seconds_used(&h, "p") - 28.0).abs() < 1e-6);

    // A deleted pool's usage goes with it: one made anew under its name counts from zero.
    let mut h = h;
    h.delete_pool("p", false).unwrap();
    h.core.store.flush(1).await.unwrap();
    assert!(store.load_pool_usage().unwrap().is_empty());
}
