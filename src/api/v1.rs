//! `etcd.example.com/v1`: the hub and storage version.
// clippy mistakes the repeated `type_ = "integer"` of two printcolumns for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Phase, defaults};

/// Desired state of an etcd cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.example.com",
    version = "v1",
    kind = "EtcdCluster",
    plural = "etcdclusters",
    shortname = "ec",
    namespaced,
    doc = "An etcd cluster managed by etcd-webhook (storage version).",
    status = "EtcdClusterStatus",
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "SIZE", type_ = "integer", json_path = ".spec.size"),
    printcolumn(name = "READY", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "LAST BACKUP",
        type_ = "date",
        json_path = ".status.backup.last.time"
    ),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    /// Number of etcd members. Odd, so that a majority quorum survives failures.
    #[schemars(range(min = 1, max = super::MAX_SIZE))]
    pub size: i32,
    /// etcd release, e.g. v3.5.10.
    #[serde(default = "defaults::version")]
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$"), length(max = 32))]
    pub version: String,
    /// StorageClass of the members' volumes: any class of the cluster. Unset, the claims
    /// name none and get the cluster's default class (or the webhook's
    /// `--default-storage-class`, filled in at creation). Never changes after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = super::STORAGE_CLASS_PATTERN), length(max = super::STORAGE_CLASS_MAX_LENGTH))]
    pub storage_class: Option<String>,
    /// Size of each member's volume in whole GiB, e.g. 10Gi.
    #[serde(default = "defaults::storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+Gi$"), length(max = 32))]
    pub storage_size: String,
    /// Periodic snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Backup>,
    /// Start the cluster from a snapshot instead of empty. Set at creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Restore>,
}

/// The snapshot a new cluster starts from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restore {
    /// The snapshot, e.g. another cluster's `status.backup.last.uri`:
    /// `s3://bucket/prefix/NAME-snapshot-<time>.db`, read with this cluster's Secret
    /// `NAME-backup-credentials` (or the pod's identity).
    #[schemars(length(max = 1024))]
    pub from: String,
    /// The SHA-256 (hex) the snapshot must have, e.g. the source's
    /// `status.backup.last.sha256`. etcd's own integrity hash is checked either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{64}$"))]
    pub sha256: Option<String>,
}

/// Periodic snapshot settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    /// Take snapshots on the schedule.
    #[serde(default)]
    pub enabled: bool,
    /// Five-field cron schedule.
    #[serde(default = "defaults::backup_schedule")]
    pub schedule: String,
    /// Number of snapshots kept.
    #[serde(default = "defaults::backup_retention")]
    #[schemars(range(min = 1, max = 100))]
    pub retention: i32,
    /// Where snapshots go, e.g. s3://bucket/prefix; a volume claim when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::phase_schema")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Client URLs of the members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// What the backups did: the newest snapshot filed, and the newest failed run when it is
    /// newer than that snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupStatus>,
}

/// The backups' record in the status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The newest snapshot filed (scheduled or final).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<SnapshotRecord>,
    /// The newest backup run that failed, while no snapshot has been filed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<BackupFailure>,
}

/// A snapshot a backup run filed, as it reported it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// When the snapshot was taken (RFC 3339).
    pub time: String,
    /// Where it is: `s3://bucket/prefix/NAME-snapshot-<time>.db`, or its path on the backup
    /// claim.
    pub uri: String,
    /// Bytes (the database and etcd's appended hash).
    pub size: i64,
    /// SHA-256 of the file, hex: the object read back had it.
    pub sha256: String,
    /// The snapshot holds every revision up to at least this one.
    pub revision: i64,
    /// The member it was taken from.
    pub member: String,
}

/// A backup run that failed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupFailure {
    /// When the run ended (RFC 3339).
    pub time: String,
    /// The step that failed: `choose a member`, `snapshot`, `verify`, `upload`, `read back`,
    /// `retention`, `arguments`, or `run` (the container ended without a report).
    pub step: String,
    pub message: String,
}
