//! A Llama-family decoder (Llama 2/3, Mistral, SmolLM2) from a GGUF file, run on the CPU over
//! a ragged batch.
//!
//! One forward step takes any mix of rows: each row is one token of one sequence at its own
//! position. A prompt being prefilled gives many rows of one sequence, a sequence being
//! decoded gives one; all of them go through each linear layer as one matrix (candle's
//! quantised matmul reads each weight block once per tile of rows, which is what makes a
//! batch cheaper than its rows one by one), and attention runs per row against that
//! sequence's own KV cache. That is what continuous batching needs: sequences join and leave
//! the batch at any step, at any length.
//!
//! Weights stay quantised as the file has them (F16, Q8_0, Q4_0/1, K-quants); the token
//! embedding is dequantised once. Attention, RoPE, RMSNorm and SwiGLU run on plain slices.

use std::collections::HashMap;
use std::path::Path;

use rayon::prelude::*;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::attention::{self, Heads};
use super::decoder::{LlamaConfig, QUANTISED_ARCHITECTURES, Row, read_gguf};
use super::kv_arena::KvArena;
use super::quantised::{MatmulScratch, Q4_1, Q8_0, QuantisedMatrix};

use crate::ModelError;
use crate::embed::cpu_ops;

struct Layer {
    attn_norm: Vec<f32>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: Vec<f32>,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
}

/// The weights, loaded once.
pub struct QuantisedLlama {
    pub config: LlamaConfig,
    /// `vocab x hidden`, dequantised.
    embedding: Vec<f32>,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    lm_head: Linear,
}

/// A forward step's buffers, kept by the caller between steps: fresh ones each step cost
/// the kernel a page clearing for every megabyte (the logits of 32 rows are 6 MB).
#[derive(Default)]
pub struct StepBuffers {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    attended: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    logits: Vec<f32>,
    matmul: MatmulScratch,
}

fn tensor(content: &Content, file: &mut std::fs::File, name: &str) -> Result<QTensor, ModelError> {
    content
        .tensor(file, name, &Device::Cpu)
        .map_err(|e| ModelError::Load(format!("GGUF tensor `{name}`: {e}")))
}

fn vector(content: &Content, file: &mut std::fs::File, name: &str) -> Result<Vec<f32>, ModelError> {
    let loaded = tensor(content, file, name)?
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| ModelError::Load(format!("GGUF tensor `{name}`: {e}")))?;
    Ok(loaded)
}

/// Quantisations for which candle's CPU matmul has no SIMD kernel (it has them for Q4_0,
/// Q8_0 and the K-quants) and we have none of our own: their weights are requantised to
/// Q8_0 once, at load. Q8_0 holds a 5-bit block's values to within 1/254 of the block's
/// largest, costs 8.5 bits a weight instead of 6, and runs several times faster than
/// candle's scalar loop; its logits differ from llama.cpp's a little more than the native
/// type's. Q4_1 and Q8_0 have kernels of our own (`quantised.rs`) and stay as stored.
const REQUANTISED_TO_Q8_0: &[GgmlDType] = &[GgmlDType::Q5_0, GgmlDType::Q5_1];

/// A linear layer's weights: candle's quantised matmul, or our kernels (`quantised.rs`).
enum Linear {
    Candle(QMatMul),
    Q4_1(QuantisedMatrix<Q4_1>),
    Q8_0(QuantisedMatrix<Q8_0>),
}

fn matmul_weight(
    content: &Content,
    file: &mut std::fs::File,
    name: &str,
) -> Result<Linear, ModelError> {
    let failed = |e: candle_core::Error| ModelError::Load(format!("GGUF tensor `{name}`: {e}"));
    let mut weight = tensor(content, file, name)?;
    if let [rows, cols] = weight.shape().dims() {
        let (rows, cols) = (*rows, *cols);
        match weight.dtype() {
            GgmlDType::Q4_1 => {
                let bytes = weight.data().map_err(failed)?;
                return Ok(Linear::Q4_1(QuantisedMatrix::from_gguf_bytes(
                    &bytes, rows, cols,
                )?));
            }
            GgmlDType::Q8_0 => {
                let bytes = weight.data().map_err(failed)?;
                return Ok(Linear::Q8_0(QuantisedMatrix::from_gguf_bytes(
                    &bytes, rows, cols,
                )?));
            }
            _ => {}
        }
    }
    if REQUANTISED_TO_Q8_0.contains(&weight.dtype()) {
        let values = weight.dequantize(&Device::Cpu).map_err(failed)?;
        weight = QTensor::quantize(&values, GgmlDType::Q8_0).map_err(failed)?;
    }
    QMatMul::from_qtensor(weight)
        .map(Linear::Candle)
        .map_err(failed)
}

