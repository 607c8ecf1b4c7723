//! AVX-512 kernels (x86-64): the unpacked panels of 4- and 8-bit weights (`unpack_rows_t`,
//! `params_t`) with their register tiles (`tiles_q`), which the matmul runs for `x @ W^T` at
//! every activation row count, and the register tiles of `x @ W` (`tiles_n`). Each `pub fn`
//! is safe: it checks the CPU features and the slice lengths it relies on, then calls a
//! `#[target_feature]` body. Twins in `scalar.rs`; tests at the bottom compare them bit for
//! bit.
//!
//! Panel layout: 64 bytes of each of sixteen weight rows are transposed in registers, and the
//! j-th field of every dword (nibble, or byte at 8 bits) is masked in place (`vpandd`) and
//! converted as unsigned (`vcvtudq2ps`), which reads `q * 2^(bits * j)` exactly (one op fewer
//! per field than shifting it down). The activations come scaled by `2^-(bits * j)`
//! (`scalar::scale_fields`), so each FMA of the tiles multiplies exactly `x * q`.

use std::arch::x86_64::*;

use half::bf16;

/// Whether this module's kernels may run (detected once: every kernel call checks it, and
/// the five feature tests showed in profiles of the per-chunk tiles).
#[inline]
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && super::x86_64::available()
    })
}

