//! Attention for the encoders without materialised scores: `softmax(q k^T * scale + bias) v`
//! per sequence and head, causal or not, padding keys left out, grouped-query heads sharing
//! their K/V head, the output with its heads merged (`[seqs * t, heads * head_dim]`, what the
//! output projection takes). The mask and bias are those of [`super::fused::AttentionMask`].
//!
//! One candle op with two implementations of one function:
//! - the CPU reference (the op's `cpu_fwd`): a two-pass softmax in f32 per query
//!   row and head (vectorised dot products), rows in parallel; f16 and bf16 go through f32.
//!   It is what the kernel is tested against; the CPU encoders keep their batched products;
//! - the CUDA kernel (`flash_attention_*` in `embed/flash_attention.cuh`): FlashAttention-2
//!   on tensor cores (`mma.sync`, f16 and bf16 in, f32 accumulators), one thread block per
//!   64 queries of a head; the scores and probabilities live in registers only. It takes
//!   heads of 32, 64 or 128 (MiniLM, MPNet and BERT, Qwen3): [`flash_attention_fits`] says
//!   when; the encoders fall back to their materialised attention otherwise (f32, other head
//!   widths, the CPU).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::generate::lanes::{self, Width};

/// The op: queries `[seqs, heads, t, head_dim]`, keys and values `[seqs, kv_heads, t,
/// head_dim]`.
#[derive(Clone, Copy, Debug)]
pub struct FlashAttention<'a> {
    /// Whether query `i` sees only keys `0..=i` (decoder-style encoders such as Qwen3).
    pub causal: bool,
    /// Multiplies the scores (1 where the scale is folded into the queries).
    pub scale: f32,
    /// `[seqs, t]`: keys where it is 0 are left out (padding).
    pub keep: Option<&'a Tensor>,
    /// `[heads, t, t]`, added to the scaled scores (MPNet's relative position bias).
    pub bias: Option<&'a Tensor>,
}

/// The op as launched: the mask and bias contiguous, f32 for the mask, the queries' dtype
/// for the bias (f32 on the CPU).
struct Prepared {
    causal: bool,
    scale: f32,
    keep: Option<Tensor>,
    bias: Option<Tensor>,
}

/// Head widths the kernel is built for.
const HEAD_WIDTHS: [usize; 3] = [32, 64, 128];

/// Whether the encoders should run attention as the kernel for `dtype` heads of `head_dim`
/// on `device`: a kernel exists for them ([`kernel_exists`]) and, the first time each GPU,
/// dtype and width are asked, it gave the CPU reference's answer on a small random case.
/// Where it did not, the error is logged and the encoders keep their materialised
/// attention: a kernel that is wrong on some GPU costs speed there, never wrong vectors.
pub fn flash_attention_fits(device: &Device, dtype: DType, head_dim: usize) -> bool {
    static CHECKED: Mutex<BTreeMap<(usize, &str, usize), bool>> = Mutex::new(BTreeMap::new());
    if !kernel_exists(device, dtype, head_dim) {
        return false;
    }
    let key = (device_ordinal(device), dtype.as_str(), head_dim);
    let mut checked = CHECKED.lock().unwrap_or_else(PoisonError::into_inner);
    *checked
        .entry(key)
        .or_insert_with(|| match self_check(device, dtype, head_dim) {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(
                    %error,
                    ?dtype,
                    head_dim,
                    "the flash attention kernel failed its check on this GPU; attention runs \
                     materialised (slower, same vectors)"
                );
                false
            }
        })
}

/// Whether a kernel exists for `dtype` heads of `head_dim` on `device`: a CUDA GPU with f16
/// (compute capability 7.5 and up) or bf16 (8.0 and up), and heads of 32, 64 or 128.
pub fn kernel_exists(device: &Device, dtype: DType, head_dim: usize) -> bool {
    if !cfg!(feature = "cuda") || !device.is_cuda() || !HEAD_WIDTHS.contains(&head_dim) {
        return false;
    }
    let least = match dtype {
        DType::F16 => (7, 5),
        DType::BF16 => (8, 0),
        _ => return false,
    };
    crate::device::compute_capability(device).is_some_and(|cc| cc >= least)
}

