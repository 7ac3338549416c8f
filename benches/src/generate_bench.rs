//! Generation throughput of the `generate` engine in process, by batch size: summarisation
//! prompts (a Wikipedia article of news length in a chat turn), greedy, a fixed number of
//! new tokens. Prints a markdown table.
//! `cargo run --release -p resident-bench --bin generate-bench -- --prompts 64 --batches 1,8,32`

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;

use clap::Parser;
use resident_models::device::select_device;
use resident_models::generate::batcher::StepLimits;
use resident_models::generate::export::export_hf_checkpoint;
use resident_models::generate::grammar::OutputGrammar;
use resident_models::generate::step_profile::StepProfile;
use resident_models::generate::{
    AttentionKernel, GenerateModel, GenerationRequest, PromptTemplate, WeightDtype,
};

mod random_checkpoint;

use random_checkpoint::DecoderShape;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[arg(
        long,
        default_value = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    model: PathBuf,
    /// JSONL with a `text` field.
    #[arg(long, default_value = "data/wiki_long.jsonl")]
    data: PathBuf,
    #[arg(long, default_value_t = 64)]
    prompts: usize,
    /// Articles are cut to this many characters (news length: about 600 tokens).
    #[arg(long, default_value_t = 2600)]
    article_chars: usize,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Every sequence runs to `--max-new-tokens`, past the end token (vLLM's `ignore_eos`),
    /// so decoding modes compare at equal work (a grammar still ends its document).
    #[arg(long)]
    ignore_eos: bool,
    /// Stop strings every prompt carries (repeat the flag for more): what looking for them
    /// costs the host each step (the profile's "sampling, stops, bookkeeping").
    #[arg(long)]
    stop: Vec<String>,
    /// Sequences in flight, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    batches: Vec<usize>,
    /// Rows in one forward step (decode plus prefill): each timed at every batch size (the
    /// first for the profiles, `--dump` and `--agreement`).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    step_tokens: Vec<usize>,
    /// Instead of timing: write each prompt's tokens, its greedy tokens (`--max-new-tokens`,
    /// batched as `--batches`' first) and its first step's logits to this JSONL file, for
    /// `benches/generate_agreement.py` to compare with llama.cpp.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Instead of timing: write each prompt's tokens (`{"id", "prompt"}` per line) to this
    /// JSONL file, for `benches/generate_llama_cpp.py` to time llama.cpp on the same tokens.
    #[arg(long)]
    prompts_out: Option<PathBuf>,
    /// Instead of timing: write the GGUF model as a Hugging Face checkpoint directory here
    /// (config, tokenizer.json, tokenizer_config.json; the weights with `--export-weights`),
    /// for `transformers` to load, or to fill with random weights of its shape.
    #[arg(long)]
    export_hf: Option<PathBuf>,
    #[arg(long)]
    export_weights: bool,
    /// Instead of timing: write a Hugging Face checkpoint of this decoder shape with random
    /// weights (bf16, made on `--gpu` where given) into `--out`, with the tokenizer file
    /// `--tokenizer` (Qwen's): issue 42's 0.5B-class rows in `benches/gpu-bench.sh`.
    #[arg(long, value_enum, requires_all = ["tokenizer", "out"])]
    random_checkpoint: Option<DecoderShape>,
    /// The `tokenizer.json` of `--random-checkpoint`.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Where `--random-checkpoint` writes.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run on this CUDA device (a `cuda` build); the CPU when absent.
    #[arg(long)]
    gpu: Option<u32>,
    /// The weights' precision: auto, quantised, f32, f16, bf16 (as the actor's `dtype`).
    #[arg(long)]
    dtype: Option<String>,
    /// Decoding modes, each timed at every batch size: `plain` (greedy), `sampled`
    /// (temperature 0.8, top-k 50, top-p 0.95, seed 1: drawn on the device by a GPU),
    /// `penalties` (greedy under repetition 1.1, presence 0.5 and frequency 0.5 penalties),
    /// `schema` (greedy under a JSON schema of a summary with keywords, through llguidance),
    /// `regex` (greedy under a regex of free text: `--guided-regex`), `grammar` (greedy
    /// under a Lark grammar of sentences: `--guided-grammar`), `logprobs` (greedy, each token's log-probability with the 5 likeliest: listed on the
    /// device by a GPU).
    #[arg(long, value_delimiter = ',', default_value = "plain")]
    decoding: Vec<String>,
    /// After the timed runs, run each batch size once more with the step profile on and print
    /// where a step's time goes (host preparation, each kernel family, the logits' copy,
    /// sampling), decode-only steps apart from steps that prefill. On a GPU the device is
    /// synchronised at every phase boundary, so the profiled run is a little slower.
    #[arg(long)]
    profile: bool,
    /// Instead of timing: the correctness check of the GPU path on the first N prompts
    /// (`--gpu` and a safetensors checkpoint): greedy tokens of the GPU in f32 against the
    /// CPU dense path in f32 (first 16 tokens), and the first step's logits of bf16 and of
    /// the GPU f32 against the CPU f32 (max abs difference).
    #[arg(long)]
    agreement: Option<usize>,
    /// CUDA graphs for decode steps (a `cuda` build on a GPU): `on`, `off`, or both
    /// (`on,off`), each timed at every batch size; the profiles (`--profile`) run with the
    /// first. Every timed run starts from an empty KV cache (no prefix an earlier row
    /// computed, no graph an earlier row captured).
    #[arg(long, value_delimiter = ',', default_value = "on")]
    cuda_graphs: Vec<Switch>,
    /// The GPU attention kernel (the dense engine on a GPU): `auto` (tensor cores where
    /// they take the model's dtype and head size), `tensor-cores`, `scalar`, or several
    /// (`tensor-cores,scalar`), each timed at every batch size; the profiles run with the
    /// first.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    attention: Vec<AttentionChoice>,
}

/// `--attention`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AttentionChoice {
    Auto,
    TensorCores,
    Scalar,
}

/// `--cuda-graphs`' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Switch {
    On,
    Off,
}

