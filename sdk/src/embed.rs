//! Embedding pools: create a pool of `embed` actors from a model spec and turn texts into
//! vectors, as a whole list or as a stream of chunks.

use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::Message;
use prost::bytes::Bytes;
use resident_proto::{ActorId, NodeId, pb};

use crate::client::Cluster;
use crate::error::SdkError;
use crate::job_stream::TaskOutput;
use crate::pool::Pool;
use crate::pool_spec::PoolSpec;

/// A pool of `embed` actors for one model.
#[derive(Clone, Debug)]
pub struct EmbedPoolSpec {
    pool: PoolSpec,
    config: serde_json::Map<String, serde_json::Value>,
    chunk_size: usize,
}

impl EmbedPoolSpec {
    /// `model` is a model directory, an `s3://bucket/prefix/` holding a
    /// `resident-model.json` (`resident model push`), or a Hugging Face id, which agents
    /// find in their hub cache or download into their model cache.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> Self {
        let mut config = serde_json::Map::new();
        config.insert("model".into(), model.into().into());
        Self {
            pool: PoolSpec::new(name, "embed"),
            config,
            chunk_size: 256,
        }
    }

    /// Actors in the pool.
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.pool = self.pool.replicas(replicas);
        self
    }

    /// GPUs per actor (0 = CPU), and the VRAM each needs.
    pub fn gpus(mut self, gpus: f64, vram_gib: f64) -> Self {
        self.pool = self.pool.gpus(gpus).vram_gib(vram_gib);
        self
    }

    /// Only nodes with the label `key=value` (repeatable).
    pub fn selector(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.pool = self.pool.selector(key, value);
        self
    }

    /// See [`PoolSpec::idle_ttl`].
    pub fn idle_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.pool = self.pool.idle_ttl(ttl);
        self
    }

    /// See [`PoolSpec::task_timeout`].
    pub fn task_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.pool = self.pool.task_timeout(timeout);
        self
    }

    /// Pins the model: a Hugging Face commit, or the manifest digest of an `s3://` model.
    /// Agents refuse to load anything else.
    pub fn model_revision(mut self, revision: &str) -> Self {
        self.config
            .insert("model_revision".into(), revision.to_owned().into());
        self
    }

    /// `f32`, `f16` or `bf16`.
    pub fn dtype(mut self, dtype: &str) -> Self {
        self.config.insert("dtype".into(), dtype.into());
        self
    }

    /// The most tokens (padding included) in one model batch; halved on out-of-memory.
    pub fn max_batch_tokens(mut self, tokens: usize) -> Self {
        self.config.insert("max_batch_tokens".into(), tokens.into());
        self
    }

    /// Cuts texts (and their prompt) to this many tokens; only shorter than the model's own
    /// `max_seq_length`, which stays the limit when this is longer.
    pub fn max_seq_length(mut self, tokens: usize) -> Self {
        self.config.insert("max_seq_length".into(), tokens.into());
        self
    }

    /// The most texts in one model batch.
    pub fn max_batch_size(mut self, size: usize) -> Self {
        self.config.insert("max_batch_size".into(), size.into());
        self
    }

    /// The instruction prefixed to queries (`embed_queries`), for models trained with one.
    pub fn query_instruction(mut self, instruction: impl Into<String>) -> Self {
        self.config
            .insert("query_instruction".into(), instruction.into().into());
        self
    }

    /// Texts per task when `embed` splits a list (default 256).
    pub fn chunk_size(mut self, texts: usize) -> Self {
        self.chunk_size = texts.max(1);
        self
    }

    /// The untyped pool spec of the `embed` kind this describes.
    pub fn into_pool_spec(self) -> PoolSpec {
        self.pool
            .config_json(&serde_json::Value::Object(self.config))
    }
}

