//! BLEU and chrF of generated answers against their references as `sacrebleu` computes them
//! (pure; its defaults: BLEU on the `13a` tokenizer with `exp` smoothing, chrF of character
//! 1- to 6-grams, whitespace removed, beta 2), which is what lm-evaluation-harness's
//! translation tasks and Hugging Face's `evaluate` report. Both are corpus figures: each
//! answer's match statistics ([`BleuStats`], [`ChrfStats`]) add up over the records (per
//! chunk in the manifest, so a resumed job's figure covers its whole output), and the score
//! comes from the sums, as `corpus_bleu` and `corpus_chrf` compute it; a line's own figure
//! is `sentence_bleu`'s (orders with no n-gram left out) and `sentence_chrf`'s. Scores run
//! from 0 to 100, as `sacrebleu` writes them.
//!
//! Written here rather than taken from a crate: the BLEU crates tokenise otherwise or
//! compute sentence BLEU only, and a figure that differs from `sacrebleu`'s is worse than
//! none; the Python tests hold these to `sacrebleu` itself.

use std::collections::HashMap;
use std::sync::LazyLock;

use fancy_regex::Regex;
use serde::{Deserialize, Serialize};

/// BLEU's highest n-gram order.
const BLEU_ORDER: usize = 4;
/// chrF's highest character n-gram order.
const CHRF_ORDER: usize = 6;
/// chrF's beta: recall weighs `beta` times precision.
const CHRF_BETA: f64 = 2.0;

/// One answer's, or a corpus's, BLEU match statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BleuStats {
    /// The answers counted.
    pub records: u64,
    /// Their tokens.
    pub answer_tokens: u64,
    /// Each one's closest reference's tokens (the shorter on a tie), summed.
    pub reference_tokens: u64,
    /// Of each order's n-grams of the answers, those a reference has (clipped to the most
    /// any one reference has).
    pub matches: [u64; BLEU_ORDER],
    /// Each order's n-grams of the answers.
    pub totals: [u64; BLEU_ORDER],
}

/// One answer's, or a corpus's, chrF match statistics: for each character n-gram order,
/// the answer's n-grams, the reference's and those they share (of the reference that
/// scores best).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChrfStats {
    /// The answers counted.
    pub records: u64,
    /// `[answer, reference, shared]` n-grams for orders 1 to 6.
    pub orders: [[u64; 3]; CHRF_ORDER],
}

/// `sacrebleu`'s `13a` tokenizer (mteval-v13a's, WMT's): the segment's trailing
/// whitespace dropped, line breaks joined, four entities decoded, punctuation and symbols
/// split off (a period or comma only when not between digits, a dash after a digit).
fn tokens_13a(segment: &str) -> Vec<String> {
    static SPLITS: LazyLock<[(Regex, &str); 4]> = LazyLock::new(|| {
        let compile = |pattern: &str| Regex::new(pattern).expect("a fixed pattern");
        [
            (compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), " $1 "),
            (compile(r"([^0-9])([\.,])"), "$1 $2 "),
            (compile(r"([\.,])([^0-9])"), " $1 $2"),
            (compile(r"([0-9])(-)"), "$1 $2 "),
        ]
    });
    let mut line = segment
        .trim_end()
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        for (entity, text) in [
            ("&quot;", "\""),
            ("&amp;", "&"),
            ("&lt;", "<"),
            ("&gt;", ">"),
        ] {
            line = line.replace(entity, text);
        }
    }
    let mut line = format!(" {line} ");
    for (pattern, replacement) in SPLITS.iter() {
        line = pattern.replace_all(&line, *replacement).into_owned();
    }
    line.split_whitespace().map(str::to_owned).collect()
}

