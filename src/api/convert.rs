//! Hub-and-spoke conversion through v1, losslessly.
//!
//! Every version converts to and from the hub (v1); spoke to spoke goes through the hub. What an
//! older version cannot express is kept in one annotation, [`CONVERSION_ANNOTATION`], holding a
//! [`Stash`], and restored (and the annotation removed) on the way back, so A -> B -> A gives A
//! back for every pair of versions. Only that annotation is ever changed in `metadata`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{CONVERSION_ANNOTATION, KIND, Version, defaults, v1, v1alpha1, v1beta1};

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConvertError {
    #[error("object is not a JSON object")]
    NotAnObject,
    #[error("kind {0:?} is not {KIND}")]
    WrongKind(String),
    #[error(
        "apiVersion {0:?} is not a served version of EtcdCluster (etcd.example.com/v1alpha1, v1beta1, v1)"
    )]
    UnknownApiVersion(String),
    #[error("{path}: {message}")]
    Decode { path: String, message: String },
    #[error("spec.storageSize {0:?} has no whole-GiB integer form for v1alpha1 spec.storageSizeGi")]
    StorageSize(String),
}

/// The hub's view of an object: v1 spec and status.
#[derive(Clone, Debug, PartialEq)]
pub struct Hub {
    pub spec: v1::EtcdClusterSpec,
    pub status: Option<v1::EtcdClusterStatus>,
}

/// The v1 fields an older version cannot express, kept in [`CONVERSION_ANNOTATION`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Stash {
    /// v1 `spec.version` when the spoke's spelling would not give it back exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// v1 `spec.storageSize` when the spoke's spelling would not give it back exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_retention: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_destination: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

impl Stash {
    fn is_empty(&self) -> bool {
        *self == Stash::default()
    }
}

/// Decodes `value` as `T`, naming the field path on error (`spec.replicas: invalid type ...`).
pub fn decode<T: DeserializeOwned>(value: &Value, prefix: &str) -> Result<T, ConvertError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let path = if inner == "." {
            prefix.to_owned()
        } else {
            format!("{prefix}.{inner}")
        };
        ConvertError::Decode {
            path,
            message: e.into_inner().to_string(),
        }
    })
}

/// The version an object is in, from its `apiVersion` (and a check of its `kind`).
pub fn version_of(obj: &Value) -> Result<Version, ConvertError> {
    let map = obj.as_object().ok_or(ConvertError::NotAnObject)?;
    match map.get("kind") {
        Some(Value::String(k)) if k == KIND => {}
        Some(other) => return Err(ConvertError::WrongKind(other.to_string())),
        None => return Err(ConvertError::WrongKind(String::new())),
    }
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    Version::from_api_version(api_version)
        .ok_or_else(|| ConvertError::UnknownApiVersion(api_version.to_owned()))
}

/// Reads the stash annotation of an object. A stash that does not parse (edited by hand) is
/// ignored with a warning: failing the conversion would make the object unreadable.
pub fn read_stash(obj: &Value) -> Option<Stash> {
    let raw = obj
        .pointer("/metadata/annotations")?
        .get(CONVERSION_ANNOTATION)?
        .as_str()?;
    match serde_json::from_str(raw) {
        Ok(stash) => Some(stash),
        Err(error) => {
            tracing::warn!(%error, annotation = CONVERSION_ANNOTATION, "ignoring unreadable conversion data");
            None
        }
    }
}

/// Decodes an object of any version into the hub's view (restoring stashed fields).
pub fn to_hub(obj: &Value) -> Result<Hub, ConvertError> {
    let version = version_of(obj)?;
    let spec_value = obj.get("spec").unwrap_or(&Value::Null);
    let status_value = match obj.get("status") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v),
    };
    let stash = match version {
        Version::V1 => None,
        _ => read_stash(obj),
    };
    Ok(match version {
        Version::V1 => Hub {
            spec: decode(spec_value, "spec")?,
            status: status_value.map(|s| decode(s, "status")).transpose()?,
        },
        Version::V1Beta1 => beta_up(
            decode(spec_value, "spec")?,
            status_value.map(|s| decode(s, "status")).transpose()?,
            stash.unwrap_or_default(),
        ),
        Version::V1Alpha1 => alpha_up(
            decode(spec_value, "spec")?,
            status_value.map(|s| decode(s, "status")).transpose()?,
            stash.unwrap_or_default(),
        ),
    })
}

