//! `resident.local()`, `resident.connect()` and the cluster's calls: embed texts, run a
//! corpus job, generate, list nodes, pools and jobs, open a pool.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use resident_actor::generate::{Completion, GenerateParams, PromptParts, Template};
use resident_jobs::corpus_job::chat_input::{parse_messages, parse_params};
use resident_jobs::corpus_job::choice_input::parse_choices;
use resident_jobs::corpus_job::{
    self, AnswerFlags, AnswerMatchSpec, BadRecordPolicy, ChoiceFields, CorpusJobConfig,
    EmbedJobConfig, EmbedWork, EngineSettings, FewshotAsked, FewshotFlags, FewshotSampling,
    FewshotSource, GenerateJobConfig, GenerationFormat, GenerationOutput, JobError, KeptColumn,
    Normalization, OutputDtype, OverlapMetric, Progress, Prompt, PromptTemplate, RecordLimit,
    VectorFormat,
};
use resident_jobs::pools::PoolRetention;
use resident_models::generate::chat::ChatTemplate;
use resident_node_agent::backends::generate as generate_backend;
use resident_sdk::{
    ClientCredentials, Cluster, EmbedOptions, EmbedPool, EmbedPoolSpec, GeneratePool,
    GeneratePoolSpec, LocalConfig, Pool, PoolSpec, SdkError, WindowSplit, Windows,
};

use crate::embed_stream::NativeEmbedStream;
use crate::errors::{bad_input, job_error, sdk_error};
use crate::pool::NativePool;
use crate::wait::{wait, wait_ticking};

/// How long a pool the package made for `embed` or `generate` stays loaded once unused.
const CALL_POOL_IDLE_TTL: Duration = Duration::from_secs(600);
/// How long a pool may take to load its model.
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// A connection to a cluster, or a cluster in this process.
#[pyclass(module = "resident._resident", frozen)]
pub struct NativeCluster {
    cluster: Cluster,
    /// Pools made by `embed` and `generate`, by their settings.
    embed_pools: Mutex<HashMap<String, EmbedPool>>,
    generate_pools: Mutex<HashMap<String, GeneratePool>>,
}

impl NativeCluster {
    fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            embed_pools: Mutex::default(),
            generate_pools: Mutex::default(),
        }
    }

    /// The pool `embed` and `embed_stream` use for `settings`: made once (and waited for),
    /// then kept while used.
    fn embed_pool(&self, py: Python<'_>, settings: EmbedPoolSettings) -> PyResult<EmbedPool> {
        let EmbedPoolSettings {
            model,
            replicas,
            gpus,
            vram_gib,
            chunk_size,
            dtype,
            max_seq_length,
            max_batch_tokens,
        } = settings;
        if chunk_size == 0 {
            return Err(bad_input(py, "chunk_size must be at least 1"));
        }
        let key = format!(
            "{model}|{replicas:?}|{gpus:?}|{vram_gib}|{chunk_size}|{dtype:?}|{max_seq_length:?}|\
             {max_batch_tokens:?}"
        );
        if let Some(pool) = self.embed_pools.lock().expect("pools").get(&key).cloned() {
            return Ok(pool);
        }
        let cluster = self.cluster.clone();
        let name = call_pool_name("py-embed", &key);
        let made = wait(py, async move {
            let gpus = chosen_gpus(&cluster, gpus, replicas).await?;
            let replicas = match replicas {
                Some(replicas) => replicas,
                // One per core on the CPU: each embed actor runs on one thread.
                None => {
                    cluster
                        .default_replicas(&Default::default(), gpus, |cores| cores)
                        .await?
                }
            };
            let mut spec = EmbedPoolSpec::new(name, model)
                .replicas(replicas)
                .chunk_size(chunk_size)
                .idle_ttl(CALL_POOL_IDLE_TTL);
            if gpus > 0.0 {
                spec = spec.gpus(gpus, vram_gib);
            }
            if let Some(dtype) = &dtype {
                spec = spec.dtype(dtype);
            }
            if let Some(tokens) = max_seq_length {
                spec = spec.max_seq_length(tokens);
            }
            if let Some(tokens) = max_batch_tokens {
                spec = spec.max_batch_tokens(tokens);
            }
            cluster.create_embed_pool(spec, LOAD_TIMEOUT).await
        })?
        .map_err(|e| sdk_error(py, e))?;
        self.embed_pools
            .lock()
            .expect("pools")
            .insert(key, made.clone());
        Ok(made)
    }
}

/// What an embedding pool the package makes is made of.
struct EmbedPoolSettings {
    model: String,
    replicas: Option<u32>,
    /// `None`: the cluster's GPUs, one actor each, when it has any ([`chosen_gpus`]).
    gpus: Option<f64>,
    vram_gib: f64,
    chunk_size: usize,
    dtype: Option<String>,
    max_seq_length: Option<usize>,
    max_batch_tokens: Option<usize>,
}

