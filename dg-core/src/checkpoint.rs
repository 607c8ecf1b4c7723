//! Checkpoint files: every `model*.safetensors` shard (sorted, as the reference globs them) and,
//! for a model with a vision tower, OptiQ's bf16 vision sidecar; each memory-mapped once and
//! indexed by the reference's sanitized tensor names. The text model and the vision tower both
//! read their tensors from one [`Checkpoint`].
//!
//! Where the reference loader (`optiq/vlm/diffusion_gemma/loader.py::_gather_weights`) finds the
//! sidecar: `optiq/optiq_vision.safetensors`, or `optiq_vision.safetensors` at the root for older
//! quants; its names lack the `model.encoder.` prefix, and a tensor the shards also hold is the
//! shards' (`setdefault`). A tensor in two model shards is an error naming both files (the
//! reference silently keeps the last copy).
//!
//! Weights stay in the mapped files; a tensor is copied only when it must change form (bf16 norm
//! weights become f32) or when the file places it at an offset its element type cannot be read
//! from in place (safetensors promises no alignment).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::bf16;
use rayon::prelude::*;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

use crate::error::CoreError;
use crate::mmap::MappedFile;

pub use crate::mmap::files_mapped_by_this_thread;

/// A tensor's location and form inside one shard.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Index into the shard list.
    shard: usize,
    /// Element type as stored.
    pub dtype: Dtype,
    /// Shape as stored, outermost first.
    pub shape: Vec<usize>,
    range: Range<usize>,
}

/// Read-only, typed view of tensor data: mapped in place when aligned, else an owned copy.
#[derive(Clone)]
pub struct Buf<T: bytemuck::Pod> {
    inner: BufInner<T>,
}

#[derive(Clone)]
enum BufInner<T> {
    Mapped {
        file: Arc<MappedFile>,
        range: Range<usize>,
    },
    Owned(Arc<Vec<T>>),
}

impl<T: bytemuck::Pod> Buf<T> {
    /// Wraps owned data.
    pub fn owned(data: Vec<T>) -> Self {
        Buf {
            inner: BufInner::Owned(Arc::new(data)),
        }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        match &self.inner {
            // Alignment and length were checked when this Buf was made (see `Checkpoint::buf`).
            BufInner::Mapped { file, range } => bytemuck::cast_slice(&file.bytes()[range.clone()]),
            BufInner::Owned(v) => v,
        }
    }

    /// Whether the data is read in place from the mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, BufInner::Mapped { .. })
    }
}

impl<T: bytemuck::Pod> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buf(len={}, mapped={})",
            self.as_slice().len(),
            self.is_mapped()
        )
    }
}

/// An opened checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<(PathBuf, Arc<MappedFile>)>,
    tensors: HashMap<String, TensorEntry>,
    /// Index into `shards` of the vision sidecar, if one was mapped.
    sidecar: Option<usize>,
}

/// A floating tensor (bf16, f16 or f32) left in the mapped file: the vision tower's plain
/// weights. Aligned bf16 is read in place (`as_bf16`: the product widens a panel at a time);
/// anything else is widened to f32 per call, so that no f32 copy outlives the call.
#[derive(Clone)]
pub struct FloatView {
    file: Arc<MappedFile>,
    range: Range<usize>,
    dtype: Dtype,
}

impl FloatView {
    /// The values in place as bf16, when they are bf16 and aligned for it in the file.
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        let raw = &self.file.bytes()[self.range.clone()];
        (self.dtype == Dtype::BF16)
            .then(|| bytemuck::try_cast_slice(raw).ok())
            .flatten()
    }

    /// The values as f32.
    pub fn to_f32(&self) -> Vec<f32> {
        // The dtype was checked when the view was made.
        widen(self.dtype, &self.file.bytes()[self.range.clone()]).unwrap_or_default()
    }
}

impl std::fmt::Debug for FloatView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FloatView({:?}, {} bytes)", self.dtype, self.range.len())
    }
}

