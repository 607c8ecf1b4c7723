//! The LoRA trainer against the reference's own training loop (goldens from
//! tools/reference/dump_lora_train_goldens.py: float32 reference, router patched,
//! `mx.random.seed(7)` before the LoRA init).

use std::path::PathBuf;

use dg_engine::train::{draw_corruption, AdamW, AdamWConfig, TrainOptions, Trainer};
use dg_engine::DiffusionGemma;
use dg_testkit::{fixtures, Tensors};
use serde_json::Value;

fn golden() -> (Value, Tensors) {
    let path = fixtures().join("goldens/lora_train.json");
    let text = std::fs::read_to_string(&path).expect("lora_train.json");
    (
        serde_json::from_str(&text).expect("json"),
        Tensors::load("lora_train.safetensors"),
    )
}

fn model() -> DiffusionGemma {
    DiffusionGemma::builder(fixtures().join("models/tiny"))
        .threads(2)
        .load()
        .expect("tiny fixture")
}

fn data() -> PathBuf {
    fixtures().join("lora/train.jsonl")
}

fn options(doc: &Value) -> TrainOptions {
    TrainOptions {
        seed: doc["seed"].as_u64().unwrap(),
        ..TrainOptions::default()
    }
}

fn key(v: &Value) -> [u32; 2] {
    [v[0].as_u64().unwrap() as u32, v[1].as_u64().unwrap() as u32]
}

#[test]
fn encoding_matches_reference() {
    let (doc, t) = golden();
    let model = model();
    let trainer = Trainer::new(&model, &data(), options(&doc)).unwrap();
    let pairs = doc["pairs"].as_array().unwrap();
    assert_eq!(trainer.examples().len(), pairs.len());
    for (i, ex) in trainer.examples().iter().enumerate() {
        let want_p: Vec<u32> = t
            .i32(&format!("encode.{i}.prompt"))
            .iter()
            .map(|&x| x as u32)
            .collect();
        let want_t: Vec<u32> = t
            .i32(&format!("encode.{i}.target"))
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(
            ex.prompt_ids, want_p,
            "pair {i} prompt ({})",
            pairs[i]["prompt"]
        );
        assert_eq!(
            ex.target_ids, want_t,
            "pair {i} target ({})",
            pairs[i]["completion"]
        );
    }
    // Truncation to the max canvas.
    let short = Trainer::new(
        &model,
        &data(),
        TrainOptions {
            max_canvas: 5,
            ..options(&doc)
        },
    )
    .unwrap();
    for (a, b) in short.examples().iter().zip(trainer.examples()) {
        assert_eq!(a.target_ids, b.target_ids[..b.target_ids.len().min(5)]);
    }
}

