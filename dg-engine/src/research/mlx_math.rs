//! Scalar replicas of the MLX 0.32.4 CPU kernels that the sampler and the RNG depend on.
//!
//! The reference runs the Linux x86-64 wheel of mlx-cpu. That build has no SIMD on x86
//! (`simd::max_size<T> == 1` in `mlx/backend/cpu/simd/base_simd.h`; the library contains no
//! AVX or FMA instructions), so every kernel below is a plain left-to-right loop, and
//! replicating that loop order reproduces MLX bit for bit:
//!
//! - `exp` is **not** libm's `expf`: `mlx/backend/cpu/simd/math.h` evaluates a Cephes
//!   polynomial for `2**fract` and builds `2**int` by bit shifting ([`exp`]). It is used by the
//!   `Exp` primitive, `logsumexp` and `softmax` (compiled graphs inline the same function; the
//!   JIT compiles them without `-mfma` on this wheel, so nothing is contracted into FMAs).
//!   Results differ from a correctly rounded `expf` by a few ulp and flush to exactly 0 below
//!   -87.3.
//! - `log` is `std::log(float)`, i.e. the platform's `logf` (glibc on the reference machine);
//!   [`log`] calls the same function through `f32::ln`. Portability caveat: on a platform
//!   whose libm `logf` rounds differently (macOS, musl, Windows), `log`, `logsumexp` and
//!   Gumbel noise may differ from the Linux reference in the last bit on rare inputs.
//! - Sums (`mx.sum`, `logsumexp`, `softmax`, `cumsum`) accumulate in f32, sequentially from
//!   index 0, starting from `0.0` ([`sum`]).
//! - `max` reductions and `maximum` propagate NaN ([`maximum`]); `argmax` keeps the **first**
//!   maximal index (strict `>`), except that the first NaN wins ([`argmax`]).

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

/// MLX's CPU `log`: `std::log(float)`, the platform `logf`.
#[inline]
pub fn log(x: f32) -> f32 {
    x.ln()
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

/// `mx.sum` over a contiguous row in f32: `0.0 + x0 + x1 + ...`, left to right.
pub fn sum(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0_f32, |acc, &x| acc + x)
}

/// `mx.argmax` over a contiguous row as mlx 0.32.4 computes it: the first NaN if there is one
/// (NumPy's rule), else the first index of the maximum. An empty row gives 0.
///
/// (Older MLX sources compare with a plain `>` and never pick a NaN after index 0; the
/// installed 0.32.4 picks the first NaN, which the goldens pin down.)
pub fn argmax(xs: &[f32]) -> usize {
    let Some(&first) = xs.first() else {
        return 0;
    };
    let mut best = first;
    let mut index = 0;
    if best.is_nan() {
        return 0;
    }
    for (j, &x) in xs.iter().enumerate() {
        if x.is_nan() {
            return j;
        }
        if x > best {
            best = x;
            index = j;
        }
    }
    index
}

/// The `LogSumExp` primitive (`mlx/backend/cpu/logsumexp.cpp`) over one row:
/// `m = max(x)`, `s = 0 + exp(x0 - m) + ...`, result `log(s) + m`, or `m` when `m` is infinite.
pub fn logsumexp(xs: &[f32]) -> f32 {
    let m = max(xs);
    let s = xs.iter().fold(0.0_f32, |acc, &x| acc + exp(x - m));
    if m.is_infinite() {
        m
    } else {
        log(s) + m
    }
}

/// The `Softmax` primitive for f32 (`mlx/backend/cpu/softmax.cpp`; `precise` changes nothing
/// for f32 input) over one row: `e = exp(x - max)`, `out = e * (1 / sum(e))`: a multiplication
/// by the reciprocal, not a division. `out` must be as long as `xs`.
pub(crate) fn softmax(xs: &[f32], out: &mut [f32]) {
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
    fn argmax_first_index_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 3.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 0.5, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn maximum_propagates_nan() {
        assert!(max(&[1.0, f32::NAN, 3.0]).is_nan());
        assert!(max(&[f32::NAN, 1.0]).is_nan());
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn logsumexp_infinite_max() {
        assert_eq!(logsumexp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
        assert_eq!(logsumexp(&[1.0, f32::INFINITY]), f32::INFINITY);
        assert_eq!(logsumexp(&[0.0]), 0.0);
    }
}
