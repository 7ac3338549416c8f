//! A projection's output split into heads, each head RMS-normed (Qwen3's query and key norms,
//! when the model has them) and rotated by its row's position, in one pass: the heads' columns
//! of `rows x width` rows in (the query's or the key's part of the fused QKV product),
//! `rows x heads x head_dim` out (the decoder's paged attention reads that), or heads first
//! per sequence, `sequences x heads x t x head_dim` (the encoders' batched attention products
//! read that), so nothing is transposed or copied.
//!
//! It replaces, per projection and layer, a transpose and a copy into candle's `(1, heads,
//! rows, head_dim)` rope layout, the rope kernel, and the copy back (and the norm's own
//! pass): six kernels a layer of the GPU step's ~35 (`generate-bench --profile`'s "head
//! norms, RoPE, layout copies", 2.1-2.4 ms of a step on an H100).
//!
//! One candle op, two implementations of one function: the CPU reference (`cpu_fwd`, rows in
//! parallel, f32 arithmetic, one rounding to the output dtype), which the CPU dense path runs,
//! and the CUDA kernel `rope_heads_*` (`embed/fused_kernels.cu`: a thread block per row and
//! head, a thread per rotated pair), tested against it.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::decoder::RopeStyle;

/// How the op lays out its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadsOut {
    /// `rows x heads x head_dim`.
    Rows,
    /// `rows / t x heads x t x head_dim`: the rows are sequences of `t` rows one after
    /// another, and each sequence's heads come first.
    PerSequence(usize),
}

/// The op: the projection's rows (`rows x width`) are the first operand, the step's `cos`
/// and `sin` (`rows x head_dim/2`, f32) the others.
pub struct RopeHeads<'a> {
    /// Heads in a row.
    pub heads: usize,
    /// Each head's width.
    pub head_dim: usize,
    /// The column of the rows where the first head starts.
    pub first_column: usize,
    /// Which dimensions rotate together.
    pub style: RopeStyle,
    /// Each head's RMSNorm weight (`head_dim`, the projection's dtype) and epsilon.
    pub norm: Option<(&'a Tensor, f64)>,
    /// The output's layout.
    pub out: HeadsOut,
}

/// The heads of `x`'s rows (`rows x width`, `op.heads` heads from column `op.first_column`)
/// as `op.out` lays them out, each head normed by `op.norm` and rotated by its row's
/// `cos`/`sin` (`rows x head_dim/2`, f32).
pub fn rope_heads(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    op: &RopeHeads<'_>,
) -> candle_core::Result<Tensor> {
    let (rows, width) = x.dims2()?;
    let head_dim = op.head_dim;
    let half = head_dim / 2;
    let norm_ok = op.norm.is_none_or(|(w, _)| {
        w.dims() == [head_dim] && w.dtype() == x.dtype() && w.device().same_device(x.device())
    });
    if op.heads == 0
        || head_dim == 0
        || op.first_column + op.heads * head_dim > width
        || !head_dim.is_multiple_of(2)
        || cos.dims() != [rows, half]
        || sin.dims() != [rows, half]
        || cos.dtype() != DType::F32
        || sin.dtype() != DType::F32
        || !norm_ok
        || matches!(op.out, HeadsOut::PerSequence(t) if t == 0 || !rows.is_multiple_of(t))
    {
        candle_core::bail!(
            "rope over {:?} in {} heads of {head_dim} from column {} to {:?} with cos {:?}/{:?} and norm {:?}",
            x.dims(),
            op.heads,
            op.first_column,
            op.out,
            cos.dims(),
            cos.dtype(),
            op.norm.map(|(w, _)| w.dims().to_vec())
        );
    }
    let out = x
        .contiguous()?
        .apply_op3_no_bwd(&cos.contiguous()?, &sin.contiguous()?, op)?;
    match op.out {
        HeadsOut::Rows => out.reshape((rows, op.heads, head_dim)),
        HeadsOut::PerSequence(t) => out.reshape((rows / t, op.heads, t, head_dim)),
    }
}

/// The norm weight's values as f32, from whatever device it is on.
fn norm_weights(norm: Option<(&Tensor, f64)>) -> candle_core::Result<Option<(Vec<f32>, f32)>> {
    norm.map(|(w, eps)| Ok((w.to_dtype(DType::F32)?.to_vec1::<f32>()?, eps as f32)))
        .transpose()
}

