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

    /// The rotation angles of `positions`, computed once for every head of a pass (each head
    /// of a row turns by the same angles).
    pub fn angles(&self, positions: impl ExactSizeIterator<Item = usize>) -> RopeAngles {
        let n = self.inv_freq.len();
        let mut cos = vec![0.0f32; positions.len() * n];
        let mut sin = vec![0.0f32; positions.len() * n];
        let rows = cos.chunks_exact_mut(n).zip(sin.chunks_exact_mut(n));
        for ((c, s), p) in rows.zip(positions) {
            for ((c, s), f) in c.iter_mut().zip(s.iter_mut()).zip(&self.inv_freq) {
                (*s, *c) = (p as f32 * f).sin_cos();
            }
        }
        RopeAngles {
            half: self.half,
            n,
            cos,
            sin,
        }
    }
}

/// The cosines and sines of one layer type's rotation at a list of positions ([`Rope::angles`]).
#[derive(Clone, Debug)]
pub struct RopeAngles {
    half: usize,
    n: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// Rotates one head vector in place for the `i`-th position.
    pub fn rotate(&self, head: &mut [f32], i: usize) {
        let (left, right) = head.split_at_mut(self.half);
        let at = i * self.n..(i + 1) * self.n;
        dg_quant::ops::rope_rotate_half(
            &mut left[..self.n],
            &mut right[..self.n],
            &self.cos[at.clone()],
            &self.sin[at],
        );
    }
}
