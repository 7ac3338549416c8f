//! A generate job's `generations.jsonl` lines as it spells them: the completion, its
//! samples, scores and log-probabilities, a record's scored choices, its generated answers
//! checked against its reference.

use resident_actor::generate::{ChoiceScores, Completion, TextScore, TokenLogprob};
use serde::Serialize;

use super::answer_match::{Judgement, RecordAnswers};
use super::evaluation_counts::InOrder;
use super::text_overlap::{OverlapMetric, OverlapScores};

/// Every key a line of `generations.jsonl` may have of its own, whatever the job asks
/// for: names `--keep-columns` cannot write the input's fields under.
pub(super) const LINE_FIELDS: &[&str] = &[
    "id",
    "text",
    "reasoning",
    "prompt_tokens",
    "generated_tokens",
    "reasoning_tokens",
    "finish_reason",
    "truncated",
    "choices",
    "logprobs",
    "score",
    "prompt_logprobs",
    "choice_scores",
    "best",
    "best_normalized",
    "answer",
    "answers",
    "correct",
    "correct_normalized",
    "answer_probability",
    "brier_score",
    "extracted",
    "rouge1",
    "rouge2",
    "rougeL",
    "rougeLsum",
    "f1",
    "bleu",
    "chrf",
    "correct_majority",
    "filters",
    "error",
];

/// The fields only `--score` adds to a line: a text's score, a record's scored choices'.
pub(super) const SCORE_FIELDS: [&str; 11] = [
    "score",
    "prompt_logprobs",
    "choice_scores",
    "best",
    "best_normalized",
    "answer",
    "answers",
    "correct",
    "correct_normalized",
    "answer_probability",
    "brier_score",
];

/// The fields only answer checks add to a line besides the overlap figures asked for
/// (`filters` only with named filters).
pub(super) const ANSWER_FIELDS: [&str; 4] = ["extracted", "correct", "correct_majority", "filters"];

/// The fields of a completion itself, which any job's lines may have, in [`LINE_FIELDS`]'
/// order: neither the id nor what scores and answer checks add.
pub(super) fn completion_fields() -> impl Iterator<Item = &'static str> {
    let overlap = |field: &str| OverlapMetric::ALL.iter().any(|m| m.name() == field);
    (LINE_FIELDS.iter().copied()).filter(move |&field| {
        field != "id"
            && !SCORE_FIELDS.contains(&field)
            && !ANSWER_FIELDS.contains(&field)
            && !overlap(field)
    })
}

/// One line of `generations.jsonl`.
#[derive(Serialize)]
pub(super) struct GenerationLine<'a> {
    id: &'a serde_json::Value,
    /// The input fields the job carries (`--keep-columns`), by name in its order.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    kept: Option<InOrder<&'a str, &'a serde_json::Value>>,
    text: &'a str,
    /// The thinking before the answer (`--reasoning-parser`), when the completion has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<&'a str>,
    prompt_tokens: u32,
    generated_tokens: u32,
    /// The generated tokens the thinking took, with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_tokens: Option<u32>,
    finish_reason: &'static str,
    /// The prompt was cut to fit the context (its record text's middle, a conversation's
    /// oldest few-shot example turns), or a scored text not scored to its end; absent when
    /// whole.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
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
    /// With named filters (`--filter`): each one's answer, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    filters: Option<ByFilter<'a, FilterLine<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// Each named filter's part of a line, by name in the job's order.
type ByFilter<'a, T> = InOrder<&'a str, T>;

impl<'a, T> InOrder<&'a str, T> {
    /// `part` of each named filter's answers; `None` when the job's filter has no name
    /// (`--extract`).
    fn of(
        answers: Option<&'a [RecordAnswers]>,
        part: impl Fn(&'a RecordAnswers) -> T,
    ) -> Option<Self> {
        let named = answers.filter(|all| all.first().is_some_and(|a| a.filter.is_some()))?;
        let parts = named
            .iter()
            .map(|answers| (answers.filter.as_deref().unwrap_or_default(), part(answers)));
        Some(parts.collect())
    }
}

/// A named filter's answer to a record: its first sample's, and with several samples the
/// majority's.
#[derive(Serialize)]
struct FilterLine<'a> {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    answer: Option<AnswerLine<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct_majority: Option<bool>,
}

/// A generated answer as the line spells it: `extracted` (null when the filter found
/// none), and `correct` when the record has a reference, with the overlap figures asked
/// for (`rouge1`, ..., `chrf`) beside it.
#[derive(Serialize)]
struct AnswerLine<'a> {
    extracted: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct: Option<bool>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    overlap: Option<&'a OverlapScores>,
}

