/// Everything an SDK call can fail with, by what the user should do about it.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    #[error("invalid cluster url `{url}`")]
    /// The URL does not parse as a scheduler address.
    BadUrl {
        /// The URL as given.
        url: String,
        #[source]
        /// Why it does not parse.
        source: tonic::transport::Error,
    },
    #[error("cannot connect to the scheduler at {url}{hint}")]
    /// The scheduler could not be reached.
    Connect {
        /// The URL dialled.
        url: String,
        /// What probably went wrong (TLS mismatch, untrusted certificate), with `: ` before it.
        hint: String,
        #[source]
        /// The transport's error.
        source: tonic::transport::Error,
    },
    /// The CA file or the token cannot be used as given.
    #[error("credentials: {0}")]
    Credentials(String),
    /// No token, or one the cluster does not know.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The token is known but its role (or ownership) does not allow the call.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("invalid request: {0}")]
    /// The request is malformed (the message says which field and why).
    InvalidArgument(String),
    #[error("not found: {0}")]
    /// The pool, job or node does not exist.
    NotFound(String),
    /// The cluster has no room for the pool as asked (VRAM, GPUs, labels).
    #[error("cannot be placed: {0}")]
    Unplaceable(String),
    /// The request does not fit the cluster's current state (not a placement problem).
    #[error("failed precondition: {0}")]
    Precondition(String),
    /// Every actor of the pool failed to start (a model that does not load, a bad config).
    #[error("every actor of pool `{pool}` failed: {error}")]
    /// Every actor of a pool failed to load: the pool's name and the last actor's error.
    ActorsFailed {
        /// The pool's name.
        pool: String,
        /// The last actor's error.
        error: String,
    },
    #[error("already exists: {0}")]
    /// A pool of that name exists with another spec.
    AlreadyExists(String),
    #[error("scheduler unavailable: {0}")]
    /// The scheduler is not reachable now (retry later).
    Unavailable(String),
    #[error("timed out: {0}")]
    /// The call did not finish in time.
    Timeout(String),
    /// A job's stream broke and the scheduler did not come back within the cluster's
    /// reconnect timeout (`Cluster::with_reconnect_timeout`).
    #[error(
        "the scheduler stayed away for {waited:?}, past the reconnect timeout, while job {job} ran \
         (last error: {last_error}); run the command again once the scheduler is back: it \
         resumes from what was written"
    )]
    SchedulerGone {
        /// The job whose stream broke.
        job: String,
        /// How long the client waited for the scheduler.
        waited: std::time::Duration,
        /// The last error while reconnecting.
        last_error: String,
    },
    #[error("scheduler error ({code:?}): {message}")]
    /// Any other error the scheduler answered with: its gRPC code and message.
    Scheduler {
        /// The gRPC code.
        code: tonic::Code,
        /// The scheduler's message.
        message: String,
    },
    #[error("task failed: {0}")]
    /// A task failed for good (after its retries): the actor's error.
    TaskFailed(String),
    #[error("local cluster failed to start: {0}")]
    /// `Cluster::local` could not start its scheduler or agent.
    LocalStart(String),
    /// Vectors of one call came from two different models (agents that resolved one model
    /// name to different files).
    #[error("mixed models: {0}")]
    MixedModels(String),
    /// A typed call's value did not encode, or an answer did not decode, as the kind's type
    /// (a client and an agent built from different versions of the kind).
    #[error(transparent)]
    Codec(#[from] resident_actor::CodecError),
}

impl From<tonic::Status> for SdkError {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            tonic::Code::InvalidArgument => SdkError::InvalidArgument(message),
            tonic::Code::NotFound => SdkError::NotFound(message),
            tonic::Code::FailedPrecondition if is_unplaceable(&status) => {
                SdkError::Unplaceable(message)
            }
            tonic::Code::FailedPrecondition => SdkError::Precondition(message),
            tonic::Code::AlreadyExists => SdkError::AlreadyExists(message),
            tonic::Code::Unavailable => SdkError::Unavailable(message),
            tonic::Code::Unauthenticated => SdkError::Unauthenticated(message),
            tonic::Code::PermissionDenied => SdkError::PermissionDenied(message),
            tonic::Code::DeadlineExceeded => SdkError::Timeout(message),
            code => SdkError::Scheduler { code, message },
        }
    }
}

/// The scheduler marks placement refusals, so they are told from other failed preconditions.
fn is_unplaceable(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get(resident_proto::ERROR_KIND_METADATA)
        .is_some_and(|kind| kind == resident_proto::ERROR_KIND_UNPLACEABLE)
}
