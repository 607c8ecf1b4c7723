//! Fine-tune a LoRA adapter with DiffusionGemma's denoising objective, on the CPU.
//!
//! ```text
//! cargo run --release --example train_lora -- --model path/to/diffusiongemma \
//!     --data path/to/data --out adapter --iters 200
//! cargo run --release --example train_lora -- --model M --data D --out adapter \
//!     --resume adapter --iters 100                       # 100 more iterations
//! cargo run --release --example generate -- --model M --adapter adapter --prompt "Hi"
//! ```
//!
//! `--data DIR` holds `train.jsonl` (or name the file): one `{"prompt", "completion"}`,
//! `{"messages": [...]}` or `{"text"}` object a line. `--out DIR` receives the adapter in the
//! reference's format (`adapter_config.json`, `adapters.safetensors`: mountable by dg's
//! `--adapter` and by mlx-optiq's `load_diffusion_lora`) plus the optimizer state, so it is also
//! a checkpoint `--resume` continues exactly. Ctrl-C stops after the current iteration and saves.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dg_engine::train::{DataOrder, TrainOptions, Trainer};
use indicatif::{ProgressBar, ProgressStyle};

#[path = "common/load.rs"]
mod load;
#[path = "common/model_source.rs"]
mod model_source;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Train a LoRA adapter for DiffusionGemma (denoising objective) in pure Rust"
)]
struct Args {
    /// Checkpoint directory, or a Hugging Face repo id (`org/name`) downloaded first.
    #[arg(short, long)]
    model: PathBuf,
    /// Directory holding train.jsonl, or the .jsonl file itself.
    #[arg(short, long)]
    data: PathBuf,
    /// Where the adapter and the training state are written.
    #[arg(short, long)]
    out: PathBuf,
    /// Iterations to run (one example each; empty completions are skipped).
    #[arg(long, default_value_t = 200)]
    iters: u64,
    /// LoRA rank [default: 8].
    #[arg(long)]
    rank: Option<usize>,
    /// Factor on the adapters' output [default: 8.0].
    #[arg(long)]
    scale: Option<f32>,
    /// AdamW learning rate [default: 1e-4].
    #[arg(long)]
    lr: Option<f32>,
    /// RNG seed: the LoRA init and the corruption draws are those of the reference after
    /// `mx.random.seed(SEED)` [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Visit the examples in a seeded random order per pass (default: file order).
    #[arg(long, value_name = "SEED")]
    shuffle: Option<u64>,
    /// Longest target in tokens; completions are cut to it.
    #[arg(long, default_value_t = dg_engine::train::DEFAULT_MAX_CANVAS)]
    max_canvas: usize,
    /// Continue the run saved in this directory (a previous --out).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Save the state to --out every N iterations (0: only at the end).
    #[arg(long, default_value_t = 0)]
    save_every: u64,
    /// Worker threads (default: physical cores).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn data_file(data: &Path) -> PathBuf {
    if data.is_dir() {
        data.join("train.jsonl")
    } else {
        data.to_owned()
    }
}

fn run(args: &Args) -> Result<()> {
    let dir = model_source::checkpoint_dir(&args.model, true)?;
    let data = data_file(&args.data);
    let model = load::load_model(&dir, args.threads, None, true)?;

    let mut trainer = match &args.resume {
        Some(from) => {
            for (given, name) in [
                (args.rank.is_some(), "--rank"),
                (args.scale.is_some(), "--scale"),
                (args.seed.is_some(), "--seed"),
                (args.shuffle.is_some(), "--shuffle"),
            ] {
                if given {
                    bail!(
                        "{name} cannot change when resuming: it comes from {}",
                        from.display()
                    );
                }
            }
            let mut t = Trainer::resume(&model, &data, from)
                .with_context(|| format!("resuming from {}", from.display()))?;
            if let Some(lr) = args.lr {
                t.set_learning_rate(lr)?;
            }
            t
        }
        None => {
            let defaults = TrainOptions::default();
            let mut options = TrainOptions {
                rank: args.rank.unwrap_or(defaults.rank),
                scale: args.scale.unwrap_or(defaults.scale),
                seed: args.seed.unwrap_or(defaults.seed),
                max_canvas: args.max_canvas,
                order: match args.shuffle {
                    Some(seed) => DataOrder::Shuffled { seed },
                    None => DataOrder::Sequential,
                },
                base_model: Some(args.model.display().to_string()),
                ..defaults
            };
            if let Some(lr) = args.lr {
                options.adamw.learning_rate = lr;
            }
            Trainer::new(&model, &data, options)?
        }
    };
    let params: usize = trainer
        .adapter()
        .factors
        .values()
        .map(|f| f.a.len() + f.b.len())
        .sum();
    let (t_min, t_max) = trainer.noise_range();
    eprintln!(
        "{} examples from {}, {} adapted layers ({:.2}M parameters), rank {}, scale {}, lr {:e}, \
         noise t in [{t_min}, {t_max}], starting at iteration {}",
        trainer.examples().len(),
        data.display(),
        trainer.adapter().factors.len(),
        params as f64 / 1e6,
        trainer.options().rank,
        trainer.options().scale,
        trainer.options().adamw.learning_rate,
        trainer.iteration(),
    );

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let interrupted = interrupted.clone();
        ctrlc::set_handler(move || interrupted.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    let bar = ProgressBar::new(args.iters).with_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .context("progress style")?
        .progress_chars("=> "),
    );
    // The loss of one example is noisy: show a running mean over the last few too.
    let mut recent: Vec<f32> = Vec::new();
    let start = Instant::now();
    for done in 1..=args.iters {
        let r = trainer.step()?;
        if let Some(loss) = r.loss {
            recent.push(loss);
            if recent.len() > 10 {
                recent.remove(0);
            }
        }
        let mean = recent.iter().sum::<f32>() / recent.len().max(1) as f32;
        bar.set_message(format!(
            "loss {} (last {}: {mean:.4})  {:.2} examples/s",
            r.loss.map_or("skipped".into(), |l| format!("{l:.4}")),
            recent.len(),
            done as f64 / start.elapsed().as_secs_f64()
        ));
        bar.inc(1);
        if args.save_every > 0 && done % args.save_every == 0 && done < args.iters {
            trainer
                .save_checkpoint(&args.out)
                .with_context(|| format!("saving to {}", args.out.display()))?;
            bar.println(format!(
                "iteration {}: saved to {}",
                r.iteration,
                args.out.display()
            ));
        }
        if interrupted.load(Ordering::Relaxed) {
            bar.println("interrupted: saving");
            break;
        }
    }
    bar.finish();
    trainer
        .save_checkpoint(&args.out)
        .with_context(|| format!("saving to {}", args.out.display()))?;
    eprintln!(
        "saved the adapter (and the state to resume from) to {} after {} iterations",
        args.out.display(),
        trainer.iteration()
    );
    Ok(())
}
