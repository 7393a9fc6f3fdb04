//! `POST /mutate`: answer with the JSON Patch that fills in defaults.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};

use super::{
    ApiError, AppState, json_response, object_json, object_version, parse_admission, read_body,
};
use crate::admission::defaults;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req = match read_body(&headers, body, state.max_body_bytes)
        .await
        .and_then(|b| parse_admission(&b))
    {
        Ok(req) => req,
        Err(e) => {
            state.count_admission("mutate", None, "error");
            return Err(e);
        }
    };
    state.test_hook(&req.uid);
    let rsp = match respond(&req) {
        Ok(rsp) => rsp,
        Err(e) => {
            state.count_admission("mutate", Some(&req), "error");
            return Err(e);
        }
    };
    state.count_admission(
        "mutate",
        Some(&req),
        if rsp.allowed { "allowed" } else { "denied" },
    );
    super::validate::log_decision("mutate", &req, &rsp, start);
    Ok(json_response(&super::AdmissionReviewOut::new(&rsp)))
}

/// The mutating decision: always allowed; a patch when defaults are missing. DELETE, CONNECT
/// and subresource requests (status) get no patch: the apiserver would discard spec changes on
/// a status update, and a patch on DELETE fails the request.
pub fn respond(req: &AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, ApiError> {
    let rsp = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) || req.sub_resource.is_some()
    {
        return Ok(rsp);
    }
    let Some(obj) = object_json(req.object.as_ref())? else {
        return Ok(rsp);
    };
    let Some(version) = object_version(req, Some(&obj)) else {
        return Ok(rsp);
    };
    let patch = defaults::patch(&obj, version);
    if patch.0.is_empty() {
        return Ok(rsp);
    }
    rsp.with_patch(patch)
        .map_err(|e| ApiError::Internal(format!("cannot encode patch: {e}")))
}
