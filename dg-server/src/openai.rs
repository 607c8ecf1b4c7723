//! The OpenAI routes: `POST /v1/chat/completions` and `POST /v1/completions`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use dg_engine::{FinishReason, Generation, Image, Message, Request};
use dg_tokenize::{Content, ContentPart};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generate::{self, data, Frames, Parsed};
use crate::images;
use crate::metrics::Endpoint;
use crate::params::{self, Common, Diffusion, Stop};
use crate::state::Server;

#[derive(Deserialize, Debug, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize, Debug)]
struct ChatRequest {
    messages: Vec<Map<String, Value>>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u64>,
    #[serde(flatten)]
    diffusion: Diffusion,
}

#[derive(Deserialize, Debug)]
struct CompletionRequest {
    prompt: Value,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    best_of: Option<u64>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(flatten)]
    diffusion: Diffusion,
}

/// The OpenAI finish reason. A generation cancelled by a shutdown ends with `"cancelled"`
/// (not an OpenAI value; clients parse it as a string).
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::StopSequence => "stop",
        FinishReason::Length => "length",
        _ => "cancelled",
    }
}

fn usage(g: &Generation) -> Value {
    let (prompt, completion) = (g.stats.prompt_tokens, g.stats.generated_tokens);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// The tokenizer, to spell out tokens in log-probability reports.
#[derive(Clone)]
struct TokenText(std::sync::Arc<dg_engine::DiffusionGemma>);

impl TokenText {
    fn of(server: &Server) -> Option<Self> {
        server.scheduler().map(|s| TokenText(s.model().clone()))
    }

    fn text(&self, id: u32) -> String {
        self.0.tokenizer().decode(&[id], false).unwrap_or_default()
    }
}

/// OpenAI's `logprobs` object of a choice (chat: `content[]`; completions: the legacy parallel
/// arrays), or null when the request did not ask for it.
fn logprobs_json(route: Route, tokens: Option<&TokenText>, g: &Generation) -> Value {
    let (Some(tokens), Some(logprobs)) = (tokens, g.logprobs.as_ref()) else {
        return Value::Null;
    };
    let texts: Vec<String> = g.token_ids.iter().map(|&id| tokens.text(id)).collect();
    match route {
        Route::Chat => json!({
            "content": texts.iter().zip(logprobs).map(|(t, lp)| json!({
                "token": t,
                "logprob": lp,
                "bytes": t.as_bytes(),
                "top_logprobs": [],
            })).collect::<Vec<_>>(),
            "refusal": null,
        }),
        Route::Completion => {
            let mut offset = 0;
            let offsets: Vec<usize> = texts
                .iter()
                .map(|t| {
                    let at = offset;
                    offset += t.len();
                    at
                })
                .collect();
            json!({
                "tokens": texts,
                "token_logprobs": logprobs,
                "top_logprobs": null,
                "text_offset": offsets,
            })
        }
    }
}

fn check_n(n: Option<u64>, param: &str) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(_) => Err(params::unsupported(param, "more than one choice")),
    }
}

/// A content part's text, or an image (pushed to `images`).
fn chat_part(
    part: &Value,
    param: &str,
    images: &mut Vec<Image>,
    max_image_bytes: usize,
) -> Result<ContentPart, ApiError> {
    let kind = part
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{param}.type"), "a content part needs a type"))?;
    match kind {
        "text" => {
            let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!("{param}.text"), "a text part needs a string text")
            })?;
            Ok(ContentPart::text(text))
        }
        "image_url" => {
            let param = format!("{param}.image_url");
            let url = match part.get("image_url") {
                Some(Value::String(url)) => url.as_str(),
                Some(Value::Object(o)) => {
                    o.get("url").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid(format!("{param}.url"), "image_url needs a string url")
                    })?
                }
                _ => {
                    return Err(ApiError::invalid(
                        param,
                        "an image_url part needs {\"url\": \"data:...\"}",
                    ))
                }
            };
            images.push(images::decode_url(url, &param, max_image_bytes)?);
            Ok(ContentPart::image())
        }
        other => Err(ApiError::invalid(
            format!("{param}.type"),
            format!("content parts of type {other:?} are not supported (text and image_url are)"),
        )),
    }
}

