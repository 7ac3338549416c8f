//! A reasoning model's thinking watched as it is generated, so that an output grammar can
//! hold from the thinking's end on (vLLM's structured output under a reasoning parser): the
//! model thinks freely in `<think>...</think>`, and its answer is of the grammar's form. A
//! leaf: text in, answers out.

/// The tag a model opens its thinking with.
pub const THINK_START: &str = "<think>";
/// The tag a model closes its thinking with.
pub const THINK_END: &str = "</think>";

/// Whether a model reading `prompt` (special tokens kept) is thinking when it starts: the
/// prompt's last think tag opens a thinking (DeepSeek-R1's template ends with `<think>`),
/// or it has none (a Qwen3 model opens its own); a prompt whose last tag closes one (Qwen3
/// with `enable_thinking` false renders an empty thinking) leaves the model answering.
pub fn prompt_leaves_thinking(prompt: &str) -> bool {
    match (prompt.rfind(THINK_START), prompt.rfind(THINK_END)) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(start), Some(end)) => start > end,
    }
}

/// Looks for `</think>` in a completion's text, a token's text at a time, keeping only the
/// tail a tag split over tokens needs.
#[derive(Debug, Default)]
pub struct ThinkingWatch {
    tail: String,
}

impl ThinkingWatch {
    /// Takes the next token's text; once it completes `</think>`, the text after the tag
    /// in that token (the answer's start, most often empty).
    pub fn see(&mut self, piece: &str) -> Option<String> {
        self.tail.push_str(piece);
        if let Some(at) = self.tail.find(THINK_END) {
            return Some(self.tail[at + THINK_END.len()..].to_owned());
        }
        let mut keep = self.tail.len().saturating_sub(THINK_END.len() - 1);
        while !self.tail.is_char_boundary(keep) {
            keep -= 1;
        }
        self.tail.drain(..keep);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_s_last_tag_says_whether_the_model_starts_thinking() {
        assert!(prompt_leaves_thinking("<|User|>2+2?<|Assistant|><think>\n"));
        assert!(prompt_leaves_thinking("<|im_start|>assistant\n"));
        assert!(!prompt_leaves_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        // Few-shot examples think and answer; the record's turn opens a thinking.
        assert!(prompt_leaves_thinking(
            "Q: 1?\n<think>a</think>A: 1\nQ: 2?\n<think>"
        ));
        assert!(!prompt_leaves_thinking(
            "Q: 1?\n<think>a</think>A: 1\nQ: 2?\n"
        ));
    }

    /// The tag found in one token, across several, or after a long thinking; what follows
    /// it in the tag's last token is the answer's start.
    #[test]
    fn the_end_tag_is_found_whole_or_split_and_what_follows_it_is_returned() {
        let watch = |pieces: &[&str]| {
            let mut watch = ThinkingWatch::default();
            pieces
                .iter()
                .position(|p| watch.see(p).is_some())
                .map(|at| {
                    let mut again = ThinkingWatch::default();
                    let found = pieces[..=at].iter().filter_map(|p| again.see(p)).next();
                    (at, found.unwrap())
                })
        };
        assert_eq!(watch(&["add", "</think>", "4"]), Some((1, String::new())));
        assert_eq!(
            watch(&["add", "</", "think", ">A", ": 4"]),
            Some((3, "A".into()))
        );
        assert_eq!(watch(&["still", " thinking"]), None);
        let mut long: Vec<&str> = vec!["é word "; 300];
        long.extend(["</thi", "nk>\n\nyes"]);
        assert_eq!(watch(&long), Some((301, "\n\nyes".into())));
    }
}
