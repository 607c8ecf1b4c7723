//! AVX2 + FMA kernels (x86-64): dequantization of 2-, 4- and 8-bit rows, the register tiles of
//! the tiled `x @ W^T` path (`tiles`, the matmul's strategy for every row count where the
//! AVX-512 unpacked panels do not run) and of `x @ W` (`tiles_n`). Each `pub fn` is safe: it
//! checks the CPU features and the slice lengths it relies on, then calls a
//! `#[target_feature]` body. Twins in `scalar.rs`; tests at the bottom compare the two bit for
//! bit on random data.
//!
//! The dispatcher in `mod.rs` sends the other widths' dequantization to the scalar kernels.

use std::arch::x86_64::*;

use half::bf16;

/// Whether this module's kernels may run.
#[inline]
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
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

// ---------------------------------------------------------------------------------------------
// Dequantization: w = f32(f32(scale * q) + bias), bit-identical to scalar::dequant_row.

/// One dequantized row; `bits` must be 2, 4 or 8.
pub fn dequant_row(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    bits: u32,
    group_size: usize,
    out: &mut [f32],
) {
    assert!(
        available() && matches!(bits, 2 | 4 | 8),
        "x86_64::dequant_row: unsupported"
    );
    assert!(
        group_size.is_multiple_of(32) && out.len().is_multiple_of(group_size),
        "x86_64::dequant_row: bad group"
    );
    let groups = out.len() / group_size;
    assert!(
        words.len() * 32 >= out.len() * bits as usize,
        "x86_64::dequant_row: short words"
    );
    assert!(
        scales.len() >= groups && biases.len() >= groups,
        "x86_64::dequant_row: short params"
    );
    // SAFETY: AVX2/FMA were detected above; the body reads `out.len() * bits / 32` words and
    // `groups` scales/biases, all checked, and writes `out.len()` floats.
    unsafe { dequant_row_avx2(words, scales, biases, bits, group_size, out) }
}

#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequant_row_avx2(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    bits: u32,
    group_size: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let wp = words.as_ptr();
        let op = out.as_mut_ptr();
        let wpg = group_size * bits as usize / 32;
        for gi in 0..out.len() / group_size {
            let s = _mm256_set1_ps(scales[gi].to_f32());
            let b = _mm256_set1_ps(biases[gi].to_f32());
            // SAFETY: group gi covers words [gi*wpg, (gi+1)*wpg) and outputs
            // [gi*group_size, (gi+1)*group_size), inside the lengths the caller checked.
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
}

// ---------------------------------------------------------------------------------------------
// GEMM tiles of the tiled `x @ W^T` path: activations transposed (`xt [k][m8]`, 8 rows per
// vector), weights dequantized in their natural layout and broadcast one element at a time.
// Each output lane accumulates its whole reduction in k order with fma, bit-identical to
// scalar::tiles.

/// Weight rows per register tile: 2 x 6 accumulators + 2 x vectors + 1 broadcast = 15 of the
/// 16 ymm registers (measured: a 3 x 4 tile for 24 activation rows spills and runs slower
/// than 2 x 6 + 1 x 6).
pub const TILE_ROWS: usize = 6;

