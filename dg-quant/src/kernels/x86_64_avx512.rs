//! AVX-512 kernels (x86-64): the unpacked panels of 4- and 8-bit weights (`unpack_rows_t`,
//! `widen_t`) with their register tiles (`tiles_q`), which every `x @ W^T` with such weights
//! runs, the transposed-word panels whose tiles decode the fields (`transpose_words_t`,
//! `tiles_qw`) for small row blocks, the same tiles over widened bf16 panels (`panel_tiles`),
//! and 32-column register tiles for `x @ W`. [`Avx512`] exists only where the CPU has
//! AVX-512F/BW/VL (and AVX2 + FMA, whose kernels it runs for the rest), so its methods call the
//! `#[target_feature]` bodies safely. Twins on `Scalar`; tests at the bottom and in
//! `kernels/mod.rs` compare them bit for bit.
//!
//! Panel layout: 64 bytes of each of sixteen weight rows are transposed in registers, and the
//! j-th field of every dword (nibble, or byte at 8 bits) is masked in place (`vpandd`) and
//! converted as unsigned (`vcvtudq2ps`), which reads `q * 2^(bits * j)` exactly (one op fewer
//! per field than shifting it down). The activations come scaled by `2^-(bits * j)`
//! (`PanelKernel::scale_fields`), so each FMA of the tiles multiplies exactly `x * q`.

use std::arch::x86_64::*;

use half::bf16;

use super::{
    check_product, register_tile, Avx2Fma, GroupParams, Kernel, Lines, PanelKernel, Scalar, Tile,
    View, ViewMut, SUM_ROWS,
};
use crate::format::QRow;

/// The AVX-512 kernels: a value exists only on a CPU with AVX-512F/BW/VL, AVX2 and FMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512 {
    avx2: Avx2Fma,
}

impl Avx512 {
    /// The kernels, where this CPU has AVX-512F/BW/VL, AVX2 and FMA.
    pub fn new() -> Option<Self> {
        let avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        Some(Avx512 {
            avx2: Avx2Fma::new().filter(|_| avx512)?,
        })
    }

    /// The AVX2 + FMA kernels this CPU also has.
    pub fn avx2(self) -> Avx2Fma {
        self.avx2
    }

    /// [`Kernel::tiles`] in register tiles of at most `max_rows` (<= 12) rows x 32 columns
    /// (`row_tiles`); `out.cols()` a multiple of 32.
    fn tiles_of(
        self,
        max_rows: usize,
        lhs: View<'_>,
        rhs: View<'_>,
        mut out: ViewMut<'_>,
        load: bool,
    ) {
        check_product(&lhs, &rhs, &out, 32);
        if !out.start(lhs.cols(), load) {
            return;
        }
        for c in (0..out.cols()).step_by(32) {
            for (i, mr) in row_tiles(out.rows(), max_rows) {
                let t = Tile::at(&lhs, &rhs, &mut out, (i, c), load);
                // SAFETY: AVX-512 present (`self`); the tile covers rows i..i+mr <= rows and
                // columns c..c+32 <= cols of views checked to fit their slices, and
                // k < lhs.cols() = rhs.rows() (`check_product`).
                unsafe {
                    match mr {
                        12 => tile::<2, 12>(t),
                        11 => tile::<2, 11>(t),
                        10 => tile::<2, 10>(t),
                        9 => tile::<2, 9>(t),
                        8 => tile::<2, 8>(t),
                        7 => tile::<2, 7>(t),
                        6 => tile::<2, 6>(t),
                        5 => tile::<2, 5>(t),
                        4 => tile::<2, 4>(t),
                        3 => tile::<2, 3>(t),
                        2 => tile::<2, 2>(t),
                        _ => tile::<2, 1>(t),
                    }
                }
            }
        }
    }
}

/// `out[i] = x[i] * factors[i % 16]` for `i < n` (`n` a multiple of 16).
///
/// # Safety
/// AVX-512F available; `x` and `out` valid for `n` elements.
#[target_feature(enable = "avx512f")]
unsafe fn scale_fields_avx512(x: *const f32, factors: &[f32; 16], out: *mut f32, n: usize) {
    // SAFETY: 16 f32s.
    let f = unsafe { _mm512_loadu_ps(factors.as_ptr()) };
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n, inside both buffers (caller's contract).
        unsafe { _mm512_storeu_ps(out.add(i), _mm512_mul_ps(_mm512_loadu_ps(x.add(i)), f)) };
    }
}

/// `out[i] = mlx::exp(xs[i] - shift)` for `i < n` (`n` a multiple of 16), bit for bit.
///
/// MLX rounds `floor(y + 0.5)` in double; here it is rounded in f32 (`vrndscaleps`), which
/// agrees for every f32 `y` whose sum `y + 0.5` is exact in f32: all of them except
/// `0.5 - 2^-25`, which `y = f32(x * 1.442695)` never is (checked over every f32 `x` by the
/// ignored test `exp_agrees_on_every_f32`). Sixteen lanes and no double conversion: the
/// attention softmax runs these exps.
///
/// # Safety
/// AVX-512F available; `xs` and `out` valid for `n` elements.
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(xs: *const f32, shift: f32, out: *mut f32, n: usize) {
    let shift = _mm512_set1_ps(shift);
    let log2e = _mm512_set1_ps(crate::mlx::EXP_LOG2E);
    let half = _mm512_set1_ps(0.5);
    let c = crate::mlx::EXP_POLY.map(|v| _mm512_set1_ps(v));
    let bias = _mm512_set1_epi32(127);
    let (hi_limit, lo_limit) = (_mm512_set1_ps(88.0), _mm512_set1_ps(-88.0));
    let inf = _mm512_set1_ps(f32::INFINITY);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n, inside both buffers (caller's contract).
        let x_init = _mm512_sub_ps(unsafe { _mm512_loadu_ps(xs.add(i)) }, shift);
        let x = _mm512_mul_ps(x_init, log2e);
        let ipart = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(
            _mm512_add_ps(x, half),
        );
        let fpart = _mm512_sub_ps(x, ipart);
        let mut p = c[0];
        for &ck in &c[1..] {
            p = _mm512_fmadd_ps(p, fpart, ck);
        }
        let epart = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(ipart), bias));
        let mut r = _mm512_mul_ps(_mm512_castsi512_ps(epart), p);
        r = _mm512_mask_mov_ps(
            r,
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x_init, x_init),
            x_init,
        );
        r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x_init, hi_limit), inf);
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x_init, lo_limit);
        r = _mm512_maskz_mov_ps(!low, r);
        // SAFETY: as the load.
        unsafe { _mm512_storeu_ps(out.add(i), r) };
    }
}

