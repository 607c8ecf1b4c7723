//! Read-only memory maps of checkpoint files.

use std::fs::File;
use std::path::Path;

use crate::error::CoreError;

/// A whole file mapped read-only.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self, CoreError> {
        let io = |source| CoreError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based
        // loader (safetensors, candle), we rely on checkpoint files not being truncated or
        // rewritten while a model is loaded; that is documented on `DiffusionGemma::load`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(MappedFile { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
