//! Where a generation step's time goes: wall time per phase of the engine's step (host
//! preparation, each kernel family of the dense model, the logits' trip to the host,
//! sampling), summed over a run, for decode-only steps and steps that also prefill apart.
//!
//! Off by default and free when off. On a GPU the kernels run asynchronously, so a profile
//! that attributes their time synchronises the device at every phase boundary
//! ([`StepProfile::new`]'s `synchronise`): the phases then add up to the step, at the cost
//! of a few microseconds per boundary (the profiled run is slower than an unprofiled one;
//! benches print both). `generate-bench --profile` prints the table.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use candle_core::Device;

/// A part of one step, in the order a step runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Batcher plan, rows, and the step's small tensors (ids, rotations, cache indices,
    /// attention masks) made on the host and uploaded.
    HostPrepare,
    /// The token embedding lookup.
    Embed,
    /// RMSNorm before attention and before the MLP, and the final norm.
    Norms,
    /// The query, key and value projections (with biases).
    QkvProjection,
    /// Per-head norms (Qwen3), RoPE and the head layout copies.
    HeadsAndRope,
    /// Keys and values written into the cache.
    KvWrite,
    /// Attention: the cache gathered, scores, softmax, weighted values.
    Attention,
    /// The output projection and the residual add.
    OutProjection,
    /// Gate, up, SiLU, product, down projection and the residual add.
    Mlp,
    /// The rows that want logits picked, and the LM head.
    LmHead,
    /// The logits converted to f32 and copied to the host.
    LogitsToHost,
    /// The whole forward pass of an engine without a per-family breakdown (the quantised CPU
    /// kernels; a decode step replayed from a CUDA graph, inputs' upload included).
    Forward,
    /// Penalties, masks, sampling, logprobs, stop checks and the sequences' bookkeeping, on
    /// the host.
    SampleAndStop,
}

impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 13] = [
        Phase::HostPrepare,
        Phase::Embed,
        Phase::Norms,
        Phase::QkvProjection,
        Phase::HeadsAndRope,
        Phase::KvWrite,
        Phase::Attention,
        Phase::OutProjection,
        Phase::Mlp,
        Phase::LmHead,
        Phase::LogitsToHost,
        Phase::Forward,
        Phase::SampleAndStop,
    ];

    /// What the table calls it.
    pub fn label(self) -> &'static str {
        match self {
            Phase::HostPrepare => "host preparation and uploads",
            Phase::Embed => "embedding lookup",
            Phase::Norms => "RMSNorm",
            Phase::QkvProjection => "QKV projections",
            Phase::HeadsAndRope => "head norms, RoPE, layout copies",
            Phase::KvWrite => "KV cache writes",
            Phase::Attention => "attention (gather, scores, softmax, values)",
            Phase::OutProjection => "output projection + residual",
            Phase::Mlp => "MLP (gate, up, SiLU, down) + residual",
            Phase::LmHead => "LM head",
            Phase::LogitsToHost => "logits to the host (f32)",
            Phase::Forward => "forward (no breakdown: CPU kernels, CUDA graph)",
            Phase::SampleAndStop => "sampling, stops, bookkeeping (host)",
        }
    }
}

/// Whether a step only decoded (one row per sequence) or also prefilled prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// One row per sequence in flight.
    Decode,
    /// Some sequence prefilled prompt tokens.
    WithPrefill,
}

/// Totals of one kind of step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTotals {
    /// Steps of this kind.
    pub steps: u64,
    /// Rows (tokens) run.
    pub rows: u64,
    /// Wall time per phase, in [`Phase::ALL`]'s order.
    pub phases: [Duration; Phase::ALL.len()],
}

impl StepTotals {
    /// All phases together.
    pub fn total(&self) -> Duration {
        self.phases.iter().sum()
    }

    /// One phase's time.
    pub fn phase(&self, phase: Phase) -> Duration {
        self.phases[Self::index(phase)]
    }

