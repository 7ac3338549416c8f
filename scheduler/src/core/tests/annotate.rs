//! A job's summary (`AnnotateJob`, a sweep's leaderboard): only its owner or an admin sets
//! it; it must be a JSON object of at most 64 KiB.

use super::*;
use crate::core::jobs::MAX_JOB_SUMMARY_BYTES;

fn annotate(
    h: &mut Harness,
    job: &JobId,
    requester: Principal,
    summary_json: &str,
) -> Result<(), SchedulerError> {
    answer(
        |reply| SchedulerCommand::AnnotateJob {
            job: job.clone(),
            requester,
            summary_json: summary_json.to_owned(),
            reply,
        },
        &mut h.core,
    )
}

#[tokio::test(start_paused = true)]
async fn the_owner_sets_a_jobs_summary_and_others_and_bad_ones_are_refused() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let (job, _rx) = h.open_job_as("p", "alice");
    let summary = r#"{"status":"1/4 trials done","leaderboard":[{"trial":0}]}"#;
    annotate(&mut h, &job, submitter("alice"), summary).unwrap();
    assert_eq!(h.job(&job).summary_json, summary);

    let refused = annotate(&mut h, &job, submitter("bob"), "{}").unwrap_err();
    assert!(
        refused.to_string().contains("belongs to `alice`"),
        "{refused}"
    );
    let admin = Principal {
        name: "ops".into(),
        role: Role::Admin,
    };
    annotate(&mut h, &job, admin.clone(), "{}").unwrap();

    let not_object = annotate(&mut h, &job, admin.clone(), "[1, 2]").unwrap_err();
    assert!(
        not_object.to_string().contains("JSON object"),
        "{not_object}"
    );
    let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_JOB_SUMMARY_BYTES));
    let too_big = annotate(&mut h, &job, admin.clone(), &huge).unwrap_err();
    assert!(
        too_big.to_string().contains("fewer leaderboard rows"),
        "{too_big}"
    );
    assert_eq!(
        h.job(&job).summary_json,
        "{}",
        "a refused summary changes nothing"
    );
    let missing = annotate(&mut h, &JobId::new("nope"), admin, "{}").unwrap_err();
    assert!(matches!(missing, SchedulerError::NotFound(_)), "{missing}");
}
