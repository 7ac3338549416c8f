//! Serving a backend that takes tasks while it runs ([`ModelBackend::run_fed`]): a
//! generation actor keeps one continuous batch across its tasks, taking the next task the
//! scheduler sent (its credit lets one wait at the actor) as soon as it has room, instead
//! of draining its batch at the end of each.
//!
//! The host's feed hands over only tasks already at hand that are plain (default method,
//! not prepared, not cancelled); any other stops the taking and waits for the run to end.
//! Each answer goes to the scheduler as it comes; a task the run leaves unanswered (an
//! error, a panic) fails with it.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::Receiver;
use std::time::Instant;

use resident_proto::pb;

use super::task_work::{Ran, TaskAnswers, TaskError, Work};
use crate::backends::{BackendError, FedTask, ModelBackend, TaskFeed, TaskSize};

/// How a run of fed tasks ended.
pub(super) enum FedRun {
    /// Every task taken was answered (or failed with the run's error).
    Answered,
    /// The agent's uplink is gone: the agent is stopping.
    UplinkGone,
    /// The kind's code panicked (the tasks' outcomes went out first): the actor must die.
    Panicked(String),
}

/// Runs `first`, and the plain tasks that arrive on `work` while it runs, through the
/// backend's [`ModelBackend::run_fed`]. The first task that is not plain is left in `held`
/// for the caller to serve next.
pub(super) fn serve_fed(
    answers: &dyn TaskAnswers,
    backend: &mut Box<dyn ModelBackend>,
    first: Work,
    work: &mut Receiver<Work>,
    held: &mut Option<Work>,
) -> FedRun {
    let run_span = tracing::info_span!("fed_tasks");
    let _entered = run_span.enter();
    let mut feed = HostFeed {
        run_span: run_span.clone(),
        answers,
        work,
        first: Some(first),
        held,
        running: BTreeMap::new(),
        next_number: 0,
        busy_from: Instant::now(),
        uplink_gone: false,
    };
    let ran = catch_unwind(AssertUnwindSafe(|| backend.run_fed(&mut feed)));
    let (error, panicked) = match ran {
        Ok(Ok(())) => (
            TaskError::transient("the actor ended its run without answering this task".into()),
            None,
        ),
        Ok(Err(error)) => (TaskError::from(error), None),
        Err(panic) => {
            let error = TaskError::panic("actor", panic.as_ref());
            let message = error.message.clone();
            (error, Some(message))
        }
    };
    feed.fail_unanswered(error);
    match (feed.uplink_gone, panicked) {
        (true, _) => FedRun::UplinkGone,
        (false, Some(message)) => FedRun::Panicked(message),
        (false, None) => FedRun::Answered,
    }
}

/// A task taken into the run and not yet answered.
struct Taken {
    task: pb::RunTask,
    span: tracing::Span,
    begun: Instant,
}

/// The host's side of [`TaskFeed`].
struct HostFeed<'a> {
    /// The run's span: each task's span is linked to it.
    run_span: tracing::Span,
    answers: &'a dyn TaskAnswers,
    work: &'a mut Receiver<Work>,
    first: Option<Work>,
    held: &'a mut Option<Work>,
    /// By the number the backend knows them by.
    running: BTreeMap<u64, Taken>,
    next_number: u64,
    /// Since when the actor's busy time is not yet counted.
    busy_from: Instant,
    uplink_gone: bool,
}

impl HostFeed<'_> {
    /// Takes `work` into the run: numbered, its progress begun.
    fn take(&mut self, work: Work) -> FedTask {
        let Work { task, span, .. } = work;
        self.run_span.follows_from(&span);
        self.answers.progress().begin(&task);
        let number = self.next_number;
        self.next_number += 1;
        let payload = task.payload.clone();
        let begun = Instant::now();
        self.running.insert(number, Taken { task, span, begun });
        FedTask { number, payload }
    }

    /// Sends task `number`'s outcome.
    fn finish(&mut self, number: u64, result: Result<Vec<u8>, TaskError>, size: TaskSize) {
        let Some(Taken { task, span, begun }) = self.running.remove(&number) else {
            tracing::error!(
                number,
                "an answer to a task not running (or answered twice) is dropped"
            );
            return;
        };
        let _entered = span.enter();
        self.answers.progress().end_task(task.task_id);
        let now = Instant::now();
        let ran = Ran {
            run_micros: now.duration_since(begun).as_micros() as u64,
            busy_micros: now.duration_since(self.busy_from).as_micros() as u64,
            size,
        };
        self.busy_from = now;
        if !self.answers.send_outcome(task, result, ran) {
            self.uplink_gone = true;
        }
    }

    /// Fails every task taken and not answered with `error`.
    fn fail_unanswered(&mut self, error: TaskError) {
        let numbers: Vec<u64> = self.running.keys().copied().collect();
        for number in numbers {
            self.finish(number, Err(error.clone()), TaskSize::default());
        }
    }
}

