//! dg-engine: run Google's DiffusionGemma (block diffusion, mixture of experts) in pure Rust.
//!
//! ```
//! use dg_engine::{DiffusionGemma, Message, Request};
//!
//! let dir = "path/to/diffusiongemma";
//! # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
//! let model = DiffusionGemma::load(dir)?;
//! let request = Request::chat(vec![
//!     Message::system("You are terse."),
//!     Message::user("Write a haiku about rust."),
//! ])
//! .max_tokens(64)
//! .stop(["\n\n"]);
//! let answer = model.generate(&request)?;
//! println!("{}", answer.text);
//! println!(
//!     "{:?} after {} tokens, {} denoising steps",
//!     answer.finish_reason, answer.stats.generated_tokens, answer.stats.denoising_steps
//! );
//! # Ok::<(), dg_engine::EngineError>(())
//! ```
//!
//! - [`DiffusionGemma`]: load a checkpoint ([`load`](DiffusionGemma::load),
//!   [`builder`](DiffusionGemma::builder)), [`generate`](DiffusionGemma::generate) or stream
//!   [`Event`]s with [`generate_stream`](DiffusionGemma::generate_stream); several requests
//!   in one batched pass per step with [`generate_batch`](DiffusionGemma::generate_batch).
//! - [`Request`]: prompt and options (sampler, temperature, steps, canvas lengths, seed, stop
//!   strings); [`Image`]s for checkpoints with a vision tower.
//! - [`Scheduler`]: continuous batching for servers: requests submitted at any time from any
//!   thread share denoising passes; each gets a [`Stream`] of [`Update`]s (sync or async).
//! - [`research`]: the block loop's pieces on their own, bit-identical to the reference: the
//!   MLX-compatible RNG, the per-step sampler math, the MLX CPU kernels they reproduce, and
//!   single prefill and decoder passes.
//! - [`retain_freed_memory`]: one call at the start of `main`, before any thread, makes long
//!   prompts faster on Linux (glibc reuses freed buffers instead of faulting in fresh pages).

#![warn(missing_docs)]

// The block loop uses the research modules under their short paths.
use research::{mlx_math, rng, sampler};

mod batch;
mod canvas;
mod engine;
pub mod error;
#[cfg(feature = "hub")]
pub mod hub;
mod output;
mod prompt;
mod request;
pub mod research;
mod scheduler;
mod settings;
mod stop;
pub mod train;

pub use dg_core::lora::{Adapter, AdapterConfig, LoraParameters};
/// Random-weight checkpoints in the exact real format (feature `synthetic`): the model runs
/// on them end to end, its output is noise.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// dg_engine::synthetic::write_checkpoint(dir.path(), &Default::default())?;
/// let model = dg_engine::DiffusionGemma::load(dir.path())?;
/// let answer = model.generate(&dg_engine::Request::text("Hello").max_tokens(8))?;
/// assert!(answer.stats.generated_tokens <= 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "synthetic")]
pub use dg_core::synthetic;
pub use dg_core::CoreError;
pub use dg_quant::alloc::retain_freed_memory;
pub use dg_tokenize::{Content, ContentPart, Tokenizer};
#[cfg(feature = "vision")]
pub use dg_vision::{DecodeLimits, VisionError};
pub use engine::{DiffusionGemma, LoadBuilder, DEFAULT_MAX_CONTEXT};
pub use error::EngineError;
#[cfg(feature = "hub")]
pub use hub::HubBuilder;
pub use output::{Event, FinishReason, Generation, Stats};
pub use prompt::{Image, PreparedPrompt};
pub use request::{ChatOptions, Defaults, Message, Prompt, Request, Sampler};
pub use scheduler::{Scheduler, SchedulerOptions, SchedulerStatus, Stream, Update};
pub use settings::{GenerationSettings, MAX_DENOISING_STEPS};
