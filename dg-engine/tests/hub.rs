//! `DiffusionGemma::from_hub` against a mock of the Hugging Face Hub's file API on loopback
//! (feature `hub`): the committed fixtures served as repos, with the headers hf-hub reads
//! (`x-repo-commit`, `etag` / `x-linked-etag`, `Content-Range`), ranges, and weights behind a
//! redirect to a "CDN" path as the real hub serves LFS files.
#![cfg(feature = "hub")]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dg_engine::{DiffusionGemma, EngineError, Request};
use dg_testkit::model_dir as fixture;

/// A fresh directory, removed when dropped (one per test: the tests run in parallel).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "dg-hub-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct MockRepo {
    sha: String,
    files: BTreeMap<String, Vec<u8>>,
    /// Listed in the repo but answered 404.
    unserved: HashSet<String>,
}

#[derive(Clone, Debug)]
struct Logged {
    path: String,
    range: Option<String>,
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, MockRepo>,
    log: Vec<Logged>,
    /// Files whose first real transfer is cut after half of it.
    cut_once: HashSet<String>,
}

/// The hub on 127.0.0.1:<any port>; every connection is one request (`Connection: close`).
struct MockHub {
    url: String,
    state: Arc<Mutex<State>>,
}

impl MockHub {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let (st, base) = (state.clone(), url.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (st, base) = (st.clone(), base.clone());
                std::thread::spawn(move || {
                    let _ = handle(stream, &st, &base);
                });
            }
        });
        MockHub { url, state }
    }

    /// Serves the fixture directory `dir` as repo `id` (files under subdirectories too).
    fn add_fixture(&self, id: &str, dir: &Path) {
        let mut files = BTreeMap::new();
        add_dir(dir, dir, &mut files);
        self.add(id, files);
    }

    fn add(&self, id: &str, files: BTreeMap<String, Vec<u8>>) {
        let sha = format!("{:040x}", fnv(id.as_bytes()) as u128 * 0x1_0000_0001);
        self.state.lock().unwrap().repos.insert(
            id.to_string(),
            MockRepo {
                sha,
                files,
                unserved: HashSet::new(),
            },
        );
    }

    fn sha(&self, id: &str) -> String {
        self.state.lock().unwrap().repos[id].sha.clone()
    }

    fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// Requests that transfer file content (not the 1-byte `bytes=0-0` probes).
    fn transfers(&self) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|l| !l.path.starts_with("/api/") && l.range.as_deref() != Some("bytes=0-0"))
            .filter(|l| !l.path.contains("/resolve/") || !l.path.ends_with(".safetensors"))
            .collect()
    }
}