/// A token list's n-grams of orders 1 to [`BLEU_ORDER`], counted.
fn word_ngrams(tokens: &[String]) -> HashMap<&[String], u64> {
    let mut counts = HashMap::new();
    for n in 1..=BLEU_ORDER {
        for gram in tokens.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

impl BleuStats {
    /// `answer`'s statistics against `references` (none: `None`).
    pub fn of(answer: &str, references: &[String]) -> Option<Self> {
        if references.is_empty() {
            return None;
        }
        let references: Vec<Vec<String>> = references.iter().map(|r| tokens_13a(r)).collect();
        let mut most: HashMap<&[String], u64> = HashMap::new();
        for reference in &references {
            for (gram, count) in word_ngrams(reference) {
                let kept = most.entry(gram).or_insert(0);
                *kept = (*kept).max(count);
            }
        }
        let answer = tokens_13a(answer);
        let length = answer.len() as u64;
        // The closest reference length; the shorter of two as close.
        let closest = (references.iter().map(|r| r.len() as u64))
            .min_by_key(|len| (len.abs_diff(length), *len))
            .unwrap_or(0);
        let mut stats = Self {
            records: 1,
            answer_tokens: length,
            reference_tokens: closest,
            ..Self::default()
        };
        for (gram, count) in word_ngrams(&answer) {
            let order = gram.len() - 1;
            stats.totals[order] += count;
            stats.matches[order] += count.min(most.get(gram).copied().unwrap_or(0));
        }
        Some(stats)
    }

    /// Adds another's.
    pub fn add(&mut self, other: &Self) {
        self.records += other.records;
        self.answer_tokens += other.answer_tokens;
        self.reference_tokens += other.reference_tokens;
        for order in 0..BLEU_ORDER {
            self.matches[order] += other.matches[order];
            self.totals[order] += other.totals[order];
        }
    }

    /// The BLEU these statistics give, 0 to 100, `exp`-smoothed (an order without a match
    /// counts as half the previous such order's one match); `effective_order` (sentence
    /// BLEU's): orders with no n-gram at all are left out of the mean rather than zero it.
    pub fn score(&self, effective_order: bool) -> f64 {
        let brevity = match self.answer_tokens < self.reference_tokens {
            true if self.answer_tokens == 0 => 0.0,
            true => (1.0 - self.reference_tokens as f64 / self.answer_tokens as f64).exp(),
            false => 1.0,
        };
        if self.matches.iter().all(|&m| m == 0) {
            return 0.0;
        }
        let mut precisions = [0.0f64; BLEU_ORDER];
        let (mut smoothing, mut orders) = (1.0, BLEU_ORDER);
        let counts = self.matches.iter().zip(&self.totals);
        for (n, (precision, (&matched, &total))) in precisions.iter_mut().zip(counts).enumerate() {
            if total == 0 {
                break;
            }
            if effective_order {
                orders = n + 1;
            }
            *precision = match matched {
                0 => {
                    smoothing *= 2.0;
                    100.0 / (smoothing * total as f64)
                }
                _ => 100.0 * matched as f64 / total as f64,
            };
        }
        // sacrebleu floors log(0) at -9999999999: an order without n-grams zeroes the score.
        let log = |p: f64| if p == 0.0 { -9_999_999_999.0 } else { p.ln() };
        let mean = precisions[..orders].iter().map(|&p| log(p)).sum::<f64>() / orders as f64;
        brevity * mean.exp()
    }
}

/// A segment without its whitespace (chrF's default reads characters so).
fn without_whitespace(segment: &str) -> String {
    segment.split_whitespace().collect()
}

/// The character n-grams of orders 1 to [`CHRF_ORDER`] of `text`, counted.
fn char_ngrams(text: &str) -> Vec<HashMap<&str, u64>> {
    let starts: Vec<usize> = (text.char_indices().map(|(at, _)| at))
        .chain([text.len()])
        .collect();
    let chars = starts.len() - 1;
    let mut orders = Vec::with_capacity(CHRF_ORDER);
    for n in 1..=CHRF_ORDER {
        let mut counts: HashMap<&str, u64> = HashMap::new();
        for first in 0..(chars + 1).saturating_sub(n) {
            *counts
                .entry(&text[starts[first]..starts[first + n]])
                .or_insert(0) += 1;
        }
        orders.push(counts);
    }
    orders
}

impl ChrfStats {
    /// `answer`'s statistics against the one of `references` it scores best on (the first
    /// of equals; none: `None`).
    pub fn of(answer: &str, references: &[String]) -> Option<Self> {
        let answer = without_whitespace(answer);
        let answer_grams = char_ngrams(&answer);
        let mut best: Option<(f64, Self)> = None;
        for reference in references {
            let reference = without_whitespace(reference);
            let reference_grams = char_ngrams(&reference);
            let mut stats = Self {
                records: 1,
                ..Self::default()
            };
            for (order, (ours, theirs)) in answer_grams.iter().zip(&reference_grams).enumerate() {
                let shared = (ours.iter())
                    .map(|(gram, count)| (*count).min(theirs.get(gram).copied().unwrap_or(0)))
                    .sum();
                let answer_count = match theirs.is_empty() {
                    true => 0,
                    false => ours.values().sum(),
                };
                stats.orders[order] = [answer_count, theirs.values().sum(), shared];
            }
            let score = stats.score();
            if best
                .as_ref()
                .is_none_or(|(best_score, _)| score > *best_score)
            {
                best = Some((score, stats));
            }
        }
        best.map(|(_, stats)| stats)
    }

    /// Adds another's.
    pub fn add(&mut self, other: &Self) {
        self.records += other.records;
        for (ours, theirs) in self.orders.iter_mut().zip(&other.orders) {
            for (a, b) in ours.iter_mut().zip(theirs) {
                *a += b;
            }
        }
    }

    /// The chrF these statistics give, 0 to 100: the F-beta of the precision and the recall
    /// averaged over the orders both sides have n-grams of.
    pub fn score(&self) -> f64 {
        let (mut precision, mut recall, mut orders) = (0.0, 0.0, 0u32);
        for [answer, reference, shared] in self.orders {
            if answer > 0 && reference > 0 {
                precision += shared as f64 / answer as f64;
                recall += shared as f64 / reference as f64;
                orders += 1;
            }
        }
        if orders == 0 {
            return 0.0;
        }
        let (precision, recall) = (precision / f64::from(orders), recall / f64::from(orders));
        if precision + recall == 0.0 {
            return 0.0;
        }
        let factor = CHRF_BETA * CHRF_BETA;
        100.0 * (1.0 + factor) * precision * recall / (factor * precision + recall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-9, "{got} != {want}");
    }

    /// sacrebleu 2.6's `Tokenizer13a` on the same segments.
    #[test]
    fn the_13a_tokenizer_splits_as_sacrebleu_s() {
        let joined = |segment: &str| tokens_13a(segment).join(" ");
        assert_eq!(
            joined("It costs $3,000.50 -- \"cheap\", isn't it?  "),
            "It costs $ 3,000.50 -- \" cheap \" , isn't it ?"
        );
        assert_eq!(
            joined("A 10-km race &amp; more.\nNext line-\nbreak"),
            "A 10 - km race & more . Next linebreak"
        );
        assert_eq!(joined("Hello, world.end 1.5"), "Hello , world . end 1.5");
    }

    /// Answers, references and the figures sacrebleu 2.6 gives them: `sentence_bleu`,
    /// `sentence_chrf` for each, `corpus_bleu` and `corpus_chrf` for the three (the second
    /// with two references, the others one).
    #[test]
    fn sentence_and_corpus_figures_are_sacrebleu_s() {
        let cases: [(&str, &[&str], f64, f64); 3] = [
            (
                "The cat sat on the mat.",
                &["The cat is sitting on the mat."],
                42.38365628278778,
                49.6485170311433,
            ),
            (
                "A dog barked loudly at 3 p.m.",
                &["The dog barked loudly at 3 p.m.", "A dog was barking."],
                93.06048591021002,
                88.16505168396611,
            ),
            (
                "Nothing matches here",
                &["Completely different words"],
                0.0,
                10.37138527461729,
            ),
        ];
        let (mut bleu, mut chrf) = (BleuStats::default(), ChrfStats::default());
        for (answer, references, sentence_bleu, sentence_chrf) in cases {
            let references: Vec<String> = references.iter().map(|r| r.to_string()).collect();
            let ours = BleuStats::of(answer, &references).unwrap();
            close(ours.score(true), sentence_bleu);
            bleu.add(&ours);
            let ours = ChrfStats::of(answer, &references).unwrap();
            close(ours.score(), sentence_chrf);
            chrf.add(&ours);
        }
        assert_eq!(
            (
                bleu.matches,
                bleu.totals,
                bleu.answer_tokens,
                bleu.reference_tokens
            ),
            ([16, 13, 9, 7], [20, 17, 14, 11], 20, 21)
        );
        assert_eq!((bleu.records, chrf.records), (3, 3));
        close(bleu.score(false), 67.28005495706151);
        close(chrf.score(), 50.53703227042703);
        assert_eq!(BleuStats::of("x", &[]), None);
        assert_eq!(ChrfStats::of("x", &[]), None);
        let nothing = BleuStats::of("", &["a reference".to_owned()]).unwrap();
        assert_eq!((nothing.score(false), nothing.reference_tokens), (0.0, 2));
        close(ChrfStats::of("", &["a b".to_owned()]).unwrap().score(), 0.0);
    }
}
