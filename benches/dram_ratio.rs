//! One-row `x @ W^T` with DRAM-resident weights against the machine's read bandwidth, timed
//! in pairs: `cargo bench --bench dram_ratio`.
//!
//! Timings on a shared VM drift by 10-30% within minutes, so criterion runs of the kernel and
//! of a bandwidth yardstick taken a minute apart give ratios that wander as much. Here each
//! repetition times the product on one cold matrix and, right after, the yardstick (the
//! 16-accumulator sum of `benches/common`) on a cold f32 slice of the same byte size, on the
//! same pool; the median of the per-pair ratios cancels the drift. Bytes are weight bytes read
//! (packed + scales + biases). Issue 2's one-row target: >= 60% of the read bandwidth.

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{random_x, stream_sum, Rng, Weights};
use dg_quant::QMatrix;
use rayon::prelude::*;

/// Bytes of weights (and, separately, of yardstick data) cycled through: four times the
/// 32 MB L3, so every matrix and slice is evicted before it is read again.
const WORKING_SET: usize = 128 << 20;
/// Timed pairs per case and thread count.
const PAIRS: usize = 41;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut rng = Rng(0x94D0_49BB_1331_11EB);
    println!("case | threads | kernel GiB/s | read GiB/s | kernel / read (median of pairs)");
    for (name, rows, cols, bits) in [
        ("head 4-bit 16384x2816", 16384usize, 2816usize, 4u32),
        ("q_proj 8-bit 4096x2816", 4096, 2816, 8),
    ] {
        let bytes = Weights::random(&mut rng, 1, rows, cols, bits)
            .matrix()
            .bytes();
        let count = WORKING_SET.div_ceil(bytes).max(2);
        let all: Vec<Weights> = (0..count)
            .map(|_| Weights::random(&mut rng, 1, rows, cols, bits))
            .collect();
        let qs: Vec<QMatrix<'_>> = all.iter().map(Weights::matrix).collect();
        let data: Vec<f32> = (0..count * bytes / 4).map(|i| i as f32).collect();
        let slices: Vec<&[f32]> = data.chunks_exact(bytes / 4).collect();
        let x = random_x(&mut rng, cols);
        let mut out = vec![0.0f32; rows];
        for threads in [Some(1), None] {
            let pool = dg_quant::pool::build(threads).unwrap();
            let (mut kernel, mut read, mut ratio) = (vec![], vec![], vec![]);
            // One warm-up lap (page faults, frequency), then the timed pairs.
            for rep in 0..count + PAIRS {
                let at = rep % count;
                let t = Instant::now();
                pool.install(|| dg_quant::matmul_t(&x, 1, &qs[at], &mut out).unwrap());
                let tk = t.elapsed().as_secs_f64();
                // The slice read least recently (half a lap away from the matrix just used).
                let s = slices[(at + count / 2) % count];
                let t = Instant::now();
                black_box(pool.install(|| s.par_chunks(1 << 16).map(stream_sum).sum::<f32>()));
                let ty = t.elapsed().as_secs_f64();
                if rep >= count {
                    let gib = (1u64 << 30) as f64;
                    kernel.push(bytes as f64 / tk / gib);
                    read.push((s.len() * 4) as f64 / ty / gib);
                    ratio.push(ty / tk * bytes as f64 / (s.len() * 4) as f64);
                }
            }
            println!(
                "{name} | {} | {:.1} | {:.1} | {:.0}%",
                pool.current_num_threads(),
                median(&mut kernel),
                median(&mut read),
                100.0 * median(&mut ratio)
            );
        }
    }
}
