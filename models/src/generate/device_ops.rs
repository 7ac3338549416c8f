//! Two steps of the dense engine that candle does slowly on a GPU, on our own kernels there
//! (`embed/fused_kernels.cu`, built by `build.rs` with the encoders'), and as plain candle
//! and host code everywhere else, so both paths compute one function:
//! - [`write_rows`]: a step's keys and values into the KV cache. candle's `scatter_set`
//!   gives each thread one column and walks the rows one after another: a 512-row prefill
//!   step took 0.26 ms per write, 16 ms a step over 30 layers (`generate-bench --profile`).
//! - [`argmax_rows`]: the greedy token of each row, taken on the device, so that greedy rows
//!   bring back one id instead of the vocabulary's logits (37 MB a step at 191 rows: 10 ms of
//!   copy and 12 ms of host argmax, the same profile).
//! - [`listed_rows`]: a row's token's log-probability (a scored prompt token's, or the token
//!   a greedy or sampled row chose), the row's argmax, and its K likeliest tokens with
//!   theirs, taken where the logits are (the `listed_rows` kernel on a GPU), so a prefill of
//!   scored prompts, or a decode step that lists logprobs (`--logprobs`,
//!   `--prompt-logprobs K`), brings back 2 + 2K numbers a row instead of the vocabulary's
//!   logits (196 KB a row at SmolLM2's vocabulary) and a host log-softmax.

use candle_core::{DType, Device, Tensor};

use super::sampling;

/// Where a step's rows go in a layer's cache (`cache rows x width`): the cache row of each,
/// in the form the device's row write takes. Made once per step, used by every layer.
pub struct CacheRows {
    index: Tensor,
    /// One past the largest cache row written: a cache must have at least these rows.
    end: usize,
}

impl CacheRows {
    /// Row `i` of a step goes to cache row `at[i]`; rows are `width` wide.
    pub fn new(at: Vec<u32>, width: usize, device: &Device) -> candle_core::Result<Self> {
        let n = at.len();
        let end = at.iter().map(|&row| row as usize + 1).max().unwrap_or(0);
        let index = match device.is_cuda() {
            true => Tensor::from_vec(at, n, device)?,
            // scatter_set wants the index in the source's shape.
            false => Tensor::from_vec(at, (n, 1), device)?
                .broadcast_as((n, width))?
                .contiguous()?,
        };
        Ok(Self { index, end })
    }

    /// The index as the device's row write takes it (on a GPU: u32, one a row), for a CUDA
    /// graph's replays to overwrite.
    pub fn index(&self) -> &Tensor {
        &self.index
    }
}

/// `cache[at[i], :] = rows[i, :]`, in place, for `rows` (`n x width`, the cache's dtype; on
/// a GPU they may be columns of wider rows, as the value part of a fused QKV product is).
pub fn write_rows(cache: &Tensor, rows: &Tensor, at: &CacheRows) -> candle_core::Result<()> {
    // The kernel trusts the index: checked here, on the host, where it was made.
    if at.end > cache.dim(0)? {
        candle_core::bail!(
            "a KV write to row {} of a cache of {} rows",
            at.end - 1,
            cache.dim(0)?
        );
    }
    #[cfg(feature = "cuda")]
    if cache.device().is_cuda() {
        // Whole rows one after another, or a column range of them: the kernel takes a row
        // stride. Anything else is copied first.
        let rows = match rows.stride()[1] == 1 {
            true => rows.clone(),
            false => rows.contiguous()?,
        };
        return cache.inplace_op3(&rows, &at.index, &cuda::ScatterRows);
    }
    cache.scatter_set(&at.index, &rows.contiguous()?, 0)
}

/// The index of each row's largest logit (`rows x vocab`), the lowest among equals, as
/// [`sampling::argmax`] takes it on the host.
pub fn argmax_rows(logits: &Tensor) -> candle_core::Result<Vec<u32>> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() && logits.is_contiguous() {
        return logits.apply_op1_no_bwd(&cuda::ArgmaxRows)?.to_vec1::<u32>();
    }
    Ok(logits
        .to_dtype(DType::F32)?
        .to_vec2::<f32>()?
        .iter()
        .map(|row| sampling::argmax(row))
        .collect())
}

