//! A GPU that fails under a job (its CUDA context gone, as after an Xid fault), with real
//! scheduler and agent processes: the agent simulates two GPUs and makes GPU 1 fail during
//! its actors' 20th task (`RESIDENT_FAULT_FAIL_SIMULATED_GPU`, the stand-in for a GPU's
//! sticky error; cuda-emu's smoke run does the same through the CUDA path). Every task is
//! answered once, on GPU 0; GPU 1 is listed as unavailable with why, and nothing is placed
//! there again, also by a scheduler restarted since (the agent's registration lists it).
//! An agent whose every GPU failed drains and exits, and started again (as its service
//! manager would) offers the GPU afresh.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{ActorState, Bytes, Cluster, NodeInfo, PoolSpec};
use resident_tests::{
    Proc, agent_command, free_port, init_logging, resident_bin, spawn_scheduler, wait_until,
};

/// Node `node-1`, two simulated T4s, GPU 1 failing as `fault` says
/// (`RESIDENT_FAULT_FAIL_SIMULATED_GPU`): `20`, during its actors' 20th task; `0`, during
/// its first load; `20:48`, the driver reports Xid 48 during the 20th task.
fn spawn_agent_whose_gpu_1_fails(url: &str, fault: &str) -> Proc {
    let fault = format!("1:{fault}");
    spawn_agent(url, "node-1", "T4:16GiB x2", Some(&fault), Stdio::inherit())
}

/// Agent `node` with simulated `gpus`, failing as `fault` says
/// (`RESIDENT_FAULT_FAIL_SIMULATED_GPU`), its log (warnings) to `log`.
fn spawn_agent(url: &str, node: &str, gpus: &str, fault: Option<&str>, log: Stdio) -> Proc {
    let mut command = agent_command(url, node, gpus, "", &[]);
    if let Some(fault) = fault {
        command.env("RESIDENT_FAULT_FAIL_SIMULATED_GPU", fault);
    }
    let child = command
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn agent");
    Proc::new(node, child)
}

async fn node_1(cluster: &Cluster) -> Option<NodeInfo> {
    let nodes = cluster.list_nodes().await.ok()?;
    nodes.into_iter().find(|n| n.node_id == "node-1")
}

/// GPU 1 alone is out of service, with the agent's reason (its context failed).
fn assert_gpu_1_out_of_service(node: &NodeInfo) {
    assert_gpu_1_out_of_service_for(node, "simulated GPU 1 failed");
}

/// GPU 1 alone is out of service, with the agent's reason, which says `why`.
fn assert_gpu_1_out_of_service_for(node: &NodeInfo, why: &str) {
    let offered: Vec<u32> = node.gpus.iter().map(|g| g.index).collect();
    assert_eq!(offered, [0], "{node:?}");
    assert_eq!(node.unavailable_gpus.len(), 1, "{node:?}");
    let failed = &node.unavailable_gpus[0];
    assert_eq!(failed.index, 1);
    assert!(
        failed.reason.contains(why) && failed.reason.contains("restart the agent"),
        "{}",
        failed.reason
    );
}

