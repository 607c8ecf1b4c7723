//! The LoRA backward pass against the float32 reference (tools/reference/dump_lora_grad_goldens.py:
//! `nn.value_and_grad` of the trainer's denoising loss on the `tiny` fixture with the router
//! patch, every factor random with non-zero lora_b): the loss within 1e-5 relative and every
//! factor's gradient within 1e-3 relative (`||ours - ref|| / ||ref||`), for a prompt shorter
//! than the sliding window and a chat-templated one longer than twice the window. Also: the
//! training forward is the inference forward (same loss bit for bit with the adapter mounted).

use dg_core::train::{diffusion_loss_and_grads, TrainExample};
use dg_core::{Adapter, SelfConditioning, TextModel};
use dg_testkit::{fixtures, model_dir, Tensors};

const LOSS_BOUND: f64 = 1e-5;
const GRAD_BOUND: f64 = 1e-3;

fn model() -> TextModel {
    TextModel::load(&model_dir("tiny")).expect("fixture loads")
}

fn adapter() -> Adapter {
    Adapter::load(&fixtures().join("adapters/tiny-grad")).expect("adapter loads")
}

struct Case {
    prompt: Vec<u32>,
    canvas: Vec<u32>,
    target: Vec<u32>,
    corrupt: Vec<bool>,
}

fn case(g: &Tensors, name: &str) -> Case {
    Case {
        prompt: g.ids(&format!("{name}.prompt_ids")),
        canvas: g.ids(&format!("{name}.canvas_ids")),
        target: g.ids(&format!("{name}.target_ids")),
        corrupt: g
            .i32(&format!("{name}.corrupt"))
            .iter()
            .map(|&v| v != 0)
            .collect(),
    }
}

impl Case {
    fn example(&self) -> TrainExample<'_> {
        TrainExample {
            prompt_ids: &self.prompt,
            canvas_ids: &self.canvas,
            target_ids: &self.target,
            corrupt: &self.corrupt,
        }
    }
}

fn relative(ours: &[f32], golden: &[f32]) -> f64 {
    assert_eq!(ours.len(), golden.len());
    let diff: f64 = ours
        .iter()
        .zip(golden)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let norm: f64 = golden.iter().map(|b| (*b as f64).powi(2)).sum();
    (diff / norm).sqrt()
}

fn check_against_reference(name: &str, expected_prompt: impl Fn(usize) -> bool) {
    let g = Tensors::load("lora_grads.safetensors");
    let (model, adapter) = (model(), adapter());
    let c = case(&g, name);
    assert!(
        expected_prompt(c.prompt.len()),
        "{name}: prompt of {}",
        c.prompt.len()
    );
    let out = diffusion_loss_and_grads(&model, &adapter, &c.example()).unwrap();
    let want = g.f32(&format!("{name}.loss"))[0] as f64;
    let loss_err = (out.loss as f64 - want).abs() / want.abs();
    assert!(
        loss_err < LOSS_BOUND,
        "{name}: loss {} vs {want} ({loss_err:.2e})",
        out.loss
    );
    assert_eq!(out.corrupted, c.corrupt.iter().filter(|&&v| v).count());
    assert_eq!(
        out.grads.len(),
        adapter.factors.len(),
        "{name}: one entry per module"
    );
    let mut worst: Vec<(f64, String)> = Vec::new();
    for (path, (d_a, d_b)) in &out.grads {
        for (which, ours) in [("lora_a", d_a), ("lora_b", d_b)] {
            let golden = g.f32(&format!("{name}.grad.{path}.{which}"));
            let err = relative(ours, golden);
            assert!(
                err < GRAD_BOUND,
                "{name}: {path}.{which}: relative error {err:.3e}"
            );
            worst.push((err, format!("{path}.{which}")));
        }
    }
    // The worst error per module kind and factor (shown with --nocapture).
    let mut by_kind: std::collections::BTreeMap<String, f64> = Default::default();
    for (err, path) in &worst {
        let kind = path.splitn(5, '.').nth(4).unwrap_or(path).to_owned();
        let e = by_kind.entry(kind).or_default();
        *e = e.max(*err);
    }
    eprintln!("{name}: loss rel. error {loss_err:.2e}; worst gradient rel. error by module:");
    for (kind, err) in by_kind {
        eprintln!("  {kind}: {err:.2e}");
    }
}

#[test]
fn lora_gradients_match_the_reference_with_a_prompt_inside_the_window() {
    check_against_reference("short", |p| p < 8);
}

#[test]
fn lora_gradients_match_the_reference_with_a_prompt_past_the_window() {
    check_against_reference("long", |p| p > 16);
}

/// The training forward repeats the inference forward: with the adapter mounted, encode +
/// decode + the same cross-entropy give the same loss, bit for bit.
#[test]
fn training_loss_is_the_mounted_inference_loss() {
    let g = Tensors::load("lora_grads.safetensors");
    let (mut model, adapter) = (model(), adapter());
    for name in ["short", "long"] {
        let c = case(&g, name);
        let out = diffusion_loss_and_grads(&model, &adapter, &c.example()).unwrap();
        model.mount_adapter(&adapter).unwrap();
        let mut cache = model.new_cache();
        model.encode(&mut cache, &c.prompt, |_, _| {}).unwrap();
        let logits = model
            .decode(&cache, &c.canvas, SelfConditioning::None)
            .unwrap();
        model.unmount_adapter();
        let vocab = model.vocab_size();
        let mut sum = 0.0f32;
        for ((row, &t), &k) in logits.chunks_exact(vocab).zip(&c.target).zip(&c.corrupt) {
            if k {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
                sum += lse - row[t as usize];
            }
        }
        let want = sum / out.corrupted.max(1) as f32;
        assert_eq!(out.loss, want, "{name}: training vs inference loss");
        // A mounted adapter is not counted twice: the base is the frozen model.
        model.mount_adapter(&adapter).unwrap();
        let again = diffusion_loss_and_grads(&model, &adapter, &c.example()).unwrap();
        model.unmount_adapter();
        assert_eq!(again.loss, out.loss, "{name}: with the adapter mounted");
    }
}

#[test]
fn bad_examples_and_adapters_are_named() {
    let (model, adapter) = (model(), adapter());
    let ids = [5u32, 6, 7];
    let ex = |prompt: &'static [u32], target: &'static [u32], corrupt: &'static [bool]| {
        (prompt, target, corrupt)
    };
    for ((prompt, target, corrupt), what) in [
        (ex(&[], &[1, 2, 3], &[true; 3]), "prompt is empty"),
        (ex(&[1], &[1, 2], &[true; 3]), "one per canvas position"),
        (ex(&[1], &[1, 2, 9999], &[true; 3]), "target id 9999"),
    ] {
        let err = diffusion_loss_and_grads(
            &model,
            &adapter,
            &TrainExample {
                prompt_ids: prompt,
                canvas_ids: &ids,
                target_ids: target,
                corrupt,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(what), "{err}");
    }
    let mut wrong = adapter.clone();
    let f = wrong
        .factors
        .remove("model.decoder.layers.5.self_attn.q_proj")
        .unwrap();
    wrong
        .factors
        .insert("model.decoder.layers.5.self_attn.v_proj".into(), f);
    let err = diffusion_loss_and_grads(
        &model,
        &wrong,
        &TrainExample {
            prompt_ids: &ids,
            canvas_ids: &ids,
            target_ids: &ids,
            corrupt: &[true; 3],
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("layers.5.self_attn.v_proj: matches no layer"),
        "{err}"
    );
}
