//! Actor kinds: what a resident actor runs. A kind loads its model once ([`ActorKind::load`])
//! and then handles chunk after chunk ([`ModelBackend::run_chunk`]) on the actor's own thread.
//!
//! To add a kind in your own crate, implement [`typed::TypedActor`] for a
//! [`resident_actor::Kind`] and register it with [`ActorKindRegistry::register_actor`]
//! (`examples/custom-actor` is a whole one). The untyped traits below are what it is built
//! on; [`text_stats`] is a small kind written on them directly.

pub mod echo;
pub mod embed;
pub mod generate;
pub mod progress;
pub mod text_stats;
pub mod typed;

mod kind;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::error::BackendError;
pub use kind::{
    ActorKind, DeviceAssignment, FedTask, LoadContext, ModelBackend, Prepared, Preparer, TaskFeed,
    TaskSize,
};
pub use progress::TaskProgress;

/// The kinds an agent offers, by name.
#[derive(Clone, Default)]
pub struct ActorKindRegistry {
    kinds: BTreeMap<String, Arc<dyn ActorKind>>,
}

impl ActorKindRegistry {
    /// The kinds every agent offers: `echo`, `text-stats`, `embed` and `generate`.
    pub fn with_builtin_kinds() -> Self {
        let mut registry = Self::default();
        registry.register(Arc::new(echo::EchoKind));
        registry.register(Arc::new(embed::EmbedKind::default()));
        registry.register(Arc::new(text_stats::TextStatsKind));
        registry.register_actor::<generate::GenerateActor>();
        registry
    }

    /// The `embed` kind's actors on `threads` compute threads each, of their own (see
    /// [`embed::EmbedKind::with_compute_threads`]).
    pub fn with_embed_compute_threads(mut self, threads: usize) -> Self {
        self.register(Arc::new(embed::EmbedKind::with_compute_threads(threads)));
        self
    }

    /// Adds a kind (replacing one of the same name).
    pub fn register(&mut self, kind: Arc<dyn ActorKind>) {
        self.kinds.insert(kind.name().to_owned(), kind);
    }

    /// Adds a typed kind: `registry.register_actor::<MinHashActor>()`.
    pub fn register_actor<A: typed::TypedActor>(&mut self) -> &mut Self {
        self.register(Arc::new(typed::TypedKind::<A>::new()));
        self
    }

    /// Removes a kind by name (`embed`, `minhash@1`); whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        self.kinds.remove(name).is_some()
    }

    /// The kind registered as `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn ActorKind>> {
        self.kinds.get(name).cloned()
    }

    /// Every registered kind's name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.kinds.keys().cloned().collect()
    }
}
