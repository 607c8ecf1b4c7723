//! [`Plan::UnpackedPanels`](super::Plan::UnpackedPanels): `x @ W^T` for 4- and 8-bit weights
//! over unpacked quantized fields. Each task takes `PANEL_ROWS` weight rows and, a `KC`-column
//! chunk at a time, transposes their quantized values into a `[kc, 32]` f32 panel and runs
//! 12-row x 32-column register tiles over it with `x` broadcast, so any `m` runs without
//! padding rows; each group's scale and bias apply to the partial sums (see the module docs of
//! `matmul`). The panel holds each field in place in its word (no shift to decode), so the
//! tiles take `x` scaled by the matching powers of two (`scale_fields`): the products are
//! exactly those of the shifted fields. Blocks of 8-24 rows (the experts' usual count) take
//! the words transposed instead and decode each field in the tiles (`tiles_qw`): the same
//! products in the same order, so the same bits at any row count.
//!
//! Generic over [`PanelKernel`]: the plan runs it on AVX-512, the tests also on the scalar
//! twins.

use rayon::prelude::*;

use super::Rows;
use crate::kernels::gemm::{column_panels, ColumnPanel};
use crate::kernels::{group_sums, GroupParams, Lines, PanelKernel, View, ViewMut};
use crate::scratch::with_buffer;
use crate::QMatrix;

/// Weight rows per panel (two 16-lane register columns).
const PANEL_ROWS: usize = 32;
/// Reduction chunk: a `[128, 32]` f32 panel chunk (16 KB) and the matching activation columns
/// stay in L1.
const KC: usize = 128;
/// Activation elements from which the rows (group sums, scaled copy) are prepared in
/// parallel: a serial step before the parallel panels, whose share grows with the core count
/// (docs/PERFORMANCE.md).
const PARALLEL_PREPARE_MIN: usize = 1 << 16;
/// Bytes of `x` (f32) per pass over the weights. Every 32-row panel reads its pass's whole
/// block, and every pass unpacks the weights once more, so the best block depends on how fast
/// the L3 streams (docs/PERFORMANCE.md): on Intel (Emerald Rapids, 2 MB L2) 768 KB blocks
/// that stay in L2 beat streaming all of `x` from L3; on AMD (Zen 4, 1 MB L2) fewer passes
/// over 2 MB blocks from L3 beat them.
pub(super) fn x_block_bytes() -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::is_amd() {
        return 2 << 20;
    }
    768 << 10
}
/// Row blocks whose tiles decode the transposed words themselves (`tiles_qw`) instead of
/// reading an unpacked f32 panel: few rows share each decoded value, so the panel's store and
/// reload cost more than decoding once per tile. Below 8 rows a 16-column tile has too few
/// FMA chains to hide their latency; above 24 the rows take two tiles, each decoding again.
const WORD_TILE_ROWS: std::ops::RangeInclusive<usize> = 8..=24;
/// Reductions up to this long run the word tiles in one chunk (the experts' down projection,
/// k = 704: one transpose and one tiles call per panel instead of six, 75-77% -> 78-79% of
/// the FMA peak); the 2816-wide gate/up products measured slower in chunks of 512 or more
/// than of `KC` (docs/PERFORMANCE.md).
const WORD_TILE_WHOLE_K: usize = 1024;

/// `out [m, w.rows] = x [m, w.cols] @ W^T` (shapes checked, none empty; 4- or 8-bit `w`). The
/// rows of `x` are read once, into the scaled copy the panels take.
pub(super) fn matmul_t(
    kern: impl PanelKernel,
    x: Rows<'_>,
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
    parallel: bool,
) {
    let (k, gs) = (w.cols, w.spec.group_size);
    let groups = k / gs;
    let ldx = padded_stride(k);
    let mut xsum = vec![0.0f32; m * groups];
    with_buffer(m * ldx, |xf| {
        // Per row: the group sums, and x scaled to the panels' in-place fields.
        let prepare = |(i, (sr, fr)): (usize, (&mut [f32], &mut [f32]))| {
            let xr = x.row(i);
            group_sums(xr, gs, sr);
            kern.scale_fields(xr, w.spec.bits, &mut fr[..k]);
        };
        let rows = xsum.chunks_exact_mut(groups).zip(xf.chunks_exact_mut(ldx));
        if parallel && m * k >= PARALLEL_PREPARE_MIN {
            let rows = xsum
                .par_chunks_exact_mut(groups)
                .zip(xf.par_chunks_exact_mut(ldx));
            rows.enumerate().for_each(prepare);
        } else {
            rows.enumerate().for_each(prepare);
        }
        panels(kern, View::new(xf, m, k, ldx), &xsum, w, out, parallel)
    })
}

