//! AVX2 + FMA kernels (x86-64): dequantization of 2-, 4- and 8-bit rows, the register tiles
//! of the dequantized-tile strategies, `axpy`, and MLX's exp. [`Avx2Fma`] exists only where the CPU has
//! both features, so its methods call the `#[target_feature]` bodies safely. Twins on
//! `Scalar`; the tests in `kernels/mod.rs` compare them bit for bit.

use std::arch::x86_64::*;

use half::bf16;

use super::{check_product, register_tile, Kernel, Scalar, Tile, View, ViewMut, SUM_ROWS};
use crate::format::QRow;

/// The AVX2 + FMA kernels: a value exists only on a CPU with both features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx2Fma(());

impl Avx2Fma {
    /// The kernels, where this CPU has AVX2 and FMA.
    pub fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Avx2Fma(()))
    }
}

/// Whether this CPU is AMD's (`cpuid` vendor "AuthenticAMD"), asked once: its caches favour
/// other blockings than Intel's (`matmul/unpacked.rs`).
pub fn is_amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        // SAFETY: every x86-64 CPU has `cpuid` and its leaf 0 (the vendor string). The
        // intrinsic is safe in newer Rust, unsafe in the MSRV's.
        #[allow(unused_unsafe)]
        let id = unsafe { __cpuid(0) };
        let word = |s: &[u8; 4]| u32::from_le_bytes(*s);
        (id.ebx, id.edx, id.ecx) == (word(b"Auth"), word(b"enti"), word(b"cAMD"))
    })
}

/// Asks the cache hierarchy to start loading `data` (one prefetch per 64-byte line); a hint
/// with no effect on results.
pub fn prefetch<T>(data: &[T]) {
    let bytes = std::mem::size_of_val(data);
    let p = data.as_ptr() as *const i8;
    for off in (0..bytes).step_by(64) {
        // SAFETY: `off < bytes`, so the address lies inside `data`; a prefetch never faults and
        // changes no architectural state (SSE is part of the x86-64 baseline).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
    }
}

/// Rows of `lhs` per register tile: 2 x 6 accumulators + 2 vectors + 1 broadcast = 15 of the
/// 16 ymm registers (a 3 x 4 tile spills).
const TILE_ROWS: usize = 6;

impl Kernel for Avx2Fma {
    fn dequant_row(self, row: QRow<'_>, out: &mut [f32]) {
        let (bits, group_size) = (row.spec.bits, row.spec.group_size);
        if !matches!(bits, 2 | 4 | 8) {
            return Scalar.dequant_row(row, out);
        }
        let QRow {
            words,
            scales,
            biases,
            ..
        } = row;
        let groups = out.len() / group_size;
        assert!(
            out.len().is_multiple_of(group_size)
                && words.len() * 32 >= out.len() * bits as usize
                && scales.len() >= groups
                && biases.len() >= groups,
            "dequant_row: short operand"
        );
        // SAFETY: `self` exists only where AVX2 and FMA were detected; the body reads
        // `out.len() * bits / 32` words and `groups` scales and biases (checked) and writes
        // `out.len()` floats.
        unsafe { dequant_row_avx2(words, scales, biases, bits, group_size, out) }
    }

