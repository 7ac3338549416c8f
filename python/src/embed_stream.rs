//! `Cluster.embed_iter` and `Cluster.embed`: one job per call on an embedding pool, fed
//! chunk by chunk from Python and answered in the order the chunks were sent. The Python
//! layer keeps a few chunks per actor in flight, so every actor stays busy however many there
//! are, and neither the input nor the answers pile up.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Mutex;

use futures::{Stream, StreamExt};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use resident_sdk::{EmbedOptions, EmbedPool, EmbeddedChunk, SdkError};
use tokio::sync::mpsc;

use crate::errors::{bad_input, sdk_error};
use crate::wait::wait;

type ChunkResults = Pin<Box<dyn Stream<Item = Result<EmbeddedChunk, SdkError>> + Send>>;

/// One embedding job, open for more chunks until `finish`.
#[pyclass(module = "resident._resident")]
pub struct NativeEmbedStream {
    /// Where sent chunks go (dropped by `finish`: the job ends after their answers).
    chunks: Option<mpsc::UnboundedSender<Vec<String>>>,
    /// Answers as actors finish them; dropping it cancels the job. (In a mutex only to be
    /// `Sync`, as Python classes must be: `recv` takes it out while it waits.)
    results: Option<Mutex<ChunkResults>>,
    /// Answers that came before an earlier chunk's, by position.
    early: BTreeMap<u64, EmbeddedChunk>,
    /// The position of the next answer to hand out.
    next: u64,
    sent: u64,
    actors: u32,
}

impl NativeEmbedStream {
    /// Opens the job on `pool`, each chunk embedded with `options`.
    pub fn start(py: Python<'_>, pool: EmbedPool, options: EmbedOptions) -> PyResult<Self> {
        let (sender, receiver) = mpsc::unbounded_channel::<Vec<String>>();
        let chunks = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|chunk| (chunk, receiver))
        });
        let started = wait(py, async move {
            let actors = pool.pool.status().await?.replicas();
            let results = pool.embed_chunks_with(chunks, options).await?;
            Ok::<_, SdkError>((actors, results))
        })?;
        let (actors, results) = started.map_err(|e| sdk_error(py, e))?;
        Ok(Self {
            chunks: Some(sender),
            results: Some(Mutex::new(Box::pin(results))),
            early: BTreeMap::new(),
            next: 0,
            sent: 0,
            actors,
        })
    }
}

#[pymethods]
impl NativeEmbedStream {
    /// The pool's actors (to keep each of them busy).
    fn actors(&self) -> u32 {
        self.actors
    }

    /// Sends one chunk of texts; its answer comes after those sent before it.
    fn send(&mut self, py: Python<'_>, texts: Vec<String>) -> PyResult<()> {
        let sender = self
            .chunks
            .as_ref()
            .ok_or_else(|| bad_input(py, "this embedding stream was finished"))?;
        sender
            .send(texts)
            .map_err(|_| bad_input(py, "this embedding stream's job has ended"))?;
        self.sent += 1;
        Ok(())
    }

    /// No more chunks: the job ends once the sent ones are answered.
    fn finish(&mut self) {
        self.chunks = None;
    }

    /// After `finish` and the last answer: waits until the scheduler has recorded the job's
    /// end (its result stream ends only then), so that a caller that looks at its jobs next
    /// finds this one finished. Waits with the GIL released.
    fn wait_ended(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.chunks.is_some() || self.next != self.sent {
            return Err(bad_input(
                py,
                "this embedding stream's job has not ended: finish it and take every answer first",
            ));
        }
        let Some(results) = self.results.take() else {
            return Ok(());
        };
        let mut results = results.into_inner().expect("the results' lock");
        let ended = wait(py, async move {
            match results.next().await {
                None => Ok(()),
                Some(Ok(chunk)) => Err(SdkError::TaskFailed(format!(
                    "the embedding job answered chunk {} that was never sent",
                    chunk.seq
                ))),
                Some(Err(error)) => Err(error),
            }
        })?;
        ended.map_err(|e| sdk_error(py, e))
    }

    /// Stops the job now (what is running is cancelled).
    fn cancel(&mut self) {
        self.chunks = None;
        self.results = None;
    }

    /// The next chunk's vectors, in the order sent: `(little-endian f32 bytes, dim, rows)`;
    /// `None` when every sent chunk was answered. Waits with the GIL released.
    fn recv<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, usize, usize)>> {
        if self.next == self.sent {
            return Ok(None);
        }
        let next = self.next;
        let early = &mut self.early;
        // Taken out while waiting; an interrupted wait drops it, which cancels the job.
        let mut results = self
            .results
            .take()
            .map(|stream| stream.into_inner().expect("the results' lock"));
        let (found, results) = wait(py, async move {
            let found = loop {
                if let Some(chunk) = early.remove(&next) {
                    break Ok(chunk);
                }
                let Some(stream) = results.as_mut() else {
                    break Err(SdkError::TaskFailed(
                        "the embedding stream was cancelled".into(),
                    ));
                };
                match stream.next().await {
                    Some(Ok(chunk)) => {
                        early.insert(chunk.seq, chunk);
                    }
                    Some(Err(error)) => break Err(error),
                    None => {
                        break Err(SdkError::TaskFailed(format!(
                            "the embedding job ended without chunk {next}'s answer"
                        )));
                    }
                }
            };
            (found, results)
        })?;
        self.results = results.map(Mutex::new);
        let chunk = found.map_err(|e| sdk_error(py, e))?;
        self.next += 1;
        let rows = chunk.stats.count as usize;
        let mut bytes = Vec::with_capacity(chunk.values.len() * 4);
        for value in &chunk.values {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        Ok(Some((PyBytes::new(py, &bytes), chunk.dim, rows)))
    }
}
