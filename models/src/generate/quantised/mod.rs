//! Quantised weights kept as the GGUF file stores them (Q4_1, Q8_0), multiplied the way
//! llama.cpp does: each activation row is quantised to 8 bits per block of 32 (a scale,
//! and for Q4_1 the scaled sum too), each block's integer products are exact, and the
//! blocks' scaled products are summed in 8 lanes of 4 values each with fused
//! multiply-adds (`lanes.rs`). candle reads Q4_1 only with a scalar loop (8 tokens/s for
//! SmolLM2-135M on 2 cores), and its Q8_0 kernel rounds activations differently;
//! requantising to Q8_0 ran fast but moved the logits far enough from llama.cpp's to fork
//! greedy decoding (BENCHMARKS.md).
//!
//! A matmul quantises its activation rows once, [`TILE`] rows at a time interleaved block
//! by block ([`TileBlock`]), so that one weight block meets all of a tile's rows in a few
//! registers. The SIMD kernels (`x86.rs`: AVX2, and AVX-512 with VNNI) are picked at run
//! time; every kernel gives the portable loop's sums bit for bit.

use std::ops::Range;

use rayon::prelude::*;

use super::lanes::{self, LANES};
use crate::ModelError;
pub use blocks::{ActivationBlock, Q4_1, Q8_0, TILE, TileBlock};
use blocks::{BLOCK, activation_block, half};

mod blocks;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

/// Weight rows, and activation rows, of one parallel task: its weights stay in L1 while
/// its activation rows pass them, and a step of any shape makes enough tasks for every
/// core. Activation rows come in whole tiles.
const WEIGHT_ROWS_PER_TASK: usize = 32;
const ACTIVATION_ROWS_PER_TASK: usize = 32 * TILE;
/// Activation rows quantised by one parallel task.
const QUANTISED_ROWS_PER_TASK: usize = 8 * TILE;

/// A block of weights of one GGUF type.
pub trait WeightBlock: Copy + Send + Sync {
    /// The type's name, for errors.
    const NAME: &'static str;
    /// Bytes of one block in the file.
    const BYTES: usize;
    fn read(bytes: &[u8]) -> Self;
    /// Adds the block's product with `a` to the lanes (and to `offsets`, for types with a
    /// minimum).
    fn accumulate(&self, a: &ActivationBlock, lanes: &mut [f32; LANES], offsets: &mut f32);

    /// `Σ` over a row's blocks: the SIMD kernel where the CPU has one, else the portable
    /// loop (the same sums in the same order).
    fn row_dot(weights: &[Self], activations: &[ActivationBlock]) -> f32 {
        row_dot(weights, activations)
    }

    /// [`WeightBlock::row_dot`] of one weight row with a tile's [`TILE`] activation rows,
    /// each sum taken in the same order as alone (so the same bits).
    fn tile_dot(weights: &[Self], tiles: &[TileBlock]) -> [f32; TILE] {
        tile_dot(weights, tiles)
    }

    /// [`WeightBlock::tile_dot`] of two weight rows with the same tile (the same bits as
    /// two calls).
    fn tile_dot_two(weights: [&[Self]; 2], tiles: &[TileBlock]) -> [[f32; TILE]; 2] {
        weights.map(|row| Self::tile_dot(row, tiles))
    }
}

impl WeightBlock for Q4_1 {
    const NAME: &'static str = "Q4_1";
    const BYTES: usize = 20;

    fn read(bytes: &[u8]) -> Self {
        Self {
            d: half(&bytes[0..2]),
            m: half(&bytes[2..4]),
            qs: bytes[4..20].try_into().expect("16 bytes"),
        }
    }

    #[inline(always)]
    fn accumulate(&self, a: &ActivationBlock, lanes: &mut [f32; LANES], offsets: &mut f32) {
        let scale = self.d * a.d;
        for (lane, sum) in lanes.iter_mut().enumerate() {
            let mut products = 0i32;
            for t in 0..4 {
                let j = 4 * lane + t;
                let q = if j < 16 {
                    self.qs[j] & 0x0f
                } else {
                    self.qs[j - 16] >> 4
                };
                products += i32::from(q) * i32::from(a.qs[j]);
            }
            *sum = scale.mul_add(products as f32, *sum);
        }
        *offsets = self.m.mul_add(a.s, *offsets);
    }

