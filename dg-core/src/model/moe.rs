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
        let pairs = PairsByExpert::new(routing);
        Ok(self.forward_by_expert(x, rows, routing, &pairs)?.0)
    }

    /// [`Experts::forward`], also returning the per-pair activations the training backward
    /// reads.
    pub(crate) fn forward_keeping(
        &self,
        x: &[f32],
        rows: usize,
        routing: &[Routing],
    ) -> Result<(Vec<f32>, ExpertActivations), CoreError> {
        let pairs = PairsByExpert::new(routing);
        let (out, by_expert) = self.forward_by_expert(x, rows, routing, &pairs)?;
        let in_routing_order = |sorted: &[f32], width: usize| -> Result<Vec<f32>, CoreError> {
            let mut v = alloc::zeroed(sorted.len(), "expert activations in routing order")?;
            v.par_chunks_exact_mut(width)
                .zip(&pairs.place)
                .for_each(|(row, &i)| row.copy_from_slice(&sorted[i * width..(i + 1) * width]));
            Ok(v)
        };
        let acts = ExpertActivations {
            gate_up: in_routing_order(&by_expert.gate_up, 2 * self.moe_dim)?,
            y: in_routing_order(&by_expert.y, self.down_proj.out_dim)?,
        };
        Ok((out, acts))
    }

    /// The experts' output, and the activations with the pairs in expert order
    /// (`pairs.sorted`). In that order each expert's rows are one block from the
    /// gate/up product to the down product, so neither copies a row; each row is computed as
    /// it would be alone, so the order changes no result.
    fn forward_by_expert(
        &self,
        x: &[f32],
        rows: usize,
        routing: &[Routing],
        pairs: &PairsByExpert,
    ) -> Result<(Vec<f32>, ExpertActivations), CoreError> {
        let n = pairs.sorted.len();
        let gate_up = self.gate_up_proj.forward_pairs(x, rows, &pairs.sorted)?;
        let m = self.moe_dim;
        let mut act = alloc::zeroed(n * m, "expert activations [rows x top_k, moe]")?;
        act.par_chunks_exact_mut(m)
            .zip(gate_up.par_chunks_exact(2 * m))
            .for_each(|(a, gu)| {
                a.copy_from_slice(&gu[..m]);
                ops::geglu_inplace(a, &gu[m..]);
            });
        let down_pairs: Vec<(usize, usize)> = pairs
            .sorted
            .iter()
            .enumerate()
            .map(|(i, &(_, e))| (i, e))
            .collect();
        let y = self.down_proj.forward_pairs(&act, n, &down_pairs)?;
        let hidden = self.down_proj.out_dim;
        let mut out = alloc::zeroed(rows * hidden, "expert output [rows, hidden]")?;
        // Each token's first pair in routing order.
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
                    let i = pairs.place[p + j];
                    let y = &y[i * hidden..(i + 1) * hidden];
                    for (o, v) in o.iter_mut().zip(y) {
                        *o += v * w;
                    }
                }
            });
        Ok((out, ExpertActivations { gate_up, y }))
    }
}

/// The routing's (token, expert) pairs sorted by expert, stably (within an expert by token,
/// as `gather_matmul_t` groups them), and where each pair of routing order went.
struct PairsByExpert {
    /// `(token, expert)`, sorted by expert.
    sorted: Vec<(usize, usize)>,
    /// For the routing-order pair `p` (token, then its experts highest score first), its
    /// index in `sorted`.
    place: Vec<usize>,
}

impl PairsByExpert {
    fn new(routing: &[Routing]) -> Self {
        let pairs: Vec<(usize, usize)> = routing
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.experts.iter().map(move |&e| (t, e)))
            .collect();
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&p| pairs[p].1);
        let mut place = vec![0; pairs.len()];
        for (i, &p) in order.iter().enumerate() {
            place[p] = i;
        }
        PairsByExpert {
            sorted: order.iter().map(|&p| pairs[p]).collect(),
            place,
        }
    }
}

/// The per-pair activations of [`Experts::forward`]: pairs in routing order (token, then its
/// experts highest score first) where the training backward reads them.
pub(crate) struct ExpertActivations {
    /// Fused gate and up projections `[pairs, 2 * moe_dim]`, gate first.
    pub(crate) gate_up: Vec<f32>,
    /// Each chosen expert's output before its routing weight, `[pairs, hidden]`.
    pub(crate) y: Vec<f32>,
}
