// cuda-emu's NVML (libnvidia-ml.so.1): what the agent's GPU fault watcher calls
// (node-agent/src/gpu/xid.rs), over the emulated driver's devices. A device's handle is
// found by the UUID the emulated driver gives it; it delivers critical Xid and double-bit
// ECC events; and an Xid that CUDA_EMU_XID_AT_LAUNCH plans (driver.cpp) reaches every event
// set that registered its device, as the real driver's does. A device that fell off the bus
// (CUDA_EMU_GPU_LOST_AT_LAUNCH) answers NVML_ERROR_GPU_IS_LOST, and so does the wait of every
// set that watches it, as the real library's do. Calls not written here are
// missing symbols, which the agent's NVML binding reads as "not supported" (no utilisation
// readings). NVML's own types are declared here: the CUDA toolkit ships no nvml.h.

#include <stdio.h>
#include <string.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

extern "C" int cuda_emu_next_xid(int *ordinal, unsigned long long *xid);
extern "C" int cuda_emu_device_count();
extern "C" int cuda_emu_device_lost(int ordinal);

namespace {

typedef int nvmlReturn_t;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_INVALID_ARGUMENT = 2;
constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
constexpr unsigned long long DOUBLE_BIT_ECC_ERROR = 0x2;
constexpr unsigned long long CRITICAL_XID_ERROR = 0x8;

struct EmuDevice {
    int ordinal;
};

struct EmuEventSet {
    std::vector<int> devices;
};

struct nvmlEventData_t {
    EmuDevice *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
};

EmuDevice *devices() {
    static EmuDevice *made = [] {
        auto *all = new EmuDevice[16];
        for (int i = 0; i < 16; i++) all[i].ordinal = i;
        return all;
    }();
    return made;
}

/// The UUID the emulated driver gives device `ordinal` (cuDeviceGetUuid_v2: "cuda-emu", then
/// zeros, then the ordinal), as NVML and the agent spell it.
void uuid_of(int ordinal, char out[41]) {
    snprintf(out, 41, "GPU-63756461-2d65-6d75-0000-0000000000%02x", ordinal & 0xff);
}

/// The Xids taken from the driver and not yet delivered to every set that watches their
/// device: each set takes its own copy.
struct Pending {
    std::mutex mutex;
    std::vector<std::pair<EmuEventSet *, std::pair<int, unsigned long long>>> events;
    std::vector<EmuEventSet *> sets;
};

Pending &pending() {
    static Pending *made = new Pending();
    return *made;
}

/// Moves the driver's new Xids to every set that watches their device. Holds the lock.
void collect(Pending &p) {
    int ordinal;
    unsigned long long xid;
    while (cuda_emu_next_xid(&ordinal, &xid) == 1) {
        for (EmuEventSet *set : p.sets) {
            for (int watched : set->devices) {
                if (watched == ordinal) p.events.push_back({set, {ordinal, xid}});
            }
        }
    }
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2() { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown() { return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t) { return "cuda-emu NVML error"; }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, EmuDevice **device) {
    for (int i = 0; i < cuda_emu_device_count(); i++) {
        char mine[41];
        uuid_of(i, mine);
        if (strcmp(uuid, mine) == 0) {
            if (cuda_emu_device_lost(i)) return NVML_ERROR_GPU_IS_LOST;
            *device = &devices()[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(EmuDevice *device, char *uuid, unsigned int length) {
    if (device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 41) return NVML_ERROR_INSUFFICIENT_SIZE;
    if (cuda_emu_device_lost(device->ordinal)) return NVML_ERROR_GPU_IS_LOST;
    uuid_of(device->ordinal, uuid);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(EmuDevice *, unsigned long long *types) {
    *types = DOUBLE_BIT_ECC_ERROR | CRITICAL_XID_ERROR;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(EmuEventSet **set) {
    Pending &p = pending();
    std::lock_guard<std::mutex> lock(p.mutex);
    *set = new EmuEventSet();
    p.sets.push_back(*set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(EmuDevice *device, unsigned long long types,
                                      EmuEventSet *set) {
    if (device == nullptr || set == nullptr || (types & CRITICAL_XID_ERROR) == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    std::lock_guard<std::mutex> lock(pending().mutex);
    set->devices.push_back(device->ordinal);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(EmuEventSet *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    Pending &p = pending();
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(p.mutex);
            for (int watched : set->devices) {
                if (cuda_emu_device_lost(watched)) return NVML_ERROR_GPU_IS_LOST;
            }
            collect(p);
            for (auto it = p.events.begin(); it != p.events.end(); ++it) {
                if (it->first != set) continue;
                *data = {&devices()[it->second.first], CRITICAL_XID_ERROR, it->second.second, 0, 0};
                p.events.erase(it);
                return NVML_SUCCESS;
            }
        }
        if (std::chrono::steady_clock::now() >= deadline) return NVML_ERROR_TIMEOUT;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

nvmlReturn_t nvmlEventSetFree(EmuEventSet *set) {
    Pending &p = pending();
    std::lock_guard<std::mutex> lock(p.mutex);
    for (auto it = p.sets.begin(); it != p.sets.end(); ++it) {
        if (*it == set) {
            p.sets.erase(it);
            break;
        }
    }
    for (auto it = p.events.begin(); it != p.events.end();) {
        it = it->first == set ? p.events.erase(it) : it + 1;
    }
    delete set;
    return NVML_SUCCESS;
}

}  // extern "C"
