//! Where a model runs: the CPU, or the GPU the scheduler assigned (CUDA builds only), and how
//! many threads one model operation may use on CPU.

use candle_core::Device;

use crate::ModelError;

/// The device for an actor assigned `gpu` (`None` = CPU). A build without the `cuda` feature
/// runs on CPU and says so once in the log.
pub fn select_device(gpu: Option<u32>) -> Result<Device, ModelError> {
    match gpu {
        Some(index) => cuda_device(index),
        None => Ok(Device::Cpu),
    }
}

/// The free memory of a CUDA `device`, in bytes (`None` on the CPU, or when the driver will
/// not say), counting what its memory pool holds unused as free: the pool is trimmed first
/// (`cuda_memory.rs`: it keeps freed memory for the next step's allocations).
pub fn free_gpu_memory(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        if let Err(e) = crate::cuda_memory::trim_pool(cuda) {
            tracing::warn!(error = %e, "cannot trim the GPU's memory pool: free memory may read low");
        }
        let (free, _total) = cuda.cuda_stream().context().mem_get_info().ok()?;
        return Some(free as u64);
    }
    let _ = device;
    None
}

/// The compute capability of a CUDA `device` (`None` on the CPU, or when the driver will
/// not say).
pub fn compute_capability(device: &Device) -> Option<(u32, u32)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let (major, minor) = cuda.cuda_stream().context().compute_capability().ok()?;
        return Some((u32::try_from(major).ok()?, u32::try_from(minor).ok()?));
    }
    let _ = device;
    None
}

/// The CUDA ordinal of `device` (`usize::MAX` for any other device): a key for what is
/// checked once per GPU (the attention kernels' first-use checks).
pub(crate) fn gpu_ordinal(device: &Device) -> usize {
    match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
        _ => usize::MAX,
    }
}

/// Whether candle's kernels have bf16 on `device`: the CPU, and GPUs of compute capability
/// 8.0 on (its CUDA kernels compile bf16 only there).
pub fn has_bf16_kernels(device: &Device) -> bool {
    compute_capability(device).is_none_or(|(major, _)| major >= 8)
}

/// Refuses a dtype `device` cannot run, with what to use instead: bf16 on a GPU older than
/// compute capability 8.0 would otherwise fail at its first op with "named symbol not found".
pub fn check_dtype(device: &Device, dtype: candle_core::DType) -> Result<(), ModelError> {
    if dtype == candle_core::DType::BF16 && !has_bf16_kernels(device) {
        let (major, minor) = compute_capability(device).unwrap_or_default();
        return Err(ModelError::InvalidConfig(format!(
            "bf16 needs a GPU of compute capability 8.0 or later, and this one is {major}.{minor} \
             (a T4 or V100): use dtype f16, or leave dtype to auto, which picks f16 there"
        )));
    }
    Ok(())
}

/// Opens GPU `index` with the allocation settings of `cuda_memory.rs`.
#[cfg(feature = "cuda")]
fn cuda_device(index: u32) -> Result<Device, ModelError> {
    let device = Device::new_cuda(index as usize)
        .map_err(|e| ModelError::Load(format!("cannot open cuda:{index}: {e}")))?;
    let cuda = device.as_cuda_device().map_err(ModelError::from)?;
    crate::cuda_memory::prepare(cuda)
        .map_err(|e| ModelError::Load(format!("cannot set up cuda:{index}'s memory pool: {e}")))?;
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(index: u32) -> Result<Device, ModelError> {
    tracing::warn!(
        gpu = index,
        "this agent was built without the `cuda` feature; running on CPU"
    );
    Ok(Device::Cpu)
}

/// Sets how many threads one model operation may use on CPU (candle and the CPU forward read
/// `RAYON_NUM_THREADS`). One thread per op with one actor per core is the fastest CPU setup
/// for small encoders; an explicit `RAYON_NUM_THREADS` in the environment wins.
///
/// For binaries: call it first thing in `main`, before any other thread starts. Libraries
/// (the SDK's `Cluster::local` among them) never call it.
pub fn set_compute_threads(threads: usize) {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        set_env_before_threads("RAYON_NUM_THREADS", threads.max(1).to_string().as_ref());
    }
}