fn device_ordinal(device: &Device) -> usize {
    match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
        _ => usize::MAX,
    }
}

/// The kernel against the CPU reference on one small case (two sequences of 80 tokens
/// across two tiles, grouped heads, causal, a padded key): an error says by how much.
fn self_check(device: &Device, dtype: DType, head_dim: usize) -> candle_core::Result<()> {
    let (seqs, heads, kv_heads, t) = (2, 4, 2, 80);
    let random = |heads: usize| {
        Tensor::randn(0f32, 1.0, (seqs, heads, t, head_dim), &Device::Cpu)?.to_dtype(dtype)
    };
    let (q, k, v) = (random(heads)?, random(kv_heads)?, random(kv_heads)?);
    let keep: Vec<f32> = (0..seqs * t).map(|i| f32::from(u8::from(i != 7))).collect();
    let keep = Tensor::from_vec(keep, (seqs, t), &Device::Cpu)?;
    let op = |keep| FlashAttention {
        causal: true,
        scale: 1.0 / (head_dim as f32).sqrt(),
        keep,
        bias: None,
    };
    let reference = flash_attention(&q, &k, &v, &op(Some(&keep)))?.to_dtype(DType::F32)?;
    let on = |x: &Tensor| x.to_device(device);
    let keep_on_device = on(&keep)?;
    let got = flash_attention(&on(&q)?, &on(&k)?, &on(&v)?, &op(Some(&keep_on_device)))?
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?;
    let worst = (got - reference)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    // Outputs are averages of values of about 1: bf16 rounds at 2^-8 of them.
    if worst.is_nan() || worst > 0.05 {
        candle_core::bail!("off the CPU reference by {worst}");
    }
    Ok(())
}

/// `softmax(q k^T * scale + bias) v` (causal when `op.causal`, padding keys left out),
/// heads merged: `[seqs * t, heads * head_dim]` in the queries' dtype. On a GPU only where
/// [`flash_attention_fits`].
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    op: &FlashAttention<'_>,
) -> candle_core::Result<Tensor> {
    let (seqs, heads, t, head_dim) = q.dims4()?;
    let (_, kv_heads, _, _) = k.dims4()?;
    if kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || k.dims() != [seqs, kv_heads, t, head_dim]
        || v.dims() != k.dims()
        || k.dtype() != q.dtype()
        || v.dtype() != q.dtype()
        || op.keep.is_some_and(|keep| keep.dims() != [seqs, t])
        || op.bias.is_some_and(|bias| bias.dims() != [heads, t, t])
    {
        candle_core::bail!(
            "flash attention takes queries [seqs, heads, t, d] and keys and values [seqs, \
             kv_heads, t, d] of one dtype, heads a multiple of kv_heads, a mask [seqs, t] and a \
             bias [heads, t, t]; got {:?} {:?}, {:?} {:?}, {:?} {:?}, mask {:?}, bias {:?}",
            q.dims(),
            q.dtype(),
            k.dims(),
            k.dtype(),
            v.dims(),
            v.dtype(),
            op.keep.map(Tensor::dims),
            op.bias.map(Tensor::dims)
        );
    }
    if q.device().is_cuda() && !kernel_exists(q.device(), q.dtype(), head_dim) {
        candle_core::bail!(
            "flash attention on this GPU takes f16 (compute 7.5+) or bf16 (8.0+) heads of \
             {HEAD_WIDTHS:?}, not {:?} heads of {head_dim}; use the materialised attention",
            q.dtype()
        );
    }
    if seqs * t == 0 {
        return Tensor::zeros((seqs * t, heads * head_dim), q.dtype(), q.device());
    }
    if q.device().is_cpu() && q.dtype() != DType::F32 {
        let f32 = |x: &Tensor| x.to_dtype(DType::F32);
        return flash_attention(&f32(q)?, &f32(k)?, &f32(v)?, op)?.to_dtype(q.dtype());
    }
    // The kernel reads 16-byte chunks: every input whole, contiguous and 16-byte aligned.
    let whole = |x: &Tensor| match x.is_contiguous() && x.layout().start_offset().is_multiple_of(8)
    {
        true => Ok(x.clone()),
        false => x.copy(),
    };
    let prepared = Prepared {
        causal: op.causal,
        scale: op.scale,
        keep: op
            .keep
            .map(|keep| whole(&keep.to_dtype(DType::F32)?))
            .transpose()?,
        bias: op
            .bias
            .map(|bias| whole(&bias.to_dtype(q.dtype())?))
            .transpose()?,
    };
    whole(q)?.apply_op3_no_bwd(&whole(k)?, &whole(v)?, &prepared)
}

