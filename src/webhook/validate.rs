//! `POST /validate`: the rules. Never returns a patch.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kube::core::admission::Operation;

use super::{AdmissionRequest, Answer, ApiError, AppState};
use crate::admission::validate::{self, Operation as Op};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req = state.admission_request("validate", &headers, body).await?;
    state.finish("validate", &req, Ok(respond(&req)), start)
}

/// The validating decision. DELETE and CONNECT are always allowed; so are status updates,
/// which cannot change the spec.
pub fn respond(req: &AdmissionRequest) -> Answer {
    let mut answer = Answer::allow(req);
    let op = match req.operation {
        Operation::Create => Op::Create,
        Operation::Update => Op::Update,
        Operation::Delete | Operation::Connect => return answer,
    };
    if req.sub_resource.is_some() {
        return answer;
    }
    let Some(version) = req.user_version() else {
        answer.warnings.push(format!(
            "etcd-webhook judges only etcd.example.com EtcdCluster; {}/{} {} was not checked",
            req.kind.group, req.kind.version, req.kind.kind
        ));
        return answer;
    };
    let Some(obj) = req.object.as_ref() else {
        return answer.deny(
            400,
            "BadRequest",
            format!("{op:?} request carries no object"),
        );
    };
    let verdict = validate::validate_as_written(version, op, obj, req.old_object.as_ref());
    answer.warnings = verdict.warnings.clone();
    if verdict.allowed() {
        return answer;
    }
    answer.deny(422, "Invalid", verdict.message())
}
