//! The vision tower at the real geometry (hidden 1152, 16 heads of 72, intermediate 4304, 10240
//! positions, random bf16 weights in the sidecar layout) on one 1920x1080 image at the real
//! soft-token budget (280): preprocessing, and the tower + embedder with one of its 27 layers
//! (multiply the per-layer part by 27 for the whole tower).
//!
//! `cargo bench --bench vision`

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, Criterion};
use dg_vision::{ImageProcessor, VisionModel};
use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// One of the real 27 layers: each iteration stays a few seconds; scale per layer.
const LAYERS: usize = 1;

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

fn write_real_geometry_tower() -> tempfile::TempDir {
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

    dir
}

fn benches(c: &mut Criterion) {
    let dir = write_real_geometry_tower();
    let model = VisionModel::load(dir.path()).unwrap();
    let (w, hh) = (1920usize, 1080usize);
    let rgb: Vec<u8> = (0..w * hh * 3)
        .map(|i| ((i / 3) % w * 255 / w) as u8)
        .collect();
    let processor = ImageProcessor::default();
    let img = processor.prepare_rgb(w, hh, &rgb).unwrap();
    let mut group = c.benchmark_group("vision");
    group.sample_size(10);
    group.bench_function("preprocess_1920x1080", |b| {
        b.iter(|| processor.prepare_rgb(w, hh, &rgb).unwrap())
    });
    group.bench_function("tower_1_layer_and_embedder_280_tokens", |b| {
        b.iter(|| model.encode(&img).unwrap())
    });
    group.finish();
}

criterion_group!(vision, benches);
criterion_main!(vision);
