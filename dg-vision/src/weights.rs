//! Finding and reading the tower's tensors, memory-mapped.
//!
//! Where the reference loader (`optiq/vlm/diffusion_gemma/loader.py::_gather_weights`) finds
//! them: every `model*.safetensors` in the checkpoint directory (sorted; a later file's tensor
//! replaces an earlier one's), then the bf16 vision sidecar `optiq/optiq_vision.safetensors`
//! (or, for older quants, `optiq_vision.safetensors` at the root), whose names lack the
//! `model.encoder.` prefix. A tensor in the model shards wins over the sidecar's.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;

use crate::error::{Result, VisionError};

/// Where the tower's weights came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightLayout {
    /// In the model shards (`model.encoder.vision_tower.*`); `quantized` when `input_proj` is.
    Inline { quantized: bool },
    /// In the bf16 sidecar at this path.
    Sidecar { path: PathBuf },
}

/// One memory-mapped safetensors file.
struct StFile {
    path: PathBuf,
    mmap: Arc<Mmap>,
    data_start: usize,
    meta: Metadata,
}

fn map_file(path: &Path) -> Result<StFile> {
    let file = File::open(path).map_err(|source| VisionError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: the map is read-only and private to this process; the checkpoint files are not
    // expected to change while a model is loaded (the same contract every mmap-based weight
    // loader has). Every access is bounds-checked against the parsed header first.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|source| VisionError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (n, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| VisionError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(StFile {
        path: path.to_path_buf(),
        mmap: Arc::new(mmap),
        data_start: 8 + n,
        meta,
    })
}

/// A tensor's bytes inside a mapped file.
#[derive(Clone)]
pub(crate) struct TensorRef {
    pub name: String,
    pub path: PathBuf,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    mmap: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl std::fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {:?} ({})",
            self.name,
            self.dtype,
            self.shape,
            self.path.display()
        )
    }
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        &self.mmap[self.start..self.end]
    }

    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(VisionError::TensorShape {
                name: self.name.clone(),
                expected: expected.to_vec(),
                got: self.shape.clone(),
            });
        }
        Ok(())
    }

    fn dtype_err(&self, expected: &'static str) -> VisionError {
        VisionError::TensorDtype {
            name: self.name.clone(),
            path: self.path.clone(),
            dtype: format!("{:?}", self.dtype),
            expected,
        }
    }

    /// Converts a floating tensor (f32, bf16, f16) to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes();
        Ok(match self.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => return Err(self.dtype_err("f32, bf16 or f16")),
        })
    }

    /// A bf16 tensor as bf16 values.
    pub fn to_bf16(&self) -> Result<Vec<bf16>> {
        if self.dtype != Dtype::BF16 {
            return Err(self.dtype_err("bf16"));
        }
        Ok(self
            .bytes()
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
            .collect())
    }

    /// A u32 tensor as u32 values.
    pub fn to_u32(&self) -> Result<Vec<u32>> {
        if self.dtype != Dtype::U32 {
            return Err(self.dtype_err("u32"));
        }
        Ok(self
            .bytes()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// A one-element floating tensor (clip bounds, layer scalars).
    pub fn scalar_f32(&self) -> Result<f32> {
        let v = self.to_f32()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(VisionError::TensorShape {
                name: self.name.clone(),
                expected: vec![],
                got: self.shape.clone(),
            }),
        }
    }
}

/// The tensors a tower may read, under their canonical (`model.encoder.…`) names.
pub(crate) struct TensorStore {
    files: Vec<StFile>,
    index: HashMap<String, (usize, String)>,
    pub sidecar: Option<PathBuf>,
    searched: String,
}

