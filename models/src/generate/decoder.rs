//! What both decoders share (the quantised CPU one in `quantised_llama.rs`, the dense one
//! in `dense.rs`): the model's shape from its metadata ([`LlamaConfig`], [`RopeStyle`]), the
//! GGUF header reader, and a forward step's rows and answers ([`Row`], [`NextToken`]). A
//! leaf: it names no other file of `generate`.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::draw::Draw;
use super::sampling::TokenLogprob;
use crate::ModelError;

/// The shape of the model, from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// How RoPE pairs a head's dimensions.
    pub rope: RopeStyle,
    /// Each pair's frequency is divided by its factor (Llama 3.1's long-context scaling);
    /// `None`: all 1.
    pub rope_freq_factors: Option<Vec<f32>>,
}

/// Which dimensions of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF's Llama layout (its converter permutes the query
    /// and key rows into it).
    Interleaved,
    /// `(i, i + head_dim/2)`: Hugging Face checkpoints, and GGUF's Qwen.
    Halves,
}

/// Architectures whose GGUF tensors the quantised CPU path reads.
pub const QUANTISED_ARCHITECTURES: &[&str] = &["llama"];
/// Architectures whose GGUF tensors the dense path (`dense.rs`) reads.
pub const DENSE_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3"];

impl LlamaConfig {
    pub fn from_metadata(metadata: &HashMap<String, Value>) -> Result<Self, ModelError> {
        let arch = Self::architecture(metadata);
        if !DENSE_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(ModelError::Load(format!(
                "GGUF architecture `{arch}` is not supported for generation (supported: {})",
                DENSE_ARCHITECTURES.join(", ")
            )));
        }
        let number = |key: &str| -> Result<usize, ModelError> {
            metadata
                .get(&format!("{arch}.{key}"))
                .and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)))
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Load(format!("the GGUF file has no `{arch}.{key}`")))
        };
        let float = |key: &str, default: f32| {
            metadata
                .get(&format!("{arch}.{key}"))
                .and_then(|v| v.to_f32().ok())
                .unwrap_or(default)
        };
        let hidden = number("embedding_length")?;
        let heads = number("attention.head_count")?;
        let kv_heads = number("attention.head_count_kv").unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || hidden % heads != 0 {
            return Err(ModelError::Load(format!(
                "inconsistent attention shape: {heads} heads, {kv_heads} KV heads, hidden {hidden}"
            )));
        }
        let vocab = match metadata.get("tokenizer.ggml.tokens").map(Value::to_vec) {
            Some(Ok(tokens)) => tokens.len(),
            _ => number("vocab_size")?,
        };
        Self {
            layers: number("block_count")?,
            hidden,
            heads,
            kv_heads,
            head_dim: number("attention.key_length").unwrap_or(hidden / heads),
            ffn: number("feed_forward_length")?,
            vocab,
            context: number("context_length")?,
            rope_base: float("rope.freq_base", 10_000.0),
            rms_eps: float("attention.layer_norm_rms_epsilon", 1e-5),
            rope: if arch == "llama" {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Halves
            },
            rope_freq_factors: None,
        }
        .check_bounds()
    }

    /// Refuses a shape no real model has before anything is sized from it: a model file
    /// whose metadata asks for absurd layers, widths or contexts would otherwise make the
    /// load allocate what no host has, and an allocation that fails aborts the agent.
    pub fn check_bounds(self) -> Result<Self, ModelError> {
        use crate::bounds::*;
        check_dims(&[
            (
                "layers (num_hidden_layers, block_count)",
                self.layers,
                MAX_LAYERS,
            ),
            (
                "hidden size (hidden_size, embedding_length)",
                self.hidden,
                MAX_HIDDEN,
            ),
            ("attention heads", self.heads, MAX_HEADS),
            ("KV heads", self.kv_heads, MAX_HEADS),
            (
                "head dimension (head_dim, key_length)",
                self.head_dim,
                MAX_HEADS,
            ),
            ("feed-forward size (intermediate_size)", self.ffn, MAX_FFN),
            ("vocabulary", self.vocab, MAX_VOCAB),
            (
                "context (max_position_embeddings)",
                self.context,
                MAX_POSITIONS,
            ),
        ])?;
        if !self.head_dim.is_multiple_of(2) || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ModelError::Load(format!(
                "inconsistent attention shape: {} heads, {} KV heads, head dimension {}",
                self.heads, self.kv_heads, self.head_dim
            )));
        }
        Ok(self)
    }

    /// The GGUF architecture name, read back from the metadata (for errors).
    pub fn architecture(metadata: &HashMap<String, Value>) -> String {
        metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default()
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Each pair's RoPE frequency, `base^(-2i/head_dim)` over its factor.
    pub fn rope_frequencies(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let freq = self.rope_base.powf(-2.0 * i as f32 / self.head_dim as f32);
                match &self.rope_freq_factors {
                    Some(factors) => freq / factors.get(i).copied().unwrap_or(1.0),
                    None => freq,
                }
            })
            .collect()
    }
}

