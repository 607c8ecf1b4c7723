//! One layer's forward pass keeping what its backward needs (its tape), and the backward.
//!
//! The forward repeats `Layer::forward` operation for operation (the same kernels in the same
//! order, the adapter's branch as `Linear::forward` adds it), so the training loss is the
//! inference model's loss bit for bit.

use rayon::prelude::*;

use dg_quant::ops;

use super::attention::{attend_head_backward, HeadGrads};
use super::grad::{
    combine_backward, geglu_backward, lora_backward, matmul, rms_norm_backward, rope_backward,
    router_weights_backward,
};
use crate::error::CoreError;
use crate::lora::LoraFactors;
use crate::model::attention::{attend_head, AttentionMask, KeyView};
use crate::model::layer::Layer;
use crate::model::linear::Linear;
use crate::model::moe::{ExpertActivations, Routing};

/// Index of each adapted module in [`LayerLora::factors`] and [`LayerGrads`]
/// (`DEFAULT_LORA_KEYS` order).
pub(crate) const Q: usize = 0;
pub(crate) const K: usize = 1;
pub(crate) const V: usize = 2;
pub(crate) const O: usize = 3;
pub(crate) const GATE: usize = 4;
pub(crate) const UP: usize = 5;
pub(crate) const DOWN: usize = 6;

/// An adapter's factors on one layer, by module.
pub(crate) struct LayerLora<'a> {
    pub(crate) factors: [Option<&'a LoraFactors>; 7],
    pub(crate) scale: f32,
}

/// Gradients `(d lora_a, d lora_b)` of one layer's factors, by module (`None`: not adapted).
pub(crate) type LayerGrads = [Option<(Vec<f32>, Vec<f32>)>; 7];

/// What a layer's attention attends over.
pub(crate) enum Pass<'a> {
    /// The encoder over the prompt (positions `0..`): causal, within `window` on sliding layers.
    Encoder { window: Option<usize> },
    /// The decoder over the canvas (positions `first_query..`): every cached key/value (per
    /// key/value head `[cached, head_dim]`, positions `first_key..`) and the canvas itself.
    Decoder {
        keys: &'a [Vec<f32>],
        values: &'a [Vec<f32>],
        first_key: usize,
        first_query: usize,
    },
}

impl Pass<'_> {
    fn first_query(&self) -> usize {
        match self {
            Pass::Encoder { .. } => 0,
            Pass::Decoder { first_query, .. } => *first_query,
        }
    }

    fn view(&self) -> KeyView<'static> {
        let (first_key, first_query, mask) = match self {
            Pass::Encoder { window } => (
                0,
                0,
                AttentionMask::Causal {
                    window: *window,
                    blocks: None,
                },
            ),
            Pass::Decoder {
                first_key,
                first_query,
                ..
            } => (*first_key, *first_query, AttentionMask::Full),
        };
        KeyView {
            keys: Vec::new(),
            values: Vec::new(),
            first_key,
            first_query,
            mask,
        }
    }
}

/// The activations of one layer's forward that its backward reads (the input is kept by the
/// caller).
pub(crate) struct Tape {
    h: Vec<f32>,
    q_raw: Vec<f32>,
    k_raw: Vec<f32>,
    v_raw: Option<Vec<f32>>,
    /// Per query head `[rows, head_dim]`, normed and rotated.
    queries: Vec<Vec<f32>>,
    /// Per key/value head, everything attended (`[cached + rows, head_dim]`).
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    attn: Vec<f32>,
    o: Vec<f32>,
    mid: Vec<f32>,
    dense_in: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    dense: Vec<f32>,
    routing: Vec<Routing>,
    gate_up: Vec<f32>,
    y: Vec<f32>,
    moe: Vec<f32>,
    sum: Vec<f32>,
}

