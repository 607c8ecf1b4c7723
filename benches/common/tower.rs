//! A vision tower of the real geometry (hidden 1152, 16 heads of 72, intermediate 4304, 10240
//! positions) with random bf16 weights, written in OptiQ's sidecar layout.

use std::collections::HashMap;

use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::Rng;

pub const HIDDEN: usize = 1152;
pub const INTERMEDIATE: usize = 4304;
pub const HEADS: usize = 16;
pub const HEAD_DIM: usize = 72;
pub const PATCH_PIXELS: usize = 768;
pub const TEXT_HIDDEN: usize = 2816;
/// The real tower's depth.
pub const REAL_LAYERS: usize = 27;

fn rand_bf16(n: usize, scale: f32, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        out.extend_from_slice(&bf16::from_f32(rng.f32() * scale).to_le_bytes());
    }
    out
}

/// Writes a tower of `layers` layers and the embedder into a fresh temporary checkpoint.
pub fn write(layers: usize) -> tempfile::TempDir {
    let (h, inter, heads, hd, pos) = (HIDDEN, INTERMEDIATE, HEADS, HEAD_DIM, 10240usize);
    let mut rng = Rng(0x1234_5678_9abc_def0);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, rng: &mut Rng| {
        let n = shape.iter().product();
        tensors.push((name, shape, rand_bf16(n, scale, rng)));
    };
    let p = "vision_tower";
    add(
        format!("{p}.patch_embedder.input_proj.weight"),
        vec![h, PATCH_PIXELS],
        0.06,
        &mut rng,
    );
    add(
        format!("{p}.patch_embedder.position_embedding_table"),
        vec![2, pos, h],
        0.5,
        &mut rng,
    );
    for i in 0..layers {
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
                &mut rng,
            );
        }
        for name in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            add(format!("{l}.{name}"), vec![hd], 1.0, &mut rng);
        }
        for name in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(format!("{l}.{name}.weight"), vec![h], 1.0, &mut rng);
        }
    }
    add(format!("{p}.std_bias"), vec![h], 0.1, &mut rng);
    add(format!("{p}.std_scale"), vec![h], 1.0, &mut rng);
    add(
        "embed_vision.embedding_projection.weight".into(),
        vec![TEXT_HIDDEN, h],
        0.05,
        &mut rng,
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
        "text_config": {"hidden_size": TEXT_HIDDEN},
        "vision_config": {
            "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": hd,
            "position_embedding_size": pos, "standardize": true
        }
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// Dense FLOPs of the tower and embedder on `patches` real patches pooled into `tokens` soft
/// tokens (every patch attends to every patch).
pub fn flops(layers: usize, patches: usize, tokens: usize) -> f64 {
    let (h, n) = (HIDDEN as f64, patches as f64);
    let proj = HEADS as f64 * HEAD_DIM as f64;
    let per_patch_layer = 4.0 * h * proj + 3.0 * h * INTERMEDIATE as f64 + 2.0 * proj * n;
    let macs = n * PATCH_PIXELS as f64 * h
        + layers as f64 * n * per_patch_layer
        + tokens as f64 * h * TEXT_HIDDEN as f64;
    2.0 * macs
}