/// One token of one sequence in a forward step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The sequence's KV cache slot.
    pub slot: usize,
    /// The token's position in its sequence.
    pub pos: usize,
    pub token: u32,
    /// Whether this row's next-token logits are wanted (a prompt's last row, a decode row).
    pub logits: bool,
    /// What is wanted of those logits.
    pub pick: Pick,
}

/// What a row that wants logits wants of them. The dense engine chooses the token where the
/// logits are and brings back its id alone ([`NextToken::Chosen`]) for [`Pick::Greedy`] and
/// [`Pick::Draw`], and a few numbers for [`Pick::Score`] and [`Pick::Listed`]; the
/// quantised CPU kernels give the logits anyway, and the host's sampler chooses the same
/// token from them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pick {
    /// The logits themselves (penalties, a grammar or suppressed tokens need them).
    Logits,
    /// The largest logit's token (plain greedy decoding).
    Greedy,
    /// A token drawn as [`draw_token`](super::draw::draw_token) draws it.
    Draw(Draw),
    /// The log-probability of `target` (a scored prompt's next token) with the `top`
    /// likeliest tokens', and whether it is the likeliest ([`NextToken::Listed`]).
    Score {
        /// The token scored.
        target: u32,
        /// How many likeliest tokens to list with it.
        top: usize,
    },
    /// The argmax (`draw` `None`) or the draw's token, with its log-probability and the
    /// `top` likeliest tokens' (a request that asks for logprobs; [`NextToken::Listed`]).
    Listed {
        /// The draw, for a sampled row.
        draw: Option<Draw>,
        /// How many likeliest tokens to list with it.
        top: usize,
    },
}

/// What a step gives back for a row that wanted logits.
#[derive(Clone, Debug, PartialEq)]
pub enum NextToken {
    /// The logits over the vocabulary, for the host's sampler.
    Logits(Vec<f32>),
    /// The token the engine chose as the row's [`Pick`] asked: the largest logit's (the
    /// lowest among equals), or the draw's.
    Chosen(u32),
    /// [`Pick::Score`]'s target or [`Pick::Listed`]'s chosen token, with its log-probability
    /// and the likeliest tokens', and whether it was the likeliest.
    Listed {
        /// The token, its log-probability and the top tokens asked for.
        logprob: TokenLogprob,
        /// Whether the token was the row's likeliest.
        greedy: bool,
    },
}

/// Opens the GGUF file at `path` and reads its header (metadata and tensor index).
pub fn read_gguf(path: &Path) -> Result<(std::fs::File, Content), ModelError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| ModelError::Load(format!("cannot open {}: {e}", path.display())))?;
    let content = Content::read(&mut file)
        .map_err(|e| ModelError::Load(format!("{} is not a GGUF file: {e}", path.display())))?;
    Ok((file, content))
}
