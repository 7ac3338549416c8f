//! What a sweep leaves in its output: `results.jsonl` (a line per finished trial, appended as
//! trials end, which is what a resumed sweep reads back), `summary.json` and the table.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SweepError;
use super::config::Mode;
use super::data::SkippedRecord;
use super::pbt::{Perturbation, PolicyStep};
use super::search::Params;
use crate::files::write_atomically;
use crate::serde_skip::is_default;

/// One finished trial, a line of `results.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    /// The trial's index among the generated trials.
    pub trial_id: usize,
    /// Its hyperparameters.
    pub params: Params,
    /// The metric after the trial's last epoch (`None` when it failed).
    pub metric: Option<f64>,
    /// Epochs it trained.
    pub epochs: u32,
    /// ASHA stopped it before its epoch cap.
    pub stopped_early: bool,
    /// The actor that ran its last segment.
    pub actor_id: String,
    /// Seconds from its first segment sent to its end.
    pub wall_s: f64,
    /// The metric after every epoch.
    #[serde(default)]
    pub metrics: Vec<f64>,
    /// Seconds the actors spent training it.
    #[serde(default)]
    pub train_s: f64,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// PBT: the hyperparameters it started with (epoch 0) and each round where it copied a
    /// better trial (`cloned_from`) and trained on with perturbed ones. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<Perturbation>,
}

/// What a sweep came to (printed by `resident sweep`, returned by the SDK).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepSummary {
    /// The sweep's name.
    pub name: String,
    /// The metric trials were ranked by.
    pub metric_name: String,
    /// Which way it is better.
    pub mode: Mode,
    /// The best trial's id.
    pub best_trial: Option<usize>,
    /// Its hyperparameters.
    pub best_params: Option<Params>,
    /// Its metric.
    pub best_metric: Option<f64>,
    /// Model loads by the sweep's actors: one per actor when weights stay resident.
    pub model_loads: u64,
    /// Actors of the sweep's pool.
    pub actors: u64,
    /// Trials finished (this run's and earlier ones').
    pub trials: usize,
    /// Of those, stopped early by ASHA.
    pub stopped_early: usize,
    /// Of those, failed.
    pub failed: usize,
    /// Trials taken from an earlier run's results.jsonl.
    pub resumed_trials: usize,
    /// Epochs trained over every trial.
    pub epochs_trained: u64,
    /// The sweep's wall time, seconds.
    pub wall_s: f64,
    /// Creating the pool until every actor had loaded the model.
    #[serde(default)]
    pub model_load_s: f64,
    /// Embedding the data (0 on a cache hit).
    pub embed_s: f64,
    /// The embedded data came from the cache.
    pub embedding_cache_hit: bool,
    /// Examples used.
    pub examples: usize,
    /// Records of the data file that were not.
    pub skipped_records: Vec<SkippedRecord>,
    /// GPU-hours the sweep's actors held while it ran (each actor's GPU fraction times its
    /// GPUs), as the scheduler counted them: model loads, embedding and trials.
    #[serde(default)]
    pub gpu_hours: f64,
    /// CPU core-hours its CPU actors held.
    #[serde(default)]
    pub cpu_hours: f64,
    /// Both at the prices of `--price` and the public on-demand price of each GPU model.
    #[serde(default)]
    pub estimated_cost_usd: f64,
    /// PBT: the hyperparameters, epoch by epoch, that trained the best trial's weights
    /// (through the trials it copied): what to train a model with to get it again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub best_policy: Vec<PolicyStep>,
    /// The best trial's trained head (`best_head.safetensors`, under the output), when the
    /// output holds that trial's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_head: Option<String>,
    /// PBT: the round an earlier run's population was resumed from (0: none).
    #[serde(default, skip_serializing_if = "is_default")]
    pub resumed_from_epoch: u32,
}

