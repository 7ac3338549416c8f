//! Every answer that acknowledges a change leaves only once the change is in the store,
//! and limits on running jobs are refused as RESOURCE_EXHAUSTED.

use super::*;

/// The pools and jobs in the store right now.
fn stored(store: &MemoryStore) -> (Vec<String>, Vec<(String, i32)>) {
    let pools = store.load_pools().unwrap().into_iter().map(|p| p.name);
    let jobs = store
        .load_jobs()
        .unwrap()
        .into_iter()
        .map(|j| (j.job_id, j.state));
    (pools.collect(), jobs.collect())
}

#[tokio::test(start_paused = true)]
async fn each_acknowledged_change_is_in_the_store_when_its_answer_arrives() {
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    assert_eq!(stored(&store).0, ["p"]);

    let scaled = h.scale_pool("p", 3).unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, 3);
    assert_eq!(store.load_pools().unwrap()[0].replicas, 3);

    let (job, _rx) = h.open_job("p");
    let running = pb::JobState::Running as i32;
    assert_eq!(stored(&store).1, [(job.to_string(), running)]);

    cancel_as(&mut h, &job, Principal::anonymous()).unwrap();
    let cancelled = pb::JobState::Cancelled as i32;
    assert_eq!(stored(&store).1, [(job.to_string(), cancelled)]);

    let deleted = h.delete_pool("p", false).unwrap();
    assert_eq!(deleted, None);
    assert!(stored(&store).0.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_finished_jobs_stream_ends_only_once_the_finish_is_stored() {
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    let (job, mut rx, task) = h.one_task_running();
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    h.outcome("n1", &task, Ok("done"));
    // Read until the stream ends: the writer thread drops the sender after the commit.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match rx.try_recv() {
            Ok(message) => assert!(message.message.is_ok()),
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the stream never ended"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
    let succeeded = pb::JobState::Succeeded as i32;
    assert_eq!(stored(&store).1, [(job.to_string(), succeeded)]);
}

#[tokio::test(start_paused = true)]
async fn a_principal_past_its_running_job_limit_is_refused_as_exhausted() {
    let config = CoreConfig {
        max_jobs_per_principal: 2,
        ..CoreConfig::for_test()
    };
    let mut h = Harness::new(config);
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let (first, _a) = h.open_job_as("p", "alice");
    let (_second, _b) = h.open_job_as("p", "alice");
    let header = pb::SubmitHeader {
        pool: "p".into(),
        job_name: "third".into(),
        ..Default::default()
    };
    let refused = h.attach(header.clone(), "alice").unwrap_err();
    let status = tonic::Status::from(refused);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("--max-jobs-per-principal 2"),
        "{}",
        status.message()
    );
    // Another principal is not held back, and a finished job frees a place.
    h.attach(header.clone(), "bob").expect("bob's job opens");
    cancel_as(&mut h, &first, Principal::anonymous()).unwrap();
    h.attach(header, "alice").expect("a place came free");
}
