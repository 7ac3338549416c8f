//! A Llama-family decoder on a candle device: the GPU path, and the path for safetensors
//! checkpoints and architectures the quantised CPU kernels do not take (Qwen2's attention
//! biases, Qwen3's per-head query and key norms).
//!
//! The same ragged batch as the quantised CPU model (`quantised_llama.rs`): a step is a list
//! of rows, each one token of one sequence at its own position. Every linear layer takes all
//! rows as one matrix (one cuBLAS call on a GPU); attention takes every row in one call over
//! the paged cache (`paged_attention.rs`: each row its own positions, nothing padded).
//!
//! Weights are dense tensors in the model's dtype (bf16 or f16 on a GPU, f32 on the CPU), or
//! a GGUF file's quantised blocks kept as they are (candle's quantised matmul, activations in
//! f32). The KV cache ([`DenseKv`]) is paged: one tensor per layer and side holding blocks of
//! 16 positions, handed out by `kv_blocks.rs` (block tables, a prefix cache, copy on write).

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};

use super::attention_check::{self, HeadShape};
use super::decoder::{LlamaConfig, NextToken, Pick, Row};
use super::device_ops::{CacheRows, argmax_rows, listed_rows, write_rows};
use super::draw::{Draw, sample_rows};
use super::kv_blocks::{BLOCK_SIZE, BlockManager, OutOfBlocks};
use super::paged_attention::{
    AttentionKernel, Padding, PagedAttention, PagedRows, Tiling, paged_attention,
};
use super::rope_heads::{HeadsOut, RopeHeads, rope_heads};
use super::rope_table::RopeTable;
use super::step_profile::{Phase, PhaseClock};
use crate::ModelError;
use crate::embed::fused::{add_rms_norm, silu_mul_halves};

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

    /// The bytes its weight holds on the device.
    fn bytes(&self) -> u64 {
        match self {
            Self::Dense(w) => tensor_bytes(w),
            Self::Quantised(QMatMul::QTensor(q)) => q.storage_size_in_bytes() as u64,
            Self::Quantised(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => tensor_bytes(w),
        }
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

/// Projections of one input whose outputs sit side by side in one product's columns: one
/// matmul of their stacked weights where all are dense (fewer, larger kernels a step), else
/// one product each, concatenated.
pub enum Stacked {
    /// The weights' rows stacked (`sum of outs x in`).
    One(Tensor),
    /// Quantised weights, kept apart.
    Apart(Vec<DenseLinear>),
}

impl Stacked {
    fn new(parts: Vec<DenseLinear>) -> candle_core::Result<Self> {
        let dense: Vec<&Tensor> = parts
            .iter()
            .filter_map(|part| match part {
                DenseLinear::Dense(w) => Some(w),
                DenseLinear::Quantised(_) => None,
            })
            .collect();
        match dense.len() == parts.len() {
            true => Ok(Self::One(Tensor::cat(&dense, 0)?)),
            false => Ok(Self::Apart(parts)),
        }
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::One(w) => x.matmul(&w.t()?),
            Self::Apart(parts) => {
                let outs = parts
                    .iter()
                    .map(|part| part.forward(x))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&outs, 1)
            }
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Self::One(w) => tensor_bytes(w),
            Self::Apart(parts) => parts.iter().map(DenseLinear::bytes).sum(),
        }
    }
}

/// One decoder layer's weights.
pub struct DenseLayer {
    /// RMSNorm before attention.
    pub attn_norm: Tensor,
    /// Query, key and value projections, in that order.
    pub qkv: Stacked,
    /// Attention output projection.
    pub wo: DenseLinear,
    /// Qwen2's attention biases, query, key and value side by side (zeros for one the
    /// checkpoint lacks).
    pub qkv_bias: Option<Tensor>,
    /// Qwen3's RMSNorms of each head's query and key (`head_dim` weights).
    pub q_norm: Option<Tensor>,
    /// Qwen3's key RMSNorm.
    pub k_norm: Option<Tensor>,
    /// RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// SwiGLU gate and up projections, in that order.
    pub gate_up: Stacked,
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
    /// The GPU kernel of its attention ([`AttentionKernel::best`] unless set otherwise).
    pub attention: AttentionKernel,
    /// Each position's rotation, computed once.
    pub(crate) rope: RopeTable,
}

