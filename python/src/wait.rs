//! Waiting on the SDK's futures from Python: one runtime, the GIL released, Ctrl-C heard.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;

/// How often a wait takes the GIL back: Python runs its signal handlers (Ctrl-C) and the
/// caller's `tick` (a progress bar) then.
const TICK: Duration = Duration::from_millis(100);

/// The runtime every call runs on; an in-process cluster's servers live on it too.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("resident")
            .build()
            .expect("a tokio runtime")
    })
}

/// Runs the future `start` makes to its end with the GIL released. Every [`TICK`] it takes
/// the GIL back, runs Python's signal handlers (a `KeyboardInterrupt` drops the future,
/// which cancels what it started, and is raised) and calls `tick`. The future is made and
/// polled on this thread, so it need not be `Send`.
pub fn wait_ticking<Fut>(
    py: Python<'_>,
    start: impl FnOnce() -> Fut + Send,
    mut tick: impl FnMut(Python<'_>) -> PyResult<()> + Send,
) -> PyResult<Fut::Output>
where
    Fut: Future,
    Fut::Output: Send,
{
    let runtime = runtime();
    py.detach(move || {
        runtime.block_on(async move {
            let mut job = std::pin::pin!(start());
            loop {
                match tokio::time::timeout(TICK, job.as_mut()).await {
                    Ok(output) => return Ok(output),
                    Err(_elapsed) => Python::attach(|py| {
                        py.check_signals()?;
                        tick(py)
                    })?,
                }
            }
        })
    })
}

/// [`wait_ticking`] for a future at hand, with nothing to do between waits.
pub fn wait<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    wait_ticking(py, move || future, |_| Ok(()))
}
