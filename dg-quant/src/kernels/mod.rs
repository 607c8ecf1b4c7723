//! The CPU kernels, as objects: one type per instruction-set level ([`Scalar`], `Avx2Fma`,
//! `Avx512`), each constructible only where the CPU has its features, so its SIMD methods are
//! safe to call (the `unsafe` `#[target_feature]` calls inside are justified by the value's
//! existence). [`Kernels`] holds the one a product runs on; strategies are generic over the
//! [`Kernel`] trait and monomorphized per kernel, so the choice is made once per product, never
//! in an inner loop. Every SIMD method has a bit-identical twin on [`Scalar`], and the tests
//! compare them on every kernel the CPU offers ([`Kernels::available`]).
//!
//! Operands are small matrix views ([`View`], [`ViewMut`]) checked to lie inside their slices
//! when made; the kernels check that the shapes agree.

use std::fmt;

use half::bf16;

use crate::format::QRow;
#[cfg(test)]
use crate::QuantSpec;

pub(crate) mod gemm;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
mod x86_64_avx512;

pub use scalar::Scalar;
pub(crate) use scalar::{dequant_value, group_sums};
#[cfg(test)]
pub(crate) use scalar::{dot_row_mlx, unpack};
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::is_amd;
#[cfg(target_arch = "x86_64")]
pub use x86_64::Avx2Fma;
#[cfg(target_arch = "x86_64")]
pub use x86_64_avx512::Avx512;

/// The widest SIMD a kernel object uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Portable code ([`Scalar`]).
    Scalar,
    /// AVX2 + FMA (`Avx2Fma`).
    Avx2Fma,
    /// AVX-512F/BW/VL (`Avx512`): the unpacked panels of 4- and 8-bit weights and the tiles of
    /// `x @ W`; AVX2 + FMA for the rest.
    Avx512,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Scalar => "scalar",
            Level::Avx2Fma => "AVX2+FMA",
            Level::Avx512 => "AVX-512",
        })
    }
}

/// A kernel object of one of the levels this CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// The portable kernels.
    Scalar(Scalar),
    /// AVX2 + FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2Fma(Avx2Fma),
    /// AVX-512 (and AVX2 + FMA where it has no kernel of its own).
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl Kernels {
    /// The widest kernels this CPU has, capped by two switches for testing and debugging:
    /// `DG_QUANT_FORCE_SCALAR=1` keeps every product on the portable kernels,
    /// `DG_QUANT_FORCE_AVX2=1` keeps AVX-512 off. What every public product runs on.
    pub fn best() -> Kernels {
        static BEST: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let all = Kernels::available();
            all[all.len() - 1]
        })
    }

    /// Every kernel object this CPU offers under the switches of [`Kernels::best`], narrowest
    /// first (always [`Scalar`]): what the tests iterate over in one run.
    pub fn available() -> Vec<Kernels> {
        let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty() && s != "0");
        let cap = if set("DG_QUANT_FORCE_SCALAR") {
            Level::Scalar
        } else if set("DG_QUANT_FORCE_AVX2") {
            Level::Avx2Fma
        } else {
            Level::Avx512
        };
        #[allow(unused_mut)] // Only x86-64 has more than the portable kernels.
        let mut all = vec![Kernels::Scalar(Scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(k) = Avx2Fma::new().filter(|_| cap >= Level::Avx2Fma) {
                all.push(Kernels::Avx2Fma(k));
            }
            if let Some(k) = Avx512::new().filter(|_| cap >= Level::Avx512) {
                all.push(Kernels::Avx512(k));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = cap;
        all
    }

    /// This object's level.
    pub fn level(self) -> Level {
        match self {
            Kernels::Scalar(_) => Level::Scalar,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2Fma(_) => Level::Avx2Fma,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(_) => Level::Avx512,
        }
    }

    /// The kernels of `self` without AVX-512: what runs where AVX-512 has no kernel of its
    /// own (named so that a plan says what runs).
    pub fn without_avx512(self) -> Kernels {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(k) => Kernels::Avx2Fma(k.avx2()),
            other => other,
        }
    }
}

impl fmt::Display for Kernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.level().fmt(f)
    }
}