/// The largest of the first `n` (a multiple of 16) values at `xs` (`-inf` if none), and
/// whether one of them is NaN (then the largest is unspecified).
///
/// # Safety
/// AVX-512F available; `xs` valid for `n` values.
#[target_feature(enable = "avx512f")]
unsafe fn max_avx512(xs: *const f32, n: usize) -> (f32, bool) {
    // Two chains, so that each comparison's latency hides behind the other's.
    let (mut m0, mut m1) = (
        _mm512_set1_ps(f32::NEG_INFINITY),
        _mm512_set1_ps(f32::NEG_INFINITY),
    );
    let mut nan: __mmask16 = 0;
    let pairs = n / 32 * 32;
    for i in (0..pairs).step_by(32) {
        // SAFETY: i + 32 <= n (caller's contract).
        let (x0, x1) = unsafe { (_mm512_loadu_ps(xs.add(i)), _mm512_loadu_ps(xs.add(i + 16))) };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x0, x1);
        m0 = _mm512_max_ps(m0, x0);
        m1 = _mm512_max_ps(m1, x1);
    }
    if pairs < n {
        // SAFETY: pairs + 16 == n (caller's contract).
        let x = unsafe { _mm512_loadu_ps(xs.add(pairs)) };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        m0 = _mm512_max_ps(m0, x);
    }
    (_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)), nan != 0)
}

/// `xs[i] *= a` for the first `n` (a multiple of 16) values.
///
/// # Safety
/// AVX-512F available; `xs` valid for reads and writes of `n` values.
#[target_feature(enable = "avx512f")]
unsafe fn scale_avx512(a: f32, xs: *mut f32, n: usize) {
    let av = _mm512_set1_ps(a);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n (caller's contract).
        unsafe { _mm512_storeu_ps(xs.add(i), _mm512_mul_ps(av, _mm512_loadu_ps(xs.add(i)))) };
    }
}

/// Widest accumulator [`Avx512::fma_terms`] keeps in registers (16 of the 32 vectors).
const FMA_TERMS_MAX_WIDTH: usize = 256;

/// [`Avx512::fma_terms`] on a `16 * V`-wide accumulator.
///
/// # Safety
/// AVX-512F available; `acc` valid for reads and writes of `16 * V` values; every term's row
/// `rows[r * 16 * V..]` valid for `16 * V` values.
#[target_feature(enable = "avx512f")]
unsafe fn fma_terms_avx512<const V: usize>(terms: &[(u32, f32)], rows: *const f32, acc: *mut f32) {
    let mut a = [_mm512_setzero_ps(); V];
    for (i, a) in a.iter_mut().enumerate() {
        // SAFETY: inside `acc` (caller's contract).
        *a = unsafe { _mm512_loadu_ps(acc.add(16 * i)) };
    }
    for &(r, p) in terms {
        let pv = _mm512_set1_ps(p);
        // SAFETY: the term's row is inside `rows` (caller's contract).
        let row = unsafe { rows.add(r as usize * 16 * V) };
        for (i, a) in a.iter_mut().enumerate() {
            // SAFETY: as above, 16 * i + 16 <= 16 * V.
            *a = _mm512_fmadd_ps(pv, unsafe { _mm512_loadu_ps(row.add(16 * i)) }, *a);
        }
    }
    for (i, a) in a.iter().enumerate() {
        // SAFETY: inside `acc` (caller's contract).
        unsafe { _mm512_storeu_ps(acc.add(16 * i), *a) };
    }
}

/// [`Avx512::add_rows_in_order`] over the first `cols` (a multiple of 16) values of each row.
///
/// # Safety
/// AVX-512F available; each of `rows` valid for `cols` values.
#[target_feature(enable = "avx512f")]
unsafe fn add_rows_avx512(rows: [*const f32; SUM_ROWS], cols: usize, sums: &mut [f32; SUM_ROWS]) {
    // SAFETY: `sums` holds 16 values.
    let mut acc = unsafe { _mm512_loadu_ps(sums.as_ptr()) };
    for c in (0..cols).step_by(16) {
        // A loop, not a closure: a closure would not inherit the target features.
        let mut block = [_mm512_setzero_si512(); SUM_ROWS];
        for (b, r) in block.iter_mut().zip(rows) {
            // SAFETY: c + 16 <= cols, inside every row (caller's contract).
            *b = _mm512_castps_si512(unsafe { _mm512_loadu_ps(r.add(c)) });
        }
        for column in transpose_16x16(block) {
            acc = _mm512_add_ps(acc, _mm512_castsi512_ps(column));
        }
    }
    // SAFETY: as the first load.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), acc) };
}

/// [`super::geglu_loop`] compiled for 16-lane AVX-512.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn geglu_avx512(gate: &mut [f32], up: &[f32]) {
    super::geglu_loop(gate, up)
}

/// [`super::soft_cap_loop`] compiled for 16-lane AVX-512.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn soft_cap_avx512(xs: &mut [f32], cap: f32) {
    super::soft_cap_loop(xs, cap)
}

/// `dequant_row` for 4 and 8 bits: sixteen values per vector, each `fl(fl(s * q) + b)` (the
/// scalar twin's two roundings, no fma).
///
/// # Safety
/// AVX-512F available; `row.words` holds `out.len() * bits / 32` words, the scales and biases
/// `out.len() / group_size` values; `group_size` a multiple of 32; `bits` 4 or 8.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dequant_row_avx512(row: QRow<'_>, bits: u32, group_size: usize, out: &mut [f32]) {
    let (wp, op) = (row.words.as_ptr(), out.as_mut_ptr());
    let words_per_vector = bits as usize / 2;
    let vectors = group_size / 16;
    // Lane i takes word i / (32 / bits) of the vector's words, shifted to field i % (32 / bits).
    let per_word = 32 / bits as i32;
    let lane_word = _mm512_set_epi32(
        15 / per_word,
        14 / per_word,
        13 / per_word,
        12 / per_word,
        11 / per_word,
        10 / per_word,
        9 / per_word,
        8 / per_word,
        7 / per_word,
        6 / per_word,
        5 / per_word,
        4 / per_word,
        3 / per_word,
        2 / per_word,
        1 / per_word,
        0,
    );
    let b = bits as i32;
    let shifts = _mm512_set_epi32(
        15 % per_word * b,
        14 % per_word * b,
        13 % per_word * b,
        12 % per_word * b,
        11 % per_word * b,
        10 % per_word * b,
        9 % per_word * b,
        8 % per_word * b,
        7 % per_word * b,
        6 % per_word * b,
        5 % per_word * b,
        4 % per_word * b,
        3 % per_word * b,
        2 % per_word * b,
        1 % per_word * b,
        0,
    );
    let mask = _mm512_set1_epi32((1 << bits) - 1);
    let word_mask: __mmask16 = (1 << words_per_vector) - 1;
    for gi in 0..out.len() / group_size {
        let s = _mm512_set1_ps(row.scales[gi].to_f32());
        let bias = _mm512_set1_ps(row.biases[gi].to_f32());
        for v in 0..vectors {
            let first = gi * vectors + v;
            // SAFETY: vector `first` reads words [first * wpv, (first + 1) * wpv) and writes
            // outputs [16 * first, 16 * first + 16), inside the contract's lengths.
            unsafe {
                let words = _mm512_maskz_loadu_epi32(
                    word_mask,
                    wp.add(first * words_per_vector) as *const i32,
                );
                let lanes = _mm512_permutexvar_epi32(lane_word, words);
                let q = _mm512_and_si512(_mm512_srlv_epi32(lanes, shifts), mask);
                let w = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), s), bias);
                _mm512_storeu_ps(op.add(16 * first), w);
            }
        }
    }
}

/// Rows of `lhs` per register tile of `tiles` (6 x 2 accumulators).
const TILE_ROWS: usize = 6;

