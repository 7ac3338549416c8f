//! GPUs that fail while the agent runs. An Xid fault, an uncorrectable ECC error or a
//! kernel's bad memory access leaves a GPU's CUDA context failed for good ("sticky": every
//! later call on it returns the same error, until the process ends). Left alone, the agent
//! would keep offering that GPU: each actor started there would fail its load, each task
//! sent there would spend an attempt, and a job could fail on one bad GPU of a healthy
//! host. So when an actor on GPUs fails (its load, or a task), its thread asks
//! [`GpuHealth::check_after_failure`]: each of its GPUs whose context fails twice in a row
//! is taken out of service in this process, once, and the scheduler is told
//! (`GpuFailed`, before the failed outcome). A fault the driver reports through NVML (a
//! critical Xid, an uncorrectable ECC error: `xid.rs`) takes the GPU out of service the same
//! way, at once, failed context or not (`GpuFaultSink::hardware_fault`). From then on the GPU
//! is listed as unavailable in registrations, left out of heartbeats, and an actor started
//! on it is refused.
//!
//! A failed GPU comes back only with a new agent process: [`RestartAfterGpuFailure`] says
//! when the agent drains and exits for its service manager to start it again.
//!
//! For tests without a GPU, [`FAIL_SIMULATED_GPU_ENV`] makes a simulated GPU fail after a
//! number of tasks, as a real one does under cuda-emu's `CUDA_EMU_FAULT_AFTER_LAUNCHES`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use resident_proto::pb;
use tokio_util::sync::CancellationToken;

use super::probe::{GpuFaultSink, GpuProbe};
use super::restart::RestartAfterGpuFailure;
use crate::uplink::ToScheduler;

/// Fault injection, for testing how a job survives a GPU that fails under it: with
/// `--simulate-gpus` and this variable set to `GPU:TASKS` (`1:3`), simulated GPU `GPU`
/// fails during the `TASKS`th task its actors run (that task fails as a GPU's would), or
/// during the first load there with `TASKS` 0, and its context stays failed.
pub const FAIL_SIMULATED_GPU_ENV: &str = "RESIDENT_FAULT_FAIL_SIMULATED_GPU";

/// What a GPU the driver reported a fault of is listed with, after the fault.
const HARDWARE_WHAT_TO_DO: &str = "the driver reported it while the agent ran, so nothing \
     more runs on this GPU in this agent process (its results could be wrong). Check \
     `nvidia-smi -q -d ECC` and the kernel log (`dmesg | grep -i xid`), then restart the \
     agent to use it again";

/// What a GPU taken out of service is listed with, after the driver's error.
const WHAT_TO_DO: &str = "its CUDA context failed while the agent ran and stays failed (an Xid \
     fault, an uncorrectable ECC error, or a kernel's bad memory access): nothing more runs \
     on it in this agent process. Check `nvidia-smi -q -d ECC` and the kernel log (`dmesg | \
     grep -i xid`), then restart the agent to use it again";

/// A simulated GPU set to fail ([`FAIL_SIMULATED_GPU_ENV`]).
#[derive(Debug)]
struct InjectedFailure {
    gpu: u32,
    after_tasks: u64,
    /// `GPU:TASKS:XID`: the driver reports Xid `XID` during that task, which itself
    /// succeeds (the context does not fail), as after an uncorrectable ECC error.
    xid: Option<u64>,
    tasks: AtomicU64,
}

impl InjectedFailure {
    fn parse(spec: &str) -> Result<Self, String> {
        let parts: Vec<&str> = spec.split(':').map(str::trim).collect();
        let parsed = match parts[..] {
            [gpu, tasks] => Some((gpu.parse().ok(), tasks.parse().ok(), None)),
            [gpu, tasks, xid] => Some((gpu.parse().ok(), tasks.parse().ok(), xid.parse().ok())),
            _ => None,
        };
        match parsed {
            Some((Some(gpu), Some(after_tasks), xid)) if parts.len() == 2 || xid.is_some() => {
                Ok(Self {
                    gpu,
                    after_tasks,
                    xid,
                    tasks: AtomicU64::new(0),
                })
            }
            _ => Err(format!(
                "{FAIL_SIMULATED_GPU_ENV}={spec:?} is not GPU:TASKS or GPU:TASKS:XID (`1:3`: \
                 simulated GPU 1 fails during its actors' third task; `1:0`: during its first \
                 load; `1:3:48`: the driver reports Xid 48 during that task)"
            )),
        }
    }

