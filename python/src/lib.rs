//! The native part of the `resident` Python package: PyO3 classes over `resident-sdk` and
//! `resident-jobs`, built against the stable ABI (one wheel for CPython 3.9 and newer).
//!
//! The Python layer (`python/pysrc/resident/`) owns the public names, docstrings, type
//! stubs, exception classes and progress bars; this crate only converts and delegates. Every
//! call that waits runs on one tokio runtime with the GIL released (`wait.rs`), takes
//! the GIL back ten times a second to let Python see Ctrl-C (the call's future is then
//! dropped, which cancels its job), and raises the package's exception classes
//! (`errors.rs`).

#![warn(missing_docs)]

use pyo3::prelude::*;

mod cluster;
mod embed_stream;
mod errors;
mod eval;
mod pool;
mod sweep;
mod wait;

/// The module `resident._resident`.
#[pymodule]
fn _resident(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cluster::local, m)?)?;
    m.add_function(wrap_pyfunction!(cluster::connect, m)?)?;
    m.add_function(wrap_pyfunction!(eval::eval_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(eval::eval_select, m)?)?;
    m.add_function(wrap_pyfunction!(eval::eval_suite_flags, m)?)?;
    m.add_function(wrap_pyfunction!(eval::eval_table, m)?)?;
    m.add_function(wrap_pyfunction!(eval::eval_write_results, m)?)?;
    m.add_class::<cluster::NativeCluster>()?;
    m.add_class::<pool::NativePool>()?;
    m.add_class::<pool::NativeResults>()?;
    m.add_class::<embed_stream::NativeEmbedStream>()?;
    Ok(())
}