impl Kernel for Avx512 {
    fn geglu(self, gate: &mut [f32], up: &[f32]) {
        // SAFETY: AVX-512F present (`self`); the loop is safe code.
        unsafe { geglu_avx512(gate, up) }
    }

    fn soft_cap(self, xs: &mut [f32], cap: f32) {
        // SAFETY: AVX-512F present (`self`); the loop is safe code.
        unsafe { soft_cap_avx512(xs, cap) }
    }

    fn dequant_row(self, row: QRow<'_>, out: &mut [f32]) {
        let (bits, group_size) = (row.spec.bits, row.spec.group_size);
        if !matches!(bits, 4 | 8) {
            return self.avx2.dequant_row(row, out);
        }
        let groups = out.len() / group_size;
        assert!(
            out.len().is_multiple_of(group_size)
                && row.words.len() * 32 >= out.len() * bits as usize
                && row.scales.len() >= groups
                && row.biases.len() >= groups,
            "dequant_row: short operand"
        );
        // SAFETY: AVX-512F present (`self`); the body reads `out.len() * bits / 32` words and
        // `groups` scales and biases (checked) and writes `out.len()` floats; group sizes are
        // multiples of 32, so every group is whole 16-value vectors.
        unsafe { dequant_row_avx512(row, bits, group_size, out) }
    }

    fn exp_shifted(self, xs: &[f32], shift: f32, out: &mut [f32]) {
        assert_eq!(xs.len(), out.len(), "exp_shifted: lengths differ");
        let n = xs.len() / 16 * 16;
        // SAFETY: AVX-512F present (`self`); the body reads xs[..n] and writes out[..n].
        unsafe { exp_shifted_avx512(xs.as_ptr(), shift, out.as_mut_ptr(), n) };
        self.avx2.exp_shifted(&xs[n..], shift, &mut out[n..])
    }

    fn exp_shifted_in_place(self, xs: &mut [f32], shift: f32) {
        let n = xs.len() / 16 * 16;
        // SAFETY: AVX-512F present (`self`); the body reads and writes xs[..n], each vector
        // loaded before it is stored.
        unsafe { exp_shifted_avx512(xs.as_ptr(), shift, xs.as_mut_ptr(), n) };
        self.avx2.exp_shifted_in_place(&mut xs[n..], shift)
    }

    fn max_unordered(self, xs: &[f32]) -> Option<f32> {
        let n = xs.len() / 16 * 16;
        // SAFETY: AVX-512F present (`self`); the body reads xs[..n].
        let (max, unordered) = unsafe { max_avx512(xs.as_ptr(), n) };
        let tail = Scalar.max_unordered(&xs[n..])?;
        (!unordered).then_some(if tail > max { tail } else { max })
    }

    fn scale(self, a: f32, xs: &mut [f32]) {
        let n = xs.len() / 16 * 16;
        // SAFETY: AVX-512F present (`self`); the body reads and writes xs[..n].
        unsafe { scale_avx512(a, xs.as_mut_ptr(), n) };
        Scalar.scale(a, &mut xs[n..])
    }

    /// Sixteen columns at a time: the `16 x 16` block transposed in registers, so lane `r` of
    /// each transposed vector is row `r`'s next value, and one vector of sums takes them in
    /// column order.
    fn add_rows_in_order(self, rows: View<'_>, sums: &mut [f32; SUM_ROWS]) {
        let (n, cols) = (rows.rows(), rows.cols());
        assert!(n <= SUM_ROWS, "add_rows_in_order: {n} rows");
        if n == 0 {
            return;
        }
        let whole = cols / 16 * 16;
        // Missing rows repeat the first: their lanes are unspecified sums.
        let starts: [*const f32; SUM_ROWS] =
            std::array::from_fn(|r| rows.ptr(if r < n { r } else { 0 }, 0));
        // SAFETY: AVX-512F present (`self`); every start holds `whole <= cols` values (the
        // view was checked to fit its slice).
        unsafe { add_rows_avx512(starts, whole, sums) };
        Scalar.add_rows_in_order(rows.block((0, whole), (n, cols - whole)), sums)
    }

    fn log_in_place(self, xs: &mut [f32]) {
        self.avx2.log_in_place(xs)
    }

    /// 6-row x 32-column register tiles (`row_tiles`); AVX2's where the width is not a
    /// multiple of 32.
    fn tiles(self, lhs: View<'_>, rhs: View<'_>, out: ViewMut<'_>, load: bool) {
        if !out.cols().is_multiple_of(32) {
            return self.avx2.tiles(lhs, rhs, out, load);
        }
        self.tiles_of(TILE_ROWS, lhs, rhs, out, load)
    }

    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        self.avx2.axpy(a, x, y)
    }

    /// A 256-wide accumulator stays in sixteen registers across the terms.
    fn fma_terms(self, terms: &[(u32, f32)], rows: &[f32], acc: &mut [f32]) {
        let w = acc.len();
        if w > FMA_TERMS_MAX_WIDTH || !w.is_multiple_of(16) {
            return self.avx2.fma_terms(terms, rows, acc);
        }
        let in_range = terms
            .iter()
            .all(|&(r, _)| (r as usize + 1) * w <= rows.len());
        assert!(in_range, "fma_terms: a row past {} values", rows.len());
        let (rows, acc) = (rows.as_ptr(), acc.as_mut_ptr());
        macro_rules! dispatch {
            ($($v:literal)*) => {
                match w / 16 {
                    $($v => fma_terms_avx512::<$v>(terms, rows, acc),)*
                    _ => {}
                }
            };
        }
        // SAFETY: AVX-512F present (`self`); `acc` holds w = 16 V values and every term's row
        // lies inside `rows` (checked above).
        unsafe { dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16) }
    }
}

register_tile!(
    tile,
    "avx512f,avx2,fma",
    16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);

impl PanelKernel for Avx512 {
    /// Sixteen lanes a step, the factors repeating every `32 / bits` lanes (4 or 8 bits; other
    /// widths take the portable loop).
    fn scale_fields(self, x: &[f32], bits: u32, out: &mut [f32]) {
        let per_word = 32 / bits as usize;
        assert_eq!(x.len(), out.len(), "scale_fields: lengths differ");
        if !16usize.is_multiple_of(per_word) {
            return super::scalar::scale_fields(x, bits, out);
        }
        let factors: [f32; 16] =
            std::array::from_fn(|j| f32::from_bits((127 - bits * (j % per_word) as u32) << 23));
        let whole = x.len() / 16 * 16;
        // SAFETY: AVX-512F present (`self`); both slices hold `whole` elements.
        unsafe { scale_fields_avx512(x.as_ptr(), &factors, out.as_mut_ptr(), whole) };
        for (k, (o, v)) in out[whole..].iter_mut().zip(&x[whole..]).enumerate() {
            *o = v * factors[k];
        }
    }

