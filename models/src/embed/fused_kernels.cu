// Fused CUDA kernels for the encoders' tensor forward (see fused.rs). candle's generic
// element-wise kernels index every element through the tensor's strides; on an H100 they
// ran 6-13x under memory bandwidth and took most of MPNet's GPU time (BENCHMARKS.md).
// These know their shapes: one pass per job, contiguous rows, no stride arithmetic.
//
// Built by models/build.rs (feature `cuda`) into one fatbin: SASS for every capability of
// RESIDENT_CUDA_ARCHS and PTX of the newest.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

// x[row, col] = act(x[row, col] + bias[col] + residual[row, col]), in place. `residual` may be
// null; act is GELU (erf form, as BERT's "gelu") when `gelu` is set. Grid: x over columns,
// y over rows (strided when rows exceed the grid).
template <typename T>
__device__ void bias_add(T *x, const T *bias, const T *residual, uint32_t rows, uint32_t cols,
                         int gelu) {
    uint32_t col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float b = to_float(bias[col]);
    for (uint32_t row = blockIdx.y; row < rows; row += gridDim.y) {
        size_t i = (size_t)row * cols + col;
        float v = to_float(x[i]) + b;
        if (residual) v += to_float(residual[i]);
        if (gelu) v = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
        x[i] = from_float<T>(v);
    }
}

// out[r, c] = silu(x[r, c]) * x[r, cols + c] for rows of 2 * cols (gate, then up: the product
// of stacked gate and up weights; Qwen3's and the decoder's MLP), n = rows * cols outputs.
template <typename T> __device__ void silu_mul_halves(T *out, const T *x, uint64_t n, uint32_t cols) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t row = i / cols, col = i % cols, in = row * 2 * cols + col;
        float g = to_float(x[in]);
        out[i] = from_float<T>(g / (1.0f + __expf(-g)) * to_float(x[in + cols]));
    }
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Reduces over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <bool IS_MAX> __device__ float block_reduce(float v, float *scratch) {
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
    return IS_MAX ? warp_max(v) : warp_sum(v);
}

// out[0] = x + y and out[1] = rmsnorm(out[0]) * weight, for [rows, cols] rows: a pre-norm
// layer's residual add and the norm after it in one pass (fused.rs). The norm is taken of the
// sum as stored, rounded to T, as candle's two ops take it. One block per row.
template <typename T>
__device__ void add_rms_norm(T *out, const T *x, const T *y, const T *weight, uint32_t rows,
                             uint32_t cols, float eps) {
    __shared__ float scratch[32];
    const uint64_t base = (uint64_t)blockIdx.x * cols;
    T *sum = out + base, *normed = out + (uint64_t)rows * cols + base;
    float squares = 0.0f;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
        T s = from_float<T>(to_float(x[base + c]) + to_float(y[base + c]));
        sum[c] = s;
        float f = to_float(s);
        squares += f * f;
    }
    const float scale = rsqrtf(block_reduce<false>(squares, scratch) / (float)cols + eps);
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x)
        normed[c] = from_float<T>(to_float(sum[c]) * scale * to_float(weight[c]));
}

// Attention probabilities, in place: for each row (batch b, head h, query q) of the scores
// [batch, heads, t, t], softmax over keys k of scores + bias[h, q, k] (when `bias` is set),
// leaving out keys with keep[b, k] == 0 (when `keep` is set) and keys after the query (when
// `causal`). A row with every key left out becomes zeros.

__device__ __forceinline__ void softmax_row_index(size_t row, uint32_t heads, uint32_t t,
                                                  uint32_t *b, uint32_t *h, uint32_t *q) {
    *q = row % t;
    *h = (row / t) % heads;
    *b = row / ((size_t)t * heads);
}

