//! The tokenizer, loaded from a checkpoint's `tokenizer.json` + `tokenizer_config.json` the way
//! transformers 5 loads it (which is what the reference's `AutoTokenizer.from_pretrained` runs).
//!
//! What transformers does beyond reading tokenizer.json, and this module repeats:
//! - `GemmaTokenizer` (the class Gemma checkpoints name) rebuilds the pipeline from the file's
//!   vocab and merges: normalizer `Replace(" " -> "▁")`, pre-tokenizer `Split(" ",
//!   merged_with_previous)`, BPE with `byte_fallback` and `fuse_unk`, decoder `Replace("▁" -> " ")
//!   + ByteFallback + Fuse`. Only the post-processor and added tokens come from the file.
//! - `add_bos_token` / `add_eos_token` in tokenizer_config.json are ignored whenever
//!   tokenizer.json exists (transformers 5 drops them), so `encode(.., add_special_tokens=true)`
//!   adds only what tokenizer.json's post-processor adds: nothing for Gemma, whose templates
//!   write `<bos>` themselves.
//! - Named special tokens (`bos_token`, ..., and model-specific ones such as `image_token`) missing
//!   from the added tokens are added as special tokens.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::{json, Map, Value};
use tokenizers::AddedToken;

use crate::error::{Result, TokenizeError};
use crate::literal::{pick_marker, Masker};
use crate::stream::{DecoderKind, PieceTable, StreamDetokenizer};
use crate::template::{ChatTemplate, RenderOptions};
use crate::Message;

/// The named special-token attributes transformers knows, in its order.
const NAMED_SPECIALS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Special tokens declared by tokenizer_config.json.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    /// Named tokens in transformers' order: `bos_token`, `eos_token`, `unk_token`, `sep_token`,
    /// `pad_token`, `cls_token`, `mask_token`, then model-specific names from the config's
    /// `extra_special_tokens` mapping (`image_token`, `boi_token`, ...). Only those that are set.
    pub named: Vec<(String, String)>,
    /// Unnamed extra special tokens (`extra_special_tokens` / `additional_special_tokens` lists).
    pub extra: Vec<String>,
}

impl SpecialTokens {
    /// The token string of a named special token (`"bos_token"`, `"image_token"`, ...).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// All special token strings, named first, without duplicates (transformers'
    /// `all_special_tokens`).
    pub fn all(&self) -> Vec<&str> {
        let mut seen = HashSet::new();
        self.named
            .iter()
            .map(|(_, v)| v.as_str())
            .chain(self.extra.iter().map(String::as_str))
            .filter(|t| seen.insert(*t))
            .collect()
    }
}

/// A loaded tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    path: PathBuf,
    specials: SpecialTokens,
    special_ids: HashSet<u32>,
    /// Added tokens flagged special (dropped by `decode(.., skip_special_tokens=true)`).
    skipped_on_decode: HashSet<u32>,
    clean_up_spaces: bool,
    model_is_bpe: bool,
    decoder_kind: DecoderKind,
    pieces: Arc<PieceTable>,
    /// A copy with special-token matching off, made on first use of a literal encode.
    plain: Arc<OnceLock<tokenizers::Tokenizer>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.specials)
            .field("decoder_kind", &self.decoder_kind)
            .finish_non_exhaustive()
    }
}

/// Reads a JSON file of at most `max` bytes (a regular file; see `dg_files`).
fn read_json(path: &Path, max: u64) -> Result<Value> {
    let text = dg_files::read_text(path, max)?;
    serde_json::from_str(&text).map_err(|source| TokenizeError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A special token as tokenizer_config.json writes it: a string or an AddedToken dict.
fn token_string(path: &Path, field: &str, v: &Value) -> Result<Option<String>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Object(o) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizeError::field(
                path,
                field,
                "token object has no string `content`",
            )),
        },
        _ => Err(TokenizeError::field(
            path,
            field,
            "expected a string or a token object",
        )),
    }
}

fn opt_bool(path: &Path, config: &Map<String, Value>, field: &str) -> Result<Option<bool>> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(TokenizeError::field(path, field, "expected true or false")),
    }
}

