//! Quantized matmul kernels at the real model's shapes (hidden 2816), on the library's default
//! pool (one thread per physical core). `tools/reference/bench_quant_mlx.py` times the same
//! products in MLX for the side-by-side comparison.
//!
//! `cargo bench --bench quant` (filter: `cargo bench --bench quant -- q_proj`)
//!
//! Throughput: the one-row cases (memory-bound) report bytes of weights read (packed + scales +
//! biases) per second; the others report multiply-adds x 2 as "elements" (= FLOP/s).
//!
//! `dram_*` cases rotate one-row products through enough distinct matrices (four times the L3)
//! that each is evicted from the last-level cache before it is read again: the DRAM-resident
//! weight stream of decoding, on 1 thread and on the default pool.
//!
//! Weights are random bits with random scales/biases (the kernels' speed does not depend on
//! the values). The expert case uses all 128 experts of the real layer (254 MB of 4-bit
//! gate_up weights, 127 MB down) and 256 tokens x top-8 routes drawn uniformly.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dg_quant::{Product, QMatrix};
use rayon::prelude::*;

mod common;

use common::{random_x, stream_sum, Rng, Weights};

fn config(c: &mut Criterion) -> criterion::BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group("quant");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g
}

/// Dense layers, `x [m, in] @ W^T`.
fn linears(c: &mut Criterion) {
    let pool = dg_quant::pool::build(None).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let shapes: [(&str, usize, usize, u32); 6] = [
        ("q_proj_8b", 4096, 2816, 8),
        ("k_proj_8b", 2048, 2816, 8),
        ("o_proj_8b", 2816, 4096, 8),
        ("mlp_gate_8b", 2112, 2816, 8),
        ("mlp_down_8b", 2816, 2112, 8),
        ("head_slice_4b", 16384, 2816, 4),
    ];
    let mut g = config(c);
    for (name, rows, cols, bits) in shapes {
        let w = Weights::random(&mut rng, 1, rows, cols, bits);
        let q = w.matrix();
        eprintln!("{name}: {}", q.plan(Product::XWt));
        for m in [1usize, 16, 256] {
            let x = random_x(&mut rng, m * cols);
            let mut out = vec![0.0f32; m * rows];
            if m == 1 {
                g.throughput(Throughput::Bytes(q.bytes() as u64));
            } else {
                g.throughput(Throughput::Elements((2 * m * rows * cols) as u64));
            }
            g.bench_with_input(BenchmarkId::new(name, m), &m, |b, &m| {
                b.iter(|| pool.install(|| dg_quant::matmul_t(&x, m, &q, &mut out).unwrap()))
            });
        }
    }
    // The soft-embedding product `probs [m, vocab] @ embed [vocab, hidden]` on a vocab slice.
    let w = Weights::random(&mut rng, 1, 16384, 2816, 4);
    let q = w.matrix();
    eprintln!("embed_slice_4b_xW: {}", q.plan(Product::XW));
    for m in [1usize, 16, 256] {
        let x = random_x(&mut rng, m * q.rows());
        let mut out = vec![0.0f32; m * q.cols()];
        if m == 1 {
            g.throughput(Throughput::Bytes(q.bytes() as u64));
        } else {
            g.throughput(Throughput::Elements((2 * m * q.rows() * q.cols()) as u64));
        }
        g.bench_with_input(BenchmarkId::new("embed_slice_4b_xW", m), &m, |b, &m| {
            b.iter(|| pool.install(|| dg_quant::matmul(&x, m, &q, &mut out).unwrap()))
        });
    }
    g.finish();
}