// One warp per row, the row held in registers: PER_LANE * 32 >= t. Rows of up to 1024 keys.
template <typename T, int PER_LANE>
__device__ void masked_softmax_warp(T *scores, const T *bias, const float *keep, uint32_t heads,
                                    uint32_t t, int causal, size_t rows) {
    size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31;
    uint32_t b, h, q;
    softmax_row_index(row, heads, t, &b, &h, &q);
    T *s = scores + row * t;
    const T *bias_row = bias ? bias + ((size_t)h * t + q) * t : nullptr;
    const float *keep_row = keep ? keep + (size_t)b * t : nullptr;
    uint32_t last = causal ? q + 1 : t;
    float v[PER_LANE];
    float top = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        uint32_t k = lane + 32 * i;
        bool used = k < last && !(keep_row && keep_row[k] == 0.0f);
        v[i] = used ? to_float(s[k]) + (bias_row ? to_float(bias_row[k]) : 0.0f) : -INFINITY;
        top = fmaxf(top, v[i]);
    }
    top = warp_max(top);
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        v[i] = v[i] == -INFINITY ? 0.0f : __expf(v[i] - top);
        total += v[i];
    }
    total = warp_sum(total);
    float scale = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        uint32_t k = lane + 32 * i;
        if (k < t) s[k] = from_float<T>(v[i] * scale);
    }
}

// One block per row, for rows longer than a warp holds.
template <typename T>
__device__ void masked_softmax_block(T *scores, const T *bias, const float *keep, uint32_t heads,
                                     uint32_t t, int causal) {
    __shared__ float scratch[32];
    size_t row = blockIdx.x;
    uint32_t b, h, q;
    softmax_row_index(row, heads, t, &b, &h, &q);
    T *s = scores + row * t;
    const T *bias_row = bias ? bias + ((size_t)h * t + q) * t : nullptr;
    const float *keep_row = keep ? keep + (size_t)b * t : nullptr;
    uint32_t last = causal ? q + 1 : t;

    float top = -INFINITY;
    for (uint32_t k = threadIdx.x; k < last; k += blockDim.x) {
        if (keep_row && keep_row[k] == 0.0f) continue;
        float v = to_float(s[k]) + (bias_row ? to_float(bias_row[k]) : 0.0f);
        top = fmaxf(top, v);
    }
    top = block_reduce<true>(top, scratch);
    float total = 0.0f;
    for (uint32_t k = threadIdx.x; k < last; k += blockDim.x) {
        if (keep_row && keep_row[k] == 0.0f) continue;
        float v = to_float(s[k]) + (bias_row ? to_float(bias_row[k]) : 0.0f);
        total += __expf(v - top);
    }
    total = block_reduce<false>(total, scratch);
    float scale = top == -INFINITY ? 0.0f : 1.0f / total;
    for (uint32_t k = threadIdx.x; k < t; k += blockDim.x) {
        float p = 0.0f;
        if (k < last && !(keep_row && keep_row[k] == 0.0f)) {
            float v = to_float(s[k]) + (bias_row ? to_float(bias_row[k]) : 0.0f);
            p = __expf(v - top) * scale;
        }
        s[k] = from_float<T>(p);
    }
}

// Head split and merge, in 16-byte units (any dtype; callers check that the head width and
// offsets are whole units). split: dst[b, h, i, :] = src[b * t + i, offset + h * d : ...]
// for `heads` heads of `d` units out of rows `stride` units wide. merge: the inverse, into
// dst rows of heads * d units.
extern "C" __global__ void split_heads(const uint4 *src, uint4 *dst, uint32_t batch, uint32_t t,
                                       uint32_t heads, uint32_t d, uint32_t stride,
                                       uint32_t offset) {
    size_t n = (size_t)batch * heads * t * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t j = i % d;
        size_t rest = i / d;
        uint32_t q = rest % t;
        rest /= t;
        uint32_t h = rest % heads;
        size_t b = rest / heads;
        dst[i] = src[(b * t + q) * stride + offset + (size_t)h * d + j];
    }
}

