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
//! - `log` is `std::log(float)`, i.e. the platform's `logf`: on the reference machine glibc's,
//!   in its FMA build. [`log`] is that algorithm ported (`dg_quant::mlx::log`, checked
//!   against glibc on all 2^32 floats), so `log`, `logsumexp` and the Gumbel noise match the
//!   Linux reference on every platform, whatever its libm.
//! - Sums (`mx.sum`, `logsumexp`, `softmax`, `cumsum`) accumulate in f32, sequentially from
//!   index 0, starting from `0.0` ([`sum`]).
//! - `max` reductions and `maximum` propagate NaN ([`maximum`]); `argmax` keeps the **first**
//!   maximal index (strict `>`), except that the first NaN wins ([`argmax`]).
//!
//! `exp`, `log`, `maximum`, `max` and `softmax` live in `dg_quant::mlx` (the decoder's
//! self-conditioning softmax is the sampler's); they are re-exported here.

pub use dg_quant::mlx::{exp, exp_shifted, log, log_in_place, max, maximum, sum_exp_shifted};

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
    logsumexp_of(m, sum_exp_shifted(xs, m))
}

/// The end of [`logsumexp`]: the row's max `m` and `s = sum(exp(x - m))` give `log(s) + m`,
/// or `m` when `m` is infinite.
pub fn logsumexp_of(m: f32, s: f32) -> f32 {
    if m.is_infinite() {
        m
    } else {
        log(s) + m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_index_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 3.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 0.5, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn logsumexp_infinite_max() {
        assert_eq!(logsumexp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
        assert_eq!(logsumexp(&[1.0, f32::INFINITY]), f32::INFINITY);
        assert_eq!(logsumexp(&[0.0]), 0.0);
    }
}
