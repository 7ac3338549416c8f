// What a process asks of the GPU, counted by the fake driver: the host-side costs a real GPU
// charges per call (launches, copies, waits, allocations) are the same calls here, so the
// counts of two runs that differ only in their number of decode steps give a step's.
// Two ways out: CUDA_EMU_STATS=FILE writes the process's counts, and every kernel the device
// ran by name, to FILE as JSON at exit (scripts/cuda-emu/step-profile.sh reads them); and
// `cuda_emu_counts`, for a test in the process, gives the calling thread's counts (a test
// thread's own calls, whatever other tests run beside it).
#pragma once

#include <cstddef>

extern "C" {
/// The counts, in the order `cuda_emu_counts` writes them: resident-models' tests read the
/// same fields as a `#[repr(C)]` struct (models/src/emu_counts.rs), so a field is added at the
/// end, in both.
struct CudaEmuCounts {
    unsigned long long kernel_launches;   // by the host (not those a graph replays)
    unsigned long long library_calls;     // cuBLAS and cuRAND calls (each, on a GPU, kernels)
    unsigned long long graph_launches;
    unsigned long long captured;          // operations recorded into a graph, not run
    unsigned long long replayed;          // operations run by graph launches
    unsigned long long copies_to_device;  // by the host (not those a graph replays), as below
    unsigned long long bytes_to_device;
    unsigned long long copies_to_host;
    unsigned long long bytes_to_host;
    unsigned long long copies_on_device;
    unsigned long long memsets;
    unsigned long long waits;  // stream, event or context synchronisations, synchronous
                               // copies, and copies to pageable host memory
    unsigned long long allocations;  // device memory, synchronous or stream-ordered
    unsigned long long allocated_bytes;
    unsigned long long frees;
    unsigned long long pool_growths;    // stream-ordered allocations the default pool could
                                        // not serve from what it held: memory from the OS
    unsigned long long events_created;
};

/// The calling thread's counts since it started.
void cuda_emu_counts(CudaEmuCounts *out);
}

namespace emu::stats {

/// An operation issued on a stream: run at once, or recorded into a graph being captured.
enum class Operation {
    Kernel,
    Library,
    CopyToDevice,
    CopyToHost,
    CopyOnDevice,
    Memset,
    HostFunction,
    EventRecord,
    GraphLaunch,
};

bool writing();
void issued(Operation operation, bool captured, size_t bytes);
void replayed(size_t operations);
void kernel_ran(const char *name);
void allocated(size_t bytes);
void freed();
/// A stream-ordered allocation took memory from the OS (driver.cpp's MemoryPool).
void pool_grew();
void event_created();
/// The host waited for the device.
void waited();

}  // namespace emu::stats