extern "C" __global__ void merge_heads(const uint4 *src, uint4 *dst, uint32_t batch, uint32_t t,
                                       uint32_t heads, uint32_t d) {
    size_t n = (size_t)batch * heads * t * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t j = i % d;
        size_t rest = i / d;
        uint32_t h = rest % heads;
        size_t token = rest / heads;
        uint32_t q = token % t;
        size_t b = token / t;
        dst[i] = src[((b * heads + h) * t + q) * d + j];
    }
}

// The generation engine's (generate/device_ops.rs), beside the encoders' for one build.
// dst[index[r], :] = src[r, :] for `rows` rows of `width` elements, `src_stride` apart (the
// value columns of a fused QKV product): every element its own
// thread (candle's scatter walks the rows one after another in each thread, so a 512-row
// KV write ran 512 dependent steps).
template <typename T>
__device__ void scatter_rows(T *dst, const T *src, const uint32_t *index, uint64_t rows,
                             uint32_t width, uint64_t src_stride) {
    uint64_t n = rows * width;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t row = i / width, col = i % width;
        dst[(uint64_t)index[row] * width + col] = src[row * src_stride + col];
    }
}

// The warp's best (value, index): the larger value, the lower index among equals; every lane
// gets it.
__device__ __forceinline__ void warp_argmax(float &value, uint32_t &index) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffff, value, o);
        uint32_t i = __shfl_xor_sync(0xffffffff, index, o);
        if (v > value || (v == value && i < index)) {
            value = v;
            index = i;
        }
    }
}

// out[row] = the index of row's largest element, the lowest index among equals (as the host
// sampler's argmax), NaN never chosen. One block per row, blockDim.x a multiple of 32.
template <typename T>
__device__ void argmax_rows(const T *x, uint32_t *out, uint32_t cols) {
    __shared__ float best_value[32];
    __shared__ uint32_t best_index[32];
    const T *row = x + (uint64_t)blockIdx.x * cols;
    float value = -INFINITY;
    uint32_t index = 0xffffffffu;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(row[c]);
        if (v > value || (index == 0xffffffffu && !(v != v))) {
            value = v;
            index = c;
        }
    }
    // Within the warp, then across warps.
    warp_argmax(value, index);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) {
        best_value[warp] = value;
        best_index[warp] = index;
    }
    __syncthreads();
    if (warp == 0) {
        value = lane < warps ? best_value[lane] : -INFINITY;
        index = lane < warps ? best_index[lane] : 0xffffffffu;
        warp_argmax(value, index);
        if (lane == 0) out[blockIdx.x] = index == 0xffffffffu ? 0 : index;
    }
}

