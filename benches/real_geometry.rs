//! The real model's step, part by part, against this machine's FMA peak measured in the same
//! run, on a random-weight checkpoint of the 26B-A4B geometry
//! (`tools/bench/write_real_geometry.sh`, 30 layers by default):
//!
//! - one denoising step over a 256-token canvas: the decoder pass (embedding, self-conditioning
//!   block, every layer, final norm), the tied head, the confidence sampler's draw, and the self-conditioning signal of the
//!   next step (softmax rows, soft embeddings with the exact sparse product);
//! - a whole block of generation (the engine's loop: the parts above plus the sampler), per step;
//! - prefill of 256 / 1024 / 4096 prompt tokens, each followed by decoder passes over its
//!   cache (a block's first step after a long prompt: attention over every cached key);
//! - the vision tower (27 layers of the real geometry, random bf16 weights written to a
//!   temporary folder) and the embedder on one 1920x1080 image at the real budget of 280 soft
//!   tokens.
//!
//! Each part prints its time, its dense FLOP count (every product as a dense matrix product,
//! attention over the keys each row sees), the dense floor (FLOPs over the FMA peak of the same
//! threads, probed between the parts) and the ratio time / floor; then peak RSS.
//!
//! `cargo bench --bench real_geometry -- [--model DIR] [--threads 1,2] [--prompts 256,1024,4096]
//! [--steps 2] [--skip-block] [--skip-vision]`

mod common;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dg_core::config::{LayerType, TextConfig};
use dg_core::{SelfConditioning, TextModel};
use dg_engine::research::{sampler, Rng};
use dg_engine::{DiffusionGemma, Request, Sampler};
use dg_vision::{ImageProcessor, PreparedImage, VisionModel};

struct Args {
    model: PathBuf,
    threads: Vec<usize>,
    prompts: Vec<usize>,
    steps: usize,
    block: bool,
    vision: bool,
}

fn list(v: &str) -> Result<Vec<usize>> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .with_context(|| format!("not a number: {s}"))
        })
        .collect()
}

fn args() -> Result<Args> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let mut a = Args {
        model: cache.join("dg/real-geometry-30l"),
        threads: vec![1, 2],
        prompts: vec![256, 1024, 4096],
        steps: 2,
        block: true,
        vision: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bench" => {}
            "--model" => a.model = value()?.into(),
            "--threads" => a.threads = list(&value()?)?,
            "--prompts" => a.prompts = list(&value()?)?,
            "--steps" => a.steps = value()?.parse()?,
            "--skip-block" => a.block = false,
            "--skip-vision" => a.vision = false,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(a)
}

/// Multiply-adds of one row through a layer's linear products (the experts a token is routed
/// to, not all of them).
fn layer_linear_macs(t: &TextConfig, lt: LayerType) -> f64 {
    let (h, heads) = (t.hidden_size as f64, t.num_attention_heads as f64);
    let (hd, kv) = (t.head_dim_of(lt) as f64, t.kv_heads_of(lt) as f64);
    // Full-attention layers take their values from the raw keys: no v_proj.
    let v = if lt == LayerType::FullAttention {
        0.0
    } else {
        h * kv * hd
    };
    let attention = h * heads * hd + h * kv * hd + v + heads * hd * h;
    let dense_mlp = 3.0 * h * t.intermediate_size as f64;
    let router = h * t.num_experts as f64;
    let experts = t.top_k_experts as f64 * 3.0 * h * t.moe_intermediate_size as f64;
    attention + dense_mlp + router + experts
}

/// Multiply-adds of one row's attention over `keys` keys (scores and the weighted values).
fn attention_macs(t: &TextConfig, lt: LayerType, keys: usize) -> f64 {
    2.0 * t.num_attention_heads as f64 * t.head_dim_of(lt) as f64 * keys as f64
}

/// FLOPs of a decoder pass over `canvas` rows after `prompt` cached positions, with or
/// without the self-conditioning block (skipped on a block's first step).
fn decoder_flops(t: &TextConfig, canvas: usize, prompt: usize, self_conditioning: bool) -> f64 {
    let sc_block = if self_conditioning {
        3.0 * (t.hidden_size * t.intermediate_size) as f64
    } else {
        0.0
    };
    let layers: f64 = t
        .layer_types()
        .into_iter()
        .map(|lt| {
            let cached = match lt {
                LayerType::SlidingAttention => prompt.min(t.sliding_window.saturating_sub(1)),
                _ => prompt,
            };
            layer_linear_macs(t, lt) + attention_macs(t, lt, cached + canvas)
        })
        .sum();
    2.0 * canvas as f64 * (sc_block + layers)
}

/// FLOPs of a causal prefill of `len` tokens (sliding layers see at most their window).
fn prefill_flops(t: &TextConfig, len: usize) -> f64 {
    t.layer_types()
        .into_iter()
        .map(|lt| {
            let window = match lt {
                LayerType::SlidingAttention => t.sliding_window,
                _ => usize::MAX,
            };
            let keys: usize = (1..=len).map(|i| i.min(window)).sum();
            2.0 * (len as f64 * layer_linear_macs(t, lt) + attention_macs(t, lt, 1) * keys as f64)
        })
        .sum()
}

