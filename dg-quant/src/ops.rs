//! Small f32 operations shared by the text model and the vision tower: norms, activations,
//! softmax and rotary embeddings. They run row by row; the `_par` variants split whole
//! matrices into blocks of rows (or elements) on the pool, each block computed as the serial
//! function computes it (the same bits): run serially between the parallel products, they
//! would leave every other thread idle.

use rayon::prelude::*;

use crate::kernels::{with_kernel, Kernel, Kernels, View, SUM_ROWS};

/// Rows per task of the row-wise `_par` variants.
const PAR_ROWS: usize = 64;
/// Elements per task of the element-wise `_par` variants.
const PAR_ELEMENTS: usize = 1 << 14;

/// `mx.fast.rms_norm(x, weight, eps)` over one row: `x * rsqrt(mean(x^2) + eps) * weight`.
/// `weight = None` is the scale-free norm (`RMSNormNoScale`).
pub fn rms_norm_row(x: &[f32], weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    scale_row(x, inverse_rms(mean_square, eps), weight, out);
}

/// `1 / sqrt(mean_square + eps)`.
fn inverse_rms(mean_square: f32, eps: f32) -> f32 {
    1.0 / (mean_square + eps).sqrt()
}

/// `out = x * inv * weight` (or `x * inv`).
fn scale_row(x: &[f32], inv: f32, weight: Option<&[f32]>, out: &mut [f32]) {
    match weight {
        Some(w) => {
            for ((o, v), w) in out.iter_mut().zip(x).zip(w) {
                *o = v * inv * w;
            }
        }
        None => {
            for (o, v) in out.iter_mut().zip(x) {
                *o = v * inv;
            }
        }
    }
}

/// Columns per chunk of squares in [`inverse_rms_rows`] (16 rows of them, 16 KB, in L1).
const SQUARE_COLUMNS: usize = 256;

/// [`inverse_rms`] of up to `SUM_ROWS` `dim`-wide rows of `x`, `ld` apart: each row's squares
/// summed left to right as in [`rms_norm_row`] (the same bits), the rows side by side in
/// register lanes ([`Kernel::add_rows_in_order`]) instead of one serial chain each.
fn inverse_rms_rows(
    x: &[f32],
    (rows, dim, ld): (usize, usize, usize),
    eps: f32,
) -> [f32; SUM_ROWS] {
    let mut sums = [0.0f32; SUM_ROWS];
    let mut squares = [0.0f32; SUM_ROWS * SQUARE_COLUMNS];
    for c in (0..dim).step_by(SQUARE_COLUMNS) {
        let len = SQUARE_COLUMNS.min(dim - c);
        for (r, sq) in squares
            .chunks_exact_mut(SQUARE_COLUMNS)
            .enumerate()
            .take(rows)
        {
            for (s, v) in sq.iter_mut().zip(&x[r * ld + c..r * ld + c + len]) {
                *s = v * v;
            }
        }
        let view = View::new(&squares, rows, len, SQUARE_COLUMNS);
        with_kernel!(Kernels::best(), k => k.add_rows_in_order(view, &mut sums));
    }
    sums.map(|s| inverse_rms(s / dim as f32, eps))
}

/// RMS norm of every `dim`-wide row of `x`, in place.
pub fn rms_norm_rows_inplace(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    if dim == 0 {
        return;
    }
    for block in x.chunks_mut(dim * SUM_ROWS) {
        let rows = block.len() / dim;
        let inv = inverse_rms_rows(block, (rows, dim, dim), eps);
        for (row, &inv) in block.chunks_exact_mut(dim).zip(&inv) {
            match weight {
                Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * inv * w),
                None => row.iter_mut().for_each(|v| *v *= inv),
            }
        }
    }
}

/// RMS norm of every `dim`-wide row of `x` into `out`.
pub fn rms_norm_rows(x: &[f32], dim: usize, weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = x.len().min(out.len()) / dim.max(1) * dim;
    rms_norm_rows_strided(&x[..n], dim, dim, weight, eps, &mut out[..n]);
}

/// RMS norm of `dim`-wide rows of `x` that start `ld` apart, packed into `out` (as many rows
/// as both hold): a head's rows inside a projection of several heads.
pub fn rms_norm_rows_strided(
    x: &[f32],
    dim: usize,
    ld: usize,
    weight: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) {
    if dim == 0 || ld < dim {
        return;
    }
    let in_x = (x.len() + ld - dim) / ld;
    let rows = in_x.min(out.len() / dim);
    for (b, block) in out[..rows * dim].chunks_mut(dim * SUM_ROWS).enumerate() {
        let rows = block.len() / dim;
        let x = &x[b * SUM_ROWS * ld..];
        let inv = inverse_rms_rows(x, (rows, dim, ld), eps);
        for (r, (o, &inv)) in block.chunks_exact_mut(dim).zip(&inv).enumerate() {
            scale_row(&x[r * ld..r * ld + dim], inv, weight, o);
        }
    }
}

