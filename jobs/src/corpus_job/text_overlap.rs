//! Generated answers scored by their words' overlap with a record's references (pure):
//! ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum as Google's `rouge-score` package computes
//! them (what Hugging Face's `evaluate` and lm-evaluation-harness call), and SQuAD's token
//! F1 as its official evaluation script computes it (lm-evaluation-harness's SQuAD, DROP
//! and CoQA `f1`). Each figure is an F-measure in `0..=1`, the best over the record's
//! references (`rouge-score`'s `score_multi`, SQuAD's max over gold answers). BLEU and chrF
//! (`sacrebleu`'s, 0 to 100, corpus figures) are [`super::sacrebleu_figures`]'; this
//! module asks for them with the others.
//!
//! Written here rather than taken from a crate: the crates that compute ROUGE tokenise
//! and count otherwise, and a figure that differs from the package everybody reports is
//! worse than none; the Python tests hold these to `rouge-score` itself.
//!
//! ROUGE's words are `rouge-score`'s default tokenizer's: the text lower-cased, every run
//! of characters other than ASCII letters and digits a separator (so a text in another
//! script has no words, as there), and with `--rouge-stemmer` (its `use_stemmer=True`)
//! each word of more than three letters Porter-stemmed as NLTK stems it
//! ([`super::porter_stem`]). ROUGE-Lsum's sentences are the text's lines (`rouge-score`
//! without `split_summaries`).

use std::collections::HashMap;
use std::sync::LazyLock;

use fancy_regex::Regex;
use serde::{Deserialize, Serialize};

use super::porter_stem::porter_stem;
use super::sacrebleu_figures::{BleuStats, ChrfStats};

/// One overlap figure, named as `rouge-score` and lm-evaluation-harness name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OverlapMetric {
    /// Unigram overlap.
    #[serde(rename = "rouge1")]
    Rouge1,
    /// Bigram overlap.
    #[serde(rename = "rouge2")]
    Rouge2,
    /// The longest common subsequence of the whole texts.
    #[serde(rename = "rougeL")]
    RougeL,
    /// The union of each reference line's longest common subsequences with the answer's
    /// lines (summary-level ROUGE-L).
    #[serde(rename = "rougeLsum")]
    RougeLsum,
    /// SQuAD's token F1: lower-cased, without ASCII punctuation and the articles `a`,
    /// `an` and `the`, words split at whitespace, counted as bags.
    #[serde(rename = "f1")]
    F1,
    /// `sacrebleu`'s BLEU (0 to 100): a corpus figure ([`BleuStats`]).
    #[serde(rename = "bleu")]
    Bleu,
    /// `sacrebleu`'s chrF (0 to 100): a corpus figure.
    #[serde(rename = "chrf")]
    Chrf,
}

/// What `rouge` asks for: the four ROUGE figures.
const ROUGE: [OverlapMetric; 4] = [
    OverlapMetric::Rouge1,
    OverlapMetric::Rouge2,
    OverlapMetric::RougeL,
    OverlapMetric::RougeLsum,
];

impl OverlapMetric {
    /// Every figure, in the report's order.
    pub const ALL: [Self; 7] = [
        Self::Rouge1,
        Self::Rouge2,
        Self::RougeL,
        Self::RougeLsum,
        Self::F1,
        Self::Bleu,
        Self::Chrf,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rouge1 => "rouge1",
            Self::Rouge2 => "rouge2",
            Self::RougeL => "rougeL",
            Self::RougeLsum => "rougeLsum",
            Self::F1 => "f1",
            Self::Bleu => "bleu",
            Self::Chrf => "chrf",
        }
    }

    /// Whether the report's figure is the corpus's, from the records' summed statistics
    /// (BLEU, chrF), rather than the mean of the records' own.
    pub fn is_corpus_figure(self) -> bool {
        matches!(self, Self::Bleu | Self::Chrf)
    }

    /// Whether it is a ROUGE figure (its words stemmed with `--rouge-stemmer`).
    pub fn is_rouge(self) -> bool {
        matches!(
            self,
            Self::Rouge1 | Self::Rouge2 | Self::RougeL | Self::RougeLsum
        )
    }

    /// The figures `names` ask for (`rouge` is the four ROUGE figures), each once, in
    /// the order the report lists them; a name it does not know is refused, listing
    /// those it does.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Vec<Self>, String> {
        let mut metrics = Vec::new();
        for name in names {
            let name = name.as_ref().trim();
            match name {
                "rouge" => metrics.extend(ROUGE),
                _ => match Self::ALL.into_iter().find(|m| m.name() == name) {
                    Some(metric) => metrics.push(metric),
                    None => {
                        return Err(format!(
                            "{name:?} is not an overlap metric: give rouge (rouge1, rouge2, \
                             rougeL and rougeLsum), one of those, f1 (SQuAD's token F1), \
                             bleu or chrf (sacrebleu's)"
                        ));
                    }
                },
            }
        }
        metrics.sort_unstable();
        metrics.dedup();
        Ok(metrics)
    }
}

