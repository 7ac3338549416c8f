//! Attention's two products read straight from the f16 KV cache, in the lanes' order of
//! `lanes.rs` (8 lanes), so that a row attended alone needs no widened copy of its
//! sequence's keys and values: the scores (a query with each key, over head dimensions)
//! and the weighted values (each dimension's sum over positions, position `p` in lane
//! `p % 8`). Widening f16 to f32 is exact, so these give the same bits as the widened
//! path's [`lanes::dot_block`] and [`lanes::dot`]; the tests hold them to it.
//!
//! A decode row is one row of its sequence in a step: widening the whole cache for it
//! (keys as rows, values transposed) cost as much as its attention did. Rows prefilled
//! together share one widening, so they keep that path.

use half::f16;

use super::lanes::{self, LANES, Width};

/// One KV head's keys or values of one layer: position `p`'s `head_dim` values start at
/// `p * stride + offset` of `data`.
#[derive(Clone, Copy)]
pub struct CachedHead<'a> {
    pub data: &'a [f16],
    pub stride: usize,
    pub offset: usize,
    pub head_dim: usize,
}

impl<'a> CachedHead<'a> {
    pub fn at(&self, p: usize) -> &'a [f16] {
        let start = p * self.stride + self.offset;
        &self.data[start..start + self.head_dim]
    }
}

/// Whether these kernels take the sums of `width` over heads of `head_dim`: 8 lanes, whole
/// registers of head dimensions. The widened path takes the rest.
pub fn applies(width: Width, head_dim: usize) -> bool {
    width == Width::Eight && head_dim.is_multiple_of(LANES) && head_dim <= MAX_HEAD_DIM
}

/// The longest head these kernels take (their accumulators live on the stack).
pub const MAX_HEAD_DIM: usize = 256;

/// The scores of `M` queries with the keys at positions `first..first + 4`: each
/// [`lanes::dot`] of a query with a key, bit for bit.
pub fn dot_block<const M: usize>(
    queries: [&[f32]; M],
    keys: CachedHead<'_>,
    first: usize,
) -> [[f32; 4]; M] {
    let rows: [&[f16]; 4] = std::array::from_fn(|k| keys.at(first + k));
    #[cfg(target_arch = "x86_64")]
    prefetch(keys, first + PREFETCH_AHEAD, 4);
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time); every row is
        // `head_dim` long, a whole number of registers ([`applies`]).
        #[allow(unsafe_code)]
        return unsafe { avx2::dot_block(queries, rows) };
    }
    let mut widened = [[0.0f32; MAX_HEAD_DIM]; 4];
    for (wide, row) in widened.iter_mut().zip(rows) {
        for (w, h) in wide.iter_mut().zip(row) {
            *w = h.to_f32();
        }
    }
    let d = keys.head_dim;
    let widened: [&[f32]; 4] = std::array::from_fn(|k| &widened[k][..d]);
    lanes::dot_block(Width::Eight, queries, widened)
}

/// How many positions ahead of those it reads a kernel asks for: enough to cover the
/// memory's latency at a few nanoseconds a position.
const PREFETCH_AHEAD: usize = 16;

/// Asks the CPU to bring positions `first..first + count` of `head` into its caches. A
/// prefetch reads nothing and cannot fault, so positions past the cache cost nothing.
#[cfg(target_arch = "x86_64")]
fn prefetch(head: CachedHead<'_>, first: usize, count: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let bytes = head.head_dim * size_of::<f16>();
    for p in first..first + count {
        let row = head.data.as_ptr().wrapping_add(at(head, p)).cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: every x86-64 CPU has SSE; a prefetch of any address is sound.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line))
            };
        }
    }
}

