//! Quantized matrix products (`mx.quantized_matmul`, `mx.gather_qmm`) and the plain f32 GEMM.
//!
//! Two strategies, chosen by the number of activation rows `m`:
//! - few rows (memory-bound): fused kernels read each packed weight once and never build the
//!   f32 matrix (`x . W[r]` as `sum_g scale_g * (x_g . q_g) + bias_g * sum(x_g)`);
//! - many rows (compute-bound): a panel of `W` is dequantized (exactly, as `dequantize`) into
//!   a per-thread f32 buffer and multiplied with the `gemm` crate; the dequantization is
//!   amortized over the rows.
//!
//! Work is split into fixed panels independent of the thread count, and each output element
//! is reduced by one task in a fixed order, so results do not depend on the pool size. They
//! may differ in the last bits between strategies (a different summation order), i.e. with
//! `m`. MLX itself sums `x_k * (scale * q_k + bias)` sequentially in f32 (`_qmm_t`); see
//! tests/goldens.rs for the tolerance this implies.

use rayon::prelude::*;

use crate::format::{check_len, mul};
use crate::kernels::{self, gemm::par_column_panels};
use crate::scratch::with_buffer;
use crate::{QExperts, QMatrix, QuantError};

/// Up to this many activation rows use the fused (memory-bound) kernels.
const FUSED_MAX_M: usize = 3;
/// Output rows of `W` per task in the fused `x @ W^T` kernel.
const FUSED_ROWS_PER_TASK: usize = 64;
/// Rows of `W` dequantized per panel in the GEMM path of `x @ W^T`.
const PANEL_ROWS: usize = 64;
/// Output columns per task of `x @ W` (a multiple of every group size).
const PANEL_COLS: usize = 256;
/// Rows of `W` (the reduction axis) dequantized per step of `x @ W`.
const PANEL_DEPTH: usize = 256;

fn check_x(what: &'static str, x: &[f32], m: usize, width: usize) -> Result<(), QuantError> {
    check_len(what, x.len(), mul(what, m, width)?)
}

/// `out [m, rows] = x [m, cols] @ W^T` (`mx.quantized_matmul(x, w, scales, biases,
/// transpose=True)`).
pub fn matmul_t(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) -> Result<(), QuantError> {
    check_x("matmul_t input x", x, m, w.cols)?;
    check_len(
        "matmul_t output",
        out.len(),
        mul("matmul_t output", m, w.rows)?,
    )?;
    matmul_t_unchecked(x, m, w, out);
    Ok(())
}

/// `matmul_t` after validation.
fn matmul_t_unchecked(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
    if m == 0 || w.rows == 0 {
        return;
    }
    if w.cols == 0 {
        out.fill(0.0);
        return;
    }
    if m <= FUSED_MAX_M {
        matmul_t_fused(x, m, w, out, true);
    } else {
        matmul_t_panels(x, m, w, out, true);
    }
}

/// Fused path: each task owns `FUSED_ROWS_PER_TASK` rows of `W` and computes them for every
/// row of `x` while they are in cache.
fn matmul_t_fused(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
    let xs: Vec<kernels::PreparedX> = x.chunks_exact(w.cols).map(|xr| kernels::prepare_x(xr, w.spec)).collect();
    let task = |panel: &mut kernels::gemm::ColumnPanel<'_>| {
        let (r0, r1) = (panel.start(), panel.start() + panel.width());
        let rows = w.row_slice(r0, r1);
        for (i, xp) in xs.iter().enumerate() {
            kernels::dot_rows(xp, rows.packed, rows.scales, rows.biases, w.spec, panel.row_mut(i));
        }
    };
    if parallel {
        par_column_panels(out, m, w.rows, FUSED_ROWS_PER_TASK, |mut p| task(&mut p));
    } else {
        kernels::gemm::seq_column_panels(out, m, w.rows, w.rows, |mut p| task(&mut p));
    }
}

/// Dequantizes rows `r0..r1` of `w` into `buf [(r1 - r0), cols]`.
fn dequant_rows(w: &QMatrix, r0: usize, r1: usize, buf: &mut [f32]) {
    for (r, row) in (r0..r1).zip(buf.chunks_exact_mut(w.cols)) {
        let (s, b) = w.row_params(r);
        kernels::dequant_row(w.row_words(r), s, b, w.spec, row);
    }
}

/// GEMM path: each task dequantizes `PANEL_ROWS` rows of `W` and multiplies them with all of
/// `x`.
fn matmul_t_panels(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
    let k = w.cols;
    let task = |panel: &mut kernels::gemm::ColumnPanel<'_>| {
        let (r0, nr) = (panel.start(), panel.width());
        with_buffer(nr * k, |buf| {
            dequant_rows(w, r0, r0 + nr, buf);
            // rhs[kk][j] = W[r0 + j][kk]: row stride 1, column stride k.
            panel.gemm(k, false, x, k, buf, 1, k);
        });
    };
    if parallel {
        par_column_panels(out, m, w.rows, PANEL_ROWS, |mut p| task(&mut p));
    } else {
        kernels::gemm::seq_column_panels(out, m, w.rows, PANEL_ROWS, |mut p| task(&mut p));
    }
}

