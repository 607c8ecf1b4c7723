//! The MLX affine layout: a width and group size, and borrowed views of packed matrices.
//!
//! MLX stores a quantized `W [rows, cols]` as three row-major arrays:
//! - `weight`: `u32 [rows, cols * bits / 32]`, each row one little-endian bit stream in which
//!   element `k` occupies bits `k * bits .. (k + 1) * bits` (LSB first). For 2/4/8 bits MLX packs
//!   whole `u32` words; for 3/5/6 bits it packs bytes (8 elements in 3 or 5 bytes, 4 elements in
//!   3 bytes) and views them as `u32` — on a little-endian machine both are the same bit stream.
//! - `scales`, `biases`: `[rows, cols / group_size]`, one pair per group of `group_size`
//!   consecutive elements of a row; `w = scale * q + bias`.

use half::bf16;

use crate::QuantError;

/// Width and group size of an MLX affine quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantSpec {
    /// Bits per element: 2, 3, 4, 5, 6 or 8.
    pub bits: u32,
    /// Consecutive elements of a row sharing one scale and bias: 32, 64 or 128.
    pub group_size: usize,
}

impl QuantSpec {
    /// `bits` in {2, 3, 4, 5, 6, 8}, `group_size` in {32, 64, 128} (what `mx.quantize` accepts).
    pub fn new(bits: u32, group_size: usize) -> Result<Self, QuantError> {
        if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) {
            return Err(QuantError::UnsupportedBits { bits });
        }
        if !matches!(group_size, 32 | 64 | 128) {
            return Err(QuantError::UnsupportedGroupSize { group_size });
        }
        Ok(QuantSpec { bits, group_size })
    }

    /// Largest quantized value, `2^bits - 1`.
    pub fn max_q(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    /// `u32` words per packed row of `cols` elements.
    pub fn words_per_row(&self, cols: usize) -> usize {
        cols * self.bits as usize / 32
    }

    /// `u32` words per group.
    pub fn words_per_group(&self) -> usize {
        self.group_size * self.bits as usize / 32
    }

    /// Checks that `cols` is a whole number of groups.
    pub(crate) fn check_cols(&self, what: &'static str, cols: usize) -> Result<(), QuantError> {
        if !cols.is_multiple_of(self.group_size) {
            return Err(QuantError::Width {
                what,
                cols,
                group_size: self.group_size,
            });
        }
        Ok(())
    }
}

pub(crate) fn mul(what: &'static str, a: usize, b: usize) -> Result<usize, QuantError> {
    a.checked_mul(b).ok_or(QuantError::Overflow { what })
}

pub(crate) fn check_len(
    what: &'static str,
    actual: usize,
    expected: usize,
) -> Result<(), QuantError> {
    if actual != expected {
        return Err(QuantError::Length {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// A borrowed row-major quantized matrix `W [rows = out, cols = in]`, packed as MLX does.
/// Its fields are checked against each other by [`QMatrix::new`], the only way to make one.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub(crate) packed: &'a [u32],
    pub(crate) scales: &'a [bf16],
    pub(crate) biases: &'a [bf16],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) spec: QuantSpec,
}

impl<'a> QMatrix<'a> {
    /// Checks every length against `rows x cols` and `spec`.
    pub fn new(
        packed: &'a [u32],
        scales: &'a [bf16],
        biases: &'a [bf16],
        rows: usize,
        cols: usize,
        spec: QuantSpec,
    ) -> Result<Self, QuantError> {
        spec.check_cols("quantized matrix", cols)?;
        let words = mul("quantized matrix", rows, spec.words_per_row(cols))?;
        let groups = mul("quantized matrix", rows, cols / spec.group_size)?;
        mul("quantized matrix", rows, cols)?;
        check_len("packed weight", packed.len(), words)?;
        check_len("scales", scales.len(), groups)?;
        check_len("biases", biases.len(), groups)?;
        Ok(QMatrix {
            packed,
            scales,
            biases,
            rows,
            cols,
            spec,
        })
    }

    /// Packed codes, `u32 [rows, cols * bits / 32]`.
    pub fn packed(&self) -> &'a [u32] {
        self.packed
    }

    /// Per-group scales, `[rows, cols / group_size]`.
    pub fn scales(&self) -> &'a [bf16] {
        self.scales
    }

    /// Per-group biases, `[rows, cols / group_size]`.
    pub fn biases(&self) -> &'a [bf16] {
        self.biases
    }

    /// Output features (rows of `W`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns of `W`), a multiple of the group size.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Width and group size.
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    /// Groups per row.
    pub fn groups_per_row(&self) -> usize {
        self.cols / self.spec.group_size
    }

    /// Row `r` (`r < rows`).
    #[inline]
    pub(crate) fn row(&self, r: usize) -> QRow<'a> {
        let (w, g) = (self.spec.words_per_row(self.cols), self.groups_per_row());
        QRow {
            words: &self.packed[r * w..(r + 1) * w],
            scales: &self.scales[r * g..(r + 1) * g],
            biases: &self.biases[r * g..(r + 1) * g],
            spec: self.spec,
        }
    }

    /// Rows `r0..r1` as a matrix of their own.
    pub(crate) fn row_slice(&self, r0: usize, r1: usize) -> QMatrix<'a> {
        let w = self.spec.words_per_row(self.cols);
        let g = self.groups_per_row();
        QMatrix {
            packed: &self.packed[r0 * w..r1 * w],
            scales: &self.scales[r0 * g..r1 * g],
            biases: &self.biases[r0 * g..r1 * g],
            rows: r1 - r0,
            cols: self.cols,
            spec: self.spec,
        }
    }

    /// Bytes of weights a full pass reads (packed + scales + biases).
    pub fn bytes(&self) -> usize {
        self.packed.len() * 4 + (self.scales.len() + self.biases.len()) * 2
    }
}

