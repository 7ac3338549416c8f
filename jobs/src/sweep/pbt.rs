//! Population-based training's rounds (pure): when every trial of the population has
//! reached a round's epoch, the worst `quantile` of them each copy a trial of the best
//! `quantile` (its weights, optimiser state and hyperparameters: exploit) and perturb the
//! copied hyperparameters (explore): a listed value moves to a neighbour, a number is
//! multiplied by 0.8 or 1.2 (kept in its range), or, with `resample_probability`, either
//! is drawn afresh from its range.
//!
//! Rounds are synchronous and every draw comes from the sweep's seed, the round's epoch
//! and the trial's id, so a seeded sweep makes the same copies whichever actor finishes
//! first. Ties rank the lower trial id first.

use std::collections::BTreeMap;

use resident_proto::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{Mode, ParamSpec, SweepConfig};
use super::search::{Params, sample};

/// The factors a perturbed number is multiplied by, each as likely.
pub const PERTURBATION_FACTORS: [f64; 2] = [0.8, 1.2];

/// A stream of the seed for PBT's draws, apart from random search's and the trials'.
const PBT_STREAM: u64 = 0x7062_7400;

/// How a sweep runs its PBT rounds.
#[derive(Clone, Debug)]
pub struct PbtSettings {
    /// Epochs between rounds.
    pub interval: u32,
    /// The share that copies and the share copied from.
    pub quantile: f64,
    /// The chance of drawing a hyperparameter afresh rather than perturbing it.
    pub resample_probability: f64,
    /// The hyperparameters a round may change, with their ranges.
    pub mutations: BTreeMap<String, ParamSpec>,
    /// Which way the metric is better.
    pub mode: Mode,
    /// The sweep's seed.
    pub seed: u64,
}

impl PbtSettings {
    /// The settings a PBT sweep declares.
    pub fn of(config: &SweepConfig) -> Self {
        let scheduler = &config.scheduler;
        let mutations = scheduler
            .pbt_mutations(&config.space)
            .into_iter()
            .filter_map(|name| config.space.get(&name).map(|spec| (name, spec.clone())))
            .collect();
        Self {
            interval: scheduler.pbt_interval(),
            quantile: scheduler.pbt_quantile(),
            resample_probability: scheduler.pbt_resample_probability(),
            mutations,
            mode: config.mode,
            seed: config.seed,
        }
    }
}

/// What a trial's hyperparameters became at an epoch: its first entry (epoch 0) is what it
/// started with, each later one a round where it copied `cloned_from`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Perturbation {
    /// The epoch after which it trained with `params`.
    pub epoch: u32,
    /// The trial whose weights and hyperparameters it copied then (none at epoch 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloned_from: Option<usize>,
    /// The hyperparameters it trained with from then on.
    pub params: Params,
}

/// One trial's copy in a round: `trial` takes `donor`'s weights and trains on with `params`.
#[derive(Clone, Debug, PartialEq)]
pub struct Exploit {
    /// The trial that copies.
    pub trial: usize,
    /// The trial it copies.
    pub donor: usize,
    /// Its hyperparameters from now on: the donor's, perturbed.
    pub params: Params,
}

/// The round at `epoch` over `members` (trial id, metric at `epoch`, hyperparameters), the
/// population's trials that are still training: which trials copy which, and with what.
pub fn round(
    settings: &PbtSettings,
    epoch: u32,
    members: &[(usize, f64, &Params)],
) -> Vec<Exploit> {
    let oriented = |metric: f64| {
        let score = match settings.mode {
            Mode::Max => metric,
            Mode::Min => -metric,
        };
        if score.is_nan() {
            f64::NEG_INFINITY
        } else {
            score
        }
    };
    let mut ranked: Vec<&(usize, f64, &Params)> = members.iter().collect();
    ranked.sort_by(|a, b| oriented(b.1).total_cmp(&oriented(a.1)).then(a.0.cmp(&b.0)));
    let share = (ranked.len() as f64 * settings.quantile).floor() as usize;
    if share == 0 {
        return Vec::new();
    }
    let (top, bottom) = (&ranked[..share], &ranked[ranked.len() - share..]);
    bottom
        .iter()
        .map(|(trial, _, _)| {
            let mut rng = round_rng(settings.seed, epoch, *trial);
            let (donor, _, donor_params) = top[rng.below(share as u64) as usize];
            Exploit {
                trial: *trial,
                donor: *donor,
                params: explore(settings, donor_params, &mut rng),
            }
        })
        .collect()
}