    fn tiles(self, lhs: View<'_>, rhs: View<'_>, mut out: ViewMut<'_>, load: bool) {
        check_product(&lhs, &rhs, &out, 8);
        if !out.start(lhs.cols(), load) {
            return;
        }
        let (rows, vectors) = (out.rows(), out.cols() / 8);
        for j in (0..rows).step_by(TILE_ROWS) {
            let n = (rows - j).min(TILE_ROWS);
            for v in (0..vectors).step_by(2) {
                let mv = (vectors - v).min(2);
                let t = Tile::at(&lhs, &rhs, &mut out, (j, 8 * v), load);
                macro_rules! tile {
                    ($($mv:literal, $nr:literal);*) => {
                        match (mv, n) {
                            $(($mv, $nr) => tile::<$mv, $nr>(t),)*
                            _ => unreachable!("tile shape ({mv}, {n})"),
                        }
                    };
                }
                // SAFETY: AVX2/FMA present (`self`); the tile covers rows j..j+n <= rows and
                // columns 8v..8(v+mv) <= cols of views checked to fit their slices, and
                // k < lhs.cols() = rhs.rows() (`check_product`).
                unsafe {
                    tile!(1, 1; 1, 2; 1, 3; 1, 4; 1, 5; 1, 6; 2, 1; 2, 2; 2, 3; 2, 4; 2, 5; 2, 6)
                };
            }
        }
    }

    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: lengths differ");
        let n = x.len() / 8 * 8;
        // SAFETY: AVX2/FMA present (`self`); the body touches x[..n] and y[..n], inside both.
        unsafe { axpy_avx2(a, x.as_ptr(), y.as_mut_ptr(), n) };
        for (y, x) in y[n..].iter_mut().zip(&x[n..]) {
            *y = a.mul_add(*x, *y);
        }
    }

    fn exp_shifted(self, xs: &[f32], shift: f32, out: &mut [f32]) {
        assert_eq!(xs.len(), out.len(), "exp_shifted: lengths differ");
        let n = xs.len() / 8 * 8;
        // SAFETY: AVX2/FMA present (`self`); the body reads xs[..n] and writes out[..n].
        unsafe { exp_shifted_avx2(xs.as_ptr(), shift, out.as_mut_ptr(), n) };
        for (o, &x) in out[n..].iter_mut().zip(&xs[n..]) {
            *o = crate::mlx::exp(x - shift);
        }
    }

    fn exp_shifted_in_place(self, xs: &mut [f32], shift: f32) {
        let n = xs.len() / 8 * 8;
        // SAFETY: AVX2/FMA present (`self`); the body reads and writes xs[..n], each vector
        // loaded before it is stored.
        unsafe { exp_shifted_avx2(xs.as_ptr(), shift, xs.as_mut_ptr(), n) };
        Scalar.exp_shifted_in_place(&mut xs[n..], shift);
    }

    fn max_unordered(self, xs: &[f32]) -> Option<f32> {
        Scalar.max_unordered(xs)
    }

    fn scale(self, a: f32, xs: &mut [f32]) {
        Scalar.scale(a, xs)
    }

    fn add_rows_in_order(self, rows: View<'_>, sums: &mut [f32; SUM_ROWS]) {
        Scalar.add_rows_in_order(rows, sums)
    }

    fn log_in_place(self, xs: &mut [f32]) {
        let n = xs.len() / 8 * 8;
        // SAFETY: AVX2/FMA present (`self`); the body reads and writes xs[..n].
        unsafe { log_avx2(xs.as_mut_ptr(), n) };
        Scalar.log_in_place(&mut xs[n..]);
    }

    fn geglu(self, gate: &mut [f32], up: &[f32]) {
        // SAFETY: AVX2/FMA present (`self`); the loop is safe code.
        unsafe { geglu_avx2(gate, up) }
    }

    fn soft_cap(self, xs: &mut [f32], cap: f32) {
        // SAFETY: AVX2/FMA present (`self`); the loop is safe code.
        unsafe { soft_cap_avx2(xs, cap) }
    }
}

register_tile!(
    tile,
    "avx2,fma",
    8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);