/// Row stride (in f32s) for `k`-wide activation rows that the register tiles read together:
/// one cache line more than `k`, so that rows a multiple of 4 KB apart (k = 1024, 4096: the
/// o_proj input) do not all fall in the same L1 set, where a 12-row tile evicts its own lines.
fn padded_stride(k: usize) -> usize {
    k + 16
}

/// [`matmul_t`] once `x` is scaled (`xf`) and its group sums are known.
fn panels(
    kern: impl PanelKernel,
    xf: View<'_>,
    xsum: &[f32],
    w: &QMatrix,
    out: &mut [f32],
    parallel: bool,
) {
    const P: usize = PANEL_ROWS;
    let (m, k, gs) = (xf.rows(), w.cols, w.spec.group_size);
    let groups = k / gs;
    let wpr = w.spec.words_per_row(k);
    // Passes over the weights, each with a block of x's rows (`x_block_bytes`) that every
    // panel reads whole.
    let passes = (m * k * 4).div_ceil(x_block_bytes()).clamp(1, m);
    for (i0, mb) in even_blocks(m, passes) {
        let decode_in_tiles = WORD_TILE_ROWS.contains(&mb);
        let kc = match decode_in_tiles && k <= WORD_TILE_WHOLE_K {
            true => k,
            false => (KC.max(gs) / gs * gs).min(k),
        };
        let task = |mut panel: ColumnPanel<'_>| {
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
                kern.widen_t(rows.scales, groups, nr, ViewMut::new(s, groups, P, P));
                kern.widen_t(rows.biases, groups, nr, ViewMut::new(b, groups, P, P));
                for (ci, k0) in (0..k).step_by(kc).enumerate() {
                    // Prefetched by the tiles one line every few steps: bursts (half before
                    // the unpack, half after) held every line-fill buffer while they went to
                    // DRAM and stalled the loads behind them (docs/PERFORMANCE.md).
                    let ahead = next_panel_share(&next, ci, chunks);
                    let kn = kc.min(k - k0);
                    let bits = w.spec.bits;
                    let (w0, wn) = (k0 * bits as usize / 32, kn * bits as usize / 32);
                    if decode_in_tiles {
                        let panel_w = ViewMut::new(q, wn, P, P);
                        kern.transpose_words_t(&rows.packed[w0..], wpr, nr, panel_w);
                    } else {
                        let panel_q = ViewMut::new(q, kn, P, P);
                        kern.unpack_rows_t(&rows.packed[w0..], wpr, bits, nr, panel_q);
                    }
                    let (g0, gn) = (k0 / gs, kn / gs);
                    let params = GroupParams {
                        scales: View::new(&s[g0 * P..], gn, P, P),
                        biases: View::new(&b[g0 * P..], gn, P, P),
                        xsum: View::new(&xsum[i0 * groups + g0..], mb, gn, groups),
                        group_size: gs,
                    };
                    let x = xf.block((i0, k0), (mb, kn));
                    let out = ViewMut::new(ct, mb, P, P);
                    if decode_in_tiles {
                        let words = View::new(q, wn, P, P);
                        kern.tiles_qw(x, words, bits, params, out, k0 > 0, ahead);
                    } else {
                        let q = View::new(q, kn, P, P);
                        kern.tiles_q(x, q, params, out, k0 > 0, ahead);
                    }
                }
                for (i, c) in ct.chunks_exact(P).enumerate() {
                    panel.row_mut(i0 + i).copy_from_slice(&c[..nr]);
                }
            });
        };
        column_panels(out, (m, w.rows), P, parallel, task);
    }
}

/// The lines of `panel` that chunk `ci` of `chunks` prefetches: the scales, the biases, then
/// the packed words shared out over the remaining chunks (all of it to each chunk if fewer
/// than three: a repeated prefetch of a cached line is cheap).
fn next_panel_share(panel: &QMatrix, ci: usize, chunks: usize) -> Lines {
    match (ci, chunks) {
        (0, 3..) => Lines::of(panel.scales),
        (1, 3..) => Lines::of(panel.biases),
        (_, 3..) => {
            let (len, n) = (panel.packed.len(), chunks - 2);
            let step = len.div_ceil(n);
            let i = ci - 2;
            Lines::of(&panel.packed[(i * step).min(len)..((i + 1) * step).min(len)])
        }
        _ => Lines::of(panel.packed),
    }
}

/// `(first row, rows)` of `n` blocks of nearly equal height over `m` rows.
pub(super) fn even_blocks(m: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).map(move |b| (b * m / n, (b + 1) * m / n - b * m / n))
}