fn round_rng(seed: u64, epoch: u32, trial: usize) -> SeededRng {
    let round = SeededRng::derived(seed, PBT_STREAM + u64::from(epoch)).next_u64();
    SeededRng::derived(round, trial as u64)
}

/// `params` with each mutation perturbed or drawn afresh.
pub fn explore(settings: &PbtSettings, params: &Params, rng: &mut SeededRng) -> Params {
    let mut out = params.clone();
    for (name, spec) in &settings.mutations {
        let resample = rng.next_f64() < settings.resample_probability;
        let factor = PERTURBATION_FACTORS[rng.below(2) as usize];
        let step_up = rng.below(2) == 1;
        let fresh = sample(spec, rng);
        let value = match (params.get(name), resample) {
            (Some(value), false) => perturb(spec, value, factor, step_up).unwrap_or(fresh),
            _ => fresh,
        };
        out.insert(name.clone(), value);
    }
    out
}

/// A value moved within its range: a listed value to its neighbour (up or down, staying
/// at an end), a number times `factor`, kept in `[low, high]`. `None` when the value is not
/// one the range holds (drawn afresh then).
fn perturb(spec: &ParamSpec, value: &Value, factor: f64, step_up: bool) -> Option<Value> {
    match spec {
        ParamSpec::Choice(values) | ParamSpec::Grid(values) => {
            let at = values.iter().position(|v| v == value)?;
            let next = if step_up {
                (at + 1).min(values.len() - 1)
            } else {
                at.saturating_sub(1)
            };
            Some(values[next].clone())
        }
        ParamSpec::Uniform([low, high]) | ParamSpec::LogUniform([low, high]) => {
            Some(Value::from((value.as_f64()? * factor).clamp(*low, *high)))
        }
        ParamSpec::Int([low, high]) => {
            let scaled = (value.as_i64()? as f64 * factor).round() as i64;
            Some(Value::from(scaled.clamp(*low, *high)))
        }
    }
}

/// The hyperparameters that made a trial's final weights, in order: each step trained
/// `trial`'s weights over epochs `(start_epoch, end_epoch]` with `params`. A trial that
/// copied another at epoch E continues the other's steps up to E.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyStep {
    /// The trial whose weights trained.
    pub trial: usize,
    /// The epoch the step starts after.
    pub start_epoch: u32,
    /// The epoch it ends at.
    pub end_epoch: u32,
    /// What they trained with.
    pub params: Params,
}