impl RopeHeads<'_> {
    fn cpu<T: WithDType>(
        &self,
        x: &[T],
        cos: &[f32],
        sin: &[f32],
        width: usize,
    ) -> candle_core::Result<Vec<T>> {
        let (head_dim, heads_width) = (self.head_dim, self.heads * self.head_dim);
        let half = head_dim / 2;
        let norm = norm_weights(self.norm)?;
        let mut out = vec![T::zero(); x.len() / width * heads_width];
        out.par_chunks_mut(heads_width)
            .zip(x.par_chunks(width))
            .enumerate()
            .for_each(|(row, (out, x))| {
                let x = &x[self.first_column..][..heads_width];
                let (cos, sin) = (&cos[row * half..][..half], &sin[row * half..][..half]);
                let mut v = vec![0f32; head_dim];
                for (out, x) in out.chunks_mut(head_dim).zip(x.chunks(head_dim)) {
                    for (v, x) in v.iter_mut().zip(x) {
                        *v = x.to_f64() as f32;
                    }
                    if let Some((weights, eps)) = &norm {
                        let mean = v.iter().map(|a| a * a).sum::<f32>() / head_dim as f32;
                        let scale = 1.0 / (mean + eps).sqrt();
                        for (v, w) in v.iter_mut().zip(weights) {
                            *v *= scale * w;
                        }
                    }
                    for i in 0..half {
                        let (a, b) = match self.style {
                            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                            RopeStyle::Halves => (i, i + half),
                        };
                        let (c, s) = (cos[i], sin[i]);
                        out[a] = T::from_f64(f64::from(v[a] * c - v[b] * s));
                        out[b] = T::from_f64(f64::from(v[a] * s + v[b] * c));
                    }
                }
            });
        Ok(match self.out {
            HeadsOut::Rows => out,
            HeadsOut::PerSequence(t) => heads_first(&out, t, self.heads, head_dim),
        })
    }
}

/// `rows x heads x d` values (`rows` sequences of `t` one after another) as `rows / t x
/// heads x t x d`.
fn heads_first<T: Copy>(rows: &[T], t: usize, heads: usize, d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len());
    for sequence in rows.chunks(t * heads * d) {
        for head in 0..heads {
            for row in sequence.chunks(heads * d) {
                out.extend_from_slice(&row[head * d..][..d]);
            }
        }
    }
    out
}

