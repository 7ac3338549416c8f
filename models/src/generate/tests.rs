//! Against the real SmolLM2-135M-Instruct GGUF (`scripts/fetch-model.sh
//! smollm2-135m-instruct`, which the test command runs).

use std::path::PathBuf;
use std::sync::OnceLock;

use super::sampling::SamplingParams;
use super::*;

fn smollm2() -> &'static GenerateModel {
    static MODEL: OnceLock<GenerateModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
        GenerateModel::load(&path).unwrap_or_else(|e| {
            panic!(
                "{e}: run scripts/fetch-model.sh smollm2-135m-instruct ({})",
                path.display()
            )
        })
    })
}

pub(super) fn greedy(id: &str, prompt: Vec<u32>, max_new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        id: id.into(),
        prompt,
        max_new_tokens,
        ..GenerationRequest::default()
    }
}

fn chat(text: &str) -> Vec<u32> {
    smollm2().prompt_tokens(text, PromptTemplate::Chat).unwrap()
}

fn run(requests: &[GenerationRequest], limits: StepLimits) -> Vec<Generation> {
    smollm2().generate(requests, limits, &mut || {}).unwrap()
}

#[test]
fn the_gguf_vocabulary_tokenizes_text_and_chat_markers() {
    let model = smollm2();
    let tokens = model
        .prompt_tokens("Hello world, 2024!", PromptTemplate::None)
        .unwrap();
    assert_eq!(model.decode(&tokens).unwrap(), "Hello world, 2024!");
    // Digits are split one by one (the `smollm` pre-tokenizer).
    let digits: Vec<String> = tokens
        .iter()
        .filter_map(|&t| model.format.vocab.token(t))
        .filter(|t| t.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(digits, ["2", "0", "2", "4"]);
    let prompt = chat("Hi");
    let im_start = model
        .format
        .vocab
        .tokenizer
        .token_to_id("<|im_start|>")
        .unwrap();
    assert_eq!(
        prompt[0], im_start,
        "the template's markers are single tokens"
    );
    assert_eq!(prompt.iter().filter(|&&t| t == im_start).count(), 3);
    assert_eq!(
        model.format.vocab.token(model.format.vocab.eos).as_deref(),
        Some("<|im_end|>")
    );
}

#[test]
fn greedy_decoding_answers_a_question() {
    // llama.cpp answers "The capital of France is Paris." on this GGUF (and, to the bare
    // question, "L'Étoile, la Cité, …").
    let question = "Answer in one sentence: What is the capital of France?";
    let out = run(&[greedy("q", chat(question), 24)], StepLimits::new(4, 64));
    assert!(out[0].text.contains("Paris"), "{:?}", out[0].text);
}

#[test]
fn a_batch_decodes_each_prompt_as_it_would_alone() {
    let prompts = [
        "Summarise in one sentence: The city council met on Tuesday to discuss the new park.",
        "What is 12 plus 30?",
        "Write a haiku about the sea.",
        "Name three colours.",
        "Translate to French: good morning",
    ];
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| greedy(&format!("r{i}"), chat(p), 12 + 3 * i))
        .collect();
    // Two slots and a small step budget: prompts join as others leave, prefill is chunked.
    let batched = run(&requests, StepLimits::new(2, 16));
    for (request, together) in requests.iter().zip(&batched) {
        let alone = run(std::slice::from_ref(request), StepLimits::new(1, 512));
        assert_eq!(together.tokens, alone[0].tokens, "{}", request.id);
        assert_eq!(together.prompt_tokens, request.prompt.len());
    }
    assert_eq!(batched[0].finish_reason, FinishReason::Length);
    assert_eq!(batched[0].tokens.len(), 12);
}

/// Groups that come while a batch runs, each at hand only after so many tokens.
struct Staggered {
    at_hand: std::collections::VecDeque<(usize, Vec<GenerationRequest>)>,
    tokens: usize,
    taken: usize,
    events: Vec<String>,
    answers: std::collections::BTreeMap<usize, Vec<Generation>>,
}

impl running::GenerationFeed for Staggered {
    fn next_group(&mut self) -> Option<Vec<GenerationRequest>> {
        let (after, _) = self.at_hand.front()?;
        if *after > self.tokens {
            return None;
        }
        self.events.push(format!("took {}", self.taken));
        self.taken += 1;
        self.at_hand.pop_front().map(|(_, group)| group)
    }

    fn token(&mut self, _group: usize) {
        self.tokens += 1;
    }

