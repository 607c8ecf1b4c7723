//! Batched forward passes (several sequences packed into one pass, `dg_core::model::batch`)
//! against the reference and against single-sequence passes.
//!
//! The reference generates one sequence at a time, so each sequence of a batch is checked
//! against the reference's golden for that sequence alone, with model_parity.rs's bounds
//! (logits within 1e-3 x max |ref| with the same argmax; states within 1e-4 x max |ref|).
//! Against our own single-sequence passes the bound is tighter, 1e-5 x max: only the row
//! count of each product changes, which at most picks a kernel with another summation order.
//!
//! The equal-length case guards a past bug (batches whose rows needed no padding ran without
//! their causal masks): every sequence gets its mask in every batch.

use dg_core::{DecoderInput, EncoderInput, KvCache, SelfConditioning, TextModel};
use dg_testkit::{assert_close, assert_logits, max_abs_diff, model_dir, Tensors};

const LOGIT_BOUND: f32 = 1e-3;
const STATE_BOUND: f32 = 1e-4;
const SAME_MODEL_BOUND: f32 = 1e-5;

fn load() -> TextModel {
    TextModel::load(&model_dir("tiny")).expect("fixture loads")
}

/// Encodes each prompt into a fresh cache in one batched pass.
fn encode_together(model: &TextModel, prompts: &[Vec<u32>]) -> (Vec<KvCache>, Vec<Vec<f32>>) {
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut inputs: Vec<EncoderInput<'_>> = caches
        .iter_mut()
        .zip(prompts)
        .map(|(cache, ids)| EncoderInput {
            cache,
            embeddings: model.embed_prompt(ids).unwrap(),
            image_blocks: None,
        })
        .collect();
    let hidden = model.encode_batch(&mut inputs, |_, _, _| {}).unwrap();
    (caches, hidden)
}

fn assert_same_cache(what: &str, ours: &KvCache, single: &KvCache, bound: f32) {
    assert_eq!(ours.offset(), single.offset(), "{what}: offset");
    for l in 0..ours.num_layers() {
        let (a, b) = (ours.layer(l).unwrap(), single.layer(l).unwrap());
        assert_eq!(a.positions(), b.positions(), "{what}: layer {l} positions");
        for h in 0..a.kv_heads() {
            assert_close(
                &format!("{what}.{l}.keys[{h}]"),
                a.keys(h),
                b.keys(h),
                bound,
            );
            assert_close(
                &format!("{what}.{l}.values[{h}]"),
                a.values(h),
                b.values(h),
                bound,
            );
        }
    }
}

#[test]
fn ragged_batch_matches_reference_per_sequence() {
    let model = load();
    let g = Tensors::load("model_tiny.safetensors");
    let vocab = model.vocab_size();
    let cases = ["short", "long"];
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| g.ids(&format!("{c}.prompt_ids")))
        .collect();
    assert_ne!(prompts[0].len(), prompts[1].len(), "a ragged batch");
    let (caches, hidden) = encode_together(&model, &prompts);
    for (case, h) in cases.iter().zip(&hidden) {
        assert_close(
            &format!("batched {case}.encoder.final"),
            h,
            g.f32(&format!("{case}.encoder.final")),
            STATE_BOUND,
        );
    }

    // Six canvases in one decoder pass: both prompts, each self-conditioning mode.
    let canvases: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| g.ids(&format!("{c}.canvas_ids")))
        .collect();
    let mut inputs = Vec::new();
    let mut expected = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        for (sc, golden) in [
            (SelfConditioning::None, "logits"),
            (
                SelfConditioning::Logits(g.f32(&format!("{case}.sc_logits_in"))),
                "logits_sc_logits",
            ),
            (
                SelfConditioning::Embeddings(g.f32(&format!("{case}.sc_embeddings_in"))),
                "logits_sc_emb",
            ),
        ] {
            inputs.push(DecoderInput {
                cache: &caches[i],
                canvas: &canvases[i],
                self_conditioning: sc,
            });
            expected.push(format!("{case}.{golden}"));
        }
    }
    let logits = model.decode_batch(&inputs).unwrap();
    assert_eq!(logits.len(), inputs.len());
    for (ours, name) in logits.iter().zip(&expected) {
        assert_logits(
            &format!("batched {name}"),
            ours,
            g.f32(name),
            vocab,
            LOGIT_BOUND,
        );
    }

    // A continuation pass for one sequence beside a first prefill of another.
    let (mut long_cache, mut fresh) = (caches[1].clone(), model.new_cache());
    let block = g.ids("cont.block_ids");
    let mut inputs = [
        EncoderInput {
            cache: &mut fresh,
            embeddings: model.embed_prompt(&prompts[0]).unwrap(),
            image_blocks: None,
        },
        EncoderInput {
            cache: &mut long_cache,
            embeddings: model.embed_prompt(&block).unwrap(),
            image_blocks: None,
        },
    ];
    model.encode_batch(&mut inputs, |_, _, _| {}).unwrap();
    assert_same_cache("fresh short prefill", &fresh, &caches[0], SAME_MODEL_BOUND);
    let canvas = g.ids("cont.canvas_ids");
    let logits = model
        .decode_batch(&[
            DecoderInput {
                cache: &long_cache,
                canvas: &canvas,
                self_conditioning: SelfConditioning::None,
            },
            DecoderInput {
                cache: &fresh,
                canvas: &canvases[0],
                self_conditioning: SelfConditioning::None,
            },
        ])
        .unwrap();
    assert_logits(
        "batched cont.logits",
        &logits[0],
        g.f32("cont.logits"),
        vocab,
        LOGIT_BOUND,
    );
    assert_logits(
        "batched short.logits (2)",
        &logits[1],
        g.f32("short.logits"),
        vocab,
        LOGIT_BOUND,
    );
}

