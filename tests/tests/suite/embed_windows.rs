//! `resident embed --split`: long documents cut into windows, a row per window with its
//! characters, or one vector per document (`--pool-windows mean`), on the real MiniLM and
//! the real `resident` binary. A window's vector must be what embedding its text alone gives.

use std::path::Path;

use resident_tests::{embed_command, parse_npy_f32, read_json};
use serde_json::{Value, json};

/// Words that are one token each in MiniLM's vocabulary, so a document of N of them is N
/// tokens and its windows fall on known words.
const WORDS: [&str; 20] = [
    "the", "house", "water", "city", "river", "music", "green", "small", "world", "time", "people",
    "school", "light", "night", "road", "book", "tree", "stone", "field", "king",
];

/// `count` one-token words, in a fixed order that does not repeat every 20.
fn one_token_words(count: usize) -> Vec<&'static str> {
    (0..count)
        .map(|i| WORDS[(i * 7 + i / 20) % WORDS.len()])
        .collect()
}

fn write_corpus(path: &Path, records: &[Value]) {
    let lines: Vec<String> = records.iter().map(Value::to_string).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Runs `resident embed` with `extra`; returns its rows and the lines of ids.jsonl.
fn embed(input: &Path, out: &Path, extra: &[&str]) -> (Vec<Vec<f32>>, Vec<Value>) {
    let output = embed_command(input, out, extra).output().unwrap();
    assert!(output.status.success(), "{extra:?}: {output:?}");
    let (shape, values) = parse_npy_f32(&std::fs::read(out.join("embeddings.npy")).unwrap());
    let rows = values.chunks(shape[1]).map(<[f32]>::to_vec).collect();
    let text = std::fs::read_to_string(out.join("ids.jsonl")).unwrap();
    let lines = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (rows, lines)
}

fn assert_same_vector(what: &str, ours: &[f32], alone: &[f32]) {
    let most = ours
        .iter()
        .zip(alone)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(most < 2e-5, "{what}: differs by up to {most}");
}

/// The characters of word `index` of `words` joined by single spaces: `[start, end)`.
fn word_chars(words: &[&str], index: usize) -> (u64, u64) {
    let start: usize = words[..index].iter().map(|w| w.len() + 1).sum();
    (start as u64, (start + words[index].len()) as u64)
}

#[test]
fn a_ten_window_document_matches_its_windows_embedded_alone_row_by_row_and_pooled() {
    let dir = tempfile::tempdir().unwrap();
    // Windows of 64 tokens sharing 16 step by 48: 64 + 9 x 48 = 496 tokens make 10.
    let words = one_token_words(496);
    let document = words.join(" ");
    let short = "A short text is one window of all of it.";
    let input = dir.path().join("corpus.jsonl");
    write_corpus(
        &input,
        &[
            json!({"id": "long", "text": document, "title": "Ten windows"}),
            json!({"id": 7, "text": short, "title": "Short"}),
        ],
    );
    let out = dir.path().join("windows");
    let (rows, lines) = embed(
        &input,
        &out,
        &["--split", "tokens:64:16", "--keep-columns", "title"],
    );
    assert_eq!(rows.len(), 11, "ten windows and the short text's one");
    let mut window_texts = Vec::new();
    for (window, line) in lines[..10].iter().enumerate() {
        let (first, last) = (48 * window, (48 * window + 63).min(495));
        let (start, _) = word_chars(&words, first);
        let (_, end) = word_chars(&words, last);
        assert_eq!(
            line,
            &json!({"id": format!("long#{window}"), "doc_id": "long", "window": window,
                    "char_start": start, "char_end": end, "title": "Ten windows"}),
        );
        window_texts.push(document[start as usize..end as usize].to_owned());
    }
    assert_eq!(
        lines[10],
        json!({"id": "7#0", "doc_id": 7, "window": 0, "char_start": 0,
               "char_end": short.chars().count(), "title": "Short"})
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["items"], 2, "documents, not windows: {report}");
    assert_eq!(
        report["windows"],
        json!({"split": "tokens:64:16", "windows": 11, "documents_split": 1})
    );

    // Each window's text alone, through plain `resident embed`.
    let alone_input = dir.path().join("alone.jsonl");
    let mut alone_records: Vec<Value> = window_texts
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"id": i, "text": text}))
        .collect();
    alone_records.push(json!({"id": 10, "text": short}));
    write_corpus(&alone_input, &alone_records);
    let (alone, _) = embed(&alone_input, &dir.path().join("alone"), &[]);
    for (i, (ours, theirs)) in rows.iter().zip(&alone).enumerate() {
        assert_same_vector(&format!("window row {i}"), ours, theirs);
    }

    // One vector per document: the mean of its windows', at unit length (MiniLM normalises).
    let pooled_out = dir.path().join("pooled");
    let (pooled, pooled_lines) = embed(
        &input,
        &pooled_out,
        &["--split", "tokens:64:16", "--pool-windows", "mean"],
    );
    assert_eq!(pooled_lines, vec![json!({"id": "long"}), json!({"id": 7})]);
    let mut mean = vec![0f32; alone[0].len()];
    for row in &alone[..10] {
        mean.iter_mut().zip(row).for_each(|(m, v)| *m += v / 10.0);
    }
    let length = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
    mean.iter_mut().for_each(|v| *v /= length);
    assert_same_vector("the pooled document", &pooled[0], &mean);
    assert_same_vector("the short document", &pooled[1], &alone[10]);
    // Without --split the long document is one row, cut at 256 tokens, and counted so.
    let (plain, _) = embed(&input, &dir.path().join("plain"), &[]);
    assert_eq!(plain.len(), 2);
    let plain_report = read_json(&dir.path().join("plain/report.json"));
    assert_eq!(plain_report["truncated"], 1);
    assert!(plain_report.get("windows").is_none());
}

