//! Issue 48, item 10: an agent is back within about a second of its link. Before, after a
//! silent cut the agent's registration backoff had grown to its cap, and it stayed away for
//! up to that long after the link returned (20.3 s after a 40 s cut). Now, while the
//! scheduler cannot be reached, the agent asks its health service every 500 ms and
//! registers as soon as it answers. The agent here backs off 10-20 s before its first new
//! registration attempt, so only the probe can bring it back sooner; its actor stays loaded.

use std::time::{Duration, Instant};

use resident_sdk::{Bytes, Cluster, PoolSpec};
use resident_tests::cut_proxy::CutProxy;
use resident_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_rejoins_within_seconds_of_its_link_after_a_silent_cut() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let (_scheduler, url) = spawn_scheduler_with(0, state.path(), &[]);
    let target = url.trim_start_matches("http://").parse().unwrap();
    let proxy = CutProxy::start(target).await;
    let agent = agent_command(
        &proxy.url(),
        "node-1",
        "A10G:24GiB",
        "",
        &[
            "--reconnect-min-ms".into(),
            "20000".into(),
            "--reconnect-max-ms".into(),
            "40000".into(),
            "--scheduler-keepalive".into(),
            "500ms".into(),
        ],
    )
    .env("RESIDENT_LOG", "info")
    .stdout(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let _agent = Proc::new("agent", agent);
    let cluster = Cluster::connect(&url).await.unwrap();
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .unwrap();
    let pool = cluster
        .create_pool(PoolSpec::new("kept", "echo"))
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();

    proxy.go_silent();
    wait_until(
        "the node is declared dead",
        Duration::from_secs(10),
        || async {
            cluster
                .list_nodes()
                .await
                .unwrap()
                .iter()
                .all(|n| !n.alive)
                .then_some(())
        },
    )
    .await;
    // Long enough for the agent to notice (keepalive) and fail a registration.
    tokio::time::sleep(Duration::from_secs(3)).await;

    proxy.restore();
    let link_back = Instant::now();
    wait_until("the node is back", Duration::from_secs(30), || async {
        cluster
            .list_nodes()
            .await
            .unwrap()
            .iter()
            .any(|n| n.alive)
            .then_some(())
    })
    .await;
    let rejoined_after = link_back.elapsed();
    eprintln!("rejoined {rejoined_after:?} after the link came back");
    assert!(
        rejoined_after < Duration::from_secs(5),
        "rejoined {rejoined_after:?} after the link (its backoff was 10-20 s)"
    );
    let status = pool.wait_ready(Duration::from_secs(10)).await.unwrap();
    assert_eq!(status.actors[0].model_loads, 1, "adopted, not reloaded");
    let echoed = pool.map(vec![Bytes::from_static(b"back")]).await.unwrap();
    assert_eq!(echoed[0].output.as_deref(), Ok(&b"back"[..]));
}
