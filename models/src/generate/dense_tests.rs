//! The dense path (`dense.rs`, `checkpoint.rs`) against the real SmolLM2-135M-Instruct GGUF
//! and checkpoints written from it: a Hugging Face safetensors directory and a Qwen2-style
//! GGUF, both the same model in another layout. On the CPU, in f32; the GPU runs this code
//! with bf16 tensors.

use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};

use super::dense::Part;
use super::sampling::SamplingParams;
use super::step_profile::{StepKind, StepProfile};
use super::tests::{greedy, write_gguf};
use super::*;

pub(super) fn gguf_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn dense_f32() -> &'static GenerateModel {
    static MODEL: OnceLock<GenerateModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        GenerateModel::load_on(&gguf_path(), &Device::Cpu, WeightDtype::F32)
            .unwrap_or_else(|e| panic!("{e}: run scripts/fetch-model.sh smollm2-135m-instruct"))
    })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(logits: &[f32]) -> usize {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap()
}

const QUESTION: &str = "Answer in one sentence: What is the capital of France?";

#[test]
fn the_dense_path_answers_as_the_quantised_kernels_do() {
    let dense = dense_f32();
    assert_eq!(dense.engine_name(), "f32 weights on cpu");
    let quantised = GenerateModel::load(&gguf_path()).unwrap();
    assert_eq!(
        quantised.engine_name(),
        "quantised weights on the CPU kernels"
    );
    let prompt = dense.prompt_tokens(QUESTION, PromptTemplate::Chat).unwrap();
    let a = dense.next_token_logits(&prompt).unwrap();
    let b = quantised.next_token_logits(&prompt).unwrap();
    assert_eq!(argmax(&a), argmax(&b));
    // Quantised activations against f32 ones: llama.cpp's own spread is about 1.5.
    assert!(max_abs_diff(&a, &b) < 4.0, "{}", max_abs_diff(&a, &b));
    let out = dense
        .generate(
            &[greedy("q", prompt, 24)],
            StepLimits::new(2, 64),
            &mut || {},
        )
        .unwrap();
    assert!(out[0].text.contains("Paris"), "{:?}", out[0].text);
}

/// Decode rows batched together, prefill per sequence, the cache grown past its first
/// capacity (64) while other slots hold keys: each prompt decodes as it would alone.
#[test]
fn a_dense_batch_decodes_each_prompt_as_it_would_alone() {
    let model = dense_f32();
    let article: String = (0..40).map(|i| format!("Event {i} happened. ")).collect();
    let prompts = [
        "Name three colours.".to_owned(),
        format!("Summarise in one sentence: {article}"),
        "What is 12 plus 30?".to_owned(),
    ];
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tokens = model.prompt_tokens(p, PromptTemplate::Chat).unwrap();
            greedy(&format!("r{i}"), tokens, 40)
        })
        .collect();
    assert!(
        requests[1].prompt.len() > 64,
        "the long prompt grows the cache"
    );
    let batched = model
        .generate(&requests, StepLimits::new(2, 48), &mut || {})
        .unwrap();
    for (request, together) in requests.iter().zip(&batched) {
        let alone = model
            .generate(
                std::slice::from_ref(request),
                StepLimits::new(1, 512),
                &mut || {},
            )
            .unwrap();
        assert_eq!(together.tokens, alone[0].tokens, "{}", request.id);
    }
}

/// A fresh f32 model on the CPU that counts the rows it runs.
fn counting_model() -> (GenerateModel, std::sync::Arc<StepProfile>) {
    let mut model = GenerateModel::load_on(&gguf_path(), &Device::Cpu, WeightDtype::F32).unwrap();
    let profile = std::sync::Arc::new(StepProfile::new(false));
    model.profile_steps(Some(profile.clone()));
    (model, profile)
}

fn rows_run(profile: &StepProfile) -> u64 {
    profile.totals(StepKind::Decode).rows + profile.totals(StepKind::WithPrefill).rows
}

