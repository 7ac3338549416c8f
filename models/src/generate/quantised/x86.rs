//! The x86 kernels: one panel of [`PANEL`] weight rows by one to [`TILE`] activation rows,
//! for Q4_1 and Q8_0. Each 32-bit lane is one weight row: a chunk of 4 weight bytes of
//! every row (`blocks.rs`) meets the activation row's chunk broadcast to every lane, so
//! each lane ends a block with its row's exact integer sum, which is converted to f32 and
//! added to the row's sum with a fused multiply-add by the block's scale (`d_w * d_a`, one
//! f32 product), block after block, as in the portable loop; so every kernel gives its
//! sums bit for bit.

/// AVX2: 8 rows a register, a panel in two halves. `vpmaddubsw` multiplies byte pairs and
/// adds neighbours into 16 bits, `vpmaddwd` adds those pairs into the lane's 32 bits.
/// For Q4_1 a block's 16-bit sums stay exact (8 chunks of two 4-bit by 7-bit products:
/// at most 30,480), so they are added before the one widening; a Q8_0 chunk's pair can
/// reach 32,512, so each chunk is widened.
pub mod avx2 {
    use std::arch::x86_64::*;

    use crate::generate::lanes::LANES;
    use crate::generate::quantised::blocks::{ActivationBlock, PANEL, Q4_1, Q8_0};

    /// Rows in one 256-bit register.
    const HALF: usize = PANEL / 2;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Bytes `32h..32h + 32` of a chunk of a panel block: half `h`'s rows.
    #[target_feature(enable = "avx2,fma")]
    fn load_half<E>(chunk: &[E; 4 * PANEL], h: usize) -> __m256i {
        assert!(h < 2 && size_of::<E>() == 1);
        // SAFETY: 32 bytes are read from bytes 32h.. of 64 (`h < 2`).
        unsafe { _mm256_loadu_si256(chunk.as_ptr().cast::<u8>().add(32 * h).cast()) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn load_scales(values: &[f32; PANEL], h: usize) -> __m256 {
        // SAFETY: 8 f32 are read from values 8h.. of 16 (`h < 2`, checked by the slice).
        unsafe { _mm256_loadu_ps(values[HALF * h..HALF * h + HALF].as_ptr()) }
    }

    /// Sums and offsets, half by half, into the panel's 16 results.
    #[target_feature(enable = "avx2,fma")]
    fn store<const T: usize>(halves: [[__m256; T]; 2], out: &mut [[f32; PANEL]; T]) {
        for (h, sums) in halves.iter().enumerate() {
            for (t, sum) in sums.iter().enumerate() {
                let half = &mut out[t][HALF * h..HALF * h + HALF];
                // SAFETY: `half` holds 8 f32.
                unsafe { _mm256_storeu_ps(half.as_mut_ptr(), *sum) };
            }
        }
    }

    /// [`super::super::panel_dot`] for Q4_1.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q4_1_panel_dot<const T: usize>(
        panel: &[Q4_1],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        let (low_mask, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let mut halves = [[_mm256_setzero_ps(); T]; 2];
        for (h, results) in halves.iter_mut().enumerate() {
            let mut sums = [_mm256_setzero_ps(); T];
            let mut offsets = [_mm256_setzero_ps(); T];
            for (j, w) in panel.iter().enumerate() {
                let a: [&ActivationBlock; T] = std::array::from_fn(|t| &rows[t][j]);
                let mut pairs = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    let packed = load_half(&w.qs[c], h);
                    let low = _mm256_and_si256(packed, low_mask);
                    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low_mask);
                    for (pair, a) in pairs.iter_mut().zip(a) {
                        let first = _mm256_maddubs_epi16(low, _mm256_set1_epi32(a.chunk(c)));
                        let last = _mm256_maddubs_epi16(high, _mm256_set1_epi32(a.chunk(c + 4)));
                        *pair = _mm256_add_epi16(*pair, _mm256_add_epi16(first, last));
                    }
                }
                let (d, m) = (load_scales(&w.d, h), load_scales(&w.m, h));
                for t in 0..T {
                    let products = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs[t], ones));
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[t].d));
                    sums[t] = _mm256_fmadd_ps(scale, products, sums[t]);
                    offsets[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(a[t].s), offsets[t]);
                }
            }
            *results = std::array::from_fn(|t| _mm256_add_ps(sums[t], offsets[t]));
        }
        let mut out = [[0.0; PANEL]; T];
        store(halves, &mut out);
        out
    }

    /// [`super::super::panel_dot`] for Q8_0: `|w|` times the activations given `w`'s sign.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q8_0_panel_dot<const T: usize>(
        panel: &[Q8_0],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        let ones = _mm256_set1_epi16(1);
        let mut halves = [[_mm256_setzero_ps(); T]; 2];
        for (h, sums) in halves.iter_mut().enumerate() {
            for (j, w) in panel.iter().enumerate() {
                let a: [&ActivationBlock; T] = std::array::from_fn(|t| &rows[t][j]);
                let mut integers = [_mm256_setzero_si256(); T];
                for c in 0..8 {
                    let values = load_half(&w.qs[c], h);
                    let magnitudes = _mm256_sign_epi8(values, values);
                    for (integer, a) in integers.iter_mut().zip(a) {
                        let signed = _mm256_sign_epi8(_mm256_set1_epi32(a.chunk(c)), values);
                        let pairs = _mm256_maddubs_epi16(magnitudes, signed);
                        *integer = _mm256_add_epi32(*integer, _mm256_madd_epi16(pairs, ones));
                    }
                }
                let d = load_scales(&w.d, h);
                for t in 0..T {
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[t].d));
                    sums[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(integers[t]), sums[t]);
                }
            }
        }
        let mut out = [[0.0; PANEL]; T];
        store(halves, &mut out);
        out
    }

    /// [`quantise_into`] block after block.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise_blocks(values: &[f32], blocks: &mut [ActivationBlock]) {
        for (block, values) in blocks.iter_mut().zip(values.chunks_exact(32)) {
            // SAFETY: the caller's promise; 32 values each.
            unsafe { quantise_into(values, block) };
        }
    }

    /// [`quantise_into`] into a new block.
    ///
    /// # Safety
    /// As [`quantise_into`].
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise(values: &[f32]) -> ActivationBlock {
        let mut block = crate::generate::quantised::blocks::activation_block(0.0, 0, [0; 32]);
        // SAFETY: forwarded.
        unsafe { quantise_into(values, &mut block) };
        block
    }

    /// `quantise_portable` in intrinsics: the same maximum, products and rounding (the CPU's
    /// default, to nearest even), 8 values a register; written into `block` where it is
    /// (a block returned through memory and copied stalled the copy on the narrower
    /// stores that built it: 3% of a generation step).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `values` must hold 32 values.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn quantise_into(values: &[f32], block: &mut ActivationBlock) {
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
        // SAFETY: `qs` holds 32 bytes.
        unsafe { _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), bytes) };
        block.set_scales(d, sum);
    }
}

