//! Writes a random-weight checkpoint in the real format (for benches and side-by-side runs).
//!
//! `cargo run --release --example write_checkpoint -- --out /tmp/dg-bench --hidden 256 --experts 32 --canvas 64`

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use dg_core::synthetic::{write_checkpoint, SyntheticSpec};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    #[arg(long, default_value_t = 6)]
    layers: usize,
    #[arg(long, default_value_t = 32)]
    experts: usize,
    #[arg(long, default_value_t = 4)]
    top_k: usize,
    #[arg(long, default_value_t = 64)]
    canvas: usize,
    #[arg(long, default_value_t = 1)]
    shards: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The real DiffusionGemma 26B-A4B geometry (hidden 2816, intermediate 2112 / MoE 704,
    /// 16 heads with 8 / 2 KV heads, head dim 256 / 512, 128 experts top-8, vocabulary 262144,
    /// canvas 256, sliding window 1024) with `--layers` layers; the size options are ignored.
    #[arg(long)]
    real: bool,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let spec = SyntheticSpec {
        vocab_size: a.vocab,
        hidden_size: a.hidden,
        intermediate_size: 2 * a.hidden,
        moe_intermediate_size: a.hidden / 2,
        num_hidden_layers: a.layers,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        num_global_key_value_heads: 1,
        head_dim: a.hidden / 4,
        global_head_dim: a.hidden / 2,
        num_experts: a.experts,
        top_k_experts: a.top_k,
        sliding_window: 64,
        canvas_length: a.canvas,
        shards: a.shards,
        seed: a.seed,
    };
    let spec = if a.real {
        SyntheticSpec {
            vocab_size: 262_144,
            hidden_size: 2816,
            intermediate_size: 2112,
            moe_intermediate_size: 704,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            num_global_key_value_heads: 2,
            head_dim: 256,
            global_head_dim: 512,
            num_experts: 128,
            top_k_experts: 8,
            sliding_window: 1024,
            canvas_length: 256,
            ..spec
        }
    } else {
        spec
    };
    write_checkpoint(&a.out, &spec)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
