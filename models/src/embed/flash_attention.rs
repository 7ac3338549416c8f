//! Attention for the encoders without materialised scores: `softmax(q k^T * scale + bias) v`
//! per sequence and head, causal or not, padding keys left out, grouped-query heads sharing
//! their K/V head, the output with its heads merged (`[seqs * t, heads * head_dim]`, what the
//! output projection takes). The mask and bias are those of [`super::fused::AttentionMask`].
//! Each input's heads are read where they are ([`Heads`]): stacked `[seqs, heads, t, d]`, or
//! side by side in the rows of a fused QKV product, so that no head is copied out first.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Layout, Tensor};
use rayon::prelude::*;

use crate::generate::lanes::{self, Width};

/// Where an input's heads are.
#[derive(Clone, Copy, Debug)]
pub enum Heads<'a> {
    /// `[seqs, heads, t, head_dim]`.
    Stacked(&'a Tensor),
    /// `count` heads side by side from column `first_column` of `[seqs * t, width]` rows:
    /// the output of a fused projection.
    Columns {
        /// The rows.
        rows: &'a Tensor,
        /// The first head's first column.
        first_column: usize,
        /// Heads.
        count: usize,
    },
}

/// The op over queries and keys and values of `seq_len` tokens a sequence and heads of
/// `head_dim`.
#[derive(Clone, Copy, Debug)]
pub struct FlashAttention<'a> {
    /// Tokens a sequence (`t`).
    pub seq_len: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Whether query `i` sees only keys `0..=i` (decoder-style encoders such as Qwen3).
    pub causal: bool,
    /// Multiplies the scores (1 where the scale is folded into the queries).
    pub scale: f32,
    /// `[seqs, t]`: keys where it is 0 are left out (padding).
    pub keep: Option<&'a Tensor>,
    /// `[heads, t, t]`, added to the scaled scores (MPNet's relative position bias).
    pub bias: Option<&'a Tensor>,
}

/// The op as launched: where each input's heads are, the mask and bias contiguous (read
/// element by element, so any start will do), f32 for the mask, the queries' dtype for the
/// bias (f32 on the CPU).
struct Prepared {
    dims: Dims,
    at: [HeadsAt; 3],
    causal: bool,
    scale: f32,
    keep: Option<Tensor>,
    bias: Option<Tensor>,
}

/// The op's dimensions.
#[derive(Clone, Copy, Debug)]
struct Dims {
    seqs: usize,
    heads: usize,
    kv_heads: usize,
    t: usize,
    head_dim: usize,
}

/// Element `(s, h, i, d)` of an input is element `offset + s * seq + h * head + i * row + d`
/// of its tensor, counted from its layout's start.
#[derive(Clone, Copy, Debug)]
struct HeadsAt {
    offset: usize,
    seq: usize,
    head: usize,
    row: usize,
}

impl HeadsAt {
    fn stacked(dims: &Dims, count: usize) -> Self {
        let (t, d) = (dims.t, dims.head_dim);
        Self {
            offset: 0,
            seq: count * t * d,
            head: t * d,
            row: d,
        }
    }

    fn index(&self, s: usize, h: usize, i: usize) -> usize {
        self.offset + s * self.seq + h * self.head + i * self.row
    }

    /// Whether the kernel can read it in `tensor`: 16-byte units (`units` elements) for
    /// keys and values, pairs for queries.
    fn aligned(&self, tensor: &Tensor, units: usize) -> bool {
        let start = tensor.layout().start_offset();
        [start, self.offset, self.seq, self.head, self.row]
            .iter()
            .all(|n| n.is_multiple_of(units))
    }
}