/// The earlier run's finished trials (lines that do not parse, e.g. one cut by a kill, are
/// ignored: that trial runs again).
pub fn read_results(path: &Path) -> Vec<TrialResult> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn result_line(result: &TrialResult) -> Result<Vec<u8>, SweepError> {
    let mut line = serde_json::to_vec(result).map_err(|e| SweepError::Output(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Appends one result to `results.jsonl` and syncs it, so that a killed sweep keeps it.
pub fn append_result(path: &Path, result: &TrialResult) -> Result<(), SweepError> {
    let fail = |e: std::io::Error| SweepError::Output(format!("{}: {e}", path.display()));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(fail)?;
    file.write_all(&result_line(result)?).map_err(fail)?;
    file.sync_data().map_err(fail)
}

/// Replaces the file with exactly `results` (atomically), dropping a line cut by a kill.
pub fn write_results(path: &Path, results: &[TrialResult]) -> Result<(), SweepError> {
    let mut bytes = Vec::new();
    for result in results {
        bytes.extend(result_line(result)?);
    }
    write_atomically(path, &bytes).map_err(|e| SweepError::Output(e.to_string()))
}

/// The best finished trial by `mode`.
/// What the sweep's job reports to the dashboard (`Cluster::annotate_job`): a status line
/// and the best `rows` trials, best first.
pub fn job_summary(
    results: &[TrialResult],
    total: usize,
    mode: Mode,
    metric: &str,
    rows: usize,
) -> serde_json::Value {
    let mut scored: Vec<&TrialResult> = results
        .iter()
        .filter(|r| r.metric.is_some_and(f64::is_finite))
        .collect();
    scored.sort_by(|a, b| {
        let order = a.metric.unwrap_or(0.0).total_cmp(&b.metric.unwrap_or(0.0));
        let order = if mode == Mode::Max {
            order.reverse()
        } else {
            order
        };
        order.then(a.trial_id.cmp(&b.trial_id))
    });
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    let best = scored.first().map_or_else(String::new, |r| {
        format!(
            ", best {metric} {:.4} (trial {})",
            r.metric.unwrap_or(0.0),
            r.trial_id
        )
    });
    let leaderboard: Vec<serde_json::Value> = scored
        .iter()
        .take(rows)
        .map(|r| {
            serde_json::json!({
                "trial": r.trial_id,
                metric: r.metric,
                "epochs": r.epochs,
                "stopped_early": r.stopped_early,
                "params": r.params,
            })
        })
        .collect();
    serde_json::json!({
        "kind": "sweep",
        "status": format!("{}/{total} trials done, {failed} failed{best}", results.len()),
        "leaderboard": leaderboard,
    })
}

/// Whether `candidate` ranks above `incumbent` as [`best`] ranks them: a better metric, or
/// the same with a lower trial id.
pub fn beats(candidate: &TrialResult, incumbent: &TrialResult, mode: Mode) -> bool {
    let (a, b) = (
        candidate.metric.unwrap_or(f64::NAN),
        incumbent.metric.unwrap_or(f64::NAN),
    );
    let order = match mode {
        Mode::Max => a.total_cmp(&b),
        Mode::Min => b.total_cmp(&a),
    };
    order.then(incumbent.trial_id.cmp(&candidate.trial_id)) == std::cmp::Ordering::Greater
}

/// The best trial of `results` for `mode` (failed ones left out).
pub fn best(results: &[TrialResult], mode: Mode) -> Option<&TrialResult> {
    let scored = results
        .iter()
        .filter(|r| r.metric.is_some_and(f64::is_finite));
    let key = |r: &&TrialResult| r.metric.unwrap_or(f64::NAN);
    match mode {
        Mode::Max => {
            scored.max_by(|a, b| key(a).total_cmp(&key(b)).then(b.trial_id.cmp(&a.trial_id)))
        }
        Mode::Min => {
            scored.min_by(|a, b| key(a).total_cmp(&key(b)).then(a.trial_id.cmp(&b.trial_id)))
        }
    }
}

fn format_value(value: &serde_json::Value) -> String {
    match value.as_f64() {
        Some(v) if value.is_f64() => format!("{v:.4e}"),
        _ => value.to_string(),
    }
}

/// The results as a table in trial order, the best trial marked with `*`.
pub fn format_table(results: &[TrialResult], summary: &SweepSummary) -> String {
    let mut sorted: Vec<&TrialResult> = results.iter().collect();
    sorted.sort_by_key(|r| r.trial_id);
    let names: Vec<&String> = sorted
        .first()
        .map(|r| r.params.keys().collect())
        .unwrap_or_default();
    let mut out = format!("{:>2} {:>5} ", "", "trial");
    for name in &names {
        out += &format!("{name:>12} ");
    }
    out += &format!(
        "{:>10} {:>6} {:>8} {:>8}\n",
        summary.metric_name, "epochs", "stopped", "wall_s"
    );
    for result in sorted {
        let mark = if summary.best_trial == Some(result.trial_id) {
            "*"
        } else {
            ""
        };
        out += &format!("{mark:>2} {:>5} ", result.trial_id);
        for name in &names {
            out += &format!(
                "{:>12} ",
                result
                    .params
                    .get(*name)
                    .map(format_value)
                    .unwrap_or_default()
            );
        }
        let metric = match (&result.error, result.metric) {
            (Some(_), _) | (_, None) => "failed".to_owned(),
            (None, Some(m)) => format!("{m:.4}"),
        };
        let stopped = if result.stopped_early { "early" } else { "" };
        out += &format!(
            "{metric:>10} {:>6} {stopped:>8} {:>8.2}\n",
            result.epochs, result.wall_s
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(id: usize, metric: Option<f64>) -> TrialResult {
        TrialResult {
            trial_id: id,
            params: Params::from([
                ("lr".to_owned(), json!(0.01 * (id + 1) as f64)),
                ("hidden".to_owned(), json!(64)),
            ]),
            metric,
            epochs: 4,
            stopped_early: id == 1,
            actor_id: "a".into(),
            wall_s: 1.5,
            metrics: vec![],
            train_s: 1.0,
            error: None,
            schedule: Vec::new(),
        }
    }

    #[test]
    fn a_trial_beats_the_incumbent_as_best_ranks_them() {
        let metrics = [Some(0.5), Some(0.7), Some(0.7), Some(0.2), Some(0.7)];
        for mode in [Mode::Max, Mode::Min] {
            let results: Vec<TrialResult> = [4, 2, 0, 3, 1]
                .iter()
                .map(|id| result(*id, metrics[*id]))
                .collect();
            // Folding in finishing order keeps what best() picks from all of them.
            let mut incumbent: Option<&TrialResult> = None;
            for candidate in &results {
                if incumbent.is_none_or(|i| beats(candidate, i, mode)) {
                    incumbent = Some(candidate);
                }
            }
            let expected = if mode == Mode::Max { 1 } else { 3 };
            assert_eq!(incumbent.map(|r| r.trial_id), Some(expected), "{mode:?}");
            assert_eq!(best(&results, mode).map(|r| r.trial_id), Some(expected));
        }
    }

    #[test]
    fn the_job_summary_ranks_the_best_first() {
        let mut failed = result(2, None);
        failed.error = Some("boom".into());
        let results = vec![
            result(0, Some(0.5)),
            result(1, Some(0.9)),
            failed,
            result(3, Some(0.7)),
        ];
        let summary = job_summary(&results, 10, Mode::Max, "accuracy", 2);
        assert_eq!(
            summary["status"],
            "4/10 trials done, 1 failed, best accuracy 0.9000 (trial 1)"
        );
        let board = summary["leaderboard"].as_array().unwrap();
        assert_eq!(board.len(), 2);
        assert_eq!(
            (board[0]["trial"].as_u64(), board[1]["trial"].as_u64()),
            (Some(1), Some(3))
        );
        assert_eq!(board[0]["accuracy"], 0.9);
        let low = job_summary(&results, 10, Mode::Min, "loss", 5);
        assert_eq!(low["leaderboard"][0]["trial"], 0);
    }

    #[test]
    fn best_and_table() {
        let results = vec![
            result(0, Some(0.5)),
            result(1, Some(0.7)),
            result(2, None),
            result(3, Some(0.7)),
        ];
        assert_eq!(
            best(&results, Mode::Max).unwrap().trial_id,
            1,
            "ties go to the earlier trial"
        );
        assert_eq!(best(&results, Mode::Min).unwrap().trial_id, 0);
        let summary: SweepSummary = serde_json::from_value(json!({
            "name": "s", "metric_name": "accuracy", "mode": "max", "best_trial": 1, "best_params": null,
            "best_metric": 0.7, "model_loads": 2, "actors": 2, "trials": 4, "stopped_early": 1, "failed": 1,
            "resumed_trials": 0, "epochs_trained": 16, "wall_s": 3.0, "embed_s": 1.0, "embedding_cache_hit": false,
            "examples": 10, "skipped_records": []
        }))
        .unwrap();
        let table = format_table(&results, &summary);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].contains("hidden") && lines[0].contains("accuracy"),
            "{table}"
        );
        assert!(
            lines[2].starts_with(" *     1")
                && lines[2].contains("0.7000")
                && lines[2].contains("early"),
            "{table}"
        );
        assert!(lines[3].contains("failed"), "{table}");
    }

    #[test]
    fn results_round_trip_and_cut_lines_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        append_result(&path, &result(0, Some(0.5))).unwrap();
        append_result(&path, &result(1, Some(0.6))).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"{\"trial_id\": 2, \"par").unwrap();
        assert_eq!(
            read_results(&path),
            vec![result(0, Some(0.5)), result(1, Some(0.6))]
        );
    }
}