/// The parts of tokenizer_config.json that change tokenization.
#[derive(Debug, Default)]
struct TokenizerConfig {
    class: Option<String>,
    specials: SpecialTokens,
    clean_up_spaces: bool,
}

fn parse_config(path: &Path, json: &Value) -> Result<TokenizerConfig> {
    let obj = json
        .as_object()
        .ok_or_else(|| TokenizeError::field(path, "<root>", "expected a JSON object"))?;
    let mut cfg = TokenizerConfig {
        class: obj
            .get("tokenizer_class")
            .and_then(Value::as_str)
            .map(str::to_string),
        clean_up_spaces: opt_bool(path, obj, "clean_up_tokenization_spaces")?.unwrap_or(false),
        ..TokenizerConfig::default()
    };
    for name in NAMED_SPECIALS {
        if let Some(v) = obj.get(name) {
            if let Some(tok) = token_string(path, name, v)? {
                cfg.specials.named.push((name.to_string(), tok));
            }
        }
    }
    for list_field in ["extra_special_tokens", "additional_special_tokens"] {
        match obj.get(list_field) {
            None | Some(Value::Null) => {}
            // A mapping declares model-specific *named* tokens (image_token, boi_token, ...).
            Some(Value::Object(map)) => {
                for (name, v) in map {
                    let field = format!("{list_field}.{name}");
                    if let Some(tok) = token_string(path, &field, v)? {
                        cfg.specials.named.retain(|(k, _)| k != name);
                        cfg.specials.named.push((name.clone(), tok));
                    }
                }
            }
            Some(Value::Array(items)) => {
                for (i, v) in items.iter().enumerate() {
                    let field = format!("{list_field}[{i}]");
                    if let Some(tok) = token_string(path, &field, v)? {
                        if !cfg.specials.extra.contains(&tok) {
                            cfg.specials.extra.push(tok);
                        }
                    }
                }
            }
            Some(_) => {
                return Err(TokenizeError::field(
                    path,
                    list_field,
                    "expected a mapping or a list of tokens",
                ))
            }
        }
    }
    Ok(cfg)
}