    fn finished(&mut self, group: usize, generations: Vec<Generation>) {
        self.events.push(format!("finished {group}"));
        assert!(self.answers.insert(group, generations).is_none());
    }
}

#[test]
fn groups_that_join_a_running_batch_answer_as_each_prompt_alone() {
    let request = |i: usize, prompt: &str| greedy(&format!("r{i}"), chat(prompt), 10 + 2 * i);
    let first = vec![
        request(0, "Write a haiku about the sea."),
        request(1, "What is 12 plus 30?"),
    ];
    let second = vec![
        request(2, "Name three colours."),
        greedy("empty", Vec::new(), 4),
    ];
    let third = vec![request(3, "Translate to French: good morning")];
    let mut feed = Staggered {
        at_hand: [
            (0, first.clone()),
            (3, Vec::new()),
            (5, second.clone()),
            (6, third.clone()),
        ]
        .into(),
        tokens: 0,
        taken: 0,
        events: Vec::new(),
        answers: Default::default(),
    };
    smollm2()
        .generate_fed(StepLimits::new(3, 16), &mut feed)
        .unwrap();
    // The empty group is answered at once; the later ones join before the first ends.
    let order = |event: &str| feed.events.iter().position(|e| e == event).unwrap();
    assert_eq!(feed.answers[&1], Vec::new());
    assert!(order("took 2") < order("finished 0"), "{:?}", feed.events);
    assert!(order("took 3") < order("finished 2"), "{:?}", feed.events);
    assert_eq!(feed.answers.len(), 4);
    for (group, requests) in [(0, &first), (2, &second), (3, &third)] {
        for (request, together) in requests.iter().zip(&feed.answers[&group]) {
            let alone = run(std::slice::from_ref(request), StepLimits::new(1, 512));
            assert_eq!(together, &alone[0], "{}", request.id);
        }
    }
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let mut request = greedy("s", chat("What is the capital of France?"), 24);
    let full = run(std::slice::from_ref(&request), StepLimits::new(1, 256));
    let text = &full[0].text;
    // A stop string from the second half of the greedy text: generation ends before its
    // first occurrence.
    let from = (text.len() / 2..text.len())
        .find(|&i| text.is_char_boundary(i) && text[..i].ends_with(' '))
        .unwrap_or_else(|| panic!("a word boundary in {text:?}"));
    let stop: String = text[from..].chars().take(4).collect();
    let at = text.find(&stop).expect("the stop string is in the text");
    request.stop = vec![stop.clone(), "never in the text".into()];
    let stopped = run(&[request], StepLimits::new(1, 256));
    assert_eq!(stopped[0].finish_reason, FinishReason::Stop, "{stop:?}");
    assert_eq!(stopped[0].text, text[..at]);
    assert!(stopped[0].tokens.len() < full[0].tokens.len());
}

/// The stop check's window (`stop_window`) on SmolLM2's real vocabulary: across a text of
/// words, punctuation, line breaks, accented letters and an emoji (byte-level tokens that
/// split characters), every stop string that first shows with a token is seen in the window.
#[test]
fn the_stop_window_sees_every_stop_string_a_real_vocabulary_makes() {
    let model = smollm2();
    let text = "Zoë's café opened in 1998.\n\nIt serves crème brûlée 🍮 and the \
                best coffee in the city. The end.\n- Ça va? «Très bien» — merci!";
    let tokens = model.prompt_tokens(text, PromptTemplate::None).unwrap();
    let stops: Vec<String> = [
        "\n\n", "é", "🍮", " the", "The end.", "—", "«Très", "ffee in",
    ]
    .map(String::from)
    .into();
    let decode = |t: &[u32]| model.decode(t);
    let mut appeared = 0;
    for n in 1..=tokens.len() {
        let (now, before) = (
            decode(&tokens[..n]).unwrap(),
            decode(&tokens[..n - 1]).unwrap(),
        );
        for stop in &stops {
            if now.contains(stop.as_str()) && !before.contains(stop.as_str()) {
                appeared += 1;
                let newest = model.format().token_text(tokens[n - 1]).unwrap();
                let seen = stop_window::stop_may_end_here(
                    &tokens[..n],
                    std::slice::from_ref(stop),
                    &newest,
                    decode,
                );
                assert!(seen.unwrap(), "{stop:?} after {n} tokens: {now:?}");
            }
        }
    }
    assert_eq!(appeared, stops.len(), "each stop string first shows once");
}

