//! `resident generate`: a completion per record of a corpus (summaries, answers), from an
//! LLM kept resident in `generate` actors, resumably.

use clap::{Args, ValueEnum};
use resident_actor::generate::{GenerateParams, ReasoningParser, ResponseFormat, Template};
use resident_jobs::corpus_job::{
    AccuracyByGroup, AnswerCounts, AnswerFlags, AnswerMatchSpec, AnswerShares, ChoiceFields,
    EngineSettings, ExtractMatch, FewshotAsked, FewshotFlags, FewshotSampling, FewshotSource,
    FilterSpec, GenerateFigures, GenerateJobConfig, GenerationFormat, GenerationOutput, JobReport,
    KeptColumn, OverlapMetric, PromptTemplate, run_generate_job,
};
use resident_models::generate::chat::ChatTemplate;

use crate::corpus_args::{CorpusArgs, progress_reporter};
use crate::exit::BadInput;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TemplateArg {
    /// The prompt as the single user turn of the model's chat template, with the
    /// generation prompt added.
    Chat,
    /// The prompt as it is, after BOS when the model's metadata asks for one.
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum InputFormatArg {
    /// JSON lines with a text field (or a `messages` list in its place), Parquet or text.
    Records,
    /// OpenAI Batch JSONL: `custom_id`, `method`, `url` (/v1/chat/completions) and `body`
    /// (messages and parameters) per line.
    OpenaiBatch,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    /// JSON lines: shards/*.jsonl merged into generations.jsonl.
    Jsonl,
    /// Parquet: shards/*.parquet merged into generations.parquet (columns `id`, the
    /// --keep-columns, `text`, `prompt_tokens`, `generated_tokens`, `finish_reason`,
    /// `truncated`, and `choices`, `logprobs` as JSON text and `error`, null where absent).
    Parquet,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExtractMatchArg {
    /// The first match (lm-evaluation-harness's GSM8K strict-match).
    First,
    /// The last match (its flexible-extract).
    Last,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormatArg {
    /// `{"id", "text", "prompt_tokens", "generated_tokens", "finish_reason"}` per record.
    Generations,
    /// OpenAI Batch output JSONL: `custom_id`, `response.body.choices` and `usage`, or
    /// `error`, per input line in input order.
    OpenaiBatch,
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub(crate) corpus: CorpusArgs,
    /// The prompt of each text record: `{text}` is the record's text (cut from its middle
    /// when the prompt would not fit the context, after any few-shot examples are left
    /// out), `{field}` any other field of the record (`{field:listed}` a list, an item a
    /// line after its --choice-labels label or A, B, C... and ". ": MMLU-Pro's options),
    /// `{{` and `}}` literal braces. Example: "Summarise in one sentence:\n\n{text}".
    /// Records with `messages` are conversations and take no prompt.
    #[arg(long, env = "RESIDENT_PROMPT", default_value = "{text}")]
    prompt: String,
    /// A system message before each text record's user turn (the model's chat template
    /// must take one; the error says so where it does not). Under --template none it is
    /// text directly before the prompt, as lm-evaluation-harness writes its
    /// --system_instruction without --apply_chat_template: then --fewshot-delimiter and
    /// --description where one is given, else the examples or the prompt at once (end it
    /// with the newline you want).
    #[arg(long, env = "RESIDENT_SYSTEM")]
    system: Option<String>,
    /// How the input's records are read.
    #[arg(
        long,
        env = "RESIDENT_INPUT_FORMAT",
        value_enum,
        default_value = "records"
    )]
    input_format: InputFormatArg,
    /// How each answer is written to generations.jsonl.
    #[arg(
        long,
        env = "RESIDENT_OUTPUT_FORMAT",
        value_enum,
        default_value = "generations"
    )]
    output_format: OutputFormatArg,
    /// Input fields written into each line of generations.jsonl after its id, as the input
    /// has them (text, number, list or object; null where a record lacks one; with
    /// --format parquet, text columns after `id`):
    /// `title,url`, a path `meta.url`, or FIELD=NAME to write one under another name
    /// (`text=article`: the record's text beside the completion, which is the line's
    /// `text`). A name the line has for itself is refused.
    #[arg(long, env = "RESIDENT_KEEP_COLUMNS", value_delimiter = ',', value_parser = KeptColumn::parse)]
    keep_columns: Vec<KeptColumn>,
    /// How generations are stored: jsonl (generations.jsonl, the default) or parquet
    /// (generations.parquet, which pyarrow, pandas, DuckDB and Spark read as it is; a
    /// typed column per field the job's lines may have, scores and checked answers
    /// included, text columns for --keep-columns; not with --output-format openai-batch).
    #[arg(
        long,
        env = "RESIDENT_GENERATE_FORMAT",
        value_enum,
        default_value = "jsonl"
    )]
    format: FormatArg,
    /// Print the first N records' prompts as the model will read them, with their token
    /// counts (with --score, the text's tokens scored and the windows they take), and exit
    /// without running anything (the model's tokenizer is read from a local --model path).
    #[arg(long, env = "RESIDENT_DRY_RUN", value_name = "N")]
    pub(crate) dry_run: Option<usize>,
    /// How the prompt reaches the model: chat (the model's chat template; the default) or
    /// none (the text as it is; the default with --score). With --score, chat scores each
    /// record's choices after its prompt as the chat template renders it, the generation
    /// prompt last (lm-evaluation-harness's --apply_chat_template: --target-delimiter is
    /// not put before the choices then); a text itself is scored raw, under none.
    #[arg(long, env = "RESIDENT_TEMPLATE", value_enum)]
    template: Option<TemplateArg>,
    /// At most this many tokens per completion.
    #[arg(long, env = "RESIDENT_MAX_NEW_TOKENS", default_value_t = 128)]
    max_new_tokens: u32,
    /// 0 is greedy; higher samples more freely.
    #[arg(long, env = "RESIDENT_TEMPERATURE", default_value_t = 0.0)]
    temperature: f32,
    /// Sample from the smallest set of tokens whose probabilities add up to this.
    #[arg(long, env = "RESIDENT_TOP_P", default_value_t = 1.0)]
    top_p: f32,
    /// Sample from the K likeliest tokens (0 = all).
    #[arg(long, env = "RESIDENT_TOP_K", default_value_t = 0)]
    top_k: u32,
    /// With each record's id, seeds its sampler: the same output on any agent, chunk size
    /// or rerun.
    #[arg(long, env = "RESIDENT_SEED", default_value_t = 0)]
    seed: u64,
    /// Stop a completion before this text (repeatable; the variable gives one).
    #[arg(long = "stop", env = "RESIDENT_STOP")]
    stop: Vec<String>,
    /// Drop tokens less likely than this fraction of the likeliest token's probability
    /// (after temperature; 0 keeps all).
    #[arg(long, env = "RESIDENT_MIN_P", default_value_t = 0.0)]
    min_p: f32,
    /// Above 1 discourages every token already in the prompt or the completion: a
    /// positive logit is divided by it, a negative one multiplied (vLLM's; 1 is off).
    #[arg(long, env = "RESIDENT_REPETITION_PENALTY", default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Subtracted once from the logit of each token the completion already holds (-2 to
    /// 2; 0 is off).
    #[arg(long, env = "RESIDENT_PRESENCE_PENALTY", default_value_t = 0.0)]
    presence_penalty: f32,
    /// Subtracted from a token's logit per time the completion holds it (-2 to 2; 0 is
    /// off).
    #[arg(long, env = "RESIDENT_FREQUENCY_PENALTY", default_value_t = 0.0)]
    frequency_penalty: f32,
    /// No end token, stop token or stop string ends a completion before this many tokens.
    #[arg(long, env = "RESIDENT_MIN_TOKENS", default_value_t = 0)]
    min_tokens: u32,
    /// End a completion after any of these token ids (comma-separated; left out of the
    /// text).
    #[arg(long, env = "RESIDENT_STOP_TOKEN_IDS", value_delimiter = ',')]
    stop_token_ids: Vec<u32>,
    /// Completions per record, each sampled with its own stream (greedy gives n equal
    /// ones).
    #[arg(short = 'n', long = "n", env = "RESIDENT_N", default_value_t = 1)]
    n: u32,
    /// Write each generated token's log-probability.
    #[arg(long, env = "RESIDENT_LOGPROBS")]
    logprobs: bool,
    /// With --logprobs, the log-probabilities of this many likeliest tokens at each step
    /// (0-20).
    #[arg(long, env = "RESIDENT_TOP_LOGPROBS", default_value_t = 0)]
    top_logprobs: u32,
    /// Score each record's text under the model: the log-probability of each of its tokens
    /// given the prompt before it, written as `score` ({"tokens", "logprob", "perplexity",
    /// "greedy"}) per record and as the corpus's perplexity in the report. For perplexity
    /// filtering (with the default prompt, `{text}`) and evaluation (the prompt's text
    /// before `{text}` is the context). A conversation record (`messages`) is scored on
    /// its last message, the assistant's reply, given the turns before it through the
    /// model's chat template (DPO reference log-probabilities, reply filtering). A record
    /// with choices (--choices-field) has each scored after its prompt instead, nothing
    /// generated, as `choice_scores` with the likeliest (`best`, `best_normalized`) and,
    /// when it names its answer (--answer-field), `correct`, and the run's accuracy in the
    /// report (multiple-choice evaluation, as lm-evaluation-harness's); so has a preference
    /// pair (`prompt`, `chosen`, `rejected`: TRL's format, text or conversations), its
    /// chosen reply first and the answer. Reads the raw text (--template none, its
    /// default; see --template for choices under the chat template); with --max-new-tokens 0
    /// nothing is generated. A text longer than the model's
    /// window is scored whole, in windows (--score-stride, --max-score-windows).
    #[arg(long, env = "RESIDENT_SCORE")]
    score: bool,
    /// With --score, the field of a record's choices: a list of texts, an object with
    /// `text` and `label` lists (ARC's), or one with `choices` and `labels` lists
    /// (TruthfulQA's `mc2_targets`, its labels 1 for each true choice: the record's right
    /// answers when it has no answer field); or several fields, comma-separated, a text
    /// each (PIQA's sol1,sol2, Winogrande's option1,option2). Each is scored as a
    /// continuation of the prompt, the prompt's trailing whitespace moved to its front.
    #[arg(long, env = "RESIDENT_CHOICES_FIELD", default_value = "choices")]
    choices_field: String,
    /// With --score, the field of a record's right choice: its index from 0, its label or
    /// its text; or a list of them, for several right choices (then `correct` is the
    /// likeliest being one of them, and `answer_probability` their probability among all
    /// the choices: TruthfulQA's MC2; `brier_score` needs exactly one).
    #[arg(long, env = "RESIDENT_ANSWER_FIELD", default_value = "answer")]
    answer_field: String,
    /// With --score, the index a number answer counts choices from: 1 for Winogrande's and
    /// StoryCloze's "1"/"2" (a label or a choice's text is read as ever).
    #[arg(
        long,
        env = "RESIDENT_ANSWER_BASE",
        default_value_t = 0,
        value_name = "N"
    )]
    answer_base: u32,
    /// With --score --choices-as-contexts, where each choice goes in the record's text
    /// (Winogrande's "_"): each choice becomes the text before the blank and the choice, and
    /// what follows the blank, trimmed, is the text scored after each, as
    /// lm-evaluation-harness scores Winogrande (no splitting the rows first).
    #[arg(long, env = "RESIDENT_BLANK", value_name = "TEXT")]
    blank: Option<String>,
    /// With --score, these are scored in place of a record's choices, in order (MMLU's
    /// letters: --choice-labels A,B,C,D, the texts written into --prompt as
    /// {choices.0}...{choices.3}); a record with more choices than labels is a bad record.
    #[arg(
        long,
        env = "RESIDENT_CHOICE_LABELS",
        value_delimiter = ',',
        value_name = "LABEL,..."
    )]
    choice_labels: Vec<String>,
    /// With --score, each of a record's choices is a context put where the prompt places
    /// the text, and the record's text is scored after each (after --target-delimiter):
    /// the choice after which the text is likeliest wins. Winogrande's partial scoring:
    /// choices "The trophy doesn't fit in the suitcase because the trophy" and "... the
    /// suitcase", text "is too large.", delimiter " ". Under --template chat each context is
    /// the user's turn (after the system message and the examples) and the text, with no
    /// delimiter, the reply's start, as lm-evaluation-harness's --apply_chat_template has it.
    #[arg(long, env = "RESIDENT_CHOICES_AS_CONTEXTS")]
    choices_as_contexts: bool,
    /// Text before each record's prompt, and before its few-shot examples, with the
    /// record's {field}s and no {text} (lm-evaluation-harness's description; MMLU's "The
    /// following are multiple choice questions (with answers) about {subject}.\n\n").
    /// Under the chat template it is the system message instead (after --system and
    /// --fewshot-delimiter), as lm-evaluation-harness's --apply_chat_template puts it.
    #[arg(long, env = "RESIDENT_DESCRIPTION", value_name = "TEMPLATE")]
    description: Option<String>,
    /// Few-shot examples from this file or directory (a dataset's dev or train split, read
    /// as the input is): its first --fewshot answered records, each written through
    /// --prompt with its answer after it (--target-delimiter between), go before every
    /// record's prompt (lm-evaluation-harness's num_fewshot). With --score, records with
    /// choices, answered by their right choice; with --reference-field, records answered
    /// by that field (GSM8K's worked solutions). A prompt too long for the context loses its
    /// oldest examples whole before the record's text is cut (the line is marked
    /// `truncated`).
    #[arg(long, env = "RESIDENT_FEWSHOT_INPUT", value_name = "PATH")]
    fewshot_input: Option<std::path::PathBuf>,
    /// The field (or path) of each few-shot example's answer, written after its prompt in
    /// place of its --reference-field (lm-evaluation-harness's few-shot doc_to_target):
    /// MMLU-Pro's chain of thought `cot_content` before records checked against their
    /// letter, worked solutions before records whose reference is a short answer. An
    /// example without it is passed over. Generating jobs only (a scoring job's examples
    /// answer with their right choice).
    #[arg(long, env = "RESIDENT_FEWSHOT_ANSWER_FIELD", value_name = "FIELD")]
    fewshot_answer_field: Option<String>,
    /// How many examples --fewshot-input gives (0: none).
    #[arg(long, env = "RESIDENT_FEWSHOT", default_value_t = 5, value_name = "N")]
    fewshot: usize,
    /// The field whose value groups the examples (MMLU's `subject`): each record gets the
    /// first --fewshot examples with its own value, as lm-evaluation-harness's per-subject
    /// tasks take their dev split's. A record of a group the file lacks is answered with an
    /// error; a group with fewer examples than --fewshot is refused before the job starts.
    #[arg(long, env = "RESIDENT_FEWSHOT_GROUP", value_name = "FIELD")]
    fewshot_group: Option<String>,
    /// Draw each record's --fewshot examples at random from every answered example of
    /// --fewshot-input (of its own group with --fewshot-group), seeded by S and the
    /// record's id, never the record itself (as lm-evaluation-harness's default sampler
    /// draws for ARC or HellaSwag from a train split; --fewshot-sampler lm-eval gives its
    /// very draws); without it, the first --fewshot.
    #[arg(long, env = "RESIDENT_FEWSHOT_SEED", value_name = "S")]
    fewshot_seed: Option<u64>,
    /// How the examples are drawn: per-record (from --fewshot-seed and each record's id,
    /// whatever the input's order) or lm-eval (lm-evaluation-harness's own draws: one
    /// Python random.Random(--fewshot-seed, default 1234) stream through the records in
    /// input order, each taking sample(examples, --fewshot), one more where the examples
    /// are the input itself, so each record gets the very examples lm-evaluation-harness
    /// gives it; not with --fewshot-group).
    #[arg(
        long,
        env = "RESIDENT_FEWSHOT_SAMPLER",
        default_value = "per-record",
        value_name = "per-record|lm-eval"
    )]
    fewshot_sampler: FewshotSampling,
    /// Writes each few-shot example as a turn of the conversation, its prompt the user's
    /// and its answer the assistant's, the record's prompt the last user turn
    /// (lm-evaluation-harness's --fewshot_as_multiturn, the Open LLM Leaderboard's setting
    /// for chat models); without it the examples are text in the one user turn. A prompt
    /// too long for the context loses its oldest examples whole before any text is cut
    /// (the line is marked `truncated`). Needs the chat template (--template chat).
    #[arg(long, env = "RESIDENT_FEWSHOT_AS_MULTITURN")]
    fewshot_as_multiturn: bool,
    /// With --score or --reference-field, the report's accuracy also by the value of this
    /// field of each record (MMLU's `subject`): `accuracy_by_group` in report.json, each
    /// group's records, accuracy (and accuracy per character, scoring), and their mean
    /// over groups.
    #[arg(long, env = "RESIDENT_ACCURACY_BY", value_name = "FIELD")]
    accuracy_by: Option<String>,
    /// The field (or path: `answer.aliases`) of each record's right answer: a text, a
    /// number or a list of them. Each generated answer (found by --extract, else the whole
    /// text) is compared with it after --ignore-regex, --ignore-case and
    /// --ignore-punctuation, and trimmed: `correct` in its line, `exact_match` in the
    /// report (with -n, also any sample's and the most common answer's: pass@n, maj@n).
    #[arg(long, env = "RESIDENT_REFERENCE_FIELD", value_name = "FIELD")]
    reference_field: Option<String>,
    /// A regular expression that finds the answer in each generated text (GSM8K's
    /// '#### (\-?[0-9\.\,]+)'): of the match --extract-match picks, its first non-empty
    /// group, or the whole match without groups; `extracted` in the line (null when none
    /// matches, which is wrong against any reference). Python's `re` syntax, look-around
    /// and backreferences included (BIG-Bench Hard's '(?<=the answer is )(.*)(?=.)').
    #[arg(long, env = "RESIDENT_EXTRACT", value_name = "REGEX")]
    extract: Option<String>,
    /// Which match of --extract is the answer.
    #[arg(
        long,
        env = "RESIDENT_EXTRACT_MATCH",
        value_enum,
        default_value = "first"
    )]
    extract_match: ExtractMatchArg,
    /// A named filter in place of --extract, judged on its own over the same generation
    /// (repeat the flag: GSM8K's 'strict-match=#### (\-?[0-9\.\,]+)' and
    /// 'flexible-extract:last=(-?[$0-9.,]{2,})|(-?[0-9]+)' in one job): NAME=REGEX, or
    /// NAME:last=REGEX for its last match; an empty REGEX takes the whole text. Each has its
    /// answer under `filters.NAME` in the line and its figures under `filters.NAME` in the
    /// report; the first also gives the line's `extracted` and the report's `exact_match`.
    #[arg(long, env = "RESIDENT_FILTER", value_name = "NAME=REGEX")]
    filter: Vec<FilterSpec>,
    /// With --reference-field, removed from the answer and the reference before they are
    /// compared (each in turn; repeat the flag: GSM8K's ',' '\$' '(?s).*#### ' '\.$').
    #[arg(long, env = "RESIDENT_IGNORE_REGEX", value_name = "REGEX")]
    ignore_regex: Vec<String>,
    /// With --reference-field, compare lower-cased.
    #[arg(long, env = "RESIDENT_IGNORE_CASE")]
    ignore_case: bool,
    /// With --reference-field, compare without ASCII punctuation.
    #[arg(long, env = "RESIDENT_IGNORE_PUNCTUATION")]
    ignore_punctuation: bool,
    /// With --reference-field, also score each generated answer (as --extract or --filter
    /// found it, else the whole text) by its overlap with the reference, the best over a
    /// list of them: rouge (rouge1, rouge2, rougeL and rougeLsum, as the rouge-score
    /// package computes them; rougeLsum's sentences are lines), any one of those, f1
    /// (SQuAD's token F1), bleu or chrf (sacrebleu's defaults, 0 to 100, against every
    /// reference at once). Repeat the flag or give a list ('rouge,f1'). Each figure in the
    /// answer's line beside `correct` (BLEU and chrF the sentence's); in the report beside
    /// `exact_match`, the mean with its standard error, BLEU and chrF the corpus's.
    #[arg(
        long,
        env = "RESIDENT_METRIC",
        value_name = "NAME",
        value_delimiter = ','
    )]
    metric: Vec<String>,
    /// With --metric rouge (or one ROUGE figure), Porter-stem each word of more than three
    /// letters before ROUGE compares them, as rouge-score's use_stemmer=True does (NLTK's
    /// stemmer; Hugging Face's summarisation examples report ROUGE so).
    #[arg(long, env = "RESIDENT_ROUGE_STEMMER")]
    rouge_stemmer: bool,
    /// What goes between a prompt and its answer (lm-evaluation-harness's
    /// target_delimiter): between each few-shot example's prompt and its answer, and before
    /// each scored choice. Empty by default: end --prompt with the space instead (a scored
    /// choice's prompt gives its trailing whitespace to the choice); give ' ' with
    /// --prompt 'Question: {text}\nAnswer:' to write GSM8K as lm-evaluation-harness does,
    /// the question's prompt ending at the colon.
    #[arg(
        long,
        env = "RESIDENT_TARGET_DELIMITER",
        default_value = "",
        value_name = "TEXT"
    )]
    target_delimiter: String,
    /// What every answer starts with (lm-evaluation-harness's gen_prefix, Llama 3's "The
    /// best answer is"): under the chat template the assistant's reply, which the model
    /// continues (or each scored choice follows); under --template none, text after the
    /// prompt and --target-delimiter. Each few-shot example's answer starts with it and a
    /// space. The same text for every record; the generated text is what follows it.
    #[arg(long, env = "RESIDENT_GEN_PREFIX", value_name = "TEXT")]
    gen_prefix: Option<String>,
    /// What goes between two examples, and between the last and the record's prompt.
    #[arg(long, env = "RESIDENT_FEWSHOT_DELIMITER", default_value = resident_jobs::corpus_job::DEFAULT_FEWSHOT_DELIMITER)]
    fewshot_delimiter: String,
    /// With --score, each scored token's log-probability, with those of this many likeliest
    /// tokens at its position (0-20; vLLM's prompt_logprobs), as `prompt_logprobs`.
    #[arg(long, env = "RESIDENT_PROMPT_LOGPROBS", value_name = "K")]
    prompt_logprobs: Option<u32>,
    /// With --score, a text longer than the model's window goes on in more windows, each
    /// scoring this many tokens after the last one's, with the window's other tokens before
    /// them as context. Default: all of a window's tokens but one (each token computed once,
    /// as lm-evaluation-harness's loglikelihood_rolling); shorter gives each token more
    /// context at more compute (Hugging Face's strided perplexity).
    #[arg(long, env = "RESIDENT_SCORE_STRIDE", value_name = "TOKENS")]
    score_stride: Option<u32>,
    /// With --score, at most this many windows a text: the rest of a longer text goes
    /// unscored and counts in truncated_prompts. 1 scores each text's head alone.
    #[arg(long, env = "RESIDENT_MAX_SCORE_WINDOWS", value_name = "N")]
    max_score_windows: Option<u32>,
    /// With --score, a text with nothing before it (the default prompt, `{text}`, on a
    /// model that adds no BOS) is scored from its first token, given the model's BOS token
    /// (its end-of-text token where it has none), as lm-evaluation-harness's
    /// loglikelihood_rolling scores a document (wikitext's bits per byte); without it the
    /// first token is context only, as llama.cpp's perplexity reads it.
    #[arg(long, env = "RESIDENT_SCORE_FIRST_TOKEN")]
    score_first_token: bool,
    /// Do not end a completion at the model's end token: run to --max-new-tokens.
    #[arg(long, env = "RESIDENT_IGNORE_EOS")]
    ignore_eos: bool,
    /// A JSON schema file: decoding is masked by its grammar (llguidance), so every
    /// completion that ends with `stop` parses and validates. A record's own
    /// `response_format` (OpenAI Batch) replaces it.
    #[arg(
        long,
        env = "RESIDENT_JSON_SCHEMA",
        value_name = "FILE",
        group = "constraint"
    )]
    json_schema: Option<std::path::PathBuf>,
    /// Each completion is text this regular expression matches whole (Rust's regex
    /// syntax, vLLM's guided_regex): '[0-9]{4}', '(yes|no): [^\n]{1,80}'. A record's own
    /// constraint replaces it.
    #[arg(
        long,
        env = "RESIDENT_GUIDED_REGEX",
        value_name = "REGEX",
        group = "constraint"
    )]
    guided_regex: Option<String>,
    /// Each completion is exactly one of these texts (vLLM's guided_choice: a label from a
    /// fixed set); repeat the flag for each, `--guided-choice positive --guided-choice
    /// negative` (a text may hold commas; the variable gives one). A record's own
    /// constraint replaces it.
    #[arg(
        long,
        env = "RESIDENT_GUIDED_CHOICE",
        value_name = "TEXT",
        group = "constraint"
    )]
    guided_choice: Vec<String>,
    /// A context-free grammar file in llguidance's Lark syntax (start rule `start`;
    /// vLLM's guided_grammar): each completion is a sentence of it. A record's own
    /// constraint replaces it.
    #[arg(
        long,
        env = "RESIDENT_GUIDED_GRAMMAR",
        value_name = "FILE",
        group = "constraint"
    )]
    guided_grammar: Option<std::path::PathBuf>,
    /// Sequences each actor decodes at once (continuous batching); when absent, 256 on a
    /// GPU and 32 on the CPU. Chunks hold at least twice this on GPUs, four times on CPUs.
    #[arg(long, env = "RESIDENT_MAX_SEQUENCES")]
    max_sequences: Option<u32>,
    /// Tokens in one forward step, prompts and decodes together; when absent, 4096 on a
    /// GPU and 512 on the CPU.
    #[arg(long, env = "RESIDENT_MAX_STEP_TOKENS")]
    max_step_tokens: Option<u32>,
    /// Cap each sequence's context (prompt and completion) at this many tokens, below the
    /// model's own: longer prompts lose their oldest few-shot examples, then the middle of
    /// the record's text. Bounds the KV cache.
    #[arg(long, env = "RESIDENT_MAX_CONTEXT")]
    max_context: Option<u32>,
    /// The weights' precision on the actors: auto (a GGUF file's quantised blocks on the
    /// CPU, bf16 on a GPU, f32 for a safetensors checkpoint on the CPU), quantised, f32,
    /// f16 or bf16.
    #[arg(
        long,
        env = "RESIDENT_WEIGHTS_DTYPE",
        value_parser = ["auto", "quantised", "f32", "f16", "bf16"]
    )]
    dtype: Option<String>,
    /// On a GPU, run every decode step eagerly instead of replaying CUDA graphs (vLLM's
    /// --enforce-eager): slower; for a driver that misbehaves under graphs.
    #[arg(long, env = "RESIDENT_ENFORCE_EAGER")]
    enforce_eager: bool,
    /// On a GPU, the paged attention's kernel: auto (tensor cores for f16 and bf16 heads of
    /// 32, 64 or 128, else scalar), tensor-cores, or scalar (for a GPU or driver where the
    /// tensor-core kernel misbehaves). CPU actors ignore it.
    #[arg(
        long,
        env = "RESIDENT_ATTENTION_KERNEL",
        value_parser = ["auto", "tensor-cores", "scalar"]
    )]
    attention_kernel: Option<String>,
    /// A Jinja chat template in place of the model's own, or for a model without one
    /// (vLLM's --chat-template): a file holding it, or the template itself. Conversations
    /// and --template chat prompts are rendered with it; one that does not compile is
    /// refused before the job starts.
    #[arg(long, env = "RESIDENT_CHAT_TEMPLATE", value_name = "FILE|TEMPLATE")]
    chat_template: Option<String>,
    /// Variables the chat template is rendered with besides the conversation, as a JSON
    /// object (vLLM's and transformers' chat_template_kwargs):
    /// '{"enable_thinking": false}' turns a Qwen3 model's thinking off.
    #[arg(long, env = "RESIDENT_CHAT_TEMPLATE_KWARGS", value_name = "JSON")]
    chat_template_kwargs: Option<String>,
    /// Split a reasoning model's thinking (`<think>...</think>`) from its answer, as vLLM's
    /// --reasoning-parser does: `text` is the answer (what --reference-field checks and
    /// --metric scores), `reasoning` the thinking, `reasoning_tokens` its tokens; a
    /// constraint (--json-schema, --guided-*) holds the answer after `</think>`. qwen3: a
    /// completion without `</think>` is all answer; deepseek_r1: all thinking.
    #[arg(
        long,
        env = "RESIDENT_REASONING_PARSER",
        value_name = "PARSER",
        value_parser = reasoning_parser()
    )]
    reasoning_parser: Option<ReasoningParser>,
}