// A sampled token per row of logits (generate/draw.rs, whose draw_token this must equal but
// for rounding): params holds temperature, top_k, top_p, min_p and a uniform u per row. The
// kept set is a prefix of the row in (logit desc, id asc) order, so it is found without a
// sort: a cut (key, id) keeps the elements above `key` and those at `key` up to `id`, and
// each cut comes from a bisection over the 32 bits of an order-preserving key of the scaled
// logit, then over the ids among equals. Every step is a block reduction over the row in a
// fixed order, so a row's draw is the same on every run. The draw walks the kept set in id
// order: the first kept id whose prefix weight reaches u times their total. One block per row.
struct SampleCut {
    uint32_t key, id;
};
__device__ __forceinline__ bool sample_within(SampleCut cut, uint32_t key, uint32_t id) {
    return key > cut.key || (key == cut.key && id <= cut.id);
}
// The order-preserving unsigned key of a float (larger float, larger key).
__device__ __forceinline__ uint32_t sample_key(float v) {
    uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
struct SampleRow {
    float temperature, smax, floor;
    SampleCut k, p;
};
// The count (or weight, when `weigh`) of the row's kept elements within `query` and at ids
// up to `last`; every thread gets it.
template <typename T>
__device__ float sample_measure(const T *row, uint32_t cols, const SampleRow &s, SampleCut query,
                                uint32_t last, bool weigh, float *scratch) {
    float sum = 0.0f;
    for (uint32_t c = threadIdx.x; c < cols && c <= last; c += blockDim.x) {
        float v = to_float(row[c]);
        if (!isfinite(v)) continue;
        float scaled = v / s.temperature;
        uint32_t key = sample_key(scaled);
        if (scaled >= s.floor && sample_within(s.k, key, c) && sample_within(s.p, key, c) &&
            sample_within(query, key, c))
            sum += weigh ? expf(scaled - s.smax) : 1.0f;
    }
    return block_reduce<false>(sum, scratch);
}
// The shortest prefix (in key desc, id asc order) of the kept elements whose measure reaches
// `target` (which the whole set reaches).
template <typename T>
__device__ SampleCut sample_cut(const T *row, uint32_t cols, const SampleRow &s, float target,
                                bool weigh, float *scratch) {
    SampleCut cut = {0u, 0xffffffffu};
    for (int bit = 31; bit >= 0; --bit) {
        SampleCut wider = {cut.key | (1u << bit), 0xffffffffu};
        if (sample_measure(row, cols, s, wider, 0xffffffffu, weigh, scratch) >= target)
            cut.key = wider.key;
    }
    uint32_t lo = 0, hi = cols - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        SampleCut at = {cut.key, mid};
        if (sample_measure(row, cols, s, at, 0xffffffffu, weigh, scratch) >= target) hi = mid;
        else lo = mid + 1;
    }
    cut.id = lo;
    return cut;
}
// Each row's listing (generate/device_ops.rs::listed_rows, whose CPU reference is the host's
// sampling::token_logprob and argmax): out, 2 + 2 * top floats a row, holds the
// log-probability of the row's token (tokens[row]), the row's argmax, then its `top`
// likeliest tokens' ids (exact in f32 below 2^24) and their log-probabilities, likeliest
// first, the lower id first among equals, NaN never listed. One block per row, blockDim.x a
// multiple of 32; max(top, 1) passes over the row after the log-sum-exp, each finding the
// likeliest token behind the one before.
template <typename T>
__device__ void listed_rows(const T *logits, const uint32_t *tokens, float *out, uint32_t cols,
                            uint32_t top) {
    __shared__ float scratch[32];
    __shared__ float best_value[32];
    __shared__ uint32_t best_index[32];
    const T *row = logits + (uint64_t)blockIdx.x * cols;
    float *o = out + (uint64_t)blockIdx.x * (2 + 2 * top);
    float largest = -INFINITY;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x)
        largest = fmaxf(largest, to_float(row[c]));
    largest = block_reduce<true>(largest, scratch);
    float total = 0.0f;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(row[c]);
        if (!(v != v)) total += expf(v - largest);
    }
    const float log_total = logf(block_reduce<false>(total, scratch));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // The last token listed: the next pass takes the likeliest behind it.
    float after_value = INFINITY;
    uint32_t after_index = 0xffffffffu;
    const uint32_t passes = top > 0 ? top : 1;
    for (uint32_t k = 0; k < passes; ++k) {
        float value = -INFINITY;
        uint32_t index = 0xffffffffu;
        for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = to_float(row[c]);
            bool behind = k == 0 || v < after_value || (v == after_value && c > after_index);
            if (v != v || !behind) continue;
            if (index == 0xffffffffu || v > value) {
                value = v;
                index = c;
            }
        }
        warp_argmax(value, index);
        __syncthreads();
        if (lane == 0) {
            best_value[warp] = value;
            best_index[warp] = index;
        }
        __syncthreads();
        value = lane < warps ? best_value[lane] : -INFINITY;
        index = lane < warps ? best_index[lane] : 0xffffffffu;
        warp_argmax(value, index);
        if (threadIdx.x == 0) {
            if (k == 0) o[1] = (float)(index == 0xffffffffu ? 0u : index);
            if (top > 0) {
                o[2 + k] = (float)index;
                o[2 + top + k] = (value - largest) - log_total;
            }
        }
        after_value = value;
        after_index = index;
    }
    if (threadIdx.x == 0) {
        uint32_t token = tokens[blockIdx.x];
        o[0] = token < cols ? (to_float(row[token]) - largest) - log_total : -INFINITY;
    }
}

