//! The portable kernels ([`Scalar`]): the reference every SIMD kernel in `x86_64.rs` and
//! `x86_64_avx512.rs` is tested against bit for bit, and the fallback on CPUs without them.

use half::bf16;

use super::{check_product, GroupParams, Kernel, PanelKernel, View, ViewMut, SUM_ROWS};
use crate::format::QRow;

/// The portable kernels (every CPU has them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scalar;

impl Kernel for Scalar {
    fn dequant_row(self, row: QRow<'_>, out: &mut [f32]) {
        let g = row.spec.group_size;
        for (gi, chunk) in out.chunks_exact_mut(g).enumerate() {
            let (s, b) = (row.scales[gi].to_f32(), row.biases[gi].to_f32());
            for (j, o) in chunk.iter_mut().enumerate() {
                *o = dequant_value(unpack(row.words, gi * g + j, row.spec.bits), s, b);
            }
        }
    }

    fn tiles(self, lhs: View<'_>, rhs: View<'_>, mut out: ViewMut<'_>, load: bool) {
        check_product(&lhs, &rhs, &out, 1);
        for r in 0..out.rows() {
            for c in 0..out.cols() {
                let mut acc = if load { *out.at(r, c) } else { 0.0 };
                for k in 0..lhs.cols() {
                    acc = lhs.at(r, k).mul_add(rhs.at(k, c), acc);
                }
                *out.at(r, c) = acc;
            }
        }
    }

    fn axpy(self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: lengths differ");
        for (y, x) in y.iter_mut().zip(x) {
            *y = a.mul_add(*x, *y);
        }
    }

    fn exp_shifted(self, xs: &[f32], shift: f32, out: &mut [f32]) {
        assert_eq!(xs.len(), out.len(), "exp_shifted: lengths differ");
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = crate::mlx::exp(x - shift);
        }
    }

    fn exp_shifted_in_place(self, xs: &mut [f32], shift: f32) {
        for x in xs {
            *x = crate::mlx::exp(*x - shift);
        }
    }

    /// In sixteen lanes (which the compiler vectorizes), then across them.
    fn max_unordered(self, xs: &[f32]) -> Option<f32> {
        const LANES: usize = 16;
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut unordered = [false; LANES];
        let chunks = xs.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for ((m, u), &x) in lanes.iter_mut().zip(&mut unordered).zip(chunk) {
                *u |= x.is_nan();
                *m = if x > *m { x } else { *m };
            }
        }
        if unordered.contains(&true) || tail.iter().any(|x| x.is_nan()) {
            return None;
        }
        let max = lanes.iter().chain(tail);
        Some(max.fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }))
    }

    fn scale(self, a: f32, xs: &mut [f32]) {
        for x in xs {
            *x *= a;
        }
    }

    fn add_rows_in_order(self, rows: View<'_>, sums: &mut [f32; SUM_ROWS]) {
        let n = rows.rows();
        assert!(n <= SUM_ROWS, "add_rows_in_order: {n} rows");
        if n == 0 {
            return;
        }
        // A fixed shape (missing rows repeat the first), so the rows' chains interleave and
        // hide the latency of each addition.
        let row: [usize; SUM_ROWS] = std::array::from_fn(|r| if r < n { r } else { 0 });
        for j in 0..rows.cols() {
            for (s, &r) in sums.iter_mut().zip(&row) {
                *s += rows.at(r, j);
            }
        }
    }

    fn log_in_place(self, xs: &mut [f32]) {
        for x in xs {
            *x = crate::mlx::log(*x);
        }
    }
}

impl PanelKernel for Scalar {
    fn scale_fields(self, x: &[f32], bits: u32, out: &mut [f32]) {
        scale_fields(x, bits, out)
    }

    fn unpack_rows_t(
        self,
        words: &[u32],
        stride: usize,
        bits: u32,
        rows: usize,
        mut out: ViewMut<'_>,
    ) {
        assert!(
            rows <= out.cols(),
            "unpack_rows_t: {rows} rows into {} lanes",
            out.cols()
        );
        let per_word = 32 / bits as usize;
        for i in 0..rows {
            let w = &words[i * stride..];
            for k in 0..out.rows() {
                let shift = bits * (k % per_word) as u32;
                *out.at(k, i) = (unpack(w, k, bits) << shift) as f32;
            }
        }
    }