/// Little-endian bf16, f16 or f32 bytes as f32; `None` for any other dtype.
fn widen(dtype: Dtype, raw: &[u8]) -> Option<Vec<f32>> {
    // In parallel: plain weights mapped as f16, f32 or misaligned bf16 are widened on every
    // forward pass.
    Some(match dtype {
        Dtype::BF16 => raw
            .par_chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => raw
            .par_chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => raw
            .par_chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => return None,
    })
}

/// Which tensors `sanitize` keeps, mirroring the reference's `Model.sanitize`.
#[derive(Clone, Copy, Debug)]
pub struct SanitizeOptions {
    /// The config has a vision tower: keep `model.encoder.vision_tower.*` and `embed_vision.*`.
    pub has_vision_tower: bool,
    /// Keep the clipping calibration tensors of clipped vision linears.
    pub use_clipped_linears: bool,
}

/// The reference's `sanitize`: drop rotary tables and `lm_head.weight` (the head is tied), keep
/// only layer scalars of the encoder's text tower (its weights are the decoder's), and give the
/// fused expert tensors their `.weight` suffix. Returns `None` for a dropped tensor.
pub fn sanitize_name(name: &str, opts: SanitizeOptions) -> Option<String> {
    if name.contains("rotary_emb") || name == "lm_head.weight" {
        return None;
    }
    if name.starts_with("model.encoder.embed_vision.")
        || name.starts_with("model.encoder.vision_tower.")
    {
        if !opts.has_vision_tower {
            return None;
        }
        let calibration = ["input_max", "input_min", "output_max", "output_min"];
        if !opts.use_clipped_linears && calibration.iter().any(|s| name.contains(s)) {
            return None;
        }
        return Some(name.to_owned());
    }
    if name.starts_with("model.encoder.language_model.") {
        return name.ends_with(".layer_scalar").then(|| name.to_owned());
    }
    for fused in [".experts.down_proj", ".experts.gate_up_proj"] {
        if name.ends_with(fused) {
            return Some(format!("{name}.weight"));
        }
    }
    Some(name.to_owned())
}

fn dtype_size(dtype: Dtype) -> Option<usize> {
    Some(match dtype {
        Dtype::U8 | Dtype::I8 | Dtype::BOOL => 1,
        Dtype::BF16 | Dtype::F16 | Dtype::I16 | Dtype::U16 => 2,
        Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
        Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        _ => return None,
    })
}