template <typename T>
__device__ void sample_rows(const T *logits, const float *params, uint32_t *out, uint32_t cols) {
    __shared__ float scratch[32];
    const T *row = logits + (uint64_t)blockIdx.x * cols;
    const float *p = params + 5 * (uint64_t)blockIdx.x;
    const float temperature = p[0], top_p = p[2], min_p = p[3], uniform = p[4];
    const uint32_t top_k = (uint32_t)p[1];
    const SampleCut all = {0u, 0xffffffffu};
    // The largest finite logit, and the first +inf (the host's argmax when nothing is finite).
    float largest = -INFINITY, first_inf = INFINITY;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(row[c]);
        if (isfinite(v)) largest = fmaxf(largest, v);
        else if (v > 0.0f) first_inf = fminf(first_inf, (float)c);
    }
    largest = block_reduce<true>(largest, scratch);
    if (largest == -INFINITY) {
        first_inf = -block_reduce<true>(-first_inf, scratch);
        if (threadIdx.x == 0) out[blockIdx.x] = first_inf == INFINITY ? 0u : (uint32_t)first_inf;
        return;
    }
    SampleRow s;
    // Divided, not multiplied by a reciprocal, to round as the host does.
    s.temperature = temperature;
    s.smax = largest / temperature;
    s.floor = min_p > 0.0f ? s.smax + logf(min_p) : -INFINITY;
    s.k = all;
    s.p = all;
    if (top_k > 0 && sample_measure(row, cols, s, all, 0xffffffffu, false, scratch) > (float)top_k)
        s.k = sample_cut(row, cols, s, (float)top_k, false, scratch);
    if (top_p < 1.0f) {
        float total = sample_measure(row, cols, s, all, 0xffffffffu, true, scratch);
        // At least the likeliest token (weight 1), as the host keeps one for any top_p.
        s.p = sample_cut(row, cols, s, fmaxf(top_p * total, 1e-30f), true, scratch);
    }
    float target = uniform * sample_measure(row, cols, s, all, 0xffffffffu, true, scratch);
    // The first id whose prefix weight reaches the target (the last kept id when rounding
    // leaves the target past the total).
    uint32_t lo = 0, hi = cols - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sample_measure(row, cols, s, all, mid, true, scratch) >= target) hi = mid;
        else lo = mid + 1;
    }
    // The first kept id at or after lo; else the last kept id.
    float first = INFINITY, last = -1.0f;
    for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(row[c]);
        if (!isfinite(v)) continue;
        float scaled = v / s.temperature;
        uint32_t key = sample_key(scaled);
        if (scaled >= s.floor && sample_within(s.k, key, c) && sample_within(s.p, key, c)) {
            if (c >= lo) first = fminf(first, (float)c);
            last = fmaxf(last, (float)c);
        }
    }
    first = -block_reduce<true>(-first, scratch);
    last = block_reduce<true>(last, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = (uint32_t)(first != INFINITY ? first : last);
}

