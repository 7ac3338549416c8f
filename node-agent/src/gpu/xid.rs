//! GPU faults the driver reports through NVML (`libnvidia-ml`) as they happen: critical Xid
//! errors and double-bit (uncorrectable) ECC errors. Not every fault fails a CUDA context:
//! an uncorrectable ECC error may leave the GPU running and its results wrong, which no
//! task's error would ever show. So the agent watches for them on a thread of its own
//! ([`watch_nvml`]) and takes a faulted GPU out of service at once
//! (`GpuFaultSink::hardware_fault`, implemented by `GpuHealth`), as NVIDIA's Kubernetes
//! device plugin marks such a GPU unhealthy. The Xids an application causes (a bad kernel's
//! page fault, a preempted context) are not the GPU's fault: those stay with the task that
//! caused them. A GPU NVML loses (fallen off the bus: its wait fails with `GPU_IS_LOST`) is
//! found among the watched ones, taken out of service, and left out of a new event set, so
//! the other GPUs are still watched.

use std::sync::Weak;
use std::time::Duration;

use nvml_wrapper::EventSet;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use super::probe::GpuFaultSink;

/// Xids an application causes, which say nothing about the GPU's health: 13 (a graphics
/// engine exception), 31 (a GPU memory page fault), 43 (the GPU stopped a context), 45
/// (preemptive cleanup), 68 (a video processor exception), 109 (a context switch timeout).
/// NVIDIA's device plugin skips the same ones.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// How long one wait for an event lasts: how late a watcher notices its agent is gone.
const WAIT: Duration = Duration::from_secs(5);

/// The fault a critical Xid is, or `None` for one an application causes.
pub fn xid_fault(xid: u64) -> Option<String> {
    if APPLICATION_XIDS.contains(&xid) {
        return None;
    }
    let what = match xid {
        48 => "a double-bit ECC error",
        63 | 64 => "an ECC page retirement or row remapping event",
        74 => "an NVLink error",
        79 => "the GPU has fallen off the bus",
        92 => "a high single-bit ECC error rate",
        94 => "a contained ECC error",
        95 => "an uncontained ECC error",
        119 | 120 => "a GSP firmware error",
        _ => "a critical error",
    };
    Some(format!("NVML reported Xid {xid} ({what})"))
}

/// Watches `gpus` (UUID and CUDA ordinal) for critical Xid and double-bit ECC events on a
/// thread of its own, telling `sink` of each GPU a fault is reported for, for as long as
/// the sink lives. A GPU whose events NVML cannot deliver (some consumer GPUs) is logged and
/// left unwatched; without NVML the thread ends at once, saying so.
pub fn watch_nvml(gpus: Vec<(String, u32)>, sink: Weak<dyn GpuFaultSink>) {
    let spawned = std::thread::Builder::new()
        .name("gpu-faults".into())
        .spawn(move || {
            if let Err(error) = watch_until_error(&gpus, &sink) {
                tracing::warn!(%error, "GPU fault events stopped; faults are found when work fails");
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the GPU fault watcher");
    }
}

/// What a GPU NVML lost is taken out of service with.
const LOST: &str = "NVML lost the GPU: it has fallen off the bus or is otherwise inaccessible \
     (NVML_ERROR_GPU_IS_LOST)";

fn watch_until_error(
    gpus: &[(String, u32)],
    sink: &Weak<dyn GpuFaultSink>,
) -> Result<(), NvmlError> {
    let nvml = super::nvml::open_nvml()?;
    // GPUs NVML lost: taken out of service and left out of the next event set, so the
    // others are still watched.
    let mut lost: Vec<u32> = Vec::new();
    loop {
        let Some(set) = register(&nvml, gpus, &mut lost, sink)? else {
            return Ok(());
        };
        let watching: Vec<&(String, u32)> =
            gpus.iter().filter(|(_, i)| !lost.contains(i)).collect();
        match wait_for_faults(set, gpus, sink) {
            Err(NvmlError::GpuLost) => {
                let newly = lost_gpus(&nvml, &watching);
                if newly.is_empty() {
                    // NVML lost a GPU it cannot name: the watch cannot go on.
                    return Err(NvmlError::GpuLost);
                }
                for index in newly {
                    report(sink, index, LOST.to_owned());
                    lost.push(index);
                }
            }
            ended => return ended,
        }
    }
}

/// An event set over the fault events of `gpus` not `lost`, or `None` when none of them
/// delivers any. A GPU NVML cannot open is left out: a lost one is reported as a fault and
/// added to `lost`, any other logged.
fn register<'n>(
    nvml: &'n nvml_wrapper::Nvml,
    gpus: &[(String, u32)],
    lost: &mut Vec<u32>,
    sink: &Weak<dyn GpuFaultSink>,
) -> Result<Option<EventSet<'n>>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    let mut watched = Vec::new();
    for (uuid, index) in gpus {
        if lost.contains(index) {
            continue;
        }
        let device = match nvml.device_by_uuid(uuid.as_str()) {
            Ok(device) => device,
            Err(NvmlError::GpuLost) => {
                report(sink, *index, LOST.to_owned());
                lost.push(*index);
                continue;
            }
            Err(error) => {
                tracing::warn!(gpu = index, %error, "NVML cannot open this GPU: its faults are found when work fails");
                continue;
            }
        };
        // Registering an event the GPU cannot deliver would free the whole set.
        let events = device.supported_event_types()?
            & (EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR);
        if events.is_empty() {
            tracing::info!(gpu = index, "NVML delivers no fault events for this GPU");
            continue;
        }
        set = device
            .register_events(events, set)
            .map_err(|failed| failed.error)?;
        watched.push(*index);
    }
    if watched.is_empty() {
        return Ok(None);
    }
    tracing::info!(gpus = ?watched, "watching GPUs for critical Xid and ECC errors");
    Ok(Some(set))
}

