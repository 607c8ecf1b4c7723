//! `gather_matmul_t`: the MoE product. Pairs are grouped by expert; each expert is one task
//! that runs the `x @ W^T` plan of the experts' format, whose column panels idle threads may
//! take over (so an expert chosen by many tokens does not keep the others waiting).

use rayon::prelude::*;

use super::{check_x, Plan, Product, Rows};
use crate::format::{check_len, mul};
use crate::kernels::Kernels;
use crate::scratch::with_buffer;
use crate::{QExperts, QuantError};

/// MoE gathered product (`mx.gather_qmm(x, w, scales, biases, rhs_indices=..., transpose=True)`):
/// for each pair `p = (x_row, expert)`, `out[p, :] = x[x_row, :] @ W_expert^T`
/// (`out [pairs.len(), rows]`). Pairs are grouped by expert (stably, as MLX's sorted path does)
/// so each expert's weights are read once per call; experts run in parallel. Pairs that come
/// sorted by expert have each expert's outputs written as one block; x rows are read in
/// place.
pub fn gather_matmul_t(
    x: &[f32],
    x_rows: usize,
    experts: &QExperts,
    pairs: &[(usize, usize)],
    out: &mut [f32],
) -> Result<(), QuantError> {
    gather_matmul_t_on(Kernels::best(), x, x_rows, experts, pairs, out)
}

/// [`gather_matmul_t`] on the given kernels.
pub(crate) fn gather_matmul_t_on(
    kernels: Kernels,
    x: &[f32],
    x_rows: usize,
    experts: &QExperts,
    pairs: &[(usize, usize)],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (k, n) = (experts.cols(), experts.rows);
    check_x("gather_matmul_t input x", x, x_rows, k)?;
    check_len(
        "gather_matmul_t output",
        out.len(),
        mul("gather_matmul_t output", pairs.len(), n)?,
    )?;
    for (pair, &(x_row, expert)) in pairs.iter().enumerate() {
        if x_row >= x_rows || expert >= experts.experts {
            return Err(QuantError::PairOutOfRange {
                pair,
                x_row,
                expert,
                x_rows,
                experts: experts.experts,
            });
        }
    }
    if pairs.is_empty() || n == 0 {
        return Ok(());
    }
    let plan = Plan::for_weights(Product::XWt, experts.spec(), kernels);
    // Stable counting sort of the pairs by expert.
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts.experts];
    for (p, &(_, e)) in pairs.iter().enumerate() {
        by_expert[e].push(p);
    }
    // Each expert's task owns its pairs' output rows (disjoint: a pair has one expert): one
    // block when the pairs come sorted by expert, else row by row.
    let sorted = pairs.windows(2).all(|w| w[0].1 <= w[1].1);
    let groups = by_expert
        .iter()
        .enumerate()
        .filter(|(_, ps)| !ps.is_empty());
    let slots: Vec<(usize, &[usize], Dest<'_>)> = if sorted {
        let mut rest = out;
        groups
            .map(|(e, ps)| {
                let (block, tail) = std::mem::take(&mut rest).split_at_mut(ps.len() * n);
                rest = tail;
                (e, ps.as_slice(), Dest::Block(block))
            })
            .collect()
    } else {
        let mut out_rows: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(n).map(Some).collect();
        groups
            .map(|(e, ps)| {
                let rows = ps.iter().filter_map(|&p| out_rows[p].take()).collect();
                (e, ps.as_slice(), Dest::Rows(rows))
            })
            .collect()
    };
    slots.into_par_iter().try_for_each(|(e, ps, dest)| {
        let w = experts.expert(e)?;
        let m = ps.len();
        if k == 0 {
            match dest {
                Dest::Block(block) => block.fill(0.0),
                Dest::Rows(mut rows) => rows.iter_mut().for_each(|r| r.fill(0.0)),
            }
            return Ok(());
        }
        // The expert's rows of x are read in place (into the scaled copy its product makes).
        let picked: Vec<usize> = ps.iter().map(|&p| pairs[p].0).collect();
        let xs = Rows::picked(x, k, &picked);
        // Nested in the experts' tasks: rayon splits the panels only when a thread is idle, and
        // each panel computes the same bits on any thread.
        match dest {
            Dest::Block(block) => plan.run_rows(xs, m, &w, block, true),
            Dest::Rows(mut rows) => with_buffer(m * n, |res| {
                plan.run_rows(xs, m, &w, res, true);
                for (row, r) in rows.iter_mut().zip(res.chunks_exact(n)) {
                    row.copy_from_slice(r);
                }
            }),
        }
        Ok::<(), QuantError>(())
    })
}

/// Where an expert's task writes its pairs' outputs.
enum Dest<'a> {
    /// Consecutive output rows, one block.
    Block(&'a mut [f32]),
    /// Scattered output rows, in the expert's pair order.
    Rows(Vec<&'a mut [f32]>),
}