/// Starts a scheduler and an agent in this process and waits for the agent.
#[pyfunction]
#[pyo3(signature = (simulate_gpus=None, state_dir=None))]
pub fn local(
    py: Python<'_>,
    simulate_gpus: Option<String>,
    state_dir: Option<PathBuf>,
) -> PyResult<NativeCluster> {
    // One thread per embedding actor (an actor per core), set on the actors rather than
    // through RAYON_NUM_THREADS: the Python process's environment stays as it was.
    let mut config = LocalConfig::default().embed_compute_threads(1);
    if let Some(spec) = simulate_gpus {
        config = config.simulate_gpus(spec);
    }
    config.state_dir = state_dir;
    let started = wait(py, async move {
        let cluster = Cluster::local(config).await?;
        cluster.wait_for_nodes(1, Duration::from_secs(60)).await?;
        Ok::<_, SdkError>(cluster)
    })?;
    Ok(NativeCluster::new(started.map_err(|e| sdk_error(py, e))?))
}

/// Connects to the scheduler at `url` with a token and a CA file.
#[pyfunction]
#[pyo3(signature = (url, token=None, ca=None))]
pub fn connect(
    py: Python<'_>,
    url: String,
    token: Option<String>,
    ca: Option<PathBuf>,
) -> PyResult<NativeCluster> {
    let mut credentials = ClientCredentials::default()
        .with_token(token)
        .allow_token_over_plaintext(resident_sdk::insecure_from_env());
    if let Some(ca) = ca {
        credentials = credentials
            .with_ca_file(&ca)
            .map_err(|e| bad_input(py, format!("ca {}: {e}", ca.display())))?;
    }
    let connected = wait(
        py,
        async move { Cluster::connect_with(&url, credentials).await },
    )?;
    Ok(NativeCluster::new(connected.map_err(|e| sdk_error(py, e))?))
}

/// A name for a pool the package makes, the same for the same settings in any process.
fn call_pool_name(prefix: &str, settings: &str) -> String {
    let digest = resident_jobs::files::sha256_hex(settings.as_bytes());
    format!("{prefix}-{}", &digest[..10])
}

/// `gpus` when given, else what `resident_sdk::choose_device` picks on the cluster: one GPU
/// per actor when its nodes have GPUs, CPU actors when they have none.
async fn chosen_gpus(
    cluster: &Cluster,
    gpus: Option<f64>,
    replicas: Option<u32>,
) -> Result<f64, SdkError> {
    if let Some(gpus) = gpus {
        return Ok(gpus);
    }
    let choice = cluster
        .choose_device(None, replicas, &Default::default(), "gpus=")
        .await?;
    Ok(choice.gpus_per_actor)
}

/// Latest progress of a running job, for the tick that draws the bar.
type SharedProgress = Arc<Mutex<Option<Progress>>>;

/// Calls `on_progress(done, total, tokens)` with the latest progress, if it moved.
fn report(
    py: Python<'_>,
    shared: &SharedProgress,
    on_progress: &Option<Py<PyAny>>,
) -> PyResult<()> {
    let latest = shared.lock().expect("progress").take();
    if let (Some(progress), Some(callback)) = (latest, on_progress) {
        callback.call1(
            py,
            (
                progress.position(),
                progress.total_docs,
                progress.generated_tokens,
            ),
        )?;
    }
    Ok(())
}

fn bad_record_policy(py: Python<'_>, name: &str) -> PyResult<BadRecordPolicy> {
    match name {
        "skip" => Ok(BadRecordPolicy::Skip),
        "fail" => Ok(BadRecordPolicy::Fail),
        other => Err(bad_input(
            py,
            format!("on_bad_record `{other}` is not skip or fail"),
        )),
    }
}

/// `limit=` (`--limit`, a count or a share, as text) and `limit_by=` (`--limit-by`).
type LimitArg = (String, Option<String>);

/// The corpus config of `[input, model, output]` with the options every corpus job takes,
/// as `resident embed` names them.
#[allow(clippy::too_many_arguments)]
fn corpus_config(
    py: Python<'_>,
    [input, model, output]: [String; 3],
    replicas: Option<u32>,
    gpus_per_actor: Option<f64>,
    vram_gib: f64,
    chunk_size: Option<usize>,
    on_bad_record: &str,
    [id_field, text_field]: [String; 2],
    keep_pool: bool,
    limit: Option<LimitArg>,
) -> PyResult<CorpusJobConfig> {
    let mut config = CorpusJobConfig::new(input.as_str(), model, output.as_str());
    config.replicas = replicas;
    config.gpus_per_actor = gpus_per_actor;
    config.vram_gib_per_actor = vram_gib;
    config.chunk_size = chunk_size;
    config.on_bad_record = bad_record_policy(py, on_bad_record)?;
    config.reader.id_field = id_field;
    config.reader.text_field = text_field;
    if let Some((limit, limit_by)) = limit {
        let limit = limit.parse::<RecordLimit>();
        config.set_limit(Some(
            limit.map_err(|e| bad_input(py, format!("limit: {e}")))?,
        ));
        config.reader.limit_by = limit_by;
    }
    config.retention = PoolRetention {
        keep: keep_pool,
        idle_ttl: None,
    };
    Ok(config)
}

/// The prompt of `prompt_name=` or `prompt=` (not both), as sentence-transformers takes
/// them; the model's default without either.
fn prompt_of(py: Python<'_>, name: Option<String>, text: Option<String>) -> PyResult<Prompt> {
    Prompt::from_name_or_text(name, text).map_err(|why| bad_input(py, why.to_string()))
}