/// `--reasoning-parser`'s values: the parsers by name.
fn reasoning_parser() -> impl clap::builder::TypedValueParser<Value = ReasoningParser> {
    use clap::builder::TypedValueParser;
    let names = ReasoningParser::ALL.map(ReasoningParser::name);
    clap::builder::PossibleValuesParser::new(names)
        .map(|name| name.parse::<ReasoningParser>().expect("a listed name"))
}

impl GenerateArgs {
    pub(crate) fn job_config(&self) -> anyhow::Result<GenerateJobConfig> {
        let prompt = PromptTemplate::parse(&self.prompt).map_err(crate::exit::BadInput)?;
        crate::exit::require(
            self.top_logprobs == 0 || self.logprobs,
            "--top-logprobs needs --logprobs",
        )?;
        crate::exit::require(
            !self.fewshot_as_multiturn || self.template() == TemplateArg::Chat,
            "--fewshot-as-multiturn writes the few-shot examples as chat turns: it needs the \
             chat template (--template chat)",
        )?;
        crate::exit::require(
            !self.score
                || (self.input_format == InputFormatArg::Records
                    && self.output_format == OutputFormatArg::Generations),
            "--score scores text records into generations.jsonl: it takes neither \
             --input-format openai-batch nor --output-format openai-batch",
        )?;
        let corpus = self.corpus.corpus_config()?;
        let mut config = GenerateJobConfig::new(corpus, prompt);
        let generation = &mut config.generation;
        generation.params = self.params()?;
        generation.output = match self.output_format {
            OutputFormatArg::Generations => GenerationOutput::Lines,
            OutputFormatArg::OpenaiBatch => GenerationOutput::OpenAiBatch,
        };
        generation.format = match self.format {
            FormatArg::Jsonl => GenerationFormat::Jsonl,
            FormatArg::Parquet => GenerationFormat::Parquet,
        };
        let engine = EngineSettings {
            max_sequences: self.max_sequences,
            max_step_tokens: self.max_step_tokens,
            max_context: self.max_context,
            dtype: self.dtype.clone(),
            enforce_eager: self.enforce_eager,
            attention_kernel: self.attention_kernel.clone(),
            chat_template: self.chat_template()?,
            chat_template_kwargs: self.chat_template_kwargs()?,
        };
        generation.engine = engine;
        let gen_prefix = self.gen_prefix.clone().unwrap_or_default();
        config.put_answer_start(self.target_delimiter.clone(), gen_prefix);
        if self.input_format == InputFormatArg::OpenaiBatch {
            config.read_openai_batch();
        }
        crate::exit::require(
            self.score || self.choice_labels.is_empty(),
            "--choice-labels scores labels in place of each record's choices: it needs --score",
        )?;
        if self.score {
            config.corpus.reader.choices = Some(ChoiceFields {
                choices: self.choices_field.clone(),
                answer: self.answer_field.clone(),
                labels: self.choice_labels.clone(),
                answer_base: self.answer_base,
                blank: self.blank.clone(),
            });
        }
        if let Some(spec) = self.answer_match()? {
            config.check_answers(spec)?;
        }
        config.keep_columns(self.keep_columns.clone())?;
        if let Some(field) = &self.accuracy_by {
            crate::exit::require(
                self.score || self.reference_field.is_some(),
                "--accuracy-by breaks down the accuracy of scored choices or of answers \
                 checked against --reference-field: it needs --score (and records with \
                 choices and answers) or --reference-field",
            )?;
            config.report_accuracy_by(field);
        }
        let fewshot = self.fewshot_source()?;
        if self.description.is_some() || fewshot.is_some() {
            config.put_prompt_start(self.description.as_deref(), fewshot.as_ref())?;
        }
        // Flags that cannot work together are refused before a cluster is reached.
        config.check()?;
        Ok(config)
    }