impl TaskFeed for HostFeed<'_> {
    fn next_task(&mut self) -> Option<FedTask> {
        if let Some(first) = self.first.take() {
            return Some(self.take(first));
        }
        if self.held.is_some() || self.uplink_gone {
            return None;
        }
        let work = self.work.try_recv().ok()?;
        if !work.is_plain() {
            *self.held = Some(work);
            return None;
        }
        Some(self.take(work))
    }

    fn answer(&mut self, number: u64, result: Result<Vec<u8>, BackendError>, size: TaskSize) {
        self.finish(number, result.map_err(TaskError::from), size);
    }

    fn progress(&mut self, number: u64, items_done: u64) {
        if let Some(taken) = self.running.get(&number) {
            let task_id = taken.task.task_id;
            self.answers.progress().report_task(task_id, items_done);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::mpsc;

    use crate::backends::{ActorKind, ActorKindRegistry, LoadContext, TaskSize};
    use crate::host::ActorHost;

    use super::*;

    /// A kind whose actor gathers tasks into one run: the first task's payload starts with
    /// how many to gather (waiting up to 5 s for them); it answers them last first, each
    /// saying how many ran together, and panics if one says `panic`.
    struct GatheringKind;

    impl ActorKind for GatheringKind {
        fn name(&self) -> &str {
            "gathering"
        }

        fn load(&self, _context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
            Ok(Box::new(Gathering))
        }
    }

    struct Gathering;

    impl ModelBackend for Gathering {
        fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
            Ok(payload.to_vec())
        }

        fn takes_tasks_while_running(&self) -> bool {
            true
        }

        fn run_fed(&mut self, feed: &mut dyn TaskFeed) -> Result<(), BackendError> {
            let first = feed.next_task().expect("a first task");
            let wanted = usize::from(first.payload[0] - b'0');
            let mut taken = vec![first];
            let deadline = Instant::now() + Duration::from_secs(5);
            while taken.len() < wanted && Instant::now() < deadline {
                match feed.next_task() {
                    Some(task) => taken.push(task),
                    None => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            if taken.iter().any(|t| t.payload.ends_with(b"panic")) {
                panic!("the model broke");
            }
            let together = taken.len();
            for task in taken.into_iter().rev() {
                let text = String::from_utf8_lossy(&task.payload);
                let answer = format!("{text} with {together}").into_bytes();
                let size = TaskSize {
                    items: 1,
                    tokens: 0,
                };
                feed.answer(task.number, Ok(answer), size);
            }
            Ok(())
        }
    }

    fn task(id: u64, payload: &str, method: &str) -> pb::RunTask {
        pb::RunTask {
            task_id: id,
            dispatch: 1,
            actor_id: "a1".into(),
            payload: payload.as_bytes().to_vec().into(),
            method: method.into(),
            ..Default::default()
        }
    }

    /// The next `count` task outcomes: (task id, output text or error, crashed).
    async fn outcomes(
        host: &mut ActorHost,
        rx: &mut mpsc::UnboundedReceiver<pb::AgentMessage>,
        count: usize,
    ) -> Vec<(u64, String, bool)> {
        let mut seen = Vec::new();
        while seen.len() < count {
            let message = tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("the actor answers")
                .expect("open");
            host.forwarded(&message);
            if let Some(pb::agent_message::Body::TaskOutcome(outcome)) = message.body {
                let text = match outcome.result.expect("a result") {
                    pb::task_outcome::Result::Output(bytes) => {
                        String::from_utf8_lossy(&bytes).into_owned()
                    }
                    pb::task_outcome::Result::Error(error) => error,
                };
                seen.push((outcome.task_id, text, outcome.crashed));
            }
        }
        seen
    }

    #[tokio::test]
    async fn a_running_backend_takes_the_plain_tasks_at_hand_and_answers_each_as_it_ends() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut registry = ActorKindRegistry::default();
        registry.register(Arc::new(GatheringKind));
        let (mut host, _models) = crate::host::host_for_tests(registry, tx);
        host.start(pb::StartActor {
            actor_id: "a1".into(),
            incarnation: 1,
            pool: "p".into(),
            kind: "gathering".into(),
            max_in_flight: 8,
            ..Default::default()
        });
        // 1 and 2 run together, answered 2 first; 3 names a method, so the run takes no
        // more and 3 is served alone (the kind has no such method); 4 is a run of its own.
        host.run(task(1, "2a", ""));
        host.run(task(2, "1b", ""));
        host.run(task(3, "x", "reverse"));
        host.run(task(4, "1d", ""));
        let seen = outcomes(&mut host, &mut rx, 4).await;
        let ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(ids, [2, 1, 3, 4], "{seen:?}");
        assert_eq!(seen[0].1, "1b with 2");
        assert_eq!(seen[1].1, "2a with 2");
        assert!(seen[2].1.contains("reverse"), "{seen:?}");
        assert_eq!(seen[3].1, "1d with 1");

        // A panic fails every task the run took, as crashed, and the actor dies.
        host.run(task(5, "2panic", ""));
        host.run(task(6, "1f", ""));
        let seen = outcomes(&mut host, &mut rx, 2).await;
        for (id, text, crashed) in &seen {
            assert!(*crashed, "task {id}: {text}");
            assert!(text.contains("the model broke"), "task {id}: {text}");
        }
        let mut ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, [5, 6]);
    }
}
