//! The sums behind a generate job's overlap figures (pure): for each figure the report
//! gives as a mean (`--metric`: ROUGE, SQuAD's F1), the records scored, the sum of their
//! figures and of their squares, so chunks add up in the manifest and the mean's standard
//! error follows, as [`super::probability_sums`] keeps the right choices' probabilities;
//! for the corpus figures (BLEU, chrF), the records' match statistics summed, from which
//! `sacrebleu` computes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sacrebleu_figures::{BleuStats, ChrfStats};
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

/// Every figure's sums.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverlapSums {
    /// The figures reported as means, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    means: BTreeMap<OverlapMetric, MeanSums>,
    /// BLEU's statistics, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bleu: Option<BleuStats>,
    /// chrF's statistics, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chrf: Option<ChrfStats>,
}

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
    /// The corpus BLEU (0 to 100; no standard error, as `sacrebleu` gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bleu: Option<f64>,
    /// The corpus chrF (0 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrf: Option<f64>,
}

impl OverlapSums {
    /// Whether no record was scored.
    pub fn is_empty(&self) -> bool {
        self.means.is_empty() && self.bleu.is_none() && self.chrf.is_none()
    }

    /// Counts one record's figures.
    pub fn add(&mut self, scores: &OverlapScores) {
        for metric in OverlapMetric::ALL
            .into_iter()
            .filter(|m| !m.is_corpus_figure())
        {
            if let Some(value) = scores.get(metric).filter(|v| v.is_finite()) {
                let sums = self.means.entry(metric).or_default();
                sums.records += 1;
                sums.sum += value;
                sums.squares += value * value;
            }
        }
        if let Some(stats) = &scores.bleu_stats {
            self.bleu.get_or_insert_default().add(stats);
        }
        if let Some(stats) = &scores.chrf_stats {
            self.chrf.get_or_insert_default().add(stats);
        }
    }

    /// Adds another chunk's sums.
    pub fn absorb(&mut self, other: &OverlapSums) {
        for (metric, theirs) in &other.means {
            let ours = self.means.entry(*metric).or_default();
            ours.records += theirs.records;
            ours.sum += theirs.sum;
            ours.squares += theirs.squares;
        }
        if let Some(stats) = &other.bleu {
            self.bleu.get_or_insert_default().add(stats);
        }
        if let Some(stats) = &other.chrf {
            self.chrf.get_or_insert_default().add(stats);
        }
    }

    /// The records `metric` scored.
    pub fn records(&self, metric: OverlapMetric) -> u64 {
        match metric {
            OverlapMetric::Bleu => self.bleu.map_or(0, |stats| stats.records),
            OverlapMetric::Chrf => self.chrf.map_or(0, |stats| stats.records),
            _ => self.means.get(&metric).map_or(0, |sums| sums.records),
        }
    }

    /// `metric`'s figure and its standard error (`None` where it scored nothing): the
    /// records' mean, or the corpus's BLEU or chrF (with no error).
    pub fn mean(&self, metric: OverlapMetric) -> Option<(f64, Option<f64>)> {
        match metric {
            OverlapMetric::Bleu => self.bleu.map(|stats| (stats.score(false), None)),
            OverlapMetric::Chrf => self.chrf.map(|stats| (stats.score(), None)),
            _ => {
                let sums = self.means.get(&metric)?;
                mean_with_stderr(sums.sum, sums.squares, sums.records)
            }
        }
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
            bleu: mean(Bleu),
            chrf: mean(Chrf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::text_overlap::{RougeWords, overlap_scores};
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
        assert_eq!(json["means"]["rouge1"]["records"], 1, "{json}");
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

    /// BLEU and chrF are the corpus's, from the statistics the chunks add up, not the mean
    /// of the lines' sentence figures; they have no standard error.
    #[test]
    fn corpus_figures_come_from_the_summed_statistics() {
        let references = ["The cat is sitting on the mat.".to_owned()];
        let metrics = [OverlapMetric::Bleu, OverlapMetric::Chrf];
        let scored = |answer: &str| {
            overlap_scores(&metrics, RougeWords::default(), Some(answer), &references).unwrap()
        };
        let (first, second) = (scored("The cat sat on the mat."), scored("A cat, on a mat"));
        let (mut one, mut other) = (OverlapSums::default(), OverlapSums::default());
        one.add(&first);
        other.add(&second);
        let mut total: OverlapSums =
            serde_json::from_value(serde_json::to_value(&one).unwrap()).unwrap();
        total.absorb(&other);
        let mut bleu = first.bleu_stats.unwrap();
        bleu.add(&second.bleu_stats.unwrap());
        let mut chrf = first.chrf_stats.unwrap();
        chrf.add(&second.chrf_stats.unwrap());
        assert_eq!(
            total.mean(OverlapMetric::Bleu),
            Some((bleu.score(false), None))
        );
        assert_eq!(total.mean(OverlapMetric::Chrf), Some((chrf.score(), None)));
        assert_eq!(total.records(OverlapMetric::Bleu), 2);
        let sentence_mean = (first.bleu.unwrap() + second.bleu.unwrap()) / 2.0;
        assert_ne!(total.means().bleu, Some(sentence_mean));
        let report = serde_json::to_value(total.means()).unwrap();
        assert!(report["chrf"].is_number() && report.get("bleu_stderr").is_none());
        assert!(total.means.is_empty(), "no mean kept for a corpus figure");
    }
}
