//! Quantised weights kept as the GGUF file stores them (Q4_1, Q8_0), multiplied the way
//! llama.cpp does: each activation row is quantised to 8 bits per block of 32 (a scale,
//! and for Q4_1 the scaled sum too), each block's integer products are exact, and the
//! blocks' scaled products are summed in 8 lanes of 4 values each with fused
//! multiply-adds (`lanes.rs`). candle reads Q4_1 only with a scalar loop (8 tokens/s for
//! SmolLM2-135M on 2 cores), and its Q8_0 kernel rounds activations differently;
//! requantising to Q8_0 ran fast but moved the logits far enough from llama.cpp's to fork
//! greedy decoding (BENCHMARKS.md). Written for the compiler to vectorise, built for
//! AVX-512, AVX2 and plain x86-64, picked at run time.

use half::f16;
use rayon::prelude::*;

use super::lanes::{self, LANES};
use crate::ModelError;

const BLOCK: usize = 32;
/// Activation rows one kernel call multiplies by a weight row: four independent sums, so
/// each fused multiply-add need not wait for the one before it (a single row's sum waits
/// four cycles a block), and each weight block is unpacked once for four rows.
pub const TILE: usize = 4;
/// Weight rows, and activation rows, of one parallel task: its weights stay in L1 while
/// its activation rows pass them, and a step of any shape makes enough tasks for every
/// core.
const WEIGHT_ROWS_PER_TASK: usize = 32;
const ACTIVATION_ROWS_PER_TASK: usize = 128;

/// One block of activations quantised to 8 bits.
#[derive(Clone, Copy)]
pub struct ActivationBlock {
    /// The scale and `scale * Σ qs`, rounded through f16 as llama.cpp stores them.
    d: f32,
    s: f32,
    qs: [i8; BLOCK],
}

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

    /// `Σ` over a row's blocks: the AVX2 kernel where the CPU has one, else the portable
    /// loop (the same sums in the same order).
    fn row_dot(weights: &[Self], activations: &[ActivationBlock]) -> f32 {
        row_dot(weights, activations)
    }

    /// [`WeightBlock::row_dot`] of one weight row with [`TILE`] activation rows, each sum
    /// taken in the same order as alone (so the same bits).
    fn tile_dot(weights: &[Self], activations: [&[ActivationBlock]; TILE]) -> [f32; TILE] {
        activations.map(|row| row_dot(weights, row))
    }
}

fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

/// Q4_1: `d` and `m` as f16, then 16 bytes of 4-bit values (the low nibbles are the block's
/// first 16 values, the high nibbles its last 16); a value is `d * q + m`.
#[derive(Clone, Copy)]
pub struct Q4_1 {
    d: f32,
    m: f32,
    qs: [u8; 16],
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
            Kernels::Vnni => return unsafe { vnni::q4_1_row_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { avx2::q4_1_row_dot(weights, activations) },
            Kernels::Portable => {}
        }
        row_dot(weights, activations)
    }

    fn tile_dot(weights: &[Self], activations: [&[ActivationBlock]; TILE]) -> [f32; TILE] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Vnni => return unsafe { vnni::q4_1_tile_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { avx2::q4_1_tile_dot(weights, activations) },
            Kernels::Portable => {}
        }
        activations.map(|row| row_dot(weights, row))
    }
}

