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
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an image in a format we decode (PNG, JPEG, WebP, GIF).
    #[error("{what}: not a supported image (PNG, JPEG, WebP or GIF)")]
    UnsupportedFormat {
        /// The image's source (a path, "request image 2", ...).
        what: String,
    },
    /// The image is damaged or truncated.
    #[error("{what}: cannot decode image: {message}")]
    Decode {
        /// The image's source (a path, "request image 2", ...).
        what: String,
        /// The decoder's message.
        message: String,
    },
    /// The image is larger than the decoder limits allow.
    #[error("{what}: image too large ({message})")]
    TooLarge {
        /// The image's source (a path, "request image 2", ...).
        what: String,
        /// The limit exceeded.
        message: String,
    },
    /// The image has no pixels.
    #[error("{what}: empty image ({width} x {height})")]
    EmptyImage {
        /// The image's source (a path, "request image 2", ...).
        what: String,
        /// Width in pixels.
        width: usize,
        /// Height in pixels.
        height: usize,
    },
    /// A raw pixel buffer does not match its stated size.
    #[error("pixel buffer holds {got} bytes, {width} x {height} RGB needs {expected}")]
    PixelBuffer {
        /// Stated width in pixels.
        width: usize,
        /// Stated height in pixels.
        height: usize,
        /// Bytes that size needs (`width * height * 3`).
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// An image processor or tower setting is out of range or inconsistent.
    #[error("invalid option `{option}`: {message}")]
    InvalidOption {
        /// The setting at fault.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// `config.json` is missing, unparsable, or a field is invalid.
    #[error("{path}: config field `{field}`: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint has no vision tower (`vision_config` absent or null).
    #[error("{path}: this checkpoint has no vision tower (no vision_config); image inputs are not supported")]
    NoVisionTower {
        /// The config file.
        path: PathBuf,
    },
    /// The checkpoint's tensors: a shard or the sidecar unreadable, a tensor missing or of the
    /// wrong shape or dtype (the loader shared with the text model names which).
    #[error(transparent)]
    Checkpoint(#[from] dg_core::CoreError),
    /// A checkpoint file (`config.json`) is missing, not a regular file, or over its size cap.
    #[error(transparent)]
    File(#[from] dg_files::FileError),
    /// A dg-quant product rejected its operands.
    #[error("{name}: {source}")]
    Quant {
        /// The product at fault.
        name: String,
        /// The kernel's error.
        #[source]
        source: dg_quant::QuantError,
    },
    /// The prompt's image-token count differs from the number of feature rows.
    #[error(
        "prompt has {image_tokens} image tokens but the images give {feature_rows} feature rows"
    )]
    TokenCount {
        /// Image tokens in the prompt.
        image_tokens: usize,
        /// Feature rows of all the images together.
        feature_rows: usize,
    },
    /// Buffers whose widths disagree.
    #[error("{what}: width {got}, expected {expected}")]
    Width {
        /// The buffer at fault.
        what: &'static str,
        /// The width it must have.
        expected: usize,
        /// Its width.
        got: usize,
    },
    /// An image does not fit the tower (patch grid larger than the patch budget, wrong size).
    #[error("image {height} x {width} does not fit the vision tower: {message}")]
    ImageShape {
        /// Height in pixels.
        height: usize,
        /// Width in pixels.
        width: usize,
        /// Why it does not fit.
        message: String,
    },
}

/// Result with [`VisionError`].
pub type Result<T, E = VisionError> = std::result::Result<T, E>;
