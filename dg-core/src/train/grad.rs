//! Backward passes of the single operations, in f32. Each is checked in the tests below against
//! central differences of an f64 forward.

use dg_quant::ops;

use super::shape_err;
use crate::error::CoreError;
use crate::model::rope::RopeAngles;

/// `out [m, n] = a [m, k] @ b [k, n]`, or `@ b^T` with `b [n, k]` when `b_transposed`.
pub(crate) fn matmul(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
) -> Result<Vec<f32>, CoreError> {
    let mut out = vec![0.0f32; m * n];
    dg_quant::matmul_f32(a, b, m, k, n, b_transposed, &mut out).map_err(shape_err)?;
    Ok(out)
}

/// `a^T` of a row-major `[rows, cols]` matrix.
pub(crate) fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; a.len()];
    for (r, row) in a.chunks_exact(cols).enumerate().take(rows) {
        for (c, v) in row.iter().enumerate() {
            t[c * rows + r] = *v;
        }
    }
    t
}

/// `a^T @ b` for `a [m, k]` and `b [m, n]`: `[k, n]` (a weight gradient from inputs and
/// output gradients).
pub(crate) fn matmul_tn(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
) -> Result<Vec<f32>, CoreError> {
    matmul(&transpose(a, m, k), b, (k, m, n), false)
}

/// Gradient of `rms_norm_row(x, weight, eps)` (`y = x * r * w`, `r = rsqrt(mean(x^2) + eps)`)
/// with respect to `x`, for every `dim`-wide row: `dx = r (dy w) - x r^3 mean(dy w x)`.
pub(crate) fn rms_norm_backward(
    x: &[f32],
    dim: usize,
    weight: Option<&[f32]>,
    eps: f32,
    dy: &[f32],
) -> Vec<f32> {
    let mut dx = vec![0.0f32; x.len()];
    let mut u = vec![0.0f32; dim];
    for ((x, dy), dx) in x
        .chunks_exact(dim)
        .zip(dy.chunks_exact(dim))
        .zip(dx.chunks_exact_mut(dim))
    {
        let mean_square = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let r = 1.0 / (mean_square + eps).sqrt();
        match weight {
            Some(w) => u
                .iter_mut()
                .zip(dy)
                .zip(w)
                .for_each(|((u, d), w)| *u = d * w),
            None => u.copy_from_slice(dy),
        }
        let dot = u.iter().zip(x).map(|(u, x)| u * x).sum::<f32>() / dim as f32;
        let c = r * r * r * dot;
        for ((dx, u), x) in dx.iter_mut().zip(&u).zip(x) {
            *dx = r * u - x * c;
        }
    }
    dx
}

/// The masked mean cross-entropy of soft-capped logits and its gradient. `logits` holds the
/// capped logits `[rows, vocab]` (`tanh(z / cap) * cap`, or `z` without a cap) and is
/// overwritten with the gradient with respect to the uncapped `z`. Returns the loss
/// `sum_t corrupt_t ce_t / max(sum corrupt, 1)`, `ce_t = logsumexp(row_t) - row_t[target_t]`.
pub(crate) fn softcap_cross_entropy(
    logits: &mut [f32],
    vocab: usize,
    targets: &[u32],
    corrupt: &[bool],
    cap: Option<f32>,
) -> f32 {
    let count = corrupt.iter().filter(|&&c| c).count();
    let denom = count.max(1) as f32;
    let mut sum = 0.0f32;
    for ((row, &target), &c) in logits.chunks_exact_mut(vocab).zip(targets).zip(corrupt) {
        if !c {
            row.fill(0.0);
            continue;
        }
        let target = target as usize;
        sum += ops::logsumexp(row) - row[target];
        // d ce / d row = softmax(row) - onehot(target); then the soft cap's 1 - tanh^2.
        let capped: Option<Vec<f32>> = cap.map(|_| row.to_vec());
        ops::softmax_inplace(row);
        row[target] -= 1.0;
        for v in row.iter_mut() {
            *v /= denom;
        }
        if let (Some(cap), Some(capped)) = (cap, capped) {
            for (v, y) in row.iter_mut().zip(capped) {
                let t = y / cap;
                *v *= 1.0 - t * t;
            }
        }
    }
    sum / denom
}

/// Derivative of `ops::gelu_tanh`.
fn gelu_tanh_derivative(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const C: f32 = 0.044715;
    let t = ops::tanh(SQRT_2_OVER_PI * (x + C * x * x * x));
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * C * x * x)
}

