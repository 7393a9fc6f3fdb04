//! `POST /convert`: every object to the desired version, in order.

#[cfg(feature = "server")]
use std::sync::Arc;

#[cfg(feature = "server")]
use axum::{body::Body, extract::State, http::HeaderMap, response::Response};
use kube::core::TypeMeta;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{ApiError, decode_error};
#[cfg(feature = "server")]
use super::{AppState, json_response, read_body};
use crate::api::{Version, convert};
#[cfg(feature = "server")]
use crate::metrics::{ConversionLabels, ResultLabel};

pub const CONVERSION_V1: &str = "apiextensions.k8s.io/v1";
pub const CONVERSION_V1BETA1: &str = "apiextensions.k8s.io/v1beta1";

/// The incoming review. Read with our own struct so that `objects: null` means no objects.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: String,
    kind: String,
    request: Option<RequestIn>,
}

#[derive(Deserialize)]
struct RequestIn {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    objects: Vec<Value>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    Ok(Option::<Vec<Value>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(feature = "server")]
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let start = std::time::Instant::now();
    let bytes = read_body(&headers, body, state.max_convert_body_bytes).await?;
    let req = parse(&bytes)?;
    let (uid, count, desired) = (
        req.uid.clone(),
        req.objects.len(),
        req.desired_api_version.clone(),
    );
    let from: Vec<&'static str> = req
        .objects
        .iter()
        .map(|o| {
            o.get("apiVersion")
                .and_then(Value::as_str)
                .and_then(Version::from_api_version)
                .map(Version::as_str)
                .unwrap_or("other")
        })
        .collect();
    let review = respond(req);
    let rsp = review.response.as_ref();
    let success = rsp.is_some_and(|r| r.result.is_success());
    let metrics = &state.metrics;
    metrics
        .conversion_requests
        .get_or_create(&ResultLabel {
            result: if success { "success" } else { "failure" },
        })
        .inc();
    if success {
        let to = Version::from_api_version(&desired)
            .map(Version::as_str)
            .unwrap_or("other");
        for from in from {
            metrics
                .converted_objects
                .get_or_create(&ConversionLabels { from, to })
                .inc();
        }
    }
    let result = rsp.map(|r| r.result.message.clone()).unwrap_or_default();
    tracing::info!(%uid, objects = count, %desired, failure = %result, micros = start.elapsed().as_micros() as u64, "conversion");
    Ok(json_response(&review))
}

/// Decodes a ConversionReview (v1 or v1beta1) into its request.
pub fn parse(bytes: &[u8]) -> Result<ConversionRequest, ApiError> {
    super::expect_object("ConversionReview", bytes)?;
    const VERSIONS: [&str; 2] = [CONVERSION_V1, CONVERSION_V1BETA1];
    let wrong = || super::wrong_review("ConversionReview", &VERSIONS, bytes);
    let review: ReviewIn = serde_json::from_slice(bytes)
        .map_err(|e| wrong().unwrap_or_else(|| decode_error("malformed ConversionReview", &e)))?;
    if review.kind != "ConversionReview" || !VERSIONS.contains(&review.api_version.as_str()) {
        return Err(wrong()
            .unwrap_or_else(|| ApiError::BadRequest("expected a ConversionReview".to_owned())));
    }
    let request = review
        .request
        .ok_or_else(|| ApiError::BadRequest("ConversionReview has no request".to_owned()))?;
    Ok(ConversionRequest {
        types: Some(TypeMeta {
            api_version: review.api_version,
            kind: review.kind,
        }),
        uid: request.uid,
        desired_api_version: request.desired_api_version,
        objects: request.objects,
    })
}

/// Converts every object; one that cannot be converted fails the whole review (HTTP 200,
/// `result.status: Failure`), as the apiserver expects.
pub fn respond(mut req: ConversionRequest) -> ConversionReview {
    let objects = std::mem::take(&mut req.objects);
    let desired = req.desired_api_version.clone();
    let rsp = ConversionResponse::for_request(req);
    let Some(version) = Version::from_api_version(&desired) else {
        return rsp
            .failure(kube::core::Status::failure(
                &format!("desiredAPIVersion {desired:?} is not a served version of EtcdCluster (etcd.example.com/v1alpha1, v1beta1, v1)"),
                "BadRequest",
            ))
            .into_review();
    };
    let mut converted = Vec::with_capacity(objects.len());
    for (i, obj) in objects.iter().enumerate() {
        match convert::convert_object(obj, version) {
            Ok(v) => converted.push(v),
            Err(e) => {
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let ns = obj
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return rsp
                    .failure(kube::core::Status::failure(
                        &format!("objects[{i}] ({ns}/{name}): cannot convert to {desired}: {e}"),
                        "Invalid",
                    ))
                    .into_review();
            }
        }
    }
    rsp.success(converted).into_review()
}