#[test]
fn seeded_sampling_repeats_per_record_whatever_the_batch() {
    let sampled = |id: &str, prompt: &str| GenerationRequest {
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 40,
            seed: 42,
            ..SamplingParams::default()
        },
        ..greedy(id, chat(prompt), 16)
    };
    let a = sampled("a", "Tell me a story about a fox.");
    let b = sampled("b", "Describe a rainy day.");
    let together = run(&[a.clone(), b.clone()], StepLimits::new(2, 64));
    let alone = run(std::slice::from_ref(&b), StepLimits::new(1, 8));
    assert_eq!(together[1].tokens, alone[0].tokens);
    let other_seed = run(
        &[GenerationRequest {
            sampling: SamplingParams {
                seed: 43,
                ..b.sampling.clone()
            },
            ..b
        }],
        StepLimits::new(1, 64),
    );
    assert_ne!(other_seed[0].tokens, alone[0].tokens);
}

/// `min_tokens`, `stop_token_ids` and `ignore_eos` move where a greedy completion ends;
/// the text up to there is the plain completion's.
#[test]
fn min_tokens_stop_token_ids_and_ignore_eos_move_the_end() {
    let prompt = chat("Answer in one word: what colour is the sky?");
    let limits = StepLimits::new(4, 64);
    let plain = run(&[greedy("q", prompt.clone(), 40)], limits).remove(0);
    assert_eq!(plain.finish_reason, FinishReason::Stop, "{plain:?}");
    let ended = plain.tokens.len();
    let at_least = run(
        &[GenerationRequest {
            min_tokens: ended + 3,
            ..greedy("q", prompt.clone(), 40)
        }],
        limits,
    )
    .remove(0);
    assert!(at_least.tokens.len() >= ended + 3, "{at_least:?}");
    assert_eq!(at_least.tokens[..ended], plain.tokens[..]);
    let ignoring = run(
        &[GenerationRequest {
            ignore_eos: true,
            ..greedy("q", prompt.clone(), 12.max(ended + 4))
        }],
        limits,
    )
    .remove(0);
    assert_eq!(ignoring.finish_reason, FinishReason::Length);
    assert_eq!(ignoring.tokens.len(), 12.max(ended + 4));
    assert!(ignoring.tokens.contains(&smollm2().format.vocab.eos));
    // The first token as a stop token: nothing is generated, and the reason is `stop`.
    let first = plain.tokens[0];
    let stopped = run(
        &[GenerationRequest {
            stop_token_ids: vec![first],
            ..greedy("q", prompt, 40)
        }],
        limits,
    )
    .remove(0);
    assert_eq!(
        (stopped.tokens.len(), stopped.finish_reason),
        (0, FinishReason::Stop)
    );
    assert_eq!(stopped.text, "");
}

/// A greedy completion's log-probabilities: each chosen token is the likeliest of its
/// step's, and the logprob of the first is the model's own next-token distribution's.
#[test]
fn greedy_logprobs_name_the_chosen_token_first() {
    let prompt = chat("Name three fruits.");
    let out = run(
        &[GenerationRequest {
            logprobs: Some(3),
            ..greedy("q", prompt.clone(), 8)
        }],
        StepLimits::new(1, 64),
    )
    .remove(0);
    assert_eq!(
        out.logprobs.len(),
        out.tokens.len() + usize::from(out.finish_reason == FinishReason::Stop)
    );
    for (step, token) in out.logprobs.iter().zip(&out.tokens) {
        assert_eq!(step.token, *token);
        assert_eq!(step.top.len(), 3);
        assert_eq!(step.top[0].0, *token);
        assert!(step.logprob <= 0.0 && step.top[0].1 >= step.top[1].1);
    }
    let logits = smollm2().next_token_logits(&prompt).unwrap();
    let expect = sampling::token_logprob(&logits, out.tokens[0], 0).logprob;
    assert!(
        (out.logprobs[0].logprob - expect).abs() < 1e-3,
        "{} vs {expect}",
        out.logprobs[0].logprob
    );
}

/// A repetition penalty changes a greedy completion that repeats itself, and the
/// second completion of a record samples apart from the first.
#[test]
fn penalties_and_choices_change_the_text() {
    let prompt = chat("Write the word 'data' ten times.");
    let limits = StepLimits::new(4, 64);
    let plain = run(&[greedy("q", prompt.clone(), 24)], limits).remove(0);
    let penalised = run(
        &[GenerationRequest {
            sampling: SamplingParams {
                repetition_penalty: 1.5,
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
            ..greedy("q", prompt.clone(), 24)
        }],
        limits,
    )
    .remove(0);
    assert_ne!(plain.tokens, penalised.tokens);
    let sampled = |choice| GenerationRequest {
        choice,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: 5,
            ..SamplingParams::default()
        },
        ..greedy("q", prompt.clone(), 16)
    };
    let out = run(&[sampled(0), sampled(1), sampled(0)], limits);
    assert_ne!(out[0].tokens, out[1].tokens);
    assert_eq!(out[0].tokens, out[2].tokens);
}