/// Q8_0: `d` as f16, then 32 signed bytes; a value is `d * q`.
#[derive(Clone, Copy)]
pub struct Q8_0 {
    d: f32,
    qs: [i8; BLOCK],
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
            Kernels::Vnni => return unsafe { vnni::q8_0_row_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { avx2::q8_0_row_dot(weights, activations) },
            Kernels::Portable => {}
        }
        row_dot(weights, activations)
    }

    fn tile_dot(weights: &[Self], activations: [&[ActivationBlock]; TILE]) -> [f32; TILE] {
        // SAFETY: the CPU has the kernels' target features (checked at run time).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        match kernels() {
            Kernels::Vnni => return unsafe { vnni::q8_0_tile_dot(weights, activations) },
            Kernels::Avx2 => return unsafe { avx2::q8_0_tile_dot(weights, activations) },
            Kernels::Portable => {}
        }
        activations.map(|row| row_dot(weights, row))
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
        self.forward_into(x, n, &mut result);
        result
    }

    /// `x` (`n x cols`, row-major) times the matrix's transpose (`n x rows`) into `result`,
    /// whose memory is reused.
    pub fn forward_into(&self, x: &[f32], n: usize, result: &mut Vec<f32>) {
        let per_row = self.cols / BLOCK;
        let activations: Vec<ActivationBlock> = x.chunks_exact(BLOCK).map(quantise).collect();
        let weight_tasks = self.rows.div_ceil(WEIGHT_ROWS_PER_TASK);
        let tasks: Vec<(usize, usize)> = (0..n.div_ceil(ACTIVATION_ROWS_PER_TASK))
            .flat_map(|a| (0..weight_tasks).map(move |w| (a, w)))
            .collect();
        // Each task's products, activation row by weight row.
        let products: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(a, w)| {
                let tokens =
                    a * ACTIVATION_ROWS_PER_TASK..n.min((a + 1) * ACTIVATION_ROWS_PER_TASK);
                let rows = w * WEIGHT_ROWS_PER_TASK..self.rows.min((w + 1) * WEIGHT_ROWS_PER_TASK);
                let weights = &self.blocks[rows.start * per_row..rows.end * per_row];
                let x = &activations[tokens.start * per_row..tokens.end * per_row];
                tile_product(weights, x, per_row)
            })
            .collect();
        result.clear();
        result.resize(n * self.rows, 0.0);
        for (&(a, w), values) in tasks.iter().zip(&products) {
            let first_row = w * WEIGHT_ROWS_PER_TASK;
            let width = self.rows.min(first_row + WEIGHT_ROWS_PER_TASK) - first_row;
            for (i, token_values) in values.chunks_exact(width).enumerate() {
                let at = (a * ACTIVATION_ROWS_PER_TASK + i) * self.rows + first_row;
                result[at..at + width].copy_from_slice(token_values);
            }
        }
    }
}

/// The products of some weight rows with some activation rows (`per_row` blocks each),
/// activation row by weight row: [`TILE`] activation rows at a time past every weight row,
/// the rows left over one by one.
fn tile_product<B: WeightBlock>(
    weights: &[B],
    activations: &[ActivationBlock],
    per_row: usize,
) -> Vec<f32> {
    let width = weights.len() / per_row;
    let mut out = vec![0.0f32; activations.len() / per_row * width];
    let mut tiles = activations.chunks_exact(TILE * per_row);
    let mut out_tiles = out.chunks_exact_mut(TILE * width);
    for (tile, out_tile) in (&mut tiles).zip(&mut out_tiles) {
        let rows: [&[ActivationBlock]; TILE] =
            std::array::from_fn(|t| &tile[t * per_row..(t + 1) * per_row]);
        for (r, weight_row) in weights.chunks_exact(per_row).enumerate() {
            for (t, value) in B::tile_dot(weight_row, rows).into_iter().enumerate() {
                out_tile[t * width + r] = value;
            }
        }
    }
    let rest = tiles.remainder().chunks_exact(per_row);
    for (row, out_row) in rest.zip(out_tiles.into_remainder().chunks_exact_mut(width)) {
        for (value, weight_row) in out_row.iter_mut().zip(weights.chunks_exact(per_row)) {
            *value = B::row_dot(weight_row, row);
        }
    }
    out
}

/// One block of activations in 8 bits, as llama.cpp's x86 build quantises them: the scale
/// is `max |x| / 127`, each value is multiplied by `127 / max |x|` and rounded half to
/// even.
fn quantise(values: &[f32]) -> ActivationBlock {
    #[cfg(target_arch = "x86_64")]
    if kernels() != Kernels::Portable {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        #[allow(unsafe_code)]
        return unsafe { avx2::quantise(values) };
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

/// The block with its scale `d` and `d * sum`, rounded through f16 as llama.cpp stores them.
fn activation_block(d: f32, sum: i32, qs: [i8; BLOCK]) -> ActivationBlock {
    ActivationBlock {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
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

/// The SIMD kernels this CPU runs, found once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    Portable,
    /// AVX2 and FMA: every x86-64 build host of ours.
    Avx2,
    /// AVX2 with AVX-512 VNNI's `vpdpbusd` for the integer products (Zen 4, Sapphire Rapids).
    Vnni,
}

fn kernels() -> Kernels {
    static FOUND: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("RESIDENT_NO_VNNI").is_none()
                && vnni::available()
                && avx2::available()
            {
                return Kernels::Vnni;
            }
            if avx2::available() {
                return Kernels::Avx2;
            }
        }
        Kernels::Portable
    })
}

