//! The LoRA training objective and its gradient: the reference's denoising loss
//! (mlx-optiq's `optiq/vlm/diffusion_gemma/lora.py`, `diffusion_loss`) on one example whose
//! corruption is already drawn, and the gradient of every adapter factor, by a hand-written
//! backward pass in f32.
//!
//! The forward is what `model(input_ids=prompt, canvas_ids=canvas)` computes in the reference:
//! an encoder pass over the prompt into a fresh cache, the decoder over the canvas with no
//! self-conditioning signal (the reference feeds zero soft embeddings, whose contribution is
//! exactly zero, as in [`TextModel::decode`]), the tied soft-capped head; then
//! `loss = sum_t corrupt_t ce_t / max(sum corrupt, 1)`. It repeats dg's inference forward
//! operation for operation, so the loss is that of the inference model with the adapter mounted.
//!
//! Gradients reach the adapter through everything between: the head and soft cap, every norm
//! and layer scalar, attention (masks, q/k/v norms, RoPE, sliding window, shared key/value
//! heads, full layers' values taken from the raw keys), the dense GeGLU MLP, the MoE block
//! (routing indices are constants, routing weights `softmax(top-k scores) * per_expert_scale`
//! are differentiated; the frozen experts and router projection pass gradients to their
//! inputs through `x @ W` products), and the encoder: the decoder attends to the encoder's
//! cached keys and values, so their gradients flow back through the encoder's layers (with
//! the encoder's layer scalars). Base weights, norms and embeddings are frozen.
//!
//! # Memory
//!
//! The forward keeps only each layer's input (both passes) and the keys/values the decoder
//! reads; the backward recomputes one layer's forward at a time to get its activations
//! (attention probabilities are recomputed a query block of 256 at a time). In f32 values, with
//! `L` layers, prompt `P`, canvas `C`, hidden `H`, vocab `V`, attention heads `A`, head dims
//! `d` (sliding) / `d_g` (full), key/value heads `k` / `k_g`, window `W`, MLP width `I`, expert
//! width `m`, top-k `K`, and `n = max(P, C)` the rows of the recomputed layer:
//! - layer inputs: `L (P + C) H`;
//! - cached keys/values and their gradients: `4 (L_s min(P, W-1) k d + L_f P k_g d_g)`;
//! - the head: `C V` (logits, turned into their gradient in place; freed before the layers);
//! - one layer's tape: `n (14 H + 3 A d_g + 3 I + K (2 m + H))` at most (full-attention
//!   layers), plus the attended keys/values `2 (P + C) k d`, and about as much again in the
//!   backward's transient gradients; per running thread a `256 x (P + C)` score block;
//! - the adapter's factors and their gradients.
//!
//! For the real geometry (L = 30: 25 sliding, 5 full; H = 2816, V = 262144, C = 256, A = 16,
//! d = 256, d_g = 512, k = 8, k_g = 2, W = 1024, I = 2112, m = 704, K = 8) and a prompt of
//! P = 512: layer inputs 30 x 768 x 2816 x 4 B = 260 MB, cached keys/values and their gradients
//! 4 x (25 x 512 x 2048 + 5 x 512 x 1024) x 4 B = 460 MB, the head 256 x 262144 x 4 B = 268 MB,
//! one layer's tape and transients about 512 x 210000 x 4 B = 430 MB: about 1.4 GB beside the
//! checkpoint, growing linearly with the prompt (about 2.1 MB per prompt token while P < W,
//! 1.2 MB past it, where the sliding layers' cached keys stop growing).

mod attention;
mod grad;
mod layer;

use std::collections::BTreeMap;

use dg_quant::ops;

use crate::config::LayerType;
use crate::error::CoreError;
use crate::lora::{split_module_path, Adapter, DEFAULT_LORA_KEYS};
use crate::model::TextModel;
use layer::{KvGrads, LayerGrads, LayerLora, Pass};

/// One training example with its corruption drawn: the canvas is the target with the
/// corrupted positions replaced by noise tokens.
#[derive(Clone, Copy, Debug)]
pub struct TrainExample<'a> {
    /// Prompt token ids (chat-templated), run through the encoder.
    pub prompt_ids: &'a [u32],
    /// The corrupted canvas, run through the decoder.
    pub canvas_ids: &'a [u32],
    /// The clean target, one id per canvas position.
    pub target_ids: &'a [u32],
    /// Which canvas positions were corrupted (the loss covers only these).
    pub corrupt: &'a [bool],
}