/// A pool of two whole-GPU echo actors runs 300 tasks: each answered once, none failed.
async fn run_300_tasks_on_two_whole_gpu_actors(cluster: &Cluster) {
    cluster
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let pool = cluster
        .create_pool(
            PoolSpec::new("work", "echo")
                .replicas(2)
                .gpus(1.0)
                .vram_gib(4.0)
                .config_json(&serde_json::json!({"delay_ms": 5})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(10)).await.unwrap();

    let total = 300u32;
    let inputs = futures::stream::iter((0..total).map(|i| Bytes::from(format!("doc-{i}"))));
    let mut job = pool.submit("gpu-fault", inputs).await.unwrap();
    let mut seen = BTreeSet::new();
    while let Some(result) = job.next().await {
        let result = result.unwrap();
        assert_eq!(
            result.output.as_deref(),
            Ok(format!("doc-{}", result.seq).as_bytes()),
            "seq {}",
            result.seq
        );
        assert!(seen.insert(result.seq), "seq {} answered twice", result.seq);
    }
    assert_eq!(
        seen,
        (0..u64::from(total)).collect(),
        "every task answered once"
    );
    let status = cluster.job_status(&job.job_id).await.unwrap();
    assert_eq!((status.succeeded, status.failed), (u64::from(total), 0));
}

/// The driver reports an uncorrectable ECC error (Xid 48) on GPU 1 mid-job, while its work
/// still succeeds: the GPU is taken out of service at once, the actor there is stopped
/// (nothing more runs on a GPU whose results could be wrong), and every task is answered
/// once, on GPU 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_the_driver_reports_a_fault_of_is_left_though_its_work_succeeds() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler(0, state.path());
    let _agent = spawn_agent_whose_gpu_1_fails(&url, "20:48");
    let cluster = Cluster::connect(&url).await.unwrap();
    run_300_tasks_on_two_whole_gpu_actors(&cluster).await;
    let node = node_1(&cluster).await.expect("node-1");
    assert_gpu_1_out_of_service_for(&node, "Xid 48 (a double-bit ECC error)");
    let actors = cluster.list_actors().await.unwrap();
    let ready: Vec<_> = actors
        .iter()
        .filter(|a| a.state == ActorState::Ready)
        .collect();
    assert_eq!(ready.len(), 1, "{actors:?}");
    assert_eq!(ready[0].gpu_indices, [0], "{actors:?}");
    assert_eq!(
        ready[0].restarts, 0,
        "the actor on the healthy GPU is untouched"
    );
}

/// An agent whose only GPU fails mid-job (`--restart-after-gpu-failure all`, the default)
/// drains and exits with why; the job finishes on the other node, every task answered
/// once; started again, as its service manager would, it offers the GPU afresh and the
/// pool's second actor is placed there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_every_gpu_failed_exits_and_comes_back_with_its_gpu() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler(0, state.path());
    let spawn = |node: &str, fault: Option<&str>, log: Stdio| {
        spawn_agent(&url, node, "T4:16GiB", fault, log)
    };
    let log = state.path().join("node-1.log");
    let mut failing = spawn(
        "node-1",
        Some("0:20"),
        std::fs::File::create(&log).unwrap().into(),
    );
    let _healthy = spawn("node-2", None, Stdio::inherit());
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(2, Duration::from_secs(10))
        .await
        .unwrap();
    run_300_tasks_on_two_whole_gpu_actors(&cluster).await;

    let exit = failing
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("node-1 exits by itself");
    assert!(!exit.success(), "{exit:?}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("this agent restarts: its GPU failed while it ran (GPU 0;")
            && said.contains("simulated GPU 0 failed")
            && said.contains("--restart-after-gpu-failure all"),
        "{said}"
    );
    let _again = spawn("node-1", None, Stdio::inherit());
    let on_node_1 = wait_until(
        "an actor on node-1 again",
        Duration::from_secs(30),
        || async {
            let actors = cluster.list_actors().await.ok()?;
            actors.into_iter().find(|a| {
                a.node_id.as_ref().is_some_and(|n| n.as_str() == "node-1")
                    && a.state == ActorState::Ready
            })
        },
    )
    .await;
    assert_eq!(on_node_1.gpu_indices, [0]);
    let node = node_1(&cluster).await.expect("node-1");
    assert!(node.alive && node.unavailable_gpus.is_empty(), "{node:?}");
    assert_eq!(node.gpus.len(), 1, "{node:?}");
}

