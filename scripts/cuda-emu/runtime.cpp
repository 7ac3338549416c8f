// The execution side of cuda-emu: a launch runs its blocks on a pool of OS threads, each
// block's CUDA threads as fibers on one OS thread, switched at barriers (`__syncthreads`, the
// warp's shuffles and mma.sync). Part of the fake libcuda (driver.cpp); the kernel modules
// (built from the .cu files against device.h) call into it.
//
// Written by hand (no fiber crate fits a C++ kernel that calls back into its scheduler): a
// fiber switch is six callee-saved registers and a stack pointer (x86-64 System V).
#include "runtime.h"

#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern "C" void emu_switch(void **save_stack, void *load_stack);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

thread_local Block *current_block = nullptr;
thread_local Thread *current_thread = nullptr;

namespace {

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t GUARD_BYTES = 4096;
constexpr unsigned MAX_THREADS = 1024;
/// A warp's exchange area: 32 lanes of 64 bytes (a shuffled value, or mma fragments).
constexpr size_t WARP_SLOT_BYTES = 32 * 64;

/// `expected` fibers meet; the last to arrive opens it for the others (a new generation).
/// A fiber that finishes leaves it, as an exited GPU thread no longer counts.
struct Barrier {
    unsigned expected = 0;
    unsigned arrived = 0;
    unsigned generation = 0;

    /// One fewer fiber to wait for; true if that opens it.
    bool leave() {
        expected--;
        if (arrived > 0 && arrived == expected) {
            arrived = 0;
            generation++;
            return true;
        }
        return false;
    }
};

struct Fiber {
    void *stack_pointer = nullptr;
    Thread thread{};
    bool done = false;
};

/// One OS thread's blocks: its fibers' stacks, kept from launch to launch.
struct Worker {
    std::vector<void *> stacks;
    std::vector<Fiber> fibers;
    Barrier block_barrier;
    std::vector<Barrier> warp_barriers;
    std::vector<unsigned char> warp_slots;
    std::vector<unsigned char> dynamic_shared;
    Block block{};
    void *scheduler_stack = nullptr;
    size_t running = 0;
    bool progressed = false;
    const Kernel *kernel = nullptr;
    void **arguments = nullptr;

    ~Worker() {
        for (void *stack : stacks) munmap(stack, STACK_BYTES + GUARD_BYTES);
    }
};

thread_local Worker *this_worker = nullptr;

Worker &worker() {
    if (this_worker == nullptr) this_worker = new Worker();  // one per OS thread, kept
    return *this_worker;
}

void yield_to_scheduler() {
    Worker &w = *this_worker;
    emu_switch(&w.fibers[w.running].stack_pointer, w.scheduler_stack);
}

void wait(Barrier &barrier) {
    Worker &w = *this_worker;
    unsigned generation = barrier.generation;
    if (++barrier.arrived == barrier.expected) {
        barrier.arrived = 0;
        barrier.generation++;
        w.progressed = true;
        return;
    }
    w.progressed = true;
    do {
        yield_to_scheduler();
    } while (barrier.generation == generation);
    w.progressed = true;
}

[[noreturn]] void fiber_main() {
    Worker &w = *this_worker;
    w.kernel->call(w.kernel->function, w.arguments);
    Fiber &fiber = w.fibers[w.running];
    fiber.done = true;
    w.progressed = true;
    w.block_barrier.leave();
    w.warp_barriers[fiber.thread.warp].leave();
    void *unused;
    emu_switch(&unused, w.scheduler_stack);
    __builtin_unreachable();
}

void *new_stack() {
    void *memory = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) trap("cannot map a fiber stack");
    mprotect(memory, GUARD_BYTES, PROT_NONE);  // an overflow faults instead of corrupting
    return memory;
}

/// A fresh fiber's stack, laid out so that emu_switch "returns" into fiber_main with the
/// stack aligned as after a call.
void *initial_stack_pointer(void *stack) {
    auto top = reinterpret_cast<uintptr_t>(stack) + GUARD_BYTES + STACK_BYTES;
    top &= ~uintptr_t{15};
    auto *slots = reinterpret_cast<void **>(top);
    slots[-1] = nullptr;  // fiber_main's return address: it never returns
    slots[-2] = reinterpret_cast<void *>(&fiber_main);
    for (int i = 3; i <= 8; i++) slots[-i] = nullptr;  // rbp, rbx, r12-r15
    return &slots[-8];
}

bool reverse_order() {
    static const bool reverse = [] {
        const char *order = getenv("CUDA_EMU_ORDER");
        return order != nullptr && std::string(order) == "reverse";
    }();
    return reverse;
}

