//! A store whose writes fail: calls that change state are refused while it fails, a call
//! whose own write fails changed nothing (in memory, on the agents, and in the store once it
//! heals), and the scheduler accepts changes again by itself once the store writes.

use super::*;
use crate::store::testing::FlakyStore;

fn setup() -> (Harness, Arc<FlakyStore>) {
    let store = Arc::new(FlakyStore::default());
    let mut h = Harness::with_durable(CoreConfig::for_test(), store.clone());
    h.add_node("n1", vec![]);
    (h, store)
}

/// Lets the disk recover and waits until the writer has written everything it kept.
fn heal(h: &mut Harness, store: &FlakyStore) {
    store.set_failing(false);
    wait_for_store(h, false);
    h.core.run_follow_ups();
}

/// Waits (10 s at most) until the store refuses changes (`failing`) or takes them again.
fn wait_for_store(h: &Harness, failing: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.core.store.refusal().is_some() != failing {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never turned {}",
            if failing { "failing" } else { "healthy" }
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn create(h: &mut Harness, spec: pb::PoolSpec) -> Result<pb::PoolStatus, SchedulerError> {
    answer(
        |reply| SchedulerCommand::CreatePool {
            spec,
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    )
}

fn unavailable(error: SchedulerError) -> String {
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    status.message().to_owned()
}

fn stored_pools(store: &FlakyStore) -> Vec<(String, u32)> {
    let pools = store.load_pools().unwrap().into_iter();
    pools.map(|p| (p.name, p.replicas)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_create_fails_to_save_starts_nothing_and_is_gone() {
    let (mut h, store) = setup();
    store.set_failing(true);
    let message = unavailable(create(&mut h, cpu_pool("lost", 2, 1)).unwrap_err());
    assert!(message.contains("No space left on device"), "{message}");
    assert!(message.contains("changed nothing"), "{message}");
    assert!(
        h.load_actors("n1").is_empty() && sent(h.agent("n1")).is_empty(),
        "no actor was started for a pool that was not saved"
    );
    assert!(h.core.pool_status(&PoolName::from("lost")).is_err());

    // While the store fails, changes are refused before they change anything.
    let refused = unavailable(create(&mut h, cpu_pool("kept", 1, 1)).unwrap_err());
    assert!(refused.contains("cannot write"), "{refused}");
    assert!(h.core.pool_status(&PoolName::from("kept")).is_err());

    heal(&mut h, &store);
    create(&mut h, cpu_pool("kept", 1, 1)).expect("accepted once the store writes");
    assert_eq!(h.started_actor("n1").pool, "kept");
    // The failed create's write reached the store once it healed, and so did its undo.
    assert_eq!(stored_pools(&store), [("kept".to_owned(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_delete_or_scale_that_fails_to_save_leaves_the_pool_as_it_was() {
    let (mut h, store) = setup();
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    store.set_failing(true);
    unavailable(h.delete_pool("p", false).unwrap_err());
    assert!(
        sent(h.agent("n1")).is_empty(),
        "no actor was stopped by a delete that was not saved"
    );
    assert_eq!(
        h.core
            .pool_status(&PoolName::from("p"))
            .unwrap()
            .ready_actors,
        1
    );
    heal(&mut h, &store);
    assert_eq!(stored_pools(&store), [("p".to_owned(), 1)]);

    // A scale's own write fails: it goes back to the replicas before.
    store.set_failing(true);
    unavailable(h.scale_pool("p", 3).unwrap_err());
    let status = h.core.pool_status(&PoolName::from("p")).unwrap();
    assert_eq!(status.spec.unwrap().replicas, 1);
    heal(&mut h, &store);
    assert_eq!(stored_pools(&store), [("p".to_owned(), 1)]);
    assert_eq!(
        h.core
            .pool_status(&PoolName::from("p"))
            .unwrap()
            .ready_actors,
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancel_or_open_that_fails_to_save_changes_no_job() {
    let (mut h, store) = setup();
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, _rx) = h.open_job("p");
    h.submit(&job, 0..1);
    store.set_failing(true);
    unavailable(cancel_as(&mut h, &job, Principal::anonymous()).unwrap_err());
    let running = pb::JobState::Running as i32;
    assert_eq!(h.job(&job).state, running, "the job runs on");
    assert_eq!(run_tasks(&sent(h.agent("n1"))).len(), 1, "its task too");

    // A job opened as the store fails is forgotten.
    let jobs_before = h.core.job_statuses().len();
    let header = pb::SubmitHeader {
        pool: "p".into(),
        job_name: "late".into(),
        ..Default::default()
    };
    unavailable(h.attach(header, "alice").unwrap_err());
    assert_eq!(h.core.job_statuses().len(), jobs_before);

    heal(&mut h, &store);
    let stored: Vec<_> = store.load_jobs().unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (stored[0].job_id.as_str(), stored[0].state),
        (job.as_str(), running)
    );
}

/// While the store fails, the pools' usage is not queued again each save period (every save
/// holds the whole count); the first save after the store heals writes all of it.
#[tokio::test(start_paused = true)]
async fn pool_usage_waits_out_a_failing_store_and_is_saved_whole_once_it_heals() {
    let mut config = CoreConfig::for_test();
    config.node_dead_after = Duration::from_secs(3600);
    let store = Arc::new(FlakyStore::default());
    let mut h = Harness::with_durable(config, store.clone());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.core.store.flush(1).await.unwrap();
    h.core.run_follow_ups();
    h.load_actors("n1");

    // The first save fails and the store turns failing; the next six are not queued.
    store.set_failing(true);
    tokio::time::advance(Duration::from_secs(5)).await;
    h.tick();
    wait_for_store(&h, true);
    let kept = h.core.store.unwritten();
    for _ in 0..6 {
        tokio::time::advance(Duration::from_secs(5)).await;
        h.tick();
    }
    assert_eq!(
        h.core.store.unwritten(),
        kept,
        "no usage piled up while failing"
    );

    heal(&mut h, &store);
    tokio::time::advance(Duration::from_secs(5)).await;
    h.tick();
    h.core.store.flush(1).await.unwrap();
    let counted = h.core.pool_status(&PoolName::from("p")).unwrap().usage;
    let saved = store.load_pool_usage().unwrap();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let saved_seconds = saved[0].classes[0].cpu_core_seconds;
    assert!(saved_seconds >= 40.0, "{saved:?}");
    assert_eq!(saved_seconds, counted[0].cpu_core_seconds, "{counted:?}");
}
