//! The sweep's trial bookkeeping (pure): which trial segments to run next, and what ASHA
//! decides when a trial reaches a rung.
//!
//! A trial runs in segments that end at rung epochs (ASHA) or at its last epoch (FIFO); the
//! actor returns the metric after each epoch plus a checkpoint to continue from. Decisions
//! are fed to the trial scheduler in trial-id order at each rung (trial `i` waits at a rung
//! until every trial before it has reached that rung or ended), so a sweep decides the same
//! under a seed whatever order actors finish in. Trials start in id order, so the lowest
//! unfinished trial can always go on: no deadlock.

use std::collections::BTreeMap;

use super::asha::{Decision, TrialSchedulerState};
use super::config::{Mode, SchedulerConfig};
use super::search::Params;

/// Epochs `(start_epoch, end_epoch]` of one trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The trial.
    pub trial: usize,
    /// The epoch it starts after (0 for a fresh trial).
    pub start_epoch: u32,
    /// The epoch it ends at.
    pub end_epoch: u32,
}

/// Where a trial is.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// No segment sent yet.
    NotStarted,
    /// A segment is running.
    Running,
    /// Waiting for the ASHA decision at this rung.
    AtRung(u32),
    /// Promoted; waits for a free slot.
    Ready,
    /// It ended.
    Done {
        /// ASHA stopped it before its epoch cap.
        stopped_early: bool,
    },
    /// A segment failed (why).
    Failed(String),
}

/// One trial as the driver tracks it.
#[derive(Clone, Debug)]
pub struct TrialProgress {
    /// Its hyperparameters.
    pub params: Params,
    /// Metric after each epoch so far.
    pub metrics: Vec<f64>,
    /// Where it is.
    pub phase: Phase,
    /// Epochs this trial may train: `max_epochs`, or less when its `epochs` param says so.
    pub epoch_cap: u32,
}

impl TrialProgress {
    fn ended(&self) -> bool {
        matches!(self.phase, Phase::Done { .. } | Phase::Failed(_))
    }
}

/// Decides which trial segments run next: at most `max_running` at once, each trial
/// promoted or stopped at ASHA's rungs. Pure: the runner sends the segments and reports
/// their results.
pub struct SweepDriver {
    trials: Vec<TrialProgress>,
    rungs: Vec<u32>,
    scheduler: TrialSchedulerState,
    /// Per rung: the next trial (by id) whose result the scheduler has not seen.
    next_to_feed: BTreeMap<u32, usize>,
    max_running: usize,
    running: usize,
}

impl SweepDriver {
    /// A driver of `trials`, none started.
    pub fn new(
        trials: Vec<Params>,
        config: &SchedulerConfig,
        mode: Mode,
        max_running: usize,
    ) -> Self {
        let scheduler = TrialSchedulerState::new(config.clone(), mode);
        let rungs = scheduler.rung_epochs();
        let trials = trials
            .into_iter()
            .map(|params| {
                let cap = params
                    .get("epochs")
                    .and_then(serde_json::Value::as_u64)
                    .map_or(config.max_epochs, |e| {
                        (e as u32).clamp(1, config.max_epochs)
                    });
                TrialProgress {
                    params,
                    metrics: Vec::new(),
                    phase: Phase::NotStarted,
                    epoch_cap: cap,
                }
            })
            .collect();
        Self {
            trials,
            next_to_feed: rungs.iter().map(|r| (*r, 0)).collect(),
            rungs,
            scheduler,
            max_running: max_running.max(1),
            running: 0,
        }
    }

    /// Every trial, by id.
    pub fn trials(&self) -> &[TrialProgress] {
        &self.trials
    }

    /// Marks a trial finished in an earlier run (from `results.jsonl`).
    pub fn restore(&mut self, trial: usize, metrics: Vec<f64>, stopped_early: bool) {
        let progress = &mut self.trials[trial];
        progress.metrics = metrics;
        progress.phase = Phase::Done { stopped_early };
        self.decide();
    }

