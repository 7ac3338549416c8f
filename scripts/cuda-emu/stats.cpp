// CUDA_EMU_STATS (stats.h): the counters, and the JSON written at exit.
#include "stats.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace emu::stats {
namespace {

constexpr size_t OPERATIONS = static_cast<size_t>(Operation::Count);
constexpr const char *NAMES[OPERATIONS] = {
    "kernel",        "library",  "copy_to_device", "copy_to_host", "copy_on_device",
    "memset",        "host_function", "event_record",   "graph_launch"};

struct Counters {
    std::atomic<unsigned long long> issued[OPERATIONS]{};
    std::atomic<unsigned long long> captured[OPERATIONS]{};
    std::atomic<unsigned long long> bytes[OPERATIONS]{};
    std::atomic<unsigned long long> replayed{0};
    std::atomic<unsigned long long> allocations{0};
    std::atomic<unsigned long long> stream_ordered_allocations{0};
    std::atomic<unsigned long long> allocated_bytes{0};
    std::atomic<unsigned long long> frees{0};
    std::atomic<unsigned long long> waits{0};
    std::mutex mutex;  // guards kernels
    std::map<std::string, unsigned long long> kernels;
};

const char *path() {
    static const char *set = getenv("CUDA_EMU_STATS");
    return set != nullptr && *set != '\0' ? set : nullptr;
}

void write_at_exit();

Counters &counters() {
    // Never destroyed: kernels may still run while static destructors do.
    static Counters *c = [] {
        atexit(write_at_exit);
        return new Counters();
    }();
    return *c;
}

void write_at_exit() {
    Counters &c = counters();
    FILE *out = fopen(path(), "w");
    if (out == nullptr) {
        fprintf(stderr, "cuda-emu: cannot write CUDA_EMU_STATS=%s\n", path());
        return;
    }
    fprintf(out, "{\n  \"issued\": {");
    for (size_t i = 0; i < OPERATIONS; i++)
        fprintf(out, "%s\"%s\": %llu", i ? ", " : "", NAMES[i], c.issued[i].load());
    fprintf(out, "},\n  \"captured\": {");
    for (size_t i = 0; i < OPERATIONS; i++)
        fprintf(out, "%s\"%s\": %llu", i ? ", " : "", NAMES[i], c.captured[i].load());
    fprintf(out, "},\n  \"bytes\": {");
    for (size_t i = 0; i < OPERATIONS; i++)
        fprintf(out, "%s\"%s\": %llu", i ? ", " : "", NAMES[i], c.bytes[i].load());
    fprintf(out,
            "},\n  \"replayed\": %llu,\n  \"allocations\": %llu,\n"
            "  \"stream_ordered_allocations\": %llu,\n  \"allocated_bytes\": %llu,\n"
            "  \"frees\": %llu,\n  \"waits\": %llu,\n  \"kernels_ran\": {",
            c.replayed.load(), c.allocations.load(), c.stream_ordered_allocations.load(),
            c.allocated_bytes.load(), c.frees.load(), c.waits.load());
    std::lock_guard<std::mutex> lock(c.mutex);
    bool first = true;
    for (const auto &[name, count] : c.kernels) {
        fprintf(out, "%s\n    \"%s\": %llu", first ? "" : ",", name.c_str(), count);
        first = false;
    }
    fprintf(out, "\n  }\n}\n");
    fclose(out);
}

}  // namespace

bool on() { return path() != nullptr; }

void issued(Operation operation, bool captured, size_t bytes) {
    if (!on()) return;
    auto i = static_cast<size_t>(operation);
    (captured ? counters().captured : counters().issued)[i]++;
    counters().bytes[i] += bytes;
}

void replayed(size_t operations) {
    if (on()) counters().replayed += operations;
}

void kernel_ran(const char *name) {
    if (!on()) return;
    Counters &c = counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.kernels[name]++;
}

void allocated(bool stream_ordered, size_t bytes) {
    if (!on()) return;
    (stream_ordered ? counters().stream_ordered_allocations : counters().allocations)++;
    counters().allocated_bytes += bytes;
}

void freed() {
    if (on()) counters().frees++;
}

void waited() {
    if (on()) counters().waits++;
}

}  // namespace emu::stats
