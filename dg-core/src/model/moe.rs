//! The routed mixture of experts that runs beside the dense MLP in every layer.
//!
//! Routing follows the reference exactly: the router sees the *raw* residual,
//! normalized by the literal two-step `rms_norm(x) * scale * hidden^-0.5`; the top-k are chosen
//! like `argpartition` (on equal scores the larger expert index wins); the weights are
//! `softmax(top-k scores) * per_expert_scale`, not renormalized.

use dg_quant::{alloc, ops};
use rayon::prelude::*;

use super::linear::{ExpertLinear, Linear};
use crate::error::CoreError;

/// Router weights.
#[derive(Debug)]
pub struct Router {
    /// Score projection `[experts, hidden]`.
    pub proj: Linear,
    /// Per-channel scale `[hidden]` applied after the scale-free RMS norm.
    pub scale: Vec<f32>,
    /// Factor on each chosen expert's weight, `[experts]`.
    pub per_expert_scale: Vec<f32>,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Epsilon of the RMS norm.
    pub eps: f32,
}

/// The experts chosen for one token and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Chosen expert indices, highest score first (`top_k` of them).
    pub experts: Vec<usize>,
    /// Each chosen expert's weight, aligned with `experts`.
    pub weights: Vec<f32>,
}

impl Router {
    /// Routes each of `rows` residual rows to `top_k` experts.
    pub fn route(&self, residual: &[f32], rows: usize) -> Result<Vec<Routing>, CoreError> {
        let normed = self.normed_input(residual)?;
        let scores = self.proj.forward(&normed, rows)?;
        let experts = self.per_expert_scale.len();
        Ok(scores
            .par_chunks_exact(experts)
            .map(|row| self.pick(row))
            .collect())
    }

    /// The projection's input: the scale-free RMS norm of each residual row, times `scale`
    /// and `hidden^-0.5` (the training backward recomputes the scores from it).
    pub(crate) fn normed_input(&self, residual: &[f32]) -> Result<Vec<f32>, CoreError> {
        let hidden = self.scale.len();
        let root = (hidden as f32).powf(-0.5);
        let mut normed = alloc::zeroed(residual.len(), "router input [rows, hidden]")?;
        ops::rms_norm_rows_par(residual, hidden, None, self.eps, &mut normed);
        normed.par_chunks_exact_mut(hidden).for_each(|row| {
            for (v, s) in row.iter_mut().zip(&self.scale) {
                *v = *v * s * root;
            }
        });
        Ok(normed)
    }

    fn pick(&self, scores: &[f32]) -> Routing {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Highest score first; among equal scores the larger index first (argpartition's pick).
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));
        order.truncate(self.top_k);
        let mut weights: Vec<f32> = order.iter().map(|&e| scores[e]).collect();
        ops::softmax_inplace(&mut weights);
        for (w, &e) in weights.iter_mut().zip(&order) {
            *w *= self.per_expert_scale[e];
        }
        Routing {
            experts: order,
            weights,
        }
    }
}

/// The experts: fused `gate_up_proj` (gate rows first) and `down_proj`.
#[derive(Debug)]
pub struct Experts {
    /// Fused gate and up projections `[E, 2 * moe_dim, hidden]`, gate rows first.
    pub gate_up_proj: ExpertLinear,
    /// Down projections `[E, hidden, moe_dim]`.
    pub down_proj: ExpertLinear,
    /// Hidden width of each expert (`moe_intermediate_size`).
    pub moe_dim: usize,
}

impl Experts {
    /// `sum_k weight_k * expert_k(x)` for every row of `x` (already normed).
    pub fn forward(
        &self,
        x: &[f32],
        rows: usize,
        routing: &[Routing],
    ) -> Result<Vec<f32>, CoreError> {
        Ok(self.forward_keeping(x, rows, routing)?.0)
    }

    /// [`Experts::forward`], also returning the per-pair activations the training backward
    /// reads.
    pub(crate) fn forward_keeping(
        &self,
        x: &[f32],
        rows: usize,
        routing: &[Routing],
    ) -> Result<(Vec<f32>, ExpertActivations), CoreError> {
        let pairs: Vec<(usize, usize)> = routing
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.experts.iter().map(move |&e| (t, e)))
            .collect();
        let gate_up = self.gate_up_proj.forward_pairs(x, rows, &pairs)?;
        let m = self.moe_dim;
        let mut act = alloc::zeroed(pairs.len() * m, "expert activations [rows x top_k, moe]")?;
        act.par_chunks_exact_mut(m)
            .zip(gate_up.par_chunks_exact(2 * m))
            .for_each(|(a, gu)| {
                a.copy_from_slice(&gu[..m]);
                ops::geglu_inplace(a, &gu[m..]);
            });
        let down_pairs: Vec<(usize, usize)> = pairs
            .iter()
            .enumerate()
            .map(|(p, &(_, e))| (p, e))
            .collect();
        let y = self
            .down_proj
            .forward_pairs(&act, pairs.len(), &down_pairs)?;
        let hidden = self.down_proj.out_dim;
        let mut out = alloc::zeroed(rows * hidden, "expert output [rows, hidden]")?;
        // Each token's first pair (pairs are in routing order).
        let first_pair: Vec<usize> = routing
            .iter()
            .scan(0, |p, r| {
                let first = *p;
                *p += r.weights.len();
                Some(first)
            })
            .collect();
        out.par_chunks_exact_mut(hidden)
            .zip(routing.par_iter().zip(first_pair))
            .for_each(|(o, (r, p))| {
                for (j, &w) in r.weights.iter().enumerate() {
                    let y = &y[(p + j) * hidden..(p + j + 1) * hidden];
                    for (o, v) in o.iter_mut().zip(y) {
                        *o += v * w;
                    }
                }
            });
        Ok((out, ExpertActivations { gate_up, y }))
    }
}

/// The per-pair activations of [`Experts::forward`], pairs in routing order (token, then
/// its experts highest score first).
pub(crate) struct ExpertActivations {
    /// Fused gate and up projections `[pairs, 2 * moe_dim]`, gate first.
    pub(crate) gate_up: Vec<f32>,
    /// Each chosen expert's output before its routing weight, `[pairs, hidden]`.
    pub(crate) y: Vec<f32>,
}