fn add_dir(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            add_dir(root, &path, files);
        } else {
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            files.insert(name, std::fs::read(&path).unwrap());
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn etag(bytes: &[u8]) -> String {
    format!("{:016x}{:016x}", fnv(bytes), fnv(&[bytes, b"x"].concat()))
}

fn handle(stream: TcpStream, state: &Mutex<State>, base: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.trim().eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let mut out = stream;
    let mut st = state.lock().unwrap();
    st.log.push(Logged {
        path: path.clone(),
        range: range.clone(),
    });
    let path = path.split('?').next().unwrap_or("").to_string();
    let not_found = |out: &mut TcpStream, what: &str| {
        let body = format!("{{\"error\":\"{what}\"}}");
        write!(
            out,
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    if method != "GET" {
        return write!(
            out,
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
    // GET /api/models/{org}/{name}/revision/{rev}
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((id, rev)) = rest.split_once("/revision/") else {
            return not_found(&mut out, "Not found");
        };
        let Some(repo) = st.repos.get(id) else {
            return not_found(&mut out, "Repository not found");
        };
        if rev != "main" && rev != repo.sha {
            return not_found(&mut out, "Invalid rev id");
        }
        let siblings: Vec<_> = repo
            .files
            .keys()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        let body =
            serde_json::json!({ "id": id, "sha": repo.sha, "siblings": siblings }).to_string();
        return write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
    }
    // GET /cdn/{org}/{name}/{file}: the weights' "CDN", reached by a redirect.
    let (cdn, rest) = match path.strip_prefix("/cdn/") {
        Some(rest) => (true, rest.to_string()),
        None => (false, path.trim_start_matches('/').to_string()),
    };
    let segments: Vec<&str> = rest.splitn(if cdn { 3 } else { 5 }, '/').collect();
    let (id, file) = match (cdn, segments.as_slice()) {
        (true, [org, name, file]) => (format!("{org}/{name}"), file.to_string()),
        (false, [org, name, "resolve", _rev, file]) => (format!("{org}/{name}"), file.to_string()),
        _ => return not_found(&mut out, "Not found"),
    };
    let Some(repo) = st.repos.get(&id) else {
        return not_found(&mut out, "Repository not found");
    };
    let Some(bytes) = repo
        .files
        .get(&file)
        .filter(|_| !repo.unserved.contains(&file))
    else {
        return not_found(&mut out, "Entry not found");
    };
    let bytes = bytes.clone();
    let (sha, tag) = (repo.sha.clone(), etag(&bytes));
    if !cdn && file.ends_with(".safetensors") {
        // As the hub answers for LFS files: a redirect carrying the commit and the blob's etag.
        return write!(
            out,
            "HTTP/1.1 302 Found\r\nLocation: {base}/cdn/{id}/{file}\r\nx-repo-commit: {sha}\r\n\
             x-linked-etag: \"{tag}\"\r\nx-linked-size: {}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n",
            bytes.len()
        );
    }
    let size = bytes.len();
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = if b.is_empty() {
                size - 1
            } else {
                b.parse().unwrap()
            };
            (a, b.min(size - 1))
        }
        None => (0, size - 1),
    };
    let cut = start == 0 && end > 0 && st.cut_once.remove(&file);
    drop(st);
    let status = match range {
        Some(_) => format!("206 Partial Content\r\nContent-Range: bytes {start}-{end}/{size}"),
        None => "200 OK".to_string(),
    };
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nx-repo-commit: {sha}\r\netag: \"{tag}\"\r\n\
         Connection: close\r\n\r\n",
        end + 1 - start
    )?;
    let body = &bytes[start..=end];
    if cut {
        // Half of it, then the connection drops.
        out.write_all(&body[..body.len() / 2])?;
        out.flush()?;
        return out.shutdown(std::net::Shutdown::Both);
    }
    out.write_all(body)
}

fn request() -> Request {
    Request::text("The sea is").max_tokens(24).seed(7)
}

/// The error's message, which must name the repo.
fn error_of(result: dg_engine::error::Result<PathBuf>) -> String {
    let err = result.expect_err("the download must fail");
    assert!(matches!(err, EngineError::Download { .. }), "{err:?}");
    eprintln!("{err}");
    err.to_string()
}

#[test]
fn download_then_load_generates_as_the_fixture() {
    let hub = MockHub::start();
    hub.add_fixture("test-org/tiny", &fixture("tiny"));
    let cache = TempDir::new();
    let mut progress: Vec<(String, u64, u64)> = Vec::new();
    let model = DiffusionGemma::builder_from_hub("test-org/tiny")
        .endpoint(&hub.url)
        .cache_dir(&cache.0)
        .download_progress(|file, done, total| progress.push((file.to_string(), done, total)))
        .load()
        .unwrap();

    // The Hugging Face cache layout: refs/main -> commit, snapshots/<commit>/<file> -> blob.
    let sha = hub.sha("test-org/tiny");
    let repo_dir = cache.0.join("models--test-org--tiny");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        sha
    );
    assert!(!repo_dir.join("refs").join(&sha).exists());
    let snapshot = repo_dir.join("snapshots").join(&sha);
    for entry in std::fs::read_dir(fixture("tiny")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let cached = snapshot.join(&name);
        assert_eq!(
            std::fs::read(&cached).unwrap(),
            std::fs::read(entry.path()).unwrap(),
            "{name:?}"
        );
        assert!(cached.symlink_metadata().unwrap().file_type().is_symlink() || cfg!(windows));
    }
    assert!(std::fs::read_dir(repo_dir.join("blobs")).unwrap().count() >= 9);

    // Same tokens as the fixture loaded directly.
    let direct = DiffusionGemma::load(fixture("tiny")).unwrap();
    let want = direct.generate(&request()).unwrap();
    let got = model.generate(&request()).unwrap();
    assert!(!want.token_ids.is_empty());
    assert_eq!(got.token_ids, want.token_ids);
    assert_eq!(got.text, want.text);

    // Progress: each file from 0 to its size, done never decreasing.
    let weights = std::fs::metadata(fixture("tiny/model.safetensors"))
        .unwrap()
        .len();
    let files: HashSet<&str> = progress.iter().map(|(f, _, _)| f.as_str()).collect();
    for f in [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "model.safetensors.index.json",
    ] {
        assert!(files.contains(f), "{f} not reported: {files:?}");
    }
    let last = progress
        .iter()
        .rev()
        .find(|(f, _, _)| f == "model.safetensors")
        .unwrap();
    assert_eq!((last.1, last.2), (weights, weights));
    assert!(progress.iter().all(|(_, done, total)| done <= total));
    assert!(
        progress
            .iter()
            .filter(|(f, _, _)| f == "model.safetensors")
            .count()
            > 2
    );
}

