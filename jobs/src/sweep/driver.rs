//! The sweep's trial bookkeeping (pure): which trial segments to run next, what ASHA
//! decides when a trial reaches a rung, and PBT's rounds.
//!
//! A trial runs in segments that end at rung epochs (ASHA) or at its last epoch (FIFO); the
//! actor returns the metric after each epoch plus a checkpoint to continue from. Decisions
//! are fed to the trial scheduler in trial-id order at each rung (trial `i` waits at a rung
//! until every trial before it has reached that rung or ended), so a sweep decides the same
//! under a seed whatever order actors finish in. Trials start in id order, so the lowest
//! unfinished trial can always go on: no deadlock.
//!
//! Under PBT the rungs are every `perturbation_interval` epochs and wait for the whole
//! population: when every trial still training stands at the rung, the round decides which
//! copy which ([`super::pbt::round`]) and all train on. The runner copies the checkpoints
//! ([`SweepDriver::take_rounds`]) before it sends another segment.

use std::collections::BTreeMap;

use super::asha::{Decision, TrialSchedulerState};
use super::config::{Mode, ParamSpec, SchedulerConfig, SearchAlgorithm, SweepConfig};
use super::pbt::{self, Exploit, PbtSettings, Perturbation};
use super::search::{Params, generate_trials};
use super::tpe;

/// How the trials' hyperparameters are chosen: all before the sweep starts (grid, random),
/// or each as it starts, from what the trials before it came to (TPE).
pub enum TrialPlan {
    /// Every trial's hyperparameters, by id.
    Fixed(Vec<Params>),
    /// TPE's draws.
    Tpe(TpePlan),
}

/// TPE over a sweep's trials. Trial `i` learns from trials `0..i - lag` alone, each as it
/// stood at its first rung (ASHA) or its end (FIFO), and waits until they got there: so
/// what it draws depends on the seed and the metrics, never on which actor finished first,
/// and a rerun replays it. `lag` is the segments the sweep runs at once.
pub struct TpePlan {
    /// The hyperparameters and their ranges.
    pub space: BTreeMap<String, ParamSpec>,
    /// Which way the metric is better.
    pub mode: Mode,
    /// The sweep's seed.
    pub seed: u64,
    /// Random search's draws under the same seed: the startup trials take theirs, and so
    /// does a trial with nothing to learn from yet.
    pub random: Vec<Params>,
    /// Random trials before the model takes over.
    pub startup: usize,
    /// How many trials before it a trial does not wait for.
    pub lag: usize,
}

impl TrialPlan {
    /// The plan a sweep declares.
    pub fn of(config: &SweepConfig) -> Self {
        let trials = generate_trials(
            &config.space,
            config.search.algorithm,
            config.trials,
            config.seed,
        );
        match config.search.algorithm {
            SearchAlgorithm::Grid | SearchAlgorithm::Random => Self::Fixed(trials),
            SearchAlgorithm::Tpe => Self::Tpe(TpePlan {
                space: config.space.clone(),
                mode: config.mode,
                seed: config.seed,
                random: trials,
                startup: config.search.tpe_startup_trials(config.trials) as usize,
                lag: (config.replicas * config.trials_per_actor) as usize,
            }),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Fixed(trials) => trials.len(),
            Self::Tpe(plan) => plan.random.len(),
        }
    }
}

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
    /// Its hyperparameters (empty until it starts, where TPE draws them then).
    pub params: Params,
    /// Metric after each epoch so far.
    pub metrics: Vec<f64>,
    /// Where it is.
    pub phase: Phase,
    /// Epochs this trial may train: `max_epochs`, or less when its `epochs` param says so.
    pub epoch_cap: u32,
    /// PBT: what it started with and each copy it made since (empty under other schedulers).
    pub schedule: Vec<Perturbation>,
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
    /// TPE's plan; `None` when every trial's hyperparameters were known from the start.
    tpe: Option<TpePlan>,
    max_epochs: u32,
    rungs: Vec<u32>,
    scheduler: TrialSchedulerState,
    /// Per rung: the next trial (by id) whose result the scheduler has not seen.
    next_to_feed: BTreeMap<u32, usize>,
    max_running: usize,
    running: usize,
    /// PBT's settings, under PBT.
    pbt: Option<PbtSettings>,
    /// PBT rounds decided and not yet taken by the runner.
    rounds: Vec<Round>,
}

