//! `mx.quantize`, `mx.dequantize` and quantized-row lookups.
//!
//! What MLX 0.32 computes on the CPU (`fast::Quantize::eval_cpu` -> `quantize<T, U>` in
//! `mlx/backend/cpu/quantized.cpp`), all in float32 whatever the input type:
//!
//! ```text
//! n_bins = 2^bits - 1;  eps = 1e-7
//! per group:  w_max, w_min over the group (as f32)
//!   mask  = |w_min| > |w_max|
//!   scale = max((w_max - w_min) / n_bins, eps);  scale = mask ? scale : -scale
//!   edge  = mask ? w_min : w_max
//!   q0    = rint(edge / scale)                     (round half to even)
//!   bias  = 0;  if q0 != 0 { scale = edge / q0;  bias = edge }
//!   q_k   = clamp(rint((w_k - bias) / scale), 0, n_bins)
//!   store scale, bias cast to the input dtype (round to nearest even for bf16)
//! ```
//!
//! The quantized values use the f32 `scale`/`bias`, not their bf16 roundings. So quantizing a
//! bf16 array and quantizing the same values as float32 give the same packed words; only the
//! stored scales/biases differ (bf16 vs f32). `quantize` is the bf16 case (the checkpoints'),
//! `quantize_f32` the float32 one.
//!
//! `mx.dequantize` on the CPU is composed of array ops (`affine_dequantize` in `mlx/ops.cpp`):
//! unpack, `multiply(w, scales)`, then `add(.., biases)` — two separately rounded operations,
//! no fused multiply-add. With float32 scales/biases (the float32 reference) the result is
//! `f32(f32(scale * q) + bias)`, which `dequantize` reproduces bit for bit.

use half::bf16;
use rayon::prelude::*;

use crate::format::{check_len, mul};
use crate::kernels::{with_kernel, Kernel, Kernels};
use crate::{QMatrix, QuantError, QuantSpec};

/// Output of `quantize`: MLX's `(weight, scales, biases)` with bf16 scales and biases.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    /// Packed codes, `u32 [rows, cols * bits / 32]` (MLX's `weight`).
    pub packed: Vec<u32>,
    /// One scale per group, `[rows, cols / group_size]`.
    pub scales: Vec<bf16>,
    /// One bias per group, `[rows, cols / group_size]`.
    pub biases: Vec<bf16>,
}

impl Quantized {
    /// A borrowed view of this `[rows, cols]` matrix.
    pub fn view(
        &self,
        rows: usize,
        cols: usize,
        spec: QuantSpec,
    ) -> Result<QMatrix<'_>, QuantError> {
        QMatrix::new(&self.packed, &self.scales, &self.biases, rows, cols, spec)
    }
}

/// Output of `quantize_f32`: MLX's `(weight, scales, biases)` for a float32 input array.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedF32 {
    /// Packed codes, `u32 [rows, cols * bits / 32]` (MLX's `weight`).
    pub packed: Vec<u32>,
    /// One scale per group, `[rows, cols / group_size]`.
    pub scales: Vec<f32>,
    /// One bias per group, `[rows, cols / group_size]`.
    pub biases: Vec<f32>,
}

/// `mx.quantize(w.astype(mx.bfloat16), group_size, bits)` for a row-major `w [rows, cols]`:
/// each value is first rounded to bf16 (a no-op for values that are already bf16, the
/// checkpoint case), then quantized exactly as MLX's CPU kernel does (see the module docs).
/// Bit-identical to MLX for every width and group size (tests/goldens.rs).
pub fn quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    spec: QuantSpec,
) -> Result<Quantized, QuantError> {
    let rounded: Vec<f32> = w.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
    let q = quantize_f32(&rounded, rows, cols, spec)?;
    Ok(Quantized {
        packed: q.packed,
        scales: q.scales.iter().map(|v| bf16::from_f32(*v)).collect(),
        biases: q.biases.iter().map(|v| bf16::from_f32(*v)).collect(),
    })
}

