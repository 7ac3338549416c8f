//! A Llama-family decoder on a candle device: the GPU path, and the path for safetensors
//! checkpoints and architectures the quantised CPU kernels do not take (Qwen2's attention
//! biases, Qwen3's per-head query and key norms).
//!
//! The same ragged batch as the quantised CPU model (`quantised_llama.rs`): a step is a list of rows, each one token of one
//! sequence at its own position. Every linear layer takes all rows as one matrix (one cuBLAS
//! call on a GPU); attention batches the decoding sequences together (one row each, their
//! keys padded to the longest and masked) and runs each prefilling sequence on its own.
//!
//! Weights are dense tensors in the model's dtype (bf16 or f16 on a GPU, f32 on the CPU), or
//! a GGUF file's quantised blocks kept as they are (candle's quantised matmul, activations in
//! f32). The KV cache ([`DenseKv`]) is one tensor per layer and side, all slots at one
//! capacity that doubles when a sequence needs more, up to the context.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};

use super::decoder::{LlamaConfig, NextToken, RopeStyle, Row};
use super::device_ops::{CacheRows, argmax_rows, write_rows};
use super::step_profile::{Phase, PhaseClock};
use crate::ModelError;

/// A linear layer's weight (`out x in`).
pub enum DenseLinear {
    /// In the model's dtype.
    Dense(Tensor),
    /// Quantised blocks as the GGUF file has them; activations go through f32.
    Quantised(QMatMul),
}

impl DenseLinear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(w) => x.matmul(&w.t()?),
            Self::Quantised(w) => w.forward(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype()),
        }
    }
}

/// One decoder layer's weights.
pub struct DenseLayer {
    /// RMSNorm before attention.
    pub attn_norm: Tensor,
    /// Query projection.
    pub wq: DenseLinear,
    /// Key projection.
    pub wk: DenseLinear,
    /// Value projection.
    pub wv: DenseLinear,
    /// Attention output projection.
    pub wo: DenseLinear,
    /// Qwen2's attention biases.
    pub q_bias: Option<Tensor>,
    /// Qwen2's key bias.
    pub k_bias: Option<Tensor>,
    /// Qwen2's value bias.
    pub v_bias: Option<Tensor>,
    /// Qwen3's RMSNorms of each head's query and key (`head_dim` weights).
    pub q_norm: Option<Tensor>,
    /// Qwen3's key RMSNorm.
    pub k_norm: Option<Tensor>,
    /// RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// SwiGLU gate projection.
    pub w_gate: DenseLinear,
    /// SwiGLU up projection.
    pub w_up: DenseLinear,
    /// MLP down projection.
    pub w_down: DenseLinear,
}

/// The whole model on its device.
pub struct DenseLlama {
    /// The model's shape.
    pub config: LlamaConfig,
    /// Where its weights are.
    pub device: Device,
    /// The activations' dtype.
    pub dtype: DType,
    /// `vocab x hidden`.
    pub embedding: Tensor,
    /// The decoder layers, in order.
    pub layers: Vec<DenseLayer>,
    /// RMSNorm after the last layer.
    pub output_norm: Tensor,
    /// The logits projection (`vocab x hidden`; the embedding where tied).
    pub lm_head: DenseLinear,
}

/// The KV caches of all slots: per layer, keys and values as `(slots * capacity) x kv_dim`,
/// slot `s`'s position `p` at row `s * capacity + p`.
pub struct DenseKv {
    slots: usize,
    capacity: usize,
    context: usize,
    kv_dim: usize,
    layers: usize,
    device: Device,
    dtype: DType,
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
}

/// Capacity a cache starts with when first used.
const FIRST_CAPACITY: usize = 64;

