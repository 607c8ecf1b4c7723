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

use crate::format::{check_len, mul, QRow};
use crate::kernels::gemm::column_panels;
use crate::kernels::{dequant_value, prefetch, with_kernel, Kernel};
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
/// Columns of the gathered product whose accumulator one output row keeps in registers.
const PIECE_COLS: usize = 256;
/// Rows of `W` the gathered product holds dequantized at once (the panel's part of each).
const VOCAB_BLOCK: usize = 64;
/// Bytes of the gathered product's accumulators (every output row over one column panel)
/// kept within L2 (half of a 1 MB L2), which bounds the panel's width.
const ACC_BYTES: usize = 512 << 10;

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
        let os = with_kernel!(kernels, k => gathered_product(k, x, w, &sparse));
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
/// `v`. The used rows of `W` go in blocks of `VOCAB_BLOCK`, each dequantized once per column
/// block; an output row's accumulator stays in registers over its entries of a block
/// ([`Kernel::fma_terms`]), the same fmas in the same order as one `axpy` per entry.
fn gathered_product(
    kern: impl Kernel,
    x: &[f32],
    w: &QMatrix,
    sparse: &[(usize, &[u32])],
) -> Vec<f32> {
    let mut is_used = vec![false; w.rows];
    for (_, kept) in sparse {
        for &v in *kept {
            is_used[v as usize] = true;
        }
    }
    let used: Vec<u32> = (0..w.rows as u32)
        .filter(|&v| is_used[v as usize])
        .collect();
    let blocks = vocab_blocks(x, w.rows, sparse, &used);
    let (n, cols) = (sparse.len(), w.cols);
    let mut out = vec![0.0f32; n * cols];
    let width = panel_width((n, cols), w.spec.group_size, rayon::current_num_threads());
    column_panels(&mut out, (n, cols), width, true, |mut panel| {
        let (c0, cw) = (panel.start(), panel.width());
        // Pieces of the panel whose accumulators fit the registers, `(first column, width)`;
        // a block's rows are held piece by piece (`VOCAB_BLOCK` rows of each piece together).
        let pieces: Vec<(usize, usize)> = (0..cw)
            .step_by(PIECE_COLS)
            .map(|p0| (p0, PIECE_COLS.min(cw - p0)))
            .collect();
        let mut acc = vec![0.0f32; n * cw];
        let mut sum = vec![0.0f32; n * cw];
        let mut rows = vec![0.0f32; VOCAB_BLOCK * cw];
        let part = |v: u32| w.row(v as usize).part(c0, c0 + cw);
        for (b, block) in blocks.iter().enumerate() {
            let vocab = &used[block.first..block.first + block.len];
            // The next block's rows, one per row dequantized here: scattered over the table,
            // they would each wait on memory.
            let next = blocks
                .get(b + 1)
                .map_or(&[][..], |n| &used[n.first..n.first + n.len]);
            for (i, &v) in vocab.iter().enumerate() {
                if let Some(&n) = next.get(i) {
                    prefetch_row(part(n));
                }
                let row = part(v);
                for &(p0, pw) in &pieces {
                    let e = &mut rows[VOCAB_BLOCK * p0 + i * pw..][..pw];
                    kern.dequant_row(row.part(p0, p0 + pw), e);
                }
            }
            // A shorter block leaves the rest of the next one to fetch now.
            for &n in next.iter().skip(vocab.len()) {
                prefetch_row(part(n));
            }
            for &(j, t0, t1) in &block.rows {
                let (j, terms) = (j as usize, &block.terms[t0 as usize..t1 as usize]);
                for &(p0, pw) in &pieces {
                    let piece_rows = &rows[VOCAB_BLOCK * p0..][..block.len * pw];
                    kern.fma_terms(terms, piece_rows, &mut acc[j * cw + p0..][..pw]);
                }
            }
            if block.ends_chunk {
                flush(&mut acc, &mut sum);
            }
        }
        for j in 0..n {
            panel.row_mut(j).copy_from_slice(&sum[j * cw..(j + 1) * cw]);
        }
    });
    out
}

/// Column panels of the gathered product over `[n, cols]`: two per thread, so that each table
/// row is read in few, long parts (a part per panel, each a wait on memory), but no wider than
/// keeps the accumulators within `ACC_BYTES`; whole groups.
fn panel_width((n, cols): (usize, usize), group_size: usize, threads: usize) -> usize {
    let shares = cols.div_ceil(2 * threads.max(1));
    let fits = ACC_BYTES / (4 * n.max(1));
    (shares.min(fits) / group_size).max(1) * group_size
}

/// Hints the cache to fetch one table row's part (words, scales, biases).
fn prefetch_row(row: QRow<'_>) {
    prefetch(row.words);
    prefetch(row.scales);
    prefetch(row.biases);
}

/// Up to `VOCAB_BLOCK` consecutive used rows of `W`, all in one `REDUCE_ROWS` chunk, and the
/// kept entries that read them, by output row.
struct VocabBlock {
    /// Index of the block's first row in the used rows.
    first: usize,
    len: usize,
    /// The last block of its chunk: the partial sums are added to the totals after it.
    ends_chunk: bool,
    /// `(output row, start, end)` into `terms`, for every output row with entries here.
    rows: Vec<(u32, u32, u32)>,
    /// `(index into the block's rows, probability)`, each output row's in ascending `v`.
    terms: Vec<(u32, f32)>,
}

