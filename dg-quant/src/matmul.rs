//! Quantized matrix products (`mx.quantized_matmul`, `mx.gather_qmm`) and the plain f32 GEMM.
//!
//! The strategy of each product is chosen by the weights' format and the CPU, never by the
//! number of activation rows: every row is computed exactly as it would be alone, so a
//! sequence gets the same bits, and the same tokens, whatever it is batched with (tested by
//! `each_row_is_computed_as_it_is_alone`).
//!
//! `x [m, k] @ W^T`:
//! - 4- and 8-bit weights on AVX-512 (every layer of the real model): each task transposes 32
//!   weight rows' quantized values into a k-major f32 panel, 128 columns at a time, and
//!   broadcasts `x` against it in 12x32 register tiles (no row padding), applying each group's
//!   scale and bias to the partial sums: `x . W[r] = sum_g scale_g (x_g . q_g) + bias_g
//!   sum(x_g)`; `x` is taken in blocks of rows that stay in L2, one pass over the weights per
//!   block;
//! - otherwise `x` is transposed once; each task dequantizes (exactly, as `dequantize`)
//!   256-wide chunks of its weight rows and accumulates 16x6 register tiles.
//!
//! `x @ W` (soft embeddings): 256-column tasks walk the reduction axis in order with register
//! tiles, in fixed chunks of 32768 weight rows whose partial sums are added in chunk order (a
//! vocab-sized `W` gives enough tasks for a many-core CPU).
//!
//! `gather_matmul_t` groups the pairs by expert; each expert is one task.
//!
//! Work is split into fixed panels independent of the thread count, and each output element
//! is reduced by one task in a fixed order, so results depend neither on the pool size nor on
//! the other rows. MLX itself sums `x_k * (scale * q_k + bias)` sequentially in f32 without
//! FMA (`_qmm_t`; checked bit for bit); tests/goldens.rs states the tolerance this implies.

use rayon::prelude::*;

use crate::format::{check_len, mul};
use crate::kernels::{self, gemm::par_column_panels};
use crate::scratch::with_buffer;
use crate::{QExperts, QMatrix, QuantError};

/// Output columns per block of `x @ W`: a block's dequantized weights stay in L1/L2 (a
/// multiple of every group size).
const XW_BLOCK_COLS: usize = 256;
/// Columns per dequantized strip of `x @ W`: one 32-column register tile (AVX-512) or two
/// 16-column ones (AVX2); every group size is a multiple of it, so strips never straddle the
/// end of a row.
const XW_STRIP: usize = 32;
/// Rows of `W` (the reduction axis) dequantized per step of `x @ W`.
const PANEL_DEPTH: usize = 256;
/// Rows of `W` per reduction chunk of `x @ W` (a multiple of `PANEL_DEPTH`).
const XW_REDUCE_ROWS: usize = 32768;

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
    matmul_t_strategy(x, m, w, out, true);
}

/// Runs the strategy of `w`'s format on this CPU (see the module docs); `parallel`: panels
/// spread over the current pool, else run on this thread.
fn matmul_t_strategy(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
    if kernels::unpacked_panels(w.spec) {
        matmul_t_unpacked(x, m, w, out, parallel);
    } else {
        matmul_t_tiled(x, m, w, out, parallel);
    }
}

/// Rows of `W` per task in the tiled path.
const TILED_TASK_ROWS: usize = 24;
/// Reduction chunk of the tiled path: a 6-row strip of the dequantized rows and the matching
/// activation chunk stay in L1.
const TILED_KC: usize = 256;

/// Dequantizes columns `c0..c1` (group-aligned) of row `r` of `w` into `out`.
pub(crate) fn dequant_part(w: &QMatrix, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
    let (g, bits) = (w.spec.group_size, w.spec.bits as usize);
    let (s, b) = w.row_params(r);
    let words = w.row_words(r);
    kernels::dequant_row(
        &words[c0 * bits / 32..c1 * bits / 32],
        &s[c0 / g..c1 / g],
        &b[c0 / g..c1 / g],
        w.spec,
        out,
    );
}

/// `x [m, k]` transposed into `[k, m8]`, `m8 = m` rounded up to 8, zero-padded.
fn pack_xt(x: &[f32], m: usize, k: usize) -> (Vec<f32>, usize) {
    let m8 = m.div_ceil(8) * 8;
    let mut xt = vec![0.0f32; k * m8];
    for (i, xr) in x.chunks_exact(k).enumerate() {
        for (kk, v) in xr.iter().enumerate() {
            xt[kk * m8 + i] = *v;
        }
    }
    (xt, m8)
}

