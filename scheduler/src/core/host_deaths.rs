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
//! - HD-6: a GPU whose CUDA context failed under its actors (`GpuFailed`: an Xid fault, an
//!   uncorrectable ECC error, a kernel's bad access) is a sudden death of that part of the
//!   host: the GPU leaves placement (listed as unavailable), and the actors placed on it are
//!   lost under HD-1 to HD-4, so a config or an input that breaks every GPU it runs on is
//!   stopped by the same bounds as one that kills its hosts.

use resident_proto::{ActorId, NodeId, TaskId, pb};

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
        self.lose_hosted_actors(&hosted, why, loss);
    }

    /// HD-6: the agent says GPU `failed.index` of `node_id` failed and stays failed. It is
    /// offered no more (listed as unavailable, with the agent's reason) and the actors placed
    /// on it are lost as a sudden death loses a node's. A GPU the node does not offer (one
    /// already failed) changes nothing.
    pub(super) fn gpu_failed(&mut self, node_id: &NodeId, mut failed: pb::UnavailableGpu) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        let Some(at) = node.gpus.iter().position(|g| g.index == failed.index) else {
            tracing::debug!(node_id = %node_id, gpu = failed.index, "a failure of a GPU the node does not offer is ignored");
            return;
        };
        shorten(
            &mut failed.reason,
            crate::policy::field_limits::MAX_GPU_REASON_BYTES,
        );
        node.gpus.remove(at);
        node.free_vram_at_refresh.remove(&failed.index);
        node.capacity.gpus.retain(|gpu| gpu.index != failed.index);
        let why = format!(
            "GPU {} of node {node_id} failed ({})",
            failed.index, failed.reason
        );
        tracing::warn!(node_id = %node_id, gpu = failed.index, reason = %failed.reason, "GPU failed: nothing more is placed on it");
        self.metrics
            .events
            .record("node", node_id.as_str(), why.clone());
        node.unavailable_gpus.push(failed.clone());
        self.node_capacities_changed();
        let on_gpu: Vec<ActorId> = self
            .hosted_here(node_id)
            .filter(|id| {
                self.actors[*id]
                    .assignment
                    .as_ref()
                    .is_some_and(|placed| placed.gpus.contains(&failed.index))
            })
            .cloned()
            .collect();
        self.lose_hosted_actors(&on_gpu, &why, NodeLoss::Sudden);
        self.replan_needed = true;
    }

    /// Loses `hosted`, actors of one host that went away under them, under HD-1 to HD-4.
    fn lose_hosted_actors(&mut self, hosted: &[ActorId], why: &str, loss: NodeLoss) {
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
        for actor in hosted {
            first_crashes.extend(self.lose_actor_blaming(actor, event, why, blame));
        }
        if event == ActorEvent::HostDied {
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
        // What the lost actors held is queued again: an idle actor elsewhere takes it now,
        // not at the next answer or submission (with every other actor idle, none comes).
        let pools: std::collections::BTreeSet<_> = hosted
            .iter()
            .map(|id| self.actors[id].pool.clone())
            .collect();
        for pool in &pools {
            self.dispatch_pool(pool);
        }
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn shorten(text: &mut String, max: usize) {
    if text.len() > max {
        let end = (0..=max)
            .rev()
            .find(|at| text.is_char_boundary(*at))
            .unwrap_or(0);
        text.truncate(end);
    }
}
