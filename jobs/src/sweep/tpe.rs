//! Tree-structured Parzen Estimator search (Bergstra et al., NeurIPS 2011), in its
//! multivariate form (Falkner et al., ICML 2018; Optuna's `multivariate=True`).
//!
//! Written here rather than taken from a crate: a sweep needs one pure function, the draw
//! of trial `i` from a given set of earlier trials, the seed and `i`, on the sweep's own
//! SplitMix64 stream, so a restarted or resumed sweep replays it with no sampler state to
//! save and the same bits on every platform and dependency version. The `tpe` crate models
//! one hyperparameter at a time (univariate TPE measured no better than random search on
//! this module's test objective: 0.36 mean regret against 0.18 for the joint model); the
//! `optimizer` crate has a multivariate sampler, but built around a `Study` that owns the
//! trial loop and a sampler whose generator advances with each trial.
//!
//! The trials seen so far are split into the best quarter ("good") and the rest. Two
//! densities over the whole space are fitted, `l` on the good trials and `g` on the others:
//! a Parzen window of one kernel per trial, plus a prior as wide as the space. A kernel is a
//! product over the hyperparameters: a truncated normal on a continuous one (log-uniform
//! ranges in log space, integers as continuous and rounded), on a choice half its weight on
//! its trial's value and half spread over every value. Candidates are drawn from `l`, and the one
//! with the largest `l(x) / g(x)` is proposed: the paper's expected-improvement criterion.
//! Modelling the hyperparameters jointly, not one by one, matters: a choice whose early
//! trials were bad for another reason (a learning rate far off) is not written off.

use std::collections::BTreeMap;

use resident_proto::SeededRng;
use serde_json::Value;

use super::config::{Mode, ParamSpec};
use super::search::Params;

/// Candidates drawn from the good trials' density (Optuna's and Hyperopt's default).
const CANDIDATES: usize = 24;
/// The share of trials seen that count as good.
const GOOD_SHARE: f64 = 0.25;
/// At most this many good trials, so that a long sweep's `l` stays sharp (Optuna's cap).
const MAX_GOOD: usize = 25;
/// A kernel's width as a share of its range, before Scott's shrinking with the number of
/// trials (`n^(-1/(d+4))`).
const BANDWIDTH: f64 = 0.2;
/// A stream of the sweep's seed of its own, apart from random search's and training's.
const TPE_STREAM: u64 = 0x7470_655f_7365_6564;

/// A trial seen: its hyperparameters and its metric.
pub type Observation<'a> = (&'a Params, f64);

/// The hyperparameters TPE proposes for trial `trial` from what the trials before it came
/// to. The same space, observations, mode, seed and trial give the same proposal.
pub fn suggest(
    space: &BTreeMap<String, ParamSpec>,
    observations: &[Observation<'_>],
    mode: Mode,
    seed: u64,
    trial: usize,
) -> Params {
    let axes: Vec<Axis<'_>> = space.values().map(Axis::of).collect();
    let points: Vec<(Vec<f64>, f64)> = observations
        .iter()
        .filter_map(|(params, metric)| {
            let point = space
                .iter()
                .zip(&axes)
                .map(|((name, _), axis)| params.get(name).and_then(|v| axis.coordinate(v)))
                .collect::<Option<Vec<f64>>>()?;
            Some((point, score(*metric, mode)))
        })
        .collect();
    let (good, bad) = split(points);
    let l = Parzen::fit(&axes, good);
    let g = Parzen::fit(&axes, bad);
    let mut rng = SeededRng::derived(seed ^ TPE_STREAM, trial as u64);
    let mut best = l.sample(&mut rng);
    let mut best_score = l.ln_pdf(&best) - g.ln_pdf(&best);
    for _ in 1..CANDIDATES {
        let candidate = l.sample(&mut rng);
        let score = l.ln_pdf(&candidate) - g.ln_pdf(&candidate);
        if score > best_score {
            (best, best_score) = (candidate, score);
        }
    }
    space
        .keys()
        .zip(&axes)
        .zip(best)
        .map(|((name, axis), x)| (name.clone(), axis.value(x)))
        .collect()
}

/// A metric oriented so that larger is better; NaN the worst.
fn score(metric: f64, mode: Mode) -> f64 {
    match mode {
        _ if metric.is_nan() => f64::NEG_INFINITY,
        Mode::Max => metric,
        Mode::Min => -metric,
    }
}

/// The good points (the best quarter, at least one) and the others. Ties keep trial order,
/// so the split depends on nothing but the metrics.
fn split(mut points: Vec<(Vec<f64>, f64)>) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    // A stable sort: equal scores stay in trial order.
    points.sort_by(|a, b| b.1.total_cmp(&a.1));
    let good_count = ((GOOD_SHARE * points.len() as f64).ceil() as usize).min(MAX_GOOD);
    let bad = points.split_off(good_count.min(points.len()));
    let strip = |points: Vec<(Vec<f64>, f64)>| points.into_iter().map(|(p, _)| p).collect();
    (strip(points), strip(bad))
}

