//! [`Plan::DequantStrips`](super::Plan::DequantStrips): `x @ W` (the soft embeddings).
//! `BLOCK_COLS`-column tasks walk the reduction axis (the rows of `W`) in order in steps of
//! `DEPTH`, dequantizing each step's weights into `STRIP`-column strips for the register
//! tiles; the reduction runs in fixed chunks of `REDUCE_ROWS` whose partial sums are added in
//! chunk order.

use rayon::prelude::*;

use super::Rows;
use crate::kernels::gemm::column_panels;
use crate::kernels::{Kernel, View, ViewMut};
use crate::scratch::with_buffer;
use crate::QMatrix;

/// Output columns per task: a block's dequantized weights stay in L1/L2 (a multiple of every
/// group size).
pub(super) const BLOCK_COLS: usize = 256;
/// Columns per dequantized strip: one 32-column register tile (AVX-512) or two 16-column ones
/// (AVX2); every group size is a multiple of it, so strips never straddle the end of a row.
const STRIP: usize = 32;
/// Rows of `W` (the reduction axis) dequantized per step.
const DEPTH: usize = 256;
/// Rows of `W` per reduction chunk (a multiple of `DEPTH`).
pub(super) const REDUCE_ROWS: usize = 32768;

/// `out [m, w.cols] = x [m, w.rows] @ W` (shapes checked, none empty).
pub(super) fn matmul(
    kern: impl Kernel,
    x: Rows<'_>,
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
    parallel: bool,
) {
    // Tasks: column blocks x reduction chunks (fixed, so neither the split nor the order of
    // the sums depends on the thread count: a vocab of 262144 rows gives 8 chunks x 11 blocks =
    // 88 tasks, where the blocks alone were 11, too few for a many-core CPU); the chunks'
    // partial products are added in chunk order.
    let chunks = w.rows.div_ceil(REDUCE_ROWS);
    if chunks == 1 {
        return column_blocks(kern, x, m, w, (0, w.rows), out, parallel);
    }
    let len = m * w.cols;
    with_buffer(chunks * len, |partials| {
        let chunk = |(c, p): (usize, &mut [f32])| {
            let r1 = ((c + 1) * REDUCE_ROWS).min(w.rows);
            column_blocks(kern, x, m, w, (c * REDUCE_ROWS, r1), p, parallel);
        };
        if parallel {
            partials.par_chunks_mut(len).enumerate().for_each(chunk);
        } else {
            partials.chunks_mut(len).enumerate().for_each(chunk);
        }
        sum_partials(partials, out);
    });
}

/// `out [m, cols] = x[:, r0..r1] @ W[r0..r1, :]` (`x [m, W.rows]`), in column blocks of
/// `BLOCK_COLS`, each walking its rows in steps of `DEPTH`.
fn column_blocks(
    kern: impl Kernel,
    x: Rows<'_>,
    m: usize,
    w: &QMatrix,
    (r0, r1): (usize, usize),
    out: &mut [f32],
    parallel: bool,
) {
    column_panels(out, (m, w.cols), BLOCK_COLS, parallel, |mut panel| {
        let (c0, cw) = (panel.start(), panel.width());
        with_buffer(DEPTH * cw + cw + m * DEPTH, |buf| {
            let (buf, rest) = buf.split_at_mut(DEPTH * cw);
            let (tmp, xp) = rest.split_at_mut(cw);
            with_buffer(m * cw, |acc| {
                for s0 in (r0..r1).step_by(DEPTH) {
                    let s1 = (s0 + DEPTH).min(r1);
                    // This step's activations, packed: rows of x are far apart (the vocab).
                    let kc = s1 - s0;
                    for (i, dst) in xp.chunks_exact_mut(kc).take(m).enumerate() {
                        dst.copy_from_slice(&x.row(i)[s0..s1]);
                    }
                    let step = Step {
                        rows: (s0, s1),
                        cols: (c0, c0 + cw),
                    };
                    let xs = View::new(xp, m, kc, kc);
                    accumulate(
                        kern,
                        xs,
                        w,
                        step,
                        ViewMut::new(acc, m, cw, cw),
                        s0 > r0,
                        (buf, tmp),
                    );
                }
                for i in 0..m {
                    panel.row_mut(i).copy_from_slice(&acc[i * cw..(i + 1) * cw]);
                }
            });
        });
    });
}

/// The block of `W` one step of a task multiplies: rows `r0..r1`, columns `c0..c1`.
#[derive(Clone, Copy)]
struct Step {
    rows: (usize, usize),
    cols: (usize, usize),
}

/// `p (+)= xs @ W[r0..r1, c0..c1]`, where `xs [m, r1 - r0]` holds `x[:, r0..r1]`. The weight
/// block is dequantized into `buf` as `STRIP`-column strips (each strip's rows contiguous, so
/// the register tiles stream it from L1), through the row buffer `tmp`.
fn accumulate(
    kern: impl Kernel,
    xs: View<'_>,
    w: &QMatrix,
    Step {
        rows: (r0, r1),
        cols: (c0, c1),
    }: Step,
    mut p: ViewMut<'_>,
    load: bool,
    (buf, tmp): (&mut [f32], &mut [f32]),
) {
    const S: usize = STRIP;
    let (kc, width) = (r1 - r0, c1 - c0);
    let tmp = &mut tmp[..width];
    assert!(
        width.is_multiple_of(S),
        "x @ W: {width} columns are not whole strips"
    );
    for (j, r) in (r0..r1).enumerate() {
        kern.dequant_row(w.row(r).part(c0, c1), tmp);
        for (b, piece) in tmp.chunks_exact(S).enumerate() {
            let at = b * kc * S + j * S;
            buf[at..at + S].copy_from_slice(piece);
        }
    }
    for b in 0..width / S {
        let strip = View::new(&buf[b * kc * S..(b + 1) * kc * S], kc, S, S);
        kern.tiles(xs, strip, p.block_mut((0, b * S), (xs.rows(), S)), load);
    }
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
