// The device side of cuda-emu: what a CUDA kernel source needs so that g++ compiles it for
// the host, force-included (`-include device.h`) before the kernel file. Each CUDA thread is
// a fiber (runtime.cpp); a block's fibers run on one OS thread, so `__shared__` variables are
// `static thread_local`, and blocks run on as many OS threads as the host has cores.
// Barriers, warp shuffles and the warp-wide mma.sync are collective operations between fibers.
// Only what our kernels and candle's use is here; anything else fails to compile, by name.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

// What nvcc would say: compute capability EMU_ARCH (build.sh builds 900, a Hopper, and 750,
// a T4), compiled by CUDA 13.0.
#undef __host__
#undef __device__
#undef __global__
#undef __forceinline__
#undef __shared__
#undef __constant__
#undef __align__
#undef __launch_bounds__
#ifndef EMU_ARCH
#define EMU_ARCH 900
#endif
#define __CUDA_ARCH__ EMU_ARCH
#ifndef __CUDACC_VER_MAJOR__
#define __CUDACC_VER_MAJOR__ 13
#define __CUDACC_VER_MINOR__ 0
#endif
#define RESIDENT_CUDA_EMU 1
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

namespace emu {

/// The block that this OS thread runs now (runtime.cpp sets it).
struct Block {
    uint3 index;
    dim3 dim;
    dim3 grid;
    void *dynamic_shared;
};
/// The CUDA thread (fiber) that runs now.
struct Thread {
    uint3 index;
    unsigned lane;
    unsigned warp;
};
extern thread_local Block *current_block;
extern thread_local Thread *current_thread;

/// `__syncthreads()`: waits until every thread of the block that has not finished arrives.
void sync_block();
/// A barrier of the calling thread's warp (the lanes that have not finished).
void sync_warp();
/// The warp's exchange slots: 32 of 16 bytes, one per lane.
unsigned char *warp_slots();
[[noreturn]] void trap(const char *why);
/// The block's dynamic shared memory (`extern __shared__`, rewritten by build.sh).
inline void *dynamic_shared() { return current_block->dynamic_shared; }

/// Every lane of the warp publishes `value`; each gets the value of lane `source(lane)`, or
/// its own where the source is out of range.
template <typename T, typename Source> T exchange(T value, Source source) {
    static_assert(sizeof(T) <= 16, "warp exchange of more than 16 bytes");
    unsigned lane = current_thread->lane;
    unsigned char *slots = warp_slots();
    std::memcpy(slots + 16 * lane, &value, sizeof(T));
    sync_warp();
    int from = source(static_cast<int>(lane));
    T result = value;
    if (from >= 0 && from < 32) std::memcpy(&result, slots + 16 * from, sizeof(T));
    sync_warp();
    return result;
}

/// c += a b, one warp's mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.f32, fragments as
/// the PTX ISA lays them out.
void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16);
/// c += a b, one warp's mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32.
void mma_m16n8k8(float c[4], const uint32_t a[2], uint32_t b0);

template <typename T> inline T atomic_update(T *address, T (*update)(T, T), T operand) {
    using Bits = std::conditional_t<sizeof(T) == 2, uint16_t,
                                    std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    static_assert(sizeof(T) == sizeof(Bits), "atomic on an odd size");
    Bits *bits = reinterpret_cast<Bits *>(address);
    Bits old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (true) {
        T old_value;
        std::memcpy(&old_value, &old, sizeof(T));
        T new_value = update(old_value, operand);
        Bits desired;
        std::memcpy(&desired, &new_value, sizeof(T));
        if (__atomic_compare_exchange_n(bits, &old, desired, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED))
            return old_value;
    }
}

}  // namespace emu

#define threadIdx (emu::current_thread->index)
#define blockIdx (emu::current_block->index)
#define blockDim (emu::current_block->dim)
#define gridDim (emu::current_block->grid)
#define warpSize 32

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::sync_warp(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { emu::trap("__trap() in a kernel"); }
inline unsigned __activemask() { return 0xffffffffu; }

template <typename T> inline T __shfl_sync(unsigned, T value, int source, int width = 32) {
    return emu::exchange(value, [=](int lane) { return (lane / width) * width + source % width; });
}
template <typename T> inline T __shfl_xor_sync(unsigned, T value, int mask, int width = 32) {
    return emu::exchange(value, [=](int lane) {
        int from = lane ^ mask;
        return from / width == lane / width ? from : lane;
    });
}
template <typename T> inline T __shfl_down_sync(unsigned, T value, unsigned delta, int width = 32) {
    return emu::exchange(value, [=](int lane) {
        int from = lane + static_cast<int>(delta);
        return from / width == lane / width ? from : lane;
    });
}
template <typename T> inline T __shfl_up_sync(unsigned, T value, unsigned delta, int width = 32) {
    return emu::exchange(value, [=](int lane) {
        int from = lane - static_cast<int>(delta);
        return from >= 0 && from / width == lane / width ? from : lane;
    });
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    unsigned bits = 0;
    for (int from = 0; from < 32; from++) {
        int p = emu::exchange(predicate, [=](int) { return from; });
        if (p) bits |= 1u << from;
    }
    return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
    return __ballot_sync(mask, !predicate) == 0;
}

// Bit casts and fast math.
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline int __float_as_int(float x) { int u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }
inline float __int_as_float(int u) { float x; std::memcpy(&x, &u, 4); return x; }
inline long long __double_as_longlong(double x) { long long u; std::memcpy(&u, &x, 8); return u; }
inline double __longlong_as_double(long long u) { double x; std::memcpy(&x, &u, 8); return x; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * static_cast<float>(M_SQRT1_2)); }
inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
/// The four signed bytes' products of a and b, summed, plus c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 0xff) * ((b >> (8 * i)) & 0xff);
    return c;
}
/// a - b in each of four signed bytes, saturated.
inline unsigned __vsubss4(unsigned a, unsigned b) {
    unsigned out = 0;
    for (int i = 0; i < 4; i++) {
        int d = static_cast<int8_t>(a >> (8 * i)) - static_cast<int8_t>(b >> (8 * i));
        d = d < -128 ? -128 : (d > 127 ? 127 : d);
        out |= (static_cast<unsigned>(d) & 0xff) << (8 * i);
    }
    return out;
}
inline int __vsubss4(int a, int b) {
    return static_cast<int>(__vsubss4(static_cast<unsigned>(a), static_cast<unsigned>(b)));
}
template <typename T> inline T __ldg(const T *p) { return *p; }
inline long long clock64() { return static_cast<long long>(__builtin_ia32_rdtsc()); }