impl<'a> AnswerLine<'a> {
    fn new(judged: &'a Judgement) -> Self {
        Self {
            extracted: judged.extracted.as_deref(),
            correct: judged.correct,
            overlap: judged.overlap.as_ref(),
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
    /// The right choice, when the record names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<u32>,
    /// The right choices, when the record names several (TruthfulQA's MC2).
    #[serde(skip_serializing_if = "Option::is_none")]
    answers: Option<&'a [u32]>,
    /// Whether the likeliest is a right one.
    #[serde(skip_serializing_if = "Option::is_none")]
    correct: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correct_normalized: Option<bool>,
    /// The probability the model puts on the right choices among all (MC2's figure).
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_probability: Option<f64>,
    /// The choices' probabilities' squared distance from the one right answer (a
    /// record's part of lm-evaluation-harness's `brier_score`).
    #[serde(skip_serializing_if = "Option::is_none")]
    brier_score: Option<f64>,
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
            answer: match &scored.answers[..] {
                [one] => Some(*one),
                _ => None,
            },
            answers: (scored.answers.len() > 1).then_some(&scored.answers[..]),
            correct: correct.map(|(plain, _)| plain),
            correct_normalized: correct.map(|(_, normalized)| normalized),
            answer_probability: scored.answer_probability(),
            brier_score: scored.brier_score(),
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
    /// The text's UTF-8 bytes and words, and the bits per byte they give, when all of it
    /// was scored (absent for a choice's score).
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    words: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bits_per_byte: Option<f64>,
}

impl ScoreLine {
    fn new(score: &TextScore) -> Self {
        Self {
            tokens: score.tokens,
            logprob: score.logprob,
            perplexity: score.perplexity(),
            greedy: score.greedy,
            bytes: score.size.map(|size| size.bytes),
            words: score.size.map(|size| size.words),
            bits_per_byte: score.bits_per_byte(),
        }
    }
}

#[derive(Serialize)]
struct ChoiceLine<'a> {
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<&'a str>,
    generated_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_tokens: Option<u32>,
    finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<&'a [TokenLogprob]>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    answer: Option<AnswerLine<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filters: Option<ByFilter<'a, Option<AnswerLine<'a>>>>,
}

impl<'a> GenerationLine<'a> {
    /// `completion`'s line; `answers`, its samples checked by each filter, when the job
    /// checks them (the first filter's are the line's own).
    pub(super) fn new(
        id: &'a serde_json::Value,
        completion: &'a Completion,
        answers: Option<&'a [RecordAnswers]>,
    ) -> Self {
        let first = answers.and_then(|all| all.first());
        let sample_of = |answers: &'a RecordAnswers, sample: usize| {
            answers.samples.get(sample).map(AnswerLine::new)
        };
        let judged = |sample: usize| first.and_then(|answers| sample_of(answers, sample));
        let filters_of = |sample: usize| ByFilter::of(answers, move |a| sample_of(a, sample));
        let choices = (!completion.more.is_empty()).then(|| {
            let first = ChoiceLine {
                text: &completion.text,
                reasoning: completion.reasoning.as_deref(),
                generated_tokens: completion.generated_tokens,
                reasoning_tokens: (completion.reasoning.as_ref())
                    .map(|_| completion.reasoning_tokens),
                finish_reason: completion.finish_reason.as_str(),
                logprobs: completion.logprobs.as_deref(),
                answer: judged(0),
                filters: filters_of(0),
            };
            let more = completion.more.iter().enumerate();
            std::iter::once(first)
                .chain(more.map(|(i, choice)| ChoiceLine {
                    text: &choice.text,
                    reasoning: choice.reasoning.as_deref(),
                    generated_tokens: choice.generated_tokens,
                    reasoning_tokens: (choice.reasoning.as_ref()).map(|_| choice.reasoning_tokens),
                    finish_reason: choice.finish_reason.as_str(),
                    logprobs: choice.logprobs.as_deref(),
                    answer: judged(i + 1),
                    filters: filters_of(i + 1),
                }))
                .collect()
        });
        Self {
            id,
            kept: None,
            text: &completion.text,
            reasoning: completion.reasoning.as_deref(),
            prompt_tokens: completion.prompt_tokens,
            generated_tokens: completion.generated_tokens,
            reasoning_tokens: (completion.reasoning.as_ref()).map(|_| completion.reasoning_tokens),
            finish_reason: completion.finish_reason.as_str(),
            truncated: completion.truncated,
            choices,
            logprobs: completion.logprobs.as_deref(),
            score: completion.score.as_ref().map(ScoreLine::new),
            prompt_logprobs: completion
                .score
                .as_ref()
                .and_then(|score| score.token_logprobs.as_deref()),
            choices_scored: completion.choice_scores.as_ref().map(ChoicesLine::new),
            answer: judged(0),
            correct_majority: first.and_then(|a| a.majority),
            filters: ByFilter::of(answers, |a| FilterLine {
                answer: sample_of(a, 0),
                correct_majority: a.majority,
            }),
            error: completion.error.as_deref(),
        }
    }

