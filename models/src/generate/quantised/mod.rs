//! Quantised weights from GGUF files (Q4_1, Q8_0), multiplied the way llama.cpp's Q4_1 x
//! Q8_1 and Q8_0 x Q8_0 dot products do: each activation row is quantised to 8 bits per
//! block of 32 (a scale, and the scaled sum for Q4_1's minimum), and each block's integer
//! products are exact. Each block's integer sum is then scaled into its row's sum with one
//! fused multiply-add (`d_w * d_a`, one f32 product), block after block, and the minimums'
//! products (`m_w * s_a`) are summed beside it and added at the end: llama.cpp's reference
//! loop's order. candle reads Q4_1 only with a scalar loop (8 tokens/s for SmolLM2-135M on
//! 2 cores), and its Q8_0 kernel rounds activations differently; requantising to Q8_0 ran
//! fast but moved the logits far enough from llama.cpp's to fork greedy decoding
//! (BENCHMARKS.md).
//!
//! The weights are laid out at load in panels of [`PANEL`] rows (`blocks.rs`), so that a
//! 512-bit register's 16 lanes are 16 rows and each lane ends a block with its row's
//! integer sum: the kernels' float work is one multiply-add per row and block. A matmul
//! quantises its activation rows once; a kernel call takes one panel and up to [`TILE`]
//! activation rows. The SIMD kernels (`x86.rs`: AVX2, and AVX-512 with VNNI) are picked at
//! run time; every kernel gives the portable loop's sums bit for bit, and a row's sums do
//! not depend on the rows it is batched with.

use std::ops::Range;

use rayon::prelude::*;

use crate::ModelError;
pub use blocks::{ActivationBlock, PANEL, Q4_1, Q8_0, TILE};
use blocks::{BLOCK, activation_block};

mod blocks;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

/// Weight rows, and activation rows, of one parallel task: its weights stay in L1 or L2
/// while its activation rows pass them, and a step of any shape makes enough tasks for
/// every core.
const WEIGHT_ROWS_PER_TASK: usize = 2 * PANEL;
const ACTIVATION_ROWS_PER_TASK: usize = 32 * TILE;
/// Activation rows quantised by one parallel task.
const QUANTISED_ROWS_PER_TASK: usize = 8 * TILE;

/// One block of [`PANEL`] weight rows of one GGUF type.
pub trait WeightBlock: Copy + Send + Sync {
    /// The type's name, for errors.
    const NAME: &'static str;
    /// Bytes of one row's block in the file.
    const BYTES: usize;
    /// Whether the type has a minimum per block (`value = d * q + m`).
    const HAS_MINIMUM: bool;

    /// A panel block from one file block of each row; rows past the matrix are `None`.
    fn from_file(rows: [Option<&[u8]>; PANEL]) -> Self;
    /// Row `r`'s value `j` of the block, as stored (before scaling).
    fn value(&self, r: usize, j: usize) -> i32;
    /// Row `r`'s exact integer sum of products with `a`.
    fn integer_sum(&self, r: usize, a: &ActivationBlock) -> i32 {
        (0..BLOCK)
            .map(|j| self.value(r, j) * i32::from(a.qs[j]))
            .sum()
    }
    /// Each row's scale `d`.
    fn scales(&self) -> &[f32; PANEL];
    /// Each row's minimum `m` (zeros for types without one).
    fn minimums(&self) -> [f32; PANEL];

    /// The products of a panel (`per_row` blocks) with `T` activation rows: the SIMD kernel
    /// where the CPU has one, else [`panel_dot`] (the same sums in the same order).
    fn panel_dot<const T: usize>(
        panel: &[Self],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T];
}

impl WeightBlock for Q4_1 {
    const NAME: &'static str = "Q4_1";
    const BYTES: usize = Q4_1::FILE_BYTES;
    const HAS_MINIMUM: bool = true;

    fn from_file(rows: [Option<&[u8]>; PANEL]) -> Self {
        Q4_1::from_file(rows)
    }

