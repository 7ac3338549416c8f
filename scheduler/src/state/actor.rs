//! The actor state machine. [`transition`] is the only way an actor's state changes.
//!
//! ```text
//!              Placed                 Loaded
//!   Pending ───────────▶ Starting ───────────▶ Ready
//!     ▲  ▲                  │  │                 │ │
//!     │  └── Failed ────────┘  │                 │ │   (Failed, HostDied: restarts += 1,
//!     │      HostDied          │                 │ │    while restarts < max_restarts;
//!     │      (restart left)    │                 │ │    else Dead)
//!     └───── NodeLost ─────────┴─────────────────┘ │
//!                                                  │ Drain
//!   Pending ── Drain ──▶ Dead        Starting/Ready ──Drain──▶ Draining ──Drained/NodeLost──▶ Dead
//!   any live state ── Failed (no restart left) ──▶ Dead
//! ```
//! Dead is terminal. NodeLost does not count as a restart: a node that left in order (drained,
//! revoked, reconnected as itself) is not the actor's fault. HostDied does: the node died
//! suddenly (its session broke, its heartbeats stopped, it came back as a new process) while
//! the actor was placed there, and an actor whose load or task takes its host down would
//! otherwise be placed on node after node (issue 48); a host that comes back as itself with
//! the actor still loaded gets the restart back (`core/adopt.rs`).
//! Nor does CrashedOnPoison (Starting/Ready ──▶ Pending): the actor died running, alone, an
//! input that had crashed another actor before, so the input is to blame.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActorState {
    Pending,
    Starting,
    Ready,
    Draining,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActorEvent {
    /// Placement found it a node; the start command goes out.
    Placed,
    /// The agent reports the model loaded.
    Loaded,
    /// Load failed or the actor thread died.
    Failed,
    /// The node hosting it left in order: drained, revoked, or reconnected as itself.
    NodeLost,
    /// The node hosting it died suddenly (session broke, heartbeats stopped, a new
    /// generation): spends a restart.
    HostDied,
    /// It died running, alone, an input that crashed an actor before (`core/quarantine.rs`).
    CrashedOnPoison,
    /// A task ran past its pool's `task_timeout_ms` and the actor was stopped
    /// (`core/task_deadlines.rs`): spends no restart, as the task's own attempts bound how
    /// often that happens.
    TaskTimedOut,
    /// Scale-down or pool deletion asked it to stop after its in-flight tasks.
    Drain,
    /// Its last in-flight task finished while draining.
    Drained,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTransition {
    pub from: ActorState,
    pub event: ActorEvent,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "actor cannot take {:?} while {:?}",
            self.event, self.from
        )
    }
}

/// Restart bookkeeping that `transition` reads and updates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    pub used: u32,
    pub max: u32,
}

/// Applies `event` to an actor in `from`; the only place actor states change.
pub fn transition(
    from: ActorState,
    event: ActorEvent,
    restarts: &mut Restarts,
) -> Result<ActorState, InvalidTransition> {
    use ActorEvent as E;
    use ActorState as S;
    let to = match (from, event) {
        (S::Pending, E::Placed) => S::Starting,
        (S::Starting, E::Loaded) => S::Ready,
        (S::Starting | S::Ready, E::Failed | E::HostDied) => {
            if restarts.used < restarts.max {
                restarts.used += 1;
                S::Pending
            } else {
                S::Dead
            }
        }
        (S::Starting | S::Ready, E::NodeLost | E::CrashedOnPoison | E::TaskTimedOut) => S::Pending,
        (S::Pending, E::Drain) => S::Dead,
        (S::Starting | S::Ready, E::Drain) => S::Draining,
        (
            S::Draining,
            E::Drained
            | E::NodeLost
            | E::HostDied
            | E::Failed
            | E::CrashedOnPoison
            | E::TaskTimedOut,
        ) => S::Dead,
        _ => return Err(InvalidTransition { from, event }),
    };
    Ok(to)
}

impl ActorState {
    pub fn to_pb(self) -> resident_proto::pb::ActorState {
        use resident_proto::pb::ActorState as Pb;
        match self {
            ActorState::Pending => Pb::Pending,
            ActorState::Starting => Pb::Starting,
            ActorState::Ready => Pb::Ready,
            ActorState::Draining => Pb::Draining,
            ActorState::Dead => Pb::Dead,
        }
    }

    /// Holds (or is about to hold) resources on a node.
    pub fn is_placed(self) -> bool {
        matches!(
            self,
            ActorState::Starting | ActorState::Ready | ActorState::Draining
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path_and_drain() {
        let mut r = Restarts { used: 0, max: 3 };
        let s = transition(ActorState::Pending, ActorEvent::Placed, &mut r).unwrap();
        let s = transition(s, ActorEvent::Loaded, &mut r).unwrap();
        assert_eq!(s, ActorState::Ready);
        let s = transition(s, ActorEvent::Drain, &mut r).unwrap();
        assert_eq!(
            transition(s, ActorEvent::Drained, &mut r),
            Ok(ActorState::Dead)
        );
    }

    #[test]
    fn failures_use_up_restarts_then_die() {
        let mut r = Restarts { used: 0, max: 1 };
        assert_eq!(
            transition(ActorState::Starting, ActorEvent::Failed, &mut r),
            Ok(ActorState::Pending)
        );
        assert_eq!(r.used, 1);
        assert_eq!(
            transition(ActorState::Starting, ActorEvent::Failed, &mut r),
            Ok(ActorState::Dead)
        );
    }

    #[test]
    fn a_crash_on_a_proven_poison_input_is_not_a_restart() {
        let mut r = Restarts { used: 0, max: 0 };
        assert_eq!(
            transition(ActorState::Ready, ActorEvent::CrashedOnPoison, &mut r),
            Ok(ActorState::Pending)
        );
        assert_eq!(r.used, 0);
    }

    #[test]
    fn a_hung_task_restarts_its_actor_without_spending_a_restart_and_ends_a_draining_one() {
        let mut r = Restarts { used: 0, max: 0 };
        assert_eq!(
            transition(ActorState::Ready, ActorEvent::TaskTimedOut, &mut r),
            Ok(ActorState::Pending)
        );
        assert_eq!(r.used, 0);
        assert_eq!(
            transition(ActorState::Draining, ActorEvent::TaskTimedOut, &mut r),
            Ok(ActorState::Dead)
        );
    }

    #[test]
    fn node_loss_is_not_a_restart() {
        let mut r = Restarts { used: 0, max: 0 };
        assert_eq!(
            transition(ActorState::Ready, ActorEvent::NodeLost, &mut r),
            Ok(ActorState::Pending)
        );
        assert_eq!(r.used, 0);
    }

    #[test]
    fn a_sudden_host_death_spends_a_restart() {
        let mut r = Restarts { used: 0, max: 1 };
        assert_eq!(
            transition(ActorState::Starting, ActorEvent::HostDied, &mut r),
            Ok(ActorState::Pending)
        );
        assert_eq!(
            transition(ActorState::Ready, ActorEvent::HostDied, &mut r),
            Ok(ActorState::Dead)
        );
        assert_eq!(r.used, 1);
    }

    #[test]
    fn dead_is_terminal() {
        let mut r = Restarts::default();
        for event in [
            ActorEvent::Placed,
            ActorEvent::Loaded,
            ActorEvent::Drain,
            ActorEvent::NodeLost,
        ] {
            assert!(transition(ActorState::Dead, event, &mut r).is_err());
        }
        assert!(transition(ActorState::Pending, ActorEvent::Loaded, &mut r).is_err());
    }
}