/// One hyperparameter as TPE models it.
enum Axis<'a> {
    /// A continuous coordinate in `[low, high]`: the value itself, its logarithm
    /// (`log`), or an integer widened by half a step each side (`int`).
    Continuous {
        low: f64,
        high: f64,
        log: bool,
        int: bool,
    },
    /// A choice's index among its values.
    Choice(&'a [Value]),
}

impl<'a> Axis<'a> {
    fn of(spec: &'a ParamSpec) -> Self {
        match spec {
            ParamSpec::Choice(values) | ParamSpec::Grid(values) => Self::Choice(values),
            ParamSpec::Uniform([low, high]) => Self::continuous(*low, *high, false, false),
            ParamSpec::LogUniform([low, high]) => {
                Self::continuous(low.ln(), high.ln(), true, false)
            }
            ParamSpec::Int([low, high]) => {
                Self::continuous(*low as f64 - 0.5, *high as f64 + 0.5, false, true)
            }
        }
    }

    fn continuous(low: f64, high: f64, log: bool, int: bool) -> Self {
        Self::Continuous {
            low,
            high,
            log,
            int,
        }
    }

    /// Where a trial's value lies on this axis; `None` for a value the space cannot hold.
    fn coordinate(&self, value: &Value) -> Option<f64> {
        match self {
            Self::Choice(values) => values.iter().position(|v| v == value).map(|i| i as f64),
            Self::Continuous { low, high, log, .. } => {
                let x = value.as_f64()?;
                let x = if *log { (x > 0.0).then(|| x.ln())? } else { x };
                Some(x.clamp(*low, *high))
            }
        }
    }

    /// The hyperparameter's value at coordinate `x`.
    fn value(&self, x: f64) -> Value {
        match self {
            Self::Choice(values) => values[x as usize].clone(),
            Self::Continuous {
                low,
                high,
                log,
                int,
            } => {
                if *int {
                    let (first, last) = ((low + 0.5) as i64, (high - 0.5) as i64);
                    Value::from((x.round() as i64).clamp(first, last))
                } else if *log {
                    Value::from(x.exp().clamp(low.exp(), high.exp()))
                } else {
                    Value::from(x)
                }
            }
        }
    }
}

/// A mixture of product kernels, equally weighted: one centred on each point, and a prior
/// (a normal as wide as each range at its middle, uniform over each choice).
struct Parzen<'s> {
    axes: &'s [Axis<'s>],
    points: Vec<Vec<f64>>,
    /// Each continuous axis's kernel width (Scott's rule, clipped).
    sigmas: Vec<f64>,
}

