//! Jobs and tasks: per-pool queues, credit-based dispatch, outcomes, retries, cancellation.
//!
//! Every task state change goes through [`Core::change_task`], which applies the task state
//! machine (`crate::state::task`) and keeps the job's counters. A task in the Queued state
//! is in its pool's queue, a BackingOff task is in the retry heap, a Running or Cancelling
//! task is in its actor's in-flight set. Its result is sent to the client once, when it
//! reaches Done and its record is removed; answers for another dispatch are ignored.

use std::cmp::Reverse;
use std::collections::HashMap;

use resident_proto::{ActorId, JobId, NodeId, PoolName, TaskId, pb};
use tokio::time::Instant;

use super::records::{JobRecord, JobStream, TaskRecord};
use super::{Core, JobResults};
use crate::auth::Principal;
use crate::error::SchedulerError;
use crate::metrics::{TaskOutcomeKind, unix_ms_now};
use crate::state::{ActorState, JobCounts, TaskEnd, TaskEvent, TaskLifecycle, TaskState};
use crate::store::{StoreOp, StoredOutcome};

/// The largest job summary (`AnnotateJob`).
pub const MAX_JOB_SUMMARY_BYTES: usize = 64 << 10;

/// Tells the client which job its stream is attached to.
fn accept(results: &JobResults, job: &JobId) {
    results.send(pb::SubmitResponse {
        body: Some(pb::submit_response::Body::Accepted(pb::JobAccepted {
            job_id: job.to_string(),
        })),
    });
}

impl Core {
    /// The job a client stream feeds, if the stream is still the one attached to it.
    fn attached_job(&mut self, stream: &JobStream) -> Option<&mut JobRecord> {
        self.jobs
            .get_mut(&stream.job)
            .filter(|job| job.attachment == stream.attachment)
    }

    pub(super) fn open_job(
        &mut self,
        header: pb::SubmitHeader,
        owner: String,
        results: JobResults,
    ) -> Result<JobStream, SchedulerError> {
        let pool = PoolName::new(header.pool.clone());
        self.pool_record(&pool)?;
        crate::policy::field_limits::check_job_name(&header.job_name)
            .map_err(SchedulerError::InvalidArgument)?;
        if !header.resume_job_id.is_empty() {
            return self.resume_job(header, owner, results);
        }
        let running = self
            .jobs
            .values()
            .filter(|j| j.is_running() && j.status.owner == owner)
            .count();
        if running >= self.config.max_jobs_per_principal {
            return Err(SchedulerError::Exhausted(format!(
                "`{owner}` runs {running} jobs, the limit per principal \
                 (--max-jobs-per-principal {}); wait for one to finish, or raise the limit",
                self.config.max_jobs_per_principal
            )));
        }
        let job = JobId::generate();
        let status = pb::JobStatus {
            job_id: job.to_string(),
            pool: header.pool,
            name: header.job_name,
            state: pb::JobState::Running as i32,
            owner,
            expected_tasks: header.expected_tasks,
            started_unix_ms: unix_ms_now(),
            ..Default::default()
        };
        accept(&results, &job);
        self.store.write(StoreOp::PutJob(status.clone()));
        tracing::info!(job_id = %job, pool = %pool, "job opened");
        self.jobs.insert(
            job.clone(),
            JobRecord {
                status,
                counts: JobCounts::default(),
                attachment: 1,
                live: HashMap::new(),
                finished: Default::default(),
                held: HashMap::new(),
                held_bytes: 0,
                inherited_runs: Default::default(),
                method: header.method,
                results: Some(results),
                input_closed: false,
                persisted: JobCounts::default(),
                detached_since: None,
                parked: Default::default(),
            },
        );
        Ok(JobStream { job, attachment: 1 })
    }