    /// Sixteen rows at a time: 64 bytes of each row are transposed in registers (16 x 16
    /// dwords), so each mask + unsigned convert of a word vector (the field read in place, no
    /// shift) yields one `k` of the panel for all sixteen rows (docs/PERFORMANCE.md has the
    /// cycle counts that chose this).
    fn unpack_rows_t(
        self,
        words: &[u32],
        stride: usize,
        bits: u32,
        rows: usize,
        mut out: ViewMut<'_>,
    ) {
        let cols = out.rows();
        assert!(
            matches!(bits, 4 | 8) && cols.is_multiple_of(32 / bits as usize),
            "unpack_rows_t: {bits} bits, {cols} columns"
        );
        let wpr = cols * bits as usize / 32;
        if rows == 0 || cols == 0 {
            return;
        }
        check_transposed("unpack_rows_t", (words.len(), stride, wpr), rows, &out);
        let ld = out.ld();
        for i0 in (0..rows).step_by(16) {
            let args = (
                words[i0 * stride..].as_ptr(),
                stride,
                wpr,
                (rows - i0).min(16),
                out.ptr(0, i0),
                ld,
            );
            // Whole slabs of whole 16-word blocks (the common case), or of one 8-word block (a
            // 64-column 4-bit chunk), take a branch-free body.
            let nw = match (args.3, wpr) {
                (16, 8) => 8,
                (16, w) if w.is_multiple_of(16) => 16,
                _ => 0,
            };
            // SAFETY: AVX-512 present (`self`); rows i0..i0+n hold wpr words each at `stride`
            // (checked length); the panel holds (k, i0 + lane) for k < cols, lane < 16 (checked
            // extent).
            unsafe {
                match (bits, nw) {
                    (4, 16) => unpack_slab::<4, 16>(args),
                    (4, 8) => unpack_slab::<4, 8>(args),
                    (4, _) => unpack_slab::<4, 0>(args),
                    (_, 16) => unpack_slab::<8, 16>(args),
                    (_, 8) => unpack_slab::<8, 8>(args),
                    (_, _) => unpack_slab::<8, 0>(args),
                }
            }
        }
    }

    /// Sixteen rows' bf16 parameters at a time, widened to f32 and transposed in registers.
    fn widen_t(self, params: &[bf16], stride: usize, rows: usize, mut out: ViewMut<'_>) {
        let groups = out.rows();
        if rows == 0 || groups == 0 {
            return;
        }
        check_transposed("widen_t", (params.len(), stride, groups), rows, &out);
        let ld = out.ld();
        for i0 in (0..rows).step_by(16) {
            let n = (rows - i0).min(16);
            for g0 in (0..groups).step_by(16) {
                let ng = (groups - g0).min(16);
                // SAFETY: AVX-512 present (`self`); row i0 + i (i < n) holds `groups` values at
                // `(i0 + i) * stride` (checked length), of which the mask reads g0..g0+ng; the
                // table holds (g, i0 + lane) for g < groups, lane < 16 (checked extent).
                unsafe {
                    params_block(
                        params[i0 * stride + g0..].as_ptr(),
                        stride,
                        n,
                        ng,
                        out.ptr(g0, i0),
                        ld,
                    )
                }
            }
        }
    }

    /// 12-row x 32-column register tiles (`row_tiles`).
    fn panel_tiles(self, x: View<'_>, panel: View<'_>, out: ViewMut<'_>, load: bool) {
        self.tiles_of(TILE_Q_ROWS, x, panel, out, load)
    }

    /// 12-row x 32-column register tiles (`row_tiles`): per `k`, two panel vectors against
    /// twelve broadcast activations; per group, the scales and the bias term into the running
    /// sums in `out`.
    fn tiles_q(
        self,
        x: View<'_>,
        q: View<'_>,
        params: GroupParams<'_>,
        mut out: ViewMut<'_>,
        load: bool,
        ahead: Lines,
    ) {
        check_product(&x, &q, &out, 32);
        let (m, cols, ncols) = (out.rows(), x.cols(), out.cols());
        let groups = check_group_params(&params, m, cols, ncols);
        let GroupParams {
            scales,
            biases,
            xsum,
            group_size,
        } = params;
        if m == 0 || ncols == 0 || cols == 0 {
            return;
        }
        // The lines `ahead`: the tiles take them in turn, one every PREFETCH_STEPS steps, and
        // the rest (if the tiles end first) go at the end.
        let mut issued = 0;
        for c in (0..ncols).step_by(32) {
            for (i, mr) in row_tiles(m, TILE_Q_ROWS) {
                let args = TileQ {
                    x: x.ptr(i, 0),
                    ldx: x.ld(),
                    q: q.ptr(0, c),
                    ld: q.ld(),
                    s: scales.ptr(0, c),
                    b: biases.ptr(0, c),
                    ldp: scales.ld(),
                    xsum: xsum.ptr(i, 0),
                    ldxs: xsum.ld(),
                    groups,
                    group_size,
                    out: out.ptr(i, c),
                    ldo: out.ld(),
                    load,
                    ahead: ahead.first + 64 * issued,
                    ahead_lines: ahead.count - issued,
                };
                // SAFETY: AVX-512 present (`self`); the tile reads x rows i..i+mr (k < cols),
                // panel, scale and bias columns c..c+32 for every k / group, xsum rows
                // i..i+mr (groups entries each), and reads/writes out rows i..i+mr, columns
                // c..c+32: inside views checked to fit their slices, whose shapes agree.
                issued += unsafe {
                    match mr {
                        12 => tile_q::<12>(args),
                        11 => tile_q::<11>(args),
                        10 => tile_q::<10>(args),
                        9 => tile_q::<9>(args),
                        8 => tile_q::<8>(args),
                        7 => tile_q::<7>(args),
                        6 => tile_q::<6>(args),
                        5 => tile_q::<5>(args),
                        4 => tile_q::<4>(args),
                        3 => tile_q::<3>(args),
                        2 => tile_q::<2>(args),
                        _ => tile_q::<1>(args),
                    }
                };
            }
        }
        prefetch_rest(ahead, issued);
    }

    fn transpose_words_t(self, words: &[u32], stride: usize, rows: usize, mut out: ViewMut<'_>) {
        let wpr = out.rows();
        if rows == 0 || wpr == 0 {
            return;
        }
        check_transposed("transpose_words_t", (words.len(), stride, wpr), rows, &out);
        let ld = out.ld();
        for i0 in (0..rows).step_by(16) {
            let n = (rows - i0).min(16);
            let args = (
                words[i0 * stride..].as_ptr(),
                stride,
                wpr,
                n,
                out.ptr(0, i0),
                ld,
            );
            // SAFETY: AVX-512 present (`self`); rows i0..i0+n hold wpr words each at `stride`
            // (checked length); the panel holds (w, i0 + lane) for w < wpr, lane < 16 (checked
            // extent); NW only for whole slabs of whole blocks.
            unsafe {
                match (n, wpr) {
                    (16, 8) => transpose_slab::<8>(args),
                    (16, w) if w.is_multiple_of(16) => transpose_slab::<16>(args),
                    _ => transpose_slab::<0>(args),
                }
            }
        }
    }