/// `w = f32(f32(scale * q) + bias)` for one row of 2-, 4- or 8-bit fields, bit-identical to
/// `Scalar::dequant_row`.
///
/// # Safety
/// AVX2/FMA available; `words` holds `out.len() * bits / 32` words, `scales` and `biases`
/// `out.len() / group_size` values, `group_size` a multiple of 32.
#[target_feature(enable = "avx2,fma")]
unsafe fn dequant_row_avx2(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    bits: u32,
    group_size: usize,
    out: &mut [f32],
) {
    let wp = words.as_ptr();
    let op = out.as_mut_ptr();
    let wpg = group_size * bits as usize / 32;
    for gi in 0..out.len() / group_size {
        let s = _mm256_set1_ps(scales[gi].to_f32());
        let b = _mm256_set1_ps(biases[gi].to_f32());
        // SAFETY: group gi covers words [gi*wpg, (gi+1)*wpg) and outputs
        // [gi*group_size, (gi+1)*group_size), inside the lengths of the contract.
        unsafe {
            let gw = wp.add(gi * wpg);
            let go = op.add(gi * group_size);
            match bits {
                4 => {
                    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
                    let mask = _mm256_set1_epi32(0xF);
                    for j in 0..wpg {
                        let v = _mm256_set1_epi32(*gw.add(j) as i32);
                        let q = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), mask);
                        let w = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), b);
                        _mm256_storeu_ps(go.add(8 * j), w);
                    }
                }
                8 => {
                    for j in 0..wpg / 2 {
                        let bytes = _mm_loadl_epi64(gw.add(2 * j) as *const __m128i);
                        let q = _mm256_cvtepu8_epi32(bytes);
                        let w = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), b);
                        _mm256_storeu_ps(go.add(8 * j), w);
                    }
                }
                _ => {
                    let lo_shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
                    let hi_shifts = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
                    let mask = _mm256_set1_epi32(0x3);
                    for j in 0..wpg {
                        let v = _mm256_set1_epi32(*gw.add(j) as i32);
                        for (half, shifts) in [lo_shifts, hi_shifts].into_iter().enumerate() {
                            let q = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), mask);
                            let w = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), b);
                            _mm256_storeu_ps(go.add(16 * j + 8 * half), w);
                        }
                    }
                }
            }
        }
    }
}

/// # Safety
/// AVX2/FMA available; `x` valid for reads and `y` for reads/writes of `n` (a multiple of 8)
/// elements.
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(a: f32, x: *const f32, y: *mut f32, n: usize) {
    let av = _mm256_set1_ps(a);
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n, inside both buffers (caller's contract).
        unsafe {
            let v = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(y.add(i)));
            _mm256_storeu_ps(y.add(i), v);
        }
    }
}

/// `out[i] = mlx::exp(xs[i] - shift)`, eight at a time, the scalar `mlx::exp` step for step:
/// the split `floor(f64(y) + 0.5)` in double, the degree-6 polynomial in fused multiply-adds,
/// the exponent built in the integer lanes, then NaN, overflow and underflow as its branches.
///
/// # Safety
/// AVX2/FMA available; `xs` valid for reads and `out` for writes of `n` (a multiple of 8)
/// elements.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(xs: *const f32, shift: f32, out: *mut f32, n: usize) {
    let shift = _mm256_set1_ps(shift);
    let log2e = _mm256_set1_ps(crate::mlx::EXP_LOG2E);
    let half = _mm256_set1_pd(0.5);
    let c = crate::mlx::EXP_POLY.map(|v| _mm256_set1_ps(v));
    let bias = _mm256_set1_epi32(127);
    let (hi_limit, lo_limit) = (_mm256_set1_ps(88.0), _mm256_set1_ps(-88.0));
    let (inf, zero) = (_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps());
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n, inside both buffers (caller's contract).
        let x_init = _mm256_sub_ps(unsafe { _mm256_loadu_ps(xs.add(i)) }, shift);
        let x = _mm256_mul_ps(x_init, log2e);
        let floor_half = |v: __m128| {
            let d = _mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(v), half));
            _mm256_cvtpd_ps(d)
        };
        let ipart = _mm256_set_m128(
            floor_half(_mm256_extractf128_ps::<1>(x)),
            floor_half(_mm256_castps256_ps128(x)),
        );
        let fpart = _mm256_sub_ps(x, ipart);
        let mut p = c[0];
        for &ck in &c[1..] {
            p = _mm256_fmadd_ps(p, fpart, ck);
        }
        let epart = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(ipart), bias));
        let mut r = _mm256_mul_ps(_mm256_castsi256_ps(epart), p);
        r = _mm256_blendv_ps(r, x_init, _mm256_cmp_ps::<_CMP_UNORD_Q>(x_init, x_init));
        r = _mm256_blendv_ps(r, inf, _mm256_cmp_ps::<_CMP_GT_OQ>(x_init, hi_limit));
        r = _mm256_blendv_ps(r, zero, _mm256_cmp_ps::<_CMP_LT_OQ>(x_init, lo_limit));
        // SAFETY: as the load.
        unsafe { _mm256_storeu_ps(out.add(i), r) };
    }
}