/// How an actor embedded one chunk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmbedStats {
    /// Texts in the chunk.
    pub count: u32,
    /// The vectors' width.
    pub dim: u32,
    /// Real tokens, and tokens the model ran including padding.
    pub tokens: u64,
    /// Tokens the model ran, padding included.
    pub padded_tokens: u64,
    /// Rows cut to the model's max_seq_length.
    pub truncated_rows: Vec<u32>,
    /// Microseconds spent tokenising.
    pub tokenize_micros: u64,
    /// Microseconds spent in the model.
    pub model_micros: u64,
    /// Microseconds for the whole chunk.
    pub total_micros: u64,
    /// Model batches the chunk took.
    pub batches: u32,
    /// `Cpu` or `Cuda(0)`, and `f32`/`f16`/`bf16`.
    pub device: String,
    /// The model's dtype: `f32`, `f16` or `bf16`.
    pub dtype: String,
    /// The token budget per batch at the end of the chunk (halved on out-of-memory).
    pub max_batch_tokens: u64,
    /// SHA-256 of the weights and configs of the model that embedded the chunk: chunks
    /// with different fingerprints came from different models.
    pub model_fingerprint: String,
    /// The prompt the actor put before every text (`""` for none).
    pub prompt: String,
    /// Texts in the chunk (`count` rows answer them: more with windows).
    pub texts: u32,
    /// Windows the texts were cut into (0 without windows).
    pub windows: u32,
    /// Texts cut into more than one window.
    pub texts_split: u32,
    /// With a row per window: each row's text (its index in the chunk) and characters
    /// `[start, end)` in it (Unicode code points). Empty otherwise.
    pub row_windows: Vec<RowWindow>,
}

/// Where one row of a windowed chunk comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowWindow {
    /// The text's index in the chunk.
    pub text: u32,
    /// The window's index among the text's windows.
    pub window: u32,
    /// Its first character in the text (Unicode code points).
    pub char_start: u32,
    /// One past its last character.
    pub char_end: u32,
}

impl From<pb::EmbedResponse> for EmbedStats {
    fn from(response: pb::EmbedResponse) -> Self {
        Self {
            count: response.count,
            dim: response.dim,
            tokens: response.tokens,
            padded_tokens: response.padded_tokens,
            truncated_rows: response.truncated_rows,
            tokenize_micros: response.tokenize_micros,
            model_micros: response.model_micros,
            total_micros: response.total_micros,
            batches: response.batches,
            device: response.device,
            dtype: response.dtype,
            max_batch_tokens: response.max_batch_tokens,
            model_fingerprint: response.model_fingerprint,
            prompt: response.prompt,
            texts: match response.texts {
                0 => response.count,
                texts => texts,
            },
            windows: response.windows,
            texts_split: response.texts_split,
            row_windows: row_windows(
                &response.row_texts,
                &response.row_char_starts,
                &response.row_char_ends,
            ),
        }
    }
}

/// Rows' windows from a response's parallel lists, numbering each text's windows.
fn row_windows(texts: &[u32], starts: &[u32], ends: &[u32]) -> Vec<RowWindow> {
    let mut previous: Option<u32> = None;
    let mut window = 0;
    texts
        .iter()
        .zip(starts.iter().zip(ends))
        .map(|(&text, (&char_start, &char_end))| {
            window = match previous == Some(text) {
                true => window + 1,
                false => 0,
            };
            previous = Some(text);
            RowWindow {
                text,
                window,
                char_start,
                char_end,
            }
        })
        .collect()
}

/// One embedded chunk.
#[derive(Clone, Debug)]
pub struct EmbeddedChunk {
    /// The chunk's position in the submitted stream.
    pub seq: u64,
    /// The vectors' width.
    pub dim: usize,
    /// `count x dim` row-major.
    pub values: Vec<f32>,
    /// How the actor embedded it.
    pub stats: EmbedStats,
    /// The actor that embedded it.
    pub actor_id: ActorId,
    /// The node of that actor.
    pub node_id: NodeId,
}

impl EmbeddedChunk {
    /// Each text's vector, in the chunk's order.
    pub fn rows(&self) -> impl Iterator<Item = &[f32]> {
        self.values.chunks(self.dim.max(1))
    }

    /// Decodes an `embed` task's output.
    pub fn from_output(output: TaskOutput) -> Result<Self, SdkError> {
        let bytes = output.output.map_err(SdkError::TaskFailed)?;
        let mut stats = pb::EmbedResponse::decode(bytes).map_err(|e| {
            SdkError::TaskFailed(format!("embed output is not an EmbedResponse: {e}"))
        })?;
        let raw = std::mem::take(&mut stats.vectors);
        if raw.len() != stats.count as usize * stats.dim as usize * 4 {
            return Err(SdkError::TaskFailed(
                "embed output has the wrong size".into(),
            ));
        }
        let windowed = stats.row_texts.len();
        if windowed > 0
            && (windowed != stats.count as usize
                || stats.row_char_starts.len() != windowed
                || stats.row_char_ends.len() != windowed)
        {
            return Err(SdkError::TaskFailed(
                "embed output's windows do not match its rows".into(),
            ));
        }
        let values = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Self {
            seq: output.seq,
            dim: stats.dim as usize,
            values,
            stats: stats.into(),
            actor_id: output.actor_id,
            node_id: output.node_id,
        })
    }
}