// A projection's heads normed (when `norm` is set: Qwen3's query and key RMSNorms) and
// rotated by their row's position, in one pass (generate/rope_heads.rs, whose CPU reference
// this must equal): the heads start at column first_column of x's rows (x_stride wide), out
// is [rows, heads, head_dim] (or heads first per sequence of seq_len rows), cos and sin
// [rows, head_dim / 2]
// f32. Pairs (2i, 2i + 1) when `interleaved`, else (i, i + head_dim / 2). One block per
// (row, head), a thread per pair, blockDim.x a multiple of 32.
template <typename T>
__device__ void rope_heads(T *out, const T *x, const float *cos, const float *sin, const T *norm,
                           uint32_t heads, uint32_t head_dim, uint32_t x_stride,
                           uint32_t first_column, uint32_t seq_len, int interleaved, float eps) {
    __shared__ float scratch[32];
    const uint32_t row = blockIdx.x, head = blockIdx.y, half = head_dim / 2, i = threadIdx.x;
    // [rows, heads, head_dim], or [rows / seq_len, heads, seq_len, head_dim] when seq_len > 0.
    const uint64_t base =
        seq_len == 0 ? ((uint64_t)row * heads + head) * head_dim
                     : (((uint64_t)(row / seq_len) * heads + head) * seq_len + row % seq_len) *
                           (uint64_t)head_dim;
    const uint64_t in = (uint64_t)row * x_stride + first_column + (uint64_t)head * head_dim;
    const uint32_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float va = 0.0f, vb = 0.0f;
    if (i < half) {
        va = to_float(x[in + a]);
        vb = to_float(x[in + b]);
    }
    if (norm != nullptr) {
        const float squares = block_reduce<false>(va * va + vb * vb, scratch);
        const float scale = rsqrtf(squares / (float)head_dim + eps);
        if (i < half) {
            va *= scale * to_float(norm[a]);
            vb *= scale * to_float(norm[b]);
        }
    }
    if (i < half) {
        const float c = cos[(uint64_t)row * half + i], s = sin[(uint64_t)row * half + i];
        out[base + a] = from_float<T>(va * c - vb * s);
        out[base + b] = from_float<T>(va * s + vb * c);
    }
}

// Attention over the paged KV cache (generate/paged_attention.rs, whose CPU reference this
// must equal): out[row, head, :] = softmax(q[row, head] . k * scale) v over the row's
// positions 0..len, read through its block table. meta holds [table start, len] per row,
// [first row, rows] per tile, then the tables; position j is cache row
// table[j / block_size] * block_size + j % block_size. One block per (tile, KV head, slice of
// at most PA_QUERIES of its query heads): a tile is consecutive rows of one sequence (one
// row when it decodes, several when it prefills) sized so that rows x heads <= PA_QUERIES;
// every key a block reads serves all of its queries. Each of PA_WARPS warps takes every
// PA_WARPS-th key with an online softmax per query (a lane holds PER_LANE dimensions: lane,
// lane + 32, ...), and the warps' partial sums are merged in shared memory.
#define PA_WARPS 4
#define PA_QUERIES 8
template <typename T, int PER_LANE>
__device__ void paged_attention(T *out, const T *q, const T *keys, const T *values,
                                const uint32_t *meta, uint32_t rows, uint32_t heads,
                                uint32_t kv_heads, uint32_t head_dim, uint32_t block_size,
                                float scale) {
    __shared__ float acc_s[PA_WARPS][PA_QUERIES][32 * PER_LANE];
    __shared__ float max_s[PA_WARPS][PA_QUERIES];
    __shared__ float sum_s[PA_WARPS][PA_QUERIES];
    const uint32_t kvh = blockIdx.y;
    const uint32_t group = heads / kv_heads;
    const uint32_t first_head = blockIdx.z * PA_QUERIES;
    const uint32_t per_row = min(group - first_head, (uint32_t)PA_QUERIES);
    const uint32_t *tile = meta + 2 * (uint64_t)rows + 2 * (uint64_t)blockIdx.x;
    const uint32_t first_row = tile[0];
    const uint32_t queries = min(tile[1] * per_row, (uint32_t)PA_QUERIES);
    const uint32_t *table = meta + meta[2 * first_row];
    const uint64_t kv_dim = (uint64_t)kv_heads * head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    // Query n is head first_head + n % per_row of row first_row + n / per_row.
    float qr[PA_QUERIES][PER_LANE], acc[PA_QUERIES][PER_LANE], mx[PA_QUERIES], sm[PA_QUERIES];
    uint32_t len[PA_QUERIES];
    uint32_t longest = 0;
#pragma unroll
    for (int n = 0; n < PA_QUERIES; n++) {
        mx[n] = -INFINITY;
        sm[n] = 0.0f;
        const uint32_t row = first_row + n / per_row;
        const uint64_t head = (uint64_t)kvh * group + first_head + n % per_row;
        len[n] = n < queries ? meta[2 * row + 1] : 0;
        longest = max(longest, len[n]);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            const uint32_t d = lane + 32 * i;
            acc[n][i] = 0.0f;
            qr[n][i] = (n < queries && d < head_dim)
                           ? to_float(q[((uint64_t)row * heads + head) * head_dim + d]) * scale
                           : 0.0f;
        }
    }
    for (uint32_t j = warp; j < longest; j += PA_WARPS) {
        const uint64_t at =
            ((uint64_t)table[j / block_size] * block_size + j % block_size) * kv_dim +
            (uint64_t)kvh * head_dim;
        float k[PER_LANE], v[PER_LANE];
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            const uint32_t d = lane + 32 * i;
            k[i] = d < head_dim ? to_float(keys[at + d]) : 0.0f;
            v[i] = d < head_dim ? to_float(values[at + d]) : 0.0f;
        }
