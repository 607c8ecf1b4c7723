//! `model.safetensors.index.json` as OptiQ's sidecar revision writes it: the tower's tensors
//! listed with the file `optiq/optiq_vision.safetensors`, a path relative to the checkpoint
//! directory. Such an index loads; one naming a file outside the directory is refused with an
//! error that names the index and the `weight_map` entry.

use std::path::{Path, PathBuf};

use dg_vision::{VisionError, VisionModel, WeightLayout};
use serde_json::Value;

use dg_testkit::{sidecar_copy as with_sidecar_entries, INDEX, SIDECAR};

fn sidecar_fixture() -> PathBuf {
    dg_testkit::model_dir("tiny-vision-sidecar")
}

#[test]
fn the_fixture_index_names_the_sidecar_subfolder_and_loads() {
    let dir = sidecar_fixture();
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(INDEX)).unwrap()).unwrap();
    assert_eq!(
        index["weight_map"]["embed_vision.embedding_projection.weight"],
        SIDECAR
    );
    let model = VisionModel::load(&dir).unwrap();
    assert_eq!(
        model.layout(),
        &WeightLayout::Sidecar {
            path: dir.join(SIDECAR)
        }
    );
}

#[test]
fn equivalent_relative_spellings_load() {
    let (_tmp, dir) = with_sidecar_entries("./optiq/optiq_vision.safetensors");
    VisionModel::load(&dir).unwrap();
}

fn refused(dir: &Path, named: &str) {
    let e = VisionModel::load(dir).unwrap_err();
    let msg = e.to_string();
    match &e {
        VisionError::Checkpoint(dg_core::CoreError::Checkpoint { path, reason }) => {
            assert_eq!(path, &dir.join(INDEX), "{msg}");
            assert!(reason.starts_with("weight_map["), "{msg}");
        }
        other => panic!("expected an index error, got {other:?}"),
    }
    assert!(msg.contains(named), "{msg}");
}

#[test]
fn an_index_naming_a_file_outside_the_checkpoint_is_refused() {
    // `../x.safetensors` exists (beside the checkpoint) and is still refused.
    let (tmp, dir) = with_sidecar_entries("../x.safetensors");
    std::fs::copy(dir.join(SIDECAR), tmp.path().join("x.safetensors")).unwrap();
    refused(&dir, "../x.safetensors");

    let (_tmp, dir) = with_sidecar_entries("optiq/../../x.safetensors");
    refused(&dir, "optiq/../../x.safetensors");

    // An absolute path, even to the checkpoint's own sidecar.
    let (tmp, dir) = with_sidecar_entries("placeholder");
    let abs = dir.join(SIDECAR).to_str().unwrap().to_owned();
    let path = dir.join(INDEX);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"placeholder\"", &format!("{abs:?}"))).unwrap();
    refused(&dir, &abs);
    drop(tmp);
}

#[test]
fn an_index_naming_a_missing_sidecar_is_refused() {
    let (_tmp, dir) = with_sidecar_entries(SIDECAR);
    std::fs::remove_file(dir.join(SIDECAR)).unwrap();
    refused(&dir, "which is missing");
}
