//! How a text longer than the model's window is scored: in windows, each scoring the text's
//! tokens after the previous window's, with the tokens just before them as context
//! (lm-evaluation-harness's `loglikelihood_rolling`; with a shorter stride, Hugging Face's
//! strided perplexity). Every token is scored once, in order, so a text's score is the sum
//! of its windows'. Pure: token counts in, ranges out. A leaf of `generate`.

use std::ops::Range;

/// How far a scored text may run past one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSettings {
    /// Text tokens each window after the first scores; the rest of the window is context.
    /// `None`: all but one (each token computed once, lm-evaluation-harness's rolling
    /// windows). A shorter stride gives each token more context at more compute.
    pub stride: Option<usize>,
    /// At most this many windows a text (`None`: as many as it takes); the text's tokens
    /// after them go unscored and the text counts as truncated. 1 scores the head alone.
    pub max_windows: Option<usize>,
    /// A text with nothing before it (no BOS, no prompt text) gets the model's start token
    /// first, so that its first token is scored too, as lm-evaluation-harness's
    /// `loglikelihood_rolling` scores a document; otherwise that token is only context, as
    /// llama.cpp's perplexity reads it. Not a matter of windows: it reaches
    /// [`super::prompt::PromptFormat::scored_text`] with them.
    pub score_first_token: bool,
}

/// One window of a text: a span of its tokens, the last of which it scores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextWindow {
    /// The text's tokens the window holds (after the prompt's start), context and scored.
    pub text: Range<usize>,
    /// Those it scores, at the window's end: each text token is scored in exactly one window.
    pub scored: Range<usize>,
}

/// A text's windows, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// At least one: the first holds the text's head after the prompt's text before it.
    pub windows: Vec<TextWindow>,
    /// The text after it (`after`) follows the last window; else it was dropped to fit.
    pub after: bool,
    /// Some of the text went unscored (`max_windows`), or `after` was dropped.
    pub truncated: bool,
}

/// The windows of a `text`-token text followed by `after` tokens, where the first window
/// has room for `first_room` text tokens (the window less the prompt before the text) and
/// each later one for `later_room` (less BOS). The last window takes `after` when it fits,
/// giving up context (never a scored token) for it.
pub fn plan_windows(
    text: usize,
    after: usize,
    first_room: usize,
    later_room: usize,
    settings: WindowSettings,
) -> Result<WindowPlan, String> {
    let widest = later_room.saturating_sub(1);
    let stride = settings.stride.unwrap_or(widest);
    let most = settings.max_windows.unwrap_or(usize::MAX).max(1);
    if text > first_room && most > 1 {
        if widest == 0 {
            return Err(format!(
                "the text is longer than the model's window, and a window after the first \
                 has room for {later_room} of its tokens, too few to go on scoring with \
                 context; generate fewer tokens after it or score its head alone \
                 (max_score_windows 1)"
            ));
        }
        if !(1..=widest).contains(&stride) {
            return Err(format!(
                "a score stride of {stride} tokens does not fit the model's window: each \
                 window after the first holds {later_room} of the text's tokens, one of them \
                 context, so the stride must be 1 to {widest} (or left unset for {widest})"
            ));
        }
    }
    let head = text.min(first_room);
    let mut windows = vec![TextWindow {
        text: 0..head,
        scored: 0..head,
    }];
    let mut end = head;
    while end < text && windows.len() < most {
        let next = (end + stride).min(text);
        windows.push(TextWindow {
            text: next.saturating_sub(later_room)..next,
            scored: end..next,
        });
        end = next;
    }
    let cut = end < text;
    let fits_after = !cut && make_room_for_after(&mut windows, after, first_room, later_room);
    Ok(WindowPlan {
        windows,
        after: fits_after,
        truncated: cut || !fits_after,
    })
}