    /// Whether GPU `gpu` is the one set to fail, and its context has failed.
    fn tripped(&self, gpu: u32) -> bool {
        self.xid.is_none()
            && gpu == self.gpu
            && self.tasks.load(Ordering::Relaxed) >= self.after_tasks
    }

    /// The error its GPU's work fails with.
    fn error(&self) -> String {
        format!(
            "simulated GPU {} failed ({FAIL_SIMULATED_GPU_ENV}): CUDA_ERROR_ILLEGAL_ADDRESS",
            self.gpu
        )
    }
}

impl GpuFaultSink for GpuHealth {
    /// The driver reported `fault` of GPU `gpu` (`xid.rs`): it is taken out of service now,
    /// whether or not its context failed, unless it is out already or was never offered.
    fn hardware_fault(&self, gpu: u32, fault: String) {
        if !self.offered.contains(&gpu) {
            tracing::debug!(gpu, %fault, "a fault of a GPU this agent does not offer");
            return;
        }
        self.take_out_of_service(gpu, &fault, HARDWARE_WHAT_TO_DO);
    }
}

/// The GPUs of this agent that failed while it ran, and how to find out (module docs).
pub struct GpuHealth {
    probe: std::sync::Arc<dyn GpuProbe>,
    injected: Option<InjectedFailure>,
    failed: Mutex<BTreeMap<u32, String>>,
    outbound: ToScheduler,
    /// The GPUs offered at start: those the restart policy counts.
    offered: BTreeSet<u32>,
    restart: RestartAfterGpuFailure,
    /// Cancelled when the restart policy says the agent restarts: the session drains and
    /// ends.
    stop: CancellationToken,
    /// Why the agent restarts, once it does.
    restart_reason: OnceLock<String>,
}

impl GpuHealth {
    /// Checks `probe`'s GPUs, telling the scheduler on `outbound`. With simulated GPUs,
    /// [`FAIL_SIMULATED_GPU_ENV`] is read here; a malformed value is an error.
    pub fn new(probe: std::sync::Arc<dyn GpuProbe>, outbound: ToScheduler) -> Result<Self, String> {
        let injected = std::env::var(FAIL_SIMULATED_GPU_ENV).ok();
        Self::with_injected_failure(probe, outbound, injected.as_deref())
    }

    /// [`GpuHealth::new`] with `injected` as the value of [`FAIL_SIMULATED_GPU_ENV`].
    pub(crate) fn with_injected_failure(
        probe: std::sync::Arc<dyn GpuProbe>,
        outbound: ToScheduler,
        injected: Option<&str>,
    ) -> Result<Self, String> {
        let injected = match injected {
            Some(spec) if probe.simulated() => Some(InjectedFailure::parse(spec)?),
            Some(_) => {
                tracing::warn!(
                    "{FAIL_SIMULATED_GPU_ENV} is set without --simulate-gpus: ignored (on real \
                     GPUs, cuda-emu's CUDA_EMU_FAULT_AFTER_LAUNCHES injects a GPU failure)"
                );
                None
            }
            None => None,
        };
        let offered = probe.gpus().iter().map(|gpu| gpu.index).collect();
        Ok(Self {
            probe,
            injected,
            failed: Mutex::new(BTreeMap::new()),
            outbound,
            offered,
            restart: RestartAfterGpuFailure::Never,
            stop: CancellationToken::new(),
            restart_reason: OnceLock::new(),
        })
    }

    /// Restarts the agent as `policy` says: cancels `stop` once it is due.
    pub fn restart_when(mut self, policy: RestartAfterGpuFailure, stop: CancellationToken) -> Self {
        self.restart = policy;
        self.stop = stop;
        self
    }

    /// Why the agent drains and exits to be started again, once its GPUs' failures made the
    /// restart policy say so.
    pub fn restart_reason(&self) -> Option<&str> {
        self.restart_reason.get().map(String::as_str)
    }

    /// True when the GPUs are simulated: the work itself runs on CPU.
    pub fn simulated(&self) -> bool {
        self.probe.simulated()
    }

    /// Why GPU `gpu` was taken out of service, if it was.
    pub fn failure(&self, gpu: u32) -> Option<String> {
        self.failed.lock().expect("failed GPUs").get(&gpu).cloned()
    }

