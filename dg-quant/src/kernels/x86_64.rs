//! AVX2 + FMA kernels (x86-64). Each `pub fn` is safe: it checks the CPU features and the
//! slice lengths it relies on, then calls a `#[target_feature]` body. Twins in `scalar.rs`;
//! tests at the bottom compare the two on random data.
//!
//! Fast paths cover 4- and 8-bit (the checkpoints' widths) and 2-bit dequantization; the
//! dispatcher in `mod.rs` sends other widths to the scalar kernels.

use std::arch::x86_64::*;

use half::bf16;

/// Whether this module's kernels may run.
#[inline]
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Horizontal sum of 8 lanes in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
#[inline]
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }
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
// Fused dot products: out[i] = sum_g s_g (x_g . q_g) + sum_g b_g xsum_g, one x row against
// consecutive quantized rows, four rows at a time so each x vector load serves four rows.

/// Order in which the 4-bit kernel consumes x within each 32-element block: the 16 even
/// elements, then the 16 odd ones (low nibbles, then high nibbles of 16 bytes).
pub fn permute_x_4bit(x: &[f32], out: &mut [f32]) {
    for (src, dst) in x.chunks_exact(32).zip(out.chunks_exact_mut(32)) {
        for j in 0..16 {
            dst[j] = src[2 * j];
            dst[16 + j] = src[2 * j + 1];
        }
    }
}

/// `out[i] = x . W[i]` for `out.len()` consecutive rows packed in `words`/`scales`/`biases`.
/// `bits` must be 4 or 8. For 4 bits, `x` must be in `permute_x_4bit` order.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows(
    x: &[f32],
    xsum: &[f32],
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    bits: u32,
    group_size: usize,
    out: &mut [f32],
) {
    assert!(
        available() && matches!(bits, 4 | 8),
        "x86_64::dot_rows: unsupported"
    );
    let cols = x.len();
    assert!(
        group_size.is_multiple_of(32) && cols.is_multiple_of(group_size),
        "x86_64::dot_rows: bad group"
    );
    let (wpr, gpr) = (cols * bits as usize / 32, cols / group_size);
    assert!(xsum.len() == gpr, "x86_64::dot_rows: xsum length");
    let rows = out.len();
    assert!(words.len() >= rows * wpr, "x86_64::dot_rows: short words");
    assert!(
        scales.len() >= rows * gpr && biases.len() >= rows * gpr,
        "x86_64::dot_rows: short params"
    );
    for (i, o) in out.iter_mut().enumerate() {
        let w = &words[i * wpr..(i + 1) * wpr];
        let (s, b) = (
            &scales[i * gpr..(i + 1) * gpr],
            &biases[i * gpr..(i + 1) * gpr],
        );
        // SAFETY: AVX2/FMA detected; `w` is one row of wpr words, `s`/`b` its gpr groups,
        // `x` holds cols floats and `xsum` gpr sums, as the bodies require.
        *o = unsafe {
            let dot = if bits == 4 {
                dot4_avx2(x, w, s, group_size)
            } else {
                dot8_avx2(x, w, s, group_size)
            };
            dot + bias_dot_avx2(b, xsum)
        };
    }
}

/// `dot_rows` for two activation rows at once: each weight row is decoded once and used for
/// both (`out_a[i] = xa . W[i]`, `out_b[i] = xb . W[i]`).
#[allow(clippy::too_many_arguments)]
pub fn dot_rows2(
    (xa, xsa): (&[f32], &[f32]),
    (xb, xsb): (&[f32], &[f32]),
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    bits: u32,
    group_size: usize,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    assert!(
        available() && matches!(bits, 4 | 8),
        "x86_64::dot_rows2: unsupported"
    );
    let cols = xa.len();
    assert!(
        xb.len() == cols && group_size.is_multiple_of(32) && cols % group_size == 0,
        "x86_64::dot_rows2: bad shape"
    );
    let (wpr, gpr) = (cols * bits as usize / 32, cols / group_size);
    assert!(
        xsa.len() == gpr && xsb.len() == gpr,
        "x86_64::dot_rows2: xsum length"
    );
    let rows = out_a.len();
    assert!(out_b.len() == rows, "x86_64::dot_rows2: output lengths");
    assert!(words.len() >= rows * wpr, "x86_64::dot_rows2: short words");
    assert!(
        scales.len() >= rows * gpr && biases.len() >= rows * gpr,
        "x86_64::dot_rows2: short params"
    );
    for i in 0..rows {
        let w = &words[i * wpr..(i + 1) * wpr];
        let (s, b) = (
            &scales[i * gpr..(i + 1) * gpr],
            &biases[i * gpr..(i + 1) * gpr],
        );
        // SAFETY: AVX2/FMA detected; `w` is one row of wpr words, `s`/`b` its gpr groups,
        // both x rows hold cols floats and their sums gpr values.
        unsafe {
            let (da, db) = if bits == 4 {
                dot4x2_avx2(xa, xb, w, s, group_size)
            } else {
                dot8x2_avx2(xa, xb, w, s, group_size)
            };
            out_a[i] = da + bias_dot_avx2(b, xsa);
            out_b[i] = db + bias_dot_avx2(b, xsb);
        }
    }
}

