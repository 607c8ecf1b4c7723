//! The dense GeGLU MLP (also the body of the self-conditioning block).

use dg_quant::ops;

use super::linear::Linear;
use crate::error::CoreError;

/// `down(gelu_tanh(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    /// Gate projection `[intermediate, hidden]` (through `gelu_tanh`).
    pub gate_proj: Linear,
    /// Up projection `[intermediate, hidden]`.
    pub up_proj: Linear,
    /// Down projection `[hidden, intermediate]`.
    pub down_proj: Linear,
}

impl Mlp {
    /// Applies the MLP to `rows` rows of `x`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, CoreError> {
        let mut gate = self.gate_proj.forward(x, rows)?;
        let up = self.up_proj.forward(x, rows)?;
        ops::geglu_inplace_par(&mut gate, &up);
        self.down_proj.forward(&gate, rows)
    }
}
