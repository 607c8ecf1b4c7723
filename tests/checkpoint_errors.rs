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

// --- The index of OptiQ's sidecar revision -------------------------------------------------
// Its `weight_map` lists the vision tower's tensors with `optiq/optiq_vision.safetensors`, a path
// relative to the checkpoint directory (tests/fixtures/models/tiny-vision-sidecar is written
// that way). Both loaders (dg-core's text checkpoint, dg-vision's tower) resolve such a name
// against the directory and refuse one that leaves it.

use dg_testkit::{sidecar_copy, INDEX, SIDECAR};

fn sidecar_fixture() -> std::path::PathBuf {
    dg_testkit::model_dir("tiny-vision-sidecar")
}

fn text_checkpoint_err(dir: &Path) -> String {
    let config = dg_core::config::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    match dg_core::checkpoint::Checkpoint::open(dir, dg_core::model::sanitize_options(&config)) {
        Ok(_) => panic!("{} opened but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Every loader refuses `dir`, naming the index, a `weight_map` entry and `named`.
fn index_refused(dir: &Path, named: &str) {
    let index = dir.join(INDEX).display().to_string();
    let errors = [
        ("engine", load_err(dir)),
        ("text checkpoint", text_checkpoint_err(dir)),
        (
            "vision tower",
            dg_vision::VisionModel::load(dir).unwrap_err().to_string(),
        ),
    ];
    for (who, err) in errors {
        assert!(
            err.contains(&index) && err.contains("weight_map[") && err.contains(named),
            "{who}: {err}"
        );
    }
}

#[test]
fn sidecar_index_naming_the_subfolder_loads() {
    let dir = sidecar_fixture();
    let index = std::fs::read_to_string(dir.join(INDEX)).unwrap();
    assert!(index.contains(&format!("\"{SIDECAR}\"")), "{index}");
    let model = DiffusionGemma::load(&dir).unwrap();
    let mut req = Request::tokens(vec![10, 20, 30, 40]);
    req.max_tokens = 4;
    req.steps = Some(2);
    model.generate(&req).unwrap();
    // The 0.7.7 layout: the sidecar at the root, the index naming it there.
    let (_tmp, dir) = sidecar_copy("optiq_vision.safetensors");
    std::fs::rename(dir.join(SIDECAR), dir.join("optiq_vision.safetensors")).unwrap();
    DiffusionGemma::load(&dir).unwrap();
}

#[test]
fn sidecar_index_naming_a_file_outside_the_checkpoint_is_refused() {
    // `../x.safetensors` is refused although the file is there.
    let (tmp, dir) = sidecar_copy("../x.safetensors");
    std::fs::copy(dir.join(SIDECAR), tmp.path().join("x.safetensors")).unwrap();
    index_refused(&dir, "`../x.safetensors`");

    let (_tmp, dir) = sidecar_copy("optiq/../../ckpt/optiq/optiq_vision.safetensors");
    index_refused(&dir, "optiq/../../ckpt/optiq/optiq_vision.safetensors");

    // An absolute path, even one to the checkpoint's own sidecar.
    let abs = sidecar_fixture().join(SIDECAR).display().to_string();
    let (_tmp, dir) = sidecar_copy(&abs);
    index_refused(&dir, &abs);
}

#[test]
fn sidecar_named_by_the_index_but_missing_is_refused() {
    let (_tmp, dir) = sidecar_copy(SIDECAR);
    std::fs::remove_file(dir.join(SIDECAR)).unwrap();
    index_refused(&dir, "optiq/optiq_vision.safetensors, which is missing");
}

/// Paths that are not checkpoint directories say what they are and what to do.
#[test]
fn wrong_paths_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let load = |path: &std::path::Path| {
        dg_engine::DiffusionGemma::load(path)
            .unwrap_err()
            .to_string()
    };
    let err = load(&tmp.path().join("missing"));
    assert!(err.ends_with("missing: no such directory"), "{err}");
    let err = load(std::path::Path::new("mlx-community/some-model"));
    assert!(
        err.contains("looks like a Hugging Face model id") && err.contains("hf download"),
        "{err}"
    );
    let gguf = tmp.path().join("model.gguf");
    std::fs::write(&gguf, b"GGUF").unwrap();
    let err = load(&gguf);
    assert!(
        err.contains("a GGUF file") && err.contains("MLX safetensors"),
        "{err}"
    );
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let fixture = dg_testkit::model_dir("tiny");
    let config = std::fs::read_to_string(fixture.join("config.json")).unwrap();
    std::fs::write(
        other.join("config.json"),
        config.replace("\"diffusion_gemma\"", "\"gemma3\""),
    )
    .unwrap();
    let err = load(&other);
    assert!(
        err.contains("model_type") && err.contains("gemma3"),
        "{err}"
    );
}

// --- Checkpoint files are untrusted ----------------------------------------------------------
// Every file dg reads from a checkpoint must be a regular file (a FIFO would block the load
// forever, a link to /dev/zero would read until memory runs out) within its size cap.

/// Loads `dir` on another thread: the error, or a panic if the load has not ended in 60 s.
fn load_err_in_time(dir: &Path) -> String {
    let dir = dir.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            DiffusionGemma::load(&dir)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(Ok(())) => panic!("loaded but should not"),
        Ok(Err(e)) => e,
        Err(_) => panic!("the load hangs"),
    }
}

/// Replaces `dir/file` with a FIFO; `false` (with a message) where `mkfifo` is missing.
fn make_fifo(dir: &Path, file: &str) -> bool {
    let path = dir.join(file);
    std::fs::remove_file(&path).unwrap();
    match std::process::Command::new("mkfifo").arg(&path).status() {
        Ok(s) if s.success() => true,
        _ => {
            eprintln!("mkfifo unavailable: the FIFO case for {file} is skipped");
            false
        }
    }
}

#[test]
fn a_fifo_in_place_of_a_checkpoint_file_is_refused_not_waited_on() {
    for file in [
        "config.json",
        "model-00002-of-00003.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ] {
        let dir = fresh(3);
        if !make_fifo(dir.path(), file) {
            return;
        }
        let err = load_err_in_time(dir.path());
        let path = dir.path().join(file).display().to_string();
        assert!(
            err.contains(&path) && err.contains("a FIFO, not a regular file"),
            "{file}: {err}"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_link_to_dev_zero_is_refused_not_read() {
    for file in [
        "config.json",
        "tokenizer.json",
        "model-00001-of-00003.safetensors",
    ] {
        let dir = fresh(3);
        let path = dir.path().join(file);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = load_err_in_time(dir.path());
        assert_eq!(
            err,
            format!("{}: a character device, not a regular file", path.display()),
            "{file}"
        );
    }
}

#[test]
fn files_over_their_size_cap_are_refused_before_reading() {
    for (file, cap) in [
        ("config.json", dg_files::CONFIG_MAX_BYTES),
        ("tokenizer.json", dg_files::TOKENIZER_MAX_BYTES),
        ("generation_config.json", dg_files::CONFIG_MAX_BYTES),
        ("model.safetensors.index.json", dg_files::CONFIG_MAX_BYTES),
    ] {
        let dir = fresh(3);
        let path = dir.path().join(file);
        // Sparse: nothing is written, and nothing may be read.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(cap + 1)
            .unwrap();
        let err = load_err_in_time(dir.path());
        assert_eq!(
            err,
            format!(
                "{}: larger than the {cap}-byte cap for this file",
                path.display()
            ),
            "{file}"
        );
    }
}

#[test]
fn a_tensor_in_two_shards_names_the_tensor_and_both_files() {
    let dir = fresh(3);
    let first = dir.path().join("model-00001-of-00003.safetensors");
    let second = dir.path().join("model-00002-of-00003.safetensors");
    let read = |p: &Path| std::fs::read(p).unwrap();
    let (a, b) = (read(&first), read(&second));
    let (a, b) = (
        safetensors::SafeTensors::deserialize(&a).unwrap(),
        safetensors::SafeTensors::deserialize(&b).unwrap(),
    );
    // A tensor the text model loads (not one `sanitize` drops), written again into shard 2.
    let (name, view) = a
        .tensors()
        .into_iter()
        .filter(|(n, _)| n.starts_with("model.decoder.layers.") && n.ends_with(".scales"))
        .min_by(|x, y| x.0.cmp(&y.0))
        .unwrap();
    let mut tensors = b.tensors();
    tensors.push((name.clone(), view));
    safetensors::serialize_to_file(tensors, None, &second).unwrap();
    let err = load_err_in_time(dir.path());
    assert_eq!(
        err,
        format!(
            "tensor {name} is in two shards: {} and {}",
            first.display(),
            second.display()
        )
    );
}