/// Gradients of GeGLU `gelu_tanh(gate) * up` with respect to `gate` and `up`.
pub(crate) fn geglu_backward(gate: &[f32], up: &[f32], d_out: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut d_gate = vec![0.0f32; gate.len()];
    let mut d_up = vec![0.0f32; gate.len()];
    for i in 0..gate.len() {
        d_up[i] = d_out[i] * ops::gelu_tanh(gate[i]);
        d_gate[i] = d_out[i] * up[i] * gelu_tanh_derivative(gate[i]);
    }
    (d_gate, d_up)
}

/// Gradient of one row's routing weights `softmax(scores[experts]) * per_expert_scale[experts]`
/// with respect to the row's scores (the chosen experts are constants): added into `d_scores`.
pub(crate) fn router_weights_backward(
    scores: &[f32],
    experts: &[usize],
    per_expert_scale: &[f32],
    d_weights: &[f32],
    d_scores: &mut [f32],
) {
    let mut p: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
    ops::softmax_inplace(&mut p);
    let dp: Vec<f32> = d_weights
        .iter()
        .zip(experts)
        .map(|(d, &e)| d * per_expert_scale[e])
        .collect();
    let dot: f32 = p.iter().zip(&dp).map(|(p, d)| p * d).sum();
    for ((&e, p), dp) in experts.iter().zip(&p).zip(&dp) {
        d_scores[e] += p * (dp - dot);
    }
}

/// Gradients of the experts' combination `out[t] = sum_k w[t, k] y[t * top_k + k]` with respect
/// to the weights (`[rows * top_k]`) and the expert outputs `y` (`[rows * top_k, dim]`).
pub(crate) fn combine_backward(
    d_out: &[f32],
    y: &[f32],
    weights: &[f32],
    dim: usize,
    top_k: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut d_w = vec![0.0f32; weights.len()];
    let mut d_y = vec![0.0f32; y.len()];
    for (p, (&w, dw)) in weights.iter().zip(d_w.iter_mut()).enumerate() {
        let d = &d_out[(p / top_k) * dim..(p / top_k + 1) * dim];
        let yp = &y[p * dim..(p + 1) * dim];
        *dw = d.iter().zip(yp).map(|(d, y)| d * y).sum();
        for (dy, d) in d_y[p * dim..(p + 1) * dim].iter_mut().zip(d) {
            *dy = w * d;
        }
    }
    (d_w, d_y)
}

/// The LoRA branch `scale * (x @ a) @ b` of a linear layer (`x [m, in]`, `a [in, rank]`,
/// `b [rank, out]`): given `d_out [m, out]`, adds the factors' gradients into `d_a`, `d_b` and
/// returns the branch's input gradient `[m, in]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lora_backward(
    x: &[f32],
    a: &[f32],
    b: &[f32],
    (m, in_dim, rank, out_dim): (usize, usize, usize, usize),
    scale: f32,
    d_out: &[f32],
    d_a: &mut [f32],
    d_b: &mut [f32],
) -> Result<Vec<f32>, CoreError> {
    let xa = matmul(x, a, (m, in_dim, rank), false)?;
    let dz: Vec<f32> = d_out.iter().map(|d| scale * d).collect();
    for (g, v) in d_b.iter_mut().zip(matmul_tn(&xa, &dz, (m, rank, out_dim))?) {
        *g += v;
    }
    let d_xa = matmul(&dz, b, (m, out_dim, rank), true)?;
    for (g, v) in d_a.iter_mut().zip(matmul_tn(x, &d_xa, (m, in_dim, rank))?) {
        *g += v;
    }
    matmul(&d_xa, a, (m, rank, in_dim), true)
}

