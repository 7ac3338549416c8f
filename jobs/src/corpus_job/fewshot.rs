//! Few-shot examples before every record's prompt (lm-evaluation-harness's `num_fewshot`):
//! the first N answered records of another file (a dataset's dev or train split), each
//! written as the job's prompt writes a record, the target delimiter and its answer after
//! it (a scoring job's example its right choice, a generating job's its reference: GSM8K's
//! worked solution), the examples joined by a delimiter and put before the prompt as
//! literal text. Every record of a job shares that start, so the engines compute it once
//! (the prefix cache).
//!
//! Grouped by a field (MMLU's `subject`), each record has the first N examples of its own
//! group, as lm-evaluation-harness's per-subject tasks take their dev split's: the records
//! of one group share that start.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::JobError;
use super::answer_match::references_of;
use super::inputs::InputSet;
use super::prompt::PromptTemplate;
use super::reader::{Item, ReaderOptions, Record, RecordReader};

/// lm-evaluation-harness's default between two examples, and between the last and the
/// record's prompt.
pub const DEFAULT_FEWSHOT_DELIMITER: &str = "\n\n";

/// Where a job's few-shot examples come from (`--fewshot-input` and its flags).
#[derive(Clone, Debug, Default)]
pub struct FewshotSource {
    /// The file or directory of examples, read as the job reads its input.
    pub path: PathBuf,
    /// Examples before each prompt.
    pub count: usize,
    /// Between two examples, and between the last and the prompt.
    pub delimiter: String,
    /// The field whose value picks a record's examples: those of the file with the same
    /// value (`None`: the file's first, for every record).
    pub group_field: Option<String>,
    /// Draws each record's examples at random from every answered example (of its group),
    /// seeded by this and the record's id (`--fewshot-seed`); `None`: the first `count`.
    pub seed: Option<u64>,
    /// How the seed draws (`--fewshot-sampler`): lm-evaluation-harness's stream draws
    /// even without a seed, from its own default, 1234.
    pub sampling: FewshotSampling,
    /// Between an example's prompt and its answer (`--target-delimiter`;
    /// lm-evaluation-harness's `target_delimiter`).
    pub target_delimiter: String,
    /// What each example's answer starts with, after the target delimiter: the job's
    /// `--gen-prefix` and a space, as lm-evaluation-harness writes its examples (the job
    /// sets it: `GenerateJobConfig::put_prompt_start`); empty: none.
    pub answer_prefix: String,
    /// What an example's answer is (the job sets it: `GenerateJobConfig::put_prompt_start`).
    pub answer: ShotAnswer,
    /// The field (or path) of each example's answer, over the job's reference field
    /// (`--fewshot-answer-field`, lm-evaluation-harness's few-shot `doc_to_target`):
    /// MMLU-Pro's `cot_content`, worked solutions before records whose reference is a short
    /// answer. Generating jobs only; `None`: the reference field, or the right choice.
    pub answer_field: Option<String>,
    /// Each example as a conversation's turns, its prompt the user's and its answer the
    /// assistant's, before the record's prompt as the last user turn
    /// (`--fewshot-as-multiturn`, lm-evaluation-harness's `--fewshot_as_multiturn`; chat
    /// template only); `false`: the examples as text before the prompt.
    pub as_turns: bool,
}

/// How `--fewshot-seed` draws each record's examples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FewshotSampling {
    /// From the seed and the record's id: independent of the input's order.
    #[default]
    PerRecord,
    /// As lm-evaluation-harness's default sampler: one Python `random.Random(seed)` stream
    /// through the records in input order.
    LmEval,
}

impl FromStr for FewshotSampling {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "per-record" => Ok(Self::PerRecord),
            "lm-eval" => Ok(Self::LmEval),
            other => Err(format!(
                "{other:?} is no few-shot sampler: give per-record (each record's own draw) \
                 or lm-eval (lm-evaluation-harness's draws, record after record)"
            )),
        }
    }
}

impl fmt::Display for FewshotSampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PerRecord => "per-record",
            Self::LmEval => "lm-eval",
        })
    }
}

