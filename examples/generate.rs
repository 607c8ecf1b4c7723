//! The main job: generate text with DiffusionGemma.
//!
//! ```text
//! cargo run --release --example generate -- --prompt "Write a haiku about rust"
//! cargo run --release --example generate -- --model path/to/diffusiongemma --prompt "Hi" --live
//! cargo run --release --example generate -- --model org/name --prompt "Hi"   # from the Hub
//! cargo run --release --example generate -- --prompt "One" --prompt "Two"   # one batch
//! ```
//!
//! Without `--model` it writes a small random-weight checkpoint to a temporary directory and
//! uses that, so the command works anywhere; its output is noise.

use std::io::{IsTerminal, Read, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use dg_engine::{
    Defaults, DiffusionGemma, Event, FinishReason, Generation, Image, Message, Request, Sampler,
};

#[path = "common/load.rs"]
mod load;
#[path = "common/model_source.rs"]
mod model_source;
#[path = "common/synthetic.rs"]
mod synthetic;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SamplerArg {
    ConfidenceThreshold,
    EntropyBound,
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Generate text with DiffusionGemma (block diffusion, MoE) in pure Rust"
)]
struct Args {
    /// Prompt text, chat-templated as one user turn (see --raw); `-` reads it from stdin.
    /// Several prompts run as one batch (each step of all of them is one forward pass).
    #[arg(value_name = "PROMPT")]
    prompts: Vec<String>,
    /// Checkpoint directory (config.json, model*.safetensors, tokenizer.json, ...), or a Hugging
    /// Face repo id (`org/name`) downloaded into the Hugging Face cache first (HF_HOME,
    /// HF_ENDPOINT, HF_TOKEN apply). Without it a small random checkpoint is written and used:
    /// its output is noise.
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Prompt text, as the positional PROMPT (repeatable). With neither, stdin when it is not a
    /// terminal, else a haiku request.
    #[arg(short, long)]
    prompt: Vec<String>,
    /// A system message before the prompt.
    #[arg(long)]
    system: Option<String>,
    /// A stop string (repeatable): the answer ends before it.
    #[arg(long)]
    stop: Vec<String>,
    /// Send the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// An image to ask about (repeatable): the prompt becomes one user turn with one image
    /// placeholder per image, as the reference builds image prompts.
    #[arg(short, long)]
    image: Vec<PathBuf>,
    /// Comma-separated prompt token ids (instead of a prompt).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// How each denoising step keeps canvas positions.
    #[arg(long, value_enum, default_value = "confidence-threshold")]
    sampler: SamplerArg,
    /// Confidence threshold of the confidence-threshold sampler.
    #[arg(long, default_value_t = 0.9)]
    threshold: f32,
    /// Entropy bound of the entropy-bound sampler (default: the generation config's).
    #[arg(long)]
    entropy_bound: Option<f32>,
    /// Sampling temperature (0: the argmax).
    #[arg(short, long, default_value_t = 0.0)]
    temperature: f32,
    /// Denoising steps per block (default: the generation config's, else 48).
    #[arg(long)]
    steps: Option<usize>,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 512)]
    max_tokens: usize,
    /// Seed of the random generator.
    #[arg(short, long, default_value_t = 0)]
    seed: u64,
    /// Worker threads (default: physical cores).
    #[arg(long)]
    threads: Option<usize>,
    /// LoRA adapter directory (adapter_config.json + adapters.safetensors, as the reference's
    /// trainer or examples/train_lora.rs write it), mounted on the model.
    #[arg(short, long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Use the reference's generation defaults (mlx-optiq ignores generation_config.json).
    #[arg(long)]
    reference_defaults: bool,
    /// Show the canvas un-masking step by step (one line, cut to the terminal's width).
    #[arg(long)]
    live: bool,
    /// Multi-turn chat: each line of stdin is a user turn (the answers join the conversation);
    /// an empty line or end of input ends it.
    #[arg(long, conflicts_with_all = ["prompts", "prompt", "prompt_ids", "raw"])]
    chat: bool,
    /// Print one JSON object per answer (the library's Generation, tokens/s); errors as
    /// {"error": ...}.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// The prompts: positional, then --prompt; `-` or none on a pipe read stdin.
    fn prompts(&self) -> Result<Vec<String>> {
        let mut prompts: Vec<String> = self.prompts.iter().chain(&self.prompt).cloned().collect();
        let piped = !std::io::stdin().is_terminal();
        if prompts.is_empty() && piped && self.prompt_ids.is_none() && !self.chat {
            prompts.push("-".into());
        }
        for p in &mut prompts {
            if p == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading the prompt from stdin")?;
                *p = text.trim_end().to_string();
            }
        }
        if prompts.is_empty() {
            prompts.push("Write a haiku about the sea.".into());
        }
        Ok(prompts)
    }
}

