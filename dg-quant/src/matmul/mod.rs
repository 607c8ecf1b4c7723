//! Quantized matrix products (`mx.quantized_matmul`, `mx.gather_qmm`) and the plain f32 GEMM.
//!
//! How each product runs is one [`Plan`], chosen by [`Plan::for_weights`] from the product,
//! the weights' format and the kernels, never from the number of activation rows: every row is
//! computed exactly as it would be alone, so a sequence gets the same bits, and the same
//! tokens, whatever it is batched with (tested by `each_row_is_computed_as_it_is_alone`, on
//! every kernel the CPU has). The strategies:
//!
//! - [`Plan::UnpackedPanels`] (`unpacked.rs`), `x @ W^T` with 4- and 8-bit weights on AVX-512
//!   (every layer of the real model): each task transposes 32 weight rows' quantized values
//!   into a k-major f32 panel, 128 columns at a time, and broadcasts `x` against it in 12x32
//!   register tiles (no row padding), applying each group's scale and bias to the partial
//!   sums: `x . W[r] = sum_g scale_g (x_g . q_g) + bias_g sum(x_g)`; `x` is taken in blocks of
//!   rows sized for the CPU's caches, one pass over the weights per block;
//! - [`Plan::DequantTiles`] (`tiled.rs`), every other `x @ W^T`: `x` is transposed once; each
//!   task dequantizes (exactly, as `dequantize`) 256-wide chunks of its weight rows and
//!   accumulates 16x6 register tiles;
//! - [`Plan::DequantStrips`] (`xw.rs`), `x @ W` (soft embeddings): 256-column tasks walk the
//!   reduction axis in order with register tiles over dequantized 32-column strips, in fixed
//!   chunks of 32768 weight rows whose partial sums are added in chunk order (a vocab-sized
//!   `W` gives enough tasks for a many-core CPU).
//!
//! [`attention_values`] (`values.rs`), attention's `probs @ values` in f32, runs the register
//! tiles of `x @ W` over strips of the values, one fma chain per element in key order.
//!
//! `gather_matmul_t` (`experts.rs`) groups the pairs by expert; each expert is one task running
//! the `x @ W^T` plan of the experts' format, its panels open to idle threads.
//!
//! Work is split into fixed panels independent of the thread count, and each output element
//! is reduced by one task in a fixed order, so results depend neither on the pool size nor on
//! the other rows. MLX itself sums `x_k * (scale * q_k + bias)` sequentially in f32 without
//! FMA (`_qmm_t`; checked bit for bit); tests/goldens.rs states the tolerance this implies.

use std::fmt;

use half::bf16;
use rayon::prelude::*;

use crate::format::{check_len, mul};
#[cfg(target_arch = "x86_64")]
use crate::kernels::Avx512;
use crate::kernels::{with_kernel, Kernels};
use crate::{QExperts, QMatrix, QuantError, QuantSpec};

mod experts;
mod tiled;
// The plan runs it on AVX-512 only; the tests also on the scalar twins.
#[cfg(any(target_arch = "x86_64", test))]
mod unpacked;
mod values;
#[cfg(any(target_arch = "x86_64", test))]
mod widened;
mod xw;

pub use experts::gather_matmul_t;
#[cfg(test)]
use experts::gather_matmul_t_on;
pub use values::attention_values;
pub(crate) use values::attention_values_on;

/// Which product of activations `x` and quantized weights `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Product {
    /// `x @ W^T`: [`matmul_t`] (the linear layers) and each expert of [`gather_matmul_t`].
    XWt,
    /// `x @ W`: [`matmul`] (the soft embeddings; the dense rows of
    /// [`matmul_sparse`](crate::matmul_sparse)).
    XW,
}

/// How a quantized product runs: a strategy and the kernels it runs on (see the module docs).
/// Printable, so that a bench or test can say what ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `x @ W^T` over quantized fields unpacked into f32 panels, the scales and biases applied
    /// per group to the partial sums (4- and 8-bit weights on AVX-512).
    #[cfg(target_arch = "x86_64")]
    UnpackedPanels(Avx512),
    /// `x @ W^T` over dequantized weight rows and transposed activations in register tiles.
    DequantTiles(Kernels),
    /// `x @ W` over dequantized 32-column strips of the weights in register tiles, the
    /// reduction in fixed chunks.
    DequantStrips(Kernels),
}

