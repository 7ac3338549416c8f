//! A text embedding model that loads once and turns chunks of texts into the vectors
//! sentence-transformers would give. The node agent's `embed` actor kind wraps [`Embedder`].
//!
//! Config (the pool's `actor_config`):
//! `{"model": "models/all-MiniLM-L6-v2", "dtype": "f32", "max_batch_tokens": 8192,
//!   "max_batch_size": 64, "query_instruction": "Given a web search query, ..."}`.
//! Payload: an `EmbedRequest` protobuf; output: an `EmbedResponse`. Sweep trials are their
//! own message (`TrialRequest`, see [`crate::trials`]) on the same actor and device.

pub mod batching;
mod bert;
mod cpu_bert;
pub(crate) mod cpu_ops;
mod encoder;
mod fingerprint;
pub(crate) mod flash_attention;
pub(crate) mod fused;
#[cfg(feature = "cuda")]
pub(crate) mod fused_cuda;
mod load;
pub mod model_files;
pub mod qwen3;
mod relative_position;
pub mod windows;

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use prost::Message;
use resident_proto::pb;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams};

use crate::ModelError;
use crate::roots::{FileRoots, MAX_TOKENIZER_BYTES};
use crate::trials::TrialRunner;
use encoder::{EncoderSpec, PaddingSide, TextEncoder, pool};
pub use flash_attention::allow_flash_attention;
use load::load_encoder;
use model_files::{Architecture, ModelLayout, Pooling, read_layout, resolve_model_dir};
use windows::{CharBytes, CharRange, TextTokens, WindowSplit};

/// Qwen3's end-of-text token, which last-token pooling needs at the end of every text.
const QWEN3_EOS: u32 = 151_643;

/// The `embed` kind's pool config (JSON): the model, and how it runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedConfig {
    /// A model directory, or a HuggingFace id already in the local hub cache (the node
    /// agent turns `s3://` prefixes and hub ids it downloads into a directory first).
    pub model: String,
    /// Pins `model`: a hub commit, or an S3 model's manifest digest. The job sets it so
    /// every agent loads the same bytes.
    #[serde(default)]
    pub model_revision: Option<String>,
    /// `f32`, `f16` or `bf16`; default f16 on GPU, f32 on CPU.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Padded tokens per model batch (batch size x longest text); default 1024 on CPU (small
    /// batches stay in cache), 16384 on GPU.
    #[serde(default)]
    pub max_batch_tokens: Option<usize>,
    /// Texts per model batch; default 16 on CPU, 256 on GPU.
    #[serde(default)]
    pub max_batch_size: Option<usize>,
    /// Prefixed to texts of requests marked `is_query` (Qwen3-Embedding style).
    #[serde(default)]
    pub query_instruction: Option<String>,
    /// Overrides the model's own max_seq_length (only to make it shorter).
    #[serde(default)]
    pub max_seq_length: Option<usize>,
    /// Threads that tokenise a chunk; default 1 on CPU (the cores run the model), up to 8 on
    /// GPU (one thread cannot keep a GPU busy on long documents).
    #[serde(default)]
    pub tokenize_threads: Option<usize>,
}

/// One chunk, tokenised.
pub struct TokenizedChunk {
    ids: Vec<Vec<u32>>,
    truncated_rows: Vec<u32>,
    tokenize_micros: u64,
    /// The prompt put before every text ("" for none).
    prompt: String,
    /// Leading tokens of every row left out of mean pooling: the prompt's, where the model
    /// pools without it (`include_prompt` false); 0 otherwise.
    pool_skip: usize,
    /// Pool without the model's Normalize module.
    skip_model_normalize: bool,
    /// Where each row (`ids`) came from, when the texts were cut into windows.
    windows: Option<ChunkWindows>,
}

/// The windows of a chunk's texts: a row each.
struct ChunkWindows {
    /// Each row's text (its index in the request).
    row_texts: Vec<u32>,
    /// Each row's characters `[start, end)` in its text.
    ranges: Vec<CharRange>,
    /// Texts in the request.
    texts: usize,
    /// One vector per text, the mean of its windows' (`--pool-windows mean`).
    mean: bool,
}

/// What a request's windows ask, checked against the model.
#[derive(Clone, Copy, Debug)]
struct WindowPlan {
    split: WindowSplit,
    mean: bool,
}

impl TokenizedChunk {
    /// Texts in the chunk (rows are windows when the texts were cut).
    pub fn rows(&self) -> usize {
        self.windows.as_ref().map_or(self.ids.len(), |w| w.texts)
    }

    /// Tokens over all its documents (after truncation).
    pub fn tokens(&self) -> usize {
        self.ids.iter().map(Vec::len).sum()
    }
}

