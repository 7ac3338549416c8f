//! What a `generate@1` task's prompts come to before and after the engine runs them: each
//! prompt's parameters, grammar and fitted tokens, or why it is refused; then the engine's
//! generations as the task's completions. A leaf: the actor (`mod.rs`) and its running
//! batch (`batch.rs`) build on it.

use std::ops::Range;
use std::sync::Arc;

use resident_actor::generate::{
    Choice, ChoiceScores, Completion, FinishReason, GenerateParams, GenerateRequest,
    GenerateResponse, MAX_CHOICES, PromptParts, ReasoningParser, ResponseFormat, Template,
    TextScore, TextSize, TokenLogprob, TopLogprob,
};
use resident_models::ModelError;
use resident_models::generate::chat::Message;
use resident_models::generate::grammar::{self, OutputGrammar};
use resident_models::generate::prompt::{Prompt, PromptFormat, ScoredText};
use resident_models::generate::sampling::SamplingParams;
use resident_models::generate::score_windows::WindowSettings;
use resident_models::generate::{
    self as engine, GenerateModel, Generation, GenerationRequest, PromptScoring,
};

/// A task's prompts as the engine takes them: each prompt's requests (one per choice), or
/// why the prompt is refused.
pub(super) struct TaskPlan {
    /// Each prompt's id and what it came to.
    prompts: Vec<(String, PromptPlan)>,
    /// Every prompt's requests, in order.
    pub requests: Vec<GenerationRequest>,
    /// Scores come with each scored token's log-probability (`prompt_logprobs`).
    list_scored_tokens: bool,
    /// How each completion's thinking is told from its answer (the job's parser).
    reasoning_parser: Option<ReasoningParser>,
}

/// A prompt's requests, or why it is refused.
type PromptPlan = Result<PromptRequests, String>;

/// A prompt's requests among [`TaskPlan::requests`]: the windows of a long scored text
/// before its last, then one per choice (the first of which scores the last window); or,
/// for a prompt with scored choices, each choice's windows in turn.
struct PromptRequests {
    requests: Range<usize>,
    /// How many of them are earlier windows, which score and generate nothing.
    windows_before: usize,
    /// Its text was cut, or (scored) not scored to its end.
    truncated: bool,
    /// A scored text's size, when all of it is scored.
    text_size: Option<TextSize>,
    /// The prompt's scored choices; `None` without choices.
    choices: Option<ChoicePlan>,
}

/// A prompt's scored choices as planned: what its completion needs besides the windows'
/// scores.
struct ChoicePlan {
    /// Each choice's windows (requests), in order.
    windows: Vec<usize>,
    /// Each choice's length in characters.
    chars: Vec<u32>,
    /// The right choices, when the record names them.
    answers: Vec<u32>,
}

impl TaskPlan {
    /// Plans every prompt of `request`. A prompt the model cannot take for a reason every
    /// prompt shares (the job's template, system message or schema) fails the whole task.
    pub fn new(model: &GenerateModel, request: &GenerateRequest) -> Result<Self, String> {
        let template = match request.params.template {
            Template::Chat => engine::PromptTemplate::Chat,
            Template::None => engine::PromptTemplate::None,
        };
        let mut prompts = Vec::with_capacity(request.prompts.len());
        let mut requests = Vec::new();
        let mut grammars = CheckedGrammars::default();
        for prompt in &request.prompts {
            let planned = match plan(model, prompt, &request.params, template, &mut grammars)? {
                Planned::Runs {
                    params,
                    tokens,
                    truncated,
                    grammar,
                    scoring,
                    windows_before,
                    text_size,
                } => {
                    let first = requests.len();
                    requests.extend(windows_before.iter().map(|(window, scoring)| {
                        GenerationRequest {
                            max_new_tokens: 0,
                            score: Some(*scoring),
                            ..generation_request(&prompt.id, 0, window, &params, &None)
                        }
                    }));
                    requests.extend((0..params.n).map(|choice| GenerationRequest {
                        // The first choice alone scores the prompt all choices share.
                        score: scoring.filter(|_| choice == 0),
                        ..generation_request(&prompt.id, choice, &tokens, &params, &grammar)
                    }));
                    Ok(PromptRequests {
                        requests: first..requests.len(),
                        windows_before: windows_before.len(),
                        truncated,
                        text_size,
                        choices: None,
                    })
                }
                Planned::Choices { params, choices } => {
                    let first = requests.len();
                    let plan = ChoicePlan {
                        windows: choices.iter().map(|c| c.windows.len()).collect(),
                        chars: (prompt.choices.iter())
                            .map(|c| c.chars().count() as u32)
                            .collect(),
                        answers: prompt.answers.clone(),
                    };
                    let truncated = choices.iter().any(|c| c.truncated);
                    let top = params.prompt_logprobs.unwrap_or(0) as usize;
                    for (window, scoring) in choices.into_iter().flat_map(|c| windows(c, top)) {
                        requests.push(GenerationRequest {
                            max_new_tokens: 0,
                            score: Some(scoring),
                            ..generation_request(&prompt.id, 0, &window, &params, &None)
                        });
                    }
                    Ok(PromptRequests {
                        requests: first..requests.len(),
                        windows_before: 0,
                        truncated,
                        text_size: None,
                        choices: Some(plan),
                    })
                }
                Planned::Refused(error) => Err(error),
            };
            prompts.push((prompt.id.clone(), planned));
        }
        Ok(Self {
            prompts,
            requests,
            list_scored_tokens: request.params.prompt_logprobs.is_some(),
            reasoning_parser: request.params.reasoning_parser,
        })
    }

