//! What a generate job counts of its records' scores and answers for its report's
//! evaluation figures (pure): accuracy over scored choices, perplexity over scored texts,
//! exact match by each filter, each by group. Counted per chunk as the answers come in and
//! kept with the chunk in the manifest ([`StoredEvaluation`]), so a resumed job's report
//! covers every chunk of its output, not only this run's.

use std::collections::BTreeMap;

use resident_actor::generate::Completion;
use serde::{Deserialize, Serialize};

use super::answer_match::RecordAnswers;
use super::group_accuracy::GroupCounts;
use super::overlap_sums::{OverlapMeans, OverlapSums};
use super::probability_sums::ProbabilitySums;
use super::shares::{share, share_stderr};
use crate::serde_skip::is_default;

/// The evaluation counts of a set of chunks (flattened into the report beside this run's
/// tokens; the maps by filter and group go to the report's own figures).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvaluationCounts {
    /// Record texts scored (`--score`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_texts: u64,
    /// Their tokens scored.
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_tokens: u64,
    /// The sum of those tokens' log-probabilities (natural log).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_logprob: f64,
    /// The sum of each text's log-probability squared (the spread of the texts' scores,
    /// for the per-text perplexity's standard error).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_logprob_squares: f64,
    /// The texts counted in `scored_logprob_squares`: all of them, unless some chunks
    /// were kept by a version that did not count it (then no standard error).
    #[serde(default, skip_serializing_if = "is_default")]
    pub squared_texts: u64,
    /// Of the texts scored, those each of whose tokens was the likeliest at its place:
    /// greedy decoding after the prompt writes them (lm-evaluation-harness's `is_greedy`,
    /// LAMBADA's accuracy).
    #[serde(default, skip_serializing_if = "is_default")]
    pub greedy_texts: u64,
    /// Of the texts scored, those scored whole (every token: none cut by
    /// `--max-score-windows`, the first after something, `--score-first-token` where nothing
    /// else came before it): what the word and byte figures count.
    #[serde(default, skip_serializing_if = "is_default")]
    pub whole_scored_texts: u64,
    /// Their UTF-8 bytes.
    #[serde(default, skip_serializing_if = "is_default")]
    pub whole_scored_bytes: u64,
    /// Their words, as lm-evaluation-harness counts them (`re.split(r"\s+", text)`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub whole_scored_words: u64,
    /// The sum of their tokens' log-probabilities.
    #[serde(default, skip_serializing_if = "is_default")]
    pub whole_scored_logprob: f64,
    /// Records whose choices were scored (a multiple-choice record, a preference pair).
    #[serde(default, skip_serializing_if = "is_default")]
    pub choice_records: u64,
    /// Of those, the records that named their right answer (a preference pair's is its
    /// `chosen`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub answered_records: u64,
    /// Of those, the records whose likeliest choice was the right one.
    #[serde(default, skip_serializing_if = "is_default")]
    pub correct_records: u64,
    /// Of those, the records whose likeliest choice per character was the right one.
    #[serde(default, skip_serializing_if = "is_default")]
    pub correct_normalized_records: u64,
    /// Of the answered records, those that named several right choices (TruthfulQA's
    /// MC2): `resident eval`'s `acc` is then the right choices' probability.
    #[serde(default, skip_serializing_if = "is_default")]
    pub several_answer_records: u64,
    /// The answered records' right choices' probabilities and Brier scores, summed.
    #[serde(flatten)]
    pub probabilities: ProbabilitySums,
    /// The (first) filter's answers checked against references.
    #[serde(flatten)]
    pub answers: AnswerCounts,
    /// Each named filter's (`--filter`; the report's `filters` holds them).
    #[serde(skip)]
    pub filters: BTreeMap<String, AnswerCounts>,
    /// The answered records' counts by group (`--accuracy-by`; the report's
    /// `accuracy_by_group` holds them).
    #[serde(skip)]
    pub groups: BTreeMap<String, GroupCounts>,
}

