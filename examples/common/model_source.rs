//! `--model`: a checkpoint directory, or a Hugging Face repo id (`org/name`, not an existing
//! path) downloaded into the Hugging Face cache first (dg-engine's `hub` feature; HF_HOME,
//! HF_HUB_CACHE, HF_ENDPOINT and HF_TOKEN are honoured), with a progress bar on stderr.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether `--model` names a hub repo rather than a path: `org/name`, and no such path exists.
pub fn is_hub_model(model: &Path) -> bool {
    let text = model.to_string_lossy();
    !model.exists() && text.contains('/') && dg_engine::hub::is_repo_id(&text)
}

/// The checkpoint directory for `--model`: as given, or the cache snapshot of the hub repo it
/// names (downloaded or completed now; files already in the cache are reused).
pub fn checkpoint_dir(model: &Path, show_progress: bool) -> Result<PathBuf> {
    if !is_hub_model(model) {
        return Ok(model.to_owned());
    }
    let id = model.to_string_lossy().into_owned();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .context("progress style")?
        .progress_chars("=> "),
    );
    if !show_progress {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let mut current = String::new();
    let dir = dg_engine::DiffusionGemma::builder_from_hub(&id)
        .download_progress(|file, done, total| {
            if file != current {
                current = file.to_string();
                bar.reset();
                bar.set_message(current.clone());
                bar.set_length(total);
            }
            bar.set_position(done);
        })
        .download()
        .with_context(|| format!("getting {id} from the Hugging Face Hub"))?;
    bar.finish_and_clear();
    Ok(dir)
}
