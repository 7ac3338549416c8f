//! Read-only views for the client API, and restoring saved state at start.

use resident_proto::{ActorId, JobId, NodeId, PoolName, pb};
use tokio::time::Instant;

use super::Core;
use super::finished::FinishedSeqs;
use super::pools::{no_pool, validate_pool_spec};
use super::records::{JobRecord, PoolUsage};
use crate::error::SchedulerError;
use crate::state::{ActorState, JobCounts, TaskEnd};
use crate::store::{DurableStore, StoreOp};

/// Finished jobs the overview carries (the newest), besides every running one.
const OVERVIEW_FINISHED_JOBS: usize = 20;

/// One consistent read of the cluster for the dashboard and `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Overview {
    /// Every node known, alive or not.
    pub nodes: Vec<pb::NodeInfo>,
    /// Every pool's status.
    pub pools: Vec<pb::PoolStatus>,
    /// Running jobs, then the newest finished ones.
    pub jobs: Vec<pb::JobStatus>,
    /// Jobs by state, counting every job held (not just those listed).
    pub jobs_by_state: std::collections::BTreeMap<pb::JobState, u64>,
    /// The demand (autoscaling signal and its parts).
    pub demand: super::Demand,
}

impl Core {
    pub(super) fn overview(&self) -> Overview {
        let mut jobs_by_state = std::collections::BTreeMap::new();
        for job in self.jobs.values() {
            let state = pb::JobState::try_from(job.status.state).unwrap_or_default();
            *jobs_by_state.entry(state).or_insert(0) += 1;
        }
        let mut jobs: Vec<pb::JobStatus> = self
            .jobs
            .values()
            .filter(|j| j.is_running())
            .map(JobRecord::snapshot)
            .collect();
        jobs.sort_by_key(|j| std::cmp::Reverse(j.started_unix_ms));
        jobs.extend(
            self.finished_jobs
                .iter()
                .rev()
                .filter_map(|id| self.jobs.get(id))
                .filter(|j| !j.is_running())
                .take(OVERVIEW_FINISHED_JOBS)
                .map(JobRecord::snapshot),
        );
        Overview {
            nodes: self.node_infos(),
            pools: self.pool_statuses(false),
            jobs,
            jobs_by_state,
            demand: self.demand(&Default::default()),
        }
    }

    /// Every node, by id.
    pub(super) fn node_infos(&self) -> Vec<pb::NodeInfo> {
        let now = Instant::now();
        let mut nodes: Vec<_> = self.nodes.iter().collect();
        nodes.sort_unstable_by_key(|(id, _)| *id);
        nodes
            .into_iter()
            .map(|(id, node)| pb::NodeInfo {
                node_id: id.to_string(),
                generation: node.generation.clone(),
                hostname: node.hostname.clone(),
                alive: node.alive,
                labels: node.labels.clone().into_iter().collect(),
                gpus: node.gpus.clone(),
                cpu_cores: node.cpu_cores,
                ram_bytes: node.ram_bytes,
                last_heartbeat_ms_ago: now
                    .saturating_duration_since(node.last_heard.at())
                    .as_millis() as u64,
                credential: node.credential.clone(),
                draining: node.draining,
                unavailable_gpus: node.unavailable_gpus.clone(),
            })
            .collect()
    }

    fn actor_info(&self, id: &ActorId) -> pb::ActorInfo {
        let actor = &self.actors[id];
        let assignment = actor.assignment.as_ref();
        let error = if actor.state == ActorState::Pending && !actor.unplaced_reason.is_empty() {
            actor.unplaced_reason.clone()
        } else {
            actor.error.clone()
        };
        pb::ActorInfo {
            actor_id: id.to_string(),
            pool: actor.pool.to_string(),
            node_id: assignment.map(|a| a.node.to_string()).unwrap_or_default(),
            gpu_indices: assignment.map(|a| a.gpus.clone()).unwrap_or_default(),
            state: actor.state.to_pb() as i32,
            model_loads: actor.model_loads,
            restarts: actor.restarts.used,
            vram_bytes: actor.vram_bytes,
            in_flight: actor.in_flight.len() as u32,
            tasks_done: actor.tasks_done,
            error,
            gpu_fraction: assignment.map_or(0.0, |a| a.share_per_gpu.as_gpus()),
        }
    }

