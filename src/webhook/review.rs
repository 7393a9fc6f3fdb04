//! The AdmissionReview wire format, both ways: the review around the request
//! (`admission::request` reads the request itself) and the answer.
//!
//! Requests are read with our own structs rather than `kube::core::admission::AdmissionReview`:
//! kube's type reads the object through `#[serde(flatten)]` into a `DynamicObject`, which
//! buffers every field and then has to be re-encoded to JSON for the decision code; reading
//! `object` and `oldObject` straight into `serde_json::Value` halves the cost of a review. The
//! field types (`GroupVersionKind`, `Operation`, `UserInfo`, `Status`) are kube's and
//! k8s-openapi's. Answers are written by hand too, because kube's `AdmissionResponse` encodes
//! `patch` as an array of numbers where the apiserver's contract is a padded base64 string.

use std::collections::HashMap;

use base64::Engine;
use kube::core::Status;
use serde::{Deserialize, Serialize};

use super::{ApiError, decode_error};
pub use crate::admission::request::{AdmissionRequest, Answer};

pub const ADMISSION_V1: &str = "admission.k8s.io/v1";
pub const ADMISSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReviewIn {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

/// Decodes an AdmissionReview (v1 or v1beta1) and takes out its request.
pub fn parse_admission(bytes: &[u8]) -> Result<AdmissionRequest, ApiError> {
    super::expect_object("AdmissionReview", bytes)?;
    const VERSIONS: [&str; 2] = [ADMISSION_V1, ADMISSION_V1BETA1];
    let wrong = || super::wrong_review("AdmissionReview", &VERSIONS, bytes);
    let review: AdmissionReviewIn = serde_json::from_slice(bytes)
        .map_err(|e| wrong().unwrap_or_else(|| decode_error("malformed AdmissionReview", &e)))?;
    if review.kind != "AdmissionReview" || !VERSIONS.contains(&review.api_version.as_str()) {
        return Err(wrong()
            .unwrap_or_else(|| ApiError::BadRequest("expected an AdmissionReview".to_owned())));
    }
    let mut request = review
        .request
        .ok_or_else(|| ApiError::BadRequest("AdmissionReview has no request".to_owned()))?;
    request.review_api_version = review.api_version;
    Ok(request)
}

/// The AdmissionReview sent back, in the apiVersion of the request.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: AdmissionResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    audit_annotations: HashMap<String, String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

impl<'a> AdmissionReviewOut<'a> {
    pub fn new(answer: &'a Answer) -> Self {
        // Go's []byte: standard base64 with padding.
        let patch = answer
            .patch
            .as_ref()
            .map(|p| base64::engine::general_purpose::STANDARD.encode(p));
        Self {
            api_version: if answer.review_api_version.is_empty() {
                ADMISSION_V1
            } else {
                &answer.review_api_version
            },
            kind: "AdmissionReview",
            response: AdmissionResponseOut {
                uid: &answer.uid,
                allowed: answer.allowed,
                status: if answer.allowed {
                    None
                } else {
                    answer.status.as_ref()
                },
                patch_type: patch.as_ref().map(|_| "JSONPatch"),
                patch,
                audit_annotations: HashMap::new(),
                warnings: &answer.warnings,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::request::LAST_APPLIED;
    use serde_json::{Value, json};

    fn review(object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": "CREATE",
                "kind": {"group": "etcd.example.com", "version": "v1", "kind": "EtcdCluster"},
                "userInfo": {"username": "alice", "groups": ["g"], "extra": {"k": ["v"]}},
                "object": object, "oldObject": null,
            }
        }))
        .unwrap()
    }

    #[test]
    fn objects_are_read_without_managed_fields_and_last_applied() {
        let object = json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {
                "name": "a", "labels": {"x": "y"},
                "annotations": {LAST_APPLIED: "{\"big\":\"copy\"}", "keep": "me"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"size": 3, "list": [1, 2.5, true, null, {"managedFields": 1}]},
        });
        let req = parse_admission(&review(object.clone())).unwrap();
        let mut want = object;
        want["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        want["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(LAST_APPLIED);
        assert_eq!(req.object, Some(want));
        assert_eq!(req.old_object, None);
        assert_eq!(req.user_info.username.as_deref(), Some("alice"));
    }

    #[test]
    fn an_annotations_map_with_only_last_applied_stays_empty() {
        let object = json!({"metadata": {"annotations": {LAST_APPLIED: "{}"}}, "spec": {}});
        let req = parse_admission(&review(object)).unwrap();
        assert_eq!(
            req.object,
            Some(json!({"metadata": {"annotations": {}}, "spec": {}}))
        );
    }

    #[test]
    fn skipped_parts_are_still_checked_as_json() {
        let mut bytes = review(json!({"metadata": {"managedFields": [1]}}));
        let at = bytes
            .windows(3)
            .position(|w| w == b"[1]")
            .expect("the managedFields array");
        bytes[at + 1] = b'@';
        let e = parse_admission(&bytes).unwrap_err().to_string();
        assert!(e.contains("malformed AdmissionReview"), "{e}");
    }

    #[test]
    fn objects_that_are_not_maps_pass_through_for_the_rules_to_refuse() {
        let req = parse_admission(&review(json!("text"))).unwrap();
        assert_eq!(req.object, Some(json!("text")));
        let req = parse_admission(&review(json!([{"metadata": {"managedFields": []}}]))).unwrap();
        assert_eq!(
            req.object,
            Some(json!([{"metadata": {"managedFields": []}}]))
        );
    }
}
