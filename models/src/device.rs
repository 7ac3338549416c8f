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

#[cfg(feature = "cuda")]
fn cuda_device(index: u32) -> Result<Device, ModelError> {
    Device::new_cuda(index as usize)
        .map_err(|e| ModelError::Load(format!("cannot open cuda:{index}: {e}")))
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
        #[allow(unsafe_code)]
        // SAFETY: documented to run before any other thread exists, so nothing reads or
        // writes the environment concurrently.
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string())
        };
    }
}
