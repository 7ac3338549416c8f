// The fake cuBLAS and cuBLASLt of cuda-emu (libcublas.so.13, libcublasLt.so.13): the GEMMs
// candle calls, column-major as cuBLAS defines them, products summed in f32 (as tensor cores
// sum) or f64, issued on the handle's stream through the fake driver (so a captured graph
// replays them). Entry points not defined here are stubs that fail by name (build.sh).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "device.h"

extern "C" {
int cuda_emu_issue(CUstream stream, std::function<void()> *operation);
int cuda_emu_current_device();
int cuda_emu_stream_device(CUstream stream);
int cuda_emu_device_of(const void *address);
}

namespace {

/// A handle belongs to the device current at its creation (cuBLAS: "the device associated
/// with a cuBLAS handle is assumed to remain unchanged" until it is destroyed), and so must
/// its stream, the device current at each call, and the memory each call reads and writes.
struct Handle {
    int device = -1;
    CUstream stream = nullptr;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

/// One element of `type` at `base[index]`, widened.
double load(cudaDataType type, const void *base, size_t index) {
    switch (type) {
        case CUDA_R_32F: return static_cast<const float *>(base)[index];
        case CUDA_R_64F: return static_cast<const double *>(base)[index];
        case CUDA_R_16F: return __half2float(static_cast<const __half *>(base)[index]);
        case CUDA_R_16BF:
            return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[index]);
        default: emu::trap("cuBLAS: an operand type cuda-emu does not emulate");
    }
}

void store(cudaDataType type, void *base, size_t index, double value) {
    switch (type) {
        case CUDA_R_32F: static_cast<float *>(base)[index] = static_cast<float>(value); break;
        case CUDA_R_64F: static_cast<double *>(base)[index] = value; break;
        case CUDA_R_16F:
            static_cast<__half *>(base)[index] = __float2half(static_cast<float>(value));
            break;
        case CUDA_R_16BF:
            static_cast<__nv_bfloat16 *>(base)[index] =
                __float2bfloat16(static_cast<float>(value));
            break;
        default: emu::trap("cuBLAS: a result type cuda-emu does not emulate");
    }
}

/// alpha and beta are of the compute type: f16 for CUBLAS_COMPUTE_16F, f64 for 64F, else f32.
double scalar(cublasComputeType_t compute, const void *value) {
    switch (compute) {
        case CUBLAS_COMPUTE_16F:
        case CUBLAS_COMPUTE_16F_PEDANTIC: return __half2float(*static_cast<const __half *>(value));
        case CUBLAS_COMPUTE_64F:
        case CUBLAS_COMPUTE_64F_PEDANTIC: return *static_cast<const double *>(value);
        default: return *static_cast<const float *>(value);
    }
}

struct Gemm {
    cublasOperation_t transa, transb;
    int m, n, k;
    double alpha, beta;
    const void *a;
    cudaDataType a_type;
    int lda;
    long long stride_a;
    const void *b;
    cudaDataType b_type;
    int ldb;
    long long stride_b;
    void *c;
    cudaDataType c_type;
    int ldc;
    long long stride_c;
    int batches;
    bool wide;  // sum in f64 (a 64F compute type)
};

/// op(A) as rows of k values (row i is A's row i under `transa`), in `T`.
template <typename T> void a_rows(const Gemm &g, size_t a0, std::vector<T> &rows) {
    rows.resize(static_cast<size_t>(g.m) * g.k);
    for (int i = 0; i < g.m; i++)
        for (int l = 0; l < g.k; l++) {
            size_t at = g.transa == CUBLAS_OP_N ? i + static_cast<size_t>(l) * g.lda
                                                : l + static_cast<size_t>(i) * g.lda;
            rows[static_cast<size_t>(i) * g.k + l] = static_cast<T>(load(g.a_type, g.a, a0 + at));
        }
}

/// Column j of op(B), k values.
template <typename T> void b_column(const Gemm &g, size_t b0, int j, std::vector<T> &column) {
    column.resize(g.k);
    for (int l = 0; l < g.k; l++) {
        size_t at = g.transb == CUBLAS_OP_N ? l + static_cast<size_t>(j) * g.ldb
                                            : j + static_cast<size_t>(l) * g.ldb;
        column[l] = static_cast<T>(load(g.b_type, g.b, b0 + at));
    }
}

/// The dot of two runs of n values, in eight interleaved sums (which the compiler keeps in
/// one vector register), added at the end.
template <typename T> T dot(const T *x, const T *y, int n) {
    T sums[8] = {};
    int l = 0;
    for (; l + 8 <= n; l += 8)
        for (int u = 0; u < 8; u++) sums[u] += x[l + u] * y[l + u];
    for (; l < n; l++) sums[0] += x[l] * y[l];
    return ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
}

/// Columns [first, last) of every batch's C = alpha op(A) op(B) + beta C, the products
/// summed in `T` (f32 as tensor cores sum, or f64 for a 64F compute type).
template <typename T> void gemm_columns(const Gemm &g, int first, int last) {
    std::vector<T> rows, column;
    for (int batch = 0; batch < g.batches; batch++) {
        const size_t c0 = static_cast<size_t>(batch) * g.stride_c;
        a_rows(g, static_cast<size_t>(batch) * g.stride_a, rows);
        for (int j = first; j < last; j++) {
            b_column(g, static_cast<size_t>(batch) * g.stride_b, j, column);
            for (int i = 0; i < g.m; i++) {
                double sum = dot(&rows[static_cast<size_t>(i) * g.k], column.data(), g.k);
                size_t at = c0 + i + static_cast<size_t>(j) * g.ldc;
                double value = g.alpha * sum;
                if (g.beta != 0.0) value += g.beta * load(g.c_type, g.c, at);
                store(g.c_type, g.c, at, value);
            }
        }
    }
}

void gemm_columns(const Gemm &g, int first, int last) {
    if (g.wide)
        gemm_columns<double>(g, first, last);
    else
        gemm_columns<float>(g, first, last);
}

/// Runs the GEMM over the host's cores, columns split between threads.
void gemm(const Gemm &g) {
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    int per = (g.n + static_cast<int>(threads) - 1) / static_cast<int>(threads);
    if (static_cast<long long>(g.m) * g.n * g.k * g.batches < (1 << 20) || per == 0) {
        gemm_columns(g, 0, g.n);
        return;
    }
    std::vector<std::thread> workers;
    for (int first = 0; first < g.n; first += per)
        workers.emplace_back([&g, first, per] { gemm_columns(g, first, std::min(g.n, first + per)); });
    for (auto &worker : workers) worker.join();
}

/// A GEMM on another device than its handle's, or on another device's memory (a GPU
/// without peer access faults): said, and refused.
bool across_devices(const Handle &h, const Gemm &g) {
    int current = cuda_emu_current_device();
    if (current != h.device) {
        fprintf(stderr, "cuda-emu: a GEMM on a cuBLAS handle of device %d with %s current\n",
                h.device, current < 0 ? "no context" : "another device's context");
        return true;
    }
    const void *operands[] = {g.a, g.b, g.c};
    for (int i = 0; i < 3; i++) {
        int owner = cuda_emu_device_of(operands[i]);
        if (owner >= 0 && owner != h.device) {
            fprintf(stderr, "cuda-emu: a GEMM on device %d reads or writes device %d's memory "
                            "(its %c operand)\n", h.device, owner, "ABC"[i]);
            return true;
        }
    }
    return false;
}

cublasStatus_t issue(cublasHandle_t handle, Gemm g) {
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batches < 0) return CUBLAS_STATUS_INVALID_VALUE;
    auto *h = reinterpret_cast<Handle *>(handle);
    if (across_devices(*h, g)) return CUBLAS_STATUS_EXECUTION_FAILED;
    std::function<void()> operation = [g] { gemm(g); };
    if (cuda_emu_issue(h->stream, &operation) != 0) return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    auto *made = new Handle();
    // Without a current context, cuBLAS's runtime takes device 0's primary context.
    made->device = std::max(0, cuda_emu_current_device());
    *handle = reinterpret_cast<cublasHandle_t>(made);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete reinterpret_cast<Handle *>(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    auto *h = reinterpret_cast<Handle *>(handle);
    int device = cuda_emu_stream_device(reinterpret_cast<CUstream>(stream));
    if (device != h->device) {
        fprintf(stderr, "cuda-emu: cublasSetStream: a stream of device %d on a handle of device "
                        "%d\n", device, h->device);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->stream = reinterpret_cast<CUstream>(stream);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
    *stream = reinterpret_cast<cudaStream_t>(reinterpret_cast<Handle *>(handle)->stream);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t *mode) {
    *mode = reinterpret_cast<Handle *>(handle)->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (mode != CUBLAS_POINTER_MODE_HOST) {
        fprintf(stderr, "cuda-emu: cuBLAS's device pointer mode is not emulated\n");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    reinterpret_cast<Handle *>(handle)->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *a, cudaDataType a_type, int lda, long long stride_a,
    const void *b, cudaDataType b_type, int ldb, long long stride_b, const void *beta, void *c,
    cudaDataType c_type, int ldc, long long stride_c, int batches, cublasComputeType_t compute,
    cublasGemmAlgo_t) {
    bool wide = compute == CUBLAS_COMPUTE_64F || compute == CUBLAS_COMPUTE_64F_PEDANTIC;
    return issue(handle, Gemm{transa, transb, m, n, k, scalar(compute, alpha),
                              scalar(compute, beta), a, a_type, lda, stride_a, b, b_type, ldb,
                              stride_b, c, c_type, ldc, stride_c, batches, wide});
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *a, cudaDataType a_type, int lda, const void *b,
                            cudaDataType b_type, int ldb, const void *beta, void *c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, a, a_type, lda,
                                      0, b, b_type, ldb, 0, beta, c, c_type, ldc, 0, 1, compute,
                                      algo);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float *alpha,
                           const float *a, int lda, const float *b, int ldb, const float *beta,
                           float *c, int ldc) {
    return cublasGemmEx(handle, transa, transb, m, n, k, alpha, a, CUDA_R_32F, lda, b,
                        CUDA_R_32F, ldb, beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *a, int lda,
                                         long long stride_a, const float *b, int ldb,
                                         long long stride_b, const float *beta, float *c,
                                         int ldc, long long stride_c, int batches) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, a, CUDA_R_32F,
                                      lda, stride_a, b, CUDA_R_32F, ldb, stride_b, beta, c,
                                      CUDA_R_32F, ldc, stride_c, batches, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double *alpha,
                           const double *a, int lda, const double *b, int ldb,
                           const double *beta, double *c, int ldc) {
    return cublasGemmEx(handle, transa, transb, m, n, k, alpha, a, CUDA_R_64F, lda, b,
                        CUDA_R_64F, ldb, beta, c, CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F,
                        CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double *alpha, const double *a, int lda,
                                         long long stride_a, const double *b, int ldb,
                                         long long stride_b, const double *beta, double *c,
                                         int ldc, long long stride_c, int batches) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, a, CUDA_R_64F,
                                      lda, stride_a, b, CUDA_R_64F, ldb, stride_b, beta, c,
                                      CUDA_R_64F, ldc, stride_c, batches, CUBLAS_COMPUTE_64F,
                                      CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    static int the_handle;
    *handle = reinterpret_cast<cublasLtHandle_t>(&the_handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

}  // extern "C"
