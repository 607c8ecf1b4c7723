//! The Anthropic route: `POST /v1/messages` (the Messages API), with its error bodies and its
//! stream's event sequence: `message_start`, `content_block_start`, `ping`,
//! `content_block_delta`s (`text_delta`), `content_block_stop`, `message_delta` (stop reason and
//! usage), `message_stop`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use dg_engine::{FinishReason, Generation, Image, Message, Request};
use dg_tokenize::{Content, ContentPart};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generate::{self, named, Frames, Parsed};
use crate::images;
use crate::metrics::Endpoint;
use crate::params::{self, Common, Diffusion};
use crate::state::Server;

#[derive(Deserialize, Debug)]
struct MessagesRequest {
    messages: Vec<AnthropicMessage>,
    max_tokens: usize,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    /// Not an Anthropic field: the seed of the random generator (0 if absent).
    #[serde(default)]
    seed: Option<u64>,
    #[serde(flatten)]
    diffusion: Diffusion,
}

#[derive(Deserialize, Debug)]
struct AnthropicMessage {
    role: String,
    content: Value,
}

/// The Anthropic stop reason. A generation cancelled by a shutdown ends with `"cancelled"`
/// (not an Anthropic value; clients parse it as a string).
fn stop_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "end_turn",
        FinishReason::StopSequence => "stop_sequence",
        FinishReason::Length => "max_tokens",
        _ => "cancelled",
    }
}

/// One content block: text, or an image (pushed to `images`).
fn block(
    block: &Value,
    param: &str,
    images: &mut Vec<Image>,
    max_image_bytes: usize,
) -> Result<ContentPart, ApiError> {
    let kind = block.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(format!("{param}.type"), "a content block needs a type")
    })?;
    match kind {
        "text" => {
            let text = block.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!("{param}.text"), "a text block needs a string text")
            })?;
            Ok(ContentPart::text(text))
        }
        "image" => {
            let param = format!("{param}.source");
            let source = block
                .get("source")
                .ok_or_else(|| ApiError::invalid(param.clone(), "an image block needs a source"))?;
            match source.get("type").and_then(Value::as_str) {
                Some("base64") => {
                    let data = source.get("data").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid(format!("{param}.data"), "a base64 source needs data")
                    })?;
                    images.push(images::decode_base64(
                        data,
                        &format!("{param}.data"),
                        max_image_bytes,
                    )?);
                }
                Some("url") => {
                    let url = source
                        .get("url")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    images.push(images::decode_url(
                        url,
                        &format!("{param}.url"),
                        max_image_bytes,
                    )?);
                }
                _ => {
                    return Err(ApiError::invalid(
                        format!("{param}.type"),
                        "image sources of type base64 are supported (the server fetches nothing)",
                    ))
                }
            }
            Ok(ContentPart::image())
        }
        other => Err(ApiError::invalid(
            format!("{param}.type"),
            format!("content blocks of type {other:?} are not supported (text and image are)"),
        )),
    }
}

/// A string or a list of blocks, as template content.
fn content(
    value: &Value,
    param: &str,
    images: &mut Vec<Image>,
    max_image_bytes: usize,
) -> Result<Content, ApiError> {
    match value {
        Value::String(text) => Ok(Content::Text(text.clone())),
        Value::Array(blocks) => {
            let parts = blocks
                .iter()
                .enumerate()
                .map(|(j, b)| block(b, &format!("{param}[{j}]"), images, max_image_bytes))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(if parts.iter().all(|p| p.kind == "text") {
                Content::Text(parts.into_iter().filter_map(|p| p.text).collect())
            } else {
                Content::Parts(parts)
            })
        }
        _ => Err(ApiError::invalid(
            param,
            "content must be a string or a list of content blocks",
        )),
    }
}

