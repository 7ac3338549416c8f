//! Attention over the paged KV cache, every row of a step in one call: each row's queries
//! against its own sequence's positions `0..=pos`, read through the sequence's block table.
//! No keys padded to the longest sequence, no scores materialised, decode and prefill rows
//! alike (a prefilling sequence's rows are in the cache before attention, so causality is
//! each row's length).
//!
//! One candle op, one function, three implementations:
//! - the CPU reference ([`PagedAttention`]'s `cpu_fwd`): a two-pass softmax in f32 per row
//!   and head (vectorised dot products), rows in parallel; f16 and bf16 go through f32. It
//!   is the CPU dense path's attention, and what the CUDA kernels are tested against;
//! - two CUDA kernels ([`AttentionKernel`]), each one thread block per tile of rows and KV
//!   head (and slice of its query heads), four warps splitting the keys, merged in shared
//!   memory; the KV head's keys and values are read once for all the tile's queries
//!   (grouped-query attention, and a prefilling sequence's rows together):
//!   - tensor cores (`paged_attention_mma_*`, `embed/paged_attention_mma.cuh`; f16 and
//!     bf16, heads of 32, 64 or 128; the default where it applies): 16 queries a tile meet
//!     16 keys at a time in `mma.sync` products, scores kept in registers;
//!   - scalar (`paged_attention_*` in `embed/fused_kernels.cu`; any dtype, heads up to
//!     256): 8 queries a tile, each key's dot products reduced across a warp.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::decoder::Row;
use super::kv_blocks::BlockManager;
use super::lanes::{self, Width};

/// Which CUDA kernel takes a step's attention (the CPU runs its reference either way). Both
/// compute the same function; the tiles of a step's row layout are made for one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Scalar arithmetic, each key's dot products reduced across a warp: any dtype, heads of
    /// up to 256.
    Scalar,
    /// Tensor cores (`mma.sync`): f16 and bf16, heads of 32, 64 or 128.
    TensorCores,
}

impl AttentionKernel {
    /// The (row, head) queries one thread block takes: the rows of a tile times the query
    /// heads of a KV head, at most this.
    pub fn queries(self) -> usize {
        match self {
            Self::Scalar => 8,
            Self::TensorCores => 16,
        }
    }

    /// Whether this kernel takes queries of `dtype` in heads of `head_dim`.
    pub fn takes(self, dtype: DType, head_dim: usize) -> bool {
        match self {
            Self::Scalar => {
                matches!(dtype, DType::F32 | DType::F16 | DType::BF16) && head_dim <= 256
            }
            Self::TensorCores => {
                matches!(dtype, DType::F16 | DType::BF16) && matches!(head_dim, 32 | 64 | 128)
            }
        }
    }

    /// Whether this kernel runs `dtype` on `device`: bf16 tensor cores need compute
    /// capability 8.0 (a T4 has f16 ones only).
    pub fn runs_on(self, device: &Device, dtype: DType) -> bool {
        self == Self::Scalar || dtype != DType::BF16 || crate::device::has_bf16_kernels(device)
    }

    /// The kernel's name as a config or a command line spells it ([`Self::parse`]'s).
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::TensorCores => "tensor-cores",
        }
    }

    /// The kernel `name` names (`tensor-cores` or `scalar`; `auto` or none: `None`, the
    /// model's [`AttentionKernel::best`]), as a config or a command line spells it.
    pub fn parse(name: Option<&str>) -> Result<Option<Self>, crate::ModelError> {
        match name {
            None | Some("auto") => Ok(None),
            Some("tensor-cores") => Ok(Some(Self::TensorCores)),
            Some("scalar") => Ok(Some(Self::Scalar)),
            Some(other) => Err(crate::ModelError::InvalidConfig(format!(
                "`attention` is `{other}`: use auto, tensor-cores or scalar"
            ))),
        }
    }

    /// The kernel a model of `dtype` with heads of `head_dim` runs on `device`: tensor cores
    /// wherever they take it (a model in f32, or of another head size, gets the scalar one).
    /// On the CPU it only shapes the tiles, which the reference ignores.
    pub fn best(device: &Device, dtype: DType, head_dim: usize) -> Self {
        if device.is_cuda()
            && Self::TensorCores.takes(dtype, head_dim)
            && Self::TensorCores.runs_on(device, dtype)
        {
            Self::TensorCores
        } else {
            Self::Scalar
        }
    }
}

