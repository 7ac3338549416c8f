//! A BERT-family encoder written for inference throughput: one fused QKV projection, the
//! attention scale folded into the query weights, 2-D matrix multiplies over all tokens of a
//! batch, no attention mask when a batch has no padding; on a GPU in f16 or bf16, attention
//! is one tensor-core kernel (`flash_attention`). It runs on GPUs and for f16/bf16; on
//! CPU in f32 its weights move into [`super::cpu_bert::CpuBert`]. Models with other
//! activations or position embeddings use candle's `BertModel`.
//!
//! Covers BERT (MiniLM, bge, e5), RoBERTa-style position ids (which start after the padding
//! id) and MPNet: RoBERTa-style positions, no token types, its own weight names, and a
//! learned relative attention bias per head ([`RelativeBias`]).

use candle_core::{D, DType, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use serde::Deserialize;

use super::encoder::{EncoderSpec, PaddingSide, TextEncoder};
use super::flash_attention::{FlashAttention, Heads, flash_attention, flash_attention_fits};
use super::fused::{self, AttentionMask};
use super::relative_position::RelativeBias;

#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: u32,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
    #[serde(default)]
    pub model_type: Option<String>,
    /// MPNet: buckets of the relative attention bias.
    #[serde(default)]
    pub relative_attention_num_buckets: Option<usize>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_position_type() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Refuses dimensions no real encoder has (`bounds.rs`), before anything is sized
    /// from them.
    pub fn check_bounds(self) -> Result<Self, crate::ModelError> {
        use crate::bounds::*;
        check_dims(&[
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("intermediate_size", self.intermediate_size, MAX_FFN),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
            ("type_vocab_size", self.type_vocab_size, 1 << 16),
            (
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets.unwrap_or(1),
                1 << 16,
            ),
        ])?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(crate::ModelError::Load(format!(
                "inconsistent attention shape: hidden_size {} is not a multiple of {} heads",
                self.hidden_size, self.num_attention_heads
            )));
        }
        Ok(self)
    }

    /// Whether this fast path covers the model.
    pub fn supported(&self) -> bool {
        self.hidden_act == "gelu" && self.position_embedding_type == "absolute"
    }

    pub fn is_mpnet(&self) -> bool {
        self.model_type.as_deref() == Some("mpnet")
    }

    /// The position id of a sequence's first token: RoBERTa-style models (RoBERTa,
    /// XLM-RoBERTa, MPNet) count positions from the padding id + 1, BERT from 0.
    pub fn first_position(&self) -> usize {
        match self.model_type.as_deref() {
            Some("roberta" | "xlm-roberta" | "mpnet") => self.pad_token_id as usize + 1,
            _ => 0,
        }
    }

    /// The longest sequence the position embeddings allow.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.first_position())
    }
}

/// A linear layer stored transposed (`[in, out]`) so the multiply needs no copy.
struct Dense {
    weight_t: Tensor,
    bias: Tensor,
}

impl Dense {
    fn load(vb: VarBuilder, input: usize, output: usize) -> candle_core::Result<Self> {
        let weight = vb.get((output, input), "weight")?;
        let bias = vb.get(output, "bias")?;
        Ok(Self {
            weight_t: weight.t()?.contiguous()?,
            bias,
        })
    }

    fn fused(parts: &[Dense]) -> candle_core::Result<Self> {
        let weights: Vec<&Tensor> = parts.iter().map(|p| &p.weight_t).collect();
        let biases: Vec<&Tensor> = parts.iter().map(|p| &p.bias).collect();
        Ok(Self {
            weight_t: Tensor::cat(&weights, 1)?.contiguous()?,
            bias: Tensor::cat(&biases, 0)?,
        })
    }

