//! Sums taken in the order of a SIMD register, the order of llama.cpp's x86 kernels: element
//! `i` of a dot product goes to lane `i % W` with a fused multiply-add, and the lanes are
//! added pairwise at the end. Floating-point sums depend on their order; summing in the same
//! order as the reference keeps our logits within a rounding of its, which is what lets
//! greedy decoding agree with it token for token (BENCHMARKS.md, issue 31).
//!
//! `W` is 8: llama.cpp's f16 matmuls and softmax use 8 lanes when built for an AVX2 host.
//! (The quantised matmuls, `quantised/`, sum each block exactly in integers and the blocks
//! one after another, as llama.cpp's reference loop does: no lanes.) A build for a host with
//! AVX-512 sums attention in 16 lanes; `RESIDENT_SUM_LANES=16` ([`Width::configured`])
//! follows it, to compare with that build. The default stays 8 on every CPU, so that a
//! job's text does not depend on which agent's CPU ran it.

/// Lanes of an AVX2 register of f32.
pub const LANES: usize = 8;

/// The lanes' total as a 256-bit register is reduced: the two halves added, then the
/// halves of that, then the last pair.
#[inline(always)]
pub fn hsum(lanes: [f32; LANES]) -> f32 {
    let quarter = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// How many lanes the attention's sums run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// An AVX2 register: llama.cpp built for an AVX2 host.
    Eight,
    /// An AVX-512 register: llama.cpp built for a host with AVX-512 (`_mm512_reduce_add_ps`
    /// adds the halves, then reduces as 8 lanes).
    Sixteen,
}

impl Width {
    /// 8, or 16 where `RESIDENT_SUM_LANES=16` says so. The same on every CPU, so that
    /// every agent computes the same bits; 16 lanes run on AVX-512 where the CPU has it, in
    /// a portable (slower) loop where not.
    pub fn configured() -> Self {
        static FOUND: std::sync::OnceLock<Width> = std::sync::OnceLock::new();
        *FOUND.get_or_init(|| match std::env::var("RESIDENT_SUM_LANES").as_deref() {
            Ok("16") => Self::Sixteen,
            _ => Self::Eight,
        })
    }

    pub fn lanes(self) -> usize {
        match self {
            Self::Eight => 8,
            Self::Sixteen => 16,
        }
    }
}

/// 16 lanes' total as `_mm512_reduce_add_ps` adds them: each lane with the one 8 after it,
/// then those 8 as [`hsum`].
#[inline(always)]
pub fn hsum16(lanes: [f32; 16]) -> f32 {
    hsum(std::array::from_fn(|i| lanes[i] + lanes[i + 8]))
}

/// The sum of `values` (f64), a register of `width` lanes at a time: each register's lanes
/// reduced in f32 as the register's width reduces them (missing lanes 0), the registers'
/// totals added in f64 (ggml's softmax sum).
///
/// Whole registers are reduced where they lie; only the last, partial one is copied (a copy
/// of a length not known at compile time is a `memmove` call).
#[inline(always)]
pub fn sum_by_register(width: Width, values: &[f32]) -> f64 {
    let reduce = |lanes: [f32; 16]| match width {
        Width::Eight => hsum(std::array::from_fn(|i| lanes[i])),
        Width::Sixteen => hsum16(lanes),
    };
    let mut total = 0.0f64;
    let mut blocks = values.chunks_exact(width.lanes());
    for block in &mut blocks {
        let lanes = std::array::from_fn(|i| block.get(i).copied().unwrap_or(0.0));
        total += f64::from(reduce(lanes));
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut lanes = [0.0f32; 16];
        lanes[..rest.len()].copy_from_slice(rest);
        total += f64::from(reduce(lanes));
    }
    total
}

/// `Σ a[i] b[i]` (equal lengths), element `i` into lane `i % width` with fused
/// multiply-adds, the lanes reduced as the register's width reduces them.
#[inline(always)]
pub fn dot(width: Width, a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time), so the fused
        // multiply-adds are instructions, not libm calls.
        #[allow(unsafe_code)]
        return unsafe { avx2::dot(width, a, b) };
    }
    match width {
        Width::Eight => dot_portable::<8>(a, b),
        Width::Sixteen => dot_portable::<16>(a, b),
    }
}

/// [`dot`] in plain Rust (its fused multiply-adds are instructions only where the caller
/// is compiled with FMA), in `W` lanes.
#[inline(always)]
fn dot_portable<const W: usize>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; W];
    let (mut xs, mut ys) = (a.chunks_exact(W), b.chunks_exact(W));
    for (x, y) in (&mut xs).zip(&mut ys) {
        for lane in 0..W {
            acc[lane] = x[lane].mul_add(y[lane], acc[lane]);
        }
    }
    for (lane, (x, y)) in xs.remainder().iter().zip(ys.remainder()).enumerate() {
        acc[lane] = x.mul_add(*y, acc[lane]);
    }
    let mut lanes = [0.0f32; 16];
    lanes[..W].copy_from_slice(&acc);
    match W {
        8 => hsum(std::array::from_fn(|i| lanes[i])),
        _ => hsum16(lanes),
    }
}