/// How one filter's answers fared against the records' references.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerCounts {
    /// Records with a reference answer (`--reference-field`) whose generation was
    /// checked against it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub reference_records: u64,
    /// Of those, the records whose (first) generated answer matched a reference.
    #[serde(default, skip_serializing_if = "is_default")]
    pub exact_match_records: u64,
    /// Records whose (first) generation the filter found no answer in.
    #[serde(default, skip_serializing_if = "is_default")]
    pub unextracted_records: u64,
    /// Of the records with a reference and several samples (`-n`), those with any sample
    /// right (pass@n).
    #[serde(default, skip_serializing_if = "is_default")]
    pub any_match_records: u64,
    /// Of those, the records whose samples' most common answer was right (maj@n).
    #[serde(default, skip_serializing_if = "is_default")]
    pub majority_match_records: u64,
    /// Records with a reference and several samples.
    #[serde(default, skip_serializing_if = "is_default")]
    pub sampled_reference_records: u64,
    /// The (first) generated answers' overlap figures with their references (`--metric`),
    /// summed by figure.
    #[serde(default, skip_serializing_if = "OverlapSums::is_empty")]
    pub overlap_sums: OverlapSums,
}

/// Values by name in a given order (a job's `--filter`s, as lm-evaluation-harness lists a
/// task's filters), written as a JSON object whose keys keep that order and read back in
/// the order the object has them (a JSON map type would sort them).
#[derive(Clone, Debug, PartialEq)]
pub struct InOrder<K, T>(pub(super) Vec<(K, T)>);

/// Each named filter's figures, in the job's order.
pub type FilterFigures = InOrder<String, AnswerFigures>;

impl<K, T> Default for InOrder<K, T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<K: AsRef<str>, T> InOrder<K, T> {
    /// Whether there are none (no named filters).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &T)> {
        self.0.iter().map(|(name, value)| (name.as_ref(), value))
    }

    /// The value named `name`.
    pub fn get(&self, name: &str) -> Option<&T> {
        self.iter()
            .find(|(named, _)| *named == name)
            .map(|(_, v)| v)
    }

    /// In `names`' order (those it does not name after, as they were).
    pub fn put_in_order<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let names: Vec<&str> = names.into_iter().collect();
        let place = |name: &str| names.iter().position(|n| *n == name).unwrap_or(names.len());
        self.0.sort_by_key(|(name, _)| place(name.as_ref()));
    }
}

impl<K, T> FromIterator<(K, T)> for InOrder<K, T> {
    fn from_iter<I: IntoIterator<Item = (K, T)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<K: Serialize, T: Serialize> Serialize for InOrder<K, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de, K: Deserialize<'de>, T: Deserialize<'de>> Deserialize<'de> for InOrder<K, T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Reads the object's entries in the order it has them.
        struct Entries<K, T>(std::marker::PhantomData<(K, T)>);
        impl<'de, K: Deserialize<'de>, T: Deserialize<'de>> serde::de::Visitor<'de> for Entries<K, T> {
            type Value = InOrder<K, T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("values by name")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(InOrder(entries))
            }
        }
        deserializer.deserialize_map(Entries(std::marker::PhantomData))
    }
}

/// One filter's figures: its counts and their shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerFigures {
    /// What it found and how often it was right.
    #[serde(flatten)]
    pub counts: AnswerCounts,
    /// How often, as shares.
    #[serde(flatten)]
    pub shares: AnswerShares,
}

/// The shares of one filter's counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerShares {
    /// `exact_match_records / reference_records`: how often the (first) generated answer
    /// matched a reference (absent without references).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match: Option<f64>,
    /// `any_match_records / sampled_reference_records` (pass@n; absent without samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match_any: Option<f64>,
    /// `majority_match_records / sampled_reference_records` (maj@n).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match_majority: Option<f64>,
    /// The standard error of `exact_match` (absent under two records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match_stderr: Option<f64>,
    /// The standard error of `exact_match_any`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match_any_stderr: Option<f64>,
    /// The standard error of `exact_match_majority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_match_majority_stderr: Option<f64>,
    /// The (first) generated answers' overlap figures: the means of `rouge1`, ..., `f1`
    /// with their standard errors, and the corpus's `bleu` and `chrf`.
    #[serde(flatten)]
    pub overlap: OverlapMeans,
}