/// `$body` with `$k` bound to the kernel object inside `$kernels`: the one dispatch of a
/// product, after which its loops are monomorphized for that kernel.
macro_rules! with_kernel {
    ($kernels:expr, $k:ident => $body:expr) => {
        match $kernels {
            $crate::kernels::Kernels::Scalar($k) => $body,
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::Kernels::Avx2Fma($k) => $body,
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::Kernels::Avx512($k) => $body,
        }
    };
}
pub(crate) use with_kernel;

/// Rows whose sums [`Kernel::add_rows_in_order`] continues side by side: one 16-lane register
/// holds a lane per row, so each row's serial chain of additions runs in its own lane.
pub(crate) const SUM_ROWS: usize = 16;

/// The kernels every strategy runs, bit-identical on every implementation.
pub(crate) trait Kernel: Copy + Send + Sync {
    /// One dequantized row of `out.len()` elements, `f32(f32(scale * q) + bias)` as MLX.
    fn dequant_row(self, row: QRow<'_>, out: &mut [f32]);

    /// `out[r][c] = (load ? out[r][c] : 0) + sum_k lhs[r][k] * rhs[k][c]`, one fma per term in
    /// `k` order; `out.cols()` a multiple of 8. (The tiled `x @ W^T` runs it as
    /// `W_block @ x^T`, `x @ W` as `x @ W_strip`.)
    fn tiles(self, lhs: View<'_>, rhs: View<'_>, out: ViewMut<'_>, load: bool);

    /// `y[i] = fma(a, x[i], y[i])` (`x` and `y` of equal length).
    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]);

    /// [`Kernel::axpy`] of every `(r, p)` of `terms` in order: `acc += p * rows[r]`, one fma
    /// per element, row `r` of `rows` being `rows[r * w..(r + 1) * w]` with `w = acc.len()`
    /// (every `r` in range).
    fn fma_terms(self, terms: &[(u32, f32)], rows: &[f32], acc: &mut [f32]) {
        let w = acc.len();
        for &(r, p) in terms {
            self.axpy(p, &rows[r as usize * w..(r as usize + 1) * w], acc);
        }
    }

    /// `out[i] = mlx::exp(xs[i] - shift)`, MLX's CPU exp bit for bit (`xs` and `out` of equal
    /// length).
    fn exp_shifted(self, xs: &[f32], shift: f32, out: &mut [f32]);

    /// [`Kernel::exp_shifted`] of `xs` into itself.
    fn exp_shifted_in_place(self, xs: &mut [f32], shift: f32);

    /// The largest of `xs` compared in any order (`-inf` when empty; `+0` and `-0` count as
    /// equal, so either may come back), or `None` if one is NaN.
    fn max_unordered(self, xs: &[f32]) -> Option<f32>;

    /// `xs[i] *= a`.
    fn scale(self, a: f32, xs: &mut [f32]);

    /// Each row's sum continued left to right (MLX's reduction order): `sums[r] = ((sums[r] +
    /// rows[r][0]) + rows[r][1]) + ...` for `r < rows.rows()` (at most [`SUM_ROWS`]); the
    /// sums past the rows are unspecified.
    fn add_rows_in_order(self, rows: View<'_>, sums: &mut [f32; SUM_ROWS]);

    /// `xs[i] = mlx::log(xs[i])`, glibc's `logf` bit for bit.
    fn log_in_place(self, xs: &mut [f32]);

    /// `gate[i] = gelu_tanh(gate[i]) * up[i]` ([`crate::ops::gelu_tanh`]; equal lengths).
    fn geglu(self, gate: &mut [f32], up: &[f32]) {
        geglu_loop(gate, up);
    }

    /// `xs[i] = tanh(xs[i] / cap) * cap` ([`crate::ops::tanh`]).
    fn soft_cap(self, xs: &mut [f32], cap: f32) {
        soft_cap_loop(xs, cap);
    }
}

/// The scalar [`Kernel::geglu`]; the SIMD kernels compile this same loop for their vector
/// width (plain IEEE multiplies, adds and divides, never fused: the same bits in every lane).
#[inline(always)]
pub(crate) fn geglu_loop(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: lengths differ");
    for (g, u) in gate.iter_mut().zip(up) {
        *g = crate::ops::gelu_tanh(*g) * u;
    }
}

/// The scalar [`Kernel::soft_cap`], compiled by the SIMD kernels as [`geglu_loop`] is.
#[inline(always)]
pub(crate) fn soft_cap_loop(xs: &mut [f32], cap: f32) {
    for v in xs.iter_mut() {
        *v = crate::ops::tanh(*v / cap) * cap;
    }
}

/// The kernels of the unpacked-panel `x @ W^T` (4- and 8-bit weights): [`Scalar`] (the
/// reference) and `Avx512` (what runs).
pub(crate) trait PanelKernel: Copy + Send + Sync {
    /// `x` in the scale of the fields `unpack_rows_t` reads in place: `out[k] = x[k] *
    /// 2^-(bits * (k % (32 / bits)))` (`scalar::scale_fields`; `out` as long as `x`).
    fn scale_fields(self, x: &[f32], bits: u32, out: &mut [f32]);