impl DenseLayer {
    fn bytes(&self) -> u64 {
        let optional = [&self.qkv_bias, &self.q_norm, &self.k_norm];
        let small: u64 = [&self.attn_norm, &self.ffn_norm]
            .into_iter()
            .chain(optional.into_iter().flatten())
            .map(tensor_bytes)
            .sum();
        small + self.qkv.bytes() + self.wo.bytes() + self.gate_up.bytes() + self.w_down.bytes()
    }
}

impl DenseLlama {
    /// The bytes its weights hold on its device (a tied LM head counted once).
    pub fn weight_bytes(&self) -> u64 {
        let lm_head = match &self.lm_head {
            DenseLinear::Dense(w) if w.id() == self.embedding.id() => 0,
            other => other.bytes(),
        };
        let layers: u64 = self.layers.iter().map(DenseLayer::bytes).sum();
        tensor_bytes(&self.embedding) + tensor_bytes(&self.output_norm) + layers + lm_head
    }
}

/// The paged KV cache of all slots: per layer, keys and values as `(blocks * BLOCK_SIZE) x
/// kv_dim`, block `b`'s position `i` at row `b * BLOCK_SIZE + i`; which blocks hold a
/// sequence's positions is the [`BlockManager`]'s business (tables, sharing, the prefix
/// cache). The tensors grow with the manager's pool (doubling, up to its limit), and hold one
/// block more, past the pool: the scratch block, which no sequence holds, for the rows a
/// step is padded with (a CUDA graph's fixed batch, `decode_graph.rs`).
pub struct DenseKv {
    blocks: BlockManager,
    /// How many times the tensors were made anew (each growth): what a CUDA graph captured
    /// against another epoch's tensors must not replay.
    epoch: u64,
    kv_dim: usize,
    layers: usize,
    device: Device,
    dtype: DType,
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
}

/// Why positions could not be reserved.
#[derive(Debug)]
pub enum ReserveError {
    /// Every block is held: a sequence must give its blocks up.
    OutOfBlocks(OutOfBlocks),
    /// The tensors could not grow or copy.
    Device(candle_core::Error),
}

impl From<candle_core::Error> for ReserveError {
    fn from(error: candle_core::Error) -> Self {
        Self::Device(error)
    }
}

impl DenseKv {
    /// Empty caches for `slots` sequences of `model`: a pool that may grow to every slot's
    /// whole context (what the actor checked against its memory at load).
    pub fn new(model: &DenseLlama, slots: usize) -> Self {
        let per_sequence = model.config.context.div_ceil(BLOCK_SIZE);
        Self::with_limit(model, slots, slots.max(1) * per_sequence.max(1))
    }