    fn widen_t(self, params: &[bf16], stride: usize, rows: usize, mut out: ViewMut<'_>) {
        assert!(
            rows <= out.cols(),
            "widen_t: {rows} rows into {} lanes",
            out.cols()
        );
        for i in 0..rows {
            for g in 0..out.rows() {
                *out.at(g, i) = params[i * stride + g].to_f32();
            }
        }
    }

    fn panel_tiles(self, x: View<'_>, panel: View<'_>, out: ViewMut<'_>, load: bool) {
        Kernel::tiles(self, x, panel, out, load)
    }

    fn tiles_q(
        self,
        x: View<'_>,
        q: View<'_>,
        params: GroupParams<'_>,
        mut out: ViewMut<'_>,
        load: bool,
        _ahead: super::Lines,
    ) {
        check_product(&x, &q, &out, 1);
        let GroupParams {
            scales,
            biases,
            xsum,
            group_size,
        } = params;
        for i in 0..out.rows() {
            for c in 0..out.cols() {
                let mut acc = if load { *out.at(i, c) } else { 0.0 };
                for g in 0..x.cols() / group_size {
                    let mut p = 0.0f32;
                    for k in g * group_size..(g + 1) * group_size {
                        p = x.at(i, k).mul_add(q.at(k, c), p);
                    }
                    acc = scales.at(g, c).mul_add(p, acc);
                    acc = biases.at(g, c).mul_add(xsum.at(i, g), acc);
                }
                *out.at(i, c) = acc;
            }
        }
    }

    fn transpose_words_t(self, words: &[u32], stride: usize, rows: usize, mut out: ViewMut<'_>) {
        assert!(
            rows <= out.cols(),
            "transpose_words_t: {rows} rows into {} lanes",
            out.cols()
        );
        for i in 0..rows {
            for w in 0..out.rows() {
                *out.at(w, i) = f32::from_bits(words[i * stride + w]);
            }
        }
    }

    fn tiles_qw(
        self,
        x: View<'_>,
        words: View<'_>,
        bits: u32,
        params: GroupParams<'_>,
        out: ViewMut<'_>,
        load: bool,
        ahead: super::Lines,
    ) {
        let q = decode_words(words, bits);
        let q = View::new(
            &q,
            words.rows() * (32 / bits as usize),
            words.cols(),
            words.cols(),
        );
        self.tiles_q(x, q, params, out, load, ahead)
    }
}

/// The fields of a transposed-word panel (`PanelKernel::transpose_words_t`) as
/// `unpack_rows_t` lays them out: `q[k][c]` is field `k % (32 / bits)` of word `k / (32 /
/// bits)`, in place.
fn decode_words(words: View<'_>, bits: u32) -> Vec<f32> {
    let per_word = 32 / bits as usize;
    let (rows, cols) = (words.rows() * per_word, words.cols());
    let field = (1u32 << bits) - 1;
    let mut q = vec![0.0f32; rows * cols];
    for (k, row) in q.chunks_exact_mut(cols.max(1)).enumerate() {
        let mask = field << (bits * (k % per_word) as u32);
        for (c, v) in row.iter_mut().enumerate() {
            *v = (words.at(k / per_word, c).to_bits() & mask) as f32;
        }
    }
    q
}

/// Element `k` of a packed row: bits `k * bits ..` of the little-endian bit stream.
#[inline(always)]
pub fn unpack(words: &[u32], k: usize, bits: u32) -> u32 {
    let bit = k * bits as usize;
    let (word, shift) = (bit / 32, (bit % 32) as u32);
    let mut v = (words[word] as u64) >> shift;
    if shift + bits > 32 {
        v |= (words[word + 1] as u64) << (32 - shift);
    }
    (v as u32) & ((1u32 << bits) - 1)
}

