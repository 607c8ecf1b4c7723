//! Finding and reading the tower's tensors, memory-mapped.
//!
//! Where the reference loader (`optiq/vlm/diffusion_gemma/loader.py::_gather_weights`) finds
//! them: every `model*.safetensors` in the checkpoint directory (sorted; a later file's tensor
//! replaces an earlier one's), then the bf16 vision sidecar `optiq/optiq_vision.safetensors`
//! (or, for older quants, `optiq_vision.safetensors` at the root), whose names lack the
//! `model.encoder.` prefix. A tensor in the model shards wins over the sidecar's.
//!
//! The reference never reads `model.safetensors.index.json`; like dg-core's checkpoint loader,
//! this one checks that every file its `weight_map` names is there. The names are paths relative
//! to the checkpoint directory: OptiQ's sidecar revision lists the tower's tensors with
//! `optiq/optiq_vision.safetensors`. A name reaching outside the directory is refused.

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
    Inline {
        /// Whether the tower's linears are quantized.
        quantized: bool,
    },
    /// In the bf16 sidecar at this path.
    Sidecar {
        /// The sidecar safetensors file.
        path: PathBuf,
    },
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

/// Resolves a file name from the index's `weight_map` against the checkpoint directory: a path
/// relative to it (`model-00001-of-00002.safetensors`, `optiq/optiq_vision.safetensors`). A name
/// that could reach outside the directory (absolute, or with a `..` component) is refused, as is
/// an empty one; the `Err` says why. Nothing is touched on disk and symlinks are not resolved (a
/// Hugging Face cache snapshot links every file to a blob outside the snapshot directory).
///
/// The same rule as dg-core's checkpoint loader (`dg-core/src/checkpoint.rs`) for the same index.
fn resolve_index_file(dir: &Path, file: &str) -> std::result::Result<PathBuf, String> {
    use std::path::Component;
    if file.is_empty() {
        return Err("an empty file name".into());
    }
    let mut resolved = dir.to_path_buf();
    for c in Path::new(file).components() {
        match c {
            Component::Normal(part) => resolved.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!(
                    "`{file}`, a path with a `..` component (index file names must stay \
                     inside the checkpoint directory)"
                ))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "`{file}`, an absolute path (index file names are relative to the \
                     checkpoint directory)"
                ))
            }
        }
    }
    if resolved == dir {
        return Err(format!("`{file}`, which names no file"));
    }
    Ok(resolved)
}

/// When `model.safetensors.index.json` exists, every file its `weight_map` names (see
/// [`resolve_index_file`]) must be there. Errors name the index and the `weight_map` entry.
fn check_index(dir: &Path) -> Result<()> {
    let index = dir.join("model.safetensors.index.json");
    let Ok(text) = std::fs::read_to_string(&index) else {
        return Ok(());
    };
    let bad = |field: String, message: String| VisionError::Config {
        path: index.clone(),
        field,
        message,
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad("weight_map".into(), format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("weight_map".into(), "no weight_map object".into()))?;
    // Thousands of entries name a handful of files: look at each file once.
    let mut checked: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (tensor, file) in map {
        let field = || format!("weight_map[{tensor}]");
        let file = file
            .as_str()
            .ok_or_else(|| bad(field(), "not a string".into()))?;
        if !checked.insert(file) {
            continue;
        }
        let path =
            resolve_index_file(dir, file).map_err(|why| bad(field(), format!("names {why}")))?;
        if !path.is_file() {
            return Err(bad(field(), format!("names {file}, which is missing")));
        }
    }
    Ok(())
}

impl TensorStore {
    /// Maps the checkpoint's model shards and its vision sidecar, if any, after checking the
    /// index (when there is one) names only files that are there.
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
        check_index(dir)?;
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
    fn index_files_resolve_inside_the_checkpoint_only() {
        let dir = Path::new("/models/dg");
        let ok = |f: &str| resolve_index_file(dir, f).unwrap();
        assert_eq!(ok("model.safetensors"), dir.join("model.safetensors"));
        assert_eq!(
            ok("optiq/optiq_vision.safetensors"),
            dir.join("optiq").join("optiq_vision.safetensors")
        );
        assert_eq!(ok("./model.safetensors"), dir.join("model.safetensors"));
        for bad in [
            "../x.safetensors",
            "optiq/../../x.safetensors",
            "optiq/../model.safetensors",
            "/x.safetensors",
            "/models/dg/model.safetensors",
            "",
            ".",
        ] {
            assert!(resolve_index_file(dir, bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_sidecar_named_by_the_index_is_mapped_once() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/models/tiny-vision-sidecar");
        let index = std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap();
        assert!(index.contains("\"optiq/optiq_vision.safetensors\""));
        let store = TensorStore::open(&dir).unwrap();
        let paths: Vec<&Path> = store.files.iter().map(|f| f.path.as_path()).collect();
        assert_eq!(
            paths,
            [
                dir.join("model.safetensors").as_path(),
                dir.join("optiq/optiq_vision.safetensors").as_path()
            ]
        );
        assert!(store.is_from_sidecar("model.encoder.embed_vision.embedding_projection.weight"));
    }

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