/// Tiled path: activations transposed once; each task dequantizes its `TILED_TASK_ROWS`
/// rows of `W` and accumulates register tiles over `TILED_KC`-wide chunks of them
/// (kernels::tiles), each output in k order.
fn matmul_t_tiled(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
    let k = w.cols;
    let (xt, m8) = pack_xt(x, m, k);
    let task = |panel: &mut kernels::gemm::ColumnPanel<'_>| {
        let (r0, nr) = (panel.start(), panel.width());
        // Whole rows first: they are contiguous in memory, so this streams at full bandwidth
        // (chunk-wide pieces of strided rows would be latency-bound).
        with_buffer(nr * k, |wbuf| {
            dequant_rows(w, r0, r0 + nr, wbuf);
            with_buffer(nr * m8, |ct| {
                // While this panel computes, pull the next one toward the cache, a slice per
                // chunk (weights streamed from DRAM otherwise stall the dequantization).
                let next =
                    (r0 + nr < w.rows).then(|| w.row_slice(r0 + nr, (r0 + 2 * nr).min(w.rows)));
                let chunks = k.div_ceil(TILED_KC);
                for (ci, k0) in (0..k).step_by(TILED_KC).enumerate() {
                    if let Some(nx) = &next {
                        let (len, step) = (nx.packed.len(), nx.packed.len().div_ceil(chunks));
                        kernels::prefetch(
                            &nx.packed[(ci * step).min(len)..((ci + 1) * step).min(len)],
                        );
                        if ci == 0 {
                            kernels::prefetch(nx.scales);
                            kernels::prefetch(nx.biases);
                        }
                    }
                    let kc = TILED_KC.min(k - k0);
                    kernels::tiles(
                        kc,
                        &xt[k0 * m8..],
                        m8,
                        m8,
                        &wbuf[k0..],
                        k,
                        nr,
                        ct,
                        m8,
                        k0 > 0,
                    );
                }
                for i in 0..m {
                    for (j, o) in panel.row_mut(i).iter_mut().enumerate() {
                        *o = ct[j * m8 + i];
                    }
                }
            })
        });
    };
    if parallel {
        par_column_panels(out, m, w.rows, TILED_TASK_ROWS, |mut p| task(&mut p));
    } else {
        kernels::gemm::seq_column_panels(out, m, w.rows, TILED_TASK_ROWS, |mut p| task(&mut p));
    }
}

/// Weight rows per panel of the unpacked path (two 16-lane register columns).
const UNPACKED_PANEL_ROWS: usize = 32;
/// Reduction chunk of the unpacked path: a `[128, 32]` f32 panel chunk (16 KB) and the
/// matching activation columns stay in L1.
const UNPACKED_KC: usize = 128;
/// Activation elements from which the unpacked path prepares its rows (group sums, scaled
/// copy) in parallel: a serial step before the parallel panels, whose share grows with the
/// core count (in parallel: 256-row head / q_proj / o_proj +1-5% on 2 threads, paired runs).
const PARALLEL_PREPARE_MIN: usize = 1 << 16;
/// Bytes of `x` (f32) per pass of the unpacked path over the weights. Without the split, each
/// 32-row panel streamed all of `x` from L3 at 256 rows (2.9-4 MB); 768 KB blocks (within a
/// 1 MB or 2 MB L2) ran 256-row products 9-19% faster on Emerald Rapids (median of paired
/// runs, 1 and 2 threads; 1-2 MB blocks gained less), for one more unpack per pass (~3% of a
/// pass at 64 rows).
const UNPACKED_X_BLOCK_BYTES: usize = 768 << 10;

/// Unpacked path (AVX-512, 4- and 8-bit): each task takes `UNPACKED_PANEL_ROWS` weight rows
/// and, a `UNPACKED_KC`-column chunk at a time, transposes their quantized values into a
/// `[kc, 32]` f32 panel and runs 12-row x 32-column register tiles over it with `x` broadcast,
/// so any `m` runs without padding rows; each group's scale and bias apply to the partial sums
/// (see the module docs). The panel holds each field in place in its word (no shift to
/// decode), so the tiles take `x` scaled by the matching powers of two (`scale_fields`): the
/// products are exactly those of the shifted fields.
fn matmul_t_unpacked(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
    let (k, gs) = (w.cols, w.spec.group_size);
    let groups = k / gs;
    let ldx = padded_stride(k);
    let mut xsum = vec![0.0f32; m * groups];
    with_buffer(m * ldx, |xf| {
        // Per row: the group sums, and x scaled to the panels' in-place fields.
        let prepare = |((xr, sr), fr): ((&[f32], &mut [f32]), &mut [f32])| {
            kernels::scalar::group_sums(xr, gs, sr);
            kernels::scalar::scale_fields(xr, w.spec.bits, &mut fr[..k]);
        };
        let rows = x.chunks_exact(k).zip(xsum.chunks_exact_mut(groups));
        if parallel && m * k >= PARALLEL_PREPARE_MIN {
            let rows = x.par_chunks_exact(k).zip(xsum.par_chunks_exact_mut(groups));
            rows.zip(xf.par_chunks_exact_mut(ldx)).for_each(prepare);
        } else {
            rows.zip(xf.chunks_exact_mut(ldx)).for_each(prepare);
        }
        matmul_t_unpacked_panels(xf, ldx, &xsum, m, w, out, parallel)
    })
}

