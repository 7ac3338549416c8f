//! Long texts cut into windows (`resident embed --split`): where each window starts and
//! ends, from a text's tokens or its sentences. Pure: the tokeniser's answers come in as
//! [`TextTokens`], and windows go out as character ranges of the text.

use unicode_segmentation::UnicodeSegmentation;

/// How a text is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowSplit {
    /// Windows of `size` tokens, consecutive ones sharing `overlap`, their edges moved to
    /// word boundaries where a word is shorter than a window.
    Tokens {
        /// Tokens a window holds.
        size: usize,
        /// Tokens consecutive windows share.
        overlap: usize,
    },
    /// Whole sentences (Unicode UAX #29) packed into windows of at most `size` tokens; a
    /// sentence longer than that is cut as [`WindowSplit::Tokens`] cuts, without overlap.
    Sentences {
        /// Tokens a window holds at most.
        size: usize,
    },
}

impl WindowSplit {
    /// Tokens of text one window holds.
    pub fn size(self) -> usize {
        match self {
            WindowSplit::Tokens { size, .. } | WindowSplit::Sentences { size } => size,
        }
    }
}

/// A text's tokens, special tokens left out: each one's characters `[start, end)` in the
/// text (Unicode code points), and the word it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextTokens {
    /// Each token's characters `[start, end)`.
    pub offsets: Vec<(usize, usize)>,
    /// Each token's word, `None` for one outside any.
    pub words: Vec<Option<u32>>,
}

/// Characters `[start, end)` of a text, in Unicode code points.
pub type CharRange = (usize, usize);

/// Token windows `[start, end)` over tokens whose words are `words`: each at most `size`
/// long (`size` >= 1), each starting `overlap` tokens before the last one ended. A window
/// that would end inside a word ends before it, and one that would start inside a word
/// starts at its start (so the overlap is at least `overlap`), unless the word alone fills
/// the window. Every token is in a window.
pub fn token_windows(words: &[Option<u32>], size: usize, overlap: usize) -> Vec<(usize, usize)> {
    let count = words.len();
    let size = size.max(1);
    let overlap = overlap.min(size - 1);
    // Token `i` continues the word of token `i - 1`: a cut before it splits a word.
    let inside_word =
        |i: usize| i > 0 && i < count && words[i].is_some() && words[i] == words[i - 1];
    let mut windows = Vec::new();
    let mut start = 0;
    loop {
        let mut end = (start + size).min(count);
        let mut snapped = end;
        while snapped > start && inside_word(snapped) {
            snapped -= 1;
        }
        if snapped > start {
            end = snapped;
        }
        windows.push((start, end));
        if end >= count {
            return windows;
        }
        // Back to the start of the word the overlap begins in, so consecutive windows share
        // at least `overlap` tokens; forward past it instead when going back would not move
        // on from this window's start.
        let first = end.saturating_sub(overlap).max(start + 1);
        let mut next = first;
        while next > start + 1 && inside_word(next) {
            next -= 1;
        }
        if inside_word(next) {
            next = first;
            while next < end && inside_word(next) {
                next += 1;
            }
        }
        start = next;
    }
}

/// The windows of a text of `text_chars` characters whose tokens are `tokens`: the whole
/// text when its tokens fit one window of `size`; otherwise token windows, each from its
/// first token's first character to its last token's last.
pub fn windows_of_tokens(
    tokens: &TextTokens,
    text_chars: usize,
    size: usize,
    overlap: usize,
) -> Vec<CharRange> {
    if tokens.offsets.len() <= size {
        return vec![(0, text_chars)];
    }
    token_windows(&tokens.words, size, overlap)
        .into_iter()
        .map(|(start, end)| (tokens.offsets[start].0, tokens.offsets[end - 1].1))
        .collect()
}

/// The windows of `text` by sentences: consecutive sentences packed while their tokens
/// (`tokens_of` each, counted apart) fit `size`, each window trimmed of surrounding white
/// space; a sentence over `size` cut into token windows. The whole text when it fits one
/// window, or when it has no sentence with a token.
pub fn windows_of_sentences<E>(
    text: &str,
    size: usize,
    mut tokens_of: impl FnMut(&str) -> Result<TextTokens, E>,
) -> Result<Vec<CharRange>, E> {
    let mut windows = Vec::new();
    // The pack being filled: its first and last characters, and its tokens.
    let mut pack: Option<(usize, usize, usize)> = None;
    let mut chars_before = 0;
    let mut total_tokens = 0;
    for sentence in text.split_sentence_bounds() {
        let first_char = chars_before;
        let sentence_chars = sentence.chars().count();
        chars_before += sentence_chars;
        let tokens = tokens_of(sentence)?;
        let count = tokens.offsets.len();
        total_tokens += count;
        if count == 0 {
            continue;
        }
        let (start, end) = (
            first_char + tokens.offsets[0].0,
            first_char + tokens.offsets[count - 1].1,
        );
        if count > size {
            windows.extend(pack.take().map(|(s, e, _)| (s, e)));
            windows.extend(
                windows_of_tokens(&tokens, sentence_chars, size, 0)
                    .into_iter()
                    .map(|(s, e)| (first_char + s, first_char + e)),
            );
            continue;
        }
        pack = match pack {
            Some((s, _, held)) if held + count <= size => Some((s, end, held + count)),
            other => {
                windows.extend(other.map(|(s, e, _)| (s, e)));
                Some((start, end, count))
            }
        };
    }
    windows.extend(pack.map(|(s, e, _)| (s, e)));
    if windows.len() <= 1 || total_tokens <= size {
        return Ok(vec![(0, chars_before)]);
    }
    Ok(windows)
}

