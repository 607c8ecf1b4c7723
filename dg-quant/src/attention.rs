//! Bidirectional softmax attention in f32 (the vision tower's: every query sees every key,
//! scale 1), in blocks of queries.
//!
//! Computed head by head as `softmax(q k^T) v`, a head's `[n, n]` scores of a large image
//! (2376 patches: 22 MB) would leave the caches between the three passes over them (scores,
//! softmax, values). Each task here takes one head's block of `QUERY_ROWS` queries, whose
//! scores stay in this thread's cache from their product to the values product. Both
//! products run on the register tiles of `x @ W` (`Kernel::tiles`), each element one fma
//! chain in order: the scores over the head's dimensions against keys transposed once per
//! head, the values over the keys ([`crate::attention_values`]). The `gemm` crate packed a
//! head's keys again for every block of queries and split the values' long sum into chunks.

use rayon::prelude::*;

use crate::format::{check_len, mul};
use crate::kernels::{tiles_any_width, with_kernel, Kernels, View, ViewMut};
use crate::matmul::attention_values_on;
use crate::scratch::with_buffer;
use crate::QuantError;

/// Queries per task: their scores over a large image's keys (2376: 1.2 MB) stay near one
/// core's L2 while the values product reads them (64 to 256 rows measured alike:
/// docs/PERFORMANCE.md).
const QUERY_ROWS: usize = 128;

/// `out [n_q, heads * hd]` (token-major) = `softmax(q_h k_h^T) v_h` for every query head `h`,
/// from head-major `q [heads, n_q, hd]`, `k` and `v` `[kv_heads, n_k, hd]` (query head `h`
/// reads key/value head `h / (heads / kv_heads)`); the softmax is MLX's
/// ([`crate::mlx::softmax_rows_inplace`]). Tasks (head, block of queries) run on the current
/// pool.
pub fn attention_bidirectional(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (heads, kv_heads, hd): (usize, usize, usize),
    n_q: usize,
    n_k: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(QuantError::Heads { heads, kv_heads });
    }
    check_len(
        "attention queries",
        q.len(),
        mul(
            "attention queries",
            mul("attention queries", heads, n_q)?,
            hd,
        )?,
    )?;
    check_len(
        "attention keys",
        k.len(),
        mul("attention keys", mul("attention keys", kv_heads, n_k)?, hd)?,
    )?;
    check_len(
        "attention values",
        v.len(),
        mul(
            "attention values",
            mul("attention values", kv_heads, n_k)?,
            hd,
        )?,
    )?;
    check_len(
        "attention output",
        out.len(),
        mul("attention output", mul("attention output", n_q, heads)?, hd)?,
    )?;
    if n_q == 0 || hd == 0 {
        return Ok(());
    }
    attention_bidirectional_on(
        Kernels::best(),
        q,
        k,
        v,
        (heads, kv_heads, hd),
        n_q,
        n_k,
        out,
    );
    Ok(())
}

