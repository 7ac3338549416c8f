//! The x86 kernels: one weight row by one activation row, or by a tile of [`TILE`] rows, for
//! Q4_1 and Q8_0. In every kernel each lane gets the exact integer sum of its 4 byte
//! products, converted to f32 and added to the lane with a fused multiply-add by the
//! block's scale (`d_w * d_a`, one f32 product), block after block, as in the portable
//! loop; so every kernel gives its sums bit for bit.

/// The one-row kernels, for the target features given, with `products` giving each 32-bit
/// lane of a 256-bit register the sum of its 4 unsigned-by-signed byte products.
macro_rules! row_kernels {
    ($features:literal) => {
        use std::arch::x86_64::*;

        use crate::generate::lanes::{self, LANES};
        use crate::generate::quantised::blocks::{ActivationBlock, Q4_1, Q8_0, TILE, TileBlock};

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
        fn load(qs: &[i8; 32]) -> __m256i {
            // SAFETY: 32 bytes are read from an array of 32.
            unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) }
        }

        /// A tile's four scaled sums in a 128-bit register.
        #[target_feature(enable = $features)]
        fn load4(values: &[f32; TILE]) -> __m128 {
            // SAFETY: 16 bytes are read from an array of 4 f32.
            unsafe { _mm_loadu_ps(values.as_ptr()) }
        }

        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q4_1_row_dot(weights: &[Q4_1], activations: &[ActivationBlock]) -> f32 {
            let mut sums = _mm256_setzero_ps();
            let mut offsets = 0.0f32;
            for (w, a) in weights.iter().zip(activations) {
                let products = _mm256_cvtepi32_ps(products(nibbles(w), load(&a.qs)));
                sums = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums);
                offsets = w.m.mul_add(a.s, offsets);
            }
            finish(sums, offsets)
        }

        /// A Q8_0 block's products with `a`: `|w|` times `a` with `w`'s sign, as the
        /// unsigned-by-signed multiply needs.
        #[target_feature(enable = $features)]
        fn signed_products(values: __m256i, a: __m256i) -> __m256i {
            let magnitudes = _mm256_sign_epi8(values, values);
            products(magnitudes, _mm256_sign_epi8(a, values))
        }

        /// # Safety
        /// The CPU must have the module's target features.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0_row_dot(weights: &[Q8_0], activations: &[ActivationBlock]) -> f32 {
            let mut sums = _mm256_setzero_ps();
            for (w, a) in weights.iter().zip(activations) {
                let products = _mm256_cvtepi32_ps(signed_products(load(&w.qs), load(&a.qs)));
                sums = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), products, sums);
            }
            finish(sums, 0.0)
        }
    };
}