    /// The task's completions from the engine's `outputs` for [`TaskPlan::requests`].
    pub fn response(self, format: &PromptFormat, outputs: &[Generation]) -> GenerateResponse {
        let completions = self
            .prompts
            .into_iter()
            .map(|(id, planned)| match planned {
                Ok(planned) if planned.choices.is_some() => {
                    let outputs = &outputs[planned.requests.clone()];
                    let scored_tokens = self.list_scored_tokens;
                    choices_completion(format, &id, outputs, &planned, scored_tokens)
                }
                Ok(planned) => {
                    let windows = planned.windows_before;
                    let first = &self.requests[planned.requests.start + windows];
                    let asked = Asked {
                        logprobs: first.logprobs.is_some(),
                        score: first.score.is_some(),
                        scored_tokens: self.list_scored_tokens,
                        text_size: planned.text_size,
                        reasoning: self.reasoning_parser,
                    };
                    let (before, choices) = outputs[planned.requests].split_at(windows);
                    completion(format, &id, (before, choices), asked, planned.truncated)
                }
                Err(error) => Completion {
                    id,
                    text: String::new(),
                    prompt_tokens: 0,
                    generated_tokens: 0,
                    finish_reason: FinishReason::Stop,
                    truncated: false,
                    logprobs: None,
                    more: Vec::new(),
                    error: Some(error),
                    score: None,
                    choice_scores: None,
                    reasoning: None,
                    reasoning_tokens: 0,
                },
            })
            .collect();
        GenerateResponse { completions }
    }
}

/// The engine's request for choice `choice` of a prompt fitted to `tokens`.
fn generation_request(
    id: &str,
    choice: u32,
    tokens: &[u32],
    params: &GenerateParams,
    grammar: &Option<Arc<OutputGrammar>>,
) -> GenerationRequest {
    GenerationRequest {
        id: id.to_owned(),
        choice,
        prompt: tokens.to_vec(),
        max_new_tokens: match params.score {
            true => params.max_new_tokens as usize,
            false => params.max_new_tokens.max(1) as usize,
        },
        sampling: SamplingParams {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k as usize,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            seed: params.seed,
        },
        stop: params.stop.clone(),
        stop_token_ids: params.stop_token_ids.clone(),
        min_tokens: params.min_tokens as usize,
        ignore_eos: params.ignore_eos,
        logprobs: params.logprobs.then_some(params.top_logprobs as usize),
        grammar: grammar.clone(),
        // Under a reasoning parser the thinking is free and the answer holds to the
        // grammar, as vLLM's structured output under a reasoning parser.
        grammar_after_thinking: params.reasoning_parser.is_some(),
        score: None,
    }
}

/// What a prompt's completion reports beyond its text.
#[derive(Clone, Copy)]
struct Asked {
    /// Each generated token's log-probability.
    logprobs: bool,
    /// The record text's score.
    score: bool,
    /// With the score, each scored token's log-probability.
    scored_tokens: bool,
    /// With the score, the text's size (when all of it is scored).
    text_size: Option<TextSize>,
    /// Each completion's thinking split from its answer by this parser.
    reasoning: Option<ReasoningParser>,
}

