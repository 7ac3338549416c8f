use crate::placement::Refusal;
use crate::store::StoreError;

/// Everything the scheduler can refuse or fail at, mapped to a gRPC status at the edge.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The request is malformed or out of bounds (what is wrong is said).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// What the request creates exists already, differently.
    #[error("{0}")]
    AlreadyExists(String),
    /// No node of the cluster could ever host the pool's actors as asked.
    #[error("cannot place pool `{pool}`: {refusal}")]
    Unplaceable {
        /// The pool.
        pool: String,
        /// Why no node can host its actors.
        refusal: Refusal,
    },
    /// The request cannot be done in the current state (what to do first is said).
    #[error("{0}")]
    Precondition(String),
    /// The caller is known but may not do this (role, ownership, another node's id).
    #[error("{0}")]
    PermissionDenied(String),
    /// The scheduler is stopping.
    #[error("scheduler is shutting down")]
    ShuttingDown,
    /// The core loop ended while the server was up (a bug): the process should exit
    /// non-zero so that its supervisor restarts it on the same state.
    #[error("the scheduler's core stopped ({0}); exiting so that a supervisor restarts it")]
    CoreStopped(String),
    /// The state store failed to read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The state store could not save the change: the call made none (what it had made
    /// in memory is undone) and fails rather than acknowledge what a restart would lose.
    #[error(
        "the state store could not save this change ({0}), so the call changed nothing; the \
         scheduler keeps retrying its writes and accepts changes again by itself once the disk \
         of --state-dir takes writes (free space there), then retry the call"
    )]
    NotSaved(String),
    /// The state store cannot take changes now (it fails, or is far behind): the call was
    /// refused before it changed anything.
    #[error("{0}")]
    StoreUnavailable(String),
    /// A limit on what the scheduler buffers or runs was reached.
    #[error("{0}")]
    Exhausted(String),
}

/// A token's refusal (its role, or a job or pool that is another's) is a permission denial,
/// its text the refusal's.
impl From<crate::auth::AccessRefusal> for SchedulerError {
    fn from(refused: crate::auth::AccessRefusal) -> Self {
        SchedulerError::PermissionDenied(refused.to_string())
    }
}

impl From<SchedulerError> for tonic::Status {
    fn from(error: SchedulerError) -> Self {
        let message = error.to_string();
        match error {
            SchedulerError::InvalidArgument(_) => tonic::Status::invalid_argument(message),
            SchedulerError::NotFound(_) => tonic::Status::not_found(message),
            SchedulerError::AlreadyExists(_) => tonic::Status::already_exists(message),
            SchedulerError::Unplaceable { .. } => {
                let mut status = tonic::Status::failed_precondition(message);
                status.metadata_mut().insert(
                    resident_proto::ERROR_KIND_METADATA,
                    tonic::metadata::MetadataValue::from_static(
                        resident_proto::ERROR_KIND_UNPLACEABLE,
                    ),
                );
                status
            }
            SchedulerError::Precondition(_) => tonic::Status::failed_precondition(message),
            SchedulerError::PermissionDenied(_) => tonic::Status::permission_denied(message),
            SchedulerError::ShuttingDown | SchedulerError::CoreStopped(_) => {
                tonic::Status::unavailable(message)
            }
            SchedulerError::Store(_) => tonic::Status::internal(message),
            SchedulerError::NotSaved(_) | SchedulerError::StoreUnavailable(_) => {
                tonic::Status::unavailable(message)
            }
            SchedulerError::Exhausted(_) => tonic::Status::resource_exhausted(message),
        }
    }
}