    fn value(&self, r: usize, j: usize) -> i32 {
        self.stored_value(r, j)
    }

    fn scales(&self) -> &[f32; PANEL] {
        &self.d
    }

    fn minimums(&self) -> [f32; PANEL] {
        self.m
    }

    fn panel_dot<const T: usize>(
        panel: &[Self],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q4_1_panel_dot(panel, rows) },
            Kernels::Avx2 => return unsafe { x86::avx2::q4_1_panel_dot(panel, rows) },
            Kernels::Portable => {}
        }
        panel_dot(panel, rows)
    }
}

impl WeightBlock for Q8_0 {
    const NAME: &'static str = "Q8_0";
    const BYTES: usize = Q8_0::FILE_BYTES;
    const HAS_MINIMUM: bool = false;

    fn from_file(rows: [Option<&[u8]>; PANEL]) -> Self {
        Q8_0::from_file(rows)
    }

    fn value(&self, r: usize, j: usize) -> i32 {
        self.stored_value(r, j)
    }

    fn scales(&self) -> &[f32; PANEL] {
        &self.d
    }

    fn minimums(&self) -> [f32; PANEL] {
        [0.0; PANEL]
    }

    fn panel_dot<const T: usize>(
        panel: &[Self],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Avx512 => return unsafe { x86::avx512::q8_0_panel_dot(panel, rows) },
            Kernels::Avx2 => return unsafe { x86::avx2::q8_0_panel_dot(panel, rows) },
            Kernels::Portable => {}
        }
        panel_dot(panel, rows)
    }
}

/// The portable kernel, for CPUs without AVX2 and FMA, and the reference of the tests:
/// for each activation row and weight row, block after block, the integer sum scaled by
/// `d_w * d_a` into the sum with a fused multiply-add, and `m_w * s_a` into the offsets;
/// the two added at the end (types without a minimum return the sums).
fn panel_dot<B: WeightBlock, const T: usize>(
    panel: &[B],
    rows: [&[ActivationBlock]; T],
) -> [[f32; PANEL]; T] {
    rows.map(|row| {
        let mut sums = [0.0f32; PANEL];
        let mut offsets = [0.0f32; PANEL];
        for (w, a) in panel.iter().zip(row) {
            let minimums = w.minimums();
            for r in 0..PANEL {
                let scale = w.scales()[r] * a.d;
                sums[r] = scale.mul_add(w.integer_sum(r, a) as f32, sums[r]);
                offsets[r] = minimums[r].mul_add(a.s, offsets[r]);
            }
        }
        if B::HAS_MINIMUM {
            std::array::from_fn(|r| sums[r] + offsets[r])
        } else {
            sums
        }
    })
}

/// A `rows x cols` matrix of quantised blocks (rows are output features), in panels of
/// [`PANEL`] rows (the last one padded with zero rows).
pub struct QuantisedMatrix<B> {
    rows: usize,
    cols: usize,
    /// Panel `p`'s blocks are `panels[p * per_row..(p + 1) * per_row]`.
    panels: Vec<B>,
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
        let per_row = cols / BLOCK;
        let file_row = per_row * B::BYTES;
        let panels = (0..rows.div_ceil(PANEL) * per_row)
            .into_par_iter()
            .map(|i| {
                let (p, j) = (i / per_row, i % per_row);
                B::from_file(std::array::from_fn(|r| {
                    let row = p * PANEL + r;
                    let start = row * file_row + j * B::BYTES;
                    (row < rows).then(|| &bytes[start..start + B::BYTES])
                }))
            })
            .collect();
        Ok(Self { rows, cols, panels })
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
        let activations = QuantisedRows::new(x, n, self.cols, &mut scratch.activations);
        let weight_tasks = self.rows.div_ceil(WEIGHT_ROWS_PER_TASK);
        let tasks = n.div_ceil(ACTIVATION_ROWS_PER_TASK) * weight_tasks;
        // Every value is overwritten: the buffer is resized, not cleared.
        result.resize(n * self.rows, 0.0);
        let out = TaskOutput::new(result, self.rows);
        let panels_per_task = WEIGHT_ROWS_PER_TASK / PANEL * per_row;
        (0..tasks).into_par_iter().for_each(|task| {
            let (a, w) = (task / weight_tasks, task % weight_tasks);
            let tokens = a * ACTIVATION_ROWS_PER_TASK..n.min((a + 1) * ACTIVATION_ROWS_PER_TASK);
            let columns = w * WEIGHT_ROWS_PER_TASK..self.rows.min((w + 1) * WEIGHT_ROWS_PER_TASK);
            let first = w * panels_per_task;
            let panels = &self.panels[first..self.panels.len().min(first + panels_per_task)];
            // SAFETY: each task has its own (tokens, columns) block of the result.
            #[allow(unsafe_code)]
            let out = unsafe { out.block(tokens.clone(), columns) };
            activations.product(panels, tokens, out);
        });
    }
}

