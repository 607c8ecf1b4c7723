//! Backward pass of one attention head (`attention::attend_head`): the probabilities are
//! recomputed a query block at a time exactly as the forward computes them, so no
//! `[queries, keys]` matrix outlives its block.

use super::grad::{matmul, matmul_tn};
use super::shape_err;
use crate::error::CoreError;
use crate::model::attention::{block_probs, query_block, visible_keys, KeyView};

/// Gradients of one query head's attention.
pub(crate) struct HeadGrads {
    /// Of the queries, `[len, hd]`.
    pub(crate) dq: Vec<f32>,
    /// Of the keys the head attended, `[n_keys, hd]`.
    pub(crate) dk: Vec<f32>,
    /// Of the values the head attended, `[n_keys, hd]`.
    pub(crate) dv: Vec<f32>,
}

/// Gradients of one query head `q [len, hd]` over its key/value head (`k`, `v`: `[n_keys, hd]`)
/// given `d_out [len, hd]`.
pub(crate) fn attend_head_backward(
    q: &[f32],
    len: usize,
    k: &[f32],
    v: &[f32],
    hd: usize,
    view: &KeyView<'_>,
    d_out: &[f32],
) -> Result<HeadGrads, CoreError> {
    let n_keys = k.len() / hd;
    let mut dq = vec![0.0f32; len * hd];
    let mut dk = vec![0.0f32; n_keys * hd];
    let mut dv = vec![0.0f32; n_keys * hd];
    let block = query_block(&view.mask);
    for i0 in (0..len).step_by(block) {
        let rows = block.min(len - i0);
        let (k0, k1) = visible_keys(view, i0, rows, n_keys);
        let width = k1 - k0;
        let q_rows = &q[i0 * hd..(i0 + rows) * hd];
        let d_rows = &d_out[i0 * hd..(i0 + rows) * hd];
        let (k_blk, v_blk) = (&k[k0 * hd..k1 * hd], &v[k0 * hd..k1 * hd]);
        let mut p = vec![0.0f32; rows * width];
        block_probs(view, q_rows, k_blk, (i0, k0), hd, &mut p).map_err(shape_err)?;
        // dS = P * (dP - rowsum(P * dP)), dP = dO V^T.
        let mut ds = matmul(d_rows, v_blk, (rows, hd, width), true)?;
        for (ds, p) in ds.chunks_exact_mut(width).zip(p.chunks_exact(width)) {
            let dot: f32 = ds.iter().zip(p).map(|(d, p)| d * p).sum();
            for (d, p) in ds.iter_mut().zip(p) {
                *d = p * (*d - dot);
            }
        }
        dq[i0 * hd..(i0 + rows) * hd].copy_from_slice(&matmul(
            &ds,
            k_blk,
            (rows, width, hd),
            false,
        )?);
        let dk_blk = matmul_tn(&ds, q_rows, (rows, width, hd))?;
        let dv_blk = matmul_tn(&p, d_rows, (rows, width, hd))?;
        for (a, b) in dk[k0 * hd..k1 * hd].iter_mut().zip(dk_blk) {
            *a += b;
        }
        for (a, b) in dv[k0 * hd..k1 * hd].iter_mut().zip(dv_blk) {
            *a += b;
        }
    }
    Ok(HeadGrads { dq, dk, dv })
}

#[cfg(test)]
mod tests {
    use super::super::grad::tests::{assert_grad, numeric_grad, values};
    use super::*;
    use crate::model::attention::{attend_head, mask_row, AttentionMask};

    /// `<softmax(mask(q k^T)) v, g>` in f64.
    fn objective(q: &[f64], k: &[f64], v: &[f64], g: &[f32], hd: usize, view: &KeyView) -> f64 {
        let (len, n_keys) = (q.len() / hd, k.len() / hd);
        let mut total = 0.0;
        for i in 0..len {
            let mut row: Vec<f32> = vec![0.0; n_keys];
            mask_row(view, i, 0, &mut row);
            let s: Vec<f64> = (0..n_keys)
                .map(|j| match row[j] == f32::NEG_INFINITY {
                    true => f64::NEG_INFINITY,
                    false => (0..hd).map(|d| q[i * hd + d] * k[j * hd + d]).sum(),
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (j, w) in e.iter().enumerate() {
                for d in 0..hd {
                    total += w / sum * v[j * hd + d] * g[i * hd + d] as f64;
                }
            }
        }
        total
    }

    #[test]
    fn attention_backward_matches_central_differences_under_every_mask() {
        let hd = 4;
        // Encoder-like (causal: with a window over 260 queries, two blocks; without, continuing 10
        // cached positions) and
        // decoder-like (5 cached keys, then the canvas's own, all visible).
        let cases = [
            (
                260,
                260,
                0,
                0,
                AttentionMask::Causal {
                    window: Some(8),
                    blocks: None,
                },
            ),
            (
                40,
                50,
                0,
                10,
                AttentionMask::Causal {
                    window: None,
                    blocks: None,
                },
            ),
            (6, 11, 3, 8, AttentionMask::Full),
        ];
        for (len, n_keys, first_key, first_query, mask) in cases {
            let view = KeyView {
                keys: Vec::new(),
                values: Vec::new(),
                first_key,
                first_query,
                mask,
            };
            let q = values(len * hd, 1, 1.5);
            let k = values(n_keys * hd, 2, 1.5);
            let v = values(n_keys * hd, 3, 1.0);
            let g = values(len * hd, 4, 1.0);
            // The forward this inverts is the model's own.
            let out = attend_head(&q, len, &k, &v, hd, &view).unwrap();
            let up = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
            let (q64, k64, v64) = (up(&q), up(&k), up(&v));
            let fwd: f64 = out.iter().zip(&g).map(|(o, g)| (o * g) as f64).sum();
            let want = objective(&q64, &k64, &v64, &g, hd, &view);
            assert!(
                (fwd - want).abs() < 1e-4 * want.abs().max(1.0),
                "{mask:?}: forward"
            );
            let HeadGrads { dq, dk, dv } =
                attend_head_backward(&q, len, &k, &v, hd, &view, &g).unwrap();
            let e = 1e-6;
            let what = format!("{mask:?}");
            let fq = |x: &[f64]| objective(x, &k64, &v64, &g, hd, &view);
            let fk = |x: &[f64]| objective(&q64, x, &v64, &g, hd, &view);
            let fv = |x: &[f64]| objective(&q64, &k64, x, &g, hd, &view);
            assert_grad(&format!("{what} dq"), &dq, &numeric_grad(&fq, &q, e), 1e-5);
            assert_grad(&format!("{what} dk"), &dk, &numeric_grad(&fk, &k, e), 1e-5);
            assert_grad(&format!("{what} dv"), &dv, &numeric_grad(&fv, &v, e), 1e-5);
        }
    }
}