impl<'s> Parzen<'s> {
    fn fit(axes: &'s [Axis<'s>], points: Vec<Vec<f64>>) -> Self {
        let n = points.len().max(1) as f64;
        let shrink = n.powf(-1.0 / (axes.len() as f64 + 4.0));
        let sigmas = axes
            .iter()
            .map(|axis| match axis {
                Axis::Continuous { low, high, .. } => {
                    let range = high - low;
                    (BANDWIDTH * shrink * range).max(range / (n + 1.0).min(100.0))
                }
                Axis::Choice(_) => 0.0,
            })
            .collect();
        Self {
            axes,
            points,
            sigmas,
        }
    }

    /// A draw: a kernel chosen uniformly (the prior being the last), then each coordinate
    /// from it.
    fn sample(&self, rng: &mut SeededRng) -> Vec<f64> {
        let k = rng.below(self.points.len() as u64 + 1) as usize;
        let centre = self.points.get(k);
        self.axes
            .iter()
            .enumerate()
            .map(|(d, axis)| match axis {
                Axis::Choice(values) => {
                    let count = values.len() as u64;
                    match centre {
                        // Its own value with probability 1/2 + 1/(2K), as in `ln_kernel`.
                        Some(c) if rng.next_f64() < 0.5 => c[d],
                        _ => rng.below(count) as f64,
                    }
                }
                Axis::Continuous { low, high, .. } => {
                    let (mean, sigma) = match centre {
                        Some(c) => (c[d], self.sigmas[d]),
                        None => (0.5 * (low + high), high - low),
                    };
                    truncated_normal(mean, sigma, *low, *high, rng)
                }
            })
            .collect()
    }

    fn ln_pdf(&self, x: &[f64]) -> f64 {
        let ln_terms: Vec<f64> = self
            .points
            .iter()
            .map(Some)
            .chain([None])
            .map(|centre| {
                (0..self.axes.len())
                    .map(|d| self.ln_kernel(centre, d, x[d]))
                    .sum()
            })
            .collect();
        let top = ln_terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = ln_terms.iter().map(|t| (t - top).exp()).sum();
        top + total.ln() - (ln_terms.len() as f64).ln()
    }

    /// The log density at `x` on axis `d` of the kernel centred on `centre` (the prior
    /// where `None`).
    fn ln_kernel(&self, centre: Option<&Vec<f64>>, d: usize, x: f64) -> f64 {
        match &self.axes[d] {
            Axis::Choice(values) => {
                let k = values.len() as f64;
                match centre {
                    Some(c) if c[d] == x => (0.5 + 0.5 / k).ln(),
                    Some(_) => (0.5 / k).ln(),
                    None => (1.0 / k).ln(),
                }
            }
            Axis::Continuous { low, high, .. } => {
                let (mean, sigma) = match centre {
                    Some(c) => (c[d], self.sigmas[d]),
                    None => (0.5 * (low + high), high - low),
                };
                let z = (x - mean) / sigma;
                let mass = normal_cdf((high - mean) / sigma) - normal_cdf((low - mean) / sigma);
                -0.5 * z * z
                    - (sigma * (2.0 * std::f64::consts::PI).sqrt() * mass.max(f64::MIN_POSITIVE))
                        .ln()
            }
        }
    }
}

/// A normal draw inside `[low, high]` (rejection; the mean after 64 misses).
fn truncated_normal(mean: f64, sigma: f64, low: f64, high: f64, rng: &mut SeededRng) -> f64 {
    for _ in 0..64 {
        let x = mean + sigma * standard_normal(rng);
        if (low..=high).contains(&x) {
            return x;
        }
    }
    mean
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * (1.0 + libm::erf(z / std::f64::consts::SQRT_2))
}