/// A PBT round the driver decided: the runner copies each donor's checkpoint to its trial.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The epoch every trial still training stood at.
    pub epoch: u32,
    /// Who copied whom.
    pub exploits: Vec<Exploit>,
}

impl SweepDriver {
    /// A driver of the planned trials, none started.
    pub fn new(plan: TrialPlan, config: &SchedulerConfig, mode: Mode, max_running: usize) -> Self {
        let scheduler = TrialSchedulerState::new(config.clone(), mode);
        let rungs = scheduler.rung_epochs();
        let count = plan.len();
        let (fixed, tpe) = match plan {
            TrialPlan::Fixed(trials) => (trials, None),
            TrialPlan::Tpe(plan) => (vec![Params::new(); count], Some(plan)),
        };
        let trials = fixed
            .into_iter()
            .map(|params| TrialProgress {
                epoch_cap: epoch_cap(&params, config.max_epochs),
                params,
                metrics: Vec::new(),
                phase: Phase::NotStarted,
                schedule: Vec::new(),
            })
            .collect();
        Self {
            trials,
            tpe,
            max_epochs: config.max_epochs,
            next_to_feed: rungs.iter().map(|r| (*r, 0)).collect(),
            rungs,
            scheduler,
            max_running: max_running.max(1),
            running: 0,
            pbt: None,
            rounds: Vec::new(),
        }
    }

    /// The same driver running PBT rounds every `settings.interval` epochs; each trial's
    /// schedule starts with its hyperparameters.
    pub fn population_based(mut self, settings: PbtSettings) -> Self {
        self.rungs = (1..)
            .map(|k| k * settings.interval)
            .take_while(|epoch| *epoch < self.max_epochs)
            .collect();
        for trial in &mut self.trials {
            trial.schedule = vec![Perturbation {
                epoch: 0,
                cloned_from: None,
                params: trial.params.clone(),
            }];
        }
        self.pbt = Some(settings);
        self
    }

    /// Whether it runs PBT rounds.
    pub fn is_population_based(&self) -> bool {
        self.pbt.is_some()
    }

    /// The PBT rounds decided since the last call, in order.
    pub fn take_rounds(&mut self) -> Vec<Round> {
        std::mem::take(&mut self.rounds)
    }

    /// Every trial, by id.
    pub fn trials(&self) -> &[TrialProgress] {
        &self.trials
    }

    /// Whether an earlier run's result of `trial` with `params` belongs to this sweep: its
    /// hyperparameters are the ones planned (TPE's model-drawn trials cannot be checked
    /// before they start; the declaration check vouches for them).
    pub fn accepts_result(&self, trial: usize, params: &Params) -> bool {
        match (&self.tpe, self.trials.get(trial)) {
            (_, None) => false,
            // PBT's rounds change a trial's hyperparameters as it trains.
            (None, Some(_)) if self.pbt.is_some() => true,
            (None, Some(progress)) => &progress.params == params,
            (Some(plan), Some(_)) => trial >= plan.startup || &plan.random[trial] == params,
        }
    }

    /// Marks a trial finished in an earlier run (from `results.jsonl`).
    pub fn restore(
        &mut self,
        trial: usize,
        params: Params,
        metrics: Vec<f64>,
        stopped_early: bool,
    ) {
        let progress = &mut self.trials[trial];
        progress.epoch_cap = epoch_cap(&params, self.max_epochs);
        progress.params = params;
        progress.metrics = metrics;
        progress.phase = Phase::Done { stopped_early };
        self.decide();
    }

    /// Marks a trial that failed in an earlier run (PBT's population went on without it).
    pub fn restore_failed(&mut self, trial: usize, error: String) {
        self.trials[trial].phase = Phase::Failed(error);
        self.decide();
    }