/// The values of a CPU tensor, f32.
fn host(x: Option<&Tensor>) -> candle_core::Result<Option<Vec<f32>>> {
    x.map(|x| x.flatten_all()?.to_vec1::<f32>()).transpose()
}

impl Prepared {
    /// The reference: per query row and head, scores in f32 with [`lanes::dot`] (keys left
    /// out as -inf), a two-pass softmax, the weighted values summed in f32; a row that sees
    /// no key gives zeros.
    fn cpu(
        &self,
        (q, k, v): (&[f32], &[f32], &[f32]),
        shape: Shape4,
    ) -> candle_core::Result<Vec<f32>> {
        let Shape4 {
            heads,
            kv_heads,
            t,
            head_dim: d,
            ..
        } = shape;
        let (keep, bias) = (host(self.keep.as_ref())?, host(self.bias.as_ref())?);
        let group = heads / kv_heads;
        let width = heads * d;
        let rows = q.len() / width;
        let mut out = vec![0f32; rows * width];
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(row, out)| {
                let (seq, i) = (row / t, row % t);
                let keys = if self.causal { i + 1 } else { t };
                let seen = |j: usize| keep.as_ref().is_none_or(|keep| keep[seq * t + j] != 0.0);
                let mut scores = vec![0f32; keys];
                for head in 0..heads {
                    let query = &q[((seq * heads + head) * t + i) * d..][..d];
                    let kv = (seq * kv_heads + head / group) * t * d;
                    for (j, score) in scores.iter_mut().enumerate() {
                        let key = &k[kv + j * d..][..d];
                        let added = bias.as_ref().map_or(0.0, |b| b[(head * t + i) * t + j]);
                        *score = match seen(j) {
                            true => lanes::dot(Width::Eight, query, key) * self.scale + added,
                            false => f32::NEG_INFINITY,
                        };
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if max == f32::NEG_INFINITY {
                        continue;
                    }
                    let mut total = 0f32;
                    let acc = &mut out[head * d..][..d];
                    for (j, score) in scores.iter().enumerate() {
                        let p = (score - max).exp();
                        total += p;
                        for (a, x) in acc.iter_mut().zip(&v[kv + j * d..][..d]) {
                            *a += p * x;
                        }
                    }
                    acc.iter_mut().for_each(|a| *a /= total);
                }
            });
        Ok(out)
    }
}

/// The op's dimensions.
#[derive(Clone, Copy)]
struct Shape4 {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    seqs: usize,
    heads: usize,
    kv_heads: usize,
    t: usize,
    head_dim: usize,
}

impl Shape4 {
    fn of(q: &Layout, k: &Layout) -> candle_core::Result<Self> {
        let (seqs, heads, t, head_dim) = q.shape().dims4()?;
        let kv_heads = k.shape().dims4()?.1;
        Ok(Self {
            seqs,
            heads,
            kv_heads,
            t,
            head_dim,
        })
    }

    fn out(&self) -> Shape {
        Shape::from((self.seqs * self.t, self.heads * self.head_dim))
    }
}