    fn row_dot(weights: &[Self], activations: &[ActivationBlock]) -> f32 {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q4_1_row_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { x86::avx2::q4_1_row_dot(weights, activations) },
            Kernels::Portable => {}
        }
        row_dot(weights, activations)
    }

    fn tile_dot(weights: &[Self], tiles: &[TileBlock]) -> [f32; TILE] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q4_1_tile_dot(weights, tiles) },
            Kernels::Avx2 => return unsafe { x86::avx2::q4_1_tile_dot(weights, tiles) },
            Kernels::Portable => {}
        }
        tile_dot(weights, tiles)
    }

    fn tile_dot_two(weights: [&[Self]; 2], tiles: &[TileBlock]) -> [[f32; TILE]; 2] {
        // SAFETY: the CPU has the kernel's target features (checked at run time). AVX2 has
        // half the registers: two rows' sums and their operands do not fit (measured slower).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        if kernels() == Kernels::Avx512 {
            return unsafe { x86::avx512::q4_1_tile_dot_two(weights, tiles) };
        }
        weights.map(|row| Self::tile_dot(row, tiles))
    }
}

impl WeightBlock for Q8_0 {
    const NAME: &'static str = "Q8_0";
    const BYTES: usize = 34;

    fn read(bytes: &[u8]) -> Self {
        Self {
            d: half(&bytes[0..2]),
            qs: std::array::from_fn(|i| bytes[2 + i] as i8),
        }
    }

    #[inline(always)]
    fn accumulate(&self, a: &ActivationBlock, lanes: &mut [f32; LANES], _: &mut f32) {
        let scale = self.d * a.d;
        for (lane, sum) in lanes.iter_mut().enumerate() {
            let products: i32 = (4 * lane..4 * lane + 4)
                .map(|j| i32::from(self.qs[j]) * i32::from(a.qs[j]))
                .sum();
            *sum = scale.mul_add(products as f32, *sum);
        }
    }

    fn row_dot(weights: &[Self], activations: &[ActivationBlock]) -> f32 {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q8_0_row_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { x86::avx2::q8_0_row_dot(weights, activations) },
            Kernels::Portable => {}
        }
        row_dot(weights, activations)
    }

    fn tile_dot(weights: &[Self], tiles: &[TileBlock]) -> [f32; TILE] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q8_0_tile_dot(weights, tiles) },
            Kernels::Avx2 => return unsafe { x86::avx2::q8_0_tile_dot(weights, tiles) },
            Kernels::Portable => {}
        }
        tile_dot(weights, tiles)
    }
}

/// A `rows x cols` matrix of quantised blocks (rows are output features).
pub struct QuantisedMatrix<B> {
    rows: usize,
    cols: usize,
    blocks: Vec<B>,
}

impl<B: WeightBlock> QuantisedMatrix<B> {
    /// From the tensor's GGUF bytes.
    pub fn from_gguf_bytes(bytes: &[u8], rows: usize, cols: usize) -> Result<Self, ModelError> {
        let expected = rows * cols / BLOCK * B::BYTES;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != expected {
            return Err(ModelError::Load(format!(
                "a {} tensor of {rows} x {cols} should hold {expected} bytes, not {}",
                B::NAME,
                bytes.len()
            )));
        }
        let blocks = bytes.chunks_exact(B::BYTES).map(B::read).collect();
        Ok(Self { rows, cols, blocks })
    }