/// The four kernels (one weight row by one activation row, or by [`TILE`] of them, for Q4_1
/// and Q8_0) in x86 intrinsics, for the target features given, with `products` giving
/// each lane the exact integer sum of its 4 byte products. Every lane's scaled products go
/// into it with a fused multiply-add, block after block, as in the portable loop.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_kernels {
    ($features:literal) => {
        use std::arch::x86_64::*;

        use super::{ActivationBlock, LANES, Q4_1, Q8_0, TILE, lanes};

        #[target_feature(enable = $features)]
        fn finish(sums: __m256, offsets: f32) -> f32 {
            let mut out = [0.0f32; LANES];
            // SAFETY: `out` holds 8 f32.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
            lanes::hsum(out) + offsets
        }

        /// A Q4_1 block's 32 values as unsigned bytes: the low nibbles, then the high.
        #[target_feature(enable = $features)]
        fn nibbles(w: &Q4_1) -> __m256i {
            let low_mask = _mm_set1_epi8(0x0f);
            // SAFETY: 16 bytes are read from an array of 16.
            let packed = unsafe { _mm_loadu_si128(w.qs.as_ptr().cast()) };
            let low = _mm_and_si128(packed, low_mask);
            let high = _mm_and_si128(_mm_srli_epi16::<4>(packed), low_mask);
            _mm256_set_m128i(high, low)
        }

        #[target_feature(enable = $features)]
        fn load(a: &ActivationBlock) -> __m256i {
            // SAFETY: 32 bytes are read from an array of 32.
            unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) }
        }

        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q4_1_row_dot(weights: &[Q4_1], activations: &[ActivationBlock]) -> f32 {
            let mut sums = _mm256_setzero_ps();
            let mut offsets = 0.0f32;
            for (w, a) in weights.iter().zip(activations) {
                let products = _mm256_cvtepi32_ps(products(nibbles(w), load(a)));
                sums = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums);
                offsets = w.m.mul_add(a.s, offsets);
            }
            finish(sums, offsets)
        }

        /// [`q4_1_row_dot`] of one weight row with [`TILE`] activation rows: each block's
        /// nibbles unpacked once, the rows' sums independent of each other.
        ///
        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q4_1_tile_dot(
            weights: &[Q4_1],
            activations: [&[ActivationBlock]; TILE],
        ) -> [f32; TILE] {
            let mut sums = [_mm256_setzero_ps(); TILE];
            let mut offsets = [0.0f32; TILE];
            let [a0, a1, a2, a3] = activations;
            let blocks = weights.iter().zip(a0).zip(a1).zip(a2).zip(a3);
            for ((((w, a0), a1), a2), a3) in blocks {
                let values = nibbles(w);
                for (t, a) in [a0, a1, a2, a3].into_iter().enumerate() {
                    let products = _mm256_cvtepi32_ps(products(values, load(a)));
                    sums[t] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums[t]);
                    offsets[t] = w.m.mul_add(a.s, offsets[t]);
                }
            }
            let mut out = [0.0f32; TILE];
            for t in 0..TILE {
                out[t] = finish(sums[t], offsets[t]);
            }
            out
        }

        /// A Q8_0 block's products with `a`: `|w|` times `a` with `w`'s sign, as the
        /// unsigned-by-signed multiply needs.
        #[target_feature(enable = $features)]
        fn signed_products(values: __m256i, a: &ActivationBlock) -> __m256i {
            let magnitudes = _mm256_sign_epi8(values, values);
            products(magnitudes, _mm256_sign_epi8(load(a), values))
        }

        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0_row_dot(weights: &[Q8_0], activations: &[ActivationBlock]) -> f32 {
            let mut sums = _mm256_setzero_ps();
            for (w, a) in weights.iter().zip(activations) {
                // SAFETY: 32 bytes are read from an array of 32.
                let values = unsafe { _mm256_loadu_si256(w.qs.as_ptr().cast()) };
                let products = _mm256_cvtepi32_ps(signed_products(values, a));
                sums = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums);
            }
            finish(sums, 0.0)
        }

        /// [`q8_0_row_dot`] of one weight row with [`TILE`] activation rows.
        ///
        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0_tile_dot(
            weights: &[Q8_0],
            activations: [&[ActivationBlock]; TILE],
        ) -> [f32; TILE] {
            let mut sums = [_mm256_setzero_ps(); TILE];
            let [a0, a1, a2, a3] = activations;
            let blocks = weights.iter().zip(a0).zip(a1).zip(a2).zip(a3);
            for ((((w, a0), a1), a2), a3) in blocks {
                // SAFETY: 32 bytes are read from an array of 32.
                let values = unsafe { _mm256_loadu_si256(w.qs.as_ptr().cast()) };
                for (t, a) in [a0, a1, a2, a3].into_iter().enumerate() {
                    let products = _mm256_cvtepi32_ps(signed_products(values, a));
                    sums[t] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums[t]);
                }
            }
            let mut out = [0.0f32; TILE];
            for t in 0..TILE {
                out[t] = finish(sums[t], 0.0);
            }
            out
        }
    };
}

