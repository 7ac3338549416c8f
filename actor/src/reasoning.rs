//! Reasoning models' thinking, told apart from their answer: a completion of a model that
//! thinks in `<think>...</think>` (Qwen3, DeepSeek-R1 and its distillations) is split into
//! its reasoning and its content, as vLLM's `--reasoning-parser` splits it, so that what
//! a job writes, checks and scores as the answer is the answer alone.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The tag a model opens its thinking with.
pub const THINK_START: &str = "<think>";
/// The tag a model closes its thinking with.
pub const THINK_END: &str = "</think>";

/// How a completion's reasoning is found, by vLLM's parser names (in JSON too, where an
/// unknown name is refused with the names there are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum ReasoningParser {
    /// Qwen3: a completion without `</think>` has no reasoning (thinking switched off, or a
    /// model that does not think); with it, the text before it (after a `<think>`, when
    /// the completion opens with one) is the reasoning.
    Qwen3,
    /// DeepSeek-R1: the template opens the thinking in the prompt, so the text before
    /// `</think>` (after a `<think>` the model wrote itself) is the reasoning, and a
    /// completion cut before `</think>` is all reasoning, with no content.
    DeepseekR1,
}

/// A completion's text split by a [`ReasoningParser`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningSplit<'a> {
    /// The thinking, without its tags; `None` when the completion has none.
    pub reasoning: Option<&'a str>,
    /// The answer: the text after the thinking.
    pub content: &'a str,
}

impl ReasoningParser {
    /// Every parser, in the order their names are listed.
    pub const ALL: [Self; 2] = [Self::Qwen3, Self::DeepseekR1];

    /// The parser's name, as vLLM's `--reasoning-parser` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepseekR1 => "deepseek_r1",
        }
    }

    /// `text`'s reasoning and content.
    pub fn split(self, text: &str) -> ReasoningSplit<'_> {
        let Some(end) = text.find(THINK_END) else {
            return match self {
                Self::Qwen3 => ReasoningSplit {
                    reasoning: None,
                    content: text,
                },
                Self::DeepseekR1 => ReasoningSplit {
                    reasoning: Some(after_start(text)),
                    content: "",
                },
            };
        };
        ReasoningSplit {
            reasoning: Some(after_start(&text[..end])),
            content: &text[end + THINK_END.len()..],
        }
    }

    /// How many of a completion's tokens (`pieces`, each token's bytes in order) its
    /// reasoning takes, `</think>` included: OpenAI's `reasoning_tokens`. A completion
    /// without `</think>` has none under Qwen3's parser and is all reasoning under
    /// DeepSeek-R1's.
    pub fn reasoning_tokens<'a>(self, pieces: impl IntoIterator<Item = &'a [u8]>) -> u32 {
        let end = THINK_END.as_bytes();
        let mut seen: Vec<u8> = Vec::new();
        let mut count = 0;
        for piece in pieces {
            count += 1;
            // Only the tail that could hold the end tag across this piece matters.
            let keep = seen.len().saturating_sub(end.len() - 1);
            seen.drain(..keep);
            seen.extend_from_slice(piece);
            if seen.windows(end.len()).any(|window| window == end) {
                return count;
            }
        }
        match self {
            Self::Qwen3 => 0,
            Self::DeepseekR1 => count,
        }
    }
}

/// The thinking after the `<think>` the model wrote itself, when it wrote one (what comes
/// before the tag is the template's, or whitespace).
fn after_start(thinking: &str) -> &str {
    match thinking.find(THINK_START) {
        Some(start) => &thinking[start + THINK_START.len()..],
        None => thinking,
    }
}

impl fmt::Display for ReasoningParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<ReasoningParser> for String {
    fn from(parser: ReasoningParser) -> Self {
        parser.name().to_owned()
    }
}

impl TryFrom<String> for ReasoningParser {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        name.parse()
    }
}

impl FromStr for ReasoningParser {
    type Err = String;

    /// A parser by its name (`deepseek-r1`, SGLang's spelling, too).
    fn from_str(name: &str) -> Result<Self, String> {
        let wanted = name.trim().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|parser| parser.name().eq_ignore_ascii_case(&wanted))
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "no reasoning parser is named {name:?}: use one of {}",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(parser: ReasoningParser, text: &str) -> (Option<&str>, &str) {
        let split = parser.split(text);
        (split.reasoning, split.content)
    }