/// The completions as JSON, a prompt's scored choices with the picks `generations.jsonl`
/// writes (`best`, `best_normalized` and, with an answer, `correct`, `correct_normalized`,
/// `answer_probability`, and with one answer `brier_score`):
/// Python reads them rather than working them out again.
fn completions_json(completions: &[Completion]) -> serde_json::Result<String> {
    let mut values = Vec::with_capacity(completions.len());
    for completion in completions {
        let mut value = serde_json::to_value(completion)?;
        if let Some(scored) = &completion.choice_scores {
            let picks = &mut value["choice_scores"];
            picks["best"] = scored.best().into();
            picks["best_normalized"] = scored.best_normalized().into();
            if let Some((plain, normalized)) = scored.correct() {
                picks["correct"] = plain.into();
                picks["correct_normalized"] = normalized.into();
            }
            if let Some(probability) = scored.answer_probability() {
                picks["answer_probability"] = probability.into();
            }
            if let Some(brier) = scored.brier_score() {
                picks["brier_score"] = brier.into();
            }
        }
        values.push(value);
    }
    serde_json::to_string(&values)
}

/// Calls `on_progress(done, total)` (prompts completed), when given.
/// The prompts of a `generate` or `chat` call: each a text, or an object with `prompt` or
/// `messages` and its own parameters by OpenAI's names (ids are set by the caller).
fn call_prompts(json: &str) -> Result<Vec<PromptParts>, String> {
    let items: Vec<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("prompts: {e}"))?;
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let at = |e: String| format!("prompt {index}: {e}");
            match item {
                serde_json::Value::String(text) => Ok(PromptParts::new("", "", &text, "")),
                serde_json::Value::Object(mut object) => {
                    let text = object.remove("prompt");
                    let messages = object.remove("messages");
                    let context = match object.remove("context") {
                        None => String::new(),
                        Some(serde_json::Value::String(context)) => context,
                        Some(_) => return Err(at("`context` must be a text".into())),
                    };
                    let mut prompt = match (text, messages) {
                        (Some(serde_json::Value::String(text)), None) => {
                            PromptParts::new("", &context, &text, "")
                        }
                        (None, Some(messages)) => {
                            PromptParts::chat("", parse_messages(&messages).map_err(at)?)
                        }
                        _ => {
                            return Err(at(
                                "give either `prompt` (a text) or `messages` (a list of \
                                 {\"role\", \"content\"})"
                                    .into(),
                            ));
                        }
                    };
                    if let Some(choices) =
                        parse_choices(&object, &ChoiceFields::default()).map_err(at)?
                    {
                        prompt.choices = choices.choices;
                        prompt.answers = choices.answers;
                    }
                    object.remove("choices");
                    object.remove("answer");
                    if !object.is_empty() {
                        prompt.params = Some(parse_params(&object).map_err(at)?);
                    }
                    Ok(prompt)
                }
                _ => Err(at(
                    "must be a text or a dict with `prompt` or `messages`".into()
                )),
            }
        })
        .collect()
}

fn generate_progress(
    py: Python<'_>,
    on_progress: &Option<Py<PyAny>>,
    done: usize,
    total: usize,
) -> PyResult<()> {
    match on_progress {
        Some(callback) => callback.call1(py, (done, total)).map(drop),
        None => Ok(()),
    }
}

/// The windows of `split=` (`"tokens:256:32"`, `"sentences"`) and `pool_windows=`
/// (`"none"`, `"mean"`; only with `split`), as `resident embed --split --pool-windows`.
fn windows_of(
    py: Python<'_>,
    split: Option<&str>,
    pool_windows: Option<&str>,
) -> PyResult<Option<Windows>> {
    let mean = match pool_windows {
        None | Some("none") => false,
        Some("mean") => true,
        Some(other) => {
            return Err(bad_input(
                py,
                format!("pool_windows `{other}` is not \"none\" or \"mean\""),
            ));
        }
    };
    match split {
        None if mean => Err(bad_input(
            py,
            "pool_windows needs split= (e.g. split=\"tokens:256:32\")",
        )),
        None => Ok(None),
        Some(split) => Ok(Some(Windows {
            split: WindowSplit::parse(split).map_err(|why| bad_input(py, why.to_string()))?,
            mean,
        })),
    }
}

