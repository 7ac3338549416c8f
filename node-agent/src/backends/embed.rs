//! `embed`: the actor kind around [`resident_models::embed::Embedder`]. The model loads once
//! per actor; its default method embeds an `EmbedRequest` (tokenised on the host's helper
//! thread, ahead of the model), and its `trial` method trains one segment of a sweep trial
//! (`TrialRequest`) on the same device, next to the resident model, so a sweep costs one model
//! load per actor.

use std::sync::Arc;

use prost::Message;
use resident_models::device::select_device;
use resident_models::embed::{EmbedConfig, Embedder, TokenizedChunk};
use resident_proto::pb;

use super::{
    ActorKind, BackendError, LoadContext, ModelBackend, Prepared, Preparer, TaskProgress, TaskSize,
};
use crate::model_cache::ModelCache;

pub use resident_proto::EMBED_TRIAL_METHOD as TRIAL_METHOD;

/// Fault injection, for testing how a job survives an input that crashes the model: when
/// this variable is set in the agent's environment, its embed actors panic on any chunk
/// with a text containing its value.
pub const PANIC_ON_TEXT_ENV: &str = "RESIDENT_FAULT_PANIC_ON_TEXT";

/// Panics if a text of the `EmbedRequest` in `payload` contains `marker`.
fn panic_on_marked_text(marker: Option<&str>, payload: &[u8]) {
    let Some(marker) = marker else { return };
    if let Ok(request) = pb::EmbedRequest::decode(payload)
        && request.texts.iter().any(|text| text.contains(marker))
    {
        panic!("a text contains `{marker}` ({PANIC_ON_TEXT_ENV})");
    }
}

/// The `embed` kind. Its actors compute on the process's threads (on CPU, as many per model
/// operation as `RAYON_NUM_THREADS` says, every core without it), or on a pool of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmbedKind {
    compute_threads: Option<usize>,
}

impl EmbedKind {
    /// Each actor runs its model on a thread pool of `threads` of its own (at least 1), so
    /// an embedding process sets its actors' threads without changing its environment
    /// (`Cluster::local` in a Python process or a Rust program).
    pub fn with_compute_threads(threads: usize) -> Self {
        Self {
            compute_threads: Some(threads.max(1)),
        }
    }
}

struct EmbedActor {
    embedder: Embedder,
    /// The size of the last chunk embedded.
    last_size: Option<TaskSize>,
    /// Fetches `s3://` sweep datasets for the `trial` method.
    models: Arc<ModelCache>,
    /// Rows embedded so far in a chunk, after each model batch.
    progress: TaskProgress,
    /// Keeps the model's cache entry from eviction while this actor has it loaded.
    _model_in_use: Option<crate::model_cache::eviction::ModelInUse>,
    /// [`PANIC_ON_TEXT_ENV`]'s value, when set.
    panic_marker: Option<Arc<str>>,
    /// The actor's own compute threads ([`EmbedKind::with_compute_threads`]).
    threads: Option<rayon::ThreadPool>,
}

impl EmbedActor {
    /// Runs `work` on the actor's own threads, if it has them.
    fn on_threads<T: Send>(&mut self, work: impl FnOnce(&mut Self) -> T + Send) -> T {
        match self.threads.take() {
            None => work(self),
            Some(pool) => {
                let done = pool.install(|| work(self));
                self.threads = Some(pool);
                done
            }
        }
    }
}

impl ModelBackend for EmbedActor {
    fn last_task_size(&self) -> Option<TaskSize> {
        self.last_size
    }

    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        self.last_size = None;
        panic_on_marked_text(self.panic_marker.as_deref(), payload);
        self.on_threads(|actor| {
            let progress = &actor.progress;
            actor
                .embedder
                .embed_payload_reporting(payload, &mut |rows| progress.report(rows as u64))
        })
    }

    fn methods(&self) -> &'static [&'static str] {
        &[TRIAL_METHOD]
    }

    fn call(&mut self, method: &str, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        match method {
            TRIAL_METHOD => {
                let mut request = pb::TrialRequest::decode(payload)
                    .map_err(|e| BackendError::BadPayload(format!("not a TrialRequest: {e}")))?;
                if request.dataset_uri.starts_with("s3://") {
                    request.dataset_uri = self
                        .models
                        .local_dataset(&request.dataset_uri, &request.dataset_sha256)?
                        .to_string_lossy()
                        .into_owned();
                }
                Ok(self.embedder.train_trial_request(&request)?)
            }
            other => Err(BackendError::unknown_method("embed", other, self.methods())),
        }
    }

    fn preparer(&self) -> Option<Preparer> {
        let preparer = self.embedder.preparer();
        let marker = self.panic_marker.clone();
        Some(Arc::new(
            move |payload: &[u8]| -> Result<Prepared, BackendError> {
                panic_on_marked_text(marker.as_deref(), payload);
                Ok(Box::new(preparer.prepare(payload)?))
            },
        ))
    }

    fn run_prepared(&mut self, prepared: Prepared) -> Result<Vec<u8>, BackendError> {
        let chunk = prepared
            .downcast::<TokenizedChunk>()
            .map_err(|_| BackendError::Task("prepared chunk of the wrong type".into()))?;
        self.last_size = Some(TaskSize {
            items: chunk.rows() as u64,
            tokens: chunk.tokens() as u64,
        });
        self.on_threads(|actor| {
            let progress = &actor.progress;
            actor
                .embedder
                .embed_prepared_reporting(*chunk, &mut |rows| progress.report(rows as u64))
        })
    }

    fn vram_bytes(&self) -> u64 {
        self.embedder.vram_bytes()
    }
}

impl ActorKind for EmbedKind {
    fn name(&self) -> &str {
        "embed"
    }

    fn load(&self, context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
        let mut config: EmbedConfig = context.parse_config()?;
        config.model = context
            .models
            .local_dir(&config.model, config.model_revision.as_deref())?;
        let device = select_device(context.device.real_gpu())?;
        let model_in_use = context.models.hold(&config.model);
        let threads = match self.compute_threads {
            Some(count) if device.is_cpu() => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(count)
                    .thread_name(|i| format!("embed-{i}"))
                    .build()
                    .map_err(|e| {
                        BackendError::Load(format!("cannot start {count} compute threads: {e}"))
                    })?,
            ),
            _ => None,
        };
        Ok(Box::new(EmbedActor {
            embedder: Embedder::load(&config, device, context.roots.clone())?,
            _model_in_use: model_in_use,
            models: context.models.clone(),
            last_size: None,
            progress: context.progress.clone(),
            panic_marker: std::env::var(PANIC_ON_TEXT_ENV)
                .ok()
                .filter(|marker| !marker.is_empty())
                .map(Arc::from),
            threads,
        }))
    }
}
