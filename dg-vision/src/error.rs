//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong turning an image into features. Each variant names the file,
/// tensor, field or option at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VisionError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an image in a format we decode (PNG, JPEG, WebP, GIF).
    #[error("{what}: not a supported image (PNG, JPEG, WebP or GIF)")]
    UnsupportedFormat { what: String },
    /// The image is damaged or truncated.
    #[error("{what}: cannot decode image: {message}")]
    Decode { what: String, message: String },
    /// The image is larger than the decoder limits allow.
    #[error("{what}: image too large ({message})")]
    TooLarge { what: String, message: String },
    /// The image has no pixels.
    #[error("{what}: empty image ({width} x {height})")]
    EmptyImage {
        what: String,
        width: usize,
        height: usize,
    },
    /// A raw pixel buffer does not match its stated size.
    #[error("pixel buffer holds {got} bytes, {width} x {height} RGB needs {expected}")]
    PixelBuffer {
        width: usize,
        height: usize,
        expected: usize,
        got: usize,
    },
    /// An image processor or tower setting is out of range or inconsistent.
    #[error("invalid option `{option}`: {message}")]
    InvalidOption {
        option: &'static str,
        message: String,
    },
    /// `config.json` is missing, unparsable, or a field is invalid.
    #[error("{path}: config field `{field}`: {message}")]
    Config {
        path: PathBuf,
        field: String,
        message: String,
    },
    /// The checkpoint has no vision tower (`vision_config` absent or null).
    #[error("{path}: this checkpoint has no vision tower (no vision_config); image inputs are not supported")]
    NoVisionTower { path: PathBuf },
    /// A safetensors file could not be parsed.
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// A tensor the tower needs is in none of the checkpoint's files.
    #[error("tensor `{name}` not found in {searched}")]
    MissingTensor { name: String, searched: String },
    /// A tensor has an unexpected dtype.
    #[error("tensor `{name}` in {path}: dtype {dtype} not supported here (want {expected})")]
    TensorDtype {
        name: String,
        path: PathBuf,
        dtype: String,
        expected: &'static str,
    },
    /// A tensor has an unexpected shape.
    #[error("tensor `{name}`: shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// The quantized-matrix layer rejected a tensor.
    #[error("quantized tensor `{name}`: {message}")]
    Quant { name: String, message: String },
    /// The prompt's image-token count differs from the number of feature rows.
    #[error(
        "prompt has {image_tokens} image tokens but the images give {feature_rows} feature rows"
    )]
    TokenCount {
        image_tokens: usize,
        feature_rows: usize,
    },
    /// Buffers whose widths disagree.
    #[error("{what}: width {got}, expected {expected}")]
    Width {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// An image does not fit the tower (patch grid larger than the patch budget, wrong size).
    #[error("image {height} x {width} does not fit the vision tower: {message}")]
    ImageShape {
        height: usize,
        width: usize,
        message: String,
    },
}

/// Result with [`VisionError`].
pub type Result<T, E = VisionError> = std::result::Result<T, E>;
