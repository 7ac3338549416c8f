//! Whether a stop string may have appeared with a sequence's newest token, from the text of
//! that token and, where needed, of its last few. The engine used to decode a sequence's whole
//! completion after every token to look for its stop strings, quadratic in the completion's
//! length: with a stop string of `\n\n`, 256 sequences of up to 128 tokens spent 1.9 ms of
//! host time a step on it (0.16 ms without a stop string; `generate-bench --stop --profile`,
//! BENCHMARKS.md), growing with the completions' length, beside a GPU decode step of a few
//! milliseconds. Now 0.56 ms, whatever the length. Only where a stop string shows in the window does the
//! engine decode the completion to cut it exactly, as before.
//!
//! Why it is enough: the completion's text grows by the newest token's text each step, and
//! every earlier step already looked, so a stop string that first appears now ends in the
//! newest token's text and lies within the last `longest + newest` bytes of the completion
//! (`longest`: the longest stop string's bytes). So where the newest token's text, decoded
//! alone, holds no stop string's last character, none ends here (unless that text is empty,
//! holds part of a character, or a stop string ends in whitespace, which a decoder may drop
//! from a token's start, as SentencePiece does: those take the window). The window grows
//! until its text, less its first token (which a decoder may render differently at the
//! start of a decode), holds that many bytes, or starts at the completion's start.

/// Whether one of `stops` may have appeared with the newest token of `generated`, whose text
/// decoded alone is `newest_text`: that text holds a stop string's last character and a stop
/// string shows in the text of the last tokens, a window wide enough to hold any stop string
/// that ends in the newest token's text. `decode` gives the text of a run of tokens.
pub(crate) fn stop_may_end_here<E>(
    generated: &[u32],
    stops: &[String],
    newest_text: &str,
    decode: impl Fn(&[u32]) -> Result<String, E>,
) -> Result<bool, E> {
    if generated.is_empty() || none_can_end_in(newest_text, stops) {
        return Ok(false);
    }
    let need = stops.iter().map(String::len).max().unwrap_or(0) + newest_text.len();
    let mut width = 4;
    loop {
        let start = generated.len().saturating_sub(width);
        let window = decode(&generated[start..])?;
        if stops.iter().any(|stop| window.contains(stop.as_str())) {
            return Ok(true);
        }
        if start == 0 || decode(&generated[start + 1..])?.len() >= need {
            return Ok(false);
        }
        width *= 2;
    }
}

/// Whether no stop string can end in a token whose text, decoded alone, is `text`: it is
/// whole characters, none a stop string's last, and no stop string ends in whitespace.
fn none_can_end_in(text: &str, stops: &[String]) -> bool {
    !text.is_empty()
        && !text.contains(char::REPLACEMENT_CHARACTER)
        && stops.iter().all(|stop| {
            stop.chars()
                .last()
                .is_some_and(|last| !last.is_whitespace() && !text.contains(last))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: token `n` is `WORDS[n]`; a decode drops the first token's leading
    /// space, as SentencePiece decoders do, and token 0 decodes to nothing.
    const WORDS: [&str; 8] = ["", " the", " end", ".", "\n", " é", "ab", "\n\n"];

    fn decode(tokens: &[u32]) -> Result<String, ()> {
        let text: String = tokens.iter().map(|&t| WORDS[t as usize]).collect();
        Ok(text.strip_prefix(' ').map(str::to_owned).unwrap_or(text))
    }

    /// The check as the engine makes it: the newest token's text decoded alone.
    fn check(
        generated: &[u32],
        stops: &[String],
        decode: impl Fn(&[u32]) -> Result<String, ()>,
    ) -> bool {
        let newest = generated
            .last()
            .map(|&t| decode(&[t]).unwrap())
            .unwrap_or_default();
        stop_may_end_here(generated, stops, &newest, decode).unwrap()
    }

    /// The rule the window stands in for: the stop shows in the whole text now and did not
    /// one token before.
    fn first_appears(generated: &[u32], stops: &[String]) -> bool {
        let now = decode(generated).unwrap();
        let before = decode(&generated[..generated.len() - 1]).unwrap();
        stops
            .iter()
            .any(|s| now.contains(s.as_str()) && !before.contains(s.as_str()))
    }

    #[test]
    fn every_stop_that_first_appears_with_a_token_is_seen_in_the_window() {
        // Every completion of up to six tokens of the toy vocabulary: tokens of no text,
        // stops across several tokens, one token holding a whole stop, one leading space.
        let stop_sets = [
            vec![" the end.".to_owned()],
            vec!["\n\n".to_owned(), "é".to_owned()],
            vec!["end".to_owned(), "bab".to_owned()],
            vec!["the".to_owned()],
            // Ends in the space a decode drops from the start of " end" alone.
            vec!["the ".to_owned()],
            vec![String::new()],
        ];
        let mut completions = vec![Vec::new()];
        for _ in 0..6 {
            completions = completions
                .into_iter()
                .flat_map(|c: Vec<u32>| {
                    (0..WORDS.len() as u32).map(move |t| [c.clone(), vec![t]].concat())
                })
                .collect();
            for stops in &stop_sets {
                for generated in &completions {
                    let seen = check(generated, stops, decode);
                    if first_appears(generated, stops) {
                        assert!(seen, "{stops:?} in {generated:?}: {:?}", decode(generated));
                    }
                }
            }
        }
    }

    #[test]
    fn the_window_stays_short_however_long_the_completion() {
        let decoded = std::cell::Cell::new(0);
        let counting = |tokens: &[u32]| {
            decoded.set(decoded.get() + tokens.len());
            decode(tokens)
        };
        let generated: Vec<u32> = (0..10_000).map(|i| [1, 2, 3][i % 3]).collect();
        let stops = ["\n\n".to_owned()];
        assert!(!check(&generated, &stops, counting));
        assert!(decoded.get() < 20, "{} tokens decoded", decoded.get());
        // Tokens without text widen the window until it holds text enough.
        let mut quiet = vec![4u32];
        quiet.extend(std::iter::repeat_n(0, 100));
        quiet.push(4);
        let stops = ["\n\n".to_owned()];
        assert!(check(&quiet, &stops, decode));
        assert!(!check(&[], &stops, decode));
    }
}
