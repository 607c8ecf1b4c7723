//! Getting a checkpoint from the Hugging Face Hub (feature `hub`).
//!
//! [`DiffusionGemma::from_hub`] downloads a repo's checkpoint files into the standard Hugging
//! Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`; the
//! `models--org--name/{blobs,snapshots/<commit>,refs}` layout that the Python tools read and
//! write, so a model downloaded by either is reused by the other), then loads it as
//! [`DiffusionGemma::load`] does.
//!
//! - Files already in the cache's snapshot of the repo's current commit are not downloaded
//!   again (one request lists the repo's files).
//! - An interrupted download leaves a `.part` file beside the blobs; the next run asks for the
//!   rest of it (an HTTP `Range` request) instead of starting over.
//! - Without a network (or with `HF_HUB_OFFLINE=1`), a complete cached snapshot of the
//!   revision is used as it is.
//! - The endpoint is `HF_ENDPOINT` (default `https://huggingface.co`) or
//!   [`HubBuilder::endpoint`]; the token is [`HubBuilder::token`], else `HF_TOKEN`, else the
//!   token file `hf auth login` writes.
//!
//! ```no_run
//! use dg_engine::DiffusionGemma;
//!
//! let model = DiffusionGemma::builder_from_hub("mlx-community/diffusiongemma-26B-A4B-it-OptiQ-4bit")
//!     .download_progress(|file, done, total| eprint!("\r{file}: {done}/{total} bytes"))
//!     .load()?;
//! # Ok::<(), dg_engine::EngineError>(())
//! ```

use std::collections::{BTreeSet, HashSet};
use std::path::{Component, Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::api::{Progress, RepoInfo};
use hf_hub::{Cache, Repo, RepoType};

use crate::engine::{DiffusionGemma, LoadBuilder};
use crate::error::{EngineError, Result};

/// The hub used when neither [`HubBuilder::endpoint`] nor `HF_ENDPOINT` says otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Download progress: the file (its path in the repo), bytes done and its total size.
pub type DownloadProgressFn<'a> = Box<dyn FnMut(&str, u64, u64) + 'a>;

/// The small files a checkpoint may have besides its weights; each is fetched when the repo
/// has it.
const SMALL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "processor_config.json",
    "optiq_metadata.json",
];

/// The vision tower's OptiQ sidecar, at either place the loader looks.
const SIDECARS: &[&str] = &["optiq/optiq_vision.safetensors", "optiq_vision.safetensors"];

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// Options for [`DiffusionGemma::builder_from_hub`]: where to download from and to, then the
/// options of [`LoadBuilder`].
pub struct HubBuilder<'a> {
    repo_id: String,
    revision: String,
    cache_dir: Option<PathBuf>,
    endpoint: Option<String>,
    token: Option<String>,
    retries: usize,
    download_progress: Option<DownloadProgressFn<'a>>,
    load: LoadBuilder<'a>,
}

impl DiffusionGemma {
    /// Downloads the checkpoint of the Hugging Face repo `repo_id` (`org/name`) into the
    /// Hugging Face cache, or reuses it there, and loads it. See [`crate::hub`].
    pub fn from_hub(repo_id: &str) -> Result<Self> {
        Self::builder_from_hub(repo_id).load()
    }

    /// Download and load options for the Hugging Face repo `repo_id` (`org/name`).
    pub fn builder_from_hub<'a>(repo_id: &str) -> HubBuilder<'a> {
        HubBuilder {
            repo_id: repo_id.to_string(),
            revision: "main".to_string(),
            cache_dir: None,
            endpoint: None,
            token: None,
            retries: 3,
            download_progress: None,
            load: DiffusionGemma::builder(PathBuf::new()),
        }
    }
}

