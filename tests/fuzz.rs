//! Fuzz targets on stable Rust (no cargo-fuzz, no nightly): config JSON, the safetensors header
//! path, the chat template, the tokenizer and detokenizers, image decoding and preprocessing.
//!
//! Each target is one test. It mutates real seeds (the committed fixtures under
//! `tests/fixtures/models/` and `tests/fixtures/images/`) and adds random structure (JSON values
//! spliced into fields, message lists, special-token text, out-of-range token ids, damaged image
//! headers), then runs every input through the public API on a worker thread under
//! `catch_unwind`. An input may succeed or return an error; it must not panic, and it must finish
//! within `DG_FUZZ_INPUT_TIMEOUT` seconds (default 10; longer is reported as a hang). Generated
//! sizes are bounded so that no input can exhaust the machine.
//!
//! - `DG_FUZZ_SECONDS`: budget per target (default 2, so `cargo test --workspace` runs each
//!   briefly); `tools/fuzz.sh 600` runs each for ten minutes in release mode.
//! - `DG_FUZZ_SEED`: the run's seed (default fixed); every input has its own seed, derived
//!   from it, the target's name and the input's index, printed on failure.
//! - `DG_FUZZ_REPLAY=<input seed>`: runs only that input of the target and prints it:
//!   `DG_FUZZ_REPLAY=0x... cargo test --release --test fuzz image -- --exact --nocapture`.
//! - `DG_FUZZ_TRACE=1`: prints each input seed before it runs (to find an input that aborts the
//!   process, which `catch_unwind` cannot report).
//!
//! Each target prints `fuzz <name>: N inputs in S s (R/s): ok, errors returned, panics, hangs`
//! and its most frequent errors (shown with `--nocapture`).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dg_testkit::fixtures;
use serde_json::{json, Map, Value};

// ---------------------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------------------

/// SplitMix64. Written out rather than taken from `rand`: the generator is the replay format (an
/// input seed printed today must give the same input after a dependency update), and it keeps
/// the root package free of a new dev-dependency.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn bool(&mut self) -> bool {
        self.u64() & 1 == 1
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// A size in `0..=max`, small sizes more likely.
    fn size(&mut self, max: usize) -> usize {
        let m = self.below(max + 1);
        self.below(m + 1)
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

/// One fuzz target: built once on its worker thread, then asked for inputs and run on them.
trait Target: Sized + 'static {
    type Input: std::fmt::Debug;
    const NAME: &'static str;
    fn setup() -> Self;
    fn generate(&self, rng: &mut Rng) -> Self::Input;
    /// Runs the input through the public API; `Err` is an error the library returned.
    fn run(&mut self, input: &Self::Input) -> Result<(), String>;
}

enum Reply {
    Ready,
    Done(Result<(), String>),
    Panicked(String),
}

fn env_f64(name: &str, default: f64) -> f64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim();
    let parsed = match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a u64 (decimal or 0x hex)")))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// An error message with its numbers blanked and paths cut to file names, to count kinds of
/// errors.
fn error_kind(msg: &str) -> String {
    let msg: Vec<&str> = msg
        .split(' ')
        .map(|w| match w.rfind('/') {
            Some(i) if w.starts_with('/') || w.starts_with("`/") => &w[i + 1..],
            _ => w,
        })
        .collect();
    let mut out = String::new();
    let mut last_digit = false;
    for c in msg.join(" ").chars().take(110) {
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
        } else {
            last_digit = false;
            out.push(c);
        }
    }
    out
}

