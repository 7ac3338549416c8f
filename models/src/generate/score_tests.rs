//! Scoring prompt tokens ([`PromptScoring`]) against the real SmolLM2-135M-Instruct GGUF, on
//! the quantised CPU kernels and the dense f32 path: a scored token's log-probability is
//! the one generating it gave, whatever the batch, the prefix cache or preemption do.

use std::sync::OnceLock;

use candle_core::Device;

use super::chat::Message;
use super::dense_tests::gguf_path;
use super::prompt::ScoredText;
use super::score_windows::WindowSettings;
use super::tests::greedy;
use super::*;

fn quantised() -> &'static GenerateModel {
    static MODEL: OnceLock<GenerateModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        GenerateModel::load(&gguf_path())
            .unwrap_or_else(|e| panic!("{e}: run scripts/fetch-model.sh smollm2-135m-instruct"))
    })
}

fn dense_f32() -> GenerateModel {
    GenerateModel::load_on(&gguf_path(), &Device::Cpu, WeightDtype::F32)
        .unwrap_or_else(|e| panic!("{e}: run scripts/fetch-model.sh smollm2-135m-instruct"))
}

/// A request that scores `prompt`'s positions `from..` and generates nothing.
fn score_only(id: &str, prompt: Vec<u32>, from: usize, top: usize) -> GenerationRequest {
    let to = prompt.len();
    GenerationRequest {
        score: Some(PromptScoring { from, to, top }),
        ..greedy(id, prompt, 0)
    }
}

/// Generates greedily with logprobs, then scores the prompt followed by what was generated:
/// each generated token comes back scored with the logprob (and top tokens) it was
/// generated with, and as the likeliest at its place.
fn scores_repeat_what_generation_said(model: &GenerateModel, tolerance: f32) {
    let prompt = model
        .prompt_tokens("Name three fruits and say why.", PromptTemplate::Chat)
        .unwrap();
    let limits = StepLimits::new(2, 64);
    let generated = model
        .generate(
            &[GenerationRequest {
                logprobs: Some(2),
                ignore_eos: true,
                ..greedy("g", prompt.clone(), 12)
            }],
            limits,
            &mut || {},
        )
        .unwrap()
        .remove(0);
    assert_eq!(generated.tokens.len(), 12);
    let whole: Vec<u32> = prompt.iter().chain(&generated.tokens).copied().collect();
    // With top tokens the logits come to the host; without, the dense engine scores
    // where the logits are (`Pick::Score`).
    for top in [2, 0] {
        let request = score_only("s", whole.clone(), prompt.len(), top);
        let scored = model
            .generate(&[request], limits, &mut || {})
            .unwrap()
            .remove(0);
        assert!(scored.tokens.is_empty(), "scoring alone generates nothing");
        assert_eq!(scored.prompt_tokens, prompt.len() + 12);
        assert_eq!(scored.prompt_logprobs.len(), 12);
        assert!(scored.prompt_greedy, "greedy generation wrote them");
        for (score, step) in scored.prompt_logprobs.iter().zip(&generated.logprobs) {
            assert_eq!(score.token, step.token);
            assert!(
                (score.logprob - step.logprob).abs() < tolerance,
                "top {top}: {score:?} vs {step:?}"
            );
            assert_eq!(score.top.len(), top);
            if top > 0 {
                assert_eq!(score.top[0].0, step.top[0].0);
            }
        }
    }
}

#[test]
fn a_scored_completion_has_the_logprobs_it_was_generated_with() {
    // Prefill rows against decode rows: the quantised kernels quantise a step's
    // activations per row, so the two agree closely but not to the bit.
    scores_repeat_what_generation_said(quantised(), 2e-2);
}

#[test]
fn a_scored_completion_has_the_logprobs_it_was_generated_with_on_the_dense_path() {
    scores_repeat_what_generation_said(&dense_f32(), 1e-3);
}