    /// The quantized fields of `rows` packed rows (`bits` 4 or 8, each row's words `stride`
    /// apart in `words`), read in place in their words, as a column-major panel:
    /// `out[k][i] = (q[i][k] << (bits * (k % (32 / bits)))) as f32` for `k < out.rows()`,
    /// `i < rows`. The lanes `rows..out.cols()` (a multiple of 16) may be written with zeros.
    fn unpack_rows_t(self, words: &[u32], stride: usize, bits: u32, rows: usize, out: ViewMut<'_>);

    /// `rows` bf16 rows (`stride` apart: per-group parameters, or plain weights) widened into
    /// an f32 table with one column per row: `out[g][i] = params[i * stride + g]` for
    /// `g < out.rows()`; the lanes `rows..out.cols()` (a multiple of 16) may be written with
    /// zeros.
    fn widen_t(self, params: &[bf16], stride: usize, rows: usize, out: ViewMut<'_>);

    /// [`Kernel::tiles`] (one fma chain per element in `k` order) over a widened panel, in
    /// the taller register tiles of `tiles_q`; `out.cols()` a multiple of 32.
    fn panel_tiles(self, x: View<'_>, panel: View<'_>, out: ViewMut<'_>, load: bool);

    /// Register tiles over an unpacked panel: `out[i][c] = sum_g fma(b[g][c], xsum[i][g],
    /// fma(s[g][c], p_g, .))` in group order, from `out[i][c]` when `load` (else 0), where
    /// `p_g = sum_{k in g} x[i][k] * q[k][c]` (fma, in k order); `out.cols()` a multiple of 32.
    /// The SIMD body also pulls the lines `ahead` toward the cache, spread over its steps (a
    /// hint that does not change the results).
    fn tiles_q(
        self,
        x: View<'_>,
        q: View<'_>,
        params: GroupParams<'_>,
        out: ViewMut<'_>,
        load: bool,
        ahead: Lines,
    );

    /// The packed words of `rows` rows (`stride` apart in `words`), transposed and stored as
    /// f32 bit patterns: `out[w][i] = f32::from_bits(words[i * stride + w])` for
    /// `w < out.rows()`, `i < rows`. The lanes `rows..out.cols()` (a multiple of 16) may be
    /// written with zeros.
    fn transpose_words_t(self, words: &[u32], stride: usize, rows: usize, out: ViewMut<'_>);

    /// [`Self::tiles_q`] over a panel of transposed words (`transpose_words_t`, `bits` 4 or
    /// 8): each field is decoded as `unpack_rows_t` reads it, so the products, their order and
    /// the result bits are those of `tiles_q` on the unpacked panel; `out.cols()` a multiple of
    /// 16. Decoding in the tiles spares the store and reload of an f32 panel eight (or four)
    /// times the words' size, which pays where few rows share each decoded value.
    #[allow(clippy::too_many_arguments)]
    fn tiles_qw(
        self,
        x: View<'_>,
        words: View<'_>,
        bits: u32,
        params: GroupParams<'_>,
        out: ViewMut<'_>,
        load: bool,
        ahead: Lines,
    );
}

/// Per-group operands of [`PanelKernel::tiles_q`].
#[derive(Clone, Copy)]
pub(crate) struct GroupParams<'a> {
    /// The panel's scales, `[groups, ncols]`.
    pub scales: View<'a>,
    /// The panel's biases, `[groups, ncols]`.
    pub biases: View<'a>,
    /// The activations' group sums, `[m, groups]`.
    pub xsum: View<'a>,
    /// Elements per group.
    pub group_size: usize,
}

/// The shape of a row-major matrix inside a slice: `rows x cols`, rows `ld` apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    rows: usize,
    cols: usize,
    ld: usize,
}

impl Shape {
    /// The shape, checked to fit in `len` elements.
    #[track_caller]
    fn fitting(len: usize, rows: usize, cols: usize, ld: usize) -> Shape {
        let fits = cols <= ld
            && (rows == 0
                || cols == 0
                || (rows - 1)
                    .checked_mul(ld)
                    .and_then(|e| e.checked_add(cols))
                    .is_some_and(|e| e <= len));
        assert!(fits, "view {rows}x{cols} (ld {ld}) out of a slice of {len}");
        Shape { rows, cols, ld }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The `rows x cols` block at `(i, j)`: its offset in the slice (at most `len`) and shape.
    #[track_caller]
    fn block(
        &self,
        len: usize,
        (i, j): (usize, usize),
        (rows, cols): (usize, usize),
    ) -> (usize, Shape) {
        assert!(
            i + rows <= self.rows && j + cols <= self.cols,
            "block out of the view"
        );
        let shape = Shape {
            rows,
            cols,
            ld: self.ld,
        };
        ((i * self.ld + j).min(len), shape)
    }
}

/// A row-major f32 matrix inside a slice, checked to fit on creation, so kernels index it
/// without further checks.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [f32],
    shape: Shape,
}

impl std::ops::Deref for View<'_> {
    type Target = Shape;

    fn deref(&self) -> &Shape {
        &self.shape
    }
}

impl<'a> View<'a> {
    #[track_caller]
    pub fn new(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Self {
        let shape = Shape::fitting(data.len(), rows, cols, ld);
        View { data, shape }
    }

    /// The `rows x cols` block at `(i, j)`.
    #[track_caller]
    pub fn block(&self, at: (usize, usize), size: (usize, usize)) -> View<'a> {
        let (offset, shape) = self.shape.block(self.data.len(), at, size);
        View {
            data: &self.data[offset..],
            shape,
        }
    }

