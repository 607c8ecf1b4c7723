//! dg-engine: the DiffusionGemma generation engine.
//!
//! - [`rng`]: an MLX-compatible (threefry) random generator, bit-identical to mlx 0.32.4.
//! - [`sampler`]: the reference's per-step sampling math as pure functions.
//! - [`mlx_math`]: the MLX CPU kernels (fast `exp`, reductions) those two reproduce.

pub mod error;
pub mod mlx_math;
pub mod rng;
pub mod sampler;

pub use error::EngineError;
pub use rng::Rng;
