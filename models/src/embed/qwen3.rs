//! A Qwen3 encoder for Qwen3-Embedding: the decoder stack without a KV cache or LM head.
//!
//! Attention is causal, so with right padding no real token ever attends to a pad; pooling
//! then takes each row's last real token. That gives what Qwen3-Embedding's left-padded
//! reference gives, without a padding mask.
//!
//! For throughput: Q, K and V are one matrix multiply, all on 2-D `[tokens, features]` rows; the
//! query and key heads are normed and rotated out of its columns in one op each
//! (`generate::rope_heads`); each residual add and the norm after it are one op; the attention
//! scale is folded into the query norm's weight;
//! grouped-query attention multiplies each K/V head against its group of query heads at once
//! (no copies of K and V per query head). On a GPU in f16 or bf16, attention is one
//! tensor-core kernel instead (`flash_attention`): no scores in memory, the heads merged as it
//! writes them.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{RmsNorm, VarBuilder, rms_norm};
use serde::Deserialize;

use super::encoder::{EncoderSpec, PaddingSide, TextEncoder};
use super::flash_attention::{FlashAttention, Heads, flash_attention, flash_attention_fits};
use super::fused::{self, AttentionMask};
use crate::ModelError;
use crate::generate::decoder::RopeStyle;
use crate::generate::rope_heads::{HeadsOut, RopeHeads, rope_heads};

