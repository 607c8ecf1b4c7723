//! Rotary position embeddings: default RoPE on sliding layers, proportional partial RoPE on
//! full-attention layers. Both rotate pairs `(x[i], x[i + head_dim/2])` ("rotate half", MLX's
//! `traditional=False`); proportional RoPE rotates only the first `rotated/2` pairs with
//! frequencies relative to the full head dimension, as the reference does.

use crate::config::RopeParameters;

/// The rotation of one layer type.
#[derive(Clone, Debug)]
pub struct Rope {
    half: usize,
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Builds the rotation for a head of `head_dim` from the layer type's parameters.
    pub fn new(head_dim: usize, params: &RopeParameters) -> Self {
        let half = head_dim / 2;
        let inv_freq = if params.rope_type == "proportional" {
            // ProportionalRoPE: freqs = factor * base^(2i / head_dim), inverted by fast.rope.
            let angles = (params.partial_rotary_factor * head_dim as f64 / 2.0) as usize;
            (0..angles)
                .map(|i| {
                    let exponent = (2 * i) as f32 / head_dim as f32;
                    let freq = params.factor as f32 * (params.rope_theta as f32).powf(exponent);
                    1.0 / freq
                })
                .collect()
        } else {
            (0..half)
                .map(|i| (params.rope_theta as f32).powf(-((2 * i) as f32) / head_dim as f32))
                .collect()
        };
        Rope { half, inv_freq }
    }

    /// Rotates one head vector in place for absolute position `position`.
    pub fn apply(&self, head: &mut [f32], position: usize) {
        let (left, right) = head.split_at_mut(self.half);
        let n = self.inv_freq.len();
        dg_quant::ops::rope_rotate_half(
            &mut left[..n],
            &mut right[..n],
            position as f32,
            &self.inv_freq,
        );
    }
}