/// A JSON schema with enums, an array and a nested object: 100 sampled completions, all
/// 100 parse and hold what the schema asks.
#[test]
fn every_completion_under_a_json_schema_is_valid() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "topics": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
            "entity": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "kind": {"enum": ["person", "place", "thing"]},
                    "mentions": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "kind", "mentions"],
                "additionalProperties": false,
            },
        },
        "required": ["sentiment", "topics", "entity"],
        "additionalProperties": false,
    });
    let grammar = std::sync::Arc::new(grammar::OutputGrammar::JsonSchema(schema));
    let texts = [
        "The new bridge in Lisbon opened to crowds on Sunday.",
        "Shares of the chip maker fell after weak earnings.",
        "A quiet village baker won the national bread prize.",
        "Heavy rain flooded roads across the northern region.",
    ];
    let requests: Vec<GenerationRequest> = (0..100)
        .map(|i| GenerationRequest {
            sampling: SamplingParams {
                temperature: 1.0,
                seed: 9,
                ..SamplingParams::default()
            },
            grammar: Some(grammar.clone()),
            ..greedy(
                &format!("r{i}"),
                chat(&format!(
                    "Describe this news item as JSON with sentiment, topics and entity: {}",
                    texts[i % texts.len()]
                )),
                200,
            )
        })
        .collect();
    let out = run(&requests, StepLimits::new(25, 256));
    let mut valid = 0;
    for generation in &out {
        let value: serde_json::Value = match serde_json::from_str(&generation.text) {
            Ok(value) => value,
            Err(e) => panic!(
                "{e}: {:?} ({:?})",
                generation.text, generation.finish_reason
            ),
        };
        let object = value.as_object().unwrap();
        assert_eq!(object.len(), 3, "{value}");
        assert!(
            ["positive", "negative", "neutral"].contains(&value["sentiment"].as_str().unwrap())
        );
        let topics = value["topics"].as_array().unwrap();
        assert!((1..=3).contains(&topics.len()), "{value}");
        assert!(
            topics
                .iter()
                .all(|t| t.as_str().unwrap().chars().count() <= 16),
            "{value}"
        );
        let entity = value["entity"].as_object().unwrap();
        assert_eq!(entity.len(), 3, "{value}");
        assert!(entity["name"].as_str().unwrap().chars().count() <= 24);
        assert!(["person", "place", "thing"].contains(&entity["kind"].as_str().unwrap()));
        assert!(
            (0..=99).contains(&entity["mentions"].as_i64().unwrap()),
            "{value}"
        );
        assert_eq!(generation.finish_reason, FinishReason::Stop);
        valid += 1;
    }
    assert_eq!(valid, 100);
    // Sampled under the grammar, the completions still differ from record to record.
    let distinct: std::collections::HashSet<&str> = out.iter().map(|g| g.text.as_str()).collect();
    assert!(distinct.len() > 10, "{distinct:?}");
}

/// `count` completions sampled at temperature 1 under `grammar`, each of a news item.
fn sampled_under(grammar: grammar::OutputGrammar, ask: &str, count: usize) -> Vec<Generation> {
    let grammar = std::sync::Arc::new(grammar);
    let texts = [
        "The new bridge in Lisbon opened to crowds on Sunday.",
        "Shares of the chip maker fell after weak earnings.",
        "A quiet village baker won the national bread prize.",
    ];
    let requests: Vec<GenerationRequest> = (0..count)
        .map(|i| GenerationRequest {
            sampling: SamplingParams {
                temperature: 1.0,
                seed: 3,
                ..SamplingParams::default()
            },
            grammar: Some(grammar.clone()),
            ..greedy(
                &format!("r{i}"),
                chat(&format!("{ask}: {}", texts[i % texts.len()])),
                40,
            )
        })
        .collect();
    let out = run(&requests, StepLimits::new(16, 256));
    for generation in &out {
        assert_eq!(
            generation.finish_reason,
            FinishReason::Stop,
            "{:?}",
            generation.text
        );
    }
    out
}

