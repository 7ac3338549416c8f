//! What a GPU source answers ([`GpuProbe`]), apart from the sources themselves, so that each
//! (the CUDA driver in `mod.rs`, [`super::SimulatedGpus`]) depends on it and not on the others.

use resident_proto::pb;

/// A source of this node's GPUs and their free VRAM.
pub trait GpuProbe: Send + Sync {
    /// Every GPU with its current free VRAM.
    fn gpus(&self) -> Vec<pb::GpuInfo>;
    /// True when the GPUs are simulated: the work itself runs on CPU.
    fn simulated(&self) -> bool;
    /// GPUs the host has that could not be opened, and why (never in [`GpuProbe::gpus`]).
    fn unavailable(&self) -> Vec<pb::UnavailableGpu> {
        Vec::new()
    }
    /// The driver's error where GPU `gpu`'s context has failed for good (see
    /// `gpu/health.rs`), else `None`. Blocks until the GPU's queued work is done.
    fn context_failure(&self, gpu: u32) -> Option<String> {
        let _ = gpu;
        None
    }
    /// From now on, tells `sink` of each GPU the driver reports a fault of (`gpu/xid.rs`),
    /// while it lives, where the probe can hear of faults; by default it cannot.
    fn watch_faults(&self, sink: std::sync::Weak<dyn GpuFaultSink>) {
        let _ = sink;
    }
}

/// What takes a GPU the driver reported a fault of out of service (the agent's record of
/// its failed GPUs), as fault watchers see it.
pub trait GpuFaultSink: Send + Sync {
    /// The driver reported `fault` of GPU `gpu`.
    fn hardware_fault(&self, gpu: u32, fault: String);
}

/// No GPUs: a CPU-only node.
pub struct NoGpus;

impl GpuProbe for NoGpus {
    fn gpus(&self) -> Vec<pb::GpuInfo> {
        Vec::new()
    }

    fn simulated(&self) -> bool {
        false
    }
}
