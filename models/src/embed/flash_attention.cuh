// Flash attention for the encoders, on tensor cores (embed/flash_attention.rs, whose CPU
// reference this must equal within the inputs' rounding). Included by fused_kernels.cu, which
// defines to_float and from_float.
//
// out[s * t + i, h * D + d] = sum_j softmax_j(q[s, h, i] . k[s, h / group, j] * scale +
// bias[h, i, j]) v[s, h / group, j, d] over keys j < t, leaving out keys after the query (when
// causal) and keys where keep[s, j] == 0 (when keep is set: padding); bias (MPNet's relative
// position bias) is optional too. Element (s, h, i, d) of q, k and v is at
// s * seq_stride + h * head_stride + i * row_stride + d of its pointer, so that heads are read
// where they are: stacked [seqs, heads, t, D], or side by side in the rows of a fused QKV
// product (no split copies). K and V rows are read in 16-byte units: their pointers and
// strides are multiples of 8 elements (the host checks). The output has its heads merged,
// ready for the output projection (no merge copy). A query that sees no key gets zeros.
//
// FlashAttention-2's scheme with mma.sync (m16n8k16, f32 accumulators): one block of FA_WARPS
// warps per (FA_QUERIES queries, head, sequence). Each warp keeps its 16 queries' Q fragments,
// running maxima and sums and its output in registers, and walks the key tiles of FA_KEYS
// (when causal, only up to its own tile) that the block stages in shared memory, K as rows and
// V transposed, so that every B fragment a lane needs is one 32-bit load without bank
// conflicts. Scores never leave registers: two n-tiles of the accumulators of S = Q K^T are,
// element for element, the A fragment of P V.
//
// Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, c = lane % 4): A (16x16, row-major)
// a0 = (g, 2c..2c+1), a1 = (g + 8, 2c..), a2 = (g, 2c + 8..), a3 = (g + 8, 2c + 8..); B (16x8)
// b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g); C (16x8) c0, c1 = (g, 2c..2c+1), c2, c3 =
// (g + 8, 2c..). A 32-bit register holds two elements, the lower index in the lower half.

#define FA_WARPS 4
#define FA_QUERIES (16 * FA_WARPS)
#define FA_KEYS 64
// Shared-memory rows padded by 16 bytes: the lanes of a fragment load hit 32 distinct banks.
#define FA_PAD 8

#ifdef RESIDENT_CUDA_EMU
// scripts/cuda-emu (kernels run on the CPU, for tests before a GPU is at hand): the warp's
// product from the PTX ISA's fragment layouts, written apart from these comments.
#define FA_MMA_K16(TYPE, c, a, b0, b1) emu::mma_m16n8k16(c, a, b0, b1, TYPE[0] == 'b')
#define FA_MMA_K8_F16(c, a_lo, a_hi, b)                                                          \
    do {                                                                                         \
        const uint32_t fa_a[2] = {a_lo, a_hi};                                                   \
        emu::mma_m16n8k8(c, fa_a, b);                                                            \
    } while (0)
#else
// c += a b in one m16n8k16 product of TYPE ("bf16" or "f16") operands (sm_80 and later).
#define FA_MMA_K16(TYPE, c, a, b0, b1)                                                           \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 "                  \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"             \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
// c += a b in one m16n8k8 product of f16 operands, a = (a_lo, a_hi) (sm_75 and later).
#define FA_MMA_K8_F16(c, a_lo, a_hi, b)                                                          \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "                             \
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"                         \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
                 : "r"(a_lo), "r"(a_hi), "r"(b))

#endif

template <typename T> struct TensorCore;

template <> struct TensorCore<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&pair);
    }
    // c += a b; bf16 tensor cores are sm_80 and later (the host never launches it on less).
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
#if __CUDA_ARCH__ >= 800
        FA_MMA_K16("bf16", c, a, b0, b1);
#else
        __trap();
#endif
    }
};

template <> struct TensorCore<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 pair = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&pair);
    }
    // c += a b; sm_75 (T4) has only the k8 shape: its two halves of k one after the other.
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
#if __CUDA_ARCH__ >= 800
        FA_MMA_K16("f16", c, a, b0, b1);
#elif __CUDA_ARCH__ >= 750
        FA_MMA_K8_F16(c, a[0], a[1], b0);
        FA_MMA_K8_F16(c, a[2], a[3], b1);
#else
        __trap();
#endif
    }
};

// Two elements of row `row` from column `col` (even) of rows `stride` apart at `base`; zeros
// past the last row.
template <typename T>
__device__ __forceinline__ uint32_t fa_pair(const T *base, uint64_t stride, uint32_t row,
                                            uint32_t col, uint32_t t) {
    return row < t ? *reinterpret_cast<const uint32_t *>(base + row * stride + col) : 0u;
}