/// `out[m * head_dim + i] = Σ_p weights[m][p] · values[p][i]` over the positions
/// `0..weights[m].len()`, position `p` into lane `p % 8` with fused multiply-adds and the
/// lanes reduced as [`lanes::hsum`]: [`lanes::dot`] of the weights with a column of the
/// values, bit for bit, with the registers running across dimensions instead.
pub fn weighted_values<const M: usize>(
    weights: [&[f32]; M],
    values: CachedHead<'_>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() && values.head_dim.is_multiple_of(avx512::DIMS) {
        // SAFETY: the CPU has AVX-512F, AVX2, FMA and F16C (checked at run time); the
        // head is a whole number of its registers.
        #[allow(unsafe_code)]
        return unsafe { avx512::weighted_values(weights, values, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: as in `dot_block`.
        #[allow(unsafe_code)]
        return unsafe { avx2::weighted_values(weights, values, out) };
    }
    weighted_values_portable(weights, values, out);
}

/// [`weighted_values`] as a plain loop: the reference the SIMD kernel is held to.
fn weighted_values_portable<const M: usize>(
    weights: [&[f32]; M],
    values: CachedHead<'_>,
    out: &mut [f32],
) {
    let d = values.head_dim;
    for (m, weights) in weights.iter().enumerate() {
        let mut acc = [[0.0f32; LANES]; MAX_HEAD_DIM];
        for (p, &weight) in weights.iter().enumerate() {
            for (acc, value) in acc.iter_mut().zip(values.at(p)) {
                acc[p % LANES] = weight.mul_add(value.to_f32(), acc[p % LANES]);
            }
        }
        for (out, acc) in out[m * d..(m + 1) * d].iter_mut().zip(acc) {
            *out = lanes::hsum(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{CachedHead, LANES, ahead, at, checked, reduce_lanes};
    use crate::generate::lanes::avx2::hsum4;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Eight f16 at `at`, widened.
    ///
    /// # Safety
    /// Eight values must be readable at `at`; the CPU must have F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen(at: *const f16) -> __m256 {
        // SAFETY: the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
    }

    /// [`super::dot_block`]: `lanes::avx2::dot_block` with the keys widened as loaded.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; every row must be `queries[0]`'s length, a
    /// multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_block<const M: usize>(
        queries: [&[f32]; M],
        keys: [&[f16]; 4],
    ) -> [[f32; 4]; M] {
        let len = queries[0].len();
        let queries = queries.map(|row| &row[..len]);
        let keys = keys.map(|row| &row[..len]);
        let mut sums = [[_mm256_setzero_ps(); 4]; M];
        for i in (0..len).step_by(LANES) {
            // SAFETY: `i + 8 <= len` for every row.
            unsafe {
                let x = queries.map(|row| _mm256_loadu_ps(row.as_ptr().add(i)));
                for (k, row) in keys.iter().enumerate() {
                    let y = widen(row.as_ptr().add(i));
                    for m in 0..M {
                        sums[m][k] = _mm256_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
        }
        let mut totals = [[0.0f32; 4]; M];
        for (total, sums) in totals.iter_mut().zip(sums) {
            *total = hsum4(sums);
        }
        totals
    }

    /// [`super::weighted_values`]: for each 8 dimensions, one register per head and lane
    /// (position `p` into lane register `p % 8`), each value widened once for all the
    /// heads, reduced across registers in [`crate::generate::lanes::hsum`]'s order. The
    /// lanes go in two passes of four (positions `p % 8 < 4`, then the rest), so that three
    /// heads' registers fit in the sixteen there are.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `values.head_dim` must be a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_values<const M: usize>(
        weights: [&[f32]; M],
        values: CachedHead<'_>,
        out: &mut [f32],
    ) {
        let (d, seen) = (values.head_dim, weights[0].len());
        let weights = checked(weights, values, out);
        let whole = seen / LANES * LANES;
        for first in (0..d).step_by(LANES) {
            let mut lanes = [[_mm256_setzero_ps(); LANES]; M];
            for half in [0, LANES / 2] {
                let mut acc = [[_mm256_setzero_ps(); LANES / 2]; M];
                let mut add = |p: usize, l: usize| {
                    // SAFETY: `p < seen`, checked by `checked`; dimensions `first..first + 8`
                    // are within the position's `d`.
                    let value = unsafe { widen(values.data.as_ptr().add(at(values, p) + first)) };
                    _mm_prefetch::<_MM_HINT_T0>(ahead(values, p, first));
                    for (acc, weights) in acc.iter_mut().zip(weights) {
                        // SAFETY: every weight row is `seen` long (`checked`).
                        let weight = unsafe { *weights.get_unchecked(p) };
                        acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(weight), value, acc[l]);
                    }
                };
                for start in (0..whole).step_by(LANES) {
                    for l in 0..LANES / 2 {
                        add(start + half + l, l);
                    }
                }
                for l in 0..LANES / 2 {
                    if whole + half + l < seen {
                        add(whole + half + l, l);
                    }
                }
                for (lanes, acc) in lanes.iter_mut().zip(acc) {
                    lanes[half..half + LANES / 2].copy_from_slice(&acc);
                }
            }
            for (m, lanes) in lanes.iter().enumerate() {
                let total = reduce_lanes(*lanes, |a, b| _mm256_add_ps(a, b));
                // SAFETY: `m * d + first + 8 <= M * d <= out.len()` (`checked`).
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(m * d + first), total) };
            }
        }
    }
}

/// Where position `p`'s values start in `head.data`.
#[cfg(target_arch = "x86_64")]
fn at(head: CachedHead<'_>, p: usize) -> usize {
    p * head.stride + head.offset
}

/// Eight lane registers (position `p` in register `p % 8`) reduced in [`lanes::hsum`]'s
/// order, with their type's addition: the one reduction both SIMD kernels of
/// [`weighted_values`] end with.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn reduce_lanes<T: Copy>(lanes: [T; LANES], add: impl Fn(T, T) -> T) -> T {
    let quarters: [T; 4] = std::array::from_fn(|i| add(lanes[i], lanes[i + 4]));
    add(add(quarters[0], quarters[2]), add(quarters[1], quarters[3]))
}