    /// Attaches a new client stream to a job the scheduler already knows: one interrupted by
    /// a restart, or one whose earlier stream this scheduler has not seen break yet. Its
    /// client sends again every task it has no result for.
    fn resume_job(
        &mut self,
        header: pb::SubmitHeader,
        owner: String,
        results: JobResults,
    ) -> Result<JobStream, SchedulerError> {
        let job_id = JobId::new(header.resume_job_id.clone());
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Err(SchedulerError::NotFound(format!(
                "job `{job_id}` is not known to this scheduler (it restarted without its state \
                 directory, or forgot the job); run the command again to resume from its output"
            )));
        };
        if job.status.owner != owner {
            return Err(SchedulerError::PermissionDenied(format!(
                "job `{job_id}` belongs to `{}`; `{owner}` cannot resume it",
                job.status.owner
            )));
        }
        if job.status.pool != header.pool {
            return Err(SchedulerError::InvalidArgument(format!(
                "job `{job_id}` runs on pool `{}`, not `{}`",
                job.status.pool, header.pool
            )));
        }
        if job.status.state == pb::JobState::Cancelled as i32 {
            return Err(SchedulerError::Precondition(format!(
                "job `{job_id}` was cancelled; run the command again to start over from its output"
            )));
        }
        let was_running = job.is_running();
        if !was_running {
            // Interrupted by a restart (nothing of it is live), or finished while its
            // results were on the way: what is accounted for is what finished.
            job.counts.submitted = job.counts.succeeded + job.counts.failed + job.counts.cancelled;
            job.counts.queued = 0;
            job.counts.running = 0;
            job.status.items_running = 0;
            job.status.state = pb::JobState::Running as i32;
            self.store.write(StoreOp::PutJob(job.snapshot()));
        }
        job.attachment += 1;
        job.detached_since = None;
        job.results = Some(results);
        job.input_closed = false;
        job.method = header.method;
        let stream = JobStream {
            job: job_id.clone(),
            attachment: job.attachment,
        };
        accept(job.results.as_ref().expect("just set"), &job_id);
        // Running again: no longer among the finished jobs that history may forget.
        self.finished_jobs.retain(|j| j != &job_id);
        tracing::info!(job_id = %job_id, attachment = stream.attachment, "job resumed");
        Ok(stream)
    }

    /// Whether `requester` may cancel `job` (its owner or an admin); `Ok(true)` if it
    /// runs, `Ok(false)` if it has already finished.
    pub(super) fn may_cancel_job(
        &self,
        job: &JobId,
        requester: &Principal,
    ) -> Result<bool, SchedulerError> {
        let status = self.job_status(job)?;
        crate::auth::may_cancel(requester, &status.owner)
            .map_err(SchedulerError::PermissionDenied)?;
        Ok(status.state == pb::JobState::Running as i32)
    }

    /// Sets the job's summary (a JSON object, at most [`MAX_JOB_SUMMARY_BYTES`]), if
    /// `requester` may: its owner or an admin.
    pub(super) fn annotate_job(
        &mut self,
        job: &JobId,
        requester: &Principal,
        summary_json: String,
    ) -> Result<(), SchedulerError> {
        let owner = self.job_status(job)?.owner;
        crate::auth::may_annotate(requester, &owner).map_err(SchedulerError::PermissionDenied)?;
        if summary_json.len() > MAX_JOB_SUMMARY_BYTES {
            return Err(SchedulerError::InvalidArgument(format!(
                "a job summary may take {MAX_JOB_SUMMARY_BYTES} bytes, this one has {}; send fewer leaderboard rows",
                summary_json.len()
            )));
        }
        let is_object = serde_json::from_str::<serde_json::Value>(&summary_json)
            .is_ok_and(|value| value.is_object());
        if !summary_json.is_empty() && !is_object {
            return Err(SchedulerError::InvalidArgument(
                "a job summary must be a JSON object, such as {\"status\": \"3/10 trials\"}".into(),
            ));
        }
        let record = self.jobs.get_mut(job).expect("found above");
        record.status.summary_json = summary_json;
        self.store.write(StoreOp::PutJob(record.snapshot()));
        Ok(())
    }

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

    pub(super) fn submit_task(
        &mut self,
        stream: &JobStream,
        input: pb::TaskInput,
        charge: Option<crate::budget::BufferCharge>,
    ) {
        let next_task = &mut self.next_task;
        let Some(job) = self
            .jobs
            .get_mut(&stream.job)
            .filter(|j| j.is_running() && j.attachment == stream.attachment)
        else {
            return;
        };
        if job.live.contains_key(&input.seq) {
            // Sent again by a resumed client while it still runs: its one result goes to
            // the stream attached now.
            return;
        }
        let pool = PoolName::new(job.status.pool.clone());
        let task = TaskId(*next_task);
        *next_task += 1;
        let earlier = job.finished.take(input.seq);
        let items = input.items.max(1);
        let lifecycle = match earlier {
            Some(end) => {
                if end == TaskEnd::Succeeded {
                    // Counted when it ended; it is counted again when it succeeds.
                    job.status.items_done = job.status.items_done.saturating_sub(items.into());
                }
                TaskLifecycle::resubmitted(&mut job.counts, end)
            }
            None => TaskLifecycle::submitted(&mut job.counts),
        };
        job.live.insert(input.seq, task);
        let held = job.take_held(input.seq);
        let record = TaskRecord {
            job: stream.job.clone(),
            seq: input.seq,
            items,
            pool: pool.clone(),
            payload: input.payload,
            lifecycle,
            last_actor: None,
            failures: 0,
            node_losses: 0,
            submitted_at: Instant::now(),
            started_at: None,
            last_error: String::new(),
            items_running: 0,
            crashes: 0,
            first_crash_victims: Vec::new(),
            charge,
        };
        let empty = record.payload.is_empty();
        self.tasks.insert(task, record);
        if empty {
            self.fail_task(task, "invalid argument: task payload is empty".into());
            return;
        }
        if held.is_none() && self.awaits_inherited_run(&stream.job, input.seq) {
            return;
        }
        if held.is_none()
            && let Some(why) = self.every_actor_died(&pool)
        {
            self.fail_task(task, why);
            return;
        }
        match self.pools.get_mut(&pool) {
            Some(record) => record.queue.push_back(task),
            None => {
                self.fail_task(task, format!("pool `{pool}` was deleted"));
                return;
            }
        }
        if let Some(held) = held {
            self.answer_queued_task(task, held.output, held.actor, held.run_micros);
            return;
        }
        self.dispatch_pool(&pool);
    }

    pub(super) fn close_job_input(&mut self, stream: &JobStream) {
        let Some(record) = self.attached_job(stream) else {
            return;
        };
        record.input_closed = true;
        self.maybe_finish_job(&stream.job);
    }

    /// The client's stream broke or was dropped, and no other stream was attached to the
    /// job meanwhile. The job runs on for `detach_grace`, so a client that reconnects
    /// (the SDK does, with `resume_job_id`) finds it. Results that finish meanwhile are
    /// held for it and counted once (`finish_task`). Past the grace, or with no grace,
    /// what is left of the job is cancelled (`expire_detached_jobs`).
    pub(super) fn client_gone(&mut self, stream: &JobStream) {
        let grace = self.config.detach_grace;
        let Some(job) = self.attached_job(stream) else {
            return;
        };
        if grace.is_zero() || !job.is_running() {
            self.cancel_job_tasks(&stream.job, "client disconnected");
            return;
        }
        job.results = None;
        job.detached_since = Some(Instant::now());
        tracing::info!(job_id = %stream.job, ?grace, "the job's client stream is gone; the job runs on until it reattaches or the grace ends");
    }

    /// Cancels what is left of each job whose client has been gone longer than the grace.
    pub(super) fn expire_detached_jobs(&mut self, now: Instant) {
        let grace = self.config.detach_grace;
        let expired: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, job)| {
                job.detached_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= grace)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for job_id in expired {
            let job = self.jobs.get_mut(&job_id).expect("listed above");
            // A job that finished meanwhile keeps how its tasks ended: its client may
            // still resume it; only the outputs held for it go.
            job.detached_since = None;
            job.clear_held();
            let why = format!(
                "client disconnected and did not reattach within {grace:?} (--detach-grace-ms)"
            );
            self.cancel_job_tasks(&job_id, &why);
        }
    }

    /// Forgets a task's record (it reached Done).
    fn remove_task(&mut self, task_id: TaskId) -> Option<TaskRecord> {
        let task = self.tasks.remove(&task_id)?;
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.status.items_running = job.status.items_running.saturating_sub(task.items_running);
            if job.live.get(&task.seq) == Some(&task_id) {
                job.live.remove(&task.seq);
            }
        }
        Some(task)
    }

    /// The ready actor of the pool with the most free credit (the largest id among equals).
    fn freest_actor(&self, pool_name: &PoolName) -> Option<ActorId> {
        let (_, Reverse(id)) = self.pools.get(pool_name)?.dispatchable.first()?;
        Some(id.clone())
    }

    /// Puts the actor in its pool's `dispatchable` index, at its free credit, or takes it
    /// out. Called after every change to what decides it: the actor's state (in
    /// `change_actor`), its tasks in flight, inherited tasks, and its node draining.
    pub(super) fn refresh_dispatchable(&mut self, id: &ActorId) {
        let Some(actor) = self.actors.get(id) else {
            return;
        };
        let takes_tasks = actor.state == ActorState::Ready
            && actor.quarantine.is_none()
            && actor.crash.is_none()
            && !self.on_draining_node(actor.assignment.as_ref());
        let busy = actor.in_flight.len() + actor.inherited_in_flight as usize;
        let was = actor.dispatch_free;
        let Some(pool) = self.pools.get_mut(&actor.pool) else {
            self.actors.get_mut(id).expect("exists").dispatch_free = None;
            return;
        };
        let free = (pool.in_flight_per_actor as usize).saturating_sub(busy) as u32;
        let now = (takes_tasks && free > 0).then_some(free);
        if was == now {
            return;
        }
        if let Some(was) = was {
            pool.dispatchable
                .remove(&(Reverse(was), Reverse(id.clone())));
        }
        if let Some(now) = now {
            pool.dispatchable
                .insert((Reverse(now), Reverse(id.clone())));
        }
        self.actors.get_mut(id).expect("exists").dispatch_free = now;
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
    fn awaited_dispatch(
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
    fn task_never_reached_actor(&mut self, actor_id: &ActorId, task_id: TaskId, error: &str) {
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

    fn retry_or_fail(&mut self, task_id: TaskId, error: String, permanent: bool) {
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
        let queue_micros = task.started_at.map_or(0, |started| {
            started.duration_since(task.submitted_at).as_micros() as u64
        });
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
        match &result {
            Ok(_) => {
                job.status.items_done += u64::from(task.items);
                self.metrics.task_items(task.pool.as_str(), task.items);
                self.metrics
                    .task_ended(task.pool.as_str(), TaskOutcomeKind::Succeeded);
            }
            Err(error) => {
                self.metrics
                    .task_ended(task.pool.as_str(), TaskOutcomeKind::Failed);
                self.metrics.events.record(
                    "task",
                    task.job.as_str(),
                    format!("task {} of pool {} failed: {error}", task.seq, task.pool),
                );
            }
        }
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
            let message = pb::TaskResult {
                seq: task.seq,
                result: Some(result),
                attempts,
                actor_id: task
                    .last_actor
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                node_id,
                queue_micros,
                run_micros,
            };
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

    fn maybe_finish_job(&mut self, job_id: &JobId) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        if !job.input_closed || job.counts.outstanding() > 0 || !job.is_running() {
            return;
        }
        job.status.state = if job.counts.failed > 0 {
            pb::JobState::Failed
        } else {
            pb::JobState::Succeeded
        } as i32;
        job.status.finished_unix_ms = unix_ms_now();
        let results = job.results.take();
        if job.detached_since.is_none() {
            job.clear_held();
        }
        tracing::info!(job_id = %job_id, succeeded = job.counts.succeeded, failed = job.counts.failed, "job finished");
        self.store.write(StoreOp::PutJob(job.snapshot()));
        self.end_results_when_durable(results);
        self.remember_finished_job(job_id.clone());
    }

    /// Ends a job's result stream once the job's end is on disk: the client learns that
    /// its job finished (or was cancelled) when the stream ends, so only then. A failed
    /// write ends the stream with the error.
    fn end_results_when_durable(&self, results: Option<JobResults>) {
        let Some(results) = results else {
            return;
        };
        self.store.when_durable(move |written| {
            if let Err(error) = written {
                results.fail(SchedulerError::NotSaved(error).into());
            }
        });
    }

    /// Keeps the last `finished_job_history` finished jobs; older ones are forgotten, in
    /// memory and in the store.
    pub(super) fn remember_finished_job(&mut self, job_id: JobId) {
        self.finished_jobs.push_back(job_id);
        while self.finished_jobs.len() > self.config.finished_job_history {
            let Some(oldest) = self.finished_jobs.pop_front() else {
                break;
            };
            self.jobs.remove(&oldest);
            self.store.write(StoreOp::DeleteJob(oldest));
        }
    }

    /// Cancels every task of the job that has not finished; nothing else is disturbed.
    pub(super) fn cancel_job_tasks(&mut self, job_id: &JobId, why: &str) {
        let Some(job) = self.jobs.get_mut(job_id).filter(|j| j.is_running()) else {
            return;
        };
        job.status.state = pb::JobState::Cancelled as i32;
        job.status.finished_unix_ms = unix_ms_now();
        let results = job.results.take();
        job.clear_held();
        job.inherited_runs.clear();
        job.parked.clear();
        let pool = PoolName::new(job.status.pool.clone());
        let mine: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| &t.job == job_id)
            .map(|(id, _)| *id)
            .collect();
        for task_id in mine {
            self.change_task(task_id, TaskEvent::Cancel);
            match self.task_state(task_id).cloned() {
                Some(TaskState::Cancelling { actor, .. }) => {
                    let node = self.actors[&actor]
                        .assignment
                        .as_ref()
                        .map(|a| a.node.clone());
                    if let Some(node) = node.and_then(|n| self.nodes.get(&n)) {
                        node.send(pb::scheduler_message::Body::CancelTask(pb::CancelTask {
                            task_id: task_id.0,
                            actor_id: actor.to_string(),
                        }));
                    }
                }
                _ => {
                    self.remove_task(task_id);
                }
            }
        }
        if let Some(record) = self.pools.get_mut(&pool) {
            let tasks = &self.tasks;
            record.queue.retain(|t| tasks.contains_key(t));
            record.suspects.retain(|t| tasks.contains_key(t));
        }
        let snapshot = self.jobs[job_id].snapshot();
        self.store.write(StoreOp::PutJob(snapshot));
        self.end_results_when_durable(results);
        self.remember_finished_job(job_id.clone());
        tracing::info!(job_id = %job_id, reason = why, "job cancelled");
    }
}