/// How a step's rows become the GPU's tiles: the model's query heads per KV head, and the
/// kernel the tiles are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Query heads per KV head.
    pub group: usize,
    /// The kernel that will read the layout.
    pub kernel: AttentionKernel,
}

/// Where each row of a step reads its keys, made once a step for every layer: per row, the
/// start of its sequence's block table and the positions it attends to; the tiles the GPU
/// takes a block each (consecutive rows of one sequence, so that a prefilling sequence's
/// rows share each key they read); then the tables, one per sequence of the step.
pub struct PagedRows {
    /// `[table start, len]` per row, `[first row, rows]` per tile, then the tables (u32,
    /// host copy).
    host: Vec<u32>,
    /// The same on the GPU (the CPU reads `host`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    device: Option<Tensor>,
    rows: usize,
    tiles: usize,
    block_size: usize,
    kernel: AttentionKernel,
}

/// Rows a step is padded with to a fixed size (a CUDA graph's batch size): each a sequence
/// of its own that attends to one position of `block`, a block no sequence holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding {
    /// How many rows.
    pub rows: usize,
    /// The block they read (the cache's scratch block).
    pub block: u32,
}

impl Padding {
    /// No padding.
    pub const NONE: Padding = Padding { rows: 0, block: 0 };
}

impl PagedRows {
    /// The layout of `rows` (each sequence's rows together, their positions reserved in
    /// `blocks`), tiled as `tiling` says.
    pub fn new(
        rows: &[Row],
        blocks: &BlockManager,
        tiling: Tiling,
        device: &Device,
    ) -> candle_core::Result<Self> {
        Self::padded(rows, blocks, tiling, Padding::NONE, Some(device))
    }

    /// [`Self::new`] with `padding` rows after `rows`; on the host alone where `device` is
    /// `None` (its words then go where the caller puts them: [`Self::with_device_words`]).
    pub fn padded(
        rows: &[Row],
        blocks: &BlockManager,
        tiling: Tiling,
        padding: Padding,
        device: Option<&Device>,
    ) -> candle_core::Result<Self> {
        let mut runs = Vec::new();
        let mut start = 0;
        for seq in rows.chunk_by(|a, b| a.slot == b.slot) {
            let (slot, end) = (seq[0].slot, start + seq.len());
            let longest = seq.iter().map(|r| r.pos + 1).max().unwrap_or(0);
            let table = blocks.table(slot);
            if blocks.blocks_for(longest) > table.len() {
                candle_core::bail!(
                    "slot {slot} attends to {longest} positions but holds {} blocks",
                    table.len()
                );
            }
            runs.push((table, start..end));
            start = end;
        }
        let scratch = [padding.block];
        for row in start..start + padding.rows {
            runs.push((&scratch[..], row..row + 1));
        }
        let mut lens: Vec<u32> = rows.iter().map(|r| (r.pos + 1) as u32).collect();
        lens.resize(rows.len() + padding.rows, 1);
        Self::build(&runs, &lens, tiling, blocks.block_size(), device)
    }

    /// The layout's words (`[table start, len]` per row, the tiles, the tables), as the
    /// kernel reads them.
    pub fn words(&self) -> &[u32] {
        &self.host
    }

    /// This layout, its kernel reading the words from `words` (u32, on the GPU, holding
    /// [`Self::words`] at its start): a buffer a CUDA graph reads step after step.
    pub fn with_device_words(mut self, words: Tensor) -> Self {
        self.device = Some(words);
        self
    }

    /// The rows, padding included.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The GPU's thread-block tiles (what the kernel's grid is sized by).
    pub fn tiles(&self) -> usize {
        self.tiles
    }

    /// Fails unless every table entry of every row names one of a cache's `blocks` blocks:
    /// the kernel trusts the tables.
    pub fn check_tables(&self, blocks: usize) -> candle_core::Result<()> {
        let blocks = blocks as u32;
        match (0..self.rows).find(|&r| self.table_of(r).0.iter().any(|&b| b >= blocks)) {
            Some(row) => {
                candle_core::bail!(
                    "row {row}'s block table points past the cache's {blocks} blocks"
                )
            }
            None => Ok(()),
        }
    }