/// Whether `after` tokens fit behind the last window, moving its start past context tokens
/// it can spare (a later window keeps one before its first scored token).
fn make_room_for_after(
    windows: &mut [TextWindow],
    after: usize,
    first_room: usize,
    later_room: usize,
) -> bool {
    let first = windows.len() == 1;
    let last = windows.last_mut().expect("a plan has a window");
    let room = if first { first_room } else { later_room };
    let over = (last.text.len() + after).saturating_sub(room);
    let spare = match first {
        true => 0,
        false => (last.scored.start - last.text.start).saturating_sub(1),
    };
    if over > spare {
        return false;
    }
    last.text.start += over;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(text: Range<usize>, scored: Range<usize>) -> TextWindow {
        TextWindow { text, scored }
    }

    const UNSET: WindowSettings = WindowSettings {
        stride: None,
        max_windows: None,
        score_first_token: false,
    };

    /// The checks every plan passes: each text token scored once, in order, up to where the
    /// plan stops; each scored token inside its window with a token before it (but for the
    /// first window's); no window over its room.
    fn check(plan: &WindowPlan, text: usize, first_room: usize, later_room: usize) {
        let mut next = 0;
        for (i, w) in plan.windows.iter().enumerate() {
            assert_eq!(
                w.scored.start, next,
                "window {i} starts where the last ended"
            );
            assert!(w.text.start <= w.scored.start && w.scored.end == w.text.end);
            assert!(w.text.len() <= if i == 0 { first_room } else { later_room });
            if i > 0 {
                assert!(w.text.start < w.scored.start, "window {i} has context");
                assert!(!w.scored.is_empty());
            }
            next = w.scored.end;
        }
        assert_eq!(plan.truncated, next < text || !plan.after);
        assert!(next == text || !plan.after, "nothing follows a cut text");
    }

    #[test]
    fn a_text_that_fits_is_one_window_with_what_follows_it() {
        let plan = plan_windows(10, 3, 20, 20, UNSET).unwrap();
        assert_eq!(plan.windows, [window(0..10, 0..10)]);
        assert!(plan.after && !plan.truncated);
        check(&plan, 10, 20, 20);
    }

    /// The default stride scores all but one of each later window's tokens: each token is
    /// computed once (but for the one token of context each window repeats).
    #[test]
    fn a_long_text_rolls_on_in_windows_with_one_token_of_context() {
        let plan = plan_windows(25, 0, 8, 10, UNSET).unwrap();
        assert_eq!(
            plan.windows,
            [
                window(0..8, 0..8),
                window(7..17, 8..17),
                window(15..25, 17..25),
            ]
        );
        assert!(plan.after && !plan.truncated);
        check(&plan, 25, 8, 10);
    }

    /// A shorter stride gives each later window's scored tokens the window's other tokens
    /// as context.
    #[test]
    fn a_stride_scores_that_many_tokens_a_window_after_the_rest_as_context() {
        let plan = plan_windows(
            14,
            0,
            8,
            10,
            WindowSettings {
                stride: Some(4),
                max_windows: None,
                score_first_token: false,
            },
        )
        .unwrap();
        assert_eq!(
            plan.windows,
            [
                window(0..8, 0..8),
                window(2..12, 8..12),
                window(4..14, 12..14),
            ]
        );
        check(&plan, 14, 8, 10);
        // Where the first window was short of room, a later one starts at the text's start.
        let plan = plan_windows(
            12,
            0,
            3,
            10,
            WindowSettings {
                stride: Some(4),
                max_windows: None,
                score_first_token: false,
            },
        )
        .unwrap();
        assert_eq!(plan.windows[1], window(0..7, 3..7));
        check(&plan, 12, 3, 10);
    }

    #[test]
    fn at_most_max_windows_are_scored_and_the_text_counts_as_truncated() {
        let head_only = WindowSettings {
            stride: None,
            max_windows: Some(1),
            score_first_token: false,
        };
        let plan = plan_windows(25, 2, 8, 10, head_only).unwrap();
        assert_eq!(plan.windows, [window(0..8, 0..8)]);
        assert!(plan.truncated && !plan.after);
        let two = WindowSettings {
            max_windows: Some(2),
            ..head_only
        };
        let plan = plan_windows(25, 0, 8, 10, two).unwrap();
        assert_eq!(plan.windows.len(), 2);
        assert!(plan.truncated);
        check(&plan, 25, 8, 10);
    }

    /// What follows the text (an instruction to generate after it) takes the last window's
    /// spare context; where it cannot, it is dropped and the text counts as truncated.
    #[test]
    fn what_follows_takes_the_last_windows_spare_context_or_is_dropped() {
        // The last window holds 8 scored tokens after 2 of context: one to spare.
        let plan = plan_windows(25, 1, 8, 10, UNSET).unwrap();
        assert_eq!(plan.windows[2], window(16..25, 17..25));
        assert!(plan.after && !plan.truncated);
        check(&plan, 25, 8, 10);
        // The last window scores 9 tokens after 1 of context: nothing to spare.
        let plan = plan_windows(26, 1, 8, 10, UNSET).unwrap();
        assert_eq!(plan.windows[2], window(16..26, 17..26));
        assert!(!plan.after && plan.truncated);
        check(&plan, 26, 8, 10);
        // A first window never gives up the prompt before the text.
        let plan = plan_windows(7, 2, 8, 10, UNSET).unwrap();
        assert!(!plan.after && plan.truncated);
        assert_eq!(plan.windows, [window(0..7, 0..7)]);
    }

    #[test]
    fn a_stride_the_window_cannot_hold_is_refused_with_the_range_that_fits() {
        let wide = WindowSettings {
            stride: Some(10),
            max_windows: None,
            score_first_token: false,
        };
        let error = plan_windows(25, 0, 8, 10, wide).unwrap_err();
        assert!(error.contains("must be 1 to 9"), "{error}");
        // A text that fits needs no stride.
        assert!(plan_windows(8, 0, 8, 10, wide).is_ok());
        let zero = WindowSettings {
            stride: Some(0),
            ..wide
        };
        assert!(plan_windows(25, 0, 8, 10, zero).is_err());
        // A window with no room for context after the first cannot roll on; the head alone
        // needs no later window.
        let error = plan_windows(25, 0, 8, 1, UNSET).unwrap_err();
        assert!(error.contains("max_score_windows 1"), "{error}");
        let head_only = WindowSettings {
            stride: None,
            max_windows: Some(1),
            score_first_token: false,
        };
        assert!(plan_windows(25, 0, 8, 1, head_only).unwrap().truncated);
    }

    #[test]
    fn an_empty_text_is_one_empty_window() {
        let plan = plan_windows(0, 2, 8, 10, UNSET).unwrap();
        assert_eq!(plan.windows, [window(0..0, 0..0)]);
        assert!(plan.after && !plan.truncated);
    }
}