/// `out [m, cols] = x [m, rows] @ W` (`mx.quantized_matmul(..., transpose=False)`; the
/// soft-embedding product `probs @ embed`).
pub fn matmul(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) -> Result<(), QuantError> {
    check_x("matmul input x", x, m, w.rows)?;
    check_len("matmul output", out.len(), mul("matmul output", m, w.cols)?)?;
    if m == 0 || w.cols == 0 {
        return Ok(());
    }
    if w.rows == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let (g, bits) = (w.spec.group_size, w.spec.bits as usize);
    if m <= FUSED_MAX_M {
        // Each task owns a column range; rows of W stream through a small dequantized buffer
        // and are accumulated into every x row with fma, in row order.
        par_column_panels(out, m, w.cols, PANEL_COLS, |mut panel| {
            let (c0, cw) = (panel.start(), panel.width());
            for i in 0..m {
                panel.row_mut(i).fill(0.0);
            }
            with_buffer(cw, |buf| {
                for r in 0..w.rows {
                    let (s, b) = w.row_params(r);
                    let words = w.row_words(r);
                    kernels::dequant_row(
                        &words[c0 * bits / 32..(c0 + cw) * bits / 32],
                        &s[c0 / g..(c0 + cw) / g],
                        &b[c0 / g..(c0 + cw) / g],
                        w.spec,
                        buf,
                    );
                    for i in 0..m {
                        kernels::axpy(x[i * w.rows + r], buf, panel.row_mut(i));
                    }
                }
            });
        });
    } else {
        // Each task owns a column range and walks the reduction axis in fixed steps of
        // PANEL_DEPTH rows, dequantizing W[step, columns] and accumulating with gemm.
        par_column_panels(out, m, w.cols, PANEL_COLS, |mut panel| {
            let (c0, cw) = (panel.start(), panel.width());
            with_buffer(PANEL_DEPTH * cw, |buf| {
                for (step, r0) in (0..w.rows).step_by(PANEL_DEPTH).enumerate() {
                    let r1 = (r0 + PANEL_DEPTH).min(w.rows);
                    for (r, row) in (r0..r1).zip(buf.chunks_exact_mut(cw)) {
                        let (s, b) = w.row_params(r);
                        let words = w.row_words(r);
                        kernels::dequant_row(
                            &words[c0 * bits / 32..(c0 + cw) * bits / 32],
                            &s[c0 / g..(c0 + cw) / g],
                            &b[c0 / g..(c0 + cw) / g],
                            w.spec,
                            row,
                        );
                    }
                    panel.gemm(r1 - r0, step > 0, &x[r0..], w.rows, buf, cw, 1);
                }
            });
        });
    }
    Ok(())
}

/// MoE gathered product (`mx.gather_qmm(x, w, scales, biases, rhs_indices=..., transpose=True)`):
/// for each pair `p = (x_row, expert)`, `out[p, :] = x[x_row, :] @ W_expert^T`
/// (`out [pairs.len(), rows]`). Pairs are grouped by expert (stably, as MLX's sorted path does)
/// so each expert's weights are read once per call; experts run in parallel.
pub fn gather_matmul_t(
    x: &[f32],
    x_rows: usize,
    experts: &QExperts,
    pairs: &[(usize, usize)],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (k, n) = (experts.cols, experts.rows);
    check_x("gather_matmul_t input x", x, x_rows, k)?;
    check_len(
        "gather_matmul_t output",
        out.len(),
        mul("gather_matmul_t output", pairs.len(), n)?,
    )?;
    for (pair, &(x_row, expert)) in pairs.iter().enumerate() {
        if x_row >= x_rows || expert >= experts.experts {
            return Err(QuantError::PairOutOfRange {
                pair,
                x_row,
                expert,
                x_rows,
                experts: experts.experts,
            });
        }
    }
    if pairs.is_empty() || n == 0 {
        return Ok(());
    }
    // Stable counting sort of the pairs by expert.
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts.experts];
    for (p, &(_, e)) in pairs.iter().enumerate() {
        by_expert[e].push(p);
    }
    let work: Vec<(usize, &[usize])> = by_expert
        .iter()
        .enumerate()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|(e, ps)| (e, ps.as_slice()))
        .collect();
    let results: Vec<Result<Vec<f32>, QuantError>> = work
        .par_iter()
        .map(|&(e, ps)| {
            let w = experts.expert(e)?;
            let m = ps.len();
            let mut xs = vec![0.0f32; m * k];
            for (dst, &p) in xs.chunks_exact_mut(k.max(1)).zip(ps) {
                let r = pairs[p].0;
                dst.copy_from_slice(&x[r * k..(r + 1) * k]);
            }
            let mut res = vec![0.0f32; m * n];
            if k == 0 {
                return Ok(res);
            }
            // One expert is one task: its panels run sequentially on this thread.
            if m <= FUSED_MAX_M {
                matmul_t_fused(&xs, m, &w, &mut res, false);
            } else {
                matmul_t_panels(&xs, m, &w, &mut res, false);
            }
            Ok(res)
        })
        .collect();
    for (&(_, ps), res) in work.iter().zip(results) {
        let res = res?;
        for (&p, row) in ps.iter().zip(res.chunks_exact(n)) {
            out[p * n..(p + 1) * n].copy_from_slice(row);
        }
    }
    Ok(())
}

/// Plain f32 GEMM via the `gemm` crate: `out [m, n] = a [m, k] @ B`, where `B` is `b [k, n]`,
/// or `b [n, k]` transposed when `b_transposed`. Large products split across the current pool
/// (deterministically: the crate partitions outputs, never the reduction).
pub fn matmul_f32(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    b_transposed: bool,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_len("matmul_f32 lhs", a.len(), mul("matmul_f32 lhs", m, k)?)?;
    check_len("matmul_f32 rhs", b.len(), mul("matmul_f32 rhs", k, n)?)?;
    check_len(
        "matmul_f32 output",
        out.len(),
        mul("matmul_f32 output", m, n)?,
    )?;
    let (rhs_rs, rhs_cs) = if b_transposed { (1, k) } else { (n, 1) };
    kernels::gemm::gemm_strided(m, n, k, out, n, false, a, k, b, rhs_rs, rhs_cs, true);
    Ok(())
}