/// Decodes and tokenises a payload. Cheap to share: the actor host runs it on a helper
/// thread, ahead of the model working on the previous chunk.
pub struct TextPreparer {
    tokenizer: Tokenizer,
    /// The same tokeniser without truncation: to find windows in long texts.
    untruncated: Tokenizer,
    /// Special tokens the model puts around every text (`[CLS]`/`[SEP]`, Qwen3's end).
    special_tokens: usize,
    architecture: Architecture,
    max_seq_length: usize,
    query_instruction: Option<String>,
    prompts: ModelPrompts,
    /// Tokenises a chunk's texts in parallel; `None` tokenises on the calling thread.
    threads: Option<rayon::ThreadPool>,
}

impl TextPreparer {
    fn new(
        tokenizer: Tokenizer,
        architecture: Architecture,
        max_seq_length: usize,
        query_instruction: Option<String>,
        prompts: ModelPrompts,
        threads: usize,
    ) -> Result<Self, ModelError> {
        let threads = match threads {
            0 | 1 => None,
            n => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("tokenize-{i}"))
                    .build()
                    .map_err(|e| ModelError::Load(format!("tokeniser threads: {e}")))?,
            ),
        };
        let mut untruncated = tokenizer.clone();
        untruncated
            .with_truncation(None)
            .map_err(|e| ModelError::Load(format!("tokenizer truncation: {e}")))?;
        let empty = tokenizer
            .encode("", true)
            .map_err(|e| ModelError::Load(format!("tokenizer: {e}")))?;
        let appended_end =
            architecture == Architecture::Qwen3 && empty.get_ids().last() != Some(&QWEN3_EOS);
        let special_tokens = empty.len() + usize::from(appended_end);
        Ok(Self {
            tokenizer,
            untruncated,
            special_tokens,
            architecture,
            max_seq_length,
            query_instruction,
            prompts,
            threads,
        })
    }

    /// Decodes an `EmbedRequest` and tokenises its texts.
    pub fn prepare(&self, payload: &[u8]) -> Result<TokenizedChunk, ModelError> {
        let started = Instant::now();
        let request = pb::EmbedRequest::decode(payload)
            .map_err(|e| ModelError::BadPayload(format!("not an EmbedRequest: {e}")))?;
        self.tokenize(request, started)
    }

    /// The prompt `request` asks for: its own text, a name the model gives, the model's
    /// query instruction (`is_query`), or the model's default prompt (sentence-transformers'
    /// order).
    fn prompt_of(&self, request: &pb::EmbedRequest) -> Result<String, ModelError> {
        if let Some(prompt) = &request.prompt {
            return Ok(prompt.clone());
        }
        if !request.prompt_name.is_empty() {
            return self.prompts.named(&request.prompt_name);
        }
        if let (Some(instruction), true) = (&self.query_instruction, request.is_query) {
            return Ok(format!("Instruct: {instruction}\nQuery:"));
        }
        Ok(self.prompts.default_prompt().to_owned())
    }

    /// Tokens of `prompt` that mean pooling leaves out (sentence-transformers: the prompt
    /// tokenised alone, less a special token it ends with), when the model pools without
    /// its prompt; 0 otherwise.
    fn pool_skip(&self, prompt: &str) -> Result<usize, ModelError> {
        if prompt.is_empty() || self.prompts.include_prompt {
            return Ok(0);
        }
        let encoding = self
            .tokenizer
            .encode(prompt, true)
            .map_err(|e| ModelError::BadPayload(format!("cannot tokenise the prompt: {e}")))?;
        let ends_special = encoding.get_special_tokens_mask().last() == Some(&1);
        Ok(encoding.len() - usize::from(ends_special))
    }

    /// One text's ids, and whether it was cut to max_seq_length.
    fn tokenize_one(
        &self,
        row: usize,
        text: &str,
        prompt: &str,
    ) -> Result<(Vec<u32>, bool), ModelError> {
        let prompted;
        let text = match prompt.is_empty() {
            true => text,
            false => {
                prompted = format!("{prompt}{text}");
                prompted.as_str()
            }
        };
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| ModelError::BadPayload(format!("cannot tokenise text {row}: {e}")))?;
        let mut tokens = encoding.get_ids().to_vec();
        let mut truncated = !encoding.get_overflowing().is_empty();
        if self.architecture == Architecture::Qwen3 && tokens.last() != Some(&QWEN3_EOS) {
            if tokens.len() >= self.max_seq_length {
                tokens.truncate(self.max_seq_length - 1);
                truncated = true;
            }
            tokens.push(QWEN3_EOS);
        }
        Ok((tokens, truncated))
    }

    /// The windows `windows` asks for, checked against the model: a window must fit its
    /// max_seq_length with the special tokens and the prompt.
    fn window_plan(
        &self,
        windows: &pb::EmbedWindows,
        prompt: &str,
    ) -> Result<WindowPlan, ModelError> {
        let prompt_tokens = match prompt.is_empty() {
            true => 0,
            false => self
                .untruncated
                .encode(prompt, false)
                .map_err(|e| ModelError::BadPayload(format!("cannot tokenise the prompt: {e}")))?
                .len(),
        };
        let room = self
            .max_seq_length
            .saturating_sub(self.special_tokens + prompt_tokens);
        let size = match windows.size {
            0 => room,
            size => size as usize,
        };
        if size == 0 || size > room {
            return Err(ModelError::BadPayload(format!(
                "windows of {size} tokens do not fit the model: its max_seq_length of {} less \
                 {} special tokens and the prompt's {prompt_tokens} leaves {room}; use windows \
                 of {room} tokens or fewer (--split tokens:{room}:OVERLAP, or a shorter prompt)",
                self.max_seq_length, self.special_tokens
            )));
        }
        let overlap = windows.overlap as usize;
        let split = match windows.split.as_str() {
            "tokens" if overlap >= size => {
                return Err(ModelError::BadPayload(format!(
                    "an overlap of {overlap} tokens needs windows longer than that (they are \
                     {size}): use a smaller overlap"
                )));
            }
            "tokens" => WindowSplit::Tokens { size, overlap },
            "sentences" if overlap > 0 => {
                return Err(ModelError::BadPayload(
                    "sentence windows take no overlap: use --split sentences:SIZE".into(),
                ));
            }
            "sentences" => WindowSplit::Sentences { size },
            other => {
                return Err(ModelError::BadPayload(format!(
                    "window split `{other}` is not `tokens` or `sentences`"
                )));
            }
        };
        let mean = match windows.pool.as_str() {
            "" | "none" => false,
            "mean" => true,
            other => {
                return Err(ModelError::BadPayload(format!(
                    "window pooling `{other}` is not `none` or `mean`"
                )));
            }
        };
        Ok(WindowPlan { split, mean })
    }

    /// A text's tokens, without special tokens or truncation, with their characters.
    fn text_tokens(&self, row: usize, text: &str) -> Result<TextTokens, ModelError> {
        let encoding = self
            .untruncated
            .encode_char_offsets(text, false)
            .map_err(|e| ModelError::BadPayload(format!("cannot tokenise text {row}: {e}")))?;
        Ok(TextTokens {
            offsets: encoding.get_offsets().to_vec(),
            words: encoding.get_word_ids().to_vec(),
        })
    }

    /// One text cut into windows, each tokenised as a text of its own: its ids, whether it
    /// was cut to max_seq_length, and its characters in the text.
    fn tokenize_windows(
        &self,
        row: usize,
        text: &str,
        prompt: &str,
        split: WindowSplit,
    ) -> Result<Vec<(Vec<u32>, bool, CharRange)>, ModelError> {
        let chars = CharBytes::new(text);
        let ranges = match split {
            WindowSplit::Tokens { size, overlap } => windows::windows_of_tokens(
                &self.text_tokens(row, text)?,
                chars.chars(),
                size,
                overlap,
            ),
            WindowSplit::Sentences { size } => {
                windows::windows_of_sentences(text, size, |sentence| {
                    self.text_tokens(row, sentence)
                })?
            }
        };
        ranges
            .into_iter()
            .map(|range| {
                let (ids, truncated) = self.tokenize_one(row, chars.slice(text, range), prompt)?;
                Ok((ids, truncated, range))
            })
            .collect()
    }

    fn tokenize(
        &self,
        request: pb::EmbedRequest,
        started: Instant,
    ) -> Result<TokenizedChunk, ModelError> {
        let prompt = self.prompt_of(&request)?;
        let pool_skip = self.pool_skip(&prompt)?;
        let plan = match &request.windows {
            Some(windows) => Some(self.window_plan(windows, &prompt)?),
            None => None,
        };
        let one = |(row, text): (usize, &String)| match plan {
            None => self
                .tokenize_one(row, text, &prompt)
                .map(|(ids, truncated)| vec![(ids, truncated, (0, 0))]),
            Some(plan) => self.tokenize_windows(row, text, &prompt, plan.split),
        };
        let texts: Result<Vec<_>, ModelError> = match &self.threads {
            None => request.texts.iter().enumerate().map(one).collect(),
            Some(pool) => pool.install(|| {
                use rayon::prelude::*;
                request.texts.par_iter().enumerate().map(one).collect()
            }),
        };
        let texts = texts?;
        let mut ids = Vec::with_capacity(texts.len());
        let mut truncated_rows = Vec::new();
        let mut row_texts = Vec::new();
        let mut ranges = Vec::new();
        for (text, rows) in texts.into_iter().enumerate() {
            // Pooled windows report their text as cut if any of its windows was.
            let mut text_cut = false;
            for (tokens, truncated, range) in rows {
                if truncated && !plan.is_some_and(|p| p.mean) {
                    truncated_rows.push(ids.len() as u32);
                }
                text_cut |= truncated;
                if plan.is_some() {
                    row_texts.push(text as u32);
                    ranges.push(range);
                }
                ids.push(tokens);
            }
            if text_cut && plan.is_some_and(|p| p.mean) {
                truncated_rows.push(text as u32);
            }
        }
        let windows = plan.map(|plan| ChunkWindows {
            row_texts,
            ranges,
            texts: request.texts.len(),
            mean: plan.mean,
        });
        Ok(TokenizedChunk {
            ids,
            truncated_rows,
            tokenize_micros: started.elapsed().as_micros() as u64,
            prompt,
            pool_skip,
            skip_model_normalize: request.skip_model_normalize,
            windows,
        })
    }
}