/// A prompt's completion from the generations of its text's earlier windows (a long scored
/// text's) and of its choices (the first is the answer, the rest `more`): the prompt's
/// tokens and its score count every window's.
fn completion(
    format: &PromptFormat,
    id: &str,
    (windows_before, outputs): (&[Generation], &[Generation]),
    asked: Asked,
    truncated: bool,
) -> Completion {
    let windows = || windows_before.iter().chain(&outputs[..1]);
    let prompt_tokens = windows().map(|w| w.prompt_tokens as u32).sum();
    let score = asked.score.then(|| TextScore {
        size: asked.text_size,
        ..text_score(format, windows(), asked.scored_tokens)
    });
    let mut choices = outputs.iter().map(|output| choice(format, output, asked));
    let first = choices.next().expect("n is at least 1");
    Completion {
        id: id.to_owned(),
        text: first.text,
        prompt_tokens,
        generated_tokens: first.generated_tokens,
        finish_reason: first.finish_reason,
        truncated,
        logprobs: first.logprobs,
        more: choices.collect(),
        error: None,
        score,
        choice_scores: None,
        reasoning: first.reasoning,
        reasoning_tokens: first.reasoning_tokens,
    }
}

/// The score of a text scored in `windows` (their scored tokens, in order), with each
/// scored token's log-probability when `listed`.
fn text_score<'a>(
    format: &PromptFormat,
    windows: impl Iterator<Item = &'a Generation> + Clone,
    listed: bool,
) -> TextScore {
    let scored = || windows.clone().flat_map(|w| &w.prompt_logprobs);
    TextScore {
        tokens: scored().count() as u32,
        logprob: scored().map(|t| f64::from(t.logprob)).sum(),
        greedy: windows.clone().all(|w| w.prompt_greedy),
        token_logprobs: listed.then(|| token_logprobs(format, scored())),
        size: None,
    }
}

/// A prompt's completion from its scored choices' windows (`outputs`, each choice's in
/// turn): a score per choice, nothing generated; its prompt tokens count every window's.
fn choices_completion(
    format: &PromptFormat,
    id: &str,
    outputs: &[Generation],
    planned: &PromptRequests,
    listed: bool,
) -> Completion {
    let plan = planned.choices.as_ref().expect("a prompt with choices");
    let mut rest = outputs;
    let scores = (plan.windows.iter())
        .map(|&count| {
            let (windows, after) = rest.split_at(count);
            rest = after;
            text_score(format, windows.iter(), listed)
        })
        .collect();
    Completion {
        id: id.to_owned(),
        text: String::new(),
        prompt_tokens: outputs.iter().map(|w| w.prompt_tokens as u32).sum(),
        generated_tokens: 0,
        finish_reason: FinishReason::Length,
        truncated: planned.truncated,
        logprobs: None,
        more: Vec::new(),
        error: None,
        score: None,
        choice_scores: Some(ChoiceScores {
            scores,
            chars: plan.chars.clone(),
            answers: plan.answers.clone(),
        }),
        reasoning: None,
        reasoning_tokens: 0,
    }
}

/// A record's conversation as the model's chat template takes it (empty for a text record).
pub fn chat_messages(prompt: &PromptParts) -> Vec<Message> {
    prompt
        .messages
        .iter()
        .map(|m| Message::new(&m.role, &m.content))
        .collect()
}

/// What the model renders for `prompt` under `params`: its conversation (`messages`, from
/// [`chat_messages`]) when it has one, else its text between the template's parts with its
/// own system message or the job's (`text_system`). `--dry-run` renders the same.
pub fn model_prompt<'a>(
    prompt: &'a PromptParts,
    params: &'a GenerateParams,
    messages: &'a [Message],
) -> Prompt<'a> {
    match messages.is_empty() {
        true => Prompt::Parts {
            system: text_system(prompt, params),
            before: &prompt.before,
            text: &prompt.text,
            after: &prompt.after,
            reply_start: &prompt.reply_start,
            examples: &prompt.example_bounds,
        },
        false => Prompt::Messages {
            messages,
            examples: prompt.example_turns as usize,
        },
    }
}

/// A text prompt's system message: its own (the description moved into it) or the job's.
/// The chat template renders it as the system turn; without it, it is text directly before
/// the prompt (lm-evaluation-harness's system instruction without its chat template).
fn text_system<'a>(prompt: &'a PromptParts, params: &'a GenerateParams) -> Option<&'a str> {
    (prompt.system.as_deref()).or(params.system.as_deref())
}

