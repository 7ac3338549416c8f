//! A job's accuracy by a field of its records (`--accuracy-by subject`: MMLU's
//! per-subject table): each group's counts as chunks come in, and the report's figures,
//! with the mean over groups beside the job's accuracy over records. A scoring job counts
//! its likeliest choices, plain and per character; a generating job its exact matches
//! (`answer_match.rs`), which have no per-character measure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::reader::Kept;
use super::shares::{mean_stderr, share_stderr};

/// One group's records that named their answer, and how many the model got right.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupCounts {
    /// The group's records that named their answer.
    pub answered_records: u64,
    /// Those whose likeliest choice (or generated answer) was the right one.
    pub correct_records: u64,
    /// Those whose likeliest choice per character was the right one (absent for
    /// generated answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct_normalized_records: Option<u64>,
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
}

impl GroupCounts {
    /// Adds another chunk's counts of the same group.
    pub fn absorb(&mut self, other: GroupCounts) {
        self.answered_records += other.answered_records;
        self.correct_records += other.correct_records;
        if let Some(normalized) = other.correct_normalized_records {
            *self.correct_normalized_records.get_or_insert(0) += normalized;
        }
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
    /// Each group's figures, by the field's value.
    pub groups: BTreeMap<String, GroupFigures>,
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
        .map(|(group, &counts)| {
            let share = |records: u64| records as f64 / counts.answered_records as f64;
            let stderr = |records: u64| share_stderr(records, counts.answered_records);
            let figures = GroupFigures {
                counts,
                accuracy: share(counts.correct_records),
                accuracy_normalized: counts.correct_normalized_records.map(share),
                accuracy_stderr: stderr(counts.correct_records),
                accuracy_normalized_stderr: counts.correct_normalized_records.and_then(stderr),
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
        groups,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
