//! When an agent whose GPUs failed restarts itself. A failed CUDA context stays failed until
//! the process ends ([`super::GpuHealth`]), so a GPU taken out of service comes back only
//! with a new agent process: once the policy says so, the agent drains (no new tasks; those
//! in hand finish) and exits with an error, and its service manager (Kubernetes'
//! `restartPolicy`, systemd's `Restart=always` as `deploy/` sets them) starts it again.
//! The new process registers as a new generation of the same node, opens its GPUs afresh,
//! and the scheduler places actors there again. A GPU that is really broken (fallen off the
//! bus) cannot be opened by the new process: it is listed unavailable from the start,
//! which this policy never counts, so a dead GPU does not restart the agent in a loop.

use std::collections::{BTreeMap, BTreeSet};

/// When the agent restarts itself after GPUs fail under it (`--restart-after-gpu-failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum RestartAfterGpuFailure {
    /// Once every GPU it offered has failed: healthy GPUs keep their actors, and an agent
    /// left with none comes back whole.
    All,
    /// At the first failed GPU: the actors on its healthy GPUs are re-placed (elsewhere, or
    /// here once it is back), so the failed GPU is back within one restart.
    Any,
    /// Never: the agent runs on with what is left until someone restarts it. The default
    /// of an agent embedded in another process (`Cluster::local()`), which nothing restarts.
    #[default]
    Never,
}

impl RestartAfterGpuFailure {
    /// Whether an agent that offered `offered` GPUs at start, of which `failed` failed
    /// since, restarts now.
    pub fn restart_due<R>(self, offered: &BTreeSet<u32>, failed: &BTreeMap<u32, R>) -> bool {
        let failed_offered = || offered.iter().filter(|gpu| failed.contains_key(gpu));
        match self {
            Self::Never => false,
            Self::Any => failed_offered().next().is_some(),
            Self::All => !offered.is_empty() && failed_offered().count() == offered.len(),
        }
    }

    /// The flag's value, as the agent's error names it.
    pub fn as_flag(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Any => "any",
            Self::Never => "never",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RestartAfterGpuFailure::{self, All, Any, Never};
    use std::collections::{BTreeMap, BTreeSet};

    fn due(policy: RestartAfterGpuFailure, offered: &[u32], failed: &[u32]) -> bool {
        let offered: BTreeSet<u32> = offered.iter().copied().collect();
        let failed: BTreeMap<u32, ()> = failed.iter().map(|gpu| (*gpu, ())).collect();
        policy.restart_due(&offered, &failed)
    }

    #[test]
    fn each_policy_restarts_when_it_says() {
        // (policy, offered, failed, due)
        let cases: &[(RestartAfterGpuFailure, &[u32], &[u32], bool)] = &[
            (All, &[0, 1], &[], false),
            (All, &[0, 1], &[1], false),
            (All, &[0, 1], &[1, 0], true),
            (All, &[0], &[0], true),
            (Any, &[0, 1], &[], false),
            (Any, &[0, 1], &[1], true),
            (Never, &[0, 1], &[0, 1], false),
            // A CPU-only agent has nothing to restart for.
            (All, &[], &[], false),
            (Any, &[], &[], false),
            // A GPU it never offered (it could not be opened at start) does not count.
            (All, &[0], &[3], false),
            (Any, &[0], &[3], false),
        ];
        for &(policy, offered, failed, want) in cases {
            assert_eq!(
                due(policy, offered, failed),
                want,
                "{policy:?} offered {offered:?} failed {failed:?}"
            );
        }
    }
}
