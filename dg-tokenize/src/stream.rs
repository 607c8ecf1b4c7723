//! Incremental detokenization for streaming output, as the reference streams text.
//!
//! The reference (`optiq/vlm/_mlxvlm/tokenizer_utils.py`) picks a detokenizer from the shape of
//! tokenizer.json's decoder. Gemma's decoder (`Replace("▁"->" ") + ByteFallback + Fuse`) selects
//! `SPMStreamingDetokenizer(trim_space=False)`:
//! - byte-fallback tokens `<0xNN>` collect in a byte buffer, decoded as UTF-8 (invalid sequences
//!   become U+FFFD as Python's `errors="replace"` does) when the next non-byte token arrives;
//! - text is committed only when a token starting with "▁" (a new word) arrives, so a word is
//!   never emitted half-way;
//! - a segment is emitted only if the committed text does not end in U+FFFD.
//!
//! Any other decoder selects the reference's `NaiveStreamingDetokenizer` (re-decode the pending
//! ids, commit at a newline). The reference's byte-level-BPE detokenizer is not ported (Gemma
//! never uses it); such tokenizers get the naive one.
//!
//! One deliberate difference: at the end the reference yields nothing if the text ends in U+FFFD,
//! dropping the tail; [`StreamDetokenizer::flush`] returns it.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{Result, TokenizeError};

const REPLACEMENT: char = '\u{FFFD}';
const SPM_SPACE: char = '\u{2581}';

/// Which streaming algorithm the reference would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderKind {
    /// `SPMStreamingDetokenizer`; `trim_space` drops the first space (decoder ends in `Strip`).
    Spm {
        /// Drop the leading space of the first piece.
        trim_space: bool,
    },
    /// `NaiveStreamingDetokenizer`.
    Naive,
}

impl DecoderKind {
    /// The reference's `_is_spm_decoder` / `_is_spm_decoder_no_space` checks on tokenizer.json's
    /// `decoder` (exact structural equality).
    pub fn from_json(decoder: Option<&Value>) -> Self {
        let base = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        let mut with_strip = base.clone();
        with_strip.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        let spm = json!({"type": "Sequence", "decoders": with_strip});
        let spm_no_space = json!({"type": "Sequence", "decoders": base});
        match decoder {
            Some(d) if *d == spm => DecoderKind::Spm { trim_space: true },
            Some(d) if *d == spm_no_space => DecoderKind::Spm { trim_space: false },
            _ => DecoderKind::Naive,
        }
    }
}

/// Id -> piece table, with byte-fallback tokens marked (built once per tokenizer).
#[derive(Debug)]
pub(crate) struct PieceTable {
    pieces: Vec<Option<String>>,
    /// `Some(b)` for a byte-fallback token `<0xNN>`.
    bytes: Vec<Option<u8>>,
}

/// Ids a tokenizer may use: `0..MAX_TOKEN_IDS` (Gemma's vocabulary has 262,144). The piece
/// table is indexed by id, so one stray id of 400 million in tokenizer.json would otherwise
/// allocate gigabytes.
pub const MAX_TOKEN_IDS: usize = 1 << 24;

impl PieceTable {
    pub(crate) fn new(tok: &tokenizers::Tokenizer, path: &std::path::Path) -> Result<Self> {
        let vocab = tok.get_vocab(true);
        if let Some((piece, id)) = vocab.iter().find(|(_, &id)| id as usize >= MAX_TOKEN_IDS) {
            return Err(TokenizeError::TokenizerLoad {
                path: path.to_owned(),
                source: format!("token `{piece}` has id {id}, over the limit of {MAX_TOKEN_IDS}")
                    .into(),
            });
        }
        let len = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let mut pieces = vec![None; len];
        let mut bytes = vec![None; len];
        for (piece, id) in vocab {
            let id = id as usize;
            // The reference's test: starts with "<0x", at least 6 chars, ">" at index 5.
            let b = piece.as_bytes();
            if piece.starts_with("<0x") && b.len() >= 6 && b[5] == b'>' {
                bytes[id] = std::str::from_utf8(&b[3..5])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
            }
            pieces[id] = Some(piece);
        }
        Ok(PieceTable { pieces, bytes })
    }

    /// One past the largest id.
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether `id` names a token.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.pieces.get(id as usize).is_some_and(Option::is_some)
    }

    fn piece(&self, id: u32) -> Result<&str> {
        self.pieces
            .get(id as usize)
            .and_then(|p| p.as_deref())
            .ok_or(TokenizeError::UnknownTokenId {
                id,
                vocab_size: self.pieces.len(),
            })
    }
}

