//! Times LoRA training steps (forward + backward + AdamW update) on a checkpoint and prints one
//! JSON line; used by tools/reference/bench_lora_step.py for the side-by-side comparison with
//! the reference's training step.
//!
//! `cargo run --release --example lora_step_time -- --model DIR --prompt-len 32 --steps 3`

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use dg_engine::train::{EncodedPair, TrainOptions, Trainer};
use dg_engine::DiffusionGemma;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    #[arg(long, default_value_t = 3)]
    steps: u64,
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let mut builder = DiffusionGemma::builder(&a.model);
    if let Some(t) = a.threads {
        builder = builder.threads(t);
    }
    let model = builder.load()?;
    let vocab = model.model().vocab_size() as u32;
    let canvas_len = model.model().config().canvas_length as u32;
    // The same ids as the reference side: a prompt and a full-canvas target.
    let example = EncodedPair {
        prompt_ids: (0..a.prompt_len as u32)
            .map(|i| (i * 7 + 3) % vocab)
            .collect(),
        target_ids: (0..canvas_len).map(|i| (i * 37 + 11) % vocab).collect(),
        line: 1,
    };
    let mut trainer = Trainer::with_examples(&model, vec![example], TrainOptions::default())?;
    trainer.step()?; // warm-up
    let start = Instant::now();
    for _ in 0..a.steps {
        trainer.step()?;
    }
    let per_step = start.elapsed().as_secs_f64() / a.steps as f64;
    println!("{}", serde_json::json!({ "per_step_s": per_step }));
    Ok(())
}
