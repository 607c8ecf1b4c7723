//! Portable reference kernels. Every SIMD kernel in `x86_64.rs` and `x86_64_avx512.rs` has its
//! twin here and a test against it; these are also the fallback on CPUs without AVX2/FMA.
//!
//! Arguments are trusted (the safe entry points in `affine.rs` / `matmul.rs` validate lengths):
//! `words` is one packed row, `scales`/`biases` its groups, `x`/`out` sized to match.

use half::bf16;

use crate::QuantSpec;

/// Element `k` of a packed row: bits `k * bits ..` of the little-endian bit stream.
#[inline(always)]
pub fn unpack(words: &[u32], k: usize, bits: u32) -> u32 {
    let bit = k * bits as usize;
    let (word, shift) = (bit / 32, (bit % 32) as u32);
    let mut v = (words[word] as u64) >> shift;
    if shift + bits > 32 {
        v |= (words[word + 1] as u64) << (32 - shift);
    }
    (v as u32) & ((1u32 << bits) - 1)
}

/// `scale * q + bias` rounded twice (a product, then a sum), as MLX's `mx.dequantize` computes
/// it in float32: two separate array ops, no fused multiply-add.
#[inline(always)]
pub fn dequant_value(q: u32, scale: f32, bias: f32) -> f32 {
    let prod = scale * q as f32;
    prod + bias
}

/// `y[i] = fma(a, x[i], y[i])`.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    for (y, x) in y.iter_mut().zip(x) {
        *y = a.mul_add(*x, *y);
    }
}

/// One dequantized row of `out.len()` elements.
pub fn dequant_row(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
    out: &mut [f32],
) {
    let g = spec.group_size;
    for (gi, chunk) in out.chunks_exact_mut(g).enumerate() {
        let (s, b) = (scales[gi].to_f32(), biases[gi].to_f32());
        for (j, o) in chunk.iter_mut().enumerate() {
            *o = dequant_value(unpack(words, gi * g + j, spec.bits), s, b);
        }
    }
}

/// The quantized fields (not dequantized) of rows `0..rows`, `cols` columns each, as a
/// column-major panel, each field read in place in its 32-bit word:
/// `out[k * ld + i] = (q[i][k] << (bits * (k % (32 / bits)))) as f32` (exact: at most `bits`
/// significant bits); row `i`'s words start at `words[i * stride]`. Reading fields in place
/// saves the SIMD decode a shift per field; `scale_fields` scales x to match.
pub fn unpack_rows_t(
    words: &[u32],
    stride: usize,
    bits: u32,
    rows: usize,
    cols: usize,
    out: &mut [f32],
    ld: usize,
) {
    let per_word = 32 / bits as usize;
    for i in 0..rows {
        let w = &words[i * stride..];
        for k in 0..cols {
            let shift = bits * (k % per_word) as u32;
            out[k * ld + i] = (unpack(w, k, bits) << shift) as f32;
        }
    }
}

/// `x` in the scale the fields of `unpack_rows_t` ask for: `out[k] = x[k] * 2^-(bits * (k %
/// (32 / bits)))`, so that `out[k] * field_k` is exactly `x[k] * q_k` (both factors are scaled
/// by powers of two; only a tiny |x|, below 2^-96, would turn subnormal and round). `bits`
/// divides 32.
pub fn scale_fields(x: &[f32], bits: u32, out: &mut [f32]) {
    match bits {
        2 => scale_fields_n::<16>(x, out),
        4 => scale_fields_n::<8>(x, out),
        8 => scale_fields_n::<4>(x, out),
        _ => {
            let per_word = 32 / bits as usize;
            for (k, (o, v)) in out.iter_mut().zip(x).enumerate() {
                *o = v * f32::from_bits((127 - bits * (k % per_word) as u32) << 23);
            }
        }
    }
}