/// [`EvaluationCounts`] as the manifest keeps them beside a chunk: the maps by filter and
/// group included.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredEvaluation {
    #[serde(flatten)]
    counts: EvaluationCounts,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    filters: BTreeMap<String, AnswerCounts>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    groups: BTreeMap<String, GroupCounts>,
}

impl From<EvaluationCounts> for StoredEvaluation {
    fn from(mut counts: EvaluationCounts) -> Self {
        let (filters, groups) = (
            std::mem::take(&mut counts.filters),
            std::mem::take(&mut counts.groups),
        );
        Self {
            counts,
            filters,
            groups,
        }
    }
}

impl From<StoredEvaluation> for EvaluationCounts {
    fn from(stored: StoredEvaluation) -> Self {
        Self {
            filters: stored.filters,
            groups: stored.groups,
            ..stored.counts
        }
    }
}

impl EvaluationCounts {
    /// Counts one record's scores and, when the job checks them, its generated answers by
    /// each filter; `group` is its group (`--accuracy-by`).
    pub(super) fn add(
        &mut self,
        completion: &Completion,
        group: Option<String>,
        answers: Option<&[RecordAnswers]>,
    ) {
        if let Some(answers) = answers {
            self.add_answers(answers, group.clone());
        }
        if let Some(score) = &completion.score {
            self.scored_texts += 1;
            self.scored_tokens += u64::from(score.tokens);
            self.scored_logprob += score.logprob;
            self.scored_logprob_squares += score.logprob * score.logprob;
            self.squared_texts += 1;
            self.greedy_texts += u64::from(score.greedy);
            if let Some(size) = score.size {
                self.whole_scored_texts += 1;
                self.whole_scored_bytes += size.bytes;
                self.whole_scored_words += size.words;
                self.whole_scored_logprob += score.logprob;
            }
        }
        if let Some(scored) = &completion.choice_scores {
            self.choice_records += 1;
            if let Some((plain, normalized)) = scored.correct() {
                self.answered_records += 1;
                self.correct_records += u64::from(plain);
                self.correct_normalized_records += u64::from(normalized);
                self.several_answer_records += u64::from(scored.answers.len() > 1);
                let (probability, brier) = (scored.answer_probability(), scored.brier_score());
                self.probabilities.add(probability, brier);
                if let Some(group) = group {
                    let counts = self.groups.entry(group).or_default();
                    counts.add(plain, Some(normalized));
                    counts.probabilities.add(probability, brier);
                }
            }
        }
    }

    /// Counts one record's generated answers by each filter; its group's by the first.
    fn add_answers(&mut self, answers: &[RecordAnswers], group: Option<String>) {
        let Some((first, named)) = answers.split_first() else {
            return;
        };
        let correct = self.answers.add(first);
        if let (Some(correct), Some(group)) = (correct, group) {
            let counts = self.groups.entry(group).or_default();
            counts.add(correct, None);
            if let Some(overlap) = first.samples.first().and_then(|j| j.overlap.as_ref()) {
                counts.overlap_sums.add(overlap);
            }
        }
        if first.filter.is_some() {
            for answers in std::iter::once(first).chain(named) {
                let name = answers.filter.clone().unwrap_or_default();
                self.filters.entry(name).or_default().add(answers);
            }
        }
    }

