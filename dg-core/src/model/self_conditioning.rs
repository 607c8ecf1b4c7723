//! Self-conditioning: the decoder's canvas embeddings are mixed with the previous step's soft
//! embeddings through a small GeGLU block, then RMS-normed without scale.

use dg_quant::{alloc, ops};

use super::mlp::Mlp;
use crate::error::CoreError;

/// `post_norm(embeds + mlp(pre_norm(soft)))`.
#[derive(Debug)]
pub struct SelfConditioningBlock {
    /// RMS-norm weight `[hidden]` on the soft embeddings.
    pub pre_norm: Vec<f32>,
    /// The GeGLU block.
    pub mlp: Mlp,
    /// Epsilon of both norms.
    pub eps: f32,
}

impl SelfConditioningBlock {
    /// Mixes `soft` (or zeros) into the canvas embeddings.
    pub fn forward(
        &self,
        embeds: &[f32],
        soft: Option<&[f32]>,
        rows: usize,
    ) -> Result<Vec<f32>, CoreError> {
        let hidden = self.pre_norm.len();
        let mut h = alloc::copied(embeds, "decoder input [canvas, hidden]")?;
        // With zero soft embeddings every product below is exactly zero (the norm of a zero
        // row is zero, quantized products of zeros are zero), so skipping them is exact.
        if let Some(soft) = soft {
            let mut normed = alloc::zeroed(soft.len(), "self-conditioning input [canvas, hidden]")?;
            ops::rms_norm_rows_par(soft, hidden, Some(&self.pre_norm), self.eps, &mut normed);
            let signal = self.mlp.forward(&normed, rows)?;
            for (v, s) in h.iter_mut().zip(&signal) {
                *v += s;
            }
        }
        ops::rms_norm_rows_inplace_par(&mut h, hidden, None, self.eps);
        Ok(h)
    }
}