    /// How generated answers are checked, if they are (`--reference-field`, `--extract`,
    /// `--filter`).
    fn answer_match(&self) -> anyhow::Result<Option<AnswerMatchSpec>> {
        let spec = AnswerMatchSpec {
            reference_field: self.reference_field.clone(),
            extract: self.extract.clone(),
            extract_match: match self.extract_match {
                ExtractMatchArg::First => ExtractMatch::First,
                ExtractMatchArg::Last => ExtractMatch::Last,
            },
            filters: self.filter.clone(),
            ignore: self.ignore_regex.clone(),
            ignore_case: self.ignore_case,
            ignore_punctuation: self.ignore_punctuation,
            metrics: OverlapMetric::from_names(&self.metric).map_err(crate::exit::BadInput)?,
            rouge_stemmer: self.rouge_stemmer,
        };
        let openai_batch = self.output_format != OutputFormatArg::Generations;
        if let Some(refusal) = spec.refusal(self.score, openai_batch) {
            return Err(crate::exit::BadInput(refusal.message(&AnswerFlags::CLI)).into());
        }
        Ok(spec.asked().then_some(spec))
    }

    /// The few-shot examples the flags name, if any.
    fn fewshot_source(&self) -> anyhow::Result<Option<FewshotSource>> {
        let asked = FewshotAsked {
            input: self.fewshot_input.is_some(),
            picked: self.fewshot_group.is_some()
                || self.fewshot_seed.is_some()
                || self.fewshot_sampler != FewshotSampling::PerRecord
                || self.fewshot_answer_field.is_some(),
            answered: self.score
                || self.reference_field.is_some()
                || self.fewshot_answer_field.is_some(),
        };
        if let Some(refusal) = asked.refusal() {
            return Err(BadInput(refusal.message(&FewshotFlags::CLI)).into());
        }
        let Some(path) = &self.fewshot_input else {
            return Ok(None);
        };
        Ok(Some(FewshotSource {
            path: path.clone(),
            count: self.fewshot,
            delimiter: self.fewshot_delimiter.clone(),
            group_field: self.fewshot_group.clone(),
            seed: self.fewshot_seed,
            sampling: self.fewshot_sampler,
            as_turns: self.fewshot_as_multiturn,
            answer_field: self.fewshot_answer_field.clone(),
            ..FewshotSource::default()
        }))
    }
}

