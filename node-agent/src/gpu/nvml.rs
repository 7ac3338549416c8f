//! GPU utilisation and free VRAM from NVML (`libnvidia-ml`, loaded at run time), which needs
//! no CUDA context: the reading costs the GPU nothing and works while the actors' models
//! hold it. A host without the library simply has no readings.

use nvml_wrapper::Nvml;
use resident_proto::pb;

/// Opens NVML: `libnvidia-ml.so.1`, as driver installs and the container toolkit ship it,
/// else `libnvidia-ml.so`.
pub fn open_nvml() -> Result<Nvml, nvml_wrapper::error::NvmlError> {
    let versioned = Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init();
    versioned.or_else(|_| Nvml::init())
}

/// An open NVML handle.
pub struct NvmlReader(Nvml);

impl NvmlReader {
    /// Opens NVML ([`open_nvml`]), or says why not.
    pub fn open() -> Result<Self, nvml_wrapper::error::NvmlError> {
        open_nvml().map(Self)
    }

    /// Fills each GPU's utilisation and free VRAM where NVML knows the GPU (matched by
    /// UUID, which CUDA and NVML spell alike); the others keep what they had.
    pub fn refresh(&self, gpus: &mut [pb::GpuInfo]) {
        for gpu in gpus.iter_mut().filter(|g| !g.uuid.is_empty()) {
            let Ok(device) = self.0.device_by_uuid(gpu.uuid.as_str()) else {
                continue;
            };
            if let Ok(rates) = device.utilization_rates() {
                gpu.utilization_ratio = Some(f64::from(rates.gpu.min(100)) / 100.0);
            }
            if let Ok(memory) = device.memory_info() {
                gpu.free_vram_bytes = memory.free;
            }
        }
    }
}