/// The vision sidecar, `optiq/` first, then the root (`sidecar_layout.resolve`).
pub fn find_vision_sidecar(dir: &Path) -> Option<PathBuf> {
    [
        dir.join("optiq").join("optiq_vision.safetensors"),
        dir.join("optiq_vision.safetensors"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// A sidecar name's canonical model name, or `None` if it names no vision parameter.
fn sidecar_canonical(name: &str) -> Option<String> {
    let full = if name.starts_with("model.") {
        name.to_string()
    } else if name.starts_with("encoder.") {
        format!("model.{name}")
    } else {
        format!("model.encoder.{name}")
    };
    (full.starts_with("model.encoder.vision_tower.")
        || full.starts_with("model.encoder.embed_vision."))
    .then_some(full)
}

impl TensorStore {
    /// Maps the checkpoint's model shards and its vision sidecar, if any.
    pub fn open(dir: &Path) -> Result<Self> {
        let entries = std::fs::read_dir(dir).map_err(|source| VisionError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut shards: Vec<PathBuf> = Vec::new();
        for e in entries {
            let e = e.map_err(|source| VisionError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("model") && name.ends_with(".safetensors") {
                shards.push(e.path());
            }
        }
        shards.sort();
        let mut store = TensorStore {
            files: Vec::new(),
            index: HashMap::new(),
            sidecar: None,
            searched: String::new(),
        };
        for path in &shards {
            let f = map_file(path)?;
            let i = store.files.len();
            for name in f.meta.tensors().into_keys() {
                if name.starts_with("model.encoder.vision_tower.")
                    || name.starts_with("model.encoder.embed_vision.")
                {
                    store.index.insert(name.clone(), (i, name));
                }
            }
            store.files.push(f);
        }
        if let Some(path) = find_vision_sidecar(dir) {
            let f = map_file(&path)?;
            let i = store.files.len();
            let mut names: Vec<String> = f.meta.tensors().into_keys().collect();
            names.sort();
            for name in names {
                let canonical =
                    sidecar_canonical(&name).ok_or_else(|| VisionError::Safetensors {
                        path: path.clone(),
                        message: format!(
                            "sidecar tensor `{name}` matches no vision parameter (the reference \
                         loader refuses such a sidecar)"
                        ),
                    })?;
                // setdefault: the shards' copy wins.
                store.index.entry(canonical).or_insert((i, name));
            }
            store.files.push(f);
            store.sidecar = Some(path);
        }
        store.searched = store
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        if store.searched.is_empty() {
            store.searched = format!("{} (no model*.safetensors)", dir.display());
        }
        Ok(store)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Whether the tensor came from the sidecar.
    pub fn is_from_sidecar(&self, name: &str) -> bool {
        match (self.index.get(name), &self.sidecar) {
            (Some(&(i, _)), Some(s)) => &self.files[i].path == s,
            _ => false,
        }
    }

    pub fn get(&self, name: &str) -> Result<TensorRef> {
        let (i, stored) = self
            .index
            .get(name)
            .ok_or_else(|| VisionError::MissingTensor {
                name: name.to_string(),
                searched: self.searched.clone(),
            })?;
        let f = &self.files[*i];
        let info = f
            .meta
            .info(stored)
            .ok_or_else(|| VisionError::MissingTensor {
                name: name.to_string(),
                searched: self.searched.clone(),
            })?;
        let (a, b) = info.data_offsets;
        Ok(TensorRef {
            name: name.to_string(),
            path: f.path.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            mmap: Arc::clone(&f.mmap),
            start: f.data_start + a,
            end: f.data_start + b,
        })
    }

    pub fn get_opt(&self, name: &str) -> Result<Option<TensorRef>> {
        if self.contains(name) {
            self.get(name).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_names_map_like_the_reference() {
        assert_eq!(
            sidecar_canonical("vision_tower.patch_embedder.input_proj.weight").as_deref(),
            Some("model.encoder.vision_tower.patch_embedder.input_proj.weight")
        );
        assert_eq!(
            sidecar_canonical("encoder.embed_vision.embedding_projection.weight").as_deref(),
            Some("model.encoder.embed_vision.embedding_projection.weight")
        );
        assert_eq!(sidecar_canonical("audio_tower.x.weight"), None);
    }
}