// One online-softmax step of a lane's two rows (g and g + 8) over N score tiles (log2 units,
// left-out entries -inf): the running maxima m0, m1 become the tiles' (across the row's four
// lanes), the sums l0, l1 and the DN output tiles o are rescaled to them, the probabilities
// are added to the sums and returned as the A fragments of P V: keys 16 kk .. 16 kk + 15 are
// score tiles 2 kk (a0, a1) and 2 kk + 1 (a2, a3). Shared by the encoders' flash kernel and
// the decoder's paged one (paged_attention_mma.cuh).
template <typename T, int N, int DN>
__device__ __forceinline__ void fa_softmax_step(const float (&s)[N][4], float &m0, float &m1,
                                                float &l0, float &l1, float (&o)[DN][4],
                                                uint32_t (&pf)[N / 2][4]) {
    float max0 = m0, max1 = m1;
#pragma unroll
    for (int n = 0; n < N; n++) {
        max0 = fmaxf(max0, fmaxf(s[n][0], s[n][1]));
        max1 = fmaxf(max1, fmaxf(s[n][2], s[n][3]));
    }
#pragma unroll
    for (int mask = 1; mask <= 2; mask <<= 1) {
        max0 = fmaxf(max0, __shfl_xor_sync(0xffffffff, max0, mask));
        max1 = fmaxf(max1, __shfl_xor_sync(0xffffffff, max1, mask));
    }
    // A row that has seen no key yet stays at -inf; exponents against 0 then give zeros
    // instead of NaN.
    const float base0 = max0 == -INFINITY ? 0.0f : max0;
    const float base1 = max1 == -INFINITY ? 0.0f : max1;
    const float kept0 = exp2f(m0 - base0), kept1 = exp2f(m1 - base1);
    m0 = max0;
    m1 = max1;
    l0 *= kept0;
    l1 *= kept1;
#pragma unroll
    for (int n = 0; n < DN; n++) {
        o[n][0] *= kept0;
        o[n][1] *= kept0;
        o[n][2] *= kept1;
        o[n][3] *= kept1;
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
        const float p0 = exp2f(s[n][0] - base0), p1 = exp2f(s[n][1] - base0);
        const float p2 = exp2f(s[n][2] - base1), p3 = exp2f(s[n][3] - base1);
        l0 += p0 + p1;
        l1 += p2 + p3;
        pf[n / 2][(n % 2) * 2] = TensorCore<T>::pack(p0, p1);
        pf[n / 2][(n % 2) * 2 + 1] = TensorCore<T>::pack(p2, p3);
    }
}

// Where one input's heads are: element (s, h, i, d) at s * seq + h * head + i * row + d.
struct FaStrides {
    uint64_t seq, head, row;
};

