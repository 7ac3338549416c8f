//! A client that does not read its results stops its job's tasks, not other jobs, and its
//! tasks go on once it reads.

use super::*;
use crate::budget::BufferBudget;

/// Opens a job on `pool` whose results buffer is capped at `cap` bytes.
fn open_capped_job(h: &mut Harness, pool: &str, cap: u64) -> (JobId, ResultsRx) {
    let budget = BufferBudget::new(1 << 30, cap);
    let (results, mut rx, _released) = super::super::JobResults::new(budget.job_buffer());
    let header = pb::SubmitHeader {
        pool: pool.into(),
        job_name: "capped".into(),
        ..Default::default()
    };
    let stream = answer(
        |reply| SchedulerCommand::OpenJob {
            header,
            owner: Principal::ANONYMOUS.into(),
            results,
            reply,
        },
        &mut h.core,
    )
    .unwrap();
    assert!(rx.try_recv().is_ok(), "accepted");
    h.streams.insert(stream.job.clone(), stream.clone());
    (stream.job, rx)
}

#[tokio::test(start_paused = true)]
async fn unread_results_park_the_jobs_tasks_and_reading_runs_them() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, mut rx) = open_capped_job(&mut h, "p", 100);
    h.submit(&job, 0..4);
    let first = run_tasks(&sent(h.agent("n1"))).remove(0);
    // A small input, a large result: the buffer is full of what the client has not read.
    let large = "x".repeat(200);
    h.outcome("n1", &first, Ok(&large));
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "no task runs while the client has a full buffer to read"
    );
    assert_eq!(h.core.jobs[&job].parked.len(), 3);

    // Another job on the same pool gets the actor meanwhile.
    let (other, _other_rx) = h.open_job("p");
    h.submit(&other, 0..1);
    let ran = run_tasks(&sent(h.agent("n1")));
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].key.as_ref().unwrap().job_id, other.as_str());
    h.outcome("n1", &ran[0], Ok("small"));

    // The client reads: its tasks run again, oldest first.
    while rx.try_recv().is_ok() {}
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    h.core.run_follow_ups();
    let ran = run_tasks(&sent(h.agent("n1")));
    assert_eq!(ran.len(), 1, "credit 1: the oldest parked task runs");
    assert_eq!(ran[0].key.as_ref().unwrap().seq, 1);
    assert!(h.core.jobs[&job].parked.is_empty());
}

#[tokio::test(start_paused = true)]
async fn parked_tasks_fail_with_their_deleted_pool() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, _rx) = open_capped_job(&mut h, "p", 100);
    h.submit(&job, 0..3);
    let first = run_tasks(&sent(h.agent("n1"))).remove(0);
    h.outcome("n1", &first, Ok(&"x".repeat(200)));
    assert_eq!(h.core.jobs[&job].parked.len(), 2);
    h.delete_pool("p", false).unwrap();
    let status = h.job(&job);
    assert_eq!((status.succeeded, status.failed), (1, 2), "{status:?}");
}
