//! Tasks: credit-based dispatch to a pool's freest actor, progress and outcomes from the
//! agents, retries with backoff, deadlines, and the finish that answers the client.
//!
//! Every task state change goes through [`Core::change_task`], which applies the task state
//! machine (`crate::state::task`) and keeps the job's counters. A task in the Queued state
//! is in its pool's queue, a BackingOff task is in the retry heap, a Running or Cancelling
//! task is in its actor's in-flight set. Its result is sent to the client once, when it
//! reaches Done and its record is removed; answers for another dispatch are ignored.

use resident_proto::{ActorId, NodeId, PoolName, TaskId, pb};
use tokio::time::Instant;

use super::Core;
use super::records::TaskRecord;
use crate::metrics::{SchedulerMetrics, TaskOutcomeKind};
use crate::state::{ActorState, JobCounts, TaskEnd, TaskEvent, TaskState};
use crate::store::{StoreOp, StoredOutcome};

impl Core {
    /// Applies one event to a task and to its job's counters. Returns whether it applied
    /// (an event that does not is logged and changes nothing).
    pub(super) fn change_task(&mut self, task_id: TaskId, event: TaskEvent) -> bool {
        let Some(task) = self.tasks.get_mut(&task_id) else {
            return false;
        };
        let mut detached = JobCounts::default();
        let job = self.jobs.get_mut(&task.job);
        let counts = match job {
            Some(job) => {
                // Progress inside a dispatch ends with it: done items move to `items_done`
                // on success, and a retry starts from 0.
                job.status.items_running =
                    job.status.items_running.saturating_sub(task.items_running);
                task.items_running = 0;
                &mut job.counts
            }
            None => &mut detached,
        };
        match task.lifecycle.apply(event, counts) {
            Ok(_) => true,
            Err(invalid) => {
                tracing::warn!(task_id = %task_id, %invalid, "ignored task event");
                false
            }
        }
    }

    pub(super) fn task_state(&self, task_id: TaskId) -> Option<&TaskState> {
        self.tasks.get(&task_id).map(|t| t.lifecycle.state())
    }

