//! Turning a space into trial configurations: grid (every combination) or random (seeded);
//! TPE's model-based draws are in `tpe`.

use std::collections::BTreeMap;

use serde_json::Value;

pub use resident_proto::SeededRng;

use super::config::{ParamSpec, SearchAlgorithm};

/// One trial's hyperparameters.
pub type Params = BTreeMap<String, Value>;

/// One draw of `spec` (random search's, and PBT's fresh draws).
pub(super) fn sample(spec: &ParamSpec, rng: &mut SeededRng) -> Value {
    match spec {
        ParamSpec::Choice(values) | ParamSpec::Grid(values) => {
            values[rng.below(values.len() as u64) as usize].clone()
        }
        ParamSpec::Uniform([low, high]) => Value::from(low + (high - low) * rng.next_f64()),
        ParamSpec::LogUniform([low, high]) => {
            Value::from((low.ln() + (high.ln() - low.ln()) * rng.next_f64()).exp())
        }
        ParamSpec::Int([low, high]) => Value::from(low + rng.below((high - low + 1) as u64) as i64),
    }
}

/// The trials to run. Grid search yields every combination of the listed values (in key
/// order, last key fastest) and ignores `trials`; random search draws `trials` samples, and
/// so does TPE, whose driver uses the first of them as its startup trials.
pub fn generate_trials(
    space: &BTreeMap<String, ParamSpec>,
    algorithm: SearchAlgorithm,
    trials: u32,
    seed: u64,
) -> Vec<Params> {
    match algorithm {
        SearchAlgorithm::Random | SearchAlgorithm::Tpe => {
            let mut rng = SeededRng::new(seed);
            (0..trials)
                .map(|_| {
                    space
                        .iter()
                        .map(|(k, s)| (k.clone(), sample(s, &mut rng)))
                        .collect()
                })
                .collect()
        }
        SearchAlgorithm::Grid => {
            let mut combos: Vec<Params> = vec![Params::new()];
            for (name, spec) in space {
                let values = match spec {
                    ParamSpec::Choice(values) | ParamSpec::Grid(values) => values.clone(),
                    _ => continue, // rejected by validation
                };
                combos = combos
                    .into_iter()
                    .flat_map(|combo| {
                        values.iter().map(move |v| {
                            let mut next = combo.clone();
                            next.insert(name.clone(), v.clone());
                            next
                        })
                    })
                    .collect();
            }
            combos
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> BTreeMap<String, ParamSpec> {
        [
            ("lr".to_owned(), ParamSpec::LogUniform([1e-4, 1e-1])),
            (
                "hidden".to_owned(),
                ParamSpec::Choice(vec![0.into(), 64.into(), 256.into()]),
            ),
            ("epochs".to_owned(), ParamSpec::Int([1, 3])),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn random_search_is_seeded_and_in_range() {
        let a = generate_trials(&space(), SearchAlgorithm::Random, 50, 7);
        assert_eq!(a, generate_trials(&space(), SearchAlgorithm::Random, 50, 7));
        assert_ne!(a, generate_trials(&space(), SearchAlgorithm::Random, 50, 8));
        for trial in &a {
            let lr = trial["lr"].as_f64().unwrap();
            assert!((1e-4..1e-1).contains(&lr));
            assert!([0, 64, 256].contains(&trial["hidden"].as_i64().unwrap()));
            assert!((1..=3).contains(&trial["epochs"].as_i64().unwrap()));
        }
        let epochs: std::collections::BTreeSet<i64> =
            a.iter().map(|t| t["epochs"].as_i64().unwrap()).collect();
        assert_eq!(epochs.len(), 3, "both ends of an int range are reachable");
    }

    #[test]
    fn grid_search_takes_every_combination() {
        let grid: BTreeMap<String, ParamSpec> = [
            (
                "lr".to_owned(),
                ParamSpec::Grid(vec![0.1.into(), 0.01.into()]),
            ),
            (
                "hidden".to_owned(),
                ParamSpec::Grid(vec![0.into(), 64.into()]),
            ),
        ]
        .into_iter()
        .collect();
        let trials = generate_trials(&grid, SearchAlgorithm::Grid, 1, 0);
        assert_eq!(trials.len(), 4);
        let distinct: std::collections::BTreeSet<String> = trials
            .iter()
            .map(|t| serde_json::to_string(t).unwrap())
            .collect();
        assert_eq!(distinct.len(), 4);
    }
}