fn fuzz<T: Target>() {
    let budget = env_f64("DG_FUZZ_SECONDS", 2.0);
    let timeout = Duration::from_secs_f64(env_f64("DG_FUZZ_INPUT_TIMEOUT", 10.0));
    let base = env_u64("DG_FUZZ_SEED").unwrap_or(0xD6_F022_5EED);
    let replay = env_u64("DG_FUZZ_REPLAY");
    let trace = std::env::var_os("DG_FUZZ_TRACE").is_some();
    let name = T::NAME;

    let (job_tx, job_rx) = mpsc::channel::<u64>();
    let (reply_tx, reply_rx) = mpsc::channel::<Reply>();
    // The worker is detached: after a hang it is left running and the test fails.
    std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .spawn(move || {
            let mut target = T::setup();
            if reply_tx.send(Reply::Ready).is_err() {
                return;
            }
            for seed in job_rx {
                if trace {
                    eprintln!("fuzz {name}: input seed {seed:#018x}");
                }
                let out = catch_unwind(AssertUnwindSafe(|| {
                    let input = target.generate(&mut Rng::new(seed));
                    if replay.is_some() {
                        eprintln!("fuzz {name}: input {input:#?}");
                    }
                    target.run(&input)
                }));
                let reply = match out {
                    Ok(r) => Reply::Done(r),
                    Err(p) => Reply::Panicked(panic_message(&*p)),
                };
                if reply_tx.send(reply).is_err() {
                    return;
                }
            }
        })
        .unwrap();
    match reply_rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Reply::Ready) => {}
        _ => panic!("fuzz {name}: the target's setup failed or took over 300 s"),
    }

    let mut seeds = Rng::new(base ^ fnv1a(name));
    let start = Instant::now();
    let (mut inputs, mut ok, mut errors) = (0u64, 0u64, 0u64);
    let mut panics: Vec<String> = Vec::new();
    let mut hang: Option<String> = None;
    let mut kinds: HashMap<String, u64> = HashMap::new();
    loop {
        let (index, seed) = match replay {
            Some(s) if inputs == 0 => (0, s),
            Some(_) => break,
            None if inputs > 0 && start.elapsed().as_secs_f64() >= budget => break,
            None => (inputs, seeds.u64()),
        };
        let t0 = Instant::now();
        job_tx.send(seed).expect("the worker is gone");
        let where_ = format!(
            "input {index} (input seed {seed:#018x}, DG_FUZZ_SEED={base:#x}); replay: \
             DG_FUZZ_REPLAY={seed:#x} cargo test --release --test fuzz {name} -- --exact \
             --nocapture"
        );
        inputs += 1;
        match reply_rx.recv_timeout(timeout) {
            Ok(Reply::Done(Ok(()))) => ok += 1,
            Ok(Reply::Done(Err(e))) => {
                errors += 1;
                *kinds.entry(error_kind(&e)).or_default() += 1;
                if replay.is_some() {
                    eprintln!("fuzz {name}: error returned: {e}");
                }
            }
            Ok(Reply::Panicked(msg)) => {
                eprintln!("fuzz {name}: PANIC at {where_}: {msg}");
                panics.push(format!("{where_}: {msg}"));
                if panics.len() >= 20 {
                    break;
                }
            }
            Ok(Reply::Ready) => unreachable!(),
            Err(_) => {
                let msg = format!(
                    "HANG at {where_}: over {:.0} s (elapsed {:.1} s)",
                    timeout.as_secs_f64(),
                    t0.elapsed().as_secs_f64()
                );
                eprintln!("fuzz {name}: {msg}");
                hang = Some(msg);
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "fuzz {name}: {inputs} inputs in {secs:.1} s ({:.0}/s): {ok} ok, {errors} errors returned, \
         {} panics, {} hangs (DG_FUZZ_SEED={base:#x})",
        inputs as f64 / secs.max(1e-9),
        panics.len(),
        u8::from(hang.is_some()),
    );
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (kind, n) in kinds.iter().take(8) {
        println!("    {n:>8} x {kind}");
    }
    assert!(
        panics.is_empty() && hang.is_none(),
        "fuzz {name}: {} panics, hang: {hang:?}\n{}",
        panics.len(),
        panics.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Fixtures and generators shared by the targets
// ---------------------------------------------------------------------------------------------

/// A writable copy of a fixture checkpoint.
fn checkpoint_copy(root: &Path, model: &str) -> PathBuf {
    let dir = root.join(model);
    dg_testkit::copy_dir(&dg_testkit::model_dir(model), &dir);
    dir
}

fn load_engine(dir: &Path) -> Result<dg_engine::DiffusionGemma, String> {
    dg_engine::DiffusionGemma::builder(dir)
        .threads(1)
        .max_context(4096)
        .load()
        .map_err(|e| e.to_string())
}

const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    15,
    16,
    17,
    31,
    32,
    63,
    64,
    65,
    127,
    128,
    255,
    256,
    511,
    512,
    513,
    1023,
    1024,
    4096,
    65535,
    65536,
    1 << 20,
    (1 << 31) - 1,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    1 << 53,
    (1 << 62) + 1,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

fn interesting_u64(rng: &mut Rng) -> u64 {
    *rng.pick(INTERESTING_U64)
}

fn random_number(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 | 1 => json!(interesting_u64(rng)),
        2 => json!(-(rng.pick(INTERESTING_U64).min(&(i64::MAX as u64)).to_owned() as i64)),
        3 => json!(i64::MIN),
        4 => json!(*rng.pick(&[
            0.0,
            -0.0,
            0.5,
            1.5,
            -1.0,
            1e-6,
            1e-30,
            5e-324,
            1e30,
            1e300,
            -1e300,
            f32::MAX as f64,
            f64::MAX,
            f64::MIN_POSITIVE,
            3.4028236e38,
        ])),
        _ => json!(rng.u64() % 1000),
    }
}

/// Pieces random text is built from: special tokens, template syntax, odd Unicode.
const TEXT_PIECES: &[&str] = &[
    "<eos>",
    "<bos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<|image|>",
    "<|image>",
    "<image|>",
    "<|audio|>",
    "<|video|>",
    "<|turn>",
    "<turn|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|\"|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<0x0A>",
    "<0xFF>",
    "▁",
    "▁▁",
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{{ messages }}",
    "{% endif %}",
    "\\",
    "\"",
    "'",
    "\n",
    "\r\n",
    "\t",
    " ",
    "  ",
    "\u{0}",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{200b}",
    "\u{202e}",
    "\u{feff}",
    "\u{fffd}",
    "\u{10ffff}",
    "a\u{301}",
    "é",
    "ß",
    "中文",
    "日本語",
    "한국어",
    "🤖",
    "👩‍👩‍👧",
    "🏳️‍🌈",
    "Ω",
    "ﬁ",
    "hello",
    "Hello, world!",
    "The",
    "the sky is blue",
    "0",
    "123",
    "-1",
    "3.14",
    "null",
    "true",
    "[]",
    "{}",
    "<",
    ">",
    "|",
    "<|",
    "|>",
    "<<",
    ">>",
];

/// Random text: pieces, runs of one piece, random chars; mostly short, now and then long.
fn random_text(rng: &mut Rng, max_chars: usize) -> String {
    let max = if rng.one_in(20) {
        max_chars
    } else {
        64.min(max_chars)
    };
    let target = rng.size(max);
    let mut s = String::new();
    while s.chars().count() < target {
        match rng.below(10) {
            0..=5 => s.push_str(rng.pick::<&str>(TEXT_PIECES)),
            6 => {
                let piece = *rng.pick(TEXT_PIECES);
                let n = rng.size(64);
                for _ in 0..n {
                    s.push_str(piece);
                }
            }
            7 => s.push(char::from(b' ' + rng.below(95) as u8)),
            8 => s.push(char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('\u{fffd}')),
            _ => {
                for _ in 0..rng.size(12) {
                    s.push(char::from(b'a' + rng.below(26) as u8));
                }
            }
        }
    }
    s
}

fn random_key(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => random_text(rng, 16),
        _ => (*rng.pick(&[
            "type",
            "text",
            "name",
            "content",
            "role",
            "id",
            "function",
            "arguments",
            "url",
            "image",
            "image_url",
            "response",
            "description",
            "parameters",
            "properties",
            "required",
            "items",
            "enum",
            "nullable",
            "value",
            "",
            "__proto__",
        ]))
        .to_string(),
    }
}

/// A random JSON value, at most `depth` levels deep.
fn random_json(rng: &mut Rng, depth: usize) -> Value {
    let kinds = if depth == 0 { 4 } else { 6 };
    match rng.below(kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.bool()),
        2 => random_number(rng),
        3 => Value::String(random_text(rng, 256)),
        4 => Value::Array(
            (0..rng.size(6))
                .map(|_| random_json(rng, depth - 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.size(6))
                .map(|_| (random_key(rng), random_json(rng, depth - 1)))
                .collect(),
        ),
    }
}

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

fn collect_paths(v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(path.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                path.push(Seg::Key(k.clone()));
                collect_paths(child, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                collect_paths(child, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Seg]) -> &'a mut Value {
    path.iter().fold(v, |v, seg| match seg {
        Seg::Key(k) => &mut v[k.as_str()],
        Seg::Index(i) => &mut v[*i],
    })
}

/// Every sub-value and key of the seed documents, to splice elsewhere.
#[derive(Default)]
struct JsonPool {
    values: Vec<Value>,
    keys: Vec<String>,
}

impl JsonPool {
    fn add(&mut self, v: &Value) {
        let mut paths = Vec::new();
        collect_paths(v, &mut Vec::new(), &mut paths);
        let mut v = v.clone();
        for p in &paths {
            if let Some(Seg::Key(k)) = p.last() {
                self.keys.push(k.clone());
            }
            self.values.push(node_mut(&mut v, p).clone());
        }
    }
}

/// One structural mutation of a JSON document at a random node.
fn mutate_json(rng: &mut Rng, doc: &mut Value, pool: &JsonPool) {
    let mut paths = Vec::new();
    collect_paths(doc, &mut Vec::new(), &mut paths);
    // Leaves are more interesting than the root: skip the root unless it is all there is.
    let path = if paths.len() > 1 && !rng.one_in(50) {
        paths[1 + rng.below(paths.len() - 1)].clone()
    } else {
        Vec::new()
    };
    let node = node_mut(doc, &path);
    match rng.below(12) {
        0 | 1 => *node = random_json(rng, 3),
        2 => {
            if !pool.values.is_empty() {
                let v = rng.pick(&pool.values).clone();
                // Bound the size: a whole document spliced into itself grows fast.
                if v.to_string().len() < 64 << 10 {
                    *node = v;
                }
            }
        }
        3 | 4 => {
            *node = match node.clone() {
                Value::Number(n) => {
                    let x = n.as_f64().unwrap_or(0.0);
                    match rng.below(9) {
                        0 => json!(x + 1.0),
                        1 => json!(n.as_i64().map_or(-1, |i| i.saturating_sub(1))),
                        2 => json!(x * 2.0),
                        3 => json!(-x),
                        4 => json!(0),
                        5 => json!(x * 1e6),
                        6 => json!(x / 3.0),
                        7 => json!(n.as_u64().map_or(0, |u| u.saturating_mul(1 << 20))),
                        _ => random_number(rng),
                    }
                }
                Value::String(s) => match rng.below(4) {
                    0 => Value::String(String::new()),
                    1 => Value::String(format!("{s}{}", random_text(rng, 32))),
                    2 => Value::String(s.chars().rev().collect()),
                    _ => Value::String(random_text(rng, 64)),
                },
                Value::Bool(b) => Value::Bool(!b),
                other => other,
            }
        }
        5 => {
            // Delete this node from its parent.
            if let Some((last, parent)) = path.split_last() {
                match (node_mut(doc, parent), last) {
                    (Value::Object(m), Seg::Key(k)) => {
                        m.shift_remove(k);
                    }
                    (Value::Array(a), Seg::Index(i)) => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
        }
        6 | 7 => match node {
            Value::Object(m) => {
                let key = if rng.bool() && !pool.keys.is_empty() {
                    rng.pick(&pool.keys).clone()
                } else {
                    random_key(rng)
                };
                let value = if rng.bool() && !pool.values.is_empty() {
                    rng.pick(&pool.values).clone()
                } else {
                    random_json(rng, 2)
                };
                if value.to_string().len() < 64 << 10 {
                    m.insert(key, value);
                }
            }
            Value::Array(a) => {
                let v = if !a.is_empty() && rng.bool() {
                    a[rng.below(a.len())].clone()
                } else {
                    random_json(rng, 2)
                };
                let at = rng.below(a.len() + 1);
                a.insert(at, v);
            }
            other => *other = random_json(rng, 1),
        },
        8 => {
            *node = match node.take() {
                Value::Number(n) => Value::String(n.to_string()),
                Value::String(s) => s.parse::<f64>().ok().map_or(Value::Null, |f| json!(f)),
                Value::Array(a) => Value::Object(
                    a.into_iter()
                        .enumerate()
                        .map(|(i, v)| (i.to_string(), v))
                        .collect(),
                ),
                Value::Object(m) => Value::Array(m.into_iter().map(|(_, v)| v).collect()),
                other => Value::Array(vec![other]),
            }
        }
        9 => match node {
            Value::Array(a) => match rng.below(3) {
                0 => a.truncate(rng.below(a.len() + 1)),
                1 => a.reverse(),
                _ => {
                    let extra: Vec<Value> = a.iter().take(64).cloned().collect();
                    a.extend(extra);
                }
            },
            other => *other = Value::Array(vec![other.take(); rng.size(4)]),
        },
        10 => {
            if let Value::Object(m) = node {
                if !m.is_empty() {
                    let old = m.keys().nth(rng.below(m.len())).unwrap().clone();
                    let v = m.shift_remove(&old).unwrap();
                    let new = if rng.bool() {
                        format!("{old}{}", random_text(rng, 4))
                    } else {
                        random_key(rng)
                    };
                    m.insert(new, v);
                }
            } else {
                *node = Value::Null;
            }
        }
        _ => *node = Value::Object(Map::new()),
    }
}

const INTERESTING_BYTES: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'[', b']'];

/// Byte-level mutations (bit flips, insertions, deletions, splices), the result at most `max`
/// bytes long.
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], max: usize) {
    for _ in 0..1 + rng.size(7) {
        let len = data.len();
        match rng.below(10) {
            0 if len > 0 => data[rng.below(len)] ^= 1 << rng.below(8),
            1 if len > 0 => data[rng.below(len)] = rng.u64() as u8,
            2 if len > 0 => data[rng.below(len)] = *rng.pick(INTERESTING_BYTES),
            3 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.size(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.u64() as u8).collect();
                data.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = (1 + rng.size(64)).min(len - at);
                data.drain(at..at + n);
            }
            5 if len > 0 => {
                let at = rng.below(len);
                let n = (1 + rng.size(256)).min(len - at);
                let copy = data[at..at + n].to_vec();
                let to = rng.below(len + 1);
                data.splice(to..to, copy);
            }
            6 if len > 0 => data.truncate(rng.below(len)),
            7 if len >= 4 => {
                let at = rng.below(len - 3);
                let v = interesting_u64(rng) as u32;
                let bytes = if rng.bool() {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                data[at..at + 4].copy_from_slice(&bytes);
            }
            8 if !other.is_empty() => {
                let from = rng.below(other.len());
                let n = (1 + rng.size(1024)).min(other.len() - from);
                let at = rng.below(len + 1);
                let end = (at + n).min(len);
                data.splice(at..end, other[from..from + n].iter().copied());
            }
            _ if len > 0 => {
                // Invalid UTF-8 at a random place.
                let at = rng.below(len);
                data[at] = *rng.pick(&[0xc0, 0xc3, 0xe2, 0xf0, 0xf8, 0xfe, 0xff, 0x80]);
            }
            _ => data.push(rng.u64() as u8),
        }
    }
    data.truncate(max);
}

/// Bytes that are mostly text, shown as text (lossily) when an input is printed.
struct Text(Vec<u8>);

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

// ---------------------------------------------------------------------------------------------
// config JSON: config.json, generation_config.json, tokenizer_config.json
// ---------------------------------------------------------------------------------------------

struct ConfigTarget {
    _root: tempfile::TempDir,
    /// (model name, writable copy)
    dirs: Vec<(&'static str, PathBuf)>,
    seeds: Vec<(&'static str, &'static str, Value)>,
    pool: JsonPool,
}

const CONFIG_FILES: &[&str] = &[
    "config.json",
    "config.json",
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
];

struct ConfigInput {
    model: usize,
    file: &'static str,
    text: Vec<u8>,
    load: bool,
    generate: bool,
}

impl std::fmt::Debug for ConfigInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigInput")
            .field("model", &self.model)
            .field("file", &self.file)
            .field("text", &String::from_utf8_lossy(&self.text))
            .field("load", &self.load)
            .field("generate", &self.generate)
            .finish()
    }
}