    /// Empty caches for `slots` sequences whose pool may grow to `limit` blocks: past it,
    /// sequences wait or are preempted.
    pub fn with_limit(model: &DenseLlama, slots: usize, limit: usize) -> Self {
        Self {
            blocks: BlockManager::new(BLOCK_SIZE, slots.max(1), limit),
            kv_dim: model.config.kv_dim(),
            layers: model.config.layers,
            device: model.device.clone(),
            dtype: model.dtype,
            epoch: 0,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Counts the tensors' growths: the tensors of one epoch stay where they are.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The blocks the tensors hold: the pool's and the scratch block (none before the first
    /// reservation).
    pub fn cache_blocks(&self) -> usize {
        self.keys.first().map_or(0, |k| k.dims()[0] / BLOCK_SIZE)
    }

    /// The scratch block (the last): padding rows write and read it, no sequence holds it.
    pub fn scratch_block(&self) -> u32 {
        self.cache_blocks().saturating_sub(1) as u32
    }

    /// The bookkeeping: tables, free blocks, the prefix cache.
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// Gives `slot` (empty) the cached blocks of the start of `tokens`; returns the
    /// positions already computed.
    pub fn share_prefix(&mut self, slot: usize, tokens: &[u32]) -> usize {
        self.blocks.share_prefix(slot, tokens)
    }

    /// Enters `slot`'s computed full blocks into the prefix cache.
    pub fn register(&mut self, slot: usize, tokens: &[u32], computed: usize) {
        self.blocks.register(slot, tokens, computed);
    }

    /// Frees `slot`'s blocks.
    pub fn release(&mut self, slot: usize) {
        self.blocks.release(slot);
    }

    /// Makes room for `slot` to write positions `start..end`: blocks taken, the pool's
    /// tensors grown, shared blocks copied.
    pub fn reserve(&mut self, slot: usize, start: usize, end: usize) -> Result<(), ReserveError> {
        let reservation = self
            .blocks
            .reserve(slot, start, end)
            .map_err(ReserveError::OutOfBlocks)?;
        if let Some(blocks) = reservation.grown_to {
            self.grow(blocks)?;
        }
        for copy in reservation.copies {
            let from = copy.from as usize * BLOCK_SIZE;
            let to: Vec<u32> = (0..BLOCK_SIZE as u32)
                .map(|i| copy.to * BLOCK_SIZE as u32 + i)
                .collect();
            let at = CacheRows::new(to, self.kv_dim, &self.device)?;
            for side in self.keys.iter().chain(&self.values) {
                write_rows(side, &side.narrow(0, from, BLOCK_SIZE)?, &at)?;
            }
        }
        Ok(())
    }

    /// Reserves every sequence's rows of a step (each sequence's rows together).
    pub(super) fn reserve_rows(&mut self, rows: &[Row]) -> candle_core::Result<()> {
        for seq in rows.chunk_by(|a, b| a.slot == b.slot) {
            let first = seq.iter().map(|r| r.pos).min().unwrap_or(0);
            let last = seq.iter().map(|r| r.pos + 1).max().unwrap_or(0);
            match self.reserve(seq[0].slot, first, last) {
                Ok(()) => {}
                // "out of memory" in the text: `ModelError::from` tells it apart.
                Err(ReserveError::OutOfBlocks(full)) => candle_core::bail!("out of memory: {full}"),
                Err(ReserveError::Device(error)) => return Err(error),
            }
        }
        Ok(())
    }

    /// Grows every layer's tensors to `blocks` blocks and the scratch block.
    fn grow(&mut self, blocks: usize) -> candle_core::Result<()> {
        let rows = (blocks + 1) * BLOCK_SIZE;
        let old = self.keys.first().map_or(Ok(0), |k| k.dim(0))?;
        // On the CPU a tensor is a plain allocation, which aborts the agent if the host
        // cannot give it: past the budget it is an out-of-memory error (fewer sequences are
        // tried). A GPU reports its own out-of-memory errors.
        if self.device.is_cpu() {
            let bytes = [
                rows,
                self.kv_dim,
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
                candle_core::bail!("out of memory: {error}");
            }
        }
        let grow = |side: Option<&Tensor>| -> candle_core::Result<Tensor> {
            let fresh = Tensor::zeros((rows - old, self.kv_dim), self.dtype, &self.device)?;
            match side {
                Some(side) => Tensor::cat(&[side, &fresh], 0),
                None => Ok(fresh),
            }
        };
        let mut keys = Vec::with_capacity(self.layers);
        let mut values = Vec::with_capacity(self.layers);
        for layer in 0..self.layers {
            keys.push(grow(self.keys.get(layer))?);
            values.push(grow(self.values.get(layer))?);
        }
        (self.keys, self.values) = (keys, values);
        self.epoch += 1;
        Ok(())
    }

    /// The bytes the cache holds now.
    pub fn bytes(&self) -> usize {
        2 * self.layers
            * self.cache_blocks()
            * BLOCK_SIZE
            * self.kv_dim
            * self.dtype.size_in_bytes()
    }
}

/// A step's inputs as the host makes them: each row's token, its rotation (`cos`, `sin`:
/// `rows x head_dim/2`, f32), the cache row its key and value go to, and the paged layout
/// attention reads. Padding rows (a CUDA graph's fixed batch) come last: token 0 at position
/// 0, written to and attending to the cache's scratch block.
pub struct HostInputs {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Cosines of each row's rotation angles.
    pub cos: Vec<f32>,
    /// Sines of the same.
    pub sin: Vec<f32>,
    /// Each row's cache row.
    pub at: Vec<u32>,
    /// Where each row reads its keys (host words, no device copy).
    pub layout: PagedRows,
}

/// A step's inputs on the model's device.
pub struct StepInputs {
    /// Token ids (u32, one a row).
    pub ids: Tensor,
    /// `rows x head_dim/2` (f32).
    pub cos: Tensor,
    /// `rows x head_dim/2` (f32).
    pub sin: Tensor,
    /// Where each row's key and value go.
    pub at: CacheRows,
    /// Where each row reads its keys.
    pub layout: PagedRows,
}

impl HostInputs {
    /// The rows of the step.
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    /// Fresh tensors of these inputs on `device` (a model of `kv_dim`-wide cache rows).
    pub fn upload(self, device: &Device, kv_dim: usize) -> candle_core::Result<StepInputs> {
        let n = self.rows();
        let half = self.cos.len() / n.max(1);
        let layout = match device.is_cpu() {
            true => self.layout,
            false => {
                let words = self.layout.words();
                let words = Tensor::from_slice(words, words.len(), device)?;
                self.layout.with_device_words(words)
            }
        };
        Ok(StepInputs {
            ids: Tensor::from_slice(&self.ids, n, device)?,
            cos: Tensor::from_slice(&self.cos, (n, half), device)?,
            sin: Tensor::from_slice(&self.sin, (n, half), device)?,
            at: CacheRows::new(self.at, kv_dim, device)?,
            layout,
        })
    }
}

/// What every layer of one step shares: the rows' rotations, cache rows and paged layout.
struct LayerStep<'a> {
    cos: &'a Tensor,
    sin: &'a Tensor,
    at: &'a CacheRows,
    layout: &'a PagedRows,
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
        self.check_tokens(rows)?;
        kv.reserve_rows(rows)?;
        let inputs = self.host_inputs(rows, 0, kv)?;
        let inputs = inputs.upload(&self.device, kv.kv_dim)?;
        clock.lap(Phase::HostPrepare)?;
        let h = self.hidden_states(&inputs, kv, clock)?;
        let wanted: Vec<&Row> = rows.iter().filter(|r| r.logits).collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let x = match wanted.len() == rows.len() {
            true => h,
            false => {
                let picked: Vec<u32> = (0..rows.len() as u32)
                    .filter(|&i| rows[i as usize].logits)
                    .collect();
                h.index_select(&Tensor::from_vec(picked, wanted.len(), &self.device)?, 0)?
            }
        };
        let logits = self.lm_head.forward(&x)?;
        clock.lap(Phase::LmHead)?;
        let out = self.next_tokens(&logits, &wanted)?;
        clock.lap(Phase::LogitsToHost)?;
        Ok(out)
    }

    /// Refuses a row whose token is outside the vocabulary (the embedding lookup trusts it).
    pub fn check_tokens(&self, rows: &[Row]) -> candle_core::Result<()> {
        match rows.iter().find(|r| r.token as usize >= self.config.vocab) {
            Some(row) => candle_core::bail!(
                "token {} is outside the vocabulary of {}",
                row.token,
                self.config.vocab
            ),
            None => Ok(()),
        }
    }

    /// The inputs of `rows` (reserved in `kv`) and `padding` rows after them.
    pub fn host_inputs(
        &self,
        rows: &[Row],
        padding: usize,
        kv: &DenseKv,
    ) -> candle_core::Result<HostInputs> {
        let c = &self.config;
        let n = rows.len() + padding;
        let half = c.head_dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        let positions = rows
            .iter()
            .map(|r| r.pos)
            .chain(std::iter::repeat_n(0, padding));
        self.rope.extend(positions, &mut cos, &mut sin);
        let scratch = kv.scratch_block();
        let pad = Padding {
            rows: padding,
            block: scratch,
        };
        let mut at: Vec<u32> = rows
            .iter()
            .map(|r| kv.blocks.row_of(r.slot, r.pos) as u32)
            .collect();
        at.resize(n, scratch * BLOCK_SIZE as u32);
        let mut ids: Vec<u32> = rows.iter().map(|r| r.token).collect();
        ids.resize(n, 0);
        let tiling = Tiling {
            group: c.heads / c.kv_heads,
            kernel: self.attention,
        };
        Ok(HostInputs {
            ids,
            cos,
            sin,
            at,
            layout: PagedRows::padded(rows, &kv.blocks, tiling, pad, None)?,
        })
    }

    /// Every row of `inputs` through the layers, keys and values written into `kv`: the last
    /// layer's output normed by the output norm (`rows x hidden`), what the LM head takes.
    pub fn hidden_states(
        &self,
        inputs: &StepInputs,
        kv: &DenseKv,
        clock: &mut PhaseClock,
    ) -> candle_core::Result<Tensor> {
        let mut x = self.embedding.index_select(&inputs.ids, 0)?;
        clock.lap(Phase::Embed)?;
        let c = &self.config;
        let mut h = candle_nn::ops::rms_norm(&x, &self.layers[0].attn_norm, c.rms_eps)?;
        clock.lap(Phase::Norms)?;
        let step = LayerStep {
            cos: &inputs.cos,
            sin: &inputs.sin,
            at: &inputs.at,
            layout: &inputs.layout,
        };
        for index in 0..self.layers.len() {
            (x, h) = self.layer(index, &x, &h, kv, &step, clock)?;
        }
        // `h` is every row normed by the output norm (the last layer's fused add and norm).
        Ok(h)
    }

    /// The logits of `h`'s rows (`rows x vocab`, the model's dtype).
    pub fn lm_head(&self, h: &Tensor) -> candle_core::Result<Tensor> {
        self.lm_head.forward(h)
    }

    /// Layer `index` over the step's residual stream `x`, whose rows `h` are normed by the
    /// layer's attention norm: the new stream, and its rows normed by the next layer's
    /// attention norm (the output norm after the last layer). Each residual add and the norm
    /// after it are one op (`add_rms_norm`).
    fn layer(
        &self,
        index: usize,
        x: &Tensor,
        h: &Tensor,
        kv: &DenseKv,
        step: &LayerStep,
        clock: &mut PhaseClock,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (c, layer) = (&self.config, &self.layers[index]);
        let n = x.dim(0)?;
        let qkv = with_bias(layer.qkv.forward(h)?, &layer.qkv_bias)?;
        clock.lap(Phase::QkvProjection)?;
        let q_dim = c.heads * c.head_dim;
        let q = self.heads_rotated(&qkv, (c.heads, 0), &layer.q_norm, step)?;
        let k = self.heads_rotated(&qkv, (c.kv_heads, q_dim), &layer.k_norm, step)?;
        clock.lap(Phase::HeadsAndRope)?;
        write_rows(&kv.keys[index], &k.reshape((n, c.kv_dim()))?, step.at)?;
        let v = qkv.narrow(1, q_dim + c.kv_dim(), c.kv_dim())?;
        write_rows(&kv.values[index], &v, step.at)?;
        clock.lap(Phase::KvWrite)?;
        let attended = paged_attention(
            &q,
            &kv.keys[index],
            &kv.values[index],
            &PagedAttention {
                layout: step.layout,
                heads: c.heads,
                kv_heads: c.kv_heads,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            },
        )?;
        clock.lap(Phase::Attention)?;
        let out = layer.wo.forward(&attended)?;
        clock.lap(Phase::OutProjection)?;
        let (x, h) = add_rms_norm(x, &out, &layer.ffn_norm, c.rms_eps)?;
        clock.lap(Phase::Norms)?;
        let gate_up = layer.gate_up.forward(&h)?;
        let down = layer.w_down.forward(&silu_mul_halves(&gate_up)?)?;
        clock.lap(Phase::Mlp)?;
        let next_norm = match self.layers.get(index + 1) {
            Some(next) => &next.attn_norm,
            None => &self.output_norm,
        };
        let normed = add_rms_norm(&x, &down, next_norm, c.rms_eps)?;
        clock.lap(Phase::Norms)?;
        Ok(normed)
    }

    /// Each wanted row's result from its logits (`wanted x vocab`), as its `Pick` asks:
    /// greedy rows' argmax and sampled rows' draws taken on the device, scored and listed
    /// rows' log-probabilities and top tokens too (`device_ops::listed_rows`), the logits (f32, on the
    /// host) of the others. Only what the host needs crosses to it.
    pub fn next_tokens(
        &self,
        logits: &Tensor,
        wanted: &[&Row],
    ) -> candle_core::Result<Vec<NextToken>> {
        let of = |pick: fn(&Pick) -> bool| -> Vec<u32> {
            (0..wanted.len() as u32)
                .filter(|&i| pick(&wanted[i as usize].pick))
                .collect()
        };
        let greedy = of(|pick| chosen_by(pick) == Some(None));
        let drawn = of(|pick| matches!(chosen_by(pick), Some(Some(_))));
        let full = of(|pick| matches!(pick, Pick::Logits));
        let listed = of(|pick| matches!(pick, Pick::Score { .. } | Pick::Listed { .. }));
        let pick = |ids: &[u32]| -> candle_core::Result<Tensor> {
            match ids.len() == wanted.len() {
                true => Ok(logits.clone()),
                false => logits.index_select(&Tensor::new(ids, &self.device)?, 0),
            }
        };
        let draws: Vec<Draw> = wanted
            .iter()
            .filter_map(|row| chosen_by(&row.pick)?)
            .collect();
        let mut greedy_tokens = of_rows(&greedy, || argmax_rows(&pick(&greedy)?))?;
        let mut drawn_tokens = of_rows(&drawn, || sample_rows(&pick(&drawn)?, &draws))?;
        // Each row's token: the one chosen, the one scored, or none (logits).
        let tokens: Vec<Option<u32>> = wanted
            .iter()
            .map(|row| match (row.pick, chosen_by(&row.pick)) {
                (Pick::Score { target, .. }, _) => Some(target),
                (_, Some(None)) => greedy_tokens.next(),
                (_, Some(Some(_))) => drawn_tokens.next(),
                (_, None) => None,
            })
            .collect();
        let top_of = |pick: &Pick| match *pick {
            Pick::Score { top, .. } | Pick::Listed { top, .. } => top,
            _ => 0,
        };
        let listed_tokens: Vec<u32> = listed.iter().filter_map(|&i| tokens[i as usize]).collect();
        let most = wanted
            .iter()
            .map(|row| top_of(&row.pick))
            .max()
            .unwrap_or(0);
        let mut listings = of_rows(&listed, || {
            listed_rows(&pick(&listed)?, &listed_tokens, most)
        })?;
        let mut full_logits = of_rows(&full, || {
            pick(&full)?.to_dtype(DType::F32)?.to_vec2::<f32>()
        })?;
        Ok(wanted
            .iter()
            .zip(tokens)
            .map(|(row, token)| match row.pick {
                Pick::Greedy | Pick::Draw(_) => NextToken::Chosen(token.expect("chosen")),
                Pick::Logits => NextToken::Logits(full_logits.next().expect("one an other row")),
                Pick::Score { top, .. } | Pick::Listed { top, .. } => {
                    let mut listing = listings.next().expect("one a listed row");
                    listing.logprob.top.truncate(top);
                    NextToken::Listed {
                        greedy: listing.best == listing.logprob.token,
                        logprob: listing.logprob,
                    }
                }
            })
            .collect())
    }

    /// `heads` heads of `qkv`'s rows from column `first_column` as `rows x heads x
    /// head_dim`, each head normed (Qwen3) and rotated, in one pass (`rope_heads.rs`).
    fn heads_rotated(
        &self,
        qkv: &Tensor,
        (heads, first_column): (usize, usize),
        norm: &Option<Tensor>,
        step: &LayerStep,
    ) -> candle_core::Result<Tensor> {
        let op = RopeHeads {
            heads,
            head_dim: self.config.head_dim,
            first_column,
            style: self.config.rope,
            norm: norm.as_ref().map(|w| (w, f64::from(self.config.rms_eps))),
            out: HeadsOut::Rows,
        };
        rope_heads(qkv, step.cos, step.sin, &op)
    }
}

/// How a row's token is chosen where the logits are: `Some(None)` the argmax, `Some(draw)`
/// a draw, `None` not there (its logits go to the host, or it scores a known token).
fn chosen_by(pick: &Pick) -> Option<Option<Draw>> {
    match *pick {
        Pick::Greedy | Pick::Listed { draw: None, .. } => Some(None),
        Pick::Draw(draw)
        | Pick::Listed {
            draw: Some(draw), ..
        } => Some(Some(draw)),
        Pick::Logits | Pick::Score { .. } => None,
    }
}

/// `rows()`'s answers for the step's rows `ids` of one kind, one each in order; nothing
/// run when the step has none of that kind.
fn of_rows<T>(
    ids: &[u32],
    rows: impl FnOnce() -> candle_core::Result<Vec<T>>,
) -> candle_core::Result<std::vec::IntoIter<T>> {
    Ok(match ids.is_empty() {
        true => Vec::new(),
        false => rows()?,
    }
    .into_iter())
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
    /// Whether [`WeightSource::linear`] gives the file's quantised blocks (not the dense
    /// tensor [`WeightSource::dense`] gives).
    fn keeps_quantised(&self) -> bool {
        false
    }
}

fn stacked(parts: Vec<DenseLinear>) -> Result<Stacked, ModelError> {
    Stacked::new(parts).map_err(ModelError::from_candle)
}

/// The query, key and value biases side by side, as the fused QKV product's columns: `None`
/// when the checkpoint has none, zeros for one it lacks.
fn qkv_bias(
    source: &mut dyn WeightSource,
    config: &LlamaConfig,
    layer: usize,
) -> Result<Option<Tensor>, ModelError> {
    let parts = [
        (Part::QBias, config.heads * config.head_dim),
        (Part::KBias, config.kv_dim()),
        (Part::VBias, config.kv_dim()),
    ];
    let mut found = Vec::new();
    for (part, width) in parts {
        found.push((source.dense(part, layer)?, width));
    }
    let Some(like) = found.iter().find_map(|(bias, _)| bias.clone()) else {
        return Ok(None);
    };
    let biases = found
        .into_iter()
        .map(|(bias, width)| match bias {
            Some(bias) => Ok(bias),
            None => Tensor::zeros(width, like.dtype(), like.device()),
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(ModelError::from_candle)?;
    Tensor::cat(&biases, 0)
        .map(Some)
        .map_err(ModelError::from_candle)
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
            qkv: stacked(vec![
                linear(source, Part::Q)?,
                linear(source, Part::K)?,
                linear(source, Part::V)?,
            ])?,
            wo: linear(source, Part::O)?,
            qkv_bias: qkv_bias(source, &config, i)?,
            q_norm: source.dense(Part::QNorm, i)?,
            k_norm: source.dense(Part::KNorm, i)?,
            ffn_norm: need(source, Part::FfnNorm, i)?,
            gate_up: stacked(vec![linear(source, Part::Gate)?, linear(source, Part::Up)?])?,
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
    // Tied embeddings: the embedding itself (loading it again held it twice on the device:
    // 272 MB of Qwen2.5-0.5B's bf16), or the file's quantised blocks where the products
    // keep them (the lookup takes the dense copy either way).
    let lm_head = match source.linear(Part::Output, 0)? {
        Some(output) => output,
        None if source.keeps_quantised() => source
            .linear(Part::Embedding, 0)?
            .unwrap_or_else(|| DenseLinear::Dense(embedding.clone())),
        None => DenseLinear::Dense(embedding.clone()),
    };
    Ok(DenseLlama {
        rope: RopeTable::new(config.rope_frequencies()),
        output_norm: need(source, Part::OutputNorm, 0)?,
        attention: attention_check::checked_kernel(&device, dtype, HeadShape::of(&config), None)?,
        config,
        device,
        dtype,
        embedding,
        layers,
        lm_head,
    })
}