/// What a prompt comes to before the model runs.
enum Planned {
    Runs {
        /// Boxed: the parameters are most of the variant's size.
        params: Box<GenerateParams>,
        tokens: Vec<u32>,
        truncated: bool,
        grammar: Option<Arc<OutputGrammar>>,
        /// The record text's tokens to score, when the job scores (the last window's).
        scoring: Option<PromptScoring>,
        /// A long scored text's windows before the last: each one's tokens and what it
        /// scores.
        windows_before: Vec<(Vec<u32>, PromptScoring)>,
        /// The scored text's size, when all of it is scored.
        text_size: Option<TextSize>,
    },
    /// A prompt's choices, each scored after it in its windows ([`scored_choices`]);
    /// nothing is generated.
    Choices {
        params: Box<GenerateParams>,
        choices: Vec<ScoredText>,
    },
    /// The record's own request is invalid: it is answered with this, without the model.
    Refused(String),
}

/// The prompt's parameters and tokens. A record whose own request is wrong (its
/// parameters, its messages) is refused alone; a text prompt the model cannot take
/// (the job's template or system message) fails the task, since every record would.
fn plan(
    model: &GenerateModel,
    prompt: &PromptParts,
    params: &GenerateParams,
    template: engine::PromptTemplate,
    grammars: &mut CheckedGrammars,
) -> Result<Planned, String> {
    if let Some(error) = &prompt.error {
        return Ok(Planned::Refused(error.clone()));
    }
    let params = match &prompt.params {
        Some(over) => params.with(over),
        None => params.clone(),
    };
    if let Some(problem) = params.problem() {
        return match prompt.params {
            Some(_) => Ok(Planned::Refused(problem.to_string())),
            None => Err(problem.to_string()),
        };
    }
    if params.score {
        return scored(model, prompt, params);
    }
    if !prompt.choices.is_empty() {
        return Ok(Planned::Refused(
            "a record's choices are scored, not generated: they need score (--score, \
             score=True)"
                .into(),
        ));
    }
    let messages = chat_messages(prompt);
    let parts = model_prompt(prompt, &params, &messages);
    // A record's own format that cannot compile is refused alone; the job's fails
    // the task (every record would fail on it).
    let grammar = match grammars.checked(params.response_format.as_ref(), |format| {
        grammar_of(model, format)
    }) {
        Ok(grammar) => grammar,
        Err(error) => {
            let own = prompt
                .params
                .as_ref()
                .and_then(|p| p.response_format.as_ref());
            return match own {
                Some(_) => Ok(Planned::Refused(error)),
                None => Err(error),
            };
        }
    };
    let reserve = params.max_new_tokens.max(1) as usize;
    match model.fit(&parts, template, reserve) {
        Ok((tokens, truncated)) => Ok(Planned::Runs {
            params: Box::new(params),
            tokens,
            truncated,
            grammar,
            scoring: None,
            windows_before: Vec::new(),
            text_size: None,
        }),
        Err(error) if !messages.is_empty() => Ok(Planned::Refused(error.to_string())),
        Err(error) => Err(error.to_string()),
    }
}

/// A prompt whose record text (or conversation's reply) is scored: the prompt with the
/// scored tokens marked, in as many windows as they take (the last one generates). A
/// conversation that ends with no reply, an instruction too long for the context, or a text
/// too long for its windows' stride, is refused alone.
fn scored(
    model: &GenerateModel,
    prompt: &PromptParts,
    params: GenerateParams,
) -> Result<Planned, String> {
    if !prompt.choices.is_empty() {
        return Ok(
            match scored_choices(model.format(), model.context(), prompt, &params) {
                Ok(choices) => Planned::Choices {
                    params: Box::new(params),
                    choices,
                },
                Err(error) => Planned::Refused(error),
            },
        );
    }
    let scored = match scored_text(model.format(), model.context(), prompt, &params) {
        Ok(scored) => scored,
        Err(error) => return Ok(Planned::Refused(error)),
    };
    let truncated = scored.truncated;
    // A conversation's scored text is its last message, the reply.
    let text = prompt.messages.last().map_or(&prompt.text, |m| &m.content);
    let text_size = scored.whole.then(|| TextSize::of(text));
    let top = params.prompt_logprobs.unwrap_or(0) as usize;
    let mut windows: Vec<_> = windows(scored, top).collect();
    let (tokens, scoring) = windows.pop().expect("a scored text has a window");
    Ok(Planned::Runs {
        params: Box::new(params),
        tokens,
        truncated,
        grammar: None,
        scoring: Some(scoring),
        windows_before: windows,
        text_size,
    })
}