/// The kernels in AVX2: `vpmaddubsw` multiplies a block's 32 byte pairs and adds
/// neighbours, `vpmaddwd` adds those in fours. The sums are exact: a pair of 4-bit (or
/// 7-bit magnitude) by 8-bit products stays inside 16 bits.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    x86_kernels!("avx2,fma");

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[target_feature(enable = "avx2,fma")]
    fn products(unsigned: __m256i, signed: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned, signed), _mm256_set1_epi16(1))
    }

    /// [`super::quantise`]: the same maximum, products and rounding (the CPU's default,
    /// to nearest even), 8 values a register.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `values` must hold 32 values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise(values: &[f32]) -> ActivationBlock {
        assert_eq!(values.len(), 32);
        // SAFETY: 4 x 8 values are read from 32.
        let v = unsafe { [0, 8, 16, 24].map(|at| _mm256_loadu_ps(values.as_ptr().add(at))) };
        let sign = _mm256_set1_ps(-0.0);
        let mut max = _mm256_andnot_ps(sign, v[0]);
        for x in &v[1..] {
            max = _mm256_max_ps(max, _mm256_andnot_ps(sign, *x));
        }
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), max) };
        let amax = lanes.iter().fold(0.0f32, |m, &x| m.max(x));
        let d = amax / 127.0;
        let inverse = _mm256_set1_ps(if amax == 0.0 { 0.0 } else { 127.0 / amax });
        let q = v.map(|x| _mm256_cvtps_epi32(_mm256_mul_ps(x, inverse)));
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let mut totals = [0i32; LANES];
        // SAFETY: `totals` holds 8 i32.
        unsafe { _mm256_storeu_si256(totals.as_mut_ptr().cast(), total) };
        let sum: i32 = totals.iter().sum();
        // Packing works within 128-bit halves; the permutation puts the values back in order.
        let words = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut qs = [0i8; 32];
        // SAFETY: `qs` holds 32 bytes.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes) };
        super::activation_block(d, sum, qs)
    }
}

/// The kernels with AVX-512 VNNI: `vpdpbusd` adds each lane's 4 byte products in one
/// instruction, exactly, so the sums are the AVX2 kernels' bit for bit.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni {
    x86_kernels!("avx2,fma,avx512f,avx512vl,avx512vnni");

    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    fn products(unsigned: __m256i, signed: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned, signed)
    }
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

    /// Every SIMD kernel set this CPU has (AVX2; AVX-512 VNNI), one row or a tile at a
    /// time, gives the portable loop's sums bit for bit; so does the AVX2 quantiser.
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
        if avx2::available() {
            for (block, values) in all.iter().zip(x.chunks_exact(BLOCK)) {
                // SAFETY: the CPU has AVX2 and FMA.
                let simd = unsafe { avx2::quantise(values) };
                assert_eq!((simd.d, simd.s, simd.qs), (block.d, block.s, block.qs));
            }
        }
        let tile: [&[ActivationBlock]; TILE] =
            std::array::from_fn(|t| &all[t * cols / BLOCK..(t + 1) * cols / BLOCK]);
        let activations = tile[0];
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
            let blocks = row * cols / BLOCK..(row + 1) * cols / BLOCK;
            let (w4, w8) = (&q4_1.blocks[blocks.clone()], &q8_0.blocks[blocks]);
            let row_4 = row_dot(w4, activations);
            let row_8 = row_dot(w8, activations);
            let tile_4 = tile.map(|a| row_dot(w4, a));
            let tile_8 = tile.map(|a| row_dot(w8, a));
            // SAFETY: each kernel set runs only where the CPU has its features.
            unsafe {
                if avx2::available() {
                    assert_eq!(avx2::q4_1_row_dot(w4, activations), row_4);
                    assert_eq!(avx2::q8_0_row_dot(w8, activations), row_8);
                    assert_eq!(avx2::q4_1_tile_dot(w4, tile), tile_4);
                    assert_eq!(avx2::q8_0_tile_dot(w8, tile), tile_8);
                    checked += 1;
                }
                if vnni::available() && avx2::available() {
                    assert_eq!(vnni::q4_1_row_dot(w4, activations), row_4);
                    assert_eq!(vnni::q8_0_row_dot(w8, activations), row_8);
                    assert_eq!(vnni::q4_1_tile_dot(w4, tile), tile_4);
                    assert_eq!(vnni::q8_0_tile_dot(w8, tile), tile_8);
                }
            }
        }
        eprintln!(
            "kernels here: {:?}; AVX2 checked on {checked} rows",
            kernels()
        );
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