    /// Adds another chunk's counts.
    pub fn absorb(&mut self, other: EvaluationCounts) {
        self.scored_texts += other.scored_texts;
        self.scored_tokens += other.scored_tokens;
        self.scored_logprob += other.scored_logprob;
        self.scored_logprob_squares += other.scored_logprob_squares;
        self.squared_texts += other.squared_texts;
        self.greedy_texts += other.greedy_texts;
        self.whole_scored_texts += other.whole_scored_texts;
        self.whole_scored_bytes += other.whole_scored_bytes;
        self.whole_scored_words += other.whole_scored_words;
        self.whole_scored_logprob += other.whole_scored_logprob;
        self.choice_records += other.choice_records;
        self.answered_records += other.answered_records;
        self.correct_records += other.correct_records;
        self.correct_normalized_records += other.correct_normalized_records;
        self.several_answer_records += other.several_answer_records;
        self.probabilities.absorb(&other.probabilities);
        self.answers.absorb(&other.answers);
        for (name, counts) in &other.filters {
            self.filters.entry(name.clone()).or_default().absorb(counts);
        }
        for (group, counts) in other.groups {
            self.groups.entry(group).or_default().absorb(counts);
        }
    }

    /// The counts of every chunk `stored` holds, from the manifest's entries; `None` when
    /// one has none (a manifest from before they were kept) or cannot be read.
    pub fn of_chunks<'a>(
        stored: impl IntoIterator<Item = Option<&'a serde_json::Value>>,
    ) -> Option<Self> {
        let mut total = EvaluationCounts::default();
        for counts in stored {
            let chunk: StoredEvaluation = serde_json::from_value(counts?.clone()).ok()?;
            total.absorb(chunk.into());
        }
        Some(total)
    }
}

impl AnswerCounts {
    /// Counts one record's answers by one filter; whether its first sample was right
    /// (`None` without a reference).
    fn add(&mut self, answers: &RecordAnswers) -> Option<bool> {
        let first = answers.samples.first();
        self.unextracted_records += u64::from(first.is_some_and(|j| j.extracted.is_none()));
        if let Some(overlap) = first.and_then(|judged| judged.overlap.as_ref()) {
            self.overlap_sums.add(overlap);
        }
        let correct = answers.first_correct()?;
        self.reference_records += 1;
        self.exact_match_records += u64::from(correct);
        if let (Some(any), Some(majority)) = (answers.any_correct(), answers.majority) {
            self.sampled_reference_records += 1;
            self.any_match_records += u64::from(any);
            self.majority_match_records += u64::from(majority);
        }
        Some(correct)
    }

    /// Adds another chunk's counts of the same filter.
    fn absorb(&mut self, other: &AnswerCounts) {
        self.reference_records += other.reference_records;
        self.exact_match_records += other.exact_match_records;
        self.unextracted_records += other.unextracted_records;
        self.any_match_records += other.any_match_records;
        self.majority_match_records += other.majority_match_records;
        self.sampled_reference_records += other.sampled_reference_records;
        self.overlap_sums.absorb(&other.overlap_sums);
    }

