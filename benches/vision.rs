//! The vision tower at the real geometry (hidden 1152, 16 heads of 72, intermediate 4304, 10240
//! positions, random bf16 weights in the sidecar layout) on one 1920x1080 image at the real
//! soft-token budget (280): preprocessing, and the tower + embedder with one of its 27 layers
//! (multiply the per-layer part by 27 for the whole tower).
//!
//! `cargo bench --bench vision`

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use dg_vision::{ImageProcessor, VisionModel};

/// One of the real 27 layers: each iteration stays a few seconds; scale per layer.
const LAYERS: usize = 1;

fn benches(c: &mut Criterion) {
    let dir = common::tower::write(LAYERS);
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