    /// The GPUs taken out of service, as registrations list them.
    pub fn failed(&self) -> Vec<pb::UnavailableGpu> {
        let failed = self.failed.lock().expect("failed GPUs");
        failed
            .iter()
            .map(|(index, reason)| pb::UnavailableGpu {
                index: *index,
                reason: reason.clone(),
            })
            .collect()
    }

    /// `gpus` less those taken out of service.
    pub fn in_service(&self, mut gpus: Vec<pb::GpuInfo>) -> Vec<pb::GpuInfo> {
        let failed = self.failed.lock().expect("failed GPUs");
        gpus.retain(|gpu| !failed.contains_key(&gpu.index));
        gpus
    }

    /// A task of an actor on `gpus` ends: where an injected failure trips now, or has
    /// tripped, the error the task fails with (its GPU's context is gone).
    pub fn injected_task_failure(&self, gpus: &[u32]) -> Option<String> {
        let injected = self.injected.as_ref()?;
        if !gpus.contains(&injected.gpu) {
            return None;
        }
        let task = injected.tasks.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(xid) = injected.xid {
            if task == injected.after_tasks
                && let Some(fault) = super::xid::xid_fault(xid)
            {
                self.hardware_fault(injected.gpu, format!("simulated: {fault}"));
            }
            return None;
        }
        injected.tripped(injected.gpu).then(|| injected.error())
    }

    /// An actor on `gpus` loads: where an injected failure fails its GPU during loads
    /// (`GPU:0`), the error the load fails with.
    pub fn injected_load_failure(&self, gpus: &[u32]) -> Option<String> {
        let injected = self.injected.as_ref()?;
        (injected.xid.is_none() && injected.after_tasks == 0 && gpus.contains(&injected.gpu))
            .then(|| injected.error())
    }

    /// An actor on `gpus` failed (its load or a task): the first of them that is out of
    /// service, found now or before, with why. A GPU found failed now is taken out of
    /// service and the scheduler told, before the caller reports the failure.
    pub fn check_after_failure(&self, gpus: &[u32]) -> Option<(u32, String)> {
        for &gpu in gpus {
            if let Some(reason) = self.failure(gpu) {
                return Some((gpu, reason));
            }
            let Some(error) = self.context_failure(gpu) else {
                continue;
            };
            return Some((gpu, self.take_out_of_service(gpu, &error, WHAT_TO_DO)));
        }
        None
    }

    /// Takes GPU `gpu` out of service for `error` (once: the scheduler is told, and the
    /// restart policy asked) and returns why it is out: this reason, or the first one.
    fn take_out_of_service(&self, gpu: u32, error: &str, what_to_do: &str) -> String {
        let reason = format!("{error}: {what_to_do}");
        let mut failed = self.failed.lock().expect("failed GPUs");
        if let Some(first) = failed.get(&gpu) {
            // Another check took it out of service meanwhile.
            return first.clone();
        }
        failed.insert(gpu, reason.clone());
        tracing::error!(gpu, %error, "GPU failed: taken out of service; the scheduler places its actors elsewhere");
        let _ = self.outbound.send(pb::AgentMessage {
            body: Some(pb::agent_message::Body::GpuFailed(pb::GpuFailed {
                gpu: Some(pb::UnavailableGpu {
                    index: gpu,
                    reason: reason.clone(),
                }),
            })),
        });
        self.restart_if_due(&failed, gpu, error);
        reason
    }

    /// GPU `gpu` failed with `error`, leaving `failed` out of service: where the restart
    /// policy says so, the agent drains and exits (once).
    fn restart_if_due(&self, failed: &BTreeMap<u32, String>, gpu: u32, error: &str) {
        if !self.restart.restart_due(&self.offered, failed) {
            return;
        }
        let which = match self.restart {
            RestartAfterGpuFailure::All if self.offered.len() > 1 => "every GPU it offered",
            RestartAfterGpuFailure::All => "its GPU",
            _ => "a GPU",
        };
        let gpus: Vec<String> = failed.keys().map(u32::to_string).collect();
        let gpus = match gpus.len() {
            1 => format!("GPU {}", gpus[0]),
            _ => format!("GPUs {}", gpus.join(", ")),
        };
        let reason = format!(
            "this agent restarts: {which} failed while it ran ({gpus}; the last, GPU {gpu}: \
             {error}), and a failed CUDA context comes back only in a new process. It drained \
             and exited for its service manager (Kubernetes, systemd's Restart=always) to start \
             it again; if a GPU still fails, check `nvidia-smi -q -d ECC` and `dmesg | grep -i \
             xid` (--restart-after-gpu-failure {}; `never` keeps the agent running without \
             them)",
            self.restart.as_flag()
        );
        if self.restart_reason.set(reason.clone()).is_ok() {
            tracing::error!(%reason, "draining, then exiting to be restarted");
            self.stop.cancel();
        }
    }

