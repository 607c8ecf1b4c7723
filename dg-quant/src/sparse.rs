//! `x @ W` for probability rows (the soft-embedding product `probs @ embed`) reading only the
//! rows of `W` that matter.
//!
//! After a softmax over a 262144-token vocabulary almost every probability is far below f32
//! resolution of the result, yet the dense product reads and multiplies every row of `W`.
//! Here each row of `x` drops its smallest entries, as long as their total weight stays within
//! a budget that bounds the change of the result far below the dense sum's own rounding:
//!
//! **Bound.** For a row `p` of `x`, let `a_v = max_c |W[v, c]|` (each table row's largest
//! entry magnitude), `t = argmax_v |p_v| a_v`, `u = 2^-24` (f32 unit roundoff) and
//! `tau = 1/2`. The skipped set `S` has `sum_{v in S} |p_v| a_v <= tau * u * |p_t| a_t`. Then
//! for every column `c`, with `y` the exact dense sum and `y'` the exact sum over the kept set
//! `K`:
//!
//! `|y_c - y'_c| = |sum_{v in S} p_v W[v, c]| <= sum_{v in S} |p_v| a_v <= tau * u * |p_t| a_t
//!   <= tau * u * max_c sum_{v in K} |p_v| |W[v, c]|`
//!
//! (`t` is always kept: its own weight exceeds the budget). So each output moves by at most
//! half a unit roundoff of the row's largest magnitude sum `max_c sum |p_v| |W[v, c]|`, the
//! quantity every f32 rounding error of this product scales with: the dense f32 sum's own
//! worst-case error is `gamma_k * sum_v |p_v| |W[v, c]|` (`gamma_k = k u / (1 - k u)`, `k` the
//! summation depth, thousands here), and its final rounding alone is up to `u |y_c|`. The soft
//! embeddings are RMS-normed next, so an error relative to the row's scale is the one that
//! counts. `tests/sparse_soft.rs` checks the bound in f64 on real-vocabulary heavy-tailed rows.
//!
//! **Selection without a sort.** Entries are bucketed by the top bits of the f32 pattern of
//! their weight `|p_v| a_v` (exponent and 3 mantissa bits, so a bucket spans at most 12.5% in
//! value); the weight of the buckets below the budget is summed in f64 (each product of two
//! f32 is exact in f64), and whole buckets are skipped from the smallest up while the running
//! sum stays within the budget (the boundary bucket is kept whole, which only keeps more).
//! Exact zeros are always skipped (they add nothing).
//!
//! **Product.** Rows that keep more than `1 / DENSE_FRACTION` of the vocabulary gain nothing
//! from skipping: they take the dense kernel ([`crate::matmul`], which computes every row as
//! it would alone, so those rows get exactly the dense bits). The others are gathered by
//! vocabulary row (each kept row of `W` is dequantized once per column block for all the rows
//! of `x` that keep it) and accumulated in vocabulary order, in partial sums over fixed
//! vocabulary chunks added in chunk order (as the dense kernel does, so the many small terms
//! do not all round against the one large one). Every output row depends only on its own row
//! of `x`: a sequence gets the same soft embeddings whatever it is batched with.

use rayon::prelude::*;

use crate::format::{check_len, mul};
use crate::kernels::gemm::column_panels;
use crate::kernels::{dequant_value, with_kernel, Kernel};
use crate::{Product, QMatrix, QuantError};

/// `tau` of the bound: the skipped weight may move an output by `tau * u` of the row's scale.
const TAU: f64 = 0.5;
/// f32 unit roundoff.
const UNIT_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;
/// Safety factor on the budget covering the f64 rounding of the summed weights (at most
/// `2^20 * 2^-53` relative for a vocabulary under 2^20 rows; far more margin than needed).
const MASS_MARGIN: f64 = 1.0 - 1e-9;
/// Bucket of a non-negative f32: its bits shifted right by this (exponent + 3 mantissa bits).
const BUCKET_SHIFT: u32 = 20;
/// Buckets of non-negative finite f32 values.
const BUCKETS: usize = (0x7f80_0000 >> BUCKET_SHIFT) as usize;
/// A row keeping more than `rows(W) / DENSE_FRACTION` entries takes the dense kernel.
const DENSE_FRACTION: usize = 8;
/// Vocabulary rows per partial sum of the gathered product.
const REDUCE_ROWS: usize = 8192;
/// Output columns per task of the gathered product (a multiple of every group size).
const BLOCK_COLS: usize = 256;

