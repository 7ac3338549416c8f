//! Few-shot examples written as text before the record's prompt (`--fewshot` without
//! `--fewshot-as-multiturn`): where each lies in the text before the record's, so that a
//! prompt too long for the context loses its oldest examples whole before the record's
//! text is cut, as [`super::example_turns`] does for examples written as turns. Pure.

use std::borrow::Cow;

/// Where a text prompt's examples lie in the text before the record's: each one's start,
/// then the last one's end (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExampleText<'a> {
    bounds: &'a [u32],
}

impl<'a> ExampleText<'a> {
    /// The examples `bounds` marks in `before`: none where the bounds do not mark slices of
    /// it (out of order, past its end, or inside a character), whoever sent them.
    pub fn of(before: &str, bounds: &'a [u32]) -> Self {
        let marks_slices = bounds.windows(2).all(|pair| pair[0] <= pair[1])
            && (bounds.iter()).all(|&bound| before.is_char_boundary(bound as usize));
        Self {
            bounds: if marks_slices { bounds } else { &[] },
        }
    }

    /// How many examples there are.
    pub fn count(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// `before` without its `dropped` oldest examples (all of them at most).
    pub fn without_oldest<'b>(&self, before: &'b str, dropped: usize) -> Cow<'b, str> {
        if dropped == 0 || self.count() == 0 {
            return Cow::Borrowed(before);
        }
        let first = self.bounds[0] as usize;
        let kept_from = self.bounds[dropped.min(self.count())] as usize;
        Cow::Owned(format!("{}{}", &before[..first], &before[kept_from..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_examples_go_first_and_what_surrounds_them_stays() {
        let before = "Maths.\n\nQ: 1+1\nA: 2\n\nQ: 2+2\nA: 4\n\nQ: ";
        let bounds = [8, 21, 34];
        let examples = ExampleText::of(before, &bounds);
        assert_eq!(examples.count(), 2);
        assert_eq!(examples.without_oldest(before, 0), before);
        assert_eq!(
            examples.without_oldest(before, 1),
            "Maths.\n\nQ: 2+2\nA: 4\n\nQ: "
        );
        assert_eq!(examples.without_oldest(before, 2), "Maths.\n\nQ: ");
        assert_eq!(examples.without_oldest(before, 9), "Maths.\n\nQ: ");
    }

    /// Bounds that mark no slices of the text (a buggy or hostile sender's) mark no
    /// examples: nothing is left out, and nothing panics.
    #[test]
    fn bounds_that_mark_no_slices_mark_no_examples() {
        let before = "é, then text";
        for bounds in [&[5, 3][..], &[0, 99], &[1, 4], &[4]] {
            let examples = ExampleText::of(before, bounds);
            assert_eq!(examples.count(), 0, "{bounds:?}");
            assert_eq!(examples.without_oldest(before, 1), before);
        }
        assert_eq!(ExampleText::of(before, &[0, 2, 2]).count(), 2);
    }
}