/// `ct[j*ldc + i] = (load ? ct[j*ldc + i] : 0) + sum_{k < kc} xt[k*ldx + i] * w[j*ldw + k]`
/// (fma, in k order) for `i < m8` (a multiple of 8) and `j < nr`.
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
    assert!(
        available() && m8.is_multiple_of(8) && m8 <= ldx && kc <= ldw && m8 <= ldc,
        "x86_64::tiles: bad layout"
    );
    if kc == 0 || m8 == 0 || nr == 0 {
        if !load {
            for j in 0..nr {
                ct[j * ldc..j * ldc + m8].fill(0.0);
            }
        }
        return;
    }
    assert!(
        (kc - 1) * ldx + m8 <= xt.len(),
        "x86_64::tiles: xt too short"
    );
    assert!((nr - 1) * ldw + kc <= w.len(), "x86_64::tiles: w too short");
    assert!(
        (nr - 1) * ldc + m8 <= ct.len(),
        "x86_64::tiles: ct too short"
    );
    let mut j = 0;
    while j < nr {
        let n = (nr - j).min(TILE_ROWS);
        let mut v = 0;
        while v < m8 / 8 {
            let mv = (m8 / 8 - v).min(2);
            // SAFETY: AVX2/FMA detected; the tile reads xt[k*ldx + 8v .. + 8*mv] for k < kc,
            // w[(j + r)*ldw + k] for r < n, and reads/writes ct[(j + r)*ldc + 8v .. + 8*mv]:
            // all inside the extents asserted above (8v + 8mv <= m8, j + n <= nr).
            unsafe {
                let (xp, wp, cp) = (
                    xt.as_ptr().add(8 * v),
                    w.as_ptr().add(j * ldw),
                    ct.as_mut_ptr().add(j * ldc + 8 * v),
                );
                macro_rules! tile {
                    ($($mv:literal, $nr:literal);*) => {
                        match (mv, n) {
                            $(($mv, $nr) => tile_avx2::<$mv, $nr>(kc, xp, ldx, wp, ldw, cp, ldc, load),)*
                            _ => unreachable!("tile shape ({mv}, {n})"),
                        }
                    };
                }
                tile!(1, 1; 1, 2; 1, 3; 1, 4; 1, 5; 1, 6; 2, 1; 2, 2; 2, 3; 2, 4; 2, 5; 2, 6);
            }
            v += mv;
        }
        j += n;
    }
}

