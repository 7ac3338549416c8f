//! GPU discovery. [`discover`] uses the CUDA driver API loaded at run time, so one binary runs
//! with or without a driver; [`SimulatedGpus`] reports capacity only, for tests and simulations.

mod health;
mod nvml;
mod probe;
mod restart;
mod simulated;
mod xid;

use resident_models::cuda_probe::CudaDevices;
use resident_proto::pb;

pub use health::{FAIL_SIMULATED_GPU_ENV, GpuHealth};
pub use probe::{GpuFaultSink, GpuProbe, NoGpus};
pub use restart::RestartAfterGpuFailure;
pub use simulated::SimulatedGpus;
pub use xid::{APPLICATION_XIDS, xid_fault};

/// The GPUs the CUDA driver sees (the driver is loaded at run time), with utilisation from
/// NVML where it loads.
pub struct CudaDriverProbe {
    devices: CudaDevices,
    nvml: Option<nvml::NvmlReader>,
}

impl GpuProbe for CudaDriverProbe {
    fn gpus(&self) -> Vec<pb::GpuInfo> {
        let mut gpus = self.devices.gpus();
        if let Some(nvml) = &self.nvml {
            nvml.refresh(&mut gpus);
        }
        gpus
    }

    fn simulated(&self) -> bool {
        false
    }

    fn unavailable(&self) -> Vec<pb::UnavailableGpu> {
        self.devices
            .unavailable()
            .iter()
            .map(|gpu| pb::UnavailableGpu {
                index: gpu.ordinal as u32,
                reason: gpu.reason.clone(),
            })
            .collect()
    }

    fn context_failure(&self, gpu: u32) -> Option<String> {
        self.devices.context_failure(gpu as usize)
    }

    fn watch_faults(&self, sink: std::sync::Weak<dyn GpuFaultSink>) {
        if self.nvml.is_none() {
            return;
        }
        let gpus = self
            .devices
            .gpus()
            .into_iter()
            .filter(|gpu| !gpu.uuid.is_empty())
            .map(|gpu| (gpu.uuid, gpu.index))
            .collect();
        xid::watch_nvml(gpus, sink);
    }
}

/// The real GPUs of this host, or none (with one log line saying why). A build without the
/// `cuda` feature offers none, whatever the host has: its actors could only run on the CPU,
/// and jobs that find GPUs put their actors there (one per GPU, not one per core).
pub fn discover() -> Box<dyn GpuProbe> {
    if !cfg!(feature = "cuda") {
        if CudaDevices::open().is_ok_and(|devices| !devices.gpus().is_empty()) {
            tracing::info!(
                "this host has GPUs, but this build has no `cuda` feature: running CPU-only \
                 (scripts/build-cuda.sh builds the GPU one)"
            );
        }
        return Box::new(NoGpus);
    }
    match CudaDevices::open() {
        Ok(devices) => {
            let nvml = nvml::NvmlReader::open()
                .inspect_err(|reason| tracing::info!(%reason, "no GPU utilisation readings"))
                .ok();
            let unavailable = devices.unavailable().len();
            let probe = CudaDriverProbe { devices, nvml };
            tracing::info!(
                gpus = probe.gpus().len(),
                unavailable,
                nvml = probe.nvml.is_some(),
                "found GPUs through the CUDA driver"
            );
            Box::new(probe)
        }
        Err(reason) => {
            tracing::info!(%reason, "no GPUs: running CPU-only");
            Box::new(NoGpus)
        }
    }
}
