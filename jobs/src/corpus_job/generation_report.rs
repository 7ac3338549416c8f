//! A generate job's report figures: the tallies of its chunks' answers as they come in
//! ([`GenerationTally`]) and what the report makes of them ([`GenerateFigures`]).

use std::f64::consts::LN_2;
use std::time::Duration;

use resident_actor::generate::{Completion, FinishReason};
use serde::{Deserialize, Serialize};

use crate::serde_skip::is_default;

use super::answer_match::RecordAnswers;
use super::evaluation_counts::{AnswerFigures, AnswerShares, EvaluationCounts, FilterFigures};
use super::group_accuracy::AccuracyByGroup;
use super::shares::{mean_with_stderr, share, share_stderr};

/// The report's figures of a generate job: this run's tokens and completions, and what it
/// counted of the records' scores and answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationTally {
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Of them, the tokens reasoning models thought in (`--reasoning-parser`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub reasoning_tokens: u64,
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
    /// What it counted of the records' scores and answers: over every chunk of the
    /// output once the job ends (the manifest keeps each chunk's), this run's until then.
    #[serde(flatten)]
    pub evaluation: EvaluationCounts,
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
    /// `exp(-scored_logprob / scored_texts)`: lm-evaluation-harness's `perplexity` of a
    /// `loglikelihood` task (LAMBADA's), the mean text's log-likelihood rather than the
    /// mean token's (absent when it scored none, or too large for a number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_perplexity: Option<f64>,
    /// Its standard error: `text_perplexity` times the standard error of the mean text
    /// log-likelihood (the delta method, which approximates the bootstrap
    /// lm-evaluation-harness runs for LAMBADA's perplexity; absent under two texts, or
    /// when earlier chunks of a resumed output did not count the texts' spread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_perplexity_stderr: Option<f64>,
    /// `greedy_texts / scored_texts`: how often greedy decoding writes the scored text
    /// (lm-evaluation-harness's `acc` of a `loglikelihood` task, LAMBADA's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greedy_share: Option<f64>,
    /// Its standard error (absent under two texts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greedy_share_stderr: Option<f64>,
    /// The job's texts were scored after a prompt before them (`--prompt` with text
    /// before `{text}`, few-shot examples: lm-evaluation-harness's `loglikelihood`), not
    /// alone (its `loglikelihood_rolling`): which of the figures above `resident eval`
    /// shows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scored_after_context: bool,
    /// `exp(-whole_scored_logprob / whole_scored_words)`: lm-evaluation-harness's
    /// `word_perplexity` of the texts scored whole (absent when none was). Unlike the
    /// perplexity per token, it compares models of different tokenizers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub word_perplexity: Option<f64>,
    /// `exp(-whole_scored_logprob / whole_scored_bytes)`: its `byte_perplexity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_perplexity: Option<f64>,
    /// `-whole_scored_logprob / whole_scored_bytes / ln 2`: its `bits_per_byte`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_byte: Option<f64>,
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
    /// The mean over answered records of the probability the model puts on the right
    /// choices, the choices' probabilities scaled to sum to one (lm-evaluation-harness's
    /// `acc` of TruthfulQA's MC2; for one right choice, a soft accuracy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_probability: Option<f64>,
    /// Its standard error (absent under two records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_probability_stderr: Option<f64>,
    /// The mean over records with one right choice of the squared distance of the
    /// choices' probabilities (scaled to sum to one) from that answer: the sum of `p^2`
    /// over wrong choices and `(1 - p)^2` for the right one, 0 for a model sure and
    /// right, 2 sure and wrong (lm-evaluation-harness's `brier_score`: how well the
    /// model's confidence is calibrated; lower is better).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brier_score: Option<f64>,
    /// Its standard error (absent under two records; lm-evaluation-harness gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brier_score_stderr: Option<f64>,
    /// The (first) filter's shares: `exact_match`, `exact_match_any` (pass@n),
    /// `exact_match_majority` (maj@n), each absent without references (or samples), and
    /// their standard errors.
    #[serde(flatten)]
    pub answers: AnswerShares,
    /// Each named filter's counts and shares, by name, in the order `--filter` gave them.
    #[serde(default, skip_serializing_if = "FilterFigures::is_empty")]
    pub filters: FilterFigures,
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
        self.evaluation.add(completion, group, answers);
        self.prompt_tokens += u64::from(completion.prompt_tokens);
        self.generated_tokens += completion.all_generated_tokens();
        self.truncated_prompts += u64::from(completion.truncated);
        for choice in completion.choices() {
            self.reasoning_tokens += u64::from(choice.reasoning_tokens);
            match choice.finish_reason {
                FinishReason::Stop => self.finished_by_stop += 1,
                FinishReason::Length => self.finished_by_length += 1,
            }
        }
    }

    /// Adds another chunk's tallies.
    pub(super) fn absorb(&mut self, chunk: GenerationTally) {
        self.prompt_tokens += chunk.prompt_tokens;
        self.generated_tokens += chunk.generated_tokens;
        self.reasoning_tokens += chunk.reasoning_tokens;
        self.truncated_prompts += chunk.truncated_prompts;
        self.finished_by_stop += chunk.finished_by_stop;
        self.finished_by_length += chunk.finished_by_length;
        self.failed_requests += chunk.failed_requests;
        self.evaluation.absorb(chunk.evaluation);
    }

    /// The report's figures of a generate job that ran `wall`.
    pub(super) fn figures(self, wall: Duration) -> GenerateFigures {
        let seconds = wall.as_secs_f64().max(1e-9);
        let counts = &self.evaluation;
        // The whole texts' negative log-likelihood per word or byte, in nats.
        let per_unit =
            |units: u64| (units > 0).then(|| -counts.whole_scored_logprob / units as f64);
        let text_perplexity = (counts.scored_texts > 0)
            .then(|| (-counts.scored_logprob / counts.scored_texts as f64).exp())
            .filter(|perplexity| perplexity.is_finite());
        let spread = (counts.squared_texts == counts.scored_texts).then(|| {
            let texts = counts.scored_texts;
            mean_with_stderr(counts.scored_logprob, counts.scored_logprob_squares, texts)
        });
        let mean_stderr = spread.flatten().and_then(|(_, stderr)| stderr);
        let answer_probability = counts.probabilities.answer_probability();
        let brier = counts.probabilities.brier_score();
        GenerateFigures {
            prompt_tokens_per_second: self.prompt_tokens as f64 / seconds,
            generated_tokens_per_second: self.generated_tokens as f64 / seconds,
            scored_perplexity: (counts.scored_tokens > 0)
                .then(|| (-counts.scored_logprob / counts.scored_tokens as f64).exp()),
            text_perplexity,
            text_perplexity_stderr: text_perplexity.zip(mean_stderr).map(|(p, se)| p * se),
            greedy_share: share(counts.greedy_texts, counts.scored_texts),
            greedy_share_stderr: share_stderr(counts.greedy_texts, counts.scored_texts),
            scored_after_context: false,
            word_perplexity: per_unit(counts.whole_scored_words).map(f64::exp),
            byte_perplexity: per_unit(counts.whole_scored_bytes).map(f64::exp),
            bits_per_byte: per_unit(counts.whole_scored_bytes).map(|nats| nats / LN_2),
            accuracy: share(counts.correct_records, counts.answered_records),
            accuracy_normalized: share(counts.correct_normalized_records, counts.answered_records),
            accuracy_stderr: share_stderr(counts.correct_records, counts.answered_records),
            accuracy_normalized_stderr: share_stderr(
                counts.correct_normalized_records,
                counts.answered_records,
            ),
            answer_probability: answer_probability.map(|(mean, _)| mean),
            answer_probability_stderr: answer_probability.and_then(|(_, stderr)| stderr),
            brier_score: brier.map(|(mean, _)| mean),
            brier_score_stderr: brier.and_then(|(_, stderr)| stderr),
            answers: counts.answers.shares(),
            filters: (counts.filters.iter())
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