/// `mx.quantize(w, group_size, bits)` for a float32 array `w [rows, cols]`: the same packed
/// words as the bf16 case for bf16-representable input, with float32 scales and biases.
/// Non-finite weights are rejected (MLX's output would be meaningless).
pub fn quantize_f32(
    w: &[f32],
    rows: usize,
    cols: usize,
    spec: QuantSpec,
) -> Result<QuantizedF32, QuantError> {
    spec.check_cols("quantize input", cols)?;
    check_len(
        "quantize input",
        w.len(),
        mul("quantize input", rows, cols)?,
    )?;
    if let Some(index) = w.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            index,
            row: index / cols.max(1),
            value: w[index],
        });
    }
    let g = spec.group_size;
    let groups = rows * cols / g;
    let wpg = spec.words_per_group();
    let mut packed = vec![0u32; groups * wpg];
    let mut scales = vec![0f32; groups];
    let mut biases = vec![0f32; groups];
    let n_bins = spec.max_q() as f32;
    let eps = 1e-7f32;
    for (gi, wg) in w.chunks_exact(g).enumerate() {
        let (mut w_max, mut w_min) = (f32::NEG_INFINITY, f32::INFINITY);
        // std::max / std::min as MLX writes them (`a < b ? b : a`).
        for &v in wg {
            if w_max < v {
                w_max = v;
            }
            if v < w_min {
                w_min = v;
            }
        }
        let mask = w_min.abs() > w_max.abs();
        let mut scale = ((w_max - w_min) / n_bins).max(eps);
        if !mask {
            scale = -scale;
        }
        let edge = if mask { w_min } else { w_max };
        let q0 = (edge / scale).round_ties_even();
        let mut bias = 0.0f32;
        if q0 != 0.0 {
            scale = edge / q0;
            bias = edge;
        }
        let out = &mut packed[gi * wpg..(gi + 1) * wpg];
        for (k, &v) in wg.iter().enumerate() {
            // A zero scale (only when |edge| / 1e-7 overflows, |w| > 3.4e31) gives +-inf, which
            // clamps as in MLX, or NaN (w == bias), which `as u32` turns into 0 as MLX's
            // float-to-u64 conversion does.
            let q = ((v - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u32;
            let bit = k * spec.bits as usize;
            let (word, shift) = (bit / 32, bit % 32);
            out[word] |= q << shift;
            if shift + spec.bits as usize > 32 {
                out[word + 1] |= q >> (32 - shift);
            }
        }
        scales[gi] = scale;
        biases[gi] = bias;
    }
    Ok(QuantizedF32 {
        packed,
        scales,
        biases,
    })
}

/// Rows per parallel task of the dequantization.
const DEQUANT_ROWS_PER_TASK: usize = 64;

/// `mx.dequantize(w, scales.astype(f32), biases.astype(f32))`: `out [rows, cols]`, bit-identical
/// to the float32 reference (`f32(f32(scale * q) + bias)`).
pub fn dequantize(w: &QMatrix, out: &mut [f32]) -> Result<(), QuantError> {
    check_len("dequantize output", out.len(), w.rows * w.cols)?;
    if w.cols == 0 {
        return Ok(());
    }
    with_kernel!(Kernels::best(), k => {
        out.par_chunks_mut(DEQUANT_ROWS_PER_TASK * w.cols)
            .enumerate()
            .for_each(|(t, chunk)| {
                for (i, row) in chunk.chunks_exact_mut(w.cols).enumerate() {
                    let r = t * DEQUANT_ROWS_PER_TASK + i;
                    k.dequant_row(w.row(r), row);
                }
            })
    });
    Ok(())
}

/// Dequantized rows `ids` of `w` (an embedding lookup): `out [ids.len(), cols]`.
pub fn embedding(w: &QMatrix, ids: &[u32], out: &mut [f32]) -> Result<(), QuantError> {
    check_len(
        "embedding output",
        out.len(),
        mul("embedding output", ids.len(), w.cols)?,
    )?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= w.rows) {
        return Err(QuantError::IdOutOfRange { id, rows: w.rows });
    }
    if w.cols == 0 {
        return Ok(());
    }
    with_kernel!(Kernels::best(), k => {
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(w.cols)) {
            let r = id as usize;
            k.dequant_row(w.row(r), row);
        }
    });
    Ok(())
}