    fn index(phase: Phase) -> usize {
        Phase::ALL
            .iter()
            .position(|&p| p == phase)
            .expect("every phase is in ALL")
    }
}

/// A run's step profile (shared by reference; interior mutability, as the engine's forward
/// takes `&self`).
#[derive(Debug)]
pub struct StepProfile {
    synchronise: bool,
    totals: Mutex<[StepTotals; 2]>,
    /// Sequences preempted for want of KV blocks.
    preemptions: AtomicU64,
    /// Positions sequences took from the prefix cache instead of computing them.
    shared_positions: AtomicU64,
}

impl StepProfile {
    /// A profile; `synchronise` waits for the device at every phase boundary (needed on a
    /// GPU for the kernel families' times to mean anything).
    pub fn new(synchronise: bool) -> Self {
        Self {
            synchronise,
            totals: Mutex::new(Default::default()),
            preemptions: AtomicU64::new(0),
            shared_positions: AtomicU64::new(0),
        }
    }

    /// Counts a sequence preempted for want of KV blocks.
    pub fn count_preemption(&self) {
        self.preemptions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `positions` a sequence took from the prefix cache.
    pub fn count_shared(&self, positions: usize) {
        self.shared_positions
            .fetch_add(positions as u64, Ordering::Relaxed);
    }

    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions.load(Ordering::Relaxed)
    }

    /// Positions taken from the prefix cache so far.
    pub fn shared_positions(&self) -> u64 {
        self.shared_positions.load(Ordering::Relaxed)
    }

    /// Counts one step of `kind` with `rows` rows.
    pub fn count_step(&self, kind: StepKind, rows: usize) {
        let mut totals = self.totals.lock().expect("step profile lock");
        let totals = &mut totals[kind as usize];
        totals.steps += 1;
        totals.rows += rows as u64;
    }

    /// Adds `spent` to `phase` of the steps of `kind`.
    pub fn add(&self, kind: StepKind, phase: Phase, spent: Duration) {
        let mut totals = self.totals.lock().expect("step profile lock");
        totals[kind as usize].phases[StepTotals::index(phase)] += spent;
    }

    /// The totals of the steps of `kind` so far.
    pub fn totals(&self, kind: StepKind) -> StepTotals {
        self.totals.lock().expect("step profile lock")[kind as usize].clone()
    }

    /// Starts timing a step of `kind` on `device`.
    pub fn clock<'a>(&'a self, kind: StepKind, device: &'a Device) -> PhaseClock<'a> {
        PhaseClock {
            profile: Some(self),
            kind,
            device,
            last: Instant::now(),
        }
    }

    /// A markdown table of both kinds of step: milliseconds per step and share per phase.
    /// Phases that took no time in either kind are left out.
    pub fn table(&self) -> String {
        let (decode, prefill) = (
            self.totals(StepKind::Decode),
            self.totals(StepKind::WithPrefill),
        );
        let per_step = |t: &StepTotals, phase: Option<Phase>| -> (f64, f64) {
            let spent = phase.map_or_else(|| t.total(), |p| t.phase(p));
            let total = t.total().as_secs_f64();
            let ms = match t.steps {
                0 => 0.0,
                n => spent.as_secs_f64() * 1e3 / n as f64,
            };
            let share = match total > 0.0 {
                true => 100.0 * spent.as_secs_f64() / total,
                false => 0.0,
            };
            (ms, share)
        };
        let mut out = String::new();
        out.push_str(&format!(
            "| phase | decode steps: ms/step | share | steps with prefill: ms/step | share |\n|---|---:|---:|---:|---:|\n| steps (rows per step) | {} ({:.0}) | | {} ({:.0}) | |\n",
            decode.steps,
            decode.rows as f64 / decode.steps.max(1) as f64,
            prefill.steps,
            prefill.rows as f64 / prefill.steps.max(1) as f64,
        ));
        for phase in Phase::ALL {
            if decode.phase(phase).is_zero() && prefill.phase(phase).is_zero() {
                continue;
            }
            let (d, ds) = per_step(&decode, Some(phase));
            let (p, ps) = per_step(&prefill, Some(phase));
            out.push_str(&format!(
                "| {} | {d:.3} | {ds:.1}% | {p:.3} | {ps:.1}% |\n",
                phase.label()
            ));
        }
        let (d, _) = per_step(&decode, None);
        let (p, _) = per_step(&prefill, None);
        out.push_str(&format!("| **step** | **{d:.3}** | | **{p:.3}** | |\n"));
        out.push_str(&format!(
            "\nKV cache: {} prompt positions taken from the prefix cache, {} sequences \
             preempted (computed again)\n",
            self.shared_positions(),
            self.preemptions()
        ));
        out
    }
}