    fn scaled(self, factor: f64) -> candle_core::Result<Self> {
        Ok(Self {
            weight_t: (self.weight_t * factor)?,
            bias: (self.bias * factor)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_then(x, None, false)
    }

    /// `x W + b`, plus `residual` when given, then GELU when `gelu`: one fused step on CUDA.
    fn forward_then(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        gelu: bool,
    ) -> candle_core::Result<Tensor> {
        fused::bias_add(x.matmul(&self.weight_t)?, &self.bias, residual, gelu)
    }
}

fn layer_norm(vb: VarBuilder, size: usize, eps: f64) -> candle_core::Result<LayerNorm> {
    let (weight, bias) = match (vb.get(size, "weight"), vb.get(size, "bias")) {
        (Ok(w), Ok(b)) => (w, b),
        _ => (vb.get(size, "gamma")?, vb.get(size, "beta")?),
    };
    Ok(LayerNorm::new(weight, bias, eps))
}

struct Layer {
    qkv: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

pub struct FastBert {
    config: BertConfig,
    words: Embedding,
    positions: Tensor,
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    /// MPNet only: the relative attention bias, and the same as `[heads, 2p-1]` on the device.
    relative: Option<(RelativeBias, Tensor)>,
}

impl Layer {
    /// Layer `l`'s weights, BERT's names or MPNet's, the query pre-scaled by
    /// `1/sqrt(head_dim)` and fused with the key and value.
    fn load(config: &BertConfig, l: VarBuilder) -> candle_core::Result<Self> {
        let h = config.hidden_size;
        let eps = config.layer_norm_eps;
        let scale = 1.0 / ((h / config.num_attention_heads) as f64).sqrt();
        let attn = l.pp("attention");
        let (query, key, value, attention_out, attention_norm) = if config.is_mpnet() {
            let a = attn.pp("attn");
            (
                Dense::load(a.pp("q"), h, h)?,
                Dense::load(a.pp("k"), h, h)?,
                Dense::load(a.pp("v"), h, h)?,
                Dense::load(a.pp("o"), h, h)?,
                layer_norm(attn.pp("LayerNorm"), h, eps)?,
            )
        } else {
            (
                Dense::load(attn.pp("self.query"), h, h)?,
                Dense::load(attn.pp("self.key"), h, h)?,
                Dense::load(attn.pp("self.value"), h, h)?,
                Dense::load(attn.pp("output.dense"), h, h)?,
                layer_norm(attn.pp("output.LayerNorm"), h, eps)?,
            )
        };
        Ok(Layer {
            qkv: Dense::fused(&[query.scaled(scale)?, key, value])?,
            attention_out,
            attention_norm,
            intermediate: Dense::load(l.pp("intermediate.dense"), h, config.intermediate_size)?,
            output: Dense::load(l.pp("output.dense"), config.intermediate_size, h)?,
            output_norm: layer_norm(l.pp("output.LayerNorm"), h, eps)?,
        })
    }
}

impl FastBert {
    pub fn load(config: BertConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        let prefix = if config.is_mpnet() { "mpnet" } else { "bert" };
        let vb = if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
            vb.pp(prefix)
        } else {
            vb
        };
        let h = config.hidden_size;
        let emb = vb.pp("embeddings");
        let words = Embedding::new(
            emb.get((config.vocab_size, h), "word_embeddings.weight")?,
            h,
        );
        let positions = emb.get(
            (config.max_position_embeddings, h),
            "position_embeddings.weight",
        )?;
        let token_type = if config.is_mpnet() {
            Tensor::zeros(h, positions.dtype(), positions.device())?
        } else {
            emb.get((config.type_vocab_size, h), "token_type_embeddings.weight")?
                .get(0)?
        };
        let embedding_norm = layer_norm(emb.pp("LayerNorm"), h, config.layer_norm_eps)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(&config, vb.pp("encoder.layer").pp(i)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let relative = match config.is_mpnet() {
            false => None,
            true => Some(Self::load_relative_bias(&config, &vb, &positions)?),
        };
        Ok(Self {
            config,
            words,
            positions,
            token_type,
            embedding_norm,
            layers,
            relative,
        })
    }

    /// MPNet's relative attention bias, and the same as `[heads, 2p-1]` on the device in
    /// the dtype of `positions`.
    fn load_relative_bias(
        config: &BertConfig,
        vb: &VarBuilder,
        positions: &Tensor,
    ) -> candle_core::Result<(RelativeBias, Tensor)> {
        let buckets = config.relative_attention_num_buckets.unwrap_or(32);
        let heads = config.num_attention_heads;
        let table = vb
            .get((buckets, heads), "encoder.relative_attention_bias.weight")?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let bias = RelativeBias::new(&table, buckets, heads, config.max_tokens());
        let width = 2 * config.max_tokens() - 1;
        let on_device = Tensor::from_vec(
            bias.by_offset().to_vec(),
            (heads, width),
            positions.device(),
        )?
        .to_dtype(positions.dtype())?;
        Ok((bias, on_device))
    }

    /// MPNet's `[heads, t, t]` relative bias for sequences of `t` tokens.
    fn relative_bias(&self, t: usize) -> candle_core::Result<Option<Tensor>> {
        let Some((bias, table)) = &self.relative else {
            return Ok(None);
        };
        let last = bias.positions() - 1;
        let columns: Vec<u32> = (0..t)
            .flat_map(|query| (0..t).map(move |key| (key + last - query) as u32))
            .collect();
        let columns = Tensor::from_vec(columns, t * t, table.device())?;
        let square = table.index_select(&columns, 1)?;
        Ok(Some(square.reshape((bias.heads(), t, t))?))
    }

    fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        shape: (usize, usize),
        mask: &AttentionMask,
    ) -> candle_core::Result<Tensor> {
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let d = h / heads;
        let qkv = layer.qkv.forward(x)?;
        let context = match flash_attention_fits(x.device(), x.dtype(), d) {
            // One tensor-core kernel reading the heads straight out of the product's columns:
            // no split copies, no scores in memory. The scale is in the query weights.
            true => {
                let columns = |first_column| Heads::Columns {
                    rows: &qkv,
                    first_column,
                    count: heads,
                };
                let op = FlashAttention {
                    seq_len: shape.1,
                    head_dim: d,
                    causal: false,
                    scale: 1.0,
                    keep: mask.keep,
                    bias: mask.bias,
                };
                flash_attention(columns(0), columns(h), columns(2 * h), &op)?
            }
            false => {
                let q = fused::split_heads(&qkv, shape, heads, d, 0)?;
                let k = fused::split_heads(&qkv, shape, heads, d, h)?;
                let v = fused::split_heads(&qkv, shape, heads, d, 2 * h)?;
                let probs = fused::attention_probs(q.matmul(&k.t()?)?, mask)?;
                fused::merge_heads(&probs.matmul(&v)?)?
            }
        };
        let attended = layer
            .attention_norm
            .forward(&layer.attention_out.forward_then(&context, Some(x), false)?)?;
        let hidden = layer.intermediate.forward_then(&attended, None, true)?;
        layer
            .output_norm
            .forward(&layer.output.forward_then(&hidden, Some(&attended), false)?)
    }
}

/// One layer's weights as `(weight [in, out], bias)` pairs and layer norms.
pub struct LayerParts<'a> {
    pub qkv: (&'a Tensor, &'a Tensor),
    pub attention_out: (&'a Tensor, &'a Tensor),
    pub attention_norm: &'a LayerNorm,
    pub intermediate: (&'a Tensor, &'a Tensor),
    pub output: (&'a Tensor, &'a Tensor),
    pub output_norm: &'a LayerNorm,
}

impl Dense {
    fn parts(&self) -> (&Tensor, &Tensor) {
        (&self.weight_t, &self.bias)
    }
}

impl FastBert {
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// MPNet's relative attention bias.
    pub fn relative_bias_table(&self) -> Option<&RelativeBias> {
        self.relative.as_ref().map(|(bias, _)| bias)
    }