void run_block(Worker &w, const Launch &launch, uint3 index) {
    unsigned threads = launch.block.x * launch.block.y * launch.block.z;
    unsigned warps = (threads + 31) / 32;
    while (w.stacks.size() < threads) w.stacks.push_back(new_stack());
    w.fibers.assign(threads, Fiber{});
    w.block = Block{index, launch.block, launch.grid, w.dynamic_shared.data()};
    w.block_barrier = Barrier{threads, 0, 0};
    w.warp_barriers.assign(warps, Barrier{});
    if (w.warp_slots.size() < warps * WARP_SLOT_BYTES) w.warp_slots.resize(warps * WARP_SLOT_BYTES);
    for (unsigned warp = 0; warp < warps; warp++)
        w.warp_barriers[warp].expected = std::min(32u, threads - 32 * warp);
    for (unsigned linear = 0; linear < threads; linear++) {
        Fiber &fiber = w.fibers[linear];
        fiber.thread.index = uint3{linear % launch.block.x,
                                   linear / launch.block.x % launch.block.y,
                                   linear / (launch.block.x * launch.block.y)};
        fiber.thread.lane = linear % 32;
        fiber.thread.warp = linear / 32;
        fiber.stack_pointer = initial_stack_pointer(w.stacks[linear]);
    }
    current_block = &w.block;
    unsigned live = threads;
    while (live > 0) {
        w.progressed = false;
        for (unsigned step = 0; step < threads; step++) {
            unsigned linear = reverse_order() ? threads - 1 - step : step;
            Fiber &fiber = w.fibers[linear];
            if (fiber.done) continue;
            w.running = linear;
            current_thread = &fiber.thread;
            emu_switch(&w.scheduler_stack, fiber.stack_pointer);
            if (fiber.done) live--;
        }
        if (live > 0 && !w.progressed) {
            fprintf(stderr,
                    "cuda-emu: kernel %s deadlocked in block (%u, %u, %u): %u threads wait at "
                    "barriers that the others never reach\n",
                    launch.kernel->name, index.x, index.y, index.z, live);
            abort();
        }
    }
    current_block = nullptr;
    current_thread = nullptr;
}

void run_blocks(const Launch &launch, std::atomic<uint64_t> &next, uint64_t count) {
    Worker &w = worker();
    w.kernel = launch.kernel;
    w.arguments = launch.arguments;
    w.dynamic_shared.assign(launch.shared_bytes + 16, 0);
    for (uint64_t b = next.fetch_add(1); b < count; b = next.fetch_add(1)) {
        uint3 index{static_cast<unsigned>(b % launch.grid.x),
                    static_cast<unsigned>(b / launch.grid.x % launch.grid.y),
                    static_cast<unsigned>(b / (uint64_t{launch.grid.x} * launch.grid.y))};
        run_block(w, launch, index);
    }
}

bool tracing() {
    static const bool trace = getenv("CUDA_EMU_TRACE") != nullptr;
    return trace;
}

unsigned worker_count() {
    static const unsigned count = [] {
        if (const char *set = getenv("CUDA_EMU_THREADS")) return std::max(1, atoi(set));
        return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }();
    return count;
}

/// The helper threads: each takes part in a launch at most once, running blocks until none
/// are left, and reports.
class Pool {
  public:
    void run(const Launch &launch, uint64_t blocks) {
        std::atomic<uint64_t> next{0};
        unsigned helpers = static_cast<unsigned>(
            std::min<uint64_t>(worker_count() - 1, blocks > 0 ? blocks - 1 : 0));
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (; threads_ < helpers; threads_++) std::thread([this] { serve(); }).detach();
            job_ = Job{&launch, &next, blocks, helpers, helpers};
            generation_++;
        }
        wake_.notify_all();
        run_blocks(launch, next, blocks);
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return job_.unfinished == 0; });
    }

  private:
    struct Job {
        const Launch *launch = nullptr;
        std::atomic<uint64_t> *next = nullptr;
        uint64_t blocks = 0;
        unsigned to_take = 0;     // helpers still wanted
        unsigned unfinished = 0;  // helpers that have not reported
    };

    [[noreturn]] void serve() {
        uint64_t seen = 0;
        while (true) {
            Job job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return generation_ != seen && job_.to_take > 0; });
                seen = generation_;
                job_.to_take--;
                job = job_;
            }
            run_blocks(*job.launch, *job.next, job.blocks);
            std::lock_guard<std::mutex> lock(mutex_);
            if (--job_.unfinished == 0) done_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_, done_;
    unsigned threads_ = 0;
    Job job_;
    uint64_t generation_ = 0;
};

}  // namespace

void sync_block() { wait(this_worker->block_barrier); }

void sync_warp() { wait(this_worker->warp_barriers[current_thread->warp]); }

unsigned char *warp_slots() {
    return this_worker->warp_slots.data() + current_thread->warp * WARP_SLOT_BYTES;
}

