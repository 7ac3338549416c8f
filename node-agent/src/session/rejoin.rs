//! Rejoining fast after a cut. Registration is the expensive call (the inventory, the
//! scheduler's adoption work), so its attempts back off, up to `--reconnect-max-ms`. But a
//! backoff grown to its cap during a long cut would keep a node away for up to that long
//! after its link is back. So while the scheduler cannot be reached, the agent also asks
//! its health service (unauthenticated, one small RPC on a fresh connection) every
//! [`PROBE_INTERVAL`], and dials as soon as it answers SERVING, after a random pause of up
//! to [`REJOIN_JITTER_MAX`] so a fleet that sees its scheduler come back does not register
//! in one instant. A wait cut short this way is not cut short again until a registration
//! succeeds: a scheduler that answers probes but refuses sessions gets the full backoff.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often an agent that cannot reach its scheduler asks whether it is back.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The longest one probe may take (connect, TLS, the health RPC).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest random pause between a probe's answer and the dial.
pub const REJOIN_JITTER_MAX: Duration = Duration::from_secs(1);

/// How a wait between two attempts ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnded {
    /// The backoff delay passed.
    BackoffOver,
    /// A probe found the scheduler serving before that.
    SchedulerAnswered,
}

/// Waits up to `delay`, asking `probe` every [`PROBE_INTERVAL`] whether the scheduler is
/// back; once it is, waits `jitter` more (within `delay`) and ends.
pub async fn wait_probing<P, F>(delay: Duration, mut probe: P, jitter: Duration) -> WaitEnded
where
    P: FnMut() -> F,
    F: Future<Output = bool>,
{
    let deadline = Instant::now() + delay;
    loop {
        let next = Instant::now() + PROBE_INTERVAL;
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            return WaitEnded::BackoffOver;
        }
        tokio::time::sleep_until(next).await;
        if probe().await {
            let dial_at = (Instant::now() + jitter).min(deadline);
            tokio::time::sleep_until(dial_at).await;
            return WaitEnded::SchedulerAnswered;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A probe that answers from its `answer_from`-th call on, counting calls.
    fn probe_answering_from(
        answer_from: u32,
    ) -> (Arc<AtomicU32>, impl FnMut() -> std::future::Ready<bool>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let probe = move || {
            let call = counted.fetch_add(1, Ordering::SeqCst) + 1;
            std::future::ready(call >= answer_from)
        };
        (calls, probe)
    }

    #[tokio::test(start_paused = true)]
    async fn a_scheduler_back_mid_backoff_is_dialled_within_a_probe_and_the_jitter() {
        let (calls, probe) = probe_answering_from(7);
        let started = Instant::now();
        let jitter = Duration::from_millis(300);
        let ended = wait_probing(Duration::from_secs(10), probe, jitter).await;
        assert_eq!(ended, WaitEnded::SchedulerAnswered);
        assert_eq!(calls.load(Ordering::SeqCst), 7);
        assert_eq!(started.elapsed(), PROBE_INTERVAL * 7 + jitter);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_scheduler_is_probed_at_a_fixed_interval_until_the_backoff_ends() {
        let (calls, probe) = probe_answering_from(u32::MAX);
        let started = Instant::now();
        let ended = wait_probing(Duration::from_millis(2_200), probe, Duration::ZERO).await;
        assert_eq!(ended, WaitEnded::BackoffOver);
        assert_eq!(started.elapsed(), Duration::from_millis(2_200));
        assert_eq!(calls.load(Ordering::SeqCst), 4, "at 0.5, 1, 1.5 and 2 s");
    }

    #[tokio::test(start_paused = true)]
    async fn the_jitter_never_outlasts_the_backoff() {
        let (_, probe) = probe_answering_from(1);
        let started = Instant::now();
        let ended = wait_probing(Duration::from_millis(700), probe, Duration::from_secs(5)).await;
        assert_eq!(ended, WaitEnded::SchedulerAnswered);
        assert_eq!(started.elapsed(), Duration::from_millis(700));
    }
}