impl GenerateArgs {
    /// `--chat-template`'s source (read from the file it names, or the template itself),
    /// checked to compile.
    fn chat_template(&self) -> anyhow::Result<Option<String>> {
        let Some(given) = &self.chat_template else {
            return Ok(None);
        };
        let path = std::path::Path::new(given);
        let source = match path.is_file() {
            true => std::fs::read_to_string(path).map_err(|e| {
                crate::exit::BadInput(format!("--chat-template {}: {e}", path.display()))
            })?,
            false if given.contains("{{") || given.contains("{%") => given.clone(),
            false => {
                return Err(crate::exit::BadInput(format!(
                    "--chat-template {given:?} is neither a file nor a Jinja template: give \
                     the path of a file holding the template, or the template itself"
                ))
                .into());
            }
        };
        match ChatTemplate::check(&source) {
            Err(why) => {
                let refusal = format!("--chat-template does not compile: {why}");
                Err(crate::exit::BadInput(refusal).into())
            }
            Ok(()) => Ok(Some(source)),
        }
    }

    /// `--chat-template-kwargs` as a JSON object.
    fn chat_template_kwargs(
        &self,
    ) -> anyhow::Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let Some(given) = &self.chat_template_kwargs else {
            return Ok(None);
        };
        match serde_json::from_str(given) {
            Ok(serde_json::Value::Object(kwargs)) => Ok(Some(kwargs)),
            _ => Err(crate::exit::BadInput(format!(
                "--chat-template-kwargs {given:?} is not a JSON object: give the template's \
                 variables as one, e.g. '{{\"enable_thinking\": false}}'"
            ))
            .into()),
        }
    }

    /// `--template`, or its default: the chat template, but the raw text for a score.
    fn template(&self) -> TemplateArg {
        match (self.template, self.score) {
            (Some(template), _) => template,
            (None, true) => TemplateArg::None,
            (None, false) => TemplateArg::Chat,
        }
    }

    /// The decoding and scoring parameters the flags give, checked: a parameter out of its
    /// range is refused under its flag's name.
    pub(crate) fn params(&self) -> anyhow::Result<GenerateParams> {
        let params = GenerateParams {
            template: match self.template() {
                TemplateArg::Chat => Template::Chat,
                TemplateArg::None => Template::None,
            },
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.clone(),
            system: self.system.clone(),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            min_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            n: self.n,
            logprobs: self.logprobs,
            top_logprobs: self.top_logprobs,
            ignore_eos: self.ignore_eos,
            response_format: self.response_format()?,
            score: self.score,
            prompt_logprobs: self.prompt_logprobs,
            score_stride: self.score_stride,
            max_score_windows: self.max_score_windows,
            score_first_token: self.score_first_token,
            choices_as_contexts: self.choices_as_contexts,
            reasoning_parser: self.reasoning_parser,
        };
        if let Some(problem) = params.problem() {
            // The flags spell the parameters with dashes; OpenAI's `max_tokens` is
            // --max-new-tokens here.
            let flag = match problem.param {
                "max_tokens" => "max-new-tokens".to_owned(),
                param => param.replace('_', "-"),
            };
            return Err(crate::exit::BadInput(format!("--{flag} {}", problem.rule)).into());
        }
        Ok(params)
    }

    /// `--json-schema FILE`, `--guided-regex`, `--guided-choice` or `--guided-grammar FILE`
    /// (clap lets one through) as the response format, refused under its flag unless it
    /// compiles (before any cluster is reached).
    fn response_format(&self) -> anyhow::Result<Option<ResponseFormat>> {
        let (flag, format) = if let Some(regex) = &self.guided_regex {
            let regex = regex.clone();
            ("--guided-regex", ResponseFormat::Regex { regex })
        } else if !self.guided_choice.is_empty() {
            let choice = self.guided_choice.clone();
            ("--guided-choice", ResponseFormat::Choice { choice })
        } else if let Some(path) = &self.guided_grammar {
            let grammar = std::fs::read_to_string(path).map_err(|e| {
                crate::exit::BadInput(format!("--guided-grammar {}: {e}", path.display()))
            })?;
            ("--guided-grammar", ResponseFormat::Grammar { grammar })
        } else {
            match self.schema_format()? {
                Some(format) => ("--json-schema", format),
                None => return Ok(None),
            }
        };
        match resident_node_agent::backends::generate::response_format_problem(&format) {
            Some(problem) => Err(crate::exit::BadInput(format!("{flag} {problem}")).into()),
            None => Ok(Some(format)),
        }
    }

    /// `--json-schema FILE` as the response format.
    fn schema_format(&self) -> anyhow::Result<Option<ResponseFormat>> {
        let Some(path) = &self.json_schema else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| crate::exit::BadInput(format!("--json-schema {}: {e}", path.display())))?;
        let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            crate::exit::BadInput(format!("--json-schema {} is not JSON: {e}", path.display()))
        })?;
        crate::exit::require(
            schema.is_object() || schema.is_boolean(),
            format!(
                "--json-schema {} must hold a JSON schema object",
                path.display()
            ),
        )?;
        Ok(Some(ResponseFormat::schema(schema)))
    }

    /// Whether the job runs on a cluster in this process.
    pub fn is_local(&self) -> bool {
        self.corpus.is_local()
    }
}