/// Prompts that share their start, scored whole: a later prompt may not take the earlier
/// ones' blocks from the prefix cache (their rows' logits are what it scores), so every
/// token is scored in every call; a KV pool too small for all at once preempts and
/// recomputes, and scores nothing twice. All give the same scores.
#[test]
fn scores_survive_the_prefix_cache_and_preemption() {
    let model = dense_f32();
    let instruction = "Read the following passage from an encyclopedia with care, then \
                       judge whether it is fluent English and well formed. Passage:";
    let requests: Vec<GenerationRequest> = (0..4)
        .map(|i| {
            let text = format!(
                "{instruction} The river {i} runs {} miles to the sea.",
                i * 7
            );
            let tokens = model.prompt_tokens(&text, PromptTemplate::None).unwrap();
            score_only(&format!("r{i}"), tokens, 1, 0)
        })
        .collect();
    let logprobs = |out: &[Generation]| -> Vec<Vec<f32>> {
        out.iter()
            .map(|g| g.prompt_logprobs.iter().map(|t| t.logprob).collect())
            .collect()
    };
    let run = |limits: StepLimits| model.generate(&requests, limits, &mut || {}).unwrap();
    let first = run(StepLimits::new(4, 64));
    for (request, out) in requests.iter().zip(&first) {
        assert_eq!(out.prompt_logprobs.len(), request.prompt.len() - 1);
        let tokens: Vec<u32> = out.prompt_logprobs.iter().map(|t| t.token).collect();
        assert_eq!(tokens, request.prompt[1..]);
    }
    // Again, with the prefix cache holding the instruction's blocks.
    let again = run(StepLimits::new(4, 64));
    assert_eq!(logprobs(&again), logprobs(&first));
    let need = requests[0].prompt.len();
    let blocks = need.div_ceil(kv_blocks::BLOCK_SIZE) * 3 / 2;
    let tight = run(StepLimits::new(4, 16).with_kv_blocks(blocks));
    assert_eq!(logprobs(&tight), logprobs(&first));
    // One at a time, chunked prefill of 8 rows a step.
    let chunked = run(StepLimits::new(1, 8));
    let close = logprobs(&chunked)
        .iter()
        .flatten()
        .zip(logprobs(&first).iter().flatten())
        .all(|(a, b)| (a - b).abs() < 1e-4);
    assert!(close, "chunked prefill scores as one pass does");
}

/// A scored prompt's text is tokenised on its own after the instruction's tokens, so its
/// positions hold exactly its tokens; limited to one window, it keeps its head and loses what
/// follows; an instruction that fills the window is refused in words.
#[test]
fn a_scored_prompt_marks_its_text_and_keeps_its_head() {
    let model = quantised();
    let parts = (
        "Question: what is a river? Answer:",
        " A river is water that flows.",
        "\n",
    );
    let whole = model.format.scored_text(parts, WINDOW, ROLLING).unwrap();
    assert!(!whole.truncated);
    let [prompt] = &whole.windows[..] else {
        panic!("one window: {whole:?}")
    };
    assert_eq!(
        model.decode(&prompt.tokens[prompt.scored.clone()]).unwrap(),
        parts.1
    );
    let start = prompt.scored.start;
    let head_only = WindowSettings {
        stride: None,
        max_windows: Some(1),
        score_first_token: false,
    };
    let head = model
        .format
        .scored_text(parts, start + 3, head_only)
        .unwrap();
    assert!(head.truncated && !head.whole);
    assert!(whole.whole);
    assert_eq!(head.windows.len(), 1);
    assert_eq!(head.windows[0].scored, start..start + 3);
    assert_eq!(head.windows[0].tokens[..], prompt.tokens[..start + 3]);
    assert!(prompt.scored.len() > 3);
    let error = model
        .format
        .scored_text(parts, start, ROLLING)
        .unwrap_err()
        .to_string();
    assert!(error.contains("shorten the prompt"), "{error}");
}

