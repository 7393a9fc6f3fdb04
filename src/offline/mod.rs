//! The offline commands `review`, `convert` and `render`: the server's decisions from the
//! command line, for CI pipelines that check manifests before they reach a cluster. They call
//! the same code the webhook endpoints and the controller call.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{self, Version};
use kube::core::GroupVersionKind;
use kube::core::admission::Operation;

use crate::admission::{self, AdmissionRequest, request::User};
use crate::webhook;

mod render;

pub use render::{PLACEHOLDER_UID, objects, render};

/// Why input could not be reviewed or converted (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("{source_name}: cannot read: {error}")]
    Read {
        source_name: String,
        error: std::io::Error,
    },
    #[error("{source_name}: document {doc}: not valid YAML or JSON: {message}")]
    Parse {
        source_name: String,
        doc: usize,
        message: String,
    },
    #[error("{source_name}: document {doc}: {message}")]
    Document {
        source_name: String,
        doc: usize,
        message: String,
    },
    #[error("{source_name}: no documents")]
    Empty { source_name: String },
    /// A manifest the webhooks would deny (exit 1, not 2: the input was readable).
    #[error("{source_name}: document {doc}: {label}: denied: {message}")]
    Denied {
        source_name: String,
        doc: usize,
        label: String,
        message: String,
    },
}

impl OfflineError {
    /// The exit code: 1 for a denial, 2 for input that could not be judged.
    pub fn exit_code(&self) -> i32 {
        match self {
            OfflineError::Denied { .. } => 1,
            _ => 2,
        }
    }
}

/// One input document, numbered from 1 in its source.
#[derive(Clone, Debug)]
pub struct Document {
    pub source_name: String,
    pub index: usize,
    pub value: Value,
}

impl Document {
    fn error(&self, message: impl Into<String>) -> OfflineError {
        OfflineError::Document {
            source_name: self.source_name.clone(),
            doc: self.index,
            message: message.into(),
        }
    }

    fn label(&self) -> String {
        let meta = |k: &str| {
            self.value
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let (ns, name) = (meta("namespace"), meta("name"));
        let what = self
            .value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("?");
        if ns.is_empty() {
            format!("{name} ({what})")
        } else {
            format!("{ns}/{name} ({what})")
        }
    }
}

/// The documents of one source, and whether they came as one `kind: List` (what
/// `kubectl get -o yaml` prints, even for one object or none): the output keeps that shape.
#[derive(Clone, Debug, Default)]
pub struct Input {
    pub documents: Vec<Document>,
    pub list: bool,
}

/// Parses YAML or JSON, several documents allowed (`---`); a `kind: List` is expanded into its
/// items (an empty List is no error: it is what `kubectl get` prints when nothing exists);
/// empty documents are skipped.
pub fn parse_documents(text: &str, source_name: &str) -> Result<Input, OfflineError> {
    let mut out = Vec::new();
    let mut lists = 0;
    let mut others = 0;
    for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|e| OfflineError::Parse {
            source_name: source_name.to_owned(),
            doc: i + 1,
            message: e.to_string(),
        })?;
        let doc = Document {
            source_name: source_name.to_owned(),
            index: i + 1,
            value,
        };
        match &doc.value {
            Value::Null => {}
            Value::Object(m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                lists += 1;
                for item in m
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(Document {
                        value: item.clone(),
                        ..doc.clone()
                    });
                }
            }
            Value::Object(_) => {
                others += 1;
                out.push(doc)
            }
            _ => return Err(doc.error("expected an object (a manifest or an AdmissionReview)")),
        }
    }
    if out.is_empty() && lists == 0 {
        return Err(OfflineError::Empty {
            source_name: source_name.to_owned(),
        });
    }
    Ok(Input {
        documents: out,
        list: lists == 1 && others == 0,
    })
}

/// Reads a file, or stdin for `-`.
pub fn read_source(path: &str) -> Result<String, OfflineError> {
    let read = if path == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    read.map_err(|error| OfflineError::Read {
        source_name: path.to_owned(),
        error,
    })
}