/// AVX2: `vpmaddubsw` multiplies a block's 32 byte pairs and adds neighbours, `vpmaddwd`
/// adds those in fours. The sums are exact: a pair of 4-bit (or 7-bit magnitude) by 8-bit
/// products stays inside 16 bits. A tile's rows each have a 256-bit register of sums.
pub mod avx2 {
    row_kernels!("avx2,fma");

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[target_feature(enable = "avx2,fma")]
    fn products(unsigned: __m256i, signed: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned, signed), _mm256_set1_epi16(1))
    }

    /// A tile row's scale in each of its 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    fn load8(values: &[f32; LANES]) -> __m256 {
        // SAFETY: 32 bytes are read from an array of 8 f32.
        unsafe { _mm256_loadu_ps(values.as_ptr()) }
    }

    /// The sums of a tile's rows from their registers, plus the rows' offsets: each row's
    /// 8 lanes reduced in [`lanes::hsum`]'s order, the four rows side by side. Each row's
    /// lane `i` plus lane `i + 4` first; interleaved by pairs of rows, those give each
    /// row's `q0 + q2` and `q1 + q3` in one addition, and their sums one more.
    #[target_feature(enable = "avx2,fma")]
    fn finish_rows(sums: [__m256; TILE], offsets: __m128) -> [f32; TILE] {
        let [q0, q1, q2, q3] = sums
            .map(|row| _mm_add_ps(_mm256_castps256_ps128(row), _mm256_extractf128_ps::<1>(row)));
        // [r0: q0 + q2, r1: q0 + q2, r0: q1 + q3, r1: q1 + q3], and the same for rows 2, 3.
        let first = _mm_add_ps(_mm_unpacklo_ps(q0, q1), _mm_unpackhi_ps(q0, q1));
        let second = _mm_add_ps(_mm_unpacklo_ps(q2, q3), _mm_unpackhi_ps(q2, q3));
        let totals = _mm_add_ps(_mm_movelh_ps(first, second), _mm_movehl_ps(second, first));
        let mut out = [0.0f32; TILE];
        // SAFETY: `out` holds 4 f32.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_add_ps(totals, offsets)) };
        out
    }

    /// [`q4_1_row_dot`] of one weight row with a tile's rows: each block's nibbles
    /// unpacked, and its scales with the tile's taken, once for all of them.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q4_1_tile_dot(weights: &[Q4_1], tiles: &[TileBlock]) -> [f32; TILE] {
        let mut sums = [_mm256_setzero_ps(); TILE];
        let mut offsets = _mm_setzero_ps();
        for (w, a) in weights.iter().zip(tiles) {
            let values = nibbles(w);
            let weight_scale = _mm256_set1_ps(w.d);
            for (t, sum) in sums.iter_mut().enumerate() {
                let products = _mm256_cvtepi32_ps(products(values, load(&a.qs[t])));
                let scale = _mm256_mul_ps(weight_scale, load8(&a.d_lanes[t]));
                *sum = _mm256_fmadd_ps(scale, products, *sum);
            }
            offsets = _mm_fmadd_ps(_mm_set1_ps(w.m), load4(&a.s), offsets);
        }
        finish_rows(sums, offsets)
    }

    /// [`q8_0_row_dot`] of one weight row with a tile's rows.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q8_0_tile_dot(weights: &[Q8_0], tiles: &[TileBlock]) -> [f32; TILE] {
        let mut sums = [_mm256_setzero_ps(); TILE];
        for (w, a) in weights.iter().zip(tiles) {
            let values = load(&w.qs);
            let weight_scale = _mm256_set1_ps(w.d);
            for (t, sum) in sums.iter_mut().enumerate() {
                let products = _mm256_cvtepi32_ps(signed_products(values, load(&a.qs[t])));
                let scale = _mm256_mul_ps(weight_scale, load8(&a.d_lanes[t]));
                *sum = _mm256_fmadd_ps(scale, products, *sum);
            }
        }
        finish_rows(sums, _mm_setzero_ps())
    }

    /// [`super::super::quantise`]: the same maximum, products and rounding (the CPU's
    /// default, to nearest even), 8 values a register.
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
        crate::generate::quantised::blocks::activation_block(d, sum, qs)
    }
}

