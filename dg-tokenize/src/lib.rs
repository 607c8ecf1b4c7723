//! dg-tokenize: text in and out of DiffusionGemma.
//!
//! - [`Tokenizer`]: a checkpoint's `tokenizer.json` + `tokenizer_config.json`, loaded the way
//!   transformers 5 loads them (pure-Rust `tokenizers`, no C regex).
//! - [`ChatTemplate`]: the checkpoint's Jinja chat template rendered with minijinja exactly as
//!   transformers' `apply_chat_template` renders it with Jinja2.
//! - [`StreamDetokenizer`]: UTF-8-safe incremental text, as the reference streams it.
//! - [`expand_image_tokens`]: image placeholders to `boi + image * n + eoi` with token types.
//!
//! Every behaviour is checked against goldens from the Python reference
//! (`tools/reference/dump_tokenize_goldens.py`).
//!
//! ```no_run
//! use dg_tokenize::{ChatTemplate, Message, RenderOptions, Tokenizer};
//!
//! # fn main() -> dg_tokenize::Result<()> {
//! let dir = "path/to/diffusiongemma-checkpoint";
//! let tok = Tokenizer::from_dir(dir)?;
//! let template = ChatTemplate::from_dir(dir)?.with_special_tokens(tok.special_tokens_map());
//! let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
//! let ids = tok.apply_chat_template(&template, &[Message::user("Hello!")], &opts)?;
//!
//! let mut stream = tok.stream_detokenizer();
//! for id in ids {
//!     if let Some(text) = stream.push(id)? {
//!         print!("{text}");
//!     }
//! }
//! print!("{}", stream.flush()?);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod error;
mod image;
mod literal;
mod message;
mod pycompat;
mod stream;
mod template;
mod tokenizer;

pub use error::{BoxError, Result, TokenizeError};
pub use image::{
    count_image_placeholders, expand_image_tokens, ExpandedPrompt, ImageTokenIds, TOKEN_TYPE_IMAGE,
    TOKEN_TYPE_TEXT,
};
pub use message::{Content, ContentPart, Message};
pub use stream::{DecoderKind, StreamDetokenizer, MAX_TOKEN_IDS};
pub use template::{ChatTemplate, RenderOptions};
pub use tokenizer::{SpecialTokens, Tokenizer};
