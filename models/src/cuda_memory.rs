//! How a GPU that Resident opens allocates: the settings `device::select_device` applies to
//! each CUDA device before any model uses it, and the pool trim behind
//! `device::free_gpu_memory`.
//!
//! candle allocates every tensor with `cuMemAllocAsync` from the device's default memory
//! pool, and an eager step (a prefill, an embedding batch, a decode step without graphs) makes
//! hundreds. Two of CUDA's and cudarc's defaults cost there:
//! - **The pool's release threshold is 0**: at every stream, event or context
//!   synchronisation the pool gives all the memory it holds unused back to the OS, so the
//!   allocations after it map memory again, at about what `cuMemAlloc` costs (NVIDIA's
//!   programming guide, "Physical Page Caching Behavior"). We set it to `u64::MAX`, as
//!   PyTorch's `cudaMallocAsync` backend and RAPIDS' async resource do: the pool keeps what a
//!   step needed for the next step. `free_gpu_memory` trims the pool first, so memory the pool
//!   holds unused still counts as free when the KV cache is planned.
//! - **cudarc makes two CUDA events for every allocation** (and destroys them with it), to
//!   order a buffer's uses across streams. It only uses them once a context has a second
//!   stream of its own making (`CudaContext::new_stream`, `CudaStream::fork`), which neither
//!   candle's `Device::new_cuda` nor Resident creates: they are made and never used. We turn
//!   that tracking off.
//!
//! cuda-emu models the pool (`scripts/cuda-emu/driver.cpp`) and counts the events, so the test
//! below holds both settings in CI.

use candle_core::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::{DriverError, result, sys};

/// Applies both settings to a device just opened.
pub(crate) fn prepare(cuda: &CudaDevice) -> Result<(), DriverError> {
    #[allow(unsafe_code)]
    // SAFETY: the events this turns off are only waited on or recorded when the context is in
    // cudarc's multi-stream mode, which only `CudaContext::new_stream`/`CudaStream::fork`
    // enter; candle's `Device::new_cuda` uses the per-thread stream and Resident creates no
    // stream, so no synchronisation that happens today is lost. A change that adds a stream
    // must order its buffers' uses itself.
    unsafe {
        cuda.disable_event_tracking()
    };
    let Some(pool) = default_pool(cuda)? else {
        return Ok(());
    };
    let mut keep_everything = u64::MAX;
    #[allow(unsafe_code)]
    // SAFETY: `pool` is the device's default pool, and RELEASE_THRESHOLD's value is a
    // cuuint64_t, which `keep_everything` is and outlives the call.
    unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep_everything as *mut u64).cast(),
        )
    }
}

/// Gives the OS back what the device's default pool holds unused, after waiting for the
/// calling thread's stream (a free counts as unused once the host has seen it complete).
pub(crate) fn trim_pool(cuda: &CudaDevice) -> Result<(), DriverError> {
    cuda.cuda_stream().synchronize()?;
    let Some(pool) = default_pool(cuda)? else {
        return Ok(());
    };
    #[allow(unsafe_code)]
    // SAFETY: `pool` is the device's default pool.
    unsafe {
        result::mem_pool::trim_to(pool, 0)
    }
}

/// The device's default memory pool; `None` where the device has no memory pools (cudarc then
/// allocates with `cuMemAlloc`, which has no pool to keep).
fn default_pool(cuda: &CudaDevice) -> Result<Option<sys::CUmemoryPool>, DriverError> {
    let context = cuda.cuda_stream().context().clone();
    if !context.has_async_alloc() {
        return Ok(None);
    }
    context.bind_to_thread()?;
    #[allow(unsafe_code)]
    // SAFETY: the device handle is the one cudarc opened the context on.
    let pool = unsafe { result::device::get_default_mem_pool(context.cu_device())? };
    Ok(Some(pool))
}

/// The device's default pool's release threshold (tests).
#[cfg(test)]
fn release_threshold(cuda: &CudaDevice) -> Result<u64, DriverError> {
    let pool = default_pool(cuda)?.expect("a device with memory pools");
    let mut threshold = 0u64;
    #[allow(unsafe_code)]
    // SAFETY: `pool` is the device's default pool; RELEASE_THRESHOLD's value is a cuuint64_t.
    unsafe {
        result::mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )?
    };
    Ok(threshold)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use crate::emu_counts::EmuCounts;

    /// Stream-ordered allocations of the kind a step makes, freed before it returns, and a
    /// synchronisation.
    fn a_step(device: &Device) -> candle_core::Result<()> {
        let x = Tensor::ones((256, 1024), DType::F32, device)?;
        let y = (x.matmul(&x.t()?)? * 2.0)?;
        let _ = y.sum_all()?.to_scalar::<f32>()?;
        device.synchronize()
    }

    #[test]
    fn an_opened_gpu_keeps_its_pool_memory_and_makes_no_events() {
        let Some(device) = crate::device::test_gpu() else {
            return;
        };
        let cuda = device.as_cuda_device().unwrap();
        assert_eq!(super::release_threshold(cuda).unwrap(), u64::MAX);
        let before = EmuCounts::of_this_thread();
        for _ in 0..3 {
            a_step(&device).unwrap();
        }
        let Some(before) = before else {
            eprintln!("a real GPU keeps no counts: the events are not checked");
            return;
        };
        let counts = EmuCounts::of_this_thread().unwrap().since(before);
        assert!(counts.allocations >= 9, "the steps allocate: {counts:?}");
        assert_eq!(counts.events_created, 0, "{counts:?}");
    }

    /// The pool keeps freed memory (the test above), but the free memory the KV cache is
    /// planned from still counts it.
    #[test]
    fn memory_the_pool_holds_unused_counts_as_free() {
        let Some(device) = crate::device::test_gpu() else {
            return;
        };
        let mib = |bytes: u64| bytes >> 20;
        let at_start = mib(crate::device::free_gpu_memory(&device).unwrap());
        let big = Tensor::zeros((256, 1 << 20), DType::F32, &device).unwrap();
        let while_held = mib(crate::device::free_gpu_memory(&device).unwrap());
        drop(big);
        let after = mib(crate::device::free_gpu_memory(&device).unwrap());
        // Other tests allocate beside this one: the 1 GiB tensor's share is checked with
        // 256 MiB to spare.
        assert!(
            while_held + 768 < at_start,
            "{while_held} MiB free, at start {at_start}"
        );
        assert!(
            after > while_held + 768,
            "{after} MiB free after, {while_held} while held"
        );
    }
}