impl<'a> HubBuilder<'a> {
    /// A branch, tag or commit of the repo (default `main`).
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = revision.into();
        self
    }

    /// The hub cache directory, the one that holds `models--org--name` (default
    /// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// The hub's address (default `$HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`]); a mirror or a
    /// local test server.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// An access token for private or gated repos (default `$HF_TOKEN`, else the token file
    /// beside the cache that `hf auth login` writes).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How many times a broken transfer is resumed within one call (default 3); when they are
    /// spent the call fails and the partial file stays in the cache for the next call.
    pub fn retries(mut self, retries: usize) -> Self {
        self.retries = retries;
        self
    }

    /// Called as each file downloads, with the file's path in the repo, bytes done and its
    /// size. Files already in the cache are not reported.
    pub fn download_progress(mut self, f: impl FnMut(&str, u64, u64) + 'a) -> Self {
        self.download_progress = Some(Box::new(f));
        self
    }

    /// See [`LoadBuilder::threads`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.load = self.load.threads(threads);
        self
    }

    /// See [`LoadBuilder::max_context`].
    pub fn max_context(mut self, tokens: usize) -> Self {
        self.load = self.load.max_context(tokens);
        self
    }

    /// Load progress (layers done and total), see [`LoadBuilder::progress`].
    pub fn progress(mut self, f: impl FnMut(usize, usize) -> bool + 'a) -> Self {
        self.load = self.load.progress(f);
        self
    }

    /// Downloads what is not in the cache yet and loads the checkpoint.
    pub fn load(mut self) -> Result<DiffusionGemma> {
        let dir = self.fetch()?;
        self.load.set_dir(dir);
        self.load.load()
    }

    /// Downloads what is not in the cache yet; returns the snapshot directory (a checkpoint
    /// directory [`DiffusionGemma::load`] takes).
    pub fn download(mut self) -> Result<PathBuf> {
        self.fetch()
    }

    fn fetch(&mut self) -> Result<PathBuf> {
        let id = self.repo_id.clone();
        if !is_repo_id(&id) {
            return Err(EngineError::InvalidArgument {
                name: "repo_id",
                reason: format!("{id:?} is not a Hugging Face repo id (`org/name`)"),
            });
        }
        let fail = |reason: String| EngineError::Download {
            repo: id.clone(),
            reason,
        };
        let cache_dir = match &self.cache_dir {
            Some(dir) => dir.clone(),
            None => default_cache_dir().ok_or_else(|| {
                fail("no cache directory: set HF_HOME or HF_HUB_CACHE (no home directory)".into())
            })?,
        };
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let cache = Cache::new(cache_dir.clone());
        let token = self
            .token
            .clone()
            .or_else(|| std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()))
            .or_else(|| cache.token());
        let repo_dir = cache_dir.join(Repo::model(id.clone()).folder_name());

        if env_flag("HF_HUB_OFFLINE") {
            return cached_snapshot(&repo_dir, &self.revision).ok_or_else(|| {
                fail(format!(
                    "HF_HUB_OFFLINE is set and {} holds no complete snapshot of revision {:?}",
                    cache_dir.display(),
                    self.revision
                ))
            });
        }

        let api = ApiBuilder::from_cache(cache)
            .with_endpoint(endpoint.clone())
            .with_token(token)
            .with_progress(false)
            .with_retries(self.retries)
            .with_user_agent("dg-engine", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| fail(format!("starting the HTTP client: {e}")))?;

        // The file list and the commit the revision points at.
        let listing = Repo::with_revision(id.clone(), RepoType::Model, self.revision.clone());
        let info: RepoInfo = match api.repo(listing).info_request().call() {
            Ok(response) => response
                .into_json()
                .map_err(|e| fail(format!("{endpoint}: unreadable file list: {e}")))?,
            Err(ureq::Error::Status(code, _)) => {
                let rev = &self.revision;
                return Err(fail(match code {
                    404 => {
                        format!("no such model repo (or no revision {rev:?}) on {endpoint} (404)")
                    }
                    401 | 403 => format!(
                        "no such model repo (or no revision {rev:?}) on {endpoint}, or it is \
                         private or gated: it needs an access token (HF_TOKEN or `hf auth \
                         login`) of an account with access ({code})"
                    ),
                    _ => format!("listing its files: {endpoint} answered {code}"),
                }));
            }
            Err(e) => {
                // No network: a complete snapshot already in the cache will do.
                return cached_snapshot(&repo_dir, &self.revision).ok_or_else(|| {
                    fail(format!(
                        "cannot reach {endpoint} ({e}) and {} holds no complete snapshot of \
                         revision {:?}",
                        cache_dir.display(),
                        self.revision
                    ))
                });
            }
        };
        let commit = info.sha.clone();
        if !is_plain_name(&commit) {
            return Err(fail(format!("{endpoint}: bad commit id {commit:?}")));
        }
        let available: HashSet<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
        let snapshot = repo_dir.join("snapshots").join(&commit);

        // Downloads pin the listed commit, so every file comes from the same one.
        let pinned = api.repo(Repo::with_revision(
            id.clone(),
            RepoType::Model,
            commit.clone(),
        ));
        let mut report = self.download_progress.take();
        let mut get = |file: &str| -> Result<PathBuf> {
            let target = snapshot.join(file);
            if target.is_file() {
                return Ok(target);
            }
            let progress = Reporter {
                f: report.as_deref_mut(),
                file: file.to_string(),
                done: 0,
                total: 0,
            };
            let path = pinned
                .download_with_progress(file, progress)
                .map_err(|e| fail(download_error(file, e)))?;
            if path != target || !target.is_file() {
                return Err(fail(format!(
                    "{file}: the hub served it for another commit than {commit} ({})",
                    path.display()
                )));
            }
            Ok(target)
        };

        if !available.contains("config.json") {
            return Err(fail(format!(
                "no config.json: not a model checkpoint ({})",
                checkpoint_kind()
            )));
        }
        let config = get("config.json")?;
        check_model_type(&config).map_err(fail)?;
        for file in SMALL_FILES.iter().skip(1) {
            if available.contains(file) {
                get(file)?;
            }
        }
        for file in weight_files(&available, &mut get).map_err(|e| match e {
            WeightError::Engine(e) => e,
            WeightError::Reason(r) => fail(r),
        })? {
            get(&file)?;
        }

        // refs/<revision> -> commit, as the Python cache records a branch or tag.
        if self.revision != commit {
            Cache::new(cache_dir.clone())
                .repo(Repo::with_revision(
                    id.clone(),
                    RepoType::Model,
                    self.revision.clone(),
                ))
                .create_ref(&commit)
                .map_err(|e| fail(format!("writing refs/{}: {e}", self.revision)))?;
            // hf-hub also wrote refs/<commit> for the pinned downloads: a ref named after a
            // commit is noise in the cache.
            let _ = std::fs::remove_file(repo_dir.join("refs").join(&commit));
        }
        Ok(snapshot)
    }
}