/// Refuses vectors from more than one model: every chunk must carry the same model content
/// fingerprint (chunks from agents without one are not checked).
pub fn one_model(chunks: &[EmbeddedChunk]) -> Result<(), SdkError> {
    let mut fingerprints = chunks
        .iter()
        .filter(|c| !c.stats.model_fingerprint.is_empty());
    let Some(first) = fingerprints.next() else {
        return Ok(());
    };
    match fingerprints.find(|c| c.stats.model_fingerprint != first.stats.model_fingerprint) {
        None => Ok(()),
        Some(other) => Err(SdkError::MixedModels(format!(
            "actor {} on node {} and actor {} on node {} loaded different models under one \
             name (content fingerprints {} and {}); give every agent the same copy (a local \
             directory, or one pinned revision)",
            first.actor_id,
            first.node_id,
            other.actor_id,
            other.node_id,
            &first.stats.model_fingerprint[..first.stats.model_fingerprint.len().min(12)],
            &other.stats.model_fingerprint[..other.stats.model_fingerprint.len().min(12)],
        ))),
    }
}

/// Which prompt an `embed` actor puts before each text, as sentence-transformers'
/// `encode(prompt_name=..., prompt=...)` does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Prompt {
    /// The model's default prompt (`default_prompt_name` in its
    /// `config_sentence_transformers.json`), or none when it names none.
    #[default]
    ModelDefault,
    /// The pool's query instruction ([`EmbedPoolSpec::query_instruction`], Qwen3-Embedding
    /// style), or else the model's default prompt.
    QueryInstruction,
    /// A prompt the model names (`"query"`, `"passage"`); a name it lacks fails the task,
    /// naming those it has.
    Named(String),
    /// This text, as given (`""` for none, even where the model has a default).
    Text(String),
}

/// A prompt choice or `--split` refused; the text says what to give instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmbedOptionError {
    /// Both a prompt name and a prompt's text.
    #[error("give a prompt name (one the model names) or a prompt's text, not both")]
    PromptNameAndText,
    /// A window size or overlap that is not a whole number.
    #[error("--split {split}: the {what} `{value}` is not a whole number of tokens")]
    SplitNumber {
        /// The `--split` given.
        split: String,
        /// `window size` or `overlap`.
        what: &'static str,
        /// The number as given.
        value: String,
    },
    /// A `--split` of neither form.
    #[error(
        "--split {0}: use tokens:SIZE:OVERLAP (e.g. tokens:256:32; tokens alone for windows as \
         long as the model takes) or sentences[:SIZE]"
    )]
    SplitForm(String),
    /// Windows that would overlap by as much as they hold.
    #[error("--split {split}: the overlap ({overlap}) must be smaller than the window ({size})")]
    SplitOverlap {
        /// The `--split` given.
        split: String,
        /// Tokens asked to overlap.
        overlap: u32,
        /// Tokens per window.
        size: u32,
    },
}

impl Prompt {
    /// The prompt of sentence-transformers' `prompt_name=` or `prompt=` (at most one of
    /// them); the model's default without either.
    pub fn from_name_or_text(
        name: Option<String>,
        text: Option<String>,
    ) -> Result<Self, EmbedOptionError> {
        match (name, text) {
            (Some(_), Some(_)) => Err(EmbedOptionError::PromptNameAndText),
            (Some(name), None) => Ok(Prompt::Named(name)),
            (None, Some(text)) => Ok(Prompt::Text(text)),
            (None, None) => Ok(Prompt::ModelDefault),
        }
    }
    /// The query instruction for queries (`is_query`), else the model's default.
    pub fn for_query(is_query: bool) -> Self {
        match is_query {
            true => Prompt::QueryInstruction,
            false => Prompt::ModelDefault,
        }
    }

    /// Says what it is in a few words, for reports and fingerprints: `model default`,
    /// `query instruction`, `name:query`, `text:"query: "`.
    pub fn describe(&self) -> String {
        match self {
            Prompt::ModelDefault => "model default".to_owned(),
            Prompt::QueryInstruction => "query instruction".to_owned(),
            Prompt::Named(name) => format!("name:{name}"),
            Prompt::Text(text) => format!("text:{text:?}"),
        }
    }
}

