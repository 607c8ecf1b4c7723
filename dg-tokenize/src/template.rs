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

use crate::error::{Result, TokenizeError};
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

/// Template instructions one render may run: a real chat template over a long conversation
/// takes a few hundred thousand; a template that loops without end stops here with an error.
pub const TEMPLATE_FUEL: u64 = 50_000_000;
/// Bytes one render may produce.
pub const TEMPLATE_OUTPUT_MAX: usize = 64 << 20;
/// Bytes of a template's source.
pub const TEMPLATE_SOURCE_MAX: usize = 4 << 20;

/// The minijinja environment configured like transformers' Jinja2 environment.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
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
        let source = dg_files::read_text(path, TEMPLATE_SOURCE_MAX as u64)?;
        Self::compile(source, Some(path.to_path_buf()))
    }

    /// Finds a checkpoint's template as transformers does: `chat_template.jinja` first, else the
    /// `chat_template` field of `tokenizer_config.json` (a string, or a list of
    /// `{"name", "template"}` from which `"default"` is taken).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let jinja = dir.join("chat_template.jinja");
        // `exists`, not `is_file`: a FIFO or a device there is an error, not skipped.
        if jinja.exists() {
            return Self::from_file(jinja);
        }
        let config = dir.join("tokenizer_config.json");
        if config.exists() {
            let text = dg_files::read_text(&config, TEMPLATE_SOURCE_MAX as u64)?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| TokenizeError::Json {
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
                        None => Err(TokenizeError::field(
                            &config,
                            "chat_template",
                            "list of templates has no {\"name\": \"default\", \"template\": ...}",
                        )),
                    };
                }
                Some(serde_json::Value::Null) | None => {}
                Some(_) => {
                    return Err(TokenizeError::field(
                        &config,
                        "chat_template",
                        "expected a string or a list of named templates",
                    ))
                }
            }
        }
        Err(TokenizeError::NoChatTemplate {
            dir: dir.to_path_buf(),
        })
    }

    fn compile(source: String, source_path: Option<PathBuf>) -> Result<Self> {
        if source.len() > TEMPLATE_SOURCE_MAX {
            return Err(TokenizeError::Template {
                name: TEMPLATE_NAME.into(),
                message: format!(
                    "the template has {} bytes, more than {TEMPLATE_SOURCE_MAX}",
                    source.len()
                ),
            });
        }
        let mut env = environment();
        let name = source_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| TEMPLATE_NAME.to_string());
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| TokenizeError::template(&name, &e))?;
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

    /// The template's source text.
    pub(crate) fn source(&self) -> String {
        self.env
            .get_template(TEMPLATE_NAME)
            .map_or_else(|_| String::new(), |t| t.source().to_string())
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
        let messages =
            serde_json::to_value(messages).map_err(|source| TokenizeError::Serialize {
                what: "messages".into(),
                source,
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
            .map_err(|e| TokenizeError::template(&name, &e))?;
        let mut out = CappedWriter(Vec::new());
        template
            .render_captured_to(Value::from_serialize(&ctx), &mut out)
            .map_err(|e| match out.0.len() >= TEMPLATE_OUTPUT_MAX {
                true => TokenizeError::Template {
                    name: name.clone(),
                    message: format!("the rendered prompt exceeds {TEMPLATE_OUTPUT_MAX} bytes"),
                },
                false => TokenizeError::template(&name, &e),
            })?;
        String::from_utf8(out.0).map_err(|e| TokenizeError::Template {
            name,
            message: format!("the rendered prompt is not UTF-8: {e}"),
        })
    }
}

/// Collects a render, refusing to grow past `TEMPLATE_OUTPUT_MAX` bytes.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > TEMPLATE_OUTPUT_MAX {
            self.0.resize(TEMPLATE_OUTPUT_MAX, 0);
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod limits {
    use super::*;

    fn render(source: &str) -> Result<String> {
        ChatTemplate::new(source)?.render(&[Message::user("hi")], &RenderOptions::default())
    }

    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel() {
        let err = render(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("fuel"), "{err}");
    }

    #[test]
    fn the_fuel_covers_a_long_conversation_with_the_real_template() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
        let template = ChatTemplate::from_dir(dir).unwrap();
        let messages: Vec<Message> = (0..2000)
            .map(|i| match i % 2 {
                0 => Message::user(format!("question {i}")),
                _ => Message::assistant(format!("answer {i}")),
            })
            .collect();
        let text = template
            .render(&messages, &RenderOptions::default())
            .unwrap();
        assert!(text.contains("answer 1999"));
    }

    #[test]
    fn output_past_the_cap_is_an_error() {
        let err = render("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds 67108864 bytes"), "{err}");
    }

    #[test]
    fn oversized_and_special_template_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("chat_template.jinja");
        std::fs::write(&big, "x".repeat(TEMPLATE_SOURCE_MAX + 1)).unwrap();
        let err = ChatTemplate::from_file(&big).unwrap_err().to_string();
        assert!(
            err.contains("larger than the 4194304-byte cap") && err.contains("chat_template.jinja"),
            "{err}"
        );
        #[cfg(unix)]
        {
            let link = dir.path().join("zero.jinja");
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            let err = ChatTemplate::from_file(&link).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
        assert!(ChatTemplate::new("x".repeat(TEMPLATE_SOURCE_MAX + 1)).is_err());
    }
}