/// The loss of one example and the gradient of every adapter factor.
#[derive(Clone, Debug)]
pub struct LossAndGrads {
    /// Mean cross-entropy over the corrupted positions (0 when none is).
    pub loss: f32,
    /// Number of corrupted positions.
    pub corrupted: usize,
    /// Module path -> (d lora_a `[in, rank]`, d lora_b `[rank, out]`), for every factor of the
    /// adapter.
    pub grads: BTreeMap<String, (Vec<f32>, Vec<f32>)>,
}

/// Maps a failed internal product to an error naming the backward pass.
fn shape_err(source: dg_quant::QuantError) -> CoreError {
    CoreError::Quant {
        name: "the LoRA backward pass".into(),
        source,
    }
}

/// The denoising loss of `ex` on `model` with `adapter`'s factors acting on their layers (the
/// model's own mounted adapter, if any, is ignored), and the gradient of every factor.
pub fn diffusion_loss_and_grads(
    model: &TextModel,
    adapter: &Adapter,
    ex: &TrainExample<'_>,
) -> Result<LossAndGrads, CoreError> {
    check_example(model, ex)?;
    let loras = layer_loras(model, adapter)?;
    let t = &model.config.text;
    let hidden = model.hidden_size();
    let (p, c) = (ex.prompt_ids.len(), ex.canvas_ids.len());
    let n_layers = model.layers.len();
    let window = t.sliding_window;
    // Per layer: the encoder pass's attention and the first cached position the canvas sees
    // (sliding layers: the last `window - 1`, as `TextModel::decode` reads the trimmed cache).
    let passes: Vec<(Option<usize>, usize)> = model
        .layer_types
        .iter()
        .map(|lt| match lt {
            LayerType::SlidingAttention => {
                (Some(window), p.saturating_sub(window.saturating_sub(1)))
            }
            LayerType::FullAttention => (None, 0),
        })
        .collect();

    // Encoder forward: keep each layer's input and the keys/values the decoder will read.
    let mut enc_inputs = Vec::with_capacity(n_layers);
    let mut cached: Vec<KvGrads> = Vec::with_capacity(n_layers);
    let mut h = model.embed_prompt(ex.prompt_ids)?;
    for (l, layer) in model.layers.iter().enumerate() {
        let (window, first) = passes[l];
        let pass = Pass::Encoder { window };
        let (out, tape) = layer::forward(layer, &loras[l], &h, p, &pass)?;
        let hd = layer.attention.head_dim;
        cached.push(KvGrads {
            keys: tape.keys.iter().map(|k| k[first * hd..].to_vec()).collect(),
            values: tape
                .values
                .iter()
                .map(|v| v[first * hd..].to_vec())
                .collect(),
        });
        enc_inputs.push(std::mem::replace(&mut h, out));
    }
    drop(h);
    let decoder_pass = |l: usize| Pass::Decoder {
        keys: &cached[l].keys,
        values: &cached[l].values,
        first_key: passes[l].1,
        first_query: p,
    };

    // Decoder forward.
    let embeds = model.embed(ex.canvas_ids)?;
    let mut h = model.self_conditioning.forward(&embeds, None, c)?;
    drop(embeds);
    let mut dec_inputs = Vec::with_capacity(n_layers);
    for (l, layer) in model.layers.iter().enumerate() {
        let (out, _) = layer::forward(layer, &loras[l], &h, c, &decoder_pass(l))?;
        dec_inputs.push(std::mem::replace(&mut h, out));
    }
    let eps = t.rms_norm_eps;
    let mut normed = h.clone();
    ops::rms_norm_rows_inplace(&mut normed, hidden, Some(&model.norm), eps);
    let mut logits = model.logits(&normed, c)?;
    drop(normed);
    let cap = t.final_logit_softcapping.filter(|c| *c > 0.0);
    let vocab = model.vocab_size();
    let loss = grad::softcap_cross_entropy(&mut logits, vocab, ex.target_ids, ex.corrupt, cap);
    let d_normed = model.embed_tokens.forward_transposed(&logits, c)?;
    drop(logits);
    let mut d_h = grad::rms_norm_backward(&h, hidden, Some(&model.norm), eps, &d_normed);
    drop((h, d_normed));

    let mut grads: Vec<LayerGrads> = loras
        .iter()
        .map(|lora| {
            lora.factors
                .map(|f| f.map(|f| (vec![0.0f32; f.a.len()], vec![0.0f32; f.b.len()])))
        })
        .collect();

    // Decoder backward, last layer first, recomputing each layer's activations.
    let mut d_cached: Vec<Option<KvGrads>> = (0..n_layers).map(|_| None).collect();
    for (l, layer) in model.layers.iter().enumerate().rev() {
        let x = &dec_inputs[l];
        let pass = decoder_pass(l);
        let (_, tape) = layer::forward(layer, &loras[l], x, c, &pass)?;
        let (d_x, d_kv) =
            layer::backward(layer, &loras[l], x, &tape, &d_h, &pass, None, &mut grads[l])?;
        d_cached[l] = d_kv;
        d_h = d_x;
    }
    drop((dec_inputs, cached));

    // Encoder backward: its output feeds nothing; its keys/values feed the decoder.
    let mut d_h = vec![0.0f32; p * hidden];
    for (l, layer) in model.layers.iter().enumerate().rev() {
        let x = &enc_inputs[l];
        let pass = Pass::Encoder {
            window: passes[l].0,
        };
        let (_, tape) = layer::forward(layer, &loras[l], x, p, &pass)?;
        let injected = d_cached[l].take().map(|d| (d, passes[l].1));
        let (d_x, _) = layer::backward(
            layer,
            &loras[l],
            x,
            &tape,
            &d_h,
            &pass,
            injected.as_ref().map(|(d, first)| (d, *first)),
            &mut grads[l],
        )?;
        d_h = d_x;
    }

    let mut out = BTreeMap::new();
    for (l, layer_grads) in grads.into_iter().enumerate() {
        for (module, g) in DEFAULT_LORA_KEYS.iter().zip(layer_grads) {
            if let Some(g) = g {
                out.insert(format!("model.decoder.layers.{l}.{module}"), g);
            }
        }
    }
    Ok(LossAndGrads {
        loss,
        corrupted: ex.corrupt.iter().filter(|&&c| c).count(),
        grads: out,
    })
}