/// A text with nothing before it has its first token as context alone (this model adds no
/// BOS), unless asked to score it: then the model's start token goes first and every token
/// of the text is scored, and the engine gives that first token a log-probability. A text
/// with a prompt before it is scored the same either way.
#[test]
fn a_text_alone_scores_its_first_token_after_the_start_token_when_asked() {
    let model = quantised();
    assert!(
        model
            .format
            .tokens("", PromptTemplate::None)
            .unwrap()
            .is_empty()
    );
    let text = "The river runs from the hills to the sea.";
    let first = WindowSettings {
        score_first_token: true,
        ..ROLLING
    };
    let plain = model
        .format
        .scored_text(("", text, ""), WINDOW, ROLLING)
        .unwrap();
    let from_first = model
        .format
        .scored_text(("", text, ""), WINDOW, first)
        .unwrap();
    assert!(
        !plain.whole && from_first.whole,
        "whole: every token scored"
    );
    let (plain, from_first) = (&plain.windows[0], &from_first.windows[0]);
    assert_eq!(
        plain.scored,
        0..plain.tokens.len(),
        "its first token has nothing before it"
    );
    assert_eq!(from_first.tokens[0], model.format.start_token());
    assert_eq!(from_first.tokens[1..], plain.tokens[..]);
    assert_eq!(from_first.scored, 1..from_first.tokens.len());
    let request = score_only(
        "first",
        from_first.tokens.clone(),
        from_first.scored.start,
        0,
    );
    let out = (model.generate(&[request], StepLimits::new(1, 256), &mut || {}))
        .unwrap()
        .remove(0);
    assert_eq!(
        out.prompt_logprobs.len(),
        plain.tokens.len(),
        "every text token"
    );
    assert!(out.prompt_logprobs[0].logprob < 0.0);
    let parts = ("Passage:", " The river runs.", "");
    assert_eq!(
        model.format.scored_text(parts, WINDOW, first).unwrap(),
        model.format.scored_text(parts, WINDOW, ROLLING).unwrap()
    );
}

/// A text longer than the window goes on in windows: together they score each of its tokens
/// once, in order; a later window is the text's tokens just before its scored ones (after
/// BOS, where the model asks for one), and what follows the text ends the last.
#[test]
fn a_long_text_is_scored_in_windows_that_cover_each_token_once() {
    let model = quantised();
    let text = " The river runs from the hills to the sea, past farms and mills and towns, \
                and its water is used for drinking, for fields and for power.";
    let parts = ("Passage:", text, "\nSummary:");
    let whole = model.format.scored_text(parts, WINDOW, ROLLING).unwrap();
    let [one] = &whole.windows[..] else {
        panic!("one window: {whole:?}")
    };
    let text_tokens = &one.tokens[one.scored.clone()];
    let after = &one.tokens[one.scored.end..];
    let limit = one.scored.start + 8;
    let lead = model.format.tokens("", PromptTemplate::None).unwrap();
    for stride in [None, Some(3)] {
        let settings = WindowSettings {
            stride,
            max_windows: None,
            score_first_token: false,
        };
        let rolled = model.format.scored_text(parts, limit, settings).unwrap();
        assert!(!rolled.truncated);
        assert!(rolled.windows.len() > 2, "{rolled:?}");
        let scored: Vec<u32> = rolled
            .windows
            .iter()
            .flat_map(|w| w.tokens[w.scored.clone()].iter().copied())
            .collect();
        assert_eq!(scored, text_tokens, "every text token once, in order");
        assert_eq!(rolled.windows[0].tokens[..], one.tokens[..limit]);
        let mut done = rolled.windows[0].scored.len();
        for window in &rolled.windows[1..] {
            assert!(window.tokens.len() <= limit);
            assert!(window.tokens.starts_with(&lead));
            let held = &window.tokens[lead.len()..window.scored.end];
            assert!(
                held.len() > window.scored.len(),
                "context before the scored tokens"
            );
            done += window.scored.len();
            assert_eq!(held, &text_tokens[done - held.len()..done]);
        }
        let last = rolled.windows.last().unwrap();
        assert!(
            last.tokens.ends_with(after),
            "what follows ends the last window"
        );
        if let Some(stride) = stride {
            assert!(rolled.windows[1..].iter().all(|w| w.scored.len() <= stride));
        }
    }
}

