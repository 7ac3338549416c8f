//! GPUs through the CUDA driver API, loaded at run time: one binary runs with or without a
//! driver, and a host without one has no GPUs rather than a crash.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError};
use resident_proto::pb;

/// Why a host has no GPUs to offer.
#[derive(Debug, thiserror::Error)]
pub enum NoCudaDevices {
    /// The driver library is not there.
    #[error("libcuda is not installed")]
    NoLibcuda,
    /// The driver could not count its devices.
    #[error("CUDA driver: {0}")]
    Driver(DriverError),
    /// One device could not be opened or read.
    #[error("device {ordinal}: {reason}")]
    Device {
        /// Its ordinal.
        ordinal: usize,
        /// The driver's reason.
        reason: DriverError,
    },
    /// The driver counts no device.
    #[error("the CUDA driver reports no devices")]
    NoDevices,
    /// The driver panicked inside cudarc (some broken installs do).
    #[error("the CUDA driver failed to initialise")]
    Panicked,
}

/// GPUs seen through `libcuda`, which is loaded at run time.
pub struct CudaDevices {
    devices: Vec<(Arc<CudaContext>, pb::GpuInfo)>,
}

fn format_uuid(bytes: &[std::os::raw::c_char]) -> String {
    let hex = hex::encode(bytes.iter().map(|b| *b as u8).collect::<Vec<u8>>());
    if hex.len() != 32 {
        return hex;
    }
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether libcuda can be loaded. The CPU build loads it at run time and checks first; the
/// `cuda` build links it (through candle), so the program would not have started without it.
#[cfg(not(feature = "cuda"))]
fn libcuda_present() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: only checks whether the shared library can be loaded; no CUDA call is made.
    unsafe {
        cudarc::driver::sys::is_culib_present()
    }
}

#[cfg(feature = "cuda")]
fn libcuda_present() -> bool {
    true
}

impl CudaDevices {
    /// Opens every device, or says why there are none.
    pub fn open() -> Result<Self, NoCudaDevices> {
        if !libcuda_present() {
            return Err(NoCudaDevices::NoLibcuda);
        }
        // cudarc panics instead of returning an error on some broken installs.
        let opened = catch_unwind(AssertUnwindSafe(|| -> Result<Self, NoCudaDevices> {
            let count = CudaContext::device_count().map_err(NoCudaDevices::Driver)?;
            let mut devices = Vec::new();
            for ordinal in 0..count.max(0) as usize {
                let device = |reason| NoCudaDevices::Device { ordinal, reason };
                let ctx = CudaContext::new(ordinal).map_err(device)?;
                let (major, minor) = ctx.compute_capability().map_err(device)?;
                let (free, total) = ctx.mem_get_info().map_err(device)?;
                let info = pb::GpuInfo {
                    index: ordinal as u32,
                    uuid: ctx
                        .uuid()
                        .map(|u| format_uuid(&u.bytes))
                        .unwrap_or_default(),
                    name: ctx.name().map_err(device)?,
                    total_vram_bytes: total as u64,
                    free_vram_bytes: free as u64,
                    compute_major: major as u32,
                    compute_minor: minor as u32,
                    simulated: false,
                    utilization_ratio: None,
                };
                devices.push((ctx, info));
            }
            Ok(Self { devices })
        }));
        match opened {
            Ok(Ok(probe)) if !probe.devices.is_empty() => Ok(probe),
            Ok(Ok(_)) => Err(NoCudaDevices::NoDevices),
            Ok(Err(reason)) => Err(reason),
            Err(_) => Err(NoCudaDevices::Panicked),
        }
    }
}

impl CudaDevices {
    /// Every device with its current free VRAM.
    pub fn gpus(&self) -> Vec<pb::GpuInfo> {
        self.devices
            .iter()
            .map(|(ctx, info)| {
                let free = ctx.mem_get_info().map(|(free, _)| free as u64);
                pb::GpuInfo {
                    free_vram_bytes: free.unwrap_or(info.free_vram_bytes),
                    ..info.clone()
                }
            })
            .collect()
    }
}