impl Plan {
    /// The plan of `product` for weights of `spec` on `kernels`: the one place the strategy
    /// is chosen.
    pub fn for_weights(product: Product, spec: QuantSpec, kernels: Kernels) -> Plan {
        match (product, kernels) {
            #[cfg(target_arch = "x86_64")]
            (Product::XWt, Kernels::Avx512(k)) if matches!(spec.bits, 4 | 8) => {
                Plan::UnpackedPanels(k)
            }
            // AVX-512 has no tiles of its own at this width: say that AVX2 runs.
            (Product::XWt, k) => Plan::DequantTiles(k.without_avx512()),
            (Product::XW, k) => Plan::DequantStrips(k),
        }
    }

    /// The product this plan computes.
    pub fn product(self) -> Product {
        match self {
            #[cfg(target_arch = "x86_64")]
            Plan::UnpackedPanels(_) => Product::XWt,
            Plan::DequantTiles(_) => Product::XWt,
            Plan::DequantStrips(_) => Product::XW,
        }
    }

    /// The kernels it runs on.
    pub fn kernels(self) -> Kernels {
        match self {
            #[cfg(target_arch = "x86_64")]
            Plan::UnpackedPanels(k) => Kernels::Avx512(k),
            Plan::DequantTiles(k) | Plan::DequantStrips(k) => k,
        }
    }

    /// `out = x @ W^T` (`x [m, w.cols]`, `out [m, w.rows]`) or `out = x @ W` (`x [m,
    /// w.rows]`, `out [m, w.cols]`) as the plan's product, on shapes already checked, with no
    /// empty dimension; `parallel`: tasks spread over the current pool, else run on this
    /// thread.
    fn run(self, x: &[f32], m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
        let depth = match self.product() {
            Product::XWt => w.cols,
            Product::XW => w.rows,
        };
        self.run_rows(Rows::all(x, depth), m, w, out, parallel)
    }

    /// [`Plan::run`] on `m` activation rows given as [`Rows`] (those an expert picks out of
    /// all the tokens' rows are read in place).
    fn run_rows(self, x: Rows<'_>, m: usize, w: &QMatrix, out: &mut [f32], parallel: bool) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Plan::UnpackedPanels(k) => unpacked::matmul_t(k, x, m, w, out, parallel),
            Plan::DequantTiles(k) => {
                with_kernel!(k, k => tiled::matmul_t(k, x, m, w, out, parallel))
            }
            Plan::DequantStrips(k) => with_kernel!(k, k => xw::matmul(k, x, m, w, out, parallel)),
        }
    }
}

/// The activation rows of a product: rows `0..m` of `x` (`width` wide), or the rows
/// `pick[0..m]` of it.
#[derive(Clone, Copy)]
struct Rows<'a> {
    x: &'a [f32],
    width: usize,
    pick: Option<&'a [usize]>,
}

impl<'a> Rows<'a> {
    fn all(x: &'a [f32], width: usize) -> Self {
        Rows {
            x,
            width,
            pick: None,
        }
    }

    fn picked(x: &'a [f32], width: usize, pick: &'a [usize]) -> Self {
        Rows {
            x,
            width,
            pick: Some(pick),
        }
    }

    /// The `i`-th row.
    fn row(&self, i: usize) -> &'a [f32] {
        let r = self.pick.map_or(i, |p| p[i]);
        &self.x[r * self.width..(r + 1) * self.width]
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let strategy = match self {
            #[cfg(target_arch = "x86_64")]
            Plan::UnpackedPanels(_) => "x @ W^T, unpacked panels",
            Plan::DequantTiles(_) => "x @ W^T, dequantized tiles",
            Plan::DequantStrips(_) => "x @ W, dequantized strips",
        };
        write!(f, "{strategy} ({})", self.kernels())
    }
}

impl QMatrix<'_> {
    /// The plan `product` runs with these weights on this CPU ([`Kernels::best`]).
    pub fn plan(&self, product: Product) -> Plan {
        Plan::for_weights(product, self.spec, Kernels::best())
    }
}

