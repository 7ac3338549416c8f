//! A model's chat template (Jinja, as Hugging Face and GGUF files carry it), rendered as
//! transformers' `apply_chat_template` renders it: a conversation with the generation prompt
//! added, or, when the conversation ends with an assistant turn, that turn left open for the
//! model to continue (`continue_final_message`).

use minijinja::{Environment, context};

use crate::ModelError;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the model's special tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        // As transformers compiles chat templates.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |message: String| -> Result<(), _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ModelError::Load(format!("the model's chat template: {e}")))?;
        Ok(Self {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
        })
    }

    /// `user` as the conversation's single user turn, followed by the assistant's prompt.
    pub fn render_user_turn(&self, user: &str) -> Result<String, ModelError> {
        self.render(&[Message::new("user", user)])
    }

    /// The conversation, then the assistant's prompt; or, when its last message is the
    /// assistant's, the text up to the end of that message's content (the model continues
    /// it). A system message the template leaves out, or one it refuses, is an error that
    /// says so.
    pub fn render(&self, messages: &[Message]) -> Result<String, ModelError> {
        let template = self.env.get_template("chat").expect("added in new");
        let prefill = messages.last().filter(|m| m.role == "assistant");
        let listed: Vec<_> = messages
            .iter()
            .map(|m| context! { role => &m.role, content => &m.content })
            .collect();
        let system = messages.iter().find(|m| m.role == "system");
        let rendered = template
            .render(context! {
                messages => listed,
                add_generation_prompt => prefill.is_none(),
                bos_token => &self.bos,
                eos_token => &self.eos,
            })
            .map_err(|e| match system {
                Some(_) => ModelError::Task(format!(
                    "the model's chat template refused the conversation ({e}); if it takes \
                     no system message, put the instruction in the user turn (--prompt) \
                     instead of --system"
                )),
                None => ModelError::Task(format!("the model's chat template failed: {e}")),
            })?;
        if let Some(system) = system.filter(|m| !m.content.trim().is_empty())
            && !rendered.contains(system.content.trim())
        {
            return Err(ModelError::Task(
                "the model's chat template leaves the system message out; put the \
                 instruction in the user turn (--prompt) instead of --system"
                    .into(),
            ));
        }
        match prefill {
            None => Ok(rendered),
            Some(last) => {
                // As transformers does: cut after the final message's content.
                let content = last.content.trim();
                match rendered.rfind(content) {
                    Some(at) if !content.is_empty() => {
                        Ok(rendered[..at + content.len()].to_owned())
                    }
                    _ => Err(ModelError::Task(
                        "the model's chat template did not keep the final assistant message's \
                         text, so it cannot be continued; end the conversation with a user \
                         message"
                            .into(),
                    )),
                }
            }
        }
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl Message {
    /// A turn of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn a_user_turn_is_wrapped_with_the_default_system_turn_and_the_generation_prompt() {
        let template = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            template.render_user_turn("Summarise: hi").unwrap(),
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nSummarise: hi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_system_message_replaces_the_default_and_an_assistant_turn_is_left_open() {
        let template = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let conversation = [
            Message::new("system", "Be terse."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello"),
            Message::new("user", "Again"),
        ];
        assert_eq!(
            template.render(&conversation).unwrap(),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let prefill = [
            Message::new("user", "Hi"),
            Message::new("assistant", "{\"a\": "),
        ];
        assert_eq!(
            template.render(&prefill).unwrap(),
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n{\"a\":"
        );
    }

    #[test]
    fn a_template_without_a_system_role_is_named_in_the_error() {
        // Refuses a system turn, as Mistral's and Gemma 1's templates do.
        let strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}[{{ m['content'] }}]{% endfor %}";
        let template = ChatTemplate::new(strict, "", "").unwrap();
        let with_system = [
            Message::new("system", "Be terse."),
            Message::new("user", "Hi"),
        ];
        let error = template.render(&with_system).unwrap_err().to_string();
        assert!(
            error.contains("System role not supported") && error.contains("--system"),
            "{error}"
        );
        // Drops it silently.
        let dropping = "{% for m in messages %}{% if m['role'] != 'system' %}[{{ m['content'] }}]{% endif %}{% endfor %}";
        let template = ChatTemplate::new(dropping, "", "").unwrap();
        let error = template.render(&with_system).unwrap_err().to_string();
        assert!(error.contains("leaves the system message out"), "{error}");
        assert_eq!(template.render(&with_system[1..]).unwrap(), "[Hi]");
    }

    #[test]
    fn a_broken_template_is_a_load_error() {
        let error = ChatTemplate::new("{% for %}", "", "")
            .err()
            .expect("refused");
        assert!(error.to_string().contains("chat template"), "{error}");
    }
}
