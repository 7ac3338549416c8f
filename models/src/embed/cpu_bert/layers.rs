//! The building blocks of the slice forward: linear layers and layer norms over f32 rows,
//! one strided matrix multiply on the calling thread, and a pointer rayon tasks may share.

use candle_core::{DType, Tensor};
use gemm::{Parallelism, gemm};

use crate::embed::cpu_ops::layer_norm_row;

/// `[input, output]` row-major weights and a bias.
pub(super) struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    input: usize,
    pub(super) output: usize,
}

impl Linear {
    pub(super) fn from_tensors(weight_t: &Tensor, bias: &Tensor) -> candle_core::Result<Self> {
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
    pub(super) fn forward(&self, x: &[f32], out: &mut [f32], residual: Option<&[f32]>) {
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

pub(super) struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub(super) fn from_candle(norm: &candle_nn::LayerNorm, eps: f64) -> candle_core::Result<Self> {
        let bias = norm
            .bias()
            .ok_or_else(|| candle_core::Error::Msg("layer norm without bias".into()))?;
        Ok(Self {
            gamma: flat(norm.weight())?,
            beta: flat(bias)?,
            eps: eps as f32,
        })
    }

    pub(super) fn apply(&self, rows: &mut [f32]) {
        for row in rows.chunks_exact_mut(self.gamma.len()) {
            layer_norm_row(row, &self.gamma, &self.beta, self.eps);
        }
    }
}

/// Row strides of a multiply's operands (column stride 1, except the right-hand side's).
#[derive(Clone, Copy)]
pub(super) struct Strides {
    pub(super) dst_rs: usize,
    pub(super) lhs_rs: usize,
    pub(super) rhs_rs: usize,
    pub(super) rhs_cs: usize,
}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]` on this thread; `accumulate` keeps what `dst` holds.
///
/// # Safety
/// Every pointer must address the whole strided matrix it stands for.
#[allow(unsafe_code)]
pub(super) unsafe fn matmul_accumulate(
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

pub(super) fn flat(tensor: &Tensor) -> candle_core::Result<Vec<f32>> {
    tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// A raw pointer that may cross to rayon's threads; each task writes a disjoint part.
#[derive(Clone, Copy)]
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: tasks given a `SharedMut` write disjoint elements and finish before it is dropped.
#[allow(unsafe_code)]
unsafe impl Send for SharedMut {}
#[allow(unsafe_code)]
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `offset` places on; a method, so closures capture the whole wrapper.
    pub(super) fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}
