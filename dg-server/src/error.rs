//! The one error type of the server: an HTTP status, a message and the request field at fault,
//! written as an OpenAI error body (`{"error": {"message", "type", "param", "code"}}`) or, on the
//! Anthropic route, as an Anthropic one (`{"type": "error", "error": {"type", "message"}}`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dg_engine::EngineError;
use serde_json::{json, Value};

/// Which API's error shape a response takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error": {"message", "type", "param", "code"}}`.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

/// An error answered to a client.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// HTTP status of the response.
    pub status: StatusCode,
    /// Human-readable message (the body's `message`).
    pub message: String,
    /// The request field at fault (`messages[0].content`, `max_tokens`, ...).
    pub param: Option<String>,
    /// A machine-readable code (`request_too_large`, `rate_limit_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Which API's error shape the body takes.
    pub flavor: Flavor,
}

impl ApiError {
    /// An error with this status and message, no param or code, in the OpenAI shape.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            flavor: Flavor::OpenAi,
        }
    }

    /// 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message).param(param)
    }

    /// 413 naming the field at fault (or none for the whole body).
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message).code("request_too_large")
    }

    /// 503: the model is still loading or the server is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message).code("service_unavailable")
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message).code("internal_error")
    }

    /// Names the request field at fault.
    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The same error in the Anthropic shape.
    pub fn anthropic(mut self) -> Self {
        self.flavor = Flavor::Anthropic;
        self
    }

    /// The OpenAI `type` of this status.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The Anthropic `type` of this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The error body in this error's flavor.
    pub fn body(&self) -> Value {
        match self.flavor {
            Flavor::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.openai_type(),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Flavor::Anthropic => {
                let message = match &self.param {
                    Some(p) if !self.message.starts_with(p.as_str()) => {
                        format!("{p}: {}", self.message)
                    }
                    _ => self.message.clone(),
                };
                json!({
                    "type": "error",
                    "error": { "type": self.anthropic_type(), "message": message }
                })
            }
        }
    }

    /// Whether the client is at fault (4xx other than 429).
    pub fn is_client_error(&self) -> bool {
        self.status.is_client_error() && self.status != StatusCode::TOO_MANY_REQUESTS
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} ({p}): {}", self.status.as_u16(), self.message),
            None => write!(f, "{}: {}", self.status.as_u16(), self.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body().to_string(),
        )
            .into_response();
        if matches!(self.status.as_u16(), 429 | 503) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::InvalidArgument { name, .. } | EngineError::Shape { name, .. } => {
                ApiError::invalid(name, message)
            }
            EngineError::Tokenize(_) => ApiError::new(StatusCode::BAD_REQUEST, message),
            EngineError::Vision(vision_error) => vision(vision_error, message),
            EngineError::Request { source, .. } => ApiError::from(*source),
            EngineError::Overloaded { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, message).code("rate_limit_exceeded")
            }
            EngineError::ShuttingDown => ApiError::unavailable(message),
            _ => ApiError::internal(message),
        }
    }
}

/// Images the client sent: too large is 413, anything else about them is 400.
fn vision(e: dg_vision::VisionError, message: String) -> ApiError {
    match e {
        dg_vision::VisionError::TooLarge { .. } => ApiError::too_large(message).param("images"),
        _ => ApiError::new(StatusCode::BAD_REQUEST, message).param("images"),
    }
}