impl QuantisedLlama {
    /// Reads the model from the GGUF file at `path`; returns it with the file's metadata.
    pub fn load(path: &Path) -> Result<(Self, HashMap<String, Value>), ModelError> {
        let (mut file, content) = read_gguf(path)?;
        let config = LlamaConfig::from_metadata(&content.metadata)?;
        super::gguf_shapes::check_tensor_shapes(&content, &config)?;
        let arch = LlamaConfig::architecture(&content.metadata);
        if !QUANTISED_ARCHITECTURES.contains(&arch.as_str())
            || content.tensor_infos.contains_key("rope_freqs.weight")
        {
            return Err(ModelError::Load(format!(
                "the quantised CPU path takes plain Llama GGUF files, not `{arch}` (or RoPE \
                 frequency factors); load it on the dense path (dtype f32, f16 or bf16)"
            )));
        }
        let file = &mut file;
        let embedding = vector(&content, file, "token_embd.weight")?;
        if embedding.len() != config.vocab * config.hidden {
            return Err(ModelError::Load(format!(
                "token_embd.weight holds {} values, not {} x {}",
                embedding.len(),
                config.vocab,
                config.hidden
            )));
        }
        let layers = (0..config.layers)
            .map(|i| {
                let name = |part: &str| format!("blk.{i}.{part}.weight");
                Ok(Layer {
                    attn_norm: vector(&content, file, &name("attn_norm"))?,
                    wq: matmul_weight(&content, file, &name("attn_q"))?,
                    wk: matmul_weight(&content, file, &name("attn_k"))?,
                    wv: matmul_weight(&content, file, &name("attn_v"))?,
                    wo: matmul_weight(&content, file, &name("attn_output"))?,
                    ffn_norm: vector(&content, file, &name("ffn_norm"))?,
                    w_gate: matmul_weight(&content, file, &name("ffn_gate"))?,
                    w_up: matmul_weight(&content, file, &name("ffn_up"))?,
                    w_down: matmul_weight(&content, file, &name("ffn_down"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let output_norm = vector(&content, file, "output_norm.weight")?;
        // Tied embeddings when the file has no output matrix (SmolLM2).
        let lm_head = if content.tensor_infos.contains_key("output.weight") {
            matmul_weight(&content, file, "output.weight")?
        } else {
            matmul_weight(&content, file, "token_embd.weight")?
        };
        let model = Self {
            config,
            embedding,
            layers,
            output_norm,
            lm_head,
        };
        Ok((model, content.metadata))
    }

    /// Runs one step over `rows`, writing their keys and values into `kv`; returns the
    /// logits of each row that asked for them, in row order. Rows of one sequence must come
    /// in position order, and every earlier position of a row's sequence must be in its
    /// slot already or among the rows before it.
    ///
    /// The step runs on a thread of rayon's pool: its few hundred parallel loops then split
    /// work between the pool's threads, where from any other thread each one was handed to
    /// the pool and waited for, two thread switches a loop.
    pub fn forward(
        &self,
        rows: &[Row],
        kv: &mut KvArena,
        buffers: &mut StepBuffers,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        rayon::scope(|_| self.forward_in_pool(rows, kv, buffers))
    }

    /// [`QuantisedLlama::forward`], on whichever thread calls it.
    fn forward_in_pool(
        &self,
        rows: &[Row],
        kv: &mut KvArena,
        buffers: &mut StepBuffers,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        self.reserve(rows, kv)?;
        let StepBuffers {
            x,
            h,
            q,
            k,
            v,
            o,
            attended,
            gate,
            up,
            down,
            logits,
            matmul,
        } = buffers;
        x.clear();
        for row in rows {
            let at = row.token as usize * c.hidden;
            x.extend_from_slice(&self.embedding[at..at + c.hidden]);
        }
        // Each row's rotations, the same for every head of every layer.
        let half = c.head_dim / 2;
        let rotations: Vec<(f32, f32)> = rows
            .iter()
            .flat_map(|row| rope_rotations(row.pos, c.head_dim, c.rope_base))
            .collect();
        let heads = Heads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        for (index, layer) in self.layers.iter().enumerate() {
            rms_norm_into(x, &layer.attn_norm, c.rms_eps, h);
            matmul_into(&layer.wq, h, n, c.hidden, (q, matmul))?;
            matmul_into(&layer.wk, h, n, c.hidden, (k, matmul))?;
            matmul_into(&layer.wv, h, n, c.hidden, (v, matmul))?;
            for (i, row) in rows.iter().enumerate() {
                let rotation = &rotations[i * half..(i + 1) * half];
                let q_row = &mut q[i * c.hidden..(i + 1) * c.hidden];
                rope(q_row, c.head_dim, rotation);
                let k_row = &mut k[i * c.kv_dim()..(i + 1) * c.kv_dim()];
                rope(k_row, c.head_dim, rotation);
                let v_row = &v[i * c.kv_dim()..(i + 1) * c.kv_dim()];
                kv.store(row.slot, index, row.pos, k_row, v_row);
            }
            attention::attend(heads, rows, q, kv, index, attended);
            matmul_into(&layer.wo, attended, n, c.hidden, (o, matmul))?;
            cpu_ops::add_assign(x, o);
            rms_norm_into(x, &layer.ffn_norm, c.rms_eps, h);
            matmul_into(&layer.w_gate, h, n, c.hidden, (gate, matmul))?;
            matmul_into(&layer.w_up, h, n, c.hidden, (up, matmul))?;
            swiglu(gate, up, c.ffn);
            matmul_into(&layer.w_down, gate, n, c.ffn, (down, matmul))?;
            cpu_ops::add_assign(x, down);
        }
        self.logits_of(rows, x, (logits, matmul))
    }

    /// Checks each row's token against the vocabulary and makes each slot's room in `kv`
    /// once for the step: growing it row by row moved the cache's memory once per doubling.
    fn reserve(&self, rows: &[Row], kv: &mut KvArena) -> Result<(), ModelError> {
        let vocab = self.config.vocab;
        let mut needed: Vec<(usize, usize)> = Vec::new();
        for row in rows {
            if row.token as usize >= vocab {
                return Err(ModelError::Task(format!(
                    "token {} is outside the vocabulary of {vocab}",
                    row.token
                )));
            }
            match needed.iter_mut().find(|(slot, _)| *slot == row.slot) {
                Some((_, len)) => *len = (*len).max(row.pos + 1),
                None => needed.push((row.slot, row.pos + 1)),
            }
        }
        for (slot, len) in needed {
            kv.reserve(slot, len)?;
        }
        Ok(())
    }

    /// The logits of the rows that asked for them, from the last layer's hidden states `x`
    /// (`logits` is the step's buffer for them).
    fn logits_of(
        &self,
        rows: &[Row],
        x: &[f32],
        buffers: (&mut Vec<f32>, &mut MatmulScratch),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let wanted: Vec<f32> = rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.logits)
            .flat_map(|(i, _)| x[i * c.hidden..(i + 1) * c.hidden].iter().copied())
            .collect();
        let m = wanted.len() / c.hidden;
        if m == 0 {
            return Ok(Vec::new());
        }
        let normed = rms_norm(&wanted, &self.output_norm, c.rms_eps);
        let logits = buffers.0;
        matmul_into(&self.lm_head, &normed, m, c.hidden, (logits, buffers.1))?;
        Ok(logits.chunks(c.vocab).map(<[f32]>::to_vec).collect())
    }
}

/// `gate` becomes `silu(gate) * up`, rows in parallel (an `exp` each: a step's worth is
/// too much for one core).
fn swiglu(gate: &mut [f32], up: &[f32], width: usize) {
    gate.par_chunks_mut(width)
        .zip(up.par_chunks(width))
        .with_min_len(8)
        .for_each(|(gate, up)| cpu_ops::silu_times(gate, up));
}

/// Rotates each head's adjacent pairs of dimensions by the row's `(sin, cos)` per pair
/// (GGUF's Llama layout).
fn rope(row: &mut [f32], head_dim: usize, rotation: &[(f32, f32)]) {
    for head in row.chunks_mut(head_dim) {
        for (pair, &(sin, cos)) in head.chunks_exact_mut(2).zip(rotation) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * cos - b * sin;
            pair[1] = a * sin + b * cos;
        }
    }
}

/// A row's `(sin, cos)` per pair of a head's dimensions at position `pos`: the angle of
/// pair `i` is `pos * base^(-2i/d)`, each pair's from the one before by one multiplication,
/// as llama.cpp computes its angles (so the roundings are the same).
fn rope_rotations(pos: usize, head_dim: usize, base: f32) -> Vec<(f32, f32)> {
    let step = base.powf(-2.0 / head_dim as f32);
    let mut theta = pos as f32;
    (0..head_dim / 2)
        .map(|_| {
            let rotation = theta.sin_cos();
            theta *= step;
            rotation
        })
        .collect()
}

/// RMSNorm of each row, times the weight; the mean square summed in f64.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::new();
    rms_norm_into(x, weight, eps, &mut out);
    out
}

/// [`rms_norm`] into `out`, whose memory is reused; rows in parallel, [`NORM_ROWS`] at a
/// time.
fn rms_norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let width = weight.len();
    out.resize(x.len(), 0.0);
    out.par_chunks_mut(NORM_ROWS * width)
        .zip(x.par_chunks(NORM_ROWS * width))
        .with_min_len(32 / NORM_ROWS)
        .for_each(|(normed, rows)| {
            let sums = sums_of_squares(rows, width);
            for ((normed, row), sum) in normed.chunks_mut(width).zip(rows.chunks(width)).zip(sums) {
                let mean = (sum / width as f64) as f32;
                let scale = 1.0 / (mean + eps).sqrt();
                for ((o, v), w) in normed.iter_mut().zip(row).zip(weight) {
                    *o = v * scale * w;
                }
            }
        });
}

/// Rows whose sums of squares run side by side.
const NORM_ROWS: usize = 8;

/// Each row's `Σ v²` (`v²` in f32, summed in f64 element after element, as ggml sums it),
/// for up to [`NORM_ROWS`] rows of `width`: the rows' sums interleaved, so that each add
/// waits for its own row's previous one only (one row alone is a chain of dependent adds).
fn sums_of_squares(rows: &[f32], width: usize) -> [f64; NORM_ROWS] {
    let mut sums = [0.0f64; NORM_ROWS];
    let count = rows.len() / width;
    if count == NORM_ROWS {
        for i in 0..width {
            for (r, sum) in sums.iter_mut().enumerate() {
                let v = rows[r * width + i];
                *sum += f64::from(v * v);
            }
        }
    } else {
        for (sum, row) in sums.iter_mut().zip(rows.chunks(width)) {
            *sum = row.iter().map(|v| f64::from(v * v)).sum();
        }
    }
    sums
}

/// `x` (`n x k`) times the weight's transpose, into `out` (whose memory is reused).
fn matmul_into(
    weight: &Linear,
    x: &[f32],
    n: usize,
    k: usize,
    (out, scratch): (&mut Vec<f32>, &mut MatmulScratch),
) -> Result<(), ModelError> {
    match weight {
        Linear::Candle(weight) => {
            let input = Tensor::from_slice(x, (n, k), &Device::Cpu)?;
            *out = weight.forward(&input)?.flatten_all()?.to_vec1::<f32>()?;
        }
        Linear::Q4_1(weight) => weight.forward_into(x, n, out, scratch),
        Linear::Q8_0(weight) => weight.forward_into(x, n, out, scratch),
    }
    Ok(())
}