pub async fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let mut config = args.job_config()?;
    if let Some(count) = args.dry_run {
        return crate::generate_preview::print_prompts(&config, count).await;
    }
    let cluster = args.corpus.cluster("generate", &mut config.corpus).await?;
    let report = run_job(&cluster, &config, &args).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Runs the job `config` (from `args`) on `cluster` with a progress bar, and says on
/// stderr what it did and what its figures are.
pub(crate) async fn run_job(
    cluster: &resident_sdk::Cluster,
    config: &GenerateJobConfig,
    args: &GenerateArgs,
) -> anyhow::Result<JobReport<GenerateFigures>> {
    let mut progress = progress_reporter("generate");
    let report = run_generate_job(cluster, config, &mut progress).await?;
    let figures = &report.figures;
    eprintln!(
        "generated for {} records ({} new) into {} in {:.1} s (actors ready after {:.1} s): {} \
         prompt and {} generated tokens ({:.1} tokens/s out), {} prompts cut to fit (their \
         lines say \"truncated\"), {} bad records, {} model loads; report: {}",
        report.items,
        report.computed_items,
        config.corpus.output,
        report.wall_seconds,
        report.ready_seconds,
        figures.tally.prompt_tokens,
        figures.tally.generated_tokens,
        figures.generated_tokens_per_second,
        figures.tally.truncated_prompts,
        report.bad_record_count,
        report.model_loads,
        config.corpus.output.join("report.json")
    );
    print_figures(figures, &args.filter);
    Ok(report)
}