/// `xs[i] = mlx::log(xs[i])`, eight at a time, the scalar `mlx::log` step for step: the
/// subinterval and exponent in the integer lanes, the table gathered, the polynomial in
/// double with the same fused multiply-adds. Lanes outside the positive normal floats take
/// the scalar function.
///
/// # Safety
/// AVX2/FMA available; `xs` valid for reads and writes of `n` (a multiple of 8) elements.
#[target_feature(enable = "avx2,fma")]
unsafe fn log_avx2(xs: *mut f32, n: usize) {
    let table = crate::mlx::LOGF_TABLE.as_ptr() as *const f64;
    let [a0, a1, a2] = crate::mlx::LOGF_POLY.map(|v| _mm256_set1_pd(v));
    let ln2 = _mm256_set1_pd(crate::mlx::LOGF_LN2);
    let minus_one = _mm256_set1_pd(-1.0);
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n, inside the buffer (caller's contract).
        let v = unsafe { _mm256_loadu_ps(xs.add(i)) };
        let ix = _mm256_castps_si256(v);
        // Below the smallest normal or above the largest finite (negatives are below too).
        let special = _mm256_or_si256(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(0x0080_0000), ix),
            _mm256_cmpgt_epi32(ix, _mm256_set1_epi32(0x7F7F_FFFF)),
        );
        let tmp = _mm256_sub_epi32(ix, _mm256_set1_epi32(0x3F33_0000));
        // Index of (1/c, ln c) in the table read as f64 pairs.
        let slot = _mm256_slli_epi32::<1>(_mm256_and_si256(
            _mm256_srli_epi32::<19>(tmp),
            _mm256_set1_epi32(15),
        ));
        let k = _mm256_srai_epi32::<23>(tmp);
        let iz = _mm256_sub_epi32(
            ix,
            _mm256_and_si256(tmp, _mm256_set1_epi32(0xFF80_0000u32 as i32)),
        );
        let half = |lo: bool| {
            let pick = |v: __m256i| match lo {
                true => _mm256_castsi256_si128(v),
                false => _mm256_extracti128_si256::<1>(v),
            };
            let z = _mm256_cvtps_pd(_mm_castsi128_ps(pick(iz)));
            let slot = pick(slot);
            // SAFETY: slot < 32 (even, from 4 bits), so both gathers stay in the table.
            let (invc, logc) = unsafe {
                (
                    _mm256_i32gather_pd::<8>(table, slot),
                    _mm256_i32gather_pd::<8>(table.add(1), slot),
                )
            };
            let r = _mm256_fmadd_pd(z, invc, minus_one);
            let y0 = _mm256_fmadd_pd(_mm256_cvtepi32_pd(pick(k)), ln2, logc);
            let r2 = _mm256_mul_pd(r, r);
            let y = _mm256_fmadd_pd(a1, r, a2);
            let y = _mm256_fmadd_pd(r2, a0, y);
            _mm256_cvtpd_ps(_mm256_fmadd_pd(r2, y, _mm256_add_pd(r, y0)))
        };
        let out = _mm256_set_m128(half(false), half(true));
        // SAFETY: as the load.
        unsafe { _mm256_storeu_ps(xs.add(i), out) };
        let special = _mm256_movemask_ps(_mm256_castsi256_ps(special));
        if special != 0 {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
            for (j, x) in lanes.iter().enumerate() {
                if special & (1 << j) != 0 {
                    // SAFETY: i + j < n.
                    unsafe { *xs.add(i + j) = crate::mlx::log(*x) };
                }
            }
        }
    }
}

/// [`super::geglu_loop`] compiled for 8-lane AVX2.
///
/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    super::geglu_loop(gate, up)
}

/// [`super::soft_cap_loop`] compiled for 8-lane AVX2.
///
/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
unsafe fn soft_cap_avx2(xs: &mut [f32], cap: f32) {
    super::soft_cap_loop(xs, cap)
}
