//! S3 paths against a real S3-compatible server (s3s-fs): the SDK's client, and
//! `resident embed` and `resident generate` from S3 to S3 killed with -9 mid-job and
//! resumed.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use resident_jobs::corpus_job::reader::{Item, RecordReader};
use resident_jobs::corpus_job::{InputSet, ReaderOptions};
use resident_jobs::storage::{Location, S3Client, S3Options};
use resident_tests::s3_server::S3Server;
use resident_tests::{
    ids_in_jsonl, init_logging, minilm_dir, parse_npy_f32, resident_bin, smollm2_gguf, wait_until,
    wiki_sample_lines,
};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_client_lists_reads_writes_and_uploads_in_parts() {
    init_logging();
    let server = S3Server::start(&["bucket"]);
    let client = S3Client::connect(&S3Options {
        part_bytes: 5 << 20,
        ..server.options()
    })
    .await;
    client
        .put("bucket", "a/x.txt", b"one".to_vec())
        .await
        .unwrap();
    client
        .put("bucket", "a/y.txt", b"two!".to_vec())
        .await
        .unwrap();
    client
        .put("bucket", "ab.txt", b"other".to_vec())
        .await
        .unwrap();
    let listed = client.list("bucket", "a/").await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|o| (o.key.as_str(), o.size))
            .collect::<Vec<_>>(),
        vec![("a/x.txt", 3), ("a/y.txt", 4)]
    );
    assert_eq!(
        client.get("bucket", "a/y.txt").await.unwrap().unwrap(),
        b"two!"
    );
    assert_eq!(client.get("bucket", "a/none").await.unwrap(), None);
    assert_eq!(client.size("bucket", "a/x.txt").await.unwrap(), Some(3));
    assert_eq!(client.size("bucket", "a/none").await.unwrap(), None);

    // 12 MB in 5 MiB parts: a multipart upload that appears whole.
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..12_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    client
        .upload_file("bucket", "big.bin", &dir.path().join("big.bin"))
        .await
        .unwrap();
    assert!(client.get("bucket", "big.bin").await.unwrap().unwrap() == big);

    // Streamed in odd slices (how a merge writes): the parts are cut at 5 MiB whatever the
    // slices, and the object appears whole at finish, not before.
    let mut writer = client.object_writer("bucket", "streamed.bin");
    for slice in big.chunks(1_000_003) {
        writer.write(slice).await.unwrap();
    }
    assert_eq!(client.get("bucket", "streamed.bin").await.unwrap(), None);
    assert_eq!(writer.finish().await.unwrap(), big.len() as u64);
    assert!(client.get("bucket", "streamed.bin").await.unwrap().unwrap() == big);
    // Aborted after a part went up: no object, whole or half.
    let mut writer = client.object_writer("bucket", "aborted.bin");
    writer.write(&big[..6 << 20]).await.unwrap();
    writer.abort().await;
    assert_eq!(client.get("bucket", "aborted.bin").await.unwrap(), None);
    // Smaller than a part: one PUT.
    let mut writer = client.object_writer("bucket", "small.bin");
    writer.write(b"tiny").await.unwrap();
    writer.finish().await.unwrap();
    assert_eq!(
        client.get("bucket", "small.bin").await.unwrap().unwrap(),
        b"tiny"
    );

    let error = client
        .check_writable("no-such-bucket", "k")
        .await
        .unwrap_err();
    assert_eq!(
        error,
        resident_storage::S3Error::NoBucket {
            bucket: "no-such-bucket".into()
        }
    );
    assert_eq!(error.to_string(), "bucket no-such-bucket does not exist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_and_zstd_objects_stream_from_a_prefix() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    init_logging();
    let server = S3Server::start(&["corpus"]);
    let client = S3Client::connect(&server.options()).await;
    let ids: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["p1", "p2"]));
    let texts: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["first", "second"]));
    let batch = RecordBatch::try_from_iter([("id", ids), ("text", texts)]).unwrap();
    let mut parquet_bytes = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut parquet_bytes, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let text = zstd::stream::encode_all(&b"line one\nline two\n"[..], 3).unwrap();
    client
        .put("corpus", "mix/a.parquet", parquet_bytes)
        .await
        .unwrap();
    client.put("corpus", "mix/b.txt.zst", text).await.unwrap();

    let location = Location::parse("s3://corpus/mix").unwrap();
    let inputs = InputSet::list(&location, Some(&client)).await.unwrap();
    let records = tokio::task::spawn_blocking(move || {
        let mut reader = RecordReader::new(inputs, ReaderOptions::default());
        let mut records = Vec::new();
        while let Some(item) = reader.next_item().unwrap() {
            if let Item::Record(record) = item {
                records.push((record.id.to_string(), record.text));
            }
        }
        records
    })
    .await
    .unwrap();
    let expected = [
        ("\"p1\"", "first"),
        ("\"p2\"", "second"),
        ("\"b.txt.zst:1\"", "line one"),
        ("\"b.txt.zst:2\"", "line two"),
    ];
    assert_eq!(
        records,
        expected.map(|(id, text)| (id.to_owned(), text.to_owned()))
    );
}