/// The summary's lines on what the job scored and checked, when it did.
fn print_figures(figures: &GenerateFigures, named: &[FilterSpec]) {
    if let Some(perplexity) = figures.scored_perplexity {
        eprintln!(
            "scored {} texts, {} tokens: perplexity {perplexity:.3} over them all",
            figures.tally.evaluation.scored_texts, figures.tally.evaluation.scored_tokens
        );
    }
    if let (true, Some(greedy)) = (figures.scored_after_context, figures.greedy_share) {
        let stderr = plus_minus(figures.text_perplexity_stderr);
        let per_text = (figures.text_perplexity)
            .map(|perplexity| format!(", perplexity {perplexity:.3}{stderr} per text"))
            .unwrap_or_default();
        eprintln!(
            "after their context: {} of {} texts are what greedy decoding writes: \
             {greedy:.4}{}{per_text}",
            figures.tally.evaluation.greedy_texts,
            figures.tally.evaluation.scored_texts,
            plus_minus(figures.greedy_share_stderr),
        );
    }
    let per_word = (figures.word_perplexity).zip(figures.byte_perplexity);
    if let (Some((word, byte)), Some(bits)) = (per_word, figures.bits_per_byte) {
        let counts = &figures.tally.evaluation;
        eprintln!(
            "scored whole: {} texts, {} words, {} bytes: word perplexity {word:.3}, byte \
             perplexity {byte:.4}, {bits:.4} bits per byte",
            counts.whole_scored_texts, counts.whole_scored_words, counts.whole_scored_bytes
        );
    }
    if let (Some(accuracy), Some(normalized)) = (figures.accuracy, figures.accuracy_normalized) {
        eprintln!(
            "choices: {} records scored, {} with an answer: accuracy {accuracy:.4}{}, \
             {normalized:.4}{} per character",
            figures.tally.evaluation.choice_records,
            figures.tally.evaluation.answered_records,
            plus_minus(figures.accuracy_stderr),
            plus_minus(figures.accuracy_normalized_stderr),
        );
    }
    if let Some(probability) = figures.answer_probability {
        let several = match figures.tally.evaluation.several_answer_records {
            0 => String::new(),
            n => format!(" ({n} records with several right answers: TruthfulQA MC2's acc)"),
        };
        eprintln!(
            "right answers' probability among the choices: {probability:.4}{}{several}",
            plus_minus(figures.answer_probability_stderr),
        );
    }
    if let Some(brier) = figures.brier_score {
        eprintln!(
            "Brier score over {} records with one right answer: {brier:.4}{} (0 sure and \
             right, 2 sure and wrong; lower is better calibrated)",
            figures.tally.evaluation.probabilities.brier_records,
            plus_minus(figures.brier_score_stderr),
        );
    }
    print_answers(figures, named);
    if let Some(by_group) = &figures.accuracy_by_group {
        print_by_group(by_group);
    }
}