impl Target for ConfigTarget {
    type Input = ConfigInput;
    const NAME: &'static str = "config_json";

    fn setup() -> Self {
        let root = tempfile::tempdir().unwrap();
        let models = ["tiny", "tiny-vision"];
        let dirs: Vec<_> = models
            .iter()
            .map(|&m| (m, checkpoint_copy(root.path(), m)))
            .collect();
        let mut seeds = Vec::new();
        let mut pool = JsonPool::default();
        for &m in &models {
            for file in [
                "config.json",
                "generation_config.json",
                "tokenizer_config.json",
            ] {
                let text = std::fs::read_to_string(dg_testkit::model_dir(m).join(file)).unwrap();
                let v: Value = serde_json::from_str(&text).unwrap();
                pool.add(&v);
                seeds.push((m, file, v));
            }
        }
        ConfigTarget {
            _root: root,
            dirs,
            seeds,
            pool,
        }
    }

    fn generate(&self, rng: &mut Rng) -> ConfigInput {
        let model = rng.below(self.dirs.len());
        let file = *rng.pick(CONFIG_FILES);
        let seed = self
            .seeds
            .iter()
            .find(|(m, f, _)| *m == self.dirs[model].0 && *f == file)
            .unwrap();
        let mut doc = seed.2.clone();
        for _ in 0..1 + rng.size(6) {
            mutate_json(rng, &mut doc, &self.pool);
        }
        let mut text = if rng.bool() {
            serde_json::to_vec_pretty(&doc).unwrap()
        } else {
            serde_json::to_vec(&doc).unwrap()
        };
        if rng.one_in(8) {
            let other = serde_json::to_vec(&rng.pick(&self.seeds).2).unwrap();
            mutate_bytes(rng, &mut text, &other, 1 << 20);
        }
        ConfigInput {
            model,
            file,
            text,
            load: !rng.one_in(4),
            generate: rng.one_in(3),
        }
    }

    fn run(&mut self, input: &ConfigInput) -> Result<(), String> {
        let (model, dir) = &self.dirs[input.model];
        let path = dir.join(input.file);
        std::fs::write(&path, &input.text).unwrap();
        let result = run_config(dir, &path, input);
        std::fs::copy(dg_testkit::model_dir(model).join(input.file), &path).unwrap();
        result
    }
}

