//! A generate job's `generations.jsonl` lines as it spells them: the completion, its
//! samples, scores and log-probabilities, a record's scored choices, its generated answers
//! checked against its reference.

use resident_actor::generate::{ChoiceScores, Completion, TextScore, TokenLogprob};
use serde::Serialize;

use super::answer_match::{Judgement, RecordAnswers};

/// One line of `generations.jsonl`.
#[derive(Serialize)]
pub(super) struct GenerationLine<'a> {
    id: &'a serde_json::Value,
    text: &'a str,
    prompt_tokens: u32,
    generated_tokens: u32,
    finish_reason: &'static str,
    /// Every completion, the first included, when the record asked for more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    choices: Option<Vec<ChoiceLine<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<&'a [TokenLogprob]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<ScoreLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<&'a [TokenLogprob]>,
    /// A record with choices: each one's score, in order, and the one the model prefers.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    choices_scored: Option<ChoicesLine<'a>>,
    /// The first sample's answer and whether it is right (`--extract`, `--reference-field`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    answer: Option<AnswerLine<'a>>,
    /// With several samples and a reference: whether their most common answer is right.
    #[serde(skip_serializing_if = "Option::is_none")]
    correct_majority: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// A generated answer as the line spells it: `extracted` (null when the filter found
/// none), and `correct` when the record has a reference.
#[derive(Serialize)]
struct AnswerLine<'a> {
    extracted: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct: Option<bool>,
}

impl<'a> AnswerLine<'a> {
    fn new(judged: &'a Judgement) -> Self {
        Self {
            extracted: judged.extracted.as_deref(),
            correct: judged.correct,
        }
    }
}

/// A record's scored choices as `generations.jsonl` spells them.
#[derive(Serialize)]
struct ChoicesLine<'a> {
    choice_scores: Vec<ChoiceScoreLine<'a>>,
    /// The likeliest choice (lm-evaluation-harness's `acc` picks it).
    best: usize,
    /// The likeliest per character (`acc_norm`'s pick).
    best_normalized: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct_normalized: Option<bool>,
}

#[derive(Serialize)]
struct ChoiceScoreLine<'a> {
    #[serde(flatten)]
    score: ScoreLine,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<&'a [TokenLogprob]>,
}

impl<'a> ChoicesLine<'a> {
    fn new(scored: &'a ChoiceScores) -> Self {
        let correct = scored.correct();
        Self {
            choice_scores: (scored.scores.iter())
                .map(|score| ChoiceScoreLine {
                    score: ScoreLine::new(score),
                    prompt_logprobs: score.token_logprobs.as_deref(),
                })
                .collect(),
            best: scored.best(),
            best_normalized: scored.best_normalized(),
            answer: scored.answer,
            correct: correct.map(|(plain, _)| plain),
            correct_normalized: correct.map(|(_, normalized)| normalized),
        }
    }
}

/// A record text's score as `generations.jsonl` spells it.
#[derive(Serialize)]
struct ScoreLine {
    tokens: u32,
    logprob: f64,
    /// `exp(-logprob / tokens)`; null when no token was scored.
    perplexity: Option<f64>,
    greedy: bool,
}

impl ScoreLine {
    fn new(score: &TextScore) -> Self {
        Self {
            tokens: score.tokens,
            logprob: score.logprob,
            perplexity: score.perplexity(),
            greedy: score.greedy,
        }
    }
}

#[derive(Serialize)]
struct ChoiceLine<'a> {
    text: &'a str,
    generated_tokens: u32,
    finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<&'a [TokenLogprob]>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    answer: Option<AnswerLine<'a>>,
}

impl<'a> GenerationLine<'a> {
    /// `completion`'s line; `answers`, its samples checked, when the job checks them.
    pub(super) fn new(
        id: &'a serde_json::Value,
        completion: &'a Completion,
        answers: Option<&'a RecordAnswers>,
    ) -> Self {
        let judged = |sample: usize| {
            let judgement = answers.and_then(|a| a.samples.get(sample));
            judgement.map(AnswerLine::new)
        };
        let choices = (!completion.more.is_empty()).then(|| {
            let first = ChoiceLine {
                text: &completion.text,
                generated_tokens: completion.generated_tokens,
                finish_reason: completion.finish_reason.as_str(),
                logprobs: completion.logprobs.as_deref(),
                answer: judged(0),
            };
            let more = completion.more.iter().enumerate();
            std::iter::once(first)
                .chain(more.map(|(i, choice)| ChoiceLine {
                    text: &choice.text,
                    generated_tokens: choice.generated_tokens,
                    finish_reason: choice.finish_reason.as_str(),
                    logprobs: choice.logprobs.as_deref(),
                    answer: judged(i + 1),
                }))
                .collect()
        });
        Self {
            id,
            text: &completion.text,
            prompt_tokens: completion.prompt_tokens,
            generated_tokens: completion.generated_tokens,
            finish_reason: completion.finish_reason.as_str(),
            choices,
            logprobs: completion.logprobs.as_deref(),
            score: completion.score.as_ref().map(ScoreLine::new),
            prompt_logprobs: completion
                .score
                .as_ref()
                .and_then(|score| score.token_logprobs.as_deref()),
            choices_scored: completion.choice_scores.as_ref().map(ChoicesLine::new),
            answer: judged(0),
            correct_majority: answers.and_then(|a| a.majority),
            error: completion.error.as_deref(),
        }
    }
}
