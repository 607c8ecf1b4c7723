//! Chat templates rendered with minijinja the way transformers renders them with Jinja2.
//!
//! transformers' `apply_chat_template` compiles the template in an `ImmutableSandboxedEnvironment`
//! with `trim_blocks=True, lstrip_blocks=True` and the `loopcontrols` extension, adds the
//! `tojson` filter (`json.dumps`, `ensure_ascii=False`), `raise_exception` and `strftime_now`, then
//! renders with `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's special
//! tokens (`bos_token`, ...) and any extra keyword arguments (`enable_thinking`, ...). Values are
//! Python objects, so output follows Python's `str()`; see [`crate::pycompat`].

use std::path::{Path, PathBuf};

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use serde_json::Map;

use crate::error::{Error, Result};
use crate::message::Message;
use crate::pycompat;

/// Name under which the template is registered (appears in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// Per-render options, mirroring `apply_chat_template`'s keyword arguments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the opening of a model turn.
    pub add_generation_prompt: bool,
    /// `enable_thinking`; `None` leaves it undefined, as when the caller does not pass it.
    pub enable_thinking: Option<bool>,
    /// Tool declarations (JSON schemas in the OpenAI `{"type": "function", "function": ...}`
    /// shape). `None` renders `tools` as Python `None`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Any other template variables (e.g. `preserve_thinking`); they override special tokens.
    pub extra: Map<String, serde_json::Value>,
}

/// A compiled chat template plus the special-token variables it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source_path: Option<PathBuf>,
    special_tokens: Map<String, serde_json::Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_path", &self.source_path)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

/// The minijinja environment configured like transformers' Jinja2 environment.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Jinja2's default Undefined: printing or testing it is fine, using it as a value errors.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_formatter(pycompat::formatter);
    env.set_unknown_method_callback(pycompat::unknown_method);
    env.add_filter("tojson", pycompat::tojson_filter);
    env.add_filter("trim", pycompat::trim_filter);
    env.add_filter("length", pycompat::length_filter);
    env.add_filter("count", pycompat::length_filter);
    env.add_filter("upper", pycompat::upper_filter);
    env.add_filter("lower", pycompat::lower_filter);
    env.add_filter("join", pycompat::join_filter);
    env.add_test("sequence", pycompat::is_sequence);
    env.add_test("iterable", pycompat::is_iterable);
    env.add_function("raise_exception", pycompat::raise_exception);
    env.add_function("strftime_now", pycompat::strftime_now);
    env
}

impl ChatTemplate {
    /// Compiles a template from its source text.
    pub fn new(source: impl Into<String>) -> Result<Self> {
        Self::compile(source.into(), None)
    }

    /// Reads and compiles a `chat_template.jinja` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::compile(source, Some(path.to_path_buf()))
    }

    /// Finds a checkpoint's template as transformers does: `chat_template.jinja` first, else the
    /// `chat_template` field of `tokenizer_config.json` (a string, or a list of
    /// `{"name", "template"}` from which `"default"` is taken).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            return Self::from_file(jinja);
        }
        let config = dir.join("tokenizer_config.json");
        if config.is_file() {
            let text = std::fs::read_to_string(&config).map_err(|source| Error::Io {
                path: config.clone(),
                source,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| Error::Json {
                    path: config.clone(),
                    source,
                })?;
            match json.get("chat_template") {
                Some(serde_json::Value::String(s)) => {
                    return Self::compile(s.clone(), Some(config));
                }
                Some(serde_json::Value::Array(list)) => {
                    let default = list
                        .iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                    return match default
                        .and_then(|t| t.get("template"))
                        .and_then(|t| t.as_str())
                    {
                        Some(s) => Self::compile(s.to_string(), Some(config)),
                        None => Err(Error::field(
                            &config,
                            "chat_template",
                            "list of templates has no {\"name\": \"default\", \"template\": ...}",
                        )),
                    };
                }
                Some(serde_json::Value::Null) | None => {}
                Some(_) => {
                    return Err(Error::field(
                        &config,
                        "chat_template",
                        "expected a string or a list of named templates",
                    ))
                }
            }
        }
        Err(Error::NoChatTemplate {
            dir: dir.to_path_buf(),
        })
    }

    fn compile(source: String, source_path: Option<PathBuf>) -> Result<Self> {
        let mut env = environment();
        let name = source_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| TEMPLATE_NAME.to_string());
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| Error::template(&name, &e))?;
        Ok(ChatTemplate {
            env,
            source_path,
            special_tokens: Map::new(),
        })
    }

    /// Sets the special-token variables (`bos_token`, `eos_token`, ...), as transformers passes
    /// the tokenizer's `special_tokens_map`. See [`crate::Tokenizer::special_tokens_map`].
    pub fn with_special_tokens(mut self, map: Map<String, serde_json::Value>) -> Self {
        self.special_tokens = map;
        self
    }

    /// The special-token variables this template renders with.
    pub fn special_tokens(&self) -> &Map<String, serde_json::Value> {
        &self.special_tokens
    }

    /// Where the template was read from, if from a file.
    pub fn source_path(&self) -> Option<&Path> {
        self.source_path.as_deref()
    }

    fn name(&self) -> String {
        self.source_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| TEMPLATE_NAME.to_string())
    }

    /// Renders a conversation to the prompt string.
    pub fn render(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        let name = self.name();
        // Same variable order and precedence as transformers: special tokens, then the explicit
        // arguments, then extra kwargs overriding special tokens.
        let mut ctx = Map::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), v.clone());
        }
        let messages = serde_json::to_value(messages).map_err(|e| Error::Serialize {
            what: "messages".into(),
            message: e.to_string(),
        })?;
        ctx.insert("messages".into(), messages);
        ctx.insert(
            "tools".into(),
            match &options.tools {
                Some(tools) => serde_json::Value::Array(tools.clone()),
                None => serde_json::Value::Null,
            },
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(options.add_generation_prompt),
        );
        if let Some(t) = options.enable_thinking {
            ctx.insert("enable_thinking".into(), serde_json::Value::Bool(t));
        }
        for (k, v) in &options.extra {
            ctx.insert(k.clone(), v.clone());
        }

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::template(&name, &e))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| Error::template(&name, &e))
    }
}
