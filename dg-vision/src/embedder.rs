//! `MultimodalEmbedder` (`gemma4/gemma4.py`): a scale-free RMS norm (eps = the vision config's
//! `rms_norm_eps`) then `embedding_projection` into the text hidden size.

use dg_core::checkpoint::Checkpoint;
use dg_core::config::QuantizationConfig;
use dg_core::model::Linear;

use crate::error::Result;
use crate::tower::load_linear;

pub(crate) struct Embedder {
    projection: Linear,
    eps: f32,
}

impl Embedder {
    pub fn load(
        ck: &Checkpoint,
        quant: Option<&QuantizationConfig>,
        vision_hidden: usize,
        text_hidden: usize,
        eps: f32,
    ) -> Result<Self> {
        let projection = load_linear(
            ck,
            quant,
            "model.encoder.embed_vision.embedding_projection",
            false,
            false,
            vision_hidden,
            text_hidden,
        )?;
        Ok(Self { projection, eps })
    }

    pub fn text_hidden(&self) -> usize {
        self.projection.out_dim
    }

    /// `[n, vision_hidden] -> [n, text_hidden]`.
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut normed = x.to_vec();
        dg_quant::ops::rms_norm_rows_inplace_par(
            &mut normed,
            self.projection.in_dim,
            None,
            self.eps,
        );
        Ok(self.projection.forward(&normed, n)?)
    }
}
