//! dg-core: the DiffusionGemma text model in pure Rust.
//!
//! - [`config`]: `config.json` with the reference's defaults.
//! - [`checkpoint`]: memory-mapped safetensors shards, sanitized names, typed errors.
//! - [`model`]: the encoder/decoder backbone ([`TextModel`]) and its [`KvCache`].
//! - [`train`]: the LoRA denoising loss and its gradient (hand-written backward pass).

#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod lora;
mod mmap;
pub mod model;
pub mod train;

pub use checkpoint::Checkpoint;
pub use config::ModelConfig;
pub use error::CoreError;
pub use lora::Adapter;
pub use model::{DecoderInput, EncoderInput, KvCache, SelfConditioning, TextModel};
#[cfg(feature = "synthetic")]
pub mod synthetic;
