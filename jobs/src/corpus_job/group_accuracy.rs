//! A job's accuracy by a field of its records (`--accuracy-by subject`: MMLU's
//! per-subject table): each group's counts as chunks come in, and the report's figures,
//! with the mean over groups beside the job's accuracy over records. A scoring job counts
//! its likeliest choices, plain and per character; a generating job its exact matches
//! (`answer_match.rs`), which have no per-character measure, and its answers' overlap
//! figures (`--metric`: ROUGE, F1, BLEU, chrF) by group too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::overlap_sums::{OverlapMeans, OverlapSums};
use super::probability_sums::ProbabilitySums;
use super::reader::Kept;
use super::shares::{mean_stderr, share_stderr};

/// One group's records that named their answer, and how many the model got right.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupCounts {
    /// The group's records that named their answer.
    pub answered_records: u64,
    /// Those whose likeliest choice (or generated answer) was the right one.
    pub correct_records: u64,
    /// Those whose likeliest choice per character was the right one (absent for
    /// generated answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct_normalized_records: Option<u64>,
    /// The group's right choices' probabilities and Brier scores, summed (scoring):
    /// TruthfulQA MC2's figure and calibration, by group.
    #[serde(flatten)]
    pub probabilities: ProbabilitySums,
    /// The group's generated answers' overlap figures, summed (`--metric`).
    #[serde(default, skip_serializing_if = "OverlapSums::is_empty")]
    pub overlap_sums: OverlapSums,
}

impl GroupCounts {
    /// Counts one answered record, right or not by each measure (`correct_normalized`:
    /// `None` where there is no per-character measure).
    pub fn add(&mut self, correct: bool, correct_normalized: Option<bool>) {
        self.answered_records += 1;
        self.correct_records += u64::from(correct);
        if let Some(normalized) = correct_normalized {
            *self.correct_normalized_records.get_or_insert(0) += u64::from(normalized);
        }
    }

    /// Adds another chunk's counts of the same group.
    pub fn absorb(&mut self, other: GroupCounts) {
        self.answered_records += other.answered_records;
        self.correct_records += other.correct_records;
        if let Some(normalized) = other.correct_normalized_records {
            *self.correct_normalized_records.get_or_insert(0) += normalized;
        }
        self.probabilities.absorb(&other.probabilities);
        self.overlap_sums.absorb(&other.overlap_sums);
    }
}

/// One group's line of the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupFigures {
    /// Its records, answered and right.
    #[serde(flatten)]
    pub counts: GroupCounts,
    /// `correct_records / answered_records`.
    pub accuracy: f64,
    /// `correct_normalized_records / answered_records` (absent for generated answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_normalized: Option<f64>,
    /// The standard error of `accuracy` (absent for a group of one record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_stderr: Option<f64>,
    /// The standard error of `accuracy_normalized`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_normalized_stderr: Option<f64>,
    /// The mean right choices' probability among the choices (scoring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_probability: Option<f64>,
    /// Its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_probability_stderr: Option<f64>,
    /// The mean Brier score (records of one right answer; lower is better).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brier_score: Option<f64>,
    /// Its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brier_score_stderr: Option<f64>,
    /// The group's overlap figures (`rouge1`, `rouge1_stderr`, ..., `bleu`, `chrf`).
    #[serde(flatten)]
    pub overlap: OverlapMeans,
}

/// The report's `accuracy_by_group`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyByGroup {
    /// The field whose values name the groups.
    pub field: String,
    /// The mean of the groups' accuracies, each group counting once (the job's
    /// `accuracy` counts each record once).
    pub mean_accuracy: f64,
    /// The same per character (absent for generated answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_accuracy_normalized: Option<f64>,
    /// The standard error of `mean_accuracy`, the groups taken as independent (absent when
    /// a group has one record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_accuracy_stderr: Option<f64>,
    /// The standard error of `mean_accuracy_normalized`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_accuracy_normalized_stderr: Option<f64>,
    /// The mean of the groups' answer probabilities (when every group has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_answer_probability: Option<f64>,
    /// Its standard error, the groups taken as independent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_answer_probability_stderr: Option<f64>,
    /// The mean of the groups' Brier scores (when every group has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_brier_score: Option<f64>,
    /// Its standard error, the groups taken as independent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_brier_score_stderr: Option<f64>,
    /// Each group's figures, by the field's value.
    pub groups: BTreeMap<String, GroupFigures>,
}

