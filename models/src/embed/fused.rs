//! The element-wise steps of the encoders' tensor forward, fused on CUDA.
//!
//! On an H100, candle's generic element-wise kernels (broadcast adds, strided copies) took
//! most of the GPU time of MPNet and Qwen3 (`benches/gpu-profile.sh`, BENCHMARKS.md). Each
//! function here runs one kernel of `fused_kernels.cu` on a CUDA tensor that fits it, and
//! the same arithmetic in plain candle operations everywhere else (CPU, other dtypes or
//! shapes), so both paths compute one function.

use candle_core::Tensor;

/// `act(y + bias + residual)` for `[rows, cols]` rows `y` (a fresh product, changed in place
/// on CUDA), a `[cols]` bias and an optional residual of `y`'s shape; GELU (erf form) when
/// `gelu`.
pub fn bias_add(
    y: Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    gelu: bool,
) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if y.device().is_cuda()
        && y.rank() == 2
        && y.is_contiguous()
        && bias.is_contiguous()
        && bias.dtype() == y.dtype()
        && residual.is_none_or(|r| r.is_contiguous() && r.dtype() == y.dtype())
    {
        let op = super::fused_cuda::BiasAdd { gelu };
        match residual {
            Some(residual) => y.inplace_op3(bias, residual, &op)?,
            None => y.inplace_op2(bias, &op)?,
        }
        return Ok(y);
    }
    let mut x = y.broadcast_add(bias)?;
    if let Some(residual) = residual {
        x = (x + residual)?;
    }
    if gelu {
        x = x.gelu_erf()?;
    }
    Ok(x)
}

/// `silu(gate) * up` for `[rows, 2 * cols]` rows holding gate then up side by side (the
/// product of stacked gate and up weights), as `[rows, cols]`.
pub fn silu_mul_halves(gate_up: &Tensor) -> candle_core::Result<Tensor> {
    let (_, width) = gate_up.dims2()?;
    if !width.is_multiple_of(2) {
        candle_core::bail!("silu_mul_halves of rows {width} wide: gate and up are not halves");
    }
    #[cfg(feature = "cuda")]
    if gate_up.device().is_cuda() && gate_up.is_contiguous() {
        return gate_up.apply_op1_no_bwd(&super::fused_cuda::SiluMulHalves);
    }
    let cols = width / 2;
    candle_nn::ops::silu(&gate_up.narrow(1, 0, cols)?)? * gate_up.narrow(1, cols, cols)?
}

/// The residual add of a pre-norm layer and the norm after it, in one pass on CUDA:
/// `(x + y, rms_norm(x + y) * weight)` for `[rows, cols]` rows, the norm taken of the sum
/// as stored (rounded to the dtype), as the two candle ops compute it everywhere else.
pub fn add_rms_norm(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> candle_core::Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda()
        && x.rank() == 2
        && [x, y, weight]
            .iter()
            .all(|t| t.is_contiguous() && t.dtype() == x.dtype())
    {
        let both = x.apply_op3_no_bwd(y, weight, &super::fused_cuda::AddRmsNorm { eps })?;
        return Ok((both.get(0)?, both.get(1)?));
    }
    let sum = (x + y)?;
    let normed = candle_nn::ops::rms_norm(&sum, weight, eps)?;
    Ok((sum, normed))
}

/// What [`attention_probs`] masks out. Built once per forward and shared by every layer.
pub struct AttentionMask<'a> {
    /// `[heads, t, t]`, added to the scores (MPNet's relative position bias).
    pub bias: Option<&'a Tensor>,
    /// f32 `[batch, t]`: keys where it is 0 are left out (padding).
    pub keep: Option<&'a Tensor>,
    /// Keys after the query are left out.
    pub causal: bool,
    /// Off the fused kernel: all of the above as one additive term, built by the first
    /// layer that needs it.
    additive: std::cell::OnceCell<Tensor>,
}