fn messages(req: &MessagesRequest, max_image_bytes: usize) -> Result<Request, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "at least one message is needed",
        ));
    }
    let mut images = Vec::new();
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    match &req.system {
        None | Some(Value::Null) => {}
        Some(system @ (Value::String(_) | Value::Array(_))) => {
            let system = content(system, "system", &mut images, max_image_bytes)?;
            if !images.is_empty() {
                return Err(ApiError::invalid(
                    "system",
                    "the system prompt takes text only",
                ));
            }
            out.push(Message::system(system));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "system",
                "system must be a string or a list of text blocks",
            ))
        }
    }
    for (i, m) in req.messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "user" | "assistant") {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("unknown role {:?} (user, assistant)", m.role),
            ));
        }
        let content = content(
            &m.content,
            &format!("messages[{i}].content"),
            &mut images,
            max_image_bytes,
        )?;
        out.push(Message::new(m.role.clone(), content));
    }
    let mut request = Request::chat(out);
    request.images = images;
    Ok(request)
}

/// `POST /v1/messages`.
pub(crate) async fn messages_route(
    State(server): State<Server>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    run(server, body).await.map_err(ApiError::anthropic)
}

async fn run(server: Server, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let parsed = (|| {
        let body = params::body(body)?;
        let req: MessagesRequest = params::parse_json(&body)?;
        if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(params::unsupported("tools", "tool use"));
        }
        let mut request = messages(&req, server.options().max_image_bytes)?;
        req.diffusion.apply(&mut request)?;
        Common {
            max_tokens: Some(req.max_tokens),
            temperature: req.temperature,
            seed: req.seed,
            stop: req.stop_sequences.unwrap_or_default(),
        }
        .apply(&mut request, server.options().default_max_tokens);
        Ok(Parsed {
            request,
            streaming: req.stream.unwrap_or(false),
            drafts: req.diffusion.drafts.unwrap_or(false),
            include_usage: false,
        })
    })();
    let id = params::new_id("msg_");
    let model = server.options().model_name.clone();
    let frames = MessageFrames {
        id: id.clone(),
        model: model.clone(),
        input_tokens: 0,
    };
    generate::respond(
        &server,
        Endpoint::Messages,
        parsed,
        |_| frames,
        |g| {
            json!({
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{ "type": "text", "text": g.text }],
                "stop_reason": stop_reason(g.finish_reason),
                "stop_sequence": g.stop_sequence,
                "usage": {
                    "input_tokens": g.stats.prompt_tokens,
                    "output_tokens": g.stats.generated_tokens,
                },
            })
        },
    )
    .await
}

struct MessageFrames {
    id: String,
    model: String,
    input_tokens: usize,
}

impl Frames for MessageFrames {
    fn open(&mut self, prompt_tokens: Option<usize>, out: &mut String) {
        self.input_tokens = prompt_tokens.unwrap_or(0);
        named(
            out,
            "message_start",
            &json!({
                "type": "message_start",
                "message": {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": { "input_tokens": self.input_tokens, "output_tokens": 0 },
                },
            }),
        );
        named(
            out,
            "content_block_start",
            &json!({
                "type": "content_block_start",
                "index": 0,
                "content_block": { "type": "text", "text": "" },
            }),
        );
        named(out, "ping", &json!({ "type": "ping" }));
    }

    fn text(&mut self, delta: &str, out: &mut String) {
        named(
            out,
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": { "type": "text_delta", "text": delta },
            }),
        );
    }

    fn finish(&mut self, g: &Generation, out: &mut String) {
        named(
            out,
            "content_block_stop",
            &json!({ "type": "content_block_stop", "index": 0 }),
        );
        named(
            out,
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {
                    "stop_reason": stop_reason(g.finish_reason),
                    "stop_sequence": g.stop_sequence,
                },
                "usage": {
                    "input_tokens": g.stats.prompt_tokens,
                    "output_tokens": g.stats.generated_tokens,
                },
            }),
        );
        named(out, "message_stop", &json!({ "type": "message_stop" }));
    }

    fn fail(&mut self, error: &ApiError, out: &mut String) {
        named(out, "error", &error.clone().anthropic().body());
    }
}