/// `scalar::unpack_rows_t` for 4- and 8-bit weights (bit-identical), sixteen rows at a time: 64
/// bytes of each row are transposed in registers (16 x 16 dwords), so each mask + unsigned
/// convert of a word vector (the field read in place, no shift) yields one `k` of the panel for
/// all sixteen rows. Panel lanes of the rows past `rows`, up to the next multiple of 16, are
/// written with zeros: `ld` must allow them.
///
/// Measured on Emerald Rapids (32 rows x 128 4-bit columns from L1, best of 40 runs, cycles):
/// shift + mask + convert 860 into an unaligned panel, 720 into a 64-byte aligned one (a store
/// that straddles two lines costs two); in place 630; with the branch-free whole slabs 441
/// (8-bit: 735 -> ~570); a 64-column 4-bit chunk (the tail of a 704-column row) 411 -> 231
/// with its own fixed-count body. The register tiles over a 128-column chunk at 16 rows take
/// ~2200.
pub fn unpack_rows_t(
    words: &[u32],
    stride: usize,
    bits: u32,
    rows: usize,
    cols: usize,
    out: &mut [f32],
    ld: usize,
) {
    assert!(
        available() && matches!(bits, 4 | 8) && cols.is_multiple_of(32 / bits as usize),
        "x86_64_avx512::unpack_rows_t: unsupported"
    );
    let wpr = cols * bits as usize / 32;
    if rows == 0 || cols == 0 {
        return;
    }
    let src = (words.len(), stride, wpr);
    check_transposed(
        "x86_64_avx512::unpack_rows_t",
        src,
        rows,
        out.len(),
        cols,
        ld,
    );
    for i0 in (0..rows).step_by(16) {
        // SAFETY: features checked above; rows i0..i0+n hold wpr words each at `stride`
        // (checked length); the panel holds (k, i0 + lane) for k < cols, lane < 16 (checked
        // extent).
        unsafe {
            let args = (
                words.as_ptr().add(i0 * stride),
                stride,
                wpr,
                (rows - i0).min(16),
                out.as_mut_ptr().add(i0),
                ld,
            );
            // Whole slabs of whole 16-word blocks (the common case), or of one 8-word block (a
            // 64-column 4-bit chunk), take a branch-free body.
            let nw = match (args.3, wpr) {
                (16, 8) => 8,
                (16, w) if w.is_multiple_of(16) => 16,
                _ => 0,
            };
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

/// Sixteen (or `n < 16`, the rest zero) rows of `unpack_rows_t`.
///
/// # Safety
/// AVX-512F available; `BITS` is 4 or 8; `words` holds `n` rows of `wpr` words, `stride`
/// words apart; `out` is writable at `k * ld + lane` for `k < 32 / BITS * wpr`, `lane < 16`;
/// `NW` (words per block, fixed) only if `n == 16` and `wpr` is 8 (`NW = 8`) or a multiple of
/// 16 (`NW = 16`); 0 takes the counts at run time.
#[allow(unused_unsafe)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn unpack_slab<const BITS: u32, const NW: usize>(
    (words, stride, wpr, n, out, ld): (*const u32, usize, usize, usize, *mut f32, usize),
) {
    // SAFETY: the caller upholds this function's contract; loads are masked to the row's
    // words, stores stay in the described extent.
    unsafe {
        let per_word = 32 / BITS as usize;
        for w0 in (0..wpr).step_by(16) {
            let full = NW > 0;
            let nw = if full { NW } else { (wpr - w0).min(16) };
            let wmask: __mmask16 = if nw == 16 { 0xFFFF } else { (1 << nw) - 1 };
            // Unrolled with literal indices (macros, not loops over a runtime count), so the
            // 16 rows and the 16 transposed words stay in registers.
            macro_rules! row {
                ($i:literal) => {
                    if full || $i < n {
                        _mm512_maskz_loadu_epi32(wmask, words.add($i * stride + w0) as *const i32)
                    } else {
                        _mm512_setzero_si512()
                    }
                };
            }
            let v = transpose_16x16([
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
            ]);
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

/// `scalar::params_t` (bit-identical): sixteen rows' bf16 parameters at a time, widened to f32
/// and transposed in registers. Lanes past `rows`, up to the next multiple of 16, are written
/// with zeros: `ld` must allow them.
pub fn params_t(
    params: &[bf16],
    stride: usize,
    rows: usize,
    groups: usize,
    out: &mut [f32],
    ld: usize,
) {
    assert!(available(), "x86_64_avx512::params_t: unsupported");
    if rows == 0 || groups == 0 {
        return;
    }
    let src = (params.len(), stride, groups);
    check_transposed("x86_64_avx512::params_t", src, rows, out.len(), groups, ld);
    for i0 in (0..rows).step_by(16) {
        let n = (rows - i0).min(16);
        for g0 in (0..groups).step_by(16) {
            let ng = (groups - g0).min(16);
            // SAFETY: features checked above; row i0 + i (i < n) holds `groups` values at
            // `(i0 + i) * stride` (checked length), of which the mask reads g0..g0+ng; the
            // table holds (g, i0 + lane) for g < groups, lane < 16 (checked extent).
            unsafe {
                params_block(
                    params.as_ptr().add(i0 * stride + g0),
                    stride,
                    n,
                    ng,
                    out.as_mut_ptr().add(g0 * ld + i0),
                    ld,
                )
            }
        }
    }
}

/// One 16 x 16 block of `params_t`: `n` rows, `ng` groups.
///
/// # Safety
/// AVX-512F/BW/VL available; `params` valid for `ng` values at `i * stride` for `i < n`;
/// `out` writable at `g * ld + lane` for `g < ng`, `lane < 16`.
#[allow(unused_unsafe)]
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

/// Checks a transposition of `rows` source rows (`src = (len, stride, items per row)`, rows
/// `stride` apart) into `out_rows` panel rows of `ld` lanes, where the lanes of each 16-row
/// slab are written whole (`ld` >= rows rounded up to 16). Both counts must be nonzero.
fn check_transposed(
    what: &str,
    (len, stride, per_row): (usize, usize, usize),
    rows: usize,
    out_len: usize,
    out_rows: usize,
    ld: usize,
) {
    assert!(
        per_row <= stride && len >= (rows - 1) * stride + per_row,
        "{what}: short source"
    );
    let lanes = rows.div_ceil(16) * 16;
    assert!(
        ld >= lanes && out_len >= (out_rows - 1) * ld + lanes,
        "{what}: short panel"
    );
}

/// Transposes 16 x 16 dwords: `out[w]` lane `i` = `r[i]` lane `w`.
#[inline]
#[allow(unused_unsafe)]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_16x16(r: [__m512i; 16]) -> [__m512i; 16] {
    // SAFETY: register-only intrinsics; the caller guarantees AVX-512F.
    unsafe {
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
/// running sums in memory (one read and write per group). Against 6-row tiles with both in
/// registers, bit-identical and 1-7% faster (median of paired runs on Emerald Rapids: fewer
/// loads per FMA, 14 per 24 instead of 8 per 12, and the panel read twice instead of three
/// times at 16 rows, the experts' typical count).
const TILE_Q_ROWS: usize = 12;
/// Activation rows per register tile of `tiles_n` (6 x 2 accumulators).
const TILE_N_ROWS: usize = 6;

/// `scalar::tiles_q` (bit-identical) in 12-row x 32-column register tiles (`row_tiles`): per
/// `k`, two panel vectors against twelve broadcast activations; per group, the scales and the
/// bias term into the running sums in `out`.
/// `ncols` must be a multiple of 32.
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
    ahead: super::Lines,
) {
    assert!(
        available()
            && group_size > 0
            && cols.is_multiple_of(group_size)
            && ncols.is_multiple_of(32)
            && ncols <= ld
            && ncols <= ldo
            && cols <= ldx,
        "x86_64_avx512::tiles_q: bad layout"
    );
    if m == 0 || ncols == 0 || cols == 0 {
        return;
    }
    let groups = cols / group_size;
    let super::GroupParams {
        scales,
        biases,
        xsum,
        ldxs,
    } = params;
    assert!(
        (m - 1) * ldx + cols <= x.len()
            && (cols - 1) * ld + ncols <= q.len()
            && (groups - 1) * ld + ncols <= scales.len().min(biases.len())
            && groups <= ldxs
            && (m - 1) * ldxs + groups <= xsum.len()
            && (m - 1) * ldo + ncols <= out.len(),
        "x86_64_avx512::tiles_q: short operand"
    );
    // The lines `ahead`: the tiles take them in turn, one every PREFETCH_STEPS steps, and
    // the rest (if the tiles end first) go at the end.
    let mut issued = 0;
    for c in (0..ncols).step_by(32) {
        for (i, mr) in row_tiles(m, TILE_Q_ROWS) {
            let args = TileQ {
                x: x[i * ldx..].as_ptr(),
                ldx,
                q: q[c..].as_ptr(),
                ld,
                s: scales[c..].as_ptr(),
                b: biases[c..].as_ptr(),
                xsum: xsum[i * ldxs..].as_ptr(),
                ldxs,
                groups,
                group_size,
                out: out[i * ldo + c..].as_mut_ptr(),
                ldo,
                load,
                ahead: ahead.first + 64 * issued,
                ahead_lines: ahead.count - issued,
            };
            // SAFETY: features checked; the tile reads x rows i..i+mr (k < cols), panel,
            // scale and bias columns c..c+32 for every k / group, xsum rows i..i+mr (groups
            // entries each), and reads/writes out rows i..i+mr, columns c..c+32: inside the
            // asserted extents.
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
    for l in issued..ahead.count {
        // SAFETY: SSE is baseline on x86-64; a prefetch never faults and reads nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((ahead.first + 64 * l) as *const i8) };
    }
}

/// `k` steps of a `tile_q` between two of its prefetches (`tiles_q`'s `ahead`). Bursts held
/// every line-fill buffer and stalled the loads behind them; one line every 2, 4 or 8 steps,
/// or spread evenly over the tiles, measured alike (paired runs, +-1%).
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
/// `tiles_q` for `MR` rows and 32 columns.
#[inline]
#[allow(unused_unsafe)]
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
                _mm512_loadu_ps(t.s.add(g * t.ld)),
                _mm512_loadu_ps(t.s.add(g * t.ld + 16)),
            ];
            let b = [
                _mm512_loadu_ps(t.b.add(g * t.ld)),
                _mm512_loadu_ps(t.b.add(g * t.ld + 16)),
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

/// `scalar::tiles_n` (bit-identical) in 6-row x 32-column register tiles (`row_tiles`);
/// `ncols` must be a multiple of 32.
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
    assert!(available(), "x86_64_avx512::tiles_n: unsupported");
    let (xs, ws) = ((kc, x, ldx, m), (w, ldw, ncols));
    if !super::tiles_n_prologue("x86_64_avx512::tiles_n", 32, xs, ws, p, ldp, load) {
        return;
    }
    for c in (0..ncols).step_by(32) {
        for (i, mr) in row_tiles(m, TILE_N_ROWS) {
            let args = (
                kc,
                x[i * ldx..].as_ptr(),
                ldx,
                w[c..].as_ptr(),
                ldw,
                p[i * ldp + c..].as_mut_ptr(),
                ldp,
                load,
            );
            // SAFETY: features checked; the tile reads x[(i + r) * ldx + k] (r < mr, k < kc),
            // w[k * ldw + c .. + 32] and reads/writes p[(i + r) * ldp + c .. + 32]: inside the
            // asserted extents (i + mr <= m, c + 32 <= ncols).
            unsafe {
                match mr {
                    6 => tile_n::<6>(args),
                    5 => tile_n::<5>(args),
                    4 => tile_n::<4>(args),
                    3 => tile_n::<3>(args),
                    2 => tile_n::<2>(args),
                    _ => tile_n::<1>(args),
                }
            }
        }
    }
}

/// One `MR x 32` tile of `tiles_n`: `(kc, x, ldx, w, ldw, p, ldp, load)`.
///
/// # Safety
/// AVX-512F available; `x` valid for reads of `x[r * ldx + k]` (r < MR, k < kc), `w` of
/// `w[k * ldw .. + 32]` (k < kc), `p` for reads/writes of `p[r * ldp .. + 32]` (r < MR).
#[inline]
#[allow(unused_unsafe, clippy::type_complexity)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_n<const MR: usize>(
    (kc, x, ldx, w, ldw, p, ldp, load): (
        usize,
        *const f32,
        usize,
        *const f32,
        usize,
        *mut f32,
        usize,
        bool,
    ),
) {
    // SAFETY: the caller upholds this function's contract.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if load {
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_loadu_ps(p.add(r * ldp));
                a[1] = _mm512_loadu_ps(p.add(r * ldp + 16));
            }
        }
        for k in 0..kc {
            let w0 = _mm512_loadu_ps(w.add(k * ldw));
            let w1 = _mm512_loadu_ps(w.add(k * ldw + 16));
            for (r, a) in acc.iter_mut().enumerate() {
                let xb = _mm512_set1_ps(*x.add(r * ldx + k));
                a[0] = _mm512_fmadd_ps(xb, w0, a[0]);
                a[1] = _mm512_fmadd_ps(xb, w1, a[1]);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(p.add(r * ldp), a[0]);
            _mm512_storeu_ps(p.add(r * ldp + 16), a[1]);
        }
    }
}

/// `scalar::fma_probe` in 16-lane AVX-512 registers: `PROBE_CHAINS` independent FMA chains,
/// `rounds` steps each; returns the smallest lane (every lane holds `scalar::fma_chain(rounds)`).
pub fn fma_probe(rounds: usize) -> f32 {
    assert!(available(), "x86_64_avx512::fma_probe: unsupported");
    // SAFETY: features checked; the body touches only registers and a local array.
    unsafe { fma_probe_body(rounds) }
}

#[allow(unused_unsafe)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fma_probe_body(rounds: usize) -> f32 {
    use super::scalar::{PROBE_C, PROBE_CHAINS, PROBE_M};
    // SAFETY: the caller upholds this function's contract (features present).
    unsafe {
        let (m, c) = (_mm512_set1_ps(PROBE_M), _mm512_set1_ps(PROBE_C));
        let mut a = [_mm512_set1_ps(1.0); PROBE_CHAINS];
        for _ in 0..rounds {
            for a in &mut a {
                *a = _mm512_fmadd_ps(*a, m, c);
            }
        }
        let mut lanes = [0.0f32; PROBE_CHAINS * 16];
        for (a, out) in a.iter().zip(lanes.chunks_exact_mut(16)) {
            _mm512_storeu_ps(out.as_mut_ptr(), *a);
        }
        lanes.iter().fold(f32::INFINITY, |m, &v| m.min(v))
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kernels::scalar;

    #[test]
    fn unpack_and_params_match_scalar() {
        if !available() {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        }
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
                unpack_rows_t(&words, stride, bits, rows, cols, &mut got, ld);
                scalar::unpack_rows_t(&words, stride, bits, rows, cols, &mut want, ld);
                for k in 0..cols {
                    for i in 0..rows.div_ceil(16) * 16 {
                        let g = got[k * ld + i];
                        if i < rows {
                            assert_eq!(
                                g.to_bits(),
                                want[k * ld + i].to_bits(),
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
                params_t(&params, stride, rows, groups, &mut got, ld);
                scalar::params_t(&params, stride, rows, groups, &mut want, ld);
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

    #[test]
    fn tiles_q_match_scalar() {
        if !available() {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        }
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
                    let params = crate::kernels::GroupParams {
                        scales: &sc,
                        biases: &bi,
                        xsum: &xsum,
                        ldxs,
                    };
                    for load in [false, true] {
                        let start: Vec<f32> =
                            (0..m * ldo).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        let (mut got, mut want) = (start.clone(), start);
                        // `ahead` is only a hint: any lines, here part of the panel.
                        let ahead = crate::kernels::Lines::of(&q[..m * 40]);
                        tiles_q(
                            cols, group_size, &x, ldx, m, &q, ld, ncols, params, &mut got, ldo,
                            load, ahead,
                        );
                        scalar::tiles_q(
                            cols, group_size, &x, ldx, m, &q, ld, ncols, params, &mut want, ldo,
                            load,
                        );
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

    #[test]
    fn tiles_n_match_scalar() {
        if !available() {
            eprintln!("skipped: no AVX-512F/BW/VL");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(24);
        for (kc, ncols) in [(1usize, 32usize), (37, 64), (256, 96)] {
            let (ldx, ldw, ldp) = (kc + 3, ncols + 16, ncols + 5);
            let w: Vec<f32> = (0..kc * ldw).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for m in 1usize..=13 {
                let x: Vec<f32> = (0..m * ldx).map(|_| rng.gen_range(-2.0..2.0)).collect();
                for load in [false, true] {
                    let start: Vec<f32> = (0..m * ldp).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    let (mut got, mut want) = (start.clone(), start);
                    tiles_n(kc, &x, ldx, m, &w, ldw, ncols, &mut got, ldp, load);
                    scalar::tiles_n(kc, &x, ldx, m, &w, ldw, ncols, &mut want, ldp, load);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "kc {kc} ncols {ncols} m {m} load {load}"
                    );
                }
            }
        }
    }
}
