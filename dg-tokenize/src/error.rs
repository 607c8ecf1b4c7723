//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in dg-tokenize. Each variant names the file, field or token at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// A checkpoint file is missing, not a regular file, or over its size cap.
    #[error(transparent)]
    File(#[from] dg_files::FileError),
    /// A file is not valid JSON.
    #[error("parsing {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A JSON file parsed but a field has the wrong shape or value.
    #[error("{path}: field `{field}`: {message}")]
    Field {
        /// The file.
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The `tokenizers` library rejected tokenizer.json (or our adjustment of it).
    #[error("loading tokenizer {path}: {source}")]
    TokenizerLoad {
        /// The tokenizer.json file.
        path: PathBuf,
        /// The library's error, or what is wrong with the vocabulary.
        #[source]
        source: BoxError,
    },
    /// Encoding text failed inside `tokenizers` (or kept-literal special tokens could not be
    /// marked).
    #[error("encoding text ({chars} chars): {source}")]
    Encode {
        /// Length of the text in chars.
        chars: usize,
        /// The library's error, or what went wrong.
        #[source]
        source: BoxError,
    },
    /// Decoding ids failed inside `tokenizers`.
    #[error("decoding {len} token ids: {source}")]
    Decode {
        /// Number of ids.
        len: usize,
        /// The library's error.
        #[source]
        source: BoxError,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownTokenId {
        /// The id.
        id: u32,
        /// Size of the vocabulary (added tokens included).
        vocab_size: usize,
    },
    /// A token string the vocabulary does not contain.
    #[error("token `{token}` is not in the vocabulary")]
    UnknownToken {
        /// The token string.
        token: String,
    },
    /// The chat template failed to compile or render (includes `raise_exception` calls).
    #[error("chat template `{name}`: {message}")]
    Template {
        /// The template's name (`chat_template` or a named template).
        name: String,
        /// Jinja's message, or the template's `raise_exception` text.
        message: String,
    },
    /// A checkpoint directory has no chat template.
    #[error(
        "no chat template in {dir} (looked for chat_template.jinja and tokenizer_config.json `chat_template`)"
    )]
    NoChatTemplate {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A chat message or tool could not be turned into template values.
    #[error("serializing {what} for the chat template: {source}")]
    Serialize {
        /// The value at fault (a message or tool).
        what: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// Image placeholders in the prompt and per-image token counts disagree.
    #[error(
        "prompt has {placeholders} image placeholder token(s) (id {image_token_id}) but {images} image token count(s) were given"
    )]
    ImageCountMismatch {
        /// Image placeholder tokens in the prompt.
        placeholders: usize,
        /// Token counts given (one per image).
        images: usize,
        /// The placeholder's id.
        image_token_id: u32,
    },
}

/// The error `tokenizers` returns (its `tokenizers::Error`), or a message of ours in its place.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Result alias for this crate.
pub type Result<T, E = TokenizeError> = std::result::Result<T, E>;

impl TokenizeError {
    pub(crate) fn field(path: &std::path::Path, field: &str, message: impl Into<String>) -> Self {
        TokenizeError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn template(name: &str, err: &minijinja::Error) -> Self {
        // minijinja's Display already names the template and line; append any chained causes.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        TokenizeError::Template {
            name: name.to_string(),
            message,
        }
    }
}
