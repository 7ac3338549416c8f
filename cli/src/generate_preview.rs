//! `resident generate --dry-run N`: the first N records' prompts as the model will read
//! them (the chat template rendered, the system message in place), each with its token
//! count (with `--score`, what is scored in how many windows; else, where the prompt is
//! too long for the context, what the model reads once it is cut), and nothing run. The
//! model's vocabulary, template and context are read from the model's files alone (a GGUF
//! file's metadata, a safetensors directory's tokenizer and config files), not its weights.

use std::path::{Path, PathBuf};

use anyhow::Context;
use resident_actor::generate::{GenerateParams, PromptParts, Template};
use resident_jobs::corpus_job::GenerateJobConfig;
use resident_jobs::corpus_job::preview_prompts;
use resident_models::generate::PromptTemplate;
use resident_models::generate::prompt::PromptFormat;
use resident_node_agent::backends::generate::{
    chat_messages, context_reading, model_prompt, score_window, scored_choices, scored_text,
};

use crate::exit::BadInput;

pub async fn print_prompts(config: &GenerateJobConfig, count: usize) -> anyhow::Result<()> {
    let model = local_model(&config.corpus.model)?;
    let chat_template = config.generation.engine.chat_template.clone();
    let kwargs = config.generation.engine.chat_template_kwargs.clone();
    let (format, context) = tokio::task::spawn_blocking(move || {
        let mut format = PromptFormat::load(&model)?;
        if let Some(source) = &chat_template {
            format.use_chat_template(source)?;
        }
        if let Some(kwargs) = &kwargs {
            format.use_chat_template_kwargs(kwargs)?;
        }
        Ok::<_, resident_models::ModelError>((format, PromptFormat::model_context(&model)?))
    })
    .await?
    .map_err(|e| BadInput(format!("--dry-run: {e}")))?;
    let (prompts, bad) = preview_prompts(config, count).await?;
    let params = &config.generation.params;
    let template = match params.template {
        Template::Chat => PromptTemplate::Chat,
        Template::None => PromptTemplate::None,
    };
    // The context an actor runs the model with: its own, capped by --max-context.
    let context = config
        .generation
        .engine
        .max_context
        .map_or(context, |cap| context.min(cap as usize));
    let checked = config.generation.answer_match.as_ref();
    let reference_field = checked.and_then(|check| check.spec().reference_field.as_deref());
    for (index, preview) in prompts.iter().enumerate() {
        let prompt = &preview.prompt;
        println!("=== record {} (id {})", index + 1, prompt.id);
        if let Some(field) = reference_field {
            match preview.references.as_slice() {
                [] => println!("=== no reference in `{field}`: generated, not checked"),
                references => println!("=== reference (`{field}`): {references:?}"),
            }
        }
        match rendered(&format, prompt, params, template) {
            Ok((text, tokens)) => {
                if params.choices_as_contexts && !prompt.choices.is_empty() {
                    println!("=== with context 0 in its place, the text scored after it:");
                }
                println!("{text}");
                println!("=== {tokens} prompt tokens");
                match (params.score, prompt.choices.is_empty()) {
                    (true, true) => {
                        println!("=== {}", scored_windows(&format, prompt, params, context))
                    }
                    (true, false) => print_choices(&format, prompt, params, context),
                    (false, _) => print_cut(&format, prompt, params, (template, context)),
                }
            }
            Err(error) => println!("=== refused: {error}"),
        }
    }
    for record in &bad {
        println!(
            "=== bad record {}:{}: {}",
            record.file, record.line, record.reason
        );
    }
    eprintln!(
        "dry run: {} prompts shown, {} bad records met; nothing was run",
        prompts.len(),
        bad.len()
    );
    Ok(())
}

/// The prompt's text as rendered and its token count, or why the actor would refuse it.
fn rendered(
    format: &PromptFormat,
    prompt: &PromptParts,
    params: &GenerateParams,
    template: PromptTemplate,
) -> Result<(String, usize), String> {
    if let Some(error) = &prompt.error {
        return Err(error.clone());
    }
    let params = record_params(prompt, params)?;
    if params.choices_as_contexts && !prompt.choices.is_empty() {
        // The first context in its place, the text after it, as the job's template reads it.
        let text = context_reading(format, prompt, &params, 0)?;
        let tokens = format.tokens(&text, template).map_err(|e| e.to_string())?;
        return Ok((text, tokens.len()));
    }
    let messages = chat_messages(prompt);
    let parts = model_prompt(prompt, &params, &messages);
    let template = parts.template(template);
    let text = match params.score && !messages.is_empty() && prompt.choices.is_empty() {
        // What a scored conversation reads: the turns before the reply, then the reply closed.
        true => format
            .reply_parts(&messages)
            .map(|(asked, reply)| asked + &reply),
        false => format.render(&parts, template, None),
    }
    .map_err(|e| e.to_string())?;
    let tokens = format.tokens(&text, template).map_err(|e| e.to_string())?;
    Ok((text, tokens.len()))
}

/// Said of a scored text that is cut.
const CUT: &str = "; cut: the text is not scored to its end (--max-score-windows), or what \
                   follows it did not fit";

/// Said of a text whose first token has nothing before it.
const FIRST_UNSCORED: &str = "; its first token is context only (--score-first-token scores \
                              it, and gives the text's bits per byte)";

