//! Bad checkpoints give typed errors that name the file and tensor or field at fault, and never
//! panic. Each case starts from a valid random checkpoint written by `dg_core::synthetic` (the real
//! format, sharded) and breaks one thing.

use std::path::Path;

use dg_core::synthetic::{write_checkpoint, SyntheticSpec};
use dg_engine::{DiffusionGemma, Request};

fn fresh(shards: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticSpec {
        shards,
        ..SyntheticSpec::default()
    };
    write_checkpoint(dir.path(), &spec).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    match DiffusionGemma::load(dir) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn a_valid_sharded_checkpoint_loads_and_generates_deterministically() {
    let dir = fresh(3);
    assert!(dir.path().join("model.safetensors.index.json").exists());
    let model = DiffusionGemma::load(dir.path()).unwrap();
    let mut req = Request::tokens(vec![10, 20, 30, 40]);
    req.max_tokens = 20;
    req.steps = Some(6);
    let a = model.generate(&req).unwrap();
    let b = model.generate(&req).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    assert!(a.stats.generated_tokens <= 20);
}

#[test]
fn truncated_shard_names_the_file_and_tensor() {
    let dir = fresh(3);
    let shard = dir.path().join("model-00002-of-00003.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model-00002-of-00003.safetensors") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn missing_shard_named_by_the_index() {
    let dir = fresh(3);
    std::fs::remove_file(dir.path().join("model-00003-of-00003.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model-00003-of-00003.safetensors"), "{err}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = fresh(1);
    // Drop one tensor by rewriting the file without it.
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "model.decoder.layers.2.mlp.up_proj.scales")
        .collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model.decoder.layers.2.mlp.up_proj.scales"),
        "{err}"
    );
}

#[test]
fn wrong_shape_names_tensor_and_shapes() {
    let dir = fresh(1);
    // The config claims a larger hidden size than the weights have.
    edit_config(dir.path(), |v| {
        v["text_config"]["intermediate_size"] = 192.into()
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("mlp.gate_proj") && err.contains("shape"),
        "{err}"
    );
}

#[test]
fn inconsistent_config_names_the_field() {
    let dir = fresh(1);
    edit_config(dir.path(), |v| {
        v["text_config"]["num_key_value_heads"] = 3.into()
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("num_attention_heads") && err.contains("config.json"),
        "{err}"
    );

    let dir = fresh(1);
    edit_config(dir.path(), |v| v["quantization"]["mode"] = "mxfp4".into());
    assert!(load_err(dir.path()).contains("quantization.mode"));

    let dir = fresh(1);
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(load_err(dir.path()).contains("config.json"));
}

#[test]
fn wrong_dtype_is_named() {
    let dir = fresh(1);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let target = "model.decoder.layers.0.self_attn.q_proj.weight";
    let mut owned: Vec<(String, safetensors::tensor::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    for t in owned.iter_mut().filter(|t| t.0 == target) {
        t.1 = safetensors::tensor::Dtype::I32;
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(target) && err.contains("I32"), "{err}");
}

#[test]
fn not_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(load_err(dir.path()).contains("config.json"));
    let err = load_err(Path::new("/nonexistent/dg-model"));
    assert!(err.contains("/nonexistent/dg-model"), "{err}");
}
