//! Inputs that crash the model. When an actor panics on a task, the agent says so
//! (`TaskOutcome.crashed`) and the actor restarts with a fresh model; the task's other
//! companions in flight go back to the queue as usual. The task itself becomes a suspect:
//! it runs again once, alone, on an actor kept for it (no other task is sent there until
//! the suspect is answered), so a second crash can only be its own. A second crash fails
//! it for good, "this input crashes the model"; a success clears it. One actor per pool is
//! kept at a time, so a poison input costs the pool one actor's work while it is retried,
//! never the pool. Once proven, neither crash spends a restart: the first actor's is given
//! back.

use resident_proto::{ActorId, PoolName, TaskId};

use super::Core;
use super::records::{Crash, Quarantine};
use crate::state::{ActorState, TaskEvent};

/// How a task that crashed its actor twice fails.
pub use resident_proto::CRASHES_THE_MODEL;

impl Core {
    /// The task's actor crashed running it: the first time it waits to run alone, the
    /// second time it fails for good.
    pub(super) fn quarantine_or_fail(
        &mut self,
        actor_id: &ActorId,
        task_id: TaskId,
        error: String,
    ) {
        let task = self.tasks.get_mut(&task_id).expect("exists");
        task.crashes += 1;
        if task.crashes >= 2 {
            // Proven: the actor's death is the input's doing and costs it no restart, and
            // the first actor it killed gets its restart back, so a corpus with many poison
            // inputs never wears a pool out.
            if let Some(actor) = self.actors.get_mut(actor_id) {
                actor.crash = Some(Crash::OnPoison);
            }
            for first in std::mem::take(&mut task.first_crash_victims) {
                if let Some(actor) = self.actors.get_mut(&first)
                    && actor.state != ActorState::Dead
                {
                    actor.restarts.used = actor.restarts.used.saturating_sub(1);
                }
            }
            let error = format!(
                "{CRASHES_THE_MODEL}: it crashed {} actors, the last time running alone ({error})",
                task.crashes
            );
            self.change_task(task_id, TaskEvent::Fail { retry_at: None });
            self.finish_task(task_id, Err(error), 0);
            return;
        }
        task.last_error = error;
        task.first_crash_victims = vec![actor_id.clone()];
        let pool = task.pool.clone();
        tracing::warn!(task_id = %task_id, pool = %pool, "an actor crashed on this task; it runs again alone");
        if !self.change_task(task_id, TaskEvent::Lose) {
            return;
        }
        match self.pools.get_mut(&pool) {
            Some(record) => record.suspects.push_back(task_id),
            None => self.fail_task(task_id, format!("pool `{pool}` was deleted")),
        }
    }

    /// Sets or clears the actor's quarantine, keeping its pool's `kept_for_suspect` and
    /// `dispatchable` index in step.
    pub(super) fn set_quarantine(&mut self, actor_id: &ActorId, to: Option<Quarantine>) {
        let Some(actor) = self.actors.get_mut(actor_id) else {
            return;
        };
        if actor.quarantine == to {
            return;
        }
        actor.quarantine = to;
        if let Some(pool) = self.pools.get_mut(&actor.pool) {
            if to.is_some() {
                pool.kept_for_suspect = Some(actor_id.clone());
            } else if pool.kept_for_suspect.as_ref() == Some(actor_id) {
                pool.kept_for_suspect = None;
            }
        }
        self.refresh_dispatchable(actor_id);
    }

    /// Sends the pool's oldest suspect to an actor kept for it: the one already kept once
    /// its tasks in flight are done, else the ready actor with the fewest tasks in flight,
    /// which takes no new task from now on. A kept actor no suspect waits for any more
    /// (its suspect was cancelled) goes back to work.
    pub(super) fn dispatch_suspects(&mut self, pool_name: &PoolName) {
        let Some(pool) = self.pools.get(pool_name) else {
            return;
        };
        let kept = pool.kept_for_suspect.clone();
        let Some(&task_id) = pool.suspects.front() else {
            if let Some(kept) = kept
                && self.actors[&kept].quarantine == Some(Quarantine::Emptying)
            {
                self.set_quarantine(&kept, None);
            }
            return;
        };
        let kept = match kept {
            Some(id) if !self.can_keep(&id) => {
                self.set_quarantine(&id, None);
                None
            }
            kept => kept,
        };
        let actor_id = match kept {
            // Running a suspect already: one at a time.
            Some(id) if self.actors[&id].quarantine != Some(Quarantine::Emptying) => return,
            Some(id) => id,
            None => match self.actor_to_keep(pool_name) {
                Some(id) => {
                    self.set_quarantine(&id, Some(Quarantine::Emptying));
                    id
                }
                None => return,
            },
        };
        let actor = &self.actors[&actor_id];
        if !actor.in_flight.is_empty() || actor.inherited_in_flight > 0 {
            return;
        }
        self.pools
            .get_mut(pool_name)
            .expect("checked")
            .suspects
            .pop_front();
        if self.dispatch_to(task_id, &actor_id) {
            self.set_quarantine(&actor_id, Some(Quarantine::Running(task_id)));
        } else {
            // The suspect is gone (cancelled): try the next one.
            self.dispatch_suspects(pool_name);
        }
    }

    /// Whether the actor may run a suspect: ready, not stopping after a crash, on a node
    /// that is not draining.
    fn can_keep(&self, id: &ActorId) -> bool {
        let actor = &self.actors[id];
        actor.state == ActorState::Ready
            && actor.crash.is_none()
            && !self.on_draining_node(actor.assignment.as_ref())
    }

    /// The actor that may run a suspect with the fewest tasks in flight.
    fn actor_to_keep(&self, pool_name: &PoolName) -> Option<ActorId> {
        self.pools[pool_name]
            .actors
            .iter()
            .filter(|id| self.can_keep(id))
            .min_by_key(|id| {
                let actor = &self.actors[*id];
                (
                    actor.in_flight.len() + actor.inherited_in_flight as usize,
                    (*id).clone(),
                )
            })
            .cloned()
    }
}
