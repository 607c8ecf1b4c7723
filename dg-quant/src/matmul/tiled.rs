//! [`Plan::DequantTiles`](super::Plan::DequantTiles): `x @ W^T` over dequantized weight rows.
//! The activations are transposed once; each task dequantizes its `TASK_ROWS` rows of `W` and
//! accumulates register tiles over `KC`-wide chunks of them (`Kernel::tiles`), each output in
//! k order.

use super::Rows;
use crate::kernels::gemm::{column_panels, ColumnPanel};
use crate::kernels::{prefetch, Kernel, View, ViewMut};
use crate::scratch::with_buffer;
use crate::QMatrix;

/// Rows of `W` per task.
const TASK_ROWS: usize = 24;
/// Reduction chunk: a 6-row strip of the dequantized rows and the matching activation chunk
/// stay in L1.
const KC: usize = 256;

/// `out [m, w.rows] = x [m, w.cols] @ W^T` (shapes checked, none empty).
pub(super) fn matmul_t(
    kern: impl Kernel,
    x: Rows<'_>,
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
    parallel: bool,
) {
    let k = w.cols;
    let (xt, m8) = pack_xt(x, m, k);
    let task = |mut panel: ColumnPanel<'_>| {
        let (r0, nr) = (panel.start(), panel.width());
        // Whole rows first: they are contiguous in memory, so this streams at full bandwidth
        // (chunk-wide pieces of strided rows would be latency-bound).
        with_buffer(nr * k, |wbuf| {
            for (r, row) in (r0..r0 + nr).zip(wbuf.chunks_exact_mut(k)) {
                kern.dequant_row(w.row(r), row);
            }
            with_buffer(nr * m8, |ct| {
                // While this panel computes, pull the next one toward the cache, a slice per
                // chunk (weights streamed from DRAM otherwise stall the dequantization).
                let next =
                    (r0 + nr < w.rows).then(|| w.row_slice(r0 + nr, (r0 + 2 * nr).min(w.rows)));
                let chunks = k.div_ceil(KC);
                for (ci, k0) in (0..k).step_by(KC).enumerate() {
                    if let Some(nx) = &next {
                        let (len, step) = (nx.packed.len(), nx.packed.len().div_ceil(chunks));
                        prefetch(&nx.packed[(ci * step).min(len)..((ci + 1) * step).min(len)]);
                        if ci == 0 {
                            prefetch(nx.scales);
                            prefetch(nx.biases);
                        }
                    }
                    let kc = KC.min(k - k0);
                    let wv = View::new(&wbuf[k0..], nr, kc, k);
                    let xv = View::new(&xt[k0 * m8..], kc, m8, m8);
                    kern.tiles(wv, xv, ViewMut::new(ct, nr, m8, m8), k0 > 0);
                }
                for i in 0..m {
                    for (j, o) in panel.row_mut(i).iter_mut().enumerate() {
                        *o = ct[j * m8 + i];
                    }
                }
            })
        });
    };
    column_panels(out, (m, w.rows), TASK_ROWS, parallel, task);
}

/// `x [m, k]` transposed into `[k, m8]`, `m8 = m` rounded up to 8, zero-padded.
fn pack_xt(x: Rows<'_>, m: usize, k: usize) -> (Vec<f32>, usize) {
    let m8 = m.div_ceil(8) * 8;
    let mut xt = vec![0.0f32; k * m8];
    for i in 0..m {
        for (kk, v) in x.row(i).iter().enumerate() {
            xt[kk * m8 + i] = *v;
        }
    }
    (xt, m8)
}
