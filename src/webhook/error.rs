//! The answers that are not reviews: every HTTP-level failure as the `metav1.Status` the
//! apiserver shows, and the JSON encoding of every answer.

use std::time::Duration;

#[cfg(feature = "server")]
use axum::http::{HeaderValue, header};
#[cfg(feature = "server")]
use axum::response::{IntoResponse, Response};
use http::StatusCode;
#[cfg(feature = "server")]
use serde::Serialize;
#[cfg(feature = "server")]
use serde_json::Value;

/// An HTTP-level failure: the request was not a review we can answer. Encoded as a
/// `metav1.Status`, whose message the apiserver shows.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("Content-Type must be application/json, got {0}")]
    UnsupportedMediaType(String),
    #[error(
        "request body exceeds {0} bytes (--max-body-bytes, or --max-convert-body-bytes for /convert)"
    )]
    PayloadTooLarge(usize),
    #[error("not found: the webhook paths are /mutate, /validate and /convert")]
    NotFound,
    #[error("method not allowed: reviews are sent with POST")]
    MethodNotAllowed,
    #[error("internal error: {0}")]
    Internal(String),
    #[error("request took longer than {0:?} (--request-timeout)")]
    Timeout(Duration),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

#[cfg(feature = "server")]
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A client's malformed, oversized or mistyped request is answered and logged once
        // (the body never is); unknown paths and methods only at debug.
        match &self {
            ApiError::BadRequest(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::PayloadTooLarge(_) => {
                tracing::warn!(code = status.as_u16(), error = %self, "request refused")
            }
            ApiError::NotFound | ApiError::MethodNotAllowed => {
                tracing::debug!(code = status.as_u16(), error = %self, "request refused")
            }
            ApiError::Internal(_) | ApiError::Timeout(_) => {}
        }
        let reason = match self {
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::PayloadTooLarge(_) => "RequestEntityTooLarge",
            ApiError::NotFound => "NotFound",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::Internal(_) => "InternalError",
            ApiError::Timeout(_) => "Timeout",
        };
        let body =
            kube::core::Status::failure(&self.to_string(), reason).with_code(status.as_u16());
        let mut value = serde_json::to_value(&body).unwrap_or(Value::Null);
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), "v1".into());
            map.insert("kind".into(), "Status".into());
        }
        let mut response = (status, json_bytes(&value)).into_response();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is not read, so the connection cannot be reused: say so
            // rather than let the client find out on its next request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// A 200 response with a JSON body.
#[cfg(feature = "server")]
pub fn json_response<T: Serialize>(body: &T) -> Response {
    (StatusCode::OK, json_bytes(body)).into_response()
}

#[cfg(feature = "server")]
fn json_bytes<T: Serialize>(body: &T) -> ([(header::HeaderName, HeaderValue); 1], Vec<u8>) {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|e| {
        format!(r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"cannot encode response: {e}","code":500}}"#).into_bytes()
    });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
}
