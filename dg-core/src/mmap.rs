//! Read-only memory maps of checkpoint files.

use std::cell::Cell;
use std::path::Path;

use crate::error::CoreError;

thread_local! {
    /// Files mapped by this thread: loading maps on the caller's thread, so a test can count
    /// the maps one load makes without seeing other tests' loads.
    static MAPPED: Cell<usize> = const { Cell::new(0) };
}

/// How many files this thread has memory-mapped so far (checkpoint shards, sidecars,
/// adapters): a load's count is the difference before and after it. For tests and diagnostics.
pub fn files_mapped_by_this_thread() -> usize {
    MAPPED.with(Cell::get)
}

/// A whole file mapped read-only.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `path` read-only; it must be a regular file (a FIFO or a device is refused before
    /// it is opened).
    pub fn open(path: &Path) -> Result<Self, CoreError> {
        let (file, _) = dg_files::open_regular(path)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based
        // loader (safetensors, candle), we rely on checkpoint files not being truncated or
        // rewritten while a model is loaded; that is documented on `DiffusionGemma::load`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| CoreError::Io {
            path: path.to_owned(),
            source,
        })?;
        MAPPED.with(|n| n.set(n.get() + 1));
        Ok(MappedFile { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