impl DenseKv {
    /// Empty caches for `slots` sequences of `model`.
    pub fn new(model: &DenseLlama, slots: usize) -> Self {
        Self {
            slots: slots.max(1),
            capacity: 0,
            context: model.config.context,
            kv_dim: model.config.kv_dim(),
            layers: model.config.layers,
            device: model.device.clone(),
            dtype: model.dtype,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Grows every slot to hold positions `0..len` (doubling, at most the context).
    fn reserve(&mut self, len: usize) -> candle_core::Result<()> {
        if len <= self.capacity {
            return Ok(());
        }
        let capacity = len
            .next_power_of_two()
            .max(FIRST_CAPACITY)
            .min(self.context.max(len));
        let (slots, old, kv_dim) = (self.slots, self.capacity, self.kv_dim);
        // On the CPU a tensor is a plain allocation, which aborts the agent if the host
        // cannot give it: past the budget it is an out-of-memory error (fewer sequences are
        // tried). A GPU reports its own out-of-memory errors.
        if self.device.is_cpu() {
            let bytes = [
                slots,
                capacity,
                kv_dim,
                self.layers,
                2,
                self.dtype.size_in_bytes(),
            ]
            .into_iter()
            .try_fold(1u64, |total, n| total.checked_mul(n as u64));
            if let Err(error) = crate::memory::check_cache_size(
                "KV cache",
                bytes,
                crate::memory::cache_budget_bytes(),
            ) {
                // "out of memory" in the text: `ModelError::from` tells it apart.
                candle_core::bail!("out of memory: {error}");
            }
        }
        let grow = |side: Option<&Tensor>| -> candle_core::Result<Tensor> {
            let fresh = Tensor::zeros((slots, capacity - old, kv_dim), self.dtype, &self.device)?;
            let grown = match side {
                Some(side) => Tensor::cat(&[&side.reshape((slots, old, kv_dim))?, &fresh], 1)?,
                None => fresh,
            };
            grown.reshape((slots * capacity, kv_dim))
        };
        let mut keys = Vec::with_capacity(self.layers);
        let mut values = Vec::with_capacity(self.layers);
        for layer in 0..self.layers {
            keys.push(grow(self.keys.get(layer))?);
            values.push(grow(self.values.get(layer))?);
        }
        (self.keys, self.values, self.capacity) = (keys, values, capacity);
        Ok(())
    }

    /// The bytes the cache holds now.
    pub fn bytes(&self) -> usize {
        2 * self.layers * self.slots * self.capacity * self.kv_dim * self.dtype.size_in_bytes()
    }
}

/// Where each row's key and value go in a layer's cache.
fn cache_rows(rows: &[Row], kv: &DenseKv) -> candle_core::Result<CacheRows> {
    let at: Vec<u32> = rows
        .iter()
        .map(|r| (r.slot * kv.capacity + r.pos) as u32)
        .collect();
    CacheRows::new(at, kv.kv_dim, &kv.device)
}

/// Rows of one step grouped for attention: the decoding sequences together, each
/// prefilling sequence alone.
#[derive(Debug)]
struct AttentionGroups {
    /// `(row index, slot, position)` of each decode row (a sequence's only row this step).
    decode: Vec<(usize, usize, usize)>,
    /// `(first row, rows, slot, first position)` of each sequence with several rows.
    prefill: Vec<(usize, usize, usize, usize)>,
}

fn group_rows(rows: &[Row]) -> AttentionGroups {
    let mut groups = AttentionGroups {
        decode: Vec::new(),
        prefill: Vec::new(),
    };
    let mut start = 0;
    while start < rows.len() {
        let slot = rows[start].slot;
        let end = (start..rows.len())
            .find(|&i| rows[i].slot != slot)
            .unwrap_or(rows.len());
        if end - start == 1 {
            groups.decode.push((start, slot, rows[start].pos));
        } else {
            groups
                .prefill
                .push((start, end - start, slot, rows[start].pos));
        }
        start = end;
    }
    groups
}

/// The step's `(cos, sin)` per row and pair of head dimensions, in `dtype`.
fn rotations(
    config: &LlamaConfig,
    rows: &[Row],
    device: &Device,
    dtype: DType,
) -> candle_core::Result<(Tensor, Tensor)> {
    let freqs = config.rope_frequencies();
    let half = freqs.len();
    let (mut cos, mut sin) = (
        Vec::with_capacity(rows.len() * half),
        Vec::with_capacity(rows.len() * half),
    );
    for row in rows {
        for f in &freqs {
            let (s, c) = (row.pos as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    let cos = Tensor::from_vec(cos, (rows.len(), half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (rows.len(), half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// Rotates `x` (`1 x heads x rows x head_dim`).
fn rope(style: RopeStyle, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    match style {
        RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin),
        RopeStyle::Halves => candle_nn::rotary_emb::rope(x, cos, sin),
    }
}

/// An additive mask: 0 where `allowed(row, key)`, minus infinity elsewhere.
fn mask(
    rows: usize,
    keys: usize,
    allowed: impl Fn(usize, usize) -> bool,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let values: Vec<f32> = (0..rows * keys)
        .map(|i| {
            if allowed(i / keys, i % keys) {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_vec(values, (rows, keys), device)
}

impl DenseLlama {
    /// Runs one step over `rows` (each sequence's rows together, in position order), writing
    /// their keys and values into `kv`; returns the logits of each row that asked for them.
    /// `clock` hears each phase of the step ([`PhaseClock::off`] when nobody profiles).
    pub fn forward(
        &self,
        rows: &[Row],
        kv: &mut DenseKv,
        clock: &mut PhaseClock,
    ) -> Result<Vec<NextToken>, ModelError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        self.forward_tensors(rows, kv, clock)
            .map_err(ModelError::from_candle)
    }

    fn forward_tensors(
        &self,
        rows: &[Row],
        kv: &mut DenseKv,
        clock: &mut PhaseClock,
    ) -> candle_core::Result<Vec<NextToken>> {
        let c = &self.config;
        let n = rows.len();
        if let Some(row) = rows.iter().find(|r| r.token as usize >= c.vocab) {
            candle_core::bail!(
                "token {} is outside the vocabulary of {}",
                row.token,
                c.vocab
            );
        }
        kv.reserve(rows.iter().map(|r| r.pos + 1).max().unwrap_or(1))?;
        let ids: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let ids = Tensor::from_vec(ids, n, &self.device)?;
        let (cos, sin) = rotations(c, rows, &self.device, self.dtype)?;
        let at = cache_rows(rows, kv)?;
        let plan = plan_attention(rows, c.heads / c.kv_heads, &self.device)?;
        clock.lap(Phase::HostPrepare)?;
        let mut x = self.embedding.index_select(&ids, 0)?;
        clock.lap(Phase::Embed)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, c.rms_eps)?;
            clock.lap(Phase::Norms)?;
            let q = with_bias(layer.wq.forward(&h)?, &layer.q_bias)?;
            let k = with_bias(layer.wk.forward(&h)?, &layer.k_bias)?;
            let v = with_bias(layer.wv.forward(&h)?, &layer.v_bias)?;
            clock.lap(Phase::QkvProjection)?;
            let q = self.heads_rotated(&q, c.heads, &layer.q_norm, &cos, &sin)?;
            let k = self.heads_rotated(&k, c.kv_heads, &layer.k_norm, &cos, &sin)?;
            clock.lap(Phase::HeadsAndRope)?;
            write_rows(&kv.keys[index], &k.reshape((n, c.kv_dim()))?, &at)?;
            write_rows(&kv.values[index], &v, &at)?;
            clock.lap(Phase::KvWrite)?;
            let attended = self.attend(&q, kv, index, &plan)?;
            clock.lap(Phase::Attention)?;
            x = (x + layer.wo.forward(&attended)?)?;
            clock.lap(Phase::OutProjection)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, c.rms_eps)?;
            clock.lap(Phase::Norms)?;
            let gate = layer.w_gate.forward(&h)?.silu()?;
            let up = layer.w_up.forward(&h)?;
            x = (x + layer.w_down.forward(&(gate * up)?)?)?;
            clock.lap(Phase::Mlp)?;
        }
        let wanted: Vec<&Row> = rows.iter().filter(|r| r.logits).collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let picked: Vec<u32> = (0..n as u32).filter(|&i| rows[i as usize].logits).collect();
        let picked = Tensor::from_vec(picked, wanted.len(), &self.device)?;
        let x = x.index_select(&picked, 0)?;
        let x = candle_nn::ops::rms_norm(&x, &self.output_norm, c.rms_eps)?;
        clock.lap(Phase::Norms)?;
        let logits = self.lm_head.forward(&x)?;
        clock.lap(Phase::LmHead)?;
        let out = self.next_tokens(&logits, &wanted)?;
        clock.lap(Phase::LogitsToHost)?;
        Ok(out)
    }

    /// Each wanted row's result from its logits (`wanted x vocab`): the argmax of greedy
    /// rows, taken on the device, and the logits (f32, on the host) of the others. Only what
    /// the host needs crosses to it.
    fn next_tokens(&self, logits: &Tensor, wanted: &[&Row]) -> candle_core::Result<Vec<NextToken>> {
        let greedy: Vec<u32> = (0..wanted.len() as u32)
            .filter(|&i| wanted[i as usize].greedy)
            .collect();
        let full: Vec<u32> = (0..wanted.len() as u32)
            .filter(|&i| !wanted[i as usize].greedy)
            .collect();
        let pick = |ids: &[u32]| -> candle_core::Result<Tensor> {
            match ids.len() == wanted.len() {
                true => Ok(logits.clone()),
                false => logits.index_select(&Tensor::new(ids, &self.device)?, 0),
            }
        };
        let mut greedy_tokens = match greedy.is_empty() {
            true => Vec::new(),
            false => argmax_rows(&pick(&greedy)?)?,
        }
        .into_iter();
        let mut full_logits = match full.is_empty() {
            true => Vec::new(),
            false => pick(&full)?.to_dtype(DType::F32)?.to_vec2::<f32>()?,
        }
        .into_iter();
        Ok(wanted
            .iter()
            .map(|row| match row.greedy {
                true => NextToken::Greedy(greedy_tokens.next().expect("one per greedy row")),
                false => NextToken::Logits(full_logits.next().expect("one per other row")),
            })
            .collect())
    }

    /// `x` (`rows x heads*head_dim`) as `rows x heads x head_dim`, each head normed (Qwen3)
    /// and rotated.
    fn heads_rotated(
        &self,
        x: &Tensor,
        heads: usize,
        norm: &Option<Tensor>,
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (n, hd) = (x.dim(0)?, self.config.head_dim);
        let mut x = x.reshape((n, heads, hd))?;
        if let Some(norm) = norm {
            x = candle_nn::ops::rms_norm(&x.contiguous()?, norm, self.config.rms_eps)?;
        }
        let x = x.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let x = rope(self.config.rope, &x, cos, sin)?;
        x.squeeze(0)?.transpose(0, 1)?.contiguous()
    }

    /// Each row's attention output (`rows x hidden`), from its queries `q` (`rows x heads x
    /// head_dim`) over its sequence's cache in `layer`.
    fn attend(
        &self,
        q: &Tensor,
        kv: &DenseKv,
        layer: usize,
        plan: &AttentionPlan,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let (kvh, hd, group) = (c.kv_heads, c.head_dim, c.heads / c.kv_heads);
        let scale = 1.0 / (hd as f64).sqrt();
        let keys = kv.keys[layer].reshape((kv.slots, kv.capacity, kvh, hd))?;
        let values = kv.values[layer].reshape((kv.slots, kv.capacity, kvh, hd))?;
        let mut pieces: Vec<Tensor> = Vec::new();
        if let Some(decode) = &plan.decode {
            let gather = |side: &Tensor| -> candle_core::Result<Tensor> {
                // index_select wants its source contiguous: the whole slots first.
                side.index_select(&decode.slots, 0)?
                    .narrow(1, 0, decode.longest)?
                    .permute((0, 2, 1, 3))?
                    .contiguous()
            };
            let (k, v) = (gather(&keys)?, gather(&values)?);
            let b = decode.count;
            let q_rows = q
                .index_select(&decode.rows, 0)?
                .reshape((b, kvh, group, hd))?;
            let out = attention_core(&q_rows, &k, &v, &decode.mask, scale)?;
            pieces.push(out.reshape((b, c.heads * hd))?);
        }
        for seq in &plan.prefill {
            let pick = |side: &Tensor| -> candle_core::Result<Tensor> {
                side.narrow(0, seq.slot, 1)?
                    .narrow(1, 0, seq.len)?
                    .permute((0, 2, 1, 3))?
                    .contiguous()
            };
            let (k, v) = (pick(&keys)?, pick(&values)?);
            let m = seq.rows;
            // rows x heads x hd -> 1 x kv_heads x (group * rows) x hd
            let q_rows =
                q.narrow(0, seq.first, m)?
                    .transpose(0, 1)?
                    .reshape((1, kvh, group * m, hd))?;
            let out = attention_core(&q_rows, &k, &v, &seq.mask, scale)?;
            let out = out
                .reshape((c.heads, m, hd))?
                .transpose(0, 1)?
                .reshape((m, c.heads * hd))?;
            pieces.push(out);
        }
        Tensor::cat(&pieces, 0)?.index_select(&plan.inverse, 0)
    }
}

/// The decoding sequences of a step, attended together.
struct DecodeBatch {
    count: usize,
    /// The longest sequence's length: keys are padded to it.
    longest: usize,
    /// Their rows in the step, and their slots (`count` each).
    rows: Tensor,
    slots: Tensor,
    /// `count x 1 x 1 x longest`: each sequence sees its own positions only.
    mask: Tensor,
}

/// A sequence prefilling several rows this step, attended alone.
struct PrefillSeq {
    first: usize,
    rows: usize,
    slot: usize,
    /// Keys it attends to: its cached positions and its rows.
    len: usize,
    /// `1 x 1 x (group * rows) x len`: causal within the rows.
    mask: Tensor,
}

/// How a step's rows are attended, on the device once for every layer.
struct AttentionPlan {
    decode: Option<DecodeBatch>,
    prefill: Vec<PrefillSeq>,
    /// Back to row order: the output of row `i` is row `inverse[i]` of the groups joined.
    inverse: Tensor,
}

fn plan_attention(
    rows: &[Row],
    group: usize,
    device: &Device,
) -> candle_core::Result<AttentionPlan> {
    let groups = group_rows(rows);
    let ids = |values: Vec<u32>| Tensor::from_vec(values.clone(), values.len(), device);
    let mut order: Vec<usize> = Vec::with_capacity(rows.len());
    let decode = match groups.decode.is_empty() {
        true => None,
        false => {
            let count = groups.decode.len();
            let longest = groups.decode.iter().map(|d| d.2 + 1).max().unwrap_or(1);
            let positions: Vec<usize> = groups.decode.iter().map(|d| d.2).collect();
            order.extend(groups.decode.iter().map(|d| d.0));
            Some(DecodeBatch {
                count,
                longest,
                rows: ids(groups.decode.iter().map(|d| d.0 as u32).collect())?,
                slots: ids(groups.decode.iter().map(|d| d.1 as u32).collect())?,
                mask: mask(count, longest, |i, j| j <= positions[i], device)?
                    .reshape((count, 1, 1, longest))?,
            })
        }
    };
    let mut prefill = Vec::with_capacity(groups.prefill.len());
    for &(first, m, slot, start) in &groups.prefill {
        let len = start + m;
        order.extend(first..first + m);
        prefill.push(PrefillSeq {
            first,
            rows: m,
            slot,
            len,
            mask: mask(m, len, |i, j| j <= start + i, device)?
                .unsqueeze(0)?
                .repeat((group, 1, 1))?
                .reshape((1, 1, group * m, len))?,
        });
    }
    let mut inverse = vec![0u32; rows.len()];
    for (at, &row) in order.iter().enumerate() {
        inverse[row] = at as u32;
    }
    Ok(AttentionPlan {
        decode,
        prefill,
        inverse: ids(inverse)?,
    })
}

/// `softmax(q k^T * scale + mask) v` for `q`: `b x kv_heads x r x hd`, `k`, `v`: `b x
/// kv_heads x len x hd`, `mask` broadcast to `b x kv_heads x r x len`; scores in f32.
fn attention_core(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let scores = (q.contiguous()?.matmul(&k.transpose(2, 3)?)? * scale)?.to_dtype(DType::F32)?;
    let scores = scores.broadcast_add(mask)?;
    let weights = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
    weights.matmul(v)
}

fn with_bias(x: Tensor, bias: &Option<Tensor>) -> candle_core::Result<Tensor> {
    match bias {
        Some(bias) => x.broadcast_add(bias),
        None => Ok(x),
    }
}

/// The weight names of a checkpoint: how one part of the model is called in its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Token embedding table.
    Embedding,
    /// RMSNorm after the last layer.
    OutputNorm,
    /// Logits projection.
    Output,
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Attention output projection.
    O,
    /// Query bias.
    QBias,
    /// Key bias.
    KBias,
    /// Value bias.
    VBias,
    /// Query RMSNorm.
    QNorm,
    /// Key RMSNorm.
    KNorm,
    /// RMSNorm before the MLP.
    FfnNorm,
    /// SwiGLU gate projection.
    Gate,
    /// SwiGLU up projection.
    Up,
    /// MLP down projection.
    Down,
}

impl Part {
    /// The part's tensor name in a GGUF file.
    pub fn gguf_name(self, layer: usize) -> String {
        let global = match self {
            Self::Embedding => Some("token_embd.weight"),
            Self::OutputNorm => Some("output_norm.weight"),
            Self::Output => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = global {
            return name.to_owned();
        }
        let part = match self {
            Self::AttnNorm => "attn_norm.weight",
            Self::Q => "attn_q.weight",
            Self::K => "attn_k.weight",
            Self::V => "attn_v.weight",
            Self::O => "attn_output.weight",
            Self::QBias => "attn_q.bias",
            Self::KBias => "attn_k.bias",
            Self::VBias => "attn_v.bias",
            Self::QNorm => "attn_q_norm.weight",
            Self::KNorm => "attn_k_norm.weight",
            Self::FfnNorm => "ffn_norm.weight",
            Self::Gate => "ffn_gate.weight",
            Self::Up => "ffn_up.weight",
            _ => "ffn_down.weight",
        };
        format!("blk.{layer}.{part}")
    }

    /// The part's tensor name in a Hugging Face safetensors checkpoint.
    pub fn hf_name(self, layer: usize) -> String {
        let global = match self {
            Self::Embedding => Some("model.embed_tokens.weight"),
            Self::OutputNorm => Some("model.norm.weight"),
            Self::Output => Some("lm_head.weight"),
            _ => None,
        };
        if let Some(name) = global {
            return name.to_owned();
        }
        let part = match self {
            Self::AttnNorm => "input_layernorm.weight",
            Self::Q => "self_attn.q_proj.weight",
            Self::K => "self_attn.k_proj.weight",
            Self::V => "self_attn.v_proj.weight",
            Self::O => "self_attn.o_proj.weight",
            Self::QBias => "self_attn.q_proj.bias",
            Self::KBias => "self_attn.k_proj.bias",
            Self::VBias => "self_attn.v_proj.bias",
            Self::QNorm => "self_attn.q_norm.weight",
            Self::KNorm => "self_attn.k_norm.weight",
            Self::FfnNorm => "post_attention_layernorm.weight",
            Self::Gate => "mlp.gate_proj.weight",
            Self::Up => "mlp.up_proj.weight",
            _ => "mlp.down_proj.weight",
        };
        format!("model.layers.{layer}.{part}")
    }
}

/// Where a checkpoint's weights come from: a tensor by part, or `None` when the file has
/// no such tensor (optional parts: biases, norms, an untied output).
pub trait WeightSource {
    /// A vector or a matrix to hold dense, in `dtype`, on `device`.
    fn dense(&mut self, part: Part, layer: usize) -> Result<Option<Tensor>, ModelError>;
    /// A matrix for a linear layer.
    fn linear(&mut self, part: Part, layer: usize) -> Result<Option<DenseLinear>, ModelError>;
}

/// Builds the model from `source`.
pub fn build(
    config: LlamaConfig,
    source: &mut dyn WeightSource,
    device: Device,
    dtype: DType,
) -> Result<DenseLlama, ModelError> {
    let missing = |part: Part, layer: usize| {
        ModelError::Load(format!(
            "the checkpoint has no `{}` (`{}`)",
            part.hf_name(layer),
            part.gguf_name(layer)
        ))
    };
    let need = |source: &mut dyn WeightSource, part: Part, layer: usize| {
        source
            .dense(part, layer)?
            .ok_or_else(|| missing(part, layer))
    };
    let mut layers = Vec::with_capacity(config.layers);
    for i in 0..config.layers {
        let linear = |source: &mut dyn WeightSource, part: Part| {
            source.linear(part, i)?.ok_or_else(|| missing(part, i))
        };
        layers.push(DenseLayer {
            attn_norm: need(source, Part::AttnNorm, i)?,
            wq: linear(source, Part::Q)?,
            wk: linear(source, Part::K)?,
            wv: linear(source, Part::V)?,
            wo: linear(source, Part::O)?,
            q_bias: source.dense(Part::QBias, i)?,
            k_bias: source.dense(Part::KBias, i)?,
            v_bias: source.dense(Part::VBias, i)?,
            q_norm: source.dense(Part::QNorm, i)?,
            k_norm: source.dense(Part::KNorm, i)?,
            ffn_norm: need(source, Part::FfnNorm, i)?,
            w_gate: linear(source, Part::Gate)?,
            w_up: linear(source, Part::Up)?,
            w_down: linear(source, Part::Down)?,
        });
    }
    let embedding = need(source, Part::Embedding, 0)?;
    let (vocab, hidden) = embedding.dims2().map_err(ModelError::from_candle)?;
    if (vocab, hidden) != (config.vocab, config.hidden) {
        return Err(ModelError::Load(format!(
            "the token embedding is {vocab} x {hidden}, not {} x {}",
            config.vocab, config.hidden
        )));
    }
    let lm_head = match source.linear(Part::Output, 0)? {
        Some(output) => output,
        // Tied embeddings.
        None => match source.linear(Part::Embedding, 0)? {
            Some(tied) => tied,
            None => DenseLinear::Dense(embedding.clone()),
        },
    };
    Ok(DenseLlama {
        output_norm: need(source, Part::OutputNorm, 0)?,
        config,
        device,
        dtype,
        embedding,
        layers,
        lm_head,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(slot: usize, pos: usize) -> Row {
        Row {
            slot,
            pos,
            token: 0,
            logits: false,
            greedy: false,
        }
    }

    /// A sequence with one row decodes; one with several prefills, wherever it sits.
    #[test]
    fn rows_group_into_decoders_and_prefilling_sequences() {
        let rows = [
            row(3, 40),
            row(1, 0),
            row(1, 1),
            row(1, 2),
            row(0, 7),
            row(2, 5),
            row(2, 6),
        ];
        let groups = group_rows(&rows);
        assert_eq!(groups.decode, vec![(0, 3, 40), (4, 0, 7)]);
        assert_eq!(groups.prefill, vec![(1, 3, 1, 0), (5, 2, 2, 5)]);
    }

    /// Joined as decoders first, then each prefill, the groups go back to row order.
    #[test]
    fn the_plan_puts_rows_back_in_order() {
        let rows = [row(3, 40), row(1, 0), row(1, 1), row(0, 7)];
        let plan = plan_attention(&rows, 3, &Device::Cpu).unwrap();
        let decode = plan.decode.as_ref().unwrap();
        assert_eq!((decode.count, decode.longest), (2, 41));
        assert_eq!(plan.prefill.len(), 1);
        assert_eq!(plan.prefill[0].mask.dims(), &[1, 1, 6, 2]);
        // Joined: [row 0, row 3, row 1, row 2]; row order takes joined 0, 2, 3, 1.
        assert_eq!(plan.inverse.to_vec1::<u32>().unwrap(), vec![0, 2, 3, 1]);
        let allowed: Vec<f32> = decode.mask.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(allowed[41 + 7], 0.0, "slot 0 sees position 7");
        assert_eq!(allowed[41 + 8], f32::NEG_INFINITY, "and not 8");
        assert_eq!(allowed[40], 0.0, "slot 3 sees position 40");
    }
}
