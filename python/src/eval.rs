//! `Cluster.eval`'s native part: each task's figures from its report, and the results
//! table, as `resident eval` makes them (`resident_jobs::eval_suite`), so Python and the
//! CLI name and print them alike.

use pyo3::prelude::*;
use resident_jobs::corpus_job::GenerateFigures;
use resident_jobs::eval_suite::{
    EvalResults, check_task_names, results_table, select_tasks, task_metrics,
};

use crate::errors::bad_input;

/// The tasks of `names` to run: those `only` names (all when it is empty), in order; the
/// names refused as `resident eval` refuses a suite's.
#[pyfunction]
pub fn eval_select(py: Python<'_>, names: Vec<String>, only: Vec<String>) -> PyResult<Vec<String>> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check_task_names(names.iter().copied()).map_err(|e| bad_input(py, e))?;
    let selected = select_tasks(&names, &only).map_err(|e| bad_input(py, e))?;
    Ok(selected.into_iter().map(str::to_owned).collect())
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