/// Prompts that start alike (a job's instruction before each record): the second and later
/// take the first's computed blocks from the prefix cache and compute only the rest, and
/// answer as they do alone.
#[test]
fn prompts_with_a_shared_start_compute_it_once_and_answer_as_alone() {
    let (model, profile) = counting_model();
    let instruction = "You are a careful assistant. Read the question, think about what is \
                       asked, and answer in one short sentence without any preamble. Question:";
    let requests: Vec<GenerationRequest> = ["What is 12 plus 30?", "Name a colour.", QUESTION]
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let text = format!("{instruction} {q}");
            let tokens = model.prompt_tokens(&text, PromptTemplate::Chat).unwrap();
            greedy(&format!("r{i}"), tokens, 16)
        })
        .collect();
    let shared = (0..requests[0].prompt.len())
        .take_while(|&i| {
            requests
                .iter()
                .all(|r| r.prompt[i] == requests[0].prompt[i])
        })
        .count();
    assert!(
        shared >= 32,
        "the instruction spans two blocks: {shared} tokens"
    );
    // One sequence at a time: each prompt finds the ones before it cached.
    let together = model
        .generate(&requests, StepLimits::new(1, 512), &mut || {})
        .unwrap();
    let rows_together = rows_run(&profile);
    let mut rows_alone = 0;
    for (request, answer) in requests.iter().zip(&together) {
        // Alone: nothing cached by the calls before.
        model.forget_cached_prefixes();
        let before = rows_run(&profile);
        let alone = model
            .generate(
                std::slice::from_ref(request),
                StepLimits::new(1, 512),
                &mut || {},
            )
            .unwrap();
        rows_alone += rows_run(&profile) - before;
        assert_eq!(answer.tokens, alone[0].tokens, "{}", request.id);
    }
    let saved = (shared / kv_blocks::BLOCK_SIZE * kv_blocks::BLOCK_SIZE) as u64 * 2;
    assert_eq!(
        rows_together,
        rows_alone - saved,
        "the two later prompts skip the shared blocks"
    );
    assert_eq!(profile.shared_positions(), saved);
    // Admitted together (three slots): the later two wait a step for the first to compute
    // the blocks they share, then take them, as one at a time does.
    model.forget_cached_prefixes();
    let (before, shared_before) = (rows_run(&profile), profile.shared_positions());
    let at_once = model
        .generate(&requests, StepLimits::new(3, 512), &mut || {})
        .unwrap();
    assert_eq!(
        rows_run(&profile) - before,
        rows_together,
        "{}",
        profile.table()
    );
    assert_eq!(profile.shared_positions() - shared_before, saved);
    for (answer, alone) in at_once.iter().zip(&together) {
        assert_eq!(answer.tokens, alone.tokens, "{}", answer.text);
    }
}

/// The paged cache outlives a `generate` call: a later call's prompts take the blocks an
/// earlier call computed (the next chunk of a job, with the same instruction), and answer
/// as with nothing cached; forgetting the cache computes them again.
#[test]
fn a_later_call_takes_the_prefix_an_earlier_call_computed() {
    let (model, profile) = counting_model();
    let instruction = "You are a careful assistant. Read the question, think about what is \
                       asked, and answer in one short sentence without any preamble. Question:";
    let request = |i: usize, question: &str| {
        let text = format!("{instruction} {question}");
        greedy(
            &format!("r{i}"),
            model.prompt_tokens(&text, PromptTemplate::Chat).unwrap(),
            12,
        )
    };
    let (first, second) = (request(0, "Name a colour."), request(1, QUESTION));
    let shared = (0..first.prompt.len())
        .take_while(|&i| first.prompt[i] == second.prompt[i])
        .count();
    let saved = (shared / kv_blocks::BLOCK_SIZE * kv_blocks::BLOCK_SIZE) as u64;
    assert!(saved >= 32, "{shared} shared tokens");
    let limits = StepLimits::new(2, 512);
    let run = |request: &GenerationRequest| {
        let before = rows_run(&profile);
        let out = model
            .generate(std::slice::from_ref(request), limits, &mut || {})
            .unwrap()
            .remove(0);
        (out.tokens, rows_run(&profile) - before)
    };
    run(&first);
    let (cached_tokens, cached_rows) = run(&second);
    model.forget_cached_prefixes();
    let (fresh_tokens, fresh_rows) = run(&second);
    assert_eq!(cached_tokens, fresh_tokens);
    assert_eq!(cached_rows, fresh_rows - saved, "{}", profile.table());
    // A call with other limits starts from an empty cache.
    run(&first);
    let before = rows_run(&profile);
    model
        .generate(
            std::slice::from_ref(&second),
            StepLimits::new(1, 512),
            &mut || {},
        )
        .unwrap();
    assert_eq!(rows_run(&profile) - before, fresh_rows);
}