    /// Their shares.
    pub(super) fn shares(&self) -> AnswerShares {
        AnswerShares {
            exact_match: share(self.exact_match_records, self.reference_records),
            exact_match_any: share(self.any_match_records, self.sampled_reference_records),
            exact_match_majority: share(
                self.majority_match_records,
                self.sampled_reference_records,
            ),
            exact_match_stderr: share_stderr(self.exact_match_records, self.reference_records),
            exact_match_any_stderr: share_stderr(
                self.any_match_records,
                self.sampled_reference_records,
            ),
            exact_match_majority_stderr: share_stderr(
                self.majority_match_records,
                self.sampled_reference_records,
            ),
            overlap: self.overlap_sums.means(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(correct: u64, group: &str, filter: &str) -> EvaluationCounts {
        let mut counts = EvaluationCounts {
            scored_texts: 1,
            scored_tokens: 10,
            scored_logprob: -2.5,
            scored_logprob_squares: 6.25,
            squared_texts: 1,
            choice_records: 2,
            answered_records: 2,
            correct_records: correct,
            correct_normalized_records: 1,
            several_answer_records: 1,
            probabilities: ProbabilitySums {
                answer_probability_records: 2,
                answer_probability_sum: 0.75,
                answer_probability_squares: 0.3125,
                brier_records: 1,
                brier_sum: 0.5,
                brier_squares: 0.25,
            },
            ..EvaluationCounts::default()
        };
        counts.answers.reference_records = 2;
        counts.answers.exact_match_records = correct;
        counts.filters.insert(filter.into(), counts.answers.clone());
        let mut group_counts = GroupCounts::default();
        group_counts.add(correct > 0, Some(true));
        counts.groups.insert(group.into(), group_counts);
        counts
    }

    /// A chunk's counts survive the manifest whole (the maps by filter and group too), and
    /// the chunks' counts add up to what one tally of all their records gives.
    #[test]
    fn chunks_counts_are_kept_whole_and_add_up() {
        let chunk = counts(1, "math", "strict");
        let stored = serde_json::to_value(StoredEvaluation::from(chunk.clone())).unwrap();
        assert_eq!(stored["groups"]["math"]["answered_records"], 1);
        assert_eq!(stored["filters"]["strict"]["exact_match_records"], 1);
        let back: StoredEvaluation = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(EvaluationCounts::from(back), chunk);
        let other = serde_json::to_value(StoredEvaluation::from(counts(2, "art", "strict")));
        let other = other.unwrap();
        let total = EvaluationCounts::of_chunks([Some(&stored), Some(&other)]).unwrap();
        assert_eq!(
            (
                total.correct_records,
                total.answered_records,
                total.scored_tokens
            ),
            (3, 4, 20)
        );
        assert_eq!(total.scored_logprob, -5.0);
        assert_eq!(
            (total.scored_logprob_squares, total.squared_texts),
            (12.5, 2)
        );
        assert_eq!(total.several_answer_records, 2);
        let sums = total.probabilities;
        assert_eq!(
            (
                sums.answer_probability_records,
                sums.answer_probability_sum,
                sums.answer_probability_squares
            ),
            (4, 1.5, 0.625)
        );
        assert_eq!(
            (sums.brier_records, sums.brier_sum, sums.brier_squares),
            (2, 1.0, 0.5)
        );
        assert_eq!(
            stored["brier_sum"], 0.5,
            "flattened into the manifest as before"
        );
        assert_eq!(total.filters["strict"].exact_match_records, 3);
        assert_eq!(total.filters["strict"].reference_records, 4);
        let groups: Vec<(&String, u64)> = (total.groups.iter())
            .map(|(name, group)| (name, group.correct_records))
            .collect();
        assert_eq!(groups, [(&"art".to_owned(), 1), (&"math".to_owned(), 1)]);
        assert_eq!(
            EvaluationCounts::of_chunks([Some(&stored), None]),
            None,
            "a chunk from before counts were kept: this run's only"
        );
        let report = serde_json::to_value(&total).unwrap();
        assert!(
            report.get("groups").is_none() && report.get("filters").is_none(),
            "the report's own figures hold the maps: {report}"
        );
    }

    #[test]
    fn filter_figures_keep_the_order_given_through_json() {
        let figures = |names: &[&str]| -> FilterFigures {
            (names.iter())
                .map(|name| {
                    let counts = AnswerCounts::default();
                    let shares = counts.shares();
                    (name.to_string(), AnswerFigures { counts, shares })
                })
                .collect()
        };
        let given = figures(&["strict-match", "flexible-extract"]);
        let json = serde_json::to_string(&given).unwrap();
        assert!(
            json.find("strict").unwrap() < json.find("flexible").unwrap(),
            "{json}"
        );
        let back: FilterFigures = serde_json::from_str(&json).unwrap();
        assert_eq!(back, given, "read back in the object's order");
        let names = |f: &FilterFigures| f.iter().map(|(n, _)| n.to_owned()).collect::<Vec<_>>();
        let mut sorted = figures(&["b", "c", "a"]);
        sorted.put_in_order(["a", "b"]);
        assert_eq!(names(&sorted), ["a", "b", "c"], "unnamed ones after");
        assert!(sorted.get("c").is_some() && sorted.get("d").is_none());
    }
}
