//! Counts heap allocation per denoising round (one batched decoder pass plus the samplers and
//! the self-conditioning product of every sequence) with a counting global allocator, and
//! prints one JSON line.
//!
//! Without `--model` it writes a random checkpoint with the real vocabulary (262144) and a
//! small body (hidden 256, 2 layers) once into `--dir`, so the per-step buffers have their real
//! size while the run stays short.
//!
//! `cargo run --profile test --example step_alloc -- --dir /tmp/dg-alloc --steps 6 --batch 2`

use std::alloc::{GlobalAlloc, Layout, System};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use clap::Parser;
use dg_core::synthetic::{write_checkpoint, SyntheticSpec};
use dg_engine::{DiffusionGemma, Event, Request, Sampler};

/// `System`, counting the bytes and calls of every allocation (a `realloc` counts its new size).
struct Counting;

static BYTES: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn counters() -> (u64, u64) {
    (BYTES.load(Ordering::Relaxed), CALLS.load(Ordering::Relaxed))
}

#[derive(Parser)]
struct Args {
    /// A checkpoint to run on; without it one is written into `--dir`.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where the random real-vocabulary checkpoint is written (reused when present).
    #[arg(long, default_value = "/tmp/dg-step-alloc")]
    dir: PathBuf,
    /// Denoising steps of the one block each sequence runs.
    #[arg(long, default_value_t = 6)]
    steps: usize,
    /// Sequences denoised together.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// `entropy` (the default sampler) or `confidence`.
    #[arg(long, default_value = "entropy")]
    sampler: String,
    /// Sampling temperature (0: argmax denoiser).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let dir = match &a.model {
        Some(dir) => dir.clone(),
        None => {
            if !a.dir.join("config.json").exists() {
                let spec = SyntheticSpec {
                    vocab_size: 262_144,
                    hidden_size: 256,
                    intermediate_size: 512,
                    moe_intermediate_size: 128,
                    num_hidden_layers: 2,
                    num_attention_heads: 4,
                    num_key_value_heads: 2,
                    num_global_key_value_heads: 1,
                    head_dim: 64,
                    global_head_dim: 128,
                    num_experts: 8,
                    top_k_experts: 2,
                    sliding_window: 64,
                    canvas_length: 256,
                    shards: 1,
                    seed: 0,
                };
                write_checkpoint(&a.dir, &spec).context("writing the checkpoint")?;
            }
            a.dir.clone()
        }
    };
    let mut builder = DiffusionGemma::builder(&dir);
    if let Some(t) = a.threads {
        builder = builder.threads(t);
    }
    let model = builder.load()?;
    let vocab = model.model().vocab_size();
    let canvas = model.model().config().canvas_length;
    let sampler = match a.sampler.as_str() {
        "entropy" => Sampler::EntropyBound { bound: None },
        "confidence" => Sampler::ConfidenceThreshold { threshold: 0.9 },
        other => anyhow::bail!("unknown sampler {other:?} (entropy or confidence)"),
    };
    let requests: Vec<Request> = (0..a.batch)
        .map(|s| {
            let prompt = (0..a.prompt_len)
                .map(|i| ((i * 7 + s * 13 + 3) % (vocab - 300) + 300) as u32)
                .collect();
            Request::tokens(prompt)
                .max_tokens(canvas)
                .canvas(canvas, canvas)
                .steps(a.steps)
                .sampler(sampler)
                .temperature(a.temperature)
                .seed(s as u64)
        })
        .collect();
    // Counters at each draft of sequence 0: consecutive drafts of one block are one round apart.
    let mut marks: Vec<(usize, (u64, u64))> = Vec::new();
    model.generate_batch_stream(&requests, |i, e| {
        if let (0, Event::Draft { block, .. }) = (i, &e) {
            marks.push((*block, counters()));
        }
        ControlFlow::Continue(())
    })?;
    let rounds: Vec<(u64, u64)> = marks
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[1].1 .0 - w[0].1 .0, w[1].1 .1 - w[0].1 .1))
        .collect();
    anyhow::ensure!(
        !rounds.is_empty(),
        "no two drafts in one block: raise --steps"
    );
    let n = rounds.len() as f64;
    let bytes = rounds.iter().map(|r| r.0 as f64).sum::<f64>() / n;
    let calls = rounds.iter().map(|r| r.1 as f64).sum::<f64>() / n;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    println!(
        "{}",
        serde_json::json!({
            "vocab": vocab, "canvas": canvas, "batch": a.batch, "sampler": a.sampler,
            "temperature": a.temperature, "rounds_measured": rounds.len(),
            "per_round_mib": mib(bytes), "per_round_calls": calls,
            "per_step_mib": mib(bytes / a.batch as f64),
            "per_step_calls": calls / a.batch as f64,
            "rounds_mib": rounds.iter().map(|r| mib(r.0 as f64)).collect::<Vec<_>>(),
        })
    );
    Ok(())
}