/// The used rows (ascending) in blocks, with each output row's entries per block (each row's
/// kept indices are ascending, so a block's share of them is one slice).
fn vocab_blocks(
    x: &[f32],
    width: usize,
    sparse: &[(usize, &[u32])],
    used: &[u32],
) -> Vec<VocabBlock> {
    let mut spans = Vec::new();
    let mut first = 0;
    while first < used.len() {
        let chunk = used[first] as usize / REDUCE_ROWS;
        let mut end = first + 1;
        while end < used.len()
            && end - first < VOCAB_BLOCK
            && used[end] as usize / REDUCE_ROWS == chunk
        {
            end += 1;
        }
        let ends_chunk = end == used.len() || used[end] as usize / REDUCE_ROWS != chunk;
        spans.push((first, end - first, ends_chunk));
        first = end;
    }
    // Each row's kept probabilities, read in one sweep per row (scattered over the row, they
    // are misses that overlap here, not one at a time below).
    let values: Vec<Vec<f32>> = sparse
        .par_iter()
        .map(|&(i, kept)| {
            let p = &x[i * width..(i + 1) * width];
            kept.iter().map(|&v| p[v as usize]).collect()
        })
        .collect();
    spans
        .into_par_iter()
        .map(|(first, len, ends_chunk)| {
            let vocab = &used[first..first + len];
            let (lo, hi) = (vocab[0], vocab[len - 1]);
            let (mut rows, mut terms) = (Vec::new(), Vec::new());
            for (j, (&(_, kept), values)) in sparse.iter().zip(&values).enumerate() {
                let (a, b) = (
                    kept.partition_point(|&v| v < lo),
                    kept.partition_point(|&v| v <= hi),
                );
                if a == b {
                    continue;
                }
                let t0 = terms.len() as u32;
                let mut local = 0;
                for (&v, &p) in kept[a..b].iter().zip(&values[a..b]) {
                    while vocab[local] != v {
                        local += 1;
                    }
                    terms.push((local as u32, p));
                }
                rows.push((j as u32, t0, terms.len() as u32));
            }
            VocabBlock {
                first,
                len,
                ends_chunk,
                rows,
                terms,
            }
        })
        .collect()
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

    /// The gathered product as one `axpy` per kept entry, in ascending `v`, the partial sums
    /// added at every `REDUCE_ROWS` boundary: the plain statement of what `gathered_product`
    /// computes.
    fn gathered_by_axpy(x: &[f32], w: &QMatrix, sparse: &[(usize, &[u32])]) -> Vec<f32> {
        let cols = w.cols;
        let mut acc = vec![0.0f32; sparse.len() * cols];
        let mut sum = acc.clone();
        let mut e = vec![0.0f32; cols];
        for chunk in 0..w.rows.div_ceil(REDUCE_ROWS) {
            for v in chunk * REDUCE_ROWS..((chunk + 1) * REDUCE_ROWS).min(w.rows) {
                crate::kernels::Scalar.dequant_row(w.row(v), &mut e);
                for (j, &(i, kept)) in sparse.iter().enumerate() {
                    if kept.binary_search(&(v as u32)).is_ok() {
                        let p = x[i * w.rows + v];
                        let a = &mut acc[j * cols..(j + 1) * cols];
                        crate::kernels::Scalar.axpy(p, &e, a);
                    }
                }
            }
            flush(&mut acc, &mut sum);
        }
        sum
    }

    #[test]
    fn gathered_product_is_one_axpy_per_entry_in_vocabulary_order() {
        let mut rng = StdRng::seed_from_u64(11);
        let spec = crate::QuantSpec::new(4, 64).unwrap();
        // Three REDUCE_ROWS chunks; on one and two threads, column panels of 640 and 320
        // columns (pieces of 256 and a partial one) and a last, narrower panel.
        let (rows, cols) = (2 * REDUCE_ROWS + 3000, 1344);
        let packed: Vec<u32> = (0..rows * spec.words_per_row(cols))
            .map(|_| rng.gen())
            .collect();
        let params = |rng: &mut StdRng, scale: f32| -> Vec<crate::bf16> {
            (0..rows * cols / 64)
                .map(|_| crate::bf16::from_f32(rng.gen_range(-1.0f32..1.0) * scale))
                .collect()
        };
        let (scales, biases) = (params(&mut rng, 0.01), params(&mut rng, 0.05));
        let w = QMatrix::new(&packed, &scales, &biases, rows, cols, spec).unwrap();
        let m = 6;
        let x: Vec<f32> = (0..m * rows)
            .map(|_| rng.gen_range(0.0f32..1.0).powi(8))
            .collect();
        // Kept sets from dense runs (more than a block of 64 used rows in a row) to a few
        // scattered entries, one row keeping nothing, one row not taking part.
        let kept: Vec<Vec<u32>> = vec![
            (0..rows as u32)
                .filter(|v| v % 97 == 0 || (9000..9300).contains(v))
                .collect(),
            (0..rows as u32).filter(|v| v % 1013 == 5).collect(),
            Vec::new(),
            (0..rows as u32).filter(|_| rng.gen_ratio(1, 40)).collect(),
            (8100..8300).collect(),
        ];
        let sparse: Vec<(usize, &[u32])> = [0usize, 1, 2, 4, 5]
            .iter()
            .zip(&kept)
            .map(|(&i, k)| (i, k.as_slice()))
            .collect();
        let want = gathered_by_axpy(&x, &w, &sparse);
        for threads in [1, 2] {
            let pool = crate::pool::build(Some(threads)).unwrap();
            for kernels in crate::Kernels::available() {
                let got = pool
                    .install(|| with_kernel!(kernels, k => gathered_product(k, &x, &w, &sparse)));
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{kernels}, {threads} threads: the gathered product differs from one axpy per entry"
                );
            }
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