/// `dot4_avx2` for two x rows (two FMA chains each).
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4x2_avx2(
    xa: &[f32],
    xb: &[f32],
    words: &[u32],
    scales: &[bf16],
    group_size: usize,
) -> (f32, f32) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let cols = xa.len();
        let (pa, pb) = (xa.as_ptr(), xb.as_ptr());
        let wp = words.as_ptr() as *const u8;
        let low = _mm256_set1_epi8(0x0F);
        let m0 = _mm256_setr_epi8(
            0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1,
            -1, 6, -1, -1, -1, 7, -1, -1, -1,
        );
        let m1 = _mm256_setr_epi8(
            8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13, -1,
            -1, -1, 14, -1, -1, -1, 15, -1, -1, -1,
        );
        let (mut acc_a, mut acc_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (gi, scale) in scales[..cols / group_size].iter().enumerate() {
            let (mut a0, mut a1, mut b0, mut b1) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut k = gi * group_size;
            while k < (gi + 1) * group_size {
                // SAFETY: k + 32 <= cols: x vectors of both rows and the row's 16 bytes at k/2
                // are in bounds.
                unsafe {
                    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        wp.add(k / 2) as *const __m128i
                    ));
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    let q = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, m0));
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), q, a0);
                    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k)), q, b0);
                    let q = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, m1));
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k + 8)), q, a1);
                    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k + 8)), q, b1);
                    let q = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, m0));
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k + 16)), q, a0);
                    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k + 16)), q, b0);
                    let q = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, m1));
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k + 24)), q, a1);
                    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k + 24)), q, b1);
                }
                k += 32;
            }
            let s = _mm256_set1_ps(bf16_f32(*scale));
            acc_a = _mm256_fmadd_ps(s, _mm256_add_ps(a0, a1), acc_a);
            acc_b = _mm256_fmadd_ps(s, _mm256_add_ps(b0, b1), acc_b);
        }
        (hsum(acc_a), hsum(acc_b))
    }
}

/// `dot8_avx2` for two x rows (two FMA chains each).
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot8x2_avx2(
    xa: &[f32],
    xb: &[f32],
    words: &[u32],
    scales: &[bf16],
    group_size: usize,
) -> (f32, f32) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let cols = xa.len();
        let (pa, pb) = (xa.as_ptr(), xb.as_ptr());
        let wp = words.as_ptr() as *const u8;
        let (mut acc_a, mut acc_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (gi, scale) in scales[..cols / group_size].iter().enumerate() {
            let (mut a0, mut a1, mut b0, mut b1) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut k = gi * group_size;
            while k < (gi + 1) * group_size {
                // SAFETY: k + 16 <= cols: x vectors of both rows and bytes k..k+16 of the row
                // are in bounds.
                unsafe {
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        wp.add(k) as *const __m128i
                    )));
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), q, a0);
                    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k)), q, b0);
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        wp.add(k + 8) as *const __m128i,
                    )));
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k + 8)), q, a1);
                    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(pb.add(k + 8)), q, b1);
                }
                k += 16;
            }
            let s = _mm256_set1_ps(bf16_f32(*scale));
            acc_a = _mm256_fmadd_ps(s, _mm256_add_ps(a0, a1), acc_a);
            acc_b = _mm256_fmadd_ps(s, _mm256_add_ps(b0, b1), acc_b);
        }
        (hsum(acc_a), hsum(acc_b))
    }
}

