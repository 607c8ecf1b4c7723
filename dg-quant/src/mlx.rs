//! Scalar replicas of the MLX 0.32.4 CPU kernels that a softmax over logits needs (`exp`,
//! `maximum`, `max`, `softmax`), bit for bit: the reference's x86-64 wheel has no SIMD, so each
//! is a plain left-to-right loop (see dg-engine's `mlx_math` for the rest of the story and the
//! kernels only the sampler and the RNG use). They live here so that the decoder's
//! self-conditioning (dg-core) and the sampler (dg-engine) share one softmax.
//!
//! The exps of a row run on the best kernels ([`exp_shifted`]: eight lanes with hardware
//! fused multiply-adds where the CPU has them, the same bits as [`exp`]); the sums stay left to
//! right, as MLX's, sixteen rows side by side (one lane each where the CPU has AVX-512), and
//! blocks of rows run in parallel ([`softmax_rows`]).

use rayon::prelude::*;

use crate::kernels::{with_kernel, Kernel, Kernels, View, SUM_ROWS};

// The constants are spelled as in MLX's source; Rust rounds them to the same f32 values
// (`1.442695f32` is `LOG2_E` rounded to f32, checked in the tests).
/// `log2(e)` as MLX's `exp` spells it.
#[allow(clippy::approx_constant)]
pub(crate) const EXP_LOG2E: f32 = 1.442_695_f32;
/// The coefficients of MLX's `exp` polynomial in the fraction, highest degree first.
#[allow(clippy::excessive_precision)]
pub(crate) const EXP_POLY: [f32; 7] = [
    1.535_336_188_319_500e-4,
    1.339_887_440_266_574e-3,
    9.618_437_357_674_640e-3,
    5.550_332_471_162_809e-2,
    2.402_264_791_363_012e-1,
    6.931_472_028_550_421e-1,
    1.0,
];

/// MLX's CPU `exp` (`simd::exp` in `mlx/backend/cpu/simd/math.h`), bit for bit.
///
/// `exp(x) = 2**i * p(f)` with `y = f32(x * 1.442695f)`, `i = floor(y + 0.5)`, `f = y - i`
/// and `p` a degree-6 polynomial evaluated with fused multiply-adds (`std::fma`). Quirks kept:
/// inputs below -88 give exactly 0, and so do inputs in (-88, -87.3) whose exponent
/// underflows (the shifted exponent field is zero, never a subnormal); above 88 gives inf.
/// The `+ 0.5` and the `floor` run in **double** (`Simd<float> + 0.5` promotes); that only
/// differs from f32 for `y = 0.5 - 2**-25`, which no f32 `x` produces, but costs nothing.
#[inline]
pub fn exp(x_init: f32) -> f32 {
    let x = x_init * EXP_LOG2E;
    let ipart = ((x as f64) + 0.5).floor() as f32;
    let fpart = x - ipart;
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(fpart, c);
    }
    // C++ converts with `cvttss2si` (out of range gives i32::MIN); only |x| <= 88 reaches the
    // result, where `as` agrees, so the saturating `as` is fine.
    let epart = (ipart as i32).wrapping_add(127).wrapping_shl(23);
    let mut result = f32::from_bits(epart as u32) * p;
    if x_init.is_nan() {
        result = x_init;
    }
    if x_init > 88.0 {
        result = f32::INFINITY;
    }
    if x_init < -88.0 {
        result = 0.0;
    }
    result
}

