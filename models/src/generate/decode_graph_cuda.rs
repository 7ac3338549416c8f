//! The CUDA side of `decode_graph.rs`: per batch size, the static tensors a captured decode
//! step reads and writes, the capture, the replay, and the first replay's check against the
//! eager step. A `cuda` build only.
//!
//! Capture runs on the device's stream in thread-local mode, so other threads' CUDA calls
//! (another actor of the process) neither break it nor are refused. Everything the
//! captured forward allocates is freed inside it (candle's tensors are dropped before the
//! capture ends), so the graph keeps its own memory and replays without leaking.

use std::collections::HashMap;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use candle_core::cuda_backend::cudarc::driver::{CudaGraph, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp1, Layout, Tensor};

use super::decoder::{NextToken, Row};
use super::dense::{DenseKv, DenseLlama, HostInputs, StepInputs};
use super::kv_blocks::BLOCK_SIZE;
use super::step_profile::{Phase, PhaseClock};

/// What a graphed step gave.
pub enum Stepped {
    /// The step's answer, from the eager forward that preceded its batch size's capture.
    Captured(Vec<NextToken>),
    /// The step's answer, replayed.
    Replayed(Vec<NextToken>),
    /// The step's answer, from the eager forward, after a bucket's first replay disagreed
    /// with it (why, in words): graphs must be given up.
    Disagreed(Vec<NextToken>, String),
}

/// Why a graphed step failed.
pub enum GraphError {
    /// Capturing or replaying a graph failed: the eager step may still run.
    Capture(candle_core::Error),
    /// The step itself failed (out of blocks, a bad token): as the eager step would.
    Step(candle_core::Error),
}

/// The captured graphs of one cache, by batch size, the cache epoch they belong to, and the
/// logits buffer they all write (`rows x vocab`, rows the largest size captured): one
/// buffer, not one a size, since a model's logits are its largest activations (Qwen3's 152k
/// vocabulary at 512 rows: 155 MB in bf16).
#[derive(Default)]
pub struct Graphs {
    by_size: HashMap<usize, Captured>,
    epoch: u64,
    logits: Option<Tensor>,
}

/// One batch size's graph and the static tensors it reads and writes.
struct Captured {
    graph: CudaGraph,
    /// The inputs, overwritten before each replay.
    inputs: StepInputs,
    /// The paged layout's words (u32, `capacity` long): `inputs.layout` reads them.
    words: Tensor,
    capacity: usize,
    /// Whether a replay was checked against the eager step.
    checked: bool,
}

// SAFETY: a CUDA graph and its executable are not tied to the thread that made them; the
// driver asks only that calls on one graph be serialised, which holding `Captured` by value
// (in a cache that one step at a time uses, behind the kept cache's mutex) ensures.
#[allow(unsafe_code)]
unsafe impl Send for Captured {}

impl Graphs {
    /// The batch sizes captured, smallest first.
    pub fn buckets(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.by_size.keys().copied().collect();
        sizes.sort_unstable();
        sizes
    }