impl candle_core::CustomOp3 for Prepared {
    fn name(&self) -> &'static str {
        "resident-flash-attention"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        ql: &Layout,
        k: &CpuStorage,
        kl: &Layout,
        v: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        fn part<'s>(s: &'s CpuStorage, l: &Layout) -> candle_core::Result<&'s [f32]> {
            let all = s.as_slice::<f32>()?;
            Ok(&all[l.start_offset()..l.start_offset() + l.shape().elem_count()])
        }
        if q.dtype() != DType::F32 {
            candle_core::bail!("flash attention on the CPU takes f32 (`flash_attention` converts)");
        }
        let shape = Shape4::of(ql, kl)?;
        let out = self.cpu((part(q, ql)?, part(k, kl)?, part(v, vl)?), shape)?;
        Ok((CpuStorage::F32(out), shape.out()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        k: &candle_core::CudaStorage,
        kl: &Layout,
        v: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        cuda::forward(self, (q, ql), (k, kl), (v, vl))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

    use super::{Prepared, Shape4};
    use crate::embed::fused_cuda::{dtype_suffix, kernel, view};

    /// Queries a thread block takes (16 per warp) and its threads: `FA_QUERIES` and
    /// `FA_WARPS` in the kernel.
    const QUERIES: usize = 64;
    const THREADS: u32 = 128;

    type Input<'a> = (&'a CudaStorage, &'a Layout);

    pub(super) fn forward(
        op: &Prepared,
        q: Input<'_>,
        k: Input<'_>,
        v: Input<'_>,
    ) -> Result<(CudaStorage, Shape)> {
        match q.0.dtype() {
            DType::F16 => launch::<half::f16>(op, q, k, v),
            DType::BF16 => launch::<half::bf16>(op, q, k, v),
            other => candle_core::bail!("flash attention takes f16 or bf16, not {other:?}"),
        }
    }

    /// The device view of a mask or bias (on the queries' GPU).
    fn device_view<'a, T: CudaDType>(
        (storage, layout): &'a (impl std::ops::Deref<Target = Storage>, &Layout),
    ) -> Result<CudaView<'a, T>> {
        let Storage::Cuda(storage) = &**storage else {
            candle_core::bail!("flash attention's mask and bias must be on the queries' GPU");
        };
        view::<T>(storage, layout)
    }

    fn launch<T: CudaDType + DeviceRepr>(
        op: &Prepared,
        q: Input<'_>,
        k: Input<'_>,
        v: Input<'_>,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = Shape4::of(q.1, k.1)?;
        let dev = q.0.device().clone();
        let (qv, kv, vv) = (
            view::<T>(q.0, q.1)?,
            view::<T>(k.0, k.1)?,
            view::<T>(v.0, v.1)?,
        );
        let keep_storage = op.keep.as_ref().map(Tensor::storage_and_layout);
        let bias_storage = op.bias.as_ref().map(Tensor::storage_and_layout);
        let keep = keep_storage.as_ref().map(device_view::<f32>).transpose()?;
        let bias = bias_storage.as_ref().map(device_view::<T>).transpose()?;
        // SAFETY: the kernel writes every element: a block per 64 queries of each head of
        // each sequence, each writing its queries' head_dim values (rows past t are not rows
        // of the output).
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(shape.out().elem_count())? };
        let name = format!(
            "flash_attention_{}_d{}",
            dtype_suffix(q.0.dtype())?,
            shape.head_dim
        );
        let (stream, func) = kernel(&dev, &name)?;
        let config = LaunchConfig {
            grid_dim: (
                shape.t.div_ceil(QUERIES) as u32,
                shape.heads as u32,
                shape.seqs as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (t, heads, kv_heads) = (shape.t as u32, shape.heads as u32, shape.kv_heads as u32);
        let (null, causal) = (0u64, i32::from(op.causal));
        let mut builder = stream.launch_builder(&func);
        builder.arg(&out).arg(&qv).arg(&kv).arg(&vv);
        match &keep {
            Some(keep) => builder.arg(keep),
            None => builder.arg(&null),
        };
        match &bias {
            Some(bias) => builder.arg(bias),
            None => builder.arg(&null),
        };
        builder
            .arg(&t)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&causal)
            .arg(&op.scale);
        // SAFETY: `flash_attention` checked the shapes (keys and values [seqs, kv_heads, t,
        // d], heads a multiple of kv_heads, the mask [seqs, t] f32, the bias [heads, t, t] in
        // the queries' dtype), the dtype and head width (a kernel exists for them, on this
        // GPU's capability) and that every input is contiguous and 16-byte aligned; the
        // kernel reads rows below t only.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), shape.out()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::generate::device_ops::test_devices as devices;

    /// Deterministic values in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
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

    /// Extras of a case: a padding mask (sequence `s` keeps its first `t - 5 s` keys) and a
    /// random bias.
    #[derive(Clone, Copy)]
    struct Extras {
        padded: bool,
        biased: bool,
    }

    const PLAIN: Extras = Extras {
        padded: false,
        biased: false,
    };

    /// The formula in f64, heads merged: what the op must equal. `keep` `[seqs, t]`, `bias`
    /// `[heads, t, t]`.
    fn expected(
        (q, k, v): (&[f32], &[f32], &[f32]),
        (keep, bias): (Option<&[f32]>, Option<&[f32]>),
        shape: Shape4,
        (causal, scale): (bool, f32),
    ) -> Vec<f32> {
        let Shape4 {
            seqs,
            heads,
            kv_heads,
            t,
            head_dim: d,
        } = shape;
        let mut out = vec![0f32; seqs * t * heads * d];
        let queries =
            (0..seqs).flat_map(|s| (0..heads).flat_map(move |h| (0..t).map(move |i| (s, h, i))));
        for (s, h, i) in queries {
            let query = &q[((s * heads + h) * t + i) * d..][..d];
            let kv = (s * kv_heads + h / (heads / kv_heads)) * t * d;
            let seen: Vec<usize> = (0..t)
                .filter(|&j| (!causal || j <= i) && keep.is_none_or(|keep| keep[s * t + j] != 0.0))
                .collect();
            let scores: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    let key = &k[kv + j * d..][..d];
                    let dot: f64 = query.iter().zip(key).map(|(a, b)| f64::from(a * b)).sum();
                    dot * f64::from(scale) + bias.map_or(0.0, |b| f64::from(b[(h * t + i) * t + j]))
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..d {
                let value: f64 = seen
                    .iter()
                    .zip(&weights)
                    .map(|(&j, w)| w * f64::from(v[kv + j * d + c]))
                    .sum();
                if total > 0.0 {
                    out[(s * t + i) * heads * d + h * d + c] = (value / total) as f32;
                }
            }
        }
        out
    }

    fn case(shape: Shape4, causal: bool, extras: Extras, seed: u64) {
        let Shape4 {
            seqs,
            heads,
            kv_heads,
            t,
            head_dim: d,
        } = shape;
        let scale = 1.0 / (d as f32).sqrt();
        // Scores of a few units, as trained models give: softmax neither flat nor one-hot.
        let q: Vec<f32> = noise(seqs * heads * t * d, seed)
            .iter()
            .map(|x| x * 3.0)
            .collect();
        let k = noise(seqs * kv_heads * t * d, seed + 1);
        let v = noise(seqs * kv_heads * t * d, seed + 2);
        let keep: Option<Vec<f32>> = extras.padded.then(|| {
            (0..seqs * t)
                .map(|r| f32::from(u8::from(r % t + 5 * (r / t) < t)))
                .collect()
        });
        let bias: Option<Vec<f32>> = extras.biased.then(|| noise(heads * t * t, seed + 3));
        let want = expected(
            (&q, &k, &v),
            (keep.as_deref(), bias.as_deref()),
            shape,
            (causal, scale),
        );
        for device in devices() {
            for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::F16, 4e-3), (DType::BF16, 3e-2)]
            {
                if device.is_cuda() && !kernel_exists(&device, dtype, d) {
                    continue;
                }
                let tensor = |data: &[f32], shape: &[usize]| {
                    Tensor::from_slice(data, shape, &device)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                let keep = keep.as_ref().map(|keep| tensor(keep, &[seqs, t]));
                let bias = bias.as_ref().map(|bias| tensor(bias, &[heads, t, t]));
                let op = FlashAttention {
                    causal,
                    scale,
                    keep: keep.as_ref(),
                    bias: bias.as_ref(),
                };
                let (q, k, v) = (
                    tensor(&q, &[seqs, heads, t, d]),
                    tensor(&k, &[seqs, kv_heads, t, d]),
                    tensor(&v, &[seqs, kv_heads, t, d]),
                );
                let got = flash_attention(&q, &k, &v, &op).unwrap();
                assert_eq!(got.dims(), &[seqs * t, heads * d]);
                let got: Vec<f32> = got
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= tolerance,
                    "{device:?} {dtype:?} {seqs} seqs of {t}, {heads}/{kv_heads} heads of {d}, \
                     causal {causal}, padded {}, biased {}: off by {worst}",
                    extras.padded,
                    extras.biased
                );
            }
        }
    }

    fn shape(seqs: usize, heads: usize, kv_heads: usize, t: usize, head_dim: usize) -> Shape4 {
        Shape4 {
            seqs,
            heads,
            kv_heads,
            t,
            head_dim,
        }
    }

    /// Qwen3-0.6B's heads (16 over 8 KV heads of 128) and smaller groups, lengths around
    /// the kernel's 64-key tiles: one token, a tile less one, a tile and one, several tiles.
    #[test]
    fn causal_attention_equals_the_formula_across_tile_edges() {
        case(shape(2, 16, 8, 1, 128), true, PLAIN, 1);
        case(shape(2, 16, 8, 63, 128), true, PLAIN, 2);
        case(shape(1, 16, 8, 130, 128), true, PLAIN, 3);
        case(shape(3, 4, 1, 65, 64), true, PLAIN, 4);
        case(shape(1, 2, 2, 200, 32), true, PLAIN, 5);
    }

    /// Bidirectional (BERT-style) attention: every query sees every key of its sequence but
    /// the padding; MPNet's bias added to the scores; a sequence of padding only gives zeros.
    #[test]
    fn full_attention_with_padding_and_bias_equals_the_formula() {
        let padded = Extras {
            padded: true,
            biased: false,
        };
        let both = Extras {
            padded: true,
            biased: true,
        };
        case(shape(2, 12, 12, 77, 32), false, PLAIN, 6);
        case(shape(3, 12, 12, 70, 32), false, padded, 7);
        case(shape(2, 12, 12, 128, 64), false, both, 8);
        case(shape(2, 4, 2, 33, 128), false, both, 9);
        // t = 10: the third sequence keeps no key.
        case(shape(3, 2, 2, 10, 64), false, padded, 10);
        case(shape(2, 4, 2, 66, 64), true, both, 11);
    }

    #[test]
    fn mismatched_keys_are_refused_with_the_shapes() {
        let device = Device::Cpu;
        let q = Tensor::zeros((1, 4, 8, 32), DType::F32, &device).unwrap();
        let kv = Tensor::zeros((1, 3, 8, 32), DType::F32, &device).unwrap();
        let op = FlashAttention {
            causal: true,
            scale: 1.0,
            keep: None,
            bias: None,
        };
        let error = flash_attention(&q, &kv, &kv, &op).unwrap_err().to_string();
        assert!(error.contains("heads a multiple of kv_heads"), "{error}");
        assert!(error.contains("[1, 3, 8, 32]"), "{error}");
    }

    #[test]
    fn the_cpu_and_f32_never_fit_the_kernel() {
        assert!(!flash_attention_fits(&Device::Cpu, DType::BF16, 128));
        for device in devices().into_iter().filter(Device::is_cuda) {
            assert!(!flash_attention_fits(&device, DType::F32, 128));
            assert!(!flash_attention_fits(&device, DType::F16, 80));
        }
    }

    /// On a GPU, the first-use check passes for every kernel this GPU has (it runs the same
    /// comparison the encoders rely on).
    #[test]
    fn the_first_use_check_passes_for_each_kernel() {
        for device in devices().into_iter().filter(Device::is_cuda) {
            for dtype in [DType::F16, DType::BF16] {
                for width in HEAD_WIDTHS {
                    if kernel_exists(&device, dtype, width) {
                        self_check(&device, dtype, width).unwrap();
                        assert!(flash_attention_fits(&device, dtype, width));
                    }
                }
            }
        }
        assert!(
            self_check(&Device::Cpu, DType::F32, 64).is_ok(),
            "the CPU against itself"
        );
    }
}