    /// `x` (`n x cols`, row-major) times the matrix's transpose: `n x rows`.
    #[cfg(test)]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut result = Vec::new();
        self.forward_into(x, n, &mut result, &mut MatmulScratch::default());
        result
    }

    /// `x` (`n x cols`, row-major) times the matrix's transpose (`n x rows`) into `result`;
    /// the memory of both `result` and `scratch` is reused.
    pub fn forward_into(
        &self,
        x: &[f32],
        n: usize,
        result: &mut Vec<f32>,
        scratch: &mut MatmulScratch,
    ) {
        let per_row = self.cols / BLOCK;
        let MatmulScratch {
            tiles,
            rest,
            products,
        } = scratch;
        let activations = QuantisedRows::new(x, n, self.cols, tiles, rest);
        let weight_tasks = self.rows.div_ceil(WEIGHT_ROWS_PER_TASK);
        let tasks = n.div_ceil(ACTIVATION_ROWS_PER_TASK) * weight_tasks;
        // Each task's products, activation row by weight row, a whole task's room apart
        // (the last tasks of each kind fill less of theirs).
        let stride = n.min(ACTIVATION_ROWS_PER_TASK) * WEIGHT_ROWS_PER_TASK;
        if products.len() < tasks * stride {
            products.resize(tasks * stride, 0.0);
        }
        products[..tasks * stride]
            .par_chunks_mut(stride)
            .enumerate()
            .for_each(|(task, out)| {
                let (a, w) = (task / weight_tasks, task % weight_tasks);
                let tokens =
                    a * ACTIVATION_ROWS_PER_TASK..n.min((a + 1) * ACTIVATION_ROWS_PER_TASK);
                let rows = w * WEIGHT_ROWS_PER_TASK..self.rows.min((w + 1) * WEIGHT_ROWS_PER_TASK);
                let weights = &self.blocks[rows.start * per_row..rows.end * per_row];
                activations.product(weights, tokens, out);
            });
        let products = &products[..tasks * stride];
        // Every value is overwritten: the buffer is resized, not cleared.
        result.resize(n * self.rows, 0.0);
        result
            .par_chunks_mut(self.rows)
            .with_min_len(16)
            .enumerate()
            .for_each(|(token, out)| {
                let (a, i) = (
                    token / ACTIVATION_ROWS_PER_TASK,
                    token % ACTIVATION_ROWS_PER_TASK,
                );
                let task_products = products[a * weight_tasks * stride..].chunks(stride);
                for (out, values) in out.chunks_mut(WEIGHT_ROWS_PER_TASK).zip(task_products) {
                    let width = out.len();
                    out.copy_from_slice(&values[i * width..(i + 1) * width]);
                }
            });
    }
}

/// A matmul's buffers, kept by the caller between matmuls: fresh ones each time cost the
/// kernel a page clearing for every few hundred kilobytes of them (the allocator gives
/// freed pages back to the host within milliseconds).
#[derive(Default)]
pub struct MatmulScratch {
    tiles: Vec<TileBlock>,
    rest: Vec<ActivationBlock>,
    products: Vec<f32>,
}

/// A matmul's activation rows, quantised: the whole tiles of [`TILE`] rows interleaved
/// block by block, then the rows after the last whole tile one by one.
struct QuantisedRows<'a> {
    per_row: usize,
    tiles: &'a [TileBlock],
    rest: &'a [ActivationBlock],
}

impl<'a> QuantisedRows<'a> {
    /// `x` (`n x cols`, row-major), quantised in parallel into the memory of `tiles` and
    /// `rest`.
    fn new(
        x: &[f32],
        n: usize,
        cols: usize,
        tiles: &'a mut Vec<TileBlock>,
        rest: &'a mut Vec<ActivationBlock>,
    ) -> Self {
        let per_row = cols / BLOCK;
        let tiled = n / TILE * TILE;
        let count = tiled / TILE * per_row;
        if tiles.len() < count {
            let zero = ActivationBlock {
                d: 0.0,
                s: 0.0,
                qs: [0; BLOCK],
            };
            tiles.resize(count, TileBlock::new([zero; TILE]));
        }
        let tiles = &mut tiles[..count];
        tiles
            .par_chunks_mut(QUANTISED_ROWS_PER_TASK / TILE * per_row)
            .zip(x[..tiled * cols].par_chunks(QUANTISED_ROWS_PER_TASK * cols))
            .for_each(|(blocks, rows)| {
                let tiles = blocks.chunks_exact_mut(per_row);
                for (blocks, tile) in tiles.zip(rows.chunks_exact(TILE * cols)) {
                    for (j, block) in blocks.iter_mut().enumerate() {
                        *block = TileBlock::new(std::array::from_fn(|t| {
                            quantise(&tile[t * cols + j * BLOCK..t * cols + (j + 1) * BLOCK])
                        }));
                    }
                }
            });
        rest.clear();
        rest.extend(x[tiled * cols..n * cols].chunks_exact(BLOCK).map(quantise));
        Self {
            per_row,
            tiles,
            rest,
        }
    }