/// The FMA peak of `pool` in FLOP/s: every thread runs the in-register probe for ~0.5 s.
fn fma_peak(pool: &rayon::ThreadPool) -> f64 {
    let t = Instant::now();
    black_box(dg_bench::fma_peak(10_000_000));
    let rounds = (0.5 * 1e7 / t.elapsed().as_secs_f64()) as usize;
    let t = Instant::now();
    let flops: u64 = pool
        .broadcast(|_| dg_bench::fma_peak(rounds).flops)
        .iter()
        .sum();
    flops as f64 / t.elapsed().as_secs_f64()
}

struct Row {
    part: String,
    seconds: f64,
    flops: f64,
}

fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let out = f()?;
    Ok((out, t.elapsed().as_secs_f64()))
}

/// The step's parts on `model`, each the best of `steps` runs.
fn step_parts(model: &TextModel, steps: usize) -> Result<Vec<Row>> {
    let t = &model.config().text;
    let (vocab, canvas_len) = (t.vocab_size, model.config().canvas_length);
    let prompt: Vec<u32> = (0..32u32).map(|i| (i * 7 + 3) % vocab as u32).collect();
    let mut cache = model.new_cache();
    model.encode(&mut cache, &prompt, |_, _| {})?;
    let canvas = canvas_ids(t, canvas_len);
    let first = model.decode(&cache, &canvas, SelfConditioning::None)?;
    let soft = model.soft_embeddings(&softmax_rows(&first, vocab), canvas_len)?;
    let (mut pass, mut head, mut softmax, mut embed) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    let mut draw = f64::MAX;
    let mut rng = Rng::new(1);
    // The logits and probabilities buffers live across steps, as the engine keeps them.
    let (mut logits, mut probs) = (first, vec![0.0f32; canvas_len * vocab]);
    for _ in 0..steps.max(1) {
        let (hidden, s) = time(|| {
            Ok(model.decode_hidden(&cache, &canvas, SelfConditioning::Embeddings(&soft))?)
        })?;
        pass = pass.min(s);
        let ((), s) = time(|| Ok(model.logits_into(&hidden, canvas_len, &mut logits)?))?;
        head = head.min(s);
        // The confidence sampler's step before its softmax (`BlockState::step`), `probs` its
        // scratch as in the engine. Temperature 1 divides without changing the logits, so the
        // rows below see the same probabilities as without this one.
        let (tokens, s) = time(|| {
            sampler::apply_temperature(&mut logits, 1.0);
            let argmax = sampler::argmax_canvas(&logits, vocab)?;
            let drawn = sampler::sample_canvas(&logits, vocab, 1.0, &mut rng)?;
            let confidence = sampler::token_probability(&logits, vocab, &drawn)?;
            Ok((argmax, confidence))
        })?;
        draw = draw.min(s);
        black_box(tokens);
        let ((), s) = time(|| {
            dg_quant::mlx::softmax_rows(&logits, vocab, &mut probs);
            Ok(())
        })?;
        softmax = softmax.min(s);
        let (e, s) = time(|| Ok(model.soft_embeddings(&probs, canvas_len)?))?;
        embed = embed.min(s);
        black_box(e);
    }
    let rows = canvas_len as f64;
    let (h, v) = (t.hidden_size as f64, vocab as f64);
    Ok(vec![
        Row {
            part: format!("decoder pass ({} layers)", t.num_hidden_layers),
            seconds: pass,
            flops: decoder_flops(t, canvas_len, prompt.len(), true),
        },
        Row {
            part: "head (tied, 4-bit)".into(),
            seconds: head,
            flops: 2.0 * rows * h * v,
        },
        Row {
            part: "sampler (temperature, argmax, Gumbel-max draw, confidences)".into(),
            seconds: draw,
            flops: 0.0,
        },
        Row {
            part: "softmax rows".into(),
            seconds: softmax,
            flops: 0.0,
        },
        Row {
            part: "soft embeddings (exact sparse; FLOPs dense)".into(),
            seconds: embed,
            flops: 2.0 * rows * h * v,
        },
    ])
}

/// The canvas every decoder pass here runs on.
fn canvas_ids(t: &TextConfig, canvas_len: usize) -> Vec<u32> {
    (0..canvas_len as u32)
        .map(|i| (i * 37 + 11) % t.vocab_size as u32)
        .collect()
}

fn softmax_rows(logits: &[f32], vocab: usize) -> Vec<f32> {
    let mut p = vec![0.0; logits.len()];
    dg_quant::mlx::softmax_rows(logits, vocab, &mut p);
    p
}

