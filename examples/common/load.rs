//! Loading a checkpoint with a layer progress bar on stderr (`--threads`, `--adapter`).

use std::path::Path;

use anyhow::{Context, Result};
use dg_engine::DiffusionGemma;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Loads the checkpoint in `dir` with `threads` workers (default: physical cores) and
/// `adapter` mounted; the progress bar is drawn only if `show_progress`.
pub fn load_model(
    dir: &Path,
    threads: Option<usize>,
    adapter: Option<&Path>,
    show_progress: bool,
) -> Result<DiffusionGemma> {
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers")
            .context("progress style")?,
    );
    if !show_progress {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let mut builder = DiffusionGemma::builder(dir).progress(|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        true
    });
    if let Some(threads) = threads {
        builder = builder.threads(threads);
    }
    if let Some(adapter) = adapter {
        builder = builder.adapter(adapter);
    }
    let model = builder
        .load()
        .with_context(|| format!("loading {}", dir.display()))?;
    bar.finish_and_clear();
    Ok(model)
}