    /// The line with the record's kept input fields after its id (`--keep-columns`).
    pub(super) fn keeping(self, kept: Option<InOrder<&'a str, &'a serde_json::Value>>) -> Self {
        Self { kept, ..self }
    }
}

#[cfg(test)]
mod tests {
    use resident_actor::generate::{Choice, FinishReason};
    use serde_json::{Value, json};

    use super::super::answer_match::AnswerMatch;
    use super::super::answer_spec::AnswerMatchSpec;
    use super::super::generation_report::GenerationTally;
    use super::super::text_overlap::OverlapMetric;
    use super::*;

    fn completion(text: &str, more: &[&str]) -> Completion {
        let choice = |text: &str| Choice {
            text: text.into(),
            generated_tokens: 4,
            finish_reason: FinishReason::Stop,
            logprobs: None,
            reasoning: None,
            reasoning_tokens: 0,
        };
        Completion {
            id: "r".into(),
            text: text.into(),
            prompt_tokens: 5,
            generated_tokens: 4,
            finish_reason: FinishReason::Stop,
            truncated: false,
            logprobs: None,
            more: more.iter().map(|text| choice(text)).collect(),
            error: None,
            score: None,
            choice_scores: None,
            reasoning: None,
            reasoning_tokens: 0,
        }
    }

    /// A prompt cut to fit the context says so in its line; a whole one's line has no
    /// `truncated` at all.
    #[test]
    fn a_cut_prompt_s_line_says_it_was_cut() {
        let id = json!("r");
        let mut cut = completion("short", &[]);
        cut.truncated = true;
        let line = |c: &Completion| serde_json::to_value(GenerationLine::new(&id, c, None));
        assert_eq!(line(&cut).unwrap()["truncated"], true);
        let whole = line(&completion("short", &[])).unwrap();
        assert!(whole.get("truncated").is_none(), "{whole}");
    }

