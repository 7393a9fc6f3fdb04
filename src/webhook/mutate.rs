//! `POST /mutate`: answer with the JSON Patch that fills in defaults.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kube::core::admission::Operation;

use super::{AdmissionRequest, Answer, ApiError, AppState};
use crate::admission::defaults;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req = state.admission_request("mutate", &headers, body).await?;
    state.finish("mutate", &req, respond(&req), start)
}

/// The mutating decision: always allowed; a patch when defaults are missing. DELETE, CONNECT
/// and subresource requests (status) get no patch: the apiserver would discard spec changes on
/// a status update, and a patch on DELETE fails the request.
pub fn respond(req: &AdmissionRequest) -> Result<Answer, ApiError> {
    let answer = Answer::allow(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) || req.sub_resource.is_some()
    {
        return Ok(answer);
    }
    let (Some(obj), Some(version)) = (req.object.as_ref(), req.object_version()) else {
        return Ok(answer);
    };
    let patch = defaults::patch(obj, version);
    if patch.0.is_empty() {
        return Ok(answer);
    }
    answer.with_patch(&patch)
}
