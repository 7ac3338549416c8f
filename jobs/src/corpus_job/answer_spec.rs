//! How a generate job checks its answers, as it is declared (pure): the reference field,
//! the filters that find an answer in the generated text (one unnamed `--extract`, or
//! several named `--filter`s, lm-evaluation-harness's GSM8K `strict-match` and
//! `flexible-extract` over one generation), how answers and references are compared, and
//! the rules by which the CLI and Python refuse combinations that cannot run, each front
//! end in its own names ([`AnswerFlags`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::text_overlap::OverlapMetric;

/// Which of the filter's matches is the answer (lm-evaluation-harness's `group_select`:
/// `0` first, `-1` last).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExtractMatch {
    /// GSM8K's `strict-match`: the first.
    #[default]
    First,
    /// GSM8K's `flexible-extract`: the last.
    Last,
}

/// How answers are found and compared, as a job declares it (`--reference-field`,
/// `--extract`, `--extract-match`, `--filter`, `--ignore-regex`, `--ignore-case`,
/// `--ignore-punctuation`; from Python, the same keys as JSON). Its JSON is the job's
/// settings fingerprint, so a key added later is left out while at its default: outputs
/// made before it resume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnswerMatchSpec {
    /// The field of a record's right answer: a text, a number, or a list of either (any
    /// one is right); `None`: answers are extracted, and not checked.
    pub reference_field: Option<String>,
    /// The filter that finds the answer in the generated text; `None`: all of it.
    pub extract: Option<String>,
    /// Which of its matches.
    pub extract_match: ExtractMatch,
    /// Named filters in its place, each judged on its own: the first gives the line's
    /// `extracted` and the report's `exact_match`, every one its entry under `filters`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<FilterSpec>,
    /// What is taken out of the answer and the references before they are compared.
    pub ignore: Vec<String>,
    /// Compare lower-cased.
    pub ignore_case: bool,
    /// Compare without ASCII punctuation.
    pub ignore_punctuation: bool,
    /// The overlap figures each answer also gets against the references (`--metric`:
    /// ROUGE, SQuAD's F1), each once, in the report's order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<OverlapMetric>,
    /// ROUGE's words Porter-stemmed (`--rouge-stemmer`, `rouge-score`'s `use_stemmer`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rouge_stemmer: bool,
}

/// One named filter (`--filter NAME=REGEX`, `NAME:last=REGEX` for its last match; an
/// empty REGEX takes the whole text). Written to JSON as the flag writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FilterSpec {
    /// Its name in lines and the report: letters, digits, `-`, `_` and `.`.
    pub name: String,
    /// The regular expression; empty: the whole text.
    pub pattern: String,
    /// Which of its matches.
    pub select: ExtractMatch,
}

impl FromStr for FilterSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let refuse = |why: &str| {
            format!(
                "filter {text:?} {why}: give NAME=REGEX, or NAME:last=REGEX for the last \
                 match (GSM8K's 'flexible-extract:last=(-?[$0-9.,]{{2,}})|(-?[0-9]+)')"
            )
        };
        let (head, pattern) = text.split_once('=').ok_or_else(|| refuse("has no `=`"))?;
        let (name, select) = match head.split_once(':') {
            None => (head, ExtractMatch::First),
            Some((name, "first")) => (name, ExtractMatch::First),
            Some((name, "last")) => (name, ExtractMatch::Last),
            Some(_) => return Err(refuse("picks a match that is not `first` or `last`")),
        };
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if name.is_empty() || !name.chars().all(allowed) {
            return Err(refuse(
                "has a name that is not letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            pattern: pattern.to_owned(),
            select,
        })
    }
}

impl fmt::Display for FilterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.select {
            ExtractMatch::First => write!(f, "{}={}", self.name, self.pattern),
            ExtractMatch::Last => write!(f, "{}:last={}", self.name, self.pattern),
        }
    }
}

