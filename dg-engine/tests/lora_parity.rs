//! Mounted LoRA adapters against the float32 reference (mlx-optiq 0.7.7's `load_diffusion_lora`).
//!
//! Adapters: tests/fixtures/adapters/{tiny-trained,tiny-random} (make_lora_adapters.py: one
//! trained by the reference's own trainer, one with random non-zero `lora_b` on a subset of the
//! layers). Goldens: lora_logits.safetensors and lora_generate.json (dump_lora_goldens.py).
//! - logits (encoder and decoder both adapted): max |ours - ref| <= 1e-3 x max |ref|, same
//!   argmax on every canvas row;
//! - generations: token for token on the cases that keep their trajectory under +-1 ulp noise,
//!   both samplers, alone and in one batch.

use std::ops::ControlFlow;

use dg_engine::research::SelfConditioning;
use dg_engine::{Adapter, DiffusionGemma, EngineError};
use serde_json::Value;

mod common;

use common::{check_generation, golden_request, Seen};
use dg_testkit::{fixtures, ids, load_json, max_abs, max_abs_diff, Tensors};

const LOGIT_BOUND: f32 = 1e-3;
const ADAPTERS: [&str; 2] = ["tiny-trained", "tiny-random"];

fn tiny() -> std::path::PathBuf {
    fixtures().join("models/tiny")
}

fn adapter_dir(name: &str) -> std::path::PathBuf {
    fixtures().join("adapters").join(name)
}

fn argmax_rows(v: &[f32], width: usize) -> Vec<usize> {
    v.chunks_exact(width)
        .map(|r| (0..width).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap())
        .collect()
}

/// Decoder logits over the cache of `prompt`, with whatever is mounted.
fn logits(model: &DiffusionGemma, prompt: &[u32], canvas: &[u32]) -> Vec<f32> {
    let cache = model.prefill(prompt).unwrap();
    model
        .decoder_logits(&cache, canvas, SelfConditioning::None)
        .unwrap()
}

#[test]
fn mounted_adapters_give_the_reference_logits() {
    let goldens = Tensors::load("lora_logits.safetensors");
    let mut model = DiffusionGemma::load(tiny()).unwrap();
    let vocab = model.model().vocab_size();
    for name in ADAPTERS {
        model
            .mount_adapter(Adapter::load(&adapter_dir(name)).unwrap())
            .unwrap();
        for case in ["short", "long"] {
            let key = format!("{name}.{case}");
            let prompt = goldens.ids(&format!("{key}.prompt_ids"));
            let canvas = goldens.ids(&format!("{key}.canvas_ids"));
            let want = goldens.f32(&format!("{key}.logits"));
            let got = logits(&model, &prompt, &canvas);
            let err = max_abs_diff(&got, want);
            eprintln!("{key}: max |diff| {err:e} / max |logit| {}", max_abs(want));
            assert!(
                err <= LOGIT_BOUND * max_abs(want),
                "{key}: max |diff| {err} over {} x max |logit| {}",
                LOGIT_BOUND,
                max_abs(want)
            );
            assert_eq!(
                argmax_rows(&got, vocab),
                argmax_rows(want, vocab),
                "{key}: argmax"
            );
        }
    }
    // Unmounting gives the base model back, bit for bit, without reloading.
    let base = DiffusionGemma::load(tiny()).unwrap();
    let prompt = goldens.ids("tiny-random.long.prompt_ids");
    let canvas = goldens.ids("tiny-random.long.canvas_ids");
    let adapted = logits(&model, &prompt, &canvas);
    model.unmount_adapter();
    assert!(model.adapter().is_none());
    let unmounted = logits(&model, &prompt, &canvas);
    assert_eq!(unmounted, logits(&base, &prompt, &canvas));
    assert!(
        adapted
            .iter()
            .zip(&unmounted)
            .any(|(a, b)| (a - b).abs() > 0.1),
        "the adapter must change the logits for this test to mean anything"
    );
}