/// What `--score` scores of a record (a text, or a conversation's reply): its tokens scored
/// and the windows they take, or why it cannot be scored.
fn scored_windows(
    format: &PromptFormat,
    prompt: &PromptParts,
    params: &GenerateParams,
    context: usize,
) -> String {
    let scored = match scored_text(format, context, prompt, params) {
        Ok(scored) => scored,
        Err(error) => return format!("refused: {error}"),
    };
    let tokens: usize = scored.windows.iter().map(|w| w.scored.len()).sum();
    let first = &scored.windows[0];
    // A text with nothing before it has its first token unscored.
    let unscored_first = first.scored.start == 0 && !first.scored.is_empty();
    let tokens = tokens - usize::from(unscored_first);
    let what = match prompt.messages.is_empty() {
        true => "the text's",
        false => "the reply's",
    };
    format!(
        "scored: {tokens} of {what} tokens, in {} window(s) of at most {} tokens{}{}",
        scored.windows.len(),
        score_window(context, params),
        match unscored_first {
            true => FIRST_UNSCORED,
            false => "",
        },
        match scored.truncated {
            true => CUT,
            false => "",
        }
    )
}

/// The job's parameters with the record's own over them, or why they cannot run.
fn record_params(prompt: &PromptParts, params: &GenerateParams) -> Result<GenerateParams, String> {
    let params = match &prompt.params {
        Some(over) => params.with(over),
        None => params.clone(),
    };
    match params.problem() {
        Some(problem) => Err(problem.to_string()),
        None => Ok(params),
    }
}

/// Where a generating prompt leaves its new tokens no room in the `context`: what the
/// model reads once it is cut as the actor cuts it (its oldest few-shot examples left out,
/// turns or text, then the middle of the record's text).
fn print_cut(
    format: &PromptFormat,
    prompt: &PromptParts,
    params: &GenerateParams,
    (template, context): (PromptTemplate, usize),
) {
    let Ok(params) = record_params(prompt, params) else {
        return;
    };
    let messages = chat_messages(prompt);
    let parts = model_prompt(prompt, &params, &messages);
    let reserve = params.max_new_tokens.max(1) as usize;
    let fitted = format.fit(&parts, template, context, reserve);
    let cut = fitted
        .and_then(|(tokens, cut)| Ok((format.decode_with_special(&tokens)?, tokens.len(), cut)));
    match cut {
        Ok((_, _, false)) => {}
        Ok((text, tokens, true)) => {
            let how = match parts.example_count() > 0 {
                false => "the middle of the record's text cut",
                true => {
                    "its oldest examples left out first, then the middle of the text where \
                     that is not enough"
                }
            };
            println!(
                "=== too long for the {context}-token context with {reserve} new tokens: the \
                 model reads it cut to {tokens} tokens ({how}):\n{text}\n=== end of the cut \
                 prompt"
            )
        }
        Err(error) => println!("=== refused: {error}"),
    }
}

/// What `--score` scores of a record with choices: each choice, marked when it is the
/// answer, with its tokens scored and windows; or why they cannot be scored.
fn print_choices(
    format: &PromptFormat,
    prompt: &PromptParts,
    params: &GenerateParams,
    context: usize,
) {
    let scored = match scored_choices(format, context, prompt, params) {
        Ok(scored) => scored,
        Err(error) => return println!("=== refused: {error}"),
    };
    // A cut context (oldest examples left out, or its start): what the first choice is
    // scored after.
    let first_window = (scored.first())
        .filter(|scored| scored.truncated && !params.choices_as_contexts)
        .and_then(|scored| scored.windows.first());
    if let Some(window) = first_window {
        let before = &window.tokens[..window.scored.start];
        if let Ok(text) = format.decode_with_special(before) {
            println!(
                "=== cut: the model reads the prompt before the first choice as {} tokens:\n\
                 {text}\n=== end of the cut prompt",
                before.len()
            );
        }
    }
    for (index, (choice, scored)) in prompt.choices.iter().zip(&scored).enumerate() {
        let tokens: usize = scored.windows.iter().map(|w| w.scored.len()).sum();
        let right = prompt.answers.contains(&(index as u32));
        let answer = match (right, prompt.answers.len()) {
            (false, _) => "",
            (true, 1) => " (the answer)",
            (true, _) => " (a right answer)",
        };
        // With choices as contexts, what each scores is the text after it.
        let (what, after) = match params.choices_as_contexts {
            true => ("context", " (the text after it)"),
            false => ("choice", ""),
        };
        println!(
            "=== {what} {index}{answer}: {choice:?}: {tokens} tokens scored{after}, in {} \
             window(s){}",
            scored.windows.len(),
            match scored.truncated {
                true =>
                    "; cut: the prompt lost its oldest examples or its start to fit the \
                     window, or the choice is not scored to its end",
                false => "",
            }
        );
    }
}

/// The model file or directory to read the tokenizer from: `--model` as a local path (a
/// GGUF file, a directory holding one, or a safetensors directory).
fn local_model(model: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(model);
    if !path.exists() {
        return Err(BadInput(format!(
            "--dry-run reads the model's tokenizer from a local path, and {model} is none; \
             give --model as a local GGUF file or directory (fetch a remote one first)"
        ))
        .into());
    }
    if !path.is_dir() || path.join("config.json").is_file() {
        return Ok(path.to_owned());
    }
    let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {model}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(BadInput(format!(
            "{model} holds {} .gguf files and no config.json; name the model file",
            ggufs.len()
        ))
        .into()),
    }
}
