//! Times LoRA training steps (forward + backward + AdamW update) on a checkpoint and prints one
//! JSON line; used by tools/reference/bench_lora_step.py for the side-by-side comparison with
//! the reference's training step.
//!
//! `cargo run --release --example lora_step_time -- --model DIR --prompt-len 32 --steps 3`

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use dg_engine::train::{EncodedPair, TrainOptions, Trainer};

#[path = "common/timing.rs"]
mod timing;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    timing: timing::TimingArgs,
    #[arg(long, default_value_t = 3)]
    steps: u64,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let model = a.timing.load()?;
    let vocab = model.model().vocab_size() as u32;
    let canvas_len = model.model().config().canvas_length;
    // The same ids as the reference side: a prompt and a full-canvas target.
    let example = EncodedPair {
        prompt_ids: a.timing.prompt_ids(vocab),
        target_ids: timing::canvas_ids(canvas_len, vocab),
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
