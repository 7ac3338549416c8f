//! Nodes that die under their work. An orderly loss (drained, revoked, reconnected as
//! itself) blames nothing: the actors are placed again for free and their tasks requeued.
//! A sudden death (the session broke, heartbeats stopped, the agent came back as a new
//! process) may be the work's doing: a config whose load aborts the agent, an input that
//! makes the model allocate what no host has. Left alone, such a pool walks the fleet,
//! taking down every agent in turn (issue 48). So a sudden death is charged like a crash:
//!
//! - HD-1: each task the node was running counts one crash of its input, under the
//!   quarantine rule (`core/quarantine.rs`): it runs once more alone, and a second crash
//!   fails it as crashing the model.
//! - HD-2: each actor on the node spends a restart (`ActorEvent::HostDied`), so an actor
//!   whose load kills its hosts dies after `max_restarts`, and a pool with no actor left
//!   fails the tasks waiting for it (`Core::fail_pool_if_every_actor_died`).
//! - HD-3: a node that dies while running a suspect alone is the suspect's doing: the
//!   suspect fails, the other tasks there are requeued, and no actor spends a restart.
//! - HD-4: once an input is proven to crash the model, every restart its first host death
//!   charged is given back, so many poison inputs never wear a pool out.
//! - HD-5: a node taken for dead that comes back as itself with its actors loaded and the
//!   tasks in hand (a network cut) gets the restarts and the crashes back (`core/adopt.rs`).

use resident_proto::{NodeId, TaskId};

use super::Core;
use super::records::Quarantine;
use crate::state::ActorEvent;

/// How a node was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NodeLoss {
    /// It drained and left, its credential was revoked, or it reconnected as itself (its
    /// actors are adopted back at once): nothing it ran is to blame.
    Orderly,
    /// Its session broke, its heartbeats stopped, or it came back as a new process.
    Sudden,
}

/// Which of a lost actor's running tasks count a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TaskBlame {
    None,
    AllRunning,
    Only(TaskId),
}

impl TaskBlame {
    pub(super) fn covers(self, task: TaskId) -> bool {
        match self {
            TaskBlame::None => false,
            TaskBlame::AllRunning => true,
            TaskBlame::Only(only) => only == task,
        }
    }
}

impl Core {
    /// Every actor of a lost node goes back to be placed again; what the loss costs them
    /// and their tasks follows the rules above.
    pub(super) fn lose_node_actors(&mut self, node_id: &NodeId, why: &str, loss: NodeLoss) {
        let hosted = self.hosted_on(node_id);
        let suspect = hosted
            .iter()
            .find_map(|id| match self.actors[id].quarantine {
                Some(Quarantine::Running(task)) => Some(task),
                _ => None,
            });
        let (event, blame) = match (loss, suspect) {
            (NodeLoss::Orderly, _) => (ActorEvent::NodeLost, TaskBlame::None),
            // HD-3
            (NodeLoss::Sudden, Some(task)) => (ActorEvent::CrashedOnPoison, TaskBlame::Only(task)),
            // HD-1, HD-2
            (NodeLoss::Sudden, None) => (ActorEvent::HostDied, TaskBlame::AllRunning),
        };
        let mut first_crashes = Vec::new();
        for actor in &hosted {
            first_crashes.extend(self.lose_actor_blaming(actor, event, why, blame));
        }
        if event != ActorEvent::HostDied {
            return;
        }
        // HD-4: the whole host's restarts ride on each of its tasks' first crash.
        let charged: Vec<_> = hosted
            .iter()
            .filter(|id| self.actors[*id].restart_spent_on_host)
            .cloned()
            .collect();
        for task in first_crashes {
            if let Some(task) = self.tasks.get_mut(&task)
                && task.crashes == 1
            {
                task.first_crash_victims = charged.clone();
            }
        }
    }
}
