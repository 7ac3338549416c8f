//! What an embedding user asks of `resident embed` besides the model: prompts (by name, by
//! text, the model's default, left out of pooling), `--truncate-dim`, `--normalize` and every
//! `--precision`, each against what sentence-transformers 6.2 gives
//! (`tests/fixtures/minilm_prompts.json`, from `scripts/make-prompt-fixture.py`, on the real
//! MiniLM with a prompts file added).

use std::path::{Path, PathBuf};
use std::time::Duration;

use resident_jobs::corpus_job::{
    EmbedJobConfig, JobError, KeptColumn, Normalization, OutputDtype, Prompt, run_embed_job,
};
use resident_sdk::{Cluster, EmbedOptions, EmbedPoolSpec, LocalConfig};
use resident_tests::{
    embed_command, embed_command_of, finished_chunks, init_logging, parse_npy_f32, prompted_minilm,
    read_json, repo_root, sample, wait_until,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    literal_prompt: String,
    texts: Vec<String>,
    vectors: std::collections::BTreeMap<String, Vec<Vec<f32>>>,
    quantized_from_none: std::collections::BTreeMap<String, Vec<Vec<i32>>>,
    ranges_from_none: Vec<Vec<f32>>,
}

fn fixture() -> Fixture {
    let path = repo_root().join("tests/fixtures/minilm_prompts.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

fn assert_close(case: &str, ours: &[Vec<f32>], theirs: &[Vec<f32>]) {
    assert_eq!(ours.len(), theirs.len(), "{case}: rows");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(a.len(), b.len(), "{case}: row {i} width");
        let similarity = cosine(a, b);
        assert!(similarity >= 0.9999, "{case}: row {i} cosine {similarity}");
        assert!(
            (norm(a) - norm(b)).abs() < 1e-4,
            "{case}: row {i} norm {} against {}",
            norm(a),
            norm(b)
        );
    }
}

async fn local() -> Cluster {
    init_logging();
    Cluster::local(LocalConfig::default()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_by_name_by_text_by_default_and_left_out_of_pooling_match_sentence_transformers() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let cluster = local().await;
    let mut pools = Vec::new();
    for (name, include_prompt) in [("prompted", true), ("prompt-excluded", false)] {
        let spec = EmbedPoolSpec::new(name, prompted_minilm(dir.path(), include_prompt))
            .replicas(1)
            .chunk_size(5);
        pools.push(
            cluster
                .create_embed_pool(spec, Duration::from_secs(120))
                .await
                .unwrap(),
        );
    }
    let cases = [
        (0, Prompt::ModelDefault, "default"),
        (0, Prompt::Named("query".into()), "query"),
        (0, Prompt::Text(fixture.literal_prompt.clone()), "literal"),
        (0, Prompt::Text(String::new()), "none"),
        (1, Prompt::Named("query".into()), "exclude_query"),
    ];
    for (pool, prompt, case) in cases {
        let options = EmbedOptions {
            prompt,
            ..EmbedOptions::default()
        };
        let vectors = pools[pool]
            .embed_with(fixture.texts.clone(), &options)
            .await
            .unwrap();
        assert_close(case, &vectors, &fixture.vectors[case]);
    }
    // The model's default prompt really is applied: without it the vectors differ.
    let none = &fixture.vectors["none"][0];
    assert!(cosine(none, &fixture.vectors["default"][0]) < 0.99);

    let refused = pools[0]
        .embed_with(
            vec!["x".into()],
            &EmbedOptions {
                prompt: Prompt::Named("question".into()),
                ..EmbedOptions::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("prompt name `question`") && refused.contains("passage, query"),
        "{refused}"
    );
}

/// The fixture's texts as a JSONL corpus with ids `t0`, `t1`, ...
fn corpus(dir: &Path, fixture: &Fixture) -> PathBuf {
    let path = dir.join("texts.jsonl");
    let lines: Vec<String> = fixture
        .texts
        .iter()
        .enumerate()
        .map(|(i, text)| serde_json::json!({"id": format!("t{i}"), "text": text}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// An `.npy` file's shape, type string and data bytes.
fn npy_parts(path: &Path) -> (String, String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let header_len = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8_lossy(&bytes[10..header_len]).to_string();
    let field = |name: &str, end: char| {
        let rest = header.split(name).nth(1).expect("npy header field");
        rest[..rest.find(end).expect("field end")].to_owned()
    };
    (
        field("'shape': (", ')'),
        field("'descr': '", '\''),
        bytes[header_len..].to_vec(),
    )
}

fn job(input: &Path, model: &str, out: &Path, dtype: OutputDtype) -> EmbedJobConfig {
    let mut config = EmbedJobConfig::new(input, model, out);
    config.corpus.replicas = Some(1);
    config.embedding.prompt = Prompt::Text(String::new());
    config.embedding.dtype = dtype;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_precision_is_written_as_sentence_transformers_quantises() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = prompted_minilm(dir.path(), true);
    let input = corpus(dir.path(), &fixture);
    let cluster = local().await;
    let rows = fixture.texts.len();
    for (dtype, descr, width) in [
        (OutputDtype::Int8, "|i1", 384),
        (OutputDtype::Uint8, "|u1", 384),
        (OutputDtype::Binary, "|i1", 48),
        (OutputDtype::Ubinary, "|u1", 48),
    ] {
        let out = dir.path().join(dtype.name());
        let config = job(&input, &model, &out, dtype);
        let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
        assert_eq!(report.figures.dtype, dtype);
        let (shape, found_descr, data) = npy_parts(&out.join("embeddings.npy"));
        assert_eq!(shape, format!("{rows}, {width}"), "{dtype:?}");
        assert_eq!(found_descr, descr, "{dtype:?}");
        let ours: Vec<i32> = data
            .iter()
            .map(|&b| match descr {
                "|i1" => i32::from(b as i8),
                _ => i32::from(b),
            })
            .collect();
        let theirs: Vec<i32> = fixture.quantized_from_none[dtype.name()]
            .iter()
            .flatten()
            .copied()
            .collect();
        assert_eq!(ours.len(), theirs.len());
        // Our floats differ from torch's in the last bits, so a value on a bucket's edge (or
        // a sign bit of a value near 0) may land one bucket away.
        let (mut same, mut near) = (0, 0);
        for (a, b) in ours.iter().zip(&theirs) {
            match (a - b).abs() {
                0 => same += 1,
                1 => near += 1,
                _ if dtype.needs_ranges() => panic!("{dtype:?}: {a} against {b}"),
                _ => {}
            }
        }
        let share = same as f64 / ours.len() as f64;
        match dtype.needs_ranges() {
            true => assert!(
                share >= 0.99 && same + near == ours.len(),
                "{dtype:?} {share}"
            ),
            false => {
                let differing_bits: u32 = data
                    .iter()
                    .zip(&theirs)
                    .map(|(a, b)| {
                        let theirs = match descr {
                            "|i1" => (*b as i8) as u8,
                            _ => *b as u8,
                        };
                        (a ^ theirs).count_ones()
                    })
                    .sum();
                assert!(
                    differing_bits as usize <= rows * 384 / 200,
                    "{dtype:?}: {differing_bits} bits differ"
                );
            }
        }
        if dtype.needs_ranges() {
            // The ranges came from the corpus (all 16 records: fewer than the 256 sampled), and are
            // written where queries can be quantised to match.
            let index = read_json(&out.join("index.json"));
            let ranges = &index["quantization_ranges"];
            assert_eq!(ranges["sample_rows"], rows);
            for (bound, theirs) in ["min", "max"].iter().zip(&fixture.ranges_from_none) {
                let ours: Vec<f32> = serde_json::from_value(ranges[bound].clone()).unwrap();
                for (a, b) in ours.iter().zip(theirs) {
                    assert!((a - b).abs() < 1e-5, "{bound}: {a} against {b}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_dim_comes_before_normalize_as_in_sentence_transformers() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = prompted_minilm(dir.path(), true);
    let input = corpus(dir.path(), &fixture);
    let cluster = local().await;
    for (normalization, case) in [
        (Normalization::Model, "truncate_128"),
        (Normalization::UnitLength, "truncate_128_normalized"),
    ] {
        let out = dir.path().join(case);
        let mut config = job(&input, &model, &out, OutputDtype::F32);
        config.embedding.truncate_dim = Some(128);
        config.embedding.normalization = normalization;
        let report = run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
        assert_eq!(report.figures.dimension, 128);
        let (shape, data) = parse_npy_f32(&std::fs::read(out.join("embeddings.npy")).unwrap());
        assert_eq!(shape, vec![fixture.texts.len(), 128]);
        let ours: Vec<Vec<f32>> = data.chunks(128).map(<[f32]>::to_vec).collect();
        assert_close(case, &ours, &fixture.vectors[case]);
    }
    // Without the model's Normalize module the vectors keep their pooled length.
    let out = dir.path().join("raw");
    let mut config = job(&input, &model, &out, OutputDtype::F32);
    config.embedding.normalization = Normalization::Raw;
    run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    let (_, data) = parse_npy_f32(&std::fs::read(out.join("embeddings.npy")).unwrap());
    for (ours, theirs) in data.chunks(384).zip(&fixture.vectors["none"]) {
        assert!(cosine(ours, theirs) >= 0.9999);
        assert!(norm(ours) > 1.5, "pooled, not unit length: {}", norm(ours));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_the_model_cannot_take_or_a_resume_under_other_settings_are_refused_in_words() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = prompted_minilm(dir.path(), true);
    let input = corpus(dir.path(), &fixture);
    let cluster = local().await;

    let out = dir.path().join("unknown-prompt");
    let mut config = job(&input, &model, &out, OutputDtype::F32);
    config.embedding.prompt = Prompt::Named("question".into());
    let error = run_embed_job(&cluster, &config, &mut |_| {})
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, JobError::Input(_)), "{error:?}");
    assert!(
        text.contains("passage, query") && text.contains("--prompt"),
        "{text}"
    );
    let shards = std::fs::read_dir(out.join("shards")).unwrap().count();
    assert_eq!(shards, 0, "refused before any chunk");

    let out = dir.path().join("too-wide");
    let mut config = job(&input, &model, &out, OutputDtype::F32);
    config.embedding.truncate_dim = Some(1000);
    let text = run_embed_job(&cluster, &config, &mut |_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("--truncate-dim 1000 is more than the model's 384"),
        "{text}"
    );

    let out = dir.path().join("resumed");
    let first = job(&input, &model, &out, OutputDtype::F32);
    run_embed_job(&cluster, &first, &mut |_| {}).await.unwrap();
    let mut other_prompt = first.clone();
    other_prompt.embedding.prompt = Prompt::Named("query".into());
    let text = run_embed_job(&cluster, &other_prompt, &mut |_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("prompt"), "{text}");
    let mut other_precision = first.clone();
    other_precision.embedding.dtype = OutputDtype::Binary;
    let text = run_embed_job(&cluster, &other_precision, &mut |_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("--precision float32"), "{text}");
}

#[test]
fn the_cli_takes_the_options_by_their_sentence_transformers_names_and_refuses_clashes() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = prompted_minilm(dir.path(), true);
    let input = corpus(dir.path(), &fixture);
    let out = dir.path().join("cli");
    let args = [
        "--prompt-name",
        "query",
        "--precision",
        "binary",
        "--truncate-dim",
        "64",
        "--replicas",
        "1",
    ];
    let run = embed_command_of(&model, &input, &out, &args)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(
        (&report["dimension"], &report["dtype"], &report["prompt"]),
        (
            &serde_json::json!(64),
            &serde_json::json!("binary"),
            &serde_json::json!("query: ")
        )
    );
    let (shape, descr, data) = npy_parts(&out.join("embeddings.npy"));
    assert_eq!(
        (shape, descr),
        (format!("{}, 8", fixture.texts.len()), "|i1".to_owned())
    );
    // The query prompt's vectors, cut to 64 dimensions, one bit each.
    let first: Vec<u8> = fixture.vectors["query"][0][..64]
        .chunks(8)
        .map(|bits| {
            let byte = bits
                .iter()
                .enumerate()
                .fold(0u8, |byte, (i, v)| byte | (u8::from(*v > 0.0) << (7 - i)));
            (i16::from(byte) - 128) as i8 as u8
        })
        .collect();
    let differing: u32 = first
        .iter()
        .zip(&data[..8])
        .map(|(a, b)| (a ^ b).count_ones())
        .sum();
    assert!(differing <= 1, "{differing} bits of the first row differ");

    for (clash, says) in [
        (
            &["--prompt-name", "query", "--prompt", "q: "][..],
            "--prompt",
        ),
        (&["--normalize", "--no-normalize"][..], "--no-normalize"),
        (&["--precision", "int4"][..], "float32, float16, int8"),
        (
            &["--truncate-dim", "0"][..],
            "--truncate-dim must be at least 1",
        ),
    ] {
        let refused = embed_command_of(&model, &input, &dir.path().join("no"), clash)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{clash:?}: {stderr}");
        assert!(stderr.contains(says), "{clash:?}: {stderr}");
    }
}

/// Every row of a Parquet file: its `id`, its vector and its text columns `names`.
fn parquet_rows(path: &Path, names: &[&str]) -> Vec<(String, Vec<f32>, Vec<Option<String>>)> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Float32Type;
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let ids = batch
            .column_by_name("id")
            .unwrap()
            .as_string::<i32>()
            .clone();
        let vectors = batch
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list()
            .clone();
        for row in 0..batch.num_rows() {
            let columns = names
                .iter()
                .map(|name| {
                    let column = batch.column_by_name(name).unwrap().as_string::<i32>();
                    (!column.is_null(row)).then(|| column.value(row).to_owned())
                })
                .collect();
            let vector = vectors.value(row);
            let vector = vector.as_primitive::<Float32Type>().values().to_vec();
            rows.push((ids.value(row).to_owned(), vector, columns));
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_output_carries_columns_and_exact_ids_after_a_kill_9_and_resume() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 300);
    let out = dir.path().join("out");
    let flags = [
        "--format",
        "parquet",
        "--keep-columns",
        "topic,description=about,missing",
    ];
    let first = [&flags[..], &["--chunk-size", "10", "--replicas", "1"]].concat();
    let mut child = embed_command(&input, &out, &first).spawn().unwrap();
    wait_until("a few shards", Duration::from_secs(60), || async {
        (finished_chunks(&out).len() >= 3).then_some(())
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let reused = finished_chunks(&out).len();
    assert!(reused < 30, "killed before the end ({reused} chunks)");

    let rerun = embed_command(&input, &out, &flags).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["chunks"]["reused"], reused as u64);
    let index = read_json(&out.join("index.json"));
    assert_eq!(index["merged"]["vectors"], "embeddings.parquet");
    assert!(!out.join("embeddings.npy").exists() && !out.join("ids.jsonl").exists());

    let records: Vec<serde_json::Value> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let rows = parquet_rows(
        &out.join("embeddings.parquet"),
        &["topic", "about", "missing"],
    );
    assert_eq!(rows.len(), records.len(), "every record once");
    for ((id, vector, columns), record) in rows.iter().zip(&records) {
        assert_eq!(id, record["id"].as_str().unwrap(), "input order");
        assert_eq!(vector.len(), 384);
        assert!((norm(vector) - 1.0).abs() < 1e-4);
        assert_eq!(columns[0].as_deref(), record["topic"].as_str());
        assert_eq!(columns[1].as_deref(), record["description"].as_str());
        assert_eq!(columns[2], None, "a field the record lacks is null");
    }
    // The shards are a Parquet dataset too, in the same rows.
    let shard_rows: usize = index["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|shard| {
            let file = out.join(shard["vectors_file"].as_str().unwrap());
            assert!(file.extension().is_some_and(|e| e == "parquet"));
            parquet_rows(&file, &["topic"]).len()
        })
        .sum();
    assert_eq!(shard_rows, records.len());

    // An npy rerun of a Parquet output is refused, not mixed.
    let mixed = embed_command(
        &input,
        &out,
        &["--keep-columns", "topic,description=about,missing"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&mixed.stderr);
    assert!(
        !mixed.status.success() && stderr.contains("--format parquet"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npy_output_carries_the_kept_columns_in_ids_jsonl() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = prompted_minilm(dir.path(), true);
    let input = dir.path().join("titled.jsonl");
    let lines: Vec<String> = fixture
        .texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::json!({"id": i, "text": text, "title": format!("T{i}"), "n": i * 2})
                .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let cluster = local().await;
    let out = dir.path().join("npy");
    let mut config = job(&input, &model, &out, OutputDtype::F16);
    let columns = |given: &[&str]| {
        given
            .iter()
            .map(|c| KeptColumn::parse(c).unwrap())
            .collect()
    };
    config.embedding.keep_columns = columns(&["title", "n=twice"]);
    run_embed_job(&cluster, &config, &mut |_| {}).await.unwrap();
    let ids = std::fs::read_to_string(out.join("ids.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(ids.lines().nth(3).unwrap()).unwrap();
    assert_eq!(
        first,
        serde_json::json!({"id": 3, "title": "T3", "twice": 6})
    );
    assert_eq!(ids.lines().count(), fixture.texts.len());

    let mut clash = config.clone();
    clash.corpus.output = dir.path().join("clash").into();
    clash.embedding.keep_columns = columns(&["title=embedding"]);
    let text = run_embed_job(&cluster, &clash, &mut |_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("cannot carry `embedding`"), "{text}");
    assert!(text.contains("under another name (FIELD=NAME)"), "{text}");
}
