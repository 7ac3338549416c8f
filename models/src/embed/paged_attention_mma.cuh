// Attention over the paged KV cache on tensor cores (f16 and bf16, heads of 32, 64 or 128):
// the function of paged_attention in fused_kernels.cu (generate/paged_attention.rs, whose CPU
// reference both must equal), the same meta words, tiles of up to PM_QUERIES queries.
// Included by fused_kernels.cu after flash_attention.cuh (TensorCore, FA_PAD).
//
// The scalar kernel reduces every (query, key) dot product across a warp (five shuffles) and
// keeps one online softmax per query and key; here a tile's queries are the 16 rows of an
// m16n8k16 product, so 16 keys of a chunk meet all of them in a few tensor-core products.
// One block per (tile, KV head, slice of PM_QUERIES query heads): query n is head
// first_head + n % per_row of row first_row + n / per_row (a decoding row's group of heads, or
// several rows of a prefilling sequence). The PM_WARPS warps split the keys in chunks of
// PM_KEYS (warp w takes chunks w, w + PM_WARPS, ...): each stages its chunk's keys (rows) and
// values (transposed) in its own shared memory, read through the block table, and keeps an
// online softmax of all 16 queries in registers as flash_attention does (scores never leave
// registers; two score tiles are the A fragment of P V). The warps' partial results are
// merged through shared memory at the end. Positions at or past a query's length are left
// out; every position below the tile's longest is in the cache (written before attention),
// and chunks past it are zeros, so a left-out value is finite and weighs zero.

#define PM_WARPS 4
#define PM_QUERIES 16
#define PM_KEYS 16

// One warp's staged chunk: keys as rows, values transposed (dimension-major), rows padded
// as flash_attention's tiles so that fragment loads hit distinct banks.
template <typename T, int D> struct PagedChunk {
    T keys[PM_KEYS][D + FA_PAD];
    T values[D][PM_KEYS + FA_PAD];
};

// One warp's partial result: per query, its output (unnormalised, f32), running maximum (log2
// units) and sum.
template <int D> struct PagedPartial {
    float out[PM_QUERIES][D];
    float max[PM_QUERIES];
    float sum[PM_QUERIES];
};

// The block's shared memory holds the warps' chunks, then (once every warp is done with them)
// their partial results.
template <typename T, int D>
constexpr size_t paged_shared_bytes =
    sizeof(PagedChunk<T, D>) > sizeof(PagedPartial<D>) ? PM_WARPS * sizeof(PagedChunk<T, D>)
                                                       : PM_WARPS * sizeof(PagedPartial<D>);

// Stages positions first .. first + PM_KEYS of the table's sequence into `chunk` (zeros at
// and past `longest`). Two lanes a position (PM_KEYS is half a warp), so each lane looks its
// cache row up once; a load instruction reads 32 contiguous bytes of each of 16 rows.
template <typename T, int D>
__device__ __forceinline__ void paged_stage(PagedChunk<T, D> &chunk, const T *keys,
                                            const T *values, const uint32_t *table,
                                            uint32_t block_size, uint64_t kv_dim, uint32_t kvh,
                                            uint32_t first, uint32_t longest, int lane) {
    const uint32_t key = lane % PM_KEYS, j = first + key;
    const bool real = j < longest;
    const uint64_t at =
        real ? ((uint64_t)table[j / block_size] * block_size + j % block_size) * kv_dim +
                   (uint64_t)kvh * D
             : 0;
#pragma unroll
    for (int col = (lane / PM_KEYS) * 8; col < D; col += 16) {
        uint4 kc = make_uint4(0, 0, 0, 0), vc = kc;
        if (real) {
            kc = *reinterpret_cast<const uint4 *>(keys + at + col);
            vc = *reinterpret_cast<const uint4 *>(values + at + col);
        }
        *reinterpret_cast<uint4 *>(&chunk.keys[key][col]) = kc;
        const T *vv = reinterpret_cast<const T *>(&vc);
#pragma unroll
        for (int i = 0; i < 8; i++) chunk.values[col + i][key] = vv[i];
    }
}