/// `[1 / c, ln c]` for the 16 subintervals of glibc's `logf` (`__logf_data.tab`).
pub(crate) const LOGF_TABLE: [[f64; 2]; 16] = [
    [hexf(0x3FF6_61EC_79F8_F3BE), hexf(0xBFD5_7BF7_808C_AADE)],
    [hexf(0x3FF5_71ED_4AAF_883D), hexf(0xBFD2_BEF0_A7C0_6DDB)],
    [hexf(0x3FF4_9539_F0F0_10B0), hexf(0xBFD0_1EAE_7F51_3A67)],
    [hexf(0x3FF3_C995_B0B8_0385), hexf(0xBFCB_31D8_A682_24E9)],
    [hexf(0x3FF3_0D19_0C88_64A5), hexf(0xBFC6_574F_0AC0_7758)],
    [hexf(0x3FF2_5E22_7B0B_8EA0), hexf(0xBFC1_AA2B_C79C_8100)],
    [hexf(0x3FF1_BB4A_4A1A_343F), hexf(0xBFBA_4E76_CE8C_0E5E)],
    [hexf(0x3FF1_2358_F08A_E5BA), hexf(0xBFB1_973C_5A61_1CCC)],
    [hexf(0x3FF0_953F_4199_00A7), hexf(0xBFA2_52F4_38E1_0C1E)],
    [hexf(0x3FF0_0000_0000_0000), 0.0],
    [hexf(0x3FEE_608C_FD9A_47AC), hexf(0x3FAA_A5AA_5DF2_5984)],
    [hexf(0x3FEC_A4B3_1F02_6AA0), hexf(0x3FBC_5E53_AA36_2EB4)],
    [hexf(0x3FEB_2036_576A_FCE6), hexf(0x3FC5_26E5_7720_DB08)],
    [hexf(0x3FE9_C2D1_63A1_AA2D), hexf(0x3FCB_C286_0D22_4770)],
    [hexf(0x3FE8_86E6_0378_41ED), hexf(0x3FD1_058B_C8A0_7EE1)],
    [hexf(0x3FE7_67DC_F553_4862), hexf(0x3FD4_0430_57B6_EE09)],
];
/// `ln 2` and the polynomial `A[0..3]` of glibc's `logf` (`log1p(r) ~ r + A[2] r^2 + ...`).
pub(crate) const LOGF_LN2: f64 = hexf(0x3FE6_2E42_FEFA_39EF);
pub(crate) const LOGF_POLY: [f64; 3] = [
    hexf(0xBFD0_0EA3_48B8_8334),
    hexf(0x3FD5_575B_0BE0_0B6A),
    hexf(0xBFDF_FFFE_F20A_4123),
];

const fn hexf(bits: u64) -> f64 {
    f64::from_bits(bits)
}

/// MLX's CPU `log`: `std::log(float)`, which on the reference machine (Linux x86-64, glibc
/// 2.36) is glibc's `logf` in its FMA build (`__logf_fma`), bit for bit on every input, so
/// that the Gumbel noise and the log-sum-exps do not depend on this machine's libm.
///
/// `x = 2^k z` with `z` near 1 in one of 16 subintervals around `c`; then, in double,
/// `log x = log1p(z / c - 1) + log c + k ln 2` with a degree-4 polynomial, each step one
/// fused multiply-add as in the FMA build, rounded once to f32 at the end.
#[inline]
pub fn log(x: f32) -> f32 {
    let mut ix = x.to_bits();
    if ix == 0x3F80_0000 {
        return 0.0;
    }
    if ix.wrapping_sub(0x0080_0000) >= 0x7F80_0000 - 0x0080_0000 {
        // Zero, subnormal, negative, infinite or NaN.
        if ix << 1 == 0 {
            return f32::NEG_INFINITY;
        }
        if ix == 0x7F80_0000 {
            return x;
        }
        if ix & 0x8000_0000 != 0 || ix << 1 >= 0xFF00_0000 {
            // glibc's `(x - x) / (x - x)`: the NaN of a NaN `x`, the x86 default NaN (sign
            // bit set) of a negative one.
            #[allow(clippy::eq_op)]
            return (x - x) / (x - x);
        }
        // A subnormal: normalized exactly, its exponent taken back below.
        ix = (x * 8_388_608.0).to_bits().wrapping_sub(23 << 23);
    }
    log_normal(ix)
}

/// [`log`] of the positive normal float `ix` (bits).
#[inline]
fn log_normal(ix: u32) -> f32 {
    let tmp = ix.wrapping_sub(0x3F33_0000);
    let [invc, logc] = LOGF_TABLE[((tmp >> 19) & 15) as usize];
    let k = (tmp as i32) >> 23;
    let z = f32::from_bits(ix.wrapping_sub(tmp & 0xFF80_0000)) as f64;
    let r = z.mul_add(invc, -1.0);
    let y0 = (k as f64).mul_add(LOGF_LN2, logc);
    let r2 = r * r;
    let y = LOGF_POLY[1].mul_add(r, LOGF_POLY[2]);
    let y = r2.mul_add(LOGF_POLY[0], y);
    r2.mul_add(y, r + y0) as f32
}

