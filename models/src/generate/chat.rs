//! A model's chat template (Jinja, as Hugging Face and GGUF files carry it), rendered for one
//! user turn with the generation prompt added, as `apply_chat_template` does.

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
        let template = self.env.get_template("chat").expect("added in new");
        template
            .render(context! {
                messages => vec![context! { role => "user", content => user }],
                add_generation_prompt => true,
                bos_token => &self.bos,
                eos_token => &self.eos,
            })
            .map_err(|e| ModelError::Task(format!("the model's chat template failed: {e}")))
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
    fn a_broken_template_is_a_load_error() {
        let error = ChatTemplate::new("{% for %}", "", "")
            .err()
            .expect("refused");
        assert!(error.to_string().contains("chat template"), "{error}");
    }
}
