//! Three agents with simulated GPUs in one process: placement as the policy says, and 2,000
//! tasks through two pools with every result exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{ActorInfo, ActorState, Bytes, PoolSpec};
use resident_tests::{AgentSpec, InProcessCluster, wait_until};

fn agent(node_id: &str, gpus: &str, labels: &str) -> AgentSpec {
    AgentSpec {
        node_id: node_id.into(),
        gpus: Some(gpus.into()),
        labels: labels.into(),
    }
}

async fn mixed_cluster() -> InProcessCluster {
    InProcessCluster::start(vec![
        agent("node-1", "A6000:48GiB x8", "pool=onprem-a6000,zone=lab1"),
        agent("node-2", "T4:16GiB x4", "pool=eks-t4"),
        agent("node-3", "H100:80GiB x1", "pool=eks-h100"),
    ])
    .await
}

fn placements(actors: &[ActorInfo], pool: &str) -> Vec<(String, Vec<u32>)> {
    actors
        .iter()
        .filter(|a| a.pool == pool)
        .map(|a| {
            let node = a.node_id.as_ref().map(ToString::to_string);
            (node.unwrap_or_default(), a.gpu_indices.clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_placed_as_the_policy_says_and_2000_tasks_return_once() {
    let test = mixed_cluster().await;
    let cluster = &test.cluster;
    let echo =
        |name: &str| PoolSpec::new(name, "echo").config_json(&serde_json::json!({"delay_ms": 1}));

    let a6000 = cluster
        .create_pool(
            echo("a6000")
                .replicas(4)
                .gpus(1.0)
                .vram_gib(20.0)
                .selector("pool", "onprem-a6000"),
        )
        .await
        .unwrap();
    let t4 = cluster
        .create_pool(
            echo("t4-quarter")
                .replicas(8)
                .gpus(0.25)
                .vram_gib(3.0)
                .gpu_model("T4"),
        )
        .await
        .unwrap();
    let big = cluster
        .create_pool(echo("big").replicas(1).gpus(1.0).vram_gib(70.0))
        .await
        .unwrap();
    for pool in [&a6000, &t4, &big] {
        pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    }

    let actors = cluster.list_actors().await.unwrap();
    let on_a6000 = placements(&actors, "a6000");
    assert!(
        on_a6000
            .iter()
            .all(|(node, gpus)| node == "node-1" && gpus.len() == 1)
    );
    let distinct: BTreeSet<_> = on_a6000.iter().map(|(_, g)| g[0]).collect();
    assert_eq!(distinct.len(), 4, "whole-GPU actors each get their own GPU");
    let on_t4 = placements(&actors, "t4-quarter");
    assert!(on_t4.iter().all(|(node, _)| node == "node-2"));
    let per_gpu: BTreeMap<u32, usize> = on_t4.iter().fold(BTreeMap::new(), |mut m, (_, g)| {
        *m.entry(g[0]).or_default() += 1;
        m
    });
    assert_eq!(
        per_gpu.values().copied().collect::<Vec<_>>(),
        vec![4, 4],
        "quarter GPUs pack four to a T4"
    );
    assert_eq!(
        placements(&actors, "big"),
        vec![("node-3".to_owned(), vec![0])],
        "only the H100 has 70 GiB"
    );

    let run = |pool: resident_sdk::Pool, prefix: &'static str| async move {
        let inputs =
            futures::stream::iter((0..1000).map(move |i| Bytes::from(format!("{prefix}-{i}"))));
        let mut job = pool.submit("many", inputs).await.unwrap();
        let mut seen = BTreeMap::new();
        while let Some(result) = job.next().await {
            let result = result.unwrap();
            let output = result.output.expect("task succeeds");
            assert_eq!(
                output,
                Bytes::from(format!("{prefix}-{}", result.seq)),
                "output belongs to its task"
            );
            assert!(
                seen.insert(result.seq, result.actor_id).is_none(),
                "seq {} twice",
                result.seq
            );
        }
        seen
    };
    let (first, second) = tokio::join!(run(a6000.clone(), "a"), run(t4.clone(), "t"));
    assert_eq!(first.len() + second.len(), 2000);
    assert_eq!(
        first.keys().copied().collect::<Vec<_>>(),
        (0..1000).collect::<Vec<_>>()
    );
    assert_eq!(
        second.keys().copied().collect::<Vec<_>>(),
        (0..1000).collect::<Vec<_>>()
    );
    let busy: BTreeSet<_> = second.values().collect();
    assert_eq!(busy.len(), 8, "every T4 actor took work");

    let actors = cluster.list_actors().await.unwrap();
    assert!(
        actors.iter().all(|a| a.model_loads == 1),
        "each actor loaded once: {actors:?}"
    );
    let done: u64 = actors
        .iter()
        .filter(|a| a.pool != "big")
        .map(|a| a.tasks_done)
        .sum();
    assert_eq!(done, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_loses_no_tasks_and_its_actors_move() {
    let test = mixed_cluster().await;
    let cluster = &test.cluster;
    let pool = cluster
        .create_pool(
            PoolSpec::new("cpu", "echo")
                .replicas(3)
                .spread()
                .config_json(&serde_json::json!({"delay_ms": 5})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let nodes: BTreeSet<_> = cluster
        .list_actors()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.node_id)
        .collect();
    assert_eq!(nodes.len(), 3, "spread puts one actor on each node");

    let inputs = futures::stream::iter((0..400).map(|i: u32| Bytes::from(i.to_string())));
    let mut job = pool.submit("survive", inputs).await.unwrap();
    let mut seen = BTreeSet::new();
    while let Some(result) = job.next().await {
        let result = result.unwrap();
        assert!(result.output.is_ok(), "{:?}", result.output);
        assert!(seen.insert(result.seq));
        if seen.len() == 50 {
            test.stop_agent("node-2");
        }
    }
    assert_eq!(seen, (0..400).collect());
    let actors = wait_until("actors re-placed", Duration::from_secs(10), || async {
        let actors = cluster.list_actors().await.unwrap();
        let ready = actors
            .iter()
            .filter(|a| a.state == ActorState::Ready)
            .count();
        (ready == 3).then_some(actors)
    })
    .await;
    assert!(actors.iter().all(|a| !a.is_on("node-2")));
    let node2 = cluster
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.node_id == "node-2")
        .unwrap();
    assert!(!node2.alive);
}