    /// `MR x 16` register tiles (`row_tiles`, up to `TILE_QW_ROWS` rows): per word, one
    /// vector of sixteen weight rows' words, each field masked and converted in registers,
    /// against `MR` broadcast activations.
    fn tiles_qw(
        self,
        x: View<'_>,
        words: View<'_>,
        bits: u32,
        params: GroupParams<'_>,
        mut out: ViewMut<'_>,
        load: bool,
        ahead: Lines,
    ) {
        assert!(matches!(bits, 4 | 8), "tiles_qw: {bits} bits");
        let per_word = 32 / bits as usize;
        let (m, cols, ncols) = (out.rows(), x.cols(), out.cols());
        assert!(
            words.rows() * per_word == cols
                && words.cols() == ncols
                && x.rows() == m
                && ncols.is_multiple_of(16),
            "tiles_qw: [{m}, {cols}] @ {} words x {} columns into [{m}, {ncols}]",
            words.rows(),
            words.cols()
        );
        let groups = check_group_params(&params, m, cols, ncols);
        if m == 0 || ncols == 0 || cols == 0 {
            return;
        }
        let mut issued = 0;
        for c in (0..ncols).step_by(16) {
            for (i, mr) in row_tiles(m, TILE_QW_ROWS) {
                let args = TileQ {
                    x: x.ptr(i, 0),
                    ldx: x.ld(),
                    q: words.ptr(0, c),
                    ld: words.ld(),
                    s: params.scales.ptr(0, c),
                    b: params.biases.ptr(0, c),
                    ldp: params.scales.ld(),
                    xsum: params.xsum.ptr(i, 0),
                    ldxs: params.xsum.ld(),
                    groups,
                    group_size: params.group_size,
                    out: out.ptr(i, c),
                    ldo: out.ld(),
                    load,
                    ahead: ahead.first + 64 * issued,
                    ahead_lines: ahead.count - issued,
                };
                macro_rules! dispatch {
                    ($($mr:literal)*) => {
                        match (bits, mr) {
                            $((4, $mr) => tile_qw::<$mr, 4>(args),
                              (_, $mr) => tile_qw::<$mr, 8>(args),)*
                            _ => unreachable!("row_tiles keeps tiles within TILE_QW_ROWS"),
                        }
                    };
                }
                // SAFETY: AVX-512 present (`self`); the tile reads x rows i..i+mr (k < cols),
                // word, scale and bias columns c..c+16 for every word / group, xsum rows
                // i..i+mr, and reads/writes out rows i..i+mr, columns c..c+16: inside views
                // checked to fit their slices, whose shapes agree.
                issued += unsafe {
                    dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
                };
            }
        }
        prefetch_rest(ahead, issued);
    }
}

/// The lines of `ahead` past the first `issued`, prefetched at once (the tiles ended first).
fn prefetch_rest(ahead: Lines, issued: usize) {
    for l in issued..ahead.count {
        // SAFETY: SSE is baseline on x86-64; a prefetch never faults and reads nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((ahead.first + 64 * l) as *const i8) };
    }
}

/// Checks the group operands of a `tiles_q` / `tiles_qw` call on `m` rows of `cols` columns
/// into `ncols` outputs; the number of groups.
fn check_group_params(params: &GroupParams<'_>, m: usize, cols: usize, ncols: usize) -> usize {
    let GroupParams {
        scales,
        biases,
        xsum,
        group_size,
    } = params;
    assert!(
        *group_size > 0 && cols.is_multiple_of(*group_size),
        "tiles_q: {cols} columns in groups of {group_size}"
    );
    let groups = cols / group_size;
    assert!(
        scales.rows() == groups
            && biases.rows() == groups
            && scales.cols() == ncols
            && biases.cols() == ncols
            && scales.ld() == biases.ld()
            && xsum.rows() == m
            && xsum.cols() == groups,
        "tiles_q: group parameters do not match"
    );
    groups
}

/// Checks a transposition of `rows` source rows (`src = (len, stride, items per row)`, rows
/// `stride` apart) into `out`, whose lanes of each 16-row slab are written whole (so
/// `out.cols()` must reach `rows` rounded up to 16). `rows` and `out.rows()` are nonzero.
fn check_transposed(
    what: &str,
    (len, stride, per_row): (usize, usize, usize),
    rows: usize,
    out: &ViewMut<'_>,
) {
    assert!(
        per_row <= stride && len >= (rows - 1) * stride + per_row,
        "{what}: short source"
    );
    assert!(out.cols() >= rows.div_ceil(16) * 16, "{what}: short panel");
}

/// Sixteen (or `n < 16`, the rest zero) rows of `unpack_rows_t`.
///
/// # Safety
/// AVX-512F available; `BITS` is 4 or 8; `words` holds `n` rows of `wpr` words, `stride`
/// words apart; `out` is writable at `k * ld + lane` for `k < 32 / BITS * wpr`, `lane < 16`;
/// `NW` (words per block, fixed) only if `n == 16` and `wpr` is 8 (`NW = 8`) or a multiple of
/// 16 (`NW = 16`); 0 takes the counts at run time.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn unpack_slab<const BITS: u32, const NW: usize>(
    (words, stride, wpr, n, out, ld): (*const u32, usize, usize, usize, *mut f32, usize),
) {
    // SAFETY: the caller upholds this function's contract; loads are masked to the row's
    // words, stores stay in the described extent.
    unsafe {
        let per_word = 32 / BITS as usize;
        for w0 in (0..wpr).step_by(16) {
            let nw = if NW > 0 { NW } else { (wpr - w0).min(16) };
            let v = slab_words::<NW>(words.add(w0), stride, nw, n);
            // Panel row per_word * (w0 + w) + j: one step of `ld` per field, words in order.
            let mut col = out.add(w0 * per_word * ld);
            macro_rules! word {
                ($w:literal) => {
                    if $w < nw {
                        let v = v[$w];
                        macro_rules! field {
                            ($j:literal) => {
                                if $j < per_word {
                                    // (`% 32` keeps the never-taken fields' shifts in range.)
                                    let mask = (((1u32 << BITS) - 1) << ((BITS * $j) % 32)) as i32;
                                    _mm512_storeu_ps(
                                        col,
                                        _mm512_cvtepu32_ps(_mm512_and_si512(
                                            v,
                                            _mm512_set1_epi32(mask),
                                        )),
                                    );
                                    col = col.add(ld);
                                }
                            };
                        }
                        field!(0);
                        field!(1);
                        field!(2);
                        field!(3);
                        field!(4);
                        field!(5);
                        field!(6);
                        field!(7);
                    }
                };
            }
            word!(0);
            word!(1);
            word!(2);
            word!(3);
            word!(4);
            word!(5);
            word!(6);
            word!(7);
            word!(8);
            word!(9);
            word!(10);
            word!(11);
            word!(12);
            word!(13);
            word!(14);
            word!(15);
        }
    }
}

/// Words `0..nw` (`nw <= 16`) of sixteen rows `stride` apart (or `n < 16` rows, the rest
/// zero), transposed: lane `i` of `out[w]` is word `w` of row `i`. `NW` as for
/// [`unpack_slab`].
///
/// # Safety
/// AVX-512F available; `words` holds `n` rows of at least `nw` words, `stride` words apart.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn slab_words<const NW: usize>(
    words: *const u32,
    stride: usize,
    nw: usize,
    n: usize,
) -> [__m512i; 16] {
    // SAFETY: the caller upholds this function's contract; loads are masked to `nw` words.
    unsafe {
        let full = NW > 0;
        let wmask: __mmask16 = if nw == 16 { 0xFFFF } else { (1 << nw) - 1 };
        // Unrolled with literal indices (macros, not loops over a runtime count), so the 16
        // rows stay in registers.
        macro_rules! row {
            ($i:literal) => {
                if full || $i < n {
                    _mm512_maskz_loadu_epi32(wmask, words.add($i * stride) as *const i32)
                } else {
                    _mm512_setzero_si512()
                }
            };
        }
        transpose_16x16([
            row!(0),
            row!(1),
            row!(2),
            row!(3),
            row!(4),
            row!(5),
            row!(6),
            row!(7),
            row!(8),
            row!(9),
            row!(10),
            row!(11),
            row!(12),
            row!(13),
            row!(14),
            row!(15),
        ])
    }
}

