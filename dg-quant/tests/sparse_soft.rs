//! The sparse soft-embedding product against the exact (f64) dense sum on rows of the real
//! vocabulary size (262144) with heavy-tailed logits at temperatures 0.4-1.0: the skipped
//! entries move each output by at most the bound stated in `dg_quant::sparse`, and the f32
//! result is within the recursive-summation error bound of the exact sum of its kept terms.

use dg_quant::sparse::{row_max_abs, support, Support};
use dg_quant::{bf16, dequantize, matmul, matmul_sparse, QMatrix, QuantSpec};
use rand::{rngs::StdRng, Rng, SeedableRng};

const VOCAB: usize = 262_144;
const HIDDEN: usize = 256;
/// `tau * u` of the stated bound.
const TAU_U: f64 = 0.5 / (1u64 << 24) as f64;
const SOFTCAP: f64 = 30.0;

struct Table {
    packed: Vec<u32>,
    scales: Vec<bf16>,
    biases: Vec<bf16>,
}

impl Table {
    /// Embedding-like 4-bit rows (group 64): entries spread around zero, a few rows larger.
    fn random(rng: &mut StdRng) -> Self {
        let spec = QuantSpec::new(4, 64).unwrap();
        let groups = VOCAB * HIDDEN / 64;
        let packed = (0..VOCAB * spec.words_per_row(HIDDEN))
            .map(|_| rng.gen())
            .collect();
        let mut scales = Vec::with_capacity(groups);
        let mut biases = Vec::with_capacity(groups);
        for _ in 0..groups {
            let s: f32 = rng.gen_range(0.002..0.01) * if rng.gen_ratio(1, 100) { 8.0 } else { 1.0 };
            scales.push(bf16::from_f32(s));
            biases.push(bf16::from_f32(-7.5 * s * rng.gen_range(0.7..1.3)));
        }
        Table {
            packed,
            scales,
            biases,
        }
    }

    fn matrix(&self) -> QMatrix<'_> {
        let spec = QuantSpec::new(4, 64).unwrap();
        QMatrix::new(
            &self.packed,
            &self.scales,
            &self.biases,
            VOCAB,
            HIDDEN,
            spec,
        )
        .unwrap()
    }
}