fn lora_cases() -> Vec<Value> {
    load_json("lora_generate.json")["cases"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn generations_with_an_adapter_match_the_reference() {
    let cases = lora_cases();
    for name in ADAPTERS {
        let model = DiffusionGemma::builder(tiny())
            .adapter(adapter_dir(name))
            .load()
            .unwrap();
        let (config, source) = model.adapter().unwrap();
        assert_eq!(config.lora_parameters.keys.len(), 7);
        assert_eq!(source, Some(adapter_dir(name).as_path()));
        let mine: Vec<&Value> = cases
            .iter()
            .filter(|c| c["adapter"].as_str().unwrap().ends_with(name))
            .collect();
        assert!(mine.len() >= 2, "{name}: {} golden cases", mine.len());
        for case in &mine {
            let req = golden_request(case);
            let mut seen = Seen::default();
            let gen = model
                .generate_stream(&req, |e| {
                    seen.record(e);
                    ControlFlow::Continue(())
                })
                .unwrap();
            check_generation(case, &gen, &seen);
        }
        // The same cases in one batch: the adapter acts in the batched passes too.
        let requests: Vec<_> = mine.iter().map(|c| golden_request(c)).collect();
        let gens = model.generate_batch(&requests).unwrap();
        for (case, gen) in mine.iter().zip(&gens) {
            assert_eq!(
                gen.token_ids,
                ids(&case["outputs"]["emitted_ids"]),
                "{} (batched)",
                case["name"]
            );
        }
    }
}

/// A copy of an adapter directory, edited by `edit`, in a fresh temp dir.
fn edited_adapter(name: &str, edit: impl FnOnce(&std::path::Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["adapter_config.json", "adapters.safetensors"] {
        std::fs::copy(adapter_dir(name).join(file), dir.path().join(file)).unwrap();
    }
    edit(dir.path());
    dir
}

fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("adapter_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn load_error(dir: &std::path::Path) -> String {
    match DiffusionGemma::builder(tiny()).adapter(dir).load() {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_adapters_are_named_errors() {
    let missing = tempfile::tempdir().unwrap();
    let msg = load_error(&missing.path().join("nope"));
    assert!(msg.contains("not a directory"), "{msg}");

    let empty = tempfile::tempdir().unwrap();
    let msg = load_error(empty.path());
    assert!(msg.contains("adapter_config.json"), "{msg}");

    let other = edited_adapter("tiny-random", |d| {
        edit_config(d, |v| v["model_type"] = "llama".into())
    });
    let msg = load_error(other.path());
    assert!(msg.contains("model_type") && msg.contains("llama"), "{msg}");

    let dora = edited_adapter("tiny-random", |d| {
        edit_config(d, |v| v["fine_tune_type"] = "dora".into())
    });
    let msg = load_error(dora.path());
    assert!(msg.contains("fine_tune_type"), "{msg}");

    let rank = edited_adapter("tiny-random", |d| {
        edit_config(d, |v| v["lora_parameters"]["rank"] = 8.into())
    });
    let msg = load_error(rank.path());
    assert!(
        msg.contains("rank 4") && msg.contains("lora_parameters.rank is 8"),
        "{msg}"
    );

    let key = edited_adapter("tiny-random", |d| {
        edit_config(d, |v| {
            v["lora_parameters"]["keys"][0] = "experts.down_proj".into()
        })
    });
    let msg = load_error(key.path());
    assert!(msg.contains("experts.down_proj"), "{msg}");

    let bad_field = edited_adapter("tiny-random", |d| {
        edit_config(d, |v| v["lora_parameters"]["scale"] = "big".into())
    });
    let msg = load_error(bad_field.path());
    assert!(msg.contains("lora_parameters.scale"), "{msg}");

    let truncated = edited_adapter("tiny-random", |d| {
        let path = d.join("adapters.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
    let msg = load_error(truncated.path());
    assert!(msg.contains("adapters.safetensors"), "{msg}");
}

/// Factors that fit no layer of the model: the error names the tensor, and the mounted adapter
/// (and the model's output) stay as they were.
#[test]
fn an_adapter_that_does_not_fit_changes_nothing() {
    let mut model = DiffusionGemma::load(tiny()).unwrap();
    model
        .mount_adapter(Adapter::load(&adapter_dir("tiny-random")).unwrap())
        .unwrap();
    let prompt = [2, 10, 20, 30];
    let canvas = [5u32; 16];
    let before = logits(&model, &prompt, &canvas);

    // A layer the model does not have.
    let mut far = Adapter::load(&adapter_dir("tiny-trained")).unwrap();
    let f = far
        .factors
        .remove("model.decoder.layers.0.mlp.up_proj")
        .unwrap();
    far.factors
        .insert("model.decoder.layers.40.mlp.up_proj".into(), f);
    let err = model.mount_adapter(far).unwrap_err();
    assert!(matches!(err, EngineError::Model(_)));
    assert!(err.to_string().contains("layers.40.mlp.up_proj"), "{err}");

    // v_proj on the full-attention layer (5), which has none.
    let mut v = Adapter::load(&adapter_dir("tiny-trained")).unwrap();
    let f = v.factors["model.decoder.layers.0.self_attn.v_proj"].clone();
    v.factors
        .insert("model.decoder.layers.5.self_attn.v_proj".into(), f);
    let err = model.mount_adapter(v).unwrap_err().to_string();
    assert!(
        err.contains("layers.5.self_attn.v_proj") && err.contains("no self_attn.v_proj"),
        "{err}"
    );

    // Wrong shapes: an up_proj factor on down_proj.
    let mut shapes = Adapter::load(&adapter_dir("tiny-trained")).unwrap();
    let f = shapes.factors["model.decoder.layers.1.mlp.up_proj"].clone();
    shapes
        .factors
        .insert("model.decoder.layers.1.mlp.down_proj".into(), f);
    let err = model.mount_adapter(shapes).unwrap_err().to_string();
    assert!(
        err.contains("layers.1.mlp.down_proj") && err.contains("do not fit"),
        "{err}"
    );

    assert!(model.adapter().unwrap().1.unwrap().ends_with("tiny-random"));
    assert_eq!(logits(&model, &prompt, &canvas), before);
}

/// An adapter written by dg reads back identically (the reference's layout).
#[test]
fn adapters_round_trip_through_save() {
    let adapter = Adapter::load(&adapter_dir("tiny-trained")).unwrap();
    let out = tempfile::tempdir().unwrap();
    adapter.save(out.path()).unwrap();
    let back = Adapter::load(out.path()).unwrap();
    assert_eq!(back.factors, adapter.factors);
    assert_eq!(back.config, adapter.config);
}