/// bf16 -> f32 is exact: the bf16 bits are the f32's high half.
#[inline(always)]
fn bf16_f32(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

/// `sum_g b_g xsum_g`, 8 lanes then a fixed-order reduction, then the tail in order.
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_dot_avx2(biases: &[bf16], xsum: &[f32]) -> f32 {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let n = xsum.len().min(biases.len());
        let mut acc = _mm256_setzero_ps();
        let mut g = 0;
        while g + 8 <= n {
            // SAFETY: g + 8 <= n elements of both slices.
            unsafe {
                let b16 = _mm_loadu_si128(biases.as_ptr().add(g) as *const __m128i);
                let b = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(b16)));
                acc = _mm256_fmadd_ps(b, _mm256_loadu_ps(xsum.as_ptr().add(g)), acc);
            }
            g += 8;
        }
        let mut s = hsum(acc);
        for k in g..n {
            s = bf16_f32(biases[k]).mul_add(xsum[k], s);
        }
        s
    }
}

/// `sum_g s_g (x_g . q_g)` for one 4-bit row, x in `permute_x_4bit` order. Four independent
/// FMA chains per group keep both FMA pipes busy; rows overlap out of order.
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_avx2(x: &[f32], words: &[u32], scales: &[bf16], group_size: usize) -> f32 {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let cols = x.len();
        let xp = x.as_ptr();
        let wp = words.as_ptr() as *const u8;
        let low = _mm256_set1_epi8(0x0F);
        // Byte k of the 16 broadcast bytes into dword lane k (low lane: bytes 0-3, high: 4-7).
        let m0 = _mm256_setr_epi8(
            0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1,
            -1, 6, -1, -1, -1, 7, -1, -1, -1,
        );
        let m1 = _mm256_setr_epi8(
            8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13, -1,
            -1, -1, 14, -1, -1, -1, 15, -1, -1, -1,
        );
        let mut acc = _mm256_setzero_ps();
        for (gi, scale) in scales[..cols / group_size].iter().enumerate() {
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut k = gi * group_size;
            while k < (gi + 1) * group_size {
                // SAFETY: k + 32 <= cols: four x vectors and the 16 bytes of elements k..k+32
                // (byte offset k/2 of the row) are in bounds.
                unsafe {
                    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        wp.add(k / 2) as *const __m128i
                    ));
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    a0 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k)),
                        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, m0)),
                        a0,
                    );
                    a1 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k + 8)),
                        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, m1)),
                        a1,
                    );
                    a2 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k + 16)),
                        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, m0)),
                        a2,
                    );
                    a3 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k + 24)),
                        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, m1)),
                        a3,
                    );
                }
                k += 32;
            }
            let dot = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(bf16_f32(*scale)), dot, acc);
        }
        hsum(acc)
    }
}

/// `sum_g s_g (x_g . q_g)` for one 8-bit row.
#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot8_avx2(x: &[f32], words: &[u32], scales: &[bf16], group_size: usize) -> f32 {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let cols = x.len();
        let xp = x.as_ptr();
        let wp = words.as_ptr() as *const u8;
        let mut acc = _mm256_setzero_ps();
        for (gi, scale) in scales[..cols / group_size].iter().enumerate() {
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut k = gi * group_size;
            while k < (gi + 1) * group_size {
                // SAFETY: k + 32 <= cols: four x vectors and bytes k..k+32 of the row are in bounds.
                unsafe {
                    let q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(wp.add(k) as *const __m128i));
                    let q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(wp.add(k + 8) as *const __m128i));
                    let q2 =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(wp.add(k + 16) as *const __m128i));
                    let q3 =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(wp.add(k + 24) as *const __m128i));
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(k)), _mm256_cvtepi32_ps(q0), a0);
                    a1 =
                        _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(k + 8)), _mm256_cvtepi32_ps(q1), a1);
                    a2 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k + 16)),
                        _mm256_cvtepi32_ps(q2),
                        a2,
                    );
                    a3 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(xp.add(k + 24)),
                        _mm256_cvtepi32_ps(q3),
                        a3,
                    );
                }
                k += 32;
            }
            let dot = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(bf16_f32(*scale)), dot, acc);
        }
        hsum(acc)
    }
}