impl Heads<'_> {
    fn tensor(&self) -> &Tensor {
        match self {
            Heads::Stacked(x) => x,
            Heads::Columns { rows, .. } => rows,
        }
    }

    /// What an error message says of it.
    fn describe(&self) -> String {
        match self {
            Heads::Stacked(x) => format!("stacked {:?} {:?}", x.dims(), x.dtype()),
            Heads::Columns {
                rows,
                first_column,
                count,
            } => format!(
                "{count} heads from column {first_column} of rows {:?} {:?}",
                rows.dims(),
                rows.dtype()
            ),
        }
    }

    fn count(&self) -> candle_core::Result<usize> {
        match self {
            Heads::Stacked(x) => Ok(x.dims4()?.1),
            Heads::Columns { count, .. } => Ok(*count),
        }
    }

    /// Sequences of `t` tokens it holds.
    fn seqs(&self, t: usize) -> candle_core::Result<usize> {
        match self {
            Heads::Stacked(x) => Ok(x.dims4()?.0),
            Heads::Columns { rows, .. } => Ok(rows.dims2()?.0.checked_div(t).unwrap_or(0)),
        }
    }

    /// Where its heads are, if they are where `dims` says (else `None`).
    fn at(&self, dims: &Dims, count: usize) -> Option<HeadsAt> {
        let (t, d) = (dims.t, dims.head_dim);
        if !self.tensor().is_contiguous() {
            return None;
        }
        match *self {
            Heads::Stacked(x) => {
                (x.dims() == [dims.seqs, count, t, d]).then(|| HeadsAt::stacked(dims, count))
            }
            Heads::Columns {
                rows, first_column, ..
            } => {
                let (n, width) = rows.dims2().ok()?;
                (n == dims.seqs * t && first_column + count * d <= width).then_some(HeadsAt {
                    offset: first_column,
                    seq: t * width,
                    head: d,
                    row: width,
                })
            }
        }
    }

    /// The heads stacked `[seqs, heads, t, d]` in a tensor of their own (a copy of columns).
    fn stacked(&self, dims: &Dims) -> candle_core::Result<Tensor> {
        match *self {
            Heads::Stacked(x) => x.contiguous()?.copy(),
            Heads::Columns {
                rows,
                first_column,
                count,
            } => super::fused::split_heads(
                &rows.contiguous()?,
                (dims.seqs, dims.t),
                count,
                dims.head_dim,
                first_column,
            ),
        }
    }
}

/// Head widths the kernel is built for.
const HEAD_WIDTHS: [usize; 3] = [32, 64, 128];
/// The kernel's grid takes heads and sequences in its second and third dimensions.
const MAX_GRID: usize = 65_535;

/// Whether the encoders may use the kernel at all: on unless a benchmark that compares it
/// with the materialised path in one run turns it off ([`allow_flash_attention`]).
static ALLOWED: AtomicBool = AtomicBool::new(true);

/// Lets the encoders of this process use the flash attention kernel where it fits (`true`,
/// the default) or keeps every encoder on the materialised attention (`false`): a switch for
/// benchmarks (`embed-bench --attention materialised`), so that both run on one GPU in one run.
pub fn allow_flash_attention(allowed: bool) {
    ALLOWED.store(allowed, Ordering::Relaxed);
}