/// Row stride (in f32s) for `k`-wide activation rows that the register tiles read together:
/// one cache line more than `k`, so that rows a multiple of 4 KB apart (k = 1024, 4096: the
/// o_proj input) do not all fall in the same L1 set, where a 12-row tile evicts its own lines
/// (paired runs: k = 1024 +5%, o_proj 256 rows +0.5-4%).
fn padded_stride(k: usize) -> usize {
    k + 16
}

/// `matmul_t_unpacked` once `x` is scaled (`xf`, rows `ldx` apart) and its group sums are
/// known.
fn matmul_t_unpacked_panels(
    xf: &[f32],
    ldx: usize,
    xsum: &[f32],
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
    parallel: bool,
) {
    const P: usize = UNPACKED_PANEL_ROWS;
    let (k, gs) = (w.cols, w.spec.group_size);
    let groups = k / gs;
    let kc = (UNPACKED_KC.max(gs) / gs * gs).min(k);
    let wpr = w.spec.words_per_row(k);
    // Passes over the weights, each with a block of x's rows small enough to stay in L2 from
    // one panel to the next (every panel reads all of its block).
    let passes = (m * k * 4).div_ceil(UNPACKED_X_BLOCK_BYTES).clamp(1, m);
    for (i0, mb) in even_blocks(m, passes) {
        let xf = &xf[i0 * ldx..(i0 + mb) * ldx];
        let xsum = &xsum[i0 * groups..(i0 + mb) * groups];
        let task = |panel: &mut kernels::gemm::ColumnPanel<'_>| {
            let (r0, nr) = (panel.start(), panel.width());
            let rows = w.row_slice(r0, r0 + nr);
            // The next panel, pulled toward the cache a share per chunk (`next_panel_share`).
            let next = w.row_slice((r0 + P).min(w.rows), (r0 + 2 * P).min(w.rows));
            let chunks = k.div_ceil(kc);
            with_buffer(kc * P + 2 * groups * P + mb * P, |buf| {
                let (q, rest) = buf.split_at_mut(kc * P);
                let (s, rest) = rest.split_at_mut(groups * P);
                let (b, ct) = rest.split_at_mut(groups * P);
                // Columns past nr are zero (scales and biases too), so they add nothing.
                if nr < P {
                    q.fill(0.0);
                    s.fill(0.0);
                    b.fill(0.0);
                }
                kernels::params_t(rows.scales, groups, nr, groups, s, P);
                kernels::params_t(rows.biases, groups, nr, groups, b, P);
                for (ci, k0) in (0..k).step_by(kc).enumerate() {
                    // Prefetched by the tiles one line every few steps. Bursts (half before
                    // the unpack, half after) held every line-fill buffer while they went to
                    // DRAM and stalled the loads behind them; spread out: experts gate_up
                    // +3-12%, down +-2%, linears +-3% (paired runs on Emerald Rapids).
                    let ahead = next_panel_share(&next, ci, chunks);
                    let kn = kc.min(k - k0);
                    let w0 = k0 * w.spec.bits as usize / 32;
                    kernels::unpack_rows_t(&rows.packed[w0..], wpr, w.spec, nr, kn, q, P);
                    let g0 = k0 / gs;
                    let params = kernels::GroupParams {
                        scales: &s[g0 * P..],
                        biases: &b[g0 * P..],
                        xsum: &xsum[g0..],
                        ldxs: groups,
                    };
                    kernels::tiles_q(
                        kn,
                        gs,
                        &xf[k0..],
                        ldx,
                        mb,
                        q,
                        P,
                        P,
                        params,
                        ct,
                        P,
                        k0 > 0,
                        ahead,
                    );
                }
                for (i, c) in ct.chunks_exact(P).enumerate() {
                    panel.row_mut(i0 + i).copy_from_slice(&c[..nr]);
                }
            });
        };
        if parallel {
            par_column_panels(out, m, w.rows, P, |mut p| task(&mut p));
        } else {
            kernels::gemm::seq_column_panels(out, m, w.rows, P, |mut p| task(&mut p));
        }
    }
}

