//! Progress inside a task: a kind that works through a large chunk in steps (an embedder's
//! inner batches) calls [`TaskProgress::report`] after each, and the scheduler passes it on
//! to the job's client and the dashboard, so a bar moves before the chunk ends.
//!
//! Reports are cheap to make: the reporter sends at most one message per actor per interval
//! (the scheduler's `Registered.task_progress_interval_ms`, none when 0) and drops the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use resident_proto::pb;

use crate::uplink::ToScheduler;

/// The least time between two progress messages of one actor, shared by the agent's actors
/// and set from each registration; 0 turns reports off.
#[derive(Clone, Debug, Default)]
pub struct ProgressInterval(Arc<AtomicU64>);

impl ProgressInterval {
    /// Sets the interval (from the scheduler's registration answer).
    pub fn set(&self, interval: Duration) {
        self.0.store(interval.as_millis() as u64, Ordering::Relaxed);
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// A task an actor is running, as the progress messages name it.
struct RunningTask {
    task: pb::RunTask,
    last_sent: Option<Instant>,
}

/// One actor's progress reporter, handed to its kind in [`super::LoadContext`].
#[derive(Clone)]
pub struct TaskProgress {
    outbound: Option<ToScheduler>,
    interval: ProgressInterval,
    /// The tasks running, in the order begun: one, or several in a batch that takes tasks
    /// while it runs ([`super::ModelBackend::run_fed`]).
    running: Arc<Mutex<Vec<RunningTask>>>,
}

impl std::fmt::Debug for TaskProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskProgress").finish_non_exhaustive()
    }
}

impl TaskProgress {
    pub(crate) fn new(outbound: ToScheduler, interval: ProgressInterval) -> Self {
        Self {
            outbound: Some(outbound),
            interval,
            running: Arc::default(),
        }
    }

    /// A reporter that sends nothing (a kind loaded outside an agent: tests, benches).
    pub fn disabled() -> Self {
        Self {
            outbound: None,
            interval: ProgressInterval::default(),
            running: Arc::default(),
        }
    }

    /// The running task has done `items_done` of its items. Between two messages at least
    /// the interval passes; reports in between are dropped (the next one carries the count).
    /// With several tasks running, this names the first begun ([`Self::report_task`] names
    /// one).
    pub fn report(&self, items_done: u64) {
        self.report_at(None, items_done, Instant::now());
    }

    /// Running task `task_id` has done `items_done` of its items, as [`Self::report`].
    pub fn report_task(&self, task_id: u64, items_done: u64) {
        self.report_at(Some(task_id), items_done, Instant::now());
    }