/// Converts one object to `desired`, keeping metadata as it is apart from the stash annotation.
pub fn convert_object(obj: &Value, desired: Version) -> Result<Value, ConvertError> {
    let from = version_of(obj)?;
    if from == desired {
        return Ok(obj.clone());
    }
    let hub = to_hub(obj)?;
    let (spec, status, stash) = from_hub(hub, desired)?;

    let mut out = obj.as_object().cloned().ok_or(ConvertError::NotAnObject)?;
    out.insert(
        "apiVersion".to_owned(),
        Value::String(desired.api_version().to_owned()),
    );
    out.insert("spec".to_owned(), spec);
    match status {
        Some(status) => {
            out.insert("status".to_owned(), status);
        }
        None => {
            out.remove("status");
        }
    }
    set_stash(&mut out, stash.filter(|s| !s.is_empty()));
    Ok(Value::Object(out))
}

/// Renders the hub in `desired`: spec, status and what that version cannot hold.
pub fn from_hub(
    hub: Hub,
    desired: Version,
) -> Result<(Value, Option<Value>, Option<Stash>), ConvertError> {
    fn json<T: Serialize>(t: &T) -> Value {
        serde_json::to_value(t).expect("API types serialize")
    }
    Ok(match desired {
        Version::V1 => (json(&hub.spec), hub.status.as_ref().map(json), None),
        Version::V1Beta1 => {
            let (spec, status, stash) = beta_down(hub);
            (json(&spec), status.as_ref().map(json), Some(stash))
        }
        Version::V1Alpha1 => {
            let (spec, status, stash) = alpha_down(hub)?;
            (json(&spec), status.as_ref().map(json), Some(stash))
        }
    })
}

/// Writes (or removes) the stash annotation; an emptied annotations map is removed too.
fn set_stash(obj: &mut Map<String, Value>, stash: Option<Stash>) {
    let metadata = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    match stash {
        Some(stash) => {
            let raw = serde_json::to_string(&stash).expect("stash serializes");
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Some(a) = annotations.as_object_mut() {
                a.insert(CONVERSION_ANNOTATION.to_owned(), Value::String(raw));
            }
        }
        None => {
            if let Some(a) = metadata
                .get_mut("annotations")
                .and_then(Value::as_object_mut)
            {
                a.remove(CONVERSION_ANNOTATION);
                if a.is_empty() {
                    metadata.remove("annotations");
                }
            }
        }
    }
}

// === v1beta1 <-> v1 ===

fn beta_down(
    hub: Hub,
) -> (
    v1beta1::EtcdClusterSpec,
    Option<v1beta1::EtcdClusterStatus>,
    Stash,
) {
    let mut stash = Stash::default();
    let v1::EtcdClusterSpec {
        size,
        version,
        storage_class,
        storage_size,
        backup,
    } = hub.spec;
    let backup = backup.map(|b| {
        stash_backup_extras(&mut stash, b.retention, b.destination);
        v1beta1::Backup {
            enabled: b.enabled,
            schedule: b.schedule,
        }
    });
    let spec = v1beta1::EtcdClusterSpec {
        size,
        version,
        storage: v1beta1::Storage {
            class_name: storage_class,
            size: storage_size,
        },
        backup,
    };
    let status = hub.status.map(|s| {
        stash.observed_generation = s.observed_generation;
        stash.conditions = s.conditions;
        v1beta1::EtcdClusterStatus {
            phase: s.phase,
            ready_replicas: s.ready_replicas,
            endpoints: s.endpoints,
        }
    });
    (spec, status, stash)
}

fn beta_up(
    spec: v1beta1::EtcdClusterSpec,
    status: Option<v1beta1::EtcdClusterStatus>,
    stash: Stash,
) -> Hub {
    let backup = spec.backup.map(|b| v1::Backup {
        enabled: b.enabled,
        schedule: b.schedule,
        retention: stash.backup_retention.unwrap_or(defaults::BACKUP_RETENTION),
        destination: stash.backup_destination.clone(),
    });
    let status = status.map(|s| v1::EtcdClusterStatus {
        phase: s.phase,
        ready_replicas: s.ready_replicas,
        endpoints: s.endpoints,
        observed_generation: stash.observed_generation,
        conditions: stash.conditions.clone(),
    });
    Hub {
        spec: v1::EtcdClusterSpec {
            size: spec.size,
            version: spec.version,
            storage_class: spec.storage.class_name,
            storage_size: spec.storage.size,
            backup,
        },
        status,
    }
}

