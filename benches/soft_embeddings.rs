//! The soft-embedding product at the real geometry (canvas 256, vocabulary 262144, hidden 2816,
//! 4-bit group 64 table): the dense kernel against the exact sparse one
//! (`dg_quant::sparse`), on heavy-tailed softmax rows at several temperatures, timed in pairs
//! (dense then sparse, median of the per-pair ratios): `cargo bench --bench soft_embeddings`.
//! `DG_BENCH_PAIRS` sets the pairs per temperature (default 3).

mod common;

use std::time::Instant;

use common::{Rng, Weights};
use dg_quant::{matmul, matmul_sparse};

const CANVAS: usize = 256;
const VOCAB: usize = 262_144;
const HIDDEN: usize = 2816;

fn normal(rng: &mut Rng) -> f64 {
    let u = (rng.f32() as f64 * 0.5 + 0.5).max(1e-12);
    let v = rng.f32() as f64 * 0.5 + 0.5;
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// One softmax row shaped like a language model's logits: a Student-t bulk (3 degrees of
/// freedom, scale 2), `candidates` tokens 8-22 above it, soft-capped at 30, over `temperature`.
fn probs_row(rng: &mut Rng, candidates: usize, temperature: f64, out: &mut [f32]) {
    let mut logits: Vec<f64> = (0..VOCAB)
        .map(|_| {
            let chi: f64 = (0..3).map(|_| normal(rng).powi(2)).sum::<f64>() / 3.0;
            2.0 * normal(rng) / chi.sqrt()
        })
        .collect();
    for _ in 0..candidates {
        let v = (rng.next() % VOCAB as u64) as usize;
        logits[v] += 8.0 + 14.0 * (rng.f32() as f64 * 0.5 + 0.5);
    }
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
    let cap = |x: f64| (x / 30.0).tanh() * 30.0 / temperature;
    let mut sum = 0.0f64;
    for (o, &x) in out.iter_mut().zip(&logits) {
        *o = ((cap(x) - cap(max)) as f32).exp();
        sum += *o as f64;
    }
    for o in out.iter_mut() {
        *o /= sum as f32;
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let pairs: usize = std::env::var("DG_BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut rng = Rng(0x5eed_0015);
    let table = Weights::random(&mut rng, 1, VOCAB, HIDDEN, 4);
    let w = table.matrix();
    let pool = dg_quant::pool::build(None).unwrap();
    println!(
        "threads {} | canvas {CANVAS} x vocab {VOCAB} x hidden {HIDDEN}, 4-bit group 64",
        pool.current_num_threads()
    );
    println!(
        "temperature | dense s | sparse s | dense / sparse | kept per sparse row | dense rows"
    );
    let mut x = vec![0.0f32; CANVAS * VOCAB];
    let (mut dense_out, mut sparse_out) =
        (vec![0.0f32; CANVAS * HIDDEN], vec![0.0f32; CANVAS * HIDDEN]);
    for temperature in [0.4, 0.6, 0.8, 1.0] {
        for (i, row) in x.chunks_exact_mut(VOCAB).enumerate() {
            probs_row(&mut rng, [0, 1, 2, 5, 20][i % 5], temperature, row);
        }
        let (mut td, mut ts, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut stats = Default::default();
        for _ in 0..pairs {
            let t = Instant::now();
            pool.install(|| matmul(&x, CANVAS, &w, &mut dense_out))
                .unwrap();
            let d = t.elapsed().as_secs_f64();
            let t = Instant::now();
            stats = pool
                .install(|| matmul_sparse(&x, CANVAS, &w, &mut sparse_out))
                .unwrap();
            let s = t.elapsed().as_secs_f64();
            td.push(d);
            ts.push(s);
            ratios.push(d / s);
        }
        let stats: dg_quant::SparseStats = stats;
        println!(
            "{temperature} | {:.3} | {:.4} | {:.1}x | {:.2}% | {}",
            median(&mut td),
            median(&mut ts),
            median(&mut ratios),
            100.0 * stats.kept as f64 / (stats.sparse_rows.max(1) * VOCAB) as f64,
            stats.dense_rows
        );
    }
}
