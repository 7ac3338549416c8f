//! Typed calls to a pool of a typed actor kind (see [`resident_actor::Kind`]): requests go
//! out and replies come back in the kind's own types, encoded once for the whole project
//! (postcard). Outer errors are the runtime's ([`SdkError`]: the cluster, a task that failed
//! for good, bytes that do not decode); the inner [`Reply`] is the actor's answer, its
//! response or the kind's own error.
//!
//! ```no_run
//! # use resident_sdk::{Cluster, PoolSpec, SdkError};
//! # use resident_sdk::actor::{Kind, Reply};
//! # struct WordCount;
//! # impl Kind for WordCount {
//! #     const NAME: &'static str = "word-count"; const VERSION: u32 = 1;
//! #     type Config = (); type Request = Vec<String>; type Response = Vec<usize>;
//! #     type Error = String;
//! # }
//! # async fn demo(cluster: Cluster) -> Result<(), SdkError> {
//! let pool = cluster.create_pool(PoolSpec::typed::<WordCount>("words", &())?.replicas(2)).await?;
//! pool.wait_ready(std::time::Duration::from_secs(60)).await?;
//! let words = pool.typed::<WordCount>();
//! let counts: Reply<WordCount> = words.call(&vec!["two words".to_owned()]).await?;
//! let many: Vec<Reply<WordCount>> = words.map(vec![vec!["a".to_owned()]; 10]).await?;
//! # Ok(()) }
//! ```

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use resident_actor::{CodecError, Kind, Reply, decode_reply, encode_request};

use crate::{ActorId, Bytes, CallSession, JobStream, NodeId, Pool, SdkError, SubmitOptions};

/// A pool's typed handle: [`Pool::typed`].
pub struct TypedPool<K: Kind> {
    pool: Pool,
    /// The job that carries [`TypedPool::call`]s, opened on the first one.
    session: tokio::sync::Mutex<Option<CallSession>>,
    kind: PhantomData<fn() -> K>,
}

/// One answer of [`TypedPool::submit`].
pub struct TypedOutput<K: Kind> {
    /// Position of the request in the submitted stream (0-based).
    pub seq: u64,
    /// The kind's reply: its response, or its error.
    pub reply: Reply<K>,
    /// The actor that answered.
    pub actor_id: ActorId,
    /// The node of that actor.
    pub node_id: NodeId,
}

impl<K: Kind> TypedPool<K> {
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            session: tokio::sync::Mutex::new(None),
            kind: PhantomData,
        }
    }

    /// The untyped pool underneath.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// One call, like calling a Ray actor handle; calls from one handle run one at a time
    /// over one long-lived job (use [`TypedPool::map`] or [`TypedPool::submit`] for many).
    pub async fn call(&self, request: &K::Request) -> Result<Reply<K>, SdkError> {
        let payload = encode_request::<K>(request)?;
        let mut session = self.session.lock().await;
        if session.is_none() {
            *session = Some(self.pool.session().await?);
        }
        let answer = session.as_mut().expect("opened above").call(payload).await;
        if answer.is_err() {
            // A broken session is opened afresh by the next call.
            *session = None;
        }
        Ok(decode_reply::<K>(&answer?)?)
    }

    /// Runs every request and returns the replies in input order.
    pub async fn map<I>(&self, requests: I) -> Result<Vec<Reply<K>>, SdkError>
    where
        I: IntoIterator<Item = K::Request>,
    {
        let payloads = requests
            .into_iter()
            .map(|request| encode_request::<K>(&request).map(Bytes::from))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = self.pool.map(payloads).await?;
        outputs
            .into_iter()
            .map(|output| {
                let bytes = output.output.map_err(SdkError::TaskFailed)?;
                Ok(decode_reply::<K>(&bytes)?)
            })
            .collect()
    }

    /// Streams `requests` to the pool as one job; replies arrive as they finish, each once,
    /// with their position in the stream. At most `window` requests are in flight (0: the
    /// scheduler's limit).
    pub async fn submit<S>(
        &self,
        job_name: &str,
        requests: S,
        window: u32,
    ) -> Result<TypedStream<K>, SdkError>
    where
        S: Stream<Item = K::Request> + Send + 'static,
    {
        // A request that does not encode ends the input there; the stream reports it after
        // the replies to the requests before it.
        let refused: Arc<Mutex<Option<CodecError>>> = Arc::default();
        let seen = refused.clone();
        let payloads = requests
            .map(move |request| encode_request::<K>(&request))
            .take_while(move |encoded| {
                let keep = match encoded {
                    Ok(_) => true,
                    Err(error) => {
                        *seen.lock().expect("refusal") = Some(error.clone());
                        false
                    }
                };
                futures::future::ready(keep)
            })
            .filter_map(|encoded| futures::future::ready(encoded.ok().map(Bytes::from)));
        let options = SubmitOptions {
            window,
            ..SubmitOptions::default()
        };
        let results = self.pool.submit_with(job_name, payloads, options).await?;
        Ok(TypedStream {
            results,
            refused,
            kind: PhantomData,
        })
    }
}

/// The replies of [`TypedPool::submit`], as they finish.
pub struct TypedStream<K: Kind> {
    results: JobStream,
    refused: Arc<Mutex<Option<CodecError>>>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Kind> Stream for TypedStream<K> {
    type Item = Result<TypedOutput<K>, SdkError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.results.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(output))) => {
                let reply = output
                    .output
                    .map_err(SdkError::TaskFailed)
                    .and_then(|bytes| Ok(decode_reply::<K>(&bytes)?));
                Poll::Ready(Some(reply.map(|reply| TypedOutput {
                    seq: output.seq,
                    reply,
                    actor_id: output.actor_id,
                    node_id: output.node_id,
                })))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error))),
            Poll::Ready(None) => {
                let refused = self.refused.lock().expect("refusal").take();
                Poll::Ready(refused.map(|error| Err(error.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Pool {
    /// A typed handle on this pool, for a pool of the typed kind `K` (see [`crate::actor`]).
    pub fn typed<K: resident_actor::Kind>(&self) -> TypedPool<K> {
        TypedPool::new(self.clone())
    }
}
