//! The one error type of dg-core: every variant names the file, tensor or field at fault.

use std::path::PathBuf;

/// Errors from loading a checkpoint or running the text model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file is missing, not a regular file, or over its size cap.
    #[error(transparent)]
    File(#[from] dg_files::FileError),
    /// A JSON file could not be written.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// `config.json` is malformed or describes an unsupported model.
    #[error("{path}: {reason}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A safetensors file is malformed or truncated.
    #[error("{path}: {reason}")]
    Checkpoint {
        /// The safetensors file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint lacks a tensor the model needs.
    #[error("missing tensor {name} (looked in {dir})")]
    MissingTensor {
        /// The tensor's (sanitized) name.
        name: String,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// Two model shards hold the same tensor (the reference would silently keep the last).
    #[error("tensor {name} is in two shards: {first} and {second}")]
    DuplicateTensor {
        /// The tensor's (sanitized) name.
        name: String,
        /// The shard read first.
        first: PathBuf,
        /// The shard that holds it again.
        second: PathBuf,
    },
    /// A tensor has the wrong shape or dtype.
    #[error("tensor {name} in {path}: {reason}")]
    BadTensor {
        /// The tensor's name.
        name: String,
        /// The shard that holds it.
        path: PathBuf,
        /// What is wrong (expected and found shape or dtype).
        reason: String,
    },
    /// An input is out of range (token id, length, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The allocator refused a buffer whose size the request or checkpoint sets.
    #[error(transparent)]
    OutOfMemory(#[from] dg_quant::alloc::OutOfMemory),
    /// A quantized kernel rejected its operands.
    #[error("quantized op on {name}: {source}")]
    Quant {
        /// The weight the operation used.
        name: String,
        /// The kernel's error.
        #[source]
        source: dg_quant::QuantError,
    },
    /// A LoRA adapter is malformed or does not fit the model.
    #[error("adapter {path}: {reason}")]
    Adapter {
        /// The adapter directory or file.
        path: PathBuf,
        /// What is wrong, naming the tensor or field.
        reason: String,
    },
    /// Loading was cancelled by the progress callback.
    #[error("loading cancelled")]
    Cancelled,
}