/// lm-evaluation-harness's default few-shot seed (its `--seed`'s fourth value).
const LM_EVAL_FEWSHOT_SEED: u64 = 1234;

impl FewshotSource {
    /// The seed each record's examples are drawn with: `--fewshot-seed`, or
    /// lm-evaluation-harness's own default for its sampler; `None`: the first `count`.
    pub fn draw_seed(&self) -> Option<u64> {
        let lm_eval = self.sampling == FewshotSampling::LmEval;
        self.seed.or(lm_eval.then_some(LM_EVAL_FEWSHOT_SEED))
    }
}

/// What answers a few-shot example.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ShotAnswer {
    /// Its right choice: a scoring job's examples, records with choices and an answer.
    #[default]
    Choice,
    /// Its right choice as the context before its text (`--choices-as-contexts`,
    /// Winogrande's): the example reads `choice`, the target delimiter, then its text.
    Context,
    /// The text of this carried field (`--reference-field`, the first of a list): a
    /// generating job's examples.
    Reference(String),
}

impl ShotAnswer {
    /// `shot`'s answer, when it has one.
    fn of(&self, shot: &Record) -> Option<String> {
        match self {
            Self::Choice | Self::Context => shot.choices.as_ref()?.first_answer().cloned(),
            Self::Reference(field) => {
                let references = references_of(shot.kept.get(field), field).ok()?;
                references.into_iter().find(|text| !text.trim().is_empty())
            }
        }
    }

    /// The records that can be examples, in a refusal.
    fn records(&self) -> String {
        match self {
            Self::Choice | Self::Context => "answered multiple-choice records".to_owned(),
            Self::Reference(field) => format!("records with an answer in `{field}`"),
        }
    }
}

/// Each group's prompt, its examples in it, by the value of the field that names it.
#[derive(Clone, Debug, PartialEq)]
pub struct FewshotGroups {
    /// The field (`--fewshot-group`).
    pub field: String,
    /// A group's prompt: the description, the group's examples as literal text, the
    /// job's prompt (every group's has the same fields, in the same order).
    pub prompts: BTreeMap<String, PromptTemplate>,
    /// Where they were read (for a record whose group has none).
    pub source: String,
}

impl FewshotGroups {
    /// The prompt of a record whose group is `group`; a refusal that says what to do when
    /// the file has no examples of that group.
    pub fn prompt_for(&self, group: &str) -> Result<&PromptTemplate, String> {
        (self.prompts.get(group)).ok_or_else(|| no_examples_of(&self.source, &self.field, group))
    }

    /// What the job's settings fingerprint holds of them (a resumed job with other
    /// examples is another job).
    pub fn settings(&self) -> serde_json::Value {
        let prompts: BTreeMap<&String, &str> = self
            .prompts
            .iter()
            .map(|(group, prompt)| (group, prompt.as_str()))
            .collect();
        serde_json::json!({ "field": self.field, "prompts": prompts })
    }
}

/// The first few-shot examples of each group as turns (`--fewshot-as-multiturn`): what
/// goes between a record's system message and its prompt, the user's last turn.
#[derive(Clone, Debug, PartialEq)]
pub struct FewshotTurns {
    /// The field whose value picks a record's examples (`None`: one group, `""`).
    pub field: Option<String>,
    /// Each group's examples, in order.
    pub groups: BTreeMap<String, Vec<ShotTurns>>,
    /// Where they were read (for a record whose group has none).
    pub source: String,
}

impl FewshotTurns {
    /// The examples of a record whose group is `group` (`""` when ungrouped); a refusal
    /// that says what to do when the file has none of that group.
    pub fn turns_for(&self, group: &str) -> Result<&[ShotTurns], String> {
        let field = self.field.as_deref().unwrap_or_default();
        (self.groups.get(group).map(Vec::as_slice))
            .ok_or_else(|| no_examples_of(&self.source, field, group))
    }

    /// What the job's settings fingerprint holds of them: every turn, by group.
    pub fn settings(&self) -> serde_json::Value {
        let groups: BTreeMap<&String, Vec<[&str; 2]>> = (self.groups.iter())
            .map(|(group, shots)| {
                let turns = shots.iter().map(|s| [s.asked.as_str(), &s.answer]);
                (group, turns.collect())
            })
            .collect();
        serde_json::json!({ "field": self.field, "turns": groups })
    }
}