    /// Whether every trial ended.
    pub fn finished(&self) -> bool {
        self.trials.iter().all(TrialProgress::ended)
    }

    /// The segments to start now, filling free slots: promoted trials first (lowest id),
    /// then new trials in id order.
    pub fn next_segments(&mut self) -> Vec<Segment> {
        let mut out = Vec::new();
        while self.running < self.max_running {
            let next = self
                .trials
                .iter()
                .position(|t| t.phase == Phase::Ready)
                .or_else(|| {
                    self.trials
                        .iter()
                        .position(|t| t.phase == Phase::NotStarted)
                });
            let Some(trial) = next else { break };
            let progress = &mut self.trials[trial];
            let start = progress.metrics.len() as u32;
            let end = self
                .rungs
                .iter()
                .copied()
                .find(|r| *r > start)
                .unwrap_or(progress.epoch_cap)
                .min(progress.epoch_cap);
            progress.phase = Phase::Running;
            self.running += 1;
            out.push(Segment {
                trial,
                start_epoch: start,
                end_epoch: end,
            });
        }
        out
    }

    /// A segment finished with these per-epoch metrics. Returns the trials that ended
    /// because of it: this one when it reached its last epoch, and any that the rung
    /// decisions it unblocked stopped.
    pub fn on_segment_done(&mut self, trial: usize, metrics: &[f64]) -> Vec<usize> {
        self.running = self.running.saturating_sub(1);
        let progress = &mut self.trials[trial];
        progress.metrics.extend_from_slice(metrics);
        let epoch = progress.metrics.len() as u32;
        progress.phase = if epoch >= progress.epoch_cap {
            Phase::Done {
                stopped_early: false,
            }
        } else if self.rungs.contains(&epoch) {
            Phase::AtRung(epoch)
        } else {
            Phase::Ready
        };
        let mut ended = self.decide();
        if self.trials[trial].ended() && !ended.contains(&trial) {
            ended.push(trial);
        }
        ended
    }

    /// A segment failed for good (its task ran out of retries). Returns the trials that
    /// ended, as [`SweepDriver::on_segment_done`] does.
    pub fn on_segment_failed(&mut self, trial: usize, error: String) -> Vec<usize> {
        self.running = self.running.saturating_sub(1);
        self.trials[trial].phase = Phase::Failed(error);
        let mut ended = self.decide();
        ended.push(trial);
        ended
    }

