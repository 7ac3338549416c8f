//! The Resident Rust SDK: connect to a cluster (or start one in process), create pools of
//! resident actors, stream tasks through them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), resident_sdk::SdkError> {
//! use resident_sdk::{Cluster, LocalConfig, PoolSpec};
//! let cluster = Cluster::local(LocalConfig::default()).await?;
//! let pool = cluster.create_pool(PoolSpec::new("stats", "text-stats").replicas(2)).await?;
//! pool.wait_ready(std::time::Duration::from_secs(30)).await?;
//! let outputs = pool.map(vec!["hello world".into()]).await?;
//! # Ok(()) }
//! ```

mod client;
mod embed;
pub mod embed_job;
mod error;
#[cfg(feature = "local")]
mod local;
mod pool_spec;
pub mod storage;
pub mod sweep;

/// Sets how many threads one model operation may use on CPU (candle reads
/// `RAYON_NUM_THREADS`). Call it first thing in `main`, before any other thread starts.
/// One thread per op with one actor per core is the fastest CPU setup for small encoders;
/// an explicit `RAYON_NUM_THREADS` in the environment wins.
pub fn set_compute_threads(threads: usize) {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        #[allow(unsafe_code)]
        // SAFETY: documented to run before any other thread exists, so nothing reads the
        // environment concurrently.
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string())
        };
    }
}

pub use client::{CallSession, Cluster, JobStream, Pool, TaskOutput};
pub use embed::{EmbedPool, EmbedPoolSpec, EmbeddedChunk, embed_request};
pub use error::SdkError;
#[cfg(feature = "local")]
pub use local::LocalConfig;
pub use pool_spec::PoolSpec;
pub use prost::bytes::Bytes;
#[cfg(feature = "local")]
pub use resident_node_agent::backends::ActorKindRegistry;
pub use resident_proto::pb;
#[cfg(feature = "local")]
pub use resident_scheduler::core::CoreConfig;