    /// Puts a PBT trial where an earlier run's last round left it: past the round, ready to
    /// train on from its checkpoint with `params`.
    pub fn restore_member(
        &mut self,
        trial: usize,
        params: Params,
        metrics: Vec<f64>,
        schedule: Vec<Perturbation>,
    ) {
        let progress = &mut self.trials[trial];
        progress.params = params;
        progress.metrics = metrics;
        progress.schedule = schedule;
        progress.phase = Phase::Ready;
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
            if self.trials[trial].phase == Phase::NotStarted && !self.draw_params(trial) {
                break; // TPE waits for the trials it learns from
            }
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

    /// Gives a trial about to start its hyperparameters where TPE draws them; false while
    /// the trials it learns from are still short of their first rung.
    fn draw_params(&mut self, trial: usize) -> bool {
        let Some(plan) = &self.tpe else { return true };
        let learn_from = trial.saturating_sub(plan.lag);
        let params = if trial < plan.startup || learn_from == 0 {
            plan.random[trial].clone()
        } else {
            let mut seen = Vec::with_capacity(learn_from);
            for earlier in &self.trials[..learn_from] {
                match self.observation(earlier) {
                    None => return false,
                    Some(Some(metric)) => seen.push((&earlier.params, metric)),
                    Some(None) => {} // failed: nothing to learn
                }
            }
            if seen.is_empty() {
                plan.random[trial].clone()
            } else {
                tpe::suggest(&plan.space, &seen, plan.mode, plan.seed, trial)
            }
        };
        let progress = &mut self.trials[trial];
        progress.epoch_cap = epoch_cap(&params, self.max_epochs);
        progress.params = params;
        true
    }

    /// What TPE learns from a trial: its metric at its first rung (or its last epoch,
    /// where it has no rung), `Some(None)` if it failed first, `None` until it gets there.
    fn observation(&self, progress: &TrialProgress) -> Option<Option<f64>> {
        let epoch = self
            .rungs
            .first()
            .map_or(progress.epoch_cap, |rung| (*rung).min(progress.epoch_cap));
        match progress.metrics.get(epoch as usize - 1) {
            Some(metric) => Some(Some(*metric)),
            None if progress.ended() => Some(None),
            None => None,
        }
    }

    /// Feeds rung results to the scheduler in trial-id order, as far as they are known;
    /// returns the trials it stopped. Under PBT, runs the round every trial waits at.
    fn decide(&mut self) -> Vec<usize> {
        if self.pbt.is_some() {
            self.decide_round();
            return Vec::new();
        }
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

impl SweepDriver {
    /// PBT: when every trial still training stands at the same rung, runs that round: the
    /// copiers take their donors' hyperparameters (perturbed), and every one trains on.
    fn decide_round(&mut self) {
        let Some(settings) = &self.pbt else { return };
        let mut epoch = None;
        for trial in &self.trials {
            match trial.phase {
                Phase::AtRung(at) if epoch.is_none_or(|e| e == at) => epoch = Some(at),
                Phase::Done { .. } | Phase::Failed(_) => {}
                _ => return,
            }
        }
        let Some(epoch) = epoch else { return };
        let members: Vec<(usize, f64, &Params)> = self
            .trials
            .iter()
            .enumerate()
            .filter(|(_, t)| t.phase == Phase::AtRung(epoch))
            .map(|(id, t)| (id, t.metrics[epoch as usize - 1], &t.params))
            .collect();
        let exploits = pbt::round(settings, epoch, &members);
        for exploit in &exploits {
            let progress = &mut self.trials[exploit.trial];
            progress.params = exploit.params.clone();
            progress.schedule.push(Perturbation {
                epoch,
                cloned_from: Some(exploit.donor),
                params: exploit.params.clone(),
            });
        }
        for trial in &mut self.trials {
            if trial.phase == Phase::AtRung(epoch) {
                trial.phase = Phase::Ready;
            }
        }
        self.rounds.push(Round { epoch, exploits });
    }
}

/// Epochs a trial with `params` may train: `max_epochs`, or fewer where its `epochs` says.
fn epoch_cap(params: &Params, max_epochs: u32) -> u32 {
    params
        .get("epochs")
        .and_then(serde_json::Value::as_u64)
        .map_or(max_epochs, |e| (e as u32).clamp(1, max_epochs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::config::TrialScheduler;
    use crate::sweep::search::generate_trials;
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
            ..SchedulerConfig::default()
        }
    }

    /// Metric of trial `t` after `epoch`: trial quality is a fixed shuffle of ids.
    fn metric(trial: usize, epoch: u32) -> f64 {
        let quality = (trial * 7 % 16) as f64 / 16.0;
        quality * (1.0 - 0.5f64.powi(epoch as i32))
    }

    /// Runs a whole sweep, finishing running segments in an order drawn from `seed`.
    fn simulate(config: &SchedulerConfig, slots: usize, seed: u64) -> Vec<(usize, bool)> {
        let mut driver = SweepDriver::new(TrialPlan::Fixed(params(16)), config, Mode::Max, slots);
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
        let mut driver = SweepDriver::new(TrialPlan::Fixed(params(3)), &fifo, Mode::Max, 2);
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
        let mut driver = SweepDriver::new(TrialPlan::Fixed(with_cap), &asha(), Mode::Max, 2);
        driver.restore(
            0,
            params(1).remove(0),
            (1..=8).map(|e| metric(9, e)).collect(),
            false,
        );
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

    fn tpe_plan(trials: u32, startup: usize, lag: usize) -> TrialPlan {
        let space = BTreeMap::from([
            ("lr".to_owned(), ParamSpec::LogUniform([1e-4, 1e-1])),
            (
                "hidden".to_owned(),
                ParamSpec::Choice(vec![json!(0), json!(64), json!(256)]),
            ),
        ]);
        TrialPlan::Tpe(TpePlan {
            random: generate_trials(&space, SearchAlgorithm::Random, trials, 5),
            space,
            mode: Mode::Max,
            seed: 5,
            startup,
            lag,
        })
    }

    /// A trial's metric after `epoch`, from its hyperparameters: best at lr 1e-2, hidden 64.
    fn metric_of(params: &Params, epoch: u32) -> f64 {
        let lr = params["lr"].as_f64().unwrap();
        let hidden = if params["hidden"] == json!(64) {
            0.0
        } else {
            0.3
        };
        let quality = 1.0 - (lr.log10() + 2.0).powi(2) / 4.0 - hidden;
        quality * (1.0 - 0.5f64.powi(epoch as i32))
    }

    /// A TPE sweep of 24 trials on 4 slots, segments finishing in an order drawn from
    /// `seed`: every trial's hyperparameters and epochs.
    fn simulate_tpe(config: &SchedulerConfig, seed: u64) -> Vec<(Params, usize)> {
        let mut driver = SweepDriver::new(tpe_plan(24, 6, 4), config, Mode::Max, 4);
        let mut rng = SeededRng::new(seed);
        let mut running: Vec<Segment> = Vec::new();
        while !driver.finished() {
            running.extend(driver.next_segments());
            assert!(!running.is_empty(), "stalled");
            let done = running.remove(rng.below(running.len() as u64) as usize);
            let params = driver.trials()[done.trial].params.clone();
            let metrics: Vec<f64> = (done.start_epoch + 1..=done.end_epoch)
                .map(|e| metric_of(&params, e))
                .collect();
            driver.on_segment_done(done.trial, &metrics);
        }
        driver
            .trials()
            .iter()
            .map(|t| (t.params.clone(), t.metrics.len()))
            .collect()
    }

    #[test]
    fn tpe_draws_the_same_trials_whatever_order_segments_finish_in() {
        for config in [
            asha(),
            SchedulerConfig {
                kind: TrialScheduler::Fifo,
                ..asha()
            },
        ] {
            let first = simulate_tpe(&config, 1);
            for seed in 2..12 {
                assert_eq!(simulate_tpe(&config, seed), first, "seed {seed}");
            }
            let TrialPlan::Tpe(plan) = tpe_plan(24, 6, 4) else {
                unreachable!()
            };
            assert_eq!(
                first[..6]
                    .iter()
                    .map(|(p, _)| p.clone())
                    .collect::<Vec<_>>(),
                plan.random[..6],
                "the startup trials are random search's"
            );
            let late_64 = first[12..]
                .iter()
                .filter(|(p, _)| p["hidden"] == json!(64))
                .count();
            assert!(
                late_64 >= 8,
                "the model finds hidden 64: {late_64} of the last 12"
            );
        }
    }

    #[test]
    fn a_tpe_trial_waits_for_the_trials_it_learns_from() {
        let fifo = SchedulerConfig {
            kind: TrialScheduler::Fifo,
            ..asha()
        };
        // Startup 2, lag 2, two slots: trial 2 has nothing to learn from (random); trial 3
        // learns from trial 0 and waits for it.
        let mut driver = SweepDriver::new(tpe_plan(6, 2, 2), &fifo, Mode::Max, 2);
        let trials = |segments: Vec<Segment>| segments.iter().map(|s| s.trial).collect::<Vec<_>>();
        assert_eq!(trials(driver.next_segments()), vec![0, 1]);
        let done = |driver: &mut SweepDriver, trial: usize| {
            let params = driver.trials()[trial].params.clone();
            let metrics: Vec<f64> = (1..=8).map(|e| metric_of(&params, e)).collect();
            driver.on_segment_done(trial, &metrics)
        };
        done(&mut driver, 1);
        assert_eq!(trials(driver.next_segments()), vec![2]);
        done(&mut driver, 2);
        assert!(
            driver.next_segments().is_empty(),
            "trial 3 waits for trial 0"
        );
        assert!(driver.trials()[3].params.is_empty(), "nothing drawn yet");
        done(&mut driver, 0);
        assert_eq!(trials(driver.next_segments()), vec![3, 4]);
        // A failed trial is nothing to learn from, and does not block.
        assert_eq!(driver.on_segment_failed(3, "lost".into()), vec![3]);
        done(&mut driver, 4);
        assert_eq!(trials(driver.next_segments()), vec![5]);
        assert_eq!(done(&mut driver, 5), vec![5]);
        assert!(driver.finished());
    }

    #[test]
    fn a_resumed_tpe_sweep_keeps_what_earlier_trials_drew() {
        let fifo = SchedulerConfig {
            kind: TrialScheduler::Fifo,
            ..asha()
        };
        let TrialPlan::Tpe(plan) = tpe_plan(6, 2, 1) else {
            unreachable!()
        };
        let mut driver = SweepDriver::new(tpe_plan(6, 2, 1), &fifo, Mode::Max, 1);
        let drawn_by_model = Params::from([
            ("lr".to_owned(), json!(0.01)),
            ("hidden".to_owned(), json!(64)),
        ]);
        assert!(driver.accepts_result(0, &plan.random[0]));
        assert!(
            !driver.accepts_result(0, &drawn_by_model),
            "a startup trial is random search's"
        );
        assert!(
            driver.accepts_result(4, &drawn_by_model),
            "a model-drawn trial is taken as it is"
        );
        assert!(!driver.accepts_result(6, &plan.random[0]), "no such trial");
        for trial in 0..2 {
            let params = plan.random[trial].clone();
            let metrics = (1..=8).map(|e| metric_of(&params, e)).collect();
            driver.restore(trial, params, metrics, false);
        }
        driver.restore(3, drawn_by_model.clone(), vec![0.5; 8], false);
        assert_eq!(driver.trials()[3].params, drawn_by_model);
        let next = driver.next_segments();
        assert_eq!(next[0].trial, 2, "the first unfinished trial runs");
        assert!(!driver.trials()[2].params.is_empty());
    }

    fn pbt_settings() -> PbtSettings {
        PbtSettings {
            interval: 2,
            quantile: 0.25,
            resample_probability: 0.25,
            mutations: BTreeMap::from([("lr".to_owned(), ParamSpec::LogUniform([1e-4, 1e-1]))]),
            mode: Mode::Max,
            seed: 9,
        }
    }

    fn pbt_driver(slots: usize) -> SweepDriver {
        let fifo = SchedulerConfig {
            kind: TrialScheduler::Pbt,
            ..asha()
        };
        let space = BTreeMap::from([("lr".to_owned(), ParamSpec::LogUniform([1e-4, 1e-1]))]);
        let plan = TrialPlan::Fixed(generate_trials(&space, SearchAlgorithm::Random, 8, 9));
        SweepDriver::new(plan, &fifo, Mode::Max, slots).population_based(pbt_settings())
    }

    /// A PBT sweep of 8 trials on `slots`, segments finishing in an order drawn from `seed`:
    /// each trial's final state and every round.
    fn simulate_pbt(slots: usize, seed: u64) -> (Vec<TrialProgress>, Vec<Round>) {
        let mut driver = pbt_driver(slots);
        let mut rng = SeededRng::new(seed);
        let mut running: Vec<Segment> = Vec::new();
        let mut rounds = Vec::new();
        while !driver.finished() {
            running.extend(driver.next_segments());
            assert!(!running.is_empty(), "stalled");
            let done = running.remove(rng.below(running.len() as u64) as usize);
            assert_eq!(
                done.end_epoch - done.start_epoch,
                2,
                "segments end at rounds"
            );
            // Best at lr 1e-2; a copier continues its donor's curve.
            let lr = driver.trials()[done.trial].params["lr"].as_f64().unwrap();
            let start = driver.trials()[done.trial]
                .metrics
                .last()
                .copied()
                .unwrap_or(0.0);
            let gain = 1.0 - (lr.log10() + 2.0).powi(2) / 4.0;
            let metrics: Vec<f64> = (1..=2).map(|e| start + gain * f64::from(e)).collect();
            driver.on_segment_done(done.trial, &metrics);
            rounds.extend(driver.take_rounds());
        }
        (driver.trials().to_vec(), rounds)
    }

    #[test]
    fn pbt_rounds_wait_for_the_population_and_copy_the_same_whatever_the_order() {
        let (trials, rounds) = simulate_pbt(3, 1);
        assert_eq!(
            rounds.iter().map(|r| r.epoch).collect::<Vec<_>>(),
            vec![2, 4, 6],
            "a round every 2 of 8 epochs"
        );
        for round in &rounds {
            assert_eq!(round.exploits.len(), 2, "a quarter of eight copies");
        }
        for seed in 2..10 {
            let (again, again_rounds) = simulate_pbt(1 + seed as usize % 8, seed);
            assert_eq!(again_rounds, rounds, "seed {seed}");
            let params =
                |t: &[TrialProgress]| t.iter().map(|t| t.params.clone()).collect::<Vec<_>>();
            assert_eq!(params(&again), params(&trials));
        }
        for trial in &trials {
            assert_eq!(trial.metrics.len(), 8);
            assert_eq!(
                trial.phase,
                Phase::Done {
                    stopped_early: false
                }
            );
            assert_eq!(trial.schedule[0].epoch, 0);
            let copies = trial.schedule.len() - 1;
            let made: usize = rounds
                .iter()
                .flat_map(|r| &r.exploits)
                .filter(|e| std::ptr::eq(&trials[e.trial], trial))
                .count();
            assert_eq!(copies, made, "each copy is in the trial's schedule");
        }
        // The copiers take a donor's lr, times 0.8 or 1.2 or drawn afresh, and the last
        // round's copiers train on with it.
        let last = &rounds[2].exploits[0];
        assert_eq!(trials[last.trial].params, last.params);
    }

    #[test]
    fn a_failed_pbt_trial_leaves_the_population_and_a_restored_one_trains_on() {
        let mut driver = pbt_driver(8);
        let segments = driver.next_segments();
        assert_eq!(segments.len(), 8);
        driver.on_segment_failed(5, "lost".into());
        for trial in (0..8).filter(|t| *t != 5) {
            assert!(driver.take_rounds().is_empty(), "the round waits for all");
            driver.on_segment_done(trial, &[0.1 * trial as f64, 0.2 * trial as f64]);
        }
        let rounds = driver.take_rounds();
        assert_eq!(rounds.len(), 1);
        let copiers: Vec<usize> = rounds[0].exploits.iter().map(|e| e.trial).collect();
        assert_eq!(copiers, vec![0], "seven members: one copies");
        assert_eq!(rounds[0].exploits[0].donor, 7);
        // A resumed sweep puts a member past its round.
        let mut resumed = pbt_driver(2);
        let schedule = driver.trials()[0].schedule.clone();
        resumed.restore_failed(5, "lost".into());
        for trial in (0..8).filter(|t| *t != 5) {
            let progress = &driver.trials()[trial];
            resumed.restore_member(
                trial,
                progress.params.clone(),
                progress.metrics.clone(),
                progress.schedule.clone(),
            );
        }
        assert_eq!(resumed.trials()[0].schedule, schedule);
        let next = resumed.next_segments();
        assert_eq!(
            next,
            vec![
                Segment {
                    trial: 0,
                    start_epoch: 2,
                    end_epoch: 4
                },
                Segment {
                    trial: 1,
                    start_epoch: 2,
                    end_epoch: 4
                }
            ]
        );
        assert!(
            resumed.accepts_result(3, &Params::new()),
            "PBT changes params"
        );
    }
}
