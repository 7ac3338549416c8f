//! Why an S3 call failed. Each message names the object or bucket and what went wrong, as
//! the strings these calls returned before did.

/// What the call was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Action {
    /// Listing a prefix.
    List,
    /// Reading an object.
    Read,
    /// Reading an object's size.
    Stat,
    /// Writing an object in one request.
    Write,
    /// Writing an object in parts.
    Upload,
    /// Deleting an object.
    Delete,
}

impl S3Action {
    fn verb(self) -> &'static str {
        match self {
            S3Action::List => "list",
            S3Action::Read => "read",
            S3Action::Stat => "stat",
            S3Action::Write => "write",
            S3Action::Upload => "upload",
            S3Action::Delete => "delete",
        }
    }
}

impl std::fmt::Display for S3Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.verb())
    }
}

/// Why an S3 call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum S3Error {
    /// The server (or the network on the way) refused or failed the call.
    #[error("cannot {action} s3://{bucket}/{key}: {reason}")]
    Call {
        /// What the call was doing.
        action: S3Action,
        /// The bucket.
        bucket: String,
        /// The key (the prefix, for a listing).
        key: String,
        /// What the client library said, with its context.
        reason: String,
    },
    /// A local file to upload could not be read.
    #[error("{path}: {reason}")]
    LocalFile {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The bucket does not exist.
    #[error("bucket {bucket} does not exist")]
    NoBucket {
        /// The bucket.
        bucket: String,
    },
    /// The bucket cannot be reached (credentials, endpoint, network).
    #[error("cannot reach bucket {bucket}: {reason}")]
    Unreachable {
        /// The bucket.
        bucket: String,
        /// What the client library said.
        reason: String,
    },
    /// This build has no S3 support.
    #[error(
        "this build has no S3 support: build with the `s3` feature of resident-storage (the resident CLI has it)"
    )]
    Disabled,
}

impl S3Error {
    /// A failed call: `action` on `s3://bucket/key`, for `reason`.
    pub fn call(action: S3Action, bucket: &str, key: &str, reason: impl ToString) -> Self {
        S3Error::Call {
            action,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// For callers whose own errors hold text.
impl From<S3Error> for String {
    fn from(error: S3Error) -> Self {
        error.to_string()
    }
}

/// An `s3://` location without a bucket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}: an S3 location needs a bucket (s3://bucket/prefix)")]
pub struct LocationError(pub String);

/// A pool's `model` (and `model_revision`) that names no model Resident can load.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelSpecError {
    /// No model at all.
    #[error(
        "the pool names no model; set `model` to a directory, an s3://bucket/prefix/ or a \
         Hugging Face id"
    )]
    NoModel,
    /// An `s3://` model without a bucket.
    #[error(transparent)]
    Location(#[from] LocationError),
    /// `org/name@a` with `model_revision: b`.
    #[error("model `{spec}` names revision {inline} but model_revision is {given}; give one")]
    TwoRevisions {
        /// The model as given.
        spec: String,
        /// The revision after its `@`.
        inline: String,
        /// `model_revision`.
        given: String,
    },
    /// A revision with characters a hub revision cannot have (or `..`).
    #[error("model `{spec}`: revision `{revision}` is not valid")]
    BadRevision {
        /// The model as given.
        spec: String,
        /// The revision.
        revision: String,
    },
}