    /// Feeds rung results to the scheduler in trial-id order, as far as they are known;
    /// returns the trials it stopped.
    fn decide(&mut self) -> Vec<usize> {
        let mut stopped = Vec::new();
        for &rung in &self.rungs {
            let next = self.next_to_feed.get_mut(&rung).expect("every rung");
            while let Some(progress) = self.trials.get_mut(*next) {
                let reached = progress.metrics.len() as u32 >= rung;
                match &progress.phase {
                    Phase::AtRung(at) if *at == rung => {
                        let metric = progress.metrics[rung as usize - 1];
                        progress.phase = match self.scheduler.on_result(rung, metric) {
                            Decision::Continue => Phase::Ready,
                            Decision::Stop => {
                                stopped.push(*next);
                                Phase::Done {
                                    stopped_early: true,
                                }
                            }
                        };
                    }
                    // Restored trials that passed the rung: their result still counts.
                    Phase::Done { .. } if reached => {
                        self.scheduler
                            .on_result(rung, progress.metrics[rung as usize - 1]);
                    }
                    // Ended before the rung: nothing to feed.
                    Phase::Done { .. } | Phase::Failed(_) => {}
                    _ => break,
                }
                *next += 1;
            }
        }
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::config::TrialScheduler;
    use resident_proto::SeededRng;
    use serde_json::json;

    fn params(count: usize) -> Vec<Params> {
        (0..count)
            .map(|i| Params::from([("quality".to_owned(), json!(i))]))
            .collect()
    }

    fn asha() -> SchedulerConfig {
        SchedulerConfig {
            kind: TrialScheduler::Asha,
            max_epochs: 8,
            grace_epochs: 1,
            reduction_factor: 2,
        }
    }

    /// Metric of trial `t` after `epoch`: trial quality is a fixed shuffle of ids.
    fn metric(trial: usize, epoch: u32) -> f64 {
        let quality = (trial * 7 % 16) as f64 / 16.0;
        quality * (1.0 - 0.5f64.powi(epoch as i32))
    }

    /// Runs a whole sweep, finishing running segments in an order drawn from `seed`.
    fn simulate(config: &SchedulerConfig, slots: usize, seed: u64) -> Vec<(usize, bool)> {
        let mut driver = SweepDriver::new(params(16), config, Mode::Max, slots);
        let mut rng = SeededRng::new(seed);
        let mut running: Vec<Segment> = Vec::new();
        let mut ended = Vec::new();
        while !driver.finished() {
            running.extend(driver.next_segments());
            assert!(!running.is_empty(), "stalled");
            let done = running.remove(rng.below(running.len() as u64) as usize);
            let metrics: Vec<f64> = (done.start_epoch + 1..=done.end_epoch)
                .map(|e| metric(done.trial, e))
                .collect();
            ended.extend(driver.on_segment_done(done.trial, &metrics));
        }
        ended.sort();
        assert_eq!(ended, (0..16).collect::<Vec<_>>(), "each trial ends once");
        driver
            .trials()
            .iter()
            .map(|t| {
                let early = matches!(
                    t.phase,
                    Phase::Done {
                        stopped_early: true
                    }
                );
                (t.metrics.len(), early)
            })
            .collect()
    }

    #[test]
    fn asha_decides_the_same_whatever_order_segments_finish_in() {
        let first = simulate(&asha(), 4, 1);
        for seed in 2..20 {
            assert_eq!(simulate(&asha(), 4, seed), first, "seed {seed}");
        }
        assert_eq!(simulate(&asha(), 1, 0), first, "one slot");
        let stopped = first.iter().filter(|(_, early)| *early).count();
        assert!(stopped >= 8, "most trials stop early: {first:?}");
        let full = first.iter().filter(|(epochs, _)| *epochs == 8).count();
        assert!((1..=6).contains(&full), "{first:?}");
        // The best trial (quality 15/16 is trial 9) trains to the end.
        assert_eq!(first[9], (8, false));
    }

    #[test]
    fn fifo_runs_every_trial_to_the_end_in_one_segment() {
        let fifo = SchedulerConfig {
            kind: TrialScheduler::Fifo,
            ..asha()
        };
        let mut driver = SweepDriver::new(params(3), &fifo, Mode::Max, 2);
        let first = driver.next_segments();
        assert_eq!(
            first,
            vec![
                Segment {
                    trial: 0,
                    start_epoch: 0,
                    end_epoch: 8
                },
                Segment {
                    trial: 1,
                    start_epoch: 0,
                    end_epoch: 8
                }
            ]
        );
        assert!(driver.next_segments().is_empty(), "two slots");
        assert_eq!(driver.on_segment_failed(1, "boom".into()), vec![1]);
        assert_eq!(driver.next_segments()[0].trial, 2);
        assert!(simulate(&fifo, 3, 5).iter().all(|t| *t == (8, false)));
    }

    #[test]
    fn an_epochs_param_caps_a_trial_and_restored_trials_count() {
        let mut with_cap = params(2);
        with_cap[1].insert("epochs".into(), json!(3));
        let mut driver = SweepDriver::new(with_cap, &asha(), Mode::Max, 2);
        driver.restore(0, (1..=8).map(|e| metric(9, e)).collect(), false);
        let segments = driver.next_segments();
        assert_eq!(
            segments,
            vec![Segment {
                trial: 1,
                start_epoch: 0,
                end_epoch: 1
            }]
        );
        assert_eq!(driver.on_segment_done(1, &[0.0]), vec![1]);
        // Trial 1 is far below the restored trial at rung 1: stopped there.
        assert_eq!(
            driver.trials()[1].phase,
            Phase::Done {
                stopped_early: true
            }
        );
        assert!(driver.finished());
    }
}
