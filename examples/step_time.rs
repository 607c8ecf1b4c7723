//! Times decoder passes (denoising steps) on a checkpoint and prints one JSON line; used by
//! tools/reference/bench_step.py for the side-by-side comparison with the reference.
//!
//! `cargo run --release --example step_time -- --model DIR --prompt-len 32 --steps 10`

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use dg_core::SelfConditioning;

#[path = "common/timing.rs"]
mod timing;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    timing: timing::TimingArgs,
    #[arg(long, default_value_t = 10)]
    steps: usize,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let model = a.timing.load()?;
    let vocab = model.model().vocab_size() as u32;
    let canvas_len = model.model().config().canvas_length;
    let prompt = a.timing.prompt_ids(vocab);
    let cache = model.prefill(&prompt)?;
    let canvas = timing::canvas_ids(canvas_len, vocab);
    let logits = model.decoder_logits(&cache, &canvas, SelfConditioning::None)?;
    let start = Instant::now();
    for _ in 0..a.steps {
        std::hint::black_box(model.decoder_logits(
            &cache,
            &canvas,
            SelfConditioning::Logits(&logits),
        )?);
    }
    let per_step = start.elapsed().as_secs_f64() / a.steps as f64;
    println!(
        "{}",
        serde_json::json!({"per_step_s": per_step, "canvas": canvas_len, "prompt": a.timing.prompt_len,
            "peak_rss_mb": peak_rss_mb()})
    );
    Ok(())
}

/// Peak resident memory of this process (Linux `VmHWM`), in MiB; `None` elsewhere.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
