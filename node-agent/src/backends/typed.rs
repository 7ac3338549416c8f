//! Typed actor kinds: implement [`TypedActor`] for a [`Kind`] (the contract clients share)
//! and register it with [`ActorKindRegistry::register_actor`](super::ActorKindRegistry).
//! The adapter here decodes the pool's config and each request, and encodes each reply, so
//! the actor sees only its own types.
//!
//! ```
//! use resident_node_agent::backends::typed::{Kind, Reply, TypedActor};
//! use resident_node_agent::backends::{ActorKindRegistry, BackendError, LoadContext};
//!
//! struct WordCount; // the contract, in a crate clients share
//! impl Kind for WordCount {
//!     const NAME: &'static str = "word-count";
//!     const VERSION: u32 = 1;
//!     type Config = ();
//!     type Request = Vec<String>;
//!     type Response = Vec<usize>;
//!     type Error = String;
//! }
//!
//! struct WordCounter; // the actor, in the agent's crate
//! impl TypedActor for WordCounter {
//!     type Kind = WordCount;
//!     fn load(_config: (), _context: &LoadContext) -> Result<Self, BackendError> {
//!         Ok(WordCounter)
//!     }
//!     fn handle(&mut self, texts: Vec<String>) -> Reply<WordCount> {
//!         Ok(texts.iter().map(|t| t.split_whitespace().count()).collect())
//!     }
//! }
//!
//! let mut registry = ActorKindRegistry::with_builtin_kinds();
//! registry.register_actor::<WordCounter>();
//! assert!(registry.names().contains(&"word-count@1".to_owned()));
//! ```

use std::marker::PhantomData;

pub use resident_actor::{CodecError, Kind, Reply, kind_id};

use super::{ActorKind, BackendError, LoadContext, ModelBackend, TaskFeed, TaskSize};

/// An actor of a typed kind: loaded once per actor start, then called request by request
/// on the actor's own thread (it may block; it has the thread to itself).
pub trait TypedActor: Sized + Send + 'static {
    /// The kind's contract: its name, version, config, request and reply types.
    type Kind: Kind;

    /// Loads the actor (weights, tables) from the pool's config; `context` has the
    /// assigned GPU, the model cache and the file roots.
    fn load(
        config: <Self::Kind as Kind>::Config,
        context: &LoadContext,
    ) -> Result<Self, BackendError>;

    /// Handles one call. An `Err` is the kind's own error, handed to the caller as a value
    /// and not retried; a panic or a [`BackendError`] from `load` fails the task instead.
    fn handle(&mut self, request: <Self::Kind as Kind>::Request) -> Reply<Self::Kind>;

    /// Whether the actor takes further requests while it runs
    /// ([`TypedActor::handle_fed`]), as a batching engine does to keep its batch full.
    const TAKES_REQUESTS_WHILE_RUNNING: bool = false;

    /// Handles the requests `feed` hands over, taking new ones while others run, and
    /// returns once every one taken is answered and none is at hand. An `Err` fails the
    /// tasks taken and not yet answered. By default, one after the other through
    /// [`TypedActor::handle`]; the host calls it only when
    /// [`TypedActor::TAKES_REQUESTS_WHILE_RUNNING`].
    fn handle_fed(&mut self, feed: &mut dyn RequestFeed<Self::Kind>) -> Result<(), BackendError> {
        while let Some((number, request)) = feed.next_request() {
            let reply = self.handle(request);
            feed.answer(number, reply);
        }
        Ok(())
    }
}

/// Requests handed to a [`TypedActor`] while it runs others ([`TypedActor::handle_fed`]).
pub trait RequestFeed<K: Kind>: Send {
    /// The next request at hand and the number that names it, if any. It never waits.
    fn next_request(&mut self) -> Option<(u64, K::Request)>;

    /// Request `number`'s reply; once per request.
    fn answer(&mut self, number: u64, reply: Reply<K>);

    /// Request `number` has done `items_done` of its items (progress).
    fn progress(&mut self, number: u64, items_done: u64);
}

/// The [`ActorKind`] of a [`TypedActor`], named `name@version`.
pub struct TypedKind<A> {
    id: String,
    actor: PhantomData<fn() -> A>,
}

impl<A: TypedActor> TypedKind<A> {
    /// The kind, named after its contract (`name@version`).
    pub fn new() -> Self {
        Self {
            id: kind_id::<A::Kind>(),
            actor: PhantomData,
        }
    }
}

impl<A: TypedActor> Default for TypedKind<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: TypedActor> ActorKind for TypedKind<A> {
    fn name(&self) -> &str {
        &self.id
    }

    fn load(&self, context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
        let config = resident_actor::decode_config::<A::Kind>(&context.config)
            .map_err(|e| BackendError::InvalidConfig(e.to_string()))?;
        let actor = A::load(config, context)?;
        Ok(Box::new(TypedBackend { actor }))
    }
}

struct TypedBackend<A> {
    actor: A,
}

