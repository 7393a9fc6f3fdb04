//! The AdmissionReview wire format, both ways.
//!
//! Requests are read with our own structs rather than `kube::core::admission::AdmissionReview`:
//! kube's type reads the object through `#[serde(flatten)]` into a `DynamicObject`, which
//! buffers every field and then has to be re-encoded to JSON for the decision code; reading
//! `object` and `oldObject` straight into `serde_json::Value` halves the cost of a review. The
//! field types (`GroupVersionKind`, `Operation`, `UserInfo`, `Status`) are kube's and
//! k8s-openapi's. Answers are written by hand too, because kube's `AdmissionResponse` encodes
//! `patch` as an array of numbers where the apiserver's contract is a padded base64 string.

use std::collections::HashMap;

use std::fmt;

use base64::Engine;
use kube::core::admission::Operation;
use kube::core::{GroupVersionKind, Status};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ApiError, decode_error};
use crate::api::{self, Version};

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

/// The request of an AdmissionReview: what the decisions read. Fields the decisions do not use
/// (resource, requestResource, options, ...) are skipped while decoding.
#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// apiVersion of the review it came in, so the answer goes back in the same one.
    #[serde(skip)]
    pub review_api_version: String,
    pub uid: String,
    pub kind: GroupVersionKind,
    /// The kind the user sent: with matchPolicy Equivalent the apiserver converts a v1alpha1
    /// or v1beta1 object to v1 for the webhook and names the user's version only here.
    #[serde(default)]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: User,
    /// The object without what no decision reads (see [`lean_object`]).
    #[serde(default, deserialize_with = "lean_object")]
    pub object: Option<Value>,
    #[serde(default, deserialize_with = "lean_object")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Who sent the request, as far as the log line names them (groups and extras are skipped
/// while decoding).
#[derive(Deserialize, Clone, Debug, Default)]
pub struct User {
    #[serde(default)]
    pub username: Option<String>,
}

/// The last-applied annotation kubectl writes: a copy of the whole object as a string.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Decodes `object`/`oldObject` as JSON in one pass, leaving out `metadata.managedFields` and
/// the [`LAST_APPLIED`] annotation: no rule or default reads them, and in a stored object they
/// are most of its bytes. They are skipped while parsing (checked as JSON, never built). An
/// `annotations` map that held only that annotation stays, empty, so a patch adding an
/// annotation still finds it. The apiserver applies /mutate's JSON Patch to the whole object,
/// so nothing is lost from it.
fn lean_object<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match Lean::Top.deserialize(d)? {
        Value::Null => Ok(None),
        v => Ok(Some(v)),
    }
}

/// Where in the object a value is, for [`lean_object`].
#[derive(Clone, Copy)]
enum Lean {
    Top,
    Metadata,
    Annotations,
    Plain,
}

impl Lean {
    /// What to do with `key` of a map at this level: `None` skips its value.
    fn child(self, key: &str) -> Option<Lean> {
        match (self, key) {
            (Lean::Top, "metadata") => Some(Lean::Metadata),
            (Lean::Metadata, "managedFields") => None,
            (Lean::Metadata, "annotations") => Some(Lean::Annotations),
            (Lean::Annotations, LAST_APPLIED) => None,
            _ => Some(Lean::Plain),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Lean {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            Lean::Plain => Value::deserialize(d),
            _ => d.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for Lean {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.child(&key) {
                Some(level) => {
                    let value = map.next_value_seed(level)?;
                    out.insert(key, value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

impl AdmissionRequest {
    /// The version the object is written in: its own apiVersion, else the request's kind.
    /// None when the review is not about an EtcdCluster.
    pub fn object_version(&self) -> Option<Version> {
        if self.kind.group != api::GROUP || self.kind.kind != api::KIND {
            return None;
        }
        self.object
            .as_ref()
            .or(self.old_object.as_ref())
            .and_then(|o| o.get("apiVersion"))
            .and_then(Value::as_str)
            .and_then(Version::from_api_version)
            .or_else(|| Version::from_version(&self.kind.version))
    }

    /// The version the user wrote, to report in: the request's kind when it is an
    /// EtcdCluster, else the object's own version.
    pub fn user_version(&self) -> Option<Version> {
        self.request_kind
            .as_ref()
            .filter(|k| k.group == api::GROUP && k.kind == api::KIND)
            .and_then(|k| Version::from_version(&k.version))
            .or_else(|| self.object_version())
    }
}

/// Decodes an AdmissionReview (v1 or v1beta1) and takes out its request.
pub fn parse_admission(bytes: &[u8]) -> Result<AdmissionRequest, ApiError> {
    super::expect_object("AdmissionReview", bytes)?;
    let review: AdmissionReviewIn =
        serde_json::from_slice(bytes).map_err(|e| decode_error("malformed AdmissionReview", &e))?;
    if review.kind != "AdmissionReview"
        || !(review.api_version == ADMISSION_V1 || review.api_version == ADMISSION_V1BETA1)
    {
        return Err(ApiError::BadRequest(format!(
            "expected an AdmissionReview of admission.k8s.io/v1 or v1beta1, got kind {:?} apiVersion {:?}",
            review.kind, review.api_version
        )));
    }
    let mut request = review
        .request
        .ok_or_else(|| ApiError::BadRequest("AdmissionReview has no request".to_owned()))?;
    request.review_api_version = review.api_version;
    Ok(request)
}

/// A decision: allowed or denied (with a Status), maybe a JSON Patch, maybe warnings.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub uid: String,
    pub review_api_version: String,
    pub allowed: bool,
    /// Sent with a denial only (the apiserver ignores it when allowed).
    pub status: Option<Status>,
    /// The JSON Patch, as JSON bytes.
    pub patch: Option<Vec<u8>>,
    pub warnings: Vec<String>,
}

impl Answer {
    /// Allowed, nothing else.
    pub fn allow(req: &AdmissionRequest) -> Self {
        Self {
            uid: req.uid.clone(),
            review_api_version: req.review_api_version.clone(),
            allowed: true,
            status: None,
            patch: None,
            warnings: Vec::new(),
        }
    }

    /// Denied: `code` 403/422, a message a person can act on.
    pub fn deny(mut self, code: u16, reason: &str, message: String) -> Self {
        self.allowed = false;
        self.status = Some(Status::failure(&message, reason).with_code(code));
        self
    }

    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Result<Self, ApiError> {
        let bytes = serde_json::to_vec(patch)
            .map_err(|e| ApiError::Internal(format!("cannot encode patch: {e}")))?;
        self.patch = Some(bytes);
        Ok(self)
    }

    pub fn message(&self) -> &str {
        self.status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or("")
    }
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
    use serde_json::json;

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
