//! The one error type of dg-engine: every variant names the argument or file at fault.

/// Errors from the generation engine and its pure building blocks (RNG, sampler).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// An argument's length or shape does not fit the others.
    #[error("{name}: {reason}")]
    Shape {
        /// The argument at fault, as the function names it.
        name: &'static str,
        /// What was expected and what was received.
        reason: String,
    },
    /// An argument's value is outside its valid range.
    #[error("{name}: {reason}")]
    InvalidArgument {
        /// The argument at fault, as the function names it.
        name: &'static str,
        /// Why the value is rejected.
        reason: String,
    },
    /// The text model failed (bad checkpoint, bad input).
    #[error(transparent)]
    Model(Box<dg_core::CoreError>),
    /// The allocator refused a buffer whose size the request sets.
    #[error(transparent)]
    OutOfMemory(#[from] dg_quant::alloc::OutOfMemory),
    /// Tokenizer, chat template or detokenizer failed.
    #[error(transparent)]
    Tokenize(#[from] dg_tokenize::TokenizeError),
    /// An image could not be read or encoded.
    #[error(transparent)]
    #[cfg(feature = "vision")]
    Vision(#[from] dg_vision::VisionError),
    /// A checkpoint file is missing, not a regular file, or over its size cap.
    #[error(transparent)]
    CheckpointFile(#[from] dg_files::FileError),
    /// A checkpoint file other than the weights is unreadable or malformed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// One request of a batch is invalid (nothing ran).
    #[error("request {index}: {source}")]
    Request {
        /// Its position in the batch.
        index: usize,
        /// What is wrong with it.
        source: Box<EngineError>,
    },
    /// Downloading a checkpoint from the Hugging Face Hub failed (feature `hub`): the repo is
    /// unknown, not a diffusion_gemma checkpoint, lacks a file, or the transfer broke (run it
    /// again: finished files are reused and a partial one resumes).
    #[error("{repo}: {reason}")]
    Download {
        /// The repo id (`org/name`).
        repo: String,
        /// What went wrong, naming the file at fault.
        reason: String,
    },
    /// Loading was cancelled by the progress callback.
    #[error("loading was cancelled")]
    Cancelled,
    /// The scheduler refused a request: its queue or token budget is full. Try again later.
    #[error("overloaded: {reason}")]
    Overloaded {
        /// Which limit was reached.
        reason: String,
    },
    /// The scheduler is shutting down and takes no more requests.
    #[error("the scheduler is shutting down")]
    ShuttingDown,
    /// A forward pass shared by several requests failed; every request in it ends with this.
    #[error("a batched pass failed: {source}")]
    Batch {
        /// The error of the pass (shared by its requests).
        #[source]
        source: std::sync::Arc<EngineError>,
    },
}

impl From<dg_core::CoreError> for EngineError {
    fn from(e: dg_core::CoreError) -> Self {
        EngineError::Model(Box::new(e))
    }
}

/// `Result` with [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;