    /// The products of some weight rows (`per_row` blocks each) with the activation rows
    /// `rows` (starting at a tile), activation row by weight row, into the start of `out`:
    /// the whole tiles through [`WeightBlock::tile_dot`], the rows after them one by one.
    fn product<B: WeightBlock>(&self, weights: &[B], rows: Range<usize>, out: &mut [f32]) {
        let per_row = self.per_row;
        let width = weights.len() / per_row;
        let out = &mut out[..rows.len() * width];
        let tiled = self.tiles.len() / per_row * TILE;
        let tiled_end = rows.end.min(tiled).max(rows.start);
        let tile_rows = out[..(tiled_end - rows.start) * width].chunks_exact_mut(TILE * width);
        for (k, out_tile) in tile_rows.enumerate() {
            let first = (rows.start / TILE + k) * per_row;
            let tile = &self.tiles[first..first + per_row];
            // Weight rows two at a time, the last alone where their number is odd.
            let mut pairs = weights.chunks_exact(2 * per_row);
            for (i, two_rows) in (&mut pairs).enumerate() {
                let (first, second) = two_rows.split_at(per_row);
                for (r, sums) in B::tile_dot_two([first, second], tile)
                    .into_iter()
                    .enumerate()
                {
                    for (t, value) in sums.into_iter().enumerate() {
                        out_tile[t * width + 2 * i + r] = value;
                    }
                }
            }
            if !pairs.remainder().is_empty() {
                let sums = B::tile_dot(pairs.remainder(), tile);
                for (t, value) in sums.into_iter().enumerate() {
                    out_tile[t * width + width - 1] = value;
                }
            }
        }
        for row in tiled_end..rows.end {
            let first = (row - tiled) * per_row;
            let activations = &self.rest[first..first + per_row];
            let out_row = &mut out[(row - rows.start) * width..(row - rows.start + 1) * width];
            for (value, weight_row) in out_row.iter_mut().zip(weights.chunks_exact(per_row)) {
                *value = B::row_dot(weight_row, activations);
            }
        }
    }
}

/// One block of activations in 8 bits, as llama.cpp's x86 build quantises them: the scale
/// is `max |x| / 127`, each value is multiplied by `127 / max |x|` and rounded half to
/// even.
fn quantise(values: &[f32]) -> ActivationBlock {
    #[cfg(target_arch = "x86_64")]
    if kernels() != Kernels::Portable {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        #[allow(unsafe_code)]
        return unsafe { x86::avx2::quantise(values) };
    }
    quantise_portable(values)
}

fn quantise_portable(values: &[f32]) -> ActivationBlock {
    let mut amax = 0.0f32;
    for v in values {
        amax = amax.max(v.abs());
    }
    let d = amax / 127.0;
    let inverse = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let mut qs = [0i8; BLOCK];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(values) {
        *q = (v * inverse).round_ties_even() as i8;
        sum += i32::from(*q);
    }
    activation_block(d, sum, qs)
}

/// The portable kernel, for CPUs without AVX2 and FMA (and the reference in tests).
fn row_dot<B: WeightBlock>(weights: &[B], activations: &[ActivationBlock]) -> f32 {
    let mut sums = [0.0f32; LANES];
    let mut offsets = 0.0f32;
    for (w, a) in weights.iter().zip(activations) {
        w.accumulate(a, &mut sums, &mut offsets);
    }
    lanes::hsum(sums) + offsets
}

/// The portable kernel of a tile: each of its rows through [`row_dot`]'s loop.
fn tile_dot<B: WeightBlock>(weights: &[B], tiles: &[TileBlock]) -> [f32; TILE] {
    std::array::from_fn(|t| {
        let mut sums = [0.0f32; LANES];
        let mut offsets = 0.0f32;
        for (w, tile) in weights.iter().zip(tiles) {
            w.accumulate(&tile.row(t), &mut sums, &mut offsets);
        }
        lanes::hsum(sums) + offsets
    })
}

/// The SIMD kernels this CPU runs, found once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    Portable,
    /// AVX2 and FMA: every x86-64 build host of ours.
    Avx2,
    /// AVX2 with AVX-512 (F, VL, BW) and VNNI's `vpdpbusd`: Zen 4, Sapphire Rapids.
    /// `RESIDENT_NO_VNNI` set turns them off.
    Avx512,
}

