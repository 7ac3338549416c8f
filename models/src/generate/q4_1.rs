//! Q4_1 weights kept as the GGUF file stores them, multiplied the way llama.cpp does: each
//! activation row is quantised to Q8_1 (32 values, a scale and the scaled sum per block),
//! and each block's product is `d_w * d_x * Σ q_w q_x + m_w * s_x`, with the integer sum
//! exact. candle reads Q4_1 too, but only with a scalar loop (8 tokens/s for SmolLM2-135M
//! on 2 cores); requantising to Q8_0 instead ran fast but moved the logits far enough from
//! llama.cpp's to fork greedy decoding (BENCHMARKS.md). This kernel is written for the
//! compiler to vectorise, built for AVX-512, AVX2 and plain x86-64, picked at run time.

use half::f16;
use rayon::prelude::*;

use crate::ModelError;

const BLOCK: usize = 32;
/// Bytes of one GGUF Q4_1 block: `d` and `m` as f16, then 16 bytes of 4-bit values (the
/// low nibbles are the block's first 16 values, the high nibbles its last 16).
const Q4_1_BYTES: usize = 20;
/// Output rows one parallel task computes.
const ROWS_PER_TASK: usize = 64;

#[derive(Clone, Copy)]
struct WeightBlock {
    d: f32,
    m: f32,
    qs: [u8; 16],
}

#[derive(Clone, Copy)]
struct ActivationBlock {
    /// The scale and `scale * Σ qs`, rounded through f16 as llama.cpp stores them.
    d: f32,
    s: f32,
    qs: [i8; BLOCK],
}

/// A `rows x cols` Q4_1 matrix (rows are output features).
pub struct Q4_1Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<WeightBlock>,
}

impl Q4_1Matrix {
    /// From the tensor's GGUF bytes.
    pub fn from_gguf_bytes(bytes: &[u8], rows: usize, cols: usize) -> Result<Self, ModelError> {
        if !cols.is_multiple_of(BLOCK) || bytes.len() != rows * cols / BLOCK * Q4_1_BYTES {
            return Err(ModelError::Load(format!(
                "a Q4_1 tensor of {rows} x {cols} should hold {} bytes, not {}",
                rows * cols / BLOCK * Q4_1_BYTES,
                bytes.len()
            )));
        }
        let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let blocks = bytes
            .chunks_exact(Q4_1_BYTES)
            .map(|b| WeightBlock {
                d: half(&b[0..2]),
                m: half(&b[2..4]),
                qs: b[4..20].try_into().expect("16 bytes"),
            })
            .collect();
        Ok(Self { rows, cols, blocks })
    }

    /// `x` (`n x cols`, row-major) times the matrix's transpose: `n x rows`.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let per_row = self.cols / BLOCK;
        let activations: Vec<ActivationBlock> = x.chunks_exact(BLOCK).map(quantise).collect();
        // Each task streams its weight rows once past every activation row.
        let columns: Vec<Vec<f32>> = self
            .blocks
            .par_chunks(ROWS_PER_TASK * per_row)
            .map(|weights| {
                let mut out = Vec::with_capacity(weights.len() / per_row * n);
                for weight_row in weights.chunks_exact(per_row) {
                    for activation_row in activations.chunks_exact(per_row) {
                        out.push(row_dot(weight_row, activation_row));
                    }
                }
                out
            })
            .collect();
        let mut result = vec![0.0; n * self.rows];
        for (task, values) in columns.iter().enumerate() {
            for (i, value) in values.iter().enumerate() {
                let (row, token) = (task * ROWS_PER_TASK + i / n, i % n);
                result[token * self.rows + row] = *value;
            }
        }
        result
    }
}

/// One block of activations as Q8_1 (llama.cpp's reference rounding).
fn quantise(values: &[f32]) -> ActivationBlock {
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut qs = [0i8; BLOCK];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(values) {
        *q = (v * inverse).round() as i8;
        sum += i32::from(*q);
    }
    ActivationBlock {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
fn row_dot(weights: &[WeightBlock], activations: &[ActivationBlock]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weights.iter().zip(activations) {
        let mut products = 0i32;
        for j in 0..16 {
            let byte = w.qs[j];
            products += i32::from(byte & 0x0f) * i32::from(a.qs[j])
                + i32::from(byte >> 4) * i32::from(a.qs[j + 16]);
        }
        sum += w.d * a.d * products as f32 + w.m * a.s;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// The kernel against candle's own Q4_1 matmul (the same arithmetic in a scalar loop)
    /// and against the dequantised weights in f32.
    #[test]
    fn matches_candles_q4_1_matmul_and_the_f32_product() {
        let (rows, cols, n) = (70, 96, 3);
        let weights: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 104_729 % 997) as f32 / 498.0 - 1.0) * 2.0)
            .collect();
        let device = Device::Cpu;
        let w = Tensor::from_slice(&weights, (rows, cols), &device).unwrap();
        let quantised = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let bytes = quantised.data().unwrap();
        let ours = Q4_1Matrix::from_gguf_bytes(&bytes, rows, cols)
            .unwrap()
            .forward(&x, n);
        let xs = Tensor::from_slice(&x, (n, cols), &device).unwrap();
        let dequantised = quantised.dequantize(&device).unwrap();
        let candle = candle_core::quantized::QMatMul::from_qtensor(quantised)
            .unwrap()
            .forward(&xs)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let exact = xs
            .matmul(&dequantised.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(ours.len(), n * rows);
        for ((ours, candle), exact) in ours.iter().zip(&candle).zip(&exact) {
            assert!((ours - candle).abs() < 1e-3, "{ours} vs candle {candle}");
            assert!((ours - exact).abs() < 0.05, "{ours} vs f32 {exact}");
        }
    }

    #[test]
    fn a_tensor_of_the_wrong_size_is_refused() {
        let error = Q4_1Matrix::from_gguf_bytes(&[0; 39], 2, 32).err().unwrap();
        assert!(
            error.to_string().contains("should hold 40 bytes"),
            "{error}"
        );
    }
}