template <typename T, int D>
__device__ void paged_attention_mma(T *out, const T *q, const T *keys, const T *values,
                                    const uint32_t *meta, uint32_t rows, uint32_t heads,
                                    uint32_t kv_heads, uint32_t block_size, float scale) {
    static_assert(D % 16 == 0, "heads are whole k-steps of 16");
    static_assert(PM_KEYS == 16, "a chunk is one k-step of P V, two lanes a position");
    __shared__ __align__(16) unsigned char shared[paged_shared_bytes<T, D>];
    PagedChunk<T, D> *chunks = reinterpret_cast<PagedChunk<T, D> *>(shared);
    const PagedPartial<D> *partials = reinterpret_cast<const PagedPartial<D> *>(shared);
    const uint32_t kvh = blockIdx.y;
    const uint32_t group = heads / kv_heads;
    const uint32_t first_head = blockIdx.z * PM_QUERIES;
    const uint32_t per_row = min(group - first_head, (uint32_t)PM_QUERIES);
    const uint32_t *tile = meta + 2 * (uint64_t)rows + 2 * (uint64_t)blockIdx.x;
    const uint32_t first_row = tile[0];
    const uint32_t queries = min(tile[1] * per_row, (uint32_t)PM_QUERIES);
    const uint32_t *table = meta + meta[2 * first_row];
    const uint64_t kv_dim = (uint64_t)kv_heads * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;

    // Query n's row and head; its positions (0 for a slot past the tile's queries).
    auto row_of = [&](uint32_t n) { return first_row + n / per_row; };
    auto head_of = [&](uint32_t n) { return kvh * group + first_head + n % per_row; };
    auto len_of = [&](uint32_t n) { return n < queries ? meta[2 * row_of(n) + 1] : 0u; };
    uint32_t longest = 0;
    for (uint32_t n = 0; n < queries; n++) longest = max(longest, len_of(n));
    // This lane's two queries (rows g and g + 8 of the m16 tile).
    const uint32_t len0 = len_of(g), len1 = len_of(g + 8);
    const T *q0 = q + ((uint64_t)row_of(g) * heads + head_of(g)) * D;
    const T *q1 = q + ((uint64_t)row_of(g + 8) * heads + head_of(g + 8)) * D;
    auto q_pair = [&](const T *row, bool real, uint32_t col) {
        return real ? *reinterpret_cast<const uint32_t *>(row + col) : 0u;
    };
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t col = kk * 16 + 2 * c;
        qf[kk][0] = q_pair(q0, g < queries, col);
        qf[kk][1] = q_pair(q1, g + 8 < queries, col);
        qf[kk][2] = q_pair(q0, g < queries, col + 8);
        qf[kk][3] = q_pair(q1, g + 8 < queries, col + 8);
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;
    PagedChunk<T, D> &chunk = chunks[warp];

    for (uint32_t first = warp * PM_KEYS; first < longest; first += PM_WARPS * PM_KEYS) {
        __syncwarp(); // the warp is done with its last chunk
        paged_stage<T, D>(chunk, keys, values, table, block_size, kv_dim, kvh, first, longest,
                          lane);
        __syncwarp();
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const T *key_row = &chunk.keys[n * 8 + g][kk * 16 + 2 * c];
                TensorCore<T>::mma(s[n], qf[kk], *reinterpret_cast<const uint32_t *>(key_row),
                                   *reinterpret_cast<const uint32_t *>(key_row + 8));
            }
        }
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t j = first + n * 8 + 2 * c + (e & 1);
                s[n][e] = j < (e < 2 ? len0 : len1) ? s[n][e] * scale_log2 : -INFINITY;
            }
        }
        // P as one A fragment: score tile 0 (a0, a1) then score tile 1 (a2, a3).
        uint32_t pf[1][4];
        fa_softmax_step<T>(s, m0, m1, l0, l1, o, pf);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const T *value_col = &chunk.values[n * 8 + g][2 * c];
            TensorCore<T>::mma(o[n], pf[0], *reinterpret_cast<const uint32_t *>(value_col),
                               *reinterpret_cast<const uint32_t *>(value_col + 8));
        }
    }
#pragma unroll
    for (int mask = 1; mask <= 2; mask <<= 1) {
        l0 += __shfl_xor_sync(0xffffffff, l0, mask);
        l1 += __shfl_xor_sync(0xffffffff, l1, mask);
    }
    __syncthreads(); // every warp is done with its chunks: their memory becomes the partials
    PagedPartial<D> &mine = reinterpret_cast<PagedPartial<D> *>(shared)[warp];
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        mine.out[g][n * 8 + 2 * c] = o[n][0];
        mine.out[g][n * 8 + 2 * c + 1] = o[n][1];
        mine.out[g + 8][n * 8 + 2 * c] = o[n][2];
        mine.out[g + 8][n * 8 + 2 * c + 1] = o[n][3];
    }
    if (c == 0) {
        mine.max[g] = m0;
        mine.max[g + 8] = m1;
        mine.sum[g] = l0;
        mine.sum[g + 8] = l1;
    }
    __syncthreads();
    for (uint32_t index = threadIdx.x; index < queries * D; index += blockDim.x) {
        const uint32_t n = index / D, d = index % D;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < PM_WARPS; w++) m = fmaxf(m, partials[w].max[n]);
        float total = 0.0f, value = 0.0f;
#pragma unroll
        for (int w = 0; w < PM_WARPS; w++) {
            const PagedPartial<D> &theirs = partials[w];
            if (theirs.max[n] != -INFINITY) {
                const float weight = exp2f(theirs.max[n] - m);
                total += theirs.sum[n] * weight;
                value += theirs.out[n][d] * weight;
            }
        }
        out[((uint64_t)row_of(n) * heads + head_of(n)) * D + d] =
            from_float<T>(total > 0.0f ? value / total : 0.0f);
    }
}

#define PAGED_ATTENTION_MMA(T, NAME, D)                                                          \
    extern "C" __global__ void __launch_bounds__(PM_WARPS * 32)                                  \
        paged_attention_mma_##NAME##_d##D(T *out, const T *q, const T *keys, const T *values,    \
                                          const uint32_t *meta, uint32_t rows, uint32_t heads,   \
                                          uint32_t kv_heads, uint32_t block_size, float scale) { \
        paged_attention_mma<T, D>(out, q, keys, values, meta, rows, heads, kv_heads, block_size, \
                                  scale);                                                        \
    }
#define PAGED_ATTENTION_MMA_SIZES(T, NAME)                                                       \
    PAGED_ATTENTION_MMA(T, NAME, 32)                                                             \
    PAGED_ATTENTION_MMA(T, NAME, 64)                                                             \
    PAGED_ATTENTION_MMA(T, NAME, 128)

PAGED_ATTENTION_MMA_SIZES(__half, f16)
PAGED_ATTENTION_MMA_SIZES(__nv_bfloat16, bf16)
