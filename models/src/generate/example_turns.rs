//! Few-shot examples written as chat turns (`--fewshot-as-multiturn`): a conversation whose
//! first exchanges after its system message are examples, each a user turn and the
//! assistant's answer, before the record's own question. When the prompt is too long for the
//! context the oldest examples are left out whole, before any text is cut: an example cut in
//! half teaches nothing, and the record's question and the template's structure stay
//! (lm-evaluation-harness cuts the rendered prompt's first tokens instead, its chat header
//! with them). Pure: what the prompt's tokens come to is [`super::prompt::PromptFormat`]'s.

use super::chat::Message;

/// Where a conversation's example exchanges lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExampleTurns {
    /// The messages before the first example (its system messages).
    start: usize,
    /// The example exchanges, two messages each.
    count: usize,
}

impl ExampleTurns {
    /// The examples of `messages` whose first `asked` exchanges after its system messages
    /// are said to be examples: as many of those as are a user turn then an assistant's,
    /// with a message after them (the record's own, never left out).
    pub fn of(messages: &[Message], asked: usize) -> Self {
        let start = messages.iter().take_while(|m| m.role == "system").count();
        let exchanges = messages[start..].chunks_exact(2);
        let count = exchanges
            .take(asked)
            .take_while(|pair| pair[0].role == "user" && pair[1].role == "assistant")
            .count()
            .min(messages.len().saturating_sub(start + 1) / 2);
        Self { start, count }
    }

    /// How many examples there are.
    pub fn count(&self) -> usize {
        self.count
    }

    /// `messages` without their `dropped` oldest examples (all of them at most).
    pub fn without_oldest(&self, messages: &[Message], dropped: usize) -> Vec<Message> {
        let dropped = dropped.min(self.count);
        let (system, rest) = messages.split_at(self.start);
        system.iter().chain(&rest[2 * dropped..]).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(roles: &[&str]) -> Vec<Message> {
        (roles.iter().enumerate())
            .map(|(i, role)| Message::new(role, &format!("{role} {i}")))
            .collect()
    }

    fn contents(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|m| m.content.as_str()).collect()
    }

    #[test]
    fn the_oldest_examples_go_first_and_the_system_and_question_stay() {
        let messages = conversation(&["system", "user", "assistant", "user", "assistant", "user"]);
        let examples = ExampleTurns::of(&messages, 2);
        assert_eq!(examples.count(), 2);
        assert_eq!(
            contents(&examples.without_oldest(&messages, 1)),
            ["system 0", "user 3", "assistant 4", "user 5"]
        );
        assert_eq!(
            contents(&examples.without_oldest(&messages, 5)),
            ["system 0", "user 5"]
        );
        assert_eq!(examples.without_oldest(&messages, 0), messages);
        let no_system = conversation(&["user", "assistant", "user"]);
        let examples = ExampleTurns::of(&no_system, 1);
        assert_eq!(
            contents(&examples.without_oldest(&no_system, 1)),
            ["user 2"]
        );
    }

    #[test]
    fn only_real_exchanges_before_a_last_message_count_as_examples() {
        let messages = conversation(&["user", "assistant", "user", "assistant"]);
        assert_eq!(ExampleTurns::of(&messages, 2).count(), 1, "the last stays");
        let odd = conversation(&["user", "user", "assistant", "user"]);
        assert_eq!(ExampleTurns::of(&odd, 1).count(), 0);
        let messages = conversation(&["user", "assistant", "user"]);
        assert_eq!(ExampleTurns::of(&messages, 0).count(), 0);
        assert_eq!(ExampleTurns::of(&messages, 9).count(), 1);
        assert_eq!(ExampleTurns::of(&[], 3).count(), 0);
    }
}