    /// One decode step of `rows` padded to `size` rows: replayed from the size's graph,
    /// captured first where there is none.
    pub fn step(
        &mut self,
        model: &DenseLlama,
        rows: &[Row],
        kv: &mut DenseKv,
        size: usize,
        clock: &mut PhaseClock,
    ) -> Result<Stepped, GraphError> {
        model.check_tokens(rows).map_err(GraphError::Step)?;
        kv.reserve_rows(rows).map_err(GraphError::Step)?;
        if kv.epoch() != self.epoch {
            // The cache's tensors moved: every graph reads the old ones.
            self.by_size.clear();
            self.epoch = kv.epoch();
        }
        let logits = match &self.logits {
            Some(logits) if logits.dim(0).map_err(GraphError::Step)? >= size => logits.clone(),
            _ => {
                // A larger buffer: every graph writes the old one.
                self.by_size.clear();
                let shape = (size, model.config.vocab);
                let logits = Tensor::zeros(shape, model.dtype, &model.device)
                    .map_err(GraphError::Capture)?;
                self.logits.insert(logits).clone()
            }
        };
        let host = model
            .host_inputs(rows, size - rows.len(), kv)
            .map_err(GraphError::Step)?;
        check_host_inputs(&host, kv).map_err(GraphError::Step)?;
        clock.lap(Phase::HostPrepare).map_err(GraphError::Step)?;
        let fits = |graph: &Captured| host.layout.words().len() <= graph.capacity;
        if !self.by_size.get(&size).is_some_and(fits) {
            self.by_size.remove(&size);
            let (captured, eager) =
                Captured::new(model, kv, host, &logits).map_err(GraphError::Capture)?;
            self.by_size.insert(size, captured);
            clock.lap(Phase::Forward).map_err(GraphError::Step)?;
            return answer(model, rows, &eager, clock).map(Stepped::Captured);
        }
        let graph = self.by_size.get_mut(&size).expect("captured above");
        graph.replay(&host).map_err(GraphError::Capture)?;
        clock.lap(Phase::Forward).map_err(GraphError::Step)?;
        if !graph.checked {
            graph.checked = true;
            let (eager, diff) = graph
                .against_eager(model, kv, &logits, rows.len())
                .map_err(GraphError::Capture)?;
            if let Some(why) = diff {
                let out = answer(model, rows, &eager, clock)?;
                return Ok(Stepped::Disagreed(out, why));
            }
        }
        answer(model, rows, &logits, clock).map(Stepped::Replayed)
    }
}

/// The rows' answers from the logits of the padded step (the first `rows.len()` rows).
fn answer(
    model: &DenseLlama,
    rows: &[Row],
    logits: &Tensor,
    clock: &mut PhaseClock,
) -> Result<Vec<NextToken>, GraphError> {
    let logits = logits.narrow(0, 0, rows.len()).map_err(GraphError::Step)?;
    let wanted: Vec<&Row> = rows.iter().collect();
    let out = model
        .next_tokens(&logits, &wanted)
        .map_err(GraphError::Step)?;
    clock.lap(Phase::LogitsToHost).map_err(GraphError::Step)?;
    Ok(out)
}

/// The checks the eager step's kernels get, for inputs a graph will read: every cache row
/// and table entry inside the cache.
fn check_host_inputs(host: &HostInputs, kv: &DenseKv) -> candle_core::Result<()> {
    let blocks = kv.cache_blocks();
    if let Some(row) = host
        .at
        .iter()
        .find(|&&row| row as usize >= blocks * BLOCK_SIZE)
    {
        candle_core::bail!("a KV write to row {row} of a cache of {blocks} blocks");
    }
    host.layout.check_tables(blocks)
}

impl Captured {
    /// Runs the step of `host` eagerly on fresh static tensors (its logits are the step's
    /// answer), then captures the same forward, writing its logits to the start of
    /// `logits`.
    fn new(
        model: &DenseLlama,
        kv: &DenseKv,
        host: HostInputs,
        logits: &Tensor,
    ) -> candle_core::Result<(Self, Tensor)> {
        let device = &model.device;
        let words = host.layout.words();
        // Room for the tables to grow (a block every 16 tokens a sequence) before a recapture.
        let capacity = 2 * words.len() + 64;
        let words_buffer = Tensor::zeros(capacity, DType::U32, device)?;
        overwrite(&words_buffer, words)?;
        let mut inputs = host.upload(device, model.config.kv_dim())?;
        inputs.layout = inputs.layout.with_device_words(words_buffer.clone());
        // Some of candle's ops upload small arrays from host memory they free on return (an
        // index_select uploads its ids' shape): captured, such a copy would read freed memory
        // at every replay (cuda-emu's trace caught the embedding's). With candle's upload
        // cache on, the eager run stores each array on the device once and the capture copies
        // from there. Only around these two runs: a cached upload is shared by every equal
        // one, and the static inputs above are overwritten in place.
        let _cached_uploads = device.as_cuda_device()?.enable_cuda_graph_htod_cache();
        let eager = logits_of(model, &inputs, kv)?;
        // The copy the capture ends with, run once first: every kernel the capture records
        // is loaded before it begins.
        logits.slice_set(&eager, 0, 0)?;
        let graph = capture(model, &inputs, kv, logits)?;
        let captured = Self {
            graph,
            inputs,
            words: words_buffer,
            capacity,
            checked: false,
        };
        Ok((captured, eager))
    }