#[test]
fn a_second_call_reuses_the_cache() {
    let hub = MockHub::start();
    hub.add_fixture("test-org/tiny", &fixture("tiny"));
    let cache = TempDir::new();
    let first = DiffusionGemma::builder_from_hub("test-org/tiny")
        .endpoint(&hub.url)
        .cache_dir(&cache.0)
        .download()
        .unwrap();
    assert_eq!(hub.transfers().len(), 9, "{:#?}", hub.transfers());
    hub.clear_log();

    let mut reported = 0;
    let model = DiffusionGemma::builder_from_hub("test-org/tiny")
        .endpoint(&hub.url)
        .cache_dir(&cache.0)
        .download_progress(|_, _, _| reported += 1)
        .load()
        .unwrap();
    // One request: the file list (for the current commit); no file is fetched again.
    let log = hub.log();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert!(log[0]
        .path
        .starts_with("/api/models/test-org/tiny/revision/main"));
    assert_eq!(reported, 0);
    assert!(!model.generate(&request()).unwrap().token_ids.is_empty());

    // With the hub out of reach the cached snapshot is used as it is.
    let offline = DiffusionGemma::builder_from_hub("test-org/tiny")
        .endpoint("http://127.0.0.1:1")
        .cache_dir(&cache.0)
        .download()
        .unwrap();
    assert_eq!(offline, first);
    // But not a revision the cache does not hold.
    let err = error_of(
        DiffusionGemma::builder_from_hub("test-org/tiny")
            .endpoint("http://127.0.0.1:1")
            .cache_dir(&cache.0)
            .revision("v2")
            .download(),
    );
    assert!(
        err.contains("cannot reach") && err.contains("\"v2\""),
        "{err}"
    );
}

#[test]
fn an_interrupted_shard_resumes_with_a_range_request() {
    let hub = MockHub::start();
    hub.add_fixture("test-org/tiny-sharded", &fixture("tiny-sharded"));
    let shard = "model-00002-of-00003.safetensors";
    let shard_bytes = std::fs::read(fixture("tiny-sharded").join(shard)).unwrap();
    hub.state.lock().unwrap().cut_once.insert(shard.to_string());
    let cache = TempDir::new();
    let builder = || {
        DiffusionGemma::builder_from_hub("test-org/tiny-sharded")
            .endpoint(&hub.url)
            .cache_dir(&cache.0)
            .retries(0)
    };

    // The transfer breaks halfway: a clear error, the partial file kept.
    let err = error_of(builder().download());
    assert!(
        err.contains("test-org/tiny-sharded") && err.contains(shard) && err.contains("resume"),
        "{err}"
    );
    let blobs = cache.0.join("models--test-org--tiny-sharded/blobs");
    let part = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "part"))
        .expect("a .part file");
    let half = shard_bytes.len() / 2;
    assert_eq!(std::fs::metadata(&part).unwrap().len(), half as u64);

    // The second run asks for the rest only, and the checkpoint is whole.
    hub.clear_log();
    let mut progress = Vec::new();
    let dir = builder()
        .download_progress(|f, done, total| progress.push((f.to_string(), done, total)))
        .download()
        .unwrap();
    let shard_gets: Vec<_> = hub
        .transfers()
        .into_iter()
        .filter(|l| l.path.ends_with(shard))
        .collect();
    assert_eq!(shard_gets.len(), 1, "{shard_gets:#?}");
    assert_eq!(
        shard_gets[0].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    // The already-finished shard 1 is not fetched again.
    assert!(!hub
        .transfers()
        .iter()
        .any(|l| l.path.ends_with("model-00001-of-00003.safetensors")));
    assert_eq!(std::fs::read(dir.join(shard)).unwrap(), shard_bytes);
    assert!(!part.exists());
    // Progress of the resumed file starts where the partial file ended.
    let resumed: Vec<_> = progress.iter().filter(|(f, _, _)| f == shard).collect();
    assert!(
        resumed.iter().any(|(_, done, _)| *done == half as u64),
        "{resumed:?}"
    );
    assert_eq!(resumed.last().unwrap().1, shard_bytes.len() as u64);

    let direct = DiffusionGemma::load(fixture("tiny-sharded")).unwrap();
    let model = DiffusionGemma::load(&dir).unwrap();
    assert_eq!(
        model.generate(&request()).unwrap().token_ids,
        direct.generate(&request()).unwrap().token_ids
    );
}

