//! Golden files written by tools/reference (see its README for how to regenerate them).
//! (Each test binary uses a different subset of these helpers.)
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

/// Repository-level `tests/fixtures/`.
pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"))
}

/// A golden safetensors file loaded into memory.
pub struct Goldens {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Goldens {
    pub fn open(name: &str) -> Goldens {
        let path = fixtures().join("goldens").join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).expect("valid golden file");
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f32> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                Dtype::I32 => data
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
                Dtype::U32 => data
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
                other => panic!("{name}: unexpected golden dtype {other:?}"),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Goldens { tensors }
    }

    pub fn f32(&self, name: &str) -> &[f32] {
        &self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("golden {name} missing"))
            .1
    }

    pub fn shape(&self, name: &str) -> &[usize] {
        &self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("golden {name} missing"))
            .0
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.f32(name).iter().map(|&v| v as u32).collect()
    }
}

/// max |a - b|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// max |x|.
pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// Row-wise argmax (first index on ties).
pub fn argmax_rows(a: &[f32], width: usize) -> Vec<usize> {
    a.chunks_exact(width)
        .map(|row| {
            let mut best = 0;
            for (i, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect()
}

/// sqrt(mean((a-b)^2)) / sqrt(mean(b^2)).
pub fn relative_rms(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Asserts max |ours - golden| <= bound x max |golden|, printing the margin (`--nocapture`).
pub fn assert_close(what: &str, ours: &[f32], golden: &[f32], bound: f32) {
    let diff = max_abs_diff(ours, golden);
    let scale = max_abs(golden).max(1e-6);
    println!(
        "{what}: max |diff| {diff:.2e}, {:.2e} of max |ref|",
        diff / scale
    );
    assert!(
        diff <= bound * scale,
        "{what}: max |diff| {diff:e} exceeds {bound:e} x max |ref| {scale:e}"
    );
}

/// `assert_close` on logits `[rows, vocab]`, and the same argmax in every row.
pub fn assert_logits(what: &str, ours: &[f32], golden: &[f32], vocab: usize, bound: f32) {
    assert_close(what, ours, golden, bound);
    assert_eq!(
        argmax_rows(ours, vocab),
        argmax_rows(golden, vocab),
        "{what}: argmax differs"
    );
}