/// Sixteen (or `n < 16`, the rest zero) rows of `transpose_words_t`.
///
/// # Safety
/// AVX-512F available; `words` holds `n` rows of `wpr` words, `stride` words apart; `out` is
/// writable at `w * ld + lane` for `w < wpr`, `lane < 16`; `NW` as for [`unpack_slab`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn transpose_slab<const NW: usize>(
    (words, stride, wpr, n, out, ld): (*const u32, usize, usize, usize, *mut f32, usize),
) {
    // SAFETY: the caller upholds this function's contract; stores stay in the extent.
    unsafe {
        for w0 in (0..wpr).step_by(16) {
            let nw = if NW > 0 { NW } else { (wpr - w0).min(16) };
            let v = slab_words::<NW>(words.add(w0), stride, nw, n);
            for (w, v) in v.iter().enumerate().take(nw) {
                _mm512_storeu_si512(out.add((w0 + w) * ld) as *mut __m512i, *v);
            }
        }
    }
}

/// One 16 x 16 block of `widen_t`: `n` rows, `ng` groups.
///
/// # Safety
/// AVX-512F/BW/VL available; `params` valid for `ng` values at `i * stride` for `i < n`;
/// `out` writable at `g * ld + lane` for `g < ng`, `lane < 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn params_block(
    params: *const bf16,
    stride: usize,
    n: usize,
    ng: usize,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: the caller upholds this function's contract; loads are masked to `ng` values.
    unsafe {
        let gmask: __mmask16 = if ng == 16 { 0xFFFF } else { (1 << ng) - 1 };
        let mut r = [_mm512_setzero_si512(); 16];
        for (i, r) in r.iter_mut().enumerate().take(n) {
            let h = _mm256_maskz_loadu_epi16(gmask, params.add(i * stride) as *const i16);
            // bf16 -> f32 is the 16 bits moved to the top.
            *r = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
        }
        let v = transpose_16x16(r);
        for (g, v) in v.iter().enumerate().take(ng) {
            _mm512_storeu_si512(out.add(g * ld) as *mut __m512i, *v);
        }
    }
}

