//! Kernel dispatch: the SIMD body when the CPU has it (checked at run time), else the
//! portable scalar reference. Callers pass validated slices.

use half::bf16;

use crate::QuantSpec;

pub mod gemm;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64_avx512;

/// The widest SIMD the kernels use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Portable kernels (`scalar.rs`).
    Scalar,
    /// AVX2 + FMA (`x86_64.rs`).
    Avx2,
    /// AVX-512F/BW/VL for the unpacked panels of 4- and 8-bit weights and their register
    /// tiles, and the tiles of `x @ W` (`x86_64_avx512.rs`), AVX2 elsewhere.
    Avx512,
}

/// The kernel level: the best the CPU has, capped by two debugging and testing switches:
/// `DG_QUANT_FORCE_SCALAR=1` runs every kernel on the portable path,
/// `DG_QUANT_FORCE_AVX2=1` keeps AVX-512 off (e.g. `DG_QUANT_FORCE_AVX2=1 cargo test -p
/// dg-quant`).
#[inline]
pub fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty() && s != "0");
        #[cfg(target_arch = "x86_64")]
        {
            if set("DG_QUANT_FORCE_SCALAR") || !x86_64::available() {
                Level::Scalar
            } else if set("DG_QUANT_FORCE_AVX2") || !x86_64_avx512::available() {
                Level::Avx2
            } else {
                Level::Avx512
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = set;
            Level::Scalar
        }
    })
}

/// Whether the AVX2 + FMA kernels (or wider) run.
#[inline]
pub fn has_avx2_fma() -> bool {
    level() >= Level::Avx2
}

/// One dequantized row (bit-identical on every path).
#[inline]
pub fn dequant_row(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(spec.bits, 2 | 4 | 8) && has_avx2_fma() {
        return x86_64::dequant_row(words, scales, biases, spec.bits, spec.group_size, out);
    }
    scalar::dequant_row(words, scales, biases, spec, out)
}

/// The FMA-throughput probe at the widest level this CPU runs: `(smallest lane, FLOPs done)`.
pub fn fma_probe(rounds: usize) -> (f32, u64) {
    let chains = (rounds * scalar::PROBE_CHAINS * 2) as u64;
    #[cfg(target_arch = "x86_64")]
    match level() {
        Level::Avx512 => return (x86_64_avx512::fma_probe(rounds), chains * 16),
        Level::Avx2 => return (x86_64::fma_probe(rounds), chains * 8),
        Level::Scalar => {}
    }
    (scalar::fma_probe(rounds), chains * 8)
}

/// Whether the unpacked-panel kernels (`unpack_rows_t`, `tiles_q`) run in SIMD for weights of
/// this spec (AVX-512, 4- or 8-bit); `matmul` routes to them only then.
pub fn unpacked_panels(spec: QuantSpec) -> bool {
    cfg!(target_arch = "x86_64") && matches!(spec.bits, 4 | 8) && level() == Level::Avx512
}

/// See `scalar::unpack_rows_t` (bit-identical on every path; SIMD lanes past `rows`, up to
/// the next multiple of 16, are written with zeros, so `ld` must allow them).
#[inline]
pub fn unpack_rows_t(
    words: &[u32],
    stride: usize,
    spec: QuantSpec,
    rows: usize,
    cols: usize,
    out: &mut [f32],
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if unpacked_panels(spec) {
        return x86_64_avx512::unpack_rows_t(words, stride, spec.bits, rows, cols, out, ld);
    }
    scalar::unpack_rows_t(words, stride, spec.bits, rows, cols, out, ld)
}

/// See `scalar::params_t` (bit-identical on every path; SIMD lanes past `rows`, up to the
/// next multiple of 16, are written with zeros, so `ld` must allow them).
#[inline]
pub fn params_t(
    params: &[bf16],
    stride: usize,
    rows: usize,
    groups: usize,
    out: &mut [f32],
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        return x86_64_avx512::params_t(params, stride, rows, groups, out, ld);
    }
    scalar::params_t(params, stride, rows, groups, out, ld)
}

