//! The command's exit status, by what went wrong, so scripts and schedulers (Argo, cron,
//! Kubernetes Jobs) can tell a retryable outage from a bad request:
//!
//! | status | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | any other error (an output that cannot be written, a bug) |
//! | 2 | usage error or bad input: a flag, a config file, a record, a request the cluster refuses as invalid |
//! | 3 | the work cannot be placed or started: no node fits the pool, or its actors fail to load |
//! | 4 | the work finished with failures: failed chunks, tasks or sweep trials |
//! | 5 | the cluster cannot be reached, or refuses the credentials |

use resident_jobs::corpus_job::JobError;
use resident_jobs::sweep::{SweepConfigError, SweepError};
use resident_sdk::SdkError;

pub const SUCCESS: u8 = 0;
pub const OTHER: u8 = 1;
pub const USAGE: u8 = 2;
pub const UNPLACEABLE: u8 = 3;
pub const FINISHED_WITH_FAILURES: u8 = 4;
pub const UNREACHABLE: u8 = 5;

/// The work ran to its end, and some of it failed (printed above this error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FinishedWithFailures(pub String);

/// Bad input that a command found itself (not the cluster).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// `Ok` when `holds`; else the bad-input error `message` (exit status 2).
pub fn require(holds: bool, message: impl Into<String>) -> Result<(), BadInput> {
    match holds {
        true => Ok(()),
        false => Err(BadInput(message.into())),
    }
}

fn of_sdk(error: &SdkError) -> u8 {
    match error {
        SdkError::BadUrl { .. }
        | SdkError::Credentials(_)
        | SdkError::InvalidArgument(_)
        | SdkError::NotFound(_)
        | SdkError::AlreadyExists(_)
        | SdkError::Precondition(_)
        | SdkError::MixedModels(_)
        | SdkError::Codec(_) => USAGE,
        SdkError::Unplaceable(_) | SdkError::ActorsFailed { .. } => UNPLACEABLE,
        SdkError::TaskFailed(_) => FINISHED_WITH_FAILURES,
        SdkError::Connect { .. }
        | SdkError::Unauthenticated(_)
        | SdkError::PermissionDenied(_)
        | SdkError::Unavailable(_)
        | SdkError::Timeout(_)
        | SdkError::SchedulerGone { .. } => UNREACHABLE,
        SdkError::Scheduler { .. } | SdkError::LocalStart(_) => OTHER,
    }
}

fn of_job(error: &JobError) -> u8 {
    match error {
        JobError::Input(_)
        | JobError::BadRecord { .. }
        | JobError::Mismatch(_)
        | JobError::ChunkSize(_) => USAGE,
        JobError::Model(_) => UNPLACEABLE,
        JobError::ChunkFailed { .. } => FINISHED_WITH_FAILURES,
        JobError::Cluster(sdk) => of_sdk(sdk),
        JobError::Output(_) => OTHER,
    }
}

fn of_sweep(error: &SweepError) -> u8 {
    match error {
        SweepError::Config(_) | SweepError::Data(_) | SweepError::Mismatch(_) => USAGE,
        SweepError::Model(_) => UNPLACEABLE,
        SweepError::Sdk(sdk) => of_sdk(sdk),
        SweepError::Cluster(_) => UNREACHABLE,
        SweepError::Output(_) => OTHER,
    }
}

/// The exit status for `error`: the first error in its chain that says.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(sdk) = cause.downcast_ref::<SdkError>() {
            return of_sdk(sdk);
        }
        if let Some(job) = cause.downcast_ref::<JobError>() {
            return of_job(job);
        }
        if let Some(sweep) = cause.downcast_ref::<SweepError>() {
            return of_sweep(sweep);
        }
        if cause.is::<SweepConfigError>() || cause.is::<BadInput>() {
            return USAGE;
        }
        if cause.is::<FinishedWithFailures>() {
            return FINISHED_WITH_FAILURES;
        }
    }
    OTHER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_of_failure_has_its_status() {
        let code = |e: anyhow::Error| exit_code(&e);
        assert_eq!(code(SdkError::InvalidArgument("x".into()).into()), USAGE);
        assert_eq!(
            code(SdkError::Unplaceable("no T4".into()).into()),
            UNPLACEABLE
        );
        assert_eq!(
            code(SdkError::Unavailable("down".into()).into()),
            UNREACHABLE
        );
        assert_eq!(
            code(SdkError::Unauthenticated("no".into()).into()),
            UNREACHABLE
        );
        assert_eq!(
            code(JobError::Cluster(SdkError::Unplaceable("x".into())).into()),
            UNPLACEABLE
        );
        assert_eq!(
            code(
                JobError::ChunkFailed {
                    index: 3,
                    error: "boom".into()
                }
                .into()
            ),
            FINISHED_WITH_FAILURES
        );
        assert_eq!(code(JobError::Input("missing".into()).into()), USAGE);
        assert_eq!(
            code(anyhow::Error::from(SweepError::Data("empty".into())).context("sweep")),
            USAGE
        );
        assert_eq!(
            code(FinishedWithFailures("2 trials failed".into()).into()),
            FINISHED_WITH_FAILURES
        );
        assert_eq!(code(anyhow::anyhow!("disk full")), OTHER);
    }
}
