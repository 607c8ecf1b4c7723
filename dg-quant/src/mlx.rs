//! Scalar replicas of the MLX 0.32.4 CPU kernels that a softmax over logits needs (`exp`,
//! `maximum`, `max`, `softmax`), bit for bit: the reference's x86-64 wheel has no SIMD, so each
//! is a plain left-to-right loop (see dg-engine's `mlx_math` for the rest of the story and the
//! kernels only the sampler and the RNG use). They live here so that the decoder's
//! self-conditioning (dg-core) and the sampler (dg-engine) share one softmax.

/// MLX's CPU `exp` (`simd::exp` in `mlx/backend/cpu/simd/math.h`), bit for bit.
///
/// `exp(x) = 2**i * p(f)` with `y = f32(x * 1.442695f)`, `i = floor(y + 0.5)`, `f = y - i`
/// and `p` a degree-6 polynomial evaluated with fused multiply-adds (`std::fma`). Quirks kept:
/// inputs below -88 give exactly 0, and so do inputs in (-88, -87.3) whose exponent
/// underflows (the shifted exponent field is zero, never a subnormal); above 88 gives inf.
/// The `+ 0.5` and the `floor` run in **double** (`Simd<float> + 0.5` promotes); that only
/// differs from f32 for `y = 0.5 - 2**-25`, which no f32 `x` produces, but costs nothing.
// The constants are spelled as in MLX's source; Rust rounds them to the same f32 values
// (`1.442695f32` is `LOG2_E` rounded to f32, checked in the tests).
#[allow(clippy::excessive_precision, clippy::approx_constant)]
#[inline]
pub fn exp(x_init: f32) -> f32 {
    let x = x_init * 1.442_695_f32;
    let ipart = ((x as f64) + 0.5).floor() as f32;
    let fpart = x - ipart;
    let mut p = 1.535_336_188_319_500e-4_f32;
    p = p.mul_add(fpart, 1.339_887_440_266_574e-3);
    p = p.mul_add(fpart, 9.618_437_357_674_640e-3);
    p = p.mul_add(fpart, 5.550_332_471_162_809e-2);
    p = p.mul_add(fpart, 2.402_264_791_363_012e-1);
    p = p.mul_add(fpart, 6.931_472_028_550_421e-1);
    p = p.mul_add(fpart, 1.0);
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

/// The `Softmax` primitive for f32 (`mlx/backend/cpu/softmax.cpp`; `precise` changes nothing
/// for f32 input) over one row: `e = exp(x - max)`, `out = e * (1 / sum(e))`: a multiplication
/// by the reciprocal, not a division. `out` must be as long as `xs`.
pub fn softmax(xs: &[f32], out: &mut [f32]) {
    let m = max(xs);
    let mut s = 0.0_f32;
    for (o, &x) in out.iter_mut().zip(xs) {
        let e = exp(x - m);
        *o = e;
        s += e;
    }
    let inv = 1.0 / s;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2e_spelling_is_the_f32_constant() {
        #[allow(clippy::approx_constant)]
        let spelled = 1.442_695_f32;
        assert_eq!(spelled.to_bits(), std::f32::consts::LOG2_E.to_bits());
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
}