impl TryFrom<String> for FilterSpec {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<FilterSpec> for String {
    fn from(filter: FilterSpec) -> Self {
        filter.to_string()
    }
}

/// Why a job's answer checks cannot run as asked; [`AnswerRefusal::message`] words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerRefusal {
    /// How answers are compared, without a reference to compare them with.
    ComparedWithoutReference,
    /// Overlap figures, without a reference to score answers against.
    MetricsWithoutReference,
    /// ROUGE's stemmer, without a ROUGE figure.
    StemmerWithoutRouge,
    /// Which match of `--extract`, without `--extract`.
    ExtractMatchWithoutExtract,
    /// `--extract` and `--filter` together.
    ExtractBesideFilters,
    /// Two filters of one name.
    FilterNamedTwice,
    /// Answer checks in a scoring job.
    Scored,
    /// Answer checks into OpenAI Batch output, which has no place for them.
    OpenaiBatch,
}

/// What a front end calls the arguments named in refusals.
#[derive(Clone, Copy, Debug)]
pub struct AnswerFlags {
    /// The reference's field.
    pub reference_field: &'static str,
    /// The one unnamed filter.
    pub extract: &'static str,
    /// Which of its matches.
    pub extract_match: &'static str,
    /// The named filters.
    pub filter: &'static str,
    /// What is taken out before comparing.
    pub ignore_regex: &'static str,
    /// Comparing lower-cased.
    pub ignore_case: &'static str,
    /// Comparing without punctuation.
    pub ignore_punctuation: &'static str,
    /// The overlap figures.
    pub metric: &'static str,
    /// Stemming ROUGE's words.
    pub rouge_stemmer: &'static str,
    /// Asking for scoring.
    pub score: &'static str,
    /// Asking for OpenAI Batch output.
    pub openai_batch: &'static str,
}

impl AnswerFlags {
    /// `resident generate`'s flags.
    pub const CLI: Self = Self {
        reference_field: "--reference-field",
        extract: "--extract",
        extract_match: "--extract-match",
        filter: "--filter",
        ignore_regex: "--ignore-regex",
        ignore_case: "--ignore-case",
        ignore_punctuation: "--ignore-punctuation",
        metric: "--metric",
        rouge_stemmer: "--rouge-stemmer",
        score: "--score",
        openai_batch: "--output-format openai-batch",
    };

    /// Python's `generate_job` keyword arguments.
    pub const PYTHON: Self = Self {
        reference_field: "reference_field",
        extract: "extract",
        extract_match: "extract_match",
        filter: "filters",
        ignore_regex: "ignore_regex",
        ignore_case: "ignore_case",
        ignore_punctuation: "ignore_punctuation",
        metric: "metrics",
        rouge_stemmer: "rouge_stemmer=True",
        score: "score=True",
        openai_batch: "output_format=\"openai-batch\"",
    };
}

impl AnswerRefusal {
    /// What was wrong and what to do, in `flags`' names.
    pub fn message(self, flags: &AnswerFlags) -> String {
        let AnswerFlags {
            reference_field,
            extract,
            extract_match,
            filter,
            ..
        } = flags;
        let checks = format!("{reference_field}, {extract} and {filter}");
        match self {
            Self::ComparedWithoutReference => format!(
                "{}, {} and {} say how answers are compared with each record's reference: \
                 give {reference_field}",
                flags.ignore_regex, flags.ignore_case, flags.ignore_punctuation
            ),
            Self::MetricsWithoutReference => format!(
                "{} scores each generated answer against its record's reference: give \
                 {reference_field} (the field of the reference summary or answers)",
                flags.metric
            ),
            Self::StemmerWithoutRouge => format!(
                "{} stems the words ROUGE compares: give {} rouge (or rouge1, rouge2, \
                 rougeL, rougeLsum) too",
                flags.rouge_stemmer, flags.metric
            ),
            Self::ExtractMatchWithoutExtract => format!(
                "{extract_match} picks among the matches of {extract}: give {extract} (a \
                 {filter} picks its own, as NAME:last=REGEX)"
            ),
            Self::ExtractBesideFilters => format!(
                "{extract} and {filter} both say how answers are found: give the {extract} \
                 pattern as one more named {filter} (the first named gives each line's \
                 `extracted` and the report's `exact_match`)"
            ),
            Self::FilterNamedTwice => format!(
                "two of {filter} have one name: name each filter apart (lines and the report \
                 hold each under its name)"
            ),
            Self::Scored => format!(
                "{checks} check generated answers, and under {} a record's answer names its \
                 right choice: check generations and score choices in two jobs",
                flags.score
            ),
            Self::OpenaiBatch => format!(
                "{checks} write `extracted` and `correct` into generations.jsonl: not with {}",
                flags.openai_batch
            ),
        }
    }
}