/// A loaded embedding model: tokenizer, encoder and pooling, answering chunks of texts with
/// one vector each.
pub struct Embedder {
    preparer: Arc<TextPreparer>,
    encoder: Box<dyn TextEncoder>,
    layout: ModelLayout,
    device: Device,
    dtype: DType,
    max_batch_tokens: usize,
    max_batch_size: usize,
    vram_bytes: u64,
    trials: TrialRunner,
    /// Where this actor may read (sweep datasets for its trials).
    roots: FileRoots,
    /// SHA-256 of the model's weights and configs (`fingerprint.rs`), in every response.
    content_fingerprint: String,
}

fn parse_dtype(name: Option<&str>, device: &Device) -> Result<DType, ModelError> {
    let dtype = match name {
        None if device.is_cuda() => DType::F16,
        None | Some("f32") => DType::F32,
        Some("f16") => DType::F16,
        Some("bf16") => DType::BF16,
        Some(other) => {
            return Err(ModelError::InvalidConfig(format!(
                "dtype `{other}` is not one of f32, f16, bf16"
            )));
        }
    };
    crate::device::check_dtype(device, dtype)?;
    Ok(dtype)
}

/// The model's `tokenizer.json`, truncating at `max_seq_length` tokens, unpadded.
fn load_tokenizer(
    dir: &std::path::Path,
    roots: &FileRoots,
    max_seq_length: usize,
) -> Result<Tokenizer, ModelError> {
    let tokenizer_json = roots.read_model_file(&dir.join("tokenizer.json"), MAX_TOKENIZER_BYTES)?;
    let mut tokenizer = Tokenizer::from_bytes(&tokenizer_json)
        .map_err(|e| ModelError::Load(format!("tokenizer.json: {e}")))?;
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_seq_length,
            ..Default::default()
        }))
        .map_err(|e| ModelError::Load(format!("tokenizer truncation: {e}")))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// The weight files' total size (those that cannot be read count nothing).