/// The schema of `--decoding schema`: long enough that completions run to their limit.
fn summary_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "summary": {"type": "string", "maxLength": 1200},
            "keywords": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 12},
            "tone": {"enum": ["neutral", "positive", "negative"]},
        },
        "required": ["summary", "keywords", "tone"],
        "additionalProperties": false,
    })
}

/// `requests` decoded as `mode` says.
fn with_decoding(
    requests: &[GenerationRequest],
    mode: &str,
) -> anyhow::Result<Vec<GenerationRequest>> {
    let grammar = std::sync::Arc::new(OutputGrammar::JsonSchema(summary_schema()));
    // Free text of sentences, long enough to run to the limit: the lexer's own cost per
    // token (a regex) and an Earley parse's over it (a Lark grammar).
    let regex = std::sync::Arc::new(OutputGrammar::Regex("[A-Za-z0-9 ,.'-]+".into()));
    let lark = std::sync::Arc::new(OutputGrammar::Lark(
        "start: sentence (\" \" sentence)*\nsentence: /[A-Z][A-Za-z0-9 ,'-]*[.!?]/".into(),
    ));
    requests
        .iter()
        .map(|request| {
            let mut request = request.clone();
            match mode {
                "plain" => {}
                "sampled" => {
                    request.sampling.temperature = 0.8;
                    request.sampling.top_k = 50;
                    request.sampling.top_p = 0.95;
                    request.sampling.seed = 1;
                }
                "penalties" => {
                    request.sampling.repetition_penalty = 1.1;
                    request.sampling.presence_penalty = 0.5;
                    request.sampling.frequency_penalty = 0.5;
                }
                "schema" => request.grammar = Some(grammar.clone()),
                "regex" => request.grammar = Some(regex.clone()),
                "grammar" => request.grammar = Some(lark.clone()),
                "logprobs" => request.logprobs = Some(5),
                other => anyhow::bail!(
                    "--decoding {other}: use plain, sampled, penalties, schema, regex, grammar \
                     or logprobs"
                ),
            }
            Ok(request)
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.export_hf {
        export_hf_checkpoint(&args.model, dir, args.export_weights)?;
        println!("wrote {}", dir.display());
        return Ok(());
    }
    let started = Instant::now();
    let device = select_device(args.gpu)?;
    if let (Some(shape), Some(tokenizer), Some(out)) =
        (args.random_checkpoint, &args.tokenizer, &args.out)
    {
        let parameters = random_checkpoint::write(shape, tokenizer, out, &device)?;
        println!(
            "wrote {shape:?} with {:.1}M random parameters to {} in {:.1} s",
            parameters as f64 / 1e6,
            out.display(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let mut model = GenerateModel::load_on(
        &args.model,
        &device,
        WeightDtype::parse(args.dtype.as_deref())?,
    )?;
    let load = started.elapsed();
    let requests = summary_requests(&model, &args)?;
    if let Some(path) = &args.prompts_out {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for request in &requests {
            let line = serde_json::json!({"id": request.id, "prompt": request.prompt});
            std::io::Write::write_all(&mut file, format!("{line}\n").as_bytes())?;
        }
        println!("wrote {} prompts to {}", requests.len(), path.display());
        return Ok(());
    }
    if let Some(dump) = &args.dump {
        return write_dump(&model, &requests, &args, dump);
    }
    if let Some(count) = args.agreement {
        drop(model);
        return agreement(&args, &requests[..count.min(requests.len())]);
    }
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt.len()).sum();
    println!(
        "{} prompts, {prompt_tokens} prompt tokens, up to {} new tokens each; {}; model loaded in {:.2} s",
        requests.len(),
        args.max_new_tokens,
        model.engine_name(),
        load.as_secs_f64()
    );
    println!();
    if args.decoding.iter().any(|mode| mode == "schema") {
        // The grammar engine is built once per model, on first use: timed apart.
        let began = Instant::now();
        model.constraint(&OutputGrammar::JsonSchema(summary_schema()))?;
        println!(
            "grammar engine built and the schema compiled in {:.2} s",
            began.elapsed().as_secs_f64()
        );
    }
    print_throughput(&mut model, &requests, &args, prompt_tokens)?;
    if args.profile {
        print_profiles(&mut model, &requests, &args)?;
    }
    Ok(())
}

/// A summary request for each of the data's first `--prompts` articles, cut to
/// `--article-chars`, in the model's chat template.
fn summary_requests(model: &GenerateModel, args: &Args) -> anyhow::Result<Vec<GenerationRequest>> {
    let file = std::io::BufReader::new(std::fs::File::open(&args.data)?);
    let mut requests = Vec::new();
    for (i, line) in file.lines().take(args.prompts).enumerate() {
        let record: serde_json::Value = serde_json::from_str(&line?)?;
        let text: String = record["text"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(args.article_chars)
            .collect();
        let prompt = format!("Summarise this article in three sentences.\n\n{text}");
        requests.push(GenerationRequest {
            id: i.to_string(),
            prompt: model.prompt_tokens(&prompt, PromptTemplate::Chat)?,
            max_new_tokens: args.max_new_tokens,
            ignore_eos: args.ignore_eos,
            stop: args.stop.clone(),
            ..GenerationRequest::default()
        });
    }
    Ok(requests)
}

/// The throughput table: one row per decoding mode and batch size.
fn print_throughput(
    model: &mut GenerateModel,
    requests: &[GenerationRequest],
    args: &Args,
    prompt_tokens: usize,
) -> anyhow::Result<()> {
    println!();
    println!(
        "| decoding | CUDA graphs | attention | sequences in flight | rows a step | generated tokens | wall s | generated tokens/s | prompt + generated tokens/s | graphs captured / decode steps replayed |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let runs = args.batches.iter().flat_map(|&batch| {
        args.step_tokens.iter().flat_map(move |&step_tokens| {
            args.cuda_graphs.iter().flat_map(move |&graphs| {
                args.attention.iter().flat_map(move |&attention| {
                    args.decoding.iter().map(move |mode| Run {
                        mode,
                        batch,
                        step_tokens,
                        graphs,
                        attention,
                    })
                })
            })
        })
    });
    for run in runs {
        let (generated, wall) = timed_run(model, requests, &run)?;
        let counts = match model.decode_graph_counts() {
            Some(c) if c.captures > 0 => format!("{} / {}", c.captures, c.replays),
            _ => "-".to_owned(),
        };
        println!(
            "| {} | {:?} | {} | {} | {} | {generated} | {wall:.1} | {:.1} | {:.1} | {counts} |",
            run.mode,
            run.graphs,
            attention_name(model),
            run.batch,
            run.step_tokens,
            generated as f64 / wall,
            (generated + prompt_tokens) as f64 / wall
        );
    }
    Ok(())
}

/// A step profile per decoding mode and batch size (`--profile`).
fn print_profiles(
    model: &mut GenerateModel,
    requests: &[GenerationRequest],
    args: &Args,
) -> anyhow::Result<()> {
    for &batch in &args.batches {
        for mode in &args.decoding {
            let profile = Arc::new(StepProfile::new(true));
            model.profile_steps(Some(profile.clone()));
            let graphs = args.cuda_graphs.first().copied().unwrap_or(Switch::On);
            let run = Run {
                mode,
                batch,
                step_tokens: args.step_tokens[0],
                graphs,
                attention: args.attention[0],
            };
            let (generated, wall) = timed_run(model, requests, &run)?;
            println!();
            println!(
                "Step profile: {mode}, {batch} sequences in flight, CUDA graphs {graphs:?}, {}; profiled run {wall:.1} s, {:.1} generated tokens/s (synchronised at every phase)",
                model.engine_name(),
                generated as f64 / wall
            );
            println!();
            print!("{}", profile.table());
        }
    }
    model.profile_steps(None);
    Ok(())
}

/// Runs `requests` as `run` says, from an empty KV cache: the tokens generated and the wall
/// seconds.
fn timed_run(
    model: &mut GenerateModel,
    requests: &[GenerationRequest],
    run: &Run,
) -> anyhow::Result<(usize, f64)> {
    let requests = with_decoding(requests, run.mode)?;
    model.use_decode_graphs(run.graphs == Switch::On);
    use_attention(model, run.attention)?;
    model.forget_cached_prefixes();
    let began = Instant::now();
    let limits = StepLimits::new(run.batch, run.step_tokens);
    let out = model.generate(&requests, limits, &mut || {})?;
    let wall = began.elapsed().as_secs_f64();
    Ok((out.iter().map(|g| g.tokens.len()).sum(), wall))
}

/// One timed run's settings.
struct Run<'a> {
    /// The decoding mode (`--decoding`).
    mode: &'a str,
    /// Sequences in flight.
    batch: usize,
    /// Rows a step.
    step_tokens: usize,
    /// CUDA graphs for decode steps.
    graphs: Switch,
    /// The GPU attention kernel.
    attention: AttentionChoice,
}

/// Sets the model's attention kernel as `choice` says (`auto`: the model's default; on the
/// CPU, nothing).
fn use_attention(model: &mut GenerateModel, choice: AttentionChoice) -> anyhow::Result<()> {
    let kernel = match choice {
        AttentionChoice::Auto => None,
        AttentionChoice::TensorCores => Some(AttentionKernel::TensorCores),
        AttentionChoice::Scalar => Some(AttentionKernel::Scalar),
    };
    Ok(model.use_attention_kernel(kernel)?)
}

/// The attention column: the kernel a GPU run used, `-` where none runs.
fn attention_name(model: &GenerateModel) -> &'static str {
    match model.attention_kernel() {
        Some(AttentionKernel::TensorCores) => "tensor cores",
        Some(AttentionKernel::Scalar) => "scalar",
        None => "-",
    }
}

/// Greedy tokens and first-step logits of `requests` on one engine.
struct Reference {
    label: String,
    greedy: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
}

fn reference(
    args: &Args,
    device: &Device,
    dtype: WeightDtype,
    requests: &[GenerationRequest],
) -> anyhow::Result<Reference> {
    let began = Instant::now();
    let model = GenerateModel::load_on(&args.model, device, dtype)?;
    let batch = args.batches.iter().copied().max().unwrap_or(1);
    let out = model.generate(
        requests,
        StepLimits::new(batch, args.step_tokens[0]),
        &mut || {},
    )?;
    let logits = requests
        .iter()
        .map(|r| model.next_token_logits(&r.prompt))
        .collect::<Result<Vec<_>, _>>()?;
    let label = model.engine_name();
    eprintln!("{label}: {:.1} s", began.elapsed().as_secs_f64());
    Ok(Reference {
        label,
        greedy: out.into_iter().map(|g| g.tokens).collect(),
        logits,
    })
}

/// The largest difference between two engines' first-step logits, over every prompt.
fn max_logit_difference(a: &Reference, b: &Reference) -> f32 {
    a.logits
        .iter()
        .zip(&b.logits)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0f32, f32::max)
}

/// `--agreement`: the GPU path against the CPU dense path on the same weights.
fn agreement(args: &Args, requests: &[GenerationRequest]) -> anyhow::Result<()> {
    const TOKENS: usize = 16;
    let gpu = select_device(args.gpu)?;
    let requests: Vec<GenerationRequest> = requests
        .iter()
        .map(|r| GenerationRequest {
            max_new_tokens: TOKENS,
            ignore_eos: true,
            ..r.clone()
        })
        .collect();
    let cpu_f32 = reference(args, &Device::Cpu, WeightDtype::F32, &requests)?;
    let gpu_f32 = reference(args, &gpu, WeightDtype::F32, &requests)?;
    let gpu_bf16 = reference(args, &gpu, WeightDtype::Bf16, &requests)?;
    let largest = cpu_f32
        .logits
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()));
    println!(
        "| {} prompts, greedy, {TOKENS} new tokens | same {TOKENS} tokens as the CPU f32 | same first token | max abs logit difference, first step | largest abs logit |",
        requests.len()
    );
    println!("|---|---:|---:|---:|---:|");
    for other in [&gpu_f32, &gpu_bf16] {
        let same = |n: usize| {
            other
                .greedy
                .iter()
                .zip(&cpu_f32.greedy)
                .filter(|(a, b)| a.iter().take(n).eq(b.iter().take(n)))
                .count()
        };
        let difference = max_logit_difference(other, &cpu_f32);
        println!(
            "| {} vs {} | {:.1}% | {:.1}% | {difference:.4} | {largest:.2} |",
            other.label,
            cpu_f32.label,
            100.0 * same(TOKENS) as f64 / requests.len() as f64,
            100.0 * same(1) as f64 / requests.len() as f64,
        );
    }
    let bf16_vs_f32 = max_logit_difference(&gpu_bf16, &gpu_f32);
    println!(
        "| {} vs {} | | | {bf16_vs_f32:.4} | |",
        gpu_bf16.label, gpu_f32.label
    );
    Ok(())
}

fn write_dump(
    model: &GenerateModel,
    requests: &[GenerationRequest],
    args: &Args,
    dump: &PathBuf,
) -> anyhow::Result<()> {
    let batch = args.batches.first().copied().unwrap_or(1);
    let out = model.generate(
        requests,
        StepLimits::new(batch, args.step_tokens[0]),
        &mut || {},
    )?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(dump)?);
    for (request, generation) in requests.iter().zip(&out) {
        let logits = model.next_token_logits(&request.prompt)?;
        let line = serde_json::json!({
            "id": request.id,
            "prompt": request.prompt,
            "greedy": generation.tokens,
            "logits": logits,
        });
        std::io::Write::write_all(&mut file, format!("{line}\n").as_bytes())?;
    }
    println!("wrote {} prompts to {}", out.len(), dump.display());
    Ok(())
}