/// How an `embed` task treats its texts, besides the pool's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EmbedOptions {
    /// The prompt before each text.
    pub prompt: Prompt,
    /// Vectors as pooled, without the model's Normalize module (where it has one).
    pub skip_model_normalize: bool,
    /// Cut each text into windows (`None`: each text whole, cut at the model's length).
    pub windows: Option<Windows>,
}

/// Where long texts are cut (`resident embed --split`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowSplit {
    /// Windows of `size` of the model's tokens (0: as many as fit), consecutive ones
    /// sharing at least `overlap`, their edges on word boundaries.
    Tokens {
        /// Tokens per window.
        size: u32,
        /// Tokens consecutive windows share.
        overlap: u32,
    },
    /// Whole sentences packed into windows of at most `size` tokens (0: as many as fit).
    Sentences {
        /// Tokens per window.
        size: u32,
    },
}

impl WindowSplit {
    /// Reads `tokens:SIZE[:OVERLAP]`, `tokens` (windows as long as the model takes),
    /// `sentences[:SIZE]`.
    pub fn parse(text: &str) -> Result<Self, EmbedOptionError> {
        let mut parts = text.split(':');
        let kind = parts.next().unwrap_or_default();
        let numbers: Vec<&str> = parts.collect();
        let number = |i: usize, what: &'static str| -> Result<u32, EmbedOptionError> {
            numbers.get(i).map_or(Ok(0), |n| {
                n.trim()
                    .parse::<u32>()
                    .map_err(|_| EmbedOptionError::SplitNumber {
                        split: text.to_owned(),
                        what,
                        value: (*n).to_owned(),
                    })
            })
        };
        let split = match (kind, numbers.len()) {
            ("tokens", 0..=2) => WindowSplit::Tokens {
                size: number(0, "window size")?,
                overlap: number(1, "overlap")?,
            },
            ("sentences", 0..=1) => WindowSplit::Sentences {
                size: number(0, "window size")?,
            },
            _ => return Err(EmbedOptionError::SplitForm(text.to_owned())),
        };
        if let WindowSplit::Tokens { size, overlap } = split
            && size > 0
            && overlap >= size
        {
            return Err(EmbedOptionError::SplitOverlap {
                split: text.to_owned(),
                overlap,
                size,
            });
        }
        Ok(split)
    }

    /// The form [`WindowSplit::parse`] reads.
    pub fn describe(&self) -> String {
        match *self {
            WindowSplit::Tokens { size, overlap } => format!("tokens:{size}:{overlap}"),
            WindowSplit::Sentences { size } => format!("sentences:{size}"),
        }
    }
}

/// Long texts cut into windows: a row per window, or a vector per text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Windows {
    /// Where texts are cut.
    pub split: WindowSplit,
    /// One vector per text, the mean of its windows' (scaled to unit length when the model
    /// normalises), instead of a row per window (`--pool-windows mean`).
    pub mean: bool,
}

impl Windows {
    /// In a few words, for reports and fingerprints: `tokens:256:32`,
    /// `sentences:0 pooled by mean`.
    pub fn describe(&self) -> String {
        match self.mean {
            true => format!("{} pooled by mean", self.split.describe()),
            false => self.split.describe(),
        }
    }
}

/// Encodes one task payload for the `embed` kind; `is_query` asks for the pool's query
/// instruction ([`Prompt::QueryInstruction`]).
pub fn embed_request(texts: Vec<String>, is_query: bool) -> Bytes {
    embed_request_with(
        texts,
        &EmbedOptions {
            prompt: Prompt::for_query(is_query),
            ..EmbedOptions::default()
        },
    )
}

/// Encodes one task payload for the `embed` kind, with a prompt and pooling options.
pub fn embed_request_with(texts: Vec<String>, options: &EmbedOptions) -> Bytes {
    let mut request = pb::EmbedRequest {
        texts,
        skip_model_normalize: options.skip_model_normalize,
        windows: options.windows.map(|windows| {
            let (split, size, overlap) = match windows.split {
                WindowSplit::Tokens { size, overlap } => ("tokens", size, overlap),
                WindowSplit::Sentences { size } => ("sentences", size, 0),
            };
            pb::EmbedWindows {
                split: split.to_owned(),
                size,
                overlap,
                pool: if windows.mean { "mean" } else { "none" }.to_owned(),
            }
        }),
        ..Default::default()
    };
    match &options.prompt {
        Prompt::ModelDefault => {}
        Prompt::QueryInstruction => request.is_query = true,
        Prompt::Named(name) => request.prompt_name = name.clone(),
        Prompt::Text(text) => request.prompt = Some(text.clone()),
    }
    request.encode_to_vec().into()
}