// ---------------------------------------------------------------------------------------------
// out[j] = fma(a, v[j], out[j]), bit-identical to scalar::axpy.

/// `out[j] = fma(a, v[j], out[j])` for `j < out.len()` (`v` at least as long).
pub fn axpy(a: f32, v: &[f32], out: &mut [f32]) {
    assert!(
        available() && v.len() >= out.len(),
        "x86_64::axpy: unsupported"
    );
    // SAFETY: AVX2/FMA detected; the body touches out.len() elements of both slices.
    unsafe { axpy_avx2(a, v, out) }
}

#[allow(unused_unsafe)]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(a: f32, v: &[f32], out: &mut [f32]) {
    // SAFETY: the caller upholds this function's contract (features present, pointers
    // and slices in bounds); the block only lets intrinsics be called on toolchains
    // before Rust 1.87, where they are `unsafe` even inside `#[target_feature]` code.
    unsafe {
        let n = out.len();
        let av = _mm256_set1_ps(a);
        let (vp, op) = (v.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while j + 8 <= n {
            // SAFETY: j + 8 <= n <= v.len().
            unsafe {
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(vp.add(j)), _mm256_loadu_ps(op.add(j)));
                _mm256_storeu_ps(op.add(j), r);
            }
            j += 8;
        }
        for k in j..n {
            out[k] = a.mul_add(v[k], out[k]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM tiles for the compute-bound path: activations transposed (`xt [k][m8]`, 8 rows per
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

    /// Bound of two summation orders of the fused dot product (see tests/goldens.rs).
    fn bound(x: &[f32], r: &Rows, row: usize, spec: QuantSpec) -> f32 {
        let cols = x.len();
        let gpr = cols / spec.group_size;
        let wpr = spec.words_per_row(cols);
        let mut s = 0.0f64;
        for (k, xv) in x.iter().enumerate() {
            let gi = row * gpr + k / spec.group_size;
            let q = scalar::unpack(&r.words[row * wpr..(row + 1) * wpr], k, spec.bits) as f64;
            s += (*xv as f64).abs()
                * ((r.scales[gi].to_f32() as f64).abs() * q + (r.biases[gi].to_f32() as f64).abs());
        }
        (2.0 * (cols as f64 + 8.0) * s / (1u64 << 24) as f64) as f32
    }

    #[test]
    fn dot_rows_match_scalar() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for bits in [4, 8] {
            for g in [32, 64, 128] {
                let spec = QuantSpec::new(bits, g).unwrap();
                // Row counts that are not multiples of 4 exercise the 1-3 row tails.
                for rows in [1usize, 2, 3, 4, 7, 13] {
                    let cols = g * 3;
                    let r = random_rows(&mut rng, rows, cols, spec);
                    let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    let mut xsum = vec![0.0; cols / g];
                    scalar::group_sums(&x, g, &mut xsum);
                    let mut xk = x.clone();
                    if bits == 4 {
                        permute_x_4bit(&x, &mut xk);
                    }
                    let mut got = vec![0.0; rows];
                    dot_rows(
                        &xk, &xsum, &r.words, &r.scales, &r.biases, bits, g, &mut got,
                    );
                    let wpr = spec.words_per_row(cols);
                    let gpr = cols / g;
                    for (i, got) in got.iter().enumerate() {
                        let want = scalar::dot_row(
                            &x,
                            &xsum,
                            &r.words[i * wpr..(i + 1) * wpr],
                            &r.scales[i * gpr..(i + 1) * gpr],
                            &r.biases[i * gpr..(i + 1) * gpr],
                            spec,
                        );
                        let tol = bound(&x, &r, i, spec);
                        assert!(
                            (got - want).abs() <= tol,
                            "{bits}b g{g} rows {rows} row {i}: {got} vs {want} (tol {tol})"
                        );
                    }
                }
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

    #[test]
    fn axpy_matches_scalar_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for n in [0usize, 1, 7, 8, 9, 31, 100] {
            let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let base: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (mut a, mut b) = (base.clone(), base);
            axpy(0.37, &v, &mut a);
            scalar::axpy(0.37, &v, &mut b);
            assert_eq!(a, b, "n = {n}");
        }
    }
}