/// A conversation's reply is scored after the turns before it, as the chat template writes
/// them with the generation prompt: exactly the tokens generation would continue from, then
/// the reply's own tokens through its end-of-turn marker. A true reply scores above a false
/// one (DPO's chosen and rejected); a conversation that ends with the user is refused.
#[test]
fn a_conversation_s_reply_is_scored_after_the_turns_before_it() {
    let model = quantised();
    let question = Message::new("user", "What is the capital of France?");
    let conversation = |reply: &str| [question.clone(), Message::new("assistant", reply)];
    let chosen = conversation("The capital of France is Paris.");
    let scored = model.format.scored_reply(&chosen, WINDOW, ROLLING).unwrap();
    let [window] = &scored.windows[..] else {
        panic!("one window: {scored:?}")
    };
    let asked = model
        .format
        .fit(
            &Prompt::conversation(&chosen[..1]),
            PromptTemplate::None,
            WINDOW,
            1,
        )
        .unwrap()
        .0;
    assert_eq!(window.tokens[..window.scored.start], asked[..]);
    assert_eq!(window.scored.end, window.tokens.len());
    let reply = &window.tokens[window.scored.clone()];
    assert_eq!(
        model.decode(reply).unwrap(),
        "The capital of France is Paris."
    );
    let end_of_turn = model.format.token_id("<|im_end|>").unwrap();
    assert_eq!(reply.last(), Some(&end_of_turn));
    let logprob = |messages: &[Message]| -> f32 {
        let scored = model
            .format
            .scored_reply(messages, WINDOW, ROLLING)
            .unwrap();
        first_window_logprob(model, &scored)
    };
    let rejected = conversation("The capital of France is Berlin.");
    let (good, bad) = (logprob(&chosen), logprob(&rejected));
    assert!(good > bad + 1.0, "chosen {good} against rejected {bad}");
    let error = model
        .format
        .scored_reply(&chosen[..1], WINDOW, ROLLING)
        .unwrap_err()
        .to_string();
    assert!(error.contains("ends with a user message"), "{error}");
}

/// The log-probability of a scored text's first window's scored tokens, each scored once.
fn first_window_logprob(model: &GenerateModel, scored: &ScoredText) -> f32 {
    let window = &scored.windows[0];
    let request = score_only("c", window.tokens.clone(), window.scored.start, 0);
    let out = model
        .generate(&[request], StepLimits::new(1, 256), &mut || {})
        .unwrap()
        .remove(0);
    assert_eq!(out.prompt_logprobs.len(), window.scored.len());
    out.prompt_logprobs.iter().map(|t| t.logprob).sum()
}

/// A choice is scored after its context as lm-evaluation-harness scores one: the two
/// tokenised apart, the context's trailing space moved to the choice's front; a context
/// too long for the window loses its start, never the choice; the right answer scores
/// above a wrong one.
#[test]
fn a_choice_is_scored_after_its_context_with_the_context_s_trailing_space() {
    let model = quantised();
    let context = "The capital of France is";
    let scored = |context: &str, choice: &str, limit: usize| {
        model
            .format
            .scored_choice((context, choice), PromptTemplate::None, limit, ROLLING)
            .unwrap()
    };
    let paris = scored(context, " Paris", WINDOW);
    assert_eq!(paris, scored(&format!("{context} "), "Paris", WINDOW));
    let [window] = &paris.windows[..] else {
        panic!("one window: {paris:?}")
    };
    let head = model.format.tokens(context, PromptTemplate::None).unwrap();
    assert_eq!(window.tokens[..window.scored.start], head[..]);
    assert_eq!(window.scored.end, window.tokens.len());
    assert_eq!(
        model.decode(&window.tokens[window.scored.clone()]).unwrap(),
        " Paris"
    );
    assert!(!paris.truncated);
    // A long context in a small window keeps its end (after BOS) and the whole choice.
    let long = format!("{} {context}", "Many words come first here.".repeat(20));
    let limit = head.len() + 4;
    let cut = scored(&long, " Paris", limit);
    assert!(cut.truncated);
    let [window] = &cut.windows[..] else {
        panic!("one window: {cut:?}")
    };
    assert!(window.tokens.len() <= limit);
    let lead = model.format.tokens("", PromptTemplate::None).unwrap();
    assert!(window.tokens.starts_with(&lead));
    let kept = &window.tokens[lead.len()..window.scored.start];
    assert!(
        head.ends_with(&kept[kept.len().saturating_sub(3)..]),
        "the context's end is kept"
    );
    assert_eq!(
        model.decode(&window.tokens[window.scored.clone()]).unwrap(),
        " Paris"
    );
    let berlin = scored(context, " Berlin", WINDOW);
    let right = first_window_logprob(model, &paris);
    let wrong = first_window_logprob(model, &berlin);
    assert!(right > wrong + 1.0, "Paris {right} against Berlin {wrong}");
}

