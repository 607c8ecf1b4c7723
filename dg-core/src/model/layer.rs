//! One transformer layer: attention, then a dense GeGLU MLP and a routed MoE in parallel, with
//! Gemma-4's seven norms and a layer scalar. The same weights serve the encoder and the decoder;
//! only the layer scalar differs (the encoder has its own).

use dg_quant::ops;

use super::attention::{Attention, AttentionMask};
use super::batch::Segments;
use super::cache::LayerCache;
use super::mlp::Mlp;
use super::moe::{Experts, Router};
use crate::error::CoreError;

/// Weights of one layer.
#[derive(Debug)]
pub struct Layer {
    /// Self-attention.
    pub attention: Attention,
    /// The dense GeGLU MLP.
    pub mlp: Mlp,
    /// Routes each row to its top-k experts.
    pub router: Router,
    /// The routed experts.
    pub experts: Experts,
    /// RMS-norm weight `[hidden]` before attention.
    pub input_layernorm: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the attention output.
    pub post_attention_layernorm: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the dense MLP's input.
    pub pre_feedforward_layernorm: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the sum of the MLP and MoE outputs.
    pub post_feedforward_layernorm: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the dense MLP's output.
    pub post_feedforward_layernorm_1: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the experts' input.
    pub pre_feedforward_layernorm_2: Vec<f32>,
    /// RMS-norm weight `[hidden]` on the experts' output.
    pub post_feedforward_layernorm_2: Vec<f32>,
    /// Factor on the residual stream at the end of a decoder pass.
    pub decoder_scalar: f32,
    /// Factor on the residual stream at the end of an encoder pass.
    pub encoder_scalar: f32,
    /// Epsilon of every norm of the layer.
    pub eps: f32,
}

/// Which pass a layer runs in, for every sequence of a packed batch (one cache each).
pub enum Pass<'a, 'm> {
    /// Encoder: causal attention under each sequence's mask, appends to its cache.
    Encoder {
        /// This layer's cache of each sequence.
        caches: &'a mut [&'m mut LayerCache],
        /// Each sequence's attention mask.
        masks: &'a [AttentionMask<'m>],
    },
    /// Decoder: each canvas over its cache's kept prompt positions `visible`.
    Decoder {
        /// This layer's cache of each canvas's sequence.
        caches: &'a [&'m LayerCache],
        /// Cache positions each canvas attends to.
        visible: &'a [std::ops::Range<usize>],
    },
}

impl Layer {
    /// The linear layer a LoRA key (`self_attn.q_proj`, `mlp.up_proj`, ...) names, if this
    /// layer has it.
    pub(crate) fn adaptable_mut(&mut self, module: &str) -> Option<&mut super::linear::Linear> {
        let a = &mut self.attention;
        Some(match module {
            "self_attn.q_proj" => &mut a.q_proj,
            "self_attn.k_proj" => &mut a.k_proj,
            "self_attn.v_proj" => a.v_proj.as_mut()?,
            "self_attn.o_proj" => &mut a.o_proj,
            "mlp.gate_proj" => &mut self.mlp.gate_proj,
            "mlp.up_proj" => &mut self.mlp.up_proj,
            "mlp.down_proj" => &mut self.mlp.down_proj,
            _ => return None,
        })
    }

    fn norm(&self, x: &[f32], weight: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0f32; x.len()];
        ops::rms_norm_rows_par(x, weight.len(), Some(weight), self.eps, &mut out);
        out
    }

    /// Runs the layer over the packed hidden states `x` of the sequences in `segments`, in
    /// place. Everything but attention is row-wise.
    pub fn forward(
        &self,
        x: &mut [f32],
        segments: &Segments,
        pass: Pass<'_, '_>,
    ) -> Result<(), CoreError> {
        let rows = segments.rows();
        let h = self.norm(x, &self.input_layernorm);
        let (attn, scalar) = match pass {
            Pass::Encoder { caches, masks } => (
                self.attention
                    .forward_encoder(&h, segments, caches, masks)?,
                self.encoder_scalar,
            ),
            Pass::Decoder { caches, visible } => (
                self.attention
                    .forward_decoder(&h, segments, caches, visible)?,
                self.decoder_scalar,
            ),
        };
        let attn = self.norm(&attn, &self.post_attention_layernorm);
        ops::elementwise_par(x, &attn, |r, a| *r += a);
        let residual: &[f32] = x;

        let dense_in = self.norm(residual, &self.pre_feedforward_layernorm);
        let dense = self.mlp.forward(&dense_in, rows)?;
        let dense = self.norm(&dense, &self.post_feedforward_layernorm_1);

        let routing = self.router.route(residual, rows)?;
        let moe_in = self.norm(residual, &self.pre_feedforward_layernorm_2);
        let moe = self.experts.forward(&moe_in, rows, &routing)?;
        let mut moe = self.norm(&moe, &self.post_feedforward_layernorm_2);

        ops::elementwise_par(&mut moe, &dense, |m, d| *m += d);
        let ffn = self.norm(&moe, &self.post_feedforward_layernorm);
        ops::elementwise_par(x, &ffn, |r, f| *r = (*r + f) * scalar);
        Ok(())
    }
}
