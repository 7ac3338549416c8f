//! `resident generate`'s own part of the corpus pipeline: each record's prompt to
//! `generate@1` actors, completions back, shards as JSON lines, merged into
//! `generations.jsonl`.

use std::time::Duration;

use resident_actor::generate::{
    ChatMessage, Completion, Generate, GenerateConfig, GenerateParams, GenerateRequest,
    PromptParts, Template,
};
use resident_sdk::{Bytes, Cluster, Pool, PoolSpec, SdkError, TaskOutput};

use super::answer_match::{AnswerMatch, RecordAnswers, references_of};
use super::answer_spec::AnswerMatchSpec;
use super::chat_input::PromptInput;
use super::engine_settings::EngineSettings;
use super::evaluation_counts::{EvaluationCounts, StoredEvaluation};
use super::fewshot::{
    DEFAULT_FEWSHOT_DELIMITER, FewshotGroups, FewshotPrompt, FewshotSampling, FewshotSource,
    FewshotTurns, ShotAnswer, ShotTurns, read_example_turns, read_examples,
};
use super::fewshot_sampling::{FewshotSampler, SequentialDraws, read_sampled_examples};
use super::generation_lines::{
    ANSWER_FIELDS, GenerationLine, LINE_FIELDS, SCORE_FIELDS, completion_fields,
};
use super::generation_parquet::encode_generation_lines;
use super::generation_report::{GenerateFigures, GenerationTally};
use super::group_accuracy::{accuracy_by_group, group_of};
use super::inputs::InputSet;
use super::kept_columns::{KeptColumn, check_kept_columns, kept_line_fields, kept_names};
use super::manifest::Manifest;
use super::output::MergeLayout;
use super::prompt::{DescriptionAsSystem, PromptTemplate};
use super::reader::{BadRecord, Item, Kept, Record, RecordReader};
use super::shard_rows::ShardRows;
use super::work::{ChunkWork, Piece};
use super::{CorpusJobConfig, JobError};
use crate::model_pin::PinnedModel;

/// Why a preference pair's line holds an error under `--choices-as-contexts`.
const REPLIES_AS_CONTEXTS: &str = "a preference pair's `chosen` and `rejected` are replies \
    scored after its `prompt`, not contexts before a text: choices as contexts \
    (--choices-as-contexts) take records with choices and a text (score preference pairs \
    without it)";

/// A generate job: what every corpus job has, and what it asks of every record.
#[derive(Clone, Debug)]
pub struct GenerateJobConfig {
    /// What every corpus job has.
    pub corpus: CorpusJobConfig,
    /// What the job asks of every record.
    pub generation: GenerateWork,
}

impl GenerateJobConfig {
    /// Greedy completions of `prompt` with the kind's defaults; the corpus config's reader
    /// is asked for the fields the prompt names.
    pub fn new(mut corpus: CorpusJobConfig, prompt: PromptTemplate) -> Self {
        corpus.reader.extra_fields = prompt.fields().to_vec();
        if corpus.reader.prompts == PromptInput::Text {
            corpus.reader.prompts = PromptInput::TextOrMessages;
        }
        let model = corpus.model.clone();
        Self {
            corpus,
            generation: GenerateWork {
                prompt,
                params: GenerateParams::default(),
                engine: EngineSettings::default(),
                output: GenerationOutput::Lines,
                model,
                fewshot_groups: None,
                fewshot_sampler: None,
                fewshot_turns: None,
                accuracy_by: None,
                answer_match: None,
                target_delimiter: String::new(),
                description: None,
                gen_prefix: String::new(),
                keep_columns: Vec::new(),
                format: GenerationFormat::Jsonl,
            },
        }
    }

    /// Carries `columns` of each record to its line (`--keep-columns title,text=article`),
    /// after its id. Refused: a name twice or one the line has for itself (`text`, the
    /// completion; `id`; the answer checks' fields...).
    pub fn keep_columns(&mut self, columns: Vec<KeptColumn>) -> Result<(), JobError> {
        check_kept_columns(&columns, LINE_FIELDS).map_err(JobError::Input)?;
        for column in &columns {
            self.carry(&column.field);
        }
        self.generation.keep_columns = columns;
        Ok(())
    }

    /// Puts what goes between each prompt and its answer (`--target-delimiter`) and what the
    /// answer starts with (`--gen-prefix`; empty: nothing): before
    /// [`Self::put_prompt_start`], which writes the few-shot examples with them.
    pub fn put_answer_start(&mut self, target_delimiter: String, gen_prefix: String) {
        self.generation.target_delimiter = target_delimiter;
        self.generation.gen_prefix = gen_prefix;
    }

    /// Puts what goes before each record's prompt: `description` (a template's source with
    /// the record's fields and without `{text}`: lm-evaluation-harness's description), then
    /// the few-shot examples `fewshot` names (`read_examples`), each written through the
    /// prompt. The reader then reads the description's fields, and when the examples are
    /// grouped, each record's group.
    pub fn put_prompt_start(
        &mut self,
        description: Option<&str>,
        fewshot: Option<&FewshotSource>,
    ) -> Result<(), JobError> {
        let description = description.unwrap_or_default();
        let delimiter = fewshot.map_or(DEFAULT_FEWSHOT_DELIMITER, |f| f.delimiter.as_str());
        self.generation.description =
            DescriptionAsSystem::new(description, delimiter).map_err(JobError::Input)?;
        let prompt = self.generation.prompt.clone();
        let whole = PromptTemplate::parse(&format!("{description}{}", prompt.as_str()))
            .map_err(JobError::Input)?;
        self.corpus.reader.extra_fields = whole.fields().to_vec();
        self.generation.prompt = whole;
        let Some(source) = fewshot else {
            return Ok(());
        };
        let mut source = source.clone();
        source.answer = self.shot_answer(&source)?;
        source.target_delimiter = self.generation.target_delimiter.clone();
        source.answer_prefix = match &self.generation.gen_prefix[..] {
            "" => String::new(),
            prefix => format!("{prefix} "),
        };
        let source = &source;
        if source.as_turns && self.generation.params.template != Template::Chat {
            return Err(JobError::Input(AS_TURNS_NEED_CHAT.into()));
        }
        let mut options = self.corpus.reader.clone();
        options.group_field = source.grouped().map(str::to_owned);
        // The examples' reader carries their answer's field, the job's lines do not.
        let mut options_with_answers = options.clone();
        if let ShotAnswer::Reference(field) = &source.answer
            && !options.keep_fields.contains(field)
        {
            options_with_answers.keep_fields.push(field.clone());
        }
        if let Some(seed) = source.draw_seed().filter(|_| source.count > 0) {
            let sequence = self.lm_eval_draws(source, seed)?;
            let reading = options_with_answers;
            let sampler =
                read_sampled_examples(source, seed, description, &prompt, reading, sequence)?;
            self.corpus.reader = options;
            self.generation.fewshot_sampler = Some(sampler);
            return Ok(());
        }
        if source.as_turns && source.count > 0 {
            let turns = read_example_turns(source, &prompt, options_with_answers)?;
            self.corpus.reader = options;
            self.generation.fewshot_turns = Some(turns);
            return Ok(());
        }
        match read_examples(source, description, &prompt, options_with_answers)? {
            FewshotPrompt::Prompt(with_examples) => self.generation.prompt = with_examples,
            FewshotPrompt::Groups(groups) => {
                self.corpus.reader = options;
                self.generation.fewshot_groups = Some(groups);
            }
        }
        Ok(())
    }

    /// Refuses what the flags ask for together and cannot work, before anything runs: an
    /// engine limit of 0; choices as contexts (`--choices-as-contexts`) take each record's
    /// choices as texts before its text, and neither labels scored in the choices' place
    /// (`--choice-labels`), which have no such text, nor an answer's start after the prompt
    /// (`--gen-prefix`) go with them. `run_generate_job` calls it; a suite calls it for
    /// every task before the first runs.
    pub fn check(&self) -> Result<(), JobError> {
        if let Some(why) = self.generation.engine.problem() {
            return Err(JobError::Input(why));
        }
        let labelled = (self.corpus.reader.choices.as_ref()).is_some_and(|c| !c.labels.is_empty());
        if self.generation.params.choices_as_contexts && labelled {
            return Err(JobError::Input(
                "choices as contexts (--choices-as-contexts) put each choice's text before the \
                 record's; --choice-labels scores letters in the choices' place: give one or \
                 the other"
                    .into(),
            ));
        }
        let blank = (self.corpus.reader.choices.as_ref()).and_then(|c| c.blank.as_deref());
        if let Some(blank) = blank.filter(|_| !self.generation.params.choices_as_contexts) {
            return Err(JobError::Input(format!(
                "--blank {blank:?} fills the record's blank with each choice and scores the \
                 text after it: it needs choices as contexts (--choices-as-contexts)"
            )));
        }
        if let Some(column) = self.generation.keep_columns.first()
            && self.generation.output == GenerationOutput::OpenAiBatch
        {
            return Err(JobError::Input(format!(
                "--keep-columns {}: OpenAI Batch output lines have OpenAI's fields only \
                 (custom_id is the record's id); write generations (--output-format \
                 generations) to keep input fields",
                column.describe()
            )));
        }
        if let Some(why) = self.generation.parquet_refusal() {
            return Err(JobError::Input(why));
        }
        if self.generation.params.choices_as_contexts && !self.generation.gen_prefix.is_empty() {
            return Err(JobError::Input(
                "--gen-prefix starts the answer after the prompt, and choices as contexts \
                 (--choices-as-contexts) score the record's text after each choice instead \
                 (lm-evaluation-harness leaves gen_prefix out there too): drop one"
                    .into(),
            ));
        }
        Ok(())
    }

