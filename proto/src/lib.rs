//! The `resident.v1` wire protocol plus the small domain types every crate shares:
//! ID newtypes, [`VramBytes`], [`GpuFraction`] and the seeded [`SeededRng`].

pub mod connect;
pub mod ids;
pub mod rng;
pub mod units;

pub use ids::{ActorId, JobId, NodeId, PoolName, TaskId};
pub use rng::SeededRng;
pub use units::{GpuFraction, VramBytes};

/// Generated protobuf and gRPC code for `resident.v1`.
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("resident.v1");
}

/// The method of the built-in `embed` actor kind that trains one segment of a sweep trial
/// (payload `pb::TrialRequest`, output `pb::TrialResponse`).
pub const EMBED_TRIAL_METHOD: &str = "trial";

/// gRPC metadata key that refines a status code for clients (what kind of refusal it is).
pub const ERROR_KIND_METADATA: &str = "resident-error-kind";
/// [`ERROR_KIND_METADATA`] value of a `FailedPrecondition` that is a placement refusal.
pub const ERROR_KIND_UNPLACEABLE: &str = "unplaceable";

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