fn check_example(model: &TextModel, ex: &TrainExample<'_>) -> Result<(), CoreError> {
    let bad = |m: String| Err(CoreError::InvalidInput(m));
    if ex.prompt_ids.is_empty() {
        return bad("training example: the prompt is empty".into());
    }
    if ex.canvas_ids.is_empty() {
        return bad("training example: the canvas is empty".into());
    }
    if ex.target_ids.len() != ex.canvas_ids.len() || ex.corrupt.len() != ex.canvas_ids.len() {
        return bad(format!(
            "training example: canvas_ids, target_ids and corrupt have {}, {} and {} entries \
             (one per canvas position each)",
            ex.canvas_ids.len(),
            ex.target_ids.len(),
            ex.corrupt.len()
        ));
    }
    let vocab = model.vocab_size();
    if let Some(id) = ex.target_ids.iter().find(|&&id| id as usize >= vocab) {
        return bad(format!(
            "training example: target id {id} is out of range (vocabulary of {vocab})"
        ));
    }
    Ok(())
}

/// The adapter's factors per layer, each checked against its layer.
fn layer_loras<'a>(
    model: &TextModel,
    adapter: &'a Adapter,
) -> Result<Vec<LayerLora<'a>>, CoreError> {
    let bad = |reason: String| CoreError::Adapter {
        path: adapter.source.clone().unwrap_or_default(),
        reason,
    };
    let scale = adapter.scale();
    let mut loras: Vec<LayerLora<'a>> = (0..model.layers.len())
        .map(|_| LayerLora {
            factors: [None; 7],
            scale,
        })
        .collect();
    for (path, factors) in &adapter.factors {
        let (i, module) =
            split_module_path(path).ok_or_else(|| bad(format!("{path}: matches no layer")))?;
        let slot = DEFAULT_LORA_KEYS.iter().position(|k| *k == module);
        let layer = model.layers.get(i);
        let linear = match (layer, slot) {
            (Some(layer), Some(slot)) => {
                let a = &layer.attention;
                let m = &layer.mlp;
                [
                    Some(&a.q_proj),
                    Some(&a.k_proj),
                    a.v_proj.as_ref(),
                    Some(&a.o_proj),
                    Some(&m.gate_proj),
                    Some(&m.up_proj),
                    Some(&m.down_proj),
                ][slot]
            }
            _ => None,
        }
        .ok_or_else(|| {
            bad(format!(
                "{path}: matches no layer (the model has {} layers; full-attention layers have \
                 no v_proj)",
                model.layers.len()
            ))
        })?;
        linear.check_lora(factors).map_err(bad)?;
        if let Some(slot) = slot {
            loras[i].factors[slot] = Some(factors);
        }
    }
    Ok(loras)
}