/// The options an `embed` payload asks for (to split a chunk into one payload per text).
pub fn embed_request_options(request: &pb::EmbedRequest) -> EmbedOptions {
    let prompt = match (
        &request.prompt,
        request.prompt_name.as_str(),
        request.is_query,
    ) {
        (Some(text), _, _) => Prompt::Text(text.clone()),
        (None, name, _) if !name.is_empty() => Prompt::Named(name.to_owned()),
        (None, _, true) => Prompt::QueryInstruction,
        (None, _, false) => Prompt::ModelDefault,
    };
    let windows = request.windows.as_ref().map(|windows| Windows {
        split: match windows.split.as_str() {
            "sentences" => WindowSplit::Sentences { size: windows.size },
            _ => WindowSplit::Tokens {
                size: windows.size,
                overlap: windows.overlap,
            },
        },
        mean: windows.pool == "mean",
    });
    EmbedOptions {
        prompt,
        skip_model_normalize: request.skip_model_normalize,
        windows,
    }
}

/// A ready pool of `embed` actors.
#[derive(Clone)]
pub struct EmbedPool {
    /// The pool underneath.
    pub pool: Pool,
    chunk_size: usize,
}

impl Cluster {
    /// Creates an embedding pool (or resizes the pool of that name) and waits until every
    /// actor has loaded the model.
    pub async fn create_embed_pool(
        &self,
        spec: EmbedPoolSpec,
        load_timeout: Duration,
    ) -> Result<EmbedPool, SdkError> {
        let chunk_size = spec.chunk_size;
        let pool = self
            .create_or_resize_pool(spec.into_pool_spec(), load_timeout)
            .await?;
        Ok(EmbedPool { pool, chunk_size })
    }

    /// Creates a pool (or, when one of that name has the same spec but its replica count,
    /// resizes it) and waits until every actor has loaded.
    pub async fn create_or_resize_pool(
        &self,
        pool_spec: PoolSpec,
        load_timeout: Duration,
    ) -> Result<Pool, SdkError> {
        let name = pool_spec.name().to_owned();
        let replicas = pool_spec.replicas_wanted();
        let pool = match self.create_pool(pool_spec.clone()).await {
            Ok(pool) => pool,
            // Same name, other replica count: resize the resident pool instead of failing.
            Err(SdkError::AlreadyExists(message)) => {
                let pool = self.pool(name);
                let existing = pool.status().await?.spec;
                if !pool_spec.same_but_replicas(&existing) {
                    return Err(SdkError::AlreadyExists(message));
                }
                pool.scale(replicas).await?;
                // The same spec now, so this only sets the idle TTL asked for.
                self.create_pool(pool_spec.clone()).await?
            }
            Err(other) => return Err(other),
        };
        pool.wait_ready(load_timeout).await?;
        Ok(pool)
    }
}

