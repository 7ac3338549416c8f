//! Trial schedulers (pure): FIFO runs every trial to `max_epochs`; ASHA (asynchronous
//! successive halving) stops a trial at a rung unless its metric is in the top
//! `1 / reduction_factor` of the trials that reached that rung before it.
//!
//! Rungs are at `grace * rf^k` epochs below `max_epochs`. A decision depends only on the
//! order results arrive in, so a sweep replayed in the same order decides the same.

use std::collections::BTreeMap;

use super::config::{Mode, SchedulerConfig, TrialScheduler};

/// What happens to a trial after it reports at a rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It trains on.
    Continue,
    /// It stops here.
    Stop,
}

/// ASHA's rungs and the metrics trials reported at each (no rungs under FIFO).
#[derive(Clone, Debug)]
pub struct TrialSchedulerState {
    config: SchedulerConfig,
    mode: Mode,
    /// Metrics recorded at each rung (epoch), in arrival order.
    rungs: BTreeMap<u32, Vec<f64>>,
}

impl TrialSchedulerState {
    /// A scheduler with the rungs of `config` (from `grace_epochs`, times
    /// `reduction_factor`, below `max_epochs`) and no metrics yet.
    pub fn new(config: SchedulerConfig, mode: Mode) -> Self {
        let mut rungs = BTreeMap::new();
        if config.kind == TrialScheduler::Asha {
            let mut epoch = config.grace_epochs;
            while epoch < config.max_epochs {
                rungs.insert(epoch, Vec::new());
                epoch = epoch.saturating_mul(config.reduction_factor);
            }
        }
        Self {
            config,
            mode,
            rungs,
        }
    }

    /// The epochs at which trials are compared.
    pub fn rung_epochs(&self) -> Vec<u32> {
        self.rungs.keys().copied().collect()
    }

    /// A trial reports `metric` after `epoch` (1-based): keep training it or stop it here.
    pub fn on_result(&mut self, epoch: u32, metric: f64) -> Decision {
        if epoch >= self.config.max_epochs {
            return Decision::Stop;
        }
        let Some(recorded) = self.rungs.get_mut(&epoch) else {
            return Decision::Continue;
        };
        // Orient so that larger is better.
        let score = match self.mode {
            Mode::Max => metric,
            Mode::Min => -metric,
        };
        recorded.push(score);
        let rf = self.config.reduction_factor as usize;
        if recorded.len() < rf {
            return Decision::Continue;
        }
        let mut sorted = recorded.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let keep = (sorted.len() / rf).max(1);
        let cutoff = sorted[keep - 1];
        if score >= cutoff {
            Decision::Continue
        } else {
            Decision::Stop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asha(max: u32, grace: u32, rf: u32) -> TrialSchedulerState {
        let config = SchedulerConfig {
            kind: TrialScheduler::Asha,
            max_epochs: max,
            grace_epochs: grace,
            reduction_factor: rf,
            ..SchedulerConfig::default()
        };
        TrialSchedulerState::new(config, Mode::Max)
    }

    #[test]
    fn rungs_grow_geometrically() {
        assert_eq!(asha(20, 2, 2).rung_epochs(), vec![2, 4, 8, 16]);
        assert_eq!(asha(9, 1, 3).rung_epochs(), vec![1, 3]);
    }

    #[test]
    fn weak_trials_stop_at_the_first_rung_and_strong_ones_go_on() {
        let mut scheduler = asha(8, 2, 2);
        // Trials report at rung 2 in this order: 0.9, 0.5, 0.95, 0.2.
        let decisions: Vec<Decision> = [0.9, 0.5, 0.95, 0.2]
            .iter()
            .map(|m| scheduler.on_result(2, *m))
            .collect();
        assert_eq!(
            decisions,
            vec![
                Decision::Continue,
                Decision::Stop,
                Decision::Continue,
                Decision::Stop
            ]
        );
        // Epochs between rungs never stop a trial; max_epochs always does.
        assert_eq!(scheduler.on_result(3, 0.0), Decision::Continue);
        assert_eq!(scheduler.on_result(8, 1.0), Decision::Stop);
    }

    #[test]
    fn the_same_results_in_the_same_order_decide_the_same() {
        let results: Vec<(u32, f64)> = (0..40)
            .map(|i| {
                (
                    if i % 3 == 0 { 4 } else { 2 },
                    ((i * 37) % 17) as f64 / 17.0,
                )
            })
            .collect();
        let run = || {
            let mut scheduler = asha(16, 2, 2);
            results
                .iter()
                .map(|(e, m)| scheduler.on_result(*e, *m))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn fifo_never_stops_early_and_min_mode_prefers_small() {
        let mut fifo = TrialSchedulerState::new(SchedulerConfig::default(), Mode::Max);
        assert!((1..10).all(|e| fifo.on_result(e, 0.0) == Decision::Continue));
        let config = SchedulerConfig {
            kind: TrialScheduler::Asha,
            max_epochs: 8,
            grace_epochs: 1,
            reduction_factor: 2,
            ..SchedulerConfig::default()
        };
        let mut min = TrialSchedulerState::new(config, Mode::Min);
        assert_eq!(min.on_result(1, 0.1), Decision::Continue);
        assert_eq!(min.on_result(1, 0.9), Decision::Stop);
    }
}