/// The summary's line on the accuracy by group: the means over groups, each with its error.
fn print_by_group(by_group: &AccuracyByGroup) {
    let per_character = (by_group.mean_accuracy_normalized)
        .map(|normalized| {
            let stderr = plus_minus(by_group.mean_accuracy_normalized_stderr);
            format!(", {normalized:.4}{stderr} per character")
        })
        .unwrap_or_default();
    let mean_of = |label: &str, mean: Option<f64>, stderr: Option<f64>| {
        mean.map(|mean| format!(", mean {label} {mean:.4}{}", plus_minus(stderr)))
            .unwrap_or_default()
    };
    let probability = mean_of(
        "answer probability",
        by_group.mean_answer_probability,
        by_group.mean_answer_probability_stderr,
    );
    let brier = mean_of(
        "Brier score",
        by_group.mean_brier_score,
        by_group.mean_brier_score_stderr,
    );
    eprintln!(
        "by {}: {} groups, mean accuracy {:.4}{}{per_character}{probability}{brier} \
         (report.json: accuracy_by_group)",
        by_group.field,
        by_group.groups.len(),
        by_group.mean_accuracy,
        plus_minus(by_group.mean_accuracy_stderr),
    );
}

/// The summary's lines on generated answers checked against references, when there were:
/// the one filter's, or each named filter's in the order given.
fn print_answers(figures: &GenerateFigures, named: &[FilterSpec]) {
    if named.is_empty() {
        let (counts, shares) = (&figures.tally.evaluation.answers, &figures.answers);
        print_filter_answers("answers", "--extract", counts, shares);
    }
    for filter in named {
        if let Some(figures) = figures.filters.get(&filter.name) {
            let label = format!("answers by filter {}", filter.name);
            print_filter_answers(&label, "the filter", &figures.counts, &figures.shares);
        }
    }
}