/// `embed_job`'s vector options, as the Python layer passes them (one JSON object, so the
/// native signature does not grow with every option): `prompt_name`, `prompt`,
/// `precision`, `truncate_dim`, `normalize` (true, false or null), `max_seq_length`,
/// `max_batch_tokens`.
fn embed_work(py: Python<'_>, json: &str) -> PyResult<(EmbedWork, JobPlacement)> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Options {
        prompt_name: Option<String>,
        prompt: Option<String>,
        precision: Option<String>,
        truncate_dim: Option<usize>,
        normalize: Option<bool>,
        max_seq_length: Option<usize>,
        max_batch_tokens: Option<usize>,
        format: Option<String>,
        keep_columns: Option<Vec<String>>,
        split: Option<String>,
        pool_windows: Option<String>,
        selector: Option<std::collections::BTreeMap<String, String>>,
        s3_endpoint: Option<String>,
        price: Option<std::collections::BTreeMap<String, f64>>,
    }
    let options: Options = serde_json::from_str(json).map_err(|e| bad_input(py, e.to_string()))?;
    let dtype = match options.precision.as_deref() {
        Some(name) => OutputDtype::parse(name).map_err(|e| bad_input(py, e))?,
        None => OutputDtype::F32,
    };
    if options.truncate_dim == Some(0) {
        return Err(bad_input(
            py,
            "truncate_dim must be at least 1 (None keeps every dimension)",
        ));
    }
    let windows = windows_of(
        py,
        options.split.as_deref(),
        options.pool_windows.as_deref(),
    )?;
    let placement = JobPlacement {
        selector: options.selector.unwrap_or_default(),
        s3_endpoint: options.s3_endpoint,
        price: options.price.unwrap_or_default(),
    };
    let work = EmbedWork {
        windows,
        prompt: prompt_of(py, options.prompt_name, options.prompt)?,
        normalization: match options.normalize {
            None => Normalization::Model,
            Some(true) => Normalization::UnitLength,
            Some(false) => Normalization::Raw,
        },
        truncate_dim: options.truncate_dim,
        dtype,
        max_seq_length: options.max_seq_length,
        max_batch_tokens: options.max_batch_tokens,
        format: match options.format.as_deref() {
            None | Some("npy") => VectorFormat::Npy,
            Some("parquet") => VectorFormat::Parquet,
            Some(other) => {
                return Err(bad_input(
                    py,
                    format!("format `{other}` is not npy or parquet"),
                ));
            }
        },
        keep_columns: (options.keep_columns.unwrap_or_default().iter())
            .map(|column| KeptColumn::parse(column).map_err(|e| bad_input(py, e)))
            .collect::<PyResult<_>>()?,
    };
    Ok((work, placement))
}

/// Where a corpus job runs and what it costs: `selector` (node labels), `s3_endpoint`,
/// `price` (USD per GPU-hour by `pool` label), as `--selector`, `--s3-endpoint`, `--price`.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct JobPlacement {
    selector: std::collections::BTreeMap<String, String>,
    s3_endpoint: Option<String>,
    price: std::collections::BTreeMap<String, f64>,
}

/// Where a generate job runs: `placement_json` (a [`JobPlacement`] as JSON, absent when
/// none was given) and the pool it shares with the other jobs of `pool_key`, if any.
fn place_generate_job(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    placement_json: Option<&str>,
    pool_key: Option<String>,
) -> PyResult<()> {
    if let Some(json) = placement_json {
        let placement: JobPlacement =
            serde_json::from_str(json).map_err(|e| bad_input(py, e.to_string()))?;
        placement.apply(&mut config.corpus);
    }
    if let Some(key) = pool_key {
        config.share_pool(&key);
    }
    Ok(())
}

impl JobPlacement {
    fn apply(self, config: &mut CorpusJobConfig) {
        config.selector.extend(self.selector);
        if self.s3_endpoint.is_some() {
            config.s3.endpoint = self.s3_endpoint;
        }
        config.prices.per_pool_label.extend(self.price);
    }
}

/// Runs the corpus job `start` makes (given where to leave its progress), calling
/// `on_progress` as it moves; returns its report as JSON.
fn run_corpus_job<Fut, R>(
    py: Python<'_>,
    on_progress: Option<Py<PyAny>>,
    start: impl FnOnce(SharedProgress) -> Fut + Send,
) -> PyResult<String>
where
    Fut: std::future::Future<Output = Result<R, JobError>>,
    R: serde::Serialize + Send,
{
    let shared: SharedProgress = Arc::default();
    let sink = shared.clone();
    let finished = wait_ticking(
        py,
        move || start(sink),
        |py| report(py, &shared, &on_progress),
    )?;
    report(py, &shared, &on_progress)?;
    let job_report = finished.map_err(|e| job_error(py, e))?;
    serde_json::to_string(&job_report).map_err(|e| bad_input(py, e.to_string()))
}

#[pymethods]
impl NativeCluster {
    /// The scheduler's URL.
    fn url(&self) -> String {
        self.cluster.url().to_owned()
    }

    /// A stream of chunks to embed on a pool of `model` (made as for `embed`): send chunks
    /// of texts, receive their vectors in the order sent.
    #[pyo3(signature = (model, replicas=None, gpus=None, vram_gib=2.0, chunk_size=256, dtype=None,
        prompt_name=None, prompt=None, skip_model_normalize=false, split=None, max_seq_length=None,
        max_batch_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn embed_stream(
        &self,
        py: Python<'_>,
        model: String,
        replicas: Option<u32>,
        gpus: Option<f64>,
        vram_gib: f64,
        chunk_size: usize,
        dtype: Option<String>,
        prompt_name: Option<String>,
        prompt: Option<String>,
        skip_model_normalize: bool,
        split: Option<String>,
        max_seq_length: Option<usize>,
        max_batch_tokens: Option<usize>,
    ) -> PyResult<NativeEmbedStream> {
        let options = EmbedOptions {
            prompt: prompt_of(py, prompt_name, prompt)?,
            skip_model_normalize,
            // One vector per text: a long one's windows averaged.
            windows: windows_of(py, split.as_deref(), split.as_ref().map(|_| "mean"))?,
        };
        let pool = self.embed_pool(
            py,
            EmbedPoolSettings {
                model,
                replicas,
                gpus,
                vram_gib,
                chunk_size,
                dtype,
                max_seq_length,
                max_batch_tokens,
            },
        )?;
        NativeEmbedStream::start(py, pool, options)
    }