/// Why a text record without choices is not scored under the chat template.
const CHAT_SCORES_CHOICES: &str = "under the chat template (--template chat) a score is of \
    each choice after the rendered prompt, and this record has no choices: score a text \
    itself raw, with --template none";

/// A record's windows to score under `params` with a model of `context` tokens, or why the
/// record cannot be scored: what an actor runs, and what `--dry-run` shows. A text record's
/// text is scored raw (after the system message written as text, where there is one); a
/// conversation's last message, the assistant's reply, given the turns before it through
/// the model's chat template.
pub fn scored_text(
    format: &PromptFormat,
    context: usize,
    prompt: &PromptParts,
    params: &GenerateParams,
) -> Result<ScoredText, String> {
    let settings = WindowSettings {
        stride: params.score_stride.map(|s| s as usize),
        max_windows: params.max_score_windows.map(|w| w as usize),
        score_first_token: params.score_first_token,
    };
    let window = score_window(context, params);
    if prompt.messages.is_empty() && params.template == Template::Chat {
        return Err(CHAT_SCORES_CHOICES.into());
    }
    let scored = match prompt.messages.is_empty() {
        true => {
            let system = text_system(prompt, params).unwrap_or_default();
            let before = format!("{system}{}", prompt.before);
            let after = format!("{}{}", prompt.after, prompt.reply_start);
            format.scored_text((&before, &prompt.text, &after), window, settings)
        }
        false => format.scored_reply(&chat_messages(prompt), window, settings),
    };
    scored.map_err(|e| e.to_string())
}

/// A scored text's windows as the engine takes them: each one's tokens and what it scores
/// (with its `top` likeliest tokens listed).
fn windows(scored: ScoredText, top: usize) -> impl Iterator<Item = (Vec<u32>, PromptScoring)> {
    scored.windows.into_iter().map(move |window| {
        let scoring = PromptScoring {
            from: window.scored.start,
            to: window.scored.end,
            top,
        };
        (window.tokens, scoring)
    })
}

/// Each of a prompt's choices scored after it under `params` with a model of `context`
/// tokens, or why they cannot be: what an actor runs, and what `--dry-run` shows. After a
/// text prompt a choice is scored raw after the whole prompt (`before + text + after`);
/// after a conversation, which must end with the user's turn, as the assistant's reply
/// through the model's chat template.
pub fn scored_choices(
    format: &PromptFormat,
    context: usize,
    prompt: &PromptParts,
    params: &GenerateParams,
) -> Result<Vec<ScoredText>, String> {
    let settings = WindowSettings {
        stride: params.score_stride.map(|s| s as usize),
        max_windows: params.max_score_windows.map(|w| w as usize),
        score_first_token: params.score_first_token,
    };
    check_choices(prompt, params)?;
    let window = score_window(context, params);
    if params.choices_as_contexts {
        return scored_after_contexts(format, window, (prompt, params), settings);
    }
    let messages = chat_messages(prompt);
    // Under the chat template a last assistant message is the reply's start, continued by
    // each choice (lm-evaluation-harness's `gen_prefix`).
    let continued = params.template == Template::Chat;
    let last = messages.last();
    if let Some(last) = last.filter(|m| m.role != "user" && !(continued && m.role == "assistant")) {
        return Err(format!(
            "a conversation with choices ends with the user's turn (each choice is the \
             assistant's reply to it; under the chat template an assistant message may start \
             that reply); this one ends with a {} message",
            last.role
        ));
    }
    if params.template == Template::Chat || messages.is_empty() {
        return scored_after_prompt(format, window, (prompt, params, &messages), settings);
    }
    (prompt.choices.iter())
        .map(|choice| {
            let reply = Message::new("assistant", choice);
            let turns: Vec<Message> = messages.iter().cloned().chain([reply]).collect();
            (format.scored_reply(&turns, window, settings)).map_err(|e| e.to_string())
        })
        .collect()
}

