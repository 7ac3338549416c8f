//! Jobs: a client's stream opened, resumed after a reconnect or a restart, annotated, fed
//! tasks and closed; a job finished once its last task is done, cancelled, or expired when
//! its client stays away. What happens to each task once submitted is `tasks.rs`.

use std::collections::HashMap;

use resident_proto::{JobId, PoolName, TaskId, pb};
use tokio::time::Instant;

use super::records::{JobRecord, JobStream, TaskRecord};
use super::{Core, JobResults};
use crate::auth::Principal;
use crate::error::SchedulerError;
use crate::metrics::unix_ms_now;
use crate::state::{JobCounts, TaskEnd, TaskEvent, TaskLifecycle, TaskState};
use crate::store::StoreOp;

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
    pub(super) fn attached_job(&mut self, stream: &JobStream) -> Option<&mut JobRecord> {
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
            .map_err(|over| SchedulerError::InvalidArgument(over.to_string()))?;
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
    pub(super) fn resume_job(
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
        crate::auth::may_cancel(requester, &status.owner)?;
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
        crate::auth::may_annotate(requester, &owner)?;
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
        let seq = input.seq;
        let record =
            TaskRecord::submitted(stream.job.clone(), pool.clone(), input, lifecycle, charge);
        let empty = record.payload.is_empty();
        self.tasks.insert(task, record);
        if empty {
            self.fail_task(task, "invalid argument: task payload is empty".into());
            return;
        }
        if held.is_none() && self.awaits_inherited_run(&stream.job, seq) {
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

    pub(super) fn maybe_finish_job(&mut self, job_id: &JobId) {
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
    pub(super) fn end_results_when_durable(&self, results: Option<JobResults>) {
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