template <typename T, int D>
__device__ void flash_attention(T *out, const T *q, FaStrides q_at, const T *k, FaStrides k_at,
                                const T *v, FaStrides v_at, const float *keep, const T *bias,
                                uint32_t t, uint32_t heads, uint32_t kv_heads, int causal,
                                float scale) {
    static_assert(D % 16 == 0, "heads are whole k-steps of 16");
    __shared__ __align__(16) T k_tile[FA_KEYS][D + FA_PAD];
    __shared__ __align__(16) T v_tile[D][FA_KEYS + FA_PAD];
    const uint32_t tile = blockIdx.x, head = blockIdx.y, seq = blockIdx.z;
    const uint32_t kv_head = head / (heads / kv_heads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const T *qh = q + seq * q_at.seq + head * q_at.head;
    const T *kh = k + seq * k_at.seq + kv_head * k_at.head;
    const T *vh = v + seq * v_at.seq + kv_head * v_at.head;
    // This lane's two query rows.
    const uint32_t r0 = tile * FA_QUERIES + warp * 16 + g, r1 = r0 + 8;

    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t col = kk * 16 + 2 * c;
        qf[kk][0] = fa_pair(qh, q_at.row, r0, col, t);
        qf[kk][1] = fa_pair(qh, q_at.row, r1, col, t);
        qf[kk][2] = fa_pair(qh, q_at.row, r0, col + 8, t);
        qf[kk][3] = fa_pair(qh, q_at.row, r1, col + 8, t);
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Running maxima (in log2 units) and sums of rows r0 and r1; the sums are this lane's
    // share, added across the row's four lanes at the end.
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const float log2e = 1.4426950408889634f;
    const float *keep_row = keep ? keep + (uint64_t)seq * t : nullptr;
    const T *bias_head = bias ? bias + (uint64_t)head * t * t : nullptr;
    const uint32_t all_tiles = (t + FA_KEYS - 1) / FA_KEYS;
    const uint32_t key_tiles = causal ? min(tile + 1, all_tiles) : all_tiles;

    for (uint32_t kt = 0; kt < key_tiles; kt++) {
        __syncthreads(); // every warp is done with the last tile
        // 16-byte chunks, consecutive threads on consecutive keys (conflict-free stores into
        // both layouts); keys past t are zeros.
        for (uint32_t chunk = threadIdx.x; chunk < FA_KEYS * D / 8; chunk += FA_WARPS * 32) {
            const uint32_t key = chunk % FA_KEYS, col = (chunk / FA_KEYS) * 8;
            const uint32_t j = kt * FA_KEYS + key;
            uint4 kc = make_uint4(0, 0, 0, 0), vc = kc;
            if (j < t) {
                kc = *reinterpret_cast<const uint4 *>(kh + j * k_at.row + col);
                vc = *reinterpret_cast<const uint4 *>(vh + j * v_at.row + col);
            }
            *reinterpret_cast<uint4 *>(&k_tile[key][col]) = kc;
            const T *vv = reinterpret_cast<const T *>(&vc);
#pragma unroll
            for (int i = 0; i < 8; i++) v_tile[col + i][key] = vv[i];
        }
        __syncthreads();
        if (r0 - g >= t) continue; // this warp's rows are all past the end

        float s[FA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const T *key_row = &k_tile[n * 8 + g][kk * 16 + 2 * c];
                TensorCore<T>::mma(s[n], qf[kk], *reinterpret_cast<const uint32_t *>(key_row),
                                   *reinterpret_cast<const uint32_t *>(key_row + 8));
            }
        }
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t j = kt * FA_KEYS + n * 8 + 2 * c + (e & 1);
                const uint32_t row = e < 2 ? r0 : r1;
                const bool seen = j < t && row < t && (!causal || j <= row) &&
                                  (!keep_row || keep_row[j] != 0.0f);
                float x = s[n][e] * scale;
                if (seen && bias_head) x += to_float(bias_head[(uint64_t)row * t + j]);
                s[n][e] = seen ? x * log2e : -INFINITY;
            }
        }
        uint32_t pf[FA_KEYS / 16][4];
        fa_softmax_step<T>(s, m0, m1, l0, l1, o, pf);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
#pragma unroll
            for (int kk = 0; kk < FA_KEYS / 16; kk++) {
                const T *value_col = &v_tile[n * 8 + g][kk * 16 + 2 * c];
                TensorCore<T>::mma(o[n], pf[kk], *reinterpret_cast<const uint32_t *>(value_col),
                                   *reinterpret_cast<const uint32_t *>(value_col + 8));
            }
        }
    }
#pragma unroll
    for (int mask = 1; mask <= 2; mask <<= 1) {
        l0 += __shfl_xor_sync(0xffffffff, l0, mask);
        l1 += __shfl_xor_sync(0xffffffff, l1, mask);
    }
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const uint64_t width = (uint64_t)heads * D;
    T *row0 = out + ((uint64_t)seq * t + r0) * width + (uint64_t)head * D + 2 * c;
    T *row1 = row0 + 8 * width;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        if (r0 < t)
            *reinterpret_cast<uint32_t *>(row0 + n * 8) =
                TensorCore<T>::pack(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < t)
            *reinterpret_cast<uint32_t *>(row1 + n * 8) =
                TensorCore<T>::pack(o[n][2] * inv1, o[n][3] * inv1);
    }
}

#define FLASH_ATTENTION(T, NAME, D)                                                              \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                                  \
        flash_attention_##NAME##_d##D(                                                           \
            T *out, const T *q, uint64_t q_seq, uint64_t q_head, uint64_t q_row, const T *k,       \
            uint64_t k_seq, uint64_t k_head, uint64_t k_row, const T *v, uint64_t v_seq,           \
            uint64_t v_head, uint64_t v_row, const float *keep, const T *bias, uint32_t t,         \
            uint32_t heads, uint32_t kv_heads, int causal, float scale) {                        \
        flash_attention<T, D>(out, q, FaStrides{q_seq, q_head, q_row}, k,                       \
                              FaStrides{k_seq, k_head, k_row}, v, FaStrides{v_seq, v_head, v_row}, \
                              keep, bias, t, heads, kv_heads, causal, scale);                    \
    }
#define FLASH_ATTENTION_SIZES(T, NAME)                                                           \
    FLASH_ATTENTION(T, NAME, 32)                                                                 \
    FLASH_ATTENTION(T, NAME, 64)                                                                 \
    FLASH_ATTENTION(T, NAME, 128)

FLASH_ATTENTION_SIZES(__half, f16)
FLASH_ATTENTION_SIZES(__nv_bfloat16, bf16)