/// Each of a prompt's choices scored as the text that follows it: after its raw text
/// (`before + text + after`, lm-evaluation-harness's multiple choice), or after what the
/// chat template renders of it with the generation prompt (its text as the user's turn,
/// after the job's system message; or its conversation: lm-evaluation-harness's
/// `--apply_chat_template`; unlike a conversation's reply under template none, a choice is
/// scored without the end-of-turn marker). A prompt with few-shot examples too long to
/// leave the longest choice room loses its oldest examples first ([`choice_context`]).
fn scored_after_prompt(
    format: &PromptFormat,
    window: usize,
    (prompt, params, messages): (&PromptParts, &GenerateParams, &[Message]),
    settings: WindowSettings,
) -> Result<Vec<ScoredText>, String> {
    let template = match params.template {
        Template::Chat => engine::PromptTemplate::Chat,
        Template::None => engine::PromptTemplate::None,
    };
    let (context, examples_dropped) =
        choice_context(format, window, template, (prompt, params, messages))
            .map_err(|e| e.to_string())?;
    (prompt.choices.iter())
        .map(|choice| {
            let mut scored = format.scored_choice((&context, choice), template, window, settings);
            if let Ok(scored) = &mut scored {
                scored.truncated |= examples_dropped;
            }
            scored.map_err(|e| e.to_string())
        })
        .collect()
}

/// The prompt before a choice as `template` renders it, and whether examples were left
/// out: a prompt whose few-shot examples (turns or text) leave the longest choice no room
/// in `window` loses its oldest examples first (the choice's context is cut from its start
/// only after).
fn choice_context(
    format: &PromptFormat,
    window: usize,
    template: engine::PromptTemplate,
    (prompt, params, messages): (&PromptParts, &GenerateParams, &[Message]),
) -> Result<(String, bool), ModelError> {
    let parts = model_prompt(prompt, params, messages);
    let whole = format.render(&parts, template, None)?;
    if parts.example_count() == 0 {
        return Ok((whole, false));
    }
    let mut longest_choice = 0;
    for choice in &prompt.choices {
        // Under the chat template's reading a text's tokens have no BOS before them.
        let tokens = format.tokens(choice, engine::PromptTemplate::Chat)?;
        longest_choice = longest_choice.max(tokens.len());
    }
    // A token spare: the context's trailing space is scored with the choice.
    let limit = window.saturating_sub(longest_choice + 1);
    if format.tokens(&whole, template)?.len() <= limit {
        return Ok((whole, false));
    }
    match format.without_oldest_examples(&parts, template, limit)? {
        Some(kept) => Ok((format.render(&kept.prompt(&parts), template, None)?, true)),
        None => Ok((whole, false)),
    }
}