    /// lm-evaluation-harness's draws when `source` asks for them: one more example a record
    /// where the examples are the job's own input (its few-shot split being its test
    /// split, the record itself then left out); refused with groups, which it lacks.
    fn lm_eval_draws(
        &self,
        source: &FewshotSource,
        seed: u64,
    ) -> Result<Option<SequentialDraws>, JobError> {
        if source.sampling != FewshotSampling::LmEval {
            return Ok(None);
        }
        if source.group_field.is_some() {
            return Err(JobError::Input(
                "--fewshot-sampler lm-eval draws from all the examples, as \
                 lm-evaluation-harness has no groups: leave out --fewshot-group (or draw per \
                 record)"
                    .into(),
            ));
        }
        // The same file however named (`./test.jsonl`, `test.jsonl`).
        let from_input = match &self.corpus.input {
            crate::storage::Location::Local(input) => {
                let real = |path: &std::path::Path| std::fs::canonicalize(path).ok();
                real(input).is_some_and(|input| Some(input) == real(&source.path))
            }
            other => other.to_string() == source.path.display().to_string(),
        };
        let take = source.count + usize::from(from_input);
        Ok(Some(SequentialDraws::new(seed, take)))
    }

    /// What answers this job's few-shot examples (`source`): the right choices of a job
    /// that reads choices (a scoring job), a generating job's examples' own answer field
    /// or its references; refused when it has none, or an answer field with choices.
    fn shot_answer(&self, source: &FewshotSource) -> Result<ShotAnswer, JobError> {
        let answer_field = source.answer_field.clone();
        if let (Some(field), Some(_)) = (&answer_field, &self.corpus.reader.choices) {
            return Err(JobError::Input(format!(
                "--fewshot-answer-field {field} answers each example with its own field, and \
                 a scoring job's examples answer with their right choice: drop it, or \
                 generate (no --score) and check answers with --reference-field"
            )));
        }
        if self.corpus.reader.choices.is_some() {
            return Ok(match self.generation.params.choices_as_contexts {
                true => ShotAnswer::Context,
                false => ShotAnswer::Choice,
            });
        }
        let check = self.generation.answer_match.as_ref();
        let reference = check.and_then(|check| check.spec().reference_field.clone());
        match answer_field.or(reference) {
            Some(field) => Ok(ShotAnswer::Reference(field)),
            None => Err(JobError::Input(
                "few-shot examples are written with their answers: score choices (--score, \
                 records with choices and answers), or name each example's answer with \
                 --fewshot-answer-field or --reference-field"
                    .into(),
            )),
        }
    }

    /// Runs the job on the pool of every job given `suite` whose actors and placement are
    /// this one's (`resident eval`: the model loads once for all such tasks), kept after the
    /// job with the idle TTL it would have had (the caller deletes it at the suite's end);
    /// call it once the device is chosen. [`Self::pool_name`] names that pool.
    pub fn share_pool(&mut self, suite: &str) {
        let idle_ttl = self.corpus.retention.idle_ttl();
        self.corpus.retention = crate::pools::PoolRetention {
            keep: true,
            idle_ttl: Some(idle_ttl),
        };
        let corpus = &self.corpus;
        let actors = self.generation.actor_config(corpus.model.clone(), None);
        let placement = serde_json::json!({
            "actors": actors,
            "replicas": corpus.replicas,
            "gpus_per_actor": corpus.gpus_per_actor,
            "vram_gib": corpus.vram_gib_per_actor,
            "selector": corpus.selector,
            "task_timeout": corpus.task_timeout.map(|t| t.as_millis() as u64),
            "idle_ttl_ms": idle_ttl.as_millis() as u64,
        });
        self.corpus.pool_key = Some(format!("{suite}|{placement}"));
    }

    /// The name of the pool the job runs on.
    pub fn pool_name(&self) -> String {
        super::work::pool_name::<GenerateWork>(&self.corpus)
    }

    /// Breaks the report's accuracy down by the value of each record's `field`
    /// (`--accuracy-by`): the reader carries it to the tallies.
    pub fn report_accuracy_by(&mut self, field: &str) {
        self.carry(field);
        self.generation.accuracy_by = Some(field.to_owned());
    }

    /// Checks each record's generated answers as `spec` says (`--reference-field`,
    /// `--extract` and the comparison's flags): the reader carries the reference field to
    /// the lines and the tallies. A pattern that does not compile is refused.
    pub fn check_answers(&mut self, spec: AnswerMatchSpec) -> Result<(), JobError> {
        let check = AnswerMatch::new(spec).map_err(JobError::Input)?;
        if let Some(field) = check.spec().reference_field.clone() {
            self.carry(&field);
        }
        self.generation.answer_match = Some(check);
        Ok(())
    }

    /// Has the reader carry each record's `field` (a name or a path) to the job's lines.
    fn carry(&mut self, field: &str) {
        let carried = &mut self.corpus.reader.keep_fields;
        if !carried.iter().any(|kept| kept == field) {
            carried.push(field.to_owned());
        }
    }

    /// Reads the corpus as an OpenAI Batch file (`custom_id` is each record's id).
    pub fn read_openai_batch(&mut self) {
        self.corpus.reader.prompts = PromptInput::OpenAiBatch;
        self.corpus.reader.id_field = "custom_id".into();
    }
}

/// How `generations.jsonl` spells each record's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GenerationOutput {
    /// `{"id", "text", "prompt_tokens", "generated_tokens", "finish_reason", ...}`.
    #[default]
    Lines,
    /// The OpenAI Batch output format: `{"id", "custom_id", "response": {"status_code",
    /// "body": {"choices", "usage", ...}}, "error"}`.
    OpenAiBatch,
}

/// How `generations` are stored (`--format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GenerationFormat {
    /// JSON lines: `shards/*.jsonl` merged into `generations.jsonl`.
    #[default]
    Jsonl,
    /// Parquet: `shards/*.parquet` merged into `generations.parquet`, a column per field of
    /// a line.
    Parquet,
}

impl GenerationFormat {
    /// The shards' file extension, and `--format`'s word.
    pub fn extension(self) -> &'static str {
        match self {
            GenerationFormat::Jsonl => "jsonl",
            GenerationFormat::Parquet => "parquet",
        }
    }
}

/// Records' prompts in, completions out.
#[derive(Clone, Debug)]
pub struct GenerateWork {
    /// `--prompt`: holds `{text}` once, and any `{field}` of the record.
    pub prompt: PromptTemplate,
    /// Decoding parameters for every record (a record's own override them).
    pub params: GenerateParams,
    /// The actors' engine settings (`--max-sequences`, `--max-context`, `--dtype`...), as
    /// a front end took them; absent ones are the actors' defaults.
    pub engine: EngineSettings,
    /// How each answer is written.
    pub output: GenerationOutput,
    /// The model as the job names it: the `model` of OpenAI Batch responses.
    pub model: String,
    /// Few-shot examples by each record's group (`--fewshot-group`), put before its prompt
    /// (ungrouped examples are in [`Self::prompt`] itself).
    pub fewshot_groups: Option<FewshotGroups>,
    /// Few-shot examples drawn for each record (`--fewshot-seed`), put before its prompt.
    pub fewshot_sampler: Option<FewshotSampler>,
    /// The first few-shot examples (of each record's group) as turns before its prompt
    /// (`--fewshot-as-multiturn`).
    pub fewshot_turns: Option<FewshotTurns>,
    /// The field whose values group the report's accuracy (`--accuracy-by`); the reader
    /// carries it.
    pub accuracy_by: Option<String>,
    /// How generated answers are found and checked against each record's reference
    /// (`--extract`, `--reference-field`); the reader carries the reference.
    pub answer_match: Option<AnswerMatch>,
    /// Between a prompt and its answer (`--target-delimiter`, lm-evaluation-harness's
    /// `target_delimiter`): before each few-shot example's answer and each scored choice.
    pub target_delimiter: String,
    /// `--description`, moved into each text record's system message under the chat
    /// template, or after `--system` without it (it starts [`Self::prompt`] all the same).
    pub description: Option<DescriptionAsSystem>,
    /// What each answer starts with (`--gen-prefix`, lm-evaluation-harness's `gen_prefix`;
    /// empty: none): the assistant's reply, continued, under the chat template; after the
    /// prompt and the target delimiter without it; in each few-shot example, before its
    /// answer (a space between). Set it before [`GenerateJobConfig::put_prompt_start`].
    pub gen_prefix: String,
    /// Input fields written into each line after its id (`--keep-columns`); the reader
    /// carries them.
    pub keep_columns: Vec<KeptColumn>,
    /// JSON lines or Parquet (`--format`).
    pub format: GenerationFormat,
}

/// What goes before a text record's text ([`GenerateWork::record_start`]).
struct RecordStart<'a> {
    prompt: std::borrow::Cow<'a, PromptTemplate>,
    turns: Vec<ShotTurns>,
    error: Option<String>,
}

/// Refused: few-shot turns without the chat template to render them.
const AS_TURNS_NEED_CHAT: &str = "--fewshot-as-multiturn writes the few-shot examples as \
    chat turns: it needs the chat template (--template chat)";

/// The id a record's sampler is seeded with: a string id as it is, a number as written.
fn seed_id(id: &serde_json::Value) -> String {
    match id {
        serde_json::Value::String(id) => id.clone(),
        other => other.to_string(),
    }
}

impl GenerateWork {
    /// Why `--format parquet` cannot hold what the job writes, if it cannot: its columns
    /// are the fields of generations lines, not OpenAI's Batch output objects.
    fn parquet_refusal(&self) -> Option<String> {
        (self.format == GenerationFormat::Parquet && self.output == GenerationOutput::OpenAiBatch)
            .then(|| {
                "--format parquet writes a column per field of a generations line; \
                 --output-format openai-batch writes OpenAI's JSON objects: write JSON lines \
                 (--format jsonl), or generations lines (--output-format generations)"
                    .to_owned()
            })
    }