/// A matmul's result (`n x rows`, row-major) as parallel tasks write it: each task its own
/// block of activation rows and weight columns, straight into place (a buffer per task and
/// a pass to copy it over cost 6% of a generation step in `memmove` calls).
#[derive(Clone, Copy)]
struct TaskOutput {
    start: *mut f32,
    n: usize,
    row_stride: usize,
}

// SAFETY: tasks given a `TaskOutput` write disjoint blocks (`block`'s contract) and finish
// before the result buffer is touched again.
#[allow(unsafe_code)]
unsafe impl Send for TaskOutput {}
#[allow(unsafe_code)]
unsafe impl Sync for TaskOutput {}

impl TaskOutput {
    fn new(result: &mut [f32], row_stride: usize) -> Self {
        Self {
            start: result.as_mut_ptr(),
            n: result.len() / row_stride,
            row_stride,
        }
    }

    /// The block of rows `tokens` and columns `columns`.
    ///
    /// # Safety
    /// No other live `OutputBlock` may share an element with this one.
    #[allow(unsafe_code)]
    unsafe fn block(self, tokens: Range<usize>, columns: Range<usize>) -> OutputBlock {
        assert!(tokens.end <= self.n && columns.end <= self.row_stride);
        OutputBlock {
            out: self,
            tokens,
            columns,
        }
    }
}

/// One task's block of a matmul's result.
struct OutputBlock {
    out: TaskOutput,
    tokens: Range<usize>,
    columns: Range<usize>,
}

impl OutputBlock {
    /// Writes the first `valid` sums of one panel (`sums[r]` is weight row `first + r` of
    /// the block's columns) for activation row `token`.
    #[inline(always)]
    fn put(&mut self, token: usize, first: usize, valid: usize, sums: &[f32; PANEL]) {
        assert!(self.tokens.contains(&token) && first + valid <= self.columns.len());
        let at = token * self.out.row_stride + self.columns.start + first;
        // SAFETY: inside this block (checked above), which no other task writes
        // (`TaskOutput::block`); a whole panel is copied at a fixed size, so without a call.
        #[allow(unsafe_code)]
        unsafe {
            let to = self.out.start.add(at);
            if valid == PANEL {
                to.cast::<[f32; PANEL]>().write_unaligned(*sums);
            } else {
                std::ptr::copy_nonoverlapping(sums.as_ptr(), to, valid);
            }
        }
    }
}

/// A matmul's buffers, kept by the caller between matmuls: fresh ones each time cost the
/// kernel a page clearing for every few hundred kilobytes of them (the allocator gives
/// freed pages back to the host within milliseconds).
#[derive(Default)]
pub struct MatmulScratch {
    activations: Vec<ActivationBlock>,
}

/// A matmul's activation rows, quantised, row after row.
struct QuantisedRows<'a> {
    per_row: usize,
    blocks: &'a [ActivationBlock],
}