#[test]
fn lora_init_matches_reference() {
    let (doc, t) = golden();
    let model = model();
    let trainer = Trainer::new(&model, &data(), options(&doc)).unwrap();
    assert_eq!(trainer.rng().state(), key(&doc["key_after_init"]));
    let adapter = trainer.adapter();
    let sums = doc["lora_a_sums"].as_object().unwrap();
    assert_eq!(adapter.factors.len(), sums.len());
    for (path, want) in sums {
        let f = adapter
            .factors
            .get(path)
            .unwrap_or_else(|| panic!("{path} missing"));
        let sum: f64 = f.a.iter().map(|&x| f64::from(x)).sum();
        let want = want.as_f64().unwrap();
        assert!(
            (sum - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{path}: {sum} vs {want}"
        );
        assert!(
            f.b.iter().all(|&x| x == 0.0),
            "{path}: lora_b starts at zero"
        );
    }
    for path in [
        "model.decoder.layers.0.mlp.down_proj",
        "model.decoder.layers.0.self_attn.q_proj",
        "model.decoder.layers.5.self_attn.k_proj",
        "model.decoder.layers.5.self_attn.q_proj",
    ] {
        let f = &adapter.factors[path];
        let want = t.f32(&format!("lora_a.{path}"));
        assert_eq!(t.shape(&format!("lora_a.{path}")), vec![f.in_dim, f.rank]);
        assert_eq!(f.a, want, "{path} lora_a bit for bit");
    }
    assert!(!adapter
        .factors
        .contains_key("model.decoder.layers.5.self_attn.v_proj"));
}

#[test]
fn corruption_matches_reference() {
    let (doc, t) = golden();
    let model = model();
    let trainer = Trainer::new(&model, &data(), options(&doc)).unwrap();
    assert_eq!(trainer.noise_range(), (0.4, 0.8));
    let mut rng = trainer.rng().clone();
    let steps = doc["steps"].as_array().unwrap();
    let mut it = 0u64;
    for (k, step) in steps.iter().enumerate() {
        // The reference's order, skipping the empty target without drawing.
        let index = loop {
            let i = trainer.example_index(it);
            it += 1;
            if !trainer.examples()[i].target_ids.is_empty() {
                break i;
            }
        };
        assert_eq!(index as u64, step["pair"].as_u64().unwrap(), "step {k}");
        let target = &trainer.examples()[index].target_ids;
        let c = draw_corruption(&mut rng, target, trainer.noise_range(), 512).unwrap();
        assert_eq!(c.t, step["t"].as_f64().unwrap() as f32, "step {k} t");
        let corrupt: Vec<bool> = t
            .i32(&format!("step.{k}.corrupt"))
            .iter()
            .map(|&x| x != 0)
            .collect();
        assert_eq!(c.corrupt, corrupt, "step {k} mask");
        let noise: Vec<u32> = t
            .i32(&format!("step.{k}.noise"))
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(c.noise, noise, "step {k} noise");
        let canvas: Vec<u32> = t
            .i32(&format!("step.{k}.canvas"))
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(c.canvas, canvas, "step {k} canvas");
    }
}

#[test]
fn adamw_matches_mlx() {
    let (doc, t) = golden();
    for case in doc["adamw"].as_array().unwrap() {
        let name = case["case"].as_str().unwrap();
        let mut opt = AdamW::new(AdamWConfig {
            learning_rate: case["learning_rate"].as_f64().unwrap() as f32,
            ..AdamWConfig::default()
        });
        let mut w = t.f32(&format!("adamw.{name}.param0")).to_vec();
        for k in 1..=case["steps"].as_u64().unwrap() {
            let g = t.f32(&format!("adamw.{name}.grad{k}"));
            opt.begin_step();
            opt.update("w", &mut w, g);
            assert_eq!(
                w,
                t.f32(&format!("adamw.{name}.param{k}")),
                "{name} step {k}"
            );
        }
    }
}

/// The losses of a run from `Trainer::new` with the golden's seed.
fn losses(trainer: &mut Trainer<'_>, iters: u64) -> Vec<(f32, usize)> {
    let mut out = Vec::new();
    trainer
        .train(iters, |r| {
            if let Some(loss) = r.loss {
                out.push((loss, r.corrupted));
            }
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    out
}

#[test]
fn ten_adamw_steps_match_reference_losses() {
    let (doc, _) = golden();
    let model = model();
    let mut trainer = Trainer::new(&model, &data(), options(&doc)).unwrap();
    let got = losses(&mut trainer, doc["iters"].as_u64().unwrap());
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(got.len(), steps.len());
    assert_eq!(trainer.optimizer().step, 10);
    for (k, ((loss, corrupted), step)) in got.iter().zip(steps).enumerate() {
        let want = step["loss"].as_f64().unwrap() as f32;
        let rel = ((loss - want) / want).abs();
        eprintln!("step {k}: dg {loss} reference {want} rel {rel:.2e}");
        assert_eq!(
            *corrupted as u64,
            step["corrupted"].as_u64().unwrap(),
            "step {k}"
        );
        assert!(
            rel <= 1e-4,
            "step {k}: loss {loss} vs reference {want} (rel {rel:.2e})"
        );
    }
}

#[test]
fn resume_continues_exactly() {
    let (doc, _) = golden();
    let model = model();
    let opts = TrainOptions {
        adamw: AdamWConfig {
            learning_rate: 1e-2,
            ..AdamWConfig::default()
        },
        ..options(&doc)
    };
    let mut whole = Trainer::new(&model, &data(), opts.clone()).unwrap();
    let all = losses(&mut whole, 9);
    let mut first = Trainer::new(&model, &data(), opts).unwrap();
    let mut split = losses(&mut first, 4);
    let dir = tempfile::tempdir().unwrap();
    first.save_checkpoint(dir.path()).unwrap();
    let mut resumed = Trainer::resume(&model, &data(), dir.path()).unwrap();
    assert_eq!(resumed.iteration(), 4);
    assert_eq!(resumed.options(), first.options());
    split.extend(losses(&mut resumed, 5));
    assert_eq!(split, all);
    assert_eq!(resumed.adapter().factors, whole.adapter().factors);
    assert_eq!(resumed.optimizer(), whole.optimizer());
    assert_eq!(resumed.rng(), whole.rng());
    // The saved adapter is the reference's format: it loads and mounts.
    let adapter = dg_engine::Adapter::load(dir.path()).unwrap();
    assert_eq!(adapter.factors, first.adapter().factors);
}

#[test]
fn a_few_dozen_iterations_decrease_the_loss() {
    let (doc, _) = golden();
    let model = model();
    // lr 1e-2: the default 1e-4 moves the adapter too little in 40 iterations to tell.
    let opts = TrainOptions {
        adamw: AdamWConfig {
            learning_rate: 1e-2,
            ..AdamWConfig::default()
        },
        ..options(&doc)
    };
    let mut trainer = Trainer::new(&model, &data(), opts).unwrap();
    let got: Vec<f32> = losses(&mut trainer, 40).iter().map(|l| l.0).collect();
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    let (first, last) = (mean(&got[..8]), mean(&got[got.len() - 8..]));
    eprintln!("mean loss of the first 8 steps {first}, of the last 8 {last}");
    assert!(last < 0.8 * first, "{first} -> {last}");
}
