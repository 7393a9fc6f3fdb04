//! The endpoints' shared state, the router with its guard (metrics, time limit, panics), and
//! the body reader.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;

use super::{AdmissionRequest, ApiError, admit, convert, parse_admission};
use crate::api::Version;
use crate::health::{self, Readiness};
use crate::metrics::{AdmissionLabels, EndpointLabel, Metrics, StatusLabel};

/// Default per-request time limit.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(9);

pub(crate) fn operation_label(op: &kube::core::admission::Operation) -> &'static str {
    use kube::core::admission::Operation;
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Default cap on admission bodies: the apiserver can send object and oldObject of ~3 MiB each.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Default cap on conversion bodies: a LIST in an old version is one ConversionReview holding
/// every object (5,000 EtcdClusters are about 11 MB).
pub const DEFAULT_MAX_CONVERT_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub max_body_bytes: usize,
    pub max_convert_body_bytes: usize,
    /// Longest a request may take; below the apiserver's default 10 s webhook timeout.
    pub request_timeout: Duration,
    /// Answers `/readyz` on the TLS port too.
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    /// What the decisions read besides the request (`--default-storage-class`, the cluster's
    /// StorageClasses).
    pub settings: crate::admission::Settings,
}

impl AppState {
    /// The defaults of the serve flags.
    pub fn new(readiness: Arc<Readiness>, metrics: Arc<Metrics>) -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_convert_body_bytes: DEFAULT_MAX_CONVERT_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            readiness,
            metrics,
            settings: crate::admission::Settings::default(),
        }
    }

    /// Reads and decodes the AdmissionReview of a request to `endpoint`; a failure is counted
    /// as an error.
    pub async fn admission_request(
        &self,
        endpoint: &'static str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<AdmissionRequest, ApiError> {
        let decoded = read_body(headers, body, self.max_body_bytes)
            .await
            .and_then(|b| parse_admission(&b));
        decoded.inspect_err(|_| self.count_admission(endpoint, None, "error"))
    }

    /// Counts an admission answer.
    pub fn count_admission(
        &self,
        endpoint: &'static str,
        req: Option<&AdmissionRequest>,
        result: &'static str,
    ) {
        let span = tracing::Span::current();
        span.record("admission.result", result);
        if let Some(r) = req {
            span.record("admission.uid", r.uid.as_str());
        }
        let (operation, version) = match req {
            Some(r) => (
                operation_label(&r.operation),
                Version::from_version(&r.kind.version)
                    .map(Version::as_str)
                    .unwrap_or("other"),
            ),
            None => ("unknown", "unknown"),
        };
        self.metrics
            .admission_requests
            .get_or_create(&AdmissionLabels {
                endpoint,
                operation,
                version,
                result,
            })
            .inc();
    }
}

/// The webhook routes with what is around every request. The apiserver appends
/// `?timeout=10s`; routing looks at the path only.
pub fn router(state: Arc<AppState>) -> Router {
    layered(routes(state.clone()), state)
}

/// `/mutate`, `/validate`, `/convert`, `/healthz` and `/readyz`, with nothing around them.
pub fn routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(admit::mutate))
        .route("/validate", post(admit::validate))
        .route("/convert", post(convert::handle))
        .with_state(state.clone())
        .merge(health::probes(state.readiness.clone()))
}

/// `routes` with the answers for unknown paths and methods, panic isolation (tower-http's
/// `CatchPanicLayer`: a panic answers 500 with a Status for that request only, counted and
/// logged) and the per-request guard (metrics, time limit) around every route.
///
/// The time limit and the body limit are not tower-http's `TimeoutLayer` and
/// `RequestBodyLimitLayer`: those answer 408 with an empty body and 413 with plain text, where
/// the apiserver shows a `metav1.Status` message, and the body limit differs per endpoint
/// (`--max-body-bytes`, `--max-convert-body-bytes`) and comes after the Content-Type check
/// (see [`read_body`]). Mapping their answers back would be more code than the guard.
pub fn layered(routes: Router, state: Arc<AppState>) -> Router {
    let metrics = state.metrics.clone();
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            move |panic: Box<dyn std::any::Any + Send>| {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown panic");
                tracing::error!(
                    panic = what,
                    "panic while answering a request; answered 500"
                );
                metrics.panics.inc();
                ApiError::Internal(format!("panic while answering the request: {what}"))
                    .into_response()
            },
        ))
        .layer(axum::middleware::from_fn_with_state(state, guard))
}

fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/mutate" => "mutate",
        "/validate" => "validate",
        "/convert" => "convert",
        _ => "other",
    }
}

/// Around every request: in-flight and latency metrics, body size, the per-request time limit
/// and HTTP error counts (a panic, turned into a 500 inside it, counts as one).
async fn guard(
    State(state): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let endpoint = endpoint_label(req.uri().path());
    let labels = EndpointLabel { endpoint };
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
    {
        state
            .metrics
            .request_body_bytes
            .get_or_create(&labels)
            .observe(len);
    }
    let in_flight = state
        .metrics
        .requests_in_flight
        .get_or_create_owned(&labels);
    in_flight.inc();
    let start = std::time::Instant::now();
    let http1 = req.version() == axum::http::Version::HTTP_11;
    let span = crate::otel::request_span(req.method(), req.uri().path(), req.headers());
    let answer = tracing::Instrument::instrument(next.run(req), span.clone());
    let mut response = match tokio::time::timeout(state.request_timeout, answer).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(endpoint, timeout = ?state.request_timeout, "request timed out");
            ApiError::Timeout(state.request_timeout).into_response()
        }
    };
    in_flight.dec();
    state
        .metrics
        .request_duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_client_error() || status.is_server_error() {
        state
            .metrics
            .http_errors
            .get_or_create(&StatusLabel {
                status: status.as_u16(),
            })
            .inc();
    }
    // Once readiness is off, every HTTP/1.1 answer closes its connection (hyper ends it after
    // the response): a client's pooled connections to this replica end at a request boundary
    // during --shutdown-delay, instead of at the drain, where a request sent on an idle
    // connection as it closes fails (the apiserver does not retry a POST).
    if http1 && state.readiness.shutting_down() {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Reads a review body: JSON only, at most `limit` bytes (checked on Content-Length first, then
/// while reading, so an oversized body is never buffered whole).
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_json = content_type.as_deref().is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !is_json {
        return Err(ApiError::UnsupportedMediaType(
            content_type.unwrap_or_else(|| "nothing".to_owned()),
        ));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    // Frames are kept as they arrive and joined once at the end: no growing buffer that
    // reallocates, and a body refused at the limit never becomes one large allocation.
    let mut frames = Vec::new();
    let mut len = 0usize;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::BadRequest(format!("cannot read request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > limit {
                return Err(ApiError::PayloadTooLarge(limit));
            }
            frames.push(data);
        }
    }
    Ok(match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap_or_default(),
        _ => {
            let mut buf = Vec::with_capacity(len);
            frames.iter().for_each(|f| buf.extend_from_slice(f));
            Bytes::from(buf)
        }
    })
}
