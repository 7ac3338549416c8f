//! Listings capped in bytes: every record is bounded on its own (`policy/field_limits.rs`,
//! pool configs, job summaries), but a scheduler may hold enough of them that one answer
//! would pass the message limit, and then no client could list anything. An answer keeps
//! the first entries that fit in a quarter of the message limit and says how many it left
//! out.

use prost::Message;

/// The most bytes of entries one listing carries.
pub const MAX_LISTING_BYTES: usize = resident_proto::MAX_MESSAGE_BYTES / 4;

/// The first `entries` that fit in `max_bytes` (as encoded in a repeated field), and how
/// many were left out.
pub fn fit_listing<T: Message>(mut entries: Vec<T>, max_bytes: usize) -> (Vec<T>, u32) {
    let mut bytes = 0usize;
    let fitting = entries
        .iter()
        .take_while(|entry| {
            // The field's tag and length prefix: at most 1 + 10 bytes.
            bytes = bytes.saturating_add(entry.encoded_len() + 11);
            bytes <= max_bytes
        })
        .count();
    let omitted = entries.len() - fitting;
    entries.truncate(fitting);
    if omitted > 0 {
        tracing::warn!(omitted, max_bytes, "a listing was cut to fit its byte cap");
    }
    (entries, u32::try_from(omitted).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use resident_proto::pb;

    use super::*;

    #[test]
    fn entries_past_the_cap_are_left_out_and_counted() {
        let jobs: Vec<pb::JobStatus> = (0..100)
            .map(|i| pb::JobStatus {
                job_id: format!("job-{i}"),
                summary_json: "x".repeat(1000),
                ..Default::default()
            })
            .collect();
        let (all, omitted) = fit_listing(jobs.clone(), usize::MAX);
        assert_eq!((all.len(), omitted), (100, 0));
        let (some, omitted) = fit_listing(jobs, 10_000);
        assert_eq!(some.len() + omitted as usize, 100);
        assert!(!some.is_empty() && omitted > 0);
        let answer = pb::ListJobsResponse {
            jobs: some,
            omitted,
        };
        assert!(
            answer.encoded_len() <= 10_000 + 8,
            "{}",
            answer.encoded_len()
        );
        assert_eq!(answer.jobs[0].job_id, "job-0", "the first entries are kept");
    }
}