/// Transposed rotation of `RopeAngles::rotate` for the `i`-th position (its gradient):
/// rotate-half with `-theta` is the rotation with the second half negated before and after.
pub(crate) fn rope_backward(angles: &RopeAngles, head: &mut [f32], i: usize) {
    let half = head.len() / 2;
    head[half..].iter_mut().for_each(|v| *v = -*v);
    angles.rotate(head, i);
    head[half..].iter_mut().for_each(|v| *v = -*v);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random values in `[-scale, scale)`.
    pub(crate) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Central differences of the f64 function `f` at `x`.
    pub(crate) fn numeric_grad(f: &dyn Fn(&[f64]) -> f64, x: &[f32], eps: f64) -> Vec<f64> {
        let mut x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        (0..x.len())
            .map(|i| {
                let v = x[i];
                x[i] = v + eps;
                let up = f(&x);
                x[i] = v - eps;
                let down = f(&x);
                x[i] = v;
                (up - down) / (2.0 * eps)
            })
            .collect()
    }

    /// `||got - want|| / ||want||` must be under `tol` (and `want` must not vanish).
    #[track_caller]
    pub(crate) fn assert_grad(what: &str, got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let norm: f64 = want.iter().map(|v| v * v).sum::<f64>().sqrt();
        let diff: f64 = got
            .iter()
            .zip(want)
            .map(|(g, w)| (*g as f64 - w).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(norm > 1e-6, "{what}: the reference gradient vanishes");
        assert!(
            diff / norm < tol,
            "{what}: relative error {:.3e} (norm {norm:.3e})",
            diff / norm
        );
    }

    fn dot(a: &[f64], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(a, b)| a * *b as f64).sum()
    }

    pub(crate) fn rms_norm_f64(x: &[f64], w: Option<&[f32]>, eps: f64) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter()
            .enumerate()
            .map(|(i, v)| v * r * w.map_or(1.0, |w| w[i] as f64))
            .collect()
    }

    #[test]
    fn rms_norm_backward_matches_central_differences() {
        let dim = 24;
        let x = values(2 * dim, 1, 2.0);
        let w = values(dim, 2, 1.5);
        let g = values(2 * dim, 3, 1.0);
        for weight in [Some(w.as_slice()), None] {
            let f = |x: &[f64]| -> f64 {
                x.chunks(dim)
                    .zip(g.chunks(dim))
                    .map(|(x, g)| dot(&rms_norm_f64(x, weight, 1e-6), g))
                    .sum()
            };
            let got = rms_norm_backward(&x, dim, weight, 1e-6, &g);
            assert_grad("rms norm", &got, &numeric_grad(&f, &x, 1e-6), 1e-5);
        }
    }

    #[test]
    fn softcap_cross_entropy_matches_central_differences() {
        let vocab = 40;
        let z = values(3 * vocab, 4, 60.0);
        let targets = [3u32, 17, 39];
        let corrupt = [true, false, true];
        let cap = 30.0f32;
        let f = |z: &[f64]| -> f64 {
            let mut sum = 0.0;
            for (t, row) in z.chunks(vocab).enumerate() {
                if !corrupt[t] {
                    continue;
                }
                let y: Vec<f64> = row
                    .iter()
                    .map(|v| (v / cap as f64).tanh() * cap as f64)
                    .collect();
                let max = y.iter().copied().fold(f64::MIN, f64::max);
                let lse = max + y.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                sum += lse - y[targets[t] as usize];
            }
            sum / 2.0
        };
        let mut logits = z.clone();
        ops::softcap_inplace(&mut logits, cap);
        let loss = softcap_cross_entropy(&mut logits, vocab, &targets, &corrupt, Some(cap));
        let z64: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        assert!((loss as f64 - f(&z64)).abs() < 1e-5 * f(&z64).abs());
        assert_grad(
            "softcap + cross-entropy",
            &logits,
            &numeric_grad(&f, &z, 1e-4),
            1e-4,
        );
        // Nothing corrupted: loss 0 (denominator 1), no gradient.
        let mut none = z.clone();
        assert_eq!(
            softcap_cross_entropy(&mut none, vocab, &targets, &[false; 3], Some(cap)),
            0.0
        );
        assert!(none.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn geglu_backward_matches_central_differences() {
        let n = 50;
        let gate = values(n, 5, 4.0);
        let up = values(n, 6, 2.0);
        let g = values(n, 7, 1.0);
        let gelu = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        let (d_gate, d_up) = geglu_backward(&gate, &up, &g);
        let fg = |x: &[f64]| -> f64 {
            (0..n)
                .map(|i| gelu(x[i]) * up[i] as f64 * g[i] as f64)
                .sum()
        };
        let fu = |x: &[f64]| -> f64 {
            (0..n)
                .map(|i| gelu(gate[i] as f64) * x[i] * g[i] as f64)
                .sum()
        };
        assert_grad("geglu gate", &d_gate, &numeric_grad(&fg, &gate, 1e-5), 1e-5);
        assert_grad("geglu up", &d_up, &numeric_grad(&fu, &up, 1e-5), 1e-5);
    }

    #[test]
    fn router_weights_backward_matches_central_differences() {
        let scores = values(8, 8, 3.0);
        let pes = values(8, 9, 1.0);
        let experts = [5usize, 2, 7];
        let g = values(3, 10, 1.0);
        let f = |s: &[f64]| -> f64 {
            let sel: Vec<f64> = experts.iter().map(|&e| s[e]).collect();
            let max = sel.iter().copied().fold(f64::MIN, f64::max);
            let sum: f64 = sel.iter().map(|v| (v - max).exp()).sum();
            sel.iter()
                .zip(&experts)
                .zip(&g)
                .map(|((v, &e), g)| (v - max).exp() / sum * pes[e] as f64 * *g as f64)
                .sum()
        };
        let mut d = vec![0.0f32; 8];
        router_weights_backward(&scores, &experts, &pes, &g, &mut d);
        assert_grad("router weights", &d, &numeric_grad(&f, &scores, 1e-6), 1e-6);
        assert!([0, 1, 3, 4, 6].iter().all(|&e| d[e] == 0.0));
    }

    #[test]
    fn combine_backward_matches_central_differences() {
        let (rows, k, dim) = (3, 2, 5);
        let y = values(rows * k * dim, 11, 1.0);
        let w = values(rows * k, 12, 1.0);
        let g = values(rows * dim, 13, 1.0);
        let out = |w: &[f64], y: &[f64]| -> f64 {
            let mut s = 0.0;
            for p in 0..rows * k {
                for d in 0..dim {
                    s += w[p] * y[p * dim + d] * g[(p / k) * dim + d] as f64;
                }
            }
            s
        };
        let (d_w, d_y) = combine_backward(&g, &y, &w, dim, k);
        let y64: Vec<f64> = y.iter().map(|&v| v as f64).collect();
        let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let fw = |w: &[f64]| out(w, &y64);
        let fy = |y: &[f64]| out(&w64, y);
        assert_grad("combine weights", &d_w, &numeric_grad(&fw, &w, 1e-6), 1e-6);
        assert_grad("combine outputs", &d_y, &numeric_grad(&fy, &y, 1e-6), 1e-6);
    }

    #[test]
    fn lora_backward_matches_central_differences() {
        let (m, in_dim, rank, out_dim, scale) = (3, 7, 2, 5, 8.0f32);
        let x = values(m * in_dim, 14, 1.0);
        let a = values(in_dim * rank, 15, 0.5);
        let b = values(rank * out_dim, 16, 0.5);
        let g = values(m * out_dim, 17, 1.0);
        let f = |x: &[f64], a: &[f64], b: &[f64]| -> f64 {
            let mut s = 0.0;
            for i in 0..m {
                for o in 0..out_dim {
                    let mut z = 0.0;
                    for r in 0..rank {
                        let xa: f64 = (0..in_dim)
                            .map(|j| x[i * in_dim + j] * a[j * rank + r])
                            .sum();
                        z += xa * b[r * out_dim + o];
                    }
                    s += scale as f64 * z * g[i * out_dim + o] as f64;
                }
            }
            s
        };
        let up = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (x64, a64, b64) = (up(&x), up(&a), up(&b));
        let (mut d_a, mut d_b) = (vec![0.0f32; a.len()], vec![0.0f32; b.len()]);
        let dims = (m, in_dim, rank, out_dim);
        let d_x = lora_backward(&x, &a, &b, dims, scale, &g, &mut d_a, &mut d_b).unwrap();
        let e = 1e-6;
        assert_grad(
            "lora x",
            &d_x,
            &numeric_grad(&|x| f(x, &a64, &b64), &x, e),
            1e-6,
        );
        assert_grad(
            "lora a",
            &d_a,
            &numeric_grad(&|a| f(&x64, a, &b64), &a, e),
            1e-6,
        );
        assert_grad(
            "lora b",
            &d_b,
            &numeric_grad(&|b| f(&x64, &a64, b), &b, e),
            1e-6,
        );
    }

    #[test]
    fn rope_backward_is_the_transposed_rotation() {
        use crate::config::RopeParameters;
        for (hd, rope_type, partial, theta) in [
            (16, "default", 1.0, 10000.0),
            (32, "proportional", 0.25, 1e6),
        ] {
            let params = RopeParameters {
                rope_type: rope_type.into(),
                rope_theta: theta,
                partial_rotary_factor: partial,
                factor: 1.0,
            };
            let angles = crate::model::rope::Rope::new(hd, &params).angles(37..38);
            let g = values(hd, 19, 1.0);
            // The rotation is linear: (R^T g)_j = <R e_j, g>.
            let want: Vec<f64> = (0..hd)
                .map(|j| {
                    let mut e = vec![0.0f32; hd];
                    e[j] = 1.0;
                    angles.rotate(&mut e, 0);
                    e.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
                })
                .collect();
            let mut got = g.clone();
            rope_backward(&angles, &mut got, 0);
            assert_grad(rope_type, &got, &want, 1e-6);
        }
    }
}