impl AnswerMatchSpec {
    /// Whether it asks for answers to be found or checked at all (the comparison's flags
    /// alone do not).
    pub fn asked(&self) -> bool {
        self.reference_field.is_some() || self.extract.is_some() || !self.filters.is_empty()
    }

    /// Why a job that scores (`scored`) or writes OpenAI Batch output (`openai_batch`)
    /// cannot check answers as this spec asks; `None` when it can (or asks for nothing).
    pub fn refusal(&self, scored: bool, openai_batch: bool) -> Option<AnswerRefusal> {
        let compared = !self.ignore.is_empty() || self.ignore_case || self.ignore_punctuation;
        let mut names: Vec<&str> = self.filters.iter().map(|f| f.name.as_str()).collect();
        names.sort_unstable();
        let rule = if compared && self.reference_field.is_none() {
            AnswerRefusal::ComparedWithoutReference
        } else if !self.metrics.is_empty() && self.reference_field.is_none() {
            AnswerRefusal::MetricsWithoutReference
        } else if self.rouge_stemmer && !self.metrics.iter().any(|m| m.is_rouge()) {
            AnswerRefusal::StemmerWithoutRouge
        } else if self.extract_match != ExtractMatch::First && self.extract.is_none() {
            AnswerRefusal::ExtractMatchWithoutExtract
        } else if self.extract.is_some() && !self.filters.is_empty() {
            AnswerRefusal::ExtractBesideFilters
        } else if names.windows(2).any(|pair| pair[0] == pair[1]) {
            AnswerRefusal::FilterNamedTwice
        } else if !self.asked() {
            return None;
        } else if scored {
            AnswerRefusal::Scored
        } else if openai_batch {
            AnswerRefusal::OpenaiBatch
        } else {
            return None;
        };
        Some(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_written_as_its_flag_and_read_back() {
        let strict: FilterSpec = r"strict-match=#### (\-?[0-9\.\,]+)".parse().unwrap();
        assert_eq!(
            (strict.name.as_str(), strict.pattern.as_str(), strict.select),
            ("strict-match", r"#### (\-?[0-9\.\,]+)", ExtractMatch::First)
        );
        let flexible: FilterSpec = "flexible-extract:last=(-?[$0-9.,]{2,})|(-?[0-9]+)"
            .parse()
            .unwrap();
        assert_eq!(flexible.select, ExtractMatch::Last);
        assert_eq!(
            flexible.pattern, "(-?[$0-9.,]{2,})|(-?[0-9]+)",
            "= inside kept"
        );
        let whole: FilterSpec = "whole:first=".parse().unwrap();
        assert_eq!(
            (whole.pattern.as_str(), whole.select),
            ("", ExtractMatch::First)
        );
        assert_eq!(whole.to_string(), "whole=");
        let spec = AnswerMatchSpec {
            filters: vec![strict, flexible],
            ..AnswerMatchSpec::default()
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json["filters"][1],
            "flexible-extract:last=(-?[$0-9.,]{2,})|(-?[0-9]+)"
        );
        assert_eq!(
            serde_json::from_value::<AnswerMatchSpec>(json).unwrap(),
            spec
        );
        let before = serde_json::to_value(AnswerMatchSpec::default()).unwrap();
        assert!(
            before.get("filters").is_none() && before.get("metrics").is_none(),
            "earlier fingerprints kept"
        );
        let rouge = AnswerMatchSpec {
            metrics: OverlapMetric::from_names(&["rouge"]).unwrap(),
            ..AnswerMatchSpec::default()
        };
        let json = serde_json::to_value(&rouge).unwrap();
        assert_eq!(
            json["metrics"],
            serde_json::json!(["rouge1", "rouge2", "rougeL", "rougeLsum"])
        );
        assert_eq!(
            serde_json::from_value::<AnswerMatchSpec>(json).unwrap(),
            rouge
        );
        for (bad, why) in [
            ("strict-match", "has no `=`"),
            ("a:middle=x", "not `first` or `last`"),
            ("=x", "a name that is not"),
            ("two words=x", "a name that is not"),
        ] {
            let error = bad.parse::<FilterSpec>().unwrap_err();
            assert!(
                error.contains(why) && error.contains("NAME=REGEX"),
                "{error}"
            );
        }
    }

    #[test]
    fn combinations_that_cannot_run_are_refused_in_each_front_end_s_names() {
        let filter = |text: &str| text.parse::<FilterSpec>().unwrap();
        let spec = |change: fn(&mut AnswerMatchSpec)| {
            let mut spec = AnswerMatchSpec::default();
            change(&mut spec);
            spec
        };
        let reference = spec(|s| s.reference_field = Some("answer".into()));
        assert_eq!(reference.refusal(false, false), None);
        assert_eq!(
            AnswerMatchSpec::default().refusal(true, true),
            None,
            "none asked"
        );
        let cases = [
            (
                spec(|s| s.ignore_case = true),
                AnswerRefusal::ComparedWithoutReference,
            ),
            (
                spec(|s| s.metrics = vec![OverlapMetric::F1]),
                AnswerRefusal::MetricsWithoutReference,
            ),
            (
                spec(|s| {
                    s.reference_field = Some("answer".into());
                    s.metrics = vec![OverlapMetric::F1];
                    s.rouge_stemmer = true;
                }),
                AnswerRefusal::StemmerWithoutRouge,
            ),
            (
                spec(|s| s.extract_match = ExtractMatch::Last),
                AnswerRefusal::ExtractMatchWithoutExtract,
            ),
            (
                AnswerMatchSpec {
                    extract: Some("x".into()),
                    filters: vec![filter("a=y")],
                    ..AnswerMatchSpec::default()
                },
                AnswerRefusal::ExtractBesideFilters,
            ),
            (
                AnswerMatchSpec {
                    filters: vec![filter("a=y"), filter("b=z"), filter("a:last=w")],
                    ..AnswerMatchSpec::default()
                },
                AnswerRefusal::FilterNamedTwice,
            ),
        ];
        for (spec, rule) in cases {
            assert_eq!(spec.refusal(false, false), Some(rule), "{spec:?}");
        }
        assert_eq!(reference.refusal(true, false), Some(AnswerRefusal::Scored));
        assert_eq!(
            reference.refusal(false, true),
            Some(AnswerRefusal::OpenaiBatch)
        );
        let cli = AnswerRefusal::Scored.message(&AnswerFlags::CLI);
        assert!(cli.starts_with("--reference-field, --extract and --filter check"));
        assert!(
            cli.contains("under --score") && cli.ends_with("in two jobs"),
            "{cli}"
        );
        let python = AnswerRefusal::OpenaiBatch.message(&AnswerFlags::PYTHON);
        assert!(
            python.starts_with("reference_field, extract and filters write")
                && python.ends_with("not with output_format=\"openai-batch\""),
            "{python}"
        );
        let compared = AnswerRefusal::ComparedWithoutReference.message(&AnswerFlags::CLI);
        assert!(compared.ends_with("give --reference-field"), "{compared}");
        let metrics = AnswerRefusal::MetricsWithoutReference.message(&AnswerFlags::PYTHON);
        assert!(
            metrics.starts_with("metrics scores") && metrics.contains("give reference_field"),
            "{metrics}"
        );
        let stemmer = AnswerRefusal::StemmerWithoutRouge.message(&AnswerFlags::CLI);
        assert!(
            stemmer.starts_with("--rouge-stemmer stems") && stemmer.contains("give --metric rouge"),
            "{stemmer}"
        );
    }
}
