//! The `resident.v1` wire protocol plus the small domain types every crate shares:
//! ID newtypes, [`VramBytes`], [`GpuFraction`] and the seeded [`SeededRng`].

#![warn(missing_docs)]

pub mod connect;
#[cfg(feature = "metrics")]
pub mod gpu_gauges;
pub mod health;
pub mod host;
pub mod ids;
pub mod prices;
pub mod rng;
pub mod units;

pub use ids::{ActorId, JobId, NodeId, PoolName, TaskId};
pub use rng::SeededRng;
pub use units::{GpuCountError, GpuFraction, VramBytes};

/// Generated protobuf and gRPC code for `resident.v1`. The comments of
/// `proto/resident.proto` are its docs; what they leave out is left to the field names.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("resident.v1");
}

/// The method of the built-in `embed` actor kind that trains one segment of a sweep trial
/// (payload `pb::TrialRequest`, output `pb::TrialResponse`).
pub const EMBED_TRIAL_METHOD: &str = "trial";

/// How a task fails for good when its input crashed two actors, the second time running
/// alone: the start of its error. Jobs tell such inputs apart by it (`resident embed` lists
/// them as bad records).
pub const CRASHES_THE_MODEL: &str = "this input crashes the model";

/// gRPC metadata key that refines a status code for clients (what kind of refusal it is).
pub const ERROR_KIND_METADATA: &str = "resident-error-kind";
/// [`ERROR_KIND_METADATA`] value of a `FailedPrecondition` that is a placement refusal.
pub const ERROR_KIND_UNPLACEABLE: &str = "unplaceable";

/// The largest gRPC message any Resident endpoint sends or accepts (256 MiB).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// The largest task payload or result: the message limit less room for the envelope (ids,
/// error text). A result over it fails its task alone, with [`oversized_result_error`].
pub const MAX_RESULT_BYTES: usize = MAX_MESSAGE_BYTES - (1 << 20);

/// Wall-clock now in Unix milliseconds (job start and end times, events, elapsed times).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The message of a caught panic (`std::panic::catch_unwind`, a thread's join error).
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}

/// The error of a task whose result is too large to send (it fails that task alone).
pub fn oversized_result_error(bytes: usize) -> String {
    format!(
        "the task's result is {bytes} bytes, over the {} MiB a result may take; give the task \
         less work (for `resident embed`, a smaller --chunk-size)",
        MAX_RESULT_BYTES >> 20
    )
}

/// Human name of an actor state, as printed by `resident status`.
pub fn actor_state_name(state: pb::ActorState) -> &'static str {
    match state {
        pb::ActorState::Unspecified => "unknown",
        pb::ActorState::Pending => "pending",
        pb::ActorState::Starting => "starting",
        pb::ActorState::Ready => "ready",
        pb::ActorState::Draining => "draining",
        pb::ActorState::Dead => "dead",
    }
}