    /// Runs `resident embed` (input, model, output and its options); returns report.json.
    #[pyo3(signature = (input, model, output, replicas=None, gpus_per_actor=None, vram_gib=2.0,
        chunk_size=None, dtype="f32", on_bad_record="skip", id_field="id".to_owned(), text_field="text".to_owned(),
        keep_pool=false, merge=true, on_progress=None, embedding_json="{}".to_owned(), limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn embed_job(
        &self,
        py: Python<'_>,
        input: String,
        model: String,
        output: String,
        replicas: Option<u32>,
        gpus_per_actor: Option<f64>,
        vram_gib: f64,
        chunk_size: Option<usize>,
        dtype: &str,
        on_bad_record: &str,
        id_field: String,
        text_field: String,
        keep_pool: bool,
        merge: bool,
        on_progress: Option<Py<PyAny>>,
        embedding_json: String,
        limit: Option<LimitArg>,
    ) -> PyResult<String> {
        let (mut embedding, placement) = embed_work(py, &embedding_json)?;
        if embedding.dtype == OutputDtype::F32 {
            embedding.dtype = OutputDtype::parse(dtype).map_err(|e| bad_input(py, e))?;
        }
        let mut corpus = corpus_config(
            py,
            [input, model, output],
            replicas,
            gpus_per_actor,
            vram_gib,
            chunk_size,
            on_bad_record,
            [id_field, text_field],
            keep_pool,
            limit,
        )?;
        corpus.merge = merge;
        placement.apply(&mut corpus);
        let config = EmbedJobConfig { corpus, embedding };
        let cluster = self.cluster.clone();
        run_corpus_job(py, on_progress, move |sink| async move {
            let mut on_job_progress = |p: Progress| *sink.lock().expect("progress") = Some(p);
            corpus_job::run_embed_job(&cluster, &config, &mut on_job_progress).await
        })
    }

    /// Runs `resident sweep` on a declaration (`format`: `toml` text, or `json` of the
    /// same keys) with the CLI's run options as JSON (`output`, `keep_pool`, `price`);
    /// returns summary.json.
    #[pyo3(signature = (declaration, format, options_json, on_progress=None))]
    fn sweep(
        &self,
        py: Python<'_>,
        declaration: String,
        format: &str,
        options_json: String,
        on_progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        crate::sweep::run(
            py,
            self.cluster.clone(),
            &declaration,
            format,
            &options_json,
            on_progress,
        )
    }