    /// Qwen3's parser: both tags, the end tag alone (the template opened the thinking),
    /// no tags (thinking switched off), a thinking cut short (no end tag: all content),
    /// an empty thinking block.
    #[test]
    fn qwen3_splits_at_the_end_tag_and_without_it_finds_no_reasoning() {
        let qwen3 = ReasoningParser::Qwen3;
        assert_eq!(
            split(qwen3, "<think>\nadd 2 and 2\n</think>\n\n4"),
            (Some("\nadd 2 and 2\n"), "\n\n4")
        );
        assert_eq!(split(qwen3, "add them</think>4"), (Some("add them"), "4"));
        assert_eq!(split(qwen3, "The answer is 4."), (None, "The answer is 4."));
        assert_eq!(
            split(qwen3, "<think>add 2 and"),
            (None, "<think>add 2 and"),
            "cut before the end tag: vLLM's qwen3 keeps it all as content"
        );
        assert_eq!(split(qwen3, "<think></think>4"), (Some(""), "4"));
        assert_eq!(split(qwen3, "<think>a</think>"), (Some("a"), ""));
        assert_eq!(
            split(qwen3, "a</think>b</think>c"),
            (Some("a"), "b</think>c"),
            "the first end tag ends the thinking"
        );
    }

    /// DeepSeek-R1's parser: as Qwen3's with an end tag; without one the whole completion
    /// is reasoning (cut by length while thinking), and no content.
    #[test]
    fn deepseek_r1_reads_a_completion_without_the_end_tag_as_all_reasoning() {
        let r1 = ReasoningParser::DeepseekR1;
        assert_eq!(
            split(r1, "think it over</think>4"),
            (Some("think it over"), "4")
        );
        assert_eq!(split(r1, "<think>x</think>y"), (Some("x"), "y"));
        assert_eq!(split(r1, "still thinking"), (Some("still thinking"), ""));
        assert_eq!(split(r1, "<think>still"), (Some("still"), ""));
        assert_eq!(split(r1, ""), (Some(""), ""));
    }

    /// The reasoning's tokens run to the one that completes `</think>`, whether the tag is
    /// one token (Qwen3's vocabulary) or split over several.
    #[test]
    fn reasoning_tokens_run_to_the_token_that_ends_the_tag() {
        let count = |parser: ReasoningParser, pieces: &[&str]| {
            parser.reasoning_tokens(pieces.iter().map(|p| p.as_bytes()))
        };
        let one_token = ["<think>", "add", " them", "</think>", "\n\n", "4"];
        assert_eq!(count(ReasoningParser::Qwen3, &one_token), 4);
        let split_tag = ["add", " them", "</", "th", "ink", ">", "4"];
        assert_eq!(count(ReasoningParser::DeepseekR1, &split_tag), 6);
        let inside_one = ["add", "x</think>4"];
        assert_eq!(count(ReasoningParser::Qwen3, &inside_one), 2);
        let unended = ["still", " thinking"];
        assert_eq!(count(ReasoningParser::Qwen3, &unended), 0);
        assert_eq!(count(ReasoningParser::DeepseekR1, &unended), 2);
        // A long thinking keeps only the tail it needs, and still finds the tag.
        let long: Vec<&str> = std::iter::repeat_n("word ", 500)
            .chain(["</thi", "nk>", "4"])
            .collect();
        assert_eq!(count(ReasoningParser::Qwen3, &long), 502);
    }

    #[test]
    fn parsers_read_by_vllm_s_names_and_sglang_s_and_refuse_others_naming_them() {
        assert_eq!("qwen3".parse(), Ok(ReasoningParser::Qwen3));
        assert_eq!("deepseek_r1".parse(), Ok(ReasoningParser::DeepseekR1));
        assert_eq!("deepseek-r1".parse(), Ok(ReasoningParser::DeepseekR1));
        let refused = "granite".parse::<ReasoningParser>().unwrap_err();
        assert!(refused.contains("\"granite\"") && refused.contains("qwen3, deepseek_r1"));
        let json = serde_json::to_string(&ReasoningParser::DeepseekR1).unwrap();
        assert_eq!(json, "\"deepseek_r1\"");
        let refused = serde_json::from_str::<ReasoningParser>("\"r1\"").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("use one of qwen3, deepseek_r1"),
            "{refused}"
        );
        let wire = postcard::to_stdvec(&Some(ReasoningParser::Qwen3)).unwrap();
        let read: Option<ReasoningParser> = postcard::from_bytes(&wire).unwrap();
        assert_eq!(read, Some(ReasoningParser::Qwen3));
        for parser in ReasoningParser::ALL {
            assert_eq!(parser.to_string().parse(), Ok(parser));
        }
    }
}