// === v1alpha1 <-> v1 ===

/// v1 `v3.5.10` is v1alpha1 `3.5.10`.
fn version_down(v1: &str) -> String {
    v1.strip_prefix('v').unwrap_or(v1).to_owned()
}

fn version_up(alpha: &str) -> String {
    format!("v{alpha}")
}

/// v1 `10Gi` is v1alpha1 `10`.
fn storage_down(v1: &str) -> Result<i64, ConvertError> {
    v1.strip_suffix("Gi")
        .and_then(|n| n.parse::<i64>().ok())
        .ok_or_else(|| ConvertError::StorageSize(v1.to_owned()))
}

fn storage_up(gi: i64) -> String {
    format!("{gi}Gi")
}

fn alpha_down(
    hub: Hub,
) -> Result<
    (
        v1alpha1::EtcdClusterSpec,
        Option<v1alpha1::EtcdClusterStatus>,
        Stash,
    ),
    ConvertError,
> {
    let mut stash = Stash::default();
    let v1::EtcdClusterSpec {
        size,
        version,
        storage_class,
        storage_size,
        backup,
    } = hub.spec;

    let etcd_version = version_down(&version);
    if version_up(&etcd_version) != version {
        stash.version = Some(version);
    }
    let storage_size_gi = storage_down(&storage_size)?;
    if storage_up(storage_size_gi) != storage_size {
        stash.storage_size = Some(storage_size);
    }
    let (backup_enabled, backup_schedule) = match backup {
        Some(b) => {
            stash_backup_extras(&mut stash, b.retention, b.destination);
            (Some(b.enabled), Some(b.schedule))
        }
        None => (None, None),
    };
    let spec = v1alpha1::EtcdClusterSpec {
        replicas: size,
        etcd_version,
        storage_class_name: storage_class,
        storage_size_gi,
        backup_enabled,
        backup_schedule,
    };
    let status = hub.status.map(|s| {
        stash.endpoints = s.endpoints;
        stash.observed_generation = s.observed_generation;
        stash.conditions = s.conditions;
        v1alpha1::EtcdClusterStatus {
            phase: s.phase,
            ready_replicas: s.ready_replicas,
        }
    });
    Ok((spec, status, stash))
}

fn alpha_up(
    spec: v1alpha1::EtcdClusterSpec,
    status: Option<v1alpha1::EtcdClusterStatus>,
    stash: Stash,
) -> Hub {
    // A stashed spelling is restored only while the spoke still says the same thing; an edit
    // made in the old version wins over the stash.
    let version = match stash.version {
        Some(v) if version_down(&v) == spec.etcd_version => v,
        _ => version_up(&spec.etcd_version),
    };
    let storage_size = match stash.storage_size {
        Some(s) if storage_down(&s).ok() == Some(spec.storage_size_gi) => s,
        _ => storage_up(spec.storage_size_gi),
    };
    let backup = match (spec.backup_enabled, spec.backup_schedule) {
        (None, None) => None,
        (enabled, schedule) => Some(v1::Backup {
            enabled: enabled.unwrap_or(false),
            schedule: schedule.unwrap_or_else(defaults::backup_schedule),
            retention: stash.backup_retention.unwrap_or(defaults::BACKUP_RETENTION),
            destination: stash.backup_destination,
        }),
    };
    let status = status.map(|s| v1::EtcdClusterStatus {
        phase: s.phase,
        ready_replicas: s.ready_replicas,
        endpoints: stash.endpoints,
        observed_generation: stash.observed_generation,
        conditions: stash.conditions,
    });
    Hub {
        spec: v1::EtcdClusterSpec {
            size: spec.replicas,
            version,
            storage_class: spec.storage_class_name,
            storage_size,
            backup,
        },
        status,
    }
}

/// Retention is stashed only when it differs from the default the way back would fill in.
fn stash_backup_extras(stash: &mut Stash, retention: i32, destination: Option<String>) {
    if retention != defaults::BACKUP_RETENTION {
        stash.backup_retention = Some(retention);
    }
    stash.backup_destination = destination;
}