impl EmbedPool {
    /// Embeds `texts`, returning one vector per text in input order.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, SdkError> {
        self.embed_as(texts, false).await
    }

    /// Embeds queries (the model's query instruction, if any, is prefixed).
    pub async fn embed_queries(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, SdkError> {
        self.embed_as(texts, true).await
    }

    async fn embed_as(
        &self,
        texts: Vec<String>,
        is_query: bool,
    ) -> Result<Vec<Vec<f32>>, SdkError> {
        let options = EmbedOptions {
            prompt: Prompt::for_query(is_query),
            ..EmbedOptions::default()
        };
        self.embed_with(texts, &options).await
    }

    /// Embeds `texts` with a prompt and pooling options (`Prompt::Named("query".into())` for
    /// queries to a model that names a query prompt), one vector per text in input order;
    /// with [`Windows`] not pooled by mean, one per window instead (each chunk's
    /// [`EmbedStats::row_windows`], from [`EmbedPool::embed_chunks_with`], says whose).
    pub async fn embed_with(
        &self,
        texts: Vec<String>,
        options: &EmbedOptions,
    ) -> Result<Vec<Vec<f32>>, SdkError> {
        let chunks: Vec<Vec<String>> = texts
            .chunks(self.chunk_size)
            .map(<[String]>::to_vec)
            .collect();
        let mut results = self
            .embed_chunks_with(futures::stream::iter(chunks), options.clone())
            .await?;
        let mut embedded = Vec::new();
        while let Some(chunk) = results.next().await {
            embedded.push(chunk?);
        }
        embedded.sort_by_key(|c| c.seq);
        one_model(&embedded)?;
        Ok(embedded
            .iter()
            .flat_map(|c| c.rows().map(<[f32]>::to_vec))
            .collect())
    }

    /// Streams chunks of texts through the pool; chunks come back as they finish (`seq` is
    /// the chunk's position in the input).
    pub async fn embed_chunks<S>(
        &self,
        chunks: S,
        is_query: bool,
    ) -> Result<impl Stream<Item = Result<EmbeddedChunk, SdkError>> + use<S>, SdkError>
    where
        S: Stream<Item = Vec<String>> + Send + 'static,
    {
        let options = EmbedOptions {
            prompt: Prompt::for_query(is_query),
            ..EmbedOptions::default()
        };
        self.embed_chunks_with(chunks, options).await
    }

    /// [`EmbedPool::embed_chunks`] with a prompt and pooling options.
    pub async fn embed_chunks_with<S>(
        &self,
        chunks: S,
        options: EmbedOptions,
    ) -> Result<impl Stream<Item = Result<EmbeddedChunk, SdkError>> + use<S>, SdkError>
    where
        S: Stream<Item = Vec<String>> + Send + 'static,
    {
        let payloads = chunks.map(move |texts| embed_request_with(texts, &options));
        let job = self.pool.submit("embed", payloads).await?;
        Ok(job.map(|output| EmbeddedChunk::from_output(output?)))
    }
}

#[cfg(test)]
mod one_model_tests {
    use super::*;

    fn chunk(seq: u64, actor: &str, fingerprint: &str) -> EmbeddedChunk {
        EmbeddedChunk {
            seq,
            dim: 1,
            values: vec![1.0],
            stats: EmbedStats {
                model_fingerprint: fingerprint.into(),
                ..Default::default()
            },
            actor_id: ActorId::new(actor.to_owned()),
            node_id: NodeId::new(format!("node-{actor}")),
        }
    }

    #[test]
    fn chunks_of_two_models_are_refused() {
        assert!(one_model(&[]).is_ok());
        assert!(one_model(&[chunk(0, "a", "f1"), chunk(1, "b", "f1"), chunk(2, "c", "")]).is_ok());
        let error = one_model(&[chunk(0, "a", "f1"), chunk(1, "b", "f2")])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("actor a on node node-a") && error.contains("actor b on node node-b"),
            "{error}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_read_their_sizes_and_refuse_what_cannot_be() {
        assert_eq!(
            WindowSplit::parse("tokens:512:64"),
            Ok(WindowSplit::Tokens {
                size: 512,
                overlap: 64
            })
        );
        assert_eq!(
            WindowSplit::parse("tokens"),
            Ok(WindowSplit::Tokens {
                size: 0,
                overlap: 0
            })
        );
        assert_eq!(
            WindowSplit::parse("sentences:200"),
            Ok(WindowSplit::Sentences { size: 200 })
        );
        for bad in ["words:10", "tokens:64:64", "tokens:x", "sentences:1:2", ""] {
            let error = WindowSplit::parse(bad).unwrap_err().to_string();
            assert!(error.starts_with(&format!("--split {bad}:")), "{error}");
        }
    }

    #[test]
    fn windows_travel_in_the_request_and_number_per_text() {
        let options = EmbedOptions {
            windows: Some(Windows {
                split: WindowSplit::Tokens {
                    size: 100,
                    overlap: 10,
                },
                mean: true,
            }),
            ..EmbedOptions::default()
        };
        let payload = embed_request_with(vec!["a".into()], &options);
        let request = pb::EmbedRequest::decode(payload).unwrap();
        assert_eq!(embed_request_options(&request), options);
        let rows = row_windows(&[0, 0, 2], &[0, 5, 0], &[6, 9, 3]);
        let numbered: Vec<(u32, u32)> = rows.iter().map(|r| (r.text, r.window)).collect();
        assert_eq!(numbered, vec![(0, 0), (0, 1), (2, 0)]);
    }
}
