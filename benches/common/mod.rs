//! Bench data shared by the kernel benches: deterministic random weights in the MLX layout,
//! activations, and the read-bandwidth yardstick.

#![allow(dead_code)]

pub mod tower;

use dg_quant::{bf16, QExperts, QMatrix, QuantSpec};

/// Deterministic xorshift for the bench data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

pub struct Weights {
    packed: Vec<u32>,
    scales: Vec<bf16>,
    biases: Vec<bf16>,
    matrices: usize,
    rows: usize,
    cols: usize,
    spec: QuantSpec,
}

impl Weights {
    pub fn random(rng: &mut Rng, matrices: usize, rows: usize, cols: usize, bits: u32) -> Self {
        let spec = QuantSpec::new(bits, 64).unwrap();
        let n = matrices * rows;
        let groups = n * cols / 64;
        Weights {
            packed: (0..n * spec.words_per_row(cols))
                .map(|_| rng.next() as u32)
                .collect(),
            scales: (0..groups)
                .map(|_| bf16::from_f32(rng.f32() * 0.01))
                .collect(),
            biases: (0..groups)
                .map(|_| bf16::from_f32(rng.f32() * 0.1))
                .collect(),
            matrices,
            rows,
            cols,
            spec,
        }
    }

    pub fn matrix(&self) -> QMatrix<'_> {
        QMatrix::new(
            &self.packed,
            &self.scales,
            &self.biases,
            self.rows,
            self.cols,
            self.spec,
        )
        .unwrap()
    }

    pub fn experts(&self) -> QExperts<'_> {
        QExperts::new(
            &self.packed,
            &self.scales,
            &self.biases,
            self.matrices,
            self.rows,
            self.cols,
            self.spec,
        )
        .unwrap()
    }
}

pub fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32()).collect()
}

/// Sum with 16 independent accumulators, so the loop is bound by loads, not by add latency.
pub fn stream_sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for c in v.chunks_exact(16) {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum()
}

/// `(token, expert)` pairs of a routing: `top_k` distinct experts per token, uniformly drawn.
pub fn expert_pairs(
    rng: &mut Rng,
    tokens: usize,
    top_k: usize,
    n_experts: usize,
) -> Vec<(usize, usize)> {
    let mut pairs = Vec::with_capacity(tokens * top_k);
    for t in 0..tokens {
        let mut chosen = Vec::with_capacity(top_k);
        while chosen.len() < top_k {
            let e = (rng.next() % n_experts as u64) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        pairs.extend(chosen.into_iter().map(|e| (t, e)));
    }
    pairs
}

/// Bytes of weights (and, separately, of yardstick data) a DRAM bench cycles through: four
/// times the L3 (read from sysfs; 32 MB assumed where it cannot be read), at least 128 MB, so
/// every matrix and slice is evicted before it is read again.
pub fn working_set() -> usize {
    let l3 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
        .ok()
        .and_then(|s| {
            let s = s.trim();
            let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let shift = match unit {
                "K" => 10,
                "M" => 20,
                "" => 0,
                _ => return None,
            };
            n.parse::<usize>().ok().map(|n| n << shift)
        })
        .unwrap_or(32 << 20);
    (4 * l3).max(128 << 20)
}