/// AVX-512 with VNNI: a panel's 16 rows in one 512-bit register, and `vpdpbusd` adds each
/// lane's 4 byte products in one instruction. Each activation row has two integer sums
/// (even and odd chunks), so that its `vpdpbusd`s wait on each other half as long.
pub mod avx512 {
    use std::arch::x86_64::*;

    use crate::generate::quantised::blocks::{ActivationBlock, PANEL, Q4_1, Q8_0};

    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn load<E>(chunk: &[E; 4 * PANEL]) -> __m512i {
        assert_eq!(size_of::<E>(), 1);
        // SAFETY: 64 bytes are read from an array of 64.
        unsafe { _mm512_loadu_si512(chunk.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn load_scales(values: &[f32; PANEL]) -> __m512 {
        // SAFETY: 16 f32 are read from an array of 16.
        unsafe { _mm512_loadu_ps(values.as_ptr()) }
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn store<const T: usize>(sums: [__m512; T]) -> [[f32; PANEL]; T] {
        let mut out = [[0.0; PANEL]; T];
        for (out, sum) in out.iter_mut().zip(sums) {
            // SAFETY: `out` holds 16 f32.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
        }
        out
    }

    /// [`super::super::panel_dot`] for Q4_1.
    ///
    /// # Safety
    /// The CPU must have the module's target features.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q4_1_panel_dot<const T: usize>(
        panel: &[Q4_1],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        let low_mask = _mm512_set1_epi8(0x0f);
        let mut sums = [_mm512_setzero_ps(); T];
        let mut offsets = [_mm512_setzero_ps(); T];
        for (j, w) in panel.iter().enumerate() {
            let packed: [__m512i; 4] = std::array::from_fn(|c| load(&w.qs[c]));
            let low = packed.map(|p| _mm512_and_si512(p, low_mask));
            let high = packed.map(|p| _mm512_and_si512(_mm512_srli_epi16::<4>(p), low_mask));
            let (d, m) = (load_scales(&w.d), load_scales(&w.m));
            for t in 0..T {
                let a = &rows[t][j];
                let mut integers = [_mm512_setzero_si512(); 2];
                for c in 0..4 {
                    let first = _mm512_set1_epi32(a.chunk(c));
                    let last = _mm512_set1_epi32(a.chunk(c + 4));
                    integers[0] = _mm512_dpbusd_epi32(integers[0], low[c], first);
                    integers[1] = _mm512_dpbusd_epi32(integers[1], high[c], last);
                }
                let products = _mm512_cvtepi32_ps(_mm512_add_epi32(integers[0], integers[1]));
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(a.d));
                sums[t] = _mm512_fmadd_ps(scale, products, sums[t]);
                offsets[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s), offsets[t]);
            }
        }
        store(std::array::from_fn(|t| _mm512_add_ps(sums[t], offsets[t])))
    }

    /// [`super::super::panel_dot`] for Q8_0: the weights offset by 128 into unsigned bytes
    /// (`w ^ 0x80`), and `128 * Σ a` taken back from each block's integer sum.
    ///
    /// # Safety
    /// The CPU must have the module's target features.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q8_0_panel_dot<const T: usize>(
        panel: &[Q8_0],
        rows: [&[ActivationBlock]; T],
    ) -> [[f32; PANEL]; T] {
        let flip = _mm512_set1_epi8(i8::MIN);
        let mut sums = [_mm512_setzero_ps(); T];
        for (j, w) in panel.iter().enumerate() {
            let values: [__m512i; 8] =
                std::array::from_fn(|c| _mm512_xor_si512(load(&w.qs[c]), flip));
            let d = load_scales(&w.d);
            for t in 0..T {
                let a = &rows[t][j];
                let mut integers = [_mm512_setzero_si512(); 2];
                for (c, values) in values.iter().enumerate() {
                    let chunk = _mm512_set1_epi32(a.chunk(c));
                    integers[c % 2] = _mm512_dpbusd_epi32(integers[c % 2], *values, chunk);
                }
                let offset = _mm512_set1_epi32(128 * a.sum);
                let integer = _mm512_sub_epi32(_mm512_add_epi32(integers[0], integers[1]), offset);
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(a.d));
                sums[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(integer), sums[t]);
            }
        }
        store(sums)
    }
}
