//! The BERT forward for CPU in f32, on plain slices instead of tensors. Against the tensor
//! version of the same model ([`FastBert`]) it
//! - packs the batch's tokens without padding, so no attention mask and no wasted rows;
//! - runs attention per sequence and head straight from the fused QKV rows (strided matrix
//!   multiplies, no transposes or copies) with the scores of one head in L2;
//! - folds each bias and residual into the multiply's output before it runs, so no separate
//!   add passes;
//! - runs everything after attention (output projection, layer norm, feed-forward, GELU,
//!   layer norm) in blocks of rows, so the 4x wide intermediate stays in cache;
//! - reuses its buffers from batch to batch (no allocation, page faults or zeroing per op).
//!
//! With more than one compute thread the row blocks and the (sequence, head) pairs run in
//! parallel, each matrix multiply on one thread.

use candle_core::{DType, Device, Tensor};
use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use super::bert::FastBert;
use super::cpu_ops::{gelu_slice, layer_norm_row, softmax_row};
use super::encoder::{PaddingSide, TextEncoder};
use super::model_files::Pooling;

/// Rows per block after attention and per QKV multiply. Larger blocks pack each weight matrix
/// fewer times; smaller ones give more parallel tasks. 512 measured best on 2 cores.
const ROW_BLOCK: usize = 512;

/// `[input, output]` row-major weights and a bias.
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    input: usize,
    output: usize,
}

impl Linear {
    fn from_tensors(weight_t: &Tensor, bias: &Tensor) -> candle_core::Result<Self> {
        let (input, output) = weight_t.dims2()?;
        Ok(Self {
            weight: flat(weight_t)?,
            bias: flat(bias)?,
            input,
            output,
        })
    }