/// Which entries of one probability row the sparse product reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Support {
    /// Every entry (too few can be skipped, or the row is not finite): the dense kernel.
    Dense,
    /// Only `kept` (ascending indices into the row).
    Sparse {
        /// Indices of the entries read, ascending.
        kept: Vec<u32>,
        /// `sum |p_v| a_v` over the skipped entries (f64).
        skipped_weight: f64,
        /// What the bound allowed to skip, `tau * u * max_v |p_v| a_v`.
        budget: f64,
    },
}

/// What one [`matmul_sparse`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparseStats {
    /// Rows of `x` that took the dense kernel.
    pub dense_rows: usize,
    /// Rows of `x` computed from their kept entries only.
    pub sparse_rows: usize,
    /// Entries read over all sparse rows.
    pub kept: usize,
}

/// `a_v = max_c |W[v, c]|` for every row `v`, exactly as dequantized: `fl(fl(s * q) + b)` is
/// monotonic in `q`, so each group's extreme values are at `q = 0` and `q = 2^bits - 1`.
pub fn row_max_abs(w: &QMatrix) -> Vec<f32> {
    let q_max = w.spec.max_q();
    let mut out = vec![0.0f32; w.rows];
    out.par_chunks_mut(4096).enumerate().for_each(|(k, out)| {
        for (i, o) in out.iter_mut().enumerate() {
            let row = w.row(k * 4096 + i);
            *o = row.scales.iter().zip(row.biases).fold(0.0f32, |m, (s, b)| {
                let (s, b) = (s.to_f32(), b.to_f32());
                let hi = dequant_value(q_max, s, b);
                m.max(b.abs()).max(hi.abs())
            });
        }
    });
    out
}

/// Bucket and exact weight `|p| a` of one entry.
#[inline]
fn bucket(p: f32, a: f32) -> (u32, f64) {
    let weight = p.abs() as f64 * a as f64;
    ((weight as f32).to_bits() >> BUCKET_SHIFT, weight)
}

/// The entries of probability row `p` that [`matmul_sparse`] reads, given the table's row
/// maxima `a` ([`row_max_abs`], one per entry of `p`).
pub fn support(p: &[f32], a: &[f32]) -> Support {
    if p.len() != a.len() {
        return Support::Dense;
    }
    // One pass: the largest weight, finiteness, and per bucket the summed weight and the count
    // of non-zero entries. Every bucket is summed in entry order, so the buckets that can be
    // skipped (those below the budget's, known only at the end) hold exactly their entries' sum.
    let (mut w_max, mut finite) = (0.0f64, true);
    let mut mass = vec![0.0f64; BUCKETS];
    let mut nonzero = vec![0u32; BUCKETS];
    let mut nonzero_total = 0usize;
    for (&v, &a) in p.iter().zip(a) {
        finite &= v.is_finite() && a.is_finite();
        let (b, weight) = bucket(v, a);
        w_max = w_max.max(weight);
        nonzero_total += usize::from(v != 0.0);
        if let (Some(m), Some(n)) = (mass.get_mut(b as usize), nonzero.get_mut(b as usize)) {
            *m += weight;
            *n += u32::from(v != 0.0);
        }
    }
    if !finite {
        return Support::Dense;
    }
    let budget = TAU * UNIT_ROUNDOFF * w_max;
    // Only buckets below the budget's can be skipped.
    let limit = (((budget as f32).to_bits() >> BUCKET_SHIFT) as usize).min(BUCKETS);
    let (mut skipped, mut cut, mut kept) = (0.0f64, 0u32, nonzero_total);
    for (m, n) in mass[..limit].iter().zip(&nonzero) {
        if skipped + m > budget * MASS_MARGIN {
            break;
        }
        skipped += m;
        cut += 1;
        kept -= *n as usize;
    }
    if kept > p.len() / DENSE_FRACTION {
        return Support::Dense;
    }
    let mut indices = Vec::with_capacity(kept);
    indices.extend(
        p.iter()
            .zip(a)
            .enumerate()
            .filter(|&(_, (&v, &a))| v != 0.0 && bucket(v, a).0 >= cut)
            .map(|(i, _)| i as u32),
    );
    Support::Sparse {
        kept: indices,
        skipped_weight: skipped,
        budget,
    }
}