/// One row's listing ([`listed_rows`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ListedRow {
    /// The row's token with its log-probability and the likeliest tokens' (as many as asked).
    pub logprob: sampling::TokenLogprob,
    /// The row's likeliest token ([`argmax_rows`]'s).
    pub best: u32,
}

/// Each row's listing (`rows x vocab` logits, one token a row): the token's log-probability,
/// the row's argmax, and the `top` likeliest tokens with theirs, as the host's
/// [`sampling::token_logprob`] (its definition) gives them; on a GPU by the `listed_rows`
/// kernel, in f32 (the host sums in f64), so that 2 + 2 `top` numbers a row cross to the
/// host.
pub fn listed_rows(
    logits: &Tensor,
    tokens: &[u32],
    top: usize,
) -> candle_core::Result<Vec<ListedRow>> {
    let (rows, _) = logits.dims2()?;
    if rows != tokens.len() {
        candle_core::bail!(
            "listed_rows: {rows} rows of logits, {} tokens",
            tokens.len()
        );
    }
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() && logits.is_contiguous() {
        let vocab = logits.dim(1)?;
        let ids = Tensor::new(tokens, logits.device())?;
        let out = logits
            .apply_op2_no_bwd(&ids, &cuda::ListedRows { top })?
            .to_vec2::<f32>()?;
        return Ok(out
            .iter()
            .zip(tokens)
            .map(|(row, &token)| ListedRow {
                logprob: sampling::TokenLogprob {
                    token,
                    logprob: row[0],
                    // A pass that found nothing (a row of NaNs: the kernel never lists a
                    // NaN) lists no token.
                    top: (0..top)
                        .map(|k| (row[2 + k] as u32, row[2 + top + k]))
                        .filter(|&(id, _)| (id as usize) < vocab)
                        .collect(),
                },
                best: row[1] as u32,
            })
            .collect());
    }
    Ok(logits
        .to_dtype(DType::F32)?
        .to_vec2::<f32>()?
        .iter()
        .zip(tokens)
        .map(|(row, &token)| ListedRow {
            logprob: sampling::token_logprob(row, token, top),
            best: sampling::argmax(row),
        })
        .collect())
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Result, Shape};

    use crate::embed::fused_cuda::{
        block_per_row, destination, dtype_suffix, elementwise, kernel, view,
    };

    /// `dst[index[r], :] = src[r, :]`, in place: operands 2 and 3 are `src` (`rows x width`)
    /// and a u32 `index` (`rows`).
    pub struct ScatterRows;

    impl ScatterRows {
        fn launch<T: CudaDType + DeviceRepr>(
            dst: (&mut CudaStorage, &Layout),
            src: (&CudaStorage, &Layout),
            index: (&CudaStorage, &Layout),
        ) -> Result<()> {
            let (_, width) = dst.1.shape().dims2()?;
            let (rows, src_width) = src.1.shape().dims2()?;
            let src_stride = src.1.stride()[0];
            if src_width != width || index.1.shape().dims() != [rows] {
                candle_core::bail!(
                    "scatter_rows of {:?} by {:?} into {:?}",
                    src.1.shape(),
                    index.1.shape(),
                    dst.1.shape()
                );
            }
            let dev = dst.0.device().clone();
            // Rows of `width` elements, `src_stride` apart, from the layout's offset.
            let start = src.1.start_offset();
            let span = match rows {
                0 => 0,
                _ => (rows - 1) * src_stride + width,
            };
            if src.1.stride()[1] != 1 || src_stride < width {
                candle_core::bail!("scatter_rows wants rows of consecutive elements");
            }
            let src = src.0.as_cuda_slice::<T>()?.slice(start..start + span);
            let index_view = view::<u32>(index.0, index.1)?;
            let name = format!("scatter_rows_{}", dtype_suffix(dst.0.dtype())?);
            let (stream, func) = kernel(&dev, &name)?;
            let target = destination::<T>(dst.0, dst.1)?;
            let n = (rows * width) as u64;
            let config = elementwise(n);
            let (rows, width, src_stride) = (rows as u64, width as u32, src_stride as u64);
            let mut builder = stream.launch_builder(&func);
            builder
                .arg(target)
                .arg(&src)
                .arg(&index_view)
                .arg(&rows)
                .arg(&width)
                .arg(&src_stride);
            // SAFETY: reads rows of `width` from `src` (its slice spans them) and rows of
            // `index` (both checked), writes rows of `width` at the indices, which
            // `write_rows` checked against `dst`'s rows (the only caller: this module's op).
            #[allow(unsafe_code)]
            unsafe { builder.launch(config) }.w()?;
            Ok(())
        }
    }

    impl InplaceOp3 for ScatterRows {
        fn name(&self) -> &'static str {
            "resident-scatter-rows"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<()> {
            candle_core::bail!("resident-scatter-rows runs on CUDA only")
        }

        fn cuda_fwd(
            &self,
            dst: &mut CudaStorage,
            dl: &Layout,
            src: &CudaStorage,
            sl: &Layout,
            index: &CudaStorage,
            il: &Layout,
        ) -> Result<()> {
            if index.dtype() != DType::U32 || src.dtype() != dst.dtype() {
                candle_core::bail!("scatter_rows takes a u32 index and rows of the cache's dtype");
            }
            match dst.dtype() {
                DType::F32 => Self::launch::<f32>((dst, dl), (src, sl), (index, il)),
                DType::F16 => Self::launch::<half::f16>((dst, dl), (src, sl), (index, il)),
                DType::BF16 => Self::launch::<half::bf16>((dst, dl), (src, sl), (index, il)),
                other => candle_core::bail!("scatter_rows takes f32, f16 or bf16, not {other:?}"),
            }
        }
    }

    /// Each row's argmax (`rows x cols` in, u32 `rows` out).
    pub struct ArgmaxRows;

    impl ArgmaxRows {
        fn launch<T: CudaDType + DeviceRepr>(
            storage: &CudaStorage,
            layout: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let (rows, cols) = layout.shape().dims2()?;
            let dev = storage.device().clone();
            let x = view::<T>(storage, layout)?;
            // SAFETY: the kernel writes one index per row, every row.
            #[allow(unsafe_code)]
            let out = unsafe { dev.alloc::<u32>(rows)? };
            let name = format!("argmax_rows_{}", dtype_suffix(storage.dtype())?);
            let (stream, func) = kernel(&dev, &name)?;
            let config = block_per_row(rows);
            let cols = cols as u32;
            let mut builder = stream.launch_builder(&func);
            builder.arg(&x).arg(&out).arg(&cols);
            // SAFETY: block r reads row r's cols elements of `x` and writes out[r].
            #[allow(unsafe_code)]
            if rows > 0 {
                unsafe { builder.launch(config) }.w()?;
            }
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
        }
    }

    impl candle_core::CustomOp1 for ArgmaxRows {
        fn name(&self) -> &'static str {
            "resident-argmax-rows"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!("resident-argmax-rows runs on CUDA only")
        }

        fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            match storage.dtype() {
                DType::F32 => Self::launch::<f32>(storage, layout),
                DType::F16 => Self::launch::<half::f16>(storage, layout),
                DType::BF16 => Self::launch::<half::bf16>(storage, layout),
                other => candle_core::bail!("argmax_rows takes f32, f16 or bf16, not {other:?}"),
            }
        }
    }

    /// Each row's listing: logits `rows x vocab` and u32 tokens `rows` in, f32
    /// `rows x (2 + 2 top)` out (the kernel's layout: the token's log-probability, the argmax,
    /// `top` ids, their `top` log-probabilities).
    pub struct ListedRows {
        pub top: usize,
    }

    impl ListedRows {
        fn launch<T: CudaDType + DeviceRepr>(
            &self,
            (logits, logits_layout): (&CudaStorage, &Layout),
            (tokens, tokens_layout): (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, Shape)> {
            let (rows, cols) = logits_layout.shape().dims2()?;
            if tokens_layout.shape().dims() != [rows] || tokens.dtype() != DType::U32 {
                candle_core::bail!("listed_rows wants {rows} u32 tokens");
            }
            let dev = logits.device().clone();
            let x = view::<T>(logits, logits_layout)?;
            let ids = view::<u32>(tokens, tokens_layout)?;
            let width = 2 + 2 * self.top;
            // SAFETY: the kernel writes every float of every row (the top columns of each
            // of its passes, and the two before them).
            #[allow(unsafe_code)]
            let out = unsafe { dev.alloc::<f32>(rows * width)? };
            let name = format!("listed_rows_{}", dtype_suffix(logits.dtype())?);
            let (stream, func) = kernel(&dev, &name)?;
            let config = block_per_row(rows);
            let (cols, top) = (cols as u32, self.top as u32);
            let mut builder = stream.launch_builder(&func);
            builder.arg(&x).arg(&ids).arg(&out).arg(&cols).arg(&top);
            // SAFETY: block r reads row r of `x` and tokens[r] and writes row r of `out`.
            #[allow(unsafe_code)]
            if rows > 0 {
                unsafe { builder.launch(config) }.w()?;
            }
            let out = CudaStorage::wrap_cuda_slice(out, dev);
            Ok((out, Shape::from((rows, width))))
        }
    }

    impl candle_core::CustomOp2 for ListedRows {
        fn name(&self) -> &'static str {
            "resident-listed-rows"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!(
                "resident-listed-rows runs on CUDA only (token_logprob is the CPU's)"
            )
        }

        fn cuda_fwd(
            &self,
            logits: &CudaStorage,
            logits_layout: &Layout,
            tokens: &CudaStorage,
            tokens_layout: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let (x, t) = ((logits, logits_layout), (tokens, tokens_layout));
            match logits.dtype() {
                DType::F32 => self.launch::<f32>(x, t),
                DType::F16 => self.launch::<half::f16>(x, t),
                DType::BF16 => self.launch::<half::bf16>(x, t),
                other => candle_core::bail!("listed_rows takes f32, f16 or bf16, not {other:?}"),
            }
        }
    }
}