/// One register tile: `MV` vectors of 8 activation rows x `NR` weight rows.
///
/// # Safety
/// AVX2/FMA available; `xt` valid for reads of `xt[k*ldx .. + 8*MV]` (k < kc), `w` of
/// `w[r*ldw + k]` (r < NR, k < kc), `ct` for reads/writes of `ct[r*ldc .. + 8*MV]` (r < NR).
#[allow(clippy::too_many_arguments)]
#[inline]
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MV: usize, const NR: usize>(
    kc: usize,
    xt: *const f32,
    ldx: usize,
    w: *const f32,
    ldw: usize,
    ct: *mut f32,
    ldc: usize,
    load: bool,
) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); MV]; NR];
        // SAFETY: every access is inside the ranges of the contract above.
        unsafe {
            if load {
                for (r, a) in acc.iter_mut().enumerate() {
                    for (v, a) in a.iter_mut().enumerate() {
                        *a = _mm256_loadu_ps(ct.add(r * ldc + 8 * v));
                    }
                }
            }
            for k in 0..kc {
                let mut xv = [_mm256_setzero_ps(); MV];
                for (v, xv) in xv.iter_mut().enumerate() {
                    *xv = _mm256_loadu_ps(xt.add(k * ldx + 8 * v));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let wb = _mm256_broadcast_ss(&*w.add(r * ldw + k));
                    for (v, a) in a.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(xv[v], wb, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (v, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(ct.add(r * ldc + 8 * v), *a);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM tiles for `x @ W` (reduction over W's rows): weights dequantized in their natural
// layout give 16 output columns per two vector loads, activations are broadcast.

/// `y[i] = fma(a, x[i], y[i])` (see `scalar::axpy`).
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert!(available(), "x86_64::axpy: unsupported");
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    let n = x.len() / 8 * 8;
    // SAFETY: AVX2/FMA detected; the body touches x[..n] and y[..n], inside both slices.
    unsafe { axpy_avx2(a, x.as_ptr(), y.as_mut_ptr(), n) };
    for (y, x) in y[n..].iter_mut().zip(&x[n..]) {
        *y = a.mul_add(*x, *y);
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

/// Activation rows per register tile of `tiles_n` (6 x 2 accumulators + 2 weight vectors + 1
/// broadcast = 15 ymm registers).
pub const TILE_N_ROWS: usize = 6;

/// `p[i*ldp + c] = (load ? p[i*ldp + c] : 0) + sum_{k < kc} x[i*ldx + k] * w[k*ldw + c]`
/// (fma, in k order) for `i < m` and `c < ncols` (a multiple of 16).
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
    assert!(available(), "x86_64::tiles_n: unsupported");
    let (xs, ws) = ((kc, x, ldx, m), (w, ldw, ncols));
    if !super::tiles_n_prologue("x86_64::tiles_n", 16, xs, ws, p, ldp, load) {
        return;
    }
    for c in (0..ncols).step_by(16) {
        let mut i = 0;
        while i < m {
            let mr = (m - i).min(TILE_N_ROWS);
            // SAFETY: AVX2/FMA detected; the tile reads x[(i + r)*ldx + k] (r < mr, k < kc),
            // w[k*ldw + c .. + 16] and reads/writes p[(i + r)*ldp + c .. + 16]: inside the
            // extents asserted above (i + mr <= m, c + 16 <= ncols).
            unsafe {
                let (xp, wp, pp) = (
                    x.as_ptr().add(i * ldx),
                    w.as_ptr().add(c),
                    p.as_mut_ptr().add(i * ldp + c),
                );
                match mr {
                    6 => tile_n_avx2::<6>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                    5 => tile_n_avx2::<5>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                    4 => tile_n_avx2::<4>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                    3 => tile_n_avx2::<3>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                    2 => tile_n_avx2::<2>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                    _ => tile_n_avx2::<1>(kc, xp, ldx, wp, ldw, pp, ldp, load),
                }
            }
            i += mr;
        }
    }
}

/// One register tile of `tiles_n`: `MR` activation rows x 16 columns.
///
/// # Safety
/// AVX2/FMA available; `x` valid for reads of `x[r*ldx + k]` (r < MR, k < kc), `w` of
/// `w[k*ldw .. + 16]` (k < kc), `p` for reads/writes of `p[r*ldp .. + 16]` (r < MR).
#[allow(clippy::too_many_arguments)]
#[inline]
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_n_avx2<const MR: usize>(
    kc: usize,
    x: *const f32,
    ldx: usize,
    w: *const f32,
    ldw: usize,
    p: *mut f32,
    ldp: usize,
    load: bool,
) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        // SAFETY: every access is inside the ranges of the contract above.
        unsafe {
            if load {
                for (r, a) in acc.iter_mut().enumerate() {
                    a[0] = _mm256_loadu_ps(p.add(r * ldp));
                    a[1] = _mm256_loadu_ps(p.add(r * ldp + 8));
                }
            }
            for k in 0..kc {
                let w0 = _mm256_loadu_ps(w.add(k * ldw));
                let w1 = _mm256_loadu_ps(w.add(k * ldw + 8));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xb = _mm256_broadcast_ss(&*x.add(r * ldx + k));
                    a[0] = _mm256_fmadd_ps(xb, w0, a[0]);
                    a[1] = _mm256_fmadd_ps(xb, w1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(p.add(r * ldp), a[0]);
                _mm256_storeu_ps(p.add(r * ldp + 8), a[1]);
            }
        }
    }
}

/// `scalar::fma_probe` in 8-lane AVX2 registers: `PROBE_CHAINS` independent FMA chains,
/// `rounds` steps each; returns the smallest lane (every lane holds `scalar::fma_chain(rounds)`).
pub fn fma_probe(rounds: usize) -> f32 {
    assert!(available(), "x86_64::fma_probe: unsupported");
    // SAFETY: features checked; the body touches only registers and a local array.
    unsafe { fma_probe_body(rounds) }
}

#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_probe_body(rounds: usize) -> f32 {
    use super::scalar::{PROBE_C, PROBE_CHAINS, PROBE_M};
    // SAFETY: the caller upholds this function's contract (features present).
    unsafe {
        let (m, c) = (_mm256_set1_ps(PROBE_M), _mm256_set1_ps(PROBE_C));
        let mut a = [_mm256_set1_ps(1.0); PROBE_CHAINS];
        for _ in 0..rounds {
            for a in &mut a {
                *a = _mm256_fmadd_ps(*a, m, c);
            }
        }
        let mut lanes = [0.0f32; PROBE_CHAINS * 8];
        for (a, out) in a.iter().zip(lanes.chunks_exact_mut(8)) {
            _mm256_storeu_ps(out.as_mut_ptr(), *a);
        }
        lanes.iter().fold(f32::INFINITY, |m, &v| m.min(v))
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kernels::scalar;
    use crate::QuantSpec;

    struct Rows {
        words: Vec<u32>,
        scales: Vec<bf16>,
        biases: Vec<bf16>,
    }

    fn random_rows(rng: &mut impl Rng, rows: usize, cols: usize, spec: QuantSpec) -> Rows {
        let groups = rows * cols / spec.group_size;
        Rows {
            words: (0..rows * spec.words_per_row(cols))
                .map(|_| rng.gen())
                .collect(),
            scales: (0..groups)
                .map(|_| bf16::from_f32(rng.gen_range(-0.05..0.05)))
                .collect(),
            biases: (0..groups)
                .map(|_| bf16::from_f32(rng.gen_range(-0.5..0.5)))
                .collect(),
        }
    }

    #[test]
    fn dequant_matches_scalar_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for bits in [2, 4, 8] {
            for g in [32, 64, 128] {
                let spec = QuantSpec::new(bits, g).unwrap();
                let cols = g * 5;
                let r = random_rows(&mut rng, 1, cols, spec);
                let mut want = vec![0.0; cols];
                scalar::dequant_row(&r.words, &r.scales, &r.biases, spec, &mut want);
                let mut got = vec![0.0; cols];
                dequant_row(&r.words, &r.scales, &r.biases, bits, g, &mut got);
                let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits_of(&got), bits_of(&want), "{bits} bits, group {g}");
            }
        }
    }

    #[test]
    fn tiles_match_scalar_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        for (kc, m8, nr) in [
            (1usize, 8usize, 1usize),
            (7, 16, 6),
            (64, 24, 13),
            (33, 40, 5),
            (128, 8, 7),
            (5, 8, 25),
            (9, 24, 3),
            (17, 32, 14),
        ] {
            let (ldx, ldw, ldc) = (m8 + 8, kc + 3, m8 + 16);
            let xt: Vec<f32> = (0..kc * ldx).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..nr * ldw).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let init: Vec<f32> = (0..nr * ldc).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for load in [false, true] {
                let (mut a, mut b) = (init.clone(), init.clone());
                tiles(kc, &xt, ldx, m8, &w, ldw, nr, &mut a, ldc, load);
                scalar::tiles(kc, &xt, ldx, m8, &w, ldw, nr, &mut b, ldc, load);
                assert_eq!(a, b, "kc {kc} m8 {m8} nr {nr} load {load}");
            }
        }
    }

    #[test]
    fn axpy_matches_scalar_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for n in [0usize, 1, 7, 8, 9, 64, 259] {
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let a = rng.gen_range(-1.0..1.0);
            let (mut p, mut q) = (y.clone(), y);
            axpy(a, &x, &mut p);
            scalar::axpy(a, &x, &mut q);
            assert_eq!(p, q, "n {n}");
        }
    }

    #[test]
    fn tiles_n_match_scalar_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (kc, m, ncols) in [
            (1usize, 1usize, 16usize),
            (9, 7, 32),
            (64, 13, 48),
            (31, 6, 16),
            (100, 2, 64),
        ] {
            let (ldx, ldw, ldp) = (kc + 5, ncols + 16, ncols + 3);
            let x: Vec<f32> = (0..m * ldx).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..kc * ldw).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let init: Vec<f32> = (0..m * ldp).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for load in [false, true] {
                let (mut a, mut b) = (init.clone(), init.clone());
                tiles_n(kc, &x, ldx, m, &w, ldw, ncols, &mut a, ldp, load);
                scalar::tiles_n(kc, &x, ldx, m, &w, ldw, ncols, &mut b, ldp, load);
                assert_eq!(a, b, "kc {kc} m {m} ncols {ncols} load {load}");
            }
        }
    }
}