/// `out [m, cols] ≈ x [m, rows] @ W` for rows of probabilities: each row skips its smallest
/// entries within the bound of the module doc (rows that cannot skip enough are computed by
/// [`crate::matmul`] exactly). Any finite `x` is accepted; the bound holds for it as stated.
pub fn matmul_sparse(
    x: &[f32],
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
) -> Result<SparseStats, QuantError> {
    check_len(
        "matmul_sparse input x",
        x.len(),
        mul("matmul_sparse input x", m, w.rows)?,
    )?;
    check_len(
        "matmul_sparse output",
        out.len(),
        mul("matmul_sparse output", m, w.cols)?,
    )?;
    if m == 0 || w.cols == 0 || w.rows == 0 {
        return crate::matmul(x, m, w, out).map(|()| SparseStats::default());
    }
    let a = row_max_abs(w);
    let supports: Vec<Support> = x.par_chunks_exact(w.rows).map(|p| support(p, &a)).collect();
    let cols = w.cols;
    let dense: Vec<usize> = (0..m).filter(|&i| supports[i] == Support::Dense).collect();
    if dense.len() == m {
        // Every row dense (flat rows): the product in place, without gathering the rows.
        crate::matmul(x, m, w, out)?;
    } else if !dense.is_empty() {
        let xd: Vec<f32> = dense
            .iter()
            .flat_map(|&i| &x[i * w.rows..(i + 1) * w.rows])
            .copied()
            .collect();
        let mut od = vec![0.0f32; dense.len() * cols];
        crate::matmul(&xd, dense.len(), w, &mut od)?;
        for (&i, o) in dense.iter().zip(od.chunks_exact(cols)) {
            out[i * cols..(i + 1) * cols].copy_from_slice(o);
        }
    }
    let sparse: Vec<(usize, &[u32])> = supports
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Support::Sparse { kept, .. } => Some((i, kept.as_slice())),
            Support::Dense => None,
        })
        .collect();
    let kept: usize = sparse.iter().map(|(_, k)| k.len()).sum();
    if !sparse.is_empty() {
        let kernels = w.plan(Product::XW).kernels();
        let os = with_kernel!(kernels, k => gathered_product(k, x, w, &sparse, kept));
        for (&(i, _), o) in sparse.iter().zip(os.chunks_exact(cols)) {
            out[i * cols..(i + 1) * cols].copy_from_slice(o);
        }
    }
    Ok(SparseStats {
        dense_rows: dense.len(),
        sparse_rows: sparse.len(),
        kept,
    })
}

/// `[sparse.len(), cols]`: row `j` is `sum_{v in kept_j} x[i_j, v] * W[v, :]`, in ascending
/// `v`. The kept entries are regrouped by `v` (a counting sort), so each column block
/// dequantizes every needed row of `W` once.
fn gathered_product(
    kern: impl Kernel,
    x: &[f32],
    w: &QMatrix,
    sparse: &[(usize, &[u32])],
    total: usize,
) -> Vec<f32> {
    let mut start = vec![0u32; w.rows + 1];
    for (_, kept) in sparse {
        for &v in *kept {
            start[v as usize + 1] += 1;
        }
    }
    for v in 0..w.rows {
        start[v + 1] += start[v];
    }
    let mut fill = start.clone();
    let mut entries = vec![(0u32, 0.0f32); total];
    for (j, &(i, kept)) in sparse.iter().enumerate() {
        let row = &x[i * w.rows..(i + 1) * w.rows];
        for &v in kept {
            let at = &mut fill[v as usize];
            entries[*at as usize] = (j as u32, row[v as usize]);
            *at += 1;
        }
    }
    let used: Vec<u32> = (0..w.rows as u32)
        .filter(|&v| start[v as usize + 1] > start[v as usize])
        .collect();
    let (n, cols) = (sparse.len(), w.cols);
    let mut out = vec![0.0f32; n * cols];
    column_panels(&mut out, (n, cols), BLOCK_COLS, true, |mut panel| {
        let (c0, cw) = (panel.start(), panel.width());
        let mut acc = vec![0.0f32; n * cw];
        let mut sum = vec![0.0f32; n * cw];
        let mut e = vec![0.0f32; cw];
        let mut chunk = 0;
        for &v in &used {
            let v = v as usize;
            if v / REDUCE_ROWS != chunk {
                chunk = v / REDUCE_ROWS;
                flush(&mut acc, &mut sum);
            }
            kern.dequant_row(w.row(v).part(c0, c0 + cw), &mut e);
            for &(j, p) in &entries[start[v] as usize..start[v + 1] as usize] {
                let j = j as usize;
                kern.axpy(p, &e, &mut acc[j * cw..(j + 1) * cw]);
            }
        }
        flush(&mut acc, &mut sum);
        for j in 0..n {
            panel.row_mut(j).copy_from_slice(&sum[j * cw..(j + 1) * cw]);
        }
    });
    out
}