fn normal(rng: &mut StdRng) -> f64 {
    let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Softmax probabilities of logits shaped like a language model's: a heavy-tailed bulk
/// (Student-t, 3 degrees of freedom) and `candidates` tokens 8-22 above it, soft-capped at 30,
/// divided by the temperature.
fn probs(rng: &mut StdRng, candidates: usize, temperature: f64) -> Vec<f32> {
    let mut logits: Vec<f64> = (0..VOCAB)
        .map(|_| {
            let chi: f64 = (0..3).map(|_| normal(rng).powi(2)).sum::<f64>() / 3.0;
            2.0 * normal(rng) / chi.sqrt()
        })
        .collect();
    for _ in 0..candidates {
        let v = rng.gen_range(0..VOCAB);
        logits[v] += rng.gen_range(8.0..22.0);
    }
    let logits: Vec<f32> = logits
        .iter()
        .map(|&x| ((x / SOFTCAP).tanh() * SOFTCAP / temperature) as f32)
        .collect();
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut p: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    for v in p.iter_mut() {
        *v /= sum;
    }
    p
}

#[test]
fn sparse_soft_embeddings_stay_within_the_bound_of_the_dense_sum() {
    let mut rng = StdRng::seed_from_u64(15);
    let table = Table::random(&mut rng);
    let w = table.matrix();
    let a = row_max_abs(&w);
    let mut x = Vec::new();
    let mut temps = Vec::new();
    for (ti, temperature) in [0.4, 0.6, 0.8, 1.0].into_iter().enumerate() {
        for candidates in [0usize, 1, 2, 5, 20] {
            x.extend(probs(&mut rng, candidates, temperature));
            temps.push((ti, temperature, candidates));
        }
    }
    let m = temps.len();
    let supports: Vec<Support> = x.chunks_exact(VOCAB).map(|p| support(p, &a)).collect();

    // Exact sums in f64: y over every entry, y' and the magnitude sum M over the kept ones.
    let mut kept_mask = vec![true; m * VOCAB];
    for (i, s) in supports.iter().enumerate() {
        if let Support::Sparse { kept, .. } = s {
            let mask = &mut kept_mask[i * VOCAB..(i + 1) * VOCAB];
            mask.fill(false);
            for &v in kept {
                mask[v as usize] = true;
            }
        }
    }
    let (mut y, mut y_kept, mut mag) = (
        vec![0.0f64; m * HIDDEN],
        vec![0.0f64; m * HIDDEN],
        vec![0.0f64; m * HIDDEN],
    );
    const CHUNK: usize = 4096;
    let words = w.spec().words_per_row(HIDDEN);
    let mut e = vec![0.0f32; CHUNK * HIDDEN];
    for v0 in (0..VOCAB).step_by(CHUNK) {
        let g = HIDDEN / 64;
        let part = QMatrix::new(
            &table.packed[v0 * words..(v0 + CHUNK) * words],
            &table.scales[v0 * g..(v0 + CHUNK) * g],
            &table.biases[v0 * g..(v0 + CHUNK) * g],
            CHUNK,
            HIDDEN,
            w.spec(),
        )
        .unwrap();
        dequantize(&part, &mut e).unwrap();
        for i in 0..m {
            let (yi, yk, mi) = (
                &mut y[i * HIDDEN..(i + 1) * HIDDEN],
                &mut y_kept[i * HIDDEN..(i + 1) * HIDDEN],
                &mut mag[i * HIDDEN..(i + 1) * HIDDEN],
            );
            for (j, row) in e.chunks_exact(HIDDEN).enumerate() {
                let v = v0 + j;
                let p = x[i * VOCAB + v] as f64;
                if p == 0.0 {
                    continue;
                }
                let kept = kept_mask[i * VOCAB + v];
                for c in 0..HIDDEN {
                    let t = p * row[c] as f64;
                    yi[c] += t;
                    if kept {
                        yk[c] += t;
                        mi[c] += t.abs();
                    }
                }
            }
        }
    }

    let mut sparse_out = vec![0.0f32; m * HIDDEN];
    let stats = matmul_sparse(&x, m, &w, &mut sparse_out).unwrap();
    let mut dense_out = vec![0.0f32; m * HIDDEN];
    matmul(&x, m, &w, &mut dense_out).unwrap();

    let mut sparse_rows_at = [0usize; 4];
    for (i, s) in supports.iter().enumerate() {
        let r = i * HIDDEN..(i + 1) * HIDDEN;
        let (ti, temperature, candidates) = temps[i];
        let m_k = mag[r.clone()].iter().fold(0.0f64, |a, &b| a.max(b));
        let bound = TAU_U * m_k;
        let skip_err = (0..HIDDEN)
            .map(|c| (y[i * HIDDEN + c] - y_kept[i * HIDDEN + c]).abs())
            .fold(0.0f64, f64::max);
        let err = |out: &[f32]| {
            (0..HIDDEN)
                .map(|c| (out[i * HIDDEN + c] as f64 - y[i * HIDDEN + c]).abs())
                .fold(0.0f64, f64::max)
        };
        let (sparse_err, dense_err) = (err(&sparse_out), err(&dense_out));
        match s {
            Support::Dense => {
                eprintln!("T {temperature} candidates {candidates:2}: dense");
                assert_eq!(skip_err, 0.0);
                assert_eq!(
                    &sparse_out[r.clone()],
                    &dense_out[r],
                    "row {i}: dense rows are exact"
                );
            }
            Support::Sparse {
                kept,
                skipped_weight,
                budget,
            } => {
                sparse_rows_at[ti] += 1;
                let skipped: f64 = x[i * VOCAB..(i + 1) * VOCAB]
                    .iter()
                    .zip(&a)
                    .zip(&kept_mask[i * VOCAB..(i + 1) * VOCAB])
                    .filter(|(_, &k)| !k)
                    .map(|((&p, &a), _)| p.abs() as f64 * a as f64)
                    .sum();
                assert!((skipped - skipped_weight).abs() <= 1e-12 * skipped_weight.max(1e-30));
                assert!(
                    *skipped_weight <= *budget,
                    "row {i}: {skipped_weight} > {budget}"
                );
                // The stated bound, in exact arithmetic.
                assert!(
                    skip_err <= *skipped_weight && *budget <= bound,
                    "row {i}: skipped terms move an output by {skip_err:e} (weight \
                     {skipped_weight:e}, budget {budget:e}), bound {bound:e}"
                );
                // The f32 sparse sum is a faithful sum of its kept terms (recursive summation:
                // |error| <= gamma_k * sum |terms|, k = kept + 1). Its rounding, not the
                // skipping, dominates its distance to the exact dense sum, as the dense kernel's
                // own rounding does (printed below).
                let k = (kept.len() + 1) as f64;
                let u = 2f64.powi(-24);
                for c in 0..HIDDEN {
                    let at = i * HIDDEN + c;
                    let gamma = k * u / (1.0 - k * u);
                    assert!(
                        (sparse_out[at] as f64 - y_kept[at]).abs() <= gamma * mag[at] + 1e-30,
                        "row {i} column {c}"
                    );
                }
                eprintln!(
                    "T {temperature} candidates {candidates:2}: kept {:6} of {VOCAB}, \
                     skipped weight {skipped_weight:.2e}, |y - y'| {skip_err:.2e} <= bound \
                     {bound:.2e}; max error vs exact: sparse {sparse_err:.2e}, dense \
                     {dense_err:.2e}",
                    kept.len()
                );
            }
        }
    }
    assert_eq!(stats.sparse_rows + stats.dense_rows, m);
    // Rows with a clear favourite skip most of the vocabulary at every temperature tested.
    assert!(
        sparse_rows_at.iter().all(|&n| n >= 2),
        "sparse rows per temperature 0.4, 0.6, 0.8, 1.0: {sparse_rows_at:?}"
    );
}