/// The address of dimension `first` of the position [`PREFETCH_AHEAD`] after `p`, for a
/// prefetch (which reads nothing and cannot fault, so it may lie past the cache).
#[cfg(target_arch = "x86_64")]
fn ahead(head: CachedHead<'_>, p: usize, first: usize) -> *const i8 {
    let at = at(head, p + PREFETCH_AHEAD) + first;
    head.data.as_ptr().wrapping_add(at).cast()
}

/// The weights cut to the first row's length, once every bound the SIMD kernels of
/// [`weighted_values`] rely on is checked: each weight row as long as the first, every
/// position of the weights in `values`, and `out` room for each head's `head_dim`.
#[cfg(target_arch = "x86_64")]
fn checked<'w, const M: usize>(
    weights: [&'w [f32]; M],
    values: CachedHead<'_>,
    out: &[f32],
) -> [&'w [f32]; M] {
    let seen = weights[0].len();
    assert!(weights.iter().all(|row| row.len() == seen));
    assert!(out.len() >= M * values.head_dim);
    assert!(seen == 0 || at(values, seen - 1) + values.head_dim <= values.data.len());
    weights
}

/// AVX-512: [`super::weighted_values`] sixteen dimensions a register, all eight lanes of
/// three heads in registers at once (24 of the 32): each value widened once, and the
/// dimensions' sums in the same order as the AVX2 kernel's, so the same bits.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{CachedHead, LANES, ahead, at, checked, reduce_lanes};

    /// Dimensions in one register.
    pub const DIMS: usize = 16;

    pub fn available() -> bool {
        super::avx2::available() && is_x86_feature_detected!("avx512f")
    }

    /// # Safety
    /// The CPU must have AVX-512F, AVX2, FMA and F16C; `values.head_dim` must be a
    /// multiple of [`DIMS`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn weighted_values<const M: usize>(
        weights: [&[f32]; M],
        values: CachedHead<'_>,
        out: &mut [f32],
    ) {
        let (d, seen) = (values.head_dim, weights[0].len());
        let weights = checked(weights, values, out);
        let whole = seen / LANES * LANES;
        for first in (0..d).step_by(DIMS) {
            let mut acc = [[_mm512_setzero_ps(); LANES]; M];
            let mut add = |p: usize, l: usize| {
                _mm_prefetch::<_MM_HINT_T0>(ahead(values, p, first));
                // SAFETY: as in the AVX2 kernel, for 16 dimensions within the position's `d`.
                let value = unsafe {
                    let from = values.data.as_ptr().add(at(values, p) + first);
                    _mm512_cvtph_ps(_mm256_loadu_si256(from.cast()))
                };
                for (acc, weights) in acc.iter_mut().zip(weights) {
                    // SAFETY: every weight row is `seen` long (`checked`).
                    let weight = unsafe { *weights.get_unchecked(p) };
                    acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(weight), value, acc[l]);
                }
            };
            for start in (0..whole).step_by(LANES) {
                for l in 0..LANES {
                    add(start + l, l);
                }
            }
            for l in 0..LANES {
                if whole + l < seen {
                    add(whole + l, l);
                }
            }
            for (m, lanes) in acc.iter().enumerate() {
                let total = reduce_lanes(*lanes, |a, b| _mm512_add_ps(a, b));
                // SAFETY: `m * d + first + 16 <= M * d <= out.len()` (`checked`).
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(m * d + first), total) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `len` positions, 3 KV heads of `d`, and the middle head's view of it.
    fn cache(len: usize, d: usize, salt: f32) -> Vec<f16> {
        (0..len * 3 * d)
            .map(|i| f16::from_f32((i as f32 * salt).sin() * 2.0))
            .collect()
    }

    fn head(data: &[f16], d: usize) -> CachedHead<'_> {
        CachedHead {
            data,
            stride: 3 * d,
            offset: d,
            head_dim: d,
        }
    }

    fn widened(view: CachedHead<'_>, p: usize) -> Vec<f32> {
        view.at(p).iter().map(|h| h.to_f32()).collect()
    }

    #[test]
    fn the_scores_are_the_widened_keys_dots_bit_for_bit() {
        fn check<const M: usize>(d: usize) {
            let data = cache(9, d, 0.37);
            let keys = head(&data, d);
            let queries: Vec<Vec<f32>> = (0..M)
                .map(|m| (0..d).map(|i| ((i + m * 7) as f32 * 0.11).cos()).collect())
                .collect();
            let queries: [&[f32]; M] = std::array::from_fn(|m| queries[m].as_slice());
            for first in [0, 5] {
                let scores = dot_block(queries, keys, first);
                for (m, query) in queries.iter().enumerate() {
                    for (k, score) in scores[m].iter().enumerate() {
                        let key = widened(keys, first + k);
                        let alone = lanes::dot(Width::Eight, query, &key);
                        assert_eq!(score.to_bits(), alone.to_bits(), "d {d} m {m} key {k}");
                    }
                }
            }
        }
        for d in [8, 64, 128] {
            check::<1>(d);
            check::<2>(d);
            check::<3>(d);
        }
    }

    #[test]
    fn the_weighted_values_are_the_transposed_dots_bit_for_bit() {
        fn check<const M: usize>(d: usize, seen: usize) {
            let data = cache(seen.max(1), d, 0.29);
            let values = head(&data, d);
            let weights: Vec<Vec<f32>> = (0..M)
                .map(|m| {
                    (0..seen)
                        .map(|p| ((p * 3 + m) as f32 * 0.7).sin().abs() / seen as f32)
                        .collect()
                })
                .collect();
            let weights: [&[f32]; M] = std::array::from_fn(|m| weights[m].as_slice());
            // The dispatched kernel, the portable loop, and each SIMD kernel the CPU has.
            let mut results = vec![("dispatched", vec![0.0f32; M * d])];
            weighted_values(weights, values, &mut results[0].1);
            let mut portable = vec![0.0f32; M * d];
            weighted_values_portable(weights, values, &mut portable);
            results.push(("portable", portable));
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            {
                if avx2::available() {
                    let mut simd = vec![0.0f32; M * d];
                    // SAFETY: the CPU has the kernel's features; `d` is a multiple of 8.
                    unsafe { avx2::weighted_values(weights, values, &mut simd) };
                    results.push(("avx2", simd));
                }
                if avx512::available() && d.is_multiple_of(avx512::DIMS) {
                    let mut simd = vec![0.0f32; M * d];
                    // SAFETY: the CPU has the kernel's features; `d` is a multiple of 16.
                    unsafe { avx512::weighted_values(weights, values, &mut simd) };
                    results.push(("avx512", simd));
                }
            }
            for (m, weights) in weights.iter().enumerate() {
                for i in 0..d {
                    let column: Vec<f32> = (0..seen).map(|p| widened(values, p)[i]).collect();
                    let alone = lanes::dot(Width::Eight, weights, &column);
                    for (kernel, result) in &results {
                        let got = result[m * d + i];
                        assert_eq!(got.to_bits(), alone.to_bits(), "{kernel} d {d} seen {seen}");
                    }
                }
            }
        }
        for seen in [0, 1, 3, 7, 8, 9, 12, 17, 64, 301] {
            for d in [8, 16, 48, 64, 128] {
                check::<1>(d, seen);
                check::<2>(d, seen);
                check::<3>(d, seen);
            }
        }
    }
}
