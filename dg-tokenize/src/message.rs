//! Chat messages in the OpenAI / Hugging Face shape that chat templates read.
//!
//! A message serializes to exactly the dict a Python caller would pass to `apply_chat_template`:
//! absent fields stay absent (templates test `is defined`), extra fields (`tool_calls`,
//! `reasoning`, `tool_call_id`, ...) pass through in insertion order.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One part of a multi-part message: `{"type": "text", "text": ...}`, `{"type": "image"}`, ...
///
/// Images are placeholders here: the template renders `<|image|>` for them and the pixels are
/// handled elsewhere (dg-vision).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `"text"`, `"image"`, `"audio"`, `"video"`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Any other fields (e.g. `"url"` of an image), passed to the template as given.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart {
            kind: "text".into(),
            text: Some(text.into()),
            extra: Map::new(),
        }
    }

    /// An image placeholder part.
    pub fn image() -> Self {
        ContentPart {
            kind: "image".into(),
            text: None,
            extra: Map::new(),
        }
    }
}

/// A message's content: a plain string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// A plain string.
    Text(String),
    /// Typed parts (text, image placeholders, ...), in order.
    Parts(Vec<ContentPart>),
}

impl From<&str> for Content {
    fn from(s: &str) -> Self {
        Content::Text(s.to_string())
    }
}

impl From<String> for Content {
    fn from(s: String) -> Self {
        Content::Text(s)
    }
}

impl From<Vec<ContentPart>> for Content {
    fn from(parts: Vec<ContentPart>) -> Self {
        Content::Parts(parts)
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `"system"`, `"developer"`, `"user"`, `"assistant"` or `"tool"`.
    pub role: String,
    /// Absent for e.g. an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// Other fields the template may read: `tool_calls`, `reasoning`, `reasoning_content`,
    /// `tool_call_id`, `name`, `tool_responses`, ...
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<Content>) -> Self {
        Message {
            role: role.into(),
            content: Some(content.into()),
            extra: Map::new(),
        }
    }

    /// A `"system"` message.
    pub fn system(content: impl Into<Content>) -> Self {
        Self::new("system", content)
    }

    /// A `"user"` message.
    pub fn user(content: impl Into<Content>) -> Self {
        Self::new("user", content)
    }

    /// An `"assistant"` message.
    pub fn assistant(content: impl Into<Content>) -> Self {
        Self::new("assistant", content)
    }

    /// Adds or replaces an extra field (e.g. `"tool_calls"`).
    pub fn with_field(mut self, key: impl Into<String>, value: Value) -> Self {
        self.extra.insert(key.into(), value);
        self
    }
}
