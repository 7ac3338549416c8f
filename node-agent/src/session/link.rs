//! The agent's link to its scheduler as one explicit state, changed only by
//! [`Link::apply`]: starting (no session yet), connecting (a session ended; since when, and
//! whether a health probe may still cut the next wait short, `rejoin.rs`), registered, or
//! draining until a deadline. Pure: no clock is read here, the caller passes the instants.

use tokio::time::Instant;

/// Where the link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// No session has been up yet.
    Starting,
    /// The last session ended at `away_since` and none is up. `may_cut_wait_short`: the
    /// next wait between attempts may end early on a health probe's answer (once per
    /// registration: a scheduler that answers probes but refuses sessions gets the full
    /// backoff).
    Connecting {
        away_since: Instant,
        may_cut_wait_short: bool,
    },
    /// Registered: tasks come and go.
    Registered,
    /// Shutting down with tasks in hand: no new tasks, and at `until` the rest are handed
    /// back.
    Draining { until: Instant },
}

/// What happens to the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// The scheduler answered the registration.
    Registered,
    /// The session ended (or an attempt failed) at this instant.
    Ended(Instant),
    /// A probe found the scheduler answering and cut the wait short.
    WaitCutShort,
    /// The agent was asked to stop while tasks were in hand: drain until then.
    DrainUntil(Instant),
}

impl Link {
    /// The one transition function. Events that do not apply to a state leave it as it is
    /// (a drain asked before registration: there is nothing to drain).
    pub fn apply(self, event: LinkEvent) -> Link {
        match (self, event) {
            (Link::Starting | Link::Connecting { .. }, LinkEvent::Registered) => Link::Registered,
            // A session that was up (or the first attempt) starts the time away and earns
            // one early end of a wait.
            (Link::Starting | Link::Registered | Link::Draining { .. }, LinkEvent::Ended(at)) => {
                Link::Connecting {
                    away_since: at,
                    may_cut_wait_short: true,
                }
            }
            (connecting @ Link::Connecting { .. }, LinkEvent::Ended(_)) => connecting,
            (Link::Connecting { away_since, .. }, LinkEvent::WaitCutShort) => Link::Connecting {
                away_since,
                may_cut_wait_short: false,
            },
            (Link::Registered, LinkEvent::DrainUntil(until)) => Link::Draining { until },
            (state, _) => state,
        }
    }

    /// Whether new tasks and actors are refused (a drain is under way).
    pub fn draining(&self) -> Option<Instant> {
        match self {
            Link::Draining { until } => Some(*until),
            _ => None,
        }
    }

    /// Since when no session has been up (`None` while one is).
    pub fn away_since(&self) -> Option<Instant> {
        match self {
            Link::Connecting { away_since, .. } => Some(*away_since),
            _ => None,
        }
    }

    /// Whether the next wait may end early on a probe's answer.
    pub fn may_cut_wait_short(&self) -> bool {
        matches!(
            self,
            Link::Connecting {
                may_cut_wait_short: true,
                ..
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_session_that_ends_starts_the_time_away_once() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        let link = Link::Starting.apply(LinkEvent::Ended(t0));
        assert_eq!(link.away_since(), Some(t0));
        assert!(link.may_cut_wait_short());
        // Failed attempts while away keep the first instant.
        let link = link.apply(LinkEvent::Ended(t1));
        assert_eq!(link.away_since(), Some(t0));
        let link = link.apply(LinkEvent::Registered);
        assert_eq!(link, Link::Registered);
        assert_eq!(link.away_since(), None);
        assert_eq!(link.apply(LinkEvent::Ended(t1)).away_since(), Some(t1));
    }

    #[test]
    fn a_probe_cuts_a_wait_short_once_per_registration() {
        let t0 = Instant::now();
        let link = Link::Registered
            .apply(LinkEvent::Ended(t0))
            .apply(LinkEvent::WaitCutShort);
        assert!(!link.may_cut_wait_short());
        // Still away: another failed attempt does not earn another early end.
        let link = link.apply(LinkEvent::Ended(t0 + Duration::from_secs(1)));
        assert!(!link.may_cut_wait_short());
        // A registration does.
        let link = link
            .apply(LinkEvent::Registered)
            .apply(LinkEvent::Ended(t0 + Duration::from_secs(2)));
        assert!(link.may_cut_wait_short());
    }

    #[test]
    fn only_a_registered_link_drains_and_a_drain_ends_with_the_session() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(30);
        assert_eq!(
            Link::Starting.apply(LinkEvent::DrainUntil(until)),
            Link::Starting
        );
        let draining = Link::Registered.apply(LinkEvent::DrainUntil(until));
        assert_eq!(draining.draining(), Some(until));
        // A second signal does not move the deadline.
        let later = until + Duration::from_secs(30);
        assert_eq!(
            draining.apply(LinkEvent::DrainUntil(later)).draining(),
            Some(until)
        );
        let ended = draining.apply(LinkEvent::Ended(t0));
        assert_eq!(ended.draining(), None);
        assert_eq!(ended.away_since(), Some(t0));
    }
}