/// One answer's overlap figures with its record's references: those the job asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverlapScores {
    /// ROUGE-1's F-measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge1: Option<f64>,
    /// ROUGE-2's F-measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge2: Option<f64>,
    /// ROUGE-L's F-measure.
    #[serde(default, rename = "rougeL", skip_serializing_if = "Option::is_none")]
    pub rouge_l: Option<f64>,
    /// ROUGE-Lsum's F-measure.
    #[serde(default, rename = "rougeLsum", skip_serializing_if = "Option::is_none")]
    pub rouge_lsum: Option<f64>,
    /// SQuAD's token F1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    /// Sentence BLEU (`sacrebleu`'s `sentence_bleu`, 0 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bleu: Option<f64>,
    /// Sentence chrF (`sentence_chrf`, 0 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrf: Option<f64>,
    /// The BLEU match statistics the corpus figure sums (not in the line).
    #[serde(skip)]
    pub bleu_stats: Option<BleuStats>,
    /// The chrF match statistics the corpus figure sums (not in the line).
    #[serde(skip)]
    pub chrf_stats: Option<ChrfStats>,
}

impl OverlapScores {
    /// `metric`'s figure, where it was asked for.
    pub fn get(&self, metric: OverlapMetric) -> Option<f64> {
        *self.slot(metric)
    }

    fn slot(&self, metric: OverlapMetric) -> &Option<f64> {
        match metric {
            OverlapMetric::Rouge1 => &self.rouge1,
            OverlapMetric::Rouge2 => &self.rouge2,
            OverlapMetric::RougeL => &self.rouge_l,
            OverlapMetric::RougeLsum => &self.rouge_lsum,
            OverlapMetric::F1 => &self.f1,
            OverlapMetric::Bleu => &self.bleu,
            OverlapMetric::Chrf => &self.chrf,
        }
    }

    fn slot_mut(&mut self, metric: OverlapMetric) -> &mut Option<f64> {
        match metric {
            OverlapMetric::Rouge1 => &mut self.rouge1,
            OverlapMetric::Rouge2 => &mut self.rouge2,
            OverlapMetric::RougeL => &mut self.rouge_l,
            OverlapMetric::RougeLsum => &mut self.rouge_lsum,
            OverlapMetric::F1 => &mut self.f1,
            OverlapMetric::Bleu => &mut self.bleu,
            OverlapMetric::Chrf => &mut self.chrf,
        }
    }
}

/// How ROUGE's words are read: stemmed or not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RougeWords {
    /// Each word of more than three letters Porter-stemmed (`rouge-score`'s
    /// `use_stemmer=True`).
    pub stemmed: bool,
}

/// Scores `answer` (none found: an empty answer) against `references` by each of
/// `metrics`, the best over the references, ROUGE's words read as `words` says; `None`
/// without references.
pub fn overlap_scores(
    metrics: &[OverlapMetric],
    words: RougeWords,
    answer: Option<&str>,
    references: &[String],
) -> Option<OverlapScores> {
    if references.is_empty() || metrics.is_empty() {
        return None;
    }
    let answer = answer.unwrap_or_default();
    let mut scores = OverlapScores::default();
    let best = |score: &dyn Fn(&str) -> f64| {
        let best = references.iter().map(|r| score(r)).fold(0.0, f64::max);
        Some(best)
    };
    // Each text read into ROUGE's words once, for every ROUGE figure asked.
    let rouge = metrics.iter().any(|m| m.is_rouge()).then(|| {
        let references: Vec<RougeText> = references.iter().map(|r| words.read(r)).collect();
        (words.read(answer), references)
    });
    let best_rouge = |score: fn(&RougeText, &RougeText) -> f64| {
        let (answer, references) = rouge.as_ref().expect("read for a ROUGE figure");
        let best = references
            .iter()
            .map(|r| score(r, answer))
            .fold(0.0, f64::max);
        Some(best)
    };
    for &metric in metrics {
        let figure = match metric {
            OverlapMetric::Rouge1 => best_rouge(|r, a| rouge_n(r, a, 1)),
            OverlapMetric::Rouge2 => best_rouge(|r, a| rouge_n(r, a, 2)),
            OverlapMetric::RougeL => best_rouge(rouge_l),
            OverlapMetric::RougeLsum => best_rouge(rouge_lsum),
            OverlapMetric::F1 => best(&|r| squad_f1(r, answer)),
            // Every reference at once: the closest length, each n-gram's most.
            OverlapMetric::Bleu => {
                scores.bleu_stats = BleuStats::of(answer, references);
                scores.bleu_stats.map(|stats| stats.score(true))
            }
            // The best reference's statistics.
            OverlapMetric::Chrf => {
                scores.chrf_stats = ChrfStats::of(answer, references);
                scores.chrf_stats.map(|stats| stats.score())
            }
        };
        *scores.slot_mut(metric) = figure;
    }
    Some(scores)
}