fn embed_command(server: &S3Server, input: &str, output: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(resident_bin());
    command
        .args(["embed", "--model", &minilm_dir(), "--input", input])
        .args(["--output", output])
        .args(extra)
        .envs(server.env())
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// A server with the buckets `corpus` and `results`, a client, and the first `count`
/// fixture articles as `s3://corpus/wiki/part-000.jsonl` (also returned as lines).
async fn corpus_on_s3(count: usize) -> (S3Server, S3Client, Vec<String>) {
    let server = S3Server::start(&["corpus", "results"]);
    let client = S3Client::connect(&server.options()).await;
    let lines = wiki_sample_lines(count);
    let corpus: String = lines.iter().map(|l| format!("{l}\n")).collect();
    client
        .put("corpus", "wiki/part-000.jsonl", corpus.into_bytes())
        .await
        .unwrap();
    (server, client, lines)
}

/// An object of the results bucket, parsed as JSON.
async fn results_json(client: &S3Client, key: &str) -> Value {
    let bytes = client.get("results", key).await.unwrap();
    serde_json::from_slice(&bytes.unwrap_or_else(|| panic!("no {key}"))).unwrap()
}

/// Chunks the S3 output records as done: those in `manifest.json` plus one journal object
/// each for those finished since its last compaction.
async fn recorded_chunks(client: &S3Client) -> Option<usize> {
    let bytes = client.get("results", "run-1/manifest.json").await.ok()??;
    let manifest: Value = serde_json::from_slice(&bytes).ok()?;
    let generation = manifest["journal_generation"].as_u64().unwrap_or(0);
    let journal = format!("run-1/journal/{generation:06}/");
    let journaled = client.list("results", &journal).await.ok()?.len();
    Some(manifest["chunks"].as_array()?.len() + journaled)
}

/// Every shard object under `prefix` and its bytes.
async fn shard_objects(client: &S3Client, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let mut shards = BTreeMap::new();
    for object in client.list("results", prefix).await.unwrap() {
        let bytes = client.get("results", &object.key).await.unwrap().unwrap();
        shards.insert(object.key, bytes);
    }
    shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeds_from_s3_to_s3_and_resumes_after_kill_9() {
    init_logging();
    let server = S3Server::start(&["corpus", "results"]);
    let client = S3Client::connect(&server.options()).await;
    // Two corpus files under the prefix (one gzipped), a file that is not a corpus, and a
    // neighbouring prefix that must not be read.
    let lines = wiki_sample_lines(300);
    let first: String = lines[..150].iter().map(|l| format!("{l}\n")).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for line in &lines[150..] {
        writeln!(gz, "{line}").unwrap();
    }
    let uploads = [
        ("wiki/part-000.jsonl", first.into_bytes()),
        ("wiki/part-001.jsonl.gz", gz.finish().unwrap()),
        ("wiki/README.md", b"not a corpus".to_vec()),
        (
            "wikipedia/other.jsonl",
            b"{\"id\": \"x\", \"text\": \"no\"}\n".to_vec(),
        ),
    ];
    for (key, bytes) in uploads {
        client.put("corpus", key, bytes).await.unwrap();
    }
    let expected_ids: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].clone())
        .collect();

    let (input, output) = ("s3://corpus/wiki", "s3://results/run-1");
    let mut child = embed_command(
        &server,
        input,
        output,
        &["--chunk-size", "10", "--replicas", "1"],
    )
    .spawn()
    .unwrap();
    let finished = wait_until("a few shards on S3", Duration::from_secs(90), || async {
        let chunks = recorded_chunks(&client).await?;
        (chunks >= 3).then_some(chunks)
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done = recorded_chunks(&client).await.unwrap();
    assert!(done >= finished && done < 30, "{done} chunks recorded");
    let before = shard_objects(&client, "run-1/shards/").await;

    let rerun = embed_command(&server, input, output, &[]).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let ids = client
        .get("results", "run-1/ids.jsonl")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ids_in_jsonl(&String::from_utf8(ids).unwrap()),
        expected_ids,
        "every input id once, in order"
    );
    let npy = client
        .get("results", "run-1/embeddings.npy")
        .await
        .unwrap()
        .unwrap();
    let (shape, data) = parse_npy_f32(&npy);
    assert_eq!(shape, vec![300, 384]);
    assert!(data.chunks(384).all(|row| {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        (norm - 1.0).abs() < 1e-4
    }));
    let report: Value = results_json(&client, "run-1/report.json").await;
    assert_eq!(report["chunks"]["reused"].as_u64().unwrap() as usize, done);
    assert_eq!(report["items"], 300);
    assert_eq!(report["input"], "s3://corpus/wiki");
    let after = shard_objects(&client, "run-1/shards/").await;
    for (key, bytes) in &before {
        assert_eq!(after.get(key), Some(bytes), "{key} changed");
    }
    assert_eq!(after.len(), 60, "30 chunks of vectors + ids");
    assert_eq!(report["output"]["merged"], true);
    let index: Value = results_json(&client, "run-1/index.json").await;
    assert_eq!(index["rows"], 300);
    assert_eq!(index["shards"].as_array().unwrap().len(), 30);
    assert!(
        client
            .list("results", "run-1/journal/")
            .await
            .unwrap()
            .is_empty(),
        "the finished job folded its journal into manifest.json"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_mistakes_are_clear_errors_before_any_chunk() {
    init_logging();
    let server = S3Server::start(&["corpus", "results"]);
    let client = S3Client::connect(&server.options()).await;
    client
        .put(
            "corpus",
            "docs/a.jsonl",
            b"{\"id\": 1, \"text\": \"hi\"}\n".to_vec(),
        )
        .await
        .unwrap();
    let cases = [
        (
            "s3://corpus/docs",
            "s3://no-such-bucket/out",
            "s3://no-such-bucket/out is not writable: bucket no-such-bucket does not exist",
        ),
        (
            "s3://corpus/nothing",
            "s3://results/o",
            "no .jsonl, .ndjson, .json or .txt (optionally .gz or .zst) or .parquet objects under s3://corpus/nothing",
        ),
        ("s3:///docs", "s3://results/o", "needs a bucket"),
    ];
    for (input, output, message) in cases {
        let run = embed_command(&server, input, output, &[]).output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            !run.status.success() && stderr.contains(message),
            "{input} -> {output}: {stderr}"
        );
    }
    assert!(
        client.list("results", "o").await.unwrap().is_empty(),
        "nothing written"
    );
}

/// A second run on an S3 output another run is writing is refused with who holds it; a
/// lease that was not renewed for its time to live is taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_the_same_s3_output_is_refused() {
    use resident_jobs::storage::lease::{LEASE_OBJECT, LEASE_TTL, Lease};
    init_logging();
    let server = S3Server::start(&["corpus", "results"]);
    let client = S3Client::connect(&server.options()).await;
    let lines: String = wiki_sample_lines(20)
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    client
        .put("corpus", "docs/a.jsonl", lines.into_bytes())
        .await
        .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let lease = |renewed_unix_ms| Lease {
        run: "elsewhere".into(),
        host: "another-host".into(),
        pid: 4242,
        renewed_unix_ms,
    };
    let key = format!("out/{LEASE_OBJECT}");
    client
        .put("results", &key, serde_json::to_vec(&lease(now_ms)).unwrap())
        .await
        .unwrap();
    let refused = embed_command(&server, "s3://corpus/docs", "s3://results/out", &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("another run is writing s3://results/out")
            && stderr.contains("pid 4242 on another-host"),
        "{stderr}"
    );
    assert!(
        client
            .list("results", "out/shards")
            .await
            .unwrap()
            .is_empty(),
        "nothing written"
    );

    let stale = now_ms - LEASE_TTL.as_millis() as u64 - 1000;
    client
        .put("results", &key, serde_json::to_vec(&lease(stale)).unwrap())
        .await
        .unwrap();
    let taken_over = embed_command(&server, "s3://corpus/docs", "s3://results/out", &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&taken_over.stderr);
    assert!(taken_over.status.success(), "{stderr}");
    assert_eq!(
        client.get("results", &key).await.unwrap(),
        None,
        "the finished run released its lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_an_s3_compaction_loses_and_repeats_nothing() {
    init_logging();
    let (server, client, lines) = corpus_on_s3(100).await;
    let (input, output) = ("s3://corpus/wiki", "s3://results/run-1");
    // The second compaction (after 4 chunks) stops with the new manifest written and the
    // folded journal's objects not yet deleted.
    let mut child = embed_command(
        &server,
        input,
        output,
        &[
            "--chunk-size",
            "10",
            "--replicas",
            "1",
            "--manifest-compact-min",
            "4",
        ],
    )
    .env(
        resident_jobs::corpus_job::journal::PauseAt::ENV,
        "compaction:2",
    )
    .spawn()
    .unwrap();
    resident_tests::wait_for_pause(&mut child).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let manifest: Value = results_json(&client, "run-1/manifest.json").await;
    assert_eq!(manifest["journal_generation"], 2);
    assert_eq!(manifest["chunks"].as_array().unwrap().len(), 4);
    let stale = client
        .list("results", "run-1/journal/000001/")
        .await
        .unwrap();
    assert_eq!(
        stale.len(),
        4,
        "the folded journal's objects are still there"
    );
    assert_eq!(recorded_chunks(&client).await, Some(4));
    let before = shard_objects(&client, "run-1/shards/").await;

    let rerun = embed_command(&server, input, output, &[]).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let report: Value = results_json(&client, "run-1/report.json").await;
    assert_eq!(report["chunks"]["reused"], 4);
    assert_eq!(report["chunks"]["computed"], 6);
    let ids = client
        .get("results", "run-1/ids.jsonl")
        .await
        .unwrap()
        .unwrap();
    let expected: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].clone())
        .collect();
    assert_eq!(ids_in_jsonl(&String::from_utf8(ids).unwrap()), expected);
    let after = shard_objects(&client, "run-1/shards/").await;
    for (key, bytes) in &before {
        assert_eq!(after.get(key), Some(bytes), "{key} changed");
    }
    assert!(
        client
            .list("results", "run-1/journal/")
            .await
            .unwrap()
            .is_empty()
    );
}