impl Checkpoint {
    /// Opens every `model*.safetensors` shard of `dir` (sorted by name, like the reference's glob),
    /// checks each file against its header, and indexes the sanitized tensor names.
    pub fn open(dir: &Path, opts: SanitizeOptions) -> Result<Self, CoreError> {
        let read_dir = std::fs::read_dir(dir).map_err(|source| CoreError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = read_dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
            })
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(CoreError::Checkpoint {
                path: dir.to_owned(),
                reason: "no model*.safetensors files".into(),
            });
        }
        check_index(dir)?;
        let mut ck = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            tensors: HashMap::new(),
            sidecar: None,
        };
        for path in paths {
            ck.add_file(&path, opts, Source::Shard)?;
        }
        if opts.has_vision_tower {
            if let Some(path) = find_vision_sidecar(dir) {
                ck.add_file(&path, opts, Source::Sidecar)?;
                ck.sidecar = Some(ck.shards.len() - 1);
            }
        }
        Ok(ck)
    }

    /// Maps one safetensors file, checks every tensor against the file, and indexes the ones
    /// `sanitize` keeps.
    fn add_file(
        &mut self,
        path: &Path,
        opts: SanitizeOptions,
        source: Source,
    ) -> Result<(), CoreError> {
        let bad = |reason: String| CoreError::Checkpoint {
            path: path.to_owned(),
            reason,
        };
        let file = Arc::new(MappedFile::open(path)?);
        let bytes = file.bytes();
        let (header_len, metadata) = SafeTensors::read_metadata(bytes)
            .map_err(|e| bad(format!("truncated or corrupt safetensors file: {e}")))?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        for (stored_name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let size = dtype_size(info.dtype).ok_or_else(|| {
                bad(format!(
                    "tensor {stored_name}: unsupported dtype {:?}",
                    info.dtype
                ))
            })?;
            let elems: usize = info.shape.iter().product();
            if end < start || end - start != elems * size {
                return Err(bad(format!(
                    "tensor {stored_name}: {} bytes for shape {:?} of {:?}",
                    end.saturating_sub(start),
                    info.shape,
                    info.dtype
                )));
            }
            if data_start + end > bytes.len() {
                return Err(bad(format!(
                    "truncated: tensor {stored_name} ends at byte {} but the file has {} bytes",
                    data_start + end,
                    bytes.len()
                )));
            }
            let canonical = match source {
                Source::Shard => stored_name.clone(),
                Source::Sidecar => sidecar_canonical(&stored_name).ok_or_else(|| {
                    bad(format!(
                        "sidecar tensor `{stored_name}` matches no vision parameter (the \
                         reference loader refuses such a sidecar)"
                    ))
                })?,
            };
            let Some(name) = sanitize_name(&canonical, opts) else {
                continue;
            };
            if let Some(first) = self.tensors.get(&name) {
                if source == Source::Sidecar {
                    // The reference's `setdefault`: the shards' copy wins.
                    continue;
                }
                return Err(CoreError::DuplicateTensor {
                    name,
                    first: self.shards[first.shard].0.clone(),
                    second: path.to_owned(),
                });
            }
            self.tensors.insert(
                name,
                TensorEntry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range: data_start + start..data_start + end,
                },
            );
        }
        self.shards.push((path.to_owned(), file));
        Ok(())
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The mapped files, in the order they were read: the shards, then the sidecar.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|(path, _)| path.as_path())
    }

    /// The vision sidecar, when one was mapped.
    pub fn sidecar(&self) -> Option<&Path> {
        self.sidecar.map(|i| self.shards[i].0.as_path())
    }

    /// The file a (sanitized) tensor is read from.
    pub fn file_of(&self, name: &str) -> Result<&Path, CoreError> {
        let e = self.entry(name)?;
        Ok(self.shard_path(e))
    }

    /// Whether a (sanitized) tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// All sanitized tensor names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// A tensor's entry, or a `MissingTensor` error.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry, CoreError> {
        self.tensors
            .get(name)
            .ok_or_else(|| CoreError::MissingTensor {
                name: name.to_owned(),
                dir: self.dir.clone(),
            })
    }

    fn shard_path(&self, e: &TensorEntry) -> &Path {
        &self.shards[e.shard].0
    }

    fn bad(&self, name: &str, e: &TensorEntry, reason: String) -> CoreError {
        CoreError::BadTensor {
            name: name.to_owned(),
            path: self.shard_path(e).to_owned(),
            reason,
        }
    }

    fn expect_shape(&self, name: &str, e: &TensorEntry, shape: &[usize]) -> Result<(), CoreError> {
        if e.shape != shape {
            return Err(self.bad(
                name,
                e,
                format!("shape {:?}, expected {:?}", e.shape, shape),
            ));
        }
        Ok(())
    }

    fn raw(&self, e: &TensorEntry) -> &[u8] {
        &self.shards[e.shard].1.bytes()[e.range.clone()]
    }

    /// A floating tensor (bf16, f16 or f32) of the given shape, converted to f32.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CoreError> {
        Ok(self.float_view(name, shape)?.to_f32())
    }

    /// A floating tensor (bf16, f16 or f32) of the given shape, left in the mapped file.
    pub fn float_view(&self, name: &str, shape: &[usize]) -> Result<FloatView, CoreError> {
        let e = self.entry(name)?;
        self.expect_shape(name, e, shape)?;
        if !matches!(e.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(self.bad(
                name,
                e,
                format!("dtype {:?}, expected a float type", e.dtype),
            ));
        }
        Ok(FloatView {
            file: self.shards[e.shard].1.clone(),
            range: e.range.clone(),
            dtype: e.dtype,
        })
    }

    /// A one-element floating tensor of any shape (`[]` or `[1]`), e.g. a clip bound.
    pub fn scalar_f32(&self, name: &str) -> Result<f32, CoreError> {
        let e = self.entry(name)?;
        match self.f32(name, &e.shape)?.as_slice() {
            [x] => Ok(*x),
            _ => Err(self.bad(
                name,
                e,
                format!("shape {:?}, expected one element", e.shape),
            )),
        }
    }

    /// A tensor of the given dtype and shape, read in place when aligned.
    fn buf<T: bytemuck::Pod>(
        &self,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
    ) -> Result<Buf<T>, CoreError> {
        let e = self.entry(name)?;
        if e.dtype != dtype {
            return Err(self.bad(name, e, format!("dtype {:?}, expected {dtype:?}", e.dtype)));
        }
        self.expect_shape(name, e, shape)?;
        let raw = self.raw(e);
        if bytemuck::try_cast_slice::<u8, T>(raw).is_ok() {
            return Ok(Buf {
                inner: BufInner::Mapped {
                    file: self.shards[e.shard].1.clone(),
                    range: e.range.clone(),
                },
            });
        }
        // Misaligned in the file: copy once into an aligned buffer.
        let mut owned = vec![T::zeroed(); raw.len() / std::mem::size_of::<T>()];
        bytemuck::cast_slice_mut::<T, u8>(&mut owned).copy_from_slice(raw);
        Ok(Buf::owned(owned))
    }

    /// A packed quantized weight (`uint32`).
    pub fn u32_buf(&self, name: &str, shape: &[usize]) -> Result<Buf<u32>, CoreError> {
        self.buf(name, Dtype::U32, shape)
    }

    /// Quantization scales or biases: bf16 as shipped; f16/f32 are converted to bf16 exactly
    /// when they hold bf16 values, else rejected.
    pub fn bf16_buf(&self, name: &str, shape: &[usize]) -> Result<Buf<bf16>, CoreError> {
        let e = self.entry(name)?;
        match e.dtype {
            Dtype::BF16 => self.buf(name, Dtype::BF16, shape),
            Dtype::F32 | Dtype::F16 => {
                let values = self.f32(name, shape)?;
                let converted: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
                if converted
                    .iter()
                    .zip(&values)
                    .any(|(b, v)| b.to_f32() != *v && !v.is_nan())
                {
                    return Err(self.bad(
                        name,
                        e,
                        "scales/biases must be exactly representable in bf16".into(),
                    ));
                }
                Ok(Buf::owned(converted))
            }
            other => Err(self.bad(name, e, format!("dtype {other:?}, expected bf16"))),
        }
    }
}