/// A text as ROUGE reads it: its words, and its lines' words (ROUGE-Lsum's sentences).
struct RougeText {
    /// Every word, in order.
    words: Vec<String>,
    /// Each line's words (empty lines left out).
    lines: Vec<Vec<String>>,
}

impl RougeWords {
    /// `text`'s words and lines' words. A line break separates words, so the text's words
    /// are its lines' words one after the other.
    fn read(self, text: &str) -> RougeText {
        let lines: Vec<Vec<String>> = (text.split('\n'))
            .filter(|line| !line.is_empty())
            .map(|line| self.of(line))
            .collect();
        RougeText {
            words: lines.concat(),
            lines,
        }
    }

    /// `rouge-score`'s default tokenizer: lower-cased, split at every character that is
    /// not an ASCII letter or digit; stemmed, a word of more than three letters.
    fn of(self, text: &str) -> Vec<String> {
        let lower = text.to_lowercase();
        let words = (lower.split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit())))
            .filter(|word| !word.is_empty());
        match self.stemmed {
            true => words
                .map(|word| match word.len() > 3 {
                    true => porter_stem(word),
                    false => word.to_owned(),
                })
                .collect(),
            false => words.map(str::to_owned).collect(),
        }
    }
}

/// The F-measure of a precision and a recall (0 when both are).
fn f_measure(precision: f64, recall: f64) -> f64 {
    if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    }
}

/// The word `n`-grams of `words`, counted.
fn ngram_counts(words: &[String], n: usize) -> HashMap<&[String], u32> {
    let mut counts = HashMap::new();
    for gram in words.windows(n) {
        *counts.entry(gram).or_insert(0) += 1;
    }
    counts
}

/// ROUGE-N's F-measure of `answer` against `reference`.
fn rouge_n(reference: &RougeText, answer: &RougeText, n: usize) -> f64 {
    let (reference, answer) = (
        ngram_counts(&reference.words, n),
        ngram_counts(&answer.words, n),
    );
    let shared: u32 = (reference.iter())
        .map(|(gram, count)| (*count).min(answer.get(gram).copied().unwrap_or(0)))
        .sum();
    let total = |counts: &HashMap<&[String], u32>| counts.values().sum::<u32>().max(1);
    let shared = f64::from(shared);
    f_measure(
        shared / f64::from(total(&answer)),
        shared / f64::from(total(&reference)),
    )
}

/// The table of longest common subsequence lengths of `a[..i]` and `b[..j]`.
fn lcs_table(a: &[String], b: &[String]) -> Vec<Vec<u32>> {
    let mut table = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            table[i][j] = if a[i - 1] == b[j - 1] {
                table[i - 1][j - 1] + 1
            } else {
                table[i - 1][j].max(table[i][j - 1])
            };
        }
    }
    table
}

/// ROUGE-L's F-measure of `answer` against `reference`.
fn rouge_l(reference: &RougeText, answer: &RougeText) -> f64 {
    let (reference, answer) = (&reference.words, &answer.words);
    if reference.is_empty() || answer.is_empty() {
        return 0.0;
    }
    let common = f64::from(lcs_table(reference, answer)[reference.len()][answer.len()]);
    f_measure(
        common / answer.len() as f64,
        common / reference.len() as f64,
    )
}