impl QExperts<'_> {
    /// The plan each expert of [`gather_matmul_t`] runs with these weights on this CPU.
    pub fn plan(&self) -> Plan {
        Plan::for_weights(Product::XWt, self.spec(), Kernels::best())
    }
}

fn check_x(what: &'static str, x: &[f32], m: usize, width: usize) -> Result<(), QuantError> {
    check_len(what, x.len(), mul(what, m, width)?)
}

/// `out [m, rows] = x [m, cols] @ W^T` (`mx.quantized_matmul(x, w, scales, biases,
/// transpose=True)`).
pub fn matmul_t(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) -> Result<(), QuantError> {
    product_on(Product::XWt, Kernels::best(), x, m, w, out)
}

/// `out [m, cols] = x [m, rows] @ W` (`mx.quantized_matmul(..., transpose=False)`; the
/// soft-embedding product `probs @ embed`).
pub fn matmul(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) -> Result<(), QuantError> {
    product_on(Product::XW, Kernels::best(), x, m, w, out)
}

/// [`matmul_t`] or [`matmul`] on the given kernels: validates the shapes, settles the empty
/// ones, and runs the plan.
pub(crate) fn product_on(
    product: Product,
    kernels: Kernels,
    x: &[f32],
    m: usize,
    w: &QMatrix,
    out: &mut [f32],
) -> Result<(), QuantError> {
    // (what x is called, what out is called, reduction length, output width)
    let (what_x, what_out, depth, width) = match product {
        Product::XWt => ("matmul_t input x", "matmul_t output", w.cols, w.rows),
        Product::XW => ("matmul input x", "matmul output", w.rows, w.cols),
    };
    check_x(what_x, x, m, depth)?;
    check_len(what_out, out.len(), mul(what_out, m, width)?)?;
    if m == 0 || width == 0 {
        return Ok(());
    }
    if depth == 0 {
        out.fill(0.0);
        return Ok(());
    }
    Plan::for_weights(product, w.spec, kernels).run(x, m, w, out, true);
    Ok(())
}

/// `out [m, rows] = x [m, cols] @ W^T` for plain bf16 weights `w [rows, cols]` (the vision
/// tower's, left in the mapped file). On AVX-512 the product widens the weights a panel at a
/// time (`widened.rs`: each output one fma chain in `k` order); elsewhere they are widened
/// whole, then multiplied by [`matmul_f32`].
pub fn matmul_bf16_t(
    x: &[f32],
    m: usize,
    w: &[bf16],
    (rows, cols): (usize, usize),
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_x("matmul_bf16_t input x", x, m, cols)?;
    check_len(
        "matmul_bf16_t weights",
        w.len(),
        mul("matmul_bf16_t weights", rows, cols)?,
    )?;
    check_len(
        "matmul_bf16_t output",
        out.len(),
        mul("matmul_bf16_t output", m, rows)?,
    )?;
    if m == 0 || rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if let Kernels::Avx512(k) = Kernels::best() {
        widened::matmul_t(k, x, m, w, (rows, cols), out, true);
        return Ok(());
    }
    let wide: Vec<f32> = w.par_iter().map(|v| v.to_f32()).collect();
    crate::kernels::gemm::matmul_f32(x, &wide, (m, cols, rows), true, out);
    Ok(())
}

/// Plain f32 GEMM via the `gemm` crate: `out [m, n] = a [m, k] @ B`, where `B` is `b [k, n]`,
/// or `b [n, k]` transposed when `b_transposed`. Large products split across the current pool
/// (deterministically: the crate partitions outputs, never the reduction).
pub fn matmul_f32(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    b_transposed: bool,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_len("matmul_f32 lhs", a.len(), mul("matmul_f32 lhs", m, k)?)?;
    check_len("matmul_f32 rhs", b.len(), mul("matmul_f32 rhs", k, n)?)?;
    check_len(
        "matmul_f32 output",
        out.len(),
        mul("matmul_f32 output", m, n)?,
    )?;
    crate::kernels::gemm::matmul_f32(a, b, (m, k, n), b_transposed, out);
    Ok(())
}

#[cfg(test)]
mod tests;