/// On the quantised CPU kernels, a question's choices compute its context once: admitted
/// together, the later choices wait a step and copy the context's positions from the slot
/// that computed them (in flight or finished); a choice whose context a free slot holds
/// goes first and takes that slot, before another question's choice writes over it; one
/// at a time, each takes them from the slot the one before left. Questions after a shared
/// preamble (few-shot examples) compute it once too. Every position that an earlier
/// request's prompt holds is shared, and every choice's scores are the same bits as
/// scored alone.
#[test]
fn a_question_s_choices_compute_its_context_once_on_the_quantised_kernels() {
    let mut model = GenerateModel::load(&gguf_path()).unwrap();
    let profile = std::sync::Arc::new(StepProfile::new(false));
    model.profile_steps(Some(profile.clone()));
    // No two start alike: without a preamble, a question shares nothing with another.
    let questions = [
        "Which city is the capital of France, the country in western Europe whose largest \
         city sits on the Seine?",
        "Name the capital of Germany, the country in central Europe whose largest city sits \
         on the Spree.",
        "Along the Tiber, the river that runs through the capital of Italy, lies which of \
         these cities?",
    ];
    let preamble = "Spain's capital is Madrid, on the Manzanares.\n\nEngland's capital is \
                    London, on the Thames.\n\n";
    for preamble in ["", preamble] {
        let mut requests = Vec::new();
        for (q, question) in questions.iter().enumerate() {
            let context = format!("{preamble}{question} Answer:");
            for (i, choice) in [" Paris", " Berlin", " Madrid", " Rome"].iter().enumerate() {
                let scored = model
                    .format
                    .scored_choice((&context, choice), PromptTemplate::None, WINDOW, ROLLING)
                    .unwrap();
                let window = scored.windows[0].clone();
                let from = window.scored.start;
                assert!(from > 20, "a context of {from} tokens");
                requests.push(score_only(&format!("q{q}c{i}"), window.tokens, from, 0));
            }
        }
        choices_share_what_earlier_prompts_hold(&model, &profile, &requests);
    }
}

/// `requests` scored at once share every position an earlier one's prompt holds (before
/// each one's first scored token), with 12, 3 and 1 slots, and score the same bits alone.
fn choices_share_what_earlier_prompts_hold(
    model: &GenerateModel,
    profile: &StepProfile,
    requests: &[GenerationRequest],
) {
    let held_before = |i: usize| {
        let wanted = &requests[i].prompt[..requests[i].score.unwrap().from - 1];
        let common = |other: &GenerationRequest| {
            let pairs = wanted.iter().zip(&other.prompt);
            pairs.take_while(|(a, b)| a == b).count() as u64
        };
        requests[..i].iter().map(common).max().unwrap_or(0)
    };
    let saved: u64 = (0..requests.len()).map(held_before).sum();
    let scores = |out: &[Generation]| -> Vec<Vec<u32>> {
        let bits = |g: &Generation| -> Vec<u32> {
            g.prompt_logprobs
                .iter()
                .map(|t| t.logprob.to_bits())
                .collect()
        };
        out.iter().map(bits).collect()
    };
    // Alone: each in a call of its own, nothing held from another.
    let before = profile.shared_positions();
    let alone: Vec<Generation> = requests
        .iter()
        .flat_map(|r| {
            let limits = StepLimits::new(1, 256);
            let one = std::slice::from_ref(r);
            model.generate(one, limits, &mut || {}).unwrap()
        })
        .collect();
    assert_eq!(profile.shared_positions(), before);
    // Twelve slots: all at once. Three: a question's first choices computed together, and
    // their slots free together with nine choices waiting for them. One: in turn.
    for slots in [12, 3, 1] {
        let before = profile.shared_positions();
        let out = model
            .generate(requests, StepLimits::new(slots, 256), &mut || {})
            .unwrap();
        assert_eq!(profile.shared_positions() - before, saved, "{slots} slots");
        assert_eq!(scores(&out), scores(&alone), "{slots} slots");
    }
}

/// The default windows: as many as a text takes, each scoring all its tokens but one.
const ROLLING: WindowSettings = WindowSettings {
    stride: None,
    max_windows: None,
    score_first_token: false,
};

/// A window wide enough for the test texts.
const WINDOW: usize = 1024;