/// Where each character of a text starts, in bytes: to slice it by character ranges.
pub struct CharBytes(Vec<usize>);

impl CharBytes {
    /// The character starts of `text`.
    pub fn new(text: &str) -> Self {
        let mut starts: Vec<usize> = text.char_indices().map(|(byte, _)| byte).collect();
        starts.push(text.len());
        Self(starts)
    }

    /// Characters in the text.
    pub fn chars(&self) -> usize {
        self.0.len() - 1
    }

    /// The text's characters `range` (code points); ranges past its end are cut at it.
    pub fn slice<'a>(&self, text: &'a str, (start, end): CharRange) -> &'a str {
        let last = self.chars();
        &text[self.0[start.min(last)]..self.0[end.min(last)]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens of `text` split at spaces, one word each, except words joined by `+` which
    /// become one word of several tokens (as "##" pieces would).
    fn tokens(text: &str) -> TextTokens {
        let mut out = TextTokens::default();
        let mut position = 0;
        for (word, piece) in (0u32..).zip(text.split(' ')) {
            let mut inner = position;
            for part in piece.split('+') {
                let length = part.chars().count();
                if length > 0 {
                    out.offsets.push((inner, inner + length));
                    out.words.push(Some(word));
                }
                inner += length + 1;
            }
            position += piece.chars().count() + 1;
        }
        out
    }

    #[test]
    fn windows_cover_every_token_with_the_overlap_asked() {
        let words: Vec<Option<u32>> = (0..10).map(Some).collect();
        assert_eq!(token_windows(&words, 4, 1), vec![(0, 4), (3, 7), (6, 10)]);
        assert_eq!(token_windows(&words, 4, 0), vec![(0, 4), (4, 8), (8, 10)]);
        assert_eq!(token_windows(&words, 20, 5), vec![(0, 10)]);
        // An overlap as large as the window still moves on by one token.
        assert_eq!(token_windows(&words[..3], 2, 5), vec![(0, 2), (1, 3)]);
    }

    #[test]
    fn window_edges_move_to_word_boundaries_unless_a_word_fills_the_window() {
        // Words: [0,1] [2,3,4] [5] [6,7]
        let words = [0, 0, 1, 1, 1, 2, 3, 3].map(Some);
        // The first window would end inside word 1 (after token 3): it ends after word 0.
        // The next would start at token 2 - 1 = 1, inside word 0: it starts at word 1.
        assert_eq!(token_windows(&words, 4, 1), vec![(0, 2), (2, 6), (5, 8)]);
        // A word of three tokens with windows of two: cut inside it, rather than never.
        let long = [0, 0, 0].map(Some);
        assert_eq!(token_windows(&long, 2, 0), vec![(0, 2), (2, 3)]);
    }

    #[test]
    fn token_windows_become_character_ranges_and_short_texts_stay_whole() {
        let text = "alpha beta gam+ma delta eps";
        let tokens = tokens(text);
        assert_eq!(tokens.offsets.len(), 6);
        let windows = windows_of_tokens(&tokens, text.chars().count(), 3, 1);
        let texts: Vec<&str> = windows.iter().map(|&w| char_slice(text, w)).collect();
        assert_eq!(
            texts,
            vec!["alpha beta", "beta gam+ma", "gam+ma delta", "delta eps"]
        );
        assert_eq!(
            windows_of_tokens(&tokens, text.chars().count(), 6, 2),
            vec![(0, 27)]
        );
    }

    #[test]
    fn sentences_are_packed_whole_and_a_long_one_is_cut() {
        let text = "One two. Three four five. Six.  Seven eight nine ten eleven twelve. End.";
        let windows = windows_of_sentences(text, 4, |s| Ok::<_, ()>(tokens(s.trim_end()))).unwrap();
        let texts: Vec<&str> = windows.iter().map(|&w| char_slice(text, w)).collect();
        assert_eq!(
            texts,
            vec![
                "One two.",
                "Three four five. Six.",
                "Seven eight nine ten",
                "eleven twelve.",
                "End."
            ]
        );
        // A text that fits is one window of all of it.
        let whole = windows_of_sentences(text, 100, |s| Ok::<_, ()>(tokens(s))).unwrap();
        assert_eq!(whole, vec![(0, text.chars().count())]);
        // So is one without tokens.
        let blank = windows_of_sentences("   ", 4, |s| Ok::<_, ()>(tokens(s.trim()))).unwrap();
        assert_eq!(blank, vec![(0, 3)]);
    }

    fn char_slice(text: &str, range: CharRange) -> &str {
        CharBytes::new(text).slice(text, range)
    }

    #[test]
    fn character_slices_count_code_points_not_bytes() {
        let text = "né à Zürich — oui";
        assert_eq!(CharBytes::new(text).chars(), 17);
        assert_eq!(char_slice(text, (3, 4)), "à");
        assert_eq!(char_slice(text, (5, 11)), "Zürich");
        assert_eq!(char_slice(text, (14, 17)), "oui");
    }
}