#pragma unroll
        for (int n = 0; n < PA_QUERIES; n++) {
            if (j < len[n]) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < PER_LANE; i++) s += qr[n][i] * k[i];
                s = warp_sum(s);
                const float m = fmaxf(mx[n], s);
                const float c = __expf(mx[n] - m);
                const float p = __expf(s - m);
                sm[n] = sm[n] * c + p;
#pragma unroll
                for (int i = 0; i < PER_LANE; i++) acc[n][i] = acc[n][i] * c + p * v[i];
                mx[n] = m;
            }
        }
    }
#pragma unroll
    for (int n = 0; n < PA_QUERIES; n++) {
        if (n < queries) {
            if (lane == 0) {
                max_s[warp][n] = mx[n];
                sum_s[warp][n] = sm[n];
            }
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) {
                const uint32_t d = lane + 32 * i;
                if (d < head_dim) acc_s[warp][n][d] = acc[n][i];
            }
        }
    }
    __syncthreads();
    for (uint32_t index = threadIdx.x; index < queries * head_dim; index += blockDim.x) {
        const uint32_t n = index / head_dim, d = index % head_dim;
        float m = -INFINITY;
        for (int w = 0; w < PA_WARPS; w++) m = fmaxf(m, max_s[w][n]);
        float total = 0.0f, value = 0.0f;
        for (int w = 0; w < PA_WARPS; w++) {
            if (max_s[w][n] != -INFINITY) {
                const float c = __expf(max_s[w][n] - m);
                total += sum_s[w][n] * c;
                value += acc_s[w][n][d] * c;
            }
        }
        const uint32_t row = first_row + n / per_row;
        const uint64_t head = (uint64_t)kvh * group + first_head + n % per_row;
        out[((uint64_t)row * heads + head) * head_dim + d] =
            from_float<T>(total > 0.0f ? value / total : 0.0f);
    }
}

#define PAGED_ATTENTION(T, NAME, PER_LANE)                                                       \
    extern "C" __global__ void __launch_bounds__(PA_WARPS * 32)                                  \
        paged_attention_##NAME##_d##PER_LANE(T *out, const T *q, const T *keys, const T *values, \
                                             const uint32_t *meta, uint32_t rows, uint32_t heads, \
                                             uint32_t kv_heads, uint32_t head_dim,               \
                                             uint32_t block_size, float scale) {                 \
        paged_attention<T, PER_LANE>(out, q, keys, values, meta, rows, heads, kv_heads,         \
                                     head_dim, block_size, scale);                              \
    }
#define PAGED_ATTENTION_SIZES(T, NAME)                                                           \
    PAGED_ATTENTION(T, NAME, 2)                                                                  \
    PAGED_ATTENTION(T, NAME, 4)                                                                  \
    PAGED_ATTENTION(T, NAME, 8)

#define SOFTMAX_WARP(T, NAME, PER_LANE)                                                          \
    extern "C" __global__ void masked_softmax_##NAME##_w##PER_LANE(                                \
        T *scores, const T *bias, const float *keep, uint32_t heads, uint32_t t, int causal,     \
        uint64_t rows) {                                                                         \
        masked_softmax_warp<T, PER_LANE>(scores, bias, keep, heads, t, causal, rows);            \
    }