/// One filter's summary line; `filter` names it in the count of texts it found no answer
/// in.
fn print_filter_answers(label: &str, filter: &str, counts: &AnswerCounts, shares: &AnswerShares) {
    let Some(exact_match) = shares.exact_match else {
        if counts.unextracted_records > 0 {
            eprintln!(
                "{label}: {filter} found none in {} records",
                counts.unextracted_records
            );
        }
        return;
    };
    let samples = match (shares.exact_match_any, shares.exact_match_majority) {
        (Some(any), Some(majority)) => format!(
            ", any sample {any:.4}{}, most common answer {majority:.4}{}",
            plus_minus(shares.exact_match_any_stderr),
            plus_minus(shares.exact_match_majority_stderr),
        ),
        _ => String::new(),
    };
    let overlap: String = (OverlapMetric::ALL.iter())
        .filter_map(|metric| {
            let (mean, stderr) = counts.overlap_sums.mean(*metric)?;
            Some(format!(
                ", {} {mean:.4}{}",
                metric.name(),
                plus_minus(stderr)
            ))
        })
        .collect();
    eprintln!(
        "{label}: {} records with a reference: exact match {exact_match:.4}{}{samples}\
         {overlap}; {filter} found none in {}",
        counts.reference_records,
        plus_minus(shares.exact_match_stderr),
        counts.unextracted_records
    );
}

/// A figure's standard error as the summary writes it after the figure (` ± 0.0249`,
/// lm-evaluation-harness's table's), nothing without one.
fn plus_minus(stderr: Option<f64>) -> String {
    stderr
        .map(|stderr| format!(" ± {stderr:.4}"))
        .unwrap_or_default()
}
