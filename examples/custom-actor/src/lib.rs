//! A user's own actor kind on Resident: MinHash signatures of texts, the step that finds
//! near-duplicates before a web corpus is embedded.
//!
//! - [`MinHash`] is the kind's contract: name, version, config, request, response, error.
//!   Both sides depend on it.
//! - [`MinHashActor`] (agent side) computes signatures; `custom-agent` is `resident agent`
//!   with it registered.
//! - [`group_near_duplicates`] (client side) groups documents whose signatures agree;
//!   `custom-client` sends a corpus through the typed API and prints the groups' count.

#![warn(missing_docs)]

mod grouping;
mod signature;

use serde::{Deserialize, Serialize};

pub use grouping::{estimated_jaccard, group_near_duplicates};
pub use signature::{Signature, signature};

use resident_node_agent::backends::typed::{Reply, TypedActor};
use resident_node_agent::backends::{BackendError, LoadContext};

/// The kind: one call takes a chunk of texts and returns one signature per text, in order.
pub struct MinHash;

impl resident_actor::Kind for MinHash {
    const NAME: &'static str = "minhash";
    const VERSION: u32 = 1;
    type Config = MinHashConfig;
    type Request = MinHashRequest;
    type Response = Vec<Signature>;
    type Error = MinHashError;
}

/// How a pool's actors hash. Every actor of a pool must use the same settings, or their
/// signatures do not compare; the pool's config guarantees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MinHashConfig {
    /// Hash functions per signature (more: finer similarity estimates).
    pub num_hashes: usize,
    /// Words per shingle.
    pub shingle_words: usize,
    /// Seed of the hash functions.
    pub seed: u64,
    /// The most texts one call may carry.
    pub max_texts_per_call: usize,
}

impl Default for MinHashConfig {
    fn default() -> Self {
        Self {
            num_hashes: 128,
            shingle_words: 3,
            seed: 0x5eed,
            max_texts_per_call: 10_000,
        }
    }
}

/// One call: the texts to sign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinHashRequest {
    /// The texts, each answered with its signature in order.
    pub texts: Vec<String>,
}

/// What a MinHash actor refuses, as a value the caller can match on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MinHashError {
    /// More texts in one call than the pool's config allows.
    TooManyTexts {
        /// Texts sent.
        got: usize,
        /// The most one call may hold.
        limit: usize,
    },
}

impl std::fmt::Display for MinHashError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MinHashError::TooManyTexts { got, limit } => write!(
                f,
                "a call carried {got} texts, over this pool's max_texts_per_call {limit}: send \
                 smaller chunks"
            ),
        }
    }
}

/// The agent side: the hash functions, drawn once when the actor loads.
pub struct MinHashActor {
    hashes: signature::HashFamily,
    config: MinHashConfig,
}

impl TypedActor for MinHashActor {
    type Kind = MinHash;

    fn load(config: MinHashConfig, _context: &LoadContext) -> Result<Self, BackendError> {
        if config.num_hashes == 0 || config.shingle_words == 0 {
            return Err(BackendError::InvalidConfig(
                "num_hashes and shingle_words must be at least 1".into(),
            ));
        }
        Ok(Self {
            hashes: signature::HashFamily::new(config.num_hashes, config.seed),
            config,
        })
    }

    fn handle(&mut self, request: MinHashRequest) -> Reply<MinHash> {
        let limit = self.config.max_texts_per_call;
        if request.texts.len() > limit {
            return Err(MinHashError::TooManyTexts {
                got: request.texts.len(),
                limit,
            });
        }
        Ok(request
            .texts
            .iter()
            .map(|text| signature(text, self.config.shingle_words, &self.hashes))
            .collect())
    }
}