enum WeightError {
    Engine(EngineError),
    Reason(String),
}

/// The weight files to fetch: every file the index names (after downloading it) plus the
/// vision sidecar, or `model.safetensors` when there is no index.
fn weight_files(
    available: &HashSet<&str>,
    get: &mut impl FnMut(&str) -> Result<PathBuf>,
) -> std::result::Result<Vec<String>, WeightError> {
    let mut files = BTreeSet::new();
    if available.contains(INDEX) {
        let index = get(INDEX).map_err(WeightError::Engine)?;
        for file in index_files(&index).map_err(WeightError::Reason)? {
            if !available.contains(file.as_str()) {
                return Err(WeightError::Reason(format!(
                    "{INDEX} names {file}, which the repo does not have (an incomplete upload?)"
                )));
            }
            files.insert(file);
        }
    } else if available.contains(SINGLE) {
        files.insert(SINGLE.to_string());
    } else {
        return Err(WeightError::Reason(format!(
            "no weights: neither {SINGLE} nor {INDEX} is in the repo ({})",
            checkpoint_kind()
        )));
    }
    for sidecar in SIDECARS {
        if available.contains(sidecar) {
            files.insert(sidecar.to_string());
        }
    }
    Ok(files.into_iter().collect())
}

/// The distinct files the index's `weight_map` names; each must be a relative path inside the
/// checkpoint (it becomes a path in the cache).
fn index_files(index: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(index).map_err(|e| format!("{INDEX}: {e}"))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{INDEX}: {e}"))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| format!("{INDEX}: no weight_map object"))?;
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| format!("{INDEX}: weight_map[{tensor}] is not a string"))?;
        if !is_relative_inside(file) {
            return Err(format!(
                "{INDEX}: weight_map[{tensor}] names {file:?}, not a path inside the repo"
            ));
        }
        files.insert(file.to_string());
    }
    Ok(files.into_iter().collect())
}

fn is_relative_inside(file: &str) -> bool {
    !file.is_empty()
        && !file.contains('\\')
        && Path::new(file)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn checkpoint_kind() -> &'static str {
    "dg loads diffusion_gemma checkpoints in MLX safetensors form, like \
     mlx-community/diffusiongemma-26B-A4B-it-OptiQ-4bit"
}

