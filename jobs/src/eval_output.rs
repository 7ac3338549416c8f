//! `resident eval`'s `results.json` (the I/O; what is kept is `eval_suite`'s, pure): the
//! earlier run's results under the suite's output are read, this run's written over them
//! with the earlier results of the tasks it left out (`--only`). The CLI and Python's
//! `Cluster.eval` both write through here.

use crate::eval_suite::{EvalResults, MergedResults};
use crate::files::{read_under, write_under};
use crate::storage::{Location, S3Options};

/// Writes `results` as `results.json` under `output` (a directory or an S3 prefix, reached
/// with `s3`), keeping the earlier file's results of the suite's other tasks (`suite`:
/// every task's name, in order; see [`EvalResults::over_earlier`]). An earlier file that
/// is not results is written over, with a warning.
pub async fn write_results(
    output: &Location,
    s3: &S3Options,
    results: EvalResults,
    suite: &[&str],
) -> std::io::Result<MergedResults> {
    let earlier = match read_under(output, "results.json", s3).await? {
        None => None,
        Some(bytes) => match serde_json::from_slice::<EvalResults>(&bytes) {
            Ok(earlier) => Some(earlier),
            Err(e) => {
                tracing::warn!(
                    "the results.json under {output} is not a suite's results ({e}): \
                     writing this run's over it"
                );
                None
            }
        },
    };
    let merged = results.over_earlier(earlier, suite);
    let json = serde_json::to_vec_pretty(&merged.results).expect("results are JSON");
    write_under(output, "results.json", json, s3).await?;
    Ok(merged)
}