impl<'a> AttentionMask<'a> {
    pub fn new(bias: Option<&'a Tensor>, keep: Option<&'a Tensor>, causal: bool) -> Self {
        Self {
            bias,
            keep,
            causal,
            additive: std::cell::OnceCell::new(),
        }
    }

    /// The bias, the padding and the causal mask as one term that broadcasts to
    /// `[batch, heads, t, t]` scores of `dtype`.
    fn additive(
        &self,
        (batch, t): (usize, usize),
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<&Tensor> {
        if let Some(term) = self.additive.get() {
            return Ok(term);
        }
        let mut term = Tensor::zeros((1, 1, t, t), dtype, device)?;
        if let Some(bias) = self.bias {
            term = term.broadcast_add(&bias.unsqueeze(0)?)?;
        }
        if let Some(keep) = self.keep {
            // Built in f32, then cast: f32::MIN is -inf in f16, and 0 x -inf would be NaN.
            let blocked = ((keep.ones_like()? - keep)? * f64::from(f32::MIN))?
                .to_dtype(dtype)?
                .reshape((batch, 1, 1, t))?;
            term = term.broadcast_add(&blocked)?;
        }
        if self.causal {
            let future: Vec<f32> = (0..t)
                .flat_map(|q| (0..t).map(move |k| if k <= q { 0.0 } else { f32::NEG_INFINITY }))
                .collect();
            let future = Tensor::from_vec(future, (1, 1, t, t), device)?.to_dtype(dtype)?;
            term = term.broadcast_add(&future)?;
        }
        Ok(self.additive.get_or_init(|| term))
    }
}

/// Softmax over the keys of `[batch, heads, t, t]` scores (a fresh product, changed in place
/// on CUDA) plus the bias, without the masked keys. A query whose keys are all masked gets
/// zeros on CUDA and a uniform row elsewhere; only padding queries can have no key, and
/// pooling leaves them out.
pub fn attention_probs(scores: Tensor, mask: &AttentionMask) -> candle_core::Result<Tensor> {
    let (batch, _, t, _) = scores.dims4()?;
    #[cfg(feature = "cuda")]
    if scores.device().is_cuda()
        && scores.is_contiguous()
        && mask
            .bias
            .is_none_or(|b| b.is_contiguous() && b.dtype() == scores.dtype())
        && mask
            .keep
            .is_none_or(|k| k.is_contiguous() && k.dtype() == candle_core::DType::F32)
    {
        let op = super::fused_cuda::MaskedSoftmax {
            bias: mask.bias.is_some(),
            keep: mask.keep.is_some(),
            causal: mask.causal,
        };
        // Operands the mask leaves out are not read; a one-element tensor stands in.
        let absent = || Tensor::zeros(1, scores.dtype(), scores.device());
        let bias = mask.bias.cloned().map_or_else(absent, Ok)?;
        let keep = mask.keep.cloned().map_or_else(absent, Ok)?;
        scores.inplace_op3(&bias, &keep, &op)?;
        return Ok(scores);
    }
    let additive = mask.additive((batch, t), scores.dtype(), scores.device())?;
    candle_nn::ops::softmax_last_dim(&scores.broadcast_add(additive)?.contiguous()?)
}

/// `heads` heads of width `d` from column `offset` of `[batch * t, width]` rows, as
/// `[batch, heads, t, d]` (contiguous).
pub fn split_heads(
    rows: &Tensor,
    (batch, t): (usize, usize),
    heads: usize,
    d: usize,
    offset: usize,
) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if rows.device().is_cuda() && rows.is_contiguous() && head_units_fit(rows, &[d, offset]) {
        let op = super::fused_cuda::HeadCopy::Split {
            batch,
            t,
            heads,
            d,
            offset,
        };
        return rows.apply_op1_no_bwd(&op);
    }
    rows.narrow(1, offset, heads * d)?
        .reshape((batch, t, heads, d))?
        .transpose(1, 2)?
        .contiguous()
}