/// GPU 1 fails while its actor loads: the pool is ready with the actor on GPU 0 (the other
/// has nowhere to go), rather than waiting out its load timeout, and the job runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_fails_while_its_actor_loads_leaves_the_pool_ready_on_the_other() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler(0, state.path());
    let _agent = spawn_agent_whose_gpu_1_fails(&url, "0");
    let cluster = Cluster::connect(&url).await.unwrap();
    run_300_tasks_on_two_whole_gpu_actors(&cluster).await;
    assert_gpu_1_out_of_service(&node_1(&cluster).await.expect("node-1"));
    let actors = cluster.list_actors().await.unwrap();
    let waiting: Vec<_> = actors
        .iter()
        .filter(|a| a.state != ActorState::Ready)
        .collect();
    assert_eq!(waiting.len(), 1, "{actors:?}");
    assert_eq!(
        waiting[0].restarts, 1,
        "its load on the failed GPU spent a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_fails_mid_job_loses_no_task_and_takes_no_actor_again() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let (scheduler, url) = spawn_scheduler(port, state.path());
    let _agent = spawn_agent_whose_gpu_1_fails(&url, "20");
    let cluster = Cluster::connect(&url).await.unwrap();
    run_300_tasks_on_two_whole_gpu_actors(&cluster).await;

    assert_gpu_1_out_of_service(&node_1(&cluster).await.expect("node-1"));
    let actors = cluster.list_actors().await.unwrap();
    let ready: Vec<_> = actors
        .iter()
        .filter(|a| a.state == ActorState::Ready)
        .collect();
    assert_eq!(
        ready.len(),
        1,
        "one whole-GPU actor on the GPU left: {actors:?}"
    );
    assert!(
        actors.iter().all(|a| !a.gpu_indices.contains(&1)),
        "{actors:?}"
    );
    let table = Command::new(resident_bin())
        .args(["status", "--cluster", &url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(
            "node-1: GPU 1 is unavailable, so no actor is placed there: simulated GPU 1 failed"
        ),
        "{table}"
    );

    // A restarted scheduler hears of GPU 1 from the agent's registration.
    drop(scheduler);
    let (_scheduler, again) = spawn_scheduler(port, state.path());
    assert_eq!(again, url);
    let cluster = Cluster::connect(&url).await.unwrap();
    let node = wait_until("node-1 back", Duration::from_secs(20), || async {
        node_1(&cluster).await.filter(|node| node.alive)
    })
    .await;
    assert_gpu_1_out_of_service(&node);
}

/// `resident embed` on two simulated GPUs, GPU 1 failing during its actor's first task: every
/// document is embedded once on GPU 0, and the report bills the lost actor as the GPU time
/// it held until its GPU failed, never as a CPU's (what it did when the bill came from the
/// actors standing at the end: the lost one, placed nowhere, was counted as a CPU actor
/// for the whole run).
#[test]
fn a_job_s_report_bills_the_actor_a_failed_gpu_lost_as_gpu_time_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let input = resident_tests::sample(dir.path(), 80);
    let out = dir.path().join("out");
    let extra = ["--simulate-gpus", "T4:16GiB x2", "--chunk-size", "4"];
    let output = resident_tests::embed_command(&input, &out, &extra)
        .env("RESIDENT_FAULT_FAIL_SIMULATED_GPU", "1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "resident embed failed:\n{stderr}");
    assert_eq!(
        resident_tests::ids_in_file(&out.join("ids.jsonl")),
        resident_tests::ids_in_file(&input)
    );
    let report = resident_tests::read_json(&out.join("report.json"));
    let per_gpu = report["per_gpu"].as_array().unwrap();
    assert!(
        per_gpu.iter().all(|g| g["gpu_index"] == 0),
        "every document on GPU 0: {report}"
    );
    assert_eq!(report["actors"], 2, "{report}");
    assert_eq!(report["cpu_hours"].as_f64(), Some(0.0), "{report}");
    let gpu_seconds = report["gpu_hours"].as_f64().unwrap() * 3600.0;
    let wall = report["wall_seconds"].as_f64().unwrap();
    assert!(
        gpu_seconds > 0.0 && gpu_seconds < 2.0 * wall,
        "{gpu_seconds} GPU-seconds in {wall} s: {report}"
    );
}