    /// The fields this job's lines may have, in [`LINE_FIELDS`]' order, each a column of
    /// `--format parquet`: a completion's; with `--score` a score's and a scored choices'
    /// (null for a record without choices); with answer checks the answer, whether it is
    /// right, the overlap figures asked for and each named filter's answers.
    fn line_fields(&self) -> Vec<&'static str> {
        let completion: Vec<_> = completion_fields().collect();
        let spec = self.answer_match.as_ref().map(AnswerMatch::spec);
        let checked = |field: &str| {
            spec.is_some_and(|spec| match field {
                "filters" => !spec.filters.is_empty(),
                field if ANSWER_FIELDS.contains(&field) => true,
                figure => spec.metrics.iter().any(|metric| metric.name() == figure),
            })
        };
        (LINE_FIELDS.iter().copied())
            .filter(|&field| {
                completion.contains(&field)
                    || (self.params.score && SCORE_FIELDS.contains(&field))
                    || checked(field)
            })
            .collect()
    }

    /// The config of the actors that run this work: `model` at `model_revision`, the
    /// work's engine settings.
    fn actor_config(&self, model: String, model_revision: Option<String>) -> GenerateConfig {
        GenerateConfig {
            model_revision,
            ..self.engine.actor_config(model)
        }
    }

    /// What goes before a text record's text: its template (`--prompt`, with the
    /// description and the examples written before it: the job's, its group's, or the one
    /// drawn for it), the examples as turns (`--fewshot-as-multiturn`; the template is then
    /// the job's), and why not, when its group has no examples.
    fn record_start(&self, record: &Record) -> RecordStart<'_> {
        use std::borrow::Cow;
        let grouped = self.fewshot_groups.is_some()
            || (self.fewshot_sampler.as_ref()).is_some_and(|s| s.field.is_some())
            || (self.fewshot_turns.as_ref()).is_some_and(|t| t.field.is_some());
        let group = match grouped {
            true => record.fields.last().map(String::as_str).unwrap_or_default(),
            false => "",
        };
        let (id, ordinal) = (seed_id(&record.id), record.ordinal);
        let own = Cow::Borrowed(&self.prompt);
        let drawn = match (
            &self.fewshot_groups,
            &self.fewshot_sampler,
            &self.fewshot_turns,
        ) {
            (Some(groups), _, _) => groups.prompt_for(group).map(|p| (Cow::Borrowed(p), vec![])),
            (_, Some(sampler), _) if sampler.as_turns => {
                (sampler.turns_for(group, &id, ordinal)).map(|turns| (own.clone(), turns))
            }
            (_, Some(sampler), _) => {
                (sampler.prompt_for(group, &id, ordinal)).map(|p| (Cow::Owned(p), vec![]))
            }
            (_, _, Some(turns)) => turns
                .turns_for(group)
                .map(|turns| (own.clone(), turns.to_vec())),
            _ => Ok((own.clone(), vec![])),
        };
        match drawn {
            Ok((prompt, turns)) => RecordStart {
                prompt,
                turns,
                error: None,
            },
            Err(error) => RecordStart {
                prompt: own,
                turns: Vec::new(),
                error: Some(error),
            },
        }
    }

    /// What a text prompt's answer starts with: `--gen-prefix`, after the target delimiter
    /// under template none (lm-evaluation-harness's `target_delimiter + gen_prefix`).
    fn reply_start(&self) -> String {
        match (self.gen_prefix.is_empty(), self.params.template) {
            (true, _) => String::new(),
            (false, Template::Chat) => self.gen_prefix.clone(),
            (false, Template::None) => format!("{}{}", self.target_delimiter, self.gen_prefix),
        }
    }

    /// A text record's prompt: its text in its template, the description as the system
    /// message under the chat template (or after the job's system message), the answer's
    /// start after it; a conversation when its examples are turns.
    fn text_prompt(&self, record: &Record) -> PromptParts {
        let start = self.record_start(record);
        let (before, after) = start.prompt.around(&record.fields);
        let whole_length = before.len();
        let bounds = start.prompt.example_bounds(&record.fields);
        let job_system = self.params.system.as_deref();
        // Without the chat template a job's system message is text before the description
        // (the delimiter between), as lm-evaluation-harness writes its system instruction.
        let (system, before) = match &self.description {
            Some(description) if self.params.template == Template::Chat || job_system.is_some() => {
                description.split(job_system, &record.fields, before)
            }
            _ => (None, before),
        };
        let id = seed_id(&record.id);
        if start.turns.is_empty() {
            // A description moved into the system message leaves the examples that much
            // nearer the start.
            let moved = whole_length - before.len();
            let example_bounds = (bounds.iter())
                .map(|bound| bound.checked_sub(moved)?.try_into().ok())
                .collect::<Option<Vec<u32>>>()
                .unwrap_or_default();
            return PromptParts {
                error: start.error,
                system,
                example_bounds,
                reply_start: self.reply_start(),
                ..PromptParts::new(&id, &before, &record.text, &after)
            };
        }
        // A conversation carries its system message itself.
        let system = system.or_else(|| job_system.map(str::to_owned));
        let mut messages: Vec<ChatMessage> = (system.iter())
            .map(|system| ChatMessage::new("system", system))
            .collect();
        for shot in &start.turns {
            messages.push(ChatMessage::new("user", &shot.asked));
            messages.push(ChatMessage::new("assistant", &shot.answer));
        }
        let example_turns = start.turns.len().try_into().unwrap_or(u32::MAX);
        if self.params.choices_as_contexts {
            // Each choice ends the user's last turn, and the text after it is scored.
            messages.push(ChatMessage::new("user", &before));
            return PromptParts {
                error: start.error,
                example_turns,
                text: record.text.clone(),
                after,
                ..PromptParts::chat(&id, messages)
            };
        }
        let asked = format!("{before}{}{after}", record.text);
        messages.push(ChatMessage::new("user", &asked));
        if !self.gen_prefix.is_empty() {
            messages.push(ChatMessage::new("assistant", &self.gen_prefix));
        }
        PromptParts {
            error: start.error,
            example_turns,
            ..PromptParts::chat(&id, messages)
        }
    }

    /// Why a request whose own `chat_template_kwargs` are `asked` cannot run in this job:
    /// they differ from the job's (a vLLM Batch file may give the same on every line; the
    /// job gives them once, `--chat-template-kwargs`).
    fn kwargs_refusal(
        &self,
        asked: &Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Option<String> {
        let asked = asked.as_ref()?;
        let job = &self.engine.chat_template_kwargs;
        (Some(asked) != job.as_ref()).then(|| {
            let job = match job {
                Some(kwargs) => format!(
                    "--chat-template-kwargs '{}'",
                    serde_json::Value::from(kwargs.clone())
                ),
                None => "none".into(),
            };
            let asked = serde_json::Value::from(asked.clone());
            format!(
                "this request's chat_template_kwargs ({asked}) are not the job's ({job}): a \
                 job renders every request with one set; run the job with \
                 --chat-template-kwargs '{asked}'"
            )
        })
    }

    /// The prompt an actor completes for `record`: its conversation, or `--prompt` around
    /// its text.
    pub fn prompt_of(&self, record: Record) -> PromptParts {
        let prompt = match record.chat {
            Some(chat) => PromptParts {
                error: chat
                    .error
                    .or_else(|| self.kwargs_refusal(&chat.template_kwargs)),
                messages: chat.messages,
                params: chat.params,
                ..PromptParts::chat(&seed_id(&record.id), Vec::new())
            },
            None => self.text_prompt(&record),
        };
        // A reference that cannot be compared is known before the record is generated.
        let prompt = match self.references(Some(&record.kept)) {
            Err(error) if prompt.error.is_none() => PromptParts {
                error: Some(error),
                ..prompt
            },
            _ => prompt,
        };
        // lm-evaluation-harness puts none before a choice scored after a chat prompt.
        let delimiter = match self.params.template {
            Template::Chat => "",
            Template::None => &self.target_delimiter,
        };
        match record.choices {
            // Each choice takes the context's place; the text, after the delimiter, is
            // scored after each.
            Some(choices) if self.params.choices_as_contexts => PromptParts {
                text: format!("{delimiter}{}", prompt.text),
                error: match choices.replies {
                    true => Some(REPLIES_AS_CONTEXTS.into()),
                    false => prompt.error,
                },
                choices: choices.choices,
                answers: choices.answers,
                ..prompt
            },
            Some(choices) => PromptParts {
                choices: (choices.choices.into_iter())
                    .map(|choice| format!("{delimiter}{choice}"))
                    .collect(),
                answers: choices.answers,
                ..prompt
            },
            None => prompt,
        }
    }
}

impl GenerateWork {
    /// A record's references (none when the job checks no answers or the record has no
    /// reference), from its carried fields; why not, for a reference that is an object.
    fn references(&self, kept: Option<&Kept>) -> Result<Vec<String>, String> {
        let check = self.answer_match.as_ref();
        match check.and_then(|check| check.spec().reference_field.as_deref()) {
            Some(field) => references_of(kept.and_then(|kept| kept.get(field)), field),
            None => Ok(Vec::new()),
        }
    }

    /// A record's generated samples checked by each filter against its references, when
    /// the job checks answers and the record was answered.
    fn answers_of(
        &self,
        completion: &Completion,
        kept: Option<&Kept>,
    ) -> Option<Vec<RecordAnswers>> {
        let check = self.answer_match.as_ref()?;
        if completion.error.is_some() {
            return None;
        }
        let references = self.references(kept).unwrap_or_default();
        let samples = completion.choices();
        let texts: Vec<&str> = samples.iter().map(|sample| sample.text.as_str()).collect();
        Some(check.judge_record(&texts, &references))
    }
}

