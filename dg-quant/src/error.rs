//! The crate's one error type.

/// Everything dg-quant can reject. Messages name the argument at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// Bits outside MLX's affine set {2, 3, 4, 5, 6, 8}.
    #[error(
        "unsupported quantization width of {bits} bits (MLX affine supports 2, 3, 4, 5, 6 and 8)"
    )]
    UnsupportedBits {
        /// The rejected width.
        bits: u32,
    },
    /// Group size outside MLX's set {32, 64, 128}.
    #[error("unsupported quantization group size {group_size} (MLX supports 32, 64 and 128)")]
    UnsupportedGroupSize {
        /// The rejected group size.
        group_size: usize,
    },
    /// A matrix width that is not a whole number of groups.
    #[error("{what}: width {cols} is not a multiple of the group size {group_size}")]
    Width {
        /// The matrix at fault.
        what: &'static str,
        /// Its width (input features).
        cols: usize,
        /// The group size it must be a multiple of.
        group_size: usize,
    },
    /// A buffer whose length does not match the shape it is used with.
    #[error("{what} has {actual} elements, expected {expected}")]
    Length {
        /// The buffer at fault.
        what: &'static str,
        /// Elements the shape calls for.
        expected: usize,
        /// Elements the buffer has.
        actual: usize,
    },
    /// A shape whose element count overflows `usize`.
    #[error("{what}: shape overflows the address space")]
    Overflow {
        /// The shape at fault.
        what: &'static str,
    },
    /// An embedding lookup past the last row.
    #[error("token id {id} is out of range for an embedding of {rows} rows")]
    IdOutOfRange {
        /// The token id looked up.
        id: u32,
        /// Rows of the embedding (its vocabulary size).
        rows: usize,
    },
    /// An expert index past the last expert.
    #[error("expert {expert} is out of range ({experts} experts)")]
    ExpertOutOfRange {
        /// The expert index asked for.
        expert: usize,
        /// Experts there are.
        experts: usize,
    },
    /// A gathered-product pair naming an input row or expert that does not exist.
    #[error("pair {pair} = (x row {x_row}, expert {expert}) is out of range ({x_rows} x rows, {experts} experts)")]
    PairOutOfRange {
        /// Index of the pair in the list.
        pair: usize,
        /// The input row it names.
        x_row: usize,
        /// The expert it names.
        expert: usize,
        /// Rows of the input.
        x_rows: usize,
        /// Experts there are.
        experts: usize,
    },
    /// Quantizing a NaN or infinity (MLX's output would be meaningless).
    #[error("weight {index} (row {row}) is not finite: {value}")]
    NonFinite {
        /// Flat index of the element in the row-major input.
        index: usize,
        /// Its row.
        row: usize,
        /// The value found.
        value: f32,
    },
    /// Query heads that do not share the key/value heads evenly.
    #[error("attention: {heads} query heads do not share {kv_heads} key/value heads evenly")]
    Heads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// The thread pool could not be built.
    #[error("thread pool: {0}")]
    ThreadPool(String),
}