/// The first `source.count` examples `source` names (of each group when grouped), read as
/// [`read_examples`] reads them, each written through `prompt` as turns.
pub fn read_example_turns(
    source: &FewshotSource,
    prompt: &PromptTemplate,
    options: ReaderOptions,
) -> Result<FewshotTurns, JobError> {
    let names = options.extra_fields.clone();
    let mut groups = BTreeMap::new();
    for (group, shots) in read_groups(source, options, source.count)? {
        let turns = (shots.iter())
            .map(|shot| write_shot(prompt, &names, shot, source).map(|(_, turns)| turns))
            .collect::<Result<Vec<_>, _>>()
            .map_err(JobError::Input)?;
        groups.insert(group, turns);
    }
    Ok(FewshotTurns {
        field: source.grouped().map(str::to_owned),
        groups,
        source: source.path.display().to_string(),
    })
}

/// The refusal of a record whose group (its `field` is `group`) has no examples in the
/// file read at `source`, saying what to do.
pub fn no_examples_of(source: &str, field: &str, group: &str) -> String {
    format!(
        "the few-shot examples ({source}) have no record whose `{field}` is {group:?}: add \
         answered records of that group, or leave out --fewshot-group"
    )
}

/// What few-shot examples make of a job's prompt.
#[derive(Debug)]
pub enum FewshotPrompt {
    /// The description, the examples and the prompt, for every record.
    Prompt(PromptTemplate),
    /// Each group's.
    Groups(FewshotGroups),
}

/// The examples `source` names, read as the job reads its records (`options`, whose
/// reader has a scoring job's choice fields, the group field when grouped, and the fields
/// of `description` and `prompt`, in that order), each written through `prompt`, put
/// after `description` (a template's source, without `{text}`) and before `prompt`: for
/// every record, or for each group's.
pub fn read_examples(
    source: &FewshotSource,
    description: &str,
    prompt: &PromptTemplate,
    options: ReaderOptions,
) -> Result<FewshotPrompt, JobError> {
    let names = options.extra_fields.clone();
    let start = |shots: &[Record]| {
        let examples = example_texts(prompt, &names, shots, source, &source.delimiter)
            .map_err(JobError::Input)?;
        PromptTemplate::with_examples(description, &examples, prompt.as_str())
            .map_err(JobError::Input)
    };
    let Some(field) = source.grouped() else {
        let shots = read_fewshot(source, options)?;
        return start(&shots).map(FewshotPrompt::Prompt);
    };
    let mut prompts = BTreeMap::new();
    for (group, shots) in read_grouped_fewshot(source, options)? {
        prompts.insert(group, start(&shots)?);
    }
    Ok(FewshotPrompt::Groups(FewshotGroups {
        field: field.to_owned(),
        prompts,
        source: source.path.display().to_string(),
    }))
}

impl FewshotSource {
    /// The field that groups the examples, when they are grouped (and there are any).
    pub fn grouped(&self) -> Option<&str> {
        self.group_field.as_deref().filter(|_| self.count > 0)
    }
}

/// Each shot's prompt (its text and fields through `template`; a shot's fields are the
/// values of `names`, in order), then `source`'s target delimiter and the shot's answer,
/// then `delimiter`: one text per shot. A shot without an answer, or one that is a
/// conversation, is refused naming it.
pub fn example_texts(
    template: &PromptTemplate,
    names: &[String],
    shots: &[Record],
    source: &FewshotSource,
    delimiter: &str,
) -> Result<Vec<String>, String> {
    (shots.iter())
        .map(|shot| {
            let (text, _) = write_shot(template, names, shot, source)?;
            Ok(text + delimiter)
        })
        .collect()
}

/// A few-shot example as a conversation's turns (`--fewshot-as-multiturn`).
#[derive(Clone, Debug, PartialEq)]
pub struct ShotTurns {
    /// Its prompt: the user's turn.
    pub asked: String,
    /// Its answer (without the target delimiter): the assistant's.
    pub answer: String,
}