/// The lines of `panel` that chunk `ci` of `chunks` prefetches: the scales, the biases, then
/// the packed words shared out over the remaining chunks (all of it to each chunk if fewer
/// than three: a repeated prefetch of a cached line is cheap).
fn next_panel_share(panel: &QMatrix, ci: usize, chunks: usize) -> kernels::Lines {
    match (ci, chunks) {
        (0, 3..) => kernels::Lines::of(panel.scales),
        (1, 3..) => kernels::Lines::of(panel.biases),
        (_, 3..) => {
            let (len, n) = (panel.packed.len(), chunks - 2);
            let step = len.div_ceil(n);
            let i = ci - 2;
            kernels::Lines::of(&panel.packed[(i * step).min(len)..((i + 1) * step).min(len)])
        }
        _ => kernels::Lines::of(panel.packed),
    }
}

/// `(first row, rows)` of `n` blocks of nearly equal height over `m` rows.
fn even_blocks(m: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).map(move |b| (b * m / n, (b + 1) * m / n - b * m / n))
}

/// Dequantizes rows `r0..r1` of `w` into `buf [(r1 - r0), cols]`.
fn dequant_rows(w: &QMatrix, r0: usize, r1: usize, buf: &mut [f32]) {
    for (r, row) in (r0..r1).zip(buf.chunks_exact_mut(w.cols)) {
        let (s, b) = w.row_params(r);
        kernels::dequant_row(w.row_words(r), s, b, w.spec, row);
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
    let cols = w.cols;
    // Tasks: column blocks x reduction chunks of XW_REDUCE_ROWS (fixed, so neither the
    // split nor the order of the sums depends on the thread count: a vocab of 262144 rows
    // gives 8 chunks x 11 blocks = 88 tasks, where the blocks alone were 11, too few for
    // a many-core CPU); the chunks' partial products are added in chunk order. On 2 cores
    // the split changes nothing (m = 256, vocab 65536: 0.98x, median of 7 paired runs,
    // within noise); the gain beyond 11 cores is not measured here.
    let chunks = w.rows.div_ceil(XW_REDUCE_ROWS);
    if chunks == 1 {
        xw_column_blocks(x, m, w, (0, w.rows), out);
    } else {
        with_buffer(chunks * m * cols, |partials| {
            partials
                .par_chunks_mut(m * cols)
                .enumerate()
                .for_each(|(c, p)| {
                    let r1 = ((c + 1) * XW_REDUCE_ROWS).min(w.rows);
                    xw_column_blocks(x, m, w, (c * XW_REDUCE_ROWS, r1), p);
                });
            sum_partials(partials, out);
        });
    }
    Ok(())
}

/// `out [m, cols] = x[:, r0..r1] @ W[r0..r1, :]` (`x [m, W.rows]`), in parallel column blocks
/// of `XW_BLOCK_COLS`, each walking its rows in steps of `PANEL_DEPTH`.
fn xw_column_blocks(x: &[f32], m: usize, w: &QMatrix, (r0, r1): (usize, usize), out: &mut [f32]) {
    par_column_panels(out, m, w.cols, XW_BLOCK_COLS, |mut panel| {
        let (c0, cw) = (panel.start(), panel.width());
        with_buffer(PANEL_DEPTH * cw + cw + m * PANEL_DEPTH, |buf| {
            let (buf, rest) = buf.split_at_mut(PANEL_DEPTH * cw);
            let (tmp, xp) = rest.split_at_mut(cw);
            with_buffer(m * cw, |acc| {
                for s0 in (r0..r1).step_by(PANEL_DEPTH) {
                    let s1 = (s0 + PANEL_DEPTH).min(r1);
                    // This step's activations, packed: rows of x are far apart (the vocab).
                    let kc = s1 - s0;
                    for (i, dst) in xp.chunks_exact_mut(kc).take(m).enumerate() {
                        dst.copy_from_slice(&x[i * w.rows + s0..i * w.rows + s1]);
                    }
                    let load = s0 > r0;
                    xw_accumulate(
                        (xp, kc),
                        m,
                        w,
                        (s0, s1),
                        (c0, c0 + cw),
                        acc,
                        cw,
                        load,
                        buf,
                        tmp,
                    );
                }
                for i in 0..m {
                    panel.row_mut(i).copy_from_slice(&acc[i * cw..(i + 1) * cw]);
                }
            });
        });
    });
}

/// `out` = the sum of the equal-sized `partials` (laid end to end), added in order.
fn sum_partials(partials: &[f32], out: &mut [f32]) {
    let (first, others) = partials.split_at(out.len());
    out.copy_from_slice(first);
    for p in others.chunks_exact(out.len()) {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
}

/// `p[:, 0..c1-c0] (+)= xs @ W[r0..r1, c0..c1]`, where `xs[i*ldx + j] = x[i, r0 + j]` and `p`
/// has row stride `ldp`. The weight block is dequantized into `buf` as `XW_STRIP`-column strips
/// (each strip's rows contiguous, so the register tiles stream it from L1), through the row
/// buffer `tmp`.
#[allow(clippy::too_many_arguments)]
fn xw_accumulate(
    (xs, ldx): (&[f32], usize),
    m: usize,
    w: &QMatrix,
    (r0, r1): (usize, usize),
    (c0, c1): (usize, usize),
    p: &mut [f32],
    ldp: usize,
    load: bool,
    buf: &mut [f32],
    tmp: &mut [f32],
) {
    let (kc, width) = (r1 - r0, c1 - c0);
    let tmp = &mut tmp[..width];
    const S: usize = XW_STRIP;
    assert!(
        width.is_multiple_of(S),
        "x @ W: {width} columns are not whole strips"
    );
    for (j, r) in (r0..r1).enumerate() {
        dequant_part(w, r, c0, c1, tmp);
        for (b, piece) in tmp.chunks_exact(S).enumerate() {
            let at = b * kc * S + j * S;
            buf[at..at + S].copy_from_slice(piece);
        }
    }
    for b in 0..width / S {
        kernels::tiles_n(
            kc,
            xs,
            ldx,
            m,
            &buf[b * kc * S..(b + 1) * kc * S],
            S,
            S,
            &mut p[b * S..],
            ldp,
            load,
        );
    }
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
    // Each expert's task owns its pairs' output rows (disjoint: a pair has one expert).
    let mut out_rows: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(n).map(Some).collect();
    let slots: Vec<_> = work
        .iter()
        .map(|&(e, ps)| {
            let rows: Vec<&mut [f32]> = ps.iter().filter_map(|&p| out_rows[p].take()).collect();
            (e, ps, rows)
        })
        .collect();
    slots.into_par_iter().try_for_each(|(e, ps, mut rows)| {
        let w = experts.expert(e)?;
        let m = ps.len();
        if k == 0 {
            rows.iter_mut().for_each(|r| r.fill(0.0));
            return Ok(());
        }
        with_buffer(m * k + m * n, |buf| {
            let (xs, res) = buf.split_at_mut(m * k);
            for (dst, &p) in xs.chunks_exact_mut(k).zip(ps) {
                let r = pairs[p].0;
                dst.copy_from_slice(&x[r * k..(r + 1) * k]);
            }
            // One expert is one task: its panels run sequentially on this thread.
            matmul_t_strategy(xs, m, &w, res, false);
            for (row, r) in rows.iter_mut().zip(res.chunks_exact(n)) {
                row.copy_from_slice(r);
            }
        });
        Ok::<(), QuantError>(())
    })
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

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kernels::scalar;
    use crate::{QuantSpec, Quantized};

    fn random_q(rng: &mut impl Rng, rows: usize, cols: usize, spec: QuantSpec) -> Quantized {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-0.1f32..0.1))
            .collect();
        crate::quantize(&w, rows, cols, spec).unwrap()
    }

    /// MLX's own formula (sequential f32 sum of x * dequantized w) and the error bound of
    /// tests/goldens.rs for one output.
    fn reference_t(x: &[f32], w: &QMatrix, r: usize) -> (f32, f32) {
        let (s, b) = w.row_params(r);
        let words = w.row_words(r);
        let want = scalar::dot_row_mlx(x, words, s, b, w.spec);
        let g = w.spec.group_size;
        let mag: f64 = x
            .iter()
            .enumerate()
            .map(|(k, xv)| {
                let q = scalar::unpack(words, k, w.spec.bits) as f64;
                (*xv as f64).abs()
                    * ((s[k / g].to_f32() as f64).abs() * q + (b[k / g].to_f32() as f64).abs())
            })
            .sum();
        (
            want,
            (2.0 * (x.len() as f64 + 8.0) * mag / (1u64 << 24) as f64) as f32,
        )
    }

    fn pool(n: usize) -> rayon::ThreadPool {
        crate::pool::build(Some(n)).unwrap()
    }

    #[test]
    fn matmul_t_every_path_matches_the_mlx_formula() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (bits, g) in [
            (4, 64),
            (8, 64),
            (4, 32),
            (8, 128),
            (3, 64),
            (6, 32),
            (2, 128),
            (5, 64),
        ] {
            let spec = QuantSpec::new(bits, g).unwrap();
            // 131 rows: not a multiple of 6, 8, 48 or 64; 640 columns: 2.5 tiled chunks.
            let (rows, cols) = (131, 640);
            let q = random_q(&mut rng, rows, cols, spec);
            let w = q.view(rows, cols, spec).unwrap();
            for m in [1usize, 2, 3, 4, 8, 9, 17, 48, 49, 70] {
                let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let mut out = vec![0.0f32; m * rows];
                pool(2).install(|| matmul_t(&x, m, &w, &mut out)).unwrap();
                for i in 0..m {
                    for r in 0..rows {
                        let (want, tol) = reference_t(&x[i * cols..(i + 1) * cols], &w, r);
                        let got = out[i * rows + r];
                        assert!(
                            (got - want).abs() <= tol,
                            "{bits}b g{g} m={m} ({i}, {r}): {got} vs {want} (tol {tol})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_every_path_matches_the_mlx_formula() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for (bits, g) in [(4, 64), (8, 32), (3, 128)] {
            let spec = QuantSpec::new(bits, g).unwrap();
            // 300 rows (reduction axis): one full 256-row depth step and a partial one;
            // 384 columns: a full and a partial 256-column panel.
            let (rows, cols) = (300, 384);
            let q = random_q(&mut rng, rows, cols, spec);
            let w = q.view(rows, cols, spec).unwrap();
            let mut deq = vec![0.0f32; rows * cols];
            crate::dequantize(&w, &mut deq).unwrap();
            for m in [1usize, 3, 5, 9, 20, 60] {
                let x: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut out = vec![0.0f32; m * cols];
                pool(2).install(|| matmul(&x, m, &w, &mut out)).unwrap();
                for i in 0..m {
                    for c in 0..cols {
                        let (mut want, mut mag) = (0.0f32, 0.0f64);
                        for r in 0..rows {
                            want += x[i * rows + r] * deq[r * cols + c];
                            mag += (x[i * rows + r] as f64 * deq[r * cols + c] as f64).abs();
                        }
                        let tol = (2.0 * (rows as f64 + 8.0) * mag / (1u64 << 24) as f64) as f32;
                        let got = out[i * cols + c];
                        assert!(
                            (got - want).abs() <= tol,
                            "{bits}b m={m} ({i}, {c}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_reduction_chunks_match_the_formula_and_any_thread_count() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let spec = QuantSpec::new(4, 64).unwrap();
        // Two reduction chunks (the second partial); a full and a partial column block.
        let (m, rows, cols) = (7, XW_REDUCE_ROWS + 300, XW_BLOCK_COLS + 64);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        let mut deq = vec![0.0f32; rows * cols];
        crate::dequantize(&w, &mut deq).unwrap();
        let x: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let run = |threads: usize| {
            let mut out = vec![0.0f32; m * cols];
            pool(threads)
                .install(|| matmul(&x, m, &w, &mut out))
                .unwrap();
            out
        };
        let out = run(2);
        assert!(
            run(1) == out && run(3) == out,
            "results depend on the thread count"
        );
        for i in 0..m {
            let xi = &x[i * rows..(i + 1) * rows];
            for c in 0..cols {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for (r, &xv) in xi.iter().enumerate() {
                    let t = xv as f64 * deq[r * cols + c] as f64;
                    want += t;
                    mag += t.abs();
                }
                // f32 sums of `rows` products (plus the chunk sums): a few ulps of the magnitude
                // per step, far below any indexing error.
                let tol = 2.0 * (rows as f64 + 8.0) * mag / (1u64 << 24) as f64;
                let got = out[i * cols + c] as f64;
                assert!((got - want).abs() <= tol, "({i}, {c}): {got} vs {want}");
            }
        }
    }

    #[test]
    fn gather_matches_per_pair_products() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let spec = QuantSpec::new(4, 64).unwrap();
        let (experts, rows, cols, x_rows) = (6usize, 70usize, 256usize, 60usize);
        let q = random_q(&mut rng, experts * rows, cols, spec);
        let e = QExperts::new(&q.packed, &q.scales, &q.biases, experts, rows, cols, spec).unwrap();
        let x: Vec<f32> = (0..x_rows * cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        // Pairs per expert: 0: 1, 1: 12, 2: 55, 3: 0, 4: 2, 5: 9.
        let mut pairs = vec![(5usize, 0usize)];
        pairs.extend((0..12).map(|i| (i * 3 % x_rows, 1)));
        pairs.extend((0..55).map(|i| (i, 2)));
        pairs.extend([(7, 4), (7, 4)]);
        pairs.extend((0..9).map(|i| (59 - i, 5)));
        // Shuffle so that the grouping by expert is exercised.
        for i in (1..pairs.len()).rev() {
            let j = rng.gen_range(0..=i);
            pairs.swap(i, j);
        }
        let mut out = vec![0.0f32; pairs.len() * rows];
        pool(2)
            .install(|| gather_matmul_t(&x, x_rows, &e, &pairs, &mut out))
            .unwrap();
        for (p, &(xr, ex)) in pairs.iter().enumerate() {
            let w = e.expert(ex).unwrap();
            for r in 0..rows {
                let (want, tol) = reference_t(&x[xr * cols..(xr + 1) * cols], &w, r);
                let got = out[p * rows + r];
                assert!(
                    (got - want).abs() <= tol,
                    "pair {p} ({xr}, {ex}) row {r}: {got} vs {want}"
                );
            }
        }
        let bad = [(0usize, 6usize)];
        let err = gather_matmul_t(&x, x_rows, &e, &bad, &mut out[..rows]).unwrap_err();
        assert!(
            matches!(
                err,
                QuantError::PairOutOfRange {
                    pair: 0,
                    expert: 6,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn passes_over_row_blocks_match_the_formula_and_single_passes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        // 97 x 2048 f32 = 776 KB of x: two passes of the unpacked path (where it runs).
        let (rows, cols, m) = (40usize, 2048usize, 97usize);
        assert!(m * cols * 4 > UNPACKED_X_BLOCK_BYTES);
        for bits in [4, 8] {
            let spec = QuantSpec::new(bits, 64).unwrap();
            let q = random_q(&mut rng, rows, cols, spec);
            let w = q.view(rows, cols, spec).unwrap();
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut out = vec![0.0f32; m * rows];
            pool(2).install(|| matmul_t(&x, m, &w, &mut out)).unwrap();
            for i in (0..m).step_by(8) {
                for r in 0..rows {
                    let (want, tol) = reference_t(&x[i * cols..(i + 1) * cols], &w, r);
                    assert!(
                        (out[i * rows + r] - want).abs() <= tol,
                        "{bits}b ({i}, {r})"
                    );
                }
            }
            // The rows of each pass computed as one smaller product (a single pass) give the
            // same bits. (Elsewhere 48 and 97 rows take different strategies.)
            if !kernels::unpacked_panels(spec) {
                continue;
            }
            for (i0, mb) in [(0usize, 48usize), (48, 49)] {
                let mut part = vec![0.0f32; mb * rows];
                pool(1)
                    .install(|| matmul_t(&x[i0 * cols..(i0 + mb) * cols], mb, &w, &mut part))
                    .unwrap();
                for (j, (a, b)) in part.iter().zip(&out[i0 * rows..]).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{bits}b pass at {i0}, element {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let spec = QuantSpec::new(4, 64).unwrap();
        let (rows, cols) = (200, 512);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        let e = QExperts::new(&q.packed, &q.scales, &q.biases, 4, rows / 4, cols, spec).unwrap();
        for m in [1usize, 5, 20, 100] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xn: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let pairs: Vec<(usize, usize)> = (0..m * 3).map(|i| (i % m, (i * 7) % 4)).collect();
            let run = |threads: usize| {
                pool(threads).install(|| {
                    let mut a = vec![0.0f32; m * rows];
                    matmul_t(&x, m, &w, &mut a).unwrap();
                    let mut b = vec![0.0f32; m * cols];
                    matmul(&xn, m, &w, &mut b).unwrap();
                    let mut c = vec![0.0f32; pairs.len() * (rows / 4)];
                    gather_matmul_t(&x, m, &e, &pairs, &mut c).unwrap();
                    let mut d = vec![0.0f32; m * rows];
                    let wd: Vec<f32> = (0..rows * cols).map(|i| (i % 13) as f32 * 0.01).collect();
                    matmul_f32(&x, &wd, m, cols, rows, true, &mut d).unwrap();
                    (a, b, c, d)
                })
            };
            let one = run(1);
            for threads in [2, 3, 5] {
                assert!(
                    run(threads) == one,
                    "m={m}: {threads} threads differ from 1"
                );
            }
        }
    }

    /// A row's result must not depend on the rows computed with it: batched sequences get
    /// the bits they get alone (and so the tokens).
    #[test]
    fn each_row_is_computed_as_it_is_alone() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        for bits in [4, 8] {
            let spec = QuantSpec::new(bits, 64).unwrap();
            let (rows, cols) = (96, 640);
            let q = random_q(&mut rng, rows, cols, spec);
            let w = q.view(rows, cols, spec).unwrap();
            let e =
                QExperts::new(&q.packed, &q.scales, &q.biases, 4, rows / 4, cols, spec).unwrap();
            let big = random_q(&mut rng, 40000, 64, spec);
            let wide = big.view(40000, 64, spec).unwrap();
            for m in [2usize, 3, 4, 5, 9, 13, 49, 97] {
                let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut all = vec![0.0f32; m * rows];
                matmul_t(&x, m, &w, &mut all).unwrap();
                let pairs: Vec<(usize, usize)> = (0..m).map(|i| (i, i % 2)).collect();
                let mut gathered = vec![0.0f32; m * (rows / 4)];
                gather_matmul_t(&x, m, &e, &pairs, &mut gathered).unwrap();
                let xn: Vec<f32> = (0..m * 40000).map(|_| rng.gen_range(0.0..1e-4)).collect();
                let mut xw = vec![0.0f32; m * 64];
                matmul(&xn, m, &wide, &mut xw).unwrap();
                for i in 0..m {
                    let xi = &x[i * cols..(i + 1) * cols];
                    let mut one = vec![0.0f32; rows];
                    matmul_t(xi, 1, &w, &mut one).unwrap();
                    assert!(
                        one == all[i * rows..(i + 1) * rows],
                        "x @ W^T, {bits} bits, row {i} of {m}"
                    );
                    let mut g = vec![0.0f32; rows / 4];
                    gather_matmul_t(xi, 1, &e, &[(0, i % 2)], &mut g).unwrap();
                    let n = rows / 4;
                    assert!(
                        g == gathered[i * n..(i + 1) * n],
                        "experts, {bits} bits, row {i} of {m}"
                    );
                    let mut o = vec![0.0f32; 64];
                    matmul(&xn[i * 40000..(i + 1) * 40000], 1, &wide, &mut o).unwrap();
                    assert!(
                        o == xw[i * 64..(i + 1) * 64],
                        "x @ W, {bits} bits, row {i} of {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn matmul_f32_matches_naive() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let (m, k, n) = (7, 33, 19);
        let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for transposed in [false, true] {
            let mut out = vec![0.0f32; m * n];
            matmul_f32(&a, &b, m, k, n, transposed, &mut out).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k)
                        .map(|kk| {
                            a[i * k + kk]
                                * if transposed {
                                    b[j * k + kk]
                                } else {
                                    b[kk * n + j]
                                }
                        })
                        .sum();
                    assert!((out[i * n + j] - want).abs() <= 1e-5, "({i}, {j})");
                }
            }
        }
        let err = matmul_f32(&a, &b, m, k, n + 1, false, &mut vec![0.0; m * (n + 1)]).unwrap_err();
        assert!(
            matches!(
                err,
                QuantError::Length {
                    what: "matmul_f32 rhs",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let spec = QuantSpec::new(4, 64).unwrap();
        let q = crate::quantize(&vec![0.5f32; 4 * 128], 4, 128, spec).unwrap();
        assert!(matches!(
            QMatrix::new(&q.packed, &q.scales, &q.biases, 4, 96, spec),
            Err(QuantError::Width { .. })
        ));
        assert!(matches!(
            QMatrix::new(&q.packed[1..], &q.scales, &q.biases, 4, 128, spec),
            Err(QuantError::Length { .. })
        ));
        let scales_short: Vec<bf16> = q.scales[1..].to_vec();
        assert!(QMatrix::new(&q.packed, &scales_short, &q.biases, 4, 128, spec).is_err());
        let w = q.view(4, 128, spec).unwrap();
        assert!(matmul_t(&[0.0; 127], 1, &w, &mut [0.0; 4]).is_err());
        assert!(matmul_t(&[0.0; 128], 1, &w, &mut [0.0; 5]).is_err());
        assert!(matmul(&[0.0; 3], 1, &w, &mut [0.0; 128]).is_err());
        let err = crate::embedding(&w, &[4], &mut [0.0; 128]).unwrap_err();
        assert!(
            matches!(err, QuantError::IdOutOfRange { id: 4, rows: 4 }),
            "{err}"
        );
        assert!(err.to_string().contains("token id 4"));
        assert!(crate::quantize(&[f32::NAN; 64], 1, 64, spec).is_err());
        assert!(QuantSpec::new(7, 64).is_err() && QuantSpec::new(4, 16).is_err());
        let e = QExperts::new(&q.packed, &q.scales, &q.biases, 2, 2, 128, spec).unwrap();
        assert!(matches!(
            e.expert(2),
            Err(QuantError::ExpertOutOfRange {
                expert: 2,
                experts: 2
            })
        ));
    }
}
