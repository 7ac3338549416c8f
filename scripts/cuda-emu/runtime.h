// What the fake driver (driver.cpp) and the launcher (runtime.cpp) of cuda-emu share.
#pragma once

#include "device.h"

namespace emu {

/// One kernel launch: the grid, the block, the dynamic shared memory and the arguments
/// (`cuLaunchKernel`'s array of pointers, valid for the launch).
struct Launch {
    const Kernel *kernel;
    dim3 grid;
    dim3 block;
    unsigned shared_bytes;
    void **arguments;
};

/// Runs every block of `launch` and returns when all have finished.
void run(const Launch &launch);

/// "kernel NAME, block (x, y, z), thread (x, y, z)" into `out` when this OS thread is running
/// a kernel; false otherwise. Async-signal-safe (for the fault handler).
bool describe_running(char *out, size_t size);

}  // namespace emu
