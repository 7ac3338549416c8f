//! The Resident Rust SDK: connect to a cluster (or, with the `local` feature, start one in
//! this process), create pools of resident actors, stream tasks through them.
//!
//! With its default features this crate is the client alone: it depends on neither the
//! servers nor any model or storage crate, and its API shows no generated protobuf types.
//!
//! ```no_run
//! # async fn demo() -> Result<(), resident_sdk::SdkError> {
//! use futures::StreamExt;
//! use resident_sdk::{Cluster, PoolSpec};
//! let cluster = Cluster::connect("http://127.0.0.1:50051").await?;
//! let pool = cluster.create_pool(PoolSpec::new("stats", "text-stats").replicas(2)).await?;
//! pool.wait_ready(std::time::Duration::from_secs(30)).await?;
//! let outputs = pool.map(["hello world", "resident actors"]).await?;
//! let mut results = pool.submit("job", futures::stream::iter(vec!["a".to_owned()])).await?;
//! while let Some(result) = results.next().await { let _ = result?; }
//! # Ok(()) }
//! ```

mod client;
mod embed;
mod error;
mod info;
mod job_stream;
#[cfg(feature = "local")]
mod local;
mod pool_spec;
mod request_queue;
mod typed;

/// Typed actor kinds: the contract both sides share ([`actor::Kind`]) and, with the `local`
/// feature, the agent side ([`actor::TypedActor`], [`actor::LoadContext`]) for testing a kind
/// in process with `Cluster::local()`.
pub mod actor {
    pub use resident_actor::{
        CodecError, Kind, Reply, decode_reply, decode_request, encode_reply, encode_request,
        kind_id, split_kind_id,
    };
    #[cfg(feature = "local")]
    pub use resident_node_agent::backends::typed::TypedActor;
    #[cfg(feature = "local")]
    pub use resident_node_agent::backends::{BackendError, DeviceAssignment, LoadContext};
}

pub use client::{
    CallSession, ClientCredentials, Cluster, DEFAULT_RECONNECT_TIMEOUT, JobStream,
    KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, Pool, SubmitOptions, TaskOutput, TaskPayload,
    credentials_from_env,
};
pub use embed::{EmbedPool, EmbedPoolSpec, EmbedStats, EmbeddedChunk, embed_request, one_model};
pub use error::SdkError;
pub use info::{ActorInfo, ActorState, GpuInfo, JobState, JobStatus, NodeInfo, PoolStatus};
#[cfg(feature = "local")]
pub use local::LocalConfig;
pub use pool_spec::PoolSpec;
pub use prost::bytes::Bytes;
#[cfg(feature = "local")]
pub use resident_node_agent::backends::ActorKindRegistry;
#[cfg(feature = "local")]
pub use resident_node_agent::model_cache::ModelCacheConfig;
pub use resident_proto::{ActorId, JobId, NodeId, PoolName};
#[cfg(feature = "local")]
pub use resident_scheduler::core::CoreConfig;
pub use typed::{TypedOutput, TypedPool, TypedStream};