fn main() {
    dg_engine::retain_freed_memory();
    let args = Args::parse();
    let code = match run(&args) {
        Ok(code) => code,
        Err(e) => {
            if args.json {
                println!("{}", serde_json::json!({ "error": format!("{e:#}") }));
            } else {
                eprintln!("error: {e:#}");
            }
            1
        }
    };
    std::process::exit(code);
}

/// Runs the command; returns the exit code (130 after Ctrl-C).
fn run(args: &Args) -> Result<i32> {
    let _tmp;
    let dir = match &args.model {
        Some(model) => model_source::checkpoint_dir(model, !args.json)?,
        None => {
            let tmp = synthetic::random_checkpoint()?;
            if !args.json {
                eprintln!("No --model given: using a small RANDOM-weight checkpoint; its output is noise.");
            }
            let path = tmp.path().to_owned();
            _tmp = tmp;
            path
        }
    };

    let model = load::load_model(&dir, args.threads, args.adapter.as_deref(), !args.json)?;

    let requests: Vec<Request> = if args.prompt_ids.is_some() {
        vec![build_request(args, "")]
    } else {
        args.prompts()?
            .iter()
            .map(|p| build_request(args, p))
            .collect()
    };
    if requests.len() > 1 {
        generate_batch(&model, &requests, args.json)?;
        return Ok(0);
    }
    // Ctrl-C cancels through the library: the partial answer and its stats are still printed.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let interrupted = interrupted.clone();
        ctrlc::set_handler(move || interrupted.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    if args.chat {
        return chat(&model, args, &interrupted);
    }
    let result = stream_answer(&model, &requests[0], args, &interrupted)?;
    Ok(if result.finish_reason == FinishReason::Cancelled {
        130
    } else {
        0
    })
}

/// Multi-turn chat on stdin: each line is a user turn; Ctrl-C cancels the answer being
/// written, an empty line or end of input ends the chat.
fn chat(model: &DiffusionGemma, args: &Args, interrupted: &AtomicBool) -> Result<i32> {
    let mut messages: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::system(s.as_str()))
        .collect();
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(0);
        }
        messages.push(Message::user(line.trim_end()));
        let mut request = build_request(args, "");
        request.prompt = dg_engine::Prompt::Chat(messages.clone());
        interrupted.store(false, Ordering::Relaxed);
        let answer = stream_answer(model, &request, args, interrupted)?;
        messages.push(Message::assistant(answer.text));
    }
}

/// Generates one answer, streaming its text (and with --live the canvas) to stdout, then
/// prints it as JSON or its stats.
fn stream_answer(
    model: &DiffusionGemma,
    request: &Request,
    args: &Args,
    interrupted: &AtomicBool,
) -> Result<Generation> {
    let stdout = std::io::stdout();
    let width = console::Term::stdout()
        .size_checked()
        .map_or(80, |(_, w)| w as usize);
    let mut live_lines = 0usize;
    let result = model.generate_stream(request, |event| {
        if interrupted.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        if args.json {
            return ControlFlow::Continue(());
        }
        let mut out = stdout.lock();
        match event {
            Event::Draft {
                block,
                step,
                total_steps,
                canvas,
                revealed,
                ..
            } if args.live => {
                let shown: Vec<u32> = canvas
                    .iter()
                    .zip(&revealed)
                    .map(|(&t, &r)| if r { t } else { u32::MAX })
                    .collect();
                let line = format!(
                    "[block {block} step {step}/{total_steps}] {}",
                    render_draft(model, &shown)
                );
                // One terminal row: a wrapped line would leave rows that \r cannot clear.
                let line = console::truncate_str(&line, width.saturating_sub(1), "…");
                let _ = write!(out, "\r\x1b[2K{line}");
                live_lines = 1;
            }
            Event::Text(delta) => {
                if live_lines > 0 {
                    let _ = write!(out, "\r\x1b[2K");
                    live_lines = 0;
                }
                let _ = write!(out, "{delta}");
            }
            _ => {}
        }
        let _ = out.flush();
        ControlFlow::Continue(())
    })?;

    if live_lines > 0 && !args.json {
        print!("\r\x1b[2K");
    }
    if args.json {
        println!("{}", json(&result)?);
    } else {
        println!();
        summary(&result);
    }
    Ok(result)
}