#[derive(Debug, Clone, Default)]
struct SpmState {
    unflushed: String,
    byte_buffer: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
struct NaiveState {
    current: Vec<u32>,
    current_text: String,
}

/// Streams text as token ids arrive. Create one per generation with
/// [`crate::Tokenizer::stream_detokenizer`].
#[derive(Clone)]
pub struct StreamDetokenizer {
    kind: DecoderKind,
    pieces: Arc<PieceTable>,
    tokenizer: Arc<tokenizers::Tokenizer>,
    skip: HashSet<u32>,
    /// Committed text.
    text: String,
    /// How much of the text was returned: bytes (SPM) or characters (naive), as the reference.
    offset: usize,
    tokens: Vec<u32>,
    spm: SpmState,
    naive: NaiveState,
}

impl std::fmt::Debug for StreamDetokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDetokenizer")
            .field("kind", &self.kind)
            .field("text", &self.text)
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl StreamDetokenizer {
    pub(crate) fn new(
        kind: DecoderKind,
        pieces: Arc<PieceTable>,
        tokenizer: Arc<tokenizers::Tokenizer>,
    ) -> Self {
        StreamDetokenizer {
            kind,
            pieces,
            tokenizer,
            skip: HashSet::new(),
            text: String::new(),
            offset: 0,
            tokens: Vec::new(),
            spm: SpmState::default(),
            naive: NaiveState::default(),
        }
    }

    /// Ids to drop silently (the reference's `skip_special_token_ids`; its public generate path
    /// passes an empty set, so special tokens other than the stop tokens appear as text).
    pub fn with_skip_ids(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.skip = ids.into_iter().collect();
        self
    }

    /// The algorithm in use.
    pub fn kind(&self) -> DecoderKind {
        self.kind
    }

    /// Forgets everything pushed so far.
    pub fn reset(&mut self) {
        self.text.clear();
        self.offset = 0;
        self.tokens.clear();
        self.spm = SpmState::default();
        self.naive = NaiveState::default();
    }

    /// Text committed so far (everything returned plus anything held back).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Ids pushed so far (skipped ids excluded; for the SPM kind this is left empty, as in the
    /// reference).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Adds one id; returns the newly printable text, if any (the reference's `add_token`
    /// followed by `last_segment`).
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        if !self.skip.contains(&id) {
            match self.kind {
                DecoderKind::Spm { trim_space } => self.spm_add(id, trim_space)?,
                DecoderKind::Naive => self.naive_add(id)?,
            }
        }
        Ok(self.last_segment())
    }

    /// Ends the stream and returns the remaining text (may be empty). Unlike the reference this
    /// also returns a tail ending in U+FFFD, which the reference drops.
    pub fn flush(&mut self) -> Result<String> {
        match self.kind {
            DecoderKind::Spm { trim_space } => {
                self.spm_flush_bytes();
                let unflushed = std::mem::take(&mut self.spm.unflushed);
                self.spm_commit(&unflushed, trim_space);
            }
            DecoderKind::Naive => {
                let current = std::mem::take(&mut self.naive.current);
                let decoded = self.decode(&current)?;
                self.tokens.extend(current);
                self.text.push_str(&decoded);
                self.naive.current_text.clear();
            }
        }
        let rest = match self.kind {
            DecoderKind::Spm { .. } => {
                let rest = self.text[self.offset..].to_string();
                self.offset = self.text.len();
                rest
            }
            DecoderKind::Naive => {
                let rest: String = self.text.chars().skip(self.offset).collect();
                self.offset = self.text.chars().count();
                rest
            }
        };
        Ok(rest)
    }

    /// The reference's `last_segment`: the text since the last call, unless the text ends in
    /// U+FFFD (a broken byte sequence that later bytes cannot repair, held back anyway).
    fn last_segment(&mut self) -> Option<String> {
        match self.kind {
            DecoderKind::Spm { .. } => {
                // SPM text only grows, so a byte offset is exact.
                if self.text.is_empty() || self.text.ends_with(REPLACEMENT) {
                    return None;
                }
                let seg = self.text[self.offset..].to_string();
                self.offset = self.text.len();
                (!seg.is_empty()).then_some(seg)
            }
            DecoderKind::Naive => {
                self.naive_refresh();
                // The pending text is re-decoded on every id and may change, so the reference's
                // offset counts characters of committed + pending text.
                let full = format!("{}{}", self.text, self.naive.current_text);
                if full.is_empty() || full.ends_with(REPLACEMENT) {
                    return None;
                }
                let seg: String = full.chars().skip(self.offset).collect();
                self.offset = full.chars().count();
                (!seg.is_empty()).then_some(seg)
            }
        }
    }

    // --- SPM ---

    fn spm_flush_bytes(&mut self) {
        if !self.spm.byte_buffer.is_empty() {
            let bytes = std::mem::take(&mut self.spm.byte_buffer);
            self.spm
                .unflushed
                .push_str(&String::from_utf8_lossy(&bytes));
        }
    }

    fn spm_commit(&mut self, unflushed: &str, trim_space: bool) {
        let piece = unflushed.replace(SPM_SPACE, " ");
        if !self.text.is_empty() || !trim_space {
            self.text.push_str(&piece);
        } else {
            // `_remove_space`: drop one leading space; the reference *assigns* here.
            self.text = piece.strip_prefix(' ').unwrap_or(&piece).to_string();
        }
    }

    fn spm_add(&mut self, id: u32, trim_space: bool) -> Result<()> {
        let piece = self.pieces.piece(id)?;
        if let Some(b) = self.pieces.bytes.get(id as usize).copied().flatten() {
            self.spm.byte_buffer.push(b);
            return Ok(());
        }
        let piece = piece.to_string();
        self.spm_flush_bytes();
        if piece.starts_with(SPM_SPACE) {
            let unflushed = std::mem::replace(&mut self.spm.unflushed, piece);
            self.spm_commit(&unflushed, trim_space);
        } else {
            self.spm.unflushed.push_str(&piece);
        }
        Ok(())
    }

    // --- Naive ---

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TokenizeError::Decode {
                len: ids.len(),
                source: e,
            })
    }

    fn naive_add(&mut self, id: u32) -> Result<()> {
        self.pieces.piece(id)?;
        self.naive.current.push(id);
        let text = self.decode(&self.naive.current)?;
        self.naive.current_text = text;
        Ok(())
    }

    /// The reference's `text` property: commit the pending ids once their text ends in "\n".
    fn naive_refresh(&mut self) {
        if self.naive.current_text.ends_with('\n') {
            let current = std::mem::take(&mut self.naive.current);
            self.tokens.extend(current);
            let t = std::mem::take(&mut self.naive.current_text);
            self.text.push_str(&t);
        }
    }
}
