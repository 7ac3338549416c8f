//! The pool of `embed` actors a job asks for, built one way for every job.

use std::collections::BTreeMap;

use resident_sdk::EmbedPoolSpec;

/// What a job needs of its embed actors.
#[derive(Clone, Debug)]
pub struct EmbedActors<'a> {
    pub pool: String,
    pub model: &'a str,
    /// The pin every agent must load (`model_pin`): a hub commit or an S3 manifest digest.
    pub revision: Option<&'a str>,
    pub replicas: u32,
    /// GPUs per actor; 0 for CPU actors.
    pub gpus_per_actor: f64,
    pub vram_gib_per_actor: f64,
    pub selector: &'a BTreeMap<String, String>,
}

impl EmbedActors<'_> {
    pub fn spec(&self) -> EmbedPoolSpec {
        let mut spec = EmbedPoolSpec::new(self.pool.clone(), self.model).replicas(self.replicas);
        if self.gpus_per_actor > 0.0 {
            spec = spec.gpus(self.gpus_per_actor, self.vram_gib_per_actor);
        }
        if let Some(revision) = self.revision {
            spec = spec.model_revision(revision);
        }
        for (key, value) in self.selector {
            spec = spec.selector(key, value);
        }
        spec
    }
}
