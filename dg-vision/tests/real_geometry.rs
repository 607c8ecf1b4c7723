//! The real tower's geometry (hidden 1152, 16 heads of 72, intermediate 4304, 10240 positions)
//! with random bf16 weights and only 2 of its 27 layers: checks that nothing in the code
//! assumes the tiny fixture's sizes, and times one image. Ignored by default (writes ~90 MB);
//! run with `cargo test -p dg-vision --test real_geometry -- --ignored --nocapture`.

use std::collections::HashMap;
use std::time::Instant;

use dg_vision::{ImageProcessor, VisionModel};
use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

const LAYERS: usize = 2;

fn rand_bf16(n: usize, scale: f32, seed: &mut u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        // xorshift: deterministic, dependency-free
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let u = (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        out.extend_from_slice(&bf16::from_f32(u * 2.0 * scale).to_le_bytes());
    }
    out
}

#[test]
#[ignore]
fn real_width_tower_runs_and_is_timed() {
    let (h, inter, heads, hd, pos) = (1152usize, 4304usize, 16usize, 72usize, 10240usize);
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, seed: &mut u64| {
        let n = shape.iter().product();
        tensors.push((name, shape, rand_bf16(n, scale, seed)));
    };
    let p = "vision_tower";
    add(
        format!("{p}.patch_embedder.input_proj.weight"),
        vec![h, 768],
        0.06,
        &mut seed,
    );
    add(
        format!("{p}.patch_embedder.position_embedding_table"),
        vec![2, pos, h],
        0.5,
        &mut seed,
    );
    for i in 0..LAYERS {
        let l = format!("{p}.encoder.layers.{i}");
        for (name, o, inn) in [
            ("self_attn.q_proj", heads * hd, h),
            ("self_attn.k_proj", heads * hd, h),
            ("self_attn.v_proj", heads * hd, h),
            ("self_attn.o_proj", h, heads * hd),
            ("mlp.gate_proj", inter, h),
            ("mlp.up_proj", inter, h),
            ("mlp.down_proj", h, inter),
        ] {
            add(
                format!("{l}.{name}.linear.weight"),
                vec![o, inn],
                1.7 / (inn as f32).sqrt(),
                &mut seed,
            );
        }
        for name in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            add(format!("{l}.{name}"), vec![hd], 1.0, &mut seed);
        }
        for name in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(format!("{l}.{name}.weight"), vec![h], 1.0, &mut seed);
        }
    }
    add(format!("{p}.std_bias"), vec![h], 0.1, &mut seed);
    add(format!("{p}.std_scale"), vec![h], 1.0, &mut seed);
    add(
        "embed_vision.embedding_projection.weight".into(),
        vec![2816, h],
        0.05,
        &mut seed,
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("optiq")).unwrap();
    let views: HashMap<String, TensorView> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::BF16, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(
        &views,
        None,
        &dir.path().join("optiq/optiq_vision.safetensors"),
    )
    .unwrap();
    // A text-only shard must exist for the loader's glob; an empty one will do.
    let empty: HashMap<String, TensorView> = HashMap::new();
    safetensors::serialize_to_file(&empty, None, &dir.path().join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "model_type": "diffusion_gemma",
        "text_config": {"hidden_size": 2816},
        "vision_config": {
            "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": LAYERS,
            "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": hd,
            "position_embedding_size": pos, "standardize": true
        }
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();

    let model = VisionModel::load(dir.path()).unwrap();
    // A 1920 x 1080 photo-sized gradient.
    let (w, hh) = (1920usize, 1080usize);
    let rgb: Vec<u8> = (0..w * hh * 3)
        .map(|i| ((i / 3) % w * 255 / w) as u8)
        .collect();
    let t0 = Instant::now();
    let img = ImageProcessor::default().prepare_rgb(w, hh, &rgb).unwrap();
    let t1 = Instant::now();
    let f = model.encode(&img).unwrap();
    let t2 = Instant::now();
    assert_eq!(f.tokens, img.soft_tokens);
    assert_eq!(f.hidden, 2816);
    assert!(f.data.iter().all(|v| v.is_finite()));
    let per_layer = (t2 - t1).as_secs_f64() / LAYERS as f64;
    eprintln!(
        "{}x{} -> {}x{}: {} patches, {} soft tokens; preprocess {:.3} s, tower+embedder {:.2} s \
         ({:.2} s per layer, ~{:.0} s for 27 layers)",
        w,
        hh,
        img.width,
        img.height,
        (img.width / 16) * (img.height / 16),
        img.soft_tokens,
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        per_layer,
        per_layer * 27.0
    );
}