/// A record as `resident generate --dry-run` shows it: the prompt its actor would be sent,
/// and the references its answer is checked against (none when the job checks none).
#[derive(Clone, Debug)]
pub struct PreviewPrompt {
    /// What the actor is sent.
    pub prompt: PromptParts,
    /// What its generated answer must equal (`--reference-field`).
    pub references: Vec<String>,
}

/// The prompts of the job's first `count` records, as its actors would be sent them, and
/// the bad records met on the way (`resident generate --dry-run`).
pub async fn preview_prompts(
    config: &GenerateJobConfig,
    count: usize,
) -> Result<(Vec<PreviewPrompt>, Vec<BadRecord>), JobError> {
    let corpus = &config.corpus;
    let s3 = match corpus.input.is_s3() {
        true => Some(resident_storage::S3Client::connect(&corpus.s3).await),
        false => None,
    };
    let mut corpus = corpus.clone();
    super::scan::resolve_limit_share(&mut corpus, s3.as_ref()).await?;
    let inputs = InputSet::list(&corpus.input, s3.as_ref()).await?;
    let (options, work) = (corpus.reader, config.generation.clone());
    tokio::task::spawn_blocking(move || {
        let mut reader = RecordReader::new(inputs, options);
        let (mut prompts, mut bad) = (Vec::new(), Vec::new());
        while prompts.len() < count {
            match reader.next_item()? {
                Some(Item::Record(record)) => {
                    let references = work.references(Some(&record.kept)).unwrap_or_default();
                    let prompt = work.prompt_of(record);
                    prompts.push(PreviewPrompt { prompt, references });
                }
                Some(Item::Bad(record)) => bad.push(record),
                None => break,
            }
        }
        Ok((prompts, bad))
    })
    .await
    .map_err(|e| JobError::Input(format!("reader stopped: {e}")))?
}

impl ChunkWork for GenerateWork {
    type Data = Vec<Completion>;
    type Tally = GenerationTally;
    type Figures = GenerateFigures;
    const JOB: &'static str = "generate";
    const OUTPUT: &'static str = "generations";
    const SETTINGS: &'static str =
        "model, prompt, choice labels, answer checks, decoding parameters or --keep-columns";
    const LAYOUT: MergeLayout = MergeLayout {
        format: "resident-generations",
        data: "generations.jsonl",
        npy: false,
        parquet: false,
        ids: None,
        generations: true,
    };
    const RUNNING_ITEMS_ARE_RECORDS: bool = false;

    fn layout(&self) -> MergeLayout {
        match self.format {
            GenerationFormat::Jsonl => Self::LAYOUT,
            GenerationFormat::Parquet => MergeLayout {
                data: "generations.parquet",
                parquet: true,
                ..Self::LAYOUT
            },
        }
    }

    fn check_resume(&self, manifest: &Manifest, place: &str) -> Result<(), JobError> {
        let plain = ("JSON lines", "jsonl");
        manifest.check_shard_format(place, self.format.extension(), plain)
    }

    fn settings_fingerprint(&self, model_fingerprint: &str) -> String {
        let mut settings = serde_json::json!({
            "model": model_fingerprint,
            "prompt": self.prompt.as_str(),
            "params": params_settings(&self.params),
            "max_context": self.engine.max_context,
        });
        // Only when set: a job started before `--dtype` existed resumes as it was.
        if let Some(dtype) = self.engine.dtype() {
            settings["dtype"] = dtype.into();
        }
        if let Some(template) = &self.engine.chat_template {
            settings["chat_template"] = template.as_str().into();
        }
        if let Some(kwargs) = &self.engine.chat_template_kwargs {
            settings["chat_template_kwargs"] = kwargs.clone().into();
        }
        if self.output == GenerationOutput::OpenAiBatch {
            settings["output"] = "openai-batch".into();
        }
        if let Some(groups) = &self.fewshot_groups {
            settings["fewshot_groups"] = groups.settings();
        }
        if let Some(sampler) = &self.fewshot_sampler {
            settings["fewshot_sampled"] = sampler.settings();
        }
        if let Some(turns) = &self.fewshot_turns {
            settings["fewshot_turns"] = turns.settings();
        }
        if let Some(check) = &self.answer_match {
            settings["answer_match"] = check.settings();
        }
        if !self.target_delimiter.is_empty() {
            settings["target_delimiter"] = self.target_delimiter.as_str().into();
        }
        if !self.gen_prefix.is_empty() {
            settings["gen_prefix"] = self.gen_prefix.as_str().into();
        }
        if !self.keep_columns.is_empty() {
            let columns = self.keep_columns.iter().map(KeptColumn::describe);
            settings["keep_columns"] = columns.collect::<Vec<_>>().into();
        }
        // Only when so: other jobs' settings read as before.
        if self.description.is_some() && self.params.template == Template::Chat {
            settings["description_as_system"] = true.into();
        }
        crate::files::sha256_hex(canonical_json(&settings).as_bytes())
    }

    /// As many records as keep an actor's continuous batch full
    /// ([`GenerateConfig::records_per_task_on`]).
    fn min_chunk_records(&self, on_gpus: bool) -> usize {
        self.actor_config(String::new(), None)
            .records_per_task_on(on_gpus)
    }

    /// One: an actor's forward steps already use every core, and one actor's batch of all
    /// the node's sequences reads the weights once a step where two would read them twice.
    fn cpu_actors_per_node(&self, _cores: u32) -> u32 {
        1
    }

    async fn create_pool(
        &self,
        cluster: &Cluster,
        config: &CorpusJobConfig,
        model: &PinnedModel,
        replicas: u32,
    ) -> Result<Pool, JobError> {
        let actor_config = self.actor_config(config.model.clone(), model.revision.clone());
        let mut spec =
            PoolSpec::typed::<Generate>(super::work::pool_name::<Self>(config), &actor_config)?
                .replicas(replicas)
                .selectors(config.selector.clone())
                .idle_ttl(config.retention.idle_ttl());
        if let Some(timeout) = config.task_timeout {
            spec = spec.task_timeout(timeout);
        }
        if config.gpus() > 0.0 {
            spec = spec.gpus(config.gpus()).vram_gib(config.vram_gib_per_actor);
        }
        cluster
            .create_or_resize_pool(spec, config.load_timeout)
            .await
            .map_err(super::work::pool_error)
    }

    fn request(&self, records: Vec<Record>) -> Bytes {
        let prompts = records
            .into_iter()
            .map(|record| self.prompt_of(record))
            .collect();
        encode(&GenerateRequest {
            prompts,
            params: self.params.clone(),
        })
    }

    fn split(&self, payload: &[u8]) -> Result<Vec<Bytes>, String> {
        let request =
            resident_actor::decode_request::<Generate>(payload).map_err(|e| e.to_string())?;
        Ok(request
            .prompts
            .into_iter()
            .map(|prompt| {
                encode(&GenerateRequest {
                    prompts: vec![prompt],
                    params: request.params.clone(),
                })
            })
            .collect())
    }

    fn read(&self, output: TaskOutput) -> Result<Piece<Vec<Completion>>, SdkError> {
        let bytes = output.output.map_err(SdkError::TaskFailed)?;
        let response = resident_actor::decode_reply::<Generate>(&bytes)?
            .map_err(|error| SdkError::TaskFailed(format!("generate: {error}")))?;
        Ok(Piece {
            rows: response.completions.len(),
            actor_id: output.actor_id,
            node_id: output.node_id,
            micros: output.run_micros,
            model_fingerprint: String::new(),
            data: response.completions,
        })
    }

    fn tally(&self, tally: &mut GenerationTally, piece: &Piece<Vec<Completion>>, kept: &[Kept]) {
        for (record, completion) in piece.data.iter().enumerate() {
            let group =
                (self.accuracy_by.as_deref()).map(|field| group_of(kept.get(record), field));
            let answers = self.answers_of(completion, kept.get(record));
            tally.add(completion, group, answers.as_deref());
        }
    }

    fn merge_tally(into: &mut GenerationTally, chunk: GenerationTally) {
        into.absorb(chunk);
    }

    fn lasting_counts(&self, chunk: &GenerationTally) -> Option<serde_json::Value> {
        let stored = StoredEvaluation::from(chunk.evaluation.clone());
        Some(serde_json::to_value(stored).expect("counts are JSON"))
    }

    fn generated_tokens(tally: &GenerationTally) -> u64 {
        tally.generated_tokens
    }

    /// This run's tokens; the evaluation counts of every chunk of the output, reused ones
    /// too (this run's alone when an earlier run's manifest kept none).
    fn figures(
        &self,
        mut tally: GenerationTally,
        manifest: &Manifest,
        wall: Duration,
    ) -> GenerateFigures {
        let stored = manifest.chunks.iter().map(|chunk| chunk.counts.as_ref());
        match EvaluationCounts::of_chunks(stored) {
            Some(whole) => tally.evaluation = whole,
            None => tracing::warn!(
                "chunks from an earlier run kept no answer counts: the report's accuracy and \
                 exact match count this run's chunks only"
            ),
        }
        let groups = &tally.evaluation.groups;
        let by_group = (self.accuracy_by.as_deref()).and_then(|f| accuracy_by_group(f, groups));
        let fewshot = self.fewshot_groups.is_some() || self.fewshot_sampler.is_some();
        let mut figures = GenerateFigures {
            accuracy_by_group: by_group,
            scored_after_context: self.params.score && (fewshot || self.prompt.has_context()),
            ..tally.figures(wall)
        };
        if let Some(check) = &self.answer_match {
            let names = check.spec().filters.iter().map(|f| f.name.as_str());
            figures.filters.put_in_order(names);
        }
        figures
    }