/// A regular expression, a list of choices (quotes, a backslash, a bar, accents: each a
/// literal, none a pattern) and a Lark grammar: every sampled completion is of the form
/// asked, and sampling still varies within it.
#[test]
fn every_completion_under_a_regex_a_choice_or_a_grammar_is_of_its_form() {
    let dates = sampled_under(
        grammar::OutputGrammar::Regex("(19|20)[0-9]{2}-(0[1-9]|1[0-2])".into()),
        "Give a year and month for this news item as YYYY-MM",
        24,
    );
    for date in &dates {
        let text = date.text.as_bytes();
        assert_eq!(text.len(), 7, "{:?}", date.text);
        assert!(matches!(&text[..2], b"19" | b"20"), "{:?}", date.text);
        assert!(text[2..4].iter().all(u8::is_ascii_digit), "{:?}", date.text);
        assert_eq!(text[4], b'-');
        let month: u32 = date.text[5..].parse().unwrap();
        assert!((1..=12).contains(&month), "{:?}", date.text);
    }
    let labels: Vec<String> = [
        "business",
        "a \"local\" story",
        "back\\slash",
        "sport | leisure",
        "café culture",
    ]
    .map(str::to_owned)
    .into();
    let chosen = sampled_under(
        grammar::OutputGrammar::Choice(labels.clone()),
        "Label this news item",
        24,
    );
    for label in &chosen {
        assert!(labels.contains(&label.text), "{:?}", label.text);
    }
    let lark = "start: \"Topic: \" topic \"; score \" /[1-5]/\ntopic: \"economy\" | \"culture\" | \"city\"";
    let rated = sampled_under(
        grammar::OutputGrammar::Lark(lark.into()),
        "Give the topic and a score",
        24,
    );
    for rating in &rated {
        let rest = rating.text.strip_prefix("Topic: ").expect(&rating.text);
        let (topic, score) = rest.split_once("; score ").expect(&rating.text);
        assert!(["economy", "culture", "city"].contains(&topic), "{rest}");
        assert!(["1", "2", "3", "4", "5"].contains(&score), "{rest}");
    }
    for (outputs, at_least) in [(&dates, 4), (&chosen, 2), (&rated, 3)] {
        let distinct: std::collections::HashSet<&str> =
            outputs.iter().map(|g| g.text.as_str()).collect();
        assert!(distinct.len() >= at_least, "{distinct:?}");
    }
}

/// What a job checks before any actor starts: a constraint that fails on every model is
/// refused in words naming what failed; one that compiles passes.
#[test]
fn a_constraint_is_checked_without_a_model() {
    use grammar::OutputGrammar::{Choice, JsonSchema, Lark, Regex};
    for (bad, says) in [
        (
            Regex("(?=a)b".into()),
            "the regular expression cannot be used",
        ),
        (Lark("start: x (".into()), "the grammar cannot be used"),
        (
            JsonSchema(serde_json::json!({"type": "no-such-type"})),
            "the JSON schema cannot be used",
        ),
    ] {
        let error = grammar::check_without_model(&bad).unwrap_err().to_string();
        assert!(error.contains(says), "{error}");
    }
    for good in [
        Regex("[a-z]+ [0-9]{2}".into()),
        Choice(vec!["say \"hi\"".into(), "a\\b".into(), "é|è".into()]),
        Lark("start: \"a\"+".into()),
        JsonSchema(serde_json::json!({"type": "object"})),
    ] {
        grammar::check_without_model(&good).unwrap();
    }
}

#[test]
fn a_schema_the_engine_cannot_compile_is_refused_in_words() {
    let bad = grammar::OutputGrammar::JsonSchema(serde_json::json!({"type": "no-such-type"}));
    let error = smollm2()
        .constraint(&bad)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("JSON schema cannot be used"), "{error}");
}

#[test]
fn a_prompt_as_long_as_the_context_ends_at_once_with_length() {
    let model = smollm2();
    let long = vec![100; model.context()];
    let out = run(&[greedy("long", long, 8)], StepLimits::new(1, 64));
    assert_eq!(out[0].finish_reason, FinishReason::Length);
    assert!(out[0].tokens.is_empty());
}

#[test]
fn a_prompt_too_long_for_the_context_loses_the_middle_of_its_text_only() {
    let model = smollm2();
    let text: String = (0..4000).map(|i| format!("word{i} ")).collect();
    let parts = ("Summarise:\n", text.as_str(), "\nEnd of article.");
    let reserve = model.context() - 500;
    let (tokens, cut) = model
        .fit_prompt(parts, PromptTemplate::Chat, reserve)
        .unwrap();
    assert!(cut);
    assert!(tokens.len() <= 500, "{} tokens", tokens.len());
    let prompt = model.decode(&tokens).unwrap();
    assert!(prompt.contains("Summarise:\nword0 word1"), "{prompt}");
    assert!(prompt.contains("word3999 \nEnd of article."), "{prompt}");
    assert!(prompt.contains(" … "));
    let (short, cut) = model
        .fit_prompt(("Say: ", "hello", ""), PromptTemplate::Chat, 64)
        .unwrap();
    assert!(!cut);
    assert_eq!(short, chat("Say: hello"));
}