/// `linear(x)` plus the adapter's `scale * (x @ A) @ B`, as `Linear::forward` computes it
/// with the adapter mounted.
fn adapted_forward(
    linear: &Linear,
    lora: Option<&LoraFactors>,
    scale: f32,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>, CoreError> {
    let mut out = linear.forward_base(x, m)?;
    if let Some(f) = lora {
        let xa = matmul(x, &f.a, (m, linear.in_dim, f.rank), false)?;
        let z = matmul(&xa, &f.b, (m, f.rank, linear.out_dim), false)?;
        for (o, z) in out.iter_mut().zip(&z) {
            *o += scale * z;
        }
    }
    Ok(out)
}

/// Input gradient of [`adapted_forward`]; adds the factors' gradients into `grad`.
fn adapted_backward(
    linear: &Linear,
    lora: Option<&LoraFactors>,
    scale: f32,
    x: &[f32],
    m: usize,
    d_out: &[f32],
    grad: &mut Option<(Vec<f32>, Vec<f32>)>,
) -> Result<Vec<f32>, CoreError> {
    let mut dx = linear.forward_transposed(d_out, m)?;
    if let (Some(f), Some((d_a, d_b))) = (lora, grad.as_mut()) {
        let dims = (m, linear.in_dim, f.rank, linear.out_dim);
        let d = lora_backward(x, &f.a, &f.b, dims, scale, d_out, d_a, d_b)?;
        for (a, b) in dx.iter_mut().zip(d) {
            *a += b;
        }
    }
    Ok(dx)
}

fn norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    ops::rms_norm_rows_par(x, weight.len(), Some(weight), eps, &mut out);
    out
}