    /// Copies `host` into the static inputs and replays the graph.
    fn replay(&mut self, host: &HostInputs) -> candle_core::Result<()> {
        overwrite(&self.inputs.ids, &host.ids)?;
        overwrite(&self.inputs.cos, &host.cos)?;
        overwrite(&self.inputs.sin, &host.sin)?;
        overwrite(self.inputs.at.index(), &host.at)?;
        overwrite(&self.words, host.layout.words())?;
        self.graph.launch().w()
    }

    /// The eager forward on the inputs the last replay read, and, where its first `rows`
    /// rows of logits disagree with the replay's (in `logits`), how far.
    fn against_eager(
        &self,
        model: &DenseLlama,
        kv: &DenseKv,
        logits: &Tensor,
        rows: usize,
    ) -> candle_core::Result<(Tensor, Option<String>)> {
        let replayed = logits.narrow(0, 0, rows)?.to_dtype(DType::F32)?;
        let eager = logits_of(model, &self.inputs, kv)?;
        let wanted = eager.narrow(0, 0, rows)?.to_dtype(DType::F32)?;
        let diff = (&replayed - &wanted)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        let scale = wanted.abs()?.max_all()?.to_scalar::<f32>()?;
        // The same kernels on the same inputs, but cuBLAS may pick another algorithm under
        // capture: rounding through every layer stays within a few percent of the scale,
        // where a stale input (a position, a table, a token) moves the logits by the scale.
        let why = (diff > 5e-2 * (1.0 + scale) || !diff.is_finite())
            .then(|| format!("logits differ by up to {diff} on a scale of {scale}"));
        Ok((eager, why))
    }
}

/// Every row's logits (`rows x vocab`, the model's dtype) from `inputs`.
fn logits_of(model: &DenseLlama, inputs: &StepInputs, kv: &DenseKv) -> candle_core::Result<Tensor> {
    let h = model.hidden_states(inputs, kv, &mut PhaseClock::off(&model.device))?;
    model.lm_head(&h)
}

/// The forward from `inputs` to `out`, captured (not run) on the device's stream.
fn capture(
    model: &DenseLlama,
    inputs: &StepInputs,
    kv: &DenseKv,
    out: &Tensor,
) -> candle_core::Result<CudaGraph> {
    let stream = model.device.as_cuda_device()?.cuda_stream();
    stream.synchronize().w()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .w()?;
    // Every tensor the forward makes is dropped inside the closure, before the capture
    // ends: their frees are the graph's own.
    let forward = (|| out.slice_set(&logits_of(model, inputs, kv)?, 0, 0))();
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    // A failed capture leaves its error in the context's record: cleared, as it is reported.
    let _ = stream.context().check_err();
    forward?;
    match ended.w()? {
        Some(graph) => {
            graph.upload().w()?;
            Ok(graph)
        }
        None => candle_core::bail!("the capture of a decode step recorded nothing"),
    }
}

/// Copies `values` to the start of `tensor` (on the GPU), in place.
fn overwrite<T: CudaDType + DeviceRepr>(tensor: &Tensor, values: &[T]) -> candle_core::Result<()> {
    tensor.inplace_op1(&Overwrite(values))
}

/// `tensor[..values.len()] = values`, from the host.
struct Overwrite<'a, T>(&'a [T]);

impl<T: CudaDType + DeviceRepr> InplaceOp1 for Overwrite<'_, T> {
    fn name(&self) -> &'static str {
        "resident-overwrite"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("static graph inputs live on the GPU")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let (start, len) = (layout.start_offset(), self.0.len());
        if !layout.is_contiguous() || len > layout.shape().elem_count() {
            candle_core::bail!(
                "{len} values do not fit a static input of {:?}",
                layout.shape()
            );
        }
        let stream = storage.device().cuda_stream();
        let slice = storage.as_cuda_slice_mut::<T>()?;
        let mut into = slice.slice_mut(start..start + len);
        stream.memcpy_htod(self.0, &mut into).w()
    }
}