/// A standard normal draw (Box-Muller).
fn standard_normal(rng: &mut SeededRng) -> f64 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::config::SearchAlgorithm;
    use crate::sweep::search::generate_trials;
    use serde_json::json;

    fn space() -> BTreeMap<String, ParamSpec> {
        BTreeMap::from([
            ("lr".to_owned(), ParamSpec::LogUniform([1e-5, 1.0])),
            (
                "hidden".to_owned(),
                ParamSpec::Choice(vec![json!(0), json!(64), json!(256)]),
            ),
            ("dropout".to_owned(), ParamSpec::Uniform([0.0, 0.5])),
            ("batch_size".to_owned(), ParamSpec::Int([8, 256])),
        ])
    }

    /// A known objective, best at lr 3e-3, hidden 64, dropout 0.1, batch 64: 0 there.
    fn objective(p: &Params) -> f64 {
        let lr = p["lr"].as_f64().unwrap();
        let hidden = p["hidden"].as_i64().unwrap();
        let dropout = p["dropout"].as_f64().unwrap();
        let batch = p["batch_size"].as_i64().unwrap() as f64;
        -(lr.log10() - 3e-3f64.log10()).powi(2)
            - if hidden == 64 { 0.0 } else { 0.5 }
            - 4.0 * (dropout - 0.1).powi(2)
            - (batch.log2() - 6.0).powi(2) / 8.0
    }

    /// The best objective of `trials` drawn one after another: the first `startup` at
    /// random, then by TPE (or at random throughout).
    fn best_of(seed: u64, trials: usize, startup: usize, use_tpe: bool) -> f64 {
        let random = generate_trials(&space(), SearchAlgorithm::Random, trials as u32, seed);
        let mut seen: Vec<(Params, f64)> = Vec::new();
        for (i, drawn) in random.into_iter().enumerate() {
            let params = if use_tpe && i >= startup {
                let observations: Vec<Observation<'_>> =
                    seen.iter().map(|(p, m)| (p, *m)).collect();
                suggest(&space(), &observations, Mode::Max, seed, i)
            } else {
                drawn
            };
            let metric = objective(&params);
            seen.push((params, metric));
        }
        seen.iter()
            .map(|(_, m)| *m)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    #[test]
    fn proposals_stay_in_their_ranges_and_replay_from_the_seed() {
        let trials = generate_trials(&space(), SearchAlgorithm::Random, 12, 3);
        let metrics: Vec<f64> = trials.iter().map(objective).collect();
        let seen: Vec<Observation<'_>> = trials.iter().zip(metrics).collect();
        for trial in 12..40 {
            let p = suggest(&space(), &seen, Mode::Max, 3, trial);
            assert_eq!(p, suggest(&space(), &seen, Mode::Max, 3, trial), "replays");
            let lr = p["lr"].as_f64().unwrap();
            assert!((1e-5..=1.0).contains(&lr), "{p:?}");
            assert!(
                [0, 64, 256].contains(&p["hidden"].as_i64().unwrap()),
                "{p:?}"
            );
            assert!(
                (0.0..=0.5).contains(&p["dropout"].as_f64().unwrap()),
                "{p:?}"
            );
            assert!(
                (8..=256).contains(&p["batch_size"].as_i64().unwrap()),
                "{p:?}"
            );
        }
        let other_seed: Vec<Params> = (12..20)
            .map(|t| suggest(&space(), &seen, Mode::Max, 4, t))
            .collect();
        let same_seed: Vec<Params> = (12..20)
            .map(|t| suggest(&space(), &seen, Mode::Max, 3, t))
            .collect();
        assert_ne!(other_seed, same_seed);
    }

    /// Measured when written, 20 seeds of 32 trials: mean regret 0.18 for TPE against 0.36
    /// for random search, TPE better on 18 seeds; one hyperparameter at a time (TPE's
    /// univariate form, tried first) came to 0.36, better on 11, and fails this.
    #[test]
    fn tpe_gets_closer_to_a_known_optimum_than_random_search_with_the_same_trials() {
        let (mut tpe_regret, mut random_regret, mut tpe_wins) = (0.0, 0.0, 0);
        for seed in 0..20 {
            let tpe = best_of(seed, 32, 8, true);
            let random = best_of(seed, 32, 8, false);
            tpe_regret -= tpe;
            random_regret -= random;
            tpe_wins += usize::from(tpe > random);
        }
        assert!(
            tpe_regret < 0.7 * random_regret && tpe_wins >= 14,
            "mean regret over 20 seeds: TPE {:.4}, random {:.4}; TPE better on {tpe_wins}",
            tpe_regret / 20.0,
            random_regret / 20.0
        );
    }

    #[test]
    fn minimising_searches_where_the_metric_is_low() {
        // The same objective negated, searched with mode = min: TPE must still find it.
        let mut seen: Vec<(Params, f64)> =
            generate_trials(&space(), SearchAlgorithm::Random, 8, 11)
                .into_iter()
                .map(|p| {
                    let loss = -objective(&p);
                    (p, loss)
                })
                .collect();
        for trial in 8..32 {
            let observations: Vec<Observation<'_>> = seen.iter().map(|(p, m)| (p, *m)).collect();
            let params = suggest(&space(), &observations, Mode::Min, 11, trial);
            let loss = -objective(&params);
            seen.push((params, loss));
        }
        let late_hidden_64 = seen[20..]
            .iter()
            .filter(|(p, _)| p["hidden"] == json!(64))
            .count();
        assert!(
            late_hidden_64 >= 8,
            "{late_hidden_64} of the last 12 at hidden 64"
        );
    }
}