/// A KV pool too small for every sequence at once: sequences wait for blocks, the newest
/// is preempted when the running ones need more and computed again later, and every answer
/// is the one a roomy cache gives.
#[test]
fn a_small_kv_pool_preempts_and_recomputes_with_the_same_answers() {
    let (model, profile) = counting_model();
    let requests: Vec<GenerationRequest> = (0..4)
        .map(|i| {
            let text = format!("Count from {} to {} in words.", i * 10, i * 10 + 30);
            let tokens = model.prompt_tokens(&text, PromptTemplate::Chat).unwrap();
            let mut request = greedy(&format!("r{i}"), tokens, 48);
            request.ignore_eos = true;
            request
        })
        .collect();
    let need = requests[0].prompt.len() + 48;
    let roomy = model
        .generate(&requests, StepLimits::new(4, 64), &mut || {})
        .unwrap();
    assert_eq!(profile.preemptions(), 0);
    // Room for two and a half sequences' whole length.
    let blocks = need.div_ceil(kv_blocks::BLOCK_SIZE) * 5 / 2;
    let tight = model
        .generate(
            &requests,
            StepLimits::new(4, 64).with_kv_blocks(blocks),
            &mut || {},
        )
        .unwrap();
    assert!(profile.preemptions() > 0, "{}", profile.table());
    for (a, b) in roomy.iter().zip(&tight) {
        assert_eq!(a.tokens, b.tokens, "{}", profile.table());
        assert_eq!(a.tokens.len(), 48);
    }
    // One sequence that cannot fit even alone is out of memory, said in words.
    let error = model
        .generate(
            &requests[..1],
            StepLimits::new(1, 64).with_kv_blocks(2),
            &mut || {},
        )
        .unwrap_err();
    assert!(matches!(error, ModelError::OutOfMemory(_)), "{error}");
    assert!(error.to_string().contains("no free block"), "{error}");
}

/// Plain greedy rows take their argmax where the logits are (`Pick::Greedy`); rows that
/// ask for logprobs take it there too and list their logprobs there (`Pick::Listed`). Both
/// give the same tokens, in one batch where the two kinds mix, and the listed logprobs are
/// the host's from the same logits.
#[test]
fn greedy_rows_on_the_device_choose_what_the_host_sampler_chooses() {
    engine_picks_match_the_host(SamplingParams::default());
}

/// Sampled rows are drawn where the logits are (`Pick::Draw`, `draw::sample_rows`) from the
/// uniform number the host's sampler would have used: the same tokens as the host's draws.
#[test]
fn sampled_rows_on_the_device_draw_what_the_host_sampler_draws() {
    engine_picks_match_the_host(SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 40,
        seed: 5,
        ..SamplingParams::default()
    });
}

fn engine_picks_match_the_host(sampling: SamplingParams) {
    let model = dense_f32();
    let prompts = ["Name three colours.", QUESTION, "What is 12 plus 30?"];
    let plain: Vec<GenerationRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tokens = model.prompt_tokens(p, PromptTemplate::Chat).unwrap();
            GenerationRequest {
                sampling: sampling.clone(),
                ..greedy(&format!("r{i}"), tokens, 24)
            }
        })
        .collect();
    // The middle request wants logprobs: its rows list them where the logits are.
    let mut mixed = plain.clone();
    mixed[1].logprobs = Some(3);
    let a = model
        .generate(&plain, StepLimits::new(3, 64), &mut || {})
        .unwrap();
    let b = model
        .generate(&mixed, StepLimits::new(3, 64), &mut || {})
        .unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.tokens, y.tokens);
        assert_eq!(x.text, y.text);
    }
    assert!(a[1].logprobs.is_empty());
    // One per token, the ending end token included.
    let (tokens, logprobs) = (b[1].tokens.len(), b[1].logprobs.len());
    assert!(
        logprobs == tokens || logprobs == tokens + 1,
        "{logprobs} for {tokens}"
    );
    // The first steps' listings against the host's, from each step's logits alone.
    let mut context = mixed[1].prompt.clone();
    for (step, &token) in b[1].logprobs.iter().zip(&b[1].tokens).take(4) {
        let logits = model.next_token_logits(&context).unwrap();
        let host = sampling::token_logprob(&logits, token, 3);
        assert_eq!(step.token, token);
        assert!(
            (step.logprob - host.logprob).abs() < 1e-3,
            "{step:?} {host:?}"
        );
        let ids = |l: &sampling::TokenLogprob| l.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(step), ids(&host));
        context.push(token);
    }
}

#[test]
fn a_safetensors_checkpoint_of_the_model_gives_the_gguf_logits() {
    let dir = tempfile::tempdir().unwrap();
    export::export_hf_checkpoint(&gguf_path(), dir.path(), true).unwrap();
    let hf = GenerateModel::load_on(dir.path(), &Device::Cpu, WeightDtype::Auto).unwrap();
    assert_eq!(hf.engine_name(), "f32 weights on cpu");
    let gguf = dense_f32();
    let prompt = gguf.prompt_tokens(QUESTION, PromptTemplate::Chat).unwrap();
    assert_eq!(
        hf.prompt_tokens(QUESTION, PromptTemplate::Chat).unwrap(),
        prompt,
        "tokenizer.json and the chat template of tokenizer_config.json"
    );
    let diff = max_abs_diff(
        &hf.next_token_logits(&prompt).unwrap(),
        &gguf.next_token_logits(&prompt).unwrap(),
    );
    assert!(diff < 2e-3, "halves RoPE on unpermuted rows: {diff}");
    let refused = GenerateModel::load_on(dir.path(), &Device::Cpu, WeightDtype::Quantised);
    let message = refused.err().expect("not quantised").to_string();
    assert!(message.contains("use dtype f32, f16 or bf16"), "{message}");
}

