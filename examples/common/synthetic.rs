//! The checkpoint of a run without `--model`.

use anyhow::Result;
use dg_core::synthetic::{write_checkpoint, SyntheticSpec};

/// A small random-weight checkpoint (its output is noise) in a fresh temporary directory,
/// deleted when the returned guard drops.
pub fn random_checkpoint() -> Result<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    write_checkpoint(tmp.path(), &SyntheticSpec::default())?;
    Ok(tmp)
}
