//! Progress inside a running task (`TaskProgress`): counted in the job's `items_running`
//! and passed to its client for the dispatch the scheduler awaits only, capped at the
//! task's items, and gone from the count when the dispatch ends.

use super::*;

fn progress(h: &mut Harness, task: &pb::RunTask, items_done: u64) {
    h.send(
        "n1",
        pb::agent_message::Body::TaskProgress(pb::TaskProgress {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id.clone(),
            items_done,
            key: task.key.clone(),
        }),
    );
}

/// The progress messages the client got, as (seq, items done).
fn client_progress(rx: &mut ResultsRx) -> Vec<(u64, u64)> {
    let mut seen = Vec::new();
    while let Ok(message) = rx.try_recv() {
        if let Some(pb::submit_response::Body::Progress(p)) = message.message.unwrap().body {
            seen.push((p.seq, p.items_done));
        }
    }
    seen
}

#[tokio::test(start_paused = true)]
async fn only_the_awaited_dispatch_moves_items_running_and_its_end_clears_them() {
    let config = CoreConfig::for_test();
    let backoff = config.retry_backoff.max;
    let mut h = Harness::new(config);
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.core.handle(SchedulerCommand::SubmitTask {
        stream: h.stream(&job),
        input: pb::TaskInput {
            seq: 0,
            payload: vec![1].into(),
            items: 10,
        },
        charge: None,
    });
    h.core.after_commands();
    let first = run_tasks(&sent(h.agent("n1"))).remove(0);

    progress(&mut h, &first, 4);
    assert_eq!(h.job(&job).items_running, 4);
    assert_eq!(client_progress(&mut rx), vec![(0, 4)]);
    let wrong = pb::RunTask {
        dispatch: first.dispatch + 1,
        ..first.clone()
    };
    progress(&mut h, &wrong, 9);
    assert_eq!(h.job(&job).items_running, 4, "not the awaited dispatch");
    progress(&mut h, &first, 50);
    assert_eq!(h.job(&job).items_running, 10, "capped at the task's items");
    assert_eq!(client_progress(&mut rx), vec![(0, 10)]);

    // A failed dispatch loses its progress; the retry starts from 0 and a late report
    // from the first dispatch is ignored.
    h.outcome("n1", &first, Err("cuda error"));
    assert_eq!(h.job(&job).items_running, 0);
    tokio::time::advance(backoff * 2).await;
    h.tick();
    let second = run_tasks(&sent(h.agent("n1"))).remove(0);
    progress(&mut h, &first, 7);
    assert_eq!(h.job(&job).items_running, 0);
    progress(&mut h, &second, 3);
    assert_eq!(h.job(&job).items_running, 3);

    h.outcome("n1", &second, Ok("vectors"));
    let status = h.job(&job);
    assert_eq!((status.items_done, status.items_running), (10, 0));
}
