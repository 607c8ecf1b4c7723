//! Research tools: the pieces of the block loop on their own, bit-identical to the reference
//! (mlx-optiq 0.7.7 on mlx 0.32.4), for parity tests, benchmarks and experiments. Generating
//! needs none of them: [`DiffusionGemma::generate`] runs them all.
//!
//! - [`rng`]: an MLX-compatible (threefry) random generator, [`Rng`], bit-identical to mlx.
//! - [`sampler`]: the reference's per-step sampling math as pure functions.
//! - [`mlx_math`]: the MLX CPU kernels (fast `exp`, reductions) those two reproduce.
//! - Single model passes outside the block loop, as methods of the loaded model (defined here):
//!   [`DiffusionGemma::prefill`] (a prompt into a fresh [`KvCache`]) and
//!   [`DiffusionGemma::decoder_logits`] (one decoder pass over a canvas).

pub mod mlx_math;
pub mod rng;
pub mod sampler;

pub use dg_core::{KvCache, SelfConditioning};
pub use rng::Rng;

use crate::error::{EngineError, Result};
use crate::DiffusionGemma;

impl DiffusionGemma {
    /// Encodes prompt ids into a fresh cache (research: see [`research`](crate::research)).
    pub fn prefill(&self, ids: &[u32]) -> Result<KvCache> {
        self.pool.install(|| {
            let mut cache = self.model.new_cache();
            self.model
                .encode(&mut cache, ids, |_, _| {})
                .map_err(|e| EngineError::Model(Box::new(e)))?;
            Ok(cache)
        })
    }

    /// One decoder pass over `canvas` after `cache`, returning soft-capped logits
    /// `[canvas, vocab]` (not divided by any schedule temperature; research: see
    /// [`research`](crate::research)).
    pub fn decoder_logits(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        sc: SelfConditioning<'_>,
    ) -> Result<Vec<f32>> {
        self.pool
            .install(|| self.model.decode(cache, canvas, sc))
            .map_err(|e| EngineError::Model(Box::new(e)))
    }
}