/// One request from the command line's options.
fn build_request(args: &Args, prompt: &str) -> Request {
    let mut request = if !args.image.is_empty() {
        Request::with_images(
            prompt,
            args.image.iter().cloned().map(Image::Path).collect(),
        )
    } else if let Some(ids) = &args.prompt_ids {
        Request::tokens(ids.clone())
    } else if args.raw {
        Request::text(prompt)
    } else {
        let system = args.system.iter().map(|s| Message::system(s.as_str()));
        Request::chat(system.chain([Message::user(prompt)]).collect())
    };
    request.stop = args.stop.clone();
    request.sampler = match args.sampler {
        SamplerArg::ConfidenceThreshold => Sampler::ConfidenceThreshold {
            threshold: args.threshold,
        },
        SamplerArg::EntropyBound => Sampler::EntropyBound {
            bound: args.entropy_bound,
        },
    };
    request.temperature = args.temperature;
    request.steps = args.steps;
    request.max_tokens = args.max_tokens;
    request.seed = args.seed;
    if args.reference_defaults {
        request.defaults = Defaults::Reference;
    }
    request
}

/// Several prompts as one batch: answers are printed when all are done.
fn generate_batch(model: &DiffusionGemma, requests: &[Request], as_json: bool) -> Result<()> {
    let results = model.generate_batch(requests)?;
    for (i, result) in results.iter().enumerate() {
        if as_json {
            println!("{}", json(result)?);
        } else {
            println!("--- answer {} ---\n{}", i + 1, result.text);
            summary(result);
        }
    }
    Ok(())
}

/// The library's own `Generation`, with the rates people compare.
fn json(result: &Generation) -> Result<serde_json::Value> {
    let mut value = serde_json::to_value(result)?;
    let s = &result.stats;
    value["tokens_per_second"] = serde_json::json!({
        "prompt": s.prompt_tps(),
        "generated": s.generation_tps(),
        "canvas": s.canvas_tps(),
        "work": s.work_tps(),
    });
    Ok(value)
}

fn summary(result: &Generation) {
    let s = &result.stats;
    eprintln!(
        "[{:?}] {} prompt tokens ({:.1} tok/s), {} generated ({:.1} tok/s), {} blocks, {} steps, {:.1} work token-steps/s",
        result.finish_reason,
        s.prompt_tokens,
        s.prompt_tps(),
        s.generated_tokens,
        s.generation_tps(),
        s.canvases,
        s.denoising_steps,
        s.work_tps()
    );
    if result.token_ids.is_empty() {
        eprintln!("(the model produced an empty answer)");
    }
}

/// Revealed tokens as text, unrevealed ones as a block character.
fn render_draft(model: &DiffusionGemma, shown: &[u32]) -> String {
    let mut out = String::new();
    let mut run = Vec::new();
    for &t in shown {
        if t == u32::MAX {
            if !run.is_empty() {
                out.push_str(&model.tokenizer().decode(&run, true).unwrap_or_default());
                run.clear();
            }
            out.push('░');
        } else {
            run.push(t);
        }
    }
    if !run.is_empty() {
        out.push_str(&model.tokenizer().decode(&run, true).unwrap_or_default());
    }
    out.replace('\n', "⏎")
}