    /// Forgets a task's record (it reached Done).
    pub(super) fn remove_task(&mut self, task_id: TaskId) -> Option<TaskRecord> {
        let task = self.tasks.remove(&task_id)?;
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.status.items_running = job.status.items_running.saturating_sub(task.items_running);
            if job.live.get(&task.seq) == Some(&task_id) {
                job.live.remove(&task.seq);
            }
        }
        Some(task)
    }

    /// Hands queued tasks to ready actors that have credit, the freest actor first (after
    /// a suspect task, if one waits, to an actor of its own).
    pub(super) fn dispatch_pool(&mut self, pool_name: &PoolName) {
        self.dispatch_suspects(pool_name);
        while self
            .pools
            .get(pool_name)
            .is_some_and(|p| !p.queue.is_empty())
        {
            let Some(actor_id) = self.freest_actor(pool_name) else {
                return;
            };
            let pool = self.pools.get_mut(pool_name).expect("checked");
            let task_id = pool.queue.pop_front().expect("not empty");
            if self.park_if_results_full(task_id) {
                continue;
            }
            self.dispatch_to(task_id, &actor_id);
        }
    }

    /// Sends one queued task to the actor; `false` if the task is gone or not dispatchable.
    pub(super) fn dispatch_to(&mut self, task_id: TaskId, actor_id: &ActorId) -> bool {
        let Some(task) = self.tasks.get(&task_id) else {
            return false;
        };
        let dispatch = task.lifecycle.dispatches() + 1;
        let event = TaskEvent::Dispatch {
            actor: actor_id.clone(),
            dispatch,
        };
        if !self.change_task(task_id, event) {
            return false;
        }
        let task = self.tasks.get_mut(&task_id).expect("exists");
        task.started_at = Some(Instant::now());
        task.last_actor = Some(actor_id.clone());
        let method = self
            .jobs
            .get(&task.job)
            .map(|j| j.method.clone())
            .unwrap_or_default();
        let key = pb::TaskKey {
            job_id: task.job.to_string(),
            seq: task.seq,
        };
        let actor = self.actors.get_mut(actor_id).expect("pool actor");
        actor.in_flight.insert(task_id);
        let node_id = actor
            .assignment
            .as_ref()
            .expect("ready actors are placed")
            .node
            .clone();
        let message = pb::RunTask {
            task_id: task_id.0,
            dispatch,
            actor_id: actor_id.to_string(),
            payload: task.payload.clone(),
            method,
            key: Some(key),
        };
        self.nodes[&node_id].send(pb::scheduler_message::Body::RunTask(message));
        self.refresh_dispatchable(actor_id);
        true
    }

    /// Whether a message about `task_id` from `actor_id` on `node_id` concerns the dispatch
    /// the scheduler awaits. Task ids differ between scheduler runs (see `Core::new`), and
    /// the key must match too, so an answer to another run's dispatch never passes for this
    /// run's.
    pub(super) fn awaited_dispatch(
        &self,
        node_id: &NodeId,
        actor_id: &ActorId,
        task_id: TaskId,
        dispatch: u32,
        key: Option<&pb::TaskKey>,
    ) -> bool {
        let awaited = self.tasks.get(&task_id).is_some_and(|t| {
            t.lifecycle.awaits(actor_id, dispatch)
                && key.is_none_or(|k| k.seq == t.seq && k.job_id == t.job.as_str())
        });
        awaited
            && self
                .actors
                .get(actor_id)
                .is_some_and(|a| a.assignment.as_ref().is_some_and(|p| &p.node == node_id))
    }

    /// A running task's actor says how many of its items are done: the job's
    /// `items_running` moves, and the job's client hears of it.
    pub(super) fn task_progress(&mut self, node_id: &NodeId, progress: pb::TaskProgress) {
        let task_id = TaskId(progress.task_id);
        let actor_id = ActorId::new(progress.actor_id);
        if !self.awaited_dispatch(
            node_id,
            &actor_id,
            task_id,
            progress.dispatch,
            progress.key.as_ref(),
        ) {
            return;
        }
        let task = self.tasks.get_mut(&task_id).expect("awaited");
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return;
        };
        let items_done = progress.items_done.min(u64::from(task.items));
        job.status.items_running =
            (job.status.items_running + items_done).saturating_sub(task.items_running);
        task.items_running = items_done;
        if let Some(results) = &job.results {
            results.send(pb::SubmitResponse {
                body: Some(pb::submit_response::Body::Progress(
                    pb::RunningTaskProgress {
                        seq: task.seq,
                        items_done,
                    },
                )),
            });
        }
    }

    pub(super) fn task_outcome(&mut self, node_id: &NodeId, outcome: pb::TaskOutcome) {
        let task_id = TaskId(outcome.task_id);
        let actor_id = ActorId::new(outcome.actor_id.clone());
        if !self.awaited_dispatch(
            node_id,
            &actor_id,
            task_id,
            outcome.dispatch,
            outcome.key.as_ref(),
        ) {
            self.unawaited_outcome(node_id, outcome);
            return;
        }
        let actor = self.actors.get_mut(&actor_id).expect("checked");
        self.metrics.task_ran(
            actor.pool.as_str(),
            std::time::Duration::from_micros(outcome.run_micros),
        );
        actor.in_flight.remove(&task_id);
        actor.tasks_done += 1;
        actor.last_answer = Some(Instant::now());
        if outcome.crashed {
            actor.crash.get_or_insert(super::records::Crash::OnTask);
        }
        let ran_suspect = actor.quarantine == Some(super::records::Quarantine::Running(task_id));
        let pool = actor.pool.clone();
        if ran_suspect {
            self.set_quarantine(&actor_id, None);
        }
        self.refresh_dispatchable(&actor_id);
        let cancelling = matches!(self.task_state(task_id), Some(TaskState::Cancelling { .. }));
        if cancelling {
            self.change_task(task_id, TaskEvent::Settle);
            self.remove_task(task_id);
        } else {
            match outcome.result {
                Some(pb::task_outcome::Result::Output(output)) => {
                    self.change_task(task_id, TaskEvent::Succeed);
                    self.finish_task(task_id, Ok(output), outcome.run_micros);
                }
                Some(pb::task_outcome::Result::Error(error)) if outcome.not_run => {
                    self.task_never_reached_actor(&actor_id, task_id, &error)
                }
                Some(pb::task_outcome::Result::Error(error)) if outcome.crashed => {
                    self.quarantine_or_fail(&actor_id, task_id, error)
                }
                Some(pb::task_outcome::Result::Error(error)) => {
                    self.retry_or_fail(task_id, error, outcome.permanent)
                }
                None => self.retry_or_fail(task_id, "agent sent an empty outcome".into(), false),
            }
        }
        if self.actors[&actor_id].state == ActorState::Draining
            && self.actors[&actor_id].in_flight.is_empty()
        {
            self.finish_drain(&actor_id);
        }
        self.dispatch_pool(&pool);
    }

    /// The agent answered that the actor it was sent to is not there (it stopped, or the
    /// agent no longer hosts it): the task did not run, so it goes back to the queue without
    /// spending an attempt (`requeue_lost_task` bounds how often), and an actor the
    /// scheduler still counts as placed is lost and started again, rather than sent more
    /// tasks it cannot take.
    pub(super) fn task_never_reached_actor(
        &mut self,
        actor_id: &ActorId,
        task_id: TaskId,
        error: &str,
    ) {
        self.requeue_lost_task(task_id, error);
        let placed = matches!(
            self.actors[actor_id].state,
            ActorState::Ready | ActorState::Starting
        );
        if placed {
            let why = format!("its node answered a task with: {error}");
            self.lose_actor(actor_id, crate::state::ActorEvent::Failed, &why);
            self.replan_needed = true;
        }
    }

    pub(super) fn retry_or_fail(&mut self, task_id: TaskId, error: String, permanent: bool) {
        let max_attempts = {
            let task = &self.tasks[&task_id];
            self.pools
                .get(&task.pool)
                .map_or(1, |p| p.max_task_attempts)
        };
        let task = self.tasks.get_mut(&task_id).expect("exists");
        task.failures += 1;
        let failures = task.failures;
        let final_error = if permanent {
            Some(error)
        } else if failures >= max_attempts {
            Some(format!("failed after {failures} attempts: {error}"))
        } else {
            task.last_error = error;
            None
        };
        if let Some(error) = final_error {
            self.change_task(task_id, TaskEvent::Fail { retry_at: None });
            self.finish_task(task_id, Err(error), 0);
            return;
        }
        self.metrics
            .task_ended(self.tasks[&task_id].pool.as_str(), TaskOutcomeKind::Retried);
        let delay = self.config.retry_backoff.delay(failures);
        let due = Instant::now() + delay;
        tracing::debug!(task_id = %task_id, failures, ?delay, "task failed; retrying");
        self.change_task(
            task_id,
            TaskEvent::Fail {
                retry_at: Some(due),
            },
        );
        self.retries.push(std::cmp::Reverse((due, task_id)));
    }

    /// A running task ran past its deadline on an actor that is being stopped
    /// (`core/task_deadlines.rs`): retried, or failed after its pool's attempts; a
    /// cancelling one is done.
    pub(super) fn time_out_task(&mut self, task_id: TaskId, error: String) {
        if matches!(self.task_state(task_id), Some(TaskState::Cancelling { .. })) {
            self.change_task(task_id, TaskEvent::Settle);
            self.remove_task(task_id);
            return;
        }
        self.retry_or_fail(task_id, error, false);
    }

    /// A running task whose actor or node was lost goes back to the front of its queue; a
    /// cancelling one is done.
    pub(super) fn requeue_lost_task(&mut self, task_id: TaskId, why: &str) {
        if !self.change_task(task_id, TaskEvent::Lose) {
            return;
        }
        if self.task_state(task_id) == Some(&TaskState::Done(TaskEnd::Cancelled)) {
            self.remove_task(task_id);
            return;
        }
        let task = self.tasks.get_mut(&task_id).expect("exists");
        task.node_losses += 1;
        let (losses, pool) = (task.node_losses, task.pool.clone());
        if losses > self.config.max_node_losses_per_task {
            self.fail_task(task_id, format!("lost {losses} times, last because {why}"));
            return;
        }
        self.metrics
            .task_ended(pool.as_str(), TaskOutcomeKind::Retried);
        let suspect = self.tasks[&task_id].crashes > 0;
        match self.pools.get_mut(&pool) {
            Some(record) if suspect => record.suspects.push_front(task_id),
            Some(record) => record.queue.push_front(task_id),
            None => self.fail_task(task_id, format!("pool `{pool}` was deleted")),
        }
    }

    pub(super) fn release_due_retries(&mut self, now: Instant) {
        let mut touched = Vec::new();
        while let Some(std::cmp::Reverse((due, task_id))) = self.retries.peek().copied() {
            if due > now {
                break;
            }
            self.retries.pop();
            let waiting = self
                .tasks
                .get(&task_id)
                .is_some_and(|t| t.lifecycle.state() == &TaskState::BackingOff { until: due });
            if !waiting || !self.change_task(task_id, TaskEvent::Release) {
                continue;
            }
            let pool = self.tasks[&task_id].pool.clone();
            match self.pools.get_mut(&pool) {
                Some(record) => {
                    record.queue.push_back(task_id);
                    touched.push(pool);
                }
                None => self.fail_task(task_id, format!("pool `{pool}` was deleted")),
            }
        }
        touched.sort();
        touched.dedup();
        for pool in touched {
            self.dispatch_pool(&pool);
        }
    }

    /// Fails a task that is not running (queued, backing off or just submitted).
    pub(super) fn fail_task(&mut self, task_id: TaskId, error: String) {
        if self.change_task(task_id, TaskEvent::Fail { retry_at: None }) {
            self.finish_task(task_id, Err(error), 0);
        }
    }

    /// Removes a task that reached Done and sends its one result.
    pub(super) fn finish_task(
        &mut self,
        task_id: TaskId,
        result: Result<prost::bytes::Bytes, String>,
        run_micros: u64,
    ) {
        let Some(task) = self.remove_task(task_id) else {
            return;
        };
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return;
        };
        let attempts = task.lifecycle.dispatches();
        let node_id = task
            .last_actor
            .as_ref()
            .and_then(|a| self.actors.get(a))
            .and_then(|a| a.assignment.as_ref())
            .map(|a| a.node.to_string())
            .unwrap_or_default();
        let stored = StoredOutcome {
            ok: result.is_ok(),
            attempts,
            error: result.as_ref().err().cloned(),
            output_bytes: result.as_ref().map_or(0, |o| o.len() as u64),
            items: task.items,
        };
        if result.is_ok() {
            job.status.items_done += u64::from(task.items);
        }
        count_task_end(&self.metrics, &task, &result);
        let result = match result {
            Ok(output) => pb::task_result::Result::Output(output),
            Err(error) => pb::task_result::Result::Error(error),
        };
        // A client that never reads this result sends the task again: counted once.
        job.finished
            .insert(task.seq, TaskEnd::of_outcome(stored.ok));
        if job.results.is_none() && job.detached_since.is_some() {
            // Its client will send this task again: answer it from here, within the job's
            // buffer (past it the task just runs again when resent).
            if let (pb::task_result::Result::Output(output), Some(actor)) =
                (&result, task.last_actor.clone())
                && let Some(charge) = self.held_outcomes.charge_within_total(output.len() as u64)
            {
                let outcome = super::records::HeldOutcome {
                    output: output.clone(),
                    actor,
                    run_micros,
                    charge,
                };
                job.hold(task.seq, outcome, self.config.max_job_buffered_bytes);
            }
        }
        if let Some(results) = &job.results {
            let message = result_message(&task, result, node_id, run_micros);
            results.send(pb::SubmitResponse {
                body: Some(pb::submit_response::Body::Result(message)),
            });
        }
        self.store.write(StoreOp::PutOutcome {
            job: task.job.clone(),
            seq: task.seq,
            outcome: stored,
        });
        self.maybe_finish_job(&task.job);
    }
}

/// The metrics and the event log of a task that ended with `result`.
fn count_task_end(
    metrics: &SchedulerMetrics,
    task: &TaskRecord,
    result: &Result<prost::bytes::Bytes, String>,
) {
    match result {
        Ok(_) => {
            metrics.task_items(task.pool.as_str(), task.items);
            metrics.task_ended(task.pool.as_str(), TaskOutcomeKind::Succeeded);
        }
        Err(error) => {
            metrics.task_ended(task.pool.as_str(), TaskOutcomeKind::Failed);
            metrics.events.record(
                "task",
                task.job.as_str(),
                format!("task {} of pool {} failed: {error}", task.seq, task.pool),
            );
        }
    }
}

/// What the client hears of a task that ended with `result`, run last on `node_id`.
fn result_message(
    task: &TaskRecord,
    result: pb::task_result::Result,
    node_id: String,
    run_micros: u64,
) -> pb::TaskResult {
    pb::TaskResult {
        seq: task.seq,
        result: Some(result),
        attempts: task.lifecycle.dispatches(),
        actor_id: task
            .last_actor
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        node_id,
        queue_micros: task.started_at.map_or(0, |started| {
            started.duration_since(task.submitted_at).as_micros() as u64
        }),
        run_micros,
    }
}