/// A mean and its standard error apart (`None` for both without values).
fn split(mean: Option<(f64, Option<f64>)>) -> (Option<f64>, Option<f64>) {
    match mean {
        Some((mean, stderr)) => (Some(mean), stderr),
        None => (None, None),
    }
}

/// The group of a record whose carried fields are `kept`: its `field` as text (another
/// value as JSON writes it: `null` for a record without the field).
pub fn group_of(kept: Option<&Kept>, field: &str) -> String {
    match kept.and_then(|kept| kept.get(field)) {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => Value::Null.to_string(),
    }
}

/// The report's figures of `groups` by `field`; `None` when no record named its answer.
pub fn accuracy_by_group(
    field: &str,
    groups: &BTreeMap<String, GroupCounts>,
) -> Option<AccuracyByGroup> {
    let groups: BTreeMap<String, GroupFigures> = groups
        .iter()
        .filter(|(_, counts)| counts.answered_records > 0)
        .map(|(group, counts)| {
            let share = |records: u64| records as f64 / counts.answered_records as f64;
            let stderr = |records: u64| share_stderr(records, counts.answered_records);
            let (answer_probability, answer_probability_stderr) =
                split(counts.probabilities.answer_probability());
            let (brier_score, brier_score_stderr) = split(counts.probabilities.brier_score());
            let figures = GroupFigures {
                overlap: counts.overlap_sums.means(),
                counts: counts.clone(),
                accuracy: share(counts.correct_records),
                accuracy_normalized: counts.correct_normalized_records.map(share),
                accuracy_stderr: stderr(counts.correct_records),
                accuracy_normalized_stderr: counts.correct_normalized_records.and_then(stderr),
                answer_probability,
                answer_probability_stderr,
                brier_score,
                brier_score_stderr,
            };
            (group.clone(), figures)
        })
        .collect();
    if groups.is_empty() {
        return None;
    }
    let mean = |of: fn(&GroupFigures) -> Option<f64>| {
        let values: Option<Vec<f64>> = groups.values().map(of).collect();
        Some(values?.iter().sum::<f64>() / groups.len() as f64)
    };
    Some(AccuracyByGroup {
        field: field.to_owned(),
        mean_accuracy: mean(|g| Some(g.accuracy)).unwrap_or_default(),
        mean_accuracy_normalized: mean(|g| g.accuracy_normalized),
        mean_accuracy_stderr: mean_stderr(groups.values().map(|g| g.accuracy_stderr)),
        mean_accuracy_normalized_stderr: mean_stderr(
            groups.values().map(|g| g.accuracy_normalized_stderr),
        ),
        mean_answer_probability: mean(|g| g.answer_probability),
        mean_answer_probability_stderr: mean_stderr(
            groups.values().map(|g| g.answer_probability_stderr),
        ),
        mean_brier_score: mean(|g| g.brier_score),
        mean_brier_score_stderr: mean_stderr(groups.values().map(|g| g.brier_score_stderr)),
        groups,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::shares::mean_with_stderr;

    use super::*;

    /// Each group's accuracy is its own records' share; the mean counts each group once;
    /// a record without the field is the `null` group.
    #[test]
    fn each_group_s_accuracy_and_their_mean() {
        let kept =
            |subject: Value| -> Kept { [("subject".to_owned(), subject)].into_iter().collect() };
        let mut groups: BTreeMap<String, GroupCounts> = BTreeMap::new();
        let answers = [
            (json!("math"), true, true),
            (json!("math"), false, true),
            (json!("math"), false, false),
            (json!("art"), true, false),
            (json!(7), true, true),
        ];
        for (subject, right, right_normalized) in answers {
            let group = group_of(Some(&kept(subject)), "subject");
            groups
                .entry(group)
                .or_default()
                .add(right, Some(right_normalized));
        }
        assert_eq!(group_of(None, "subject"), "null");
        assert_eq!(group_of(Some(&kept(json!("x"))), "topic"), "null");
        let figures = accuracy_by_group("subject", &groups).unwrap();
        assert_eq!(figures.groups["math"].accuracy, 1.0 / 3.0);
        assert_eq!(figures.groups["math"].accuracy_normalized, Some(2.0 / 3.0));
        assert_eq!(
            figures.groups["art"].counts.correct_normalized_records,
            Some(0)
        );
        assert_eq!(figures.groups["7"].accuracy, 1.0);
        // Summed in the groups' order: "7", "art", "math".
        assert_eq!(figures.mean_accuracy, (1.0 + 1.0 + 1.0 / 3.0) / 3.0);
        let normalized = (1.0 + 0.0 + 2.0 / 3.0) / 3.0;
        assert_eq!(figures.mean_accuracy_normalized, Some(normalized));
        assert_eq!(figures.groups["math"].accuracy_stderr, share_stderr(1, 3));
        assert_eq!(
            (
                figures.groups["art"].accuracy_stderr,
                figures.mean_accuracy_stderr
            ),
            (None, None),
            "a group of one record has no error, nor then has the mean"
        );
        groups.remove("art");
        groups.remove("7");
        groups
            .entry("art".into())
            .or_default()
            .add(true, Some(false));
        groups
            .entry("art".into())
            .or_default()
            .add(false, Some(false));
        let two = accuracy_by_group("subject", &groups).unwrap();
        let (math, art) = (share_stderr(1, 3).unwrap(), share_stderr(1, 2).unwrap());
        assert_eq!(
            two.mean_accuracy_stderr,
            mean_stderr([Some(art), Some(math)])
        );
        assert_eq!(
            two.mean_accuracy_normalized_stderr,
            mean_stderr([share_stderr(0, 2), share_stderr(2, 3)])
        );
        let report = serde_json::to_value(&figures).unwrap();
        assert_eq!(report["field"], "subject");
        assert_eq!(report["groups"]["math"]["answered_records"], 3);
        assert_eq!(report["groups"]["math"]["correct_records"], 1);
        assert_eq!(report["groups"]["art"]["correct_normalized_records"], 0);
        assert_eq!(report["groups"]["art"]["accuracy_normalized"], 0.0);
        assert!(accuracy_by_group("subject", &BTreeMap::new()).is_none());
    }

    /// A scoring job's groups also have their mean right choices' probability and Brier
    /// score, each with its error, and the means over groups; chunks' counts add up;
    /// generated answers and counts stored before have none.
    #[test]
    fn each_group_has_its_answer_probability_and_brier_score() {
        let mut groups: BTreeMap<String, GroupCounts> = BTreeMap::new();
        for (group, p, b) in [("a", 0.5, 0.5), ("a", 0.9, 0.02), ("b", 0.2, 1.28)] {
            let counts = groups.entry(group.into()).or_default();
            counts.add(p > 0.5, Some(p > 0.5));
            counts.probabilities.add(Some(p), Some(b));
        }
        let figures = accuracy_by_group("category", &groups).unwrap();
        let close = |a: Option<f64>, b: f64| assert!((a.unwrap() - b).abs() < 1e-12, "{a:?} {b}");
        let a = &figures.groups["a"];
        close(a.answer_probability, 0.7);
        close(a.brier_score, 0.26);
        let expected = mean_with_stderr(0.5 + 0.9, 0.25 + 0.81, 2)
            .unwrap()
            .1
            .unwrap();
        close(a.answer_probability_stderr, expected);
        assert_eq!(figures.groups["b"].brier_score_stderr, None, "one record");
        close(figures.mean_answer_probability, (0.7 + 0.2) / 2.0);
        close(figures.mean_brier_score, (0.26 + 1.28) / 2.0);
        assert_eq!(figures.mean_answer_probability_stderr, None);
        let mut twice = groups["a"].clone();
        twice.absorb(groups["a"].clone());
        let (once, twice) = (groups["a"].probabilities, twice.probabilities);
        assert_eq!(
            (twice.answer_probability_records, twice.brier_records),
            (4, 4)
        );
        close(Some(twice.brier_sum), 2.0 * once.brier_sum);
        let mut plain: BTreeMap<String, GroupCounts> = BTreeMap::new();
        plain.entry("x".into()).or_default().add(true, None);
        let report = serde_json::to_value(accuracy_by_group("t", &plain).unwrap()).unwrap();
        assert!(report.get("mean_answer_probability").is_none(), "{report}");
        assert!(
            report["groups"]["x"]
                .get("answer_probability_records")
                .is_none()
        );
        let stored: GroupCounts =
            serde_json::from_value(json!({"answered_records": 2, "correct_records": 1})).unwrap();
        assert_eq!(stored.probabilities, ProbabilitySums::default());
    }

    /// Generated answers' overlap figures by group: each group's mean and error of its own
    /// records' figures, BLEU the group's corpus figure; chunks add up.
    #[test]
    fn each_group_has_its_answers_overlap_figures() {
        use super::super::text_overlap::{OverlapMetric, RougeWords, overlap_scores};
        let metrics = [OverlapMetric::Rouge1, OverlapMetric::Bleu];
        let reference = ["the storm hit the coast".to_owned()];
        let mut groups: BTreeMap<String, GroupCounts> = BTreeMap::new();
        let mut rouge = BTreeMap::<&str, Vec<f64>>::new();
        for (group, answer) in [
            ("news", "the storm hit the coast"),
            ("news", "a storm hit"),
            ("sport", "a team won"),
        ] {
            let scores =
                overlap_scores(&metrics, RougeWords::default(), Some(answer), &reference).unwrap();
            rouge.entry(group).or_default().push(scores.rouge1.unwrap());
            let counts = groups.entry(group.into()).or_default();
            counts.add(false, None);
            counts.overlap_sums.add(&scores);
        }
        let stored = serde_json::to_value(&groups["news"]).unwrap();
        let mut news: GroupCounts = serde_json::from_value(stored).unwrap();
        news.absorb(GroupCounts::default());
        assert_eq!(news, groups["news"], "kept whole through the manifest");
        let figures = accuracy_by_group("section", &groups).unwrap();
        let news = &figures.groups["news"];
        let values = &rouge["news"];
        let (sum, squares) = (values[0] + values[1], values[0].powi(2) + values[1].powi(2));
        let (mean, stderr) = mean_with_stderr(sum, squares, 2).unwrap();
        assert_eq!(
            (news.overlap.rouge1, news.overlap.rouge1_stderr),
            (Some(mean), stderr)
        );
        assert_eq!(figures.groups["sport"].overlap.rouge1, Some(0.0));
        assert_eq!(figures.groups["sport"].overlap.bleu, Some(0.0));
        assert!(news.overlap.bleu.unwrap() > 50.0, "{news:?}");
        let report = serde_json::to_value(&figures).unwrap();
        assert!(
            report["groups"]["news"]["rouge1_stderr"].is_number(),
            "{report}"
        );
    }

    /// Generated answers' groups have no per-character figures, in the report either.
    #[test]
    fn exact_matches_by_group_have_no_per_character_accuracy() {
        let mut groups: BTreeMap<String, GroupCounts> = BTreeMap::new();
        for (group, right) in [("a", true), ("a", false), ("b", true)] {
            groups.entry(group.into()).or_default().add(right, None);
        }
        let figures = accuracy_by_group("task", &groups).unwrap();
        assert_eq!(figures.mean_accuracy, (0.5 + 1.0) / 2.0);
        assert_eq!(figures.mean_accuracy_normalized, None);
        let report = serde_json::to_value(&figures).unwrap();
        assert!(report.get("mean_accuracy_normalized").is_none(), "{report}");
        let a = &report["groups"]["a"];
        assert_eq!(
            (a["answered_records"].as_u64(), a["accuracy"].as_f64()),
            (Some(2), Some(0.5))
        );
        assert!(
            a.get("accuracy_normalized").is_none() && a.get("correct_normalized_records").is_none()
        );
    }
}