/// A Qwen2 GGUF: its architecture's metadata keys, RoPE in halves, attention biases.
#[test]
fn a_qwen2_gguf_loads_on_the_dense_path_with_its_biases() {
    let mut file = std::fs::File::open(gguf_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "general.architecture" => (k.clone(), gguf_file::Value::String("qwen2".into())),
            _ => (k.replacen("llama.", "qwen2.", 1), v.clone()),
        })
        .collect();
    let config = dense_f32().config().clone();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for (part, layer, tensor) in export::halves_layout_tensors(&gguf_path(), &config).unwrap() {
        let name = part.gguf_name(layer.unwrap_or(0));
        tensors.push((name, QTensor::quantize(&tensor, GgmlDType::F32).unwrap()));
    }
    for layer in 0..config.layers {
        for (part, width) in [
            (Part::QBias, config.heads * config.head_dim),
            (Part::KBias, config.kv_dim()),
            (Part::VBias, config.kv_dim()),
        ] {
            let zeros = Tensor::zeros(width, DType::F32, &Device::Cpu).unwrap();
            let bias = QTensor::quantize(&zeros, GgmlDType::F32).unwrap();
            tensors.push((part.gguf_name(layer), bias));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen2-layout.gguf");
    write_gguf(&path, metadata.iter().map(|(k, v)| (k, v)), &tensors);

    let qwen = GenerateModel::load(&path).unwrap();
    assert_eq!(
        qwen.engine_name(),
        "f32 weights on cpu",
        "not our llama kernels"
    );
    assert_eq!(qwen.config().rope, decoder::RopeStyle::Halves);
    let prompt = qwen.prompt_tokens(QUESTION, PromptTemplate::Chat).unwrap();
    let diff = max_abs_diff(
        &qwen.next_token_logits(&prompt).unwrap(),
        &dense_f32().next_token_logits(&prompt).unwrap(),
    );
    assert!(diff < 2e-3, "{diff}");
}

/// SmolLM2's GGUF on the dense path with its Q4_1 blocks kept as they are (the GPU's
/// `--dtype quantised`), on the CPU.
fn dense_keeping_quantised_blocks() -> GenerateModel {
    let mut file = std::fs::File::open(gguf_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let config = LlamaConfig::from_metadata(&content.metadata).unwrap();
    let vocab = Vocab::from_metadata(&content.metadata).unwrap();
    let mut weights = checkpoint::GgufWeights {
        content: &content,
        file: &mut file,
        device: &Device::Cpu,
        dtype: DType::F32,
        keep_quantised: true,
    };
    let model = dense::build(config, &mut weights, Device::Cpu, DType::F32).unwrap();
    GenerateModel::with_vocab(Engine::Dense(model), vocab).unwrap()
}

/// The GPU's quantised option: candle's quantised matmul over the file's blocks, on the
/// dense path's attention and cache.
#[test]
fn quantised_blocks_run_on_the_dense_path() {
    let model = dense_keeping_quantised_blocks();
    assert_eq!(model.engine_name(), "quantised weights on cpu");
    let prompt = model.prompt_tokens(QUESTION, PromptTemplate::Chat).unwrap();
    let out = model
        .generate(
            &[greedy("q", prompt, 24)],
            StepLimits::new(1, 64),
            &mut || {},
        )
        .unwrap();
    assert!(out[0].text.contains("Paris"), "{:?}", out[0].text);
}

/// What the weights hold on the device, which a GPU actor's memory plan subtracts from its
/// share: SmolLM2-135M's 134.5 million parameters at 4 bytes in f32 (the tied LM head
/// counted once), and the Q4_1 blocks kept quantised on the dense path in far less.
#[test]
fn the_weights_bytes_are_the_parameters_at_their_dtype() {
    let dense = dense_f32();
    let c = dense.config();
    let (hidden, kv_dim) = (c.hidden as u64, c.kv_dim() as u64);
    let q_dim = (c.heads * c.head_dim) as u64;
    let per_layer = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * c.ffn as u64;
    let params = c.layers as u64 * (per_layer + 2 * hidden) + c.vocab as u64 * hidden + hidden;
    assert_eq!(params, 134_515_008, "SmolLM2-135M's parameters, tied");
    assert_eq!(dense.weight_bytes(), 4 * params);
    let bytes = dense_keeping_quantised_blocks().weight_bytes();
    assert!(bytes < dense.weight_bytes() / 2, "{bytes}");
    assert_eq!(GenerateModel::load(&gguf_path()).unwrap().weight_bytes(), 0);
}