/// `scale_fields` with `PER_WORD = 32 / bits` known at compile time (vectorizes).
fn scale_fields_n<const PER_WORD: usize>(x: &[f32], out: &mut [f32]) {
    let bits = (32 / PER_WORD) as u32;
    let factors: [f32; PER_WORD] =
        std::array::from_fn(|j| f32::from_bits((127 - bits * j as u32) << 23));
    for (o, v) in out.chunks_mut(PER_WORD).zip(x.chunks(PER_WORD)) {
        for ((o, v), f) in o.iter_mut().zip(v).zip(&factors) {
            *o = v * f;
        }
    }
}

/// Per-group parameters (scales or biases) of rows `0..rows` as an f32 table with one column
/// per row: `out[g * ld + i] = params[i * stride + g]` for `g < groups`.
pub fn params_t(
    params: &[bf16],
    stride: usize,
    rows: usize,
    groups: usize,
    out: &mut [f32],
    ld: usize,
) {
    for i in 0..rows {
        for g in 0..groups {
            out[g * ld + i] = params[i * stride + g].to_f32();
        }
    }
}

/// Register tiles over an unpacked panel (`unpack_rows_t`): for `i < m`, `c < ncols`,
/// `out[i * ldo + c] = sum_g fma(b[g][c], xsum[i][g], fma(s[g][c], p_g, .))` in group order,
/// starting from `out[i * ldo + c]` when `load` (else 0), where
/// `p_g = sum_{k in g} x[i][k] * q[k][c]` (fma, in k order); `x [m, ldx]`, `q [cols, ld]`,
/// scales and biases `[groups, ld]`, `xsum [m, ldxs]` (the group sums of `x`).
#[allow(clippy::too_many_arguments)]
pub fn tiles_q(
    cols: usize,
    group_size: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    q: &[f32],
    ld: usize,
    ncols: usize,
    params: super::GroupParams<'_>,
    out: &mut [f32],
    ldo: usize,
    load: bool,
) {
    let groups = cols / group_size;
    let super::GroupParams {
        scales,
        biases,
        xsum,
        ldxs,
    } = params;
    for i in 0..m {
        for c in 0..ncols {
            let mut acc = if load { out[i * ldo + c] } else { 0.0 };
            for g in 0..groups {
                let mut p = 0.0f32;
                for k in g * group_size..(g + 1) * group_size {
                    p = x[i * ldx + k].mul_add(q[k * ld + c], p);
                }
                acc = scales[g * ld + c].mul_add(p, acc);
                acc = biases[g * ld + c].mul_add(xsum[i * ldxs + g], acc);
            }
            out[i * ldo + c] = acc;
        }
    }
}

/// Per-group sums of `x` (`xsum` of `tiles_q`: the bias term is `bias_g * sum(x_g)`).
pub fn group_sums(x: &[f32], group_size: usize, out: &mut [f32]) {
    for (o, chunk) in out.iter_mut().zip(x.chunks_exact(group_size)) {
        *o = chunk.iter().sum();
    }
}

/// Independent chains of the FMA-throughput probe (`fma_probe`): enough to cover the FMA
/// latency on two FMA ports (4 cycles x 2 in flight).
pub const PROBE_CHAINS: usize = 12;
/// Step of every probe chain, `a = a * PROBE_M + PROBE_C` from 1.0: it converges to 0.1, so no
/// round count overflows or turns subnormal (which would slow the FMAs down).
pub const PROBE_M: f32 = 0.9999;
pub const PROBE_C: f32 = 1e-5;

/// The value every lane of every probe chain holds after `rounds` steps.
#[cfg(test)]
pub fn fma_chain(rounds: usize) -> f32 {
    (0..rounds).fold(1.0f32, |a, _| a.mul_add(PROBE_M, PROBE_C))
}