fn weight_bytes(weights: &[std::path::PathBuf]) -> u64 {
    weights
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

impl Embedder {
    /// Loads the model `config` names, reading only under `roots` (whose data roots also
    /// bound the sweep datasets this actor's trials read).
    pub fn load(
        config: &EmbedConfig,
        device: Device,
        roots: FileRoots,
    ) -> Result<Self, ModelError> {
        let dir = resolve_model_dir(&config.model)?;
        let layout = read_layout(&dir, &roots)?;
        let dir = layout.dir.clone();
        let dtype = parse_dtype(config.dtype.as_deref(), &device)?;
        let gpu = device.is_cuda();
        let max_batch_tokens = config
            .max_batch_tokens
            .unwrap_or(if gpu { 16_384 } else { 1024 });
        let max_batch_size = config.max_batch_size.unwrap_or(if gpu { 256 } else { 16 });
        if max_batch_tokens < 16 || max_batch_size == 0 {
            return Err(ModelError::InvalidConfig(
                "max_batch_tokens must be >= 16 and max_batch_size >= 1".into(),
            ));
        }
        let max_seq_length = config
            .max_seq_length
            .map_or(layout.max_seq_length, |m| m.min(layout.max_seq_length));
        let tokenizer = load_tokenizer(&dir, &roots, max_seq_length)?;
        let encoder = load_encoder(&layout, &device, dtype)?;
        let hashing = std::time::Instant::now();
        let content_fingerprint =
            fingerprint::model_content_fingerprint(&dir, &layout.weights, &roots)?;
        tracing::debug!(seconds = hashing.elapsed().as_secs_f64(), %content_fingerprint, "model fingerprint");
        let vram_bytes = match gpu {
            true => estimate_vram(
                weight_bytes(&layout.weights),
                dtype,
                max_batch_tokens,
                encoder.spec().hidden_size,
            ),
            false => 0,
        };
        let tokenize_threads = config.tokenize_threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            default_tokenize_threads(gpu, cores, gpus_on_host(gpu))
        });
        let preparer = TextPreparer::new(
            tokenizer,
            layout.architecture,
            max_seq_length,
            config.query_instruction.clone(),
            ModelPrompts::of(&layout),
            tokenize_threads,
        )?;
        let mut embedder = Self {
            preparer: Arc::new(preparer),
            encoder,
            layout,
            device,
            dtype,
            max_batch_tokens,
            max_batch_size,
            vram_bytes,
            trials: TrialRunner::default(),
            roots,
            content_fingerprint,
        };
        embedder.warm_up()?;
        Ok(embedder)
    }

    /// SHA-256 of the loaded model's weights and configs.
    pub fn content_fingerprint(&self) -> &str {
        &self.content_fingerprint
    }

    /// One padded batch of two short texts through the whole forward and pooling: a GPU
    /// compiles its kernels (PTX JIT) and initialises cuBLAS here instead of in the first
    /// task, and a model whose forward fails is a load error, not a task error.
    fn warm_up(&mut self) -> Result<(), ModelError> {
        let long: Vec<u32> = (1..=8).collect();
        let short: Vec<u32> = (1..=3).collect();
        self.run_batch(&[&long, &short])
            .map(drop)
            .map_err(|e| ModelError::Load(format!("a test forward failed: {e}")))
    }

    /// Runs one planned batch, returning `[batch, hidden]` f32 rows in the batch's order.
    fn run_batch(&mut self, ids: &[&[u32]]) -> candle_core::Result<Vec<Vec<f32>>> {
        self.run_batch_pooled(ids, BatchPooling::of_model(&self.layout))
    }

    /// [`Embedder::run_batch`], pooled as `how` says.
    fn run_batch_pooled(
        &mut self,
        ids: &[&[u32]],
        how: BatchPooling,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let (pooling, normalize) = (self.layout.pooling, how.normalize);
        let skip = match pooling {
            Pooling::Mean => how.skip,
            Pooling::Cls | Pooling::LastToken => 0,
        };
        if skip == 0
            && let Some(rows) = self.encoder.embed_unpadded(ids, pooling, normalize)
        {
            return rows;
        }
        let longest = ids.iter().map(|t| t.len()).max().unwrap_or(1);
        let EncoderSpec {
            pad_id: pad,
            padding_side: side,
            ..
        } = self.encoder.spec();
        let mut flat_ids = Vec::with_capacity(ids.len() * longest);
        let mut flat_mask = Vec::with_capacity(ids.len() * longest);
        for tokens in ids {
            let padding = longest - tokens.len();
            let (ids_row, mask_row): (Vec<u32>, Vec<u32>) = match side {
                PaddingSide::Right => (
                    tokens
                        .iter()
                        .copied()
                        .chain(std::iter::repeat_n(pad, padding))
                        .collect(),
                    std::iter::repeat_n(1, tokens.len())
                        .chain(std::iter::repeat_n(0, padding))
                        .collect(),
                ),
                PaddingSide::Left => (
                    std::iter::repeat_n(pad, padding)
                        .chain(tokens.iter().copied())
                        .collect(),
                    std::iter::repeat_n(0, padding)
                        .chain(std::iter::repeat_n(1, tokens.len()))
                        .collect(),
                ),
            };
            flat_ids.extend(ids_row);
            flat_mask.extend(mask_row);
        }
        let shape = (ids.len(), longest);
        let input = Tensor::from_vec(flat_ids, shape, &self.device)?;
        let pool_mask = match skip {
            0 => None,
            _ => Some(skip_leading_tokens(
                &flat_mask,
                shape,
                skip,
                side,
                &self.device,
            )?),
        };
        let mask = Tensor::from_vec(flat_mask, shape, &self.device)?;
        let hidden = self.encoder.forward(&input, &mask)?;
        let pooled = pool(
            &hidden,
            pool_mask.as_ref().unwrap_or(&mask),
            pooling,
            side,
            normalize,
        )?;
        pooled.to_vec2::<f32>()
    }

    /// Embeds a chunk batch by batch, calling `rows_done` with the rows embedded so far
    /// after each batch.
    fn embed(
        &mut self,
        chunk: TokenizedChunk,
        rows_done: &mut dyn FnMut(usize),
    ) -> Result<pb::EmbedResponse, ModelError> {
        let started = Instant::now();
        let how = BatchPooling {
            normalize: self.layout.normalize && !chunk.skip_model_normalize,
            skip: chunk.pool_skip,
        };
        // Progress counts texts: windows embedded, scaled to the texts they come from.
        let texts = chunk.rows();
        let rows_total = chunk.ids.len().max(1);
        let embedded = self.embed_rows(&chunk.ids, how, &mut |rows| {
            rows_done(rows * texts / rows_total)
        })?;
        let model_micros = started.elapsed().as_micros() as u64;
        Ok(self.response(chunk, embedded, how, model_micros))
    }

    /// One vector for each of `ids`, in order, batch by batch under the token budget;
    /// `rows_done` hears the rows embedded so far after each batch. Out of GPU memory, the
    /// budget halves and the batch runs again split.
    fn embed_rows(
        &mut self,
        ids: &[Vec<u32>],
        how: BatchPooling,
        rows_done: &mut dyn FnMut(usize),
    ) -> Result<EmbeddedRows, ModelError> {
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        let mut pending: Vec<Vec<usize>> =
            batching::plan_batches(&lengths, self.max_batch_tokens, self.max_batch_size);
        pending.reverse();
        let (tokens, _) = batching::token_counts(&lengths, &pending);
        let mut rows: Vec<Option<Vec<f32>>> = vec![None; lengths.len()];
        let (mut padded, mut batches, mut embedded) = (0usize, 0u32, 0usize);
        while let Some(batch) = pending.pop() {
            let batch_ids: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
            match self.run_batch_pooled(&batch_ids, how) {
                Ok(vectors) => {
                    padded += batch.len() * batch_ids.iter().map(|t| t.len()).max().unwrap_or(0);
                    batches += 1;
                    embedded += batch.len();
                    for (index, vector) in batch.into_iter().zip(vectors) {
                        rows[index] = Some(vector);
                    }
                    rows_done(embedded);
                }
                Err(error) if crate::error::is_out_of_memory(&error) && batch.len() > 1 => {
                    self.max_batch_tokens = (self.max_batch_tokens / 2).max(16);
                    tracing::warn!(
                        budget = self.max_batch_tokens,
                        "out of memory; halving the token budget"
                    );
                    let sub_lengths: Vec<usize> = batch.iter().map(|&i| lengths[i]).collect();
                    for sub in batching::plan_batches(
                        &sub_lengths,
                        self.max_batch_tokens,
                        self.max_batch_size,
                    )
                    .into_iter()
                    .rev()
                    {
                        pending.push(sub.into_iter().map(|j| batch[j]).collect());
                    }
                }
                Err(error) => {
                    return Err(ModelError::Task(format!("model forward failed: {error}")));
                }
            }
        }
        let rows: Vec<Vec<f32>> = rows
            .into_iter()
            .map(|row| row.ok_or_else(|| ModelError::Task("a text was not embedded".into())))
            .collect::<Result<_, _>>()?;
        Ok(EmbeddedRows {
            rows,
            tokens,
            padded,
            batches,
        })
    }

    /// The chunk's answer: its rows' vectors (or each text's mean over its windows) as
    /// little-endian f32, with what it took.
    fn response(
        &self,
        chunk: TokenizedChunk,
        embedded: EmbeddedRows,
        how: BatchPooling,
        model_micros: u64,
    ) -> pb::EmbedResponse {
        let dim = self.encoder.spec().hidden_size;
        let window_count = chunk.windows.as_ref().map_or(0, |w| w.row_texts.len());
        // A text's rows are consecutive: a run longer than one is a text that was cut.
        let texts_split = chunk.windows.as_ref().map_or(0, |w| {
            w.row_texts
                .chunk_by(|a, b| a == b)
                .filter(|run| run.len() > 1)
                .count()
        });
        let texts = chunk.rows();
        let (rows, row_texts, ranges) = match chunk.windows {
            None => (embedded.rows, Vec::new(), Vec::new()),
            Some(windows) if windows.mean => (
                mean_of_windows(
                    &embedded.rows,
                    &windows.row_texts,
                    windows.texts,
                    how.normalize,
                ),
                Vec::new(),
                Vec::new(),
            ),
            Some(windows) => (embedded.rows, windows.row_texts, windows.ranges),
        };
        let mut vectors = Vec::with_capacity(rows.len() * dim * 4);
        for row in &rows {
            for value in row {
                vectors.extend_from_slice(&value.to_le_bytes());
            }
        }
        pb::EmbedResponse {
            count: rows.len() as u32,
            row_texts,
            row_char_starts: ranges.iter().map(|r| r.0 as u32).collect(),
            row_char_ends: ranges.iter().map(|r| r.1 as u32).collect(),
            texts: texts as u32,
            windows: window_count as u32,
            texts_split: texts_split as u32,
            dim: dim as u32,
            vectors: vectors.into(),
            tokens: embedded.tokens as u64,
            padded_tokens: embedded.padded as u64,
            truncated_rows: chunk.truncated_rows,
            tokenize_micros: chunk.tokenize_micros,
            model_micros,
            total_micros: chunk.tokenize_micros + model_micros,
            batches: embedded.batches,
            device: format!("{:?}", self.device.location()),
            dtype: format!("{:?}", self.dtype).to_ascii_lowercase(),
            max_batch_tokens: self.max_batch_tokens as u64,
            model_fingerprint: self.content_fingerprint.clone(),
            prompt: chunk.prompt,
        }
    }
}