fn kernels() -> Kernels {
    static FOUND: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::avx2::available() {
                if std::env::var_os("RESIDENT_NO_VNNI").is_none() && x86::avx512::available() {
                    return Kernels::Avx512;
                }
                return Kernels::Avx2;
            }
        }
        Kernels::Portable
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// The kernel against candle's own matmul of the type (the same arithmetic in another
    /// order, activations rounded a little differently) and the dequantised weights in f32.
    fn matches_candle_and_the_f32_product<B: WeightBlock>(dtype: GgmlDType) {
        // More weight rows than a task takes, and activation rows for a tile and a rest.
        let (rows, cols, n) = (70, 96, TILE + 3);
        let weights: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 104_729 % 997) as f32 / 498.0 - 1.0) * 2.0)
            .collect();
        let device = Device::Cpu;
        let w = Tensor::from_slice(&weights, (rows, cols), &device).unwrap();
        let quantised = QTensor::quantize(&w, dtype).unwrap();
        let bytes = quantised.data().unwrap();
        let ours = QuantisedMatrix::<B>::from_gguf_bytes(&bytes, rows, cols)
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
            assert!((ours - candle).abs() < 2e-2, "{ours} vs candle {candle}");
            assert!((ours - exact).abs() < 0.05, "{ours} vs f32 {exact}");
        }
    }

    #[test]
    fn q4_1_matches_candle_and_the_f32_product() {
        matches_candle_and_the_f32_product::<Q4_1>(GgmlDType::Q4_1);
    }

    #[test]
    fn q8_0_matches_candle_and_the_f32_product() {
        matches_candle_and_the_f32_product::<Q8_0>(GgmlDType::Q8_0);
    }

    /// Every kernel set this CPU has (portable; AVX2; AVX-512 with VNNI), one row or a tile
    /// at a time, gives the portable loop's sums bit for bit; so does the AVX2 quantiser.
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    fn the_simd_kernels_equal_the_portable_loop() {
        let (rows, cols) = (9, 128);
        let weights: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let mut x: Vec<f32> = (0..TILE * cols)
            .map(|i| ((i * 104_729 % 997) as f32 / 498.0 - 1.0) * 2.0)
            .collect();
        x[..BLOCK].fill(0.0);
        let all: Vec<ActivationBlock> = x.chunks_exact(BLOCK).map(quantise_portable).collect();
        if x86::avx2::available() {
            for (block, values) in all.iter().zip(x.chunks_exact(BLOCK)) {
                // SAFETY: the CPU has AVX2 and FMA.
                let simd = unsafe { x86::avx2::quantise(values) };
                assert_eq!((simd.d, simd.s, simd.qs), (block.d, block.s, block.qs));
            }
        }
        let per_row = cols / BLOCK;
        let rows_of: [&[ActivationBlock]; TILE] =
            std::array::from_fn(|t| &all[t * per_row..(t + 1) * per_row]);
        let tile: Vec<TileBlock> = (0..per_row)
            .map(|j| TileBlock::new(rows_of.map(|row| row[j])))
            .collect();
        let activations = rows_of[0];
        let w = Tensor::from_slice(&weights, (rows, cols), &Device::Cpu).unwrap();
        let bytes = |dtype| {
            QTensor::quantize(&w, dtype)
                .unwrap()
                .data()
                .unwrap()
                .to_vec()
        };
        let q4_1 =
            QuantisedMatrix::<Q4_1>::from_gguf_bytes(&bytes(GgmlDType::Q4_1), rows, cols).unwrap();
        let q8_0 =
            QuantisedMatrix::<Q8_0>::from_gguf_bytes(&bytes(GgmlDType::Q8_0), rows, cols).unwrap();
        let mut checked = 0;
        for row in 0..rows {
            let blocks = row * per_row..(row + 1) * per_row;
            let (w4, w8) = (&q4_1.blocks[blocks.clone()], &q8_0.blocks[blocks]);
            // This row and the one after it (the first again for the last row).
            let next = (row + 1) % rows * per_row;
            let two = [w4, &q4_1.blocks[next..next + per_row]];
            let two_sums = two.map(|w| rows_of.map(|a| row_dot(w, a)));
            assert_eq!(Q4_1::tile_dot_two(two, &tile), two_sums);
            let row_4 = row_dot(w4, activations);
            let row_8 = row_dot(w8, activations);
            let tile_4 = rows_of.map(|a| row_dot(w4, a));
            let tile_8 = rows_of.map(|a| row_dot(w8, a));
            assert_eq!(tile_dot(w4, &tile), tile_4);
            assert_eq!(tile_dot(w8, &tile), tile_8);
            // SAFETY: each kernel set runs only where the CPU has its features.
            unsafe {
                if x86::avx2::available() {
                    assert_eq!(x86::avx2::q4_1_row_dot(w4, activations), row_4);
                    assert_eq!(x86::avx2::q8_0_row_dot(w8, activations), row_8);
                    assert_eq!(x86::avx2::q4_1_tile_dot(w4, &tile), tile_4);
                    assert_eq!(x86::avx2::q8_0_tile_dot(w8, &tile), tile_8);
                    checked += 1;
                }
                if x86::avx512::available() && x86::avx2::available() {
                    assert_eq!(x86::avx512::q4_1_row_dot(w4, activations), row_4);
                    assert_eq!(x86::avx512::q8_0_row_dot(w8, activations), row_8);
                    assert_eq!(x86::avx512::q4_1_tile_dot(w4, &tile), tile_4);
                    assert_eq!(x86::avx512::q4_1_tile_dot_two(two, &tile), two_sums);
                    assert_eq!(x86::avx512::q8_0_tile_dot(w8, &tile), tile_8);
                }
            }
        }
        eprintln!(
            "kernels here: {:?}; AVX2 checked on {checked} rows",
            kernels()
        );
    }

    /// A matmul's rows, tiled or left over, in tasks of any shape, are each row's
    /// [`row_dot`] bit for bit: how rows are batched never changes a logit.
    #[test]
    fn a_matmul_row_is_its_row_dot_whatever_the_batch() {
        let (rows, cols) = (WEIGHT_ROWS_PER_TASK + 5, 64);
        let n = ACTIVATION_ROWS_PER_TASK + TILE + 2;
        let weights: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 104_729 % 997) as f32 / 498.0 - 1.0) * 2.0)
            .collect();
        let w = Tensor::from_slice(&weights, (rows, cols), &Device::Cpu).unwrap();
        let bytes = QTensor::quantize(&w, GgmlDType::Q4_1)
            .unwrap()
            .data()
            .unwrap()
            .to_vec();
        let matrix = QuantisedMatrix::<Q4_1>::from_gguf_bytes(&bytes, rows, cols).unwrap();
        let all = matrix.forward(&x, n);
        let one = matrix.forward(&x[..cols], 1);
        assert_eq!(&all[..rows], &one[..]);
        let per_row = cols / BLOCK;
        for (i, row) in x.chunks_exact(cols).enumerate() {
            let activations: Vec<ActivationBlock> =
                row.chunks_exact(BLOCK).map(quantise_portable).collect();
            for r in 0..rows {
                let weight_row = &matrix.blocks[r * per_row..(r + 1) * per_row];
                assert_eq!(
                    all[i * rows + r],
                    row_dot(weight_row, &activations),
                    "{i}, {r}"
                );
            }
        }
    }

    /// Activations round half to even after a multiplication by `127 / max`: 0.5 and 2.5
    /// steps go down, 1.5 goes up.
    #[test]
    fn activations_round_half_to_even() {
        let mut values = [0.0f32; BLOCK];
        values[0] = 127.0;
        values[1] = 0.5;
        values[2] = 1.5;
        values[3] = 2.5;
        let block = quantise(&values);
        assert_eq!(quantise_portable(&values).qs, block.qs);
        assert_eq!(&block.qs[..4], &[127, 0, 2, 2]);
        assert_eq!(block.d, 1.0);
    }

    #[test]
    fn a_tensor_of_the_wrong_size_is_refused() {
        let error = QuantisedMatrix::<Q4_1>::from_gguf_bytes(&[0; 39], 2, 32)
            .err()
            .unwrap();
        assert!(
            error
                .to_string()
                .contains("Q4_1 tensor of 2 x 32 should hold 40 bytes"),
            "{error}"
        );
    }
}