/// `prompt` (read with `template`), whose `count` examples `without(n)` gives the tokens of
/// once its `n` oldest are left out: whole where it fits; in a context for 2 examples less
/// it loses exactly its 2 oldest, one token shorter its 3 oldest; and where even its
/// question alone is 20 tokens too many, the question's middle is cut and the instruction
/// ("Answer briefly.") stays. Returns that last prompt, read back.
fn oldest_examples_go_first(
    (prompt, template): (&super::prompt::Prompt, PromptTemplate),
    count: usize,
    without: impl Fn(usize) -> Vec<u32>,
) -> String {
    let model = smollm2();
    let reserve_for = |limit: usize| model.context() - limit;
    let whole = model.fit(prompt, template, 1).unwrap();
    assert_eq!(whole, (without(0), false));
    for (limit, dropped) in [(without(2).len(), 2), (without(2).len() - 1, 3)] {
        let fitted = model.fit(prompt, template, reserve_for(limit));
        assert_eq!(fitted.unwrap(), (without(dropped), true), "{limit} tokens");
    }
    let limit = without(count).len() - 20;
    let (tokens, cut) = model.fit(prompt, template, reserve_for(limit)).unwrap();
    assert!(cut && tokens.len() <= limit, "{}", tokens.len());
    let read = model.decode(&tokens).unwrap();
    assert!(
        read.contains("Answer briefly.") && read.contains(" … "),
        "{read}"
    );
    read
}

/// A conversation of few-shot example turns too long for the context loses its oldest
/// examples whole, as few as it takes, not the middle of a message: the system message,
/// the newest examples and the record's question stay as they are. With none left the
/// question's middle goes; a conversation without examples is cut as before.
#[test]
fn a_conversation_too_long_loses_its_oldest_example_turns_first() {
    use super::chat::Message;
    use super::prompt::Prompt;

    let model = smollm2();
    let words = |count: usize| "word ".repeat(count);
    let mut messages = vec![Message::new("system", "Answer briefly.")];
    for i in 0..6 {
        let asked = format!("Question {i}: {}", words(40));
        messages.push(Message::new("user", &asked));
        messages.push(Message::new("assistant", &format!("Answer {i}")));
    }
    messages.push(Message::new("user", &format!("Question 6: {}", words(80))));
    let with_examples = Prompt::Messages {
        messages: &messages,
        examples: 6,
    };
    let chat = PromptTemplate::Chat;
    // The prompt with its `dropped` oldest examples left out, and its tokens.
    let without = |dropped: usize| {
        let kept: Vec<Message> = (messages[..1].iter())
            .chain(&messages[1 + 2 * dropped..])
            .cloned()
            .collect();
        model.fit(&Prompt::conversation(&kept), chat, 1).unwrap().0
    };
    let read = oldest_examples_go_first((&with_examples, chat), 6, without);
    assert!(
        read.contains("Question 6: word") && !read.contains("Question 5"),
        "{read}"
    );
    let plain = Prompt::conversation(&messages);
    let limit = without(2).len();
    let (tokens, cut) = model.fit(&plain, chat, model.context() - limit).unwrap();
    let read = model.decode(&tokens).unwrap();
    assert!(
        cut && read.contains("Question 0") && read.contains(" … "),
        "{read}"
    );
}

/// A text prompt whose few-shot examples (written as text before the record's) make it too
/// long loses its oldest examples whole, as few as it takes, raw or under the chat
/// template: the description, the newest examples and the record's question stay as they
/// are. With none left the question's middle goes, the description still whole.
#[test]
fn a_text_prompt_too_long_loses_its_oldest_text_examples_first() {
    use super::prompt::Prompt;

    let model = smollm2();
    let words = |count: usize| "word ".repeat(count);
    let description = "Answer briefly.\n\n";
    let examples: Vec<String> = (0..5)
        .map(|i| format!("Q: Question {i}: {}\nA: Answer {i}\n\n", words(30)))
        .collect();
    let mut bounds = vec![description.len() as u32];
    for example in &examples {
        bounds.push(bounds.last().unwrap() + example.len() as u32);
    }
    let before = format!("{description}{}Q: ", examples.concat());
    let question = format!("Question 5: {}", words(60));
    let with_examples = Prompt::Parts {
        system: None,
        before: &before,
        text: &question,
        after: "\nA:",
        reply_start: "",
        examples: &bounds,
    };
    for template in [PromptTemplate::None, PromptTemplate::Chat] {
        // The prompt with its `dropped` oldest examples left out, and its tokens.
        let without = |dropped: usize| {
            let kept = format!("{description}{}Q: ", examples[dropped..].concat());
            (model.fit_prompt((&kept, &question, "\nA:"), template, 1))
                .unwrap()
                .0
        };
        let read = oldest_examples_go_first((&with_examples, template), 5, without);
        assert!(
            read.contains("Q: Question 5: word") && !read.contains("Answer 4"),
            "{read}"
        );
    }
}