    /// Every actor (of `pool`), by id.
    pub(super) fn actor_infos(&self, pool: Option<&PoolName>) -> Vec<pb::ActorInfo> {
        let mut ids: Vec<&ActorId> = self
            .actors
            .iter()
            .filter(|(_, a)| pool.is_none_or(|p| &a.pool == p))
            .map(|(id, _)| id)
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|id| self.actor_info(id)).collect()
    }

    pub(super) fn pool_status(&self, pool: &PoolName) -> Result<pb::PoolStatus, SchedulerError> {
        self.pool_status_with(pool, true)
    }

    /// The pool's status, with or without the list of its actors.
    fn pool_status_with(
        &self,
        pool: &PoolName,
        with_actors: bool,
    ) -> Result<pb::PoolStatus, SchedulerError> {
        let record = self.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        let actors: Vec<pb::ActorInfo> = match with_actors {
            true => record.actors.iter().map(|id| self.actor_info(id)).collect(),
            false => Vec::new(),
        };
        let ready = record
            .actors
            .iter()
            .filter(|id| self.actors[*id].state == ActorState::Ready)
            .count() as u32;
        let unplaced_reason = record
            .actors
            .iter()
            .map(|id| &self.actors[id])
            .find(|a| a.state == ActorState::Pending && !a.unplaced_reason.is_empty())
            .map(|a| a.unplaced_reason.clone())
            .unwrap_or_default();
        Ok(pb::PoolStatus {
            spec: Some(record.spec.clone()),
            ready_actors: ready,
            actors,
            unplaced_reason,
            usage: record.usage.until(Instant::now()),
            usage_since_unix_ms: record.usage.since_unix_ms,
        })
    }

    /// Every pool, by name (without their actors with `omit_actors`).
    pub(super) fn pool_statuses(&self, omit_actors: bool) -> Vec<pb::PoolStatus> {
        let mut names: Vec<&PoolName> = self.pools.keys().collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names
            .into_iter()
            .filter_map(|name| self.pool_status_with(name, !omit_actors).ok())
            .collect()
    }

    /// Every job held (running ones and the recent finished ones), by id.
    pub(super) fn job_statuses(&self) -> Vec<pb::JobStatus> {
        let mut jobs: Vec<pb::JobStatus> = self.jobs.values().map(JobRecord::snapshot).collect();
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        jobs
    }

    pub(super) fn job_status(&self, job: &JobId) -> Result<pb::JobStatus, SchedulerError> {
        self.jobs
            .get(job)
            .map(JobRecord::snapshot)
            .ok_or_else(|| SchedulerError::NotFound(format!("no job with id `{job}`")))
    }

    /// Brings back pools and jobs saved by an earlier scheduler process.
    pub(super) fn restore(&mut self, store: &dyn DurableStore) -> Result<(), SchedulerError> {
        for spec in store.load_pools()? {
            match validate_pool_spec(&spec) {
                Ok(request) => self.add_pool(spec, request),
                Err(error) => tracing::error!(pool = %spec.name, %error, "skipping saved pool"),
            }
        }
        // Finished jobs enter the history oldest first; interrupted ones are not finished
        // (their clients may resume them) and no history trims them.
        let mut finished_history: Vec<(u64, JobId)> = Vec::new();
        for mut status in store.load_jobs()? {
            let job = JobId::new(status.job_id.clone());
            let interrupted = [pb::JobState::Running, pb::JobState::Interrupted]
                .map(|state| state as i32)
                .contains(&status.state);
            let finished = match interrupted {
                true => self.recount_interrupted(store, &job, &mut status)?,
                false => FinishedSeqs::default(),
            };
            let counts = JobCounts::from_status(&status);
            let record = JobRecord {
                counts,
                status,
                attachment: 0,
                live: Default::default(),
                finished,
                held: Default::default(),
                held_bytes: 0,
                inherited_runs: Default::default(),
                method: String::new(),
                results: None,
                input_closed: true,
                persisted: counts,
                detached_since: None,
                parked: Default::default(),
            };
            if !interrupted {
                finished_history.push((record.status.finished_unix_ms, job.clone()));
            }
            self.jobs.insert(job, record);
        }
        finished_history.sort();
        for (_, job) in finished_history {
            self.remember_finished_job(job);
        }
        // A deleted pool's usage went with it; one of a pool skipped above stays for a
        // scheduler that can read its spec.
        for saved in store.load_pool_usage()? {
            if let Some(record) = self.pools.get_mut(&PoolName::new(saved.pool.clone())) {
                record.usage = PoolUsage::restored(saved, Instant::now());
            }
        }
        for (actor, placed) in store.load_placements()? {
            let pool = PoolName::new(placed.pool);
            if self.pools.contains_key(&pool) {
                self.restore_placement(actor, pool, NodeId::new(placed.node));
            } else {
                self.store.write(StoreOp::DeletePlacement(actor));
            }
        }
        let known: std::collections::BTreeSet<NodeId> = store.load_nodes()?.into_iter().collect();
        if !known.is_empty() && !self.pools.is_empty() {
            tracing::info!(nodes = known.len(), window = ?self.config.settle_window, "waiting for the nodes known before the restart");
            self.settle = Some(super::model::Settle {
                until: Instant::now() + self.config.settle_window,
                awaited: known,
            });
        }
        Ok(())
    }

    /// An interrupted job's finished tasks, by sequence number. Every finished task's
    /// outcome was written as it finished; the counters only up to a second before the
    /// stop. So the done counts are recounted from the outcomes, exactly, and the outcomes
    /// kept by sequence number, so that a resumed client's tasks are counted once
    /// (`TaskLifecycle::resubmitted`). A job still marked running becomes interrupted.
    fn recount_interrupted(
        &mut self,
        store: &dyn DurableStore,
        job: &JobId,
        status: &mut pb::JobStatus,
    ) -> Result<FinishedSeqs, SchedulerError> {
        let outcomes = store.outcomes(job)?;
        let succeeded = outcomes.iter().filter(|(_, o)| o.ok).count() as u64;
        status.items_done = outcomes
            .iter()
            .filter(|(_, o)| o.ok)
            .map(|(_, o)| u64::from(o.items.max(1)))
            .sum();
        let failed = outcomes.len() as u64 - succeeded;
        if status.state == pb::JobState::Running as i32 {
            status.state = pb::JobState::Interrupted as i32;
            status.succeeded = succeeded;
            status.failed = failed;
            status.queued = 0;
            status.running = 0;
            status.submitted = status.submitted.max(succeeded + failed + status.cancelled);
            self.store.write(StoreOp::PutJob(status.clone()));
        }
        Ok(outcomes
            .into_iter()
            .map(|(seq, outcome)| (seq, TaskEnd::of_outcome(outcome.ok)))
            .collect())
    }
}
