//! The untyped contract of an actor kind: [`ActorKind`] loads a [`ModelBackend`], which runs
//! chunk after chunk on the actor's thread; [`LoadContext`] is what a load is given. A leaf:
//! the kinds (`echo.rs`, `embed.rs`, ...) implement it and `mod.rs` registers them.

use std::sync::Arc;

use resident_models::roots::FileRoots;
use resident_proto::ActorId;

use super::progress::TaskProgress;
use crate::error::BackendError;
use crate::model_cache::ModelCache;

/// Where an actor runs, as the scheduler assigned it.
#[derive(Clone, Debug, Default)]
pub struct DeviceAssignment {
    /// The node's GPUs the actor may use (by index); empty for CPU actors.
    pub gpu_indices: Vec<u32>,
    /// Share of each GPU (0.25, 1.0); 0 for CPU-only actors.
    pub gpu_fraction: f64,
    /// The VRAM the actor asked for on each GPU, in bytes.
    pub vram_bytes: u64,
    /// The node's GPUs are simulated: run on CPU whatever the assignment says.
    pub simulated: bool,
}

impl DeviceAssignment {
    /// The first assigned GPU the model should really run on: `None` for CPU actors and on
    /// nodes whose GPUs are simulated.
    pub fn real_gpu(&self) -> Option<u32> {
        self.gpu_indices
            .first()
            .copied()
            .filter(|_| !self.simulated)
    }
}

/// Everything a kind gets when one of its actors loads.
#[derive(Clone, Debug)]
pub struct LoadContext {
    /// The actor being loaded.
    pub actor_id: ActorId,
    /// The pool's `actor_config`, JSON (empty when the pool gave none).
    pub config: Vec<u8>,
    /// Where it runs.
    pub device: DeviceAssignment,
    /// Where the actor may read model files and datasets named by clients.
    pub roots: FileRoots,
    /// Fetches remote models (`s3://`, Hugging Face ids) to a local directory, once per node.
    pub models: Arc<ModelCache>,
    /// How far the running task got, for kinds that work through a chunk in steps.
    pub progress: TaskProgress,
}

impl LoadContext {
    /// A context for loading a kind outside an agent (unit tests, benchmarks): on CPU, no
    /// file roots, a default model cache, progress reports dropped.
    pub fn standalone(actor_id: &str, config: Vec<u8>) -> Self {
        Self {
            actor_id: actor_id.into(),
            config,
            device: DeviceAssignment::default(),
            roots: FileRoots::default(),
            models: Arc::new(ModelCache::new(Default::default())),
            progress: TaskProgress::disabled(),
        }
    }

    /// Parses the JSON config into `T`, treating an empty config as `{}`.
    pub fn parse_config<T: serde::de::DeserializeOwned>(&self) -> Result<T, BackendError> {
        let text: &[u8] = if self.config.is_empty() {
            b"{}"
        } else {
            &self.config
        };
        serde_json::from_slice(text).map_err(|e| BackendError::InvalidConfig(e.to_string()))
    }
}

/// A chunk after its CPU-side preparation (e.g. tokenised texts); the backend downcasts it.
pub type Prepared = Box<dyn std::any::Any + Send>;

/// CPU-side preparation of a payload. The host runs it on a helper thread, so it overlaps
/// with the model working on the previous chunk.
pub type Preparer = Arc<dyn Fn(&[u8]) -> Result<Prepared, BackendError> + Send + Sync>;

/// What one task amounted to, for metrics (batch sizes, tokens/s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskSize {
    /// Documents (rows) in the task.
    pub items: u64,
    /// Tokens the model ran over.
    pub tokens: u64,
}

/// A task handed to a backend that takes tasks while it runs ([`ModelBackend::run_fed`]).
#[derive(Clone, Debug)]
pub struct FedTask {
    /// Names the task in [`TaskFeed::answer`] and [`TaskFeed::progress`].
    pub number: u64,
    /// The task's payload (its default method's request).
    pub payload: prost::bytes::Bytes,
}

/// Where a backend that takes tasks while it runs gets them and sends their answers. The
/// host's feed hands over only tasks of the default method that have already arrived.
pub trait TaskFeed: Send {
    /// The next task at hand, if any. It never waits.
    fn next_task(&mut self) -> Option<FedTask>;

    /// Task `number`'s answer, and what it amounted to; once per task.
    fn answer(&mut self, number: u64, result: Result<Vec<u8>, BackendError>, size: TaskSize);

    /// Task `number` has done `items_done` of its items (progress, as
    /// [`TaskProgress::report`] for a single task).
    fn progress(&mut self, number: u64, items_done: u64);
}

/// A loaded model owned by one actor thread.
pub trait ModelBackend: Send {
    /// The size of the task just run, where the kind can tell (embedders: rows and tokens).
    fn last_task_size(&self) -> Option<TaskSize> {
        None
    }

    /// Handles one task of the kind's default method. Runs on the actor's thread; may block.
    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError>;

    /// Methods besides the default one that tasks may name (a job's `method`).
    fn methods(&self) -> &'static [&'static str] {
        &[]
    }

    /// Handles a task that names one of [`ModelBackend::methods`]; the host refuses other
    /// names before calling it.
    fn call(&mut self, method: &str, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        let _ = payload;
        Err(BackendError::Task(format!(
            "method `{method}` is listed but not handled"
        )))
    }

    /// A preparation stage to run ahead of the model on another thread, if the kind has one.
    /// Then the host calls [`ModelBackend::run_prepared`] instead of `run_chunk`.
    fn preparer(&self) -> Option<Preparer> {
        None
    }

    /// Handles a chunk that [`ModelBackend::preparer`] prepared.
    fn run_prepared(&mut self, prepared: Prepared) -> Result<Vec<u8>, BackendError> {
        drop(prepared);
        Err(BackendError::Task(
            "this actor kind has no preparation stage".into(),
        ))
    }

    /// Whether the backend takes further tasks while it runs ([`ModelBackend::run_fed`]):
    /// a batching engine that keeps its batch full across tasks (`generate`).
    fn takes_tasks_while_running(&self) -> bool {
        false
    }

    /// Runs the tasks `feed` hands over, taking each new one when it has room, answering
    /// each when it is done, and returns once every task taken is answered and none is at
    /// hand. An `Err` fails every task taken and not yet answered. By default, one task
    /// after the other through [`ModelBackend::run_chunk`].
    fn run_fed(&mut self, feed: &mut dyn TaskFeed) -> Result<(), BackendError> {
        while let Some(task) = feed.next_task() {
            let result = self.run_chunk(&task.payload);
            let size = self.last_task_size().unwrap_or_default();
            feed.answer(task.number, result, size);
        }
        Ok(())
    }

    /// VRAM this backend holds, for status.
    fn vram_bytes(&self) -> u64 {
        0
    }
}

/// A named kind of actor that agents can host. Most kinds are easier written as a
/// [`TypedActor`](super::typed::TypedActor): typed requests and replies, config decoded, a versioned name.
pub trait ActorKind: Send + Sync {
    /// The name agents offer and pools ask for (`name@version` for typed kinds).
    fn name(&self) -> &str;

    /// Loads the model; called once per actor start, on the actor's thread.
    fn load(&self, context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError>;
}