impl<A: TypedActor> ModelBackend for TypedBackend<A> {
    fn last_task_size(&self) -> Option<TaskSize> {
        Some(TaskSize {
            items: 1,
            tokens: 0,
        })
    }

    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        let request = decode::<A::Kind>(payload)?;
        let reply = self.actor.handle(request);
        encode::<A::Kind>(&reply)
    }

    fn takes_tasks_while_running(&self) -> bool {
        A::TAKES_REQUESTS_WHILE_RUNNING
    }

    fn run_fed(&mut self, feed: &mut dyn TaskFeed) -> Result<(), BackendError> {
        self.actor.handle_fed(&mut TypedFeed {
            tasks: feed,
            kind: PhantomData,
        })
    }
}

/// Undecodable bytes fail the same way anywhere: a permanent error, not retried.
fn decode<K: Kind>(payload: &[u8]) -> Result<K::Request, BackendError> {
    resident_actor::decode_request::<K>(payload)
        .map_err(|e| BackendError::BadPayload(e.to_string()))
}

fn encode<K: Kind>(reply: &Reply<K>) -> Result<Vec<u8>, BackendError> {
    resident_actor::encode_reply::<K>(reply).map_err(|e| BackendError::Task(e.to_string()))
}

/// The host's tasks as a typed actor's requests: payloads decoded, replies encoded.
struct TypedFeed<'a, K> {
    tasks: &'a mut dyn TaskFeed,
    kind: PhantomData<fn() -> K>,
}

impl<K: Kind> RequestFeed<K> for TypedFeed<'_, K> {
    fn next_request(&mut self) -> Option<(u64, K::Request)> {
        loop {
            let task = self.tasks.next_task()?;
            match decode::<K>(&task.payload) {
                Ok(request) => return Some((task.number, request)),
                Err(error) => self
                    .tasks
                    .answer(task.number, Err(error), TaskSize::default()),
            }
        }
    }

    fn answer(&mut self, number: u64, reply: Reply<K>) {
        let size = TaskSize {
            items: 1,
            tokens: 0,
        };
        self.tasks.answer(number, encode::<K>(&reply), size);
    }

    fn progress(&mut self, number: u64, items_done: u64) {
        self.tasks.progress(number, items_done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::ActorKindRegistry;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Scale {
        factor: i64,
    }

    struct Multiply;
    impl Kind for Multiply {
        const NAME: &'static str = "multiply";
        const VERSION: u32 = 2;
        type Config = Scale;
        type Request = Vec<i64>;
        type Response = Vec<i64>;
        type Error = String;
    }

    struct Multiplier(i64);
    impl TypedActor for Multiplier {
        type Kind = Multiply;
        fn load(config: Scale, _context: &LoadContext) -> Result<Self, BackendError> {
            Ok(Multiplier(config.factor))
        }
        fn handle(&mut self, values: Vec<i64>) -> Reply<Multiply> {
            values
                .iter()
                .map(|v| {
                    v.checked_mul(self.0)
                        .ok_or(format!("{v} x {} overflows", self.0))
                })
                .collect()
        }
    }

    fn context(config: &str) -> LoadContext {
        LoadContext::standalone("a", config.as_bytes().to_vec())
    }

    #[test]
    fn a_typed_actor_loads_its_config_and_answers_in_its_types() {
        let mut registry = ActorKindRegistry::default();
        registry.register_actor::<Multiplier>();
        assert_eq!(registry.names(), vec!["multiply@2".to_owned()]);
        let kind = registry.get("multiply@2").unwrap();
        let mut actor = kind.load(&context(r#"{"factor":3}"#)).unwrap();
        let request = resident_actor::encode_request::<Multiply>(&vec![1, 2]).unwrap();
        let reply = actor.run_chunk(&request).unwrap();
        assert_eq!(
            resident_actor::decode_reply::<Multiply>(&reply).unwrap(),
            Ok(vec![3, 6])
        );
        let overflow = resident_actor::encode_request::<Multiply>(&vec![i64::MAX]).unwrap();
        let reply = actor.run_chunk(&overflow).unwrap();
        let error = resident_actor::decode_reply::<Multiply>(&reply).unwrap();
        assert_eq!(error, Err(format!("{} x 3 overflows", i64::MAX)));
    }

    #[test]
    fn bad_configs_and_payloads_are_permanent_errors_naming_the_kind() {
        let kind = TypedKind::<Multiplier>::new();
        let error = kind.load(&context(r#"{"factor":"x"}"#)).err().unwrap();
        assert!(matches!(error, BackendError::InvalidConfig(_)), "{error}");
        assert!(error.to_string().contains("multiply@2"), "{error}");
        let mut actor = kind.load(&context(r#"{"factor":1}"#)).unwrap();
        let error = actor.run_chunk(&[0xff; 3]).unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(
            error
                .to_string()
                .contains("cannot decode the request as `alloc::vec::Vec<i64>`"),
            "{error}"
        );
    }
}
