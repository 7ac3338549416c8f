//! A lock on an S3 output prefix: a lease object (`.resident.lock`) that names its run and
//! is renewed while the run writes. S3 has no `flock`: a second run reads the lease and is
//! refused while it is fresh. A lease is taken over when it is stale (not renewed for
//! [`LEASE_TTL`]) or when its holder was a process on this host that no longer exists (a
//! killed run, so a rerun resumes at once). Where the store supports conditional writes the
//! lease is created with `If-None-Match`, and every acquisition reads the lease back, so of
//! two runs racing for it only one goes on.

use std::time::Duration;

use resident_storage::S3Error;
use serde::{Deserialize, Serialize};

use super::{S3Client, key_under};

/// A lease not renewed for this long belongs to a run that is gone.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The lease object under the output prefix (the same name as the local lock file).
pub const LEASE_OBJECT: &str = ".resident.lock";

/// What a lease object holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Unique per run.
    pub run: String,
    /// The holder's host.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the holder last renewed it.
    pub renewed_unix_ms: u64,
}

/// Whether a run may take the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// Nobody holds it (or the holder is gone): take it.
    Take,
    /// A live run holds it: refuse.
    Refuse {
        /// Who holds it (`pid N on HOST`).
        holder: String,
        /// How long ago it was renewed.
        age: Duration,
    },
}

/// Decides from the lease found (if any). `pid_alive` answers for processes on this host.
pub fn lease_verdict(
    found: Option<&Lease>,
    now_unix_ms: u64,
    this_host: &str,
    pid_alive: impl Fn(u32) -> bool,
) -> LeaseVerdict {
    let Some(lease) = found else {
        return LeaseVerdict::Take;
    };
    let age = Duration::from_millis(now_unix_ms.saturating_sub(lease.renewed_unix_ms));
    let stale = age > LEASE_TTL;
    let holder_gone = lease.host == this_host && !pid_alive(lease.pid);
    if stale || holder_gone {
        LeaseVerdict::Take
    } else {
        LeaseVerdict::Refuse {
            holder: format!("pid {} on {}", lease.pid, lease.host),
            age,
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Held while a run writes an S3 output; renewed in the background, deleted on drop.
#[derive(Debug)]
pub struct S3OutputLease {
    renewal: tokio::task::JoinHandle<()>,
    release: Option<(S3Client, String, String)>,
}

impl Drop for S3OutputLease {
    fn drop(&mut self) {
        self.renewal.abort();
        if let Some((client, bucket, key)) = self.release.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Best effort: if it never runs, the lease goes stale after LEASE_TTL.
            runtime.spawn(async move { client.delete(&bucket, &key).await });
        }
    }
}

impl S3OutputLease {
    /// Stops renewing and deletes the lease.
    pub async fn release(mut self) {
        self.renewal.abort();
        if let Some((client, bucket, key)) = self.release.take()
            && let Err(error) = client.delete(&bucket, &key).await
        {
            tracing::warn!(%error, "cannot delete the output lease; it goes stale by itself");
        }
    }

    /// Takes the lease on `s3://bucket/prefix`, or says who holds it.
    pub async fn acquire(
        client: &S3Client,
        bucket: &str,
        prefix: &str,
    ) -> Result<Self, LeaseRefused> {
        let key = key_under(prefix, LEASE_OBJECT);
        let place = format!("s3://{bucket}/{prefix}");
        let host = crate::files::this_host();
        let found = match client.get(bucket, &key).await? {
            Some(bytes) => serde_json::from_slice::<Lease>(&bytes).ok(),
            None => None,
        };
        if let LeaseVerdict::Refuse { holder, age } = lease_verdict(
            found.as_ref(),
            resident_proto::unix_ms_now(),
            &host,
            pid_alive,
        ) {
            return Err(LeaseRefused::Held { place, holder, age });
        }
        let lease = Lease {
            run: uuid::Uuid::new_v4().to_string(),
            host,
            pid: std::process::id(),
            renewed_unix_ms: resident_proto::unix_ms_now(),
        };
        let bytes = serde_json::to_vec(&lease).expect("a lease serialises");
        let created = match found {
            None => client.put_if_absent(bucket, &key, bytes).await?,
            Some(_) => client.put(bucket, &key, bytes).await.map(|()| true)?,
        };
        // Read back: a run that raced us (on a store without conditional writes) may have
        // written after us.
        let now_held = match client.get(bucket, &key).await? {
            Some(bytes) => serde_json::from_slice::<Lease>(&bytes).ok(),
            None => None,
        };
        if !created || now_held.as_ref().map(|l| &l.run) != Some(&lease.run) {
            let holder = now_held.map_or_else(
                || "another run".to_owned(),
                |l| format!("pid {} on {}", l.pid, l.host),
            );
            return Err(LeaseRefused::Held {
                place,
                holder,
                age: Duration::ZERO,
            });
        }
        let renewal = tokio::spawn(renew(client.clone(), bucket.to_owned(), key.clone(), lease));
        Ok(Self {
            renewal,
            release: Some((client.clone(), bucket.to_owned(), key)),
        })
    }
}

/// Why the output lease was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseRefused {
    /// Another run holds it and renews it.
    #[error(
        "another run is writing {place} ({holder}, lease renewed {:.0} s ago); wait for it to \
         finish or stop it (a rerun then resumes; a lease not renewed for {} s is taken over), \
         or choose another output",
        .age.as_secs_f64(),
        LEASE_TTL.as_secs()
    )]
    Held {
        /// The output, `s3://bucket/prefix`.
        place: String,
        /// Who holds it (`pid N on HOST`, or `another run`).
        holder: String,
        /// How long ago it was renewed.
        age: Duration,
    },
    /// The lease object could not be read or written.
    #[error(transparent)]
    Storage(#[from] S3Error),
}

async fn renew(client: S3Client, bucket: String, key: String, mut lease: Lease) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        lease.renewed_unix_ms = resident_proto::unix_ms_now();
        let bytes = serde_json::to_vec(&lease).expect("a lease serialises");
        if let Err(error) = client.put(&bucket, &key, bytes).await {
            tracing::warn!(%error, "cannot renew the output lease; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(host: &str, pid: u32, renewed_unix_ms: u64) -> Lease {
        Lease {
            run: "r".into(),
            host: host.into(),
            pid,
            renewed_unix_ms,
        }
    }

    #[test]
    fn a_fresh_lease_of_a_live_run_is_respected() {
        let found = lease("other", 7, 100_000);
        let verdict = lease_verdict(Some(&found), 105_000, "here", |_| true);
        assert_eq!(
            verdict,
            LeaseVerdict::Refuse {
                holder: "pid 7 on other".into(),
                age: Duration::from_secs(5)
            }
        );
    }

    #[test]
    fn no_lease_a_stale_lease_or_a_dead_local_holder_is_taken() {
        assert_eq!(lease_verdict(None, 0, "here", |_| true), LeaseVerdict::Take);
        let stale = lease("other", 7, 0);
        let after_ttl = LEASE_TTL.as_millis() as u64 + 1;
        assert_eq!(
            lease_verdict(Some(&stale), after_ttl, "here", |_| true),
            LeaseVerdict::Take
        );
        let killed = lease("here", 7, 100_000);
        assert_eq!(
            lease_verdict(Some(&killed), 100_001, "here", |_| false),
            LeaseVerdict::Take,
            "a killed run on this host does not hold its output"
        );
        let live_here = lease("here", 7, 100_000);
        assert!(matches!(
            lease_verdict(Some(&live_here), 100_001, "here", |_| true),
            LeaseVerdict::Refuse { .. }
        ));
    }
}