/// `shot` written through `template` (its fields the values of `names`, in order): as the
/// text that goes before a prompt (its prompt, `source`'s target delimiter, its answer
/// after `source`'s answer prefix), and as turns. A shot without an answer, or one that is
/// a conversation, is refused naming it.
pub fn write_shot(
    template: &PromptTemplate,
    names: &[String],
    shot: &Record,
    source: &FewshotSource,
) -> Result<(String, ShotTurns), String> {
    let answer = source.answer.of(shot).ok_or_else(|| match &source.answer {
        ShotAnswer::Choice | ShotAnswer::Context => format!(
            "few-shot example {} has no answered choices: an example needs choices and \
             an answer (--choices-field, --answer-field)",
            shot.id
        ),
        ShotAnswer::Reference(field) => format!(
            "few-shot example {} has no `{field}`: an example needs its answer there",
            shot.id
        ),
    })?;
    if shot.chat.is_some() {
        return Err(format!(
            "few-shot example {} is a conversation: examples are written through \
             --prompt, so they need a text",
            shot.id
        ));
    }
    let values: Vec<String> = (template.fields().iter())
        .map(|field| {
            let at = names.iter().position(|name| name == field);
            at.and_then(|at| shot.fields.get(at))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let (before, after) = template.around(&values);
    let (target, prefix) = (&source.target_delimiter, &source.answer_prefix);
    let text = &shot.text;
    Ok(match source.answer {
        ShotAnswer::Context => (
            format!("{before}{answer}{target}{text}{after}"),
            ShotTurns {
                asked: format!("{before}{answer}"),
                answer: format!("{text}{after}"),
            },
        ),
        _ => (
            format!("{before}{text}{after}{target}{prefix}{answer}"),
            ShotTurns {
                asked: format!("{before}{text}{after}"),
                answer: format!("{prefix}{answer}"),
            },
        ),
    })
}

/// Whether `item` can be a few-shot example: a record with a text and `answer`'s answer.
fn answered(item: Item, answer: &ShotAnswer) -> Option<Record> {
    match item {
        Item::Record(record) if record.chat.is_none() && answer.of(&record).is_some() => {
            Some(record)
        }
        _ => None,
    }
}

/// The reader of the examples at `path`, a missing one's error naming them; the whole
/// file, whatever `--limit` says of the job's input.
fn fewshot_reader(path: &Path, options: ReaderOptions) -> Result<RecordReader, JobError> {
    let inputs = InputSet::local(path).map_err(|e| match e {
        JobError::Input(reason) => JobError::Input(format!("few-shot examples: {reason}")),
        other => other,
    })?;
    let options = ReaderOptions {
        limit: None,
        limit_by: None,
        group_limits: None,
        ..options
    };
    Ok(RecordReader::new(inputs, options))
}

/// The first `source.count` answered records of the file or directory `source` names,
/// read as the job reads its records (`options`); an error when it has fewer.
pub fn read_fewshot(
    source: &FewshotSource,
    options: ReaderOptions,
) -> Result<Vec<Record>, JobError> {
    let (path, count) = (&source.path, source.count);
    let mut reader = fewshot_reader(path, options)?;
    let mut shots = Vec::new();
    while shots.len() < count {
        match reader.next_item()? {
            Some(item) => shots.extend(answered(item, &source.answer)),
            None => {
                return Err(JobError::Input(format!(
                    "{} has {} {} with a text, and --fewshot asks for {count}",
                    path.display(),
                    shots.len(),
                    source.answer.records()
                )));
            }
        }
    }
    Ok(shots)
}

/// The most groups with too few examples that a refusal names.
const SHORT_GROUPS_NAMED: usize = 8;

/// The first `source.count` answered records of each group `source` holds (its value
/// last of a record's fields: `options` names the group field), by group; an error naming
/// every group that has fewer, and when there is none.
pub fn read_grouped_fewshot(
    source: &FewshotSource,
    options: ReaderOptions,
) -> Result<BTreeMap<String, Vec<Record>>, JobError> {
    read_groups(source, options, source.count)
}

/// The first `keep` answered records of each group `source` holds (one group, `""`, when
/// `options` names no group field), by group; an error when a group has fewer than
/// `source.count`, naming such groups, and when there is none.
pub fn read_groups(
    source: &FewshotSource,
    options: ReaderOptions,
    keep: usize,
) -> Result<BTreeMap<String, Vec<Record>>, JobError> {
    let (path, count) = (source.path.as_path(), source.count);
    let field = options.group_field.clone();
    let mut reader = fewshot_reader(path, options)?;
    let mut groups: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    while let Some(item) = reader.next_item()? {
        let Some(record) = answered(item, &source.answer) else {
            continue;
        };
        let group = match field {
            Some(_) => record.fields.last().cloned().unwrap_or_default(),
            None => String::new(),
        };
        let shots = groups.entry(group).or_default();
        if shots.len() < keep {
            shots.push(record);
        }
    }
    match field {
        Some(field) => check_group_sizes(source, &field, &groups)?,
        None => {
            let found = groups.values().map(Vec::len).sum::<usize>();
            if found < count || found == 0 {
                return Err(JobError::Input(format!(
                    "{} has {found} {} with a text, and --fewshot asks for {count}",
                    path.display(),
                    source.answer.records()
                )));
            }
        }
    }
    Ok(groups)
}

/// Refuses groups with fewer than `source.count` examples (naming up to
/// [`SHORT_GROUPS_NAMED`] of them), and no group at all.
fn check_group_sizes(
    source: &FewshotSource,
    field: &str,
    groups: &BTreeMap<String, Vec<Record>>,
) -> Result<(), JobError> {
    let (path, count) = (&source.path, source.count);
    let short: Vec<String> = groups
        .iter()
        .filter(|(_, shots)| shots.len() < count)
        .map(|(group, shots)| format!("{group:?} has {}", shots.len()))
        .take(SHORT_GROUPS_NAMED)
        .collect();
    let short_groups = groups.values().filter(|shots| shots.len() < count).count();
    if groups.is_empty() || !short.is_empty() {
        let found = match short.is_empty() {
            true => format!("no {} with a text", source.answer.records()),
            false => format!(
                "too few answered records in {short_groups} of {} groups ({}{})",
                groups.len(),
                short.join(", "),
                if short_groups > short.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
        };
        return Err(JobError::Input(format!(
            "{}: {found}, and --fewshot asks for {count} of each `{field}`; give more \
             examples or a lower --fewshot",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::corpus_job::choice_input::ChoiceRecord;

    fn shot(
        id: &str,
        text: &str,
        fields: &[&str],
        choices: &[&str],
        answer: Option<u32>,
    ) -> Record {
        Record {
            id: Value::from(id),
            text: text.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            kept: Default::default(),
            chat: None,
            choices: Some(Box::new(ChoiceRecord {
                choices: choices.iter().map(|c| c.to_string()).collect(),
                answers: answer.into_iter().collect(),
                replies: false,
            })),
            limit_group: None,
            ordinal: 0,
        }
    }

    /// Each example reads as the prompt writes a record (its fields found by name among the
    /// reader's), its right choice after it.
    #[test]
    fn examples_are_written_through_the_prompt_with_their_answer() {
        let template = PromptTemplate::parse("{subject}: {text}\nAnswer:").unwrap();
        // The reader's fields: a description's `level` first, then the prompt's `subject`.
        let names = ["level".to_owned(), "subject".to_owned()];
        let shots = [
            shot("a", "2+2=", &["easy", "math"], &[" 3", " 4"], Some(1)),
            shot("b", "Set {x}", &["hard", "sets"], &[" {x}", " {}"], Some(0)),
        ];
        let scoring = FewshotSource::default();
        let examples = example_texts(&template, &names, &shots, &scoring, "\n\n").unwrap();
        assert_eq!(
            examples,
            [
                "math: 2+2=\nAnswer: 4\n\n",
                "sets: Set {x}\nAnswer: {x}\n\n"
            ]
        );
        assert!((example_texts(&template, &names, &[], &scoring, "\n\n").unwrap()).is_empty());
    }

    /// A generating job's example is answered by its reference (the first non-empty of a
    /// list), after the target delimiter (and the answer prefix); one without it is refused
    /// naming the field.
    #[test]
    fn a_reference_answers_a_generating_job_s_example_after_the_target_delimiter() {
        let template = PromptTemplate::parse("Question: {text}\nAnswer:").unwrap();
        let source = FewshotSource {
            answer: ShotAnswer::Reference("answer".into()),
            target_delimiter: " ".into(),
            ..FewshotSource::default()
        };
        let with = |answer: serde_json::Value| Record {
            kept: [("answer".to_owned(), answer)].into_iter().collect(),
            ..shot("g", "2+2?", &[], &[], None)
        };
        let shots = [with("4".into()), with(serde_json::json!(["", "five", "5"]))];
        let examples = example_texts(&template, &[], &shots, &source, "\n\n").unwrap();
        assert_eq!(
            examples.concat(),
            "Question: 2+2?\nAnswer: 4\n\nQuestion: 2+2?\nAnswer: five\n\n"
        );
        let error = example_texts(&template, &[], &[with(Value::Null)], &source, "").unwrap_err();
        assert!(
            error.contains("few-shot example \"g\" has no `answer`"),
            "{error}"
        );
        assert_eq!(
            source.answer.records(),
            "records with an answer in `answer`"
        );
        // `--gen-prefix`: each answer starts with it, as text and as the assistant's turn.
        let prefixed = FewshotSource {
            answer_prefix: "The answer is ".into(),
            ..source.clone()
        };
        let (text, turns) = write_shot(&template, &[], &shots[0], &prefixed).unwrap();
        assert_eq!(
            (text.as_str(), turns.answer.as_str()),
            ("Question: 2+2?\nAnswer: The answer is 4", "The answer is 4")
        );
    }

    #[test]
    fn an_example_without_an_answer_is_refused_naming_it() {
        let template = PromptTemplate::parse("{text}").unwrap();
        let unanswered = [shot("q7", "x", &[], &[" a"], None)];
        let error = example_texts(&template, &[], &unanswered, &FewshotSource::default(), "\n")
            .unwrap_err();
        assert!(
            error.contains("few-shot example \"q7\" has no answered choices"),
            "{error}"
        );
    }

    /// The first answered records with a text are the examples; a file with too few is
    /// refused saying how many it has.
    #[test]
    fn the_first_answered_records_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": 1, "text": "open", "choices": [" a", " b"]}"#,
                "\n",
                r#"{"id": 2, "text": "first", "choices": [" a", " b"], "answer": 1}"#,
                "\n",
                r#"{"id": 3, "messages": [{"role": "user", "content": "hi"}], "choices": [" a"], "answer": 0}"#,
                "\n",
                r#"{"id": 4, "text": "second", "choices": [" c", " d"], "answer": " c"}"#,
                "\n",
            ),
        )
        .unwrap();
        let options = || ReaderOptions {
            prompts: crate::corpus_job::PromptInput::TextOrMessages,
            choices: Some(Default::default()),
            ..ReaderOptions::default()
        };
        let source = |count| FewshotSource {
            path: path.clone(),
            count,
            ..FewshotSource::default()
        };
        let shots = read_fewshot(&source(2), options()).unwrap();
        let texts: Vec<&str> = shots.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["first", "second"]);
        let error = read_fewshot(&source(3), options()).unwrap_err().to_string();
        assert!(
            error.contains("has 2 answered multiple-choice records"),
            "{error}"
        );
        let missing = dir.path().join("missing.jsonl");
        let missing = FewshotSource {
            path: missing,
            ..source(1)
        };
        let error = read_fewshot(&missing, options()).unwrap_err().to_string();
        assert!(error.contains("few-shot examples: input "), "{error}");
    }

    fn grouped_dev_file(dir: &Path) -> PathBuf {
        let path = dir.join("dev.jsonl");
        let lines = [
            r#"{"id": 1, "subject": "math", "text": "1+1", "choices": [" 2", " 3"], "answer": 0}"#,
            r#"{"id": 2, "subject": "art", "text": "Mona {Lisa}", "choices": [" Leonardo", " Monet"], "answer": 0}"#,
            r#"{"id": 3, "subject": "math", "text": "open", "choices": [" 1", " 2"]}"#,
            r#"{"id": 4, "text": "no subject", "choices": [" a"], "answer": 0}"#,
            r#"{"id": 5, "subject": "math", "text": "2+2", "choices": [" 3", " 4"], "answer": 1}"#,
            r#"{"id": 6, "subject": "math", "text": "3+3", "choices": [" 6", " 7"], "answer": 0}"#,
            r#"{"id": 7, "subject": "art", "text": "Starry Night", "choices": [" Dali", " Van Gogh"], "answer": 1}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    }

    fn grouped_options() -> ReaderOptions {
        ReaderOptions {
            extra_fields: vec!["subject".into()],
            group_field: Some("subject".into()),
            prompts: crate::corpus_job::PromptInput::TextOrMessages,
            choices: Some(Default::default()),
            ..ReaderOptions::default()
        }
    }

    /// Grouped, each group's examples are its first answered records in file order,
    /// written through the prompt; a record of a group without examples gets a refusal
    /// saying what to do; a group with too few examples is refused naming it.
    #[test]
    fn grouped_examples_are_each_group_s_first_answered_records() {
        let dir = tempfile::tempdir().unwrap();
        let source = FewshotSource {
            path: grouped_dev_file(dir.path()),
            count: 1,
            delimiter: "\n\n".into(),
            group_field: Some("subject".into()),
            ..FewshotSource::default()
        };
        // The description, then the group's examples (braces literal), then the prompt.
        let template = PromptTemplate::parse("{subject}: {text}\nA:").unwrap();
        let description = "About {subject}:\n\n";
        let FewshotPrompt::Groups(groups) =
            read_examples(&source, description, &template, grouped_options()).unwrap()
        else {
            panic!("grouped examples give groups")
        };
        assert_eq!(groups.prompts.len(), 2);
        let before = |group: &str| {
            let prompt = groups.prompt_for(group).unwrap();
            assert_eq!(prompt.fields(), template.fields());
            prompt.around(&[group.to_owned(), group.to_owned()]).0
        };
        assert_eq!(before("math"), "About math:\n\nmath: 1+1\nA: 2\n\nmath: ");
        assert_eq!(
            before("art"),
            "About art:\n\nart: Mona {Lisa}\nA: Leonardo\n\nart: "
        );
        let error = groups.prompt_for("history").unwrap_err();
        assert!(
            error.contains("no record whose `subject` is \"history\": add answered records"),
            "{error}"
        );
        let of = |count| FewshotSource {
            count,
            ..source.clone()
        };
        let two = read_grouped_fewshot(&of(2), grouped_options()).unwrap();
        let texts =
            |group: &str| -> Vec<String> { two[group].iter().map(|s| s.text.clone()).collect() };
        assert_eq!(texts("math"), ["1+1", "2+2"]);
        assert_eq!(texts("art"), ["Mona {Lisa}", "Starry Night"]);
        let error = read_grouped_fewshot(&of(3), grouped_options())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("too few answered records in 1 of 2 groups (\"art\" has 2)")
                && error.contains("--fewshot asks for 3 of each `subject`"),
            "{error}"
        );
        // No examples asked: no groups, the prompt as it was.
        let none = FewshotSource { count: 0, ..source };
        assert!(none.grouped().is_none());
        let FewshotPrompt::Prompt(prompt) =
            read_examples(&none, "", &template, grouped_options()).unwrap()
        else {
            panic!("no examples leave the prompt")
        };
        assert_eq!(prompt, template);
    }

    /// The group is read after the prompt's fields; a record without it is a bad record
    /// that says why it is needed.
    #[test]
    fn a_record_without_its_group_is_a_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let items = crate::corpus_job::reader::read_items(
            &grouped_dev_file(dir.path()),
            ReaderOptions {
                extra_fields: vec![],
                ..grouped_options()
            },
        );
        assert_eq!(items[0].as_ref().unwrap().fields, ["math"]);
        assert_eq!(
            items[3].as_ref().unwrap_err(),
            "missing field `subject` (the record's few-shot group)"
        );
    }
}