    fn shard_data(
        &self,
        index: u64,
        pieces: &[Piece<Vec<Completion>>],
        rows: &ShardRows<'_>,
        _manifest: &mut Manifest,
    ) -> Result<(String, Vec<u8>), JobError> {
        let ids = rows.ids;
        let completions = pieces.iter().flat_map(|p| &p.data);
        let mut lines = Vec::new();
        let created = resident_proto::unix_ms_now() / 1000;
        for (record, (id, completion)) in ids.iter().zip(completions).enumerate() {
            let written = match self.output {
                GenerationOutput::Lines => {
                    let carried = rows.kept.get(record);
                    let answers = self.answers_of(completion, carried);
                    let kept = kept_line_fields(&self.keep_columns, carried);
                    let line =
                        GenerationLine::new(id, completion, answers.as_deref()).keeping(kept);
                    serde_json::to_writer(&mut lines, &line)
                }
                GenerationOutput::OpenAiBatch => serde_json::to_writer(
                    &mut lines,
                    &super::openai_batch::output_line(id, completion, &self.model, created),
                ),
            };
            written.map_err(|e| JobError::Output(e.to_string()))?;
            lines.push(b'\n');
        }
        if self.format == GenerationFormat::Parquet {
            // The JSON lines read back as columns: each value as the line writes it (an
            // f32 log-probability in its shortest form).
            let failed = |error: String| JobError::ChunkFailed { index, error };
            let fields = (lines.split(|b| *b == b'\n').filter(|line| !line.is_empty()))
                .map(serde_json::from_slice)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failed(format!("a line as JSON: {e}")))?;
            let kept = kept_names(&self.keep_columns);
            let bytes = encode_generation_lines(&fields, &kept, &self.line_fields());
            return Ok((
                format!("shards/chunk-{index:06}.parquet"),
                bytes.map_err(failed)?,
            ));
        }
        Ok((format!("shards/chunk-{index:06}.jsonl"), lines))
    }

    /// Parquet: the columns with no rows.
    fn no_rows_data(&self, _manifest: &Manifest) -> Result<Vec<u8>, JobError> {
        let kept = kept_names(&self.keep_columns);
        encode_generation_lines(&[], &kept, &self.line_fields()).map_err(JobError::Output)
    }

    fn merged_bytes(manifest: &Manifest) -> u64 {
        manifest.chunks.iter().map(|c| c.vectors_bytes).sum()
    }
}

/// `value` as compact JSON with every object's keys sorted: the bytes a settings
/// fingerprint hashes, whatever order serde_json's maps keep (llguidance turns on its
/// `preserve_order`, which made them insertion-ordered; jobs started before it resume).
fn canonical_json(value: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                serde_json::Value::Object(
                    keys.into_iter()
                        .map(|key| (key.clone(), sorted(&map[key])))
                        .collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sorted).collect())
            }
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// The parameters as a job's settings record them: those added after the first release
/// appear only when set, so a job started before they existed resumes as it was.
fn params_settings(params: &GenerateParams) -> serde_json::Value {
    let mut settings = serde_json::to_value(params).expect("parameters are JSON");
    let defaults = serde_json::to_value(GenerateParams::default()).expect("parameters are JSON");
    const FIRST_RELEASE: &[&str] = &[
        "template",
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
    ];
    if let (Some(settings), Some(defaults)) = (settings.as_object_mut(), defaults.as_object()) {
        settings.retain(|key, value| {
            FIRST_RELEASE.contains(&key.as_str()) || defaults.get(key) != Some(value)
        });
    }
    // A scoring job started before long texts were scored in windows scored their heads
    // alone: it does not resume into whole-text scores.
    // One started before records' choices were scored read such a record's text alone: it
    // does not resume into per-choice scores either.
    if params.score {
        settings["score_windows"] = true.into();
        settings["score_choices"] = true.into();
    }
    settings
}

fn encode(request: &GenerateRequest) -> Bytes {
    resident_actor::encode_request::<Generate>(request)
        .expect("a generate request always encodes")
        .into()
}

#[cfg(test)]
mod tests {
    use resident_actor::generate::{ChoiceScores, FinishReason, TextScore, TextSize};

    use super::super::chat_input::ChatRecord;
    use super::super::choice_input::ChoiceRecord;
    use super::*;