/// Without the chat template a system message is text directly before the prompt
/// (lm-evaluation-harness's system instruction without `--apply_chat_template`): the
/// tokens of the whole written out by hand; a prompt too long keeps it whole and cuts the
/// record's text.
#[test]
fn a_system_message_without_the_chat_template_is_text_before_the_prompt() {
    use super::prompt::Prompt;

    let model = smollm2();
    let none = PromptTemplate::None;
    let text = "word ".repeat(200);
    let with_system = Prompt::Parts {
        system: Some("Answer briefly.\n"),
        before: "Q: ",
        text: &text,
        after: "\nA:",
        reply_start: "",
        examples: &[],
    };
    let by_hand = format!("Answer briefly.\nQ: {text}\nA:");
    let whole = model.fit_prompt((&by_hand, "", ""), none, 1).unwrap();
    assert_eq!(model.fit(&with_system, none, 1).unwrap(), whole);
    let limit = 60;
    let (tokens, cut) = (model.fit(&with_system, none, model.context() - limit)).unwrap();
    let read = model.decode(&tokens).unwrap();
    assert!(cut && tokens.len() <= limit, "{} tokens", tokens.len());
    assert!(
        read.contains("Answer briefly.\nQ: word") && read.contains(" … ") && read.ends_with("\nA:"),
        "{read}"
    );
}

/// A reply's start (lm-evaluation-harness's `gen_prefix`) is, under the chat template, the
/// assistant's turn left open for the model to continue (the tokens of that conversation
/// rendered by hand), and without it, text right after the prompt; a cut keeps it whole.
#[test]
fn a_reply_start_is_the_assistant_s_turn_left_open_or_text_after_the_prompt() {
    use super::prompt::Prompt;

    let model = smollm2();
    let text = "word ".repeat(200);
    let started = Prompt::Parts {
        system: Some("Answer briefly."),
        before: "Q: ",
        text: &text,
        after: "\nA:",
        reply_start: "The answer is",
        examples: &[],
    };
    let chat = format!(
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nQ: {text}\nA:<|im_end|>\n\
         <|im_start|>assistant\nThe answer is"
    );
    let raw = format!("Answer briefly.Q: {text}\nA:The answer is");
    for (template, by_hand) in [(PromptTemplate::Chat, chat), (PromptTemplate::None, raw)] {
        let whole = model.fit(&started, template, 1).unwrap();
        let none = PromptTemplate::None;
        assert_eq!(
            whole,
            model.fit_prompt((&by_hand, "", ""), none, 1).unwrap()
        );
        let (tokens, cut) = (model.fit(&started, template, model.context() - 60)).unwrap();
        let read = model.decode(&tokens).unwrap();
        assert!(
            cut && read.contains(" … ") && read.ends_with("The answer is"),
            "{read}"
        );
    }
}