/// One packed row of a [`QMatrix`], or a group-aligned run of its columns: what a kernel
/// dequantizes.
#[derive(Clone, Copy)]
pub(crate) struct QRow<'a> {
    pub words: &'a [u32],
    pub scales: &'a [bf16],
    pub biases: &'a [bf16],
    pub spec: QuantSpec,
}

impl<'a> QRow<'a> {
    /// Columns `c0..c1` (group-aligned).
    #[inline]
    pub fn part(self, c0: usize, c1: usize) -> QRow<'a> {
        let (g, bits) = (self.spec.group_size, self.spec.bits as usize);
        QRow {
            words: &self.words[c0 * bits / 32..c1 * bits / 32],
            scales: &self.scales[c0 / g..c1 / g],
            biases: &self.biases[c0 / g..c1 / g],
            spec: self.spec,
        }
    }
}

/// `experts` stacked quantized matrices `[E, rows, cols]` (MLX `SwitchLinear` layout). Its
/// fields are checked against each other by [`QExperts::new`], the only way to make one.
#[derive(Clone, Copy, Debug)]
pub struct QExperts<'a> {
    /// Every expert's rows, one after the other: `[E * rows, cols]`.
    stack: QMatrix<'a>,
    pub(crate) experts: usize,
    pub(crate) rows: usize,
}

impl<'a> QExperts<'a> {
    /// Checks every length against `experts x rows x cols` and `spec`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        packed: &'a [u32],
        scales: &'a [bf16],
        biases: &'a [bf16],
        experts: usize,
        rows: usize,
        cols: usize,
        spec: QuantSpec,
    ) -> Result<Self, QuantError> {
        let all_rows = mul("quantized experts", experts, rows)?;
        Ok(QExperts {
            stack: QMatrix::new(packed, scales, biases, all_rows, cols, spec)?,
            experts,
            rows,
        })
    }

    /// Packed codes, `u32 [experts, rows, cols * bits / 32]`.
    pub fn packed(&self) -> &'a [u32] {
        self.stack.packed
    }

    /// Per-group scales, `[experts, rows, cols / group_size]`.
    pub fn scales(&self) -> &'a [bf16] {
        self.stack.scales
    }

    /// Per-group biases, `[experts, rows, cols / group_size]`.
    pub fn biases(&self) -> &'a [bf16] {
        self.stack.biases
    }

    /// Number of stacked matrices.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Output features of each expert.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features of each expert, a multiple of the group size.
    pub fn cols(&self) -> usize {
        self.stack.cols
    }

    /// Width and group size.
    pub fn spec(&self) -> QuantSpec {
        self.stack.spec
    }

    /// Expert `e`'s `[rows, cols]` matrix.
    pub fn expert(&self, e: usize) -> Result<QMatrix<'a>, QuantError> {
        if e >= self.experts {
            return Err(QuantError::ExpertOutOfRange {
                expert: e,
                experts: self.experts,
            });
        }
        Ok(self.stack.row_slice(e * self.rows, (e + 1) * self.rows))
    }
}
