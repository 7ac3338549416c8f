//! Task deadlines (`PoolSpec.task_timeout_ms`). A task that never returns (a hung kernel, a
//! deadlocked call) would otherwise hold its actor, and its GPU, forever, and a Draining
//! actor behind it would never stop. Once the task at the head of an actor's queue has run
//! past its pool's timeout, the task is taken back (retried, or failed after its pool's
//! `max_task_attempts`, saying it ran past the timeout) and the actor is stopped on its
//! node: started again elsewhere or there if it was working, gone (its GPU freed) if it was
//! draining. Other tasks it held go back to the queue untouched. The stop spends no
//! restart: the task's own attempts bound how often one input can do this.
//!
//! An actor runs its tasks one after another, so the task at the head of its queue started
//! running when it was dispatched or when the actor last answered, whichever is later; the
//! decision is the pure [`head_overdue`].

use std::time::Duration;

use resident_proto::{ActorId, TaskId, pb};
use tokio::time::Instant;

use super::Core;
use crate::state::{ActorEvent, ActorState};

/// How often deadlines are checked at most (the loop's tick may be slower).
pub const DEADLINE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Whether an actor's head task ran past `timeout` by `now`: it was dispatched at
/// `dispatched` and the actor last answered a task (or became ready) at `last_answer`.
pub fn head_overdue(
    dispatched: Instant,
    last_answer: Option<Instant>,
    timeout: Duration,
    now: Instant,
) -> bool {
    let running_since = last_answer.map_or(dispatched, |answered| answered.max(dispatched));
    now.saturating_duration_since(running_since) > timeout
}

/// The error a timed-out task's attempt ends with.
pub fn timed_out_error(timeout: Duration) -> String {
    format!(
        "it ran past the pool's task_timeout_ms ({} ms), so its actor was stopped; raise \
         task_timeout_ms if such inputs are simply slow, or look for an input that hangs the \
         model",
        timeout.as_millis()
    )
}

impl Core {
    /// Stops every actor whose head task ran past its pool's task timeout.
    pub(super) fn enforce_task_deadlines(&mut self, now: Instant) {
        let interval = DEADLINE_CHECK_INTERVAL.min(self.config.reconcile_interval);
        if now.saturating_duration_since(self.last_deadline_check) < interval {
            return;
        }
        self.last_deadline_check = now;
        let mut overdue: Vec<(ActorId, TaskId, Duration)> = Vec::new();
        for (id, actor) in &self.actors {
            let Some(timeout) = actor.task_timeout else {
                continue;
            };
            let head = actor
                .in_flight
                .iter()
                .filter_map(|task| Some((self.tasks.get(task)?.started_at?, *task)))
                .min();
            if let Some((dispatched, task)) = head
                && head_overdue(dispatched, actor.last_answer, timeout, now)
            {
                overdue.push((id.clone(), task, timeout));
            }
        }
        for (actor_id, task_id, timeout) in overdue {
            self.stop_hung_actor(&actor_id, task_id, timeout);
        }
    }

    fn stop_hung_actor(&mut self, actor_id: &ActorId, task_id: TaskId, timeout: Duration) {
        let why = timed_out_error(timeout);
        let actor = self.actors.get_mut(actor_id).expect("listed");
        actor.in_flight.remove(&task_id);
        let (pool, draining) = (actor.pool.clone(), actor.state == ActorState::Draining);
        tracing::warn!(actor_id = %actor_id, task_id = %task_id, pool = %pool, ?timeout, draining, "a task ran past its deadline; stopping its actor");
        self.metrics.events.record(
            "actor",
            pool.as_str(),
            format!("actor {actor_id}: a task {why}"),
        );
        self.time_out_task(task_id, why.clone());
        if draining {
            // Its pool asked it to stop after its tasks: the hung one was the last word.
            let left: Vec<TaskId> =
                std::mem::take(&mut self.actors.get_mut(actor_id).expect("listed").in_flight)
                    .into_iter()
                    .collect();
            for task in left {
                self.requeue_lost_task(task, &why);
            }
            self.finish_drain(actor_id);
        } else {
            let actor = &self.actors[actor_id];
            if let Some(node) = actor
                .assignment
                .as_ref()
                .and_then(|a| self.nodes.get(&a.node))
            {
                node.send(pb::scheduler_message::Body::StopActor(pb::StopActor {
                    actor_id: actor_id.to_string(),
                    incarnation: actor.incarnation,
                }));
            }
            self.lose_actor(actor_id, ActorEvent::TaskTimedOut, &why);
            self.replan_needed = true;
        }
        self.dispatch_pool(&pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn a_head_task_is_timed_from_its_dispatch_when_its_actor_was_idle() {
        let now = Instant::now();
        let dispatched = now - Duration::from_secs(11);
        let ready_long_before = Some(now - Duration::from_secs(100));
        assert!(head_overdue(dispatched, ready_long_before, TIMEOUT, now));
        assert!(head_overdue(dispatched, None, TIMEOUT, now));
        assert!(!head_overdue(
            now - Duration::from_secs(9),
            ready_long_before,
            TIMEOUT,
            now
        ));
    }

    #[test]
    fn a_task_queued_behind_another_is_timed_from_the_last_answer() {
        let now = Instant::now();
        // Dispatched with the one before it, 30 s ago; that one was answered 5 s ago.
        let dispatched = now - Duration::from_secs(30);
        let answered = Some(now - Duration::from_secs(5));
        assert!(!head_overdue(dispatched, answered, TIMEOUT, now));
        assert!(head_overdue(
            dispatched,
            answered,
            TIMEOUT,
            now + Duration::from_secs(6)
        ));
    }

    #[test]
    fn the_error_names_the_field_and_what_to_do() {
        let error = timed_out_error(Duration::from_millis(1500));
        assert!(error.contains("task_timeout_ms (1500 ms)"), "{error}");
        assert!(error.contains("raise task_timeout_ms"), "{error}");
    }
}