    /// Runs `resident generate` over a corpus; returns report.json.
    #[pyo3(signature = (input, model, output, prompt, params_json, replicas=None,
        gpus_per_actor=None, vram_gib=2.0, chunk_size=None, on_bad_record="skip",
        id_field="id".to_owned(), text_field="text".to_owned(), keep_pool=false, on_progress=None,
        input_format="records", output_format="generations", choices_json="{}".to_owned(),
        fewshot_input=None, fewshot=5,
        fewshot_delimiter=resident_jobs::corpus_job::DEFAULT_FEWSHOT_DELIMITER.to_owned(),
        fewshot_group=None, accuracy_by=None, description=None, fewshot_seed=None, answer_check_json=None, target_delimiter=String::new(), limit=None,
        pool_key=None, placement_json=None, fewshot_sampler="per-record".to_owned(),
        engine_json=None, fewshot_as_multiturn=false, gen_prefix=None,
        fewshot_answer_field=None, keep_columns=None, format="jsonl"))]
    #[allow(clippy::too_many_arguments)]
    fn generate_job(
        &self,
        py: Python<'_>,
        input: String,
        model: String,
        output: String,
        prompt: String,
        params_json: String,
        replicas: Option<u32>,
        gpus_per_actor: Option<f64>,
        vram_gib: f64,
        chunk_size: Option<usize>,
        on_bad_record: &str,
        id_field: String,
        text_field: String,
        keep_pool: bool,
        on_progress: Option<Py<PyAny>>,
        input_format: &str,
        output_format: &str,
        choices_json: String,
        fewshot_input: Option<String>,
        fewshot: usize,
        fewshot_delimiter: String,
        fewshot_group: Option<String>,
        accuracy_by: Option<String>,
        description: Option<String>,
        fewshot_seed: Option<u64>,
        answer_check_json: Option<String>,
        target_delimiter: String,
        limit: Option<LimitArg>,
        pool_key: Option<String>,
        placement_json: Option<String>,
        fewshot_sampler: String,
        engine_json: Option<String>,
        fewshot_as_multiturn: bool,
        gen_prefix: Option<String>,
        fewshot_answer_field: Option<String>,
        keep_columns: Option<Vec<String>>,
        format: &str,
    ) -> PyResult<String> {
        let corpus = corpus_config(
            py,
            [input, model, output],
            replicas,
            gpus_per_actor,
            vram_gib,
            chunk_size,
            on_bad_record,
            [id_field, text_field],
            keep_pool,
            limit,
        )?;
        let prompt = PromptTemplate::parse(&prompt).map_err(|e| bad_input(py, e))?;
        let mut config = GenerateJobConfig::new(corpus, prompt);
        set_decoding(py, &mut config, &params_json, engine_json.as_deref())?;
        config.put_answer_start(target_delimiter, gen_prefix.unwrap_or_default());
        check_answers(py, &mut config, answer_check_json.as_deref(), output_format)?;
        read_choices(py, &mut config, &choices_json, accuracy_by)?;
        let fewshot = (
            fewshot_input,
            fewshot,
            fewshot_delimiter,
            fewshot_group,
            fewshot_seed,
            fewshot_sampler,
            fewshot_as_multiturn,
            fewshot_answer_field,
        );
        put_prompt_start(py, &mut config, description, fewshot)?;
        set_formats(py, &mut config, input_format, output_format)?;
        set_lines(py, &mut config, keep_columns.unwrap_or_default(), format)?;
        place_generate_job(py, &mut config, placement_json.as_deref(), pool_key)?;
        let cluster = self.cluster.clone();
        run_corpus_job(py, on_progress, move |sink| async move {
            let mut on_job_progress = |p: Progress| *sink.lock().expect("progress") = Some(p);
            corpus_job::run_generate_job(&cluster, &config, &mut on_job_progress).await
        })
    }

    /// Completes `prompts_json` on a pool of `model`: a JSON list whose items are a text
    /// (the user turn, or the raw text with `template="none"`), or an object with `prompt`
    /// (a text) or `messages` (a conversation) and any parameters of its own by OpenAI's
    /// names. `params_json` is `GenerateParams` as JSON, `engine_json` the actors'
    /// [`EngineSettings`] as JSON. Returns the completions as JSON, in input order.
    #[pyo3(signature = (prompts_json, model, params_json, replicas=None, gpus=None, vram_gib=2.0,
        engine_json=None, on_progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompts_json: String,
        model: String,
        params_json: String,
        replicas: Option<u32>,
        gpus: Option<f64>,
        vram_gib: f64,
        engine_json: Option<String>,
        on_progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        let params = checked_params(py, &params_json)?;
        let engine = engine_settings(py, engine_json.as_deref().unwrap_or("{}"))?;
        let prompts = call_prompts(&prompts_json).map_err(|e| bad_input(py, e))?;
        let config = engine.actor_config(model);
        // The actors' whole config (the model in it) and their placement.
        let actors = serde_json::to_string(&config).unwrap_or_default();
        let key = format!("{actors}|{replicas:?}|{gpus:?}|{vram_gib}");
        let cached = self
            .generate_pools
            .lock()
            .expect("pools")
            .get(&key)
            .cloned();
        let pool = match cached {
            Some(pool) => pool,
            None => {
                let mut spec = GeneratePoolSpec::new(call_pool_name("py-generate", &key), config)
                    .gpus(gpus, vram_gib)
                    .idle_ttl(CALL_POOL_IDLE_TTL);
                if let Some(replicas) = replicas {
                    spec = spec.replicas(replicas);
                }
                let cluster = self.cluster.clone();
                let made = wait(py, async move {
                    cluster.create_generate_pool(spec, LOAD_TIMEOUT).await
                })?
                .map_err(|e| sdk_error(py, e))?;
                self.generate_pools
                    .lock()
                    .expect("pools")
                    .insert(key, made.clone());
                made
            }
        };
        // The progress callback runs between waits with the GIL held; `done` counts the
        // prompts answered so far.
        let total = prompts.len();
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = done.clone();
        let completions = wait_ticking(
            py,
            move || async move {
                pool.generate(&prompts, &params, |answered| {
                    counted.store(answered, Ordering::Relaxed)
                })
                .await
            },
            |py| generate_progress(py, &on_progress, done.load(Ordering::Relaxed), total),
        )?
        .map_err(|e| match e {
            SdkError::TaskFailed(why) => {
                crate::errors::task_failed(py, format!("generation failed: {why}"))
            }
            other => sdk_error(py, other),
        })?;
        generate_progress(py, &on_progress, total, total)?;
        completions_json(&completions).map_err(|e| bad_input(py, e.to_string()))
    }

    /// Deletes the pools `embed` and `generate` made, unless a job still uses one; returns
    /// how many it deleted.
    fn close(&self, py: Python<'_>) -> PyResult<usize> {
        let mut pools: Vec<Pool> = self
            .embed_pools
            .lock()
            .expect("pools")
            .drain()
            .map(|(_, pool)| pool.pool)
            .collect();
        pools.extend(
            self.generate_pools
                .lock()
                .expect("pools")
                .drain()
                .map(|(_, pool)| pool.pool),
        );
        let deleted = wait(py, async move {
            let mut deleted = 0;
            for pool in pools {
                if let Ok(None) = pool.delete_if_unused().await {
                    deleted += 1;
                }
            }
            deleted
        })?;
        Ok(deleted)
    }

    /// `resident status --json`: the nodes and actors, as JSON.
    fn status(&self, py: Python<'_>) -> PyResult<String> {
        let cluster = self.cluster.clone();
        let listed = wait(py, async move {
            let nodes = cluster.list_nodes().await?;
            let actors = cluster.list_actors().await?;
            Ok::<_, SdkError>(resident_sdk::json::status_json(&nodes, &actors))
        })?;
        Ok(listed.map_err(|e| sdk_error(py, e))?.to_string())
    }

    /// `resident pools --json`'s list, as JSON.
    fn pools(&self, py: Python<'_>) -> PyResult<String> {
        let cluster = self.cluster.clone();
        let pools =
            wait(py, async move { cluster.list_pools().await })?.map_err(|e| sdk_error(py, e))?;
        let list: Vec<_> = pools.iter().map(resident_sdk::json::pool_json).collect();
        Ok(serde_json::Value::from(list).to_string())
    }

    /// `resident jobs --json`'s list, as JSON.
    fn jobs(&self, py: Python<'_>) -> PyResult<String> {
        let cluster = self.cluster.clone();
        let jobs =
            wait(py, async move { cluster.list_jobs().await })?.map_err(|e| sdk_error(py, e))?;
        let list: Vec<_> = jobs.iter().map(resident_sdk::json::job_json).collect();
        Ok(serde_json::Value::from(list).to_string())
    }

    /// Creates the pool `name` of `kind` (or resizes one of that name and spec) and waits
    /// until its actors are ready; without `kind`, attaches to an existing pool.
    #[pyo3(signature = (name, kind=None, replicas=1, gpus=0.0, vram_gib=0.0, selector=None, config_json=None))]
    #[allow(clippy::too_many_arguments)]
    fn pool(
        &self,
        py: Python<'_>,
        name: String,
        kind: Option<String>,
        replicas: u32,
        gpus: f64,
        vram_gib: f64,
        selector: Option<HashMap<String, String>>,
        config_json: Option<String>,
    ) -> PyResult<NativePool> {
        let Some(kind) = kind else {
            let pool = self.cluster.pool(name);
            let attached = pool.clone();
            wait(py, async move { attached.status().await })?.map_err(|e| sdk_error(py, e))?;
            return Ok(NativePool::new(pool));
        };
        let mut spec = PoolSpec::new(name, kind).replicas(replicas);
        if gpus > 0.0 {
            spec = spec.gpus(gpus).vram_gib(vram_gib);
        }
        for (key, value) in selector.unwrap_or_default() {
            spec = spec.selector(key, value);
        }
        if let Some(config) = config_json {
            let value: serde_json::Value =
                serde_json::from_str(&config).map_err(|e| bad_input(py, format!("config: {e}")))?;
            spec = spec.config_json(&value);
        }
        let cluster = self.cluster.clone();
        let pool = wait(py, async move {
            cluster.create_or_resize_pool(spec, LOAD_TIMEOUT).await
        })?
        .map_err(|e| sdk_error(py, e))?;
        Ok(NativePool::new(pool))
    }
}