/// Portable probe: `PROBE_CHAINS` chains of 8 lanes (vectorized where the target has vector
/// FMA in its baseline, e.g. aarch64); returns the smallest lane (every lane holds
/// `fma_chain(rounds)`).
pub fn fma_probe(rounds: usize) -> f32 {
    let mut a = [[1.0f32; 8]; PROBE_CHAINS];
    for _ in 0..rounds {
        for lane in a.iter_mut().flatten() {
            *lane = lane.mul_add(PROBE_M, PROBE_C);
        }
    }
    a.iter().flatten().fold(f32::INFINITY, |m, &v| m.min(v))
}

/// MLX's own definition of one output of `quantized_matmul(transpose=True)` on the CPU
/// (`_qmm_t`): a sequential sum of `x_k * (scale * q_k + bias)`. Used by tests as the
/// ground-truth formula; the fast paths reorder the sum.
#[cfg(test)]
pub fn dot_row_mlx(
    x: &[f32],
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
) -> f32 {
    let g = spec.group_size;
    let mut sum = 0.0f32;
    for (k, xv) in x.iter().enumerate() {
        let w = dequant_value(
            unpack(words, k, spec.bits),
            scales[k / g].to_f32(),
            biases[k / g].to_f32(),
        );
        sum += xv * w;
    }
    sum
}

/// `ct[j*ldc + i] = (load ? ct[j*ldc + i] : 0) + sum_{k < kc} xt[k*ldx + i] * w[j*ldw + k]`
/// with one fma per term in k order, for `i < m8` and `j < nr` (the GEMM tile of the tiled
/// `x @ W^T` path; `xt` holds activations transposed).
#[allow(clippy::too_many_arguments)]
pub fn tiles(
    kc: usize,
    xt: &[f32],
    ldx: usize,
    m8: usize,
    w: &[f32],
    ldw: usize,
    nr: usize,
    ct: &mut [f32],
    ldc: usize,
    load: bool,
) {
    for j in 0..nr {
        for i in 0..m8 {
            let mut acc = if load { ct[j * ldc + i] } else { 0.0 };
            for k in 0..kc {
                acc = xt[k * ldx + i].mul_add(w[j * ldw + k], acc);
            }
            ct[j * ldc + i] = acc;
        }
    }
}

/// `p[i*ldp + c] = (load ? p[i*ldp + c] : 0) + sum_{k < kc} x[i*ldx + k] * w[k*ldw + c]` with
/// one fma per term in k order, for `i < m` and `c < ncols` (the GEMM tile of `x @ W`).
#[allow(clippy::too_many_arguments)]
pub fn tiles_n(
    kc: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    w: &[f32],
    ldw: usize,
    ncols: usize,
    p: &mut [f32],
    ldp: usize,
    load: bool,
) {
    for i in 0..m {
        for c in 0..ncols {
            let mut acc = if load { p[i * ldp + c] } else { 0.0 };
            for k in 0..kc {
                acc = x[i * ldx + k].mul_add(w[k * ldw + c], acc);
            }
            p[i * ldp + c] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn scaled_x_times_in_place_fields_is_exactly_x_times_q() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for bits in [2u32, 4, 8] {
            let (rows, cols, stride) = (3usize, 64usize, 64 * bits as usize / 32);
            let words: Vec<u32> = (0..rows * stride).map(|_| rng.gen()).collect();
            // Magnitudes from 2^-60 to 2^60: every product is exact, so equality is bitwise.
            let x: Vec<f32> = (0..cols)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-60..60)))
                .collect();
            let mut xf = vec![0.0; cols];
            scale_fields(&x, bits, &mut xf);
            let mut panel = vec![0.0; cols * rows];
            unpack_rows_t(&words, stride, bits, rows, cols, &mut panel, rows);
            for i in 0..rows {
                for k in 0..cols {
                    let want = x[k] * unpack(&words[i * stride..], k, bits) as f32;
                    let got = xf[k] * panel[k * rows + i];
                    assert_eq!(got.to_bits(), want.to_bits(), "{bits}b row {i} col {k}");
                }
            }
        }
    }
}