/// A chunk's rows once embedded, with what it took.
struct EmbeddedRows {
    /// One vector per row, in order.
    rows: Vec<Vec<f32>>,
    /// Tokens of the rows, padding left out.
    tokens: usize,
    /// Tokens the batches ran, padding included.
    padded: usize,
    batches: u32,
}

/// One vector per text from its windows' vectors (`rows`, each of text `row_texts`): their
/// mean, scaled to unit length when the model normalises (`normalize`), as one would average
/// the vectors of a text's windows embedded apart.
fn mean_of_windows(
    rows: &[Vec<f32>],
    row_texts: &[u32],
    texts: usize,
    normalize: bool,
) -> Vec<Vec<f32>> {
    let dim = rows.first().map_or(0, Vec::len);
    let mut sums = vec![vec![0f32; dim]; texts];
    let mut counts = vec![0usize; texts];
    for (row, &text) in rows.iter().zip(row_texts) {
        let text = text as usize;
        counts[text] += 1;
        for (sum, value) in sums[text].iter_mut().zip(row) {
            *sum += value;
        }
    }
    for (sum, count) in sums.iter_mut().zip(counts) {
        let count = count.max(1) as f32;
        sum.iter_mut().for_each(|v| *v /= count);
        if normalize {
            let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            sum.iter_mut().for_each(|v| *v /= norm);
        }
    }
    sums
}