/// `xs[i] = log(xs[i])` on the best kernels (the same bits as [`log`] on every kernel).
pub fn log_in_place(xs: &mut [f32]) {
    with_kernel!(Kernels::best(), k => k.log_in_place(xs));
}

/// `simd::maximum(a, b)`: `a` if `a` is NaN, else `a > b ? a : b` (so a NaN `b` also wins).
#[inline]
pub fn maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// `mx.max` over a contiguous row: starts at `-inf`, folds `maximum(x, acc)` left to right.
pub fn max(xs: &[f32]) -> f32 {
    xs.iter().fold(f32::NEG_INFINITY, |acc, &x| maximum(x, acc))
}

/// `out[i] = exp(xs[i] - shift)` for `i < min(xs.len(), out.len())`, on the best kernels
/// (the same bits as [`exp`] on every kernel).
pub fn exp_shifted(xs: &[f32], shift: f32, out: &mut [f32]) {
    let n = xs.len().min(out.len());
    let (xs, out) = (&xs[..n], &mut out[..n]);
    with_kernel!(Kernels::best(), k => k.exp_shifted(xs, shift, out));
}

/// `0 + exp(xs[0] - shift) + exp(xs[1] - shift) + ...` in f32, left to right (MLX's reduction
/// order), without a buffer as long as `xs`.
pub fn sum_exp_shifted(xs: &[f32], shift: f32) -> f32 {
    let mut buf = [0.0_f32; 1024];
    let mut s = 0.0_f32;
    for chunk in xs.chunks(buf.len()) {
        let e = &mut buf[..chunk.len()];
        exp_shifted(chunk, shift, e);
        s = e.iter().fold(s, |acc, &v| acc + v);
    }
    s
}