/// [`rms_norm_rows`] on blocks of rows in parallel.
pub fn rms_norm_rows_par(x: &[f32], dim: usize, weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let block = dim.max(1) * PAR_ROWS;
    x.par_chunks(block)
        .zip(out.par_chunks_mut(block))
        .for_each(|(x, o)| rms_norm_rows(x, dim, weight, eps, o));
}

/// [`rms_norm_rows_inplace`] on blocks of rows in parallel.
pub fn rms_norm_rows_inplace_par(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    x.par_chunks_mut(dim.max(1) * PAR_ROWS)
        .for_each(|x| rms_norm_rows_inplace(x, dim, weight, eps));
}

/// `tanh` as a branch-free rational approximation (Eigen's `ptanh_float` coefficients),
/// within a few ulp of the correctly rounded value. Plain multiply-adds, not `mul_add`: without
/// FMA enabled at compile time `mul_add` is a libm call per use. libm's `tanhf` is a call per element
/// and was a quarter of a denoising step (the soft cap and every GeGLU use it); this form
/// vectorizes.
#[inline]
pub fn tanh(x: f32) -> f32 {
    // Beyond this |x| the result rounds to +-1 in f32.
    const CLAMP: f32 = 7.905_311;
    const A1: f32 = 4.893_524_6e-3;
    const A3: f32 = 6.372_619_3e-4;
    const A5: f32 = 1.485_722_4e-5;
    const A7: f32 = 5.122_297e-8;
    const A9: f32 = -8.604_672e-11;
    const A11: f32 = 2.000_188e-13;
    const A13: f32 = -2.760_768_5e-16;
    const B0: f32 = 4.893_525e-3;
    const B2: f32 = 2.268_434_6e-3;
    const B4: f32 = 1.185_347_1e-4;
    const B6: f32 = 1.198_258_4e-6;
    let x = x.clamp(-CLAMP, CLAMP);
    let x2 = x * x;
    let mut p = A13 * x2 + A11;
    p = p * x2 + A9;
    p = p * x2 + A7;
    p = p * x2 + A5;
    p = p * x2 + A3;
    p = p * x2 + A1;
    let p = p * x;
    let mut q = B6 * x2 + B4;
    q = q * x2 + B2;
    q = q * x2 + B0;
    p / q
}

/// `nn.gelu_approx`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
}

/// GeGLU: `gelu_tanh(gate) * up`, written into `gate`.
pub fn geglu_inplace(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    with_kernel!(Kernels::best(), k => k.geglu(&mut gate[..n], &up[..n]));
}

/// [`geglu_inplace`] on blocks of elements in parallel.
pub fn geglu_inplace_par(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(PAR_ELEMENTS)
        .zip(up.par_chunks(PAR_ELEMENTS))
        .for_each(|(g, u)| geglu_inplace(g, u));
}

/// `f(&mut x[i], y[i])` for every `i`, blocks of elements in parallel (residual streams are
/// megabytes, and a serial pass would leave every other thread idle).
pub fn elementwise_par(x: &mut [f32], y: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    x.par_chunks_mut(PAR_ELEMENTS)
        .zip(y.par_chunks(PAR_ELEMENTS))
        .for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(x, &y)| f(x, y)));
}

/// Numerically stable softmax of one row, in place (max-subtracted, f32 accumulation).
pub fn softmax_inplace(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // A fully masked row: MLX yields NaN here; we never build one, keep zeros.
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// `log(sum(exp(row)))`, max-subtracted.
pub fn logsumexp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
    max + sum.ln()
}

/// Rotary embedding in the non-interleaved ("rotate half") layout MLX uses with
/// `traditional=False`: pairs `(x0[i], x1[i])` (a head's `x[i]` and `x[i + half]`) are rotated
/// by the angle `position * inv_freq[i]` whose cosine and sine are `cos[i]`, `sin[i]`.
pub fn rope_rotate_half(x0: &mut [f32], x1: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (((a, b), &cos), &sin) in x0.iter_mut().zip(x1.iter_mut()).zip(cos).zip(sin) {
        let (va, vb) = (*a, *b);
        *a = va * cos - vb * sin;
        *b = va * sin + vb * cos;
    }
}

