//! A BERT encoder written for inference throughput: one fused QKV projection, the attention
//! scale folded into the query weights, 2-D matrix multiplies over all tokens of a batch,
//! no attention mask when a batch has no padding. It runs on GPUs and for f16/bf16; on CPU in
//! f32 its weights move into [`super::cpu_bert::CpuBert`]. Models with other activations or
//! position embeddings use candle's `BertModel`.

use candle_core::{D, DType, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use serde::Deserialize;

use super::encoder::{EncoderSpec, PaddingSide, TextEncoder};

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
    /// Whether this fast path covers the model.
    pub fn supported(&self) -> bool {
        self.hidden_act == "gelu" && self.position_embedding_type == "absolute"
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
        x.matmul(&self.weight_t)?.broadcast_add(&self.bias)
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
}

impl FastBert {
    pub fn load(config: BertConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
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
        let token_type = emb
            .get((config.type_vocab_size, h), "token_type_embeddings.weight")?
            .get(0)?;
        let embedding_norm = layer_norm(emb.pp("LayerNorm"), h, config.layer_norm_eps)?;
        let head_dim = h / config.num_attention_heads;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let l = vb.pp("encoder.layer").pp(i);
            let attn = l.pp("attention");
            let query =
                Dense::load(attn.pp("self.query"), h, h)?.scaled(1.0 / (head_dim as f64).sqrt())?;
            let key = Dense::load(attn.pp("self.key"), h, h)?;
            let value = Dense::load(attn.pp("self.value"), h, h)?;
            layers.push(Layer {
                qkv: Dense::fused(&[query, key, value])?,
                attention_out: Dense::load(attn.pp("output.dense"), h, h)?,
                attention_norm: layer_norm(attn.pp("output.LayerNorm"), h, config.layer_norm_eps)?,
                intermediate: Dense::load(l.pp("intermediate.dense"), h, config.intermediate_size)?,
                output: Dense::load(l.pp("output.dense"), config.intermediate_size, h)?,
                output_norm: layer_norm(l.pp("output.LayerNorm"), h, config.layer_norm_eps)?,
            });
        }
        Ok(Self {
            config,
            words,
            positions,
            token_type,
            embedding_norm,
            layers,
        })
    }

    fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        shape: (usize, usize),
        mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = shape;
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let d = h / heads;
        let qkv = layer.qkv.forward(x)?;
        let split = |i: usize| {
            qkv.narrow(1, i * h, h)?
                .reshape((b, t, heads, d))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let mut scores = q.matmul(&k.t()?)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
        let context = probs.matmul(&v)?.transpose(1, 2)?.reshape((b * t, h))?;
        let attended = layer
            .attention_norm
            .forward(&(layer.attention_out.forward(&context)? + x)?)?;
        let hidden = layer.intermediate.forward(&attended)?.gelu_erf()?;
        layer
            .output_norm
            .forward(&(layer.output.forward(&hidden)? + attended)?)
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

    /// Word embeddings `[vocab, h]`, position embeddings `[positions, h]`, the token type 0
    /// embedding `[h]` and the embedding layer norm.
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
        let h = self.config.hidden_size;
        let dtype = self.positions.dtype();
        let embedded = self
            .words
            .forward(ids)?
            .broadcast_add(&self.positions.narrow(0, 0, t)?)?
            .broadcast_add(&self.token_type)?;
        let mut x = self
            .embedding_norm
            .forward(&embedded)?
            .reshape((b * t, h))?;
        let padded = mask.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()? < (b * t) as f64;
        let additive = if padded {
            let keep = mask.to_dtype(dtype)?;
            let blocked = ((keep.ones_like()? - keep)? * f64::from(f32::MIN))?;
            Some(blocked.reshape((b, 1, 1, t))?)
        } else {
            None
        };
        for layer in &self.layers {
            x = self.layer(layer, &x, (b, t), additive.as_ref())?;
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
