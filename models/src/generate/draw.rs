//! One sampled token from a row of logits: temperature, min-p, top-k and top-p, then a draw
//! by a uniform number the sequence's sampler gave. [`draw_token`] is the definition: the
//! host's sampler calls it, and it is the CPU reference of the device's kernel
//! (`sample_rows` in `embed/fused_kernels.cu`), through which [`sample_rows`] chooses the
//! tokens of a step's sampled rows where the logits are, so only their ids cross to the host.
//!
//! The kept set is the host's since issue 31: the finite logits divided by the temperature,
//! most likely first (ties by the lower id); those within `min_p` of the largest
//! probability; the first `top_k`; the shortest run of those whose probability reaches
//! `top_p`. The draw walks the kept tokens in id order, not likelihood order, which is the
//! same distribution, and lets the device find the token by prefix sums over the row in
//! place, with no sort of the vocabulary.

use candle_core::{DType, Tensor};

/// What one row's draw needs: the sampling parameters and the uniform number in `[0, 1)`
/// drawn from the sequence's stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    /// Greater than zero (zero is greedy, which never comes here).
    pub temperature: f32,
    /// Keep the `top_k` likeliest (0: all).
    pub top_k: u32,
    /// Keep the shortest likeliest run whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Keep the tokens at least `min_p` times as likely as the likeliest (0: all).
    pub min_p: f32,
    /// Where the draw falls in the kept tokens' probability, `[0, 1)`.
    pub uniform: f32,
}

/// The token `draw` picks from `logits`. With no finite logit, the first largest one (the
/// host's argmax).
pub fn draw_token(logits: &[f32], draw: &Draw) -> u32 {
    let (kept, weights) = kept_tokens(logits, draw);
    if kept.is_empty() {
        return argmax(logits);
    }
    let mut order: Vec<usize> = (0..kept.len()).collect();
    order.sort_unstable_by_key(|&i| kept[i]);
    let total: f32 = weights.iter().sum();
    let mut left = draw.uniform * total;
    for &i in &order {
        left -= weights[i];
        if left <= 0.0 {
            return kept[i];
        }
    }
    kept[*order.last().expect("kept is not empty")]
}

/// The tokens `draw` keeps, likeliest first (ties by id), and their weights
/// (`exp(l / t - max)`, not normalised).
pub fn kept_tokens(logits: &[f32], draw: &Draw) -> (Vec<u32>, Vec<f32>) {
    let temperature = draw.temperature;
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, logit)| logit.is_finite())
        .map(|(id, &logit)| (id as u32, logit / temperature))
        .collect();
    if candidates.is_empty() {
        return (Vec::new(), Vec::new());
    }
    candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = candidates[0].1;
    if draw.min_p > 0.0 {
        // p / p_max = exp(l - l_max) >= min_p.
        let floor = max + draw.min_p.ln();
        let keep = candidates.partition_point(|(_, logit)| *logit >= floor);
        candidates.truncate(keep.max(1));
    }
    if draw.top_k > 0 {
        candidates.truncate(draw.top_k as usize);
    }
    let mut weights: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
    if draw.top_p < 1.0 {
        let total: f32 = weights.iter().sum();
        let mut kept = 0.0;
        let mut keep = weights.len();
        for (i, weight) in weights.iter().enumerate() {
            kept += weight / total;
            if kept >= draw.top_p {
                keep = i + 1;
                break;
            }
        }
        weights.truncate(keep);
        candidates.truncate(keep);
    }
    (candidates.into_iter().map(|(id, _)| id).collect(), weights)
}