/// What `review` decided for one document.
#[derive(Debug)]
pub struct Decision {
    pub label: String,
    pub allowed: bool,
    pub message: String,
    pub warnings: Vec<String>,
    /// The JSON Patch /mutate answered (an empty array when none).
    pub patch: Value,
    /// The object after the patch, as the apiserver would store it (or judge it).
    pub patched: Value,
}

/// The request the apiserver would send for `object` (UPDATE when `old`).
fn synthetic_request(object: &Value, old: Option<&Value>, version: Version) -> AdmissionRequest {
    let meta = |k: &str| {
        object
            .pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    AdmissionRequest {
        review_api_version: webhook::ADMISSION_V1.to_owned(),
        uid: PLACEHOLDER_UID.to_owned(),
        kind: GroupVersionKind::gvk(api::GROUP, version.as_str(), api::KIND),
        request_kind: None,
        sub_resource: None,
        name: meta("name").unwrap_or_default(),
        namespace: meta("namespace"),
        operation: if old.is_some() {
            Operation::Update
        } else {
            Operation::Create
        },
        user_info: User {
            username: Some("etcd-webhook-review".to_owned()),
        },
        object: Some(object.clone()),
        old_object: old.cloned(),
        dry_run: Some(true),
        options: None,
    }
}

/// Runs /mutate then /validate on a request, as the apiserver runs mutating then validating
/// webhooks; `object` is the whole object the request carries (the request holds it without
/// the fields no decision reads).
fn decide(
    mut req: AdmissionRequest,
    object: Value,
    doc: &Document,
    settings: &admission::Settings,
    schema: bool,
) -> Result<Decision, OfflineError> {
    let mutated = admission::mutate(&req, settings).map_err(|e| doc.error(e.to_string()))?;
    let patch: Value = match &mutated.patch {
        Some(p) => serde_json::from_slice(p).map_err(|e| doc.error(e.to_string()))?,
        None => json!([]),
    };
    let mut patched = object;
    if !patched.is_null() {
        let ops: json_patch::Patch =
            serde_json::from_value(patch.clone()).map_err(|e| doc.error(e.to_string()))?;
        json_patch::patch(&mut patched, &ops)
            .map_err(|e| doc.error(format!("patch does not apply: {e}")))?;
        req.object = Some(patched.clone());
    }
    let verdict = admission::validate(&req, settings);
    let mut warnings = mutated.warnings;
    warnings.extend(verdict.warnings.iter().cloned());
    // A manifest (not a review, which the apiserver made from an object it had checked) meets
    // the CRD's schema between the two webhooks, as on the apiserver.
    let refused = match (schema, api::convert::version_of(&patched)) {
        (true, Ok(version)) => api::schema::violations(&api::schema::of(version), &patched),
        _ => Vec::new(),
    };
    let (allowed, message) = match (refused.is_empty(), verdict.allowed) {
        (true, _) => (verdict.allowed, verdict.message().to_owned()),
        (false, true) => (false, refused.join(", ")),
        (false, false) => (
            false,
            format!("{}, {}", refused.join(", "), verdict.message()),
        ),
    };
    let label = Document {
        value: patched.clone(),
        ..doc.clone()
    }
    .label();
    Ok(Decision {
        label: if patched.is_null() {
            format!("review {}", req.uid)
        } else {
            label
        },
        allowed,
        message,
        warnings,
        patch,
        patched,
    })
}

/// Fields the object's version does not have, as the decision reports them: with `strict` a
/// denial (a CI gate fails as `kubectl apply --validate=strict` does), without it a warning.
/// The webhook path does not check them: the apiserver prunes unknown fields before it asks.
fn judge_fields(decision: &mut Decision, object: &Value, strict: bool) {
    let Ok(version) = api::convert::version_of(object) else {
        return;
    };
    let unknown = api::strict::unknown_fields(object, version);
    if unknown.is_empty() {
        return;
    }
    let what = format!(
        "unknown field{} {} (not in {} {}; the apiserver would drop {})",
        if unknown.len() == 1 { "" } else { "s" },
        unknown
            .iter()
            .map(|f| format!("{f:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        version.api_version(),
        api::KIND,
        if unknown.len() == 1 { "it" } else { "them" },
    );
    if strict {
        let message = format!("{what}: fix the spelling, or pass --strict=false to only warn");
        decision.message = if decision.allowed {
            message
        } else {
            format!("{message}; {}", decision.message)
        };
        decision.allowed = false;
    } else {
        decision.warnings.push(what);
    }
}

/// Reviews every document: an AdmissionReview as it is, an EtcdCluster as a CREATE (or an
/// UPDATE against the document of the same namespace/name in `old`). With `strict`, a field the
/// object's version does not have denies it.
pub fn review(
    docs: &[Document],
    old: &[Document],
    strict: bool,
    settings: &admission::Settings,
) -> Result<Vec<Decision>, OfflineError> {
    docs.iter()
        .map(|doc| {
            let mut decision = review_one(doc, old, settings)?;
            let object = match doc.value.get("kind").and_then(Value::as_str) {
                Some("AdmissionReview") => doc.value.pointer("/request/object"),
                _ => Some(&doc.value),
            };
            if let Some(object) =
                object.filter(|o| o.get("kind").and_then(Value::as_str) == Some(api::KIND))
            {
                judge_fields(&mut decision, object, strict);
            }
            Ok(decision)
        })
        .collect()
}

fn review_one(
    doc: &Document,
    old: &[Document],
    settings: &admission::Settings,
) -> Result<Decision, OfflineError> {
    let kind = doc.value.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
                "AdmissionReview" => {
                    let bytes =
                        serde_json::to_vec(&doc.value).map_err(|e| doc.error(e.to_string()))?;
                    let req =
                        webhook::parse_admission(&bytes).map_err(|e| doc.error(e.to_string()))?;
                    let object = doc
                        .value
                        .pointer("/request/object")
                        .cloned()
                        .unwrap_or(Value::Null);
                    decide(req, object, doc, settings, false)
                }
                k if k == api::KIND => {
                    let version = api::convert::version_of(&doc.value)
                        .map_err(|e| doc.error(e.to_string()))?;
                    let key = |v: &Value| {
                        (
                            Some(
                                v.pointer("/metadata/namespace")
                                    .cloned()
                                    .unwrap_or_else(|| json!("default")),
                            ),
                            v.pointer("/metadata/name").cloned(),
                        )
                    };
                    // Paired by namespace and name (no namespace: `default`), never by position:
                    // an object named `y` is no update of `x`.
                    let previous = match old {
                        [] => None,
                        many => Some(
                            &many
                                .iter()
                                .find(|o| key(&o.value) == key(&doc.value))
                                .ok_or_else(|| {
                                    let (ns, name) = key(&doc.value);
                                    doc.error(format!(
                                        "no object {ns}/{name} in --old (objects are paired by namespace and name)",
                                        ns = ns.as_ref().and_then(Value::as_str).unwrap_or("default"),
                                        name = name.as_ref().and_then(Value::as_str).unwrap_or(""),
                                    ))
                                })?
                                .value,
                        ),
                    };
                    let req = synthetic_request(&doc.value, previous, version);
                    decide(req, doc.value.clone(), doc, settings, true)
                }
                "ConversionReview" => Err(doc.error(
                    "this is a ConversionReview: `etcd-webhook convert` converts manifests (or send the review to /convert)",
                )),
                "" => Err(doc.error(
                    "no kind: expected an EtcdCluster manifest or an AdmissionReview",
                )),
                other => Err(doc.error(format!(
                    "kind {other} is neither an EtcdCluster nor an AdmissionReview: review checks only those"
                ))),
            }
}

/// Converts every document to `to`, through the same function `/convert` uses.
pub fn convert(docs: &[Document], to: Version) -> Result<Vec<Value>, OfflineError> {
    docs.iter()
        .map(|doc| {
            api::convert::convert_object(&doc.value, to).map_err(|e| {
                doc.error(format!(
                    "{}: cannot convert to {}: {e}",
                    doc.label(),
                    to.api_version()
                ))
            })
        })
        .collect()
}