/// Whether the encoders should run attention as the kernel for `dtype` heads of `head_dim`
/// on `device`: it is allowed, a kernel exists for them ([`kernel_exists`]) and, the first time each GPU,
/// dtype and width are asked, it gave the CPU reference's answer on a small random case.
/// Where it did not, the error is logged and the encoders keep their materialised
/// attention: a kernel that is wrong on some GPU costs speed there, never wrong vectors.
pub fn flash_attention_fits(device: &Device, dtype: DType, head_dim: usize) -> bool {
    static CHECKED: Mutex<BTreeMap<(usize, &str, usize), bool>> = Mutex::new(BTreeMap::new());
    if !ALLOWED.load(Ordering::Relaxed) || !kernel_exists(device, dtype, head_dim) {
        return false;
    }
    let key = (crate::device::gpu_ordinal(device), dtype.as_str(), head_dim);
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

/// The kernel against the CPU reference on one small case (two sequences of 80 tokens
/// across two tiles, grouped heads read from a fused product's columns, causal, a padded
/// key): an error says by how much.
fn self_check(device: &Device, dtype: DType, head_dim: usize) -> candle_core::Result<()> {
    let (seqs, heads, kv_heads, t) = (2, 4, 2, 80);
    let width = (heads + 2 * kv_heads) * head_dim;
    let qkv = Tensor::randn(0f32, 1.0, (seqs * t, width), &Device::Cpu)?.to_dtype(dtype)?;
    let keep: Vec<f32> = (0..seqs * t).map(|i| f32::from(u8::from(i != 7))).collect();
    let keep = Tensor::from_vec(keep, (seqs, t), &Device::Cpu)?;
    let run = |qkv: &Tensor, keep: &Tensor| {
        let columns = |first_column, count| Heads::Columns {
            rows: qkv,
            first_column: first_column * head_dim,
            count,
        };
        let op = FlashAttention {
            seq_len: t,
            head_dim,
            causal: true,
            scale: 1.0 / (head_dim as f32).sqrt(),
            keep: Some(keep),
            bias: None,
        };
        let (q, k, v) = (
            columns(0, heads),
            columns(heads, kv_heads),
            columns(heads + kv_heads, kv_heads),
        );
        flash_attention(q, k, v, &op)?
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)
    };
    let reference = run(&qkv, &keep)?;
    let got = run(&qkv.to_device(device)?, &keep.to_device(device)?)?;
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
/// [`kernel_exists`] (the encoders ask [`flash_attention_fits`]).
pub fn flash_attention(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    op: &FlashAttention<'_>,
) -> candle_core::Result<Tensor> {
    let (dims, at) = checked(q, k, v, op)?;
    let (dtype, device) = (q.tensor().dtype(), q.tensor().device());
    if dims.seqs * dims.t == 0 {
        let heads_width = dims.heads * dims.head_dim;
        return Tensor::zeros((dims.seqs * dims.t, heads_width), dtype, device);
    }
    if device.is_cpu() && dtype != DType::F32 {
        // The reference runs in f32: the heads stacked and converted.
        let f32 = |x: Heads<'_>| x.stacked(&dims)?.to_dtype(DType::F32);
        let (q, k, v) = (f32(q)?, f32(k)?, f32(v)?);
        let (q, k, v) = (Heads::Stacked(&q), Heads::Stacked(&k), Heads::Stacked(&v));
        return flash_attention(q, k, v, op)?.to_dtype(dtype);
    }
    // The kernel reads 16-byte units of keys and values and pairs of queries: an input
    // whose heads are not so aligned is stacked in a tensor of its own first.
    let mut tensors = [q, k, v].map(|x| x.tensor().clone());
    let mut at = at;
    for (n, (input, units)) in [(q, 2), (k, 8), (v, 8)].into_iter().enumerate() {
        if !at[n].aligned(&tensors[n], units) {
            tensors[n] = input.stacked(&dims)?;
            at[n] = HeadsAt::stacked(&dims, input.count()?);
        }
    }
    let prepared = Prepared {
        dims,
        at,
        causal: op.causal,
        scale: op.scale,
        keep: op
            .keep
            .map(|keep| keep.to_dtype(DType::F32)?.contiguous())
            .transpose()?,
        bias: op
            .bias
            .map(|bias| bias.to_dtype(dtype)?.contiguous())
            .transpose()?,
    };
    let [q, k, v] = tensors;
    q.apply_op3_no_bwd(&k, &v, &prepared)
}

/// The op's dimensions and where each input's heads are, or an error that says what does
/// not fit (shapes, dtypes, a GPU without the kernel, a grid too large).
fn checked(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    op: &FlashAttention<'_>,
) -> candle_core::Result<(Dims, [HeadsAt; 3])> {
    let (t, head_dim) = (op.seq_len, op.head_dim);
    let (heads, kv_heads) = (q.count()?, k.count()?);
    let (dtype, device) = (q.tensor().dtype(), q.tensor().device());
    let seqs = q.seqs(t)?;
    let dims = Dims {
        seqs,
        heads,
        kv_heads,
        t,
        head_dim,
    };
    let at = [
        q.at(&dims, heads),
        k.at(&dims, kv_heads),
        v.at(&dims, kv_heads),
    ];
    let fits = head_dim > 0
        && kv_heads > 0
        && heads.is_multiple_of(kv_heads)
        && v.count()? == kv_heads
        && [k.tensor(), v.tensor()].iter().all(|x| x.dtype() == dtype)
        && op.keep.is_none_or(|keep| keep.dims() == [seqs, t])
        && op.bias.is_none_or(|bias| bias.dims() == [heads, t, t]);
    let ([Some(q_at), Some(k_at), Some(v_at)], true) = (at, fits) else {
        candle_core::bail!(
            "flash attention takes queries and keys and values of one dtype, {t} tokens a \
             sequence, heads of {head_dim}, heads a multiple of kv_heads, a mask [seqs, t] and a \
             bias [heads, t, t]; got queries {}, keys {}, values {}, mask {:?}, bias {:?}",
            q.describe(),
            k.describe(),
            v.describe(),
            op.keep.map(Tensor::dims),
            op.bias.map(Tensor::dims)
        )
    };
    if device.is_cuda() && !kernel_exists(device, dtype, head_dim) {
        candle_core::bail!(
            "flash attention on this GPU takes f16 (compute 7.5+) or bf16 (8.0+) heads of \
             {HEAD_WIDTHS:?}, not {dtype:?} heads of {head_dim}; use the materialised attention"
        );
    }
    if device.is_cuda() && seqs.max(heads) > MAX_GRID {
        candle_core::bail!(
            "flash attention on a GPU takes at most {MAX_GRID} sequences and heads a call, not \
             {seqs} and {heads}: split the batch"
        );
    }
    Ok((dims, [q_at, k_at, v_at]))
}

/// The values of a CPU tensor, f32.
fn host(x: Option<&Tensor>) -> candle_core::Result<Option<Vec<f32>>> {
    x.map(|x| x.flatten_all()?.to_vec1::<f32>()).transpose()
}

impl Prepared {
    /// The reference: per query row and head, scores in f32 with [`lanes::dot`] (keys left
    /// out as -inf), a two-pass softmax, the weighted values summed in f32; a row that sees
    /// no key gives zeros.
    fn cpu(&self, [q, k, v]: [&[f32]; 3]) -> candle_core::Result<Vec<f32>> {
        let Dims {
            heads,
            kv_heads,
            t,
            head_dim: d,
            ..
        } = self.dims;
        let [q_at, k_at, v_at] = self.at;
        let (keep, bias) = (host(self.keep.as_ref())?, host(self.bias.as_ref())?);
        let group = heads / kv_heads;
        let width = heads * d;
        let mut out = vec![0f32; self.dims.seqs * t * width];
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(row, out)| {
                let (seq, i) = (row / t, row % t);
                let keys = if self.causal { i + 1 } else { t };
                let seen = |j: usize| keep.as_ref().is_none_or(|keep| keep[seq * t + j] != 0.0);
                let mut scores = vec![0f32; keys];
                for head in 0..heads {
                    let query = &q[q_at.index(seq, head, i)..][..d];
                    let kv_head = head / group;
                    for (j, score) in scores.iter_mut().enumerate() {
                        let key = &k[k_at.index(seq, kv_head, j)..][..d];
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
                        let value = &v[v_at.index(seq, kv_head, j)..][..d];
                        acc.iter_mut().zip(value).for_each(|(a, x)| *a += p * x);
                    }
                    acc.iter_mut().for_each(|a| *a /= total);
                }
            });
        Ok(out)
    }

    fn out_shape(&self) -> candle_core::Shape {
        let Dims {
            seqs,
            heads,
            t,
            head_dim,
            ..
        } = self.dims;
        candle_core::Shape::from((seqs * t, heads * head_dim))
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
    ) -> candle_core::Result<(CpuStorage, candle_core::Shape)> {
        fn from_start<'s>(s: &'s CpuStorage, l: &Layout) -> candle_core::Result<&'s [f32]> {
            Ok(&s.as_slice::<f32>()?[l.start_offset()..])
        }
        if q.dtype() != DType::F32 {
            candle_core::bail!("flash attention on the CPU takes f32 (`flash_attention` converts)");
        }
        let out = self.cpu([from_start(q, ql)?, from_start(k, kl)?, from_start(v, vl)?])?;
        Ok((CpuStorage::F32(out), self.out_shape()))
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
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        cuda::forward(self, [(q, ql), (k, kl), (v, vl)])
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

    use super::Prepared;
    use crate::embed::fused_cuda::{dtype_suffix, kernel};

    /// Queries a thread block takes (16 per warp) and its threads: `FA_QUERIES` and
    /// `FA_WARPS` in the kernel.
    const QUERIES: usize = 64;
    const THREADS: u32 = 128;

    type Input<'a> = (&'a CudaStorage, &'a Layout);

    pub(super) fn forward(op: &Prepared, inputs: [Input<'_>; 3]) -> Result<(CudaStorage, Shape)> {
        match inputs[0].0.dtype() {
            DType::F16 => launch::<half::f16>(op, inputs),
            DType::BF16 => launch::<half::bf16>(op, inputs),
            other => candle_core::bail!("flash attention takes f16 or bf16, not {other:?}"),
        }
    }

    /// A tensor's storage from its layout's start to its end (contiguous: `flash_attention`
    /// checked).
    fn from_start<'a, T: CudaDType>((storage, layout): Input<'a>) -> Result<CudaView<'a, T>> {
        if !layout.is_contiguous() {
            candle_core::bail!("flash attention reads contiguous tensors");
        }
        let slice = storage.as_cuda_slice::<T>()?;
        let start = layout.start_offset();
        Ok(slice.slice(start..start + layout.shape().elem_count()))
    }

    /// The device view of a mask or bias (on the queries' GPU).
    fn device_view<'a, T: CudaDType>(
        (storage, layout): &'a (impl std::ops::Deref<Target = Storage>, &Layout),
    ) -> Result<CudaView<'a, T>> {
        let Storage::Cuda(storage) = &**storage else {
            candle_core::bail!("flash attention's mask and bias must be on the queries' GPU");
        };
        from_start((storage, layout))
    }

    fn launch<T: CudaDType + DeviceRepr>(
        op: &Prepared,
        [q, k, v]: [Input<'_>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        let dims = op.dims;
        let dev = q.0.device().clone();
        let [q_at, k_at, v_at] = op.at;
        let q_view = from_start::<T>(q)?;
        let k_view = from_start::<T>(k)?;
        let v_view = from_start::<T>(v)?;
        let qv = q_view.slice(q_at.offset..);
        let kv = k_view.slice(k_at.offset..);
        let vv = v_view.slice(v_at.offset..);
        let keep_storage = op.keep.as_ref().map(Tensor::storage_and_layout);
        let bias_storage = op.bias.as_ref().map(Tensor::storage_and_layout);
        let keep = keep_storage.as_ref().map(device_view::<f32>).transpose()?;
        let bias = bias_storage.as_ref().map(device_view::<T>).transpose()?;
        let out_shape = op.out_shape();
        // SAFETY: the kernel writes every element: a block per 64 queries of each head of
        // each sequence, each writing its queries' head_dim values (rows past t are not rows
        // of the output).
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(out_shape.elem_count())? };
        let name = format!(
            "flash_attention_{}_d{}",
            dtype_suffix(q.0.dtype())?,
            dims.head_dim
        );
        let (stream, func) = kernel(&dev, &name)?;
        let config = LaunchConfig {
            grid_dim: (
                dims.t.div_ceil(QUERIES) as u32,
                dims.heads as u32,
                dims.seqs as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let strides = |at: super::HeadsAt| [at.seq as u64, at.head as u64, at.row as u64];
        let [q_strides, k_strides, v_strides] = [q_at, k_at, v_at].map(strides);
        let (t, heads, kv_heads) = (dims.t as u32, dims.heads as u32, dims.kv_heads as u32);
        let (null, causal) = (0u64, i32::from(op.causal));
        let mut builder = stream.launch_builder(&func);
        builder.arg(&out);
        for (view, strides) in [(&qv, &q_strides), (&kv, &k_strides), (&vv, &v_strides)] {
            builder.arg(view);
            for stride in strides {
                builder.arg(stride);
            }
        }
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
        // SAFETY: `flash_attention` checked the shapes (every input's heads inside its
        // tensor at the strides given, heads a multiple of kv_heads, the mask [seqs, t] f32,
        // the bias [heads, t, t] in the queries' dtype), the dtype and head width (a kernel
        // exists for them, on this GPU's capability) and the alignment the kernel's loads
        // need (16 bytes for keys and values, 4 for queries); the kernel reads rows below t
        // only.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), out_shape))
    }
}

#[cfg(test)]
#[path = "flash_attention_tests.rs"]
mod tests;