/// Rebuilds the pipeline exactly as transformers' `GemmaTokenizer.__init__` does.
fn apply_gemma_pipeline(path: &Path, json: &mut Value, unk_token: &str) -> Result<()> {
    let root = json
        .as_object_mut()
        .ok_or_else(|| TokenizeError::field(path, "<root>", "expected a JSON object"))?;
    let model = root
        .get_mut("model")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| TokenizeError::field(path, "model", "missing or not an object"))?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(TokenizeError::field(
            path,
            "model.type",
            "GemmaTokenizer needs a BPE model",
        ));
    }
    model.insert("dropout".into(), Value::Null);
    model.insert("unk_token".into(), Value::String(unk_token.to_string()));
    model.insert("continuing_subword_prefix".into(), Value::Null);
    model.insert("end_of_word_suffix".into(), Value::Null);
    model.insert("fuse_unk".into(), Value::Bool(true));
    model.insert("byte_fallback".into(), Value::Bool(true));
    model.insert("ignore_merges".into(), Value::Bool(false));
    root.insert(
        "normalizer".into(),
        json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
    );
    root.insert(
        "pre_tokenizer".into(),
        json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
    );
    root.insert(
        "decoder".into(),
        json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}
        ]}),
    );
    Ok(())
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when present, `tokenizer_config.json` from a checkpoint dir.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = dir.join("tokenizer_config.json");
        Self::from_files(
            dir.join("tokenizer.json"),
            // `exists`, not `is_file`: a FIFO or a device there is an error, not skipped.
            config.exists().then_some(config.as_path()),
        )
    }

    /// Loads a tokenizer from explicit file paths.
    pub fn from_files(
        tokenizer_json: impl AsRef<Path>,
        tokenizer_config: Option<&Path>,
    ) -> Result<Self> {
        let path = tokenizer_json.as_ref().to_path_buf();
        let mut json = read_json(&path, dg_files::TOKENIZER_MAX_BYTES)?;
        let cfg = match tokenizer_config {
            Some(p) => parse_config(p, &read_json(p, dg_files::CONFIG_MAX_BYTES)?)?,
            None => TokenizerConfig::default(),
        };
        // The reference picks its streaming detokenizer from the decoder *as written in the file*.
        let decoder_kind = DecoderKind::from_json(json.get("decoder"));
        let model_is_bpe = json.pointer("/model/type").and_then(Value::as_str) == Some("BPE");

        if matches!(
            cfg.class.as_deref(),
            Some("GemmaTokenizer") | Some("GemmaTokenizerFast")
        ) {
            let unk = cfg.specials.get("unk_token").unwrap_or("<unk>").to_string();
            apply_gemma_pipeline(&path, &mut json, &unk)?;
        }

        // A null post-processor stays null: transformers' replacement (`$A` with no added tokens,
        // since it drops the add_bos/add_eos flags) encodes identically.
        let mut inner: tokenizers::Tokenizer =
            serde_json::from_value(json).map_err(|e| TokenizeError::TokenizerLoad {
                path: path.clone(),
                source: e.into(),
            })?;

        // Named / extra special tokens that tokenizer.json does not already declare.
        let added: HashSet<String> = inner
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .collect();
        let missing: Vec<AddedToken> = cfg
            .specials
            .all()
            .into_iter()
            .filter(|t| !added.contains(*t))
            .map(|t| AddedToken::from(t.to_string(), true).normalized(false))
            .collect();
        if !missing.is_empty() {
            inner.add_special_tokens(&missing);
        }

        let special_ids = cfg
            .specials
            .all()
            .into_iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        let skipped_on_decode = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let pieces = Arc::new(PieceTable::new(&inner, &path)?);
        Ok(Tokenizer {
            inner: Arc::new(inner),
            path,
            specials: cfg.specials,
            special_ids,
            skipped_on_decode,
            clean_up_spaces: cfg.clean_up_spaces,
            model_is_bpe,
            decoder_kind,
            pieces,
            plain: Arc::new(OnceLock::new()),
        })
    }

    /// The `tokenizers` object underneath.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The tokenizer.json this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Encodes text. `add_special_tokens` applies tokenizer.json's post-processor, as Python
    /// `tokenizer.encode(text, add_special_tokens=...)` does (Gemma's adds nothing).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        encode_with(&self.inner, text, add_special_tokens)
    }

    /// Encodes text with special-token strings as plain text (`<eos>` becomes the tokens of the
    /// characters `<`, `eos`, `>`), as Python `tokenizer.encode(text, add_special_tokens=...,
    /// split_special_tokens=True)`.
    pub fn encode_literal(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        encode_with(self.plain(), text, add_special_tokens)
    }

    fn plain(&self) -> &tokenizers::Tokenizer {
        self.plain.get_or_init(|| {
            let mut plain = (*self.inner).clone();
            plain.set_encode_special_tokens(true);
            plain
        })
    }

    /// Decodes ids to text, as Python `tokenizer.decode(ids, skip_special_tokens=...)`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| !self.pieces.contains(id)) {
            return Err(TokenizeError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            });
        }
        let text =
            self.inner
                .decode(ids, skip_special_tokens)
                .map_err(|e| TokenizeError::Decode {
                    len: ids.len(),
                    source: e,
                })?;
        // transformers never applies its WordPiece-era cleanup to BPE models.
        Ok(if self.clean_up_spaces && !self.model_is_bpe {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// Number of token ids, added tokens included (Python `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// One past the largest id the tokenizer can produce: a model needs at least this many
    /// embedding rows (it may have more, padded).
    pub fn id_count(&self) -> usize {
        self.pieces.len()
    }

    /// The id of a token string (added or in the model vocab).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a named special token (`"bos_token"`, `"image_token"`, ...), if declared.
    pub fn special_token_id(&self, name: &str) -> Option<u32> {
        self.specials.get(name).and_then(|t| self.token_to_id(t))
    }

    /// Whether `id` is one of the declared special tokens (transformers' `all_special_ids`:
    /// named and extra special tokens, e.g. `<bos>`, `<eos>`, `<|image|>`; not every control token
    /// of the vocabulary).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Ids of the declared special tokens, in transformers' `all_special_ids` order.
    pub fn special_ids(&self) -> Vec<u32> {
        self.specials
            .all()
            .into_iter()
            .filter_map(|t| self.token_to_id(t))
            .collect()
    }

    /// Whether decoding with `skip_special_tokens=true` drops `id` (any added token marked
    /// special in tokenizer.json, e.g. `<|turn>`).
    pub fn is_skipped_on_decode(&self, id: u32) -> bool {
        self.skipped_on_decode.contains(&id)
    }

    /// The declared special tokens.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }

    /// The variables transformers passes to a chat template for the tokenizer
    /// (`special_tokens_map`: `bos_token`, `eos_token`, ..., `image_token`, ...).
    pub fn special_tokens_map(&self) -> Map<String, Value> {
        self.specials
            .named
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect()
    }

    /// The `eos_token` id, if declared.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.special_token_id("eos_token")
    }

    /// The `bos_token` id, if declared.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special_token_id("bos_token")
    }

    /// The stop-token set the reference uses: the tokenizer's EOS first, then the model config's
    /// `eos_token_id` entries (DiffusionGemma: `[1, 106]` gives {1, 106}), duplicates removed.
    pub fn eos_token_ids(&self, config_eos: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        for id in self
            .eos_token_id()
            .into_iter()
            .chain(config_eos.iter().copied())
        {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }

    /// A fresh streaming detokenizer of the kind the reference picks for this tokenizer.
    pub fn stream_detokenizer(&self) -> StreamDetokenizer {
        StreamDetokenizer::new(self.decoder_kind, self.pieces.clone(), self.inner.clone())
    }

    /// The chat template of `template` rendered for `messages` and encoded without adding
    /// special tokens, as `apply_chat_template(..., tokenize=True)` does.
    pub fn apply_chat_template(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<Vec<u32>> {
        let text = template.render(messages, options)?;
        self.encode(&text, false)
    }

    /// [`apply_chat_template`](Self::apply_chat_template) with special-token strings inside the
    /// messages kept as text: a user who types `<eos>` or `<|image|>` gets the tokens of those
    /// characters, while the template's own markers (`<bos>`, turn markers, the generation
    /// prompt) stay control tokens. Every string a message carries counts as its text (content,
    /// text parts, tool calls, ...) except its role and part types. A conversation whose
    /// messages hold no special-token string gets exactly the ids of `apply_chat_template`.
    pub fn apply_chat_template_literal(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<Vec<u32>> {
        // Every input the render can copy text from, so the marker is in none of them.
        let inputs = [
            template.source(),
            json_text("messages", &messages)?,
            json_text("tools", &options.tools)?,
            json_text("template variables", &options.extra)?,
            json_text("special tokens", template.special_tokens())?,
        ];
        let marker = pick_marker(inputs.iter().map(String::as_str))?;
        let mut masker = Masker::new(&self.inner, &self.skipped_on_decode, marker);
        let masked: Vec<Message> = messages.iter().map(|m| masker.message(m)).collect();
        if !masker.masked_any() {
            return self.apply_chat_template(template, messages, options);
        }
        let text = template.render(&masked, options)?;
        masker.encode(self.plain(), &text)
    }
}

/// `tok.encode(text, add_special_tokens)`'s ids, its error named as ours.
fn encode_with(
    tok: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>> {
    let enc = tok
        .encode(text, add_special_tokens)
        .map_err(|source| TokenizeError::Encode {
            chars: text.chars().count(),
            source,
        })?;
    Ok(enc.get_ids().to_vec())
}

fn json_text(what: &str, value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|source| TokenizeError::Serialize {
        what: what.into(),
        source,
    })
}

/// transformers' `clean_up_tokenization` (only used for non-BPE models).
fn clean_up_tokenization(s: &str) -> String {
    s.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}