    /// A layout from raw parts, for the tests and the first-use check: per row `(table,
    /// len)`; consecutive rows with the same table are one sequence's.
    pub(crate) fn from_tables(
        rows: &[(Vec<u32>, usize)],
        tiling: Tiling,
        block_size: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let mut runs: Vec<(&[u32], std::ops::Range<usize>)> = Vec::new();
        for (i, (table, _)) in rows.iter().enumerate() {
            match runs.last_mut() {
                Some((last, range)) if *last == &table[..] => range.end = i + 1,
                _ => runs.push((table, i..i + 1)),
            }
        }
        let lens: Vec<u32> = rows.iter().map(|(_, len)| *len as u32).collect();
        Self::build(&runs, &lens, tiling, block_size, Some(device))
    }

    fn build(
        runs: &[(&[u32], std::ops::Range<usize>)],
        lens: &[u32],
        tiling: Tiling,
        block_size: usize,
        device: Option<&Device>,
    ) -> candle_core::Result<Self> {
        let rows = lens.len();
        // Rows a tile may take: its queries (rows x the heads of a block) fill the block.
        let queries = tiling.kernel.queries();
        let per_tile = (queries / tiling.group.clamp(1, queries)).max(1);
        let mut tiles = Vec::new();
        for (_, range) in runs {
            for first in range.clone().step_by(per_tile) {
                tiles.extend([first as u32, per_tile.min(range.end - first) as u32]);
            }
        }
        let mut host = vec![0u32; 2 * rows];
        host.extend_from_slice(&tiles);
        for (table, range) in runs {
            let at = host.len() as u32;
            for row in range.clone() {
                host[2 * row] = at;
                host[2 * row + 1] = lens[row];
            }
            host.extend_from_slice(table);
        }
        Ok(Self {
            device: upload(&host, device)?,
            host,
            rows,
            tiles: tiles.len() / 2,
            block_size,
            kernel: tiling.kernel,
        })
    }

    /// Row `row`'s block table (the blocks its positions need) and its length.
    fn table_of(&self, row: usize) -> (&[u32], usize) {
        let (at, len) = (self.host[2 * row] as usize, self.host[2 * row + 1] as usize);
        let blocks = len.div_ceil(self.block_size);
        (&self.host[at..at + blocks], len)
    }
}

fn upload(host: &[u32], device: Option<&Device>) -> candle_core::Result<Option<Tensor>> {
    match device {
        Some(device) if !device.is_cpu() => Tensor::from_slice(host, host.len(), device).map(Some),
        _ => Ok(None),
    }
}

/// The attention op: queries `rows x heads x head_dim`, key and value caches `cache rows x
/// kv_heads*head_dim`; gives `rows x heads*head_dim` in the queries' dtype.
pub struct PagedAttention<'a> {
    /// The step's rows.
    pub layout: &'a PagedRows,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// `softmax(q k^T * scale) v` for every row of `layout`, over its own positions.
pub fn paged_attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    op: &PagedAttention<'_>,
) -> candle_core::Result<Tensor> {
    let (rows, heads, head_dim) = q.dims3()?;
    let (cache_rows, kv_dim) = keys.dims2()?;
    if rows != op.layout.rows
        || heads != op.heads
        || op.kv_heads == 0
        || !heads.is_multiple_of(op.kv_heads)
        || kv_dim != op.kv_heads * head_dim
        || values.dims() != [cache_rows, kv_dim]
        || !cache_rows.is_multiple_of(op.layout.block_size)
    {
        candle_core::bail!(
            "paged attention of queries {:?} over caches {:?}/{:?}: {} rows, {}/{} heads, blocks \
             of {}",
            q.dims(),
            keys.dims(),
            values.dims(),
            op.layout.rows,
            op.heads,
            op.kv_heads,
            op.layout.block_size
        );
    }
    op.layout.check_tables(cache_rows / op.layout.block_size)?;
    if !op.layout.kernel.runs_on(q.device(), q.dtype()) {
        candle_core::bail!(
            "bf16 attention on tensor cores needs a GPU of compute capability 8.0 or later; use \
             f16 (or the scalar kernel)"
        );
    }
    let q = q.contiguous()?;
    if rows == 0 {
        return Tensor::zeros((0, heads * head_dim), q.dtype(), q.device());
    }
    if q.device().is_cpu() && q.dtype() != DType::F32 {
        // The CPU reference runs in f32 (the CPU dense path's dtype); others convert.
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        return paged_attention(&f32(&q)?, &f32(keys)?, &f32(values)?, op)?.to_dtype(q.dtype());
    }
    q.apply_op3_no_bwd(&keys.contiguous()?, &values.contiguous()?, op)
}