namespace {

/// The 32 lanes' registers of one mma.sync, published to each other through the warp's slots.
struct Fragments {
    uint32_t a[4];
    uint32_t b[2];
};

float element(uint32_t pair, unsigned half, bool bf16) {
    uint16_t bits = static_cast<uint16_t>(half != 0 ? pair >> 16 : pair & 0xffff);
    if (bf16) {
        uint32_t widened = uint32_t{bits} << 16;
        float value;
        memcpy(&value, &widened, 4);
        return value;
    }
    __half value;
    memcpy(&value, &bits, 2);
    return __half2float(value);
}

/// c += A B for this lane's four elements of C (rows g and g + 8, columns 2c and 2c + 1),
/// with `k` 16 (A's registers a0-a3, B's b0-b1) or 8 (a0-a1, b0). Per the PTX ISA's layouts:
/// A's row r, column j is in lane (r % 8) * 4 + (j % 8) / 2, register (r / 8) + 2 (j / 8),
/// half j % 2; B's row j, column n in lane n * 4 + (j % 8) / 2, register j / 8, half j % 2.
/// Products are exact and summed in f64, then rounded once (the hardware sums in f32 in an
/// order of its own: the kernels' tests allow for that).
void mma(float c[4], const uint32_t *a, const uint32_t *b, unsigned k, bool bf16) {
    auto *slots = reinterpret_cast<Fragments *>(warp_slots());
    unsigned lane = current_thread->lane;
    Fragments mine{};
    memcpy(mine.a, a, sizeof(uint32_t) * (k == 16 ? 4 : 2));
    memcpy(mine.b, b, sizeof(uint32_t) * (k == 16 ? 2 : 1));
    slots[lane] = mine;
    sync_warp();
    unsigned group = lane / 4, pair = lane % 4;
    float result[4];
    for (unsigned e = 0; e < 4; e++) {
        unsigned row = group + 8 * (e / 2), column = 2 * pair + e % 2;
        double sum = c[e];
        for (unsigned j = 0; j < k; j++) {
            const Fragments &a_lane = slots[(row % 8) * 4 + (j % 8) / 2];
            const Fragments &b_lane = slots[column * 4 + (j % 8) / 2];
            float x = element(a_lane.a[row / 8 + 2 * (j / 8)], j % 2, bf16);
            float y = element(b_lane.b[j / 8], j % 2, bf16);
            sum += static_cast<double>(x) * y;
        }
        result[e] = static_cast<float>(sum);
    }
    sync_warp();  // every lane has read the slots before any lane's next exchange
    memcpy(c, result, sizeof(result));
}

}  // namespace

void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16) {
    const uint32_t b[2] = {b0, b1};
    mma(c, a, b, 16, bf16);
}

void mma_m16n8k8(float c[4], const uint32_t a[2], uint32_t b0) {
    mma(c, a, &b0, 8, false);
}

void trap(const char *why) {
    Block *block = current_block;
    Thread *thread = current_thread;
    if (block != nullptr && thread != nullptr)
        fprintf(stderr, "cuda-emu: %s (block (%u, %u, %u), thread (%u, %u, %u))\n", why,
                block->index.x, block->index.y, block->index.z, thread->index.x,
                thread->index.y, thread->index.z);
    else
        fprintf(stderr, "cuda-emu: %s\n", why);
    abort();
}

bool describe_running(char *out, size_t size) {
    const Block *block = current_block;
    const Thread *thread = current_thread;
    const Worker *w = this_worker;
    if (block == nullptr || thread == nullptr || w == nullptr || w->kernel == nullptr)
        return false;
    snprintf(out, size, "kernel %s, block (%u, %u, %u), thread (%u, %u, %u)", w->kernel->name,
             block->index.x, block->index.y, block->index.z, thread->index.x, thread->index.y,
             thread->index.z);
    return true;
}

void run(const Launch &launch) {
    unsigned threads = launch.block.x * launch.block.y * launch.block.z;
    if (threads == 0 || threads > MAX_THREADS) trap("a launch of 0 or more than 1024 threads");
    uint64_t blocks = uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
    static Pool *pool = new Pool();  // never destroyed: its threads live as long as the process
    static std::mutex one_launch_at_a_time;
    std::lock_guard<std::mutex> lock(one_launch_at_a_time);
    if (tracing())
        fprintf(stderr, "cuda-emu: %s <<<(%u, %u, %u), (%u, %u, %u), %u>>>\n", launch.kernel->name,
                launch.grid.x, launch.grid.y, launch.grid.z, launch.block.x, launch.block.y,
                launch.block.z, launch.shared_bytes);
    pool->run(launch, blocks);
}

}  // namespace emu