#[test]
fn sentence_windows_hold_whole_sentences_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let sentences: Vec<String> = (0..40)
        .map(|i| {
            let words = one_token_words(5 + i % 9);
            let mut sentence = words[i % 3..].join(" ");
            sentence[..1].make_ascii_uppercase();
            sentence + "."
        })
        .collect();
    let document = sentences.join(" ");
    let input = dir.path().join("corpus.jsonl");
    write_corpus(&input, &[json!({"id": "s", "text": document})]);
    let out = dir.path().join("out");
    let (rows, lines) = embed(&input, &out, &["--split", "sentences:40"]);
    assert!(rows.len() > 5, "{} windows", rows.len());
    let mut next_sentence = 0;
    for line in &lines {
        let (start, end) = (
            line["char_start"].as_u64().unwrap() as usize,
            line["char_end"].as_u64().unwrap() as usize,
        );
        let window = &document[start..end];
        // A window is whole sentences, the next ones in order.
        let mut rest = window;
        let mut held = 0;
        while !rest.is_empty() {
            let sentence = &sentences[next_sentence];
            assert!(
                rest.starts_with(sentence.as_str()),
                "window {line} should go on with sentence {next_sentence} {sentence:?}: {rest:?}"
            );
            rest = rest[sentence.len()..].trim_start();
            next_sentence += 1;
            held += 1;
        }
        assert!(held >= 1);
    }
    assert_eq!(
        next_sentence,
        sentences.len(),
        "every sentence is in a window"
    );
}

#[test]
fn windows_the_model_cannot_take_are_refused_in_words_before_any_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    write_corpus(&input, &[json!({"id": 1, "text": "one two three"})]);
    let refused = |extra: &[&str]| {
        let out = dir
            .path()
            .join(format!("out-{}", extra.join("-").replace(':', "_")));
        let output = embed_command(&input, &out, extra).output().unwrap();
        assert!(!output.status.success(), "{extra:?} was taken");
        let shards = std::fs::read_dir(out.join("shards")).map_or(0, |d| d.count());
        assert_eq!(shards, 0, "{extra:?} wrote no shard");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    // MiniLM takes 256 tokens, [CLS] and [SEP] included.
    let too_long = refused(&["--split", "tokens:300:10"]);
    assert!(
        too_long.contains("windows of 300 tokens do not fit the model")
            && too_long.contains("use windows of 254 tokens or fewer"),
        "{too_long}"
    );
    // A prompt takes its tokens from the room too.
    let prompted = refused(&["--split", "tokens:254:10", "--prompt", "query: "]);
    assert!(
        prompted.contains("use windows of 252 tokens or fewer"),
        "{prompted}"
    );
    let overlap = refused(&["--split", "tokens:64:64"]);
    assert!(
        overlap.contains("the overlap (64) must be smaller than the window (64)"),
        "{overlap}"
    );
    let unknown = refused(&["--split", "paragraphs"]);
    assert!(unknown.contains("use tokens:SIZE:OVERLAP"), "{unknown}");
    let pooled_alone = refused(&["--pool-windows", "mean"]);
    assert!(pooled_alone.contains("--split"), "{pooled_alone}");
}