impl candle_core::CustomOp3 for RopeHeads<'_> {
    fn name(&self) -> &'static str {
        "resident-rope-heads"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        cos: &CpuStorage,
        cl: &Layout,
        sin: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        fn part<'s, T: WithDType>(s: &'s CpuStorage, l: &Layout) -> candle_core::Result<&'s [T]> {
            let all = s.as_slice::<T>()?;
            Ok(&all[l.start_offset()..l.start_offset() + l.shape().elem_count()])
        }
        let (rows, width) = xl.shape().dims2()?;
        let (cos, sin) = (part::<f32>(cos, cl)?, part::<f32>(sin, sl)?);
        let out = match x.dtype() {
            DType::F32 => CpuStorage::F32(self.cpu(part::<f32>(x, xl)?, cos, sin, width)?),
            DType::F16 => CpuStorage::F16(self.cpu(part::<half::f16>(x, xl)?, cos, sin, width)?),
            DType::BF16 => {
                CpuStorage::BF16(self.cpu(part::<half::bf16>(x, xl)?, cos, sin, width)?)
            }
            other => candle_core::bail!("rope_heads takes f32, f16 or bf16, not {other:?}"),
        };
        Ok((out, Shape::from((rows, self.heads * self.head_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        cos: &candle_core::CudaStorage,
        cl: &Layout,
        sin: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        cuda::forward(self, (x, xl), (cos, cl), (sin, sl))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape, Storage};

    use super::RopeHeads;
    use crate::embed::fused_cuda::{dtype_suffix, kernel, view};
    use crate::generate::decoder::RopeStyle;

    pub(super) fn forward(
        op: &RopeHeads<'_>,
        x: (&CudaStorage, &Layout),
        cos: (&CudaStorage, &Layout),
        sin: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        match x.0.dtype() {
            DType::F32 => launch::<f32>(op, x, cos, sin),
            DType::F16 => launch::<half::f16>(op, x, cos, sin),
            DType::BF16 => launch::<half::bf16>(op, x, cos, sin),
            other => candle_core::bail!("rope_heads takes f32, f16 or bf16, not {other:?}"),
        }
    }

    fn launch<T: CudaDType + DeviceRepr>(
        op: &RopeHeads<'_>,
        x: (&CudaStorage, &Layout),
        cos: (&CudaStorage, &Layout),
        sin: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, width) = x.1.shape().dims2()?;
        let head_dim = op.head_dim;
        let dev = x.0.device().clone();
        let (xv, cv, sv) = (
            view::<T>(x.0, x.1)?,
            view::<f32>(cos.0, cos.1)?,
            view::<f32>(sin.0, sin.1)?,
        );
        let guard;
        let (norm, eps) = match op.norm {
            Some((weight, eps)) => {
                guard = weight.storage_and_layout();
                let Storage::Cuda(storage) = &*guard.0 else {
                    candle_core::bail!("rope_heads' norm weight is not on the GPU");
                };
                (Some(view::<T>(storage, guard.1)?), eps as f32)
            }
            None => (None, 0.0),
        };
        // SAFETY: the kernel writes every element: a block per row and head, each thread
        // one rotated pair.
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(rows * op.heads * head_dim)? };
        let name = format!("rope_heads_{}", dtype_suffix(x.0.dtype())?);
        let (stream, func) = kernel(&dev, &name)?;
        let pairs = (head_dim / 2) as u32;
        let config = LaunchConfig {
            grid_dim: (rows as u32, op.heads as u32, 1),
            // Whole warps (the norm's block reduction wants them).
            block_dim: (pairs.div_ceil(32) * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let interleaved = i32::from(op.style == RopeStyle::Interleaved);
        let (heads, head_dim) = (op.heads as u32, head_dim as u32);
        let (x_stride, first_column) = (width as u32, op.first_column as u32);
        // The kernel's sequence length: 0 for rows.
        let seq_len = match op.out {
            super::HeadsOut::Rows => 0u32,
            super::HeadsOut::PerSequence(t) => t as u32,
        };
        let mut builder = stream.launch_builder(&func);
        builder.arg(&out).arg(&xv).arg(&cv).arg(&sv);
        // A null pointer for no norm: the kernel tests it.
        let null = 0u64;
        match &norm {
            Some(norm) => builder.arg(norm),
            None => builder.arg(&null),
        };
        builder
            .arg(&heads)
            .arg(&head_dim)
            .arg(&x_stride)
            .arg(&first_column)
            .arg(&seq_len)
            .arg(&interleaved)
            .arg(&eps);
        // SAFETY: `rope_heads` checked the shapes: x is rows x width with the heads within
        // it, cos and sin rows x head_dim/2, the norm head_dim; each block reads and writes
        // one head.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((rows, op.heads * op.head_dim)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    use super::super::device_ops::{max_abs_diff, test_devices as devices};

    /// candle's own ops, as the dense path ran them before: the layout copies, the norm,
    /// candle's rope.
    fn candle_way(
        x: &Tensor,
        heads: usize,
        norm: Option<(&Tensor, f64)>,
        cos: &Tensor,
        sin: &Tensor,
        style: RopeStyle,
    ) -> Tensor {
        let (rows, width) = x.dims2().unwrap();
        let mut x = x.reshape((rows, heads, width / heads)).unwrap();
        if let Some((w, eps)) = norm {
            x = candle_nn::ops::rms_norm(&x.contiguous().unwrap(), w, eps as f32).unwrap();
        }
        let x = x
            .transpose(0, 1)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
            .contiguous()
            .unwrap();
        let (cos, sin) = (
            cos.to_dtype(x.dtype()).unwrap(),
            sin.to_dtype(x.dtype()).unwrap(),
        );
        let x = match style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin),
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin),
        }
        .unwrap();
        x.squeeze(0)
            .unwrap()
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
    }

    #[test]
    fn heads_are_normed_and_rotated_as_candles_ops_do() {
        let (rows, heads, hd) = (7, 5, 64);
        for device in devices() {
            let x = Tensor::randn(0f32, 1.0, (rows, heads * hd), &device).unwrap();
            let angles: Vec<f32> = (0..rows * hd / 2)
                .map(|i| (i / (hd / 2)) as f32 * 0.37 / (1.0 + (i % (hd / 2)) as f32))
                .collect();
            let cos = Tensor::new(angles.iter().map(|a| a.cos()).collect::<Vec<_>>(), &device)
                .unwrap()
                .reshape((rows, hd / 2))
                .unwrap();
            let sin = Tensor::new(angles.iter().map(|a| a.sin()).collect::<Vec<_>>(), &device)
                .unwrap()
                .reshape((rows, hd / 2))
                .unwrap();
            let weight = Tensor::randn(1f32, 0.2, hd, &device).unwrap();
            let cases = [(DType::F32, 1e-5), (DType::F16, 1e-2), (DType::BF16, 8e-2)];
            let runs = |(dtype, _): &(DType, _)| {
                *dtype != DType::BF16 || crate::device::has_bf16_kernels(&device)
            };
            for (dtype, tolerance) in cases.into_iter().filter(runs) {
                let (x, weight) = (x.to_dtype(dtype).unwrap(), weight.to_dtype(dtype).unwrap());
                for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
                    for norm in [None, Some((&weight, 1e-6))] {
                        let op = RopeHeads {
                            heads,
                            head_dim: hd,
                            first_column: 0,
                            style,
                            norm,
                            out: HeadsOut::Rows,
                        };
                        let got = rope_heads(&x, &cos, &sin, &op).unwrap();
                        let want = candle_way(&x, heads, norm, &cos, &sin, style);
                        // The same heads as columns 3.. of wider rows (a fused QKV product).
                        let wide = Tensor::cat(
                            &[&x.narrow(1, 0, 3).unwrap(), &x, &x.narrow(1, 0, 5).unwrap()],
                            1,
                        )
                        .unwrap();
                        let within = RopeHeads {
                            first_column: 3,
                            ..op
                        };
                        let inner = rope_heads(&wide, &cos, &sin, &within).unwrap();
                        assert_eq!(
                            inner
                                .flatten_all()
                                .unwrap()
                                .to_dtype(DType::F32)
                                .unwrap()
                                .to_vec1::<f32>()
                                .unwrap(),
                            got.flatten_all()
                                .unwrap()
                                .to_dtype(DType::F32)
                                .unwrap()
                                .to_vec1::<f32>()
                                .unwrap(),
                            "{device:?} {dtype:?} {style:?}: columns within wider rows"
                        );
                        // Heads first per sequence (7 rows as one sequence; the encoders'
                        // layout): the same values, transposed.
                        let per_sequence = RopeHeads {
                            out: HeadsOut::PerSequence(rows),
                            ..op
                        };
                        let first = rope_heads(&x, &cos, &sin, &per_sequence).unwrap();
                        assert_eq!(first.dims(), &[1, heads, rows, hd]);
                        let transposed = got.transpose(0, 1).unwrap().unsqueeze(0).unwrap();
                        let as_f32 = |t: &Tensor| {
                            t.contiguous()
                                .unwrap()
                                .flatten_all()
                                .unwrap()
                                .to_dtype(DType::F32)
                                .unwrap()
                                .to_vec1::<f32>()
                                .unwrap()
                        };
                        assert_eq!(
                            as_f32(&first),
                            as_f32(&transposed),
                            "{device:?} {dtype:?} {style:?}: heads first"
                        );
                        assert_eq!(got.dims(), &[rows, heads, hd]);
                        let worst = max_abs_diff(&got, &want);
                        assert!(
                            worst <= tolerance,
                            "{device:?} {dtype:?} {style:?} norm {}: off by {worst}",
                            norm.is_some()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_shape_that_does_not_split_into_heads_is_refused() {
        let x = Tensor::zeros((2, 30), DType::F32, &Device::Cpu).unwrap();
        let cs = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let op = RopeHeads {
            heads: 4,
            head_dim: 8,
            first_column: 0,
            style: RopeStyle::Halves,
            norm: None,
            out: HeadsOut::Rows,
        };
        assert!(rope_heads(&x, &cs, &cs, &op).is_err());
        // Heads past the row's end.
        let op = RopeHeads {
            heads: 3,
            head_dim: 6,
            first_column: 14,
            ..op
        };
        assert!(rope_heads(&x, &cs, &cs, &op).is_err());
        // Two rows are not sequences of three.
        let x = Tensor::zeros((2, 8), DType::F32, &Device::Cpu).unwrap();
        let cs = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        let op = RopeHeads {
            heads: 1,
            first_column: 0,
            out: HeadsOut::PerSequence(3),
            ..op
        };
        assert!(rope_heads(&x, &cs, &cs, &op).is_err());
    }
}