    /// [`Self::report`] of `task_id` (the first begun: `None`) at `now` (the tests give the
    /// clock).
    fn report_at(&self, task_id: Option<u64>, items_done: u64, now: Instant) {
        let (Some(outbound), Some(interval)) = (&self.outbound, self.interval.get()) else {
            return;
        };
        let mut running = self.running.lock().expect("running task");
        let running = match task_id {
            None => running.first_mut(),
            Some(id) => running.iter_mut().find(|r| r.task.task_id == id),
        };
        let Some(running) = running else {
            return;
        };
        if running
            .last_sent
            .is_some_and(|sent| now.duration_since(sent) < interval)
        {
            return;
        }
        running.last_sent = Some(now);
        let task = &running.task;
        let _ = outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::TaskProgress(pb::TaskProgress {
                task_id: task.task_id,
                dispatch: task.dispatch,
                actor_id: task.actor_id.clone(),
                items_done,
                key: task.key.clone(),
            })),
        });
    }

    /// The actor thread starts running `task`: reports from now on name it. The first
    /// report waits one interval, so short tasks send none.
    pub(crate) fn begin(&self, task: &pb::RunTask) {
        self.begin_at(task, Instant::now());
    }

    /// [`Self::begin`] at `now` (the tests give the clock).
    fn begin_at(&self, task: &pb::RunTask, now: Instant) {
        let header = pb::RunTask {
            payload: Default::default(),
            ..task.clone()
        };
        self.running
            .lock()
            .expect("running task")
            .push(RunningTask {
                task: header,
                last_sent: Some(now),
            });
    }

    /// Every running task ended (their outcomes go next on the same uplink, so no report
    /// follows them).
    pub(crate) fn end(&self) {
        self.running.lock().expect("running task").clear();
    }

    /// Running task `task_id` ended.
    pub(crate) fn end_task(&self, task_id: u64) {
        let mut running = self.running.lock().expect("running task");
        running.retain(|r| r.task.task_id != task_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(task_id: u64) -> pb::RunTask {
        pb::RunTask {
            task_id,
            dispatch: 1,
            actor_id: "a-1".into(),
            payload: vec![0u8; 1024].into(),
            ..Default::default()
        }
    }

    /// Progress reported at most every 30 ms, and the messages it sends.
    fn every_30_ms() -> (
        TaskProgress,
        tokio::sync::mpsc::UnboundedReceiver<pb::AgentMessage>,
    ) {
        let (outbound, uplink) = tokio::sync::mpsc::unbounded_channel();
        let interval = ProgressInterval::default();
        interval.set(Duration::from_millis(30));
        (TaskProgress::new(outbound, interval), uplink)
    }

    fn progress_of(message: pb::AgentMessage) -> pb::TaskProgress {
        match message.body {
            Some(pb::agent_message::Body::TaskProgress(progress)) => progress,
            other => panic!("not progress: {other:?}"),
        }
    }

    #[test]
    fn reports_at_most_once_per_interval_and_only_while_a_task_runs() {
        // The clock is given, so the test holds on a host of any speed.
        let (progress, mut uplink) = every_30_ms();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        progress.report_at(None, 1, at(0));
        assert!(uplink.try_recv().is_err(), "no task runs");

        progress.begin_at(&task(7), at(0));
        progress.report_at(None, 1, at(29));
        assert!(
            uplink.try_recv().is_err(),
            "the first report waits an interval"
        );
        progress.report_at(None, 5, at(30));
        progress.report_at(None, 6, at(59));
        let sent = progress_of(uplink.try_recv().expect("one report"));
        assert_eq!((sent.task_id, sent.items_done, sent.dispatch), (7, 5, 1));
        assert!(
            uplink.try_recv().is_err(),
            "the second report came too soon"
        );
        progress.report_at(None, 8, at(60));
        assert_eq!(
            progress_of(uplink.try_recv().expect("a report")).items_done,
            8
        );

        progress.end();
        progress.report_at(None, 9, at(200));
        assert!(uplink.try_recv().is_err(), "the task ended");
    }

    #[test]
    fn tasks_running_together_each_report_under_their_own_name_and_interval() {
        let (progress, mut uplink) = every_30_ms();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        progress.begin_at(&task(7), at(0));
        progress.begin_at(&task(8), at(10));
        progress.report_at(Some(8), 4, at(40));
        progress.report_at(Some(7), 3, at(40));
        progress.report_at(Some(7), 5, at(50));
        let sent: Vec<(u64, u64)> = std::iter::from_fn(|| uplink.try_recv().ok())
            .map(progress_of)
            .map(|p| (p.task_id, p.items_done))
            .collect();
        assert_eq!(sent, [(8, 4), (7, 3)], "each task its own interval");

        progress.end_task(7);
        progress.report_at(Some(7), 9, at(200));
        assert!(uplink.try_recv().is_err(), "task 7 ended");
        progress.report_at(None, 6, at(200));
        let sent = progress_of(uplink.try_recv().expect("task 8 still runs"));
        assert_eq!((sent.task_id, sent.items_done), (8, 6));
        progress.report_at(Some(99), 1, at(400));
        assert!(uplink.try_recv().is_err(), "no such task");
    }

    #[test]
    fn an_interval_of_zero_sends_nothing() {
        let (outbound, mut uplink) = tokio::sync::mpsc::unbounded_channel();
        let progress = TaskProgress::new(outbound, ProgressInterval::default());
        let start = Instant::now();
        progress.begin_at(&task(1), start);
        progress.report_at(None, 3, start + Duration::from_secs(60));
        assert!(uplink.try_recv().is_err());
        assert!(TaskProgress::disabled().outbound.is_none());
    }
}