    /// Element `(i, j)`.
    #[inline(always)]
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.ld + j]
    }

    /// Pointer to element `(i, j)` (`i <= rows`, `j <= cols`: in or one past the view).
    #[inline(always)]
    pub fn ptr(&self, i: usize, j: usize) -> *const f32 {
        self.data[i * self.ld + j..].as_ptr()
    }
}

/// [`View`] with write access.
pub(crate) struct ViewMut<'a> {
    data: &'a mut [f32],
    shape: Shape,
}

impl std::ops::Deref for ViewMut<'_> {
    type Target = Shape;

    fn deref(&self) -> &Shape {
        &self.shape
    }
}

impl<'a> ViewMut<'a> {
    #[track_caller]
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize, ld: usize) -> Self {
        let shape = Shape::fitting(data.len(), rows, cols, ld);
        ViewMut { data, shape }
    }

    /// The `rows x cols` block at `(i, j)`.
    #[track_caller]
    pub fn block_mut(&mut self, at: (usize, usize), size: (usize, usize)) -> ViewMut<'_> {
        let (offset, shape) = self.shape.block(self.data.len(), at, size);
        ViewMut {
            data: &mut self.data[offset..],
            shape,
        }
    }

    /// Element `(i, j)`.
    #[inline(always)]
    pub fn at(&mut self, i: usize, j: usize) -> &mut f32 {
        &mut self.data[i * self.shape.ld + j]
    }

    /// Pointer to element `(i, j)` (`i <= rows`, `j <= cols`).
    #[inline(always)]
    pub fn ptr(&mut self, i: usize, j: usize) -> *mut f32 {
        self.data[i * self.shape.ld + j..].as_mut_ptr()
    }

    /// Zeroes the view unless `load`; whether there is anything to multiply (`depth`, the
    /// reduction length, and the view nonempty). The tile kernels' shared start.
    pub fn start(&mut self, depth: usize, load: bool) -> bool {
        let Shape { rows, cols, ld } = self.shape;
        if rows == 0 || cols == 0 {
            return false;
        }
        if depth == 0 {
            if !load {
                for i in 0..rows {
                    self.data[i * ld..i * ld + cols].fill(0.0);
                }
            }
            return false;
        }
        true
    }
}