/// The policy (hyperparameters by epoch) that gave `trial` its weights after `epochs`,
/// from each trial's schedule (`schedules[id]`).
pub fn policy(
    schedules: &BTreeMap<usize, &[Perturbation]>,
    trial: usize,
    epochs: u32,
) -> Vec<PolicyStep> {
    let mut steps = Vec::new();
    let (mut current, mut end) = (trial, epochs);
    while end > 0 {
        let Some(entry) = schedules
            .get(&current)
            .and_then(|schedule| schedule.iter().rev().find(|p| p.epoch < end))
        else {
            break;
        };
        steps.push(PolicyStep {
            trial: current,
            start_epoch: entry.epoch,
            end_epoch: end,
            params: entry.params.clone(),
        });
        end = entry.epoch;
        if let Some(donor) = entry.cloned_from {
            current = donor;
        }
    }
    steps.reverse();
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(resample: f64) -> PbtSettings {
        PbtSettings {
            interval: 2,
            quantile: 0.25,
            resample_probability: resample,
            mutations: BTreeMap::from([
                ("lr".to_owned(), ParamSpec::LogUniform([1e-4, 1e-1])),
                (
                    "batch_size".to_owned(),
                    ParamSpec::Choice(vec![json!(16), json!(32), json!(64)]),
                ),
                ("dropout".to_owned(), ParamSpec::Uniform([0.0, 0.5])),
                ("warm".to_owned(), ParamSpec::Int([1, 10])),
            ]),
            mode: Mode::Max,
            seed: 3,
        }
    }

    fn params(lr: f64) -> Params {
        Params::from([
            ("lr".to_owned(), json!(lr)),
            ("batch_size".to_owned(), json!(32)),
            ("dropout".to_owned(), json!(0.45)),
            ("warm".to_owned(), json!(5)),
            ("hidden".to_owned(), json!(64)),
        ])
    }

    #[test]
    fn the_worst_quarter_copies_the_best_quarter_and_perturbs_it() {
        let all: Vec<Params> = (0..8).map(|i| params(1e-3 * (i + 1) as f64)).collect();
        // Metrics: trial i scores i, except a NaN (worst) and a tie at the top.
        let metrics = [0.5, f64::NAN, 2.0, 3.0, 4.0, 5.0, 7.0, 7.0];
        let members: Vec<(usize, f64, &Params)> =
            (0..8).map(|i| (i, metrics[i], &all[i])).collect();
        let exploits = round(&settings(0.0), 4, &members);
        let copiers: Vec<usize> = exploits.iter().map(|e| e.trial).collect();
        assert_eq!(copiers, vec![0, 1], "two of eight, the NaN counts as worst");
        for exploit in &exploits {
            assert!([6, 7].contains(&exploit.donor), "{exploit:?}");
            let donor = &all[exploit.donor];
            let lr = exploit.params["lr"].as_f64().unwrap() / donor["lr"].as_f64().unwrap();
            assert!((lr - 0.8).abs() < 1e-9 || (lr - 1.2).abs() < 1e-9, "{lr}");
            assert!([json!(16), json!(64)].contains(&exploit.params["batch_size"]));
            let dropout = exploit.params["dropout"].as_f64().unwrap();
            assert!(
                dropout == 0.5 || (dropout - 0.36).abs() < 1e-9,
                "kept in range: {dropout}"
            );
            assert!([json!(4), json!(6)].contains(&exploit.params["warm"]));
            assert_eq!(
                exploit.params["hidden"],
                json!(64),
                "the shape is the donor's"
            );
        }
        // The same round decides the same; another epoch draws anew; Min mode flips it.
        assert_eq!(round(&settings(0.0), 4, &members), exploits);
        let min = PbtSettings {
            mode: Mode::Min,
            ..settings(0.0)
        };
        let flipped: Vec<usize> = round(&min, 4, &members).iter().map(|e| e.trial).collect();
        assert_eq!(
            flipped,
            vec![7, 1],
            "lowest wins; of the tie at 7, trial 6 ranks first"
        );
        // Fewer than 1/quantile members: nothing to copy.
        assert!(round(&settings(0.0), 4, &members[..3]).is_empty());
    }

    #[test]
    fn a_resampled_value_comes_from_its_range() {
        let mut rng = SeededRng::new(1);
        let all = settings(1.0);
        for _ in 0..50 {
            let out = explore(&all, &params(0.01), &mut rng);
            let lr = out["lr"].as_f64().unwrap();
            assert!((1e-4..1e-1).contains(&lr));
            assert!((1..=10).contains(&out["warm"].as_i64().unwrap()));
        }
        // A value outside its list is drawn afresh even without resampling.
        let mut odd = params(0.01);
        odd.insert("batch_size".into(), json!(48));
        let out = explore(&settings(0.0), &odd, &mut rng);
        assert!([json!(16), json!(32), json!(64)].contains(&out["batch_size"]));
        assert_eq!(
            perturb(&ParamSpec::Int([1, 10]), &json!(10), 1.2, true),
            Some(json!(10))
        );
        assert_eq!(
            perturb(
                &ParamSpec::Choice(vec![json!(1), json!(2)]),
                &json!(1),
                1.0,
                false
            ),
            Some(json!(1)),
            "an end stays"
        );
    }

    #[test]
    fn a_policy_follows_the_weights_back_through_each_copy() {
        let at = |epoch, from: Option<usize>, lr: f64| Perturbation {
            epoch,
            cloned_from: from,
            params: params(lr),
        };
        // Trial 2 copied trial 0 at epoch 4; trial 0 had copied trial 1 at epoch 2.
        let zero = [at(0, None, 0.1), at(2, Some(1), 0.02)];
        let one = [at(0, None, 0.01)];
        let two = [at(0, None, 0.5), at(4, Some(0), 0.03)];
        let schedules = BTreeMap::from([(0, &zero[..]), (1, &one[..]), (2, &two[..])]);
        let steps = policy(&schedules, 2, 6);
        let spans: Vec<(usize, u32, u32, f64)> = steps
            .iter()
            .map(|s| {
                (
                    s.trial,
                    s.start_epoch,
                    s.end_epoch,
                    s.params["lr"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            spans,
            vec![(1, 0, 2, 0.01), (0, 2, 4, 0.02), (2, 4, 6, 0.03)]
        );
        let alone = policy(&schedules, 1, 6);
        assert_eq!(alone.len(), 1);
        assert_eq!((alone[0].start_epoch, alone[0].end_epoch), (0, 6));
    }
}
