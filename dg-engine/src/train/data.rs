//! Training data: `train.jsonl` read and encoded as the reference's `_read_pairs` and
//! `_encode_pair` do (mlx-optiq 0.7.7 `optiq/vlm/diffusion_gemma/lora.py`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::TrainError;
use crate::engine::DiffusionGemma;
use crate::error::EngineError;
use crate::request::{Message, Prompt};

/// The reference's default longest target: completions are cut to this many tokens.
pub const DEFAULT_MAX_CANVAS: usize = 256;

/// One training example as written in `train.jsonl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainPair {
    /// The user's prompt (chat-templated for the encoder); empty for `{text}` lines.
    pub prompt: String,
    /// The text the decoder learns to denoise.
    pub completion: String,
    /// Its 1-based line in the file.
    pub line: usize,
}

/// A pair as token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedPair {
    /// The chat-templated prompt, tokenized without added special tokens.
    pub prompt_ids: Vec<u32>,
    /// The completion tokenized without special tokens, cut to the max canvas. Empty targets
    /// are kept (the reference skips their iterations, which keeps its data order).
    pub target_ids: Vec<u32>,
    /// The line of `train.jsonl` it came from.
    pub line: usize,
}

/// Reads `train.jsonl`: one JSON object a line, `{"prompt", "completion"}`, `{"messages":
/// [...]}` (the first user and the first assistant message's contents, `""` when missing) or
/// `{"text"}` (an empty prompt). Blank lines are skipped.
///
/// Stricter than the reference, which silently drops a line of none of the three forms: such
/// a line, a non-string field and malformed JSON are errors naming the file and line.
pub fn read_pairs(path: &Path) -> Result<Vec<TrainPair>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut pairs = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let (prompt, completion) = parse_line(raw).map_err(|reason| TrainError::Data {
            path: path.to_owned(),
            line,
            reason,
        })?;
        pairs.push(TrainPair {
            prompt,
            completion,
            line,
        });
    }
    if pairs.is_empty() {
        return Err(TrainError::File {
            path: path.to_owned(),
            reason: "no training examples".into(),
        });
    }
    Ok(pairs)
}

fn string_field(obj: &serde_json::Map<String, Value>, key: &str) -> Result<String, String> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("field {key:?} is {other}, not a string")),
        None => Err(format!("field {key:?} is missing")),
    }
}

/// The `(prompt, completion)` of one line, in the reference's order of precedence.
fn parse_line(raw: &str) -> Result<(String, String), String> {
    let value: Value = serde_json::from_str(raw).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("not a JSON object".into());
    };
    if obj.contains_key("prompt") && obj.contains_key("completion") {
        return Ok((
            string_field(&obj, "prompt")?,
            string_field(&obj, "completion")?,
        ));
    }
    if let Some(messages) = obj.get("messages") {
        let Value::Array(messages) = messages else {
            return Err("field \"messages\" is not an array".into());
        };
        // The reference: `next(m["content"] for m in msgs if m["role"] == role)`, else "".
        let first = |role: &str| -> Result<String, String> {
            for (k, m) in messages.iter().enumerate() {
                let Value::Object(m) = m else {
                    return Err(format!("messages[{k}] is not an object"));
                };
                if string_field(m, "role").map_err(|e| format!("messages[{k}]: {e}"))? == role {
                    return string_field(m, "content").map_err(|e| format!("messages[{k}]: {e}"));
                }
            }
            Ok(String::new())
        };
        return Ok((first("user")?, first("assistant")?));
    }
    if obj.contains_key("text") {
        return Ok((String::new(), string_field(&obj, "text")?));
    }
    Err(
        "none of the training formats: {\"prompt\", \"completion\"}, {\"messages\"} or \
         {\"text\"}"
            .into(),
    )
}

/// Encodes a pair as the reference's `_encode_pair`: the prompt as one user message of the
/// chat template with the generation prompt, tokenized without added special tokens; the
/// completion tokenized without special tokens and cut to `max_canvas` tokens.
///
/// The checkpoint must have a chat template (the reference falls back to the raw prompt with
/// special tokens when rendering fails; every DiffusionGemma checkpoint ships one).
pub fn encode_pair(
    model: &DiffusionGemma,
    pair: &TrainPair,
    max_canvas: usize,
) -> Result<EncodedPair, TrainError> {
    let prompt_ids = model.prompt_ids(&Prompt::Chat(vec![Message::user(pair.prompt.as_str())]))?;
    let mut target_ids = model
        .tokenizer()
        .encode(&pair.completion, false)
        .map_err(EngineError::from)?;
    target_ids.truncate(max_canvas);
    Ok(EncodedPair {
        prompt_ids,
        target_ids,
        line: pair.line,
    })
}

/// Reads and encodes `path`; errors name the file and line.
pub fn load_dataset(
    model: &DiffusionGemma,
    path: &Path,
    max_canvas: usize,
) -> Result<Vec<EncodedPair>, TrainError> {
    let at = |line: usize| {
        let path: PathBuf = path.to_owned();
        move |e: TrainError| TrainError::Data {
            path,
            line,
            reason: e.to_string(),
        }
    };
    let pairs = read_pairs(path)?;
    let encoded = pairs
        .iter()
        .map(|p| encode_pair(model, p, max_canvas).map_err(at(p.line)))
        .collect::<Result<Vec<_>, _>>()?;
    if encoded.iter().all(|p| p.target_ids.is_empty()) {
        return Err(TrainError::File {
            path: path.to_owned(),
            reason: "every completion is empty: nothing to train on".into(),
        });
    }
    Ok(encoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_in_the_reference_order() {
        let p = |s: &str| parse_line(s);
        assert_eq!(
            p(r#"{"prompt": "a", "completion": "b", "text": "c"}"#).unwrap(),
            ("a".into(), "b".into())
        );
        assert_eq!(
            p(r#"{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}]}"#)
                .unwrap(),
            ("".into(), "x".into())
        );
        assert_eq!(
            p(r#"{"prompt": "only", "text": "t"}"#).unwrap(),
            ("".into(), "t".into())
        );
        assert!(p(r#"{"prompt": "only"}"#)
            .unwrap_err()
            .contains("none of the training formats"));
        assert!(p(r#"{"prompt": 1, "completion": "b"}"#)
            .unwrap_err()
            .contains("\"prompt\""));
        assert!(p(r#"{"messages": [{"content": "x"}]}"#)
            .unwrap_err()
            .contains("messages[0]"));
        assert!(p("[1]").unwrap_err().contains("not a JSON object"));
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.jsonl");
        std::fs::write(&path, "{\"text\": \"ok\"}\n\n{\"text\": 3}\n").unwrap();
        let err = read_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("train.jsonl:3:"), "{err}");
        std::fs::write(&path, "\n  \n").unwrap();
        let err = read_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("no training examples"), "{err}");
    }
}