/// The largest absolute difference between two tensors of one shape, in f32.
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let f32_of = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
    };
    (f32_of(a) - f32_of(b))
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Deterministic values in [-1, 1): the kernels' tests' inputs, and the paged attention's
/// first-use check's (`attention_check`).
pub(crate) fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The largest absolute difference between a tensor's values and `want` (f32, in order).
#[cfg(test)]
pub(crate) fn max_abs_diff_to(got: &Tensor, want: &[f32]) -> f32 {
    let want = Tensor::from_slice(want, got.dims(), &Device::Cpu).unwrap();
    max_abs_diff(got, &want)
}

/// The CPU, and the first GPU where there is one (a `cuda` build on a GPU machine): where
/// the kernels' tests run.
#[cfg(test)]
pub(crate) fn test_devices() -> Vec<Device> {
    std::iter::once(Device::Cpu)
        .chain(crate::device::test_gpu())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_devices as devices;
    use crate::device::has_bf16_kernels;

    #[test]
    fn rows_land_where_the_index_says_and_nowhere_else() {
        for device in devices() {
            let dtypes = [DType::F32, DType::F16, DType::BF16];
            let runs = |dtype: &DType| *dtype != DType::BF16 || has_bf16_kernels(&device);
            for dtype in dtypes.into_iter().filter(runs) {
                let cache = Tensor::zeros((6, 4), dtype, &device).unwrap();
                let rows = Tensor::arange(1f32, 13., &device)
                    .unwrap()
                    .reshape((3, 4))
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let at = CacheRows::new(vec![4, 0, 2], 4, &device).unwrap();
                // The rows as columns 2..6 of wider ones (a fused QKV product's values).
                let wide = Tensor::cat(
                    &[
                        &rows.narrow(1, 0, 2).unwrap(),
                        &rows,
                        &rows.narrow(1, 1, 3).unwrap(),
                    ],
                    1,
                )
                .unwrap();
                write_rows(&cache, &wide.narrow(1, 2, 4).unwrap(), &at).unwrap();
                let got = cache
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                let zero = vec![0f32; 4];
                assert_eq!(
                    got,
                    vec![
                        vec![5., 6., 7., 8.],
                        zero.clone(),
                        vec![9., 10., 11., 12.],
                        zero.clone(),
                        vec![1., 2., 3., 4.],
                        zero,
                    ],
                    "{device:?} {dtype:?}"
                );
            }
        }
    }

    /// Rows with many equal logits (997 distinct values over 3,000 tokens), so the top
    /// tokens' order among equals (the lower id first) is tested too.
    #[test]
    fn listed_rows_give_the_hosts_log_probabilities_top_tokens_and_argmax() {
        let vocab = 3000;
        let rows: Vec<Vec<f32>> = (0..5)
            .map(|r| {
                (0..vocab)
                    .map(|i| ((i * 7919 + r * 131) % 997) as f32 * 0.02 - 9.0)
                    .collect()
            })
            .collect();
        let tokens: Vec<u32> = rows
            .iter()
            .enumerate()
            .map(|(r, row)| match r % 2 {
                0 => sampling::argmax(row),
                _ => (r * 577) as u32,
            })
            .collect();
        for device in devices() {
            let logits = Tensor::from_vec(rows.concat(), (rows.len(), vocab), &device).unwrap();
            for top in [0, 1, 5, 20] {
                let listed = listed_rows(&logits, &tokens, top).unwrap();
                for ((row, &token), got) in rows.iter().zip(&tokens).zip(listed) {
                    let host = sampling::token_logprob(row, token, top);
                    let close = |a: f32, b: f32| (a - b).abs() < 1e-4;
                    assert_eq!(got.best, sampling::argmax(row), "{device:?}");
                    assert_eq!(got.logprob.token, token);
                    assert!(close(got.logprob.logprob, host.logprob), "{device:?} {top}");
                    let ids = |l: &sampling::TokenLogprob| -> Vec<u32> {
                        l.top.iter().map(|t| t.0).collect()
                    };
                    assert_eq!(ids(&got.logprob), ids(&host), "{device:?} top {top}");
                    let values = got.logprob.top.iter().zip(&host.top);
                    assert!(values.into_iter().all(|(a, b)| close(a.1, b.1)));
                }
            }
        }
    }

    #[test]
    fn argmax_takes_the_lowest_index_among_equals_as_the_host_does() {
        let vocab = 1000;
        let rows: Vec<Vec<f32>> = vec![
            (0..vocab)
                .map(|i| ((i * 7919) % 997) as f32 * 0.01)
                .collect(),
            // Ties at 3 and 700: the lowest wins.
            (0..vocab)
                .map(|i| if i == 3 || i == 700 { 5.0 } else { -1.0 })
                .collect(),
            vec![f32::NEG_INFINITY; vocab],
            (0..vocab).map(|i| -(i as f32)).collect(),
        ];
        let expected: Vec<u32> = rows.iter().map(|r| sampling::argmax(r)).collect();
        assert_eq!(expected[1], 3);
        for device in devices() {
            for dtype in [DType::F32, DType::BF16] {
                let flat: Vec<f32> = rows.concat();
                let logits = Tensor::from_vec(flat, (rows.len(), vocab), &device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                // bf16 rounds the first row's values: the host argmax of the rounded logits.
                let rounded: Vec<u32> = logits
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap()
                    .iter()
                    .map(|r| sampling::argmax(r))
                    .collect();
                assert_eq!(
                    argmax_rows(&logits).unwrap(),
                    rounded,
                    "{device:?} {dtype:?}"
                );
            }
        }
    }
}
