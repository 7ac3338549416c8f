//! `Cluster.sweep`: `resident sweep` from Python, on a declaration given as TOML text or as
//! the same keys in a dict (sent here as JSON), with the CLI's run options.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use resident_jobs::sweep::{SweepConfig, SweepEvent, run_sweep};
use resident_sdk::Cluster;

use crate::errors::{bad_input, sweep_error};
use crate::wait::wait_ticking;

/// What `resident sweep`'s flags set beside the declaration.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RunOptions {
    output: Option<String>,
    #[serde(default)]
    keep_pool: bool,
    price: Option<BTreeMap<String, f64>>,
}

/// The declaration, checked as the CLI checks a file: `format` says whether `text` is the
/// TOML file's or a dict's JSON.
fn declaration(py: Python<'_>, text: &str, format: &str) -> PyResult<SweepConfig> {
    let config = match format {
        "toml" => SweepConfig::from_toml(text).map_err(|e| bad_input(py, e.to_string()))?,
        "json" => {
            let config: SweepConfig = serde_json::from_str(text)
                .map_err(|e| bad_input(py, format!("sweep declaration: {e}")))?;
            config
                .validate()
                .map_err(|e| bad_input(py, e.to_string()))?;
            config
        }
        other => {
            return Err(bad_input(
                py,
                format!("format {other:?} is not toml or json"),
            ));
        }
    };
    Ok(config)
}

/// Trials done and trials in all, when they moved since the bar last saw them.
type SharedTrials = Arc<Mutex<Option<(usize, usize)>>>;

/// Calls `on_progress(done, total)` with the latest counts, if they moved.
fn report(py: Python<'_>, shared: &SharedTrials, on_progress: &Option<Py<PyAny>>) -> PyResult<()> {
    let latest = shared.lock().expect("progress").take();
    if let (Some((done, total)), Some(callback)) = (latest, on_progress) {
        callback.call1(py, (done, total))?;
    }
    Ok(())
}

/// Runs the sweep to its end, calling `on_progress(done, total)` as trials finish; returns
/// `summary.json` as JSON.
pub fn run(
    py: Python<'_>,
    cluster: Cluster,
    text: &str,
    format: &str,
    options_json: &str,
    on_progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let mut config = declaration(py, text, format)?;
    let options: RunOptions = serde_json::from_str(options_json)
        .map_err(|e| bad_input(py, format!("sweep options: {e}")))?;
    if let Some(output) = options.output {
        config.output = output;
    }
    config.keep_pool |= options.keep_pool;
    config
        .prices
        .per_pool_label
        .extend(options.price.unwrap_or_default());
    let shared: SharedTrials = Arc::default();
    let sink = shared.clone();
    let finished = wait_ticking(
        py,
        move || async move {
            let mut counts = (0usize, 0usize);
            let mut on_event = |event: SweepEvent<'_>| {
                match event {
                    SweepEvent::TrialsPlanned { total, resumed } => counts = (resumed.len(), total),
                    SweepEvent::TrialFinished(_) => counts.0 += 1,
                    SweepEvent::DataReady { .. }
                    | SweepEvent::PbtRound { .. }
                    | SweepEvent::PopulationResumed { .. } => return,
                }
                *sink.lock().expect("progress") = Some(counts);
            };
            run_sweep(&cluster, &config, &mut on_event).await
        },
        |py| report(py, &shared, &on_progress),
    )?;
    report(py, &shared, &on_progress)?;
    let summary = finished.map_err(|e| sweep_error(py, e))?;
    serde_json::to_string(&summary).map_err(|e| bad_input(py, e.to_string()))
}