/// How `generate_job` reads its records (`"records"` or `"openai-batch"`) and writes its
/// answers (`"generations"` or `"openai-batch"`).
fn set_formats(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    input_format: &str,
    output_format: &str,
) -> PyResult<()> {
    match input_format {
        "records" => {}
        "openai-batch" => config.read_openai_batch(),
        other => {
            return Err(bad_input(
                py,
                format!("input_format {other:?} is not 'records' or 'openai-batch'"),
            ));
        }
    }
    config.generation.output = match output_format {
        "generations" => GenerationOutput::Lines,
        "openai-batch" => GenerationOutput::OpenAiBatch,
        other => {
            return Err(bad_input(
                py,
                format!("output_format {other:?} is not 'generations' or 'openai-batch'"),
            ));
        }
    };
    Ok(())
}

/// What each line of the job's output holds and how it is stored: `keep_columns`
/// (`["title", "text=article"]`, as `--keep-columns` reads them) after its id, `format`
/// `"jsonl"` or `"parquet"`; then the whole job is checked, before anything runs.
fn set_lines(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    keep_columns: Vec<String>,
    format: &str,
) -> PyResult<()> {
    let columns = keep_columns.iter().map(|column| KeptColumn::parse(column));
    let columns = columns
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_input(py, e))?;
    config.keep_columns(columns).map_err(|e| job_error(py, e))?;
    config.generation.format = match format {
        "jsonl" => GenerationFormat::Jsonl,
        "parquet" => GenerationFormat::Parquet,
        other => {
            let why = format!("format {other:?} is not 'jsonl' or 'parquet'");
            return Err(bad_input(py, why));
        }
    };
    config.check().map_err(|e| job_error(py, e))
}

/// `generate_job`'s few-shot arguments: the examples' file, how many, the delimiter, the
/// group field, the seed of each record's draw, how it draws, and whether the examples
/// are chat turns.
type FewshotArgs = (
    Option<String>,
    usize,
    String,
    Option<String>,
    Option<u64>,
    String,
    bool,
    Option<String>,
);

/// Puts `description` and the few-shot examples `fewshot` names before the job's prompt,
/// as `--description` and `--fewshot-input` do.
fn put_prompt_start(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    description: Option<String>,
    (input, count, delimiter, group_field, seed, sampler, as_turns, answer_field): FewshotArgs,
) -> PyResult<()> {
    if as_turns && config.generation.params.template != Template::Chat {
        return Err(bad_input(
            py,
            "fewshot_as_multiturn writes the few-shot examples as chat turns: it needs the \
             chat template (template=\"chat\")",
        ));
    }
    let sampling: FewshotSampling = (sampler.parse())
        .map_err(|why: String| bad_input(py, format!("fewshot_sampler: {why}")))?;
    let asked = FewshotAsked {
        input: input.is_some(),
        picked: group_field.is_some()
            || seed.is_some()
            || sampling != FewshotSampling::PerRecord
            || answer_field.is_some(),
        answered: config.generation.params.score
            || answer_field.is_some()
            || (config.generation.answer_match.as_ref())
                .is_some_and(|check| check.spec().reference_field.is_some()),
    };
    if let Some(refusal) = asked.refusal() {
        return Err(bad_input(py, refusal.message(&FewshotFlags::PYTHON)));
    }
    let source = input.map(|path| FewshotSource {
        path: path.into(),
        count,
        delimiter,
        group_field,
        seed,
        sampling,
        as_turns,
        answer_field,
        ..FewshotSource::default()
    });
    if description.is_none() && source.is_none() {
        return Ok(());
    }
    config
        .put_prompt_start(description.as_deref(), source.as_ref())
        .map_err(|e| bad_input(py, e.to_string()))
}

