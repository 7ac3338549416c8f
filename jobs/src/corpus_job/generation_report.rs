//! A generate job's report figures: the tallies of its chunks' answers as they come in
//! ([`GenerationTally`]) and what the report makes of them ([`GenerateFigures`]).

use std::collections::BTreeMap;
use std::time::Duration;

use resident_actor::generate::{Completion, FinishReason};
use serde::{Deserialize, Serialize};

use super::answer_match::RecordAnswers;
use super::group_accuracy::{AccuracyByGroup, GroupCounts};
use super::shares::{share, share_stderr};

/// The report's figures of a generate job (this run's chunks).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationTally {
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompts whose record text was cut from its middle to fit the context (scored:
    /// whose text was not scored to its end, `--max-score-windows`).
    pub truncated_prompts: u64,
    /// Completions that ended at the model's end token or a stop string.
    pub finished_by_stop: u64,
    /// Completions that ended at `--max-new-tokens` or the context's end.
    pub finished_by_length: u64,
    /// Records answered with an error instead of a completion (an invalid request of an
    /// OpenAI Batch line, a conversation the chat template refuses).
    #[serde(default)]
    pub failed_requests: u64,
    /// Record texts scored (`--score`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_texts: u64,
    /// Their tokens scored.
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_tokens: u64,
    /// The sum of those tokens' log-probabilities (natural log).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scored_logprob: f64,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl AnswerCounts {
    /// Counts one record's answers by one filter; whether its first sample was right
    /// (`None` without a reference).
    fn add(&mut self, answers: &RecordAnswers) -> Option<bool> {
        let first = answers.samples.first();
        self.unextracted_records += u64::from(first.is_some_and(|j| j.extracted.is_none()));
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

    /// Their shares.
    fn shares(&self) -> AnswerShares {
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
        }
    }
}

/// Whether a report figure is at its default (left out of a report that never scored).
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// A generate job's own figures: this run's tokens, in and out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GenerateFigures {
    /// This run's tokens and prompts.
    #[serde(flatten)]
    pub tally: GenerationTally,
    /// Prompt tokens (prefilled) per wall second of this run.
    pub prompt_tokens_per_second: f64,
    /// Generated tokens per wall second of this run.
    pub generated_tokens_per_second: f64,
    /// `exp(-scored_logprob / scored_tokens)`: the perplexity of every text this run scored
    /// as one corpus (absent when it scored none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored_perplexity: Option<f64>,
    /// `correct_records / answered_records`: how often the likeliest choice was the right
    /// one (absent when no record named its answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// The same by log-probability per character.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_normalized: Option<f64>,
    /// The standard error of `accuracy` (lm-evaluation-harness's `acc_stderr`; absent
    /// under two answered records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_stderr: Option<f64>,
    /// The standard error of `accuracy_normalized`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_normalized_stderr: Option<f64>,
    /// The (first) filter's shares: `exact_match`, `exact_match_any` (pass@n),
    /// `exact_match_majority` (maj@n), each absent without references (or samples), and
    /// their standard errors.
    #[serde(flatten)]
    pub answers: AnswerShares,
    /// Each named filter's counts and shares, by name (`--filter`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filters: BTreeMap<String, AnswerFigures>,
    /// Both accuracies by the groups of `--accuracy-by` (absent without it, or when no
    /// record named its answer); a generating job's exact match there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_by_group: Option<AccuracyByGroup>,
}

impl GenerationTally {
    /// Counts one record's answer; `group` is its group when the accuracy is broken down
    /// (`--accuracy-by`); `answers`, its samples checked against its references when the
    /// job checks them, by each filter (the first is the report's own).
    pub(super) fn add(
        &mut self,
        completion: &Completion,
        group: Option<String>,
        answers: Option<&[RecordAnswers]>,
    ) {
        if completion.error.is_some() {
            self.failed_requests += 1;
            return;
        }
        if let Some(answers) = answers {
            self.add_answers(answers, group.clone());
        }
        self.prompt_tokens += u64::from(completion.prompt_tokens);
        self.generated_tokens += completion.all_generated_tokens();
        self.truncated_prompts += u64::from(completion.truncated);
        if let Some(score) = &completion.score {
            self.scored_texts += 1;
            self.scored_tokens += u64::from(score.tokens);
            self.scored_logprob += score.logprob;
        }
        if let Some(scored) = &completion.choice_scores {
            self.choice_records += 1;
            if let Some((plain, normalized)) = scored.correct() {
                self.answered_records += 1;
                self.correct_records += u64::from(plain);
                self.correct_normalized_records += u64::from(normalized);
                if let Some(group) = group {
                    let counts = self.groups.entry(group).or_default();
                    counts.add(plain, Some(normalized));
                }
            }
        }
        for choice in completion.choices() {
            match choice.finish_reason {
                FinishReason::Stop => self.finished_by_stop += 1,
                FinishReason::Length => self.finished_by_length += 1,
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
            self.groups.entry(group).or_default().add(correct, None);
        }
        if first.filter.is_some() {
            for answers in std::iter::once(first).chain(named) {
                let name = answers.filter.clone().unwrap_or_default();
                self.filters.entry(name).or_default().add(answers);
            }
        }
    }

    /// The report's figures of a generate job that ran `wall`.
    pub(super) fn figures(self, wall: Duration) -> GenerateFigures {
        let seconds = wall.as_secs_f64().max(1e-9);
        GenerateFigures {
            prompt_tokens_per_second: self.prompt_tokens as f64 / seconds,
            generated_tokens_per_second: self.generated_tokens as f64 / seconds,
            scored_perplexity: (self.scored_tokens > 0)
                .then(|| (-self.scored_logprob / self.scored_tokens as f64).exp()),
            accuracy: share(self.correct_records, self.answered_records),
            accuracy_normalized: share(self.correct_normalized_records, self.answered_records),
            accuracy_stderr: share_stderr(self.correct_records, self.answered_records),
            accuracy_normalized_stderr: share_stderr(
                self.correct_normalized_records,
                self.answered_records,
            ),
            answers: self.answers.shares(),
            filters: (self.filters.iter())
                .map(|(name, counts)| {
                    let figures = AnswerFigures {
                        counts: counts.clone(),
                        shares: counts.shares(),
                    };
                    (name.clone(), figures)
                })
                .collect(),
            accuracy_by_group: None,
            tally: self,
        }
    }
}
