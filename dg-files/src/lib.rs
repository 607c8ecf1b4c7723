//! Checkpoint files are untrusted input: a directory downloaded from anywhere may hold a FIFO
//! (reading it blocks forever), a link to `/dev/zero` (reading it never ends) or a file far
//! larger than any real one. Every file dg reads from a checkpoint goes through here:
//!
//! - it must be a regular file, checked on the link's target *before* it is opened (opening a
//!   FIFO for reading blocks until a writer comes), and again on the opened handle;
//! - text files are read through `take(cap + 1)`, so even a file swapped for a bigger one
//!   between the check and the read cannot exceed its cap.
//!
//! The caps are generous: several times the largest real file of each kind.

#![warn(missing_docs)]

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Cap on JSON configuration files: `config.json`, `generation_config.json`,
/// `tokenizer_config.json`, `model.safetensors.index.json`, adapter configs. The real ones are
/// 1 KB to 2 MB (an index with a line per tensor of the 26B model is about 300 KB).
pub const CONFIG_MAX_BYTES: u64 = 16 << 20;

/// Cap on `tokenizer.json`. Gemma's (262144 pieces and merges) is about 33 MB.
pub const TOKENIZER_MAX_BYTES: u64 = 128 << 20;

/// A checkpoint file that cannot be read, or should not be.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The file is missing or unreadable.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The path (or the target of the link it is) is not a regular file.
    #[error("{path}: {kind}, not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead: "a directory", "a FIFO", "a character device", ...
        kind: &'static str,
    },
    /// The file is larger than its cap.
    #[error("{path}: larger than the {max}-byte cap for this file")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap, in bytes.
        max: u64,
    },
    /// A text file is not UTF-8.
    #[error("{path}: not UTF-8 text")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
    },
}

impl FileError {
    /// The file at fault.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Io { path, .. }
            | FileError::NotRegular { path, .. }
            | FileError::TooLarge { path, .. }
            | FileError::NotUtf8 { path } => path,
        }
    }

    /// Whether the file does not exist (optional files are skipped then).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

fn kind_of(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// Checks, without opening it, that `path` (the target, when it is a link) is a regular file;
/// returns its size.
pub fn check_regular(path: &Path) -> Result<u64, FileError> {
    let meta = std::fs::metadata(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    match meta.is_file() {
        true => Ok(meta.len()),
        false => Err(FileError::NotRegular {
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        }),
    }
}

/// Opens `path` for reading after checking that it (the target, when it is a link) is a regular
/// file; returns the handle and the file's size.
pub fn open_regular(path: &Path) -> Result<(File, u64), FileError> {
    let io = |source| FileError::Io {
        path: path.to_owned(),
        source,
    };
    let regular = |meta: std::fs::Metadata| {
        if meta.is_file() {
            Ok(meta.len())
        } else {
            Err(FileError::NotRegular {
                path: path.to_owned(),
                kind: kind_of(meta.file_type()),
            })
        }
    };
    // Checked before opening: opening a FIFO blocks until another process writes to it.
    check_regular(path)?;
    let file = File::open(path).map_err(io)?;
    // And on the handle: the path may have been replaced in between.
    let len = regular(file.metadata().map_err(io)?)?;
    Ok((file, len))
}

/// Reads a regular file of at most `max` bytes.
pub fn read_bytes(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let too_large = || FileError::TooLarge {
        path: path.to_owned(),
        max,
    };
    let (file, len) = open_regular(path)?;
    if len > max {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // `take`: the file may grow after the size check; never read past the cap.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| FileError::Io {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Reads a regular UTF-8 text file of at most `max` bytes.
pub fn read_text(path: &Path, max: u64) -> Result<String, FileError> {
    String::from_utf8(read_bytes(path, max)?).map_err(|_| FileError::NotUtf8 {
        path: path.to_owned(),
    })
}

/// [`read_text`] for an optional file: `Ok(None)` when there is none.
pub fn read_text_if_present(path: &Path, max: u64) -> Result<Option<String>, FileError> {
    match read_text(path, max) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A FIFO at `dir/name`, or `None` (with a message) where `mkfifo` is missing.
    fn fifo(dir: &Path, name: &str) -> Option<PathBuf> {
        let path = dir.join(name);
        match std::process::Command::new("mkfifo").arg(&path).status() {
            Ok(s) if s.success() => Some(path),
            _ => {
                eprintln!("mkfifo unavailable: FIFO case skipped");
                None
            }
        }
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let Some(path) = fifo(tmp.path(), "config.json") else {
            return;
        };
        let start = Instant::now();
        let e = read_text(&path, CONFIG_MAX_BYTES).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(e, FileError::NotRegular { kind: "a FIFO", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("config.json"), "{e}");
        let e = open_regular(&path).unwrap_err();
        assert!(e.to_string().contains("a FIFO, not a regular file"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_to_dev_zero_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tokenizer.json");
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let e = read_text(&path, TOKENIZER_MAX_BYTES).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}: a character device, not a regular file", path.display())
        );
    }

    #[test]
    fn a_file_over_its_cap_is_refused_before_reading() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config.json");
        // Sparse: the cap is checked against the size, nothing is read.
        File::create(&path)
            .unwrap()
            .set_len(CONFIG_MAX_BYTES + 1)
            .unwrap();
        let e = read_text(&path, CONFIG_MAX_BYTES).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: larger than the 16777216-byte cap for this file",
                path.display()
            )
        );
        std::fs::write(&path, "12345").unwrap();
        assert!(matches!(
            read_text(&path, 4),
            Err(FileError::TooLarge { max: 4, .. })
        ));
        assert_eq!(read_text(&path, 5).unwrap(), "12345");
    }

    #[test]
    fn missing_optional_files_are_none_and_others_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("generation_config.json");
        assert!(read_text_if_present(&missing, 10).unwrap().is_none());
        let e = read_text_if_present(tmp.path(), 10).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::NotRegular {
                    kind: "a directory",
                    ..
                }
            ),
            "{e}"
        );
        std::fs::write(&missing, [0xff, 0xfe]).unwrap();
        let e = read_text(&missing, 10).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("generation_config.json: not UTF-8 text"),
            "{e}"
        );
    }
}