    /// `out = x · W + bias`, or `out = residual + x · W + bias` when a residual is given.
    /// `x` is `[rows, input]`, `out` and `residual` `[rows, output]`.
    fn forward(&self, x: &[f32], out: &mut [f32], residual: Option<&[f32]>) {
        let rows = x.len() / self.input;
        debug_assert_eq!(out.len(), rows * self.output);
        match residual {
            Some(residual) => {
                for (row, res) in out
                    .chunks_exact_mut(self.output)
                    .zip(residual.chunks_exact(self.output))
                {
                    for ((o, r), b) in row.iter_mut().zip(res).zip(&self.bias) {
                        *o = r + b;
                    }
                }
            }
            None => {
                for row in out.chunks_exact_mut(self.output) {
                    row.copy_from_slice(&self.bias);
                }
            }
        }
        let strides = Strides {
            dst_rs: self.output,
            lhs_rs: self.input,
            rhs_rs: self.output,
            rhs_cs: 1,
        };
        // SAFETY: the slices hold rows x input, input x output and rows x output values.
        #[allow(unsafe_code)]
        unsafe {
            matmul_accumulate(
                (rows, self.output, self.input),
                out.as_mut_ptr(),
                x.as_ptr(),
                self.weight.as_ptr(),
                strides,
                true,
            );
        }
    }
}

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn from_candle(norm: &candle_nn::LayerNorm, eps: f64) -> candle_core::Result<Self> {
        let bias = norm
            .bias()
            .ok_or_else(|| candle_core::Error::Msg("layer norm without bias".into()))?;
        Ok(Self {
            gamma: flat(norm.weight())?,
            beta: flat(bias)?,
            eps: eps as f32,
        })
    }

    fn apply(&self, rows: &mut [f32]) {
        for row in rows.chunks_exact_mut(self.gamma.len()) {
            layer_norm_row(row, &self.gamma, &self.beta, self.eps);
        }
    }
}

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// Row strides of a multiply's operands (column stride 1, except the right-hand side's).
#[derive(Clone, Copy)]
struct Strides {
    dst_rs: usize,
    lhs_rs: usize,
    rhs_rs: usize,
    rhs_cs: usize,
}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]` on this thread; `accumulate` keeps what `dst` holds.
///
/// # Safety
/// Every pointer must address the whole strided matrix it stands for.
#[allow(unsafe_code)]
unsafe fn matmul_accumulate(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    lhs: *const f32,
    rhs: *const f32,
    strides: Strides,
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            1,
            strides.dst_rs as isize,
            accumulate,
            lhs,
            1,
            strides.lhs_rs as isize,
            rhs,
            strides.rhs_cs as isize,
            strides.rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

fn flat(tensor: &Tensor) -> candle_core::Result<Vec<f32>> {
    tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// Buffers reused from batch to batch.
#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    /// One head's attention scores (single-threaded runs).
    scores: Vec<f32>,
    /// One row block's attended rows and intermediate activations (single-threaded runs).
    block: BlockBuffers,
}

#[derive(Default)]
struct BlockBuffers {
    attended: Vec<f32>,
    inner: Vec<f32>,
}

fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.clear();
    buffer.resize(len, 0.0);
}

/// A raw pointer that may cross to rayon's threads; each task writes a disjoint part.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: tasks given a `SharedMut` write disjoint elements and finish before it is dropped.
#[allow(unsafe_code)]
unsafe impl Send for SharedMut {}
#[allow(unsafe_code)]
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `offset` places on; a method, so closures capture the whole wrapper.
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

pub struct CpuBert {
    hidden: usize,
    heads: usize,
    pad_id: u32,
    words: Vec<f32>,
    positions: Vec<f32>,
    max_positions: usize,
    token_type: Vec<f32>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    scratch: Scratch,
}

impl CpuBert {
    /// Copies the weights of a loaded model (fused QKV, scaled query) into plain f32 buffers.
    pub fn from_model(model: &FastBert) -> candle_core::Result<Self> {
        let config = model.config();
        let eps = config.layer_norm_eps;
        let layers = model
            .layers()
            .map(|parts| {
                let linear = |(w, b): (&Tensor, &Tensor)| Linear::from_tensors(w, b);
                Ok(Layer {
                    qkv: linear(parts.qkv)?,
                    attention_out: linear(parts.attention_out)?,
                    attention_norm: LayerNorm::from_candle(parts.attention_norm, eps)?,
                    intermediate: linear(parts.intermediate)?,
                    output: linear(parts.output)?,
                    output_norm: LayerNorm::from_candle(parts.output_norm, eps)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let (words, positions, token_type, embedding_norm) = model.embeddings();
        Ok(Self {
            hidden: config.hidden_size,
            heads: config.num_attention_heads,
            pad_id: config.pad_token_id,
            words: flat(words)?,
            positions: flat(positions)?,
            max_positions: positions.dim(0)?,
            token_type: flat(token_type)?,
            embedding_norm: LayerNorm::from_candle(embedding_norm, eps)?,
            layers,
            scratch: Scratch::default(),
        })
    }

    /// Word + position + token-type embeddings, layer-normed, into `hidden` (packed rows).
    fn embed(&self, sequences: &[&[u32]], hidden: &mut [f32]) -> candle_core::Result<()> {
        let h = self.hidden;
        let mut rows = hidden.chunks_exact_mut(h);
        for ids in sequences {
            if ids.len() > self.max_positions {
                candle_core::bail!(
                    "sequence of {} tokens is longer than the model's {} positions",
                    ids.len(),
                    self.max_positions
                );
            }
            for (position, &id) in ids.iter().enumerate() {
                let row = rows.next().expect("one row per token");
                let word = self
                    .words
                    .get(id as usize * h..(id as usize + 1) * h)
                    .ok_or_else(|| {
                        candle_core::Error::Msg(format!("token id {id} out of range"))
                    })?;
                let place = &self.positions[position * h..(position + 1) * h];
                for (((r, w), p), t) in row.iter_mut().zip(word).zip(place).zip(&self.token_type) {
                    *r = w + p + t;
                }
                self.embedding_norm.apply(row);
            }
        }
        Ok(())
    }

    /// Runs the encoder over the sequences; leaves their packed hidden states
    /// `[tokens, hidden]` in `self.scratch.hidden`.
    fn encode(&mut self, sequences: &[&[u32]]) -> candle_core::Result<()> {
        let h = self.hidden;
        let tokens: usize = sequences.iter().map(|s| s.len()).sum();
        let mut scratch = std::mem::take(&mut self.scratch);
        resize(&mut scratch.hidden, tokens * h);
        resize(&mut scratch.qkv, tokens * 3 * h);
        resize(&mut scratch.context, tokens * h);
        let embedded = self.embed(sequences, &mut scratch.hidden);
        let lengths: Vec<usize> = sequences.iter().map(|s| s.len()).collect();
        let parallel = rayon::current_num_threads() > 1;
        if embedded.is_ok() {
            for layer in &self.layers {
                self.project_qkv(layer, &scratch.hidden, &mut scratch.qkv, parallel);
                let Scratch {
                    qkv,
                    context,
                    scores,
                    ..
                } = &mut scratch;
                self.attend(&lengths, qkv, context, scores, parallel);
                let Scratch {
                    context,
                    hidden,
                    block,
                    ..
                } = &mut scratch;
                self.feed_forward(layer, context, hidden, block, parallel);
            }
        }
        self.scratch = scratch;
        embedded
    }

    fn project_qkv(&self, layer: &Layer, hidden: &[f32], qkv: &mut [f32], parallel: bool) {
        let (h, w) = (self.hidden, layer.qkv.output);
        let block = |(x, out): (&[f32], &mut [f32])| layer.qkv.forward(x, out, None);
        let (rows_in, rows_out) = (ROW_BLOCK * h, ROW_BLOCK * w);
        if parallel {
            let pairs = hidden.par_chunks(rows_in).zip(qkv.par_chunks_mut(rows_out));
            pairs.for_each(block);
        } else {
            hidden
                .chunks(rows_in)
                .zip(qkv.chunks_mut(rows_out))
                .for_each(block);
        }
    }

    /// Scaled dot-product attention per sequence and head, from `qkv` rows into `context`.
    fn attend(
        &self,
        lengths: &[usize],
        qkv: &[f32],
        context: &mut [f32],
        scores: &mut Vec<f32>,
        parallel: bool,
    ) {
        let (h, heads) = (self.hidden, self.heads);
        let d = h / heads;
        let mut jobs = Vec::with_capacity(lengths.len() * heads);
        let mut offset = 0;
        for &len in lengths {
            jobs.extend((0..heads).map(|head| (offset, len, head)));
            offset += len;
        }
        let context = SharedMut(context.as_mut_ptr());
        let run = |scores: &mut Vec<f32>, (offset, len, head): (usize, usize, usize)| {
            resize(scores, len * len);
            let q = qkv[offset * 3 * h + head * d..].as_ptr();
            let k = qkv[offset * 3 * h + h + head * d..].as_ptr();
            let v = qkv[offset * 3 * h + 2 * h + head * d..].as_ptr();
            // SAFETY: q, k, v address `len` rows of `d` values at row stride 3h inside `qkv`;
            // `scores` holds len x len; this job alone writes columns head*d.. of the
            // sequence's `len` rows of `context`.
            #[allow(unsafe_code)]
            unsafe {
                let keys_t = Strides {
                    dst_rs: len,
                    lhs_rs: 3 * h,
                    rhs_rs: 1,
                    rhs_cs: 3 * h,
                };
                matmul_accumulate((len, len, d), scores.as_mut_ptr(), q, k, keys_t, false);
                scores.chunks_exact_mut(len).for_each(softmax_row);
                let values = Strides {
                    dst_rs: h,
                    lhs_rs: len,
                    rhs_rs: 3 * h,
                    rhs_cs: 1,
                };
                let out = context.at(offset * h + head * d);
                matmul_accumulate((len, d, len), out, scores.as_ptr(), v, values, false);
            }
        };
        if parallel {
            jobs.into_par_iter().for_each_init(Vec::new, run);
        } else {
            jobs.into_iter().for_each(|job| run(scores, job));
        }
    }

    /// Output projection, residual, layer norm, feed-forward, residual, layer norm; in row
    /// blocks, writing the layer's output over `hidden`.
    fn feed_forward(
        &self,
        layer: &Layer,
        context: &[f32],
        hidden: &mut [f32],
        buffers: &mut BlockBuffers,
        parallel: bool,
    ) {
        let h = self.hidden;
        let wide = layer.intermediate.output;
        let block = |buffers: &mut BlockBuffers, (ctx, x): (&[f32], &mut [f32])| {
            let BlockBuffers { attended, inner } = buffers;
            resize(attended, x.len());
            resize(inner, x.len() / h * wide);
            layer.attention_out.forward(ctx, attended, Some(x));
            layer.attention_norm.apply(attended);
            layer.intermediate.forward(attended, inner, None);
            gelu_slice(inner);
            layer.output.forward(inner, x, Some(attended));
            layer.output_norm.apply(x);
        };
        let rows = ROW_BLOCK * h;
        if parallel {
            let pairs = context.par_chunks(rows).zip(hidden.par_chunks_mut(rows));
            pairs.for_each_init(Default::default, block);
        } else {
            let pairs = context.chunks(rows).zip(hidden.chunks_mut(rows));
            pairs.for_each(|pair| block(buffers, pair));
        }
    }
}

/// The sequences of a right-padded `[batch, seq]` id tensor, cut at their mask lengths.
fn unpadded(ids: &Tensor, mask: &Tensor) -> candle_core::Result<Vec<Vec<u32>>> {
    let lengths = mask.to_dtype(DType::F32)?.sum(1)?.to_vec1::<f32>()?;
    let rows = ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
    Ok(rows
        .into_iter()
        .zip(lengths)
        .map(|(mut row, len)| {
            row.truncate(len as usize);
            row
        })
        .collect())
}

impl TextEncoder for CpuBert {
    fn forward(&mut self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let sequences = unpadded(ids, mask)?;
        let sequences: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
        self.encode(&sequences)?;
        let h = self.hidden;
        let mut padded = vec![0.0f32; b * t * h];
        let mut rows = self.scratch.hidden.chunks_exact(h);
        for (i, sequence) in sequences.iter().enumerate() {
            for position in 0..sequence.len() {
                let start = (i * t + position) * h;
                padded[start..start + h].copy_from_slice(rows.next().expect("packed row"));
            }
        }
        Tensor::from_vec(padded, (b, t, h), &Device::Cpu)
    }

    fn embed_unpadded(
        &mut self,
        sequences: &[&[u32]],
        pooling: Pooling,
        normalize: bool,
    ) -> Option<candle_core::Result<Vec<Vec<f32>>>> {
        if let Err(error) = self.encode(sequences) {
            return Some(Err(error));
        }
        let h = self.hidden;
        let mut offset = 0;
        let pooled = sequences
            .iter()
            .map(|sequence| {
                let rows = &self.scratch.hidden[offset * h..(offset + sequence.len()) * h];
                offset += sequence.len();
                let mut vector = pool_rows(rows, h, pooling);
                if normalize {
                    normalize_l2(&mut vector);
                }
                vector
            })
            .collect();
        Some(Ok(pooled))
    }

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn padding_side(&self) -> PaddingSide {
        PaddingSide::Right
    }

    fn pad_id(&self) -> u32 {
        self.pad_id
    }
}

/// One sequence's vector from its `[len, h]` hidden rows.
fn pool_rows(rows: &[f32], h: usize, pooling: Pooling) -> Vec<f32> {
    let len = rows.len() / h;
    match pooling {
        Pooling::Mean => {
            let mut sum = vec![0.0f32; h];
            for row in rows.chunks_exact(h) {
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += v;
                }
            }
            let count = len.max(1) as f32;
            sum.iter_mut().for_each(|s| *s /= count);
            sum
        }
        Pooling::Cls => rows.get(..h).map_or_else(|| vec![0.0; h], <[f32]>::to_vec),
        Pooling::LastToken => rows
            .get(len.saturating_sub(1) * h..)
            .filter(|last| last.len() == h)
            .map_or_else(|| vec![0.0; h], <[f32]>::to_vec),
    }
}

fn normalize_l2(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.iter_mut().for_each(|v| *v /= norm);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_nn::VarBuilder;

    use super::*;
    use crate::backends::embed::bert::BertConfig;
    use crate::backends::embed::encoder::pool;

    const HIDDEN: usize = 32;
    const WIDE: usize = 64;
    const POSITIONS: usize = 320;

    fn tiny_bert() -> FastBert {
        let config: BertConfig = serde_json::from_value(serde_json::json!({
            "vocab_size": 50, "hidden_size": HIDDEN, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": WIDE,
            "max_position_embeddings": POSITIONS, "layer_norm_eps": 1e-12
        }))
        .unwrap();
        let mut tensors = HashMap::new();
        let mut put = |name: String, shape: &[usize]| {
            let t = Tensor::randn(0f32, 0.3, shape, &Device::Cpu).unwrap();
            tensors.insert(name, t);
        };
        put("embeddings.word_embeddings.weight".into(), &[50, HIDDEN]);
        put(
            "embeddings.position_embeddings.weight".into(),
            &[POSITIONS, HIDDEN],
        );
        put(
            "embeddings.token_type_embeddings.weight".into(),
            &[2, HIDDEN],
        );
        let norm = |put: &mut dyn FnMut(String, &[usize]), prefix: String| {
            put(format!("{prefix}.weight"), &[HIDDEN]);
            put(format!("{prefix}.bias"), &[HIDDEN]);
        };
        norm(&mut put, "embeddings.LayerNorm".into());
        for i in 0..2 {
            let l = format!("encoder.layer.{i}");
            for part in [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
            ] {
                put(format!("{l}.{part}.weight"), &[HIDDEN, HIDDEN]);
                put(format!("{l}.{part}.bias"), &[HIDDEN]);
            }
            put(
                format!("{l}.attention.output.dense.weight"),
                &[HIDDEN, HIDDEN],
            );
            put(format!("{l}.attention.output.dense.bias"), &[HIDDEN]);
            norm(&mut put, format!("{l}.attention.output.LayerNorm"));
            put(format!("{l}.intermediate.dense.weight"), &[WIDE, HIDDEN]);
            put(format!("{l}.intermediate.dense.bias"), &[WIDE]);
            put(format!("{l}.output.dense.weight"), &[HIDDEN, WIDE]);
            put(format!("{l}.output.dense.bias"), &[HIDDEN]);
            norm(&mut put, format!("{l}.output.LayerNorm"));
        }
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        FastBert::load(config, vb).unwrap()
    }

    /// Right-padded ids and mask for sequences of these lengths.
    fn batch(lengths: &[usize]) -> (Tensor, Tensor) {
        let longest = *lengths.iter().max().unwrap();
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for (s, &len) in lengths.iter().enumerate() {
            for i in 0..longest {
                ids.push(if i < len {
                    ((s * 7 + i * 3) % 50) as u32
                } else {
                    0
                });
                mask.push(u32::from(i < len));
            }
        }
        let shape = (lengths.len(), longest);
        let ids = Tensor::from_vec(ids, shape, &Device::Cpu).unwrap();
        let mask = Tensor::from_vec(mask, shape, &Device::Cpu).unwrap();
        (ids, mask)
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// Hidden states of real tokens and mean-pooled, normalised vectors from both forwards,
    /// on one thread and on three (more than one row block, so blocks run in parallel).
    #[test]
    fn matches_the_tensor_forward_on_one_thread_and_several() {
        let mut reference = tiny_bert();
        let mut packed = CpuBert::from_model(&reference).unwrap();
        let lengths = [300, 7, 250, 1];
        let (ids, mask) = batch(&lengths);
        let expected_hidden = reference.forward(&ids, &mask).unwrap();
        let expected_pooled = pool(
            &expected_hidden,
            &mask,
            Pooling::Mean,
            PaddingSide::Right,
            true,
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
        let keep = mask.to_dtype(DType::F32).unwrap().unsqueeze(2).unwrap();
        let real = |hidden: &Tensor| {
            let masked = hidden.broadcast_mul(&keep).unwrap();
            masked.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        let sequences = unpadded(&ids, &mask).unwrap();
        let sequences: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
        for threads in [1, 3] {
            let workers = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (hidden, pooled) = workers.install(|| {
                let hidden = packed.forward(&ids, &mask).unwrap();
                let pooled = packed.embed_unpadded(&sequences, Pooling::Mean, true);
                (hidden, pooled.unwrap().unwrap())
            });
            let off = max_difference(&real(&hidden), &real(&expected_hidden));
            assert!(
                off < 1e-4,
                "{threads} thread(s): hidden states off by {off}"
            );
            for (ours, theirs) in pooled.iter().zip(&expected_pooled) {
                let off = max_difference(ours, theirs);
                assert!(
                    off < 1e-5,
                    "{threads} thread(s): pooled vector off by {off}"
                );
            }
        }
    }

    #[test]
    fn cls_and_last_token_pooling_pick_their_rows() {
        let rows: Vec<f32> = (0..3 * 4).map(|v| v as f32).collect();
        assert_eq!(pool_rows(&rows, 4, Pooling::Cls), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(
            pool_rows(&rows, 4, Pooling::LastToken),
            vec![8.0, 9.0, 10.0, 11.0]
        );
        assert_eq!(pool_rows(&rows, 4, Pooling::Mean), vec![4.0, 5.0, 6.0, 7.0]);
    }

    #[test]
    fn ids_past_the_vocabulary_or_positions_are_errors() {
        let mut packed = CpuBert::from_model(&tiny_bert()).unwrap();
        let too_long = vec![1u32; POSITIONS + 1];
        let error = packed.embed_unpadded(&[&too_long], Pooling::Mean, true);
        let message = error.unwrap().unwrap_err().to_string();
        assert!(message.contains("longer than the model's"), "{message}");
        let error = packed.embed_unpadded(&[&[1, 99, 2]], Pooling::Mean, true);
        let message = error.unwrap().unwrap_err().to_string();
        assert!(message.contains("token id 99 out of range"), "{message}");
    }
}