/// Which kind of file [`Checkpoint::add_file`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// A `model*.safetensors` shard: names as stored; a name in two shards is an error.
    Shard,
    /// The vision sidecar: names made canonical; a name the shards hold is skipped.
    Sidecar,
}

/// The vision sidecar, `optiq/` first, then the root (the reference's `resolve_vision_sidecar`).
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

/// Resolves a file name from the index's `weight_map` against the checkpoint directory.
///
/// The file is a path relative to the directory: a shard (`model-00001-of-00002.safetensors`) or
/// a file in a subfolder (OptiQ's vision sidecar, `optiq/optiq_vision.safetensors`). A name that
/// could reach outside the directory (absolute, or with a `..` component) is refused, as is an
/// empty one; the `Err` says why. Nothing is touched on disk, and symlinks are not resolved (a
/// Hugging Face cache snapshot links every file to a blob outside the snapshot directory).
fn resolve_index_file(dir: &Path, file: &str) -> Result<PathBuf, String> {
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

/// When `model.safetensors.index.json` exists, every file its `weight_map` names (a path
/// relative to the checkpoint directory, see [`resolve_index_file`]) must be there.
fn check_index(dir: &Path) -> Result<(), CoreError> {
    let index = dir.join("model.safetensors.index.json");
    let Some(text) = dg_files::read_text_if_present(&index, dg_files::CONFIG_MAX_BYTES)? else {
        return Ok(());
    };
    let bad = |reason: String| CoreError::Checkpoint {
        path: index.clone(),
        reason,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    // Thousands of entries name a handful of files: look at each file once.
    let mut checked: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor}] is not a string")))?;
        if !checked.insert(file) {
            continue;
        }
        let path = resolve_index_file(dir, file)
            .map_err(|why| bad(format!("weight_map[{tensor}] names {why}")))?;
        match dg_files::check_regular(&path) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                return Err(bad(format!(
                    "weight_map[{tensor}] names {file}, which is missing"
                )))
            }
            // A FIFO or a device: the file's own error ("…: a FIFO, not a regular file").
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/models")
            .join(name)
    }

    #[test]
    fn an_index_naming_the_sidecar_subfolder_opens() {
        let dir = fixture("tiny-vision-sidecar");
        let index = std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap();
        assert!(index.contains("\"optiq/optiq_vision.safetensors\""));
        let opts = SanitizeOptions {
            has_vision_tower: true,
            use_clipped_linears: true,
        };
        let ck = Checkpoint::open(&dir, opts).unwrap();
        // The model shard and the sidecar the index names, each mapped once.
        let files: Vec<&Path> = ck.files().collect();
        assert_eq!(
            files,
            [
                dir.join("model.safetensors").as_path(),
                dir.join("optiq/optiq_vision.safetensors").as_path()
            ]
        );
        assert_eq!(ck.sidecar(), Some(files[1]));
        assert!(ck.contains("model.decoder.embed_tokens.weight"));
        let projection = "model.encoder.embed_vision.embedding_projection.weight";
        assert_eq!(ck.file_of(projection).unwrap(), files[1]);
        // Without a vision tower the sidecar is not mapped.
        let text = SanitizeOptions {
            has_vision_tower: false,
            use_clipped_linears: false,
        };
        let ck = Checkpoint::open(&dir, text).unwrap();
        assert_eq!(ck.files().count(), 1);
        assert!(!ck.contains(projection));
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

    #[test]
    fn sanitize_follows_the_reference() {
        let text = SanitizeOptions {
            has_vision_tower: false,
            use_clipped_linears: false,
        };
        assert_eq!(sanitize_name("lm_head.weight", text), None);
        assert_eq!(
            sanitize_name("model.decoder.rotary_emb.inv_freq", text),
            None
        );
        assert_eq!(
            sanitize_name("model.encoder.language_model.layers.3.layer_scalar", text).as_deref(),
            Some("model.encoder.language_model.layers.3.layer_scalar")
        );
        assert_eq!(
            sanitize_name(
                "model.encoder.language_model.layers.3.mlp.up_proj.weight",
                text
            ),
            None
        );
        assert_eq!(
            sanitize_name("model.decoder.layers.0.experts.gate_up_proj", text).as_deref(),
            Some("model.decoder.layers.0.experts.gate_up_proj.weight")
        );
        assert_eq!(
            sanitize_name("model.encoder.vision_tower.x.weight", text),
            None
        );
        let vision = SanitizeOptions {
            has_vision_tower: true,
            use_clipped_linears: false,
        };
        assert!(sanitize_name("model.encoder.vision_tower.x.weight", vision).is_some());
        assert_eq!(
            sanitize_name("model.encoder.vision_tower.x.input_max", vision),
            None
        );
    }
}