/// Tanh soft cap `tanh(x / cap) * cap`, in f32 (the reference upcasts before capping).
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    with_kernel!(Kernels::best(), k => k.soft_cap(x, cap));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, -1.0];
        let mut out = [0.0f32; 4];
        rms_norm_row(&x, Some(&w), 1e-6, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        let inv = 1.0 / (ms + 1e-6f32).sqrt();
        for i in 0..4 {
            approx::assert_relative_eq!(out[i], x[i] * inv * w[i], max_relative = 1e-6);
        }
    }

    #[test]
    fn norms_of_many_rows_are_each_row_alone() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for dim in [1usize, 7, 16, 250, 256, 300, 2816] {
            for rows in [1usize, 5, 16, 17, 40] {
                // Magnitudes over many binades, so that any other summation order rounds
                // differently somewhere.
                let ld = 3 * dim + 5;
                let x: Vec<f32> = (0..rows * ld)
                    .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-12..12)))
                    .collect();
                let w: Vec<f32> = (0..dim).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                for weight in [Some(w.as_slice()), None] {
                    let mut want = vec![0.0f32; rows * dim];
                    for (r, o) in want.chunks_exact_mut(dim).enumerate() {
                        rms_norm_row(&x[r * ld..r * ld + dim], weight, 1e-6, o);
                    }
                    let mut strided = vec![0.0f32; rows * dim];
                    rms_norm_rows_strided(&x, dim, ld, weight, 1e-6, &mut strided);
                    let packed: Vec<f32> = x
                        .chunks_exact(ld)
                        .flat_map(|r| &r[..dim])
                        .copied()
                        .collect();
                    let mut out = vec![0.0f32; rows * dim];
                    rms_norm_rows(&packed, dim, weight, 1e-6, &mut out);
                    let mut inplace = packed.clone();
                    rms_norm_rows_inplace(&mut inplace, dim, weight, 1e-6);
                    let case = format!("dim {dim}, rows {rows}, weight {}", weight.is_some());
                    assert_eq!(bits(&strided), bits(&want), "strided, {case}");
                    assert_eq!(bits(&out), bits(&want), "packed, {case}");
                    assert_eq!(bits(&inplace), bits(&want), "in place, {case}");
                    // Room for more rows than `x` holds: only the rows it holds are written.
                    let mut long = vec![7.0f32; (rows + 2) * dim];
                    rms_norm_rows_strided(&x, dim, ld, weight, 1e-6, &mut long);
                    assert_eq!(bits(&long[..rows * dim]), bits(&want), "longer out, {case}");
                    assert!(long[rows * dim..].iter().all(|&v| v == 7.0), "{case}");
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders() {
        let mut row = [1.0f32, 2.0, 3.0, -1e9];
        softmax_inplace(&mut row);
        approx::assert_relative_eq!(row.iter().sum::<f32>(), 1.0, max_relative = 1e-6);
        assert!(row[2] > row[1] && row[1] > row[0] && row[3] == 0.0);
        approx::assert_relative_eq!(logsumexp(&[0.0, 0.0]), 2f32.ln(), max_relative = 1e-6);
    }

    #[test]
    fn rope_rotates_pairs() {
        let mut a = [1.0f32, 0.0];
        let mut b = [0.0f32, 1.0];
        let theta = std::f32::consts::FRAC_PI_2;
        rope_rotate_half(&mut a, &mut b, &[theta.cos(), 1.0], &[theta.sin(), 0.0]);
        approx::assert_abs_diff_eq!(a[0], 0.0, epsilon = 1e-6);
        approx::assert_abs_diff_eq!(b[0], 1.0, epsilon = 1e-6);
        assert_eq!((a[1], b[1]), (0.0, 1.0));
    }

    #[test]
    fn tanh_matches_libm_within_a_few_ulp() {
        let mut worst = 0.0f32;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            let (ours, libm) = (tanh(x), x.tanh());
            let ulp = (libm.abs().max(f32::MIN_POSITIVE) * f32::EPSILON).max(1e-30);
            worst = worst.max((ours - libm).abs() / ulp);
        }
        for x in [20.0f32, -20.0, 1e10, -1e10, 1e-20, 0.0] {
            approx::assert_abs_diff_eq!(tanh(x), x.tanh(), epsilon = 1e-6);
        }
        assert!(worst <= 4.0, "worst error {worst} ulp");
    }

    #[test]
    fn gelu_known_values() {
        approx::assert_abs_diff_eq!(gelu_tanh(0.0), 0.0);
        approx::assert_abs_diff_eq!(gelu_tanh(1.0), 0.841_192, epsilon = 1e-5);
        approx::assert_abs_diff_eq!(gelu_tanh(-3.0), -0.003_637_4, epsilon = 1e-5);
    }
}