    /// The driver's error where GPU `gpu`'s context has failed for good, else `None`.
    fn context_failure(&self, gpu: u32) -> Option<String> {
        match &self.injected {
            Some(injected) if injected.tripped(gpu) => Some(injected.error()),
            _ => self.probe.context_failure(gpu),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::mpsc;

    use super::*;

    /// GPUs whose contexts fail as `failing` says.
    struct Probe {
        failing: Vec<u32>,
    }

    impl GpuProbe for Probe {
        fn gpus(&self) -> Vec<pb::GpuInfo> {
            (0..4)
                .map(|index| pb::GpuInfo {
                    index,
                    ..Default::default()
                })
                .collect()
        }

        fn simulated(&self) -> bool {
            false
        }

        fn context_failure(&self, gpu: u32) -> Option<String> {
            self.failing.contains(&gpu).then(|| {
                "an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS)".into()
            })
        }
    }

    fn health(failing: Vec<u32>) -> (GpuHealth, mpsc::UnboundedReceiver<pb::AgentMessage>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let probe = Arc::new(Probe { failing });
        (GpuHealth::new(probe, tx).unwrap(), rx)
    }

    /// A failed context takes its GPU out of service once: the scheduler hears of it once,
    /// with the driver's error and what to do, and the GPU leaves the heartbeats' list.
    #[test]
    fn a_failed_gpu_is_taken_out_of_service_once_and_the_scheduler_told() {
        let (health, mut rx) = health(vec![2]);
        assert_eq!(
            health.check_after_failure(&[0, 1]),
            None,
            "healthy GPUs stay"
        );
        assert!(rx.try_recv().is_err());
        let (gpu, reason) = health.check_after_failure(&[1, 2]).expect("GPU 2 failed");
        assert_eq!(gpu, 2);
        assert!(
            reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && reason.contains("restart the agent")
        );
        assert!(
            reason.len() <= 512,
            "within the scheduler's limit: {}",
            reason.len()
        );
        let Some(pb::agent_message::Body::GpuFailed(told)) = rx.try_recv().unwrap().body else {
            panic!("the scheduler is told first");
        };
        assert_eq!(told.gpu.unwrap().index, 2);
        assert_eq!(
            health.check_after_failure(&[2]).map(|(gpu, _)| gpu),
            Some(2)
        );
        assert!(rx.try_recv().is_err(), "told once");
        let offered: Vec<u32> = health
            .in_service(Probe { failing: vec![] }.gpus())
            .iter()
            .map(|g| g.index)
            .collect();
        assert_eq!(offered, [0, 1, 3]);
        assert_eq!(health.failed().len(), 1);
        assert!(health.failure(2).is_some() && health.failure(1).is_none());
    }

    /// The agent restarts once its restart policy is due, and not before: `all` after the
    /// last of its four GPUs, `any` at the first; with why and what to check.
    #[test]
    fn the_restart_policy_stops_the_agent_once_it_is_due() {
        let stopped = |policy| {
            let (tx, _rx) = mpsc::unbounded_channel();
            let stop = CancellationToken::new();
            let probe = Arc::new(Probe {
                failing: vec![0, 1, 2, 3],
            });
            let health = GpuHealth::new(probe, tx)
                .unwrap()
                .restart_when(policy, stop.clone());
            let mut failures = 0;
            while !stop.is_cancelled() && failures < 4 {
                assert!(health.restart_reason().is_none());
                health.check_after_failure(&[failures]);
                failures += 1;
            }
            (failures, health.restart_reason().map(str::to_owned))
        };
        let (failures, reason) = stopped(RestartAfterGpuFailure::All);
        assert_eq!(failures, 4);
        let reason = reason.expect("stopped after the last GPU");
        for part in [
            "every GPU it offered failed",
            "GPUs 0, 1, 2, 3",
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "--restart-after-gpu-failure all",
        ] {
            assert!(reason.contains(part), "{part}: {reason}");
        }
        let (failures, reason) = stopped(RestartAfterGpuFailure::Any);
        assert_eq!(failures, 1);
        assert!(
            reason
                .unwrap()
                .contains("a GPU failed while it ran (GPU 0;")
        );
        let (failures, reason) = stopped(RestartAfterGpuFailure::Never);
        assert_eq!((failures, reason), (4, None));
    }

    /// A fault the driver reports takes its GPU out of service at once, with the fault and
    /// what to do, though its context works; once, and only for a GPU the agent offers.
    #[test]
    fn a_reported_hardware_fault_takes_an_offered_gpu_out_once() {
        let (health, mut rx) = health(vec![]);
        health.hardware_fault(7, "NVML reported Xid 79".into());
        assert!(rx.try_recv().is_err(), "GPU 7 is not offered");
        let fault = crate::gpu::xid_fault(48).unwrap();
        health.hardware_fault(2, fault.clone());
        let Some(pb::agent_message::Body::GpuFailed(told)) = rx.try_recv().unwrap().body else {
            panic!("the scheduler is told");
        };
        let told = told.gpu.unwrap();
        assert_eq!(told.index, 2);
        assert!(
            told.reason.starts_with(&fault) && told.reason.contains("could be wrong"),
            "{}",
            told.reason
        );
        assert!(told.reason.len() <= 512, "{}", told.reason.len());
        health.hardware_fault(2, fault);
        assert!(rx.try_recv().is_err(), "told once");
        assert_eq!(
            health.check_after_failure(&[2]).map(|(gpu, _)| gpu),
            Some(2),
            "an actor's failure there is the GPU's"
        );
    }

    /// `GPU:TASKS:XID`: the driver reports the Xid during that task, which succeeds; an
    /// application's Xid reports nothing.
    #[test]
    fn an_injected_xid_reports_a_fault_and_fails_no_task() {
        let simulated = || Arc::new(crate::gpu::SimulatedGpus::parse("T4:16GiB x2").unwrap());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let health = GpuHealth::with_injected_failure(simulated(), tx, Some("1:2:79")).unwrap();
        assert_eq!(health.injected_load_failure(&[1]), None);
        assert_eq!(health.injected_task_failure(&[1]), None);
        assert!(rx.try_recv().is_err());
        assert_eq!(
            health.injected_task_failure(&[1]),
            None,
            "the task succeeds"
        );
        let Some(pb::agent_message::Body::GpuFailed(told)) = rx.try_recv().unwrap().body else {
            panic!("the fault is reported");
        };
        assert!(told.gpu.unwrap().reason.contains("Xid 79"));
        assert_eq!(health.check_after_failure(&[0]), None, "GPU 0 is well");

        let (tx, mut rx) = mpsc::unbounded_channel();
        let health = GpuHealth::with_injected_failure(simulated(), tx, Some("1:1:13")).unwrap();
        assert_eq!(health.injected_task_failure(&[1]), None);
        assert!(rx.try_recv().is_err(), "Xid 13 is the application's");
        assert!(health.failure(1).is_none());
        for wrong in ["1:2:", "1:2:x", "1:2:3:4"] {
            let error = InjectedFailure::parse(wrong).unwrap_err();
            assert!(error.contains("GPU:TASKS:XID"), "{error}");
        }
    }

    #[test]
    fn an_injected_failure_trips_on_its_task_and_stays() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let simulated = crate::gpu::SimulatedGpus::parse("T4:16GiB x2").unwrap();
        let health =
            GpuHealth::with_injected_failure(Arc::new(simulated), tx, Some("1:3")).unwrap();
        assert_eq!(
            health.injected_task_failure(&[0]),
            None,
            "another GPU's tasks count not"
        );
        assert_eq!(health.injected_task_failure(&[1]), None);
        assert_eq!(health.injected_task_failure(&[1]), None);
        assert!(
            health
                .injected_task_failure(&[1])
                .unwrap()
                .contains("simulated GPU 1 failed")
        );
        assert!(
            health.injected_task_failure(&[1]).is_some(),
            "and stays failed"
        );
        assert_eq!(
            health.check_after_failure(&[0, 1]).map(|(gpu, _)| gpu),
            Some(1)
        );
        assert_eq!(health.injected_load_failure(&[1]), None, "tasks, not loads");
        for wrong in ["1", "x:3", "1:-2", "1:"] {
            let error = InjectedFailure::parse(wrong).unwrap_err();
            assert!(error.contains("GPU:TASKS"), "{error}");
        }
    }
}