/// How one batch is pooled.
#[derive(Clone, Copy, Debug)]
struct BatchPooling {
    /// Scale each vector to unit length (the model's Normalize module).
    normalize: bool,
    /// Leading tokens of each row that mean pooling leaves out (a prompt the model pools
    /// without).
    skip: usize,
}

impl BatchPooling {
    fn of_model(layout: &ModelLayout) -> Self {
        Self {
            normalize: layout.normalize,
            skip: 0,
        }
    }
}

/// The attention mask `flat_mask` (`shape`, 1 = real token) with each row's first `skip`
/// real tokens set to 0, as sentence-transformers leaves a prompt out of pooling.
fn skip_leading_tokens(
    flat_mask: &[u32],
    shape: (usize, usize),
    skip: usize,
    side: PaddingSide,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let (rows, columns) = shape;
    let mut mask = flat_mask.to_vec();
    for row in mask.chunks_exact_mut(columns.max(1)).take(rows) {
        let first_real = match side {
            PaddingSide::Right => 0,
            PaddingSide::Left => row.iter().position(|&m| m == 1).unwrap_or(columns),
        };
        let end = (first_real + skip).min(columns);
        row[first_real..end].fill(0);
    }
    Tensor::from_vec(mask, shape, device)
}

/// The prompts a model names, and how it pools them.
#[derive(Clone, Debug, Default)]
struct ModelPrompts {
    prompts: std::collections::BTreeMap<String, String>,
    /// The default prompt's text ("" when the model has none).
    default: String,
    include_prompt: bool,
}