/// The chat messages as the template reads them, and their images in order.
fn chat_messages(
    messages: Vec<Map<String, Value>>,
    max_image_bytes: usize,
) -> Result<(Vec<Message>, Vec<Image>), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "at least one message is needed",
        ));
    }
    let mut images = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, mut m) in messages.into_iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let role = match m.remove("role") {
            Some(Value::String(role)) => role,
            _ => {
                return Err(ApiError::invalid(
                    at("role"),
                    "a message needs a string role",
                ))
            }
        };
        if !matches!(
            role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::invalid(
                at("role"),
                format!("unknown role {role:?} (system, developer, user, assistant, tool)"),
            ));
        }
        let content = match m.remove("content") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(Content::Text(text)),
            Some(Value::Array(parts)) => {
                let parts = parts
                    .iter()
                    .enumerate()
                    .map(|(j, part)| {
                        chat_part(
                            part,
                            &format!("messages[{i}].content[{j}]"),
                            &mut images,
                            max_image_bytes,
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some(if parts.iter().all(|p| p.kind == "text") {
                    // Text-only parts: one string, as every template reads it.
                    Content::Text(parts.into_iter().filter_map(|p| p.text).collect())
                } else {
                    Content::Parts(parts)
                })
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    at("content"),
                    "content must be a string or a list of parts",
                ))
            }
        };
        out.push(Message {
            role,
            content,
            extra: m,
        });
    }
    Ok((out, images))
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(server): State<Server>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let parsed = (|| {
        let body = params::body(body)?;
        let req: ChatRequest = params::parse_json(&body)?;
        check_n(req.n, "n")?;
        if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(params::unsupported("tools", "tool calling"));
        }
        let logprobs = req.logprobs == Some(true);
        match req.top_logprobs {
            Some(k) if k > 0 && !logprobs => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
            Some(k) if k > 0 => {
                return Err(params::unsupported(
                    "top_logprobs",
                    "alternatives to the generated tokens (logprobs: true reports the \
                     generated tokens' own log probabilities)",
                ))
            }
            _ => {}
        }
        let (messages, images) = chat_messages(req.messages, server.options().max_image_bytes)?;
        let mut request = Request::chat(messages).logprobs(logprobs);
        request.images = images;
        let max_tokens = req.max_completion_tokens.or(req.max_tokens);
        let common = (max_tokens, req.temperature, req.seed, req.stop);
        parsed(
            &server,
            request,
            common,
            req.stream,
            req.stream_options,
            req.diffusion,
        )
    })();
    respond(&server, Route::Chat, parsed).await
}

