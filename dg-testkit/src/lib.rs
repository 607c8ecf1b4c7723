//! Test support shared by the workspace's tests and benches: the committed fixtures under
//! `tests/fixtures/`, the golden files `tools/reference` writes (see its README for how to
//! regenerate them) and the comparisons the parity tests make.
//!
//! Test code only: a missing or malformed golden, or a comparison that fails, panics with the
//! file or tensor named, as an assertion does.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// The repository's `tests/fixtures/`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// A committed model fixture: `tests/fixtures/models/<name>`.
pub fn model_dir(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// The vision sidecar of the `tiny-vision-sidecar` fixture, as its index names it (relative to
/// the checkpoint directory, as OptiQ's sidecar revision writes it).
pub const SIDECAR: &str = "optiq/optiq_vision.safetensors";

/// A checkpoint's shard index.
pub const INDEX: &str = "model.safetensors.index.json";

/// Copies a directory tree (a fixture, to edit the copy).
pub fn copy_dir(src: &Path, dst: &Path) {
    try_copy_dir(src, dst)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), dst.display()));
}

fn try_copy_dir(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            try_copy_dir(&entry.path(), &to)?;
        } else {
            std::fs::copy(entry.path(), to)?;
        }
    }
    Ok(())
}

/// A copy of the `tiny-vision-sidecar` fixture at `<tmp>/ckpt` whose index names `file` in place
/// of [`SIDECAR`] for every tower tensor.
pub fn sidecar_copy(file: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join("ckpt");
    copy_dir(&model_dir("tiny-vision-sidecar"), &dir);
    let path = dir.join(INDEX);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut index: Value = serde_json::from_str(&text).expect("the fixture's index is JSON");
    let mut renamed = 0;
    for v in index["weight_map"]
        .as_object_mut()
        .expect("a weight_map object")
        .values_mut()
    {
        if v == SIDECAR {
            *v = file.into();
            renamed += 1;
        }
    }
    assert!(renamed > 0, "the fixture's index names no {SIDECAR}");
    std::fs::write(&path, index.to_string()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (tmp, dir)
}

/// A golden file: `tests/fixtures/goldens/<file>`.
pub fn golden_path(file: &str) -> PathBuf {
    fixtures().join("goldens").join(file)
}

/// A golden JSON file, parsed.
pub fn load_json(file: &str) -> Value {
    let path = golden_path(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The unsigned integers of a JSON array.
pub fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not unsigned: {x}")) as usize)
        .collect()
}

/// Token ids of a JSON array.
pub fn ids(v: &Value) -> Vec<u32> {
    usizes(v).into_iter().map(|x| x as u32).collect()
}

/// One tensor's values, decoded from little-endian bytes.
enum Values {
    F32(Vec<f32>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    U8(Vec<u8>),
    /// Bit patterns.
    Bf16(Vec<u16>),
}

/// All tensors of one golden safetensors file, decoded; each accessor checks the tensor's dtype.
pub struct Tensors(HashMap<String, (Vec<usize>, Values)>);

fn words(data: &[u8]) -> impl Iterator<Item = [u8; 4]> + '_ {
    data.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]])
}

impl Tensors {
    /// Loads `tests/fixtures/goldens/<file>`.
    pub fn load(file: &str) -> Self {
        let path = golden_path(file);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let st =
            SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let map = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let data = view.data();
                let values = match view.dtype() {
                    Dtype::F32 => Values::F32(words(data).map(f32::from_le_bytes).collect()),
                    Dtype::I32 => Values::I32(words(data).map(i32::from_le_bytes).collect()),
                    Dtype::U32 => Values::U32(words(data).map(u32::from_le_bytes).collect()),
                    Dtype::U8 => Values::U8(data.to_vec()),
                    Dtype::BF16 => Values::Bf16(
                        data.chunks_exact(2)
                            .map(|c| u16::from_le_bytes([c[0], c[1]]))
                            .collect(),
                    ),
                    other => panic!("{}: {name}: unexpected dtype {other:?}", path.display()),
                };
                (name, (view.shape().to_vec(), values))
            })
            .collect();
        Self(map)
    }

    fn entry(&self, name: &str) -> &(Vec<usize>, Values) {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("golden tensor {name} missing"))
    }

    /// The tensor's shape.
    pub fn shape(&self, name: &str) -> &[usize] {
        &self.entry(name).0
    }

    /// An `F32` tensor.
    pub fn f32(&self, name: &str) -> &[f32] {
        match &self.entry(name).1 {
            Values::F32(v) => v,
            _ => panic!("golden tensor {name} is not F32"),
        }
    }

    /// An `I32` tensor.
    pub fn i32(&self, name: &str) -> &[i32] {
        match &self.entry(name).1 {
            Values::I32(v) => v,
            _ => panic!("golden tensor {name} is not I32"),
        }
    }

    /// A `U32` tensor.
    pub fn u32(&self, name: &str) -> &[u32] {
        match &self.entry(name).1 {
            Values::U32(v) => v,
            _ => panic!("golden tensor {name} is not U32"),
        }
    }

    /// A `U8` tensor.
    pub fn u8(&self, name: &str) -> &[u8] {
        match &self.entry(name).1 {
            Values::U8(v) => v,
            _ => panic!("golden tensor {name} is not U8"),
        }
    }

    /// A `BF16` tensor as its bit patterns.
    pub fn bf16_bits(&self, name: &str) -> &[u16] {
        match &self.entry(name).1 {
            Values::Bf16(v) => v,
            _ => panic!("golden tensor {name} is not BF16"),
        }
    }

    /// A `BF16` tensor widened to f32 (exactly).
    pub fn bf16_as_f32(&self, name: &str) -> Vec<f32> {
        self.bf16_bits(name)
            .iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect()
    }

    /// `f32` with the tensor's shape.
    pub fn f32_shaped(&self, name: &str) -> (&[usize], &[f32]) {
        (self.shape(name), self.f32(name))
    }

    /// `i32` with the tensor's shape.
    pub fn i32_shaped(&self, name: &str) -> (&[usize], &[i32]) {
        (self.shape(name), self.i32(name))
    }

    /// `u8` with the tensor's shape.
    pub fn u8_shaped(&self, name: &str) -> (&[usize], &[u8]) {
        (self.shape(name), self.u8(name))
    }

    /// Token ids or flags stored as `I32` or `U32` (the reference writes either).
    pub fn ids(&self, name: &str) -> Vec<u32> {
        match &self.entry(name).1 {
            Values::I32(v) => v.iter().map(|&x| x as u32).collect(),
            Values::U32(v) => v.clone(),
            _ => panic!("golden tensor {name} is not I32 or U32"),
        }
    }
}

/// max |a - b|; the lengths must agree.
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
