//! The Resident Rust SDK: connect to a cluster (or, with the `local` feature, start one in
//! this process), create pools of resident actors, stream tasks through them.
//!
//! With its default features this crate is the client alone: it depends on neither the
//! servers nor any model or storage crate, and its API shows no generated protobuf types.
//!
//! ```
//! # #[cfg(feature = "local")] {
//! use resident_sdk::{Cluster, LocalConfig, PoolSpec};
//! let runtime = tokio::runtime::Runtime::new().unwrap();
//! runtime.block_on(async {
//!     // A scheduler and an agent in this process; on a cluster,
//!     // `Cluster::connect("https://scheduler:50051").await?`.
//!     let cluster = Cluster::local(LocalConfig::default()).await?;
//!     cluster.wait_for_nodes(1, std::time::Duration::from_secs(30)).await?;
//!     // Two resident actors of the built-in `echo` kind.
//!     let pool = cluster.create_pool(PoolSpec::new("echo", "echo").replicas(2)).await?;
//!     pool.wait_ready(std::time::Duration::from_secs(30)).await?;
//!     // Outputs in input order (`pool.submit` streams them as they finish).
//!     let outputs = pool.map(["hello", "resident"]).await?;
//!     assert_eq!(outputs[1].output.as_deref().unwrap(), b"resident");
//!     Ok::<_, resident_sdk::SdkError>(())
//! })
//! .unwrap();
//! # }
//! ```

#![warn(missing_docs)]

mod client;
mod device_choice;
mod embed;
mod error;
mod generate;
mod info;
mod job_stream;
pub mod json;
#[cfg(feature = "local")]
mod local;
mod pool;
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
    ClientCredentials, Cluster, DEFAULT_RECONNECT_TIMEOUT, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT,
    credentials_from_env, insecure_from_env,
};
pub use device_choice::{DEFAULT_GPUS_PER_ACTOR, DeviceChoice, choose_device, default_replicas};
pub use embed::{
    EmbedOptionError, EmbedOptions, EmbedPool, EmbedPoolSpec, EmbedStats, EmbeddedChunk, Prompt,
    RowWindow, WindowSplit, Windows, embed_request, embed_request_options, embed_request_with,
    one_model,
};
pub use error::SdkError;
pub use generate::{GeneratePool, GeneratePoolSpec};
pub use info::{
    ActorInfo, ActorState, GpuInfo, HeldUsage, JobState, JobStatus, NodeInfo, PoolStatus,
    UnavailableGpu,
};
pub use job_stream::{JobStream, TaskOutput, TaskPayload};
#[cfg(feature = "local")]
pub use local::LocalConfig;
pub use pool::{CallSession, Pool, SubmitOptions};
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
