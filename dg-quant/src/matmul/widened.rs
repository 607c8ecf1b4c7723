//! [`matmul_bf16_t`](super::matmul_bf16_t) on AVX-512: `x @ W^T` with plain bf16 weights (the
//! vision tower's, left in the mapped file). Each task takes `PANEL_ROWS` weight rows and, a
//! `KC`-column chunk at a time, widens them into a `[kc, 32]` f32 panel (`widen_t`) that the
//! register tiles of the quantized panels run over with `x` broadcast (`panel_tiles`), so
//! the weights are never widened whole: no matrix-sized f32 copy per call. `x` is taken in
//! blocks of rows, one pass over the weights per block, as in `unpacked.rs`. Each output is one
//! fma chain in `k` order, so neither the blocks nor the thread count change a bit.
//!
//! Generic over [`PanelKernel`]: the product runs it on AVX-512, the tests also on the scalar
//! twins.

use half::bf16;

use super::unpacked::{even_blocks, x_block_bytes};
use crate::kernels::gemm::{column_panels, ColumnPanel};
use crate::kernels::{PanelKernel, View, ViewMut};
use crate::scratch::with_buffer;

/// Weight rows per panel (two 16-lane register columns).
const PANEL_ROWS: usize = 32;
/// Reduction chunk: a `[128, 32]` f32 panel (16 KB) stays in L1 while the row tiles pass.
const KC: usize = 128;

/// Bytes of `x` (f32) per pass over the weights. Every pass widens the weights once more
/// (`widen_t` transposes 16 x 16 blocks in registers, ~10% of the product's time at 2 MB
/// blocks of the vision tower's shapes), so on Zen 4, whose L3 streams `x` fast, blocks four
/// times those of the quantized panels (`x_block_bytes`) measured best
/// (docs/PERFORMANCE.md); elsewhere unmeasured, the quantized panels' size.
fn widened_x_block_bytes() -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::is_amd() {
        return 4 * x_block_bytes();
    }
    x_block_bytes()
}

/// `out [m, rows] = x [m, cols] @ W^T`, `W` the bf16 `[rows, cols]` (shapes checked, none
/// empty).
pub(super) fn matmul_t(
    kern: impl PanelKernel,
    x: &[f32],
    m: usize,
    w: &[bf16],
    (rows, cols): (usize, usize),
    out: &mut [f32],
    parallel: bool,
) {
    const P: usize = PANEL_ROWS;
    let k = cols;
    let passes = (m * k * 4).div_ceil(widened_x_block_bytes()).clamp(1, m);
    for (i0, mb) in even_blocks(m, passes) {
        let task = |mut panel: ColumnPanel<'_>| {
            let (r0, nr) = (panel.start(), panel.width());
            with_buffer(KC * P + mb * P, |buf| {
                let (q, ct) = buf.split_at_mut(KC * P);
                // Columns past nr are zero, so they add nothing.
                if nr < P {
                    q.fill(0.0);
                }
                for k0 in (0..k).step_by(KC) {
                    let kn = KC.min(k - k0);
                    kern.widen_t(&w[r0 * k + k0..], k, nr, ViewMut::new(q, kn, P, P));
                    let xb = View::new(&x[i0 * k + k0..], mb, kn, k);
                    let panel_q = View::new(q, kn, P, P);
                    kern.panel_tiles(xb, panel_q, ViewMut::new(ct, mb, P, P), k0 > 0);
                }
                for (i, c) in ct.chunks_exact(P).enumerate() {
                    panel.row_mut(i0 + i).copy_from_slice(&c[..nr]);
                }
            });
        };
        column_panels(out, (m, rows), P, parallel, task);
    }
}