/// A prompt's `text + after` scored after each choice in place of the record's text,
/// within `window` tokens: Winogrande's partial scoring
/// ([`GenerateParams::choices_as_contexts`]). Under template none the context is `before +
/// choice` after the system message written as text; under the chat template it is the
/// user's turn, `before + choice` (or the conversation's last user turn with the choice
/// after it), rendered with the generation prompt, and the text is the reply's start
/// (lm-evaluation-harness's `multiple_input_context` with `--apply_chat_template`), its
/// oldest few-shot examples left out first when it is too long. An empty text is refused,
/// and a conversation under template none.
fn scored_after_contexts(
    format: &PromptFormat,
    window: usize,
    (prompt, params): (&PromptParts, &GenerateParams),
    settings: WindowSettings,
) -> Result<Vec<ScoredText>, String> {
    let chat = params.template == Template::Chat;
    if !prompt.messages.is_empty() && !chat {
        return Err(
            "a conversation's choices are the assistant's replies to it: choices as contexts \
             (--choices-as-contexts) take text records, or a conversation under the chat \
             template (--template chat), whose last user turn each choice ends"
                .into(),
        );
    }
    let continuation = format!("{}{}", prompt.text, prompt.after);
    if continuation.trim().is_empty() {
        return Err(
            "the record's text is what is scored after each choice, and it is \
                    empty: give the text that follows the choices"
                .into(),
        );
    }
    if chat {
        return (prompt.choices.iter())
            .map(|choice| {
                let filled = context_filled_by(prompt, choice, continuation.clone())?;
                let messages = chat_messages(&filled);
                let mut scored =
                    scored_after_prompt(format, window, (&filled, params, &messages), settings)?;
                // One continuation, one score.
                scored
                    .pop()
                    .ok_or_else(|| "the text after a context was not scored".into())
            })
            .collect();
    }
    let system = text_system(prompt, params).unwrap_or_default();
    (prompt.choices.iter())
        .map(|choice| {
            let context = format!("{system}{}{choice}", prompt.before);
            let raw = engine::PromptTemplate::None;
            (format.scored_choice((&context, &continuation), raw, window, settings))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// What the model reads for a prompt's choice `index` as a context
/// ([`GenerateParams::choices_as_contexts`]): the context as [`scored_choices`] renders it,
/// then the text scored after it. What `--dry-run` shows.
pub fn context_reading(
    format: &PromptFormat,
    prompt: &PromptParts,
    params: &GenerateParams,
    index: usize,
) -> Result<String, String> {
    let choice = (prompt.choices.get(index))
        .ok_or_else(|| format!("no choice {index}: the record has {}", prompt.choices.len()))?;
    let continuation = format!("{}{}", prompt.text, prompt.after);
    if params.template == Template::None {
        let system = text_system(prompt, params).unwrap_or_default();
        return Ok(format!("{system}{}{choice}{continuation}", prompt.before));
    }
    let filled = context_filled_by(prompt, choice, continuation.clone())?;
    let messages = chat_messages(&filled);
    let parts = model_prompt(&filled, params, &messages);
    let context =
        (format.render(&parts, engine::PromptTemplate::Chat, None)).map_err(|e| e.to_string())?;
    Ok(context + &continuation)
}

/// `prompt` with `choice` written where its text was (after `before`, or at the end of its
/// conversation's last user turn) and `continuation` as its one choice: what the chat
/// template renders before the text a choice as context is scored on.
fn context_filled_by(
    prompt: &PromptParts,
    choice: &str,
    continuation: String,
) -> Result<PromptParts, String> {
    let mut filled = PromptParts {
        before: format!("{}{choice}", prompt.before),
        text: String::new(),
        after: String::new(),
        choices: vec![continuation],
        answers: Vec::new(),
        ..prompt.clone()
    };
    if let Some(last) = filled.messages.last_mut() {
        if last.role != "user" {
            return Err(format!(
                "a conversation whose choices are contexts ends with the user's turn, which \
                 each choice ends; this one ends with a {} message",
                last.role
            ));
        }
        last.content.push_str(choice);
    }
    Ok(filled)
}

/// Why a prompt's choices cannot be scored: samples asked for (`n`), too many, one empty,
/// or an answer that is none of them.
fn check_choices(prompt: &PromptParts, params: &GenerateParams) -> Result<(), String> {
    let count = prompt.choices.len();
    if params.n > 1 {
        return Err(format!(
            "n = {} asks for samples, and a record with choices is scored, each choice once: \
             leave n at 1 (or drop the choices to sample replies)",
            params.n
        ));
    }
    if count > MAX_CHOICES as usize {
        return Err(format!(
            "{count} choices; a record may have at most {MAX_CHOICES} (split the rest into \
             records of their own)"
        ));
    }
    if let Some(empty) = prompt.choices.iter().position(|c| c.is_empty()) {
        return Err(format!(
            "choice {empty} is empty: an empty continuation scores nothing (give each \
             choice its text)"
        ));
    }
    match prompt
        .answers
        .iter()
        .find(|&&answer| answer as usize >= count)
    {
        Some(answer) => Err(format!(
            "the answer is choice {answer}, and there are {count} choices (numbered from 0)"
        )),
        None => Ok(()),
    }
}

/// The tokens a scoring window may hold in a model of `context` tokens: the context less
/// what is generated after the text (at least one token, the next one's row).
pub fn score_window(context: usize, params: &GenerateParams) -> usize {
    context
        .saturating_sub(params.max_new_tokens.max(1) as usize)
        .max(1)
}

/// The grammar `format` asks for (none for free text).
fn output_grammar(format: &ResponseFormat) -> Option<OutputGrammar> {
    Some(match format {
        ResponseFormat::Text => return None,
        ResponseFormat::JsonObject => OutputGrammar::JsonObject,
        ResponseFormat::JsonSchema { json_schema } => {
            OutputGrammar::JsonSchema(json_schema.schema.clone())
        }
        ResponseFormat::Regex { regex } => OutputGrammar::Regex(regex.clone()),
        ResponseFormat::Choice { choice } => OutputGrammar::Choice(choice.clone()),
        ResponseFormat::Grammar { grammar } => OutputGrammar::Lark(grammar.clone()),
    })
}

/// Why `format` cannot constrain any model's output (it is empty, or its schema,
/// expression or grammar does not compile), in words to follow its name (`has an empty
/// regular expression`, `does not compile: ...`); `None` when it can. A job checks its
/// own before any actor starts.
pub fn response_format_problem(format: &ResponseFormat) -> Option<String> {
    if let Some(problem) = format.problem() {
        return Some(problem.into());
    }
    let grammar = output_grammar(format)?;
    grammar::check_without_model(&grammar)
        .err()
        .map(|e| format!("does not compile: {e}"))
}

/// The grammar `format` asks for, compiled once to check it (each sequence compiles
/// its own state from it).
fn grammar_of(model: &GenerateModel, format: Option<&ResponseFormat>) -> GrammarCheck {
    let Some(grammar) = format.and_then(output_grammar) else {
        return Ok(None);
    };
    model.constraint(&grammar).map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(grammar)))
}

/// The response formats a request's prompts asked for, each compiled once to check it: a
/// job's schema is compiled once per task, not once per prompt, and a record's own once
/// per distinct format.
#[derive(Default)]
pub(super) struct CheckedGrammars {
    checked: Vec<(ResponseFormat, GrammarCheck)>,
}

/// A response format's grammar (none for free text), or why it does not compile.
type GrammarCheck = Result<Option<Arc<OutputGrammar>>, String>;

impl CheckedGrammars {
    /// `format`'s grammar (or why it cannot compile), from `check` the first time only.
    pub(super) fn checked(
        &mut self,
        format: Option<&ResponseFormat>,
        check: impl FnOnce(Option<&ResponseFormat>) -> GrammarCheck,
    ) -> GrammarCheck {
        let Some(format) = format else {
            return check(None);
        };
        if let Some((_, result)) = self.checked.iter().find(|(seen, _)| seen == format) {
            return result.clone();
        }
        let result = check(Some(format));
        self.checked.push((format.clone(), result.clone()));
        result
    }
}

/// One generation as a completion's choice, its log-probabilities (when `asked`) as text.
fn choice(format: &PromptFormat, output: &Generation, asked: Asked) -> Choice {
    let (text, reasoning, reasoning_tokens) = match asked.reasoning {
        Some(parser) => {
            let split = parser.split(&output.text);
            // Each token's text, decoded once a process (the tags are ASCII).
            let pieces: Vec<_> = (output.tokens.iter())
                .map(|&id| format.token_text(id).unwrap_or_default())
                .collect();
            let tokens = parser.reasoning_tokens(pieces.iter().map(|p| p.as_bytes()));
            let reasoning = split.reasoning.map(str::to_owned);
            (split.content.to_owned(), reasoning, tokens)
        }
        None => (output.text.clone(), None, 0),
    };
    Choice {
        text,
        generated_tokens: output.tokens.len() as u32,
        finish_reason: match output.finish_reason {
            engine::FinishReason::Stop => FinishReason::Stop,
            engine::FinishReason::Length => FinishReason::Length,
        },
        logprobs: asked
            .logprobs
            .then(|| token_logprobs(format, &output.logprobs)),
        reasoning,
        reasoning_tokens,
    }
}

/// The engine's log-probabilities of tokens, with each token (and its likeliest rivals) as
/// text and bytes.
fn token_logprobs<'a>(
    format: &PromptFormat,
    steps: impl IntoIterator<Item = &'a engine::sampling::TokenLogprob>,
) -> Vec<TokenLogprob> {
    steps
        .into_iter()
        .map(|step| {
            let (token, bytes) = format.token_piece(step.token);
            TokenLogprob {
                token,
                logprob: step.logprob,
                bytes,
                top_logprobs: step
                    .top
                    .iter()
                    .map(|&(id, logprob)| {
                        let (token, bytes) = format.token_piece(id);
                        TopLogprob {
                            token,
                            logprob,
                            bytes,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's prompts share their formats' checks: one per distinct format, whether it
    /// compiled or not; no format is checked as `None` each time (nothing to compile).
    #[test]
    fn each_distinct_response_format_is_checked_once_a_request() {
        let schema = |n: u32| ResponseFormat::JsonSchema {
            json_schema: resident_actor::generate::JsonSchemaFormat {
                name: String::new(),
                schema: serde_json::json!({"type": "object", "maxProperties": n}),
                strict: None,
            },
        };
        let mut grammars = CheckedGrammars::default();
        let mut checks = Vec::new();
        let formats = [
            Some(schema(1)),
            None,
            Some(schema(1)),
            Some(schema(2)),
            Some(schema(2)),
        ];
        for format in &formats {
            let result = grammars.checked(format.as_ref(), |format| {
                checks.push(format.cloned());
                match format {
                    Some(f) if *f == schema(2) => Err("does not compile".into()),
                    Some(_) => Ok(Some(Arc::new(OutputGrammar::JsonObject))),
                    None => Ok(None),
                }
            });
            assert_eq!(result.is_err(), *format == Some(schema(2)));
        }
        assert_eq!(checks, [Some(schema(1)), None, Some(schema(2))]);
    }
}