/// `resident generate` from S3 to S3, killed with -9 after a few chunks and run again: no
/// finished shard is rewritten, and `generations.jsonl` holds every record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generates_from_s3_to_s3_and_resumes_after_kill_9() {
    init_logging();
    let (server, client, lines) = corpus_on_s3(10).await;
    let generate = |extra: &[&str]| {
        let mut command = Command::new(resident_bin());
        command
            .args(["generate", "--model", &smollm2_gguf()])
            .args(["--prompt", "Summarise in one sentence:\n\n{text}"])
            .args([
                "--input",
                "s3://corpus/wiki",
                "--output",
                "s3://results/run-1",
            ])
            .args([
                "--chunk-size",
                "2",
                "--replicas",
                "1",
                "--max-new-tokens",
                "6",
            ])
            .args(extra)
            .envs(server.env())
            .env("RESIDENT_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };
    let mut child = generate(&[]).spawn().unwrap();
    wait_until("a few shards on S3", Duration::from_secs(120), || async {
        let chunks = recorded_chunks(&client).await?;
        (chunks >= 2).then_some(chunks)
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done = recorded_chunks(&client).await.unwrap();
    assert!(done < 5, "{done} of 5 chunks recorded before the kill");
    let before = shard_objects(&client, "run-1/shards/").await;

    let rerun = generate(&[]).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let generations = client
        .get("results", "run-1/generations.jsonl")
        .await
        .unwrap()
        .unwrap();
    let expected_ids: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].clone())
        .collect();
    assert_eq!(
        ids_in_jsonl(&String::from_utf8(generations).unwrap()),
        expected_ids,
        "every record once, in order"
    );
    let after = shard_objects(&client, "run-1/shards/").await;
    for (key, bytes) in &before {
        assert_eq!(after.get(key), Some(bytes), "{key} changed");
    }
    assert_eq!(after.len(), 10, "5 chunks of generations + ids");
    let report: Value = results_json(&client, "run-1/report.json").await;
    assert_eq!(report["chunks"]["reused"].as_u64().unwrap() as usize, done);
    assert_eq!(report["items"], 10);
}