/// The first most likely token (the lowest index among equal maxima): greedy decoding's
/// pick, and a draw's for rows with nothing finite.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Each row's token (`logits`: `rows x vocab`, one [`Draw`] a row): drawn on the device by
/// the `sample_rows` kernel on a GPU (only the ids come back), by [`draw_token`] elsewhere.
pub fn sample_rows(logits: &Tensor, draws: &[Draw]) -> candle_core::Result<Vec<u32>> {
    let (rows, _) = logits.dims2()?;
    if rows != draws.len() {
        candle_core::bail!("sample_rows: {rows} rows of logits, {} draws", draws.len());
    }
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() && logits.is_contiguous() {
        let params: Vec<f32> = draws.iter().flat_map(cuda::params).collect();
        let params = Tensor::from_vec(params, (rows, cuda::PARAMS), logits.device())?;
        return logits
            .apply_op2_no_bwd(&params, &cuda::SampleRows)?
            .to_vec1::<u32>();
    }
    Ok(logits
        .to_dtype(DType::F32)?
        .to_vec2::<f32>()?
        .iter()
        .zip(draws)
        .map(|(row, draw)| draw_token(row, draw))
        .collect())
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CpuStorage, CudaStorage, DType, Layout, Result, Shape};

    use super::Draw;
    use crate::embed::fused_cuda::{block_per_row, dtype_suffix, kernel, view};

    /// Floats per row of the kernel's parameters.
    pub const PARAMS: usize = 5;

    /// A draw as the kernel reads it: temperature, top_k, top_p, min_p, uniform (top_k
    /// exact in f32 up to 2^24, past any vocabulary).
    pub fn params(draw: &Draw) -> [f32; PARAMS] {
        [
            draw.temperature,
            draw.top_k.min(1 << 24) as f32,
            draw.top_p,
            draw.min_p,
            draw.uniform,
        ]
    }

    /// Each row's drawn token: logits `rows x vocab` and parameters `rows x 5` (f32) in,
    /// u32 `rows` out.
    pub struct SampleRows;

    impl SampleRows {
        fn launch<T: CudaDType + DeviceRepr>(
            (logits, logits_layout): (&CudaStorage, &Layout),
            (params, params_layout): (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, Shape)> {
            let (rows, cols) = logits_layout.shape().dims2()?;
            if params_layout.shape().dims() != [rows, PARAMS] || params.dtype() != DType::F32 {
                candle_core::bail!(
                    "sample_rows wants f32 parameters of {rows} x {PARAMS}, not {:?} {:?}",
                    params.dtype(),
                    params_layout.shape()
                );
            }
            let dev = logits.device().clone();
            let x = view::<T>(logits, logits_layout)?;
            let p = view::<f32>(params, params_layout)?;
            // SAFETY: the kernel writes one id per row, every row.
            #[allow(unsafe_code)]
            let out = unsafe { dev.alloc::<u32>(rows)? };
            let name = format!("sample_rows_{}", dtype_suffix(logits.dtype())?);
            let (stream, func) = kernel(&dev, &name)?;
            let config = block_per_row(rows);
            let cols = cols as u32;
            let mut builder = stream.launch_builder(&func);
            builder.arg(&x).arg(&p).arg(&out).arg(&cols);
            // SAFETY: block r reads row r of `x` and of `p` and writes out[r].
            #[allow(unsafe_code)]
            if rows > 0 {
                unsafe { builder.launch(config) }.w()?;
            }
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
        }
    }

    impl candle_core::CustomOp2 for SampleRows {
        fn name(&self) -> &'static str {
            "resident-sample-rows"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!("resident-sample-rows runs on CUDA only (draw_token is the CPU's)")
        }

        fn cuda_fwd(
            &self,
            logits: &CudaStorage,
            logits_layout: &Layout,
            params: &CudaStorage,
            params_layout: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let (x, p) = ((logits, logits_layout), (params, params_layout));
            match logits.dtype() {
                DType::F32 => Self::launch::<f32>(x, p),
                DType::F16 => Self::launch::<half::f16>(x, p),
                DType::BF16 => Self::launch::<half::bf16>(x, p),
                other => candle_core::bail!("sample_rows takes f32, f16 or bf16, not {other:?}"),
            }
        }
    }
}

#[cfg(test)]
#[path = "draw_tests.rs"]
mod tests;