fn run_config(dir: &Path, path: &Path, input: &ConfigInput) -> Result<(), String> {
    if input.file == "config.json" {
        let config = dg_core::ModelConfig::from_file(path).map_err(|e| e.to_string())?;
        // The derived values the loader reads.
        let t = &config.text;
        for lt in t.layer_types() {
            let _ = (t.rope(lt), t.head_dim_of(lt), t.kv_heads_of(lt));
        }
        let _ = config.eos_ids();
        let _ = format!("{config:?}");
    }
    if !input.load {
        return Ok(());
    }
    let engine = load_engine(dir)?;
    if input.generate {
        use dg_engine::{Message, Request};
        let request = Request::chat(vec![Message::user("Hi <eos> there")]).max_tokens(4);
        engine.generate(&request).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn config_json() {
    fuzz::<ConfigTarget>();
}

// ---------------------------------------------------------------------------------------------
// The safetensors header path: shard headers, the length prefix, the index, the sidecar
// ---------------------------------------------------------------------------------------------

struct Shard {
    model: &'static str,
    /// Path of the file inside the checkpoint directory.
    file: &'static str,
    header: Value,
    data: Vec<u8>,
}

struct SafetensorsTarget {
    _root: tempfile::TempDir,
    dirs: HashMap<&'static str, PathBuf>,
    shards: Vec<Shard>,
    pool: JsonPool,
}

#[derive(Debug)]
struct SafetensorsInput {
    shard: usize,
    /// The 8-byte length prefix.
    header_len: u64,
    header: String,
    /// Bytes of the original data kept (the file is truncated or extended to this).
    data_len: usize,
    /// Mutated `model.safetensors.index.json`, when the index is the thing mutated.
    index: Option<String>,
    has_vision_tower: bool,
    use_clipped_linears: bool,
    load: bool,
}

const DTYPES: &[&str] = &[
    "F32", "BF16", "F16", "U32", "I32", "U8", "I8", "BOOL", "F64", "I64", "U64", "U16", "I16",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "C64", "", "f32", "XYZ",
];

impl Target for SafetensorsTarget {
    type Input = SafetensorsInput;
    const NAME: &'static str = "safetensors_header";

    fn setup() -> Self {
        let root = tempfile::tempdir().unwrap();
        let files: &[(&str, &[&str])] = &[
            ("tiny", &["model.safetensors"]),
            (
                "tiny-sharded",
                &[
                    "model-00001-of-00003.safetensors",
                    "model-00002-of-00003.safetensors",
                    "model-00003-of-00003.safetensors",
                ],
            ),
            ("tiny-vision", &["model.safetensors"]),
            (
                "tiny-vision-sidecar",
                &["model.safetensors", "optiq/optiq_vision.safetensors"],
            ),
        ];
        let mut dirs = HashMap::new();
        let mut shards = Vec::new();
        let mut pool = JsonPool::default();
        for &(model, names) in files {
            dirs.insert(model, checkpoint_copy(root.path(), model));
            for &file in names {
                let bytes = std::fs::read(dg_testkit::model_dir(model).join(file)).unwrap();
                let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
                let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
                pool.add(&header);
                shards.push(Shard {
                    model,
                    file,
                    header,
                    data: bytes[8 + n..].to_vec(),
                });
            }
        }
        SafetensorsTarget {
            _root: root,
            dirs,
            shards,
            pool,
        }
    }

    fn generate(&self, rng: &mut Rng) -> SafetensorsInput {
        let shard = rng.below(self.shards.len());
        let s = &self.shards[shard];
        let mut header = s.header.clone();
        // Half the inputs keep the file valid for the safetensors crate (same byte sizes, same
        // offsets), so that they reach the loader's own checks.
        let valid = rng.bool();
        for _ in 0..1 + rng.size(5) {
            if valid {
                mutate_tensor_keeping_sizes(rng, &mut header);
            } else if rng.bool() {
                mutate_tensor_entry(rng, &mut header, s.data.len());
            } else {
                mutate_json(rng, &mut header, &self.pool);
            }
        }
        let mut text = serde_json::to_vec(&header).unwrap();
        if !valid && rng.one_in(6) {
            mutate_bytes(rng, &mut text, &[], 4 << 20);
        }
        // Padding spaces after the JSON, as writers align the data start.
        if rng.one_in(4) {
            text.extend(std::iter::repeat_n(b' ', rng.below(8)));
        }
        let header = String::from_utf8_lossy(&text).into_owned();
        let header_len = match if valid { 9 } else { rng.below(10) } {
            0 => interesting_u64(rng),
            1 => (header.len() as u64)
                .wrapping_add(rng.below(17) as u64)
                .wrapping_sub(8),
            _ => header.len() as u64,
        };
        let data_len = match if valid { 7 } else { rng.below(8) } {
            0 => rng.below(s.data.len() + 1),
            1 => s.data.len() + rng.size(4096),
            _ => s.data.len(),
        };
        let index = rng.one_in(8).then(|| {
            let path = dg_testkit::model_dir(s.model).join("model.safetensors.index.json");
            let mut doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            for _ in 0..1 + rng.size(4) {
                mutate_index(rng, &mut doc, &self.pool);
            }
            doc.to_string()
        });
        SafetensorsInput {
            shard,
            header_len,
            header,
            data_len,
            index,
            has_vision_tower: rng.bool(),
            use_clipped_linears: rng.bool(),
            load: rng.one_in(2),
        }
    }

    fn run(&mut self, input: &SafetensorsInput) -> Result<(), String> {
        let s = &self.shards[input.shard];
        let dir = &self.dirs[s.model];
        let path = dir.join(s.file);
        let mut bytes = input.header_len.to_le_bytes().to_vec();
        bytes.extend_from_slice(input.header.as_bytes());
        let mut data = s.data.clone();
        data.resize(input.data_len, 0xA5);
        bytes.extend_from_slice(&data);
        std::fs::write(&path, &bytes).unwrap();
        let index_path = dir.join("model.safetensors.index.json");
        if let Some(index) = &input.index {
            std::fs::write(&index_path, index).unwrap();
        }
        let result = run_checkpoint(dir, input);
        std::fs::copy(dg_testkit::model_dir(s.model).join(s.file), &path).unwrap();
        if input.index.is_some() {
            let original = dg_testkit::model_dir(s.model).join("model.safetensors.index.json");
            std::fs::copy(original, &index_path).unwrap();
        }
        result
    }
}

fn run_checkpoint(dir: &Path, input: &SafetensorsInput) -> Result<(), String> {
    use dg_core::checkpoint::SanitizeOptions;
    use safetensors::Dtype;
    let opts = SanitizeOptions {
        has_vision_tower: input.has_vision_tower,
        use_clipped_linears: input.use_clipped_linears,
    };
    let opened = dg_core::Checkpoint::open(dir, opts);
    if let Ok(ck) = &opened {
        // Read every tensor as its own dtype and shape, and once with a wrong shape.
        let names: Vec<String> = ck.names().map(str::to_owned).collect();
        for name in names {
            let entry = ck.entry(&name).map_err(|e| e.to_string())?.clone();
            let shape = entry.shape.clone();
            let mut wrong = shape.clone();
            wrong.push(2);
            for shape in [shape, wrong] {
                let _ = match entry.dtype {
                    Dtype::U32 => ck.u32_buf(&name, &shape).map(|_| ()),
                    Dtype::BF16 => ck.bf16_buf(&name, &shape).map(|_| ()),
                    _ => ck.f32(&name, &shape).map(|_| ()),
                };
            }
        }
    }
    if input.load {
        // The real loader (config, vision tower, sidecar, sanitize options from the config).
        load_engine(dir)?;
    }
    opened.map(|_| ()).map_err(|e| e.to_string())
}

/// Mutations the safetensors crate accepts: a dtype of the same width, a shape with the same
/// element count, a rename (also to a name sanitize drops or rewrites), two tensors' headers
/// swapped but not their bytes.
fn mutate_tensor_keeping_sizes(rng: &mut Rng, header: &mut Value) {
    let Value::Object(m) = header else { return };
    let names: Vec<String> = m.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return;
    }
    let name = rng.pick(&names).clone();
    let same_width: &[&[&str]] = &[
        &["F32", "U32", "I32"],
        &["BF16", "F16", "U16", "I16"],
        &["U8", "I8", "BOOL", "F8_E4M3", "F8_E5M2"],
        &["F64", "I64", "U64"],
    ];
    match rng.below(4) {
        0 => {
            let dtype = m[&name]["dtype"].as_str().unwrap_or("").to_string();
            if let Some(class) = same_width.iter().find(|c| c.contains(&dtype.as_str())) {
                m[&name]["dtype"] = json!(*rng.pick(class));
            }
        }
        1 => {
            let dims: Vec<u64> = m[&name]["shape"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let product: u64 = dims.iter().product();
            let mut split = [1, 2, 4, 8, 64]
                .into_iter()
                .filter(|d| product.is_multiple_of(*d));
            let d = split.next_back().unwrap_or(1);
            m[&name]["shape"] = match rng.below(5) {
                0 => json!(dims.iter().rev().collect::<Vec<_>>()),
                1 => json!([product]),
                2 => json!([1, product, 1]),
                3 => json!([d, product / d.max(1)]),
                _ => json!([product / d.max(1), d]),
            };
        }
        2 => {
            let v = m.shift_remove(&name).unwrap();
            let new = match rng.below(7) {
                0 => format!("{name}.rotary_emb.inv_freq"),
                1 => "lm_head.weight".into(),
                2 => name.replace("decoder", "encoder.language_model"),
                3 => name.replace(".weight", ""),
                4 => name.replace("vision_tower", "vision_tower.x"),
                5 => format!("model.encoder.vision_tower.{}", random_text(rng, 8)),
                _ => name.replace("scales", "biases"),
            };
            if !m.contains_key(&new) {
                m.insert(new, v);
            } else {
                m.insert(name, v);
            }
        }
        _ => {
            // Swap two tensors' names (their bytes stay where they are).
            let other = rng.pick(&names).clone();
            if other != name {
                let a = m[&name].clone();
                let b = m[&other].clone();
                m[&name] = b;
                m[&other] = a;
            }
        }
    }
}

/// Header-aware mutations: dtypes, shapes and offsets of one tensor, names, metadata.
fn mutate_tensor_entry(rng: &mut Rng, header: &mut Value, data_len: usize) {
    let Value::Object(m) = header else { return };
    let names: Vec<String> = m.keys().cloned().collect();
    if names.is_empty() {
        return;
    }
    let name = rng.pick(&names).clone();
    if !m[&name].is_object() {
        m[&name] = json!({});
    }
    match rng.below(9) {
        0 => m[&name]["dtype"] = json!(*rng.pick(DTYPES)),
        1 => {
            let rank = rng.size(5);
            let dims: Vec<u64> = (0..rank)
                .map(|_| match rng.below(3) {
                    0 => interesting_u64(rng),
                    _ => rng.below(600) as u64,
                })
                .collect();
            m[&name]["shape"] = json!(dims);
        }
        2 => {
            // Same number of elements, another shape (a transposition or a flattening).
            if let Some(shape) = m[&name]["shape"].as_array().cloned() {
                let dims: Vec<u64> = shape.iter().filter_map(Value::as_u64).collect();
                let product: u64 = dims.iter().product();
                m[&name]["shape"] = match rng.below(3) {
                    0 => json!(dims.iter().rev().collect::<Vec<_>>()),
                    1 => json!([product]),
                    _ => json!([1, product, 1]),
                };
            }
        }
        3 => {
            let a = match rng.below(3) {
                0 => interesting_u64(rng),
                _ => rng.below(data_len + 64) as u64,
            };
            let b = match rng.below(3) {
                0 => interesting_u64(rng),
                1 => a.wrapping_add(rng.below(4096) as u64),
                _ => rng.below(data_len + 64) as u64,
            };
            m[&name]["data_offsets"] = json!([a, b]);
        }
        4 => {
            // Point this tensor at another's bytes.
            let other = rng.pick(&names).clone();
            let offsets = m[&other]["data_offsets"].clone();
            m[&name]["data_offsets"] = offsets;
        }
        5 => {
            let v = m.shift_remove(&name).unwrap();
            let new = match rng.below(6) {
                0 => format!("{name}.rotary_emb.inv_freq"),
                1 => "lm_head.weight".into(),
                2 => name.replace("decoder", "encoder.language_model"),
                3 => name.replace("experts.down_proj.weight", "experts.down_proj"),
                4 => format!("model.encoder.vision_tower.{}", random_text(rng, 8)),
                _ => random_text(rng, 40),
            };
            m.insert(new, v);
        }
        6 => {
            m.shift_remove(&name);
        }
        7 => {
            let v = m[&name].clone();
            m.insert(format!("{name}{}", rng.below(10)), v);
        }
        _ => {
            m.insert(
                "__metadata__".into(),
                match rng.below(3) {
                    0 => json!({"format": random_text(rng, 8)}),
                    1 => random_json(rng, 2),
                    _ => json!({"format": "pt", "x": {"nested": 1}}),
                },
            );
        }
    }
}

/// Index mutations: weight_map files (missing, absolute, `..`, other shards), metadata.
fn mutate_index(rng: &mut Rng, doc: &mut Value, pool: &JsonPool) {
    let Some(map) = doc.get_mut("weight_map").and_then(Value::as_object_mut) else {
        mutate_json(rng, doc, pool);
        return;
    };
    if map.is_empty() || rng.one_in(3) {
        mutate_json(rng, doc, pool);
        return;
    }
    let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
    map[&key] = json!(*rng.pick(&[
        "missing.safetensors",
        "/etc/passwd",
        "../model.safetensors",
        "optiq/../../x.safetensors",
        "model-00002-of-00003.safetensors",
        "optiq/optiq_vision.safetensors",
        "optiq",
        "",
        ".",
        "model.safetensors\u{0}",
        "config.json",
    ]));
}

#[test]
fn safetensors_header() {
    fuzz::<SafetensorsTarget>();
}

// ---------------------------------------------------------------------------------------------
// The chat template with arbitrary messages (and the engine's prompt path)
// ---------------------------------------------------------------------------------------------

struct TemplateTarget {
    template: dg_tokenize::ChatTemplate,
    source: String,
    tokenizer: dg_tokenize::Tokenizer,
    /// tiny-vision: the prompt path with image placeholders and images.
    engine: dg_engine::DiffusionGemma,
    image: Vec<u8>,
}

#[derive(Debug)]
struct TemplateInput {
    messages: Vec<dg_tokenize::Message>,
    options: dg_tokenize::RenderOptions,
    /// A mutated template source, now and then.
    source: Option<String>,
    /// Also run the engine's prompt path with this many images.
    engine_images: Option<usize>,
}

const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "user",
    "user",
    "assistant",
    "assistant",
    "tool",
    "model",
    "",
    "USER",
    "<eos>",
];

const PART_KINDS: &[&str] = &["text", "text", "image", "audio", "video", "image_url", ""];

fn random_part(rng: &mut Rng) -> dg_tokenize::ContentPart {
    let kind = if rng.one_in(10) {
        random_text(rng, 12)
    } else {
        rng.pick(PART_KINDS).to_string()
    };
    let text = (kind == "text" || rng.one_in(5)).then(|| random_text(rng, 2048));
    let mut extra = Map::new();
    for _ in 0..rng.size(3) {
        extra.insert(random_key(rng), random_json(rng, 2));
    }
    let mut part = dg_tokenize::ContentPart::text("");
    part.kind = kind;
    part.text = text;
    part.extra = extra;
    part
}

fn random_tool_call(rng: &mut Rng) -> Value {
    if rng.one_in(6) {
        return random_json(rng, 3);
    }
    let arguments = match rng.below(4) {
        0 => Value::String(random_text(rng, 128)),
        1 => random_json(rng, 3),
        _ => Value::Object(
            (0..rng.size(4))
                .map(|_| (random_key(rng), random_json(rng, 2)))
                .collect(),
        ),
    };
    let mut call = json!({
        "id": random_text(rng, 8),
        "type": "function",
        "function": {"name": random_text(rng, 16), "arguments": arguments},
    });
    if rng.one_in(5) {
        mutate_json(rng, &mut call, &JsonPool::default());
    }
    call
}

fn random_message(rng: &mut Rng) -> dg_tokenize::Message {
    use dg_tokenize::{Content, Message};
    let role = if rng.one_in(12) {
        random_text(rng, 12)
    } else {
        rng.pick(ROLES).to_string()
    };
    let content = match rng.below(8) {
        0 => None,
        1..=4 => Some(Content::Text(random_text(rng, 4096))),
        _ => Some(Content::Parts(
            (0..rng.size(5)).map(|_| random_part(rng)).collect(),
        )),
    };
    let mut m = Message::new(role, "");
    m.content = content;
    for _ in 0..rng.size(3) {
        let (key, value) = match rng.below(8) {
            0 | 1 => (
                "tool_calls".to_string(),
                Value::Array((0..rng.size(3)).map(|_| random_tool_call(rng)).collect()),
            ),
            2 => ("reasoning".into(), Value::String(random_text(rng, 256))),
            3 => ("reasoning_content".into(), random_json(rng, 1)),
            4 => ("tool_call_id".into(), random_json(rng, 1)),
            5 => (
                "tool_responses".into(),
                json!([{"name": random_text(rng, 12), "response": random_json(rng, 3)}]),
            ),
            6 => ("name".into(), random_json(rng, 1)),
            _ => (random_key(rng), random_json(rng, 3)),
        };
        m = m.with_field(key, value);
    }
    m
}

fn random_schema(rng: &mut Rng, depth: usize) -> Value {
    if rng.one_in(8) {
        return random_json(rng, 2);
    }
    let ty = *rng.pick(&[
        "string", "number", "integer", "boolean", "array", "object", "null", "STRING", "",
    ]);
    let mut s = json!({"type": ty});
    if rng.bool() {
        s["description"] = Value::String(random_text(rng, 128));
    }
    if rng.one_in(4) {
        s["enum"] = Value::Array((0..rng.size(4)).map(|_| random_json(rng, 0)).collect());
    }
    if rng.one_in(4) {
        s["nullable"] = random_json(rng, 0);
    }
    if depth > 0 && (ty == "array" || rng.one_in(6)) {
        s["items"] = random_schema(rng, depth - 1);
    }
    if depth > 0 && (ty == "object" || rng.one_in(6)) {
        let props: Map<String, Value> = (0..rng.size(4))
            .map(|_| (random_key(rng), random_schema(rng, depth - 1)))
            .collect();
        let required: Vec<Value> = props
            .keys()
            .filter(|_| rng.bool())
            .map(|k| Value::String(k.clone()))
            .collect();
        s["properties"] = Value::Object(props);
        s["required"] = Value::Array(required);
    }
    s
}

fn random_tool(rng: &mut Rng) -> Value {
    if rng.one_in(8) {
        return random_json(rng, 3);
    }
    let mut function = json!({
        "name": random_text(rng, 16),
        "description": random_text(rng, 256),
        "parameters": random_schema(rng, 3),
    });
    if rng.one_in(3) {
        function["response"] = random_schema(rng, 2);
    }
    if rng.one_in(6) {
        mutate_json(rng, &mut function, &JsonPool::default());
    }
    json!({"type": "function", "function": function})
}

/// Snippets a mutated template source gets: loops, recursion, filters, errors.
const JINJA_SNIPPETS: &[&str] = &[
    "{% for i in range(1000000) %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 'a' * 100000000 }}",
    "{{ messages | tojson }}",
    "{{ messages[0]['content'][0]['text'] }}",
    "{{ messages[999] }}",
    "{{ raise_exception('fuzz') }}",
    "{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = ns.x + 1 %}{% endfor %}",
    "{{ (messages | length) / 0 }}",
    "{{ 1 // 0 }}",
    "{{ 9223372036854775807 + 1 }}",
    "{{ -9223372036854775808 // -1 }}",
    "{{ range(9223372036854775807) | list | length }}",
    "{{ 'x' | center(1000000000) }}",
    "{{ messages | map(attribute='role') | join('|') }}",
    "{{ tools[0]['function']['parameters'] | items | list }}",
    "{{ '%s' | format(messages) }}",
    "{{ bos_token ~ eos_token }}",
    "{% if %}",
    "{{",
    "{% endfor %}",
    "{% for m in messages recursive %}{{ loop(m) }}{% endfor %}",
    "{{ messages|string|replace('a', 'aaaa')|replace('a', 'aaaa')|replace('a', 'aaaa') }}",
    "{{ 'abc'[::-1] }}{{ 'abc'[1:99999999999] }}",
    "{{ [1,2,3][9223372036854775807] }}",
    "{{ messages[-9223372036854775808] }}",
    "{{ 'x'.split('') }}{{ 'a b'.split(none, -5) }}",
];

impl Target for TemplateTarget {
    type Input = TemplateInput;
    const NAME: &'static str = "chat_template";

    fn setup() -> Self {
        let dir = dg_testkit::model_dir("tiny");
        let tokenizer = dg_tokenize::Tokenizer::from_dir(&dir).unwrap();
        let template = dg_tokenize::ChatTemplate::from_dir(&dir)
            .unwrap()
            .with_special_tokens(tokenizer.special_tokens_map());
        let source = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
        let engine = load_engine(&dg_testkit::model_dir("tiny-vision")).unwrap();
        let image = std::fs::read(fixtures().join("images/gray.png")).unwrap();
        TemplateTarget {
            template,
            source,
            tokenizer,
            engine,
            image,
        }
    }

    fn generate(&self, rng: &mut Rng) -> TemplateInput {
        let n = if rng.one_in(30) { 200 } else { 12 };
        let messages = (0..rng.size(n)).map(|_| random_message(rng)).collect();
        let mut options = dg_tokenize::RenderOptions {
            add_generation_prompt: rng.bool(),
            enable_thinking: [None, Some(false), Some(true)][rng.below(3)],
            tools: rng
                .bool()
                .then(|| (0..rng.size(4)).map(|_| random_tool(rng)).collect()),
            ..Default::default()
        };
        for _ in 0..rng.size(2) {
            let key = match rng.below(3) {
                0 => "preserve_thinking".to_string(),
                1 => (*rng.pick(&["bos_token", "eos_token", "messages", "tools"])).to_string(),
                _ => random_key(rng),
            };
            options.extra.insert(key, random_json(rng, 2));
        }
        let source = rng.one_in(10).then(|| {
            let mut src = self.source.clone().into_bytes();
            match rng.below(3) {
                0 => mutate_bytes(rng, &mut src, JINJA_SNIPPETS.join("").as_bytes(), 1 << 20),
                _ => {
                    let mut at = rng.below(src.len() + 1);
                    while !self.source.is_char_boundary(at) {
                        at -= 1;
                    }
                    let snippet = rng.pick(JINJA_SNIPPETS).as_bytes().to_vec();
                    src.splice(at..at, snippet);
                }
            }
            String::from_utf8_lossy(&src).into_owned()
        });
        let engine_images = rng.one_in(4).then(|| rng.size(2));
        TemplateInput {
            messages,
            options,
            source,
            engine_images,
        }
    }

    fn run(&mut self, input: &TemplateInput) -> Result<(), String> {
        let err = |e: dg_tokenize::TokenizeError| e.to_string();
        let text = match &input.source {
            Some(source) => dg_tokenize::ChatTemplate::new(source.clone())
                .map_err(err)?
                .with_special_tokens(self.tokenizer.special_tokens_map())
                .render(&input.messages, &input.options)
                .map_err(err)?,
            None => self
                .template
                .render(&input.messages, &input.options)
                .map_err(err)?,
        };
        let ids = self.tokenizer.encode(&text, false).map_err(err)?;
        self.tokenizer.decode(&ids, false).map_err(err)?;
        if let Some(n) = input.engine_images {
            let images = vec![dg_engine::Image::Bytes(self.image.clone()); n];
            let request = dg_engine::Request::chat(input.messages.clone()).images(images);
            self.engine
                .prepare_prompt(&request)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[test]
fn chat_template() {
    fuzz::<TemplateTarget>();
}

// ---------------------------------------------------------------------------------------------
// The tokenizer and detokenizers
// ---------------------------------------------------------------------------------------------

struct TokenizerTarget {
    tokenizer: dg_tokenize::Tokenizer,
    vocab: Vec<String>,
    seeds: Vec<(&'static str, Vec<u8>)>,
    pool: JsonPool,
    _root: tempfile::TempDir,
    dir: PathBuf,
}

#[derive(Debug)]
enum TokenizerInput {
    Encode {
        text: String,
        add_special_tokens: bool,
    },
    Decode {
        ids: Vec<u32>,
        skip_special_tokens: bool,
    },
    Stream {
        ids: Vec<u32>,
        skip: Vec<u32>,
        reset_at: Option<usize>,
    },
    /// A mutated tokenizer.json or tokenizer_config.json, loaded and used.
    Load {
        file: &'static str,
        bytes: Text,
        text: String,
        ids: Vec<u32>,
    },
}

/// Token ids: half the time all in range, else with out-of-range ids mixed in.
fn random_ids(rng: &mut Rng, vocab: usize, max: usize) -> Vec<u32> {
    let wild = if rng.bool() { 0 } else { 4 };
    (0..rng.size(max))
        .map(|_| match wild + rng.below(12 - wild) {
            0 => vocab as u32 + rng.below(8) as u32,
            1 => interesting_u64(rng) as u32,
            2 => rng.below(30) as u32,
            3 => u32::MAX - rng.below(2) as u32,
            // Byte-fallback tokens live near the front of a Gemma vocabulary.
            4 => rng.below(vocab.min(300)) as u32,
            _ => rng.below(vocab) as u32,
        })
        .collect()
}

impl TokenizerTarget {
    fn text(&self, rng: &mut Rng) -> String {
        let mut s = String::new();
        for _ in 0..rng.size(16) {
            if rng.bool() {
                s.push_str(rng.pick(&self.vocab).as_str());
            } else {
                s.push_str(&random_text(rng, 1024));
            }
        }
        s
    }
}

impl Target for TokenizerTarget {
    type Input = TokenizerInput;
    const NAME: &'static str = "tokenizer";

    fn setup() -> Self {
        let dir = dg_testkit::model_dir("tiny");
        let tokenizer = dg_tokenize::Tokenizer::from_dir(&dir).unwrap();
        let vocab = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.id_to_token(id))
            .collect();
        let root = tempfile::tempdir().unwrap();
        let copy = root.path().join("tok");
        std::fs::create_dir(&copy).unwrap();
        let mut seeds = Vec::new();
        let mut pool = JsonPool::default();
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            let bytes = std::fs::read(dir.join(file)).unwrap();
            std::fs::write(copy.join(file), &bytes).unwrap();
            pool.add(&serde_json::from_slice(&bytes).unwrap());
            seeds.push((file, bytes));
        }
        TokenizerTarget {
            tokenizer,
            vocab,
            seeds,
            pool,
            _root: root,
            dir: copy,
        }
    }

    fn generate(&self, rng: &mut Rng) -> TokenizerInput {
        let vocab = self.tokenizer.vocab_size();
        match rng.below(10) {
            0..=2 => TokenizerInput::Encode {
                text: self.text(rng),
                add_special_tokens: rng.bool(),
            },
            3 | 4 => TokenizerInput::Decode {
                ids: random_ids(rng, vocab, 256),
                skip_special_tokens: rng.bool(),
            },
            5..=8 => TokenizerInput::Stream {
                ids: random_ids(rng, vocab, 256),
                skip: random_ids(rng, vocab, 8),
                reset_at: rng.one_in(4).then(|| rng.below(64)),
            },
            _ => {
                let (file, seed) = rng.pick(&self.seeds);
                let mut doc: Value = serde_json::from_slice(seed).unwrap();
                for _ in 0..1 + rng.size(5) {
                    mutate_json(rng, &mut doc, &self.pool);
                }
                let mut bytes = serde_json::to_vec(&doc).unwrap();
                if rng.one_in(6) {
                    mutate_bytes(rng, &mut bytes, seed, 1 << 20);
                }
                TokenizerInput::Load {
                    file,
                    bytes: Text(bytes),
                    text: self.text(rng),
                    ids: random_ids(rng, vocab, 64),
                }
            }
        }
    }

    fn run(&mut self, input: &TokenizerInput) -> Result<(), String> {
        let err = |e: dg_tokenize::TokenizeError| e.to_string();
        match input {
            TokenizerInput::Encode {
                text,
                add_special_tokens,
            } => {
                let ids = self
                    .tokenizer
                    .encode(text, *add_special_tokens)
                    .map_err(err)?;
                self.tokenizer.decode(&ids, false).map_err(err)?;
                self.tokenizer.decode(&ids, true).map_err(err)?;
                stream(&self.tokenizer, &ids, &[], None)
            }
            TokenizerInput::Decode {
                ids,
                skip_special_tokens,
            } => {
                for &id in ids.iter().take(8) {
                    let _ = (
                        self.tokenizer.id_to_token(id),
                        self.tokenizer.is_special(id),
                    );
                    let _ = self.tokenizer.is_skipped_on_decode(id);
                }
                self.tokenizer
                    .decode(ids, *skip_special_tokens)
                    .map(|_| ())
                    .map_err(err)
            }
            TokenizerInput::Stream {
                ids,
                skip,
                reset_at,
            } => stream(&self.tokenizer, ids, skip, *reset_at),
            TokenizerInput::Load {
                file,
                bytes,
                text,
                ids,
            } => {
                let path = self.dir.join(file);
                std::fs::write(&path, &bytes.0).unwrap();
                let result = (|| {
                    let t = dg_tokenize::Tokenizer::from_dir(&self.dir).map_err(err)?;
                    let _ = (
                        t.special_ids(),
                        t.special_tokens_map(),
                        t.eos_token_ids(&[1]),
                    );
                    let enc = t.encode(text, true).map_err(err)?;
                    t.decode(&enc, false).map_err(err)?;
                    t.decode(ids, true).map_err(err)?;
                    stream(&t, ids, &[], None)
                })();
                let seed = &self.seeds.iter().find(|(f, _)| f == file).unwrap().1;
                std::fs::write(&path, seed).unwrap();
                result
            }
        }
    }
}

/// Pushes `ids` through a streaming detokenizer, going on past errors (an out-of-range id must
/// not leave it in a state that panics later).
fn stream(
    t: &dg_tokenize::Tokenizer,
    ids: &[u32],
    skip: &[u32],
    reset_at: Option<usize>,
) -> Result<(), String> {
    let mut d = t.stream_detokenizer().with_skip_ids(skip.iter().copied());
    let mut first_err = None;
    for (i, &id) in ids.iter().enumerate() {
        if reset_at == Some(i) {
            d.reset();
        }
        if let Err(e) = d.push(id) {
            first_err.get_or_insert(e.to_string());
        }
        let _ = (d.text(), d.tokens());
    }
    if let Err(e) = d.flush() {
        first_err.get_or_insert(e.to_string());
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[test]
fn tokenizer() {
    fuzz::<TokenizerTarget>();
}

// ---------------------------------------------------------------------------------------------
// Image decoding and preprocessing
// ---------------------------------------------------------------------------------------------

struct ImageTarget {
    seeds: Vec<(String, Vec<u8>)>,
    engine: dg_engine::DiffusionGemma,
}

#[derive(Clone, Copy, Debug)]
struct ProcessorOptions {
    patch_size: usize,
    max_soft_tokens: usize,
    pooling_kernel_size: usize,
    max_pixels: Option<u64>,
    max_alloc_bytes: Option<u64>,
    exif_apply: bool,
}

struct ImageInput {
    seed: String,
    kind: ImageKind,
    options: ProcessorOptions,
}

#[derive(Debug)]
enum ImageKind {
    /// Encoded bytes for `prepare_bytes` (and `decode_rgb8`).
    Bytes(Vec<u8>),
    /// Raw pixels for `prepare_rgb`: the buffer may not match the size.
    Rgb {
        width: usize,
        height: usize,
        len: usize,
    },
    /// Bytes through the engine's prompt path (tiny-vision: decode, preprocess, tower).
    Engine(Vec<u8>),
}

impl std::fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ImageInput");
        d.field("seed", &self.seed).field("options", &self.options);
        match &self.kind {
            ImageKind::Bytes(b) | ImageKind::Engine(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                d.field("engine", &matches!(self.kind, ImageKind::Engine(_)))
                    .field("len", &b.len())
                    .field("hex", &hex)
            }
            other => d.field("kind", other),
        }
        .finish()
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn image_dim(rng: &mut Rng) -> u32 {
    *rng.pick(&[
        0,
        1,
        2,
        3,
        47,
        48,
        49,
        96,
        144,
        1000,
        4096,
        13_377,
        16_384,
        65_535,
        65_536,
        1 << 24,
        1 << 31,
        u32::MAX,
    ])
}

/// Format-aware damage: new dimensions in a PNG IHDR (with its CRC fixed, so the decoder
/// believes them), a GIF screen or frame, a JPEG SOF; then plain byte mutations.
fn mutate_image(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    if data.starts_with(b"\x89PNG") && data.len() >= 33 && rng.bool() {
        match rng.below(3) {
            0 => data[16..20].copy_from_slice(&image_dim(rng).to_be_bytes()),
            1 => data[20..24].copy_from_slice(&image_dim(rng).to_be_bytes()),
            _ => {
                // Bit depth and colour type, valid and invalid combinations.
                data[24] = *rng.pick(&[1, 2, 4, 8, 16, 0, 3, 32]);
                data[25] = *rng.pick(&[0, 2, 3, 4, 6, 1, 7]);
            }
        }
        let crc = crc32(&data[12..29]);
        data[29..33].copy_from_slice(&crc.to_be_bytes());
        if rng.bool() {
            return;
        }
    }
    if data.starts_with(b"GIF") && data.len() >= 10 && rng.bool() {
        let at = *rng.pick(&[6, 8]);
        let v = image_dim(rng) as u16;
        data[at..at + 2].copy_from_slice(&v.to_le_bytes());
        if let Some(p) = data.iter().position(|&b| b == 0x2c) {
            if p + 9 <= data.len() && rng.bool() {
                let at = p + *rng.pick(&[1, 3, 5, 7]);
                data[at..at + 2].copy_from_slice(&(image_dim(rng) as u16).to_le_bytes());
            }
        }
        if rng.bool() {
            return;
        }
    }
    if data.starts_with(&[0xff, 0xd8]) && rng.bool() {
        if let Some(p) = data
            .windows(2)
            .position(|w| w == [0xff, 0xc0] || w == [0xff, 0xc2])
        {
            if p + 9 <= data.len() {
                let at = p + *rng.pick(&[5, 7]);
                data[at..at + 2].copy_from_slice(&(image_dim(rng) as u16).to_be_bytes());
                if rng.bool() {
                    return;
                }
            }
        }
    }
    mutate_bytes(rng, data, other, 256 << 10);
}

const IMAGE_OPTION_SIZES: &[usize] = &[0, 1, 2, 3, 4, 7, 14, 16, 17, 32];

impl Target for ImageTarget {
    type Input = ImageInput;
    const NAME: &'static str = "image";

    fn setup() -> Self {
        let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixtures().join("images"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).unwrap())
            })
            .collect();
        seeds.sort();
        let engine = load_engine(&dg_testkit::model_dir("tiny-vision")).unwrap();
        ImageTarget { seeds, engine }
    }

    fn generate(&self, rng: &mut Rng) -> ImageInput {
        let (name, seed) = rng.pick(&self.seeds);
        let other = &rng.pick(&self.seeds).1;
        let mut options = ProcessorOptions {
            patch_size: 16,
            max_soft_tokens: 280,
            pooling_kernel_size: 3,
            max_pixels: None,
            max_alloc_bytes: None,
            exif_apply: rng.one_in(3),
        };
        if rng.one_in(8) {
            // Options either bounded (the resize target stays under ~16 M pixels) or huge
            // (their products overflow, which must be an error).
            loop {
                options.patch_size = *rng.pick(IMAGE_OPTION_SIZES);
                options.max_soft_tokens = *rng.pick(&[0, 1, 2, 5, 280, 1000, 4096]);
                options.pooling_kernel_size = *rng.pick(IMAGE_OPTION_SIZES);
                let (p, s, k) = (
                    options.patch_size,
                    options.max_soft_tokens,
                    options.pooling_kernel_size,
                );
                if s * k * k * p * p <= 16 << 20 {
                    break;
                }
            }
            if rng.one_in(3) {
                // Over the processor's pixel budget, most overflowing `max_soft_tokens *
                // pooling^2 * patch^2`: refused before anything is allocated.
                let huge = [usize::MAX, usize::MAX / 2, 1 << 32, 1 << 40, 1 << 20];
                match rng.below(3) {
                    0 => options.patch_size = *rng.pick(&huge),
                    1 => options.max_soft_tokens = *rng.pick(&huge),
                    _ => options.pooling_kernel_size = *rng.pick(&huge),
                }
            }
        }
        if rng.one_in(6) {
            options.max_pixels = Some(*rng.pick(&[0, 1, 100, 4096, 1 << 20]));
        }
        if rng.one_in(6) {
            options.max_alloc_bytes = Some(*rng.pick(&[0, 1, 1024, 1 << 16, 1 << 20]));
        }
        let kind = match rng.below(10) {
            0 => {
                let width = image_dim(rng) as usize;
                let height = image_dim(rng) as usize;
                let width = match rng.below(8) {
                    0 => *rng.pick(&[usize::MAX, usize::MAX / 2, 1 << 40, 1 << 60]),
                    _ => width,
                };
                let exact = width.checked_mul(height).and_then(|n| n.checked_mul(3));
                let len = match exact {
                    Some(n) if n <= 48 << 20 && !rng.one_in(4) => n,
                    _ => rng.size(1 << 16),
                };
                ImageKind::Rgb { width, height, len }
            }
            1 => {
                let mut data = seed.clone();
                mutate_image(rng, &mut data, other);
                ImageKind::Engine(data)
            }
            2 if rng.one_in(4) => {
                ImageKind::Bytes((0..rng.size(4096)).map(|_| rng.u64() as u8).collect())
            }
            _ => {
                let mut data = seed.clone();
                mutate_image(rng, &mut data, other);
                ImageKind::Bytes(data)
            }
        };
        ImageInput {
            seed: name.clone(),
            kind,
            options,
        }
    }

    fn run(&mut self, input: &ImageInput) -> Result<(), String> {
        let o = input.options;
        let mut p = dg_vision::ImageProcessor::default();
        p.patch_size = o.patch_size;
        p.max_soft_tokens = o.max_soft_tokens;
        p.pooling_kernel_size = o.pooling_kernel_size;
        if let Some(n) = o.max_pixels {
            p.limits.max_pixels = n;
        }
        if let Some(n) = o.max_alloc_bytes {
            p.limits.max_alloc_bytes = n;
        }
        if o.exif_apply {
            p.exif = dg_vision::ExifOrientation::Apply;
        }
        let err = |e: dg_vision::VisionError| e.to_string();
        match &input.kind {
            ImageKind::Bytes(bytes) => {
                let decoded = dg_vision::decode_rgb8(bytes, "fuzz image", p.limits, p.exif);
                let prepared = p.prepare_bytes(bytes, "fuzz image").map_err(err)?;
                let _ = (prepared.pixel_values(), prepared.patch_grid());
                decoded.map(|_| ()).map_err(err)
            }
            ImageKind::Rgb { width, height, len } => {
                // The resize target alone, for any size (no pixels needed).
                let _ = p.target_size(*height, *width);
                let _ = p.target_size(*width, *height);
                let rgb: Vec<u8> = (0..*len).map(|i| (i * 7 % 251) as u8).collect();
                let prepared = p.prepare_rgb(*width, *height, &rgb).map_err(err)?;
                let _ = prepared.pixel_values();
                Ok(())
            }
            ImageKind::Engine(bytes) => {
                let request = dg_engine::Request::with_images(
                    "What is this?",
                    vec![dg_engine::Image::Bytes(bytes.clone())],
                );
                self.engine
                    .prepare_prompt(&request)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        }
    }
}

#[test]
fn image() {
    fuzz::<ImageTarget>();
}

// ---------------------------------------------------------------------------------------------
// What the targets found, kept as plain tests (the seeds that found them depend on the
// generators, which will change)
// ---------------------------------------------------------------------------------------------

/// `max_soft_tokens * pooling^2 * patch^2` overflowed (a panic in debug builds, a wrapped size in
/// release); sizes past the pixel budget are now refused naming the options.
#[test]
fn found_image_processor_overflow() {
    for (patch, soft, pool) in [
        (usize::MAX, 280, 3),
        (16, usize::MAX / 2, 3),
        (16, 280, 1 << 32),
        (16, 1 << 32, 3),
    ] {
        let mut p = dg_vision::ImageProcessor::default();
        p.patch_size = patch;
        p.max_soft_tokens = soft;
        p.pooling_kernel_size = pool;
        let err = p.prepare_rgb(2, 2, &[0; 12]).unwrap_err().to_string();
        assert!(err.contains("max_soft_tokens"), "{err}");
        assert!(p.target_size(1, usize::MAX).is_err());
    }
    let p = dg_vision::ImageProcessor::default();
    assert_eq!(p.target_size(1, usize::MAX).unwrap(), (48, 280 * 48));
}

/// One token id of 405,798,912 in tokenizer.json made the piece table allocate ~10 GB (ten
/// seconds and more, and an abort for ids near `u32::MAX`); now a load error naming the token.
#[test]
fn found_tokenizer_huge_token_id() {
    let dir = tempfile::tempdir().unwrap();
    let src = dg_testkit::model_dir("tiny");
    let mut json: Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer.json")).unwrap()).unwrap();
    json["model"]["vocab"]["<0x8A>"] = json!(405_798_912_u32);
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        src.join("tokenizer_config.json"),
        dir.path().join("tokenizer_config.json"),
    )
    .unwrap();
    let err = dg_tokenize::Tokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("<0x8A>"),
        "{err}"
    );
}