/// [`Kernel::tiles`] on any width: the widest multiple of 8 columns on `kern` (its widest
/// tiles take the multiple of 32 in it), a remainder under 8 on the portable tiles. The same
/// bits as `Scalar.tiles` on the whole.
pub(crate) fn tiles_any_width(
    kern: impl Kernel,
    lhs: View<'_>,
    rhs: View<'_>,
    mut out: ViewMut<'_>,
    load: bool,
) {
    let (rows, cols, depth) = (out.rows(), out.cols(), lhs.cols());
    let wide = cols / 32 * 32;
    let eights = cols / 8 * 8;
    for (c0, c1) in [(0, wide), (wide, eights)] {
        if c1 > c0 {
            let r = rhs.block((0, c0), (depth, c1 - c0));
            kern.tiles(lhs, r, out.block_mut((0, c0), (rows, c1 - c0)), load);
        }
    }
    if cols > eights {
        let r = rhs.block((0, eights), (depth, cols - eights));
        Scalar.tiles(
            lhs,
            r,
            out.block_mut((0, eights), (rows, cols - eights)),
            load,
        );
    }
}

/// Checks that `out = lhs @ rhs` is a well-formed product with `out.cols()` a multiple of
/// `lanes`.
#[track_caller]
pub(crate) fn check_product(lhs: &View<'_>, rhs: &View<'_>, out: &ViewMut<'_>, lanes: usize) {
    assert!(
        lhs.cols == rhs.rows
            && lhs.rows == out.rows
            && rhs.cols == out.cols
            && out.cols.is_multiple_of(lanes),
        "tiles: [{}, {}] @ [{}, {}] into [{}, {}] ({lanes}-column vectors)",
        lhs.rows,
        lhs.cols,
        rhs.rows,
        rhs.cols,
        out.rows,
        out.cols
    );
}

/// The cache lines a slice spans, as addresses: what a kernel may prefetch (a hint; no
/// memory is read through it).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Lines {
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

