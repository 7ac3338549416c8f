// CUDA_EMU_STATS=FILE: what a process asked of the GPU, counted by the fake driver and
// written to FILE as JSON when the process exits. The host-side costs a real GPU charges per
// call (launches, copies, synchronisations, allocations) are the same calls here, so the
// counts of two runs that differ only in their number of decode steps give a step's
// (scripts/cuda-emu/step-profile.sh). Counting nothing when the variable is unset.
#pragma once

#include <cstddef>

namespace emu::stats {

/// An operation issued on a stream: run at once, or recorded into a graph being captured.
enum class Operation {
    Kernel,
    Library,  // a cuBLAS or cuRAND call (on a GPU, one or more kernels)
    CopyToDevice,
    CopyToHost,
    CopyOnDevice,
    Memset,
    HostFunction,
    EventRecord,
    GraphLaunch,
    Count
};

bool on();
void issued(Operation operation, bool captured, size_t bytes);
void replayed(size_t operations);
void kernel_ran(const char *name);
void allocated(bool stream_ordered, size_t bytes);
void freed();
/// The host waited for the device: a stream, event or context synchronisation, or a
/// synchronous copy.
void waited();

}  // namespace emu::stats
