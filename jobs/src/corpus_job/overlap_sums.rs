//! The sums behind a generate job's mean overlap figures (pure): for each figure asked
//! for (`--metric`: ROUGE, SQuAD's F1), the records scored, the sum of their figures and
//! of their squares, so chunks add up in the manifest and the mean's standard error
//! follows, as [`super::probability_sums`] keeps the right choices' probabilities.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::shares::mean_with_stderr;
use super::text_overlap::{OverlapMetric, OverlapScores};

/// One figure's records, sum and sum of squares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MeanSums {
    /// The records scored.
    pub records: u64,
    /// The sum of their figures.
    pub sum: f64,
    /// The sum of their squares.
    pub squares: f64,
}

/// Every figure's sums, by figure (written by its name).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OverlapSums(BTreeMap<OverlapMetric, MeanSums>);

/// The mean figures and their standard errors, as the report writes them beside
/// `exact_match`: `rouge1`, `rouge1_stderr`, ..., `f1`, `f1_stderr` (absent where not
/// asked for; no error for one record).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverlapMeans {
    /// The mean ROUGE-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge1: Option<f64>,
    /// Its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge1_stderr: Option<f64>,
    /// The mean ROUGE-2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge2: Option<f64>,
    /// Its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge2_stderr: Option<f64>,
    /// The mean ROUGE-L.
    #[serde(default, rename = "rougeL", skip_serializing_if = "Option::is_none")]
    pub rouge_l: Option<f64>,
    /// Its standard error.
    #[serde(
        default,
        rename = "rougeL_stderr",
        skip_serializing_if = "Option::is_none"
    )]
    pub rouge_l_stderr: Option<f64>,
    /// The mean ROUGE-Lsum.
    #[serde(default, rename = "rougeLsum", skip_serializing_if = "Option::is_none")]
    pub rouge_lsum: Option<f64>,
    /// Its standard error.
    #[serde(
        default,
        rename = "rougeLsum_stderr",
        skip_serializing_if = "Option::is_none"
    )]
    pub rouge_lsum_stderr: Option<f64>,
    /// The mean SQuAD token F1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    /// Its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1_stderr: Option<f64>,
}

impl OverlapSums {
    /// Whether no record was scored.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Counts one record's figures.
    pub fn add(&mut self, scores: &OverlapScores) {
        for metric in OverlapMetric::ALL {
            if let Some(value) = scores.get(metric).filter(|v| v.is_finite()) {
                let sums = self.0.entry(metric).or_default();
                sums.records += 1;
                sums.sum += value;
                sums.squares += value * value;
            }
        }
    }

    /// Adds another chunk's sums.
    pub fn absorb(&mut self, other: &OverlapSums) {
        for (metric, theirs) in &other.0 {
            let ours = self.0.entry(*metric).or_default();
            ours.records += theirs.records;
            ours.sum += theirs.sum;
            ours.squares += theirs.squares;
        }
    }

    /// The records `metric` scored.
    pub fn records(&self, metric: OverlapMetric) -> u64 {
        self.0.get(&metric).map_or(0, |sums| sums.records)
    }

    /// `metric`'s mean and its standard error (`None` where it scored nothing).
    pub fn mean(&self, metric: OverlapMetric) -> Option<(f64, Option<f64>)> {
        let sums = self.0.get(&metric)?;
        mean_with_stderr(sums.sum, sums.squares, sums.records)
    }

    /// Every mean and standard error.
    pub fn means(&self) -> OverlapMeans {
        let mean = |metric| self.mean(metric).map(|(mean, _)| mean);
        let stderr = |metric| self.mean(metric).and_then(|(_, stderr)| stderr);
        use OverlapMetric::*;
        OverlapMeans {
            rouge1: mean(Rouge1),
            rouge1_stderr: stderr(Rouge1),
            rouge2: mean(Rouge2),
            rouge2_stderr: stderr(Rouge2),
            rouge_l: mean(RougeL),
            rouge_l_stderr: stderr(RougeL),
            rouge_lsum: mean(RougeLsum),
            rouge_lsum_stderr: stderr(RougeLsum),
            f1: mean(F1),
            f1_stderr: stderr(F1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks' sums add up to one tally's, survive JSON by name, and give the mean with
    /// the standard error of the mean.
    #[test]
    fn sums_add_up_and_give_means_with_their_errors() {
        let scores = |rouge1: f64, f1: Option<f64>| OverlapScores {
            rouge1: Some(rouge1),
            f1,
            ..OverlapScores::default()
        };
        let (mut one, mut other, mut all) = <(OverlapSums, OverlapSums, OverlapSums)>::default();
        for (sums, score) in [
            (&mut one, scores(0.5, Some(1.0))),
            (&mut other, scores(0.25, None)),
        ] {
            OverlapSums::add(sums, &score);
            all.add(&score);
        }
        let json = serde_json::to_value(&one).unwrap();
        assert_eq!(json["rouge1"]["records"], 1, "{json}");
        let mut total: OverlapSums = serde_json::from_value(json).unwrap();
        total.absorb(&other);
        assert_eq!(total, all);
        assert_eq!(
            (
                total.records(OverlapMetric::Rouge1),
                total.records(OverlapMetric::F1)
            ),
            (2, 1)
        );
        let means = total.means();
        assert_eq!(means.rouge1, Some(0.375));
        // The sample standard deviation of 0.5 and 0.25 over the root of 2 records.
        let stderr = means.rouge1_stderr.unwrap();
        assert!((stderr - 0.125).abs() < 1e-12, "{stderr}");
        assert_eq!((means.f1, means.f1_stderr), (Some(1.0), None));
        let report = serde_json::to_value(&means).unwrap();
        assert!(report.get("rougeL").is_none() && report["rouge1_stderr"].is_number());
        assert!(OverlapSums::default().is_empty() && !total.is_empty());
    }
}
