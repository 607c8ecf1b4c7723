//! What the timing examples share with each other and with their reference scripts
//! (tools/reference/bench_*step.py): the options, the loading and the token ids timed.

use std::path::PathBuf;

use anyhow::Result;
use dg_engine::DiffusionGemma;

// The checkpoint and the prompt length timed (a plain comment: a doc comment here would
// become the examples' `--help` text).
#[derive(clap::Args)]
pub struct TimingArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    #[arg(long)]
    pub threads: Option<usize>,
}

impl TimingArgs {
    /// Loads `--model` with `--threads` workers.
    pub fn load(&self) -> Result<DiffusionGemma> {
        let mut builder = DiffusionGemma::builder(&self.model);
        if let Some(t) = self.threads {
            builder = builder.threads(t);
        }
        Ok(builder.load()?)
    }

    /// The prompt the reference side times too: `--prompt-len` ids `(i * 7 + 3) % vocab`.
    pub fn prompt_ids(&self, vocab: u32) -> Vec<u32> {
        (0..self.prompt_len as u32)
            .map(|i| (i * 7 + 3) % vocab)
            .collect()
    }
}

/// The canvas the reference side times too: `len` ids `(i * 37 + 11) % vocab`.
pub fn canvas_ids(len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + 11) % vocab).collect()
}