impl<'a> QuantisedRows<'a> {
    /// `x` (`n x cols`, row-major), quantised in parallel into the memory of `blocks`.
    fn new(x: &[f32], n: usize, cols: usize, blocks: &'a mut Vec<ActivationBlock>) -> Self {
        let per_row = cols / BLOCK;
        let count = n * per_row;
        if blocks.len() < count {
            blocks.resize(count, activation_block(0.0, 0, [0; BLOCK]));
        }
        let blocks = &mut blocks[..count];
        blocks
            .par_chunks_mut(QUANTISED_ROWS_PER_TASK * per_row)
            .zip(x[..n * cols].par_chunks(QUANTISED_ROWS_PER_TASK * cols))
            .for_each(|(blocks, values)| quantise_blocks(values, blocks));
        Self { per_row, blocks }
    }

    fn row(&self, i: usize) -> &[ActivationBlock] {
        &self.blocks[i * self.per_row..(i + 1) * self.per_row]
    }

    /// The products of some panels with the activation rows `rows`, into their block of
    /// the result: each panel against the rows [`TILE`] at a time, then the rows after the
    /// last whole tile together.
    fn product<B: WeightBlock>(&self, panels: &[B], rows: Range<usize>, mut out: OutputBlock) {
        let width = out.columns.len();
        for (p, panel) in panels.chunks_exact(self.per_row).enumerate() {
            let (first_weight, valid) = (p * PANEL, PANEL.min(width - p * PANEL));
            let mut put = |row: usize, sums: &[f32; PANEL]| {
                out.put(row, first_weight, valid, sums);
            };
            let mut row = rows.start;
            while row < rows.end {
                let count = TILE.min(rows.end - row);
                match count {
                    4 => self.group::<B, 4>(panel, row, &mut put),
                    3 => self.group::<B, 3>(panel, row, &mut put),
                    2 => self.group::<B, 2>(panel, row, &mut put),
                    _ => self.group::<B, 1>(panel, row, &mut put),
                }
                row += count;
            }
        }
    }

    /// One panel's products with activation rows `first..first + T`, each row's handed
    /// to `put`.
    fn group<B: WeightBlock, const T: usize>(
        &self,
        panel: &[B],
        first: usize,
        put: &mut impl FnMut(usize, &[f32; PANEL]),
    ) {
        let sums = B::panel_dot::<T>(panel, std::array::from_fn(|t| self.row(first + t)));
        for (t, sums) in sums.iter().enumerate() {
            put(first + t, sums);
        }
    }
}

/// Consecutive blocks of `values` quantised into `blocks`, each as `quantise_portable`
/// does it.
fn quantise_blocks(values: &[f32], blocks: &mut [ActivationBlock]) {
    #[cfg(target_arch = "x86_64")]
    if kernels() != Kernels::Portable {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        #[allow(unsafe_code)]
        return unsafe { x86::avx2::quantise_blocks(values, blocks) };
    }
    for (block, values) in blocks.iter_mut().zip(values.chunks_exact(BLOCK)) {
        *block = quantise_portable(values);
    }
}

