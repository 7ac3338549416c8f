//! A client that submits large payloads and never reads its results holds at most its
//! job's buffer in the scheduler, slows only itself, and limits on what the scheduler
//! takes are refused as RESOURCE_EXHAUSTED naming the flag.

use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{Bytes, Cluster, JobState, PoolSpec, SdkError};
use resident_tests::scale_run::process_rss_bytes;
use resident_tests::*;

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_only_its_jobs_buffer_and_others_go_on() {
    init_logging();
    let job_cap = 32 * MIB;
    let (_state, scheduler, _agent, cluster, url, http) = scheduler_with_job_cap(job_cap).await;
    let greedy_pool = cluster
        .create_pool(PoolSpec::new("greedy", "echo").replicas(2))
        .await
        .unwrap();
    greedy_pool
        .wait_ready(Duration::from_secs(20))
        .await
        .unwrap();
    let rss_before = process_rss_bytes(scheduler.pid()).unwrap();

    // 3,000 payloads of 1 MiB (3 GiB in all), echoed back, never read.
    let payload = Bytes::from(vec![7u8; MIB as usize]);
    let inputs = futures::stream::iter((0..3000).map(move |_| payload.clone()));
    let greedy = greedy_pool.submit("greedy", inputs).await.unwrap();
    let greedy_id = greedy.job_id.clone();
    // Its own connection backs up with the results it does not read (HTTP/2 flow
    // control): the job's state is read over another.
    let observer = Cluster::connect(&url).await.unwrap();
    // Filled: the results its connection could not take wait in the job's buffer (past
    // half its cap; waited for, since a loaded host fills it at its own pace).
    let mut peak = 0;
    wait_until(
        "the greedy job's buffer to fill",
        Duration::from_secs(60),
        || {
            let rss = process_rss_bytes(scheduler.pid()).unwrap();
            peak = peak.max(rss);
            let filled = buffered_bytes(http) > job_cap / 2;
            let job = observer.job_status(&greedy.job_id);
            async move {
                let job = job.await.unwrap();
                (filled && job.succeeded >= 20).then_some(())
            }
        },
    )
    .await;

    // Another client's job runs to the end meanwhile, on another pool.
    let other = Cluster::connect(&url).await.unwrap();
    let other_pool = other
        .create_pool(PoolSpec::new("other", "echo"))
        .await
        .unwrap();
    other_pool
        .wait_ready(Duration::from_secs(20))
        .await
        .unwrap();
    let inputs: Vec<Bytes> = (0..200).map(|i| Bytes::from(format!("doc-{i}"))).collect();
    let outputs = tokio::time::timeout(Duration::from_secs(60), other_pool.map(inputs))
        .await
        .expect("the other client's job is not held up")
        .unwrap();
    assert!(outputs.iter().all(|o| o.output.is_ok()));

    // The greedy job stays stuck at its cap: it was read no further.
    for _ in 0..10 {
        peak = peak.max(process_rss_bytes(scheduler.pid()).unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job = observer.job_status(&greedy.job_id).await.unwrap();
    assert!(
        job.submitted < 200,
        "the scheduler took {} tasks of 1 MiB past a 32 MiB buffer",
        job.submitted
    );
    // `/metrics` shows what is held: the job's buffer, give or take one payload; it stayed
    // full, and grew no further than its cap.
    let held = buffered_bytes(http);
    assert!(
        held > job_cap / 2 && held <= job_cap + MIB,
        "resident_scheduler_buffered_bytes {held} for a job capped at {job_cap}"
    );
    let grown = peak.saturating_sub(rss_before);
    eprintln!(
        "greedy client: {} tasks taken, scheduler RSS grew by {} MiB at its peak",
        job.submitted,
        grown / MIB
    );
    assert!(
        grown < 8 * job_cap,
        "scheduler RSS grew by {} MiB for a job capped at 32 MiB",
        grown / MIB
    );

    // The client drops its job (its process lives on, its connection stays open): the job
    // is cancelled and every byte held for it comes back at once, not after a grace.
    drop(greedy);
    wait_until(
        "the scheduler to give back the dropped job's buffer",
        Duration::from_secs(10),
        || async { (buffered_bytes(http) == 0).then_some(()) },
    )
    .await;
    let job = observer.job_status(&greedy_id).await.unwrap();
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");

    // Its pool takes a new job at once, from the same connection.
    let mut after = greedy_pool
        .submit("after", futures::stream::iter([Bytes::from("x")]))
        .await
        .unwrap();
    let result = after.next().await.expect("a result").unwrap();
    assert_eq!(result.output.as_deref(), Ok(&b"x"[..]));
    // Dropped once its every result was read, a job is not cancelled: it succeeds.
    let after_id = after.job_id.clone();
    drop(after);
    let state = wait_until(
        "the job that was read to end",
        Duration::from_secs(10),
        || {
            let job = observer.job_status(&after_id);
            async move {
                let state = job.await.unwrap().state;
                (state != JobState::Running).then_some(state)
            }
        },
    )
    .await;
    assert_eq!(state, JobState::Succeeded);
    drop((greedy_pool, cluster));
}

/// Issue 48, item 6. Before, results were charged whatever the cap: 1,000 inputs of 16
/// bytes, each echoed back as 1 MiB and never read, all ran and left 1 GiB in the
/// scheduler. Now a job whose buffer is full of unread results runs no more tasks (its
/// actors' credit goes to other jobs) until its client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_of_small_inputs_stop_the_jobs_tasks_not_the_schedulers_memory() {
    init_logging();
    let job_cap = 16 * MIB;
    let (_state, scheduler, _agent, cluster, url, http) = scheduler_with_job_cap(job_cap).await;
    let pool = cluster.create_pool(amplifying_pool()).await.unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let rss_before = process_rss_bytes(scheduler.pid()).unwrap();

    let inputs = futures::stream::iter((0..1000).map(|i| Bytes::from(format!("{i:016}"))));
    let greedy = pool.submit("greedy", inputs).await.unwrap();
    let observer = Cluster::connect(&url).await.unwrap();
    let mut peak = 0;
    wait_until(
        "the greedy job's buffer to fill with results",
        Duration::from_secs(60),
        || {
            peak = peak.max(process_rss_bytes(scheduler.pid()).unwrap());
            async { (buffered_bytes(http) >= job_cap).then_some(()) }
        },
    )
    .await;
    // Its tasks stop: what ran is the buffer, the client's read-ahead and window, and the
    // tasks that were running then. Waited for until the job settles, not for a guessed
    // time: the client's side drains into its read-ahead at a loaded host's pace, and each
    // result it takes lets one more task run.
    let stopped = settled(&observer, &greedy.job_id, || {
        buffered_bytes(http) >= job_cap
    })
    .await;
    // Another job on the same pool runs to the end meanwhile, on the credit it left.
    let other_pool = Cluster::connect(&url)
        .await
        .unwrap()
        .create_pool(amplifying_pool())
        .await
        .unwrap();
    let outputs = tokio::time::timeout(
        Duration::from_secs(60),
        other_pool.map((0..20).map(|i| Bytes::from(vec![i as u8]))),
    )
    .await
    .expect("another job on the pool is not held up")
    .unwrap();
    assert!(
        outputs
            .iter()
            .all(|o| o.output.as_ref().is_ok_and(|b| b.len() == 65536))
    );
    for _ in 0..10 {
        peak = peak.max(process_rss_bytes(scheduler.pid()).unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let later = observer.job_status(&greedy.job_id).await.unwrap();
    assert_eq!(
        later.succeeded, stopped.succeeded,
        "the unread job's tasks kept running"
    );
    let held = buffered_bytes(http);
    let grown = peak.saturating_sub(rss_before);
    eprintln!(
        "unread 1 MiB results: {} ran, {} MiB buffered, scheduler RSS grew by {} MiB at its peak",
        later.succeeded,
        held / MIB,
        grown / MIB
    );
    // What ran: the scheduler's buffer (16), the SDK's read-ahead (64 results in its own
    // bounded channel), the client's HTTP/2 window (2 MiB) and the tasks in flight (4).
    assert!(
        later.succeeded < 16 + 64 + 2 + 4 + 10,
        "{} results of 1 MiB ran for a 16 MiB buffer",
        later.succeeded
    );
    assert!(
        held <= job_cap + 5 * MIB,
        "resident_scheduler_buffered_bytes {held} for a job capped at {job_cap}"
    );
    assert!(
        grown < 8 * job_cap,
        "scheduler RSS grew by {} MiB for a job capped at 16 MiB",
        grown / MIB
    );

    // The client reads: the rest runs, and every result arrives.
    let mut greedy = greedy;
    let mut received = 0;
    while let Some(result) = tokio::time::timeout(Duration::from_secs(60), greedy.next())
        .await
        .expect("results keep coming once read")
    {
        assert_eq!(result.unwrap().output.unwrap().len(), 16 * 65536);
        received += 1;
    }
    assert_eq!(received, 1000);
}

/// The job's status once it has settled: `full()`, no task running and its succeeded count
/// unchanged for a second (30 s at most).
async fn settled(
    observer: &Cluster,
    job_id: &resident_sdk::JobId,
    full: impl Fn() -> bool,
) -> resident_sdk::JobStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut quiet_since: Option<(u64, std::time::Instant)> = None;
    loop {
        let full = full();
        let job = observer.job_status(job_id).await.unwrap();
        let still = full && job.running == 0;
        match quiet_since {
            Some((count, at)) if still && count == job.succeeded => {
                if at.elapsed() >= Duration::from_secs(1) {
                    return job;
                }
            }
            _ => quiet_since = still.then(|| (job.succeeded, std::time::Instant::now())),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the full job never settled: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two echo actors (credit 2 each) that answer each input repeated 65,536 times.
fn amplifying_pool() -> PoolSpec {
    PoolSpec::new("amplify", "echo")
        .replicas(2)
        .max_in_flight_per_actor(2)
        .config_json(&serde_json::json!({"repeat": 65536}))
}

/// A scheduler whose jobs may each buffer `job_cap` bytes, with its HTTP port (last) and
/// one agent; its state dir first.
async fn scheduler_with_job_cap(
    job_cap: u64,
) -> (
    tempfile::TempDir,
    Proc,
    Proc,
    Cluster,
    String,
    std::net::SocketAddr,
) {
    let state = tempfile::tempdir().unwrap();
    let http: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let extra = [
        "--http-listen".into(),
        http.to_string().into(),
        "--max-job-buffered-bytes".into(),
        job_cap.to_string().into(),
    ];
    let (scheduler, agent, cluster, url) = scheduler_with_one_agent(state.path(), &extra).await;
    (state, scheduler, agent, cluster, url, http)
}

/// `resident_scheduler_buffered_bytes` from the scheduler's `/metrics`.
fn buffered_bytes(http: std::net::SocketAddr) -> u64 {
    let text = plain_http_get(http, "/metrics");
    text.lines()
        .find_map(|line| line.strip_prefix("resident_scheduler_buffered_bytes "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no resident_scheduler_buffered_bytes in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_a_principals_limit_are_refused_as_exhausted_naming_the_flag() {
    init_logging();
    let state = tempfile::tempdir().unwrap();
    let extra = ["--max-jobs-per-principal".into(), "2".into()];
    let (_scheduler, _agent, cluster, _url) = scheduler_with_one_agent(state.path(), &extra).await;
    let pool = cluster
        .create_pool(PoolSpec::new("p", "echo"))
        .await
        .unwrap();
    let open = || pool.submit("held", futures::stream::pending::<Bytes>());
    let _first = open().await.unwrap();
    let _second = open().await.unwrap();
    match open().await {
        Err(SdkError::Scheduler { code, message }) => {
            assert_eq!(code, tonic::Code::ResourceExhausted, "{message}");
            assert!(message.contains("--max-jobs-per-principal 2"), "{message}");
        }
        other => panic!(
            "a third job was not refused: {:?}",
            other.map(|j| j.job_id.clone())
        ),
    }
}
