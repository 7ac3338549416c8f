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

mod layers;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use self::layers::{LayerNorm, Linear, SharedMut, Strides, flat, matmul_accumulate};
use super::bert::FastBert;
use super::cpu_ops::{add_assign, gelu_slice, softmax_row};
use super::encoder::{EncoderSpec, PaddingSide, TextEncoder};
use super::model_files::Pooling;
use super::relative_position::RelativeBias;

/// Rows per block after attention and per QKV multiply. Larger blocks pack each weight matrix
/// fewer times; smaller ones give more parallel tasks. 512 measured best on 2 cores.
const ROW_BLOCK: usize = 512;

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
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

pub struct CpuBert {
    hidden: usize,
    heads: usize,
    pad_id: u32,
    words: Vec<f32>,
    positions: Vec<f32>,
    /// Position id of a sequence's first token (after the padding id for RoBERTa and MPNet).
    first_position: usize,
    max_positions: usize,
    token_type: Vec<f32>,
    /// MPNet's relative attention bias.
    relative: Option<RelativeBias>,
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
            first_position: config.first_position(),
            max_positions: positions.dim(0)?,
            token_type: flat(token_type)?,
            relative: model.relative_bias_table().cloned(),
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
            if self.first_position + ids.len() > self.max_positions {
                candle_core::bail!(
                    "sequence of {} tokens is longer than the model's {} positions",
                    ids.len(),
                    self.max_positions - self.first_position
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
                let place = &self.positions[(self.first_position + position) * h..][..h];
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
        let relative = self.relative.as_ref();
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
                match relative {
                    None => scores.chunks_exact_mut(len).for_each(softmax_row),
                    Some(bias) => {
                        for (query, row) in scores.chunks_exact_mut(len).enumerate() {
                            add_assign(row, bias.row(head, query, len));
                            softmax_row(row);
                        }
                    }
                }
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

    fn spec(&self) -> EncoderSpec {
        EncoderSpec {
            hidden_size: self.hidden,
            pad_id: self.pad_id,
            padding_side: PaddingSide::Right,
        }
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
mod tests;