fn add_into(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// Runs `layer` over `rows` rows of `x` in `pass`; returns its output and its tape.
pub(crate) fn forward(
    layer: &Layer,
    lora: &LayerLora<'_>,
    x: &[f32],
    rows: usize,
    pass: &Pass<'_>,
) -> Result<(Vec<f32>, Tape), CoreError> {
    let (eps, s) = (layer.eps, lora.scale);
    let att = &layer.attention;
    let hd = att.head_dim;
    let h = norm(x, &layer.input_layernorm, eps);
    let q_raw = adapted_forward(&att.q_proj, lora.factors[Q], s, &h, rows)?;
    let k_raw = adapted_forward(&att.k_proj, lora.factors[K], s, &h, rows)?;
    let v_raw = match &att.v_proj {
        Some(v_proj) => Some(adapted_forward(v_proj, lora.factors[V], s, &h, rows)?),
        None => None,
    };
    let first = pass.first_query();
    let angles = att.rope.angles(first..first + rows);
    // As `Attention::project`: per head, normed, then rotated for its absolute position.
    let split = |flat: &[f32], heads: usize, w: Option<&[f32]>, rope: bool| -> Vec<Vec<f32>> {
        (0..heads)
            .map(|head| {
                let mut out = vec![0.0f32; rows * hd];
                let src = flat.get(head * hd..).unwrap_or_default();
                ops::rms_norm_rows_strided(src, hd, heads * hd, w, eps, &mut out);
                if rope {
                    for (t, o) in out.chunks_exact_mut(hd).enumerate() {
                        angles.rotate(o, t);
                    }
                }
                out
            })
            .collect()
    };
    let queries = split(&q_raw, att.heads, Some(&att.q_norm), true);
    let fresh_keys = split(&k_raw, att.kv_heads, Some(&att.k_norm), true);
    let fresh_values = split(
        v_raw.as_deref().unwrap_or(&k_raw),
        att.kv_heads,
        None,
        false,
    );
    let (keys, values) = match pass {
        Pass::Encoder { .. } => (fresh_keys, fresh_values),
        Pass::Decoder { keys, values, .. } => {
            let join = |cached: &[Vec<f32>], fresh: Vec<Vec<f32>>| -> Vec<Vec<f32>> {
                cached
                    .iter()
                    .zip(fresh)
                    .map(|(c, f)| [c.as_slice(), &f].concat())
                    .collect()
            };
            (join(keys, fresh_keys), join(values, fresh_values))
        }
    };
    let view = pass.view();
    let group = att.heads / att.kv_heads;
    let per_head: Vec<Vec<f32>> = (0..att.heads)
        .into_par_iter()
        .map(|head| {
            let kv = head / group;
            attend_head(&queries[head], rows, &keys[kv], &values[kv], hd, &view)
        })
        .collect::<Result<_, _>>()
        .map_err(|source| CoreError::Quant {
            name: att.o_proj.name().replace("o_proj", "attention"),
            source,
        })?;
    let mut attn = vec![0.0f32; rows * att.heads * hd];
    for (head, out) in per_head.iter().enumerate() {
        for (t, row) in out.chunks_exact(hd).enumerate() {
            attn[(t * att.heads + head) * hd..(t * att.heads + head + 1) * hd].copy_from_slice(row);
        }
    }
    let o = adapted_forward(&att.o_proj, lora.factors[O], s, &attn, rows)?;
    let mut mid = x.to_vec();
    add_into(&mut mid, &norm(&o, &layer.post_attention_layernorm, eps));

    let dense_in = norm(&mid, &layer.pre_feedforward_layernorm, eps);
    let mlp = &layer.mlp;
    let gate = adapted_forward(&mlp.gate_proj, lora.factors[GATE], s, &dense_in, rows)?;
    let up = adapted_forward(&mlp.up_proj, lora.factors[UP], s, &dense_in, rows)?;
    let mut act = gate.clone();
    ops::geglu_inplace_par(&mut act, &up);
    let dense = adapted_forward(&mlp.down_proj, lora.factors[DOWN], s, &act, rows)?;
    let dense_n = norm(&dense, &layer.post_feedforward_layernorm_1, eps);

    let routing = layer.router.route(&mid, rows)?;
    let moe_in = norm(&mid, &layer.pre_feedforward_layernorm_2, eps);
    let (moe, ExpertActivations { gate_up, y }) =
        layer.experts.forward_keeping(&moe_in, rows, &routing)?;
    let mut sum = norm(&moe, &layer.post_feedforward_layernorm_2, eps);
    add_into(&mut sum, &dense_n);
    let ffn = norm(&sum, &layer.post_feedforward_layernorm, eps);
    let scalar = match pass {
        Pass::Encoder { .. } => layer.encoder_scalar,
        Pass::Decoder { .. } => layer.decoder_scalar,
    };
    let out: Vec<f32> = mid
        .iter()
        .zip(&ffn)
        .map(|(r, f)| (r + f) * scalar)
        .collect();
    let tape = Tape {
        h,
        q_raw,
        k_raw,
        v_raw,
        queries,
        keys,
        values,
        attn,
        o,
        mid,
        dense_in,
        gate,
        up,
        act,
        dense,
        routing,
        gate_up,
        y,
        moe,
        sum,
    };
    Ok((out, tape))
}

/// Gradients of the keys and values a pass attended, per key/value head.
pub(crate) struct KvGrads {
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
}

/// Backward of [`forward`] (`x` and `tape` from the same call) given the output's gradient
/// `d_out`. `d_cache` (encoder only) is the gradient the decoder sent to this layer's keys
/// and values of positions `first..` (post norm and RoPE, as cached). Adds the adapter's
/// gradients into `grads`; returns the input's gradient and, in a decoder pass, the gradient
/// of the cached keys and values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    layer: &Layer,
    lora: &LayerLora<'_>,
    x: &[f32],
    tape: &Tape,
    d_out: &[f32],
    pass: &Pass<'_>,
    d_cache: Option<(&KvGrads, usize)>,
    grads: &mut LayerGrads,
) -> Result<(Vec<f32>, Option<KvGrads>), CoreError> {
    let (eps, s) = (layer.eps, lora.scale);
    let hidden = layer.input_layernorm.len();
    let rows = x.len() / hidden;
    let t = tape;
    let scalar = match pass {
        Pass::Encoder { .. } => layer.encoder_scalar,
        Pass::Decoder { .. } => layer.decoder_scalar,
    };
    let d_pre: Vec<f32> = d_out.iter().map(|d| d * scalar).collect();
    let mut d_mid = d_pre.clone();
    // The encoder's last layer feeds nothing but its keys and values: skip the exact zeros.
    if d_pre.iter().any(|&v| v != 0.0) {
        let d_sum = rms_norm_backward(
            &t.sum,
            hidden,
            Some(&layer.post_feedforward_layernorm),
            eps,
            &d_pre,
        );
        ffn_backward(layer, lora, tape, &d_sum, &mut d_mid, grads)?;
    }

    let att = &layer.attention;
    let hd = att.head_dim;
    let mut d_x = d_mid.clone();
    let d_o = rms_norm_backward(
        &t.o,
        hidden,
        Some(&layer.post_attention_layernorm),
        eps,
        &d_mid,
    );
    let d_attn = adapted_backward(
        &att.o_proj,
        lora.factors[O],
        s,
        &t.attn,
        rows,
        &d_o,
        &mut grads[O],
    )?;
    let view = pass.view();
    let group = att.heads / att.kv_heads;
    let per_head: Vec<HeadGrads> = (0..att.heads)
        .into_par_iter()
        .map(|head| {
            let d_head: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    d_attn[(r * att.heads + head) * hd..(r * att.heads + head + 1) * hd]
                        .iter()
                        .copied()
                })
                .collect();
            let kv = head / group;
            attend_head_backward(
                &t.queries[head],
                rows,
                &t.keys[kv],
                &t.values[kv],
                hd,
                &view,
                &d_head,
            )
        })
        .collect::<Result<_, _>>()?;
    // Key/value gradients summed over each group's query heads, in head order.
    let n_keys = t.keys.first().map_or(0, |k| k.len() / hd);
    let mut d_keys = vec![vec![0.0f32; n_keys * hd]; att.kv_heads];
    let mut d_values = vec![vec![0.0f32; n_keys * hd]; att.kv_heads];
    for (head, g) in per_head.iter().enumerate() {
        add_into(&mut d_keys[head / group], &g.dk);
        add_into(&mut d_values[head / group], &g.dv);
    }
    if let Some((injected, first)) = d_cache {
        for (d, i) in d_keys.iter_mut().zip(&injected.keys) {
            add_into(&mut d[first * hd..], i);
        }
        for (d, i) in d_values.iter_mut().zip(&injected.values) {
            add_into(&mut d[first * hd..], i);
        }
    }
    // Decoder passes attend to the cached positions first, then to their own rows.
    let cached = n_keys - rows;
    let first = pass.first_query();
    let angles = att.rope.angles(first..first + rows);
    let cache_grads = match pass {
        Pass::Encoder { .. } => None,
        Pass::Decoder { .. } => Some(KvGrads {
            keys: d_keys.iter().map(|d| d[..cached * hd].to_vec()).collect(),
            values: d_values.iter().map(|d| d[..cached * hd].to_vec()).collect(),
        }),
    };
    // Back through RoPE and the per-head norms, into the projections' layout.
    let unsplit = |per_head: &mut dyn Iterator<Item = &[f32]>,
                   heads: usize,
                   raw: &[f32],
                   w: Option<&[f32]>,
                   rope: bool|
     -> Vec<f32> {
        let mut out = vec![0.0f32; rows * heads * hd];
        for (head, d) in per_head.enumerate() {
            for r in 0..rows {
                let mut g = d[r * hd..(r + 1) * hd].to_vec();
                if rope {
                    rope_backward(&angles, &mut g, r);
                }
                let at = (r * heads + head) * hd..(r * heads + head + 1) * hd;
                let dx = rms_norm_backward(&raw[at.clone()], hd, w, eps, &g);
                out[at].copy_from_slice(&dx);
            }
        }
        out
    };
    let dq_raw = unsplit(
        &mut per_head.iter().map(|g| g.dq.as_slice()),
        att.heads,
        &t.q_raw,
        Some(&att.q_norm),
        true,
    );
    let mut dk_raw = unsplit(
        &mut d_keys.iter().map(|d| &d[cached * hd..]),
        att.kv_heads,
        &t.k_raw,
        Some(&att.k_norm),
        true,
    );
    let dv_raw = unsplit(
        &mut d_values.iter().map(|d| &d[cached * hd..]),
        att.kv_heads,
        t.v_raw.as_deref().unwrap_or(&t.k_raw),
        None,
        false,
    );
    let mut d_h = adapted_backward(
        &att.q_proj,
        lora.factors[Q],
        s,
        &t.h,
        rows,
        &dq_raw,
        &mut grads[Q],
    )?;
    match &att.v_proj {
        Some(v_proj) => {
            let d = adapted_backward(
                v_proj,
                lora.factors[V],
                s,
                &t.h,
                rows,
                &dv_raw,
                &mut grads[V],
            )?;
            add_into(&mut d_h, &d);
        }
        // Full-attention layers: the values are the raw keys.
        None => add_into(&mut dk_raw, &dv_raw),
    }
    let d = adapted_backward(
        &att.k_proj,
        lora.factors[K],
        s,
        &t.h,
        rows,
        &dk_raw,
        &mut grads[K],
    )?;
    add_into(&mut d_h, &d);
    add_into(
        &mut d_x,
        &rms_norm_backward(x, hidden, Some(&layer.input_layernorm), eps, &d_h),
    );
    Ok((d_x, cache_grads))
}