/// A generate job's decoding parameters (`GenerateParams` as JSON, checked) and engine
/// settings ([`EngineSettings`] as JSON, checked: [`engine_settings`]), as Python passes
/// them.
fn set_decoding(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    params_json: &str,
    engine_json: Option<&str>,
) -> PyResult<()> {
    config.generation.params = checked_params(py, params_json)?;
    if let Some(engine) = engine_json {
        config.generation.engine = engine_settings(py, engine)?;
    }
    Ok(())
}

/// Decoding parameters (`GenerateParams` as JSON), or why the actors would refuse them,
/// before a pool is asked for: a parameter out of its range, a `response_format` that does
/// not compile (as `resident generate --json-schema` and `--guided-*` are checked).
fn checked_params(py: Python<'_>, params_json: &str) -> PyResult<GenerateParams> {
    let params: GenerateParams = serde_json::from_str(params_json)
        .map_err(|e| bad_input(py, format!("generation parameters: {e}")))?;
    if let Some(problem) = params.problem() {
        return Err(bad_input(py, problem.to_string()));
    }
    let format = params.response_format.as_ref();
    if let Some(problem) = format.and_then(generate_backend::response_format_problem) {
        return Err(bad_input(py, format!("`response_format` {problem}")));
    }
    Ok(params)
}

/// The actors' engine settings ([`EngineSettings`] as JSON), or why the actors would refuse
/// them, before a pool is asked for: a limit of 0, a chat template that does not compile
/// (as `resident generate --chat-template` is checked).
fn engine_settings(py: Python<'_>, engine_json: &str) -> PyResult<EngineSettings> {
    let engine: EngineSettings = serde_json::from_str(engine_json)
        .map_err(|e| bad_input(py, format!("engine settings: {e}")))?;
    if let Some(problem) = engine.problem() {
        return Err(bad_input(py, problem));
    }
    if let Some(source) = &engine.chat_template {
        ChatTemplate::check(source)
            .map_err(|why| bad_input(py, format!("chat_template does not compile: {why}")))?;
    }
    Ok(engine)
}

/// Reads a scoring job's choices as `choices_json` (a [`ChoiceFields`] as JSON, the
/// defaults where it leaves one out) names them, and reports accuracy by `accuracy_by`.
fn read_choices(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    choices_json: &str,
    accuracy_by: Option<String>,
) -> PyResult<()> {
    let fields: ChoiceFields = serde_json::from_str(choices_json)
        .map_err(|e| bad_input(py, format!("the choices' fields: {e}")))?;
    if !fields.labels.is_empty() && !config.generation.params.score {
        return Err(bad_input(
            py,
            "choice_labels scores labels in place of each record's choices: it needs score=True",
        ));
    }
    if config.generation.params.score {
        config.corpus.reader.choices = Some(fields);
    }
    if let Some(field) = accuracy_by {
        if !config.generation.params.score && config.generation.answer_match.is_none() {
            return Err(bad_input(
                py,
                "accuracy_by breaks down the accuracy of scored choices or of answers checked \
                 against reference_field: it needs score=True or reference_field",
            ));
        }
        config.report_accuracy_by(&field);
    }
    Ok(())
}

/// How generated answers are checked (`reference_field`, `extract`, `filters` and the
/// comparison's arguments, as JSON from the wrapper), refused by the CLI's rules.
fn check_answers(
    py: Python<'_>,
    config: &mut GenerateJobConfig,
    json: Option<&str>,
    output_format: &str,
) -> PyResult<()> {
    let Some(json) = json else {
        return Ok(());
    };
    let refuse = |e: String| bad_input(py, format!("answer checks: {e}"));
    let mut spec: serde_json::Value =
        serde_json::from_str(json).map_err(|e| refuse(e.to_string()))?;
    // `metrics` as the CLI's --metric reads them (`rouge` for the four ROUGE figures).
    if let Some(names) = spec.get_mut("metrics") {
        let asked: Vec<String> = serde_json::from_value(names.take())
            .map_err(|_| bad_input(py, "metrics is a list of names: give [\"rouge\"] for one"))?;
        let metrics = OverlapMetric::from_names(&asked).map_err(|e| bad_input(py, e))?;
        *names = serde_json::json!(metrics);
    }
    let spec: AnswerMatchSpec = serde_json::from_value(spec).map_err(|e| refuse(e.to_string()))?;
    let openai_batch = output_format != "generations";
    if let Some(refusal) = spec.refusal(config.generation.params.score, openai_batch) {
        return Err(bad_input(py, refusal.message(&AnswerFlags::PYTHON)));
    }
    if !spec.asked() {
        return Ok(());
    }
    config
        .check_answers(spec)
        .map_err(|e| bad_input(py, e.to_string()))
}