/// [`attention_bidirectional`] on the given kernels, on checked lengths.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_bidirectional_on(
    kernels: Kernels,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (heads, kv_heads, hd): (usize, usize, usize),
    n_q: usize,
    n_k: usize,
    out: &mut [f32],
) {
    let group = heads / kv_heads;
    let head_len = n_k * hd;
    // Each key head transposed, `[hd, n_k]`: the scores are then `q @ k^T` on the register
    // tiles of `x @ W`, one fma chain over the head's dimensions per score, reading the keys
    // as rows (shared by every block of queries of the head's group).
    let mut keys_t = vec![0.0f32; k.len()];
    keys_t
        .par_chunks_mut(head_len.max(1))
        .zip(k.par_chunks(head_len.max(1)))
        .for_each(|(t, k)| {
            for (j, key) in k.chunks_exact(hd).enumerate() {
                for (d, &x) in key.iter().enumerate() {
                    t[d * n_k + j] = x;
                }
            }
        });
    let blocks = n_q.div_ceil(QUERY_ROWS);
    let per_task: Vec<Vec<f32>> = (0..heads * blocks)
        .into_par_iter()
        .map(|t| {
            let (h, b) = (t / blocks, t % blocks);
            let (i0, rows) = (b * QUERY_ROWS, QUERY_ROWS.min(n_q - b * QUERY_ROWS));
            let kv = h / group;
            let qs = View::new(
                &q[(h * n_q + i0) * hd..(h * n_q + i0 + rows) * hd],
                rows,
                hd,
                hd,
            );
            let kt = View::new(&keys_t[kv * head_len..(kv + 1) * head_len], hd, n_k, n_k);
            let vs = &v[kv * head_len..(kv + 1) * head_len];
            let mut ctx = vec![0.0f32; rows * hd];
            with_buffer(rows * n_k, |scores| {
                let s = ViewMut::new(scores, rows, n_k, n_k);
                with_kernel!(kernels, kern => tiles_any_width(kern, qs, kt, s, false));
                crate::mlx::softmax_rows_inplace(scores, n_k);
                attention_values_on(kernels, scores, vs, (rows, n_k, hd), &mut ctx, false);
            });
            ctx
        })
        .collect();
    out.par_chunks_mut(heads * hd)
        .enumerate()
        .for_each(|(i, token)| {
            let (b, r) = (i / QUERY_ROWS, i % QUERY_ROWS);
            for (h, dst) in token.chunks_exact_mut(hd).enumerate() {
                dst.copy_from_slice(&per_task[h * blocks + b][r * hd..(r + 1) * hd]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax attention of one query row in f64.
    fn naive_row(q: &[f32], k: &[f32], v: &[f32], hd: usize) -> Vec<f64> {
        let s: Vec<f64> = k
            .chunks_exact(hd)
            .map(|kr| q.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum())
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut o = vec![0.0f64; hd];
        for (w, vr) in e.iter().zip(v.chunks_exact(hd)) {
            for (o, x) in o.iter_mut().zip(vr) {
                *o += w / z * *x as f64;
            }
        }
        o
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    /// Head-major queries, keys and values of the given shape.
    fn inputs(
        (heads, kv_heads, hd): (usize, usize, usize),
        n_q: usize,
        n_k: usize,
        seed: u32,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (
            values(heads * n_q * hd, seed),
            values(kv_heads * n_k * hd, seed + 1),
            values(kv_heads * n_k * hd, seed + 2),
        )
    }

    #[test]
    fn matches_f64_attention() {
        // 300 queries: two whole blocks and a partial one; 4 query heads on 2 key/value heads.
        let (heads, kv_heads, hd, n_q, n_k) = (4usize, 2usize, 9usize, 300usize, 77usize);
        let (q, k, v) = inputs((heads, kv_heads, hd), n_q, n_k, 1);
        let mut out = vec![f32::NAN; n_q * heads * hd];
        attention_bidirectional(&q, &k, &v, (heads, kv_heads, hd), n_q, n_k, &mut out).unwrap();
        for h in 0..heads {
            let kv = h / 2;
            let (ks, vs) = (
                &k[kv * n_k * hd..(kv + 1) * n_k * hd],
                &v[kv * n_k * hd..(kv + 1) * n_k * hd],
            );
            for i in [0usize, 127, 128, 299] {
                let want = naive_row(&q[(h * n_q + i) * hd..(h * n_q + i + 1) * hd], ks, vs, hd);
                let got = &out[(i * heads + h) * hd..(i * heads + h + 1) * hd];
                for (g, w) in got.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() < 1e-5, "head {h} row {i}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_gives_the_portable_bits() {
        // Heads of 72 (two 32-column strips and 8 lanes) over 77 keys (two strips, 8 lanes and
        // a remainder of 5), 130 queries (a whole block and a partial one); 2 query heads per
        // key/value head.
        let (heads, kv_heads, hd, n_q, n_k) = (4usize, 2usize, 72usize, 130usize, 77usize);
        let (q, k, v) = inputs((heads, kv_heads, hd), n_q, n_k, 4);
        let run = |kernels| {
            let mut out = vec![f32::NAN; n_q * heads * hd];
            let shape = (heads, kv_heads, hd);
            attention_bidirectional_on(kernels, &q, &k, &v, shape, n_q, n_k, &mut out);
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let want = run(Kernels::Scalar(crate::Scalar));
        for kernels in Kernels::available() {
            assert!(
                run(kernels) == want,
                "{kernels} differs from the portable kernels"
            );
        }
    }

    #[test]
    fn no_keys_give_zeros() {
        let mut out = vec![f32::NAN; 3 * 2 * 4];
        attention_bidirectional(&[1.0; 24], &[], &[], (2, 1, 4), 3, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn rejects_mismatched_shapes() {
        let mut out = vec![0.0f32; 8];
        let err =
            attention_bidirectional(&[0.0; 8], &[0.0; 8], &[0.0; 8], (3, 2, 4), 2, 2, &mut out);
        assert!(err.unwrap_err().to_string().contains("heads"));
        let err =
            attention_bidirectional(&[0.0; 7], &[0.0; 8], &[0.0; 8], (1, 1, 4), 2, 2, &mut out);
        assert!(err.unwrap_err().to_string().contains("queries"));
    }
}