/// `[batch, heads, t, d]` back to `[batch * t, heads * d]` rows.
pub fn merge_heads(x: &Tensor) -> candle_core::Result<Tensor> {
    let (batch, heads, t, d) = x.dims4()?;
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.is_contiguous() && head_units_fit(x, &[d]) {
        return x.apply_op1_no_bwd(&super::fused_cuda::HeadCopy::Merge);
    }
    x.transpose(1, 2)?.reshape((batch * t, heads * d))
}

/// Whether the widths (and the tensor's rows) are whole 16-byte units, as the head copies
/// move them.
#[cfg(feature = "cuda")]
fn head_units_fit(x: &Tensor, widths: &[usize]) -> bool {
    use candle_core::DType;
    let unit = 16 / x.dtype().size_in_bytes();
    matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && widths.iter().all(|w| w % unit == 0)
        && x.dims().last().is_some_and(|w| w % unit == 0)
}

/// The CUDA kernels against the plain candle path on the CPU, on random inputs of every
/// dtype and of shapes with and without padding. Runs where a GPU is (`cargo test
/// --features cuda` on the device machine, `scripts/build-cuda.sh --tests`, or cuda-emu's
/// emulated GPU, `scripts/cuda-emu.sh test`); elsewhere each test says so and passes.
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use candle_core::{DType, Device};

    use crate::device::test_gpu as gpu;

    /// ‖a − b‖ / ‖b‖ in f64, both brought to the CPU.
    fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
        let a = a
            .to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
        let b = b
            .to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
        let diff = (&a - &b).unwrap().sqr().unwrap().sum_all().unwrap();
        let norm = b.sqr().unwrap().sum_all().unwrap();
        let (diff, norm) = (
            diff.to_scalar::<f64>().unwrap(),
            norm.to_scalar::<f64>().unwrap(),
        );
        assert!(diff.is_finite(), "NaN or inf in the output");
        (diff / norm).sqrt()
    }

    /// The reference runs on the CPU in f32 (the inputs converted exactly), so that its own
    /// rounding (an f16 or bf16 softmax sums in its own precision) stays out of the error.
    fn reference_input(t: &Tensor) -> Tensor {
        let t = t.to_device(&Device::Cpu).unwrap();
        if t.dtype() == DType::F64 {
            t
        } else {
            t.to_dtype(DType::F32).unwrap()
        }
    }

    fn tolerance(dtype: DType) -> f64 {
        match dtype {
            DType::F32 => 1e-5,
            _ => 1e-2,
        }
    }

    fn random(shape: &[usize], dtype: DType, device: &Device) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(device)
            .unwrap()
    }

    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    #[test]
    fn bias_add_matches_candle() {
        let Some(gpu) = gpu() else { return };
        for dtype in DTYPES {
            for (rows, cols, residual, gelu) in [
                (7, 40, false, false),
                (300, 768, true, false),
                (70_000, 24, false, true),
            ] {
                let y = random(&[rows, cols], dtype, &gpu);
                let bias = random(&[cols], dtype, &gpu);
                let res = residual.then(|| random(&[rows, cols], dtype, &gpu));
                let cpu = reference_input;
                let want =
                    bias_add(cpu(&y), &cpu(&bias), res.as_ref().map(cpu).as_ref(), gelu).unwrap();
                let got = bias_add(y.copy().unwrap(), &bias, res.as_ref(), gelu).unwrap();
                let error = relative_error(&got, &want);
                assert!(error < tolerance(dtype), "{dtype:?} {rows}x{cols}: {error}");
            }
        }
    }

    #[test]
    fn silu_mul_halves_matches_candle() {
        let Some(gpu) = gpu() else { return };
        for dtype in DTYPES {
            for (rows, cols) in [(1, 1536), (5, 40), (512, 4864)] {
                let x = random(&[rows, 2 * cols], dtype, &gpu);
                let want = silu_mul_halves(&reference_input(&x)).unwrap();
                let got = silu_mul_halves(&x).unwrap();
                assert_eq!(got.dims(), &[rows, cols]);
                let error = relative_error(&got, &want);
                assert!(error < tolerance(dtype), "{dtype:?} {rows}x{cols}: {error}");
            }
        }
    }

    #[test]
    fn add_rms_norm_matches_candle() {
        let Some(gpu) = gpu() else { return };
        for dtype in DTYPES {
            for (rows, cols) in [(1, 576), (7, 40), (300, 1024), (3000, 896)] {
                let x = random(&[rows, cols], dtype, &gpu);
                let y = random(&[rows, cols], dtype, &gpu);
                let weight = random(&[cols], dtype, &gpu);
                let cpu = reference_input;
                let (want_sum, want_normed) =
                    add_rms_norm(&cpu(&x), &cpu(&y), &cpu(&weight), 1e-6).unwrap();
                let (sum, normed) = add_rms_norm(&x, &y, &weight, 1e-6).unwrap();
                for (got, want, what) in [(sum, want_sum, "sum"), (normed, want_normed, "norm")] {
                    let error = relative_error(&got, &want);
                    assert!(
                        error < tolerance(dtype),
                        "{dtype:?} {rows}x{cols} {what}: {error}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_probs_match_candle() {
        let Some(gpu) = gpu() else { return };
        for dtype in DTYPES {
            // One shape for each kernel: a warp a row holding 1, 16 and 4 keys a lane (the
            // last causal), and a block a row past 1,024 keys (its second pass over a row).
            // Small in rows: on cuda-emu each element is a host thread's work.
            for (batch, heads, t, with_bias, padded, causal) in [
                (2, 3, 5, true, true, false),
                (2, 3, 384, true, true, false),
                (2, 1, 1100, false, true, false),
                (2, 16, 77, false, false, true),
            ] {
                let scores = random(&[batch, heads, t, t], dtype, &gpu);
                let bias = with_bias.then(|| random(&[heads, t, t], dtype, &gpu));
                // Row b keeps its first t - 2b keys (at least one).
                let keep: Vec<f32> = (0..batch)
                    .flat_map(|b| {
                        (0..t).map(move |k| f32::from(u8::from(k + 2 * b < t.max(2 * b + 1))))
                    })
                    .collect();
                let keep = padded.then(|| Tensor::from_vec(keep, (batch, t), &gpu).unwrap());
                let cpu = reference_input;
                let (bias_cpu, keep_cpu) = (bias.as_ref().map(cpu), keep.as_ref().map(cpu));
                let want = attention_probs(
                    cpu(&scores),
                    &AttentionMask::new(bias_cpu.as_ref(), keep_cpu.as_ref(), causal),
                )
                .unwrap();
                let got = attention_probs(
                    scores.copy().unwrap(),
                    &AttentionMask::new(bias.as_ref(), keep.as_ref(), causal),
                )
                .unwrap();
                let error = relative_error(&got, &want);
                assert!(
                    error < tolerance(dtype),
                    "{dtype:?} {batch}x{heads}x{t}: {error}"
                );
            }
        }
    }

    #[test]
    fn head_split_and_merge_match_candle() {
        let Some(gpu) = gpu() else { return };
        for dtype in DTYPES {
            let (batch, t, heads, kv, d) = (3, 37, 16, 8, 128);
            let width = (heads + 2 * kv) * d;
            let rows = random(&[batch * t, width], dtype, &gpu);
            let rows_cpu = rows.to_device(&Device::Cpu).unwrap();
            for (n, offset) in [(heads, 0), (kv, heads * d), (kv, (heads + kv) * d)] {
                let got = split_heads(&rows, (batch, t), n, d, offset).unwrap();
                let want = split_heads(&rows_cpu, (batch, t), n, d, offset).unwrap();
                assert_eq!(
                    relative_error(&got, &want),
                    0.0,
                    "{dtype:?} split at {offset}"
                );
                let back = merge_heads(&got).unwrap();
                let want_back = merge_heads(&want).unwrap();
                assert_eq!(relative_error(&back, &want_back), 0.0, "{dtype:?} merge");
            }
        }
    }
}
