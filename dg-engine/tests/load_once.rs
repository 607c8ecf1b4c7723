//! Loading maps each checkpoint file once: the text model and the vision tower read their
//! tensors from one `Checkpoint` (before, each tower mapped every shard itself).

use dg_core::checkpoint::files_mapped_by_this_thread;
use dg_engine::DiffusionGemma;
use dg_testkit::model_dir as fixture;

/// Files mapped while loading `name` (loading maps on the caller's thread).
fn maps_to_load(name: &str) -> usize {
    let before = files_mapped_by_this_thread();
    DiffusionGemma::load(fixture(name)).unwrap();
    files_mapped_by_this_thread() - before
}

#[test]
fn every_checkpoint_file_is_mapped_once() {
    // model.safetensors and optiq/optiq_vision.safetensors (text and tower: 1 + 2 before).
    assert_eq!(maps_to_load("tiny-vision-sidecar"), 2);
    // The tower inline in the one shard (1 + 1 before).
    assert_eq!(maps_to_load("tiny-vision"), 1);
    // Three shards, no tower.
    assert_eq!(maps_to_load("tiny-sharded"), 3);
}