/// The `Softmax` primitive for f32 (`mlx/backend/cpu/softmax.cpp`; `precise` changes nothing
/// for f32 input) over one row: `e = exp(x - max)`, `out = e * (1 / sum(e))` with the sum left
/// to right: a multiplication by the reciprocal, not a division. `out` must be as long as
/// `xs` (only the common length is written).
pub fn softmax(xs: &[f32], out: &mut [f32]) {
    let n = xs.len().min(out.len());
    let (xs, out) = (&xs[..n], &mut out[..n]);
    exp_shifted(xs, softmax_shift(xs), out);
    let s = out.iter().fold(0.0_f32, |acc, &e| acc + e);
    let inv = 1.0 / s;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Rows whose sums run side by side ([`add_rows_in_order`]): each row's sum stays left to
/// right (MLX's order, the same bits), one lane per row.
const INTERLEAVED_ROWS: usize = SUM_ROWS;

/// Rows per block when they stream from memory: sixteen rows' streams at once measured 20%
/// slower.
const STREAMED_ROWS: usize = 8;

/// Columns per chunk of a block's exps: a block's chunk (16 KB) stays in L1 from its exps to
/// their sums.
const EXP_COLUMNS: usize = 256;

/// Continues each row's left-to-right sum (`sums[r]`) over the `rows x cols` block of `xs`
/// whose rows are `ld` apart, on the best kernels (at most [`INTERLEAVED_ROWS`] rows).
fn add_rows_in_order(
    xs: &[f32],
    (rows, cols, ld): (usize, usize, usize),
    sums: &mut [f32; SUM_ROWS],
) {
    let view = View::new(xs, rows, cols, ld);
    with_kernel!(Kernels::best(), k => k.add_rows_in_order(view, sums));
}

/// [`max`] of a row as a softmax's shift, compared in any order on the best kernels
/// ([`Kernel::max_unordered`]) instead of one serial fold. Without NaNs the maximum does not
/// depend on the order, except which of `+0` and `-0` wins, and `exp(x - 0)` and `exp(x + 0)`
/// agree for every `x` (both zeros give `exp(±0) = 1`): the same exps, the same bits. A row
/// with a NaN takes the serial fold.
fn softmax_shift(row: &[f32]) -> f32 {
    with_kernel!(Kernels::best(), k => k.max_unordered(row)).unwrap_or_else(|| max(row))
}

/// [`softmax`] of the whole rows in `block` (at most [`INTERLEAVED_ROWS`]) into `out`, or in
/// place when `xs` is `None`.
fn softmax_block(xs: Option<&[f32]>, out: &mut [f32], width: usize) {
    let rows = out.len() / width;
    let mut maxes = [0.0f32; INTERLEAVED_ROWS];
    for (m, row) in maxes.iter_mut().zip(xs.unwrap_or(out).chunks_exact(width)) {
        *m = softmax_shift(row);
    }
    let mut sums = [0.0f32; SUM_ROWS];
    match xs {
        // Rows streamed from memory (the logits, at most `STREAMED_ROWS`): whole rows, which
        // the prefetchers follow (chunks of sixteen rows a few KB each measured twice as slow).
        Some(xs) => {
            for (row, (x, &shift)) in out
                .chunks_exact_mut(width)
                .zip(xs.chunks_exact(width).zip(&maxes))
            {
                exp_shifted(x, shift, row);
            }
            add_rows_in_order(out, (rows, width, width), &mut sums);
        }
        // Rows in the cache (a block of attention scores): a chunk of columns at a time, whose
        // exps stay in L1 for their sums.
        None => {
            for c in (0..width).step_by(EXP_COLUMNS) {
                let len = EXP_COLUMNS.min(width - c);
                for (r, &shift) in maxes.iter().enumerate().take(rows) {
                    let row = &mut out[r * width + c..r * width + c + len];
                    with_kernel!(Kernels::best(), k => k.exp_shifted_in_place(row, shift));
                }
                add_rows_in_order(&out[c..], (rows, len, width), &mut sums);
            }
        }
    }
    for (row, &s) in out.chunks_exact_mut(width).zip(&sums) {
        with_kernel!(Kernels::best(), k => k.scale(1.0 / s, row));
    }
}

/// [`softmax`] of every `width`-long row of `xs` into the same row of `out`, blocks of rows in
/// parallel on the current thread pool (each row as alone, the same bits). Only whole rows of
/// the common length are written; nothing when `width` is 0.
pub fn softmax_rows(xs: &[f32], width: usize, out: &mut [f32]) {
    if width == 0 {
        return;
    }
    let n = xs.len().min(out.len()) / width * width;
    let block = width * STREAMED_ROWS;
    xs[..n]
        .par_chunks(block)
        .zip(out[..n].par_chunks_mut(block))
        .for_each(|(x, o)| softmax_block(Some(x), o, width));
}

/// Per `width`-long row of `xs` (whole rows only; none when `width` is 0): `(m, s)`, `m` the
/// row's [`max`] and `s = 0 + exp(x0 - m) + exp(x1 - m) + ...` left to right, the two halves
/// of the `LogSumExp` primitive. Blocks of rows go in parallel on the current thread pool, and
/// a block's sums run side by side (each row's fold as alone: the same bits as
/// [`sum_exp_shifted`]); the max is the softmax's shift, which exponentiates to the same
/// values.
pub fn max_sum_exp_rows(xs: &[f32], width: usize) -> Vec<(f32, f32)> {
    if width == 0 {
        return Vec::new();
    }
    let n = xs.len() / width * width;
    xs[..n]
        .par_chunks(width * INTERLEAVED_ROWS)
        .flat_map_iter(|block| {
            let rows = block.len() / width;
            let mut maxes = [0.0f32; INTERLEAVED_ROWS];
            for (m, row) in maxes.iter_mut().zip(block.chunks_exact(width)) {
                *m = softmax_shift(row);
            }
            let mut sums = [0.0f32; SUM_ROWS];
            let mut exps = [0.0f32; INTERLEAVED_ROWS * EXP_COLUMNS];
            for c in (0..width).step_by(EXP_COLUMNS) {
                let len = EXP_COLUMNS.min(width - c);
                for (r, e) in exps.chunks_exact_mut(EXP_COLUMNS).enumerate().take(rows) {
                    let x = &block[r * width + c..r * width + c + len];
                    exp_shifted(x, maxes[r], &mut e[..len]);
                }
                add_rows_in_order(&exps, (rows, len, EXP_COLUMNS), &mut sums);
            }
            (0..rows).map(move |r| (maxes[r], sums[r]))
        })
        .collect()
}

/// [`softmax`] of every `width`-long row of `rows` in place, on this thread, the same bits
/// (the attention probabilities: MLX's CPU `scaled_dot_product_attention` softmaxes its scores
/// with this primitive). A row of `-inf` gives NaN, as in MLX. Only whole rows are written;
/// nothing when `width` is 0.
pub fn softmax_rows_inplace(rows: &mut [f32], width: usize) {
    if width == 0 {
        return;
    }
    let n = rows.len() / width * width;
    for block in rows[..n].chunks_mut(width * INTERLEAVED_ROWS) {
        softmax_block(None, block, width);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `f32::ln` is the reference's `logf`: glibc's FMA build (x86-64 Linux with FMA).
    fn libm_is_glibc_fma() -> bool {
        #[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
        return std::arch::is_x86_feature_detected!("fma");
        #[allow(unreachable_code)]
        false
    }

    /// `log` against this machine's `logf` on every 251st float and around 1.0, where glibc
    /// runs it; `every_kernel_logs_as_the_scalar_one` ties the kernels to `log`.
    #[test]
    fn log_is_glibcs_logf() {
        if !libm_is_glibc_fma() {
            eprintln!("skipped: the platform logf is not glibc's FMA build");
            return;
        }
        let near_one = (0x3F70_0000u32..0x3F88_0000).step_by(7);
        for b in (0..=u32::MAX).step_by(251).chain(near_one) {
            let x = f32::from_bits(b);
            assert_eq!(log(x).to_bits(), x.ln().to_bits(), "x = {x:e} ({b:#x})");
        }
    }

    /// [`log_in_place`] on all 2^32 floats against this machine's `logf` (glibc's FMA build;
    /// about a minute in release: `cargo test --release -p dg-quant -- --ignored
    /// log_agrees`).
    #[test]
    #[ignore]
    fn log_agrees_with_glibc_on_every_f32() {
        if !libm_is_glibc_fma() {
            eprintln!("skipped: the platform logf is not glibc's FMA build");
            return;
        }
        (0..1u64 << 12).into_par_iter().for_each(|chunk| {
            let start = (chunk << 20) as u32;
            let xs: Vec<f32> = (0..1u32 << 20).map(|i| f32::from_bits(start + i)).collect();
            let mut got = xs.clone();
            log_in_place(&mut got);
            for (x, g) in xs.iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    x.ln().to_bits(),
                    "x = {x:e} ({:#x})",
                    x.to_bits()
                );
            }
        });
    }

    #[test]
    fn softmax_rows_are_each_rows_softmax() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for width in [1usize, 7, 1023, 1025, 3000] {
            for rows in [1usize, 3, 8, 9, 17] {
                let xs: Vec<f32> = (0..rows * width)
                    .map(|i| ((i * 2_654_435_761) % 1000) as f32 * 0.037 - 20.0)
                    .collect();
                let mut want = vec![0.0; xs.len()];
                for (x, o) in xs.chunks_exact(width).zip(want.chunks_exact_mut(width)) {
                    softmax(x, o);
                }
                let mut got = vec![0.0; xs.len()];
                softmax_rows(&xs, width, &mut got);
                assert_eq!(bits(&got), bits(&want), "rows {rows}, width {width}");
                let mut got = xs.clone();
                softmax_rows_inplace(&mut got, width);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "in place: rows {rows}, width {width}"
                );
            }
        }
    }

    #[test]
    fn log2e_spelling_is_the_f32_constant() {
        assert_eq!(EXP_LOG2E.to_bits(), std::f32::consts::LOG2_E.to_bits());
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp(0.0).to_bits(), 1.0_f32.to_bits());
        assert_eq!(exp(-88.5), 0.0);
        assert_eq!(
            exp(-87.9),
            0.0,
            "exponent field underflows to zero, not a subnormal"
        );
        assert_eq!(exp(88.5), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn exp_close_to_libm() {
        // A sanity bound only; bit-exactness against MLX is checked by the golden tests. The
        // error grows with |x|: `x * 1.442695f` is rounded to f32 before the split.
        let mut x = -87.0_f32;
        while x < 88.0 {
            let ours = exp(x) as f64;
            let exact = (x as f64).exp();
            let bound = 2e-7 * (1.0 + x.abs() as f64);
            assert!(
                ((ours - exact) / exact).abs() < bound,
                "x = {x}: {ours} vs {exact}"
            );
            x += 0.173;
        }
    }

    #[test]
    fn maximum_propagates_nan() {
        assert!(max(&[1.0, f32::NAN, 3.0]).is_nan());
        assert!(max(&[f32::NAN, 1.0]).is_nan());
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn sum_exp_shifted_folds_left_to_right() {
        let xs: Vec<f32> = (0..3000)
            .map(|i| ((i * 37) % 101) as f32 * 0.37 - 20.0)
            .collect();
        let want = xs.iter().fold(0.0f32, |acc, &x| acc + exp(x - 1.5));
        assert_eq!(sum_exp_shifted(&xs, 1.5).to_bits(), want.to_bits());
        assert_eq!(sum_exp_shifted(&[], 1.5), 0.0);
    }

    #[test]
    fn max_sum_exp_rows_are_each_row_alone() {
        // 11 rows (a block of 8 and one of 3), 1031 wide (two whole column chunks and a
        // tail); a NaN row, a -inf row and a row with +inf among ordinary ones.
        let (rows, width) = (11, 1031);
        let mut xs: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 37) % 101) as f32 * 0.37 - 20.0)
            .collect();
        xs[2 * width + 500] = f32::NAN;
        xs[4 * width..5 * width].fill(f32::NEG_INFINITY);
        xs[9 * width + 7] = f32::INFINITY;
        let got = max_sum_exp_rows(&xs, width);
        assert_eq!(got.len(), rows);
        for (r, (row, &(m, s))) in xs.chunks_exact(width).zip(&got).enumerate() {
            let want_m = max(row);
            let want_s = sum_exp_shifted(row, want_m);
            assert_eq!(m.to_bits(), want_m.to_bits(), "max of row {r}");
            assert_eq!(s.to_bits(), want_s.to_bits(), "sum of row {r}");
        }
        assert!(max_sum_exp_rows(&xs, 0).is_empty());
    }

    #[test]
    fn softmax_rows_are_each_row_alone() {
        let (rows, width) = (5, 1031);
        let xs: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.03 - 15.0)
            .collect();
        let mut got = vec![0.0; rows * width];
        softmax_rows(&xs, width, &mut got);
        for (row, g) in xs.chunks(width).zip(got.chunks(width)) {
            let mut want = vec![0.0; width];
            softmax(row, &mut want);
            assert_eq!(g, &want[..]);
        }
        softmax_rows(&xs, 0, &mut got);
    }

    #[test]
    fn softmax_multiplies_by_the_reciprocal() {
        let xs = [1.0f32, 2.0, 3.0, -1.0];
        let mut out = [0.0f32; 4];
        softmax(&xs, &mut out);
        let e: Vec<f32> = xs.iter().map(|&x| exp(x - 3.0)).collect();
        let inv = 1.0 / e.iter().fold(0.0f32, |a, &v| a + v);
        for (o, e) in out.iter().zip(&e) {
            assert_eq!(o.to_bits(), (e * inv).to_bits());
        }
    }

    #[test]
    fn softmax_matches_the_serial_max_fold() {
        // MLX's order: the serial `max`, the exps, the left-to-right sum, the reciprocal.
        let serial = |xs: &[f32]| -> Vec<u32> {
            let e: Vec<f32> = xs.iter().map(|&x| exp(x - max(xs))).collect();
            let inv = 1.0 / e.iter().fold(0.0f32, |a, &v| a + v);
            e.iter().map(|v| (v * inv).to_bits()).collect()
        };
        let specials = [
            0.0f32,
            -0.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -3.5,
        ];
        for width in [1usize, 5, 16, 17, 40, 1000] {
            for (s, &special) in specials.iter().enumerate() {
                for at in [0, width / 2, width - 1] {
                    let mut xs: Vec<f32> = (0..width)
                        .map(|i| ((i * 7919 + s) % 97) as f32 * -0.25)
                        .collect();
                    xs[at] = special;
                    // Every other entry of the last row zero of either sign: the max is a zero.
                    let zeros: Vec<f32> = (0..width)
                        .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 } - (i % 3) as f32)
                        .collect();
                    for row in [xs, zeros] {
                        let mut got = vec![0.0; width];
                        softmax(&row, &mut got);
                        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(
                            got,
                            serial(&row),
                            "width {width}, special {special} at {at}"
                        );
                        let mut rows = [row.clone(), row.clone()].concat();
                        softmax_rows_inplace(&mut rows, width);
                        let rows: Vec<u32> = rows[width..].iter().map(|v| v.to_bits()).collect();
                        assert_eq!(rows, serial(&row), "in place, width {width}");
                    }
                }
            }
        }
    }
}
