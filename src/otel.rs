//! Traces: the spans a webhook request and a reconcile pass open, exported over OTLP when
//! `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) is set (`app::logging` installs the
//! exporter). Their target is [`TARGET`], which the log output never shows: with no exporter no
//! layer wants them, so the macros below are skipped at their call sites (one cached check)
//! and cost nothing.

use axum::http::{HeaderMap, Method};
use opentelemetry::propagation::Extractor;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every span meant for the trace exporter.
pub const TARGET: &str = "etcd_webhook::otel";

/// A request's headers as the W3C trace-context propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The server span of one webhook request (`POST /validate`), continuing the trace whose
/// `traceparent` the apiserver sent; `http.response.status_code` and `admission.result` are
/// recorded as the answer is made.
pub fn request_span(method: &Method, path: &str, headers: &HeaderMap) -> tracing::Span {
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %format_args!("{method} {path}"),
        otel.kind = "server",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
        admission.result = tracing::field::Empty,
        admission.uid = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
        let _ = span.set_parent(parent);
    }
    span
}

/// The span of one reconcile pass of one cluster (a trace of its own: a pass has no caller).
pub fn pass_span(namespace: &str, name: &str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "reconcile",
        otel.kind = "internal",
        k8s.namespace.name = %namespace,
        etcdcluster.name = %name,
        result = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_exporter_the_spans_are_not_made() {
        // No subscriber wants the target: the span is disabled and reads no header.
        let headers = HeaderMap::new();
        assert!(request_span(&Method::POST, "/validate", &headers).is_disabled());
        assert!(pass_span("prod", "etcd").is_disabled());
    }
}