#[test]
fn a_broken_transfer_resumes_within_one_call_by_default() {
    let hub = MockHub::start();
    hub.add_fixture("test-org/tiny-sharded", &fixture("tiny-sharded"));
    let shard = "model-00003-of-00003.safetensors";
    hub.state.lock().unwrap().cut_once.insert(shard.to_string());
    let cache = TempDir::new();
    let dir = DiffusionGemma::builder_from_hub("test-org/tiny-sharded")
        .endpoint(&hub.url)
        .cache_dir(&cache.0)
        .download()
        .unwrap();
    assert_eq!(
        std::fs::read(dir.join(shard)).unwrap(),
        std::fs::read(fixture("tiny-sharded").join(shard)).unwrap()
    );
    let ranges: Vec<_> = hub
        .transfers()
        .into_iter()
        .filter(|l| l.path.ends_with(shard))
        .map(|l| l.range)
        .collect();
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_ne!(ranges[1].as_deref(), Some("bytes=0-"));
}

#[test]
fn the_vision_sidecar_is_fetched() {
    let hub = MockHub::start();
    hub.add_fixture(
        "test-org/tiny-vision-sidecar",
        &fixture("tiny-vision-sidecar"),
    );
    let cache = TempDir::new();
    let dir = DiffusionGemma::builder_from_hub("test-org/tiny-vision-sidecar")
        .endpoint(&hub.url)
        .cache_dir(&cache.0)
        .download()
        .unwrap();
    assert!(dir.join("optiq/optiq_vision.safetensors").is_file());
    DiffusionGemma::load(&dir).unwrap();
}

#[test]
fn errors_name_the_repo_and_what_is_wrong() {
    let hub = MockHub::start();
    let cache = TempDir::new();
    let download = |id: &str| {
        DiffusionGemma::builder_from_hub(id)
            .endpoint(&hub.url)
            .cache_dir(&cache.0)
            .retries(0)
            .download()
    };

    // An unknown repo.
    let err = error_of(download("nobody/nothing"));
    assert!(
        err.starts_with("nobody/nothing: ")
            && err.contains("no such model repo")
            && err.contains("404"),
        "{err}"
    );

    // Another model: refused on its config.json, before any weight is fetched.
    let mut files = BTreeMap::new();
    files.insert("config.json".into(), br#"{"model_type": "llama"}"#.to_vec());
    files.insert("model.safetensors".into(), vec![0; 64]);
    hub.add("meta/llama", files);
    let err = error_of(download("meta/llama"));
    assert!(
        err.contains("model_type is \"llama\"") && err.contains("diffusion_gemma"),
        "{err}"
    );
    assert!(!hub
        .log()
        .iter()
        .any(|l| l.path.contains("model.safetensors")));

    // A shard the index names but the repo lacks.
    let mut files = BTreeMap::new();
    add_dir(
        &fixture("tiny-sharded"),
        &fixture("tiny-sharded"),
        &mut files,
    );
    files.remove("model-00003-of-00003.safetensors");
    hub.add("test-org/incomplete", files);
    let err = error_of(download("test-org/incomplete"));
    assert!(
        err.contains("model-00003-of-00003.safetensors") && err.contains("does not have"),
        "{err}"
    );

    // A shard listed but not served.
    hub.add_fixture("test-org/gone", &fixture("tiny-sharded"));
    hub.state
        .lock()
        .unwrap()
        .repos
        .get_mut("test-org/gone")
        .unwrap()
        .unserved
        .insert("model-00001-of-00003.safetensors".into());
    let err = error_of(download("test-org/gone"));
    assert!(
        err.contains("model-00001-of-00003.safetensors: not found"),
        "{err}"
    );

    // No weights at all.
    let mut files = BTreeMap::new();
    add_dir(&fixture("tiny"), &fixture("tiny"), &mut files);
    files.retain(|f, _| !f.contains("safetensors"));
    hub.add("test-org/no-weights", files);
    let err = error_of(download("test-org/no-weights"));
    assert!(err.contains("no weights"), "{err}");

    // Not a repo id at all.
    let err = DiffusionGemma::builder_from_hub("../etc")
        .cache_dir(&cache.0)
        .download()
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidArgument {
                name: "repo_id",
                ..
            }
        ),
        "{err}"
    );
}