impl ModelPrompts {
    fn of(layout: &ModelLayout) -> Self {
        let default = layout
            .default_prompt_name
            .as_ref()
            .and_then(|name| layout.prompts.get(name))
            .cloned()
            .unwrap_or_default();
        Self {
            prompts: layout.prompts.clone(),
            default,
            include_prompt: layout.include_prompt,
        }
    }

    /// The prompt called `name`, or an error naming those there are.
    fn named(&self, name: &str) -> Result<String, ModelError> {
        self.prompts.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.prompts.keys().map(String::as_str).collect();
            ModelError::BadPayload(match known.is_empty() {
                true => format!(
                    "prompt name `{name}`: the model names no prompts (its \
                     config_sentence_transformers.json has none); give the prompt's text \
                     instead (--prompt)"
                ),
                false => format!(
                    "prompt name `{name}`: the model's prompts are {}; pick one of them, or \
                     give the prompt's text (--prompt)",
                    known.join(", ")
                ),
            })
        })
    }

    fn default_prompt(&self) -> &str {
        &self.default
    }
}

/// Weights in the chosen dtype plus activations for a full token budget (a generous
/// per-token allowance of 64 hidden-size f32 buffers).
fn estimate_vram(
    weight_file_bytes: u64,
    dtype: DType,
    max_batch_tokens: usize,
    hidden: usize,
) -> u64 {
    let weights = match dtype {
        DType::F32 => weight_file_bytes,
        _ => weight_file_bytes / 2,
    };
    weights + (max_batch_tokens * hidden * 4 * 64) as u64
}

impl Embedder {
    /// The decoding and tokenising stage, to run ahead of the model on another thread.
    pub fn preparer(&self) -> Arc<TextPreparer> {
        self.preparer.clone()
    }

