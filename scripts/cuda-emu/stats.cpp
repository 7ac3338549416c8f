// The counts of stats.h: each thread's own, and the process's (with every kernel run, by
// name), written as JSON at exit when CUDA_EMU_STATS names a file.
#include "stats.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace emu::stats {
namespace {

using Field = unsigned long long CudaEmuCounts::*;

struct Process {
    std::mutex mutex;  // guards everything below
    CudaEmuCounts counts{};
    std::map<std::string, unsigned long long> kernels;
};

const char *path() {
    static const char *set = getenv("CUDA_EMU_STATS");
    return set != nullptr && *set != '\0' ? set : nullptr;
}

void write_at_exit();

Process &process() {
    // Never destroyed: kernels may still run while static destructors do.
    static Process *p = [] {
        if (path() != nullptr) atexit(write_at_exit);
        return new Process();
    }();
    return *p;
}

thread_local CudaEmuCounts thread_counts{};

void add(Field field, unsigned long long amount = 1) {
    thread_counts.*field += amount;
    if (path() == nullptr) return;  // the process's counts only feed the file
    Process &p = process();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.counts.*field += amount;
}

void write_at_exit() {
    Process &p = process();
    FILE *out = fopen(path(), "w");
    if (out == nullptr) {
        fprintf(stderr, "cuda-emu: cannot write CUDA_EMU_STATS=%s\n", path());
        return;
    }
    std::lock_guard<std::mutex> lock(p.mutex);
    const CudaEmuCounts &c = p.counts;
    const std::pair<const char *, unsigned long long> fields[] = {
        {"kernel_launches", c.kernel_launches},   {"library_calls", c.library_calls},
        {"graph_launches", c.graph_launches},     {"captured", c.captured},
        {"replayed", c.replayed},                 {"copies_to_device", c.copies_to_device},
        {"bytes_to_device", c.bytes_to_device},   {"copies_to_host", c.copies_to_host},
        {"bytes_to_host", c.bytes_to_host},       {"copies_on_device", c.copies_on_device},
        {"memsets", c.memsets},                   {"waits", c.waits},
        {"allocations", c.allocations},           {"allocated_bytes", c.allocated_bytes},
        {"frees", c.frees},                       {"pool_growths", c.pool_growths},
        {"events_created", c.events_created}};
    fprintf(out, "{\n");
    for (const auto &[name, value] : fields) fprintf(out, "  \"%s\": %llu,\n", name, value);
    fprintf(out, "  \"kernels_ran\": {");
    bool first = true;
    for (const auto &[name, count] : p.kernels) {
        fprintf(out, "%s\n    \"%s\": %llu", first ? "" : ",", name.c_str(), count);
        first = false;
    }
    fprintf(out, "\n  }\n}\n");
    fclose(out);
}

}  // namespace

bool writing() { return path() != nullptr; }

void issued(Operation operation, bool captured, size_t bytes) {
    if (captured) return add(&CudaEmuCounts::captured);
    switch (operation) {
        case Operation::Kernel: return add(&CudaEmuCounts::kernel_launches);
        case Operation::Library: return add(&CudaEmuCounts::library_calls);
        case Operation::GraphLaunch: return add(&CudaEmuCounts::graph_launches);
        case Operation::CopyToDevice:
            add(&CudaEmuCounts::copies_to_device);
            return add(&CudaEmuCounts::bytes_to_device, bytes);
        case Operation::CopyToHost:
            add(&CudaEmuCounts::copies_to_host);
            return add(&CudaEmuCounts::bytes_to_host, bytes);
        case Operation::CopyOnDevice: return add(&CudaEmuCounts::copies_on_device);
        case Operation::Memset: return add(&CudaEmuCounts::memsets);
        case Operation::HostFunction:
        case Operation::EventRecord: return;
    }
}

void replayed(size_t operations) { add(&CudaEmuCounts::replayed, operations); }

void kernel_ran(const char *name) {
    if (!writing()) return;
    Process &p = process();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.kernels[name]++;
}

void allocated(size_t bytes) {
    add(&CudaEmuCounts::allocations);
    add(&CudaEmuCounts::allocated_bytes, bytes);
}

void freed() { add(&CudaEmuCounts::frees); }

void pool_grew() { add(&CudaEmuCounts::pool_growths); }

void event_created() { add(&CudaEmuCounts::events_created); }

void waited() { add(&CudaEmuCounts::waits); }

}  // namespace emu::stats

extern "C" void cuda_emu_counts(CudaEmuCounts *out) { *out = emu::stats::thread_counts; }