/// Per-group operands of `tiles_q`: the panel's scales and biases `[groups, ld]` (f32) and
/// the activations' group sums `[m, ldxs]`.
#[derive(Clone, Copy)]
pub struct GroupParams<'a> {
    pub scales: &'a [f32],
    pub biases: &'a [f32],
    pub xsum: &'a [f32],
    pub ldxs: usize,
}

/// The cache lines a slice spans, as addresses: what a kernel may prefetch (a hint; no
/// memory is read through it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Lines {
    /// Address of the first line (64-byte aligned).
    pub first: usize,
    /// Number of lines.
    pub count: usize,
}

impl Lines {
    /// Every line `data` touches.
    pub fn of<T>(data: &[T]) -> Self {
        let range = data.as_ptr_range();
        let first = range.start as usize & !63;
        Lines {
            first,
            count: (range.end as usize).saturating_sub(first).div_ceil(64),
        }
    }
}

/// See `scalar::tiles_q` (bit-identical on every path; `ncols` a multiple of 32). The SIMD
/// path also pulls the lines `ahead` (e.g. part of the next panel) toward the cache, one at a
/// time spread over the tiles' steps: a hint that does not change the results.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tiles_q(
    cols: usize,
    group_size: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    q: &[f32],
    ld: usize,
    ncols: usize,
    params: GroupParams<'_>,
    out: &mut [f32],
    ldo: usize,
    load: bool,
    ahead: Lines,
) {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        return x86_64_avx512::tiles_q(
            cols, group_size, x, ldx, m, q, ld, ncols, params, out, ldo, load, ahead,
        );
    }
    let _ = ahead;
    scalar::tiles_q(
        cols, group_size, x, ldx, m, q, ld, ncols, params, out, ldo, load,
    )
}

/// See `scalar::tiles` (bit-identical on every path).
#[allow(clippy::too_many_arguments)]
#[inline]
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
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::tiles(kc, xt, ldx, m8, w, ldw, nr, ct, ldc, load);
    }
    scalar::tiles(kc, xt, ldx, m8, w, ldw, nr, ct, ldc, load)
}

/// See `scalar::tiles_n` (bit-identical on every path; `ncols` a multiple of 16).
#[allow(clippy::too_many_arguments)]
#[inline]
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
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 && ncols.is_multiple_of(32) {
        return x86_64_avx512::tiles_n(kc, x, ldx, m, w, ldw, ncols, p, ldp, load);
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::tiles_n(kc, x, ldx, m, w, ldw, ncols, p, ldp, load);
    }
    scalar::tiles_n(kc, x, ldx, m, w, ldw, ncols, p, ldp, load)
}

/// The shared prologue of the SIMD `tiles_n` kernels (`strip` = their column width): checks
/// the layout and extents, settles the cases with nothing to multiply (zeroing `p` when `kc`
/// is 0 and not `load`), and returns whether the tiles still have to run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tiles_n_prologue(
    what: &str,
    strip: usize,
    (kc, x, ldx, m): (usize, &[f32], usize, usize),
    (w, ldw, ncols): (&[f32], usize, usize),
    p: &mut [f32],
    ldp: usize,
    load: bool,
) -> bool {
    assert!(
        ncols.is_multiple_of(strip) && kc <= ldx && ncols <= ldw && ncols <= ldp,
        "{what}: bad layout"
    );
    if m == 0 || ncols == 0 {
        return false;
    }
    assert!((m - 1) * ldp + ncols <= p.len(), "{what}: p too short");
    if kc == 0 {
        if !load {
            for i in 0..m {
                p[i * ldp..i * ldp + ncols].fill(0.0);
            }
        }
        return false;
    }
    assert!((m - 1) * ldx + kc <= x.len(), "{what}: x too short");
    assert!((kc - 1) * ldw + ncols <= w.len(), "{what}: w too short");
    true
}

/// `y[i] = fma(a, x[i], y[i])` (bit-identical on every path; `x` and `y` of equal length).
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::axpy(a, x, y);
    }
    scalar::axpy(a, x, y)
}

/// Prefetch hint for data needed soon (no-op off x86-64).
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86_64::prefetch(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}
