//! What `--metric` costs per record: each overlap figure (ROUGE with and without the
//! stemmer, SQuAD's F1, BLEU and chrF) of every answer-reference pair of a JSONL file
//! (`{"answer": ..., "references": [...]}`), timed figure by figure, and written out so
//! `benches/overlap-bench.sh` can hold them to rouge-score and sacrebleu on the same pairs.
//! `cargo run --release -p resident-bench --bin overlap-bench -- PAIRS OUT`

mod cpu_model;

use std::io::Write;
use std::time::Instant;

use clap::Parser;
use resident_jobs::corpus_job::{OverlapMetric, RougeWords, overlap_scores};

#[derive(Parser)]
struct Args {
    /// The pairs: one `{"answer": ..., "references": [...]}` a line.
    pairs: std::path::PathBuf,
    /// Where each pair's figures go, a JSON line each (`rouge1`, ..., `rouge1_stemmed`,
    /// ..., `f1`, `bleu`, `chrf`, sentence figures).
    out: std::path::PathBuf,
}

/// The figures timed, each alone: a name, the metrics asked, the words stemmed or not.
const RUNS: [(&str, &[OverlapMetric], bool); 5] = [
    ("rouge (four figures)", &ROUGE, false),
    ("rouge --rouge-stemmer", &ROUGE, true),
    ("f1", &[OverlapMetric::F1], false),
    ("bleu", &[OverlapMetric::Bleu], false),
    ("chrf", &[OverlapMetric::Chrf], false),
];

const ROUGE: [OverlapMetric; 4] = [
    OverlapMetric::Rouge1,
    OverlapMetric::Rouge2,
    OverlapMetric::RougeL,
    OverlapMetric::RougeLsum,
];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pairs: Vec<(String, Vec<String>)> = std::fs::read_to_string(&args.pairs)?
        .lines()
        .map(|line| {
            let pair: serde_json::Value = serde_json::from_str(line)?;
            let answer = pair["answer"].as_str().unwrap_or_default().to_owned();
            let references = serde_json::from_value(pair["references"].clone())?;
            Ok((answer, references))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut figures = vec![serde_json::Map::new(); pairs.len()];
    println!(
        "| figure (ours, {}) | pairs | µs a pair |",
        cpu_model::cpu_model()
    );
    println!("|---|---:|---:|");
    for (name, metrics, stemmed) in RUNS {
        let words = RougeWords { stemmed };
        let started = Instant::now();
        let scored: Vec<_> = (pairs.iter())
            .map(|(answer, references)| overlap_scores(metrics, words, Some(answer), references))
            .collect();
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "| {name} | {} | {:.1} |",
            pairs.len(),
            seconds * 1e6 / pairs.len() as f64
        );
        for (into, scores) in figures.iter_mut().zip(scored) {
            let scores = serde_json::to_value(scores.unwrap_or_default())?;
            for (key, value) in scores.as_object().into_iter().flatten() {
                let key = match stemmed {
                    true => format!("{key}_stemmed"),
                    false => key.clone(),
                };
                into.insert(key, value.clone());
            }
        }
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(&args.out)?);
    for line in figures {
        writeln!(out, "{}", serde_json::Value::Object(line))?;
    }
    Ok(())
}