/// Backward of the parallel dense MLP and MoE given the gradient of their normed sum; adds
/// the residual's gradient into `d_mid`.
fn ffn_backward(
    layer: &Layer,
    lora: &LayerLora<'_>,
    t: &Tape,
    d_sum: &[f32],
    d_mid: &mut [f32],
    grads: &mut LayerGrads,
) -> Result<(), CoreError> {
    let (eps, s) = (layer.eps, lora.scale);
    let hidden = layer.input_layernorm.len();
    let rows = d_sum.len() / hidden;
    let mlp = &layer.mlp;
    let norm_back =
        |x: &[f32], w: &[f32], dy: &[f32]| rms_norm_backward(x, hidden, Some(w), eps, dy);

    // Dense GeGLU MLP.
    let d_dense = norm_back(&t.dense, &layer.post_feedforward_layernorm_1, d_sum);
    let d_act = adapted_backward(
        &mlp.down_proj,
        lora.factors[DOWN],
        s,
        &t.act,
        rows,
        &d_dense,
        &mut grads[DOWN],
    )?;
    let (d_gate, d_up) = geglu_backward(&t.gate, &t.up, &d_act);
    let mut d_in = adapted_backward(
        &mlp.gate_proj,
        lora.factors[GATE],
        s,
        &t.dense_in,
        rows,
        &d_gate,
        &mut grads[GATE],
    )?;
    let d = adapted_backward(
        &mlp.up_proj,
        lora.factors[UP],
        s,
        &t.dense_in,
        rows,
        &d_up,
        &mut grads[UP],
    )?;
    add_into(&mut d_in, &d);
    add_into(
        d_mid,
        &norm_back(&t.mid, &layer.pre_feedforward_layernorm, &d_in),
    );

    // MoE through the frozen experts; routing weights differentiated, indices not.
    let experts = &layer.experts;
    let top_k = layer.router.top_k;
    let d_moe = norm_back(&t.moe, &layer.post_feedforward_layernorm_2, d_sum);
    let weights: Vec<f32> = t.routing.iter().flat_map(|r| r.weights.clone()).collect();
    let (d_w, d_y) = combine_backward(&d_moe, &t.y, &weights, hidden, top_k);
    let of_pairs: Vec<usize> = t.routing.iter().flat_map(|r| r.experts.clone()).collect();
    let d_moe_act = experts.down_proj.backward_pairs(&d_y, &of_pairs)?;
    let m = experts.moe_dim;
    let mut d_gate_up = vec![0.0f32; of_pairs.len() * 2 * m];
    for ((dgu, gu), da) in d_gate_up
        .chunks_exact_mut(2 * m)
        .zip(t.gate_up.chunks_exact(2 * m))
        .zip(d_moe_act.chunks_exact(m))
    {
        let (dg, du) = geglu_backward(&gu[..m], &gu[m..], da);
        dgu[..m].copy_from_slice(&dg);
        dgu[m..].copy_from_slice(&du);
    }
    let d_pairs = experts.gate_up_proj.backward_pairs(&d_gate_up, &of_pairs)?;
    let mut d_moe_in = vec![0.0f32; rows * hidden];
    for (p, d) in d_pairs.chunks_exact(hidden).enumerate() {
        add_into(
            &mut d_moe_in[(p / top_k) * hidden..(p / top_k + 1) * hidden],
            d,
        );
    }
    add_into(
        d_mid,
        &norm_back(&t.mid, &layer.pre_feedforward_layernorm_2, &d_moe_in),
    );

    // Router: scores recomputed as `Router::route` computes them; the projection is frozen.
    let router = &layer.router;
    let scores = router
        .proj
        .forward_base(&router.normed_input(&t.mid)?, rows)?;
    let n_experts = router.per_expert_scale.len();
    let mut d_scores = vec![0.0f32; rows * n_experts];
    for (r, routing) in t.routing.iter().enumerate() {
        router_weights_backward(
            &scores[r * n_experts..(r + 1) * n_experts],
            &routing.experts,
            &router.per_expert_scale,
            &d_w[r * top_k..(r + 1) * top_k],
            &mut d_scores[r * n_experts..(r + 1) * n_experts],
        );
    }
    let d_normed = router.proj.forward_transposed(&d_scores, rows)?;
    let root = (hidden as f32).powf(-0.5);
    let w: Vec<f32> = router.scale.iter().map(|s| s * root).collect();
    add_into(
        d_mid,
        &rms_norm_backward(&t.mid, hidden, Some(&w), router.eps, &d_normed),
    );
    Ok(())
}
