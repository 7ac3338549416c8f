//! A STAND-IN ENCODER, not a model: an actor kind registered under the name `embed` that
//! answers an `EmbedRequest` with deterministic unit vectors derived from a hash of each
//! text. It does a few microseconds of work per document, so a job run on it times the job
//! machinery (reading, chunking, dispatch, shards, manifest, merge) and not a model. Its
//! vectors mean nothing; nothing outside the job-overhead benchmark uses it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prost::Message;
use resident_node_agent::backends::{
    ActorKind, ActorKindRegistry, BackendError, LoadContext, ModelBackend,
};
use resident_proto::pb;

/// The fingerprint every stand-in chunk carries, so no one mistakes its output for a model's.
pub const STAND_IN_FINGERPRINT: &str = "stand-in-encoder-not-a-model";

pub struct StandInEncoderKind {
    pub dim: usize,
    /// Nanoseconds spent inside the stand-in, summed over its actors (to subtract from the
    /// process's CPU time).
    pub busy_nanos: Arc<AtomicU64>,
}

/// The built-in kinds, with `embed` replaced by the stand-in.
pub fn registry_with_stand_in(kind: StandInEncoderKind) -> ActorKindRegistry {
    let mut kinds = ActorKindRegistry::with_builtin_kinds();
    kinds.register(Arc::new(kind));
    kinds
}

struct StandInEncoder {
    dim: usize,
    busy_nanos: Arc<AtomicU64>,
}

impl ActorKind for StandInEncoderKind {
    fn name(&self) -> &str {
        "embed"
    }

    fn load(&self, _context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
        Ok(Box::new(StandInEncoder {
            dim: self.dim,
            busy_nanos: self.busy_nanos.clone(),
        }))
    }
}

/// FNV-1a, then a xorshift stream: the same text always gives the same vector.
fn stand_in_vector(text: &str, dim: usize, out: &mut Vec<u8>) {
    let mut state = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    let values: Vec<f32> = (0..dim)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    for value in values {
        out.extend_from_slice(&(value / norm).to_le_bytes());
    }
}

impl ModelBackend for StandInEncoder {
    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        let started = Instant::now();
        let request = pb::EmbedRequest::decode(payload)
            .map_err(|e| BackendError::BadPayload(format!("not an EmbedRequest: {e}")))?;
        let mut vectors = Vec::with_capacity(request.texts.len() * self.dim * 4);
        let mut tokens = 0u64;
        for text in &request.texts {
            tokens += text.split_whitespace().count() as u64;
            stand_in_vector(text, self.dim, &mut vectors);
        }
        let micros = started.elapsed().as_micros() as u64;
        let response = pb::EmbedResponse {
            count: request.texts.len() as u32,
            dim: self.dim as u32,
            vectors: vectors.into(),
            tokens,
            padded_tokens: tokens,
            total_micros: micros,
            model_micros: micros,
            batches: 1,
            device: "stand-in".into(),
            dtype: "f32".into(),
            model_fingerprint: STAND_IN_FINGERPRINT.into(),
            ..Default::default()
        };
        self.busy_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(response.encode_to_vec())
    }
}