/// Times the phases of one step: each [`PhaseClock::lap`] charges the time since the last
/// lap to a phase. A clock without a profile does nothing.
pub struct PhaseClock<'a> {
    profile: Option<&'a StepProfile>,
    kind: StepKind,
    device: &'a Device,
    last: Instant,
}

impl<'a> PhaseClock<'a> {
    /// A clock that records nothing (no profile asked for).
    pub fn off(device: &'a Device) -> Self {
        Self {
            profile: None,
            kind: StepKind::Decode,
            device,
            last: Instant::now(),
        }
    }

    /// Charges the time since the last lap (or the start) to `phase`, after waiting for the
    /// device when the profile synchronises.
    pub fn lap(&mut self, phase: Phase) -> candle_core::Result<()> {
        let Some(profile) = self.profile else {
            return Ok(());
        };
        if profile.synchronise {
            self.device.synchronize()?;
        }
        let now = Instant::now();
        profile.add(self.kind, phase, now - self.last);
        self.last = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_by_phase_and_kind() {
        let profile = StepProfile::new(true);
        profile.count_step(StepKind::Decode, 4);
        profile.count_step(StepKind::Decode, 4);
        profile.add(StepKind::Decode, Phase::Mlp, Duration::from_millis(3));
        profile.add(StepKind::Decode, Phase::Mlp, Duration::from_millis(1));
        profile.add(StepKind::Decode, Phase::Attention, Duration::from_millis(4));
        profile.add(
            StepKind::WithPrefill,
            Phase::Attention,
            Duration::from_millis(9),
        );
        let decode = profile.totals(StepKind::Decode);
        assert_eq!((decode.steps, decode.rows), (2, 8));
        assert_eq!(decode.phase(Phase::Mlp), Duration::from_millis(4));
        assert_eq!(decode.total(), Duration::from_millis(8));
        let table = profile.table();
        // 4 ms of MLP over 2 decode steps: 2 ms a step, half the decode time.
        assert!(
            table.contains(
                "| MLP (gate, up, SiLU, down) + residual | 2.000 | 50.0% | 0.000 | 0.0% |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| **step** | **4.000** | | **0.000** | |"),
            "{table}"
        );
        assert!(
            !table.contains("LM head"),
            "phases never timed are left out: {table}"
        );
    }

    #[test]
    fn a_clock_charges_the_time_between_laps_on_the_cpu() {
        let profile = StepProfile::new(true);
        let mut clock = profile.clock(StepKind::WithPrefill, &Device::Cpu);
        std::thread::sleep(Duration::from_millis(5));
        clock.lap(Phase::HostPrepare).unwrap();
        clock.lap(Phase::Embed).unwrap();
        let totals = profile.totals(StepKind::WithPrefill);
        assert!(totals.phase(Phase::HostPrepare) >= Duration::from_millis(5));
        assert!(totals.phase(Phase::Embed) < Duration::from_millis(5));
        let mut off = PhaseClock::off(&Device::Cpu);
        off.lap(Phase::Mlp).unwrap();
        assert!(profile.totals(StepKind::Decode).total().is_zero());
    }
}
