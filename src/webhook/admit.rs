//! `POST /mutate` and `POST /validate`: decode the AdmissionReview, ask
//! [`admission::review`], count, log and encode the answer.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::{AdmissionRequest, AdmissionReviewOut, Answer, ApiError, AppState, json_response};
use crate::admission::{self, Webhook};

pub async fn mutate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    answer(&state, Webhook::Mutate, &headers, body).await
}

pub async fn validate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    answer(&state, Webhook::Validate, &headers, body).await
}

async fn answer(
    state: &AppState,
    webhook: Webhook,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let endpoint = webhook.name();
    let req = state.admission_request(endpoint, headers, body).await?;
    // The one look outside the request: a credentials Secret, only where S3 starts being used.
    let missing = match (webhook, &state.settings.secrets) {
        (Webhook::Validate, Some(secrets)) if secrets.can_look() => {
            match admission::credentials::to_check(&req) {
                Some(check) => (secrets.exists(&check.namespace, &check.secret).await
                    == Some(false))
                .then(|| check.warning()),
                None => None,
            }
        }
        _ => None,
    };
    match admission::review(webhook, &req, &state.settings) {
        Ok(mut answer) => {
            answer.warnings.extend(missing);
            let result = if answer.allowed { "allowed" } else { "denied" };
            state.count_admission(endpoint, Some(&req), result);
            log_decision(webhook, &req, &answer, start);
            Ok(json_response(&AdmissionReviewOut::new(&answer)))
        }
        Err(e) => {
            state.count_admission(endpoint, Some(&req), "error");
            Err(ApiError::Internal(e.to_string()))
        }
    }
}

/// One line per admission decision, under the endpoint's own target
/// (`etcd_webhook::webhook::mutate` or `::validate`); object bodies are never logged.
pub fn log_decision(webhook: Webhook, req: &AdmissionRequest, answer: &Answer, start: Instant) {
    macro_rules! decision {
        ($target:literal) => {
            tracing::info!(
                target: $target,
                endpoint = webhook.name(),
                uid = %req.uid,
                kind = %format_args!("{}/{}", req.kind.version, req.kind.kind),
                namespace = req.namespace.as_deref().unwrap_or(""),
                name = %req.name,
                operation = ?req.operation,
                user = %req.user_info.username.as_deref().unwrap_or(""),
                allowed = answer.allowed,
                patched = answer.patch.is_some(),
                reason = %answer.message(),
                micros = start.elapsed().as_micros() as u64,
                "admission decision"
            )
        };
    }
    match webhook {
        Webhook::Mutate => decision!("etcd_webhook::webhook::mutate"),
        Webhook::Validate => decision!("etcd_webhook::webhook::validate"),
    }
}