/// The positions in `reference` of one longest common subsequence with `answer`, read
/// back from the table as `rouge-score` reads it (on a tie, the answer's side first).
fn lcs_positions(reference: &[String], answer: &[String]) -> Vec<usize> {
    let table = lcs_table(reference, answer);
    let (mut i, mut j) = (reference.len(), answer.len());
    let mut positions = Vec::new();
    while i > 0 && j > 0 {
        if reference[i - 1] == answer[j - 1] {
            positions.push(i - 1);
            i -= 1;
            j -= 1;
        } else if table[i][j - 1] > table[i - 1][j] {
            j -= 1;
        } else {
            i -= 1;
        }
    }
    positions.reverse();
    positions
}

/// ROUGE-Lsum's F-measure: each reference line's union of longest common subsequences
/// with the answer's lines, a word counted no more often than both texts have it.
fn rouge_lsum(reference: &RougeText, answer: &RougeText) -> f64 {
    let (reference_words, answer_words) = (reference.words.len(), answer.words.len());
    let (reference, answer) = (&reference.lines, &answer.lines);
    if reference_words == 0 || answer_words == 0 {
        return 0.0;
    }
    let counts = |lines: &[Vec<String>]| {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for word in lines.iter().flatten() {
            *counts.entry(word.clone()).or_default() += 1;
        }
        counts
    };
    let (mut left_in_reference, mut left_in_answer) = (counts(reference), counts(answer));
    let mut hits = 0u32;
    for line in reference {
        let mut union: Vec<usize> = (answer.iter())
            .flat_map(|answer_line| lcs_positions(line, answer_line))
            .collect();
        union.sort_unstable();
        union.dedup();
        for word in union.into_iter().map(|at| &line[at]) {
            let (in_reference, in_answer) = (
                left_in_reference.get_mut(word),
                left_in_answer.get_mut(word),
            );
            if let (Some(r), Some(a)) = (in_reference, in_answer)
                && *r > 0
                && *a > 0
            {
                hits += 1;
                *r -= 1;
                *a -= 1;
            }
        }
    }
    let hits = f64::from(hits);
    f_measure(hits / answer_words as f64, hits / reference_words as f64)
}

/// SQuAD's answer words: lower-cased, ASCII punctuation removed, the articles `a`, `an`
/// and `the` replaced by a space, split at whitespace.
fn squad_words(text: &str) -> Vec<String> {
    static ARTICLES: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\b(a|an|the)\b").expect("a fixed pattern"));
    let mut text = text.to_lowercase();
    text.retain(|c| !c.is_ascii_punctuation());
    let text = match ARTICLES.replace_all(&text, " ") {
        std::borrow::Cow::Borrowed(_) => text.clone(),
        std::borrow::Cow::Owned(replaced) => replaced,
    };
    text.split_whitespace().map(str::to_owned).collect()
}