/// A clear refusal, before the weights are downloaded, of a repo of another model.
fn check_model_type(config: &Path) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(config).map_err(|e| format!("config.json: {e}"))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("config.json: {e}"))?;
    match json.get("model_type").and_then(|t| t.as_str()) {
        Some("diffusion_gemma") => Ok(()),
        Some(other) => Err(format!(
            "config.json: model_type is {other:?}, not \"diffusion_gemma\": not a \
             DiffusionGemma checkpoint ({})",
            checkpoint_kind()
        )),
        None => Err(format!(
            "config.json: no model_type: not a DiffusionGemma checkpoint ({})",
            checkpoint_kind()
        )),
    }
}

fn download_error(file: &str, e: ApiError) -> String {
    match e {
        ApiError::RequestError(e) => match *e {
            ureq::Error::Status(404, _) => format!("{file}: not found on the hub (404)"),
            ureq::Error::Status(code @ (401 | 403), _) => format!(
                "{file}: access denied ({code}); a private or gated repo needs an access token \
                 (HF_TOKEN or `hf auth login`)"
            ),
            ureq::Error::Status(code, _) => format!("{file}: the hub answered {code}"),
            other => format!("{file}: {other}"),
        },
        ApiError::MissingHeader(h) => format!(
            "{file}: the server's answer has no {h} header (is the endpoint a Hugging Face hub?)"
        ),
        ApiError::LockAcquisition(p) => format!(
            "{file}: another process is downloading it (lock {})",
            p.display()
        ),
        ApiError::IoError(e) => format!(
            "{file}: the download broke ({e}); run again to resume it (the partial file stays \
             in the cache)"
        ),
        ApiError::TooManyRetries(e) => format!(
            "{file}: the download broke and retrying did not help ({e}); run again to resume \
             it (the partial file stays in the cache)"
        ),
        other => format!("{file}: {other}"),
    }
}

type CallbackRef<'p, 'a> = &'p mut (dyn FnMut(&str, u64, u64) + 'a);

/// Feeds hf-hub's per-file progress to the caller's callback as (file, done, total).
struct Reporter<'p, 'a> {
    f: Option<CallbackRef<'p, 'a>>,
    file: String,
    done: u64,
    total: u64,
}

impl Progress for Reporter<'_, '_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
        if let Some(f) = self.f.as_mut() {
            f(&self.file, 0, self.total);
        }
    }

    fn update(&mut self, size: usize) {
        if size == 0 {
            return;
        }
        self.done += size as u64;
        if let Some(f) = self.f.as_mut() {
            f(&self.file, self.done, self.total);
        }
    }

    fn finish(&mut self) {}
}

/// Whether `text` reads as a Hugging Face repo id: `org/name` (or a bare legacy `name`) of
/// ASCII letters, digits, `-`, `_` and `.`, no part starting with `.`.
pub fn is_repo_id(text: &str) -> bool {
    let parts: Vec<&str> = text.split('/').collect();
    (1..=2).contains(&parts.len()) && parts.iter().all(|p| is_plain_name(p))
}

fn is_plain_name(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && !part.starts_with('.')
        && !part.contains("..")
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The hub cache directory the Python tools use: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("HF_HUB_CACHE") {
        return Some(dir.into());
    }
    if let Some(home) = var("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    if let Some(cache) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(cache).join("huggingface").join("hub"));
    }
    let home = var("HOME").or_else(|| var("USERPROFILE"))?;
    Some(
        PathBuf::from(home)
            .join(".cache")
            .join("huggingface")
            .join("hub"),
    )
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// The cached snapshot of `revision` (a ref or a commit) when it holds a whole checkpoint:
/// config.json and every weight file.
fn cached_snapshot(repo_dir: &Path, revision: &str) -> Option<PathBuf> {
    let commit = match std::fs::read_to_string(repo_dir.join("refs").join(revision)) {
        Ok(commit) => commit.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    if !is_plain_name(&commit) {
        return None;
    }
    let dir = repo_dir.join("snapshots").join(commit);
    if !dir.join("config.json").is_file() {
        return None;
    }
    let index = dir.join(INDEX);
    let complete = if index.is_file() {
        index_files(&index)
            .ok()?
            .iter()
            .all(|f| dir.join(f).is_file())
    } else {
        dir.join(SINGLE).is_file()
    };
    complete.then_some(dir)
}