/// Waits on `set`, telling `sink` of each fault, until the sink is gone (`Ok`) or NVML
/// fails (`GpuLost` when a GPU fell off the bus).
fn wait_for_faults(
    set: EventSet<'_>,
    gpus: &[(String, u32)],
    sink: &Weak<dyn GpuFaultSink>,
) -> Result<(), NvmlError> {
    let wait_ms = WAIT.as_millis() as u32;
    loop {
        let event = match set.wait(wait_ms) {
            Ok(event) => event,
            Err(NvmlError::Timeout) if sink.strong_count() > 0 => continue,
            Err(NvmlError::Timeout) => return Ok(()),
            Err(error) => return Err(error),
        };
        let Ok(uuid) = event.device.uuid() else {
            continue;
        };
        let Some((_, index)) = gpus.iter().find(|(known, _)| *known == uuid) else {
            continue;
        };
        let fault = match event.event_data {
            Some(XidError::Value(xid)) => xid_fault(xid),
            _ if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) => {
                Some("NVML reported a double-bit (uncorrectable) ECC error".to_owned())
            }
            _ => Some("NVML reported a critical Xid error".to_owned()),
        };
        match fault {
            Some(fault) if sink.strong_count() > 0 => report(sink, *index, fault),
            Some(_) => return Ok(()),
            None => {
                tracing::debug!(gpu = index, event = ?event.event_data, "an application's Xid: not the GPU's fault")
            }
        }
    }
}

/// Those of `gpus` NVML says it lost (their handle or UUID cannot be read any more).
fn lost_gpus(nvml: &nvml_wrapper::Nvml, gpus: &[&(String, u32)]) -> Vec<u32> {
    gpus.iter()
        .filter(|(uuid, _)| {
            matches!(
                nvml.device_by_uuid(uuid.as_str()).and_then(|d| d.uuid()),
                Err(NvmlError::GpuLost)
            )
        })
        .map(|(_, index)| *index)
        .collect()
}

/// Tells `sink`, if it still lives, of `fault` on GPU `index`.
fn report(sink: &Weak<dyn GpuFaultSink>, index: u32, fault: String) {
    if let Some(sink) = sink.upgrade() {
        sink.hardware_fault(index, fault);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_xids_are_faults_and_an_applications_are_not() {
        for xid in APPLICATION_XIDS {
            assert_eq!(xid_fault(xid), None, "Xid {xid}");
        }
        let fault = xid_fault(79).unwrap();
        assert!(
            fault.contains("Xid 79") && fault.contains("fallen off the bus"),
            "{fault}"
        );
        assert!(xid_fault(48).unwrap().contains("double-bit ECC"));
        assert!(
            xid_fault(12345)
                .unwrap()
                .contains("Xid 12345 (a critical error)")
        );
    }
}
