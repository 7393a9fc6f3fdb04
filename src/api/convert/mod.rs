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

mod spokes;

use spokes::{alpha_down, alpha_up, beta_down, beta_up, kept_gaps};

use super::{CONVERSION_ANNOTATION, KIND, Version, v1};

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
    /// What a v1alpha1 object left out that v1 fills in, so that the way back leaves it out again.
    pub alpha_gaps: AlphaGaps,
}

/// v1alpha1 has `backupEnabled` and `backupSchedule` side by side, each optional; v1 has one
/// `backup` block where both always have a value. An object written in v1alpha1 with only one of
/// them comes back with only that one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AlphaGaps {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_backup_enabled: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_backup_schedule: bool,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_status: Option<v1::BackupStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<v1::MemberState>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<v1::Restore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<v1::Maintenance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<v1::Tls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<v1::Recovery>,
    /// Kept in every version (v1 included) while the object has a `backup` block.
    #[serde(default, flatten)]
    pub alpha_gaps: AlphaGaps,
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
        Some(Value::String(other)) => return Err(ConvertError::WrongKind(other.clone())),
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
    let stash = read_stash(obj);
    Ok(match version {
        Version::V1 => Hub {
            spec: decode(spec_value, "spec")?,
            status: status_value.map(|s| decode(s, "status")).transpose()?,
            alpha_gaps: stash.map(|s| s.alpha_gaps).unwrap_or_default(),
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
        Version::V1 => {
            let stash = Stash {
                alpha_gaps: kept_gaps(&hub),
                ..Stash::default()
            };
            (json(&hub.spec), hub.status.as_ref().map(json), Some(stash))
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::v1alpha1;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::collection::{btree_map, vec};
    use proptest::option;
    use proptest::prelude::*;
    use serde_json::json;

    fn phase() -> impl Strategy<Value = crate::api::Phase> {
        use crate::api::Phase::*;
        prop_oneof![Just(Creating), Just(Running), Just(Failed), Just(Deleting)]
    }

    fn condition() -> impl Strategy<Value = Condition> {
        (
            "[A-Z][a-z]{1,8}",
            prop_oneof![Just("True"), Just("False"), Just("Unknown")],
            "[A-Z][A-Za-z]{0,10}",
            ".{0,20}",
            0i64..2_000_000_000,
            option::of(0i64..100),
        )
            .prop_map(
                |(type_, status, reason, message, t, generation)| Condition {
                    type_,
                    status: status.to_owned(),
                    reason,
                    message,
                    last_transition_time: Time(
                        k8s_openapi::jiff::Timestamp::from_second(t).unwrap(),
                    ),
                    observed_generation: generation,
                },
            )
    }

    /// Valid v1 specs, including spellings an older version cannot hold exactly (`010Gi`).
    pub fn v1_spec() -> impl Strategy<Value = v1::EtcdClusterSpec> {
        (
            1i32..=crate::api::MAX_SIZE,
            (0u32..12, 0u32..30, 0u32..40, any::<bool>()),
            option::of("[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?"),
            "[0-9]{1,7}Gi",
            option::of((
                any::<bool>(),
                prop_oneof![Just("0 */6 * * *"), Just("*/5 * * * *"), Just("@daily")],
                1i32..=100,
                option::of("s3://[a-z]{1,8}/[a-z]{0,8}"),
            )),
            (
                option::of((
                    "s3://[a-z]{1,8}/[a-z-]{1,12}\\.db",
                    option::of("[0-9a-f]{64}"),
                )),
                option::of((
                    option::of(crate::api::QUOTA_MIN_BYTES..crate::api::QUOTA_MAX_BYTES),
                    option::of("(0|[1-9][0-9]{0,2}(s|m|h))"),
                    option::of(0i32..100),
                )),
                option::of((
                    option::of(any::<bool>()),
                    option::of(prop_oneof![
                        Just(v1::CertificateSource::CertManager),
                        Just(v1::CertificateSource::Secrets)
                    ]),
                    option::of((
                        "[a-z]{1,8}",
                        option::of(prop_oneof![Just("Issuer"), Just("ClusterIssuer")]),
                    )),
                )),
                option::of(option::of(prop_oneof![
                    Just(v1::QuorumLoss::Automatic),
                    Just(v1::QuorumLoss::Manual)
                ])),
            ),
        )
            .prop_map(
                |(
                    size,
                    (ma, mi, pa, zero),
                    class,
                    storage,
                    backup,
                    (restore, maintenance, tls, recovery),
                )| {
                    v1::EtcdClusterSpec {
                        size,
                        version: if zero {
                            format!("v0{ma}.{mi}.{pa}")
                        } else {
                            format!("v{ma}.{mi}.{pa}")
                        },
                        storage_class: class,
                        storage_size: storage,
                        backup: backup.map(|(enabled, schedule, retention, destination)| {
                            v1::Backup {
                                enabled,
                                schedule: schedule.to_owned(),
                                retention,
                                destination,
                            }
                        }),
                        restore: restore.map(|(from, sha256)| v1::Restore { from, sha256 }),
                        maintenance: maintenance.map(|(quota, retention, threshold)| {
                            v1::Maintenance {
                                quota_backend_bytes: quota,
                                auto_compaction_retention: retention,
                                defrag_threshold_percent: threshold,
                            }
                        }),
                        tls: tls.map(|(enabled, certificates, issuer)| v1::Tls {
                            enabled,
                            certificates,
                            issuer_ref: issuer.map(|(name, kind)| v1::IssuerRef {
                                name,
                                kind: kind.map(str::to_owned),
                                group: None,
                            }),
                        }),
                        recovery: recovery.map(|quorum_loss| v1::Recovery { quorum_loss }),
                    }
                },
            )
    }

    pub fn v1_status() -> impl Strategy<Value = v1::EtcdClusterStatus> {
        (
            option::of(phase()),
            option::of(0i32..8),
            option::of(vec("http://[a-z]{1,5}-[0-6]\\.[a-z]{1,5}:2379", 0..4)),
            option::of(0i64..1000),
            option::of(vec(condition(), 0..3)),
            option::of(backup_status()),
            option::of("[a-z]{1,5}-[0-6]"),
            option::of(vec(member_state(), 0..4)),
        )
            .prop_map(
                |(
                    phase,
                    ready_replicas,
                    endpoints,
                    observed_generation,
                    conditions,
                    backup,
                    leader,
                    members,
                )| {
                    v1::EtcdClusterStatus {
                        phase,
                        ready_replicas,
                        endpoints,
                        observed_generation,
                        conditions,
                        backup,
                        leader,
                        members,
                    }
                },
            )
    }

    fn member_state() -> impl Strategy<Value = v1::MemberState> {
        (
            "[a-z]{1,5}-[0-6]",
            "[0-9a-f]{1,16}",
            prop_oneof![Just("Leader"), Just("Follower"), Just("Learner")],
            any::<bool>(),
            "(v3\\.[56]\\.[0-9]{1,2})?",
            option::of(0i64..1 << 33),
            option::of(0i64..1 << 33),
            vec(Just("NOSPACE".to_owned()), 0..2),
            option::of("2026-12-0[1-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]Z"),
        )
            .prop_map(
                |(name, id, role, healthy, version, db_size, db_size_in_use, alarms, last)| {
                    v1::MemberState {
                        name,
                        id,
                        role: role.to_owned(),
                        healthy,
                        version,
                        db_size,
                        db_size_in_use,
                        alarms,
                        last_defragmentation: last.clone(),
                        corruption_detected_at: last,
                    }
                },
            )
    }

    fn backup_status() -> impl Strategy<Value = v1::BackupStatus> {
        let record = (
            "2026-12-0[1-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]Z",
            "s3://[a-z]{1,6}/[a-z-]{1,12}\\.db",
            0i64..1_000_000_000,
            "[0-9a-f]{64}",
            0i64..1_000_000,
            proptest::option::of(0i64..1_000_000),
            "[a-z]{1,5}-[0-6]",
            proptest::option::of((0i64..4_294_967_296, -1i64..1_000_000)),
        )
            .prop_map(
                |(time, uri, size, sha256, revision, keys, member, hashed)| v1::SnapshotRecord {
                    time,
                    uri,
                    size,
                    sha256,
                    revision,
                    keys,
                    hash: hashed.map(|h| h.0),
                    compact_revision: hashed.map(|h| h.1),
                    member,
                },
            );
        let verified = (
            "2026-12-0[1-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]Z",
            "s3://[a-z]{1,6}/[a-z-]{1,12}\\.db",
            "(Verified|Failed|Inconclusive)",
            "[ -~]{0,40}",
        )
            .prop_map(|(time, uri, outcome, message)| v1::Verification {
                time,
                uri,
                outcome,
                message,
            });
        let failure = (
            "2026-12-0[1-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]Z",
            "(upload|snapshot|verify)",
            "[ -~]{0,40}",
        )
            .prop_map(|(time, step, message)| v1::BackupFailure {
                time,
                step,
                message,
            });
        (
            option::of(record),
            option::of(failure),
            option::of(verified),
        )
            .prop_map(|(last, last_failure, last_verified)| v1::BackupStatus {
                last,
                last_failure,
                last_verified,
            })
    }

    fn metadata() -> impl Strategy<Value = Value> {
        (
            "[a-z][a-z0-9-]{0,10}",
            "[a-z]{1,8}",
            option::of(btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 1..3)),
            option::of(btree_map("[a-z]{1,6}(/[a-z]{1,4})?", ".{0,10}", 1..3)),
        )
            .prop_map(|(name, ns, labels, annotations)| {
                let mut m = json!({
                    "name": name, "namespace": ns,
                    "uid": "3415a7fc-162b-4300-b5da-fd6083580d66",
                    "resourceVersion": "143", "generation": 2,
                    "creationTimestamp": "2019-09-04T14:03:02Z",
                    "finalizers": ["etcd.example.com/finalizer"],
                });
                if let Some(l) = labels {
                    m["labels"] = json!(l);
                }
                if let Some(a) = annotations {
                    m["annotations"] = json!(a);
                }
                m
            })
    }

    /// Whole v1 objects.
    pub fn v1_object() -> impl Strategy<Value = Value> {
        (metadata(), v1_spec(), option::of(v1_status())).prop_map(|(metadata, spec, status)| {
            let mut o = json!({
                "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                "metadata": metadata, "spec": spec,
            });
            if let Some(s) = status {
                o["status"] = json!(s);
            }
            o
        })
    }

    /// Whole v1alpha1 objects as a user would write them (no conversion data).
    fn alpha_object() -> impl Strategy<Value = Value> {
        (
            metadata(),
            1i32..=crate::api::MAX_SIZE,
            (0u32..12, 0u32..30, 0u32..40),
            option::of("[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?"),
            1i64..100_000,
            // Either, both or none of backupEnabled and backupSchedule.
            (
                option::of(any::<bool>()),
                option::of(prop_oneof![Just("0 */6 * * *"), Just("@hourly")]),
            ),
            option::of((option::of(phase()), option::of(0i32..8))),
        )
            .prop_map(
                |(metadata, replicas, (a, b, c), class, gi, backup, status)| {
                    let mut o = json!({
                        "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
                        "metadata": metadata,
                        "spec": {"replicas": replicas, "etcdVersion": format!("{a}.{b}.{c}"),
                                 "storageSizeGi": gi},
                    });
                    if let Some(class) = class {
                        o["spec"]["storageClassName"] = json!(class);
                    }
                    let (enabled, schedule) = backup;
                    if let Some(enabled) = enabled {
                        o["spec"]["backupEnabled"] = json!(enabled);
                    }
                    if let Some(schedule) = schedule {
                        o["spec"]["backupSchedule"] = json!(schedule);
                    }
                    if let Some((phase, ready)) = status {
                        o["status"] = json!(v1alpha1::EtcdClusterStatus {
                            phase,
                            ready_replicas: ready
                        });
                    }
                    o
                },
            )
    }

    /// Whole v1beta1 objects as a user would write them.
    fn beta_object() -> impl Strategy<Value = Value> {
        (v1_object(), any::<bool>()).prop_map(|(hub, keep_backup)| {
            let mut o = convert_object(&hub, Version::V1Beta1).unwrap();
            if let Some(a) = o
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                a.remove(CONVERSION_ANNOTATION);
                if a.is_empty() {
                    o["metadata"].as_object_mut().unwrap().remove("annotations");
                }
            }
            if !keep_backup {
                o["spec"].as_object_mut().unwrap().remove("backup");
            }
            o
        })
    }

    fn round_trip(obj: &Value, via: Version) -> Value {
        let home = version_of(obj).unwrap();
        let there = convert_object(obj, via).unwrap();
        assert_eq!(version_of(&there).unwrap(), via);
        for key in ["name", "namespace", "uid", "labels"] {
            assert_eq!(
                there["metadata"][key], obj["metadata"][key],
                "{key} changed"
            );
        }
        convert_object(&there, home).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn every_version_round_trips_through_every_other(hub in v1_object()) {
            for a in Version::ALL {
                let start = convert_object(&hub, a).unwrap();
                // Going down and back up is the identity on the hub.
                prop_assert_eq!(&convert_object(&start, Version::V1).unwrap(), &hub);
                for b in Version::ALL {
                    prop_assert_eq!(&round_trip(&start, b), &start, "{} -> {} -> {}", a, b, a);
                }
            }
        }

        #[test]
        fn v1alpha1_as_written_round_trips(obj in alpha_object()) {
            for b in Version::ALL {
                prop_assert_eq!(&round_trip(&obj, b), &obj, "v1alpha1 -> {} -> v1alpha1", b);
            }
        }

        #[test]
        fn v1beta1_as_written_round_trips(obj in beta_object()) {
            for b in Version::ALL {
                prop_assert_eq!(&round_trip(&obj, b), &obj, "v1beta1 -> {} -> v1beta1", b);
            }
        }

        #[test]
        fn only_the_stash_annotation_changes_in_metadata(hub in v1_object()) {
            for a in [Version::V1Alpha1, Version::V1Beta1] {
                let mut down = convert_object(&hub, a).unwrap();
                let mut before = hub.clone();
                for o in [&mut down, &mut before] {
                    let m = o["metadata"].as_object_mut().unwrap();
                    if let Some(ann) = m.get_mut("annotations").and_then(Value::as_object_mut) {
                        ann.remove(CONVERSION_ANNOTATION);
                        if ann.is_empty() { m.remove("annotations"); }
                    }
                }
                prop_assert_eq!(&down["metadata"], &before["metadata"]);
            }
        }
    }

    #[test]
    fn maps_fields_by_name() {
        let alpha = json!({
            "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"replicas": 3, "etcdVersion": "3.5.10", "storageClassName": "ssd",
                     "storageSizeGi": 20, "backupEnabled": true, "backupSchedule": "0 * * * *"},
            "status": {"phase": "Running", "readyReplicas": 3}
        });
        let v1 = convert_object(&alpha, Version::V1).unwrap();
        assert_eq!(
            v1["spec"],
            json!({"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "20Gi",
                   "backup": {"enabled": true, "schedule": "0 * * * *", "retention": 7}})
        );
        assert_eq!(
            v1["status"],
            json!({"phase": "Running", "readyReplicas": 3})
        );
        assert!(v1["metadata"].get("annotations").is_none());
        let beta = convert_object(&alpha, Version::V1Beta1).unwrap();
        assert_eq!(
            beta["spec"],
            json!({"size": 3, "version": "v3.5.10", "storage": {"className": "ssd", "size": "20Gi"},
                   "backup": {"enabled": true, "schedule": "0 * * * *"}})
        );
    }

    #[test]
    fn stash_holds_only_what_the_old_version_lacks() {
        let hub = json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "default", "annotations": {"note": "x"}},
            "spec": {"size": 3, "version": "v3.5.10", "storageClass": "standard", "storageSize": "010Gi",
                     "backup": {"enabled": true, "schedule": "@daily", "retention": 3, "destination": "s3://b/p"}},
            "status": {"observedGeneration": 4, "endpoints": ["http://a-0.a.default.svc:2379"]}
        });
        let alpha = convert_object(&hub, Version::V1Alpha1).unwrap();
        let stash: Stash = serde_json::from_str(
            alpha["metadata"]["annotations"][CONVERSION_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            stash,
            Stash {
                storage_size: Some("010Gi".into()),
                backup_retention: Some(3),
                backup_destination: Some("s3://b/p".into()),
                endpoints: Some(vec!["http://a-0.a.default.svc:2379".into()]),
                observed_generation: Some(4),
                ..Stash::default()
            }
        );
        assert_eq!(alpha["metadata"]["annotations"]["note"], "x");
        assert_eq!(alpha["spec"]["storageSizeGi"], 10);
    }

    /// Issue 12, item 9: `backupEnabled` without `backupSchedule` came back with the default
    /// schedule filled in.
    #[test]
    fn a_partial_v1alpha1_backup_block_comes_back_partial() {
        let alpha = json!({
            "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"replicas": 3, "etcdVersion": "3.5.10", "storageClassName": "ssd",
                     "storageSizeGi": 20, "backupEnabled": true}
        });
        let v1 = convert_object(&alpha, Version::V1).unwrap();
        // v1 holds the full block (what the controller reads) and remembers the gap.
        assert_eq!(
            v1["spec"]["backup"],
            json!({"enabled": true, "schedule": "0 */6 * * *", "retention": 7})
        );
        assert_eq!(
            v1["metadata"]["annotations"][CONVERSION_ANNOTATION],
            r#"{"noBackupSchedule":true}"#
        );
        for via in Version::ALL {
            assert_eq!(round_trip(&alpha, via), alpha, "via {via}");
        }
        // A schedule set since in v1 shows in v1alpha1.
        let mut edited = v1.clone();
        edited["spec"]["backup"]["schedule"] = json!("@daily");
        let back = convert_object(&edited, Version::V1Alpha1).unwrap();
        assert_eq!(back["spec"]["backupSchedule"], "@daily");
        // So does a block removed in v1: no backup at all, and no gap left behind.
        let mut removed = v1;
        removed["spec"].as_object_mut().unwrap().remove("backup");
        let back = convert_object(&removed, Version::V1Alpha1).unwrap();
        assert!(back["spec"].get("backupEnabled").is_none());
        assert!(back["metadata"].get("annotations").is_none(), "{back}");
    }

    #[test]
    fn an_edit_in_the_old_version_wins_over_the_stash() {
        let hub = json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster", "metadata": {"name": "a"},
            "spec": {"size": 3, "version": "v3.5.10", "storageClass": "standard", "storageSize": "010Gi"}
        });
        let mut alpha = convert_object(&hub, Version::V1Alpha1).unwrap();
        alpha["spec"]["storageSizeGi"] = json!(20);
        let back = convert_object(&alpha, Version::V1).unwrap();
        assert_eq!(back["spec"]["storageSize"], "20Gi");
    }

    #[test]
    fn unreadable_stash_is_ignored_not_fatal() {
        let alpha = json!({
            "apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "annotations": {CONVERSION_ANNOTATION: "{not json"}},
            "spec": {"replicas": 3, "etcdVersion": "3.5.10", "storageClassName": "standard", "storageSizeGi": 10}
        });
        let v1 = convert_object(&alpha, Version::V1).unwrap();
        assert!(v1["metadata"].get("annotations").is_none());
    }

    #[test]
    fn unconvertible_objects_say_why() {
        let cases = [
            (json!([1]), "not a JSON object"),
            (
                json!({"apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster"}),
                "spec: invalid type: null",
            ),
            (
                json!({"apiVersion": "etcd.example.com/v1", "kind": "Pod"}),
                "kind \"Pod\" is not EtcdCluster",
            ),
            (
                json!({"apiVersion": "etcd.example.com/v2", "kind": "EtcdCluster"}),
                "not a served version",
            ),
            (
                json!({"apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster", "spec": {"replicas": "three"}}),
                "spec.replicas: invalid type",
            ),
            (
                json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                       "spec": {"size": 3, "storageSize": "99999999999999999999Gi"}}),
                "no whole-GiB integer form",
            ),
        ];
        for (obj, want) in cases {
            let to = match version_of(&obj) {
                Ok(Version::V1) => Version::V1Alpha1,
                _ => Version::V1,
            };
            let err = convert_object(&obj, to).unwrap_err().to_string();
            assert!(err.contains(want), "{obj}: {err}");
        }
    }
}