/// Prefetch hint for data needed soon (no-op off x86-64).
#[inline]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86_64::prefetch(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Register tiles of [`Kernel::tiles`]: `NR` rows of `lhs` (broadcast) against `MV` vectors of
/// `rhs`, per `k` one fma per accumulator. Defined once for both vector widths.
#[cfg(target_arch = "x86_64")]
macro_rules! register_tile {
    ($name:ident, $features:literal, $lanes:literal,
     $zero:ident, $load:ident, $store:ident, $set1:ident, $fmadd:ident) => {
        /// One `NR x (MV * lanes)` register tile of `tiles`.
        ///
        /// # Safety
        /// The features are available; `t.lhs` is valid for reads of `lhs[r * ldl + k]`
        /// (`r < NR`, `k < kc`), `t.rhs` of `rhs[k * ldr .. + MV * lanes]` (`k < kc`), `t.out`
        /// for reads and writes of `out[r * ldo .. + MV * lanes]` (`r < NR`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const MV: usize, const NR: usize>(t: $crate::kernels::Tile) {
            let mut acc = [[$zero(); MV]; NR];
            if t.load {
                for (r, a) in acc.iter_mut().enumerate() {
                    for (v, a) in a.iter_mut().enumerate() {
                        // SAFETY: row r < NR, vector v < MV of `out` (contract).
                        *a = unsafe { $load(t.out.add(r * t.ldo + $lanes * v)) };
                    }
                }
            }
            for k in 0..t.kc {
                let mut b = [$zero(); MV];
                for (v, b) in b.iter_mut().enumerate() {
                    // SAFETY: row k < kc, vector v < MV of `rhs` (contract).
                    *b = unsafe { $load(t.rhs.add(k * t.ldr + $lanes * v)) };
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: element (r, k) of `lhs`, r < NR, k < kc (contract).
                    let l = $set1(unsafe { *t.lhs.add(r * t.ldl + k) });
                    for (a, b) in a.iter_mut().zip(&b) {
                        *a = $fmadd(l, *b, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (v, a) in a.iter().enumerate() {
                    // SAFETY: as the loads of `out` above.
                    unsafe { $store(t.out.add(r * t.ldo + $lanes * v), *a) };
                }
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use register_tile;

/// Operands of one register tile (pointers at its first row and column).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub kc: usize,
    pub lhs: *const f32,
    pub ldl: usize,
    pub rhs: *const f32,
    pub ldr: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub load: bool,
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// The tile of `out = lhs @ rhs` at row `i`, column `c`.
    pub fn at(
        lhs: &View<'_>,
        rhs: &View<'_>,
        out: &mut ViewMut<'_>,
        (i, c): (usize, usize),
        load: bool,
    ) -> Self {
        Tile {
            kc: lhs.cols(),
            lhs: lhs.ptr(i, 0),
            ldl: lhs.ld(),
            rhs: rhs.ptr(0, c),
            ldr: rhs.ld(),
            out: out.ptr(i, c),
            ldo: out.ld(),
            load,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Random `[rows, cols]` data with row stride `ld`.
    fn random(rng: &mut impl Rng, rows: usize, ld: usize) -> Vec<f32> {
        (0..rows * ld).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn every_kernel_dequantizes_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for bits_ in [2, 3, 4, 5, 6, 8] {
            for g in [32, 64, 128] {
                let spec = QuantSpec::new(bits_, g).unwrap();
                let cols = g * 5;
                let words: Vec<u32> = (0..spec.words_per_row(cols)).map(|_| rng.gen()).collect();
                let params = |rng: &mut rand::rngs::StdRng, r: f32| -> Vec<bf16> {
                    (0..5)
                        .map(|_| bf16::from_f32(rng.gen_range(-r..r)))
                        .collect()
                };
                let (scales, biases) = (params(&mut rng, 0.05), params(&mut rng, 0.5));
                let mut want = vec![0.0; cols];
                let row = QRow {
                    words: &words,
                    scales: &scales,
                    biases: &biases,
                    spec,
                };
                Scalar.dequant_row(row, &mut want);
                for k in Kernels::available() {
                    let mut got = vec![0.0; cols];
                    with_kernel!(k, k => k.dequant_row(row, &mut got));
                    assert_eq!(bits(&got), bits(&want), "{k}: {bits_} bits, group {g}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_tiles_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        // (rows, depth, cols): every tile height and width, partial tiles, odd depths.
        for (rows, kc, cols) in [
            (1usize, 1usize, 16usize),
            (6, 7, 16),
            (13, 64, 32),
            (5, 33, 48),
            (7, 128, 16),
            (25, 5, 16),
            (3, 9, 64),
            (14, 17, 96),
            (12, 256, 32),
            (4, 0, 32),
        ] {
            let (ldl, ldr, ldo) = (kc + 3, cols + 16, cols + 5);
            let lhs = random(&mut rng, rows, ldl);
            let rhs = random(&mut rng, kc.max(1), ldr);
            let init = random(&mut rng, rows, ldo);
            for load in [false, true] {
                let mut want = init.clone();
                let (l, r) = (
                    View::new(&lhs, rows, kc, ldl),
                    View::new(&rhs, kc, cols, ldr),
                );
                Scalar.tiles(l, r, ViewMut::new(&mut want, rows, cols, ldo), load);
                for k in Kernels::available() {
                    let mut got = init.clone();
                    let o = ViewMut::new(&mut got, rows, cols, ldo);
                    with_kernel!(k, k => k.tiles(l, r, o, load));
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{k}: {rows}x{kc}x{cols} load {load}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_kernel_axpys_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for n in [0usize, 1, 7, 8, 9, 64, 259] {
            let x = random(&mut rng, 1, n);
            let y = random(&mut rng, 1, n);
            let a = rng.gen_range(-1.0..1.0);
            let mut want = y.clone();
            Scalar.axpy(a, &x, &mut want);
            for k in Kernels::available() {
                let mut got = y.clone();
                with_kernel!(k, k => k.axpy(a, &x, &mut got));
                assert_eq!(bits(&got), bits(&want), "{k}: n {n}");
            }
        }
    }

    #[test]
    fn every_kernel_exps_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // Around every branch of MLX's exp: the underflow edges near -88 and -87.3, overflow
        // above 88, NaN and infinities, and the range softmax rows live in.
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            88.0,
            88.000_01,
            -88.0,
            -88.000_01,
            -87.3,
            -87.33,
            -87.34,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-40,
        ];
        // Where `x * log2(e)` lies next to a half-integer, the split's rounding shows.
        for k in -127..128 {
            let x = (k as f32 + 0.5) / std::f32::consts::LOG2_E;
            let (lo, hi) = (
                f32::from_bits(x.to_bits() - 1),
                f32::from_bits(x.to_bits() + 1),
            );
            xs.extend([lo, x, hi]);
        }
        xs.extend((0..4000).map(|_| rng.gen_range(-100.0f32..100.0)));
        xs.extend((0..4000).map(|_| rng.gen_range(-1.0f32..1.0)));
        for shift in [0.0f32, 3.5, -20.25, 87.9, f32::NAN, f32::INFINITY] {
            for n in [0usize, 1, 7, 8, 9, 17, xs.len()] {
                let x = &xs[..n];
                let mut want = vec![0.0; n];
                Scalar.exp_shifted(x, shift, &mut want);
                for (w, &v) in want.iter().zip(x) {
                    assert_eq!(w.to_bits(), crate::mlx::exp(v - shift).to_bits());
                }
                for k in Kernels::available() {
                    let mut got = vec![0.0; n];
                    with_kernel!(k, k => k.exp_shifted(x, shift, &mut got));
                    assert_eq!(bits(&got), bits(&want), "{k}: n {n}, shift {shift}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_fmas_terms_as_one_axpy_each() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for w in [256usize, 64, 40] {
            let rows = random(&mut rng, 9, w);
            let start = random(&mut rng, 1, w);
            let terms: Vec<(u32, f32)> = (0..40)
                .map(|t| ((t * 7 % 9) as u32, rng.gen_range(-1.0f32..1.0)))
                .collect();
            for n in [0usize, 1, 5, 40] {
                let mut want = start.clone();
                for &(r, p) in &terms[..n] {
                    let row = &rows[r as usize * w..(r as usize + 1) * w];
                    Scalar.axpy(p, row, &mut want);
                }
                for k in Kernels::available() {
                    let mut got = start.clone();
                    with_kernel!(k, k => k.fma_terms(&terms[..n], &rows, &mut got));
                    assert_eq!(bits(&got), bits(&want), "{k}: width {w}, {n} terms");
                }
            }
        }
    }

    #[test]
    fn every_kernel_exps_in_place_as_out_of_place() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let mut xs: Vec<f32> = (0..300).map(|_| rng.gen_range(-100.0f32..100.0)).collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            88.000_01,
            -88.000_01,
        ]);
        for n in [0usize, 1, 7, 8, 9, 16, 17, 33, xs.len()] {
            let mut want = vec![0.0; n];
            Scalar.exp_shifted(&xs[..n], 1.5, &mut want);
            for k in Kernels::available() {
                let mut got = xs[..n].to_vec();
                with_kernel!(k, k => k.exp_shifted_in_place(&mut got, 1.5));
                assert_eq!(bits(&got), bits(&want), "{k}: n {n}");
            }
        }
    }

    #[test]
    fn every_kernel_gelus_and_caps_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        // Every magnitude from subnormal to huge, both signs, and the specials, in runs long
        // enough for the vector bodies and their tails.
        let mut xs: Vec<f32> = (0..997)
            .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-140..40)))
            .collect();
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            7.905_311,
            -9.0,
        ];
        xs[..specials.len()].copy_from_slice(&specials);
        let up: Vec<f32> = (0..xs.len()).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        let (mut gelu, mut capped) = (xs.clone(), xs.clone());
        Scalar.geglu(&mut gelu, &up);
        Scalar.soft_cap(&mut capped, 30.0);
        for k in Kernels::available() {
            let mut g = xs.clone();
            with_kernel!(k, k => k.geglu(&mut g, &up));
            assert_eq!(bits(&g), bits(&gelu), "{k}: geglu");
            let mut c = xs.clone();
            with_kernel!(k, k => k.soft_cap(&mut c, 30.0));
            assert_eq!(bits(&c), bits(&capped), "{k}: soft cap");
        }
    }

    #[test]
    fn every_kernel_finds_the_max_and_scales_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let xs: Vec<f32> = (0..300).map(|_| rng.gen_range(-50.0f32..50.0)).collect();
        let serial = |xs: &[f32]| xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for n in [0usize, 1, 15, 16, 17, 31, 32, 33, 48, 300] {
            for special in [
                None,
                Some(f32::NAN),
                Some(f32::INFINITY),
                Some(f32::NEG_INFINITY),
            ] {
                for at in [0, n / 2, n.saturating_sub(1)] {
                    let mut x = xs[..n].to_vec();
                    if let (Some(v), true) = (special, n > 0) {
                        x[at] = v;
                    }
                    let want = match x.iter().any(|v| v.is_nan()) {
                        true => None,
                        false => Some(serial(&x)),
                    };
                    let mut scaled = x.clone();
                    Scalar.scale(0.37, &mut scaled);
                    for k in Kernels::available() {
                        let got = with_kernel!(k, k => k.max_unordered(&x));
                        assert_eq!(got, want, "{k}: n {n}, {special:?} at {at}");
                        let mut s = x.clone();
                        with_kernel!(k, k => k.scale(0.37, &mut s));
                        assert_eq!(bits(&s), bits(&scaled), "{k}: scale, n {n}");
                    }
                }
            }
        }
        // Zeros of both signs compare equal: either may come back.
        let zeros = [-0.0f32, 0.0, -1.0].repeat(20);
        for k in Kernels::available() {
            assert_eq!(
                with_kernel!(k, k => k.max_unordered(&zeros)),
                Some(0.0),
                "{k}"
            );
        }
    }

    #[test]
    fn every_kernel_adds_each_row_left_to_right() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        // Magnitudes far apart, so any other order of the additions rounds differently.
        let ld = 301;
        let mut xs: Vec<f32> = (0..SUM_ROWS * ld)
            .map(|i| rng.gen_range(-1.0f32..1.0) * [1e-4, 1.0, 1e4][i % 3])
            .collect();
        // One row turns NaN midway, one meets +inf and -inf.
        xs[3 * ld + 40] = f32::NAN;
        xs[5 * ld + 17] = f32::INFINITY;
        xs[5 * ld + 200] = f32::NEG_INFINITY;
        for rows in [1usize, 5, 15, SUM_ROWS] {
            for cols in [0usize, 1, 15, 16, 17, 47, 256, ld] {
                let start: [f32; SUM_ROWS] = std::array::from_fn(|r| r as f32 * 0.37);
                let view = View::new(&xs, rows, cols, ld);
                for k in Kernels::available() {
                    let mut got = start;
                    with_kernel!(k, k => k.add_rows_in_order(view, &mut got));
                    for r in 0..rows {
                        let row = &xs[r * ld..r * ld + cols];
                        let want = row.iter().fold(start[r], |s, &x| s + x);
                        assert_eq!(
                            got[r].to_bits(),
                            want.to_bits(),
                            "{k}: row {r} of {rows}, {cols} columns"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_kernel_logs_as_the_scalar_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut xs = vec![
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            1e-45,
            0.999_999_94,
            f32::EPSILON,
        ];
        // Every subinterval edge of the table, and its neighbours.
        for e in -3..3 {
            for i in 0..16u32 {
                let edge = 0x3F33_0000u32
                    .wrapping_add(i << 19)
                    .wrapping_add((e as u32) << 23);
                xs.extend([edge - 1, edge, edge + 1].map(f32::from_bits));
            }
        }
        xs.extend((0..4000).map(|_| f32::from_bits(rng.gen())));
        xs.extend((0..4000).map(|_| rng.gen_range(0.0f32..30.0)));
        for n in [0usize, 1, 7, 8, 9, 17, xs.len()] {
            let mut want = xs[..n].to_vec();
            Scalar.log_in_place(&mut want);
            for (w, &v) in want.iter().zip(&xs) {
                assert_eq!(w.to_bits(), crate::mlx::log(v).to_bits());
            }
            for k in Kernels::available() {
                let mut got = xs[..n].to_vec();
                with_kernel!(k, k => k.log_in_place(&mut got));
                assert_eq!(bits(&got), bits(&want), "{k}: n {n}");
            }
        }
    }

    #[test]
    fn the_switches_cap_the_kernels() {
        let all = Kernels::available();
        assert_eq!(all[0], Kernels::Scalar(Scalar));
        assert!(all.windows(2).all(|w| w[0].level() < w[1].level()));
        assert_eq!(Kernels::best(), all[all.len() - 1]);
        let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty() && s != "0");
        if set("DG_QUANT_FORCE_SCALAR") {
            assert_eq!(all.len(), 1);
        }
        if set("DG_QUANT_FORCE_AVX2") {
            assert!(Kernels::best().level() <= Level::Avx2Fma);
        }
        for k in all {
            assert!(k.without_avx512().level() <= Level::Avx2Fma);
        }
    }
}
