//! The request the decisions read and the answer they give. A request is read from JSON in one
//! pass without what no decision reads ([`lean_object`]); the review around it and the answer's
//! wire form are the webhook layer's (`webhook::review`).

use std::fmt;

use kube::core::admission::Operation;
use kube::core::{GroupVersionKind, Status};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::api::{self, Version};

/// A JSON Patch that cannot be encoded (a bug, answered as an internal error).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode patch: {0}")]
pub struct PatchError(serde_json::Error);

/// The request of an AdmissionReview: what the decisions read. Fields the decisions do not use
/// (resource, requestResource, ...) are skipped while decoding.
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
    /// The operation's options (a DELETE's `DeleteOptions`): only the propagation is read.
    #[serde(default)]
    pub options: Option<RequestOptions>,
}

/// What the decisions read of a request's options.
#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct RequestOptions {
    /// A DELETE's `propagationPolicy`: `Foreground`, `Background` or `Orphan`.
    #[serde(default)]
    pub propagation_policy: Option<String>,
}

/// Who sent the request, as far as the log line names them (groups and extras are skipped
/// while decoding).
#[derive(Deserialize, Clone, Debug, Default)]
pub struct User {
    #[serde(default)]
    pub username: Option<String>,
}

/// The last-applied annotation kubectl writes: a copy of the whole object as a string.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Result<Self, PatchError> {
        self.patch = Some(serde_json::to_vec(patch).map_err(PatchError)?);
        Ok(self)
    }

    pub fn message(&self) -> &str {
        self.status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or("")
    }
}
