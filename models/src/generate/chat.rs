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
    /// Variables every rendering sees besides the conversation (transformers'
    /// `apply_chat_template(**kwargs)`, vLLM's `chat_template_kwargs`): a map.
    kwargs: minijinja::Value,
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the model's special tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        // As transformers compiles chat templates: Jinja2's block trimming, Python's
        // string and dict methods (`content.startswith(...)`, `.split('</think>')`,
        // `.items()`), and its two functions.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<(), _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ModelError::Load(format!("the model's chat template: {e}")))?;
        Ok(Self {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
            kwargs: minijinja::Value::from_serialize(serde_json::Map::new()),
        })
    }

    /// Renders every conversation with `kwargs` as variables besides the renderer's own
    /// (`{"enable_thinking": false}` turns a Qwen3 template's thinking off). The
    /// renderer's own (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`) win
    /// over a kwarg of the same name; front ends refuse one
    /// (`resident_actor::generate::chat_template_kwargs_problem`).
    pub fn set_kwargs(&mut self, kwargs: &serde_json::Map<String, serde_json::Value>) {
        self.kwargs = minijinja::Value::from_serialize(kwargs);
    }

    /// Why `source` does not compile as a chat template (its syntax error, without naming
    /// whose template it is), or nothing: what a front end checks of a template given
    /// before a job asks for actors.
    pub fn check(source: &str) -> Result<(), String> {
        match Self::new(source, "", "") {
            Ok(_) => Ok(()),
            Err(ModelError::Load(why)) => Err(why.replace("the model's chat template: ", "")),
            Err(other) => Err(other.to_string()),
        }
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
        let prefill = messages.last().filter(|m| m.role == "assistant");
        let rendered = self.render_with(messages, prefill.is_none())?;
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

    /// A conversation that ends with the assistant's reply, split where the reply starts:
    /// the conversation before it with the generation prompt (what the model reads before
    /// it writes the reply), and the reply as the template writes it, its end-of-turn
    /// marker included and the separator after that left out. What `--score` scores of a
    /// conversation (TRL's DPO reference log-probabilities split a conversation so).
    pub fn render_reply(&self, messages: &[Message]) -> Result<(String, String), ModelError> {
        let refused = |why: String| {
            ModelError::Task(format!(
                "a conversation is scored on its last message, the assistant's reply to the \
                 turns before it; {why} (end it with the reply to score, a \
                 {{\"role\": \"assistant\"}} message after a user turn)"
            ))
        };
        let (last, before) = messages
            .split_last()
            .ok_or_else(|| refused("this one has no message".into()))?;
        if last.role != "assistant" {
            return Err(refused(format!(
                "this one ends with a {} message",
                last.role
            )));
        }
        if before.last().is_none_or(|m| m.role != "user") {
            return Err(refused("its reply follows no user turn".into()));
        }
        let asked = self.render_with(before, true)?;
        let whole = self.render_with(messages, false)?;
        match whole.strip_prefix(asked.as_str()) {
            Some(reply) if reply.contains(last.content.trim()) => {
                Ok((asked, reply.trim_end().to_owned()))
            }
            _ => Err(ModelError::Task(
                "the model's chat template writes the conversation before the reply \
                 differently once the reply follows (as templates that drop earlier turns' \
                 reasoning do), so the reply cannot be scored apart from it"
                    .into(),
            )),
        }
    }

    /// The conversation as the template renders it, with or without the generation prompt.
    fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let template = self.env.get_template("chat").expect("added in new");
        let listed: Vec<_> = messages
            .iter()
            .map(|m| context! { role => &m.role, content => &m.content })
            .collect();
        let system = messages.iter().find(|m| m.role == "system");
        let rendered = template
            .render(context! {
                messages => listed,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos,
                eos_token => &self.eos,
                ..self.kwargs.clone()
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
        Ok(rendered)
    }
}

/// transformers' `strftime_now(format)`: the local time now in Python's `strftime` format
/// (`"%d %b %Y"`: `07 Dec 2026`); a format chrono cannot read is an error, not a panic.
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write;
    let mut now = String::new();
    write!(now, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now: {format:?} is not a date format"),
        )
    })?;
    Ok(now)
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
    fn a_reply_is_split_from_the_conversation_before_it_with_its_end_of_turn() {
        let template = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let conversation = [
            Message::new("user", "Capital of France?"),
            Message::new("assistant", "Paris."),
        ];
        let (asked, reply) = template.render_reply(&conversation).unwrap();
        assert_eq!(asked, template.render(&conversation[..1]).unwrap());
        assert!(asked.ends_with("<|im_start|>assistant\n"), "{asked}");
        assert_eq!(reply, "Paris.<|im_end|>");
        let refusal =
            |messages: &[Message]| template.render_reply(messages).unwrap_err().to_string();
        let open = refusal(&conversation[..1]);
        assert!(open.contains("ends with a user message"), "{open}");
        assert!(refusal(&[]).contains("has no message"));
        let alone = refusal(&conversation[1..]);
        assert!(alone.contains("follows no user turn"), "{alone}");
        // A template that writes earlier turns otherwise once a reply follows them.
        let shifting = "{% for m in messages %}{{ m['content'] }}{% if not loop.last %}|{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}";
        let template = ChatTemplate::new(shifting, "", "").unwrap();
        let error = template
            .render_reply(&conversation)
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot be scored apart"), "{error}");
    }

    /// A template given by a user is checked before a job: a syntax error is named, not
    /// as the model's.
    #[test]
    fn a_given_template_is_checked_for_its_syntax() {
        assert_eq!(ChatTemplate::check(CHATML), Ok(()));
        let error = ChatTemplate::check("{% for m in messages %}").unwrap_err();
        assert!(
            error.starts_with("syntax error") && !error.contains("model's"),
            "{error}"
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

    /// A template in the manner of the reasoning models' (Qwen3's, DeepSeek-R1's
    /// distills'): Python string methods, a namespace, a reversed list, `continue`, and
    /// `enable_thinking` left undefined (the end-to-end tests' fixture). The expected
    /// texts are Jinja2 3.1's rendering of the same template (`trim_blocks`,
    /// `lstrip_blocks`, loop controls: as transformers compiles it).
    const REASONING: &str = include_str!("../../../tests/fixtures/reasoning_chat_template.jinja");

    #[test]
    fn a_reasoning_model_s_template_renders_as_jinja2_renders_it() {
        let template = ChatTemplate::new(REASONING, "", "<|im_end|>").unwrap();
        let conversation = [
            Message::new("system", "  Be brief. "),
            Message::new("user", "What is 2+2?"),
            Message::new("assistant", "<think>\nadd them\n</think>\n\n4"),
            Message::new("user", "<result>x</result>"),
            Message::new("user", "And 3+3?"),
        ];
        assert_eq!(
            template.render(&conversation).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n<result>x</result><|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
        );
        // The last reply keeps its thinking; the text before it is the prompt's.
        let (asked, reply) = template.render_reply(&conversation[..3]).unwrap();
        assert_eq!(
            format!("{asked}{reply}\n"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n"
        );
    }

    /// `chat_template_kwargs` reach the template as variables (thinking off renders
    /// Jinja2's text for `enable_thinking=False`); the renderer's own win over a kwarg.
    #[test]
    fn chat_template_kwargs_are_the_template_s_variables() {
        let mut template = ChatTemplate::new(REASONING, "", "<|im_end|>").unwrap();
        let kwargs = serde_json::json!({"enable_thinking": false, "messages": [],
                                        "add_generation_prompt": false});
        template.set_kwargs(kwargs.as_object().unwrap());
        let asked = [
            Message::new("system", "  Be brief. "),
            Message::new("user", "And 3+3?"),
        ];
        assert_eq!(
            template.render(&asked).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    /// transformers' `strftime_now`: today's date in Python's format (Llama 3.2's template
    /// dates its system turn with it); a format that is not one is an error in words.
    #[test]
    fn strftime_now_writes_today_s_date() {
        let dated = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", "", "").unwrap();
        let today = || chrono::Local::now().format("%d %b %Y").to_string();
        let before = today();
        let rendered = dated.render(&[Message::new("user", "hi")]).unwrap();
        assert!(rendered == before || rendered == today(), "{rendered}");
        let broken = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        let error = broken.render(&[Message::new("user", "hi")]).unwrap_err();
        assert!(
            error.to_string().contains("is not a date format"),
            "{error}"
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
