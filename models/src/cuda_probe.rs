//! GPUs through the CUDA driver API, loaded at run time: one binary runs with or without a
//! driver, and a host without one has no GPUs rather than a crash.

use std::panic::catch_unwind;
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
    /// The driver counts devices, and not one of them could be opened or read.
    #[error("no device opens: {}", unavailable_list(.0))]
    NoneOpens(Vec<Unavailable>),
    /// The driver counts no device.
    #[error("the CUDA driver reports no devices")]
    NoDevices,
    /// The driver panicked inside cudarc (some broken installs do).
    #[error("the CUDA driver failed to initialise")]
    Panicked,
}

/// A device the driver counts that could not be opened or read, and why.
#[derive(Clone, Debug)]
pub struct Unavailable {
    /// Its CUDA ordinal.
    pub ordinal: usize,
    /// The driver's reason.
    pub reason: String,
}

fn unavailable_list(devices: &[Unavailable]) -> String {
    let each: Vec<String> = devices
        .iter()
        .map(|d| format!("device {}: {}", d.ordinal, d.reason))
        .collect();
    each.join("; ")
}

/// GPUs seen through `libcuda`, which is loaded at run time.
pub struct CudaDevices {
    devices: Vec<(Arc<CudaContext>, pb::GpuInfo)>,
    unavailable: Vec<Unavailable>,
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
    /// Opens every device that opens, or says why there are none. A device that cannot be
    /// opened (another process holds it in exclusive mode, or it fell off the bus) is left
    /// out with a warning and listed in [`CudaDevices::unavailable`]: the host's other GPUs
    /// are still offered, under their own CUDA ordinals.
    pub fn open() -> Result<Self, NoCudaDevices> {
        if !libcuda_present() {
            return Err(NoCudaDevices::NoLibcuda);
        }
        // cudarc panics instead of returning an error on some broken installs.
        let count = catch_unwind(CudaContext::device_count)
            .map_err(|_| NoCudaDevices::Panicked)?
            .map_err(NoCudaDevices::Driver)?;
        let mut probe = Self {
            devices: Vec::new(),
            unavailable: Vec::new(),
        };
        for ordinal in 0..count.max(0) as usize {
            let opened = catch_unwind(|| open_device(ordinal))
                .unwrap_or_else(|_| Err("the CUDA driver panicked while opening it".to_owned()));
            match opened {
                Ok(device) => probe.devices.push(device),
                Err(reason) => {
                    tracing::warn!(
                        gpu = ordinal,
                        %reason,
                        "a GPU cannot be opened: it is left out, and the host's other GPUs \
                         are offered (check nvidia-smi for its state and for processes that \
                         hold it)"
                    );
                    probe.unavailable.push(Unavailable { ordinal, reason });
                }
            }
        }
        match (probe.devices.is_empty(), probe.unavailable.is_empty()) {
            (false, _) => Ok(probe),
            (true, true) => Err(NoCudaDevices::NoDevices),
            (true, false) => Err(NoCudaDevices::NoneOpens(probe.unavailable)),
        }
    }

    /// The driver's error where device `ordinal`'s context has failed for good, else `None`
    /// (also for a device not opened). A sticky error (CUDA_ERROR_ILLEGAL_ADDRESS after an
    /// Xid fault or a kernel's bad access, an uncorrectable ECC error) fails every later call
    /// on the context, so it is the one that fails two synchronisations in a row; an error
    /// of one asynchronous launch is returned once and cleared. Waits for the device's
    /// queued work.
    pub fn context_failure(&self, ordinal: usize) -> Option<String> {
        let (ctx, _) = self
            .devices
            .iter()
            .find(|(_, info)| info.index as usize == ordinal)?;
        ctx.synchronize().err()?;
        ctx.synchronize().err().map(driver_reason)
    }

    /// The devices the driver counts that could not be opened, and why.
    pub fn unavailable(&self) -> &[Unavailable] {
        &self.unavailable
    }
}

/// The driver's words for `error` and its name ("CUDA-capable device(s) is/are busy or
/// unavailable (CUDA_ERROR_DEVICE_UNAVAILABLE)").
fn driver_reason(error: DriverError) -> String {
    match (error.error_string(), error.error_name()) {
        (Ok(text), Ok(name)) if text != name => {
            format!("{} ({})", text.to_string_lossy(), name.to_string_lossy())
        }
        (_, Ok(name)) => name.to_string_lossy().into_owned(),
        _ => error.to_string(),
    }
}