/// The options both OpenAI routes share, applied to `request`.
fn parsed(
    server: &Server,
    mut request: Request,
    (max_tokens, temperature, seed, stop): (Option<usize>, Option<f32>, Option<u64>, Option<Stop>),
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    diffusion: Diffusion,
) -> Result<Parsed, ApiError> {
    diffusion.apply(&mut request)?;
    Common {
        max_tokens,
        temperature,
        seed,
        stop: stop.map(Stop::into_vec).unwrap_or_default(),
    }
    .apply(&mut request, server.options().default_max_tokens);
    Ok(Parsed {
        request,
        streaming: stream.unwrap_or(false),
        drafts: diffusion.drafts.unwrap_or(false),
        include_usage: stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

/// Answers an OpenAI route: streamed in [`OpenAiFrames`], or whole as a `chat.completion`
/// (the text in `message`) or a `text_completion` (the text in `text`).
async fn respond(
    server: &Server,
    route: Route,
    parsed: Result<Parsed, ApiError>,
) -> Result<Response, ApiError> {
    let frames = OpenAiFrames::new(server, route);
    let (id, created, model) = (frames.id.clone(), frames.created, frames.model.clone());
    let tokens = TokenText::of(server);
    let (endpoint, object, text_key) = match route {
        Route::Chat => (Endpoint::ChatCompletions, "chat.completion", "message"),
        Route::Completion => (Endpoint::Completions, "text_completion", "text"),
    };
    generate::respond(
        server,
        endpoint,
        parsed,
        |p| frames.usage(p.include_usage),
        |g| {
            let text = match route {
                Route::Chat => json!({ "role": "assistant", "content": g.text, "refusal": null }),
                Route::Completion => json!(g.text),
            };
            json!({
                "id": id,
                "object": object,
                "created": created,
                "model": model,
                "choices": [{
                    "index": 0,
                    text_key: text,
                    "logprobs": logprobs_json(route, tokens.as_ref(), g),
                    "finish_reason": finish_reason(g.finish_reason),
                }],
                "usage": usage(g),
                "system_fingerprint": null,
            })
        },
    )
    .await
}

#[derive(Clone, Copy, PartialEq)]
enum Route {
    Chat,
    Completion,
}

/// The stream framing of both OpenAI routes.
struct OpenAiFrames {
    route: Route,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    tokens: Option<TokenText>,
}

impl OpenAiFrames {
    fn new(server: &Server, route: Route) -> Self {
        OpenAiFrames {
            route,
            id: params::new_id(match route {
                Route::Chat => "chatcmpl-",
                Route::Completion => "cmpl-",
            }),
            created: params::now(),
            model: server.options().model_name.clone(),
            include_usage: false,
            tokens: TokenText::of(server),
        }
    }

    fn usage(self, include_usage: bool) -> Self {
        OpenAiFrames {
            include_usage,
            ..self
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let object = match self.route {
            Route::Chat => "chat.completion.chunk",
            Route::Completion => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        chunk
    }

    /// A chunk of one choice: a chat `delta` or a completion's `text`.
    fn choice(&self, delta: Value, text: &str, finish: Option<&str>) -> Value {
        let mut choice = json!({ "index": 0, "logprobs": null, "finish_reason": finish });
        match self.route {
            Route::Chat => choice["delta"] = delta,
            Route::Completion => choice["text"] = json!(text),
        }
        self.chunk(json!([choice]), None)
    }
}

impl Frames for OpenAiFrames {
    fn open(&mut self, _prompt_tokens: Option<usize>, out: &mut String) {
        if self.route == Route::Chat {
            let role = json!({ "role": "assistant", "content": "" });
            data(out, &self.choice(role, "", None));
        }
    }

    fn text(&mut self, delta: &str, out: &mut String) {
        data(out, &self.choice(json!({ "content": delta }), delta, None));
    }

    fn finish(&mut self, g: &Generation, out: &mut String) {
        let finish = Some(finish_reason(g.finish_reason));
        let mut last = self.choice(json!({}), "", finish);
        // The text chunks follow the detokenizer, not token boundaries: the final chunk
        // carries the log probabilities of every generated token.
        last["choices"][0]["logprobs"] = logprobs_json(self.route, self.tokens.as_ref(), g);
        data(out, &last);
        if self.include_usage {
            data(out, &self.chunk(json!([]), Some(usage(g))));
        }
        out.push_str("data: [DONE]\n\n");
    }

    fn fail(&mut self, error: &ApiError, out: &mut String) {
        data(out, &error.body());
        out.push_str("data: [DONE]\n\n");
    }
}

/// The prompt of a completion request: a string, or token ids (one prompt only).
fn completion_prompt(prompt: Value) -> Result<Request, ApiError> {
    let one = "one prompt per request: send a string or a list of token ids";
    match prompt {
        Value::String(text) => Ok(Request::text(text)),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::invalid("prompt", "the prompt is empty"))
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let ids = items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| {
                            ApiError::invalid(
                                format!("prompt[{i}]"),
                                format!("{v} is not a token id"),
                            )
                        })
                })
                .collect::<Result<Vec<u32>, _>>()?;
            Ok(Request::tokens(ids))
        }
        Value::Array(mut items) if items.len() == 1 => completion_prompt(items.remove(0)),
        Value::Array(_) => Err(ApiError::invalid("prompt", one)),
        _ => Err(ApiError::invalid("prompt", one)),
    }
}

/// `POST /v1/completions`: a raw prompt, not chat-templated.
pub(crate) async fn completions(
    State(server): State<Server>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let parsed =
        (|| {
            let body = params::body(body)?;
            let req: CompletionRequest = params::parse_json(&body)?;
            check_n(req.n, "n")?;
            check_n(req.best_of, "best_of")?;
            if req.echo == Some(true) {
                return Err(params::unsupported("echo", "echoing the prompt"));
            }
            if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
                return Err(params::unsupported("suffix", "a suffix"));
            }
            // The legacy `logprobs: k` asks for the k most likely alternatives too: 0 is the
            // generated tokens alone, which is what dg reports.
            let logprobs =
                match &req.logprobs {
                    None | Some(Value::Null) => false,
                    Some(v) if v.as_u64() == Some(0) => true,
                    Some(v) if v.as_u64().is_some() => return Err(params::unsupported(
                        "logprobs",
                        "alternatives to the generated tokens (logprobs: 0 reports the generated \
                     tokens' own log probabilities)",
                    )),
                    Some(_) => return Err(ApiError::invalid(
                        "logprobs",
                        "logprobs must be an integer (0: the generated tokens' log probabilities)",
                    )),
                };
            let request = completion_prompt(req.prompt)?.logprobs(logprobs);
            let common = (req.max_tokens, req.temperature, req.seed, req.stop);
            parsed(
                &server,
                request,
                common,
                req.stream,
                req.stream_options,
                req.diffusion,
            )
        })();
    respond(&server, Route::Completion, parsed).await
}