// CUDA's math is in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

// CUDA's global min and max overloads.
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }

// Half-precision math the host headers leave out, through f32 (as the device's f16 math
// rounds its f32 result).
#define EMU_HALF_MATH(T, TO_FLOAT, FROM_FLOAT)                                                 \
    inline T hexp(T x) { return FROM_FLOAT(expf(TO_FLOAT(x))); }                               \
    inline T hlog(T x) { return FROM_FLOAT(logf(TO_FLOAT(x))); }                               \
    inline T hsqrt(T x) { return FROM_FLOAT(sqrtf(TO_FLOAT(x))); }                             \
    inline T hrsqrt(T x) { return FROM_FLOAT(1.0f / sqrtf(TO_FLOAT(x))); }                     \
    inline T hcos(T x) { return FROM_FLOAT(cosf(TO_FLOAT(x))); }                               \
    inline T hsin(T x) { return FROM_FLOAT(sinf(TO_FLOAT(x))); }                               \
    inline T hexp2(T x) { return FROM_FLOAT(exp2f(TO_FLOAT(x))); }                             \
    inline T htanh(T x) { return FROM_FLOAT(tanhf(TO_FLOAT(x))); }
EMU_HALF_MATH(__half, __half2float, __float2half)
EMU_HALF_MATH(__nv_bfloat16, __bfloat162float, __float2bfloat16)
#undef EMU_HALF_MATH

// Atomics: blocks run on several OS threads at once, so these are real atomics.
template <typename T, typename U> inline T atomicAdd(T *address, U operand) {
    T value = static_cast<T>(operand);
    if constexpr (std::is_integral_v<T>) {
        return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
    } else {
        return emu::atomic_update<T>(address, [](T a, T b) { return T(a + b); }, value);
    }
}
template <typename T, typename U> inline T atomicSub(T *address, U operand) {
    return __atomic_fetch_sub(address, static_cast<T>(operand), __ATOMIC_SEQ_CST);
}
template <typename T, typename U> inline T atomicMax(T *address, U operand) {
    return emu::atomic_update<T>(address, [](T a, T b) { return a < b ? b : a; },
                                 static_cast<T>(operand));
}
template <typename T, typename U> inline T atomicMin(T *address, U operand) {
    return emu::atomic_update<T>(address, [](T a, T b) { return b < a ? b : a; },
                                 static_cast<T>(operand));
}
template <typename T, typename U> inline T atomicExch(T *address, U operand) {
    return __atomic_exchange_n(address, static_cast<T>(operand), __ATOMIC_SEQ_CST);
}
template <typename T, typename U, typename V> inline T atomicCAS(T *address, U compare, V value) {
    T expected = static_cast<T>(compare);
    __atomic_compare_exchange_n(address, &expected, static_cast<T>(value), false,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}

namespace emu {

/// A kernel as the driver sees it: its name, its address and how to call it with
/// `cuLaunchKernel`'s array of pointers to the arguments.
struct Kernel {
    const char *name;
    void *function;
    void (*call)(void *function, void **arguments);
    const size_t *argument_sizes;
    size_t argument_count;
};

template <typename... Args> struct Call {
    static constexpr size_t sizes[sizeof...(Args) + 1] = {sizeof(Args)..., 0};
    template <size_t... I>
    static void unpack(void *function, void **arguments, std::index_sequence<I...>) {
        reinterpret_cast<void (*)(Args...)>(function)(
            *static_cast<std::remove_reference_t<Args> *>(arguments[I])...);
    }
    static void call(void *function, void **arguments) {
        unpack(function, arguments, std::index_sequence_for<Args...>{});
    }
};

template <typename... Args> Kernel kernel(const char *name, void (*function)(Args...)) {
    return Kernel{name, reinterpret_cast<void *>(function), &Call<Args...>::call,
                  Call<Args...>::sizes, sizeof...(Args)};
}

}  // namespace emu