/// Transposes 16 x 16 dwords: `out[w]` lane `i` = `r[i]` lane `w`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_16x16(r: [__m512i; 16]) -> [__m512i; 16] {
    {
        // Within 128-bit lanes: pairs of rows, then quadruples (t: a0 b0 a1 b1 .., u[4c + j]
        // holds in 128-bit lane L the dwords 4L + j of rows 4c..4c+3).
        let mut t = [_mm512_setzero_si512(); 16];
        for a in 0..8 {
            t[2 * a] = _mm512_unpacklo_epi32(r[2 * a], r[2 * a + 1]);
            t[2 * a + 1] = _mm512_unpackhi_epi32(r[2 * a], r[2 * a + 1]);
        }
        let mut u = [_mm512_setzero_si512(); 16];
        for c in 0..4 {
            let (t0, t1, t2, t3) = (t[4 * c], t[4 * c + 1], t[4 * c + 2], t[4 * c + 3]);
            u[4 * c] = _mm512_unpacklo_epi64(t0, t2);
            u[4 * c + 1] = _mm512_unpackhi_epi64(t0, t2);
            u[4 * c + 2] = _mm512_unpacklo_epi64(t1, t3);
            u[4 * c + 3] = _mm512_unpackhi_epi64(t1, t3);
        }
        // Across 128-bit lanes: word 4L + j gathers lane L of u[j], u[4 + j], u[8 + j],
        // u[12 + j].
        let mut out = [_mm512_setzero_si512(); 16];
        for j in 0..4 {
            let p = _mm512_shuffle_i32x4::<0b10_00_10_00>(u[j], u[4 + j]);
            let q = _mm512_shuffle_i32x4::<0b11_01_11_01>(u[j], u[4 + j]);
            let p2 = _mm512_shuffle_i32x4::<0b10_00_10_00>(u[8 + j], u[12 + j]);
            let q2 = _mm512_shuffle_i32x4::<0b11_01_11_01>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(p, p2);
            out[8 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(p, p2);
            out[4 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(q, q2);
            out[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(q, q2);
        }
        out
    }
}

/// Activation rows per register tile of `tiles_q`: 12 x 2 partial sums in registers, the
/// running sums in memory (one read and write per group): fewer loads per FMA than 6-row tiles
/// with both in registers (14 per 24 instead of 8 per 12), and the panel read twice instead of
/// three times at 16 rows, the experts' typical count (docs/PERFORMANCE.md).
const TILE_Q_ROWS: usize = 12;
/// `k` steps of a `tile_q` between two of its prefetches (`tiles_q`'s `ahead`). Bursts held
/// every line-fill buffer and stalled the loads behind them; other spacings measured alike
/// (docs/PERFORMANCE.md).
const PREFETCH_STEPS: usize = 4;

/// `(first row, height)` of the register tiles over `m` rows: as few as `max` rows each allows,
/// of nearly equal height (13 rows at most 6: 5, 4, 4, not 6, 6, 1), since a 1-row tile has two
/// fma chains, too few to hide the fma latency.
fn row_tiles(m: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = m.div_ceil(max);
    (0..tiles).scan(0, move |i, t| {
        let mr = (m - *i).div_ceil(tiles - t);
        *i += mr;
        Some((*i - mr, mr))
    })
}

/// Operands of one `tile_q` (pointers at the tile's first row / column).
struct TileQ {
    x: *const f32,
    ldx: usize,
    q: *const f32,
    ld: usize,
    s: *const f32,
    b: *const f32,
    ldp: usize,
    xsum: *const f32,
    ldxs: usize,
    groups: usize,
    group_size: usize,
    out: *mut f32,
    ldo: usize,
    load: bool,
    /// Address of the first cache line to prefetch (`tiles_q`'s `ahead`), and how many lines
    /// at most.
    ahead: usize,
    ahead_lines: usize,
}

/// One `MR x 32` tile of `tiles_q`: the group's partial sums in registers (2 per row), the
/// running sums in `out`, read and written once per group. Returns how many of the lines
/// `t.ahead` it prefetched.
///
/// # Safety
/// AVX-512F available; the pointers of `t` are valid for the reads and writes described in
/// `PanelKernel::tiles_q` for `MR` rows and 32 columns.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_q<const MR: usize>(t: TileQ) -> usize {
    // SAFETY: the caller upholds this function's contract.
    unsafe {
        // Prefetches issued so far, one every PREFETCH_STEPS steps.
        let mut pf = 0;
        for g in 0..t.groups {
            let mut p = [[_mm512_setzero_ps(); 2]; MR];
            for k in g * t.group_size..(g + 1) * t.group_size {
                if k.is_multiple_of(PREFETCH_STEPS) && pf < t.ahead_lines {
                    _mm_prefetch::<_MM_HINT_T0>((t.ahead + 64 * pf) as *const i8);
                    pf += 1;
                }
                let w0 = _mm512_loadu_ps(t.q.add(k * t.ld));
                let w1 = _mm512_loadu_ps(t.q.add(k * t.ld + 16));
                for (i, p) in p.iter_mut().enumerate() {
                    let xb = _mm512_set1_ps(*t.x.add(i * t.ldx + k));
                    p[0] = _mm512_fmadd_ps(xb, w0, p[0]);
                    p[1] = _mm512_fmadd_ps(xb, w1, p[1]);
                }
            }
            let s = [
                _mm512_loadu_ps(t.s.add(g * t.ldp)),
                _mm512_loadu_ps(t.s.add(g * t.ldp + 16)),
            ];
            let b = [
                _mm512_loadu_ps(t.b.add(g * t.ldp)),
                _mm512_loadu_ps(t.b.add(g * t.ldp + 16)),
            ];
            let first = g == 0 && !t.load;
            for (i, p) in p.iter().enumerate() {
                let xs = _mm512_set1_ps(*t.xsum.add(i * t.ldxs + g));
                let o = t.out.add(i * t.ldo);
                for v in 0..2 {
                    let acc = if first {
                        _mm512_setzero_ps()
                    } else {
                        _mm512_loadu_ps(o.add(16 * v))
                    };
                    let acc = _mm512_fmadd_ps(s[v], p[v], acc);
                    let acc = _mm512_fmadd_ps(b[v], xs, acc);
                    _mm512_storeu_ps(o.add(16 * v), acc);
                }
            }
        }
        pf
    }
}

/// Activation rows per register tile of `tiles_qw`: 24 x 1 partial sums in registers, so the
/// experts' typical 8-24 rows share each decoded vector in one tile.
const TILE_QW_ROWS: usize = 24;

/// One `MR x 16` tile of `tiles_qw` (`t.q` points at transposed words, `BITS` 4 or 8): the
/// group's partial sums in registers, the running sums in `out`, read and written once per
/// group. Returns how many of the lines `t.ahead` it prefetched (one per word).
///
/// # Safety
/// AVX-512F available; the pointers of `t` are valid for the reads and writes described in
/// `PanelKernel::tiles_qw` for `MR` rows and 16 columns.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_qw<const MR: usize, const BITS: u32>(t: TileQ) -> usize {
    // SAFETY: the caller upholds this function's contract.
    unsafe {
        let per_word = 32 / BITS as usize;
        let words_per_group = t.group_size / per_word;
        let mut pf = 0;
        for g in 0..t.groups {
            let mut p = [_mm512_setzero_ps(); MR];
            for w in g * words_per_group..(g + 1) * words_per_group {
                if pf < t.ahead_lines {
                    _mm_prefetch::<_MM_HINT_T0>((t.ahead + 64 * pf) as *const i8);
                    pf += 1;
                }
                let packed = _mm512_loadu_si512(t.q.add(w * t.ld) as *const __m512i);
                for j in 0..per_word {
                    // The field in place, as `unpack_slab` stores it.
                    let mask = (((1u32 << BITS) - 1) << (BITS as usize * j)) as i32;
                    let q = _mm512_cvtepu32_ps(_mm512_and_si512(packed, _mm512_set1_epi32(mask)));
                    let k = w * per_word + j;
                    for (i, p) in p.iter_mut().enumerate() {
                        *p = _mm512_fmadd_ps(_mm512_set1_ps(*t.x.add(i * t.ldx + k)), q, *p);
                    }
                }
            }
            let s = _mm512_loadu_ps(t.s.add(g * t.ldp));
            let b = _mm512_loadu_ps(t.b.add(g * t.ldp));
            let first = g == 0 && !t.load;
            for (i, p) in p.iter().enumerate() {
                let xs = _mm512_set1_ps(*t.xsum.add(i * t.ldxs + g));
                let o = t.out.add(i * t.ldo);
                let acc = if first {
                    _mm512_setzero_ps()
                } else {
                    _mm512_loadu_ps(o)
                };
                let acc = _mm512_fmadd_ps(s, *p, acc);
                _mm512_storeu_ps(o, _mm512_fmadd_ps(b, xs, acc));
            }
        }
        pf
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kernels::Scalar;

    /// The f32 rounding of `exp_shifted_avx512` against MLX's double one, on all 2^32 inputs
    /// (about a minute in release: `cargo test --release -p dg-quant -- --ignored
    /// exp_agrees`); `every_kernel_exps_as_the_scalar_one` covers the edges in every run.
    #[test]
    #[ignore]
    fn exp_agrees_on_every_f32() {
        let Some(k) = Avx512::new() else {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        };
        let chunk = 1u64 << 20;
        let mut xs = vec![0.0f32; chunk as usize];
        let mut got = xs.clone();
        for start in (0..1u64 << 32).step_by(chunk as usize) {
            for (i, x) in xs.iter_mut().enumerate() {
                *x = f32::from_bits((start + i as u64) as u32);
            }
            k.exp_shifted(&xs, 0.0, &mut got);
            for (x, g) in xs.iter().zip(&got) {
                let want = crate::mlx::exp(x - std::hint::black_box(0.0));
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "x = {x:e} ({:#x})",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn scaled_fields_match_scalar() {
        let Some(k) = Avx512::new() else {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        // Whole vectors and a tail; the 2-bit width takes the portable loop.
        for (bits, len) in [(4u32, 2816usize), (4, 72), (8, 704), (8, 20), (2, 48)] {
            let x: Vec<f32> = (0..len).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let (mut got, mut want) = (vec![f32::NAN; len], vec![f32::NAN; len]);
            k.scale_fields(&x, bits, &mut got);
            Scalar.scale_fields(&x, bits, &mut want);
            let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits_of(&got), bits_of(&want), "{bits} bits, {len} values");
        }
    }

    #[test]
    fn unpack_and_params_match_scalar() {
        let Some(k) = Avx512::new() else {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(22);
        let ld = 48;
        // Row counts around the 16-row slabs; 704 columns = 88 words (a 16-word block tail);
        // 256 4-bit / 128 8-bit columns = 32 words (whole blocks: the branch-free slabs).
        for rows in [1usize, 15, 16, 17, 33] {
            for (bits, cols) in [
                (4, 8usize),
                (4, 64),
                (4, 136),
                (4, 256),
                (4, 704),
                (8, 4),
                (8, 68),
                (8, 128),
                (8, 352),
            ] {
                let stride = cols * bits as usize / 32 + 3;
                let words: Vec<u32> = (0..rows * stride).map(|_| rng.gen()).collect();
                let mut got = vec![f32::NAN; cols * ld];
                let mut want = got.clone();
                k.unpack_rows_t(
                    &words,
                    stride,
                    bits,
                    rows,
                    ViewMut::new(&mut got, cols, ld, ld),
                );
                Scalar.unpack_rows_t(
                    &words,
                    stride,
                    bits,
                    rows,
                    ViewMut::new(&mut want, cols, ld, ld),
                );
                for c in 0..cols {
                    for i in 0..rows.div_ceil(16) * 16 {
                        let g = got[c * ld + i];
                        if i < rows {
                            assert_eq!(
                                g.to_bits(),
                                want[c * ld + i].to_bits(),
                                "{bits}b {rows}x{cols}"
                            );
                        } else {
                            assert_eq!(g, 0.0, "{rows}x{cols}: padding lane {i}");
                        }
                    }
                }
            }
            for groups in [1usize, 11, 16, 44] {
                let stride = groups + 2;
                let params: Vec<bf16> = (0..rows * stride)
                    .map(|_| bf16::from_f32(rng.gen_range(-1.0..1.0)))
                    .collect();
                let mut got = vec![f32::NAN; groups * ld];
                let mut want = got.clone();
                k.widen_t(
                    &params,
                    stride,
                    rows,
                    ViewMut::new(&mut got, groups, ld, ld),
                );
                Scalar.widen_t(
                    &params,
                    stride,
                    rows,
                    ViewMut::new(&mut want, groups, ld, ld),
                );
                for g in 0..groups {
                    for i in 0..rows.div_ceil(16) * 16 {
                        let v = got[g * ld + i];
                        if i < rows {
                            assert_eq!(v.to_bits(), want[g * ld + i].to_bits(), "{rows}x{groups}");
                        } else {
                            assert_eq!(v, 0.0, "{rows}x{groups}: padding lane {i}");
                        }
                    }
                }
            }
        }
    }

    /// The transposed words decoded in the tiles give the bits of the unpacked panel's tiles,
    /// on both kernels, for every tile height and a second and third tile.
    #[test]
    fn word_tiles_match_unpacked_tiles() {
        let Some(k) = Avx512::new() else {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(24);
        for (bits, cols, group_size) in [(4u32, 128usize, 64usize), (4, 256, 32), (8, 128, 64)] {
            let (groups, per_word) = (cols / group_size, 32 / bits as usize);
            let wpr = cols / per_word;
            for (rows, ncols) in [(16usize, 16usize), (23, 32), (32, 32)] {
                let stride = wpr + 3;
                let words: Vec<u32> = (0..rows * stride).map(|_| rng.gen()).collect();
                let ld = ncols + 16;
                let mut q = vec![0.0f32; cols * ld];
                Scalar.unpack_rows_t(
                    &words,
                    stride,
                    bits,
                    rows,
                    ViewMut::new(&mut q, cols, ncols, ld),
                );
                let (mut tw, mut tw_scalar) = (vec![f32::NAN; wpr * ld], vec![0.0f32; wpr * ld]);
                k.transpose_words_t(&words, stride, rows, ViewMut::new(&mut tw, wpr, ncols, ld));
                let panel = ViewMut::new(&mut tw_scalar, wpr, ncols, ld);
                Scalar.transpose_words_t(&words, stride, rows, panel);
                for w in 0..wpr {
                    for i in 0..ncols {
                        let want = if i < rows {
                            tw_scalar[w * ld + i].to_bits()
                        } else {
                            0
                        };
                        assert_eq!(tw[w * ld + i].to_bits(), want, "{bits}b word {w} lane {i}");
                    }
                }
                let sc: Vec<f32> = (0..groups * ld).map(|_| rng.gen_range(-0.1..0.1)).collect();
                let bi: Vec<f32> = (0..groups * ld).map(|_| rng.gen_range(-1.0..1.0)).collect();
                for m in 1usize..=50 {
                    let ldx = cols + 5;
                    let x: Vec<f32> = (0..m * ldx).map(|_| rng.gen_range(-2.0..2.0)).collect();
                    let xsum: Vec<f32> =
                        (0..m * groups).map(|_| rng.gen_range(-9.0..9.0)).collect();
                    let params = GroupParams {
                        scales: View::new(&sc, groups, ncols, ld),
                        biases: View::new(&bi, groups, ncols, ld),
                        xsum: View::new(&xsum, m, groups, groups),
                        group_size,
                    };
                    let xv = View::new(&x, m, cols, ldx);
                    let (qv, wv) = (
                        View::new(&q, cols, ncols, ld),
                        View::new(&tw, wpr, ncols, ld),
                    );
                    for load in [false, true] {
                        let start: Vec<f32> =
                            (0..m * ncols).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        let ahead = Lines::of(&q[..64]);
                        let mut want = start.clone();
                        let out = ViewMut::new(&mut want, m, ncols, ncols);
                        Scalar.tiles_q(xv, qv, params, out, load, ahead);
                        let (mut got, mut twin) = (start.clone(), start);
                        let out = ViewMut::new(&mut got, m, ncols, ncols);
                        k.tiles_qw(xv, wv, bits, params, out, load, ahead);
                        let out = ViewMut::new(&mut twin, m, ncols, ncols);
                        Scalar.tiles_qw(xv, wv, bits, params, out, load, ahead);
                        for (name, got) in [("avx-512", got), ("scalar", twin)] {
                            assert!(
                                got.iter()
                                    .zip(&want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{name}: {bits}b g{group_size} {rows} rows m {m} load {load}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_q_match_scalar() {
        let Some(k) = Avx512::new() else {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        for (cols, group_size) in [(64usize, 64usize), (128, 32), (256, 128)] {
            let groups = cols / group_size;
            for ncols in [32usize, 64] {
                let (ld, ldx, ldo, ldxs) = (ncols + 16, cols + 5, ncols + 3, groups + 1);
                let q: Vec<f32> = (0..cols * ld)
                    .map(|_| rng.gen_range(0..16) as f32)
                    .collect();
                let sc: Vec<f32> = (0..groups * ld).map(|_| rng.gen_range(-0.1..0.1)).collect();
                let bi: Vec<f32> = (0..groups * ld).map(|_| rng.gen_range(-1.0..1.0)).collect();
                // 1..=25 rows: every tile height, two tiles and three.
                for m in 1usize..=25 {
                    let x: Vec<f32> = (0..m * ldx).map(|_| rng.gen_range(-2.0..2.0)).collect();
                    let xsum: Vec<f32> = (0..m * ldxs).map(|_| rng.gen_range(-9.0..9.0)).collect();
                    let params = GroupParams {
                        scales: View::new(&sc, groups, ncols, ld),
                        biases: View::new(&bi, groups, ncols, ld),
                        xsum: View::new(&xsum, m, groups, ldxs),
                        group_size,
                    };
                    let (xv, qv) = (View::new(&x, m, cols, ldx), View::new(&q, cols, ncols, ld));
                    for load in [false, true] {
                        let start: Vec<f32> =
                            (0..m * ldo).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        let (mut got, mut want) = (start.clone(), start);
                        // `ahead` is only a hint: any lines, here part of the panel.
                        let ahead = Lines::of(&q[..m * 40]);
                        let out = ViewMut::new(&mut got, m, ncols, ldo);
                        k.tiles_q(xv, qv, params, out, load, ahead);
                        let out = ViewMut::new(&mut want, m, ncols, ldo);
                        Scalar.tiles_q(xv, qv, params, out, load, ahead);
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "cols {cols} g{group_size} ncols {ncols} m {m} load {load}"
                        );
                    }
                }
            }
        }
    }
}