/// One block of activations in 8 bits, as llama.cpp's x86 build quantises them: the scale
/// is `max |x| / 127`, each value is multiplied by `127 / max |x|` and rounded half to
/// even.
#[cfg(test)]
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
    use crate::generate::quantised::blocks::half;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Module, Tensor};

    fn weights(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3)
            .collect()
    }

    fn inputs(n: usize, cols: usize) -> Vec<f32> {
        (0..n * cols)
            .map(|i| ((i * 104_729 % 997) as f32 / 498.0 - 1.0) * 2.0)
            .collect()
    }

    fn file_bytes(weights: &[f32], rows: usize, cols: usize, dtype: GgmlDType) -> Vec<u8> {
        let w = Tensor::from_slice(weights, (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&w, dtype)
            .unwrap()
            .data()
            .unwrap()
            .to_vec()
    }

    /// The kernel against candle's own matmul of the type (the same arithmetic in another
    /// order, activations rounded a little differently) and the dequantised weights in f32.
    fn matches_candle_and_the_f32_product<B: WeightBlock>(dtype: GgmlDType) {
        // Two tasks of weight rows, the last panel part empty, and a tile and a rest.
        let (rows, cols, n) = (WEIGHT_ROWS_PER_TASK + 6, 96, TILE + 3);
        let weights = weights(rows, cols);
        let x = inputs(n, cols);
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

    /// llama.cpp's reference loop over one row's file blocks: each block's integer sum
    /// scaled into the sum, the minimum's product into the offsets, added at the end.
    fn reference_row(file_row: &[u8], a: &[ActivationBlock], q4_1: bool) -> f32 {
        let (bytes, mut sum, mut offsets) = (if q4_1 { 20 } else { 34 }, 0.0f32, 0.0f32);
        for (block, a) in file_row.chunks_exact(bytes).zip(a) {
            let d = half(&block[0..2]);
            let integer: i32 = (0..BLOCK)
                .map(|j| {
                    let q = if !q4_1 {
                        i32::from(block[2 + j] as i8)
                    } else if j < 16 {
                        i32::from(block[4 + j] & 0x0f)
                    } else {
                        i32::from(block[4 + j - 16] >> 4)
                    };
                    q * i32::from(a.qs[j])
                })
                .sum();
            sum = (d * a.d).mul_add(integer as f32, sum);
            if q4_1 {
                offsets = half(&block[2..4]).mul_add(a.s, offsets);
            }
        }
        if q4_1 { sum + offsets } else { sum }
    }

    /// Every row of a matmul, tiled or left over, in tasks of any shape, is llama.cpp's
    /// reference loop over the file's bytes bit for bit: how rows are batched, and which
    /// kernel this CPU runs, never change a logit.
    #[test]
    fn a_matmul_row_is_the_reference_loop_whatever_the_batch() {
        let (rows, cols) = (WEIGHT_ROWS_PER_TASK + 5, 64);
        let n = ACTIVATION_ROWS_PER_TASK + TILE + 2;
        let weights = weights(rows, cols);
        let x = inputs(n, cols);
        for (dtype, q4_1) in [(GgmlDType::Q4_1, true), (GgmlDType::Q8_0, false)] {
            let mut bytes = file_bytes(&weights, rows, cols, dtype);
            if !q4_1 {
                // The type's extreme value, which the quantiser never writes.
                bytes[2] = 0x80;
            }
            let all = if q4_1 {
                QuantisedMatrix::<Q4_1>::from_gguf_bytes(&bytes, rows, cols)
                    .unwrap()
                    .forward(&x, n)
            } else {
                QuantisedMatrix::<Q8_0>::from_gguf_bytes(&bytes, rows, cols)
                    .unwrap()
                    .forward(&x, n)
            };
            let file_row = bytes.len() / rows;
            for (i, row) in x.chunks_exact(cols).enumerate() {
                let activations: Vec<ActivationBlock> =
                    row.chunks_exact(BLOCK).map(quantise_portable).collect();
                for r in 0..rows {
                    let file = &bytes[r * file_row..(r + 1) * file_row];
                    let expected = reference_row(file, &activations, q4_1);
                    assert_eq!(all[i * rows + r], expected, "{dtype:?} {i}, {r}");
                }
            }
        }
    }

    /// Every kernel set this CPU has (portable; AVX2; AVX-512 with VNNI), for one to
    /// [`TILE`] activation rows, gives the portable loop's sums bit for bit; so does the
    /// AVX2 quantiser.
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    fn the_simd_kernels_equal_the_portable_loop() {
        let (rows, cols) = (PANEL + 3, 128);
        let mut x = inputs(TILE, cols);
        x[..BLOCK].fill(0.0);
        let all: Vec<ActivationBlock> = x.chunks_exact(BLOCK).map(quantise_portable).collect();
        if x86::avx2::available() {
            for (block, values) in all.iter().zip(x.chunks_exact(BLOCK)) {
                // SAFETY: the CPU has AVX2 and FMA.
                assert_eq!(unsafe { x86::avx2::quantise(values) }, *block);
            }
        }
        let per_row = cols / BLOCK;
        let rows_of: [&[ActivationBlock]; TILE] =
            std::array::from_fn(|t| &all[t * per_row..(t + 1) * per_row]);
        let weights = weights(rows, cols);
        let mut q8 = file_bytes(&weights, rows, cols, GgmlDType::Q8_0);
        q8[2] = 0x80;
        let q4_1 = QuantisedMatrix::<Q4_1>::from_gguf_bytes(
            &file_bytes(&weights, rows, cols, GgmlDType::Q4_1),
            rows,
            cols,
        )
        .unwrap();
        let q8_0 = QuantisedMatrix::<Q8_0>::from_gguf_bytes(&q8, rows, cols).unwrap();
        let mut checked = 0;
        for p in 0..rows.div_ceil(PANEL) {
            let blocks = p * per_row..(p + 1) * per_row;
            let (w4, w8) = (&q4_1.panels[blocks.clone()], &q8_0.panels[blocks]);
            checked += check_kernels(w4, w8, rows_of);
            checked += check_kernels(w4, w8, [rows_of[1], rows_of[0], rows_of[3]]);
            checked += check_kernels(w4, w8, [rows_of[2], rows_of[1]]);
            checked += check_kernels(w4, w8, [rows_of[3]]);
        }
        eprintln!(
            "kernels here: {:?}; {checked} kernel calls checked",
            kernels()
        );
    }

    /// Each SIMD kernel this CPU has against the portable loop; how many were checked.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    fn check_kernels<const T: usize>(
        w4: &[Q4_1],
        w8: &[Q8_0],
        rows: [&[ActivationBlock]; T],
    ) -> usize {
        let (portable_4, portable_8) = (panel_dot(w4, rows), panel_dot(w8, rows));
        let mut checked = 0;
        // SAFETY: each kernel set runs only where the CPU has its features.
        unsafe {
            if x86::avx2::available() {
                assert_eq!(x86::avx2::q4_1_panel_dot(w4, rows), portable_4, "AVX2 Q4_1");
                assert_eq!(x86::avx2::q8_0_panel_dot(w8, rows), portable_8, "AVX2 Q8_0");
                checked += 2;
                if x86::avx512::available() {
                    assert_eq!(x86::avx512::q4_1_panel_dot(w4, rows), portable_4, "Q4_1");
                    assert_eq!(x86::avx512::q8_0_panel_dot(w8, rows), portable_8, "Q8_0");
                    checked += 2;
                }
            }
        }
        checked
    }

    /// The panel layout keeps every row's values: each is the file's, as candle
    /// dequantises it.
    #[test]
    fn a_panel_holds_each_rows_values() {
        let (rows, cols) = (PANEL + 3, 64);
        let weights = weights(rows, cols);
        let bytes = file_bytes(&weights, rows, cols, GgmlDType::Q4_1);
        let w = Tensor::from_slice(&weights, (rows, cols), &Device::Cpu).unwrap();
        let candle = QTensor::quantize(&w, GgmlDType::Q4_1)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let matrix = QuantisedMatrix::<Q4_1>::from_gguf_bytes(&bytes, rows, cols).unwrap();
        let per_row = cols / BLOCK;
        for p in 0..rows.div_ceil(PANEL) {
            for j in 0..per_row {
                let block = &matrix.panels[p * per_row + j];
                for r in 0..PANEL {
                    let row = p * PANEL + r;
                    for k in 0..BLOCK {
                        let value = block.value(r, k) as f32 * block.d[r] + block.m[r];
                        let expected = candle.get(row * cols + j * BLOCK + k).copied();
                        assert_eq!(value, expected.unwrap_or(0.0), "{row}, {j}, {k}");
                    }
                }
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