/// The GGUF types our own kernels do not take (K-quants, Q5_0, F16) load through candle's and
/// answer as the Q4_1 file does. The files are SmolLM2 itself, its matrices requantised
/// here: Q4_K where a row is whole 256-value super-blocks (the FFN's down projection) and
/// Q5_0 elsewhere, the mix llama.cpp's Q4_K_M makes of a model this narrow; and all F16.
#[test]
fn k_quant_q5_0_and_f16_files_of_the_model_answer_alike() {
    use candle_core::quantized::{GgmlDType, QTensor, gguf_file};

    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = std::fs::File::open(&source).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let device = candle_core::Device::Cpu;
    let dir = tempfile::tempdir().unwrap();
    let question = "Answer in one sentence: What is the capital of France?";
    for (name, whole_rows, other_rows) in [
        ("q4_k_m", GgmlDType::Q4K, GgmlDType::Q5_0),
        ("f16", GgmlDType::F16, GgmlDType::F16),
    ] {
        let mut tensors = Vec::new();
        for (tensor_name, info) in &content.tensor_infos {
            let tensor = content.tensor(&mut file, tensor_name, &device).unwrap();
            let dims = info.shape.dims().to_vec();
            let matrix = dims.len() == 2 && tensor_name.starts_with("blk.");
            let tensor = if matrix {
                let dtype = if dims[1] % 256 == 0 {
                    whole_rows
                } else {
                    other_rows
                };
                QTensor::quantize(&tensor.dequantize(&device).unwrap(), dtype).unwrap()
            } else {
                tensor
            };
            tensors.push((tensor_name.clone(), tensor));
        }
        let path = dir.path().join(format!("smollm2-{name}.gguf"));
        write_gguf(&path, content.metadata.iter(), &tensors);

        let model = GenerateModel::load(&path).unwrap();
        let prompt = model.prompt_tokens(question, PromptTemplate::Chat).unwrap();
        assert_eq!(prompt, chat(question), "{name}: the same tokenizer");
        let out = model
            .generate(
                &[greedy("q", prompt, 24)],
                StepLimits::new(1, 64),
                &mut || {},
            )
            .unwrap();
        assert!(out[0].text.contains("Paris"), "{name}: {:?}", out[0].text);
    }
}

#[test]
fn a_gguf_whose_metadata_disagrees_with_its_tensors_is_refused_naming_the_tensor() {
    use candle_core::quantized::gguf_file;

    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = std::fs::File::open(&source).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let device = candle_core::Device::Cpu;
    let tensors: Vec<_> = content
        .tensor_infos
        .keys()
        .map(|name| {
            (
                name.clone(),
                content.tensor(&mut file, name, &device).unwrap(),
            )
        })
        .collect();
    // The real feed-forward size is 1536: the metadata now says 1024.
    let mut metadata = content.metadata.clone();
    metadata.insert(
        "llama.feed_forward_length".into(),
        gguf_file::Value::U32(1024),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edited.gguf");
    write_gguf(&path, metadata.iter(), &tensors);
    for dtype in [WeightDtype::Auto, WeightDtype::F32] {
        let error = GenerateModel::load_on(&path, &device, dtype)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            error.contains("ffn_gate.weight` has shape [1536, 576]")
                && error.contains("[1024, 576]")
                && error.contains("disagrees"),
            "{dtype:?}: {error}"
        );
    }
}

/// Writes a GGUF file of `metadata` and `tensors` (the tests' copies of SmolLM2 in other
/// types and layouts).
pub(super) fn write_gguf<'a>(
    path: &std::path::Path,
    metadata: impl Iterator<Item = (&'a String, &'a candle_core::quantized::gguf_file::Value)>,
    tensors: &[(String, candle_core::quantized::QTensor)],
) {
    use candle_core::quantized::{QTensor, gguf_file};
    let metadata: Vec<(&str, &gguf_file::Value)> = metadata.map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
}

#[test]
fn auto_runs_bf16_from_ampere_and_f16_on_older_gpus() {
    assert_eq!(gpu_dtype(Some((7, 5))), DType::F16, "T4");
    assert_eq!(gpu_dtype(Some((7, 0))), DType::F16, "V100");
    assert_eq!(gpu_dtype(Some((8, 6))), DType::BF16, "A10G, A6000");
    assert_eq!(gpu_dtype(Some((9, 0))), DType::BF16, "H100");
    assert_eq!(
        gpu_dtype(None),
        DType::BF16,
        "a capability the driver would not tell"
    );
    assert_eq!(WeightDtype::Auto.dense(&Device::Cpu), Some(DType::F32));
}

/// bf16 asked for on a GPU without candle's bf16 kernels (a T4: cuda-emu with
/// CUDA_EMU_ARCH=75, or the real one) is refused with what to use; the CPU and newer GPUs
/// take it.
#[test]
fn bf16_on_a_gpu_before_ampere_is_refused_with_the_dtype_to_use() {
    for device in crate::generate::device_ops::test_devices() {
        let checked = crate::device::check_dtype(&device, DType::BF16);
        match crate::device::compute_capability(&device) {
            Some((major, minor)) if major < 8 => {
                let error = checked.unwrap_err().to_string();
                assert!(error.contains(&format!("is {major}.{minor}")), "{error}");
                assert!(error.contains("use dtype f16"), "{error}");
            }
            _ => checked.unwrap(),
        }
        for dtype in [DType::F32, DType::F16] {
            crate::device::check_dtype(&device, dtype).unwrap();
        }
    }
}