impl PagedAttention<'_> {
    /// The reference: per row and head, scores in f32 with [`lanes::dot`] (vectorised), a
    /// two-pass softmax, and the weighted values summed in f32.
    fn cpu(&self, q: &[f32], keys: &[f32], values: &[f32], head_dim: usize) -> Vec<f32> {
        let (heads, kv_heads, bs) = (self.heads, self.kv_heads, self.layout.block_size);
        let (group, kv_dim) = (heads / kv_heads, kv_heads * head_dim);
        let width = heads * head_dim;
        let lanes = Width::Eight;
        let mut out = vec![0f32; self.layout.rows * width];
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(row, out)| {
                let (table, len) = self.layout.table_of(row);
                let cache_row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_dim;
                let mut scores = vec![0f32; len];
                for head in 0..heads {
                    let kv = (head / group) * head_dim;
                    let query = &q[(row * heads + head) * head_dim..][..head_dim];
                    for (j, score) in scores.iter_mut().enumerate() {
                        let key = &keys[cache_row(j) + kv..][..head_dim];
                        *score = lanes::dot(lanes, query, key) * self.scale;
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut total = 0f32;
                    let acc = &mut out[head * head_dim..][..head_dim];
                    for (j, score) in scores.iter().enumerate() {
                        let p = (score - max).exp();
                        total += p;
                        let value = &values[cache_row(j) + kv..][..head_dim];
                        for (a, v) in acc.iter_mut().zip(value) {
                            *a += p * v;
                        }
                    }
                    for a in acc.iter_mut() {
                        *a /= total;
                    }
                }
            });
        out
    }
}

