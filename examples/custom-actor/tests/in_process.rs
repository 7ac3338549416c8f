//! The MinHash kind tested in process: `Cluster::local()` with the kind registered, typed
//! calls through the real scheduler and agent (gRPC over loopback), typed errors back.

use std::collections::BTreeSet;
use std::time::Duration;

use custom_actor::{MinHash, MinHashActor, MinHashConfig, MinHashError, MinHashRequest};
use futures::StreamExt;
use resident_sdk::actor::{LoadContext, TypedActor};
use resident_sdk::{Cluster, LocalConfig, PoolSpec};

fn texts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "document {i} says something about topic {} at length",
                i % 7
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kind_answers_typed_calls_in_process() {
    let mut local = LocalConfig::default();
    local.kinds.register_actor::<MinHashActor>();
    let cluster = Cluster::local(local).await.unwrap();
    let config = MinHashConfig {
        max_texts_per_call: 4,
        ..MinHashConfig::default()
    };
    let spec = PoolSpec::typed::<MinHash>("dedup", &config)
        .unwrap()
        .replicas(2);
    let pool = cluster.create_pool(spec).await.unwrap();
    pool.wait_ready(Duration::from_secs(60)).await.unwrap();
    let minhash = pool.typed::<MinHash>();

    // What an actor computes here is what the pool's actors compute.
    let mut reference =
        MinHashActor::load(config.clone(), &LoadContext::standalone("ref", vec![])).unwrap();
    let requests: Vec<MinHashRequest> = texts(12)
        .chunks(3)
        .map(|t| MinHashRequest { texts: t.to_vec() })
        .collect();
    let expected: Vec<_> = requests
        .iter()
        .map(|r| reference.handle(r.clone()).unwrap())
        .collect();

    let one = minhash.call(&requests[0]).await.unwrap().unwrap();
    assert_eq!(one, expected[0]);
    assert_eq!(one[0].len(), 128);

    let refused = minhash
        .call(&MinHashRequest { texts: texts(5) })
        .await
        .unwrap();
    assert_eq!(
        refused,
        Err(MinHashError::TooManyTexts { got: 5, limit: 4 })
    );
    // The handle goes on after a typed error.
    assert_eq!(
        minhash.call(&requests[1]).await.unwrap().unwrap(),
        expected[1]
    );

    let mapped = minhash.map(requests.clone()).await.unwrap();
    let mapped: Vec<_> = mapped.into_iter().map(Result::unwrap).collect();
    assert_eq!(mapped, expected, "map answers in input order");

    let mut stream = minhash
        .submit("stream", futures::stream::iter(requests.clone()), 2)
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    while let Some(output) = stream.next().await {
        let output = output.unwrap();
        assert!(seen.insert(output.seq), "seq {} twice", output.seq);
        assert_eq!(output.reply.unwrap(), expected[output.seq as usize]);
    }
    assert_eq!(seen.len(), requests.len(), "each reply once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_a_version_no_agent_has_is_refused_naming_it() {
    let mut local = LocalConfig::default();
    local.kinds.register_actor::<MinHashActor>();
    let cluster = Cluster::local(local).await.unwrap();
    let error = cluster
        .create_pool(PoolSpec::new("dedup", "minhash@2"))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("no alive agent offers actor kind `minhash@2`")
            && error.contains("agents offer other versions of it: minhash@1"),
        "{error}"
    );
}