#define DTYPE_KERNELS(T, NAME)                                                                   \
    extern "C" __global__ void bias_add_##NAME(T *x, const T *bias, const T *residual,           \
                                               uint32_t rows, uint32_t cols, int gelu) {         \
        bias_add<T>(x, bias, residual, rows, cols, gelu);                                        \
    }                                                                                            \
    extern "C" __global__ void scatter_rows_##NAME(T *dst, const T *src, const uint32_t *index,  \
                                                   uint64_t rows, uint32_t width,                \
                                                   uint64_t src_stride) {                        \
        scatter_rows<T>(dst, src, index, rows, width, src_stride);                               \
    }                                                                                            \
    extern "C" __global__ void argmax_rows_##NAME(const T *x, uint32_t *out, uint32_t cols) {    \
        argmax_rows<T>(x, out, cols);                                                            \
    }                                                                                            \
    extern "C" __global__ void sample_rows_##NAME(const T *logits, const float *params,           \
                                                  uint32_t *out, uint32_t cols) {               \
        sample_rows<T>(logits, params, out, cols);                                               \
    }                                                                                            \
    extern "C" __global__ void listed_rows_##NAME(const T *logits, const uint32_t *tokens,        \
                                                  float *out, uint32_t cols, uint32_t top) {    \
        listed_rows<T>(logits, tokens, out, cols, top);                                          \
    }                                                                                            \
    extern "C" __global__ void add_rms_norm_##NAME(T *out, const T *x, const T *y,             \
                                                   const T *weight, uint32_t rows, uint32_t cols, \
                                                   float eps) {                                   \
        add_rms_norm<T>(out, x, y, weight, rows, cols, eps);                                     \
    }                                                                                            \
    extern "C" __global__ void silu_mul_halves_##NAME(T *out, const T *x, uint64_t n,             \
                                                      uint32_t cols) {                           \
        silu_mul_halves<T>(out, x, n, cols);                                                     \
    }                                                                                            \
    extern "C" __global__ void rope_heads_##NAME(T *out, const T *x, const float *cos,           \
                                                 const float *sin, const T *norm, uint32_t heads, \
                                                 uint32_t head_dim, uint32_t x_stride,            \
                                                 uint32_t first_column, uint32_t seq_len,         \
                                                 int interleaved, float eps) {                    \
        rope_heads<T>(out, x, cos, sin, norm, heads, head_dim, x_stride, first_column, seq_len,  \
                      interleaved, eps);                                                         \
    }                                                                                            \
    extern "C" __global__ void masked_softmax_##NAME(T *scores, const T *bias, const float *keep, \
                                                     uint32_t heads, uint32_t t, int causal) {   \
        masked_softmax_block<T>(scores, bias, keep, heads, t, causal);                           \
    }                                                                                            \
    SOFTMAX_WARP(T, NAME, 1)                                                                     \
    SOFTMAX_WARP(T, NAME, 2)                                                                     \
    SOFTMAX_WARP(T, NAME, 4)                                                                     \
    SOFTMAX_WARP(T, NAME, 8)                                                                     \
    SOFTMAX_WARP(T, NAME, 16)                                                                    \
    SOFTMAX_WARP(T, NAME, 32)

DTYPE_KERNELS(float, f32)
DTYPE_KERNELS(__half, f16)
DTYPE_KERNELS(__nv_bfloat16, bf16)

PAGED_ATTENTION_SIZES(float, f32)
PAGED_ATTENTION_SIZES(__half, f16)
PAGED_ATTENTION_SIZES(__nv_bfloat16, bf16)

// The encoders' attention on tensor cores (f16 and bf16).
#include "flash_attention.cuh"

// The generation engine's attention over the paged KV cache on tensor cores (f16 and bf16).
#include "paged_attention_mma.cuh"