/// AVX-512 with VNNI: `vpdpbusd` adds each lane's 4 byte products in one instruction,
/// exactly, so the sums are the AVX2 kernels' bit for bit. A tile's rows go two to a
/// 512-bit register (a row in each half), the weight block copied into both halves.
pub mod avx512 {
    row_kernels!("avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni");

    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn products(unsigned: __m256i, signed: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned, signed)
    }

    /// Rows `2p` and `2p + 1` of a tile block, one in each half of a 512-bit register.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn load_pair(a: &TileBlock, p: usize) -> __m512i {
        // SAFETY: 64 bytes are read from rows 2p and 2p + 1 of the tile (`p < TILE / 2`),
        // which lie one after the other.
        unsafe { _mm512_loadu_si512(a.qs[2 * p..2 * p + 2].as_ptr().cast()) }
    }

    /// The scales of rows `2p` and `2p + 1` of a tile block, each in its half's 8 lanes.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn load_pair_scales(a: &TileBlock, p: usize) -> __m512 {
        // SAFETY: 64 bytes are read from the lanes of rows 2p and 2p + 1 (`p < TILE / 2`),
        // which lie one after the other.
        unsafe { _mm512_loadu_ps(a.d_lanes[2 * p..2 * p + 2].as_ptr().cast()) }
    }

    /// The sums of a tile's rows from its two pair registers, plus the rows' offsets: each
    /// row's 8 lanes reduced in [`lanes::hsum`]'s order, the four rows side by side. Lane
    /// `i` and lane `i + 4` of every row first, gathered from both registers into one;
    /// then within each row's four: `q0 + q2` and `q1 + q3`, then their sum.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn finish_pairs(pairs: [__m512; TILE / 2], offsets: __m128) -> [f32; TILE] {
        let first_halves =
            _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        let second_halves =
            _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        let [low, high] = pairs;
        let quarters = _mm512_add_ps(
            _mm512_permutex2var_ps(low, first_halves, high),
            _mm512_permutex2var_ps(low, second_halves, high),
        );
        // Within each 128-bit lane (one row's four): adding [q2, q3, q0, q1] puts q0 + q2
        // and q1 + q3 first; adding those swapped puts their sum first.
        let halves = _mm512_add_ps(quarters, _mm512_permute_ps::<0b01_00_11_10>(quarters));
        let totals = _mm512_add_ps(halves, _mm512_permute_ps::<0b10_11_00_01>(halves));
        let rows = _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            totals,
        );
        let mut out = [0.0f32; TILE];
        // SAFETY: `out` holds 4 f32.
        unsafe {
            _mm_storeu_ps(
                out.as_mut_ptr(),
                _mm_add_ps(_mm512_castps512_ps128(rows), offsets),
            )
        };
        out
    }

    /// One Q4_1 block of a weight row against a tile block: its products added to the
    /// row's pair registers and offsets.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    #[inline]
    fn q4_1_block(w: &Q4_1, a: &TileBlock, pairs: &mut [__m512; TILE / 2], offsets: &mut __m128) {
        // The 16 packed bytes in each 128-bit quarter; the high nibbles shifted down in the
        // second and fourth: [low, high] in each half.
        // SAFETY: 16 bytes are read from an array of 16.
        let packed = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(w.qs.as_ptr().cast()) });
        let shifted = _mm512_mask_srli_epi32::<4>(packed, 0xf0f0, packed);
        let values = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
        let weight_scale = _mm512_set1_ps(w.d);
        for (p, pair) in pairs.iter_mut().enumerate() {
            let products = _mm512_dpbusd_epi32(_mm512_setzero_si512(), values, load_pair(a, p));
            let scale = _mm512_mul_ps(weight_scale, load_pair_scales(a, p));
            *pair = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(products), *pair);
        }
        *offsets = _mm_fmadd_ps(_mm_set1_ps(w.m), load4(&a.s), *offsets);
    }

    /// [`q4_1_row_dot`] of one weight row with a tile's rows, two rows a register.
    ///
    /// # Safety
    /// The CPU must have the module's target features.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q4_1_tile_dot(weights: &[Q4_1], tiles: &[TileBlock]) -> [f32; TILE] {
        let mut pairs = [_mm512_setzero_ps(); TILE / 2];
        let mut offsets = _mm_setzero_ps();
        for (w, a) in weights.iter().zip(tiles) {
            q4_1_block(w, a, &mut pairs, &mut offsets);
        }
        finish_pairs(pairs, offsets)
    }

    /// [`q4_1_tile_dot`] of two weight rows with the same tile, in one pass over it: twice
    /// the independent sums in flight, each tile block loaded once for both.
    ///
    /// # Safety
    /// The CPU must have the module's target features.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q4_1_tile_dot_two(
        weights: [&[Q4_1]; 2],
        tiles: &[TileBlock],
    ) -> [[f32; TILE]; 2] {
        let mut pairs = [[_mm512_setzero_ps(); TILE / 2]; 2];
        let mut offsets = [_mm_setzero_ps(); 2];
        for ((w0, w1), a) in weights[0].iter().zip(weights[1]).zip(tiles) {
            q4_1_block(w0, a, &mut pairs[0], &mut offsets[0]);
            q4_1_block(w1, a, &mut pairs[1], &mut offsets[1]);
        }
        [
            finish_pairs(pairs[0], offsets[0]),
            finish_pairs(pairs[1], offsets[1]),
        ]
    }

    /// [`q8_0_row_dot`] of one weight row with a tile's rows, two rows a register: `|w|`
    /// times the activations negated where `w` is negative.
    ///
    /// # Safety
    /// The CPU must have the module's target features.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q8_0_tile_dot(weights: &[Q8_0], tiles: &[TileBlock]) -> [f32; TILE] {
        let zero = _mm512_setzero_si512();
        let mut pairs = [_mm512_setzero_ps(); TILE / 2];
        for (w, a) in weights.iter().zip(tiles) {
            let values = _mm512_broadcast_i64x4(load(&w.qs));
            let magnitudes = _mm512_abs_epi8(values);
            let negative = _mm512_movepi8_mask(values);
            let weight_scale = _mm512_set1_ps(w.d);
            for (p, pair) in pairs.iter_mut().enumerate() {
                let activations = load_pair(a, p);
                let signed = _mm512_mask_sub_epi8(activations, negative, zero, activations);
                let products = _mm512_dpbusd_epi32(zero, magnitudes, signed);
                let scale = _mm512_mul_ps(weight_scale, load_pair_scales(a, p));
                *pair = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(products), *pair);
            }
        }
        finish_pairs(pairs, _mm_setzero_ps())
    }
}
