//! The SDK's and the jobs' errors as the package's exception classes (defined in Python,
//! `resident/errors.py`): `ResidentError` and its subclasses `Unplaceable`,
//! `Unauthenticated`, `PermissionDenied`, `SchedulerGone`, `BadInput`. Each carries the Rust
//! error's message and its kind (the variant's name) as `kind`.

use pyo3::prelude::*;
use resident_jobs::corpus_job::JobError;
use resident_jobs::sweep::SweepError;
use resident_sdk::SdkError;

/// The exception `class` of `resident.errors`, raised with `message` and `kind`.
fn raise(py: Python<'_>, class: &str, message: String, kind: &str) -> PyErr {
    let made = py
        .import("resident.errors")
        .and_then(|module| module.getattr(class))
        .and_then(|class| class.call1((message.clone(), kind)));
    match made {
        Ok(value) => PyErr::from_value(value),
        // The package's Python half is missing (the native module imported alone).
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}

/// The exception class and kind for an SDK error.
fn sdk_class(error: &SdkError) -> (&'static str, &'static str) {
    match error {
        SdkError::Unplaceable(_) => ("Unplaceable", "Unplaceable"),
        SdkError::Unauthenticated(_) => ("Unauthenticated", "Unauthenticated"),
        SdkError::PermissionDenied(_) => ("PermissionDenied", "PermissionDenied"),
        SdkError::SchedulerGone { .. } => ("SchedulerGone", "SchedulerGone"),
        SdkError::Unavailable(_) => ("SchedulerGone", "Unavailable"),
        SdkError::Connect { .. } => ("SchedulerGone", "Connect"),
        SdkError::BadUrl { .. } => ("BadInput", "BadUrl"),
        SdkError::Credentials(_) => ("BadInput", "Credentials"),
        SdkError::InvalidArgument(_) => ("BadInput", "InvalidArgument"),
        SdkError::NotFound(_) => ("BadInput", "NotFound"),
        SdkError::AlreadyExists(_) => ("BadInput", "AlreadyExists"),
        SdkError::Precondition(_) => ("ResidentError", "Precondition"),
        SdkError::ActorsFailed { .. } => ("ResidentError", "ActorsFailed"),
        SdkError::Timeout(_) => ("ResidentError", "Timeout"),
        SdkError::Scheduler { .. } => ("ResidentError", "Scheduler"),
        SdkError::TaskFailed(_) => ("ResidentError", "TaskFailed"),
        SdkError::LocalStart(_) => ("ResidentError", "LocalStart"),
        SdkError::MixedModels(_) => ("ResidentError", "MixedModels"),
        SdkError::Codec(_) => ("ResidentError", "Codec"),
    }
}

/// An SDK error as its exception.
pub fn sdk_error(py: Python<'_>, error: SdkError) -> PyErr {
    let (class, kind) = sdk_class(&error);
    raise(py, class, error.to_string(), kind)
}

/// A sweep's error as its exception: a refused declaration, data or output (another sweep
/// there) is `BadInput`; the cluster's errors are as for any call.
pub fn sweep_error(py: Python<'_>, error: SweepError) -> PyErr {
    let (class, kind) = match &error {
        SweepError::Sdk(inner) => sdk_class(inner),
        SweepError::Config(_) => ("BadInput", "Config"),
        SweepError::Data(_) => ("BadInput", "Data"),
        SweepError::Mismatch(_) => ("BadInput", "Mismatch"),
        SweepError::Output(_) => ("ResidentError", "Output"),
        SweepError::Model(_) => ("ResidentError", "Model"),
        SweepError::Cluster(_) => ("ResidentError", "Cluster"),
    };
    raise(py, class, error.to_string(), kind)
}

/// A corpus job's error as its exception: what the input or settings got wrong is
/// `BadInput`; the cluster's errors are as for any call.
pub fn job_error(py: Python<'_>, error: JobError) -> PyErr {
    let (class, kind) = match &error {
        JobError::Cluster(inner) => sdk_class(inner),
        JobError::Input(_) => ("BadInput", "Input"),
        JobError::BadRecord { .. } => ("BadInput", "BadRecord"),
        JobError::Mismatch(_) => ("BadInput", "Mismatch"),
        JobError::ChunkSize(_) => ("BadInput", "ChunkSize"),
        JobError::Output(_) => ("ResidentError", "Output"),
        JobError::Model(_) => ("ResidentError", "Model"),
        JobError::ChunkFailed { .. } => ("ResidentError", "ChunkFailed"),
    };
    raise(py, class, error.to_string(), kind)
}

/// Bad arguments found before any call: `BadInput`.
pub fn bad_input(py: Python<'_>, message: impl Into<String>) -> PyErr {
    raise(py, "BadInput", message.into(), "BadInput")
}

/// A task the actors answered with an error: `ResidentError` of kind `TaskFailed`.
pub fn task_failed(py: Python<'_>, message: String) -> PyErr {
    raise(py, "ResidentError", message, "TaskFailed")
}
