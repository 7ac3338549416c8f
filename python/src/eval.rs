//! `Cluster.eval`'s native part: each task's figures from its report, the results table
//! and results.json (kept with an earlier run's results of the tasks left out), as
//! `resident eval` makes them (`resident_jobs::eval_suite`, `resident_jobs::eval_output`),
//! so Python and the CLI name, print and keep them alike.

use pyo3::prelude::*;
use resident_jobs::corpus_job::{GenerateFigures, JobError};
use resident_jobs::eval_output::write_results;
use resident_jobs::eval_suite::{
    EvalResults, EvalSuite, check_task_names, results_table, select_tasks, task_metrics,
};
use resident_jobs::storage::{Location, S3Options};

use crate::errors::{bad_input, job_error};
use crate::wait::wait;

/// The tasks of `names` to run: those `only` names (all when it is empty), in order; the
/// names refused as `resident eval` refuses a suite's.
#[pyfunction]
pub fn eval_select(py: Python<'_>, names: Vec<String>, only: Vec<String>) -> PyResult<Vec<String>> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check_task_names(names.iter().copied()).map_err(|e| bad_input(py, e))?;
    let selected = select_tasks(&names, &only).map_err(|e| bad_input(py, e))?;
    Ok(selected.into_iter().map(str::to_owned).collect())
}

/// A `resident eval` suite file's tasks (`text`, its TOML), checked as `resident eval`
/// checks them: each task's name and its `resident generate` flags, the suite's first.
#[pyfunction]
pub fn eval_suite_flags(py: Python<'_>, text: &str) -> PyResult<Vec<(String, Vec<String>)>> {
    let suite = EvalSuite::parse(text).map_err(|e| bad_input(py, e))?;
    let flags_of = |task: &resident_jobs::eval_suite::EvalTask| {
        suite.flags.iter().chain(&task.flags).cloned().collect()
    };
    Ok((suite.tasks.iter())
        .map(|task| (task.name.clone(), flags_of(task)))
        .collect())
}

/// A task's figures (JSON list of `{metric, value, stderr, records}`) from its report.json
/// (as JSON).
#[pyfunction]
pub fn eval_metrics(py: Python<'_>, report_json: &str) -> PyResult<String> {
    let figures: GenerateFigures = serde_json::from_str(report_json)
        .map_err(|e| bad_input(py, format!("a generate job's report: {e}")))?;
    serde_json::to_string(&task_metrics(&figures)).map_err(|e| bad_input(py, e.to_string()))
}

/// The results table (Markdown) of results.json (as JSON).
#[pyfunction]
pub fn eval_table(py: Python<'_>, results_json: &str) -> PyResult<String> {
    let results: EvalResults = serde_json::from_str(results_json)
        .map_err(|e| bad_input(py, format!("eval results: {e}")))?;
    Ok(results_table(&results))
}

/// Writes results.json in `output`, a directory or an `s3://bucket/prefix` (reached
/// through `s3_endpoint`, as the tasks' outputs were), as `resident eval` does: `results_json`
/// (this run's) with the earlier file's results of the suite's other tasks (`suite`: every
/// task's name, in order). Returns what was written (as JSON) and what to tell of the
/// earlier results (`None`: nothing).
#[pyfunction]
#[pyo3(signature = (output, results_json, suite, s3_endpoint=None))]
pub fn eval_write_results(
    py: Python<'_>,
    output: &str,
    results_json: &str,
    suite: Vec<String>,
    s3_endpoint: Option<String>,
) -> PyResult<(String, Option<String>)> {
    let location = Location::parse(output).map_err(|e| bad_input(py, e.to_string()))?;
    let results: EvalResults = serde_json::from_str(results_json)
        .map_err(|e| bad_input(py, format!("eval results: {e}")))?;
    let s3 = S3Options {
        endpoint: s3_endpoint,
        ..S3Options::default()
    };
    let written = wait(py, async move {
        let suite: Vec<&str> = suite.iter().map(String::as_str).collect();
        write_results(&location, &s3, results, &suite).await
    })?;
    let merged = written
        .map_err(|e| job_error(py, JobError::Output(format!("writing results.json: {e}"))))?;
    let json = serde_json::to_string_pretty(&merged.results).expect("results are JSON");
    Ok((json, merged.note()))
}