/// `sum += acc; acc = 0` (one chunk's partial sums into the running total).
fn flush(acc: &mut [f32], sum: &mut [f32]) {
    for (s, a) in sum.iter_mut().zip(acc.iter_mut()) {
        *s += *a;
        *a = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The selection as three separate passes (largest weight, bucket masses below the budget,
    /// kept entries), the plain statement of the rule `support` computes in one pass.
    fn support_three_passes(p: &[f32], a: &[f32]) -> Support {
        let (mut w_max, mut finite) = (0.0f64, true);
        for (v, a) in p.iter().zip(a) {
            finite &= v.is_finite() && a.is_finite();
            w_max = w_max.max(v.abs() as f64 * *a as f64);
        }
        if !finite {
            return Support::Dense;
        }
        let budget = TAU * UNIT_ROUNDOFF * w_max;
        let limit = ((budget as f32).to_bits() >> BUCKET_SHIFT) as usize;
        let mut mass = vec![0.0f64; limit.min(BUCKETS)];
        for (&v, &a) in p.iter().zip(a) {
            let (b, weight) = bucket(v, a);
            if let Some(m) = mass.get_mut(b as usize) {
                *m += weight;
            }
        }
        let (mut skipped, mut cut) = (0.0f64, 0u32);
        for m in &mass {
            if skipped + m > budget * MASS_MARGIN {
                break;
            }
            skipped += m;
            cut += 1;
        }
        let kept: Vec<u32> = (0..p.len() as u32)
            .filter(|&i| p[i as usize] != 0.0 && bucket(p[i as usize], a[i as usize]).0 >= cut)
            .collect();
        if kept.len() > p.len() / DENSE_FRACTION {
            return Support::Dense;
        }
        Support::Sparse {
            kept,
            skipped_weight: skipped,
            budget,
        }
    }

    #[test]
    fn one_pass_selection_equals_three_passes() {
        let mut rng = StdRng::seed_from_u64(7);
        let n = 20000;
        let a: Vec<f32> = (0..n).map(|_| rng.gen_range(0.0f32..2.0)).collect();
        let (mut sparse, mut dense) = (0, 0);
        for case in 0..60 {
            // Heavy-tailed rows from flat (dense) to peaked, with exact zeros and, in a few
            // rows, a non-finite entry or a weight whose f32 rounding overflows.
            let spread = 2.0 + 5.0 * case as f32;
            let mut p: Vec<f32> = (0..n)
                .map(|_| {
                    let z: f32 = rng.gen_range(-spread..0.0);
                    if rng.gen_range(0..10) == 0 {
                        0.0
                    } else {
                        z.exp()
                    }
                })
                .collect();
            let mut a = a.clone();
            match case % 10 {
                3 => p[17] = f32::NAN,
                5 => a[99] = f32::INFINITY,
                7 => (p[5], a[5]) = (3.0e38, 3.0e38),
                _ => {}
            }
            let expected = support_three_passes(&p, &a);
            match &expected {
                Support::Dense => dense += 1,
                Support::Sparse { .. } => sparse += 1,
            }
            assert_eq!(support(&p, &a), expected, "case {case}");
        }
        assert!(
            sparse > 0 && dense > 0,
            "both outcomes: {sparse} sparse, {dense} dense"
        );
    }
}