#[test]
fn equal_length_batch_keeps_every_mask() {
    let model = load();
    let g = Tensors::load("model_tiny.safetensors");
    let vocab = model.vocab_size();
    let long = g.ids("long.prompt_ids");
    // Same length, other tokens: no sequence needs padding.
    let other: Vec<u32> = long.iter().rev().copied().collect();
    let prompts = vec![long.clone(), other.clone()];
    let (caches, hidden) = encode_together(&model, &prompts);

    // The golden sequence against the reference: a missing causal or sliding-window mask, or a
    // query attending to the other sequence, moves these by percents.
    assert_close(
        "equal-length long.encoder.final",
        &hidden[0],
        g.f32("long.encoder.final"),
        STATE_BOUND,
    );
    for (i, ids) in prompts.iter().enumerate() {
        let mut single = model.new_cache();
        let h = model.encode(&mut single, ids, |_, _| {}).unwrap();
        assert_close(
            &format!("equal-length prompt {i} vs alone"),
            &hidden[i],
            &h,
            SAME_MODEL_BOUND,
        );
        assert_same_cache(
            &format!("equal-length cache {i}"),
            &caches[i],
            &single,
            SAME_MODEL_BOUND,
        );
    }

    let canvas = g.ids("long.canvas_ids");
    let logits = model
        .decode_batch(&[
            DecoderInput {
                cache: &caches[0],
                canvas: &canvas,
                self_conditioning: SelfConditioning::None,
            },
            DecoderInput {
                cache: &caches[1],
                canvas: &canvas,
                self_conditioning: SelfConditioning::None,
            },
        ])
        .unwrap();
    assert_logits(
        "equal-length long.logits",
        &logits[0],
        g.f32("long.logits"),
        vocab,
        LOGIT_BOUND,
    );
    let alone = model
        .decode(&caches[1], &canvas, SelfConditioning::None)
        .unwrap();
    assert_close(
        "equal-length canvas 1 vs alone",
        &logits[1],
        &alone,
        SAME_MODEL_BOUND,
    );
    // The two prompts must lead to different logits, or a leak between them could hide.
    assert!(max_abs_diff(&logits[0], &logits[1]) > 100.0 * LOGIT_BOUND);
}

#[test]
fn batch_errors_name_the_input_and_change_nothing() {
    let model = load();
    let g = Tensors::load("model_tiny.safetensors");
    let prompt = g.ids("short.prompt_ids");
    let (mut a, mut b) = (model.new_cache(), model.new_cache());
    let mut inputs = [
        EncoderInput {
            cache: &mut a,
            embeddings: model.embed_prompt(&prompt).unwrap(),
            image_blocks: None,
        },
        EncoderInput {
            cache: &mut b,
            embeddings: vec![0.0; 3],
            image_blocks: None,
        },
    ];
    let err = model.encode_batch(&mut inputs, |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("encoder input 1"), "{err}");
    assert_eq!(
        (a.offset(), a.layer(0).unwrap().len()),
        (0, 0),
        "input 0 untouched"
    );

    let canvas = g.ids("short.canvas_ids");
    let err = model
        .decode_batch(&[
            DecoderInput {
                cache: &a,
                canvas: &canvas,
                self_conditioning: SelfConditioning::None,
            },
            DecoderInput {
                cache: &a,
                canvas: &canvas,
                self_conditioning: SelfConditioning::Embeddings(&[1.0; 5]),
            },
        ])
        .unwrap_err();
    assert!(err.to_string().contains("canvas 1"), "{err}");
    assert!(model.decode_batch(&[]).is_err());
}