/// Device `ordinal`'s context and what the agent offers of it.
fn open_device(ordinal: usize) -> Result<(Arc<CudaContext>, pb::GpuInfo), String> {
    let ctx = CudaContext::new(ordinal).map_err(driver_reason)?;
    let (major, minor) = ctx.compute_capability().map_err(driver_reason)?;
    let (free, total) = ctx.mem_get_info().map_err(driver_reason)?;
    let info = pb::GpuInfo {
        index: ordinal as u32,
        uuid: ctx
            .uuid()
            .map(|u| format_uuid(&u.bytes))
            .unwrap_or_default(),
        name: ctx.name().map_err(driver_reason)?,
        total_vram_bytes: total as u64,
        free_vram_bytes: free as u64,
        compute_major: major as u32,
        compute_minor: minor as u32,
        simulated: false,
        utilization_ratio: None,
    };
    Ok((ctx, info))
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

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use std::ffi::{c_char, c_int, c_void};

    use candle_core::{DType, Tensor};

    use super::*;

    #[allow(unsafe_code)]
    unsafe extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }

    /// Calls cuda-emu's `void NAME(int ordinal)`, a switch that changes what this thread
    /// sees of GPU `ordinal`, where the process runs on cuda-emu; false elsewhere.
    #[allow(unsafe_code)]
    fn emulator_switch(name: &std::ffi::CStr, ordinal: usize) -> bool {
        // SAFETY: dlsym with RTLD_DEFAULT (a null handle on glibc) only looks a name up in
        // the loaded libraries; the switches cuda-emu's libcuda defines under these names
        // are `void (int)`, and change only what this thread sees of one device.
        unsafe {
            let symbol = dlsym(std::ptr::null_mut(), name.as_ptr());
            if symbol.is_null() {
                return false;
            }
            let switch: unsafe extern "C" fn(c_int) = std::mem::transmute(symbol);
            switch(ordinal as c_int);
        }
        true
    }

    /// Makes GPU `ordinal` refuse its context to this thread, as a GPU held by another process
    /// in exclusive mode does (on cuda-emu; false elsewhere).
    fn make_unavailable_on_this_thread(ordinal: usize) -> bool {
        emulator_switch(c"cuda_emu_make_unavailable_on_this_thread", ordinal)
    }

    /// Makes GPU `ordinal`'s context fail for good as this thread sees it, as after an Xid
    /// fault (on cuda-emu; false elsewhere).
    fn fail_on_this_thread(ordinal: usize) -> bool {
        emulator_switch(c"cuda_emu_fail_device_on_this_thread", ordinal)
    }

    /// A GPU whose context failed for good (a sticky error) is found, with the driver's
    /// error, and its neighbour is not: the agent takes out of service only the GPU that
    /// failed. Work on the failed GPU fails; on the other it goes on.
    #[test]
    fn a_gpu_whose_context_fails_for_good_is_found_and_its_neighbour_is_not() {
        let gpus = crate::device::test_gpus(2);
        if gpus.len() < 2 {
            return;
        }
        let devices = CudaDevices::open().expect("the GPUs open");
        assert!(devices.context_failure(0).is_none());
        assert!(devices.context_failure(1).is_none());
        if !fail_on_this_thread(1) {
            eprintln!("not on cuda-emu: no GPU can be made to fail here; skipped");
            return;
        }
        let failure = devices.context_failure(1).expect("GPU 1 failed");
        assert!(failure.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{failure}");
        assert!(devices.context_failure(0).is_none(), "GPU 0 is healthy");
        assert!(
            devices.context_failure(7).is_none(),
            "no such GPU: nothing to say"
        );
        let sum = |device: &candle_core::Device| {
            Tensor::ones(8, DType::F32, device)?
                .sum_all()?
                .to_scalar::<f32>()
        };
        assert_eq!(sum(&gpus[0]).unwrap(), 8.0);
        assert!(sum(&gpus[1]).is_err(), "work on the failed GPU fails");
    }

    /// A host whose first GPU will not open (held in exclusive mode, or fallen off the bus)
    /// still offers the others, under their own ordinals, so that an actor placed on GPU 1
    /// opens GPU 1; when none opens, the error names each and why.
    #[test]
    fn a_gpu_that_does_not_open_is_left_out_and_the_others_keep_their_ordinals() {
        let gpus = crate::device::test_gpus(2);
        if gpus.len() < 2 {
            return;
        }
        if !make_unavailable_on_this_thread(0) {
            eprintln!("not on cuda-emu: no GPU can be made to refuse here; skipped");
            return;
        }
        let devices = CudaDevices::open().expect("the other GPUs open");
        let offered: Vec<u32> = devices.gpus().iter().map(|g| g.index).collect();
        assert_eq!(offered, (1..gpus.len() as u32).collect::<Vec<_>>());
        let left_out: Vec<usize> = devices.unavailable().iter().map(|d| d.ordinal).collect();
        assert_eq!(left_out, [0]);
        let gpu = crate::device::select_device(Some(offered[0])).unwrap();
        let sum = Tensor::ones(8, DType::F32, &gpu)
            .unwrap()
            .sum_all()
            .unwrap();
        assert_eq!(sum.to_scalar::<f32>().unwrap(), 8.0);

        (1..gpus.len()).for_each(|ordinal| assert!(make_unavailable_on_this_thread(ordinal)));
        let Err(error) = CudaDevices::open() else {
            panic!("no GPU opens, and CudaDevices::open succeeded");
        };
        let message = error.to_string();
        for ordinal in 0..gpus.len() {
            assert!(
                message.contains(&format!("device {ordinal}: ")),
                "{message}"
            );
        }
    }
}