/// The [`dot`] of each of `M` slices with each of four (all of one length): `4M`
/// independent sums, so one fused multiply-add need not wait for the one before it, and
/// each chunk of the four is loaded once for all `M`; each sum in [`dot`]'s order, so the
/// same bits. In AVX2 or AVX-512 intrinsics where the CPU has them (the compiler's own
/// vectorisation of such loops shuffled lanes for most of its time), else a portable loop.
/// `M` is at most 3: with the four rows' chunks that fills the 16 AVX2 registers.
#[inline(always)]
pub fn dot_block<const M: usize>(width: Width, a: [&[f32]; M], b: [&[f32]; 4]) -> [[f32; 4]; M] {
    const { assert!(M >= 1 && M <= 3) };
    let len = a[0].len();
    let a = a.map(|row| &row[..len]);
    let b = b.map(|row| &row[..len]);
    match width {
        Width::Eight => {
            #[cfg(target_arch = "x86_64")]
            if avx2::available() {
                // SAFETY: the CPU has AVX2 and FMA (checked at run time); every row is
                // `len` long.
                #[allow(unsafe_code)]
                return unsafe { avx2::dot_block(a, b) };
            }
            a.map(|row| b.map(|other| dot_portable::<8>(row, other)))
        }
        Width::Sixteen => {
            #[cfg(target_arch = "x86_64")]
            if avx512::available() {
                // SAFETY: the CPU has AVX-512F, AVX2 and FMA (checked at run time); every
                // row is `len` long.
                #[allow(unsafe_code)]
                return unsafe { avx512::dot_block(a, b) };
            }
            a.map(|row| b.map(|other| dot_portable::<16>(row, other)))
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA, and every row must be `a[0]`'s length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_block<const M: usize>(a: [&[f32]; M], b: [&[f32]; 4]) -> [[f32; 4]; M] {
        let len = a[0].len();
        let whole = len / LANES * LANES;
        let mut sums = [[_mm256_setzero_ps(); 4]; M];
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= whole <= len` for every row.
            unsafe {
                let x = a.map(|row| _mm256_loadu_ps(row.as_ptr().add(i)));
                for (k, row) in b.iter().enumerate() {
                    let y = _mm256_loadu_ps(row.as_ptr().add(i));
                    for m in 0..M {
                        sums[m][k] = _mm256_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
            i += LANES;
        }
        if whole < len {
            // The last elements into lanes `0..`; the other lanes gain 0 x 0.
            let mask = tail_mask(len - whole);
            // SAFETY: the mask reads only the `len - whole` elements left in each row.
            unsafe {
                let x = a.map(|row| _mm256_maskload_ps(row.as_ptr().add(whole), mask));
                for (k, row) in b.iter().enumerate() {
                    let y = _mm256_maskload_ps(row.as_ptr().add(whole), mask);
                    for m in 0..M {
                        sums[m][k] = _mm256_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
        }
        sums.map(|four| hsum4(four))
    }

    /// [`super::dot`]'s loop compiled with FMA.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(width: super::Width, a: &[f32], b: &[f32]) -> f32 {
        match width {
            super::Width::Eight => super::dot_portable::<8>(a, b),
            super::Width::Sixteen => super::dot_portable::<16>(a, b),
        }
    }

    /// The first `n` (under 8) lanes set.
    #[target_feature(enable = "avx2,fma")]
    fn tail_mask(n: usize) -> __m256i {
        let n = n as i32;
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// [`super::hsum`] of four registers at once, its additions in its order: the halves
    /// (`l[i] + l[i + 4]`), then `q[0] + q[2]` and `q[1] + q[3]`, then those two.
    #[target_feature(enable = "avx2,fma")]
    pub fn hsum4(sums: [__m256; 4]) -> [f32; 4] {
        let [s0, s1, s2, s3] = sums;
        // [quarters of 0 | quarters of 1] and [quarters of 2 | quarters of 3].
        let q01 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(s0, s1),
            _mm256_permute2f128_ps::<0x31>(s0, s1),
        );
        let q23 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(s2, s3),
            _mm256_permute2f128_ps::<0x31>(s2, s3),
        );
        // [0: q0 + q2, q1 + q3; 2: the same | 1: the same; 3: the same].
        let pairs = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(q01, q23),
            _mm256_shuffle_ps::<0b11_10_11_10>(q01, q23),
        );
        // [0, 2, 0, 2 | 1, 3, 1, 3].
        let totals = _mm256_hadd_ps(pairs, pairs);
        let ordered = _mm_unpacklo_ps(
            _mm256_castps256_ps128(totals),
            _mm256_extractf128_ps::<1>(totals),
        );
        let mut out = [0.0f32; 4];
        // SAFETY: `out` holds 4 f32.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), ordered) };
        out
    }
}

/// The 16-lane kernels: AVX-512F registers, reduced as `_mm512_reduce_add_ps` does (the
/// halves added, then as 8 lanes).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        super::avx2::available() && is_x86_feature_detected!("avx512f")
    }

    /// # Safety
    /// The CPU must have AVX-512F, AVX2 and FMA, and every row must be `a[0]`'s length.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn dot_block<const M: usize>(a: [&[f32]; M], b: [&[f32]; 4]) -> [[f32; 4]; M] {
        let len = a[0].len();
        let whole = len / 16 * 16;
        let mut sums = [[_mm512_setzero_ps(); 4]; M];
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 16 <= whole <= len` for every row.
            unsafe {
                let x = a.map(|row| _mm512_loadu_ps(row.as_ptr().add(i)));
                for (k, row) in b.iter().enumerate() {
                    let y = _mm512_loadu_ps(row.as_ptr().add(i));
                    for m in 0..M {
                        sums[m][k] = _mm512_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
            i += 16;
        }
        if whole < len {
            // The last elements into lanes `0..`; the other lanes gain 0 x 0.
            let mask: __mmask16 = (1u16 << (len - whole)) - 1;
            // SAFETY: the mask reads only the `len - whole` elements left in each row.
            unsafe {
                let x = a.map(|row| _mm512_maskz_loadu_ps(mask, row.as_ptr().add(whole)));
                for (k, row) in b.iter().enumerate() {
                    let y = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(whole));
                    for m in 0..M {
                        sums[m][k] = _mm512_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
        }
        sums.map(|four| super::avx2::hsum4(four.map(|sum| halves(sum))))
    }

    /// Each lane plus the one 8 after it.
    #[target_feature(enable = "avx2,fma,avx512f")]
    fn halves(sum: __m512) -> __m256 {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum)));
        _mm256_add_ps(high, _mm512_castps512_ps256(sum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_order_sums_what_a_plain_loop_sums() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
        for width in [Width::Eight, Width::Sixteen] {
            assert!((f64::from(dot(width, &a, &b)) - plain).abs() < 1e-5);
        }
        assert_eq!(hsum([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), 36.0);
    }

    /// A block of sums at once (the SIMD kernels where the CPU has them) is each sum in the
    /// portable loop, bit for bit, at any length, any `M` and either width.
    #[test]
    fn a_block_of_dots_equals_each_dot_alone() {
        fn check<const M: usize>(n: usize) {
            let a: Vec<Vec<f32>> = (0..M)
                .map(|m| {
                    (0..n)
                        .map(|i| ((i * 3 + m) as f32 * 0.37).sin() * 1e3)
                        .collect()
                })
                .collect();
            let rows: Vec<Vec<f32>> = (0..4)
                .map(|k| (0..n).map(|i| ((i * 5 + k) as f32 * 0.11).cos()).collect())
                .collect();
            for width in [Width::Eight, Width::Sixteen] {
                let together = dot_block::<M>(
                    width,
                    std::array::from_fn(|m| a[m].as_slice()),
                    std::array::from_fn(|k| rows[k].as_slice()),
                );
                for (m, a) in a.iter().enumerate() {
                    for (k, row) in rows.iter().enumerate() {
                        let alone = match width {
                            Width::Eight => dot_portable::<8>(a, row),
                            Width::Sixteen => dot_portable::<16>(a, row),
                        };
                        assert_eq!(
                            together[m][k].to_bits(),
                            alone.to_bits(),
                            "{width:?}: n {n} m {m} row {k}"
                        );
                    }
                }
            }
        }
        for n in [1, 7, 8, 15, 16, 64, 67, 600] {
            check::<1>(n);
            check::<2>(n);
            check::<3>(n);
        }
    }

    /// 16 lanes meet 8 apart first, then as 8 lanes do; the softmax sum adds registers.
    #[test]
    fn sixteen_lanes_meet_eight_apart_first() {
        let mut lanes = [0.0f32; 16];
        lanes[0] = 1e8;
        lanes[8] = -1e8;
        lanes[4] = 1.0;
        assert_eq!(hsum16(lanes), 1.0);
        // Two 8-lane registers, each reduced, would have lost the 1.
        let halves =
            hsum(std::array::from_fn(|i| lanes[i])) + hsum(std::array::from_fn(|i| lanes[i + 8]));
        assert_eq!(halves, 0.0);
        let values = [1.0f32; 20];
        assert_eq!(sum_by_register(Width::Sixteen, &values), 20.0);
        assert_eq!(sum_by_register(Width::Eight, &values), 20.0);
    }

    /// The order is the register's, not left to right: 1e8 + 1 - 1e8 loses the 1 only
    /// when the big values meet first.
    #[test]
    fn lanes_four_apart_meet_first() {
        let lanes = [1e8, 1.0, 0.0, 0.0, -1e8, 0.0, 0.0, 0.0];
        assert_eq!(hsum(lanes), 1.0);
        let left_to_right: f32 = lanes.iter().sum();
        assert_eq!(left_to_right, 0.0);
    }
}
