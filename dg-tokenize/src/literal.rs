//! Special-token strings typed in message text, tokenized as text.
//!
//! A chat prompt is one rendered string, and transformers tokenizes it with every special token
//! recognised, so a user who types `<eos>` or `<|image|>` sends the control token. In literal
//! mode each special-token string inside a message's text is swapped for a placeholder before
//! rendering (so the template's own markers are the only special tokens left in the render), the
//! render is split at those markers exactly as `tokenizers` splits it, and the text between two
//! markers, placeholders restored, is encoded with special tokens off (transformers'
//! `split_special_tokens=True`). Text between markers is encoded on its own in both modes, so a
//! conversation without special-token strings in its messages gets the same ids either way.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value;
use tokenizers::{OffsetReferential, OffsetType};

use crate::error::{Result, TokenizeError};
use crate::message::{Content, Message};

/// Placeholder delimiters are taken from the supplementary private-use planes: a character no
/// input contains, so every one in the render is ours.
const MARKER_CANDIDATES: [std::ops::RangeInclusive<u32>; 2] =
    [0xF0000..=0xFFFFD, 0x100000..=0x10FFFD];

/// Picks a placeholder delimiter that none of `inputs` contains.
pub(crate) fn pick_marker<'a>(inputs: impl IntoIterator<Item = &'a str>) -> Result<char> {
    let used: HashSet<char> = inputs
        .into_iter()
        .flat_map(str::chars)
        .filter(|c| MARKER_CANDIDATES.iter().any(|r| r.contains(&(*c as u32))))
        .collect();
    MARKER_CANDIDATES
        .into_iter()
        .flatten()
        .filter_map(char::from_u32)
        .find(|c| !used.contains(c))
        .ok_or_else(|| TokenizeError::Encode {
            chars: used.len(),
            source: "literal special tokens: the messages use every private-use character, \
                      none is left to mark their special-token strings"
                .into(),
        })
}

/// Special-token strings found in message text, each replaced by `marker index marker`.
pub(crate) struct Masker<'a> {
    tokenizer: &'a tokenizers::Tokenizer,
    special_ids: &'a HashSet<u32>,
    marker: char,
    /// Each distinct masked string once; a placeholder holds its index.
    table: Vec<String>,
    index: HashMap<String, usize>,
}

impl<'a> Masker<'a> {
    pub(crate) fn new(
        tokenizer: &'a tokenizers::Tokenizer,
        special_ids: &'a HashSet<u32>,
        marker: char,
    ) -> Self {
        Masker {
            tokenizer,
            special_ids,
            marker,
            table: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Whether any message text held a special-token string.
    pub(crate) fn masked_any(&self) -> bool {
        !self.table.is_empty()
    }

    /// `message` with every string it carries masked, except its role and part types (which
    /// the template dispatches on).
    pub(crate) fn message(&mut self, message: &Message) -> Message {
        let mut out = message.clone();
        match &mut out.content {
            Some(Content::Text(text)) => *text = self.text(text),
            Some(Content::Parts(parts)) => {
                for part in parts {
                    if let Some(text) = &mut part.text {
                        *text = self.text(text);
                    }
                    part.extra.values_mut().for_each(|v| self.value(v));
                }
            }
            None => {}
        }
        out.extra.values_mut().for_each(|v| self.value(v));
        out
    }

    fn value(&mut self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.value(v)),
            _ => {}
        }
    }

    /// `text` with each special token the tokenizer would match in it replaced by a placeholder.
    fn text(&mut self, text: &str) -> String {
        let splits = special_splits(self.tokenizer, self.special_ids, text);
        if splits.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (start, end, _) in splits {
            out.push_str(&text[last..start]);
            let matched = &text[start..end];
            let next = self.table.len();
            let i = *self.index.entry(matched.to_string()).or_insert(next);
            if i == next {
                self.table.push(matched.to_string());
            }
            out.push(self.marker);
            // Writing to a String cannot fail.
            let _ = write!(out, "{i}");
            out.push(self.marker);
            last = end;
        }
        out.push_str(&text[last..]);
        out
    }

    /// `text` with its placeholders replaced by the strings they stand for.
    fn restore(&self, text: &str) -> Result<String> {
        let broken = || TokenizeError::Encode {
            chars: text.chars().count(),
            source: "literal special tokens: the chat template cut a placeholder of a \
                      special-token string in a message"
                .into(),
        };
        let pieces: Vec<&str> = text.split(self.marker).collect();
        // Placeholders come in pairs of markers: an even number of pieces means one was cut.
        if pieces.len().is_multiple_of(2) {
            return Err(broken());
        }
        let mut out = String::with_capacity(text.len());
        for (i, piece) in pieces.into_iter().enumerate() {
            if i.is_multiple_of(2) {
                out.push_str(piece);
            } else {
                let index: usize = piece.parse().map_err(|_| broken())?;
                out.push_str(self.table.get(index).ok_or_else(broken)?);
            }
        }
        Ok(out)
    }

    /// Encodes a render of masked messages: the special tokens the tokenizer finds in it (the
    /// template's own) as control tokens, the text between them with placeholders restored and
    /// special tokens off (`plain`).
    pub(crate) fn encode(&self, plain: &tokenizers::Tokenizer, rendered: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut gap = 0;
        let encode_gap = |ids: &mut Vec<u32>, text: &str| -> Result<()> {
            if text.is_empty() {
                return Ok(());
            }
            let text = self.restore(text)?;
            let enc = plain
                .encode(text.as_str(), false)
                .map_err(|e| TokenizeError::Encode {
                    chars: text.chars().count(),
                    source: e,
                })?;
            ids.extend_from_slice(enc.get_ids());
            Ok(())
        };
        for (start, end, id) in special_splits(self.tokenizer, self.special_ids, rendered) {
            encode_gap(&mut ids, &rendered[gap..start])?;
            ids.push(id);
            gap = end;
        }
        encode_gap(&mut ids, &rendered[gap..])?;
        Ok(ids)
    }
}

/// Where `tokenizer` finds special tokens in `text`: byte ranges (with any whitespace an
/// `lstrip`/`rstrip` token takes) and ids, by the library's own matching.
fn special_splits(
    tokenizer: &tokenizers::Tokenizer,
    special_ids: &HashSet<u32>,
    text: &str,
) -> Vec<(usize, usize, u32)> {
    let pre = tokenizer
        .get_added_vocabulary()
        .extract_and_normalize(tokenizer.get_normalizer(), text);
    pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .filter_map(|(_, (start, end), tokens)| match tokens.as_deref() {
            Some([token]) if special_ids.contains(&token.id) => Some((start, end, token.id)),
            _ => None,
        })
        .collect()
}