    /// Chunks keep an actor's batch full at its device's default batch (256 sequences on a
    /// GPU, 32 on the CPU), or at `--max-sequences` when given.
    #[test]
    fn chunks_hold_two_gpu_batches_or_four_cpu_batches() {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let mut job = GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap());
        assert_eq!(job.generation.min_chunk_records(true), 512);
        assert_eq!(job.generation.min_chunk_records(false), 128);
        job.generation.engine.max_sequences = Some(64);
        assert_eq!(job.generation.min_chunk_records(true), 128);
        assert_eq!(job.generation.min_chunk_records(false), 256);
    }

    /// A description, then grouped few-shot examples go before each record's prompt by its
    /// group (the reader reads the description's field and the group), the settings
    /// fingerprint holds them, and a record of a group without examples is answered with
    /// the refusal.
    #[test]
    fn grouped_fewshot_examples_go_before_each_record_s_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev.jsonl");
        let lines = [
            r#"{"subject": "math", "text": "1+1", "choices": [" 2", " 3"], "answer": 0}"#,
            r#"{"subject": "art", "text": "Mona Lisa", "choices": [" Monet", " Leonardo"], "answer": 1}"#,
        ];
        std::fs::write(&dev, lines.join("\n")).unwrap();
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let template = PromptTemplate::parse("Q: {text}\nA:").unwrap();
        let mut job = GenerateJobConfig::new(corpus, template);
        job.corpus.reader.choices = Some(Default::default());
        job.generation.params.template = Template::None;
        let ungrouped = job.generation.settings_fingerprint("m");
        let source = FewshotSource {
            path: dev,
            count: 1,
            delimiter: "\n\n".into(),
            group_field: Some("subject".into()),
            ..FewshotSource::default()
        };
        let description = Some("About {subject}:\n");
        job.put_prompt_start(description, Some(&source)).unwrap();
        // The description's field, then the group.
        assert_eq!(job.corpus.reader.extra_fields, ["subject"]);
        assert_eq!(job.corpus.reader.group_field.as_deref(), Some("subject"));
        assert_eq!(
            job.generation.prompt.as_str(),
            "About {subject}:\nQ: {text}\nA:"
        );
        assert_ne!(job.generation.settings_fingerprint("m"), ungrouped);
        let record = subject_record;
        let math = job.generation.prompt_of(record("math"));
        assert_eq!(
            (math.before.as_str(), math.error),
            ("About math:\nQ: 1+1\nA: 2\n\nQ: ", None)
        );
        // The example marked where it lies, to be left out whole when too long.
        assert_eq!(math.example_bounds, [12, 25]);
        let art = job.generation.prompt_of(record("art"));
        assert_eq!(art.before, "About art:\nQ: Mona Lisa\nA: Leonardo\n\nQ: ");
        let error = job.generation.prompt_of(record("history")).error.unwrap();
        assert!(error.contains("whose `subject` is \"history\""), "{error}");
    }

    /// A job scoring choices after "Q: {text}\nA:" under `template`.
    fn qa_scoring_job(template: Template) -> GenerateJobConfig {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let prompt = PromptTemplate::parse("Q: {text}\nA:").unwrap();
        let mut job = GenerateJobConfig::new(corpus, prompt);
        job.corpus.reader.choices = Some(Default::default());
        job.generation.params.template = template;
        job
    }

    /// Choices as contexts with the examples as turns: each example's right context is a
    /// user turn and its text the assistant's; the record's last user turn is the prompt's
    /// head, which each choice ends, and its text (with no delimiter under the chat
    /// template) and the prompt's tail are what is scored after it.
    #[test]
    fn choices_as_contexts_with_turns_leave_the_text_out_of_the_last_turn() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev.jsonl");
        let shot = r#"{"text": "is warm.", "choices": ["The fire", "The ice"], "answer": 0}"#;
        std::fs::write(&dev, shot).unwrap();
        let mut job = qa_scoring_job(Template::Chat);
        job.generation.params.choices_as_contexts = true;
        job.generation.target_delimiter = " ".into();
        let source = FewshotSource {
            path: dev,
            count: 1,
            delimiter: "\n\n".into(),
            as_turns: true,
            ..FewshotSource::default()
        };
        job.put_prompt_start(None, Some(&source)).unwrap();
        job.check().unwrap();
        let record = Record {
            text: "is hot.".into(),
            choices: Some(Box::new(ChoiceRecord {
                choices: vec!["The sun".into(), "The snow".into()],
                answers: vec![0],
                replies: false,
            })),
            ..subject_record("")
        };
        let prompt = job.generation.prompt_of(record);
        let said: Vec<(&str, &str)> = (prompt.messages.iter())
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            said,
            [
                ("user", "Q: The fire"),
                ("assistant", "is warm.\nA:"),
                ("user", "Q: ")
            ]
        );
        assert_eq!(prompt.example_turns, 1);
        assert_eq!(
            (prompt.text.as_str(), prompt.after.as_str()),
            ("is hot.", "\nA:")
        );
        assert_eq!(prompt.choices, ["The sun", "The snow"]);
    }

    /// Under the chat template the description is each record's system message (after the
    /// job's, the few-shot delimiter between), and without it too where the job has a
    /// system message (written as text); with `--fewshot-as-multiturn` each example
    /// of the record's group is a user turn and its answer the assistant's, the record's
    /// prompt the last user turn. Other settings, another job.
    #[test]
    fn fewshot_examples_as_turns_make_a_conversation_after_the_description() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev.jsonl");
        let lines = [
            r#"{"subject": "math", "text": "1+1", "choices": ["2", "3"], "answer": 0}"#,
            r#"{"subject": "math", "text": "2+2", "choices": ["4", "5"], "answer": 0}"#,
            r#"{"subject": "art", "text": "Mona Lisa", "choices": ["Monet", "Leonardo"], "answer": 1}"#,
            r#"{"subject": "art", "text": "Guernica", "choices": ["Picasso", "Dali"], "answer": 0}"#,
        ];
        std::fs::write(&dev, lines.join("\n")).unwrap();
        let job_under = |template: Template, as_turns: bool| {
            let mut job = qa_scoring_job(template);
            job.generation.params.system = Some("Be brief.".into());
            job.generation.target_delimiter = " ".into();
            let source = FewshotSource {
                path: dev.clone(),
                count: 2,
                delimiter: "\n\n".into(),
                group_field: Some("subject".into()),
                as_turns,
                ..FewshotSource::default()
            };
            job.put_prompt_start(Some("About {subject}."), Some(&source))
                .map(|()| job)
        };
        let job = |as_turns: bool| job_under(Template::Chat, as_turns);
        let record = subject_record;
        let as_text = job(false).unwrap();
        let math = as_text.generation.prompt_of(record("math"));
        assert_eq!(
            (math.system.as_deref(), math.before.as_str()),
            (
                Some("Be brief.\n\nAbout math."),
                "Q: 1+1\nA: 2\n\nQ: 2+2\nA: 4\n\nQ: "
            )
        );
        // The description moved into the system message, the examples start the text.
        assert_eq!(math.example_bounds, [0, 13, 26]);
        let as_turns = job(true).unwrap();
        let math = as_turns.generation.prompt_of(record("math"));
        let said: Vec<(&str, &str)> = (math.messages.iter())
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!((math.example_turns, &math.example_bounds[..]), (2, &[][..]));
        assert_eq!(
            said,
            [
                ("system", "Be brief.\n\nAbout math."),
                ("user", "Q: 1+1\nA:"),
                ("assistant", "2"),
                ("user", "Q: 2+2\nA:"),
                ("assistant", "4"),
                ("user", "Q: 5+5\nA:"),
            ]
        );
        let error = as_turns.generation.prompt_of(record("history")).error;
        assert!(error.unwrap().contains("whose `subject` is \"history\""));
        let fingerprints = [&as_text, &as_turns].map(|j| j.generation.settings_fingerprint("m"));
        assert_ne!(fingerprints[0], fingerprints[1]);
        // Without the chat template: turns refused; the job's system message and the
        // description, the delimiter between, as the chat template's system message is
        // (written as text before the examples), or the description alone before them.
        let refused = job_under(Template::None, true).unwrap_err().to_string();
        assert!(refused.contains("needs the chat template"), "{refused}");
        let mut raw = job_under(Template::None, false).unwrap();
        let with_system = raw.generation.prompt_of(record("math"));
        assert_eq!(
            (
                with_system.system.as_deref(),
                with_system.before.as_str(),
                &with_system.example_bounds[..]
            ),
            (
                Some("Be brief.\n\nAbout math."),
                "Q: 1+1\nA: 2\n\nQ: 2+2\nA: 4\n\nQ: ",
                &[0, 13, 26][..]
            )
        );
        raw.generation.params.system = None;
        let plain = raw.generation.prompt_of(record("math"));
        assert_eq!(plain.system, None);
        assert!(
            plain.before.starts_with("About math.Q: 1+1"),
            "{}",
            plain.before
        );
        assert_eq!(plain.example_bounds, [11, 24, 37]);
    }

    /// `--gen-prefix` starts every answer: each few-shot example's (a space before the
    /// answer), and the record's, the assistant's reply under the chat template (a last
    /// assistant turn with the examples as turns) and after the target delimiter without
    /// it. It is part of the job's settings; choices as contexts refuse it.
    #[test]
    fn a_gen_prefix_starts_each_example_s_answer_and_the_record_s() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev.jsonl");
        let line = r#"{"subject": "math", "text": "1+1", "choices": ["2", "3"], "answer": 0}"#;
        std::fs::write(&dev, line).unwrap();
        let job_under = |template: Template, as_turns: bool| {
            let mut job = qa_scoring_job(template);
            job.put_answer_start(" ".into(), "Best:".into());
            let source = FewshotSource {
                path: dev.clone(),
                count: 1,
                delimiter: "\n\n".into(),
                as_turns,
                ..FewshotSource::default()
            };
            job.put_prompt_start(None, Some(&source)).unwrap();
            job
        };
        let record = subject_record;
        let raw = job_under(Template::None, false);
        let prompt = raw.generation.prompt_of(record("math"));
        let parts = |p: &PromptParts| (p.before.clone(), p.after.clone(), p.reply_start.clone());
        let example = "Q: 1+1\nA: Best: 2\n\nQ: ".to_owned();
        assert_eq!(
            parts(&prompt),
            (example.clone(), "\nA:".into(), " Best:".into())
        );
        let chat = job_under(Template::Chat, false).generation;
        let prompt = chat.prompt_of(record("math"));
        assert_eq!(parts(&prompt), (example, "\nA:".into(), "Best:".into()));
        let turns = job_under(Template::Chat, true).generation;
        let prompt = turns.prompt_of(record("math"));
        let said: Vec<(&str, &str)> = (prompt.messages.iter())
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            said,
            [
                ("user", "Q: 1+1\nA:"),
                ("assistant", "Best: 2"),
                ("user", "Q: 5+5\nA:"),
                ("assistant", "Best:"),
            ]
        );
        let mut plain = raw.clone();
        plain.generation.gen_prefix.clear();
        let fingerprint = |job: &GenerateJobConfig| job.generation.settings_fingerprint("m");
        assert_ne!(fingerprint(&raw), fingerprint(&plain));
        let mut contexts = raw;
        contexts.generation.params.choices_as_contexts = true;
        let refused = contexts.check().unwrap_err().to_string();
        assert!(
            refused.contains("--gen-prefix starts the answer"),
            "{refused}"
        );
    }

    /// A job's own chat template (`--chat-template`) is part of its settings: a resumed
    /// job with another is another job; without one they read as before.
    #[test]
    fn a_chat_template_given_is_part_of_the_job_s_settings() {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let mut job = GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap());
        let plain = job.generation.settings_fingerprint("m");
        job.generation.engine.chat_template = Some("{{ messages[0].content }}".into());
        let given = job.generation.settings_fingerprint("m");
        job.generation.engine.chat_template = Some("{{ messages[1].content }}".into());
        let other = job.generation.settings_fingerprint("m");
        assert!(plain != given && given != other && plain != other);
        job.generation.engine.chat_template = None;
        assert_eq!(job.generation.settings_fingerprint("m"), plain);
    }

    /// Kept columns: the reader carries their fields (a field the answers read too, once),
    /// they are part of the job's settings, OpenAI Batch output refuses them, and a name
    /// the line has for itself is refused with one to use.
    #[test]
    fn kept_columns_are_carried_part_of_the_settings_and_refused_where_lines_cannot_hold_them() {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let mut job = GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap());
        let plain = job.generation.settings_fingerprint("m");
        job.check_answers(AnswerMatchSpec {
            reference_field: Some("highlights".into()),
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        let columns = |given: &[&str]| {
            given
                .iter()
                .map(|c| KeptColumn::parse(c).unwrap())
                .collect()
        };
        job.keep_columns(columns(&["text=article", "highlights", "meta.url=url"]))
            .unwrap();
        assert_eq!(
            job.corpus.reader.keep_fields,
            ["highlights", "text", "meta.url"],
            "each field carried once"
        );
        let kept = job.generation.settings_fingerprint("m");
        job.keep_columns(columns(&["text=article"])).unwrap();
        assert!(plain != kept && kept != job.generation.settings_fingerprint("m"));
        job.check().unwrap();
        job.generation.output = GenerationOutput::OpenAiBatch;
        let refused = job.check().unwrap_err().to_string();
        assert!(
            refused.contains("--keep-columns text=article: OpenAI Batch output"),
            "{refused}"
        );
        let taken = job
            .keep_columns(columns(&["highlights=correct"]))
            .unwrap_err();
        assert!(
            taken
                .to_string()
                .contains("--keep-columns highlights=input_correct"),
            "{taken}"
        );
    }

    /// Parquet holds completions: a scoring job, answer checks and OpenAI Batch output are
    /// refused with it, saying what each writes; JSON lines take them all.
    #[test]
    fn parquet_output_refuses_only_openai_s_objects_and_has_a_column_for_each_field() {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let plain = GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap());
        let refusal = |change: &dyn Fn(&mut GenerateJobConfig)| {
            let mut job = plain.clone();
            job.generation.format = GenerationFormat::Parquet;
            change(&mut job);
            let jsonl = GenerateJobConfig {
                generation: GenerateWork {
                    format: GenerationFormat::Jsonl,
                    ..job.generation.clone()
                },
                ..job.clone()
            };
            assert!(jsonl.check().is_ok());
            job.check().err().map(|e| e.to_string())
        };
        assert_eq!(refusal(&|_| {}), None);
        assert_eq!(refusal(&|job| job.generation.params.n = 3), None);
        assert_eq!(refusal(&|job| job.generation.params.score = true), None);
        let batch = refusal(&|job| job.generation.output = GenerationOutput::OpenAiBatch);
        let batch = batch.unwrap();
        assert!(
            batch.contains("--output-format openai-batch writes OpenAI's"),
            "{batch}"
        );
        assert!(batch.contains("(--format jsonl)"), "{batch}");

        let completion: Vec<_> = completion_fields().collect();
        assert_eq!(plain.generation.line_fields(), completion);
        assert_eq!(completion[..3], ["text", "reasoning", "prompt_tokens"]);
        assert_eq!(completion.last(), Some(&"error"));
        let mut scored = plain.generation.clone();
        scored.params.score = true;
        let fields = scored.line_fields();
        assert!(fields.contains(&"score") && fields.contains(&"brier_score"));
        assert!(!fields.contains(&"extracted"), "{fields:?}");
        let mut checked = plain.clone();
        let spec = AnswerMatchSpec {
            reference_field: Some("answer".into()),
            filters: vec!["strict=(\\d+)".parse().unwrap()],
            metrics: super::super::text_overlap::OverlapMetric::from_names(&["rouge"]).unwrap(),
            ..AnswerMatchSpec::default()
        };
        checked.check_answers(spec).unwrap();
        let fields = checked.generation.line_fields();
        let added: Vec<_> = fields.iter().filter(|f| !completion.contains(f)).collect();
        assert_eq!(
            added,
            [
                &"correct",
                &"extracted",
                &"rouge1",
                &"rouge2",
                &"rougeL",
                &"rougeLsum",
                &"correct_majority",
                &"filters"
            ],
            "in the lines' order, only the figures asked for"
        );
    }

    /// A Batch request's own `chat_template_kwargs` run when they are the job's (a vLLM
    /// file may repeat them on every line) and are answered with an error saying what to
    /// run otherwise; the job's kwargs are part of its settings.
    #[test]
    fn a_request_s_chat_template_kwargs_must_be_the_job_s() {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let mut job = GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap());
        let plain = job.generation.settings_fingerprint("m");
        let off = serde_json::json!({"enable_thinking": false});
        let request = |kwargs: Option<&serde_json::Value>| Record {
            chat: Some(Box::new(ChatRecord {
                messages: vec![ChatMessage::new("user", "hi")],
                template_kwargs: kwargs.map(|k| k.as_object().unwrap().clone()),
                ..ChatRecord::default()
            })),
            ..subject_record("x")
        };
        assert_eq!(job.generation.prompt_of(request(None)).error, None);
        let refused = job.generation.prompt_of(request(Some(&off))).error.unwrap();
        assert!(
            refused.contains("are not the job's (none)")
                && refused.contains(r#"--chat-template-kwargs '{"enable_thinking":false}'"#),
            "{refused}"
        );
        job.generation.engine.chat_template_kwargs = off.as_object().cloned();
        assert_ne!(job.generation.settings_fingerprint("m"), plain);
        assert_eq!(job.generation.prompt_of(request(Some(&off))).error, None);
        assert_eq!(job.generation.prompt_of(request(None)).error, None);
        let on = serde_json::json!({"enable_thinking": true});
        let refused = job.generation.prompt_of(request(Some(&on))).error.unwrap();
        assert!(
            refused.contains("are not the job's (--chat-template-kwargs"),
            "{refused}"
        );
    }

    /// A record "5+5" whose description field and group (the reader's last field) are
    /// both `subject`.
    fn subject_record(subject: &str) -> Record {
        Record {
            id: "r".into(),
            text: "5+5".into(),
            fields: vec![subject.into(), subject.into()],
            kept: Default::default(),
            chat: None,
            choices: None,
            limit_group: None,
            ordinal: 0,
        }
    }

    /// `data` as one actor's answer to a task.
    fn piece(data: Vec<Completion>) -> Piece<Vec<Completion>> {
        Piece {
            rows: data.len(),
            actor_id: resident_sdk::ActorId::new("a"),
            node_id: resident_sdk::NodeId::new("n"),
            micros: 0,
            model_fingerprint: String::new(),
            data,
        }
    }

    /// A completion that generated nothing, with no score yet.
    fn scored_nothing() -> Completion {
        Completion {
            id: "r".into(),
            text: String::new(),
            prompt_tokens: 1,
            generated_tokens: 0,
            finish_reason: FinishReason::Length,
            truncated: false,
            logprobs: None,
            more: Vec::new(),
            error: None,
            score: None,
            choice_scores: None,
            reasoning: None,
            reasoning_tokens: 0,
        }
    }

    /// A scored record's line carries its score with the perplexity, its size and bits
    /// per byte when scored whole, the listed tokens when asked; the run's figures give the
    /// perplexity of all scored tokens together, and per word and byte (and bits per byte)
    /// over the texts scored whole alone.
    #[test]
    fn a_score_is_written_with_its_perplexity_and_summed_into_the_report() {
        let completion = |logprob: f64, tokens: u32, size: Option<TextSize>| Completion {
            prompt_tokens: tokens + 1,
            score: Some(TextScore {
                tokens,
                logprob,
                greedy: false,
                token_logprobs: None,
                size,
            }),
            ..scored_nothing()
        };
        let id = serde_json::json!("r");
        let size = TextSize {
            bytes: 12,
            words: 3,
        };
        let first = completion(-8.0, 4, Some(size));
        let line = serde_json::to_value(GenerationLine::new(&id, &first, None)).unwrap();
        assert_eq!(line["score"]["tokens"], 4);
        assert_eq!(line["score"]["perplexity"], 2f64.exp());
        assert_eq!(
            (&line["score"]["bytes"], &line["score"]["words"]),
            (&12.into(), &3.into())
        );
        let bits = line["score"]["bits_per_byte"].as_f64().unwrap();
        assert!((bits - 8.0 / 12.0 / std::f64::consts::LN_2).abs() < 1e-12);
        assert!(line.get("prompt_logprobs").is_none(), "{line}");
        let cut = completion(-2.0, 2, None);
        let cut_line = serde_json::to_value(GenerationLine::new(&id, &cut, None)).unwrap();
        assert!(cut_line["score"].get("bytes").is_none(), "{cut_line}");
        assert!(
            cut_line["score"].get("bits_per_byte").is_none(),
            "{cut_line}"
        );
        let mut tally = GenerationTally::default();
        let work = test_work();
        work.tally(&mut tally, &piece(vec![first, cut]), &[]);
        let figures = tally.figures(Duration::from_secs(1));
        let counts = &figures.tally.evaluation;
        assert_eq!((counts.scored_texts, counts.scored_tokens), (2, 6));
        assert_eq!(
            (counts.whole_scored_texts, counts.whole_scored_bytes),
            (1, 12)
        );
        assert_eq!(counts.whole_scored_words, 3);
        let perplexity = figures.scored_perplexity.unwrap();
        assert!((perplexity - (10f64 / 6.0).exp()).abs() < 1e-12);
        let near = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(near(figures.word_perplexity, (8f64 / 3.0).exp()));
        assert!(near(figures.byte_perplexity, (8f64 / 12.0).exp()));
        assert!(near(figures.bits_per_byte, bits));
        // Texts of -8 and -2: per text e^5, the mean's standard error 3 (sd 18^0.5 over
        // 2^0.5), times e^5 by the delta method.
        assert!(near(figures.text_perplexity, 5f64.exp()));
        assert!(near(figures.text_perplexity_stderr, 3.0 * 5f64.exp()));
        let mut older = figures.tally.clone();
        older.evaluation.squared_texts = 1;
        let older = older.figures(Duration::from_secs(1));
        assert_eq!(
            (
                older.text_perplexity.is_some(),
                older.text_perplexity_stderr
            ),
            (true, None),
            "a chunk kept without the spread: no error"
        );
        let unscored = GenerationTally::default().figures(Duration::from_secs(1));
        let json = serde_json::to_value(unscored).unwrap();
        assert!(json.get("scored_perplexity").is_none() && json.get("scored_tokens").is_none());
        assert!(json.get("bits_per_byte").is_none() && json.get("whole_scored_bytes").is_none());
        assert!(json.get("accuracy").is_none() && json.get("choice_records").is_none());
    }

    /// A record with choices writes each one's score, the likeliest plain and per
    /// character, and (with an answer) whether each is right; the run's accuracy counts
    /// only the records that named an answer.
    #[test]
    fn scored_choices_are_written_and_counted_into_the_accuracy() {
        let score = |logprob: f64, tokens: u32| TextScore {
            tokens,
            logprob,
            greedy: tokens == 1,
            token_logprobs: None,
            size: None,
        };
        let completion = |answers: &[u32]| Completion {
            // " Paris" (-1 over 6 characters) against " the city of Lyon" (-2.5 over 17).
            choice_scores: Some(ChoiceScores {
                scores: vec![score(-1.0, 1), score(-2.5, 4)],
                chars: vec![6, 17],
                answers: answers.to_vec(),
            }),
            ..scored_nothing()
        };
        let id = serde_json::json!("q");
        let right = completion(&[0]);
        let line = serde_json::to_value(GenerationLine::new(&id, &right, None)).unwrap();
        assert_eq!(line["choice_scores"][0]["logprob"], -1.0);
        assert_eq!(line["choice_scores"][1]["tokens"], 4);
        assert_eq!(line["choice_scores"][1]["perplexity"], 0.625f64.exp());
        assert_eq!(
            (line["best"].clone(), line["best_normalized"].clone()),
            (0.into(), 1.into())
        );
        assert_eq!(
            (line["correct"].clone(), line["correct_normalized"].clone()),
            (true.into(), false.into())
        );
        assert!(
            line.get("score").is_none() && line.get("choices").is_none(),
            "{line}"
        );
        // e^-1 / (e^-1 + e^-2.5): the right choice's share of the two's probability.
        let right_share = 1.0 / (1.0 + (-1.5f64).exp());
        let probability = line["answer_probability"].as_f64().unwrap();
        assert!((probability - right_share).abs() < 1e-12, "{line}");
        // Two choices: the right one's (1 - p)^2 and the wrong one's p^2 are alike.
        let brier = line["brier_score"].as_f64().unwrap();
        assert!(
            (brier - 2.0 * (1.0 - right_share).powi(2)).abs() < 1e-12,
            "{line}"
        );
        assert!(line.get("answers").is_none(), "one answer: `answer`");
        let both = completion(&[0, 1]);
        let line = serde_json::to_value(GenerationLine::new(&id, &both, None)).unwrap();
        assert_eq!(
            (&line["answers"], line.get("answer"), &line["correct"]),
            (&serde_json::json!([0, 1]), None, &true.into()),
            "several answers: `answers`"
        );
        assert!((line["answer_probability"].as_f64().unwrap() - 1.0).abs() < 1e-12);
        assert!(
            line.get("brier_score").is_none(),
            "no one-hot answer: {line}"
        );
        let unanswered = completion(&[]);
        let line = serde_json::to_value(GenerationLine::new(&id, &unanswered, None)).unwrap();
        assert!(
            ["correct", "answer", "answer_probability", "brier_score"].map(|f| line.get(f))
                == [None; 4],
            "{line}"
        );
        assert_eq!(line["best"], 0);
        let mut tally = GenerationTally::default();
        let piece = piece(vec![right, completion(&[1]), unanswered]);
        // By subject: the right record is math's, the wrong one art's (right per
        // character), the unanswered one math's again.
        let mut work = test_work();
        work.accuracy_by = Some("subject".into());
        let kept: Vec<Kept> = ["math", "art", "math"]
            .map(|subject| {
                [("subject".to_owned(), subject.into())]
                    .into_iter()
                    .collect()
            })
            .to_vec();
        work.tally(&mut tally, &piece, &kept);
        let groups = &tally.evaluation.groups;
        assert_eq!(
            (
                groups["math"].answered_records,
                groups["math"].correct_records
            ),
            (1, 1)
        );
        assert_eq!(
            (
                groups["art"].correct_records,
                groups["art"].correct_normalized_records
            ),
            (0, Some(1))
        );
        let figures = tally.figures(Duration::from_secs(1));
        assert_eq!(
            (
                figures.tally.evaluation.choice_records,
                figures.tally.evaluation.answered_records
            ),
            (3, 2)
        );
        assert_eq!(figures.accuracy, Some(0.5));
        assert_eq!(figures.accuracy_normalized, Some(0.5));
        // The right one's share, then the wrong one's: they sum to 1, their mean is 0.5 and
        // the mean's standard error half their difference.
        let answer_probability = figures.answer_probability.unwrap();
        assert!((answer_probability - 0.5).abs() < 1e-12);
        let stderr = figures.answer_probability_stderr.unwrap();
        assert!((stderr - (right_share - 0.5)).abs() < 1e-12, "{stderr}");
        // The right record's 2 (1 - p)^2 and the wrong one's 2 p^2, averaged.
        let briers = [2.0 * (1.0 - right_share).powi(2), 2.0 * right_share.powi(2)];
        let brier = figures.brier_score.unwrap();
        assert!(
            (brier - (briers[0] + briers[1]) / 2.0).abs() < 1e-12,
            "{brier}"
        );
        let brier_stderr = figures.brier_score_stderr.unwrap();
        assert!((brier_stderr - (briers[1] - briers[0]) / 2.0).abs() < 1e-12);
        let json = serde_json::to_value(&figures).unwrap();
        assert_eq!(json["correct_records"], 1);
        assert!(
            json.get("groups").is_none(),
            "the counts are reported by group only"
        );
    }

    /// A job that checks answers: each line has the first sample's extracted answer and
    /// whether it is right, each sample its own, and the majority; the tallies count
    /// them (by group too); a record without a reference is extracted, not counted; an
    /// object as the reference answers the record with an error before it is generated;
    /// the settings fingerprint changes with the checks.
    #[test]
    fn generated_answers_are_checked_against_each_record_s_reference() {
        let mut job = GenerateJobConfig::new(
            CorpusJobConfig::new("in.jsonl", "model.gguf", "out"),
            PromptTemplate::parse("{text}").unwrap(),
        );
        let plain = job.generation.settings_fingerprint("m");
        job.check_answers(AnswerMatchSpec {
            reference_field: Some("target.value".into()),
            extract: Some(r"answer is (\d+)".into()),
            ignore: vec![",".into()],
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        job.report_accuracy_by("task");
        assert_eq!(job.corpus.reader.keep_fields, ["target.value", "task"]);
        assert_ne!(job.generation.settings_fingerprint("m"), plain);
        let work = job.generation;
        let kept = |target: serde_json::Value, task: &str| -> Kept {
            let fields = [("target.value", target), ("task", task.into())];
            fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
        };
        let sample = |text: &str| resident_actor::generate::Choice {
            text: text.into(),
            generated_tokens: 3,
            finish_reason: FinishReason::Stop,
            logprobs: None,
            reasoning: None,
            reasoning_tokens: 0,
        };
        let answered = |text: &str, more: &[&str]| Completion {
            text: text.into(),
            more: more.iter().map(|t| sample(t)).collect(),
            ..scored_nothing()
        };
        let records = vec![
            answered("The answer is 1000.", &["answer is 7", "answer is 1,000"]),
            answered("I do not know.", &[]),
            answered("answer is 3", &[]),
        ];
        let kept = vec![
            kept(serde_json::json!(["1,000", "one thousand"]), "math"),
            kept(serde_json::json!("5"), "math"),
            kept(serde_json::Value::Null, "art"),
        ];
        let lines: Vec<serde_json::Value> = (records.iter().zip(&kept))
            .map(|(completion, kept)| {
                let answers = work.answers_of(completion, Some(kept));
                let line =
                    GenerationLine::new(&serde_json::Value::Null, completion, answers.as_deref());
                serde_json::to_value(line).unwrap()
            })
            .collect();
        assert_eq!(
            (&lines[0]["extracted"], &lines[0]["correct"]),
            (&"1000".into(), &true.into())
        );
        let samples = lines[0]["choices"].as_array().unwrap();
        let sampled: Vec<(&serde_json::Value, &serde_json::Value)> = samples
            .iter()
            .map(|s| (&s["extracted"], &s["correct"]))
            .collect();
        assert_eq!(sampled[1], (&"7".into(), &false.into()));
        assert_eq!(lines[0]["correct_majority"], true, "1000 twice, 7 once");
        assert_eq!(
            lines[1]["extracted"],
            serde_json::Value::Null,
            "written as null"
        );
        assert_eq!(lines[1]["correct"], false);
        assert!(lines[2].get("correct").is_none() && lines[2]["extracted"] == "3");
        let mut tally = GenerationTally::default();
        let piece = piece(records);
        work.tally(&mut tally, &piece, &kept);
        let by_task = accuracy_by_group("task", &tally.evaluation.groups).unwrap();
        let figures = tally.figures(Duration::from_secs(1));
        let counts = &figures.tally;
        assert_eq!(
            (
                counts.evaluation.answers.reference_records,
                counts.evaluation.answers.exact_match_records
            ),
            (2, 1)
        );
        assert_eq!(
            (
                counts.evaluation.answers.unextracted_records,
                counts.evaluation.answers.sampled_reference_records
            ),
            (1, 1)
        );
        assert_eq!(figures.answers.exact_match, Some(0.5));
        assert_eq!(
            (
                figures.answers.exact_match_any,
                figures.answers.exact_match_majority
            ),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(figures.accuracy, None, "no choices were scored");
        assert_eq!(by_task.groups["math"].accuracy, 0.5);
        assert!(
            !by_task.groups.contains_key("art"),
            "art's record has no reference"
        );
        // A reference that is an object answers its record with an error, saying what to do.
        let mut record = Record {
            id: "q".into(),
            text: "2 + 2?".into(),
            fields: Vec::new(),
            kept: kept_object(),
            chat: None,
            choices: None,
            limit_group: None,
            ordinal: 0,
        };
        let error = work.prompt_of(record.clone()).error.unwrap();
        assert!(error.contains("`target.value.aliases`"), "{error}");
        record.kept = Kept::new();
        assert!(
            work.prompt_of(record).error.is_none(),
            "no reference: nothing to check"
        );
    }

    fn kept_object() -> Kept {
        [(
            "target.value".to_owned(),
            serde_json::json!({"aliases": ["4"]}),
        )]
        .into_iter()
        .collect()
    }

    /// A generate job's work as the CLI's defaults make it.
    fn test_work() -> GenerateWork {
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        GenerateJobConfig::new(corpus, PromptTemplate::parse("{text}").unwrap()).generation
    }

    /// A job's settings read as before the new parameters existed while they are at their
    /// defaults, and differ once one is set.
    #[test]
    fn new_parameters_join_the_settings_only_when_set() {
        let plain = params_settings(&GenerateParams::default());
        assert_eq!(
            canonical_json(&plain),
            r#"{"max_new_tokens":128,"seed":0,"stop":[],"temperature":0.0,"template":"Chat","top_k":0,"top_p":1.0}"#,
            "the first release's settings, keys sorted"
        );
        let penalised = GenerateParams {
            repetition_penalty: 1.2,
            ..GenerateParams::default()
        };
        assert_eq!(
            params_settings(&penalised)["repetition_penalty"],
            1.2f32 as f64
        );
        // A scoring job's settings say its texts are scored whole, in windows: one started
        // when they were scored on their heads alone does not resume into it.
        let scoring = GenerateParams {
            score: true,
            ..GenerateParams::default()
        };
        assert_eq!(params_settings(&scoring)["score_windows"], true);
        assert_eq!(params_settings(&scoring)["score_choices"], true);
        assert!(plain.get("score_windows").is_none() && plain.get("score_choices").is_none());
    }
}