/// A whole block through the engine (confidence sampler, temperature 1, 4 steps), per step.
fn block_per_step(engine: &DiffusionGemma) -> Result<Row> {
    let t = &engine.model().config().text;
    let canvas_len = engine.model().config().canvas_length;
    let prompt: Vec<u32> = (0..32u32)
        .map(|i| (i * 7 + 3) % t.vocab_size as u32)
        .collect();
    let request = Request::tokens(prompt.clone())
        .max_tokens(canvas_len)
        .sampler(Sampler::ConfidenceThreshold { threshold: 0.9 })
        .temperature(1.0)
        .steps(4)
        .seed(1);
    // The prefill of the same prompt, timed alone, is subtracted.
    let (_, prefill) = time(|| Ok(engine.prefill(&prompt)?))?;
    let (out, s) = time(|| Ok(engine.generate(&request)?))?;
    let steps = out.stats.denoising_steps.max(1);
    Ok(Row {
        part: format!("whole block, per step ({steps} steps)"),
        seconds: (s - prefill) / steps as f64,
        flops: decoder_flops(t, canvas_len, prompt.len(), true)
            + 4.0 * (canvas_len * t.hidden_size * t.vocab_size) as f64,
    })
}

/// The vision tower and embedder on `image`.
fn vision_part(vision: &VisionModel, image: &PreparedImage) -> Result<Row> {
    let (_, s) = time(|| Ok(vision.encode(image)?))?;
    let patches = (image.height / image.patch_size) * (image.width / image.patch_size);
    Ok(Row {
        part: format!(
            "vision tower + embedder ({patches} patches, {} tokens)",
            image.soft_tokens
        ),
        seconds: s,
        flops: common::tower::flops(common::tower::REAL_LAYERS, patches, image.soft_tokens),
    })
}

fn print(rows: &[Row], threads: usize, peak: f64) {
    for r in rows {
        let floor = r.flops / peak;
        let ratio = if r.flops > 0.0 {
            format!("{:.2}x", r.seconds / floor)
        } else {
            "-".into()
        };
        println!(
            "{} | {threads} | {:.3} | {:.1} | {:.3} | {ratio}",
            r.part,
            r.seconds,
            r.flops / 1e9,
            floor
        );
    }
}

fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

fn main() -> Result<()> {
    // As the examples run: freed buffers reused, not faulted in again (Linux, glibc).
    let retained = dg_engine::retain_freed_memory();
    let a = args()?;
    if !a.model.join("config.json").is_file() {
        eprintln!(
            "no checkpoint at {} (write it with tools/bench/write_real_geometry.sh, or pass --model)",
            a.model.display()
        );
        return Ok(());
    }
    println!("checkpoint: {}", a.model.display());
    println!("allocator keeps freed memory: {retained}");
    let tower = a
        .vision
        .then(|| common::tower::write(common::tower::REAL_LAYERS));
    let vision = match &tower {
        Some(dir) => {
            let (w, h) = (1920usize, 1080usize);
            let rgb: Vec<u8> = (0..w * h * 3)
                .map(|i| ((i / 3) % w * 255 / w) as u8)
                .collect();
            let image = ImageProcessor::default().prepare_rgb(w, h, &rgb)?;
            Some((VisionModel::load(dir.path())?, image))
        }
        None => None,
    };
    println!("part | threads | seconds | GFLOP (dense) | floor s | time / floor");
    for &threads in &a.threads {
        let engine = DiffusionGemma::builder(&a.model).threads(threads).load()?;
        let pool = dg_quant::pool::build(Some(threads))?;
        let model = engine.model();
        let t = &model.config().text;
        let peak_before = fma_peak(&pool);
        let mut rows = pool.install(|| step_parts(model, a.steps))?;
        for &len in &a.prompts {
            let ids: Vec<u32> = (0..len as u32)
                .map(|i| (i * 7 + 3) % t.vocab_size as u32)
                .collect();
            let (cache, s) = pool.install(|| {
                time(|| {
                    let mut cache = model.new_cache();
                    model.encode(&mut cache, &ids, |_, _| {})?;
                    Ok(cache)
                })
            })?;
            rows.push(Row {
                part: format!("prefill {len} tokens"),
                seconds: s,
                flops: prefill_flops(t, len),
            });
            let canvas_len = model.config().canvas_length;
            let canvas = canvas_ids(t, canvas_len);
            let mut s = f64::MAX;
            for _ in 0..a.steps.max(1) {
                let pass = pool.install(|| {
                    time(|| Ok(model.decode_hidden(&cache, &canvas, SelfConditioning::None)?))
                })?;
                s = s.min(pass.1);
            }
            rows.push(Row {
                part: format!("decoder pass after {len} cached (first step: no self-conditioning)"),
                seconds: s,
                flops: decoder_flops(t, canvas_len, len, false),
            });
        }
        if a.block {
            rows.push(block_per_step(&engine)?);
        }
        if let Some((vision, image)) = &vision {
            rows.push(pool.install(|| vision_part(vision, image))?);
        }
        let peak = 0.5 * (peak_before + fma_peak(&pool));
        println!("# {threads} thread(s): FMA peak {:.1} GFLOP/s", peak / 1e9);
        print(&rows, threads, peak);
    }
    if let Some(mb) = peak_rss_mb() {
        println!("peak RSS {mb:.0} MiB (the checkpoint mapped)");
    }
    Ok(())
}