impl candle_core::CustomOp3 for PagedAttention<'_> {
    fn name(&self) -> &'static str {
        "resident-paged-attention"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        ql: &Layout,
        keys: &CpuStorage,
        kl: &Layout,
        values: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, heads, head_dim) = ql.shape().dims3()?;
        let shape = Shape::from((rows, heads * head_dim));
        fn part<'s>(s: &'s CpuStorage, l: &Layout) -> candle_core::Result<&'s [f32]> {
            let all = s.as_slice::<f32>()?;
            Ok(&all[l.start_offset()..l.start_offset() + l.shape().elem_count()])
        }
        if q.dtype() != DType::F32 {
            candle_core::bail!("paged attention on the CPU takes f32 (`paged_attention` converts)");
        }
        let out =
            CpuStorage::F32(self.cpu(part(q, ql)?, part(keys, kl)?, part(values, vl)?, head_dim));
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        keys: &candle_core::CudaStorage,
        kl: &Layout,
        values: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        cuda::forward(self, (q, ql), (keys, kl), (values, vl))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use super::{AttentionKernel, PagedAttention};
    use crate::embed::fused_cuda::{dtype_suffix, kernel, view};

    /// Threads per block (both kernels): four warps split the keys.
    const THREADS: u32 = 128;

    pub(super) fn forward(
        op: &PagedAttention<'_>,
        q: (&CudaStorage, &Layout),
        keys: (&CudaStorage, &Layout),
        values: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        if keys.0.dtype() != q.0.dtype() || values.0.dtype() != q.0.dtype() {
            candle_core::bail!("paged attention takes queries and caches of one dtype");
        }
        match q.0.dtype() {
            DType::F32 => launch::<f32>(op, q, keys, values),
            DType::F16 => launch::<half::f16>(op, q, keys, values),
            DType::BF16 => launch::<half::bf16>(op, q, keys, values),
            other => candle_core::bail!("paged attention takes f32, f16 or bf16, not {other:?}"),
        }
    }

    /// The kernel's name in the module: `which` for `dtype` heads of `head_dim`.
    fn kernel_name(which: AttentionKernel, dtype: DType, head_dim: usize) -> Result<String> {
        if !which.takes(dtype, head_dim) {
            candle_core::bail!(
                "the {which:?} paged attention kernel does not take {dtype:?} heads of \
                 {head_dim} (AttentionKernel::best picks one that does)"
            );
        }
        let suffix = dtype_suffix(dtype)?;
        Ok(match which {
            AttentionKernel::TensorCores => format!("paged_attention_mma_{suffix}_d{head_dim}"),
            // Each lane holds head_dim / 32 dimensions, rounded up to a size the kernel has.
            AttentionKernel::Scalar => match head_dim.div_ceil(32) {
                0..=2 => format!("paged_attention_{suffix}_d2"),
                3..=4 => format!("paged_attention_{suffix}_d4"),
                _ => format!("paged_attention_{suffix}_d8"),
            },
        })
    }

    fn launch<T: CudaDType + DeviceRepr>(
        op: &PagedAttention<'_>,
        q: (&CudaStorage, &Layout),
        keys: (&CudaStorage, &Layout),
        values: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, heads, head_dim) = q.1.shape().dims3()?;
        let which = op.layout.kernel;
        let name = kernel_name(which, q.0.dtype(), head_dim)?;
        let dev = q.0.device().clone();
        let Some(meta) = &op.layout.device else {
            candle_core::bail!("paged attention's row layout is not on the GPU");
        };
        let (meta_storage, meta_layout) = meta.storage_and_layout();
        let candle_core::Storage::Cuda(meta_storage) = &*meta_storage else {
            candle_core::bail!("paged attention's row layout is not on the GPU");
        };
        let meta = view::<u32>(meta_storage, meta_layout)?;
        let (qv, kv, vv) = (
            view::<T>(q.0, q.1)?,
            view::<T>(keys.0, keys.1)?,
            view::<T>(values.0, values.1)?,
        );
        // SAFETY: the kernel writes every element: one block per tile of rows, KV head and
        // slice of its query heads, each writing its queries' head_dim values.
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(rows * heads * head_dim)? };
        let (stream, func) = kernel(&dev, &name)?;
        let group = heads / op.kv_heads;
        let config = LaunchConfig {
            grid_dim: (
                op.layout.tiles as u32,
                op.kv_heads as u32,
                group.div_ceil(which.queries()) as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (heads, kv_heads, head_dim) = (heads as u32, op.kv_heads as u32, head_dim as u32);
        let block_size = op.layout.block_size as u32;
        let rows = rows as u32;
        let mut builder = stream.launch_builder(&func);
        builder
            .arg(&out)
            .arg(&qv)
            .arg(&kv)
            .arg(&vv)
            .arg(&meta)
            .arg(&rows)
            .arg(&heads)
            .arg(&kv_heads);
        // The tensor-core kernels have their head size in their name.
        if which == AttentionKernel::Scalar {
            builder.arg(&head_dim);
        }
        builder.arg(&block_size).arg(&op.scale);
        // SAFETY: `paged_attention` checked the shapes and that every table entry of every
        // row names a block inside the caches; each row reads `len` positions of its table.
        // The arguments are the named kernel's, in its order.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((rows as usize, (heads * head_dim) as usize)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::device_ops::{max_abs_diff_to, noise, test_devices as devices};

    /// The plain formula per row, on contiguous keys: what the op must equal.
    fn expected(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        rows: &[(Vec<u32>, usize)],
        shape: (usize, usize, usize, usize),
    ) -> Vec<f32> {
        let (heads, kv_heads, hd, bs) = shape;
        let group = heads / kv_heads;
        let mut out = Vec::new();
        for (r, (table, len)) in rows.iter().enumerate() {
            for h in 0..heads {
                let kvh = h / group;
                let at =
                    |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_heads * hd + kvh * hd;
                let qh = &q[(r * heads + h) * hd..][..hd];
                let scores: Vec<f64> = (0..*len)
                    .map(|j| {
                        let k = &keys[at(j)..][..hd];
                        qh.iter().zip(k).map(|(a, b)| f64::from(a * b)).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for d in 0..hd {
                    let v: f64 = (0..*len)
                        .map(|j| weights[j] * f64::from(values[at(j) + d]))
                        .sum();
                    out.push((v / total) as f32);
                }
            }
        }
        out
    }

    /// Decoding sequences (a row each), lengths across block edges, blocks out of order,
    /// and prefilling ones (consecutive rows of one table, which the GPU takes in tiles).
    fn case(heads: usize, kv_heads: usize, hd: usize, seed: u64) {
        let bs = 16;
        let pool = 40;
        // Scattered, shared between sequences: blocks (i * 7 + b * 13) mod pool.
        let table = |i: usize, len: usize| -> Vec<u32> {
            (0..len.div_ceil(bs))
                .map(|b| ((i * 7 + b * 13) % pool) as u32)
                .collect()
        };
        let mut rows: Vec<(Vec<u32>, usize)> = Vec::new();
        for (i, &len) in [1usize, 15, 16, 17, 33, 100, 250, 7].iter().enumerate() {
            rows.push((table(i, len), len));
        }
        // A prompt's first 11 rows, then a chunk of a longer one from position 90 on.
        rows.extend((1..=11).map(|len| (table(20, 11), len)));
        rows.extend((91..=103).map(|len| (table(21, 103), len)));
        rows.push((table(22, 5), 5));
        let kv_dim = kv_heads * hd;
        let q = noise(rows.len() * heads * hd, seed);
        let keys = noise(pool * bs * kv_dim, seed + 1);
        let values = noise(pool * bs * kv_dim, seed + 2);
        let want = expected(&q, &keys, &values, &rows, (heads, kv_heads, hd, bs));
        let kernels = [AttentionKernel::Scalar, AttentionKernel::TensorCores];
        for (device, kernel) in devices()
            .into_iter()
            .flat_map(|d| kernels.map(|k| (d.clone(), k)))
        {
            let tiling = Tiling {
                group: heads / kv_heads,
                kernel,
            };
            let layout = PagedRows::from_tables(&rows, tiling, bs, &device).unwrap();
            let op = PagedAttention {
                layout: &layout,
                heads,
                kv_heads,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::F16, 4e-3), (DType::BF16, 3e-2)]
            {
                // The CPU's reference takes every layout; a GPU kernel its own dtypes and sizes.
                let runs =
                    device.is_cpu() || kernel.takes(dtype, hd) && kernel.runs_on(&device, dtype);
                if !runs {
                    continue;
                }
                let t = |data: &[f32], shape: &[usize]| {
                    Tensor::from_slice(data, shape, &device)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                let got = paged_attention(
                    &t(&q, &[rows.len(), heads, hd]),
                    &t(&keys, &[pool * bs, kv_dim]),
                    &t(&values, &[pool * bs, kv_dim]),
                    &op,
                )
                .unwrap();
                assert_eq!(got.dims(), &[rows.len(), heads * hd]);
                let worst = max_abs_diff_to(&got, &want);
                assert!(
                    worst <= tolerance,
                    "{device:?} {kernel:?} {dtype:?} {heads}/{kv_heads} heads of {hd}: off by \
                     {worst}"
                );
            }
        }
    }

    #[test]
    fn each_row_attends_to_its_own_positions_through_its_table() {
        // SmolLM2-135M (9/3 of 64), Qwen2.5-0.5B (14/2 of 64), Qwen3-0.6B (16/8 of 128).
        case(9, 3, 64, 1);
        case(14, 2, 64, 2);
        case(16, 8, 128, 3);
    }

    #[test]
    fn odd_head_sizes_and_groups_over_a_blocks_queries() {
        // 80-wide heads (lanes hold 3 of 4 slots), a group of 12 (two blocks of the scalar
        // kernel's heads), MHA, a group of 20 (two of the tensor cores' 16).
        case(4, 2, 80, 4);
        case(12, 1, 32, 5);
        case(4, 4, 256, 6);
        case(20, 1, 64, 7);
    }

    /// Which kernel a model gets: tensor cores on a GPU wherever they take its dtype and
    /// head size.
    #[test]
    fn tensor_cores_take_half_precision_heads_of_32_64_and_128() {
        let tensor = AttentionKernel::TensorCores;
        for (dtype, head_dim, takes) in [
            (DType::BF16, 64, true),
            (DType::F16, 128, true),
            (DType::F16, 32, true),
            (DType::F32, 64, false),
            (DType::BF16, 80, false),
            (DType::BF16, 256, false),
        ] {
            assert_eq!(tensor.takes(dtype, head_dim), takes, "{dtype:?} {head_dim}");
            assert!(AttentionKernel::Scalar.takes(dtype, head_dim));
        }
        assert!(!AttentionKernel::Scalar.takes(DType::F32, 512));
        // The CPU runs its reference whatever the tiles.
        let cpu = AttentionKernel::best(&Device::Cpu, DType::BF16, 64);
        assert_eq!(cpu, AttentionKernel::Scalar);
    }

    /// The GPU's tiles: a decoding row alone, a prefilling sequence's rows in tiles that
    /// fill a block's queries, never two sequences in one tile.
    #[test]
    fn tiles_fill_a_blocks_queries_with_one_sequences_rows() {
        let tiles_for = |group: usize, kernel: AttentionKernel| {
            let mut rows: Vec<(Vec<u32>, usize)> = vec![(vec![3], 9)];
            rows.extend((1..=5).map(|len| (vec![1], len)));
            rows.push((vec![2], 4));
            let tiling = Tiling { group, kernel };
            let layout = PagedRows::from_tables(&rows, tiling, 16, &Device::Cpu).unwrap();
            let at = 2 * layout.rows;
            let tiles: Vec<(u32, u32)> = layout.host[at..at + 2 * layout.tiles]
                .chunks(2)
                .map(|t| (t[0], t[1]))
                .collect();
            // Every row of a tile reads the same table.
            for &(first, count) in &tiles {
                let table = layout.host[2 * first as usize];
                for row in first..first + count {
                    assert_eq!(layout.host[2 * row as usize], table);
                }
            }
            tiles
        };
        let tiles = |group: usize| tiles_for(group, AttentionKernel::Scalar);
        // SmolLM2: 3 heads a KV head, two rows a tile (6 queries of 8).
        assert_eq!(tiles(3), [(0, 1), (1, 2), (3, 2), (5, 1), (6, 1)]);
        // One head a KV head: up to 8 rows.
        assert_eq!(tiles(1), [(0, 1), (1, 5), (6, 1)]);
        // 9 heads a KV head: the heads split over blocks, a row each.
        assert_eq!(tiles(9).len(), 7);
        // Tensor cores: 16 queries a block, so SmolLM2's prefilling rows go five to a tile,
        // Qwen3-0.6B's (2 heads a KV head) eight.
        let tensor = |group: usize| tiles_for(group, AttentionKernel::TensorCores);
        assert_eq!(tensor(3), [(0, 1), (1, 5), (6, 1)]);
        assert_eq!(tensor(2), [(0, 1), (1, 5), (6, 1)]);
        assert_eq!(tensor(1), [(0, 1), (1, 5), (6, 1)]);
        assert_eq!(tensor(20).len(), 7);
    }

    /// On a GPU before compute capability 8.0 (an emulated T4 in CI), bf16 on tensor cores
    /// is refused with what to use, never launched (its kernel would trap).
    #[test]
    fn bf16_tensor_cores_before_ampere_are_refused_with_what_to_use() {
        for device in devices() {
            if device.is_cpu() || crate::device::has_bf16_kernels(&device) {
                continue;
            }
            let tiling = Tiling {
                group: 1,
                kernel: AttentionKernel::TensorCores,
            };
            let layout = PagedRows::from_tables(&[(vec![0], 3)], tiling, 16, &device).unwrap();
            let op = PagedAttention {
                layout: &layout,
                heads: 1,
                kv_heads: 1,
                scale: 0.125,
            };
            let q = Tensor::zeros((1, 1, 64), DType::BF16, &device).unwrap();
            let cache = Tensor::zeros((16, 64), DType::BF16, &device).unwrap();
            let error = paged_attention(&q, &cache, &cache, &op).unwrap_err();
            assert!(error.to_string().contains("use f16"), "{error}");
            assert_eq!(
                AttentionKernel::best(&device, DType::BF16, 64),
                AttentionKernel::Scalar
            );
            assert_eq!(
                AttentionKernel::best(&device, DType::F16, 64),
                AttentionKernel::TensorCores
            );
        }
    }

    #[test]
    fn a_table_past_the_cache_is_refused_before_any_read() {
        let device = Device::Cpu;
        let tiling = Tiling {
            group: 2,
            kernel: AttentionKernel::Scalar,
        };
        let layout = PagedRows::from_tables(&[(vec![0, 9], 20)], tiling, 16, &device).unwrap();
        let op = PagedAttention {
            layout: &layout,
            heads: 2,
            kv_heads: 1,
            scale: 0.125,
        };
        let q = Tensor::zeros((1, 2, 8), DType::F32, &device).unwrap();
        let cache = Tensor::zeros((32, 8), DType::F32, &device).unwrap();
        let error = paged_attention(&q, &cache, &cache, &op).unwrap_err();
        assert!(
            error.to_string().contains("past the cache's 2 blocks"),
            "{error}"
        );
    }
}