/// The fields of a Qwen3 `config.json` the encoder uses.
#[derive(Clone, Debug, Deserialize)]
pub struct Qwen3Config {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key and value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Width of a head, when not `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Whether the attention projections have biases.
    #[serde(default)]
    pub attention_bias: bool,
    /// Positions the model was trained for.
    pub max_position_embeddings: usize,
    /// The RMSNorms' epsilon.
    pub rms_norm_eps: f64,
    /// RoPE's base.
    pub rope_theta: f64,
    /// The padding token, when the config names one.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
}

impl Qwen3Config {
    /// Refuses dimensions no real model has (`bounds.rs`), before the rotary tables and
    /// buffers are sized from them.
    pub fn check_bounds(self) -> Result<Self, ModelError> {
        use crate::bounds::*;
        check_dims(&[
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("intermediate_size", self.intermediate_size, MAX_FFN),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ])?;
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads);
        check_dims(&[("head_dim", head_dim, MAX_HEADS)])?;
        if !head_dim.is_multiple_of(2)
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ModelError::Load(format!(
                "inconsistent attention shape: {} heads, {} KV heads, head_dim {head_dim}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        Ok(self)
    }

    /// Width of a head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Floating-point operations of one forward pass over `tokens` tokens in sequences of `seq`.
    pub fn forward_flops(&self, tokens: usize, seq: usize) -> f64 {
        let h = self.hidden_size as f64;
        let d = self.head_dim() as f64;
        let q = self.num_attention_heads as f64 * d;
        let kv = self.num_key_value_heads as f64 * d;
        let per_token_params = h * (q + 2.0 * kv) + q * h + 3.0 * h * self.intermediate_size as f64;
        let attention = 2.0 * q * seq as f64; // scores and weighted sum, per token
        self.num_hidden_layers as f64 * tokens as f64 * 2.0 * (per_token_params + attention)
    }
}

/// A linear layer stored transposed (`[in, out]`), for 2-D rows.
struct Dense {
    weight_t: Tensor,
    bias: Option<Tensor>,
}

impl Dense {
    /// Several projections of the same input as one: their weights side by side.
    fn load_fused(
        vb: &VarBuilder,
        input: usize,
        parts: &[(&str, usize)],
        bias: bool,
    ) -> candle_core::Result<Self> {
        let weights = parts
            .iter()
            .map(|(name, out)| {
                let init = candle_nn::init::DEFAULT_KAIMING_NORMAL;
                vb.pp(*name).get_with_hints((*out, input), "weight", init)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let weights: Vec<Tensor> = weights.iter().map(|w| w.t()).collect::<Result<_, _>>()?;
        let bias = if bias {
            let biases = parts
                .iter()
                .map(|(name, out)| vb.pp(*name).get(*out, "bias"))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Some(Tensor::cat(&biases, 0)?)
        } else {
            None
        };
        Ok(Self {
            weight_t: Tensor::cat(&weights, 1)?.contiguous()?,
            bias,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.matmul(&self.weight_t)?;
        match &self.bias {
            Some(bias) => fused::bias_add(y, bias, None, false),
            None => Ok(y),
        }
    }
}

struct Layer {
    qkv: Dense,
    o: Dense,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    gate_up: Dense,
    down: Dense,
}

/// A Qwen3 decoder run as an embedder: causal attention, the last token's hidden state
/// pooled.
pub struct Qwen3Encoder {
    config: Qwen3Config,
    embed: candle_nn::Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    inv_freq: Tensor,
    /// Whether attention may run as one fused kernel where it fits (a GPU, f16 or bf16);
    /// tests turn it off to compare with the materialised path.
    flash: bool,
}

fn load_layer(config: &Qwen3Config, vb: VarBuilder) -> candle_core::Result<Layer> {
    let (h, d) = (config.hidden_size, config.head_dim());
    let (q_width, kv_width) = (
        config.num_attention_heads * d,
        config.num_key_value_heads * d,
    );
    let inter = config.intermediate_size;
    let attn = vb.pp("self_attn");
    let mlp = vb.pp("mlp");
    // 1/sqrt(d) on the query norm's weight scales the scores (RoPE is a rotation).
    let ones = candle_nn::Init::Const(1.0);
    let q_norm_weight = (attn.pp("q_norm").get_with_hints(d, "weight", ones)? / (d as f64).sqrt())?;
    Ok(Layer {
        qkv: Dense::load_fused(
            &attn,
            h,
            &[
                ("q_proj", q_width),
                ("k_proj", kv_width),
                ("v_proj", kv_width),
            ],
            config.attention_bias,
        )?,
        o: Dense::load_fused(&attn, q_width, &[("o_proj", h)], false)?,
        q_norm: RmsNorm::new(q_norm_weight, config.rms_norm_eps),
        k_norm: rms_norm(d, config.rms_norm_eps, attn.pp("k_norm"))?,
        input_norm: rms_norm(h, config.rms_norm_eps, vb.pp("input_layernorm"))?,
        post_norm: rms_norm(h, config.rms_norm_eps, vb.pp("post_attention_layernorm"))?,
        // Gate and up are one product; SiLU and the product read its halves in one op.
        gate_up: Dense::load_fused(&mlp, h, &[("gate_proj", inter), ("up_proj", inter)], false)?,
        down: Dense::load_fused(&mlp, inter, &[("down_proj", h)], false)?,
    })
}

impl Qwen3Encoder {
    /// Loads the weights under `vb` (with or without a `model.` prefix).
    pub fn new(config: Qwen3Config, vb: VarBuilder) -> candle_core::Result<Self> {
        let vb = if vb.contains_tensor("model.embed_tokens.weight") {
            vb.pp("model")
        } else {
            vb
        };
        let embed =
            candle_nn::embedding(config.vocab_size, config.hidden_size, vb.pp("embed_tokens"))?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| load_layer(&config, vb.pp("layers").pp(i)))
            .collect::<candle_core::Result<_>>()?;
        let norm = rms_norm(config.hidden_size, config.rms_norm_eps, vb.pp("norm"))?;
        let d = config.head_dim();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / (config.rope_theta as f32).powf(2.0 * i as f32 / d as f32))
            .collect();
        let inv_freq = Tensor::new(inv_freq, vb.device())?;
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            inv_freq,
            flash: true,
        })
    }

    /// Each row's rotation (`b * t x head_dim / 2`, f32): the rows are `b` sequences of
    /// positions `0..t`.
    fn rope_tables(
        &self,
        (b, t): (usize, usize),
        device: &Device,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let positions = Tensor::arange(0u32, t as u32, device)?.to_dtype(DType::F32)?;
        let freqs = positions
            .unsqueeze(1)?
            .broadcast_mul(&self.inv_freq.unsqueeze(0)?)?
            .repeat((b, 1))?;
        Ok((freqs.cos()?, freqs.sin()?))
    }

    /// Self-attention over `x` (`[b * t, h]` rows), returning `[b * t, h]`.
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        (b, t): (usize, usize),
        cos: &Tensor,
        sin: &Tensor,
        causal: &AttentionMask,
    ) -> candle_core::Result<Tensor> {
        let (heads, kv_heads, d) = (
            self.config.num_attention_heads,
            self.config.num_key_value_heads,
            self.config.head_dim(),
        );
        let qkv = layer.qkv.forward(x)?;
        // Query and key heads normed and rotated straight out of the product's columns into
        // `[b, heads, t, d]`, one op each (`rope_heads`); the values only change layout.
        fn heads_of(
            norm: &RmsNorm,
            heads: usize,
            first_column: usize,
            (d, t): (usize, usize),
        ) -> RopeHeads<'_> {
            RopeHeads {
                heads,
                head_dim: d,
                first_column,
                style: RopeStyle::Halves,
                norm: Some((norm.weight(), norm.eps())),
                out: HeadsOut::PerSequence(t),
            }
        }
        let q = rope_heads(&qkv, cos, sin, &heads_of(&layer.q_norm, heads, 0, (d, t)))?;
        let k_op = heads_of(&layer.k_norm, kv_heads, heads * d, (d, t));
        let k = rope_heads(&qkv, cos, sin, &k_op)?;
        if self.flash && flash_attention_fits(x.device(), x.dtype(), d) {
            // Scores never materialised, the values read straight out of the product's
            // columns, the output with its heads merged. The scale is in the query norm's
            // weight.
            let op = FlashAttention {
                seq_len: t,
                head_dim: d,
                causal: true,
                scale: 1.0,
                keep: None,
                bias: None,
            };
            let v = Heads::Columns {
                rows: &qkv,
                first_column: (heads + kv_heads) * d,
                count: kv_heads,
            };
            let out = flash_attention(Heads::Stacked(&q), Heads::Stacked(&k), v, &op)?;
            return layer.o.forward(&out);
        }
        let v = fused::split_heads(&qkv, (b, t), kv_heads, d, (heads + kv_heads) * d)?;
        // Query heads g*r..(g+1)*r share K/V head g: as `[b, kv, r*t, d]` they multiply it
        // in one batched product.
        let group = heads / kv_heads;
        let q = q.reshape((b, kv_heads, group * t, d))?;
        let scores = q.matmul(&k.t()?)?.reshape((b, heads, t, t))?;
        let weights = fused::attention_probs(scores, causal)?;
        let out = weights
            .reshape((b, kv_heads, group * t, t))?
            .matmul(&v)?
            .reshape((b, heads, t, d))?;
        layer.o.forward(&fused::merge_heads(&out)?)
    }
}

impl TextEncoder for Qwen3Encoder {
    fn forward(&mut self, ids: &Tensor, _mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let hidden = self.config.hidden_size;
        let mut h = self.embed.forward(ids)?.reshape((b * t, hidden))?;
        let (cos, sin) = self.rope_tables((b, t), h.device())?;
        // Right padding under a causal mask: no real token sees a pad (module docs).
        let causal = AttentionMask::new(None, None, true);
        // Each residual add and the norm after it in one op: `normed` is `h` under the next
        // norm (the final one after the last layer).
        let eps = self.config.rms_norm_eps as f32;
        let mut normed = match self.layers.first() {
            Some(first) => first.input_norm.forward(&h)?,
            None => self.norm.forward(&h)?,
        };
        for (index, layer) in self.layers.iter().enumerate() {
            let attended = self.attention(layer, &normed, (b, t), &cos, &sin, &causal)?;
            let (sum, post) = fused::add_rms_norm(&h, &attended, layer.post_norm.weight(), eps)?;
            let gated = fused::silu_mul_halves(&layer.gate_up.forward(&post)?)?;
            let next = self
                .layers
                .get(index + 1)
                .map_or(&self.norm, |l| &l.input_norm);
            (h, normed) =
                fused::add_rms_norm(&sum, &layer.down.forward(&gated)?, next.weight(), eps)?;
        }
        normed.reshape((b, t, hidden))
    }

    fn spec(&self) -> EncoderSpec {
        EncoderSpec {
            hidden_size: self.config.hidden_size,
            pad_id: self.config.pad_token_id.unwrap_or(151_643),
            padding_side: PaddingSide::Right,
        }
    }
}

/// The encoder of a Qwen3 `config.json` (`config_text`) and its weights.
pub fn load(config_text: &str, weights: VarBuilder) -> Result<Box<dyn TextEncoder>, ModelError> {
    let config: Qwen3Config = serde_json::from_str::<Qwen3Config>(config_text)
        .map_err(|e| ModelError::Load(format!("qwen3 config: {e}")))?
        .check_bounds()?;
    let encoder = Qwen3Encoder::new(config, weights)
        .map_err(|e| ModelError::Load(format!("qwen3 weights: {e}")))?;
    Ok(Box::new(encoder))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};
    use candle_nn::{VarBuilder, VarMap};

    use super::*;
    use crate::embed::encoder::pool;
    use crate::embed::model_files::Pooling;
    use crate::generate::device_ops::max_abs_diff;

    #[test]
    fn absurd_dimensions_are_refused_before_anything_is_sized() {
        let config = |positions: u64, kv_heads: u64| {
            format!(
                r#"{{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": {kv_heads},
                "head_dim": 8, "max_position_embeddings": {positions}, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0}}"#
            )
        };
        let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
        let error = load(&config(1 << 40, 2), vb.clone())
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("max_position_embeddings is 1099511627776"),
            "{error}"
        );
        let error = load(&config(128, 3), vb).err().unwrap().to_string();
        assert!(error.contains("inconsistent attention shape"), "{error}");
    }

    fn tiny() -> (Qwen3Encoder, VarMap) {
        let config: Qwen3Config = serde_json::from_str(
            r#"{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}"#,
        )
        .unwrap();
        let vars = VarMap::new();
        let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
        (Qwen3Encoder::new(config, vb).unwrap(), vars)
    }

    fn embed(encoder: &mut Qwen3Encoder, rows: &[&[u32]]) -> Vec<Vec<f32>> {
        let longest = rows.iter().map(|r| r.len()).max().unwrap();
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        for row in rows {
            ids.extend(
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, longest - row.len())),
            );
            mask.extend(
                std::iter::repeat_n(1u32, row.len())
                    .chain(std::iter::repeat_n(0, longest - row.len())),
            );
        }
        let ids = Tensor::from_vec(ids, (rows.len(), longest), &Device::Cpu).unwrap();
        let mask = Tensor::from_vec(mask, (rows.len(), longest), &Device::Cpu).unwrap();
        let hidden = encoder.forward(&ids, &mask).unwrap();
        pool(&hidden, &mask, Pooling::LastToken, PaddingSide::Right, true)
            .unwrap()
            .to_vec2()
            .unwrap()
    }

    /// Causal attention plus right padding: a text's vector does not depend on what it is
    /// batched with, and pooling takes its own last token.
    #[test]
    fn right_padded_batches_give_the_same_vectors_as_single_texts() {
        let (mut encoder, _vars) = tiny();
        let short: &[u32] = &[5, 9, 13];
        let long: &[u32] = &[7, 3, 22, 41, 8, 19, 2];
        let alone = embed(&mut encoder, &[short]);
        let batched = embed(&mut encoder, &[short, long]);
        let long_alone = embed(&mut encoder, &[long]);
        for (a, b) in alone[0].iter().zip(&batched[0]) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        for (a, b) in long_alone[0].iter().zip(&batched[1]) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        let norm: f32 = batched[1].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_ne!(alone[0], long_alone[0]);
    }

    /// The encoder as plain candle ops: heads split by copies, candle's RMSNorm and rope,
    /// separate residual adds and norms (the forward before the fused ops).
    fn plain_forward(encoder: &Qwen3Encoder, ids: &Tensor) -> Tensor {
        let c = &encoder.config;
        let (b, t) = ids.dims2().unwrap();
        let (heads, kv_heads, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim());
        let positions = Tensor::arange(0u32, t as u32, &Device::Cpu).unwrap();
        let freqs = positions
            .to_dtype(DType::F32)
            .unwrap()
            .unsqueeze(1)
            .unwrap()
            .broadcast_mul(&encoder.inv_freq.unsqueeze(0).unwrap())
            .unwrap();
        let (cos, sin) = (freqs.cos().unwrap(), freqs.sin().unwrap());
        let mask = AttentionMask::new(None, None, true);
        let mut h = encoder
            .embed
            .forward(ids)
            .unwrap()
            .reshape((b * t, c.hidden_size))
            .unwrap();
        for layer in &encoder.layers {
            let qkv = layer
                .qkv
                .forward(&layer.input_norm.forward(&h).unwrap())
                .unwrap();
            let split = |n, at| fused::split_heads(&qkv, (b, t), n, d, at).unwrap();
            let rope = |x: Tensor, norm: &RmsNorm| {
                candle_nn::rotary_emb::rope(&norm.forward(&x).unwrap(), &cos, &sin).unwrap()
            };
            let q = rope(split(heads, 0), &layer.q_norm);
            let k = rope(split(kv_heads, heads * d), &layer.k_norm);
            let v = split(kv_heads, (heads + kv_heads) * d);
            let group = heads / kv_heads;
            let q = q.reshape((b, kv_heads, group * t, d)).unwrap();
            let scores = q
                .matmul(&k.t().unwrap())
                .unwrap()
                .reshape((b, heads, t, t))
                .unwrap();
            let weights = fused::attention_probs(scores, &mask).unwrap();
            let out = weights
                .reshape((b, kv_heads, group * t, t))
                .unwrap()
                .matmul(&v)
                .unwrap();
            let merged = fused::merge_heads(&out.reshape((b, heads, t, d)).unwrap()).unwrap();
            h = (h + layer.o.forward(&merged).unwrap()).unwrap();
            let normed = layer.post_norm.forward(&h).unwrap();
            let gate_up = layer.gate_up.forward(&normed).unwrap();
            let inter = c.intermediate_size;
            let gate = candle_nn::ops::silu(&gate_up.narrow(1, 0, inter).unwrap()).unwrap();
            let up = gate_up.narrow(1, inter, inter).unwrap();
            h = (h + layer.down.forward(&(gate * up).unwrap()).unwrap()).unwrap();
        }
        encoder
            .norm
            .forward(&h)
            .unwrap()
            .reshape((b, t, c.hidden_size))
            .unwrap()
    }

    /// The fused ops (`rope_heads` out of the QKV columns, the residual adds fused with the
    /// norms) compute what the plain candle ops do, with every norm weight random.
    #[test]
    fn the_fused_forward_is_the_plain_one() {
        let (mut encoder, vars) = tiny();
        for (name, var) in vars.data().lock().unwrap().iter() {
            if name.contains("norm") {
                let random = Tensor::randn(1f32, 0.3, var.dims(), &Device::Cpu).unwrap();
                var.set(&random).unwrap();
            }
        }
        // The varmap's q_norm is read raw at load, so load again from the randomised vars.
        let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
        encoder = Qwen3Encoder::new(encoder.config.clone(), vb).unwrap();
        let ids = Tensor::new(&[[5u32, 9, 13, 2, 0], [7, 3, 22, 41, 8]], &Device::Cpu).unwrap();
        let mask = Tensor::ones((2, 5), DType::U32, &Device::Cpu).unwrap();
        let fused = encoder.forward(&ids, &mask).unwrap();
        let plain = plain_forward(&encoder, &ids);
        let worst = max_abs_diff(&fused, &plain);
        assert!(worst < 1e-4, "{worst}");
    }

    /// On a GPU in bf16 (where the kernel fits), the flash attention forward gives the
    /// materialised one's hidden states: two layers, heads of 32 in groups of two, two
    /// sequences of 150 tokens (across the kernel's 64-row tiles).
    #[cfg(feature = "cuda")]
    #[test]
    fn flash_attention_forward_is_the_materialised_one() {
        let Some(gpu) = crate::device::test_gpu() else {
            return;
        };
        let config: Qwen3Config = serde_json::from_str(
            r#"{"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0}"#,
        )
        .unwrap();
        let vars = VarMap::new();
        // bf16 from compute capability 8.0, f16 before (a T4's tensor-core path).
        let dtype = crate::generate::gpu_dtype(crate::device::compute_capability(&gpu));
        let vb = VarBuilder::from_varmap(&vars, dtype, &gpu);
        let mut flash = Qwen3Encoder::new(config.clone(), vb.clone()).unwrap();
        let mut materialised = Qwen3Encoder::new(config, vb).unwrap();
        materialised.flash = false;
        assert!(super::flash_attention_fits(&gpu, dtype, 32));
        let t = 150;
        let ids: Vec<u32> = (0..2 * t as u32).map(|i| (i * 37 + 11) % 512).collect();
        let ids = Tensor::from_vec(ids, (2, t), &gpu).unwrap();
        let mask = Tensor::ones((2, t), DType::U32, &gpu).unwrap();
        let rows = |encoder: &mut Qwen3Encoder| -> Vec<Vec<f32>> {
            let hidden = encoder.forward(&ids, &mask).unwrap();
            hidden
                .to_dtype(DType::F32)
                .unwrap()
                .reshape((2 * t, 128))
                .unwrap()
                .to_vec2()
                .unwrap()
        };
        let (a, b) = (rows(&mut flash), rows(&mut materialised));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let dot: f32 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let norms = x.iter().map(|p| p * p).sum::<f32>().sqrt()
                * y.iter().map(|q| q * q).sum::<f32>().sqrt();
            let cosine = dot / norms;
            assert!(cosine > 0.999, "row {i}: cosine {cosine}");
        }
    }

    #[test]
    fn flops_count_the_dense_layers() {
        let (encoder, _vars) = tiny();
        let per_token = encoder.config.forward_flops(1, 1);
        // 2 layers x 2 FLOPs x (QKV 32*64 + O 32*32 + MLP 3*32*64 + attention 2*32*1).
        assert_eq!(per_token, 2.0 * 2.0 * (2048.0 + 1024.0 + 6144.0 + 64.0));
    }
}
