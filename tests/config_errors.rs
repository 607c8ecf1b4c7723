//! Bad numbers in config.json and generation_config.json are refused at load with a typed error
//! naming the file and the field, before anything is allocated from them: never an abort, a
//! panic at the first generate, or a silently truncated value. Each case copies a committed
//! fixture checkpoint into a temporary directory and edits one field.

use dg_engine::{DiffusionGemma, EngineError};
use dg_testkit::model_dir as fixture;

/// A copy of a fixture checkpoint with `edit` applied to its `file`.
fn edited(model: &str, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(model)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join(file);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// Loads `dir`, which must fail with a typed error naming `dir/file` and every one of `needles`.
fn refused(dir: &tempfile::TempDir, file: &str, needles: &[&str]) -> String {
    let err = match DiffusionGemma::load(dir.path()) {
        Ok(_) => panic!("loaded; expected an error naming {needles:?}"),
        Err(e) => e,
    };
    let typed = match &err {
        EngineError::Model(e) => matches!(**e, dg_core::CoreError::Config { .. }),
        EngineError::Vision(e) => matches!(e, dg_vision::VisionError::Config { .. }),
        EngineError::File { .. } => file == "generation_config.json",
        _ => false,
    };
    assert!(typed, "not a config error for {file}: {err:?}");
    let msg = err.to_string();
    let path = dir.path().join(file);
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    for n in needles {
        assert!(msg.contains(n), "{n:?} not in {msg}");
    }
    msg
}

fn config(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    edited("tiny", "config.json", edit)
}

fn generation(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    edited("tiny", "generation_config.json", edit)
}

#[test]
fn the_unedited_copy_loads() {
    DiffusionGemma::load(config(|_| {}).path()).unwrap();
}

#[test]
fn huge_layer_counts_are_refused_not_aborted() {
    for n in [100_000_000_u64, 1_000_000_000_000, u64::MAX] {
        let dir = config(|v| {
            v["text_config"]["num_hidden_layers"] = n.into();
            v["text_config"]
                .as_object_mut()
                .unwrap()
                .remove("layer_types");
        });
        refused(&dir, "config.json", &["text_config.num_hidden_layers"]);
    }
    let dir = edited("tiny-vision", "config.json", |v| {
        v["vision_config"]["num_hidden_layers"] = 1_000_000_000_000_u64.into()
    });
    refused(&dir, "config.json", &["vision_config.num_hidden_layers"]);
}

#[test]
fn huge_canvas_is_refused() {
    let dir = config(|v| v["canvas_length"] = 1_000_000_000.into());
    refused(&dir, "config.json", &["canvas_length"]);
}

#[test]
fn rope_and_norm_numbers_are_refused() {
    let dir = config(|v| {
        v["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 2.0.into()
    });
    refused(&dir, "config.json", &["partial_rotary_factor"]);
    for theta in [0.0, -1.0] {
        let dir = config(|v| {
            v["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = theta.into()
        });
        refused(&dir, "config.json", &["rope_theta"]);
    }
    let dir = config(|v| v["text_config"]["rms_norm_eps"] = (-1.0).into());
    refused(&dir, "config.json", &["text_config.rms_norm_eps"]);
}

#[test]
fn quantization_bits_are_not_truncated() {
    let dir = config(|v| v["quantization"]["bits"] = ((1u64 << 32) + 4).into());
    refused(&dir, "config.json", &["quantization.bits", "4294967300"]);
}

#[test]
fn token_ids_outside_the_vocab_are_refused() {
    let dir = config(|v| v["image_token_id"] = 4096.into());
    refused(&dir, "config.json", &["image_token_id", "vocab_size"]);
    let dir = config(|v| v["eos_token_id"] = serde_json::json!([1, 1000]));
    refused(&dir, "config.json", &["eos_token_id"]);
}

#[test]
fn type_errors_name_the_field() {
    let dir = config(|v| v["text_config"]["hidden_size"] = "big".into());
    let msg = refused(
        &dir,
        "config.json",
        &["config.json: text_config.hidden_size: invalid type: string \"big\", expected usize"],
    );
    assert!(!msg.contains("column"), "{msg}");
}

#[test]
fn generation_config_numbers_are_refused() {
    let cases: [(&str, serde_json::Value); 6] = [
        ("eos_token_id", serde_json::json!((1u64 << 32) + 26)),
        ("stability_threshold", serde_json::json!(-3)),
        ("entropy_bound", serde_json::json!(-1)),
        ("t_max", serde_json::json!(0)),
        ("max_denoising_steps", serde_json::json!(-1)),
        ("confidence_threshold", serde_json::json!(-0.5)),
    ];
    for (field, value) in cases {
        let dir = generation(|v| {
            if field == "entropy_bound" {
                v["sampler_config"]["entropy_bound"] = value;
            } else {
                if field == "t_max" {
                    v["t_min"] = 0.into();
                }
                v[field] = value;
            }
        });
        refused(&dir, "generation_config.json", &[field]);
    }
    let dir = generation(|v| {
        v["t_min"] = 5.into();
        v["t_max"] = (-3).into();
    });
    refused(&dir, "generation_config.json", &["t_max"]);
}

#[test]
fn generation_config_eos_ids_outside_the_vocab_are_refused() {
    let dir = generation(|v| v["eos_token_id"] = serde_json::json!([1, 600]));
    refused(
        &dir,
        "generation_config.json",
        &["eos_token_id", "600", "vocab_size 512"],
    );
    // The generation_config embedded in config.json (what `Defaults::Reference` uses).
    let dir = config(|v| v["generation_config"] = serde_json::json!({"eos_token_id": 512}));
    let err = DiffusionGemma::load(dir.path()).unwrap_err();
    let path = dir.path().join("config.json");
    assert!(
        matches!(&err, EngineError::File { path: p, .. } if *p == path),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("generation_config.eos_token_id: token id 512"),
        "{msg}"
    );
}

#[test]
fn a_tokenizer_with_ids_past_the_model_vocab_is_refused() {
    // An added token past the model's 512 embedding rows (tokenizers numbers it 512).
    let dir = edited("tiny", "tokenizer.json", |v| {
        v["added_tokens"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "id": 700, "content": "<extra>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            }))
    });
    let err = DiffusionGemma::load(dir.path()).unwrap_err();
    let path = dir.path().join("tokenizer.json");
    assert!(
        matches!(&err, EngineError::File { path: p, .. } if *p == path),
        "{err:?}"
    );
    let msg = err.to_string();
    for needle in ["ids reach 512", "text_config.vocab_size is 512"] {
        assert!(msg.contains(needle), "{needle:?} not in {msg}");
    }
    // A model vocabulary larger than the tokenizer's (a padded embedding) is fine: the
    // unedited fixture's tokenizer has 512 ids for 512 rows, a smaller one loads as well.
    let dir = edited("tiny", "tokenizer.json", |v| {
        v["added_tokens"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["id"].as_u64() < Some(500));
    });
    DiffusionGemma::load(dir.path()).unwrap();
}