    /// Embeds a chunk that [`TextPreparer::prepare`] tokenised; returns an `EmbedResponse`.
    pub fn embed_prepared(&mut self, chunk: TokenizedChunk) -> Result<Vec<u8>, ModelError> {
        self.embed_prepared_reporting(chunk, &mut |_| {})
    }

    /// [`Embedder::embed_prepared`], calling `rows_done` with the rows embedded so far after
    /// each model batch (progress inside a large chunk).
    pub fn embed_prepared_reporting(
        &mut self,
        chunk: TokenizedChunk,
        rows_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<u8>, ModelError> {
        Ok(self.embed(chunk, rows_done)?.encode_to_vec())
    }

    /// Decodes, tokenises and embeds an `EmbedRequest` payload on this thread.
    pub fn embed_payload(&mut self, payload: &[u8]) -> Result<Vec<u8>, ModelError> {
        self.embed_payload_reporting(payload, &mut |_| {})
    }

    /// [`Embedder::embed_payload`] with [`Embedder::embed_prepared_reporting`]'s progress.
    pub fn embed_payload_reporting(
        &mut self,
        payload: &[u8],
        rows_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<u8>, ModelError> {
        let chunk = self.preparer.prepare(payload)?;
        self.embed_prepared_reporting(chunk, rows_done)
    }

    /// Trains one segment of a sweep trial (a `TrialRequest` payload) on this model's device,
    /// next to the resident model; returns a `TrialResponse`.
    pub fn train_trial(&mut self, payload: &[u8]) -> Result<Vec<u8>, ModelError> {
        let request = pb::TrialRequest::decode(payload)
            .map_err(|e| ModelError::BadPayload(format!("not a TrialRequest: {e}")))?;
        self.train_trial_request(&request)
    }

    /// [`Embedder::train_trial`] on a decoded request (the agent rewrites an `s3://`
    /// dataset to the local copy it fetched).
    pub fn train_trial_request(
        &mut self,
        request: &pb::TrialRequest,
    ) -> Result<Vec<u8>, ModelError> {
        Ok(self
            .trials
            .run(request, &self.device, &self.roots)?
            .encode_to_vec())
    }

    /// VRAM this model holds (0 on CPU).
    pub fn vram_bytes(&self) -> u64 {
        self.vram_bytes
    }
}

/// Threads that tokenise an actor's chunks when its config does not say: one on the CPU,
/// where the cores run the model; on a GPU the node's cores shared by its GPUs (2 to 32), so
/// that an actor per GPU tokenises the next chunk faster than its GPU embeds this one, even
/// on long documents (the preparation thread runs one chunk ahead).
fn default_tokenize_threads(gpu: bool, cores: usize, gpus: usize) -> usize {
    match gpu {
        false => 1,
        true => (cores / gpus.max(1)).clamp(2, 32),
    }
}

/// The GPUs this process sees (1 when it cannot tell).
fn gpus_on_host(gpu: bool) -> usize {
    #[cfg(feature = "cuda")]
    if gpu {
        use candle_core::cuda_backend::cudarc::driver::CudaContext;
        return CudaContext::device_count().map_or(1, |n| n.max(1) as usize);
    }
    let _ = gpu;
    1
}

#[cfg(test)]
mod tests {
    use super::{default_tokenize_threads, mean_of_windows};

    #[test]
    fn a_gpu_actor_tokenises_on_its_share_of_the_nodes_cores() {
        assert_eq!(
            default_tokenize_threads(false, 64, 8),
            1,
            "CPU actors run the model"
        );
        assert_eq!(
            default_tokenize_threads(true, 16, 1),
            16,
            "one H200, 16 cores"
        );
        assert_eq!(
            default_tokenize_threads(true, 64, 8),
            8,
            "8 A6000s, 64 cores"
        );
        assert_eq!(
            default_tokenize_threads(true, 4, 1),
            4,
            "g5.xlarge: one A10G, 4 cores"
        );
        assert_eq!(default_tokenize_threads(true, 2, 8), 2, "at least two");
        assert_eq!(default_tokenize_threads(true, 192, 1), 32, "at most 32");
    }

    #[test]
    fn windows_average_per_text_and_rescale_when_the_model_normalises() {
        let rows = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![0.6, 0.8]];
        let means = mean_of_windows(&rows, &[0, 0, 1], 2, false);
        assert_eq!(means, vec![vec![0.5, 0.5], vec![0.6, 0.8]]);
        let unit = mean_of_windows(&rows, &[0, 0, 1], 2, true);
        let half = std::f32::consts::FRAC_1_SQRT_2;
        assert!((unit[0][0] - half).abs() < 1e-6 && (unit[0][1] - half).abs() < 1e-6);
        assert!((unit[1][0] - 0.6).abs() < 1e-6);
    }
}