/// Where the CUDA driver keeps the kernels it compiles from PTX, and how much it may keep.
/// Our kernels and candle's (patched, vendor/README.md) ship as SASS for compute
/// capabilities 7.5 to 9.0 and PTX of the newest: a GPU of a later generation compiles that
/// PTX the first time a process loads each module. The driver's default cache lives under
/// `$HOME/.nv`, which a container may not be able to write (a read-only root file system) and
/// which does not outlive it, and holds 256 MiB. This puts the cache in `dir` (beside the
/// agent's model cache, a host path in our deployments) and lets it hold 4 GiB, so that only
/// the first load on such a host compiles.
///
/// An explicit `CUDA_CACHE_PATH` or `CUDA_CACHE_MAXSIZE` wins. For binaries: call it first
/// thing in `main`, before any other thread starts. Without the `cuda` feature it does nothing.
pub fn set_cuda_jit_cache(dir: &std::path::Path) {
    if !cfg!(feature = "cuda") {
        return;
    }
    if std::env::var_os("CUDA_CACHE_PATH").is_none() {
        // The driver caches nothing where it cannot write: a failure here shows as a slow
        // first load, never as an error.
        let _ = std::fs::create_dir_all(dir);
        set_env_before_threads("CUDA_CACHE_PATH", dir.as_os_str());
    }
    if std::env::var_os("CUDA_CACHE_MAXSIZE").is_none() {
        set_env_before_threads("CUDA_CACHE_MAXSIZE", (4u64 << 30).to_string().as_ref());
    }
}

/// `std::env::set_var`, for the functions above that binaries call before any other thread.
fn set_env_before_threads(name: &str, value: &std::ffi::OsStr) {
    #[allow(unsafe_code)]
    // SAFETY: every caller documents that it runs before any other thread exists, so nothing
    // reads or writes the environment concurrently.
    unsafe {
        std::env::set_var(name, value)
    };
}

/// The GPU whose side of a test runs: the first CUDA device of a `cuda` build, or `None`
/// (the test says so and checks only the CPU). With `RESIDENT_TEST_GPU=required`, which
/// `scripts/cuda-emu.sh test` sets (CI runs these tests on the emulated GPU), a missing GPU
/// fails the test instead of skipping it, so that run cannot pass without its GPU side.
#[cfg(test)]
pub(crate) fn test_gpu() -> Option<Device> {
    #[cfg(feature = "cuda")]
    let opened = cuda_device(0).map_err(|e| e.to_string());
    #[cfg(not(feature = "cuda"))]
    let opened: Result<Device, String> = Err("a build without the `cuda` feature".into());
    match opened {
        Ok(gpu) => Some(gpu),
        Err(why) if std::env::var("RESIDENT_TEST_GPU").as_deref() == Ok("required") => {
            panic!("RESIDENT_TEST_GPU=required, but no GPU opens: {why}")
        }
        Err(why) => {
            eprintln!("no GPU here ({why}): the GPU side of this test is skipped");
            None
        }
    }
}

/// Every GPU of a `cuda` build's host, for tests of several GPUs in one process (an 8-GPU
/// server runs an actor on each, in one agent). Fewer than `wanted` opens the test's GPU
/// side to skip, unless `RESIDENT_TEST_GPUS` asks for at least `wanted` (`scripts/cuda-emu.sh
/// test` sets it and emulates that many), where it fails instead.
#[cfg(all(test, feature = "cuda"))]
pub(crate) fn test_gpus(wanted: usize) -> Vec<Device> {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let count = CudaContext::device_count().map_or(0, |n| n.max(0) as u32);
    let gpus: Vec<Device> = (0..count)
        .map(|index| cuda_device(index).expect("a GPU the driver counts opens"))
        .collect();
    let required = std::env::var("RESIDENT_TEST_GPUS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    if gpus.len() < wanted {
        assert!(
            required < wanted,
            "RESIDENT_TEST_GPUS={required}, but {} GPUs open",
            gpus.len()
        );
        eprintln!(
            "{} GPUs here, {wanted} wanted: the GPU side of this test is skipped",
            gpus.len()
        );
    }
    gpus
}