    /// Word embeddings `[vocab, h]`, position embeddings `[positions, h]`, the token type 0
    /// embedding `[h]` (zeros for MPNet) and the embedding layer norm.
    pub fn embeddings(&self) -> (&Tensor, &Tensor, &Tensor, &LayerNorm) {
        (
            self.words.embeddings(),
            &self.positions,
            &self.token_type,
            &self.embedding_norm,
        )
    }

    pub fn layers(&self) -> impl Iterator<Item = LayerParts<'_>> {
        self.layers.iter().map(|layer| LayerParts {
            qkv: layer.qkv.parts(),
            attention_out: layer.attention_out.parts(),
            attention_norm: &layer.attention_norm,
            intermediate: layer.intermediate.parts(),
            output: layer.output.parts(),
            output_norm: &layer.output_norm,
        })
    }
}

impl TextEncoder for FastBert {
    fn forward(&mut self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if t > self.config.max_tokens() {
            candle_core::bail!(
                "sequence of {t} tokens is longer than the model's {} positions",
                self.config.max_tokens()
            );
        }
        let h = self.config.hidden_size;
        let first = self.config.first_position();
        let embedded = self
            .words
            .forward(ids)?
            .broadcast_add(&self.positions.narrow(0, first, t)?)?
            .broadcast_add(&self.token_type)?;
        let mut x = self
            .embedding_norm
            .forward(&embedded)?
            .reshape((b * t, h))?;
        let padded = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()? < (b * t) as f64;
        let keep = if padded {
            Some(mask.to_dtype(DType::F32)?.contiguous()?)
        } else {
            None
        };
        let relative = self.relative_bias(t)?;
        let attention = AttentionMask::new(relative.as_ref(), keep.as_ref(), false);
        for layer in &self.layers {
            x = self.layer(layer, &x, (b, t), &attention)?;
        }
        x.reshape((b, t, h))?.contiguous()?.narrow(D::Minus1, 0, h)
    }

    fn spec(&self) -> EncoderSpec {
        EncoderSpec {
            hidden_size: self.config.hidden_size,
            pad_id: self.config.pad_token_id,
            padding_side: PaddingSide::Right,
        }
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    fn config(layers: u64, heads: u64) -> BertConfig {
        serde_json::from_str(&format!(
            r#"{{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": {layers},
            "num_attention_heads": {heads}, "intermediate_size": 1536,
            "max_position_embeddings": 512}}"#
        ))
        .unwrap()
    }

    #[test]
    fn absurd_or_inconsistent_dimensions_are_refused() {
        assert!(config(6, 12).check_bounds().is_ok());
        let error = config(1_000_000_000, 12)
            .check_bounds()
            .unwrap_err()
            .to_string();
        assert!(error.contains("num_hidden_layers is 1000000000"), "{error}");
        let error = config(6, 7).check_bounds().unwrap_err().to_string();
        assert!(error.contains("not a multiple of 7 heads"), "{error}");
    }
}
