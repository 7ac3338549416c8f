//! The real binaries: a scheduler and three agents as processes. kill -9 an agent while tasks
//! run, and kill -9 the scheduler itself: no task is lost or answered twice.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{ActorState, Bytes, Cluster, JobState, PoolSpec};
use resident_tests::{
    Proc, free_port, init_logging, resident_bin, spawn_agent, spawn_scheduler, wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_an_agent_mid_job_loses_nothing_and_its_actors_move() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler(0, state.path());
    let mut agents = [
        spawn_agent(&url, "node-1", "A6000:48GiB x8", "pool=onprem-a6000"),
        spawn_agent(&url, "node-2", "T4:16GiB x4", "pool=eks-t4"),
        spawn_agent(&url, "node-3", "H100:80GiB x1", "pool=eks-h100"),
    ];
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(3, Duration::from_secs(10))
        .await
        .unwrap();
    let pool = cluster
        .create_pool(
            PoolSpec::new("work", "echo")
                .replicas(6)
                .gpus(0.5)
                .vram_gib(4.0)
                .spread()
                .config_json(&serde_json::json!({"delay_ms": 10})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let before = cluster.list_actors().await.unwrap();
    let on_node2: Vec<String> = before
        .iter()
        .filter(|a| a.is_on("node-2"))
        .map(|a| a.actor_id.to_string())
        .collect();
    assert!(
        !on_node2.is_empty(),
        "spread placed actors on node-2: {before:?}"
    );

    let total = 600u32;
    let inputs = futures::stream::iter((0..total).map(|i| Bytes::from(format!("doc-{i}"))));
    let mut job = pool.submit("chaos", inputs).await.unwrap();
    let mut seen = BTreeSet::new();
    let mut killed = false;
    while let Some(result) = job.next().await {
        let result = result.unwrap();
        assert_eq!(
            result.output.as_deref(),
            Ok(format!("doc-{}", result.seq).as_bytes())
        );
        assert!(seen.insert(result.seq), "seq {} answered twice", result.seq);
        if seen.len() == 100 && !killed {
            let node2 = agents.iter().position(|a| a.name == "node-2").unwrap();
            agents[node2].kill9();
            killed = true;
        }
    }
    assert!(killed);
    assert_eq!(
        seen,
        (0..u64::from(total)).collect(),
        "every task answered exactly once"
    );

    let status = cluster.job_status(&job.job_id).await.unwrap();
    assert_eq!((status.succeeded, status.failed), (u64::from(total), 0));
    let actors = wait_until(
        "actors re-placed off node-2",
        Duration::from_secs(10),
        || async {
            let actors = cluster.list_actors().await.unwrap();
            let ready = actors
                .iter()
                .filter(|a| a.state == ActorState::Ready)
                .count();
            (ready == 6 && actors.iter().all(|a| !a.is_on("node-2"))).then_some(actors)
        },
    )
    .await;
    for moved in &on_node2 {
        let actor = actors.iter().find(|a| &a.actor_id == moved).unwrap();
        assert_eq!(actor.model_loads, 2, "{moved} loaded again on its new node");
    }

    let output = Command::new(resident_bin())
        .args(["status", "--cluster", &url, "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let node2 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "node-2")
        .unwrap();
    assert_eq!(node2["state"], "dead");
    let node1 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "node-1")
        .unwrap();
    assert_eq!(node1["labels"]["pool"], "onprem-a6000");
    assert_eq!(node1["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(node1["gpus"][0]["total_vram_bytes"], 48u64 << 30);
    assert!(node1["gpus"][0]["free_vram_bytes"].is_u64());
    let actor = &status["actors"][0];
    for field in [
        "actor_id",
        "pool",
        "node_id",
        "gpu_index",
        "state",
        "model_loads",
    ] {
        assert!(
            !actor[field].is_null(),
            "status --json actor lacks {field}: {actor}"
        );
    }

    // The same node id comes back as a new generation; nothing it hosted is resurrected and
    // no actor moves back to it. Its fourth GPU is now held by another process (`!`): three
    // are offered, and the fourth is listed as unavailable, with why.
    let old_generation = node2["generation"].as_str().unwrap().to_owned();
    agents[1] = spawn_agent(&url, "node-2", "T4:16GiB x3, !T4:16GiB", "pool=eks-t4");
    let node = wait_until("node-2 back", Duration::from_secs(10), || async {
        let nodes = cluster.list_nodes().await.unwrap();
        nodes.into_iter().find(|n| n.node_id == "node-2" && n.alive)
    })
    .await;
    assert_ne!(node.generation, old_generation);
    assert_eq!(node.gpus.len(), 3);
    let unavailable: Vec<u32> = node.unavailable_gpus.iter().map(|g| g.index).collect();
    assert_eq!(unavailable, [3]);
    let after = cluster.list_actors().await.unwrap();
    assert!(
        after.iter().all(|a| !a.is_on("node-2")),
        "no actor moved back"
    );
    assert_eq!(after.len(), 6);

    let table = Command::new(resident_bin())
        .args(["status", "--cluster", &url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("node-2") && table.contains("alive") && table.contains("ready"),
        "{table}"
    );
    assert!(
        table.contains("node-2: GPU 3 is unavailable, so no actor is placed there"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_scheduler_restarts_with_its_pools_and_jobs() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let (mut scheduler, url) = spawn_scheduler(port, state.path());
    let _agent = spawn_agent(&url, "node-1", "A10G:24GiB x2", "");
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let pool = cluster
        .create_pool(PoolSpec::new("kept", "text-stats").replicas(2).gpus(1.0))
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    let outputs = pool.map(vec![Bytes::from("one two three")]).await.unwrap();
    assert_eq!(
        outputs[0].output.as_deref(),
        Ok(&br#"{"chars":13,"words":3,"lines":1}"#[..])
    );
    let mut job = pool
        .submit("first", futures::stream::iter([Bytes::from("a")]))
        .await
        .unwrap();
    while job.next().await.is_some() {}
    let first_job = job.job_id.clone();
    // No wait for the store: the stream ended only once the job's end was on disk.

    scheduler.kill9();
    let (_scheduler, url) = spawn_scheduler(port, state.path());
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let pool = cluster.pool("kept");
    let status = pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        status.ready_actors, 2,
        "the saved pool came back and was placed again"
    );
    let job = cluster.job_status(&first_job).await.unwrap();
    assert_eq!((job.state, job.succeeded), (JobState::Succeeded, 1));
    let outputs = pool.map(vec![Bytes::from("after restart")]).await.unwrap();
    assert!(outputs[0].output.is_ok());
}

/// A scheduler process, agents `first` and `second` (one simulated GPU each), a client, and
/// a ready one-replica `echo` pool (`config`) that takes a whole GPU; `home` is the node
/// that holds its actor.
struct TwoAgentEchoPool {
    _state: tempfile::TempDir,
    _scheduler: Proc,
    first: Proc,
    second: Proc,
    cluster: Cluster,
    pool: resident_sdk::Pool,
    home: String,
}

impl TwoAgentEchoPool {
    async fn start(name: &str, config: serde_json::Value) -> Self {
        init_logging();
        let state = tempfile::tempdir().unwrap();
        let (scheduler, url) = spawn_scheduler(0, state.path());
        let first = spawn_agent(&url, "first", "L4:24GiB", "");
        let second = spawn_agent(&url, "second", "L4:24GiB", "");
        let cluster = Cluster::connect(&url).await.unwrap();
        cluster
            .wait_for_nodes(2, Duration::from_secs(10))
            .await
            .unwrap();
        let pool = cluster
            .create_pool(
                PoolSpec::new(name, "echo")
                    .replicas(1)
                    .gpus(1.0)
                    .config_json(&config),
            )
            .await
            .unwrap();
        pool.wait_ready(Duration::from_secs(10)).await.unwrap();
        let home = cluster.list_actors().await.unwrap()[0]
            .node_id
            .clone()
            .expect("placed")
            .to_string();
        Self {
            _state: state,
            _scheduler: scheduler,
            first,
            second,
            cluster,
            pool,
            home,
        }
    }

    /// The agent process of the node that holds the actor.
    fn home_agent(&self) -> &Proc {
        if self.home == "first" {
            &self.first
        } else {
            &self.second
        }
    }

    /// The node that does not.
    fn other_node(&self) -> &'static str {
        if self.home == "first" {
            "second"
        } else {
            "first"
        }
    }
}

/// An agent that stops answering without closing its connection (a frozen host, a NAT that
/// drops packets) is declared dead by missed heartbeats; when it wakes up it rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_declared_dead_by_missed_heartbeats_and_rejoins() {
    let setup = TwoAgentEchoPool::start("p", serde_json::json!({})).await;
    let (cluster, pool) = (&setup.cluster, &setup.pool);
    let first_home = setup.home.as_str();
    let victim = setup.home_agent();
    victim.signal("STOP");
    let other = setup.other_node();
    let actors = wait_until(
        "actor moved off the silent node",
        Duration::from_secs(15),
        || async {
            let actors = cluster.list_actors().await.unwrap();
            (actors[0].is_on(other) && actors[0].state == ActorState::Ready).then_some(actors)
        },
    )
    .await;
    assert_eq!(actors[0].model_loads, 2);
    let nodes = cluster.list_nodes().await.unwrap();
    assert!(
        !nodes
            .iter()
            .find(|n| n.node_id == first_home)
            .unwrap()
            .alive
    );
    victim.signal("CONT");
    wait_until(
        "the silent node rejoins",
        Duration::from_secs(15),
        || async {
            let nodes = cluster.list_nodes().await.unwrap();
            nodes
                .iter()
                .find(|n| n.node_id == first_home && n.alive)
                .map(|_| ())
        },
    )
    .await;
    let outputs = pool.map(vec![Bytes::from("still works")]).await.unwrap();
    assert!(outputs[0].output.is_ok());
}

/// A scheduler process and one agent process (`only`), a client, and a ready one-replica
/// `echo` pool with `config`. The temporary state directory lives as long as the processes.
async fn one_agent_echo_pool(
    name: &str,
    config: serde_json::Value,
) -> (tempfile::TempDir, Proc, Proc, Cluster, resident_sdk::Pool) {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (scheduler, url) = spawn_scheduler(0, state.path());
    let agent = spawn_agent(&url, "only", "L4:24GiB", "");
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let pool = cluster
        .create_pool(
            PoolSpec::new(name, "echo")
                .replicas(1)
                .cpus(1.0)
                .config_json(&config),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    (state, scheduler, agent, cluster, pool)
}

/// A result too large for one message fails its task alone, with a message that says what to
/// do; the agent's session, its actor (one model load) and the tasks around it carry on.
/// Before, the encode failure on the agent reset its whole session: the node was declared
/// dead, every actor on it reloaded, and the task moved on to do the same elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_result_fails_only_its_task() {
    // 1 MiB x 260 = 260 MiB of result, over the 255 MiB a result may take.
    let (_state, _scheduler, _agent, cluster, pool) =
        one_agent_echo_pool("big", serde_json::json!({"repeat": 260})).await;
    let payloads = vec![
        Bytes::from("before"),
        Bytes::from(vec![b'x'; 1 << 20]),
        Bytes::from("after"),
    ];
    let outputs = pool.map(payloads).await.unwrap();
    assert_eq!(outputs.len(), 3);
    assert_eq!(outputs[0].output.as_ref().unwrap().len(), 6 * 260);
    assert_eq!(outputs[2].output.as_ref().unwrap().len(), 5 * 260);
    let error = outputs[1].output.as_ref().unwrap_err();
    assert!(
        error.contains("272629760 bytes") && error.contains("--chunk-size"),
        "{error}"
    );
    assert_eq!(outputs[1].attempts, 1, "a permanent failure is not retried");
    let actors = cluster.list_actors().await.unwrap();
    assert_eq!(actors.len(), 1);
    assert_eq!(actors[0].model_loads, 1, "the actor never reloaded");
    assert_eq!(actors[0].state, ActorState::Ready);
    let nodes = cluster.list_nodes().await.unwrap();
    assert!(nodes[0].alive, "the node's session never dropped");
}

/// A job stream whose scheduler stops answering without closing the connection (a frozen
/// host: SIGSTOP keeps the socket open, and the kernel still acknowledges every packet)
/// ends in an error after the client's keepalive pings go unanswered; before, it waited
/// for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_scheduler_ends_the_job_stream_instead_of_hanging_it() {
    let (_state, scheduler, _agent, cluster, _pool) =
        one_agent_echo_pool("slow", serde_json::json!({"delay_ms": 600_000})).await;
    // The stream breaks within the keepalive deadline; resuming then gives up after this.
    let reconnect = Duration::from_secs(2);
    let pool = cluster.with_reconnect_timeout(reconnect).pool("slow");
    let mut job = pool
        .submit("stuck", futures::stream::iter([Bytes::from("x")]))
        .await
        .unwrap();
    scheduler.signal("STOP");
    let stopped = std::time::Instant::now();
    let deadline = resident_sdk::KEEPALIVE_INTERVAL + resident_sdk::KEEPALIVE_TIMEOUT;
    let ended =
        tokio::time::timeout(deadline + reconnect + Duration::from_secs(15), job.next()).await;
    scheduler.signal("CONT");
    let ended = ended.expect("the stream ends within the keepalive deadline");
    assert!(
        matches!(
            ended,
            Some(Err(resident_sdk::SdkError::SchedulerGone { .. }))
        ),
        "no result can come from a frozen scheduler: {ended:?}"
    );
    eprintln!("stream ended after {:?}", stopped.elapsed());
}

/// An agent frozen (SIGSTOP) with a task in flight is declared dead; the task runs again on
/// the other node and its result reaches the client. When the frozen agent wakes and sends
/// its own, late result for the same task, that answer is dropped: the client sees one
/// result, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_from_a_frozen_agent_is_dropped() {
    let setup = TwoAgentEchoPool::start("slow", serde_json::json!({"delay_ms": 1500})).await;
    let (cluster, pool) = (&setup.cluster, &setup.pool);
    let (frozen, other) = (setup.home_agent(), setup.other_node());
    // The input stays open, so a second answer for the task could still be delivered.
    let inputs = futures::stream::iter([Bytes::from("only")]).chain(futures::stream::pending());
    let mut job = pool.submit("late", inputs).await.unwrap();
    let job_id = job.job_id.clone();
    wait_until("the task runs", Duration::from_secs(10), || async {
        let status = cluster.job_status(&job_id).await.unwrap();
        (status.running == 1).then_some(())
    })
    .await;
    frozen.signal("STOP");
    let result = tokio::time::timeout(Duration::from_secs(30), job.next())
        .await
        .expect("the task is answered from the other node")
        .expect("a result")
        .expect("not an error");
    assert_eq!(result.output.as_deref().unwrap(), b"only");
    assert!(result.node_id.as_str() == other, "{result:?}");
    // Wake the frozen agent: its echo finishes and answers the old dispatch.
    frozen.signal("CONT");
    let again = tokio::time::timeout(Duration::from_secs(5), job.next()).await;
    assert!(
        again.is_err(),
        "a second answer reached the client: {again:?}"
    );
    let status = cluster.job_status(&job_id).await.unwrap();
    assert_eq!((status.succeeded, status.running, status.queued), (1, 0, 0));
}