    /// A reasoning model's line (`--reasoning-parser`): `text` is the answer, `reasoning`
    /// the thinking and `reasoning_tokens` its tokens, for the line and each sample; a
    /// sample without thinking has neither, nor has a job without a parser.
    #[test]
    fn a_line_has_the_thinking_apart_from_the_answer() {
        let id = json!("r");
        let mut record = completion("4", &["5", "six"]);
        record.reasoning = Some("2 and 2".into());
        record.reasoning_tokens = 3;
        record.more[0].reasoning = Some("2 and 3".into());
        record.more[0].reasoning_tokens = 4;
        let line = serde_json::to_value(GenerationLine::new(&id, &record, None)).unwrap();
        assert_eq!(
            (&line["text"], &line["reasoning"], &line["reasoning_tokens"]),
            (&json!("4"), &json!("2 and 2"), &json!(3))
        );
        let choices = line["choices"].as_array().unwrap();
        assert_eq!(choices[0]["reasoning"], "2 and 2");
        assert_eq!(
            (&choices[1]["reasoning"], &choices[1]["reasoning_tokens"]),
            (&json!("2 and 3"), &json!(4))
        );
        let unthought = choices[2].as_object().unwrap();
        assert!(
            !unthought.contains_key("reasoning") && !unthought.contains_key("reasoning_tokens")
        );
        let plain = serde_json::to_value(GenerationLine::new(&id, &completion("4", &[]), None));
        let plain = plain.unwrap();
        assert!(plain.get("reasoning").is_none() && plain.get("reasoning_tokens").is_none());
        let written = serde_json::to_string(&GenerationLine::new(&id, &record, None)).unwrap();
        assert!(
            written.starts_with(r#"{"id":"r","text":"4","reasoning":"2 and 2","#),
            "{written}"
        );
    }

    /// Named filters: the first gives the line's `extracted` and `correct` and the
    /// report's `exact_match`; every one its own entry under `filters`, in the line, each
    /// sample and the report; `--extract`'s lines have no `filters`.
    #[test]
    fn each_named_filter_has_its_place_in_the_line_and_the_report() {
        let check = |filters: &[&str], extract: Option<&str>| {
            AnswerMatch::new(AnswerMatchSpec {
                reference_field: Some("answer".into()),
                extract: extract.map(String::from),
                filters: filters.iter().map(|f| f.parse().unwrap()).collect(),
                ..AnswerMatchSpec::default()
            })
            .unwrap()
        };
        let named = check(&[r"strict=#### (\d+)", r"flexible:last=(\d+)"], None);
        let references = ["18".to_owned()];
        let record = completion("9 * 2 = 18", &["#### 7, not 18", "#### 18"]);
        let choices = record.choices();
        let texts: Vec<&str> = choices.iter().map(|c| c.text.as_str()).collect();
        let answers = named.judge_record(&texts, &references);
        let id = json!(1);
        let line = serde_json::to_value(GenerationLine::new(&id, &record, Some(&answers))).unwrap();
        assert_eq!(
            (&line["extracted"], &line["correct"]),
            (&Value::Null, &json!(false))
        );
        assert_eq!(
            line["filters"],
            json!({
                "strict": {"extracted": null, "correct": false, "correct_majority": false},
                "flexible": {"extracted": "18", "correct": true, "correct_majority": true},
            })
        );
        let written = serde_json::to_string(&GenerationLine::new(&id, &record, Some(&answers)));
        let written = written.unwrap();
        let at = |name: &str| written.find(&format!("\"{name}\":{{")).unwrap();
        assert!(
            at("strict") < at("flexible"),
            "in the job's order: {written}"
        );
        assert_eq!(
            line["choices"][1]["filters"],
            json!({
                "strict": {"extracted": "7", "correct": false},
                "flexible": {"extracted": "18", "correct": true},
            })
        );
        assert_eq!(line["choices"][2]["extracted"], "18");
        let mut tally = GenerationTally::default();
        tally.add(&record, None, Some(&answers));
        let report =
            serde_json::to_value(tally.figures(std::time::Duration::from_secs(1))).unwrap();
        assert_eq!(
            (&report["exact_match"], &report["reference_records"]),
            (&json!(0.0), &json!(1))
        );
        assert_eq!(report["filters"]["strict"]["exact_match"], 0.0);
        assert_eq!(report["filters"]["strict"]["unextracted_records"], 1);
        assert_eq!(report["filters"]["strict"]["exact_match_any"], 1.0);
        assert_eq!(report["filters"]["flexible"]["exact_match"], 1.0);
        assert_eq!(report["filters"]["flexible"]["exact_match_majority"], 1.0);
        // One `--extract`: no `filters` anywhere.
        let single = check(&[], Some(r"(\d+)"));
        let answers = single.judge_record(&texts, &references);
        let line = serde_json::to_value(GenerationLine::new(&id, &record, Some(&answers))).unwrap();
        assert_eq!(line["extracted"], "9");
        assert!(line.get("filters").is_none() && line["choices"][0].get("filters").is_none());
        let mut tally = GenerationTally::default();
        tally.add(&record, None, Some(&answers));
        let report =
            serde_json::to_value(tally.figures(std::time::Duration::from_secs(1))).unwrap();
        assert!(report.get("filters").is_none(), "{report}");
    }

    /// Overlap figures (`--metric`): each sample's and each filter's answer has its own
    /// beside `correct`, computed on the answer as found; the report has the first
    /// samples' means beside `exact_match`, for the job and each filter, whichever chunks
    /// the records came in.
    #[test]
    fn overlap_figures_sit_beside_each_answer_and_their_means_in_the_report() {
        let check = AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("highlights".into()),
            filters: vec![
                "whole=".parse().unwrap(),
                "first:first=^[^.]*".parse().unwrap(),
            ],
            metrics: OverlapMetric::from_names(&["rouge1", "f1"]).unwrap(),
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        let references = ["The storm hit the coast.".to_owned()];
        let records = [
            completion("A storm hit the coast. Many fled.", &["Nothing happened."]),
            completion("The storm hit.", &[]),
        ];
        let id = json!(1);
        let mut one_tally = GenerationTally::default();
        let mut chunks = [GenerationTally::default(), GenerationTally::default()];
        let mut lines = Vec::new();
        for (record, chunk) in records.iter().zip(&mut chunks) {
            let choices = record.choices();
            let texts: Vec<&str> = choices.iter().map(|c| c.text.as_str()).collect();
            let answers = check.judge_record(&texts, &references);
            let line = GenerationLine::new(&id, record, Some(&answers));
            lines.push(serde_json::to_value(line).unwrap());
            one_tally.add(record, None, Some(&answers));
            chunk.add(record, None, Some(&answers));
        }
        let line = &lines[0];
        // "a storm hit the coast many fled" against "the storm hit the coast": 4 shared
        // words of 7 and 5 (ROUGE counts "the" once: the answer has one).
        let rouge1 = 2.0 * (4.0 / 7.0) * (4.0 / 5.0) / (4.0 / 7.0 + 4.0 / 5.0);
        assert_eq!(line["rouge1"], rouge1, "{line}");
        assert_eq!(line["filters"]["whole"]["rouge1"], rouge1);
        assert_eq!(
            line["filters"]["first"]["extracted"],
            "A storm hit the coast"
        );
        assert_eq!(
            line["filters"]["first"]["f1"], 1.0,
            "SQuAD drops the articles"
        );
        assert_eq!(line["choices"][1]["filters"]["whole"]["f1"], 0.0);
        assert!(line.get("rougeL").is_none(), "only the figures asked for");
        let [mut total, other] = chunks;
        total.absorb(other);
        let figures = |tally: GenerationTally| {
            serde_json::to_value(tally.figures(std::time::Duration::from_secs(1))).unwrap()
        };
        let (report, whole) = (figures(total), figures(one_tally));
        assert_eq!(report, whole, "chunks add up to one tally");
        let f1_second = lines[1]["f1"].as_f64().unwrap();
        assert_eq!(
            report["f1"],
            (line["f1"].as_f64().unwrap() + f1_second) / 2.0
        );
        assert!(report["f1_stderr"].is_number() && report["rouge1_stderr"].is_number());
        assert_eq!(report["filters"]["first"]["f1"], (1.0 + f1_second) / 2.0);
        assert_eq!(report["overlap_sums"]["means"]["rouge1"]["records"], 2);
    }

    /// `LINE_FIELDS` names every key a line may have: lines with every part the job can
    /// ask for (samples, log-probabilities, a score, scored choices with one and with
    /// several answers, named filters, every overlap figure, reasoning, an error) have no
    /// other, and
    /// kept input fields follow the id in the job's order.
    #[test]
    fn line_fields_name_every_key_a_line_may_have() {
        use resident_actor::generate::{TextScore, TextSize};
        let score = |size: Option<TextSize>| TextScore {
            tokens: 2,
            logprob: -1.0,
            greedy: true,
            token_logprobs: Some(Vec::new()),
            size,
        };
        let mut record = completion("The storm hit.", &["A storm."]);
        record.truncated = true;
        record.logprobs = Some(Vec::new());
        record.score = Some(score(Some(TextSize::of("The storm hit."))));
        record.error = Some("cut".into());
        record.reasoning = Some("Storms hit coasts.".into());
        record.reasoning_tokens = 5;
        let mut several = record.clone();
        record.choice_scores = Some(ChoiceScores {
            scores: vec![score(None), score(None)],
            chars: vec![3, 4],
            answers: vec![1],
        });
        several.choice_scores = Some(ChoiceScores {
            answers: vec![0, 1],
            ..record.choice_scores.clone().unwrap()
        });
        let check = AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("highlights".into()),
            filters: vec!["whole=".parse().unwrap(), "first=^[^.]*".parse().unwrap()],
            metrics: OverlapMetric::ALL.to_vec(),
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        let id = json!("r");
        let mut keys = std::collections::BTreeSet::new();
        for record in [&record, &several] {
            let choices = record.choices();
            let texts: Vec<&str> = choices.iter().map(|c| c.text.as_str()).collect();
            let answers = check.judge_record(&texts, &["The storm hit the coast.".to_owned()]);
            let line = serde_json::to_value(GenerationLine::new(&id, record, Some(&answers)));
            keys.extend(line.unwrap().as_object().unwrap().keys().cloned());
        }
        let unnamed: Vec<_> = keys
            .iter()
            .filter(|k| !LINE_FIELDS.contains(&k.as_str()))
            .collect();
        assert!(
            unnamed.is_empty(),
            "keys missing from LINE_FIELDS: {unnamed:?}"
        );
        let unseen: Vec<_> = LINE_FIELDS.iter().filter(|k| !keys.contains(**k)).collect();
        assert!(
            unseen.is_empty(),
            "LINE_FIELDS the lines never had: {unseen:?}"
        );
        let (title, year) = (json!("Storm"), json!(1999));
        let kept = [("year", &year), ("title", &title)].into_iter().collect();
        let line = GenerationLine::new(&id, &record, None).keeping(Some(kept));
        let written = serde_json::to_string(&line).unwrap();
        assert!(
            written.starts_with(r#"{"id":"r","year":1999,"title":"Storm","text":"The storm hit.""#),
            "{written}"
        );
    }
}