/// SQuAD's token F1 of `answer` against `reference` (1 when both have no words, 0 when one
/// has none).
fn squad_f1(reference: &str, answer: &str) -> f64 {
    let (reference, answer) = (squad_words(reference), squad_words(answer));
    if reference.is_empty() || answer.is_empty() {
        return f64::from(u8::from(reference == answer));
    }
    let mut left: HashMap<&str, u32> = HashMap::new();
    for word in &reference {
        *left.entry(word.as_str()).or_default() += 1;
    }
    let mut shared = 0u32;
    for word in &answer {
        if let Some(count) = left.get_mut(word.as_str())
            && *count > 0
        {
            *count -= 1;
            shared += 1;
        }
    }
    if shared == 0 {
        return 0.0;
    }
    let shared = f64::from(shared);
    f_measure(
        shared / answer.len() as f64,
        shared / reference.len() as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: RougeWords = RougeWords { stemmed: false };

    /// ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum of `answer` against `reference`, each
    /// close to `want`'s.
    fn assert_rouge(words: RougeWords, reference: &str, answer: &str, want: [f64; 4]) {
        let (reference, answer) = (words.read(reference), words.read(answer));
        let got = [
            rouge_n(&reference, &answer, 1),
            rouge_n(&reference, &answer, 2),
            rouge_l(&reference, &answer),
            rouge_lsum(&reference, &answer),
        ];
        for (got, want) in got.into_iter().zip(want) {
            close(got, want);
        }
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-12, "{got} != {want}");
    }

    /// Figures `rouge-score` 0.1.2 gives for the same texts (its own README's example, and
    /// texts that exercise its tokenizer, its n-gram counts and its summary-level LCS).
    #[test]
    fn rouge_figures_are_rouge_score_s() {
        let (reference, answer) = (
            "The quick brown fox jumps over the lazy dog",
            "The quick brown dog jumps on the log.",
        );
        let figures = [0.7058823529411765, 0.26666666666666666, 0.5882352941176471];
        assert_rouge(
            PLAIN,
            reference,
            answer,
            [figures[0], figures[1], figures[2], figures[2]],
        );
        let (reference, answer) = (
            "police killed the gunman.\nthe gunman shot three people",
            "the gunman was shot by police\npolice killed three people",
        );
        let (one, two, whole) = (0.7368421052631577, 0.35294117647058826, 0.5263157894736842);
        assert_rouge(PLAIN, reference, answer, [one, two, whole, one]);
        assert_eq!(
            PLAIN.of("It's 3-D, naïve!"),
            ["it", "s", "3", "d", "na", "ve"]
        );
        let read = |text: &str| PLAIN.read(text);
        close(rouge_n(&read("東京 tower"), &read("東京"), 1), 0.0);
        close(rouge_l(&read(""), &read("anything")), 0.0);
        close(rouge_lsum(&read("a\n\n"), &read("\n")), 0.0);
        assert_eq!(
            read("The cat\n\nsat, down").words,
            ["the", "cat", "sat", "down"]
        );
    }

    /// With the stemmer (`use_stemmer=True`): `officials`/`official`, `flooding`/`floods`,
    /// `destroyed`/`destroy`, `houses` meet; words of three letters or fewer stay whole.
    #[test]
    fn stemmed_rouge_is_rouge_score_s_with_its_stemmer() {
        let stemmed = RougeWords { stemmed: true };
        assert_eq!(
            stemmed.of("Officials said the flooding destroyed hundreds of houses"),
            [
                "offici", "said", "the", "flood", "destroy", "hundr", "of", "hous"
            ]
        );
        let (reference, answer) = (
            "Officials said the flooding destroyed hundreds of houses",
            "An official says floods destroy houses",
        );
        let (one, two) = (0.5714285714285715, 0.16666666666666666);
        assert_rouge(stemmed, reference, answer, [one, two, one, one]);
        close(
            rouge_n(&PLAIN.read(reference), &PLAIN.read(answer), 1),
            2.0 * 1.0 / 6.0 * 1.0 / 8.0 / (1.0 / 6.0 + 1.0 / 8.0),
        );
    }

    /// SQuAD's official script's figures: articles and punctuation dropped, bags of words,
    /// empty answers.
    #[test]
    fn squad_f1_is_the_official_script_s() {
        close(squad_f1("The Eiffel Tower", "eiffel tower!"), 1.0);
        close(squad_f1("Denver Broncos", "the Broncos of Denver"), 0.8);
        close(squad_f1("a cat", "the"), 0.0);
        close(squad_f1("the", "A"), 1.0);
        close(squad_f1("cat", ""), 0.0);
        close(squad_f1("1,000 people", "1000"), 2.0 / 3.0);
        assert_eq!(squad_words("Theatre an apple."), ["theatre", "apple"]);
    }

    /// The best reference counts; nothing found scores 0; no references, no figures; the
    /// names as flags give them.
    #[test]
    fn scores_are_the_best_over_references_for_the_metrics_asked() {
        let metrics = OverlapMetric::from_names(&["f1", "rouge", "rouge1"]).unwrap();
        assert_eq!(
            metrics.iter().map(|m| m.name()).collect::<Vec<_>>(),
            ["rouge1", "rouge2", "rougeL", "rougeLsum", "f1"]
        );
        let references = ["Paris".to_owned(), "the city of Paris".to_owned()];
        let scores = overlap_scores(&metrics, PLAIN, Some("city of Paris"), &references).unwrap();
        close(scores.get(OverlapMetric::F1).unwrap(), 1.0);
        close(scores.rouge1.unwrap(), 2.0 * 0.75 / 1.75);
        let json = serde_json::to_value(scores).unwrap();
        assert!(
            json["rougeL"].is_number() && json["rougeLsum"].is_number(),
            "{json}"
        );
        let f1_only = OverlapMetric::from_names(&["f1"]).unwrap();
        let none_found = overlap_scores(&f1_only, PLAIN, None, &references).unwrap();
        assert_eq!(none_found.f1, Some(0.0));
        let only_f1 = serde_json::to_value(none_found).unwrap();
        assert_eq!(only_f1, serde_json::json!({"f1": 0.0}));
        assert_eq!(overlap_scores(&f1_only, PLAIN, Some("Paris"), &[]), None);
        let error = OverlapMetric::from_names(&["meteor"]).unwrap_err();
        assert!(
            error.contains("\"meteor\" is not") && error.ends_with("bleu or chrf (sacrebleu's)"),
            "{error}"
        );
    }
}
