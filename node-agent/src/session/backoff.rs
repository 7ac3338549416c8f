//! Reconnect backoff: doubles from `min` to `max`, reset after a successful registration,
//! with jitter so a fleet that lost its scheduler does not come back in one instant.

use std::time::Duration;

use resident_proto::SeededRng;

/// How long an agent waits before it dials the scheduler again: doubling from `min` to
/// `max`, jittered.
#[derive(Clone, Debug)]
pub struct ReconnectBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
    /// Seeded per agent process, so agents spread out and tests stay deterministic.
    rng: SeededRng,
}

impl ReconnectBackoff {
    /// A backoff starting at `min`, jitter seeded with `seed`.
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Self {
            min,
            max,
            next: min,
            rng: SeededRng::new(seed),
        }
    }

    /// The next wait: uniformly between half the current step and the full step ("equal
    /// jitter"), so waits still grow but agents that failed together retry apart.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        step / 2 + step.mul_f64(self.rng.next_f64() / 2.0)
    }

    /// A random pause from zero to `max`, from the same per-agent stream.
    pub fn jitter(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.rng.next_f64())
    }

    /// Back to `min` (after a registration).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_jitters_and_resets() {
        let mut backoff =
            ReconnectBackoff::new(Duration::from_millis(100), Duration::from_millis(350), 7);
        let steps = [100, 200, 350, 350];
        for step in steps {
            let delay = backoff.next_delay().as_millis();
            assert!(
                (step / 2..=step).contains(&delay),
                "{delay} ms outside [{}, {step}]",
                step / 2
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn agents_that_failed_together_retry_apart() {
        let delays = |seed| {
            let mut backoff =
                ReconnectBackoff::new(Duration::from_millis(200), Duration::from_secs(10), seed);
            (0..6).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(delays(1), delays(1), "deterministic under a seed");
        let fleet: std::collections::BTreeSet<Vec<Duration>> = (0..50).map(delays).collect();
        assert_eq!(fleet.len(), 50, "no two agents share a schedule");
    }
}