/// One-row `x @ W^T` with DRAM-resident weights: each iteration multiplies by the next of
/// `count` distinct matrices (`common::working_set`: four times the L3 together).
fn dram(c: &mut Criterion) {
    let mut rng = Rng(0x94D0_49BB_1331_11EB);
    let mut g = c.benchmark_group("quant");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for (name, rows, cols, bits) in [
        ("dram_head_4b", 16384usize, 2816usize, 4u32),
        ("dram_q_proj_8b", 4096, 2816, 8),
    ] {
        let one = Weights::random(&mut rng, 1, rows, cols, bits);
        let bytes = one.matrix().bytes();
        let count = common::working_set().div_ceil(bytes).max(2);
        let mut all = vec![one];
        all.extend((1..count).map(|_| Weights::random(&mut rng, 1, rows, cols, bits)));
        let qs: Vec<QMatrix<'_>> = all.iter().map(Weights::matrix).collect();
        let x = random_x(&mut rng, cols);
        let mut out = vec![0.0f32; rows];
        g.throughput(Throughput::Bytes(bytes as u64));
        for threads in [Some(1), None] {
            let pool = dg_quant::pool::build(threads).unwrap();
            let id = format!("t{}", pool.current_num_threads());
            let mut at = 0;
            g.bench_function(BenchmarkId::new(name, id), |b| {
                b.iter(|| {
                    at = (at + 1) % qs.len();
                    pool.install(|| dg_quant::matmul_t(&x, 1, &qs[at], &mut out).unwrap())
                })
            });
        }
    }
    // The yardstick, measured in the same run: the machine's read bandwidth, summing four L3s
    // of f32 in 26 MB slices (a 4-bit head's size) with the same pools.
    let slice = 26usize << 20;
    let data: Vec<f32> = (0..common::working_set() / 4).map(|i| i as f32).collect();
    let slices: Vec<&[f32]> = data.chunks(slice / 4).collect();
    g.throughput(Throughput::Bytes(slice as u64));
    for threads in [Some(1), None] {
        let pool = dg_quant::pool::build(threads).unwrap();
        let id = format!("t{}", pool.current_num_threads());
        let mut at = 0;
        g.bench_function(BenchmarkId::new("dram_read_bandwidth", id), |b| {
            b.iter(|| {
                at = (at + 1) % (slices.len() - 1);
                let s = slices[at];
                pool.install(|| s.par_chunks(1 << 16).map(stream_sum).sum::<f32>())
            })
        });
    }
    g.finish();
}

/// MoE experts: 256 tokens x top-8 of 128 experts, `gate_up` (2816 -> 1408) and `down`
/// (704 -> 2816), 4-bit.
fn experts(c: &mut Criterion) {
    let pools = [Some(1), None].map(|t| dg_quant::pool::build(t).unwrap());
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let (tokens, top_k, n_experts) = (256usize, 8usize, 128usize);
    let pairs = common::expert_pairs(&mut rng, tokens, top_k, n_experts);
    let mut g = config(c);
    for (name, rows, cols, x_rows) in [
        ("experts_gate_up_4b", 1408usize, 2816usize, tokens),
        ("experts_down_4b", 2816, 704, tokens * top_k),
    ] {
        let w = Weights::random(&mut rng, n_experts, rows, cols, 4);
        let e = w.experts();
        let x = random_x(&mut rng, x_rows * cols);
        // The down projection's input rows are the per-pair activations.
        let pairs: Vec<(usize, usize)> = if x_rows == tokens {
            pairs.clone()
        } else {
            pairs
                .iter()
                .enumerate()
                .map(|(p, &(_, e))| (p, e))
                .collect()
        };
        let mut out = vec![0.0f32; pairs.len() * rows];
        g.throughput(Throughput::Elements((2 * pairs.len() * rows * cols) as u64));
        for pool in &pools {
            let id = format!("{}/t{}", pairs.len(), pool.current_num_threads());
            g.bench_function(BenchmarkId::new(name, id), |b| {
                b.iter(|| {
                    pool.install(|| {
                        dg_quant::gather_matmul_t(&x, x_rows, &e, &pairs, &mut out).unwrap()
                    })
                })
            });
        }
    }
    g.finish();
}

/// Plain f32 GEMM (attention scores, bf16 linears) for reference.
fn dense(c: &mut Criterion) {
    let pool = dg_quant::pool::build(None).unwrap();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (m, k, n) = (256usize, 2816usize, 2048usize);
    let a = random_x(&mut rng, m * k);
    let b = random_x(&mut rng, n * k);
    let mut out = vec![0.0f32; m * n];
    let mut g = config(c);
    g.throughput(Throughput::Elements((2 * m * k * n) as u64));
    g.bench_function(BenchmarkId::new("f32_gemm_bt", m), |bch| {
        bch.iter(|| pool.install(|| dg_quant::matmul_f32(&a, &b, m, k, n, true, &mut out).unwrap()))
    });
    g.finish();
}

criterion_group!(quant, dram, linears, experts, dense);
criterion_main!(quant);
