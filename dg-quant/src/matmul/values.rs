//! [`attention_values`]: `probs @ values`, attention's second product, in f32 on the register
//! tiles of `x @ W` (`Kernel::tiles`).
//!
//! The reduction runs over the keys (thousands after a long prompt) into a narrow output (a
//! head: 72 to 512 columns). The `gemm` crate splits such a reduction into chunks whose sums it
//! adds afterwards, and ran this shape at about half the FMA peak. Here each output element is
//! one fma chain in key order: `STRIP`-column tasks walk the keys in steps of `KEY_STEP`,
//! copying each step's values into a contiguous strip the tiles read from L1 (a head's rows
//! are 1-2 KB apart, so read in place they would share a few cache sets).

use crate::format::{check_len, mul};
use crate::kernels::gemm::column_panels;
use crate::kernels::{tiles_any_width, with_kernel, Kernels, View, ViewMut};
use crate::scratch::with_buffer;
use crate::QuantError;

/// Output columns per task: one AVX-512 register tile.
const STRIP: usize = 32;
/// Keys per step: a strip of values (16 KB) stays in L1 while the tiles sweep the rows.
const KEY_STEP: usize = 128;
/// Value rows whose byte stride is a multiple of this fall into few L1 sets, so the tiles read
/// a contiguous copy of each step's strip; other strides (the vision tower's 72-wide heads)
/// spread over the sets and are read in place.
const ALIASING_STRIDE: usize = 256;
/// Work (multiply-adds) above which the strips spread over the current pool.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// `out [m, n] = probs [m, k] @ values [k, n]` (row-major f32), each element computed as one
/// fma chain over `k` in order from 0, so its bits depend neither on the shape nor on the pool.
/// Large products spread their column strips over the current pool.
pub fn attention_values(
    probs: &[f32],
    values: &[f32],
    (m, k, n): (usize, usize, usize),
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_len(
        "attention probabilities",
        probs.len(),
        mul("attention probabilities", m, k)?,
    )?;
    check_len(
        "attention values",
        values.len(),
        mul("attention values", k, n)?,
    )?;
    check_len(
        "attention output",
        out.len(),
        mul("attention output", m, n)?,
    )?;
    let parallel = m * k * n >= PARALLEL_MIN_MACS;
    attention_values_on(Kernels::best(), probs, values, (m, k, n), out, parallel);
    Ok(())
}

/// [`attention_values`] on the given kernels, on checked lengths; its strips on the current
/// pool when `parallel`.
pub(crate) fn attention_values_on(
    kernels: Kernels,
    probs: &[f32],
    values: &[f32],
    (m, k, n): (usize, usize, usize),
    out: &mut [f32],
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let in_place = !(n * std::mem::size_of::<f32>()).is_multiple_of(ALIASING_STRIDE);
    with_kernel!(kernels, kern => column_panels(out, (m, n), STRIP, parallel, |mut panel| {
        let (c0, w) = (panel.start(), panel.width());
        with_buffer(KEY_STEP * w + m * w, |buf| {
            let (strip, acc) = buf.split_at_mut(KEY_STEP * w);
            for k0 in (0..k).step_by(KEY_STEP) {
                let kc = KEY_STEP.min(k - k0);
                let v = if in_place {
                    View::new(&values[k0 * n + c0..], kc, w, n)
                } else {
                    for (j, dst) in strip.chunks_exact_mut(w).take(kc).enumerate() {
                        let at = (k0 + j) * n + c0;
                        dst.copy_from_slice(&values[at..at + w]);
                    }
                    View::new(&strip[..kc * w], kc, w, w)
                };
                let p = View::new(&probs[k0..], m, kc, k);
                let o = ViewMut::new(acc, m, w, w);
                tiles_any_width(kern, p, v, o, k0 > 0);
            }
            for (i, row) in acc.chunks_exact(w).enumerate() {
                panel.row_mut(i).copy_from_slice(row);
            }
        });
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    /// Each element as one fma chain in key order, the definition.
    fn chain(p: &[f32], v: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for c in 0..n {
                out[i * n + c] =
                    (0..k).fold(0.0f32, |acc, j| p[i * k + j].mul_add(v[j * n + c], acc));
            }
        }
        out
    }

    #[test]
    fn every_kernel_gives_the_fma_chain_bits() {
        // Keys over several steps with a partial one; heads of 512, 72 (a partial strip of 8)
        // and 20 (a remainder of 4 lanes); rows over several tiles with a partial one.
        for (m, k, n) in [
            (13usize, 300usize, 512usize),
            (7, 130, 72),
            (5, 129, 20),
            (1, 1, 1),
        ] {
            let (p, v) = (values(m * k, 1), values(k * n, 2));
            let want = chain(&p, &v, (m, k, n));
            for kernels in Kernels::available() {
                let mut out = vec![f32::NAN; m * n];
                // Odd and even row counts take the serial and the parallel strips.
                attention_values_on(kernels, &p, &v, (m, k, n), &mut out, m % 2 == 0);
                let same = out
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{kernels}: [{m}, {k}] @ [{k}, {n}] differs from the fma chain"
                );
            }
        }
    }

    #[test]
    fn no_keys_give_zeros_and_bad_lengths_an_error() {
        let mut out = vec![f32::NAN; 6];
        attention_values(&[], &[], (2, 0, 3), &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.0));
        let err = attention_values(&[0.0; 5], &[0.0; 6], (2, 3, 2), &mut out[..4]).unwrap_err();
        assert!(err.to_string().contains("attention probabilities"), "{err}");
    }
}