/// `scale * q + bias` rounded twice (a product, then a sum), as MLX's `mx.dequantize` computes
/// it in float32: two separate array ops, no fused multiply-add.
#[inline(always)]
pub fn dequant_value(q: u32, scale: f32, bias: f32) -> f32 {
    let prod = scale * q as f32;
    prod + bias
}

/// `x` in the scale the fields of `unpack_rows_t` ask for: `out[k] = x[k] * 2^-(bits * (k %
/// (32 / bits)))`, so that `out[k] * field_k` is exactly `x[k] * q_k` (both factors are scaled
/// by powers of two; only a tiny |x|, below 2^-96, would turn subnormal and round). `bits`
/// divides 32.
pub fn scale_fields(x: &[f32], bits: u32, out: &mut [f32]) {
    match bits {
        2 => scale_fields_n::<16>(x, out),
        4 => scale_fields_n::<8>(x, out),
        8 => scale_fields_n::<4>(x, out),
        _ => {
            let per_word = 32 / bits as usize;
            for (k, (o, v)) in out.iter_mut().zip(x).enumerate() {
                *o = v * f32::from_bits((127 - bits * (k % per_word) as u32) << 23);
            }
        }
    }
}

/// `scale_fields` with `PER_WORD = 32 / bits` known at compile time (vectorizes).
fn scale_fields_n<const PER_WORD: usize>(x: &[f32], out: &mut [f32]) {
    let bits = (32 / PER_WORD) as u32;
    let factors: [f32; PER_WORD] =
        std::array::from_fn(|j| f32::from_bits((127 - bits * j as u32) << 23));
    for (o, v) in out.chunks_mut(PER_WORD).zip(x.chunks(PER_WORD)) {
        for ((o, v), f) in o.iter_mut().zip(v).zip(&factors) {
            *o = v * f;
        }
    }
}

/// Per-group sums of `x` (`xsum` of `tiles_q`: the bias term is `bias_g * sum(x_g)`).
pub fn group_sums(x: &[f32], group_size: usize, out: &mut [f32]) {
    for (o, chunk) in out.iter_mut().zip(x.chunks_exact(group_size)) {
        *o = chunk.iter().sum();
    }
}

/// MLX's own definition of one output of `quantized_matmul(transpose=True)` on the CPU
/// (`_qmm_t`): a sequential sum of `x_k * (scale * q_k + bias)`. Used by tests as the
/// ground-truth formula; the fast paths reorder the sum.
#[cfg(test)]
pub fn dot_row_mlx(x: &[f32], row: QRow<'_>) -> f32 {
    let g = row.spec.group_size;
    let mut sum = 0.0f32;
    for (k, xv) in x.iter().enumerate() {
        let w = dequant_value(
            unpack(row.words, k, row.spec.bits),
            row.scales[k / g].to_f32(),
            row.biases[k / g].to_f32(),
        );
        sum += xv * w;
    }
    sum
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn scaled_x_times_in_place_fields_is_exactly_x_times_q() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for bits in [2u32, 4, 8] {
            let (rows, cols, stride) = (3usize, 64usize, 64 * bits as usize / 32);
            let words: Vec<u32> = (0..rows * stride).map(|_| rng.gen()).collect();
            // Magnitudes from 2^-60 to 2^60: every product is exact, so equality is bitwise.
            let x: Vec<f32> = (0..cols)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-60..60)))
                .collect();
            let mut xf = vec![0.0; cols];
            scale_fields(&x, bits, &mut xf);
            let mut panel = vec![0.0; cols * rows];
            Scalar.unpack_rows_t(
                &words,
                stride,
                bits,
                rows,
                ViewMut::new(&mut panel, cols, rows, rows),
            );
            for i in 0..rows {
                for k in 0..cols {
                    let want = x[k] * unpack(&words[i * stride..], k, bits) as f32;
                    let got = xf[k] * panel[k * rows + i];
                    assert_eq!(got.to_bits(), want.to_bits(), "{bits}b row {i} col {k}");
                }
            }
        }
    }
}
