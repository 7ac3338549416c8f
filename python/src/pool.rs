//! A pool from Python: bytes in, bytes out (`map` in input order, `submit` as they finish),
//! its status, its deletion.

use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use resident_sdk::{Bytes, JobStream, Pool};

use crate::errors::{sdk_error, task_failed};
use crate::wait::wait;

/// A pool of resident actors.
#[pyclass(module = "resident._resident", frozen)]
pub struct NativePool {
    pool: Pool,
}

impl NativePool {
    pub fn new(pool: Pool) -> Self {
        Self { pool }
    }
}

/// The results of one `submit`, as they finish: `(position, output)`.
#[pyclass(module = "resident._resident")]
pub struct NativeResults {
    results: JobStream,
}

#[pymethods]
impl NativePool {
    /// The pool's name.
    fn name(&self) -> String {
        self.pool.name().to_owned()
    }

    /// Runs every payload; the outputs in input order. A task that failed for good raises.
    fn map<'py>(
        &self,
        py: Python<'py>,
        payloads: Vec<Vec<u8>>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let pool = self.pool.clone();
        let payloads: Vec<Bytes> = payloads.into_iter().map(Bytes::from).collect();
        let outputs =
            wait(py, async move { pool.map(payloads).await })?.map_err(|e| sdk_error(py, e))?;
        outputs
            .into_iter()
            .map(|output| match output.output {
                Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
                Err(message) => Err(task_failed(
                    py,
                    format!("task {} failed: {message}", output.seq),
                )),
            })
            .collect()
    }

    /// Streams the payloads to the pool as one job named `job_name`.
    fn submit(
        &self,
        py: Python<'_>,
        job_name: String,
        payloads: Vec<Vec<u8>>,
    ) -> PyResult<NativeResults> {
        let pool = self.pool.clone();
        let inputs = futures::stream::iter(payloads.into_iter().map(Bytes::from));
        let results = wait(py, async move { pool.submit(&job_name, inputs).await })?
            .map_err(|e| sdk_error(py, e))?;
        Ok(NativeResults { results })
    }

    /// `resident pools --json`'s entry for this pool, as JSON.
    fn status(&self, py: Python<'_>) -> PyResult<String> {
        let pool = self.pool.clone();
        let status = wait(py, async move { pool.status().await })?.map_err(|e| sdk_error(py, e))?;
        Ok(resident_sdk::json::pool_json(&status).to_string())
    }

    /// Deletes the pool: its actors stop and free what they hold.
    fn delete(&self, py: Python<'_>) -> PyResult<()> {
        let pool = self.pool.clone();
        wait(py, async move { pool.delete().await })?.map_err(|e| sdk_error(py, e))
    }
}

#[pymethods]
impl NativeResults {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next result to finish: `(position, output)`; a failed task raises.
    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyBytes>)>> {
        let results = &mut self.results;
        let next = wait(py, async move { results.next().await })?;
        match next {
            None => Ok(None),
            Some(Err(error)) => Err(sdk_error(py, error)),
            Some(Ok(output)) => match output.output {
                Ok(bytes) => Ok(Some((output.seq, PyBytes::new(py, &bytes)))),
                Err(message) => Err(task_failed(
                    py,
                    format!("task {} failed: {message}", output.seq),
                )),
            },
        }
    }
}
