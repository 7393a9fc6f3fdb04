//! `POST /validate`: the rules. Never returns a patch.

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
use crate::admission::validate::{self, Operation as Op};

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
            state.count_admission("validate", None, "error");
            return Err(e);
        }
    };
    state.test_hook(&req.uid);
    let rsp = match respond(&req) {
        Ok(rsp) => rsp,
        Err(e) => {
            state.count_admission("validate", Some(&req), "error");
            return Err(e);
        }
    };
    state.count_admission(
        "validate",
        Some(&req),
        if rsp.allowed { "allowed" } else { "denied" },
    );
    log_decision("validate", &req, &rsp, start);
    Ok(json_response(&super::AdmissionReviewOut::new(&rsp)))
}

/// The validating decision. DELETE and CONNECT are always allowed; so are status updates,
/// which cannot change the spec.
pub fn respond(req: &AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, ApiError> {
    let mut rsp = AdmissionResponse::from(req);
    let op = match req.operation {
        Operation::Create => Op::Create,
        Operation::Update => Op::Update,
        Operation::Delete | Operation::Connect => return Ok(rsp),
    };
    if req.sub_resource.is_some() {
        return Ok(rsp);
    }
    let obj = object_json(req.object.as_ref())?;
    let old = object_json(req.old_object.as_ref())?;
    let Some(version) = object_version(req, obj.as_ref()) else {
        rsp.warnings = Some(vec![format!(
            "etcd-webhook judges only etcd.example.com EtcdCluster; {}/{} {} was not checked",
            req.kind.group, req.kind.version, req.kind.kind
        )]);
        return Ok(rsp);
    };
    let Some(obj) = obj else {
        return Ok(rsp.deny(format!("{op:?} request carries no object")));
    };
    let verdict = validate::validate(version, op, &obj, old.as_ref());
    if !verdict.warnings.is_empty() {
        rsp.warnings = Some(verdict.warnings.clone());
    }
    if verdict.allowed() {
        return Ok(rsp);
    }
    let mut rsp = rsp.deny(verdict.message());
    rsp.result.code = 422;
    rsp.result.reason = "Invalid".to_owned();
    rsp.result.status = Some(kube::core::response::StatusSummary::Failure);
    Ok(rsp)
}

/// One line per admission decision; object bodies are never logged.
pub fn log_decision(
    endpoint: &str,
    req: &AdmissionRequest<DynamicObject>,
    rsp: &AdmissionResponse,
    start: Instant,
) {
    tracing::info!(
        endpoint,
        uid = %req.uid,
        kind = %format_args!("{}/{}", req.kind.version, req.kind.kind),
        namespace = req.namespace.as_deref().unwrap_or(""),
        name = %req.name,
        operation = ?req.operation,
        user = %req.user_info.username.as_deref().unwrap_or(""),
        allowed = rsp.allowed,
        patched = rsp.patch.is_some(),
        reason = %rsp.result.message,
        micros = start.elapsed().as_micros() as u64,
        "admission decision"
    );
}
