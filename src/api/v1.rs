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
    printcolumn(name = "LEADER", type_ = "string", json_path = ".status.leader"),
    printcolumn(name = "VERSION", type_ = "string", json_path = ".spec.version"),
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
    /// etcd release, e.g. v3.6.4.
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
    /// etcd's upkeep: its space quota, compaction of old revisions, defragmentation. Unset
    /// fields take the defaults each names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Maintenance>,
    /// TLS on the members' peer and client ports, with client certificates required on both.
    /// Set at creation only: members cannot move between plain HTTP and TLS in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
    /// What the loop does by itself when a majority of the members is gone. Unset: the
    /// default each field names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// What the loop does by itself after a lost quorum (docs/clusters.md, "When quorum is lost").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// `Automatic` (unset): when one member with data is all that is left (every other
    /// member's pod reports an empty volume), the empty members rejoin from it at once.
    /// `Manual`: the `Available` condition says what the loop would do, what it keeps and the
    /// plan to approve, and the loop waits for `kubectl annotate ec NAME -n NS
    /// etcd.example.com/approve-recovery=PLAN --overwrite` naming that plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::quorum_loss_schema")]
    pub quorum_loss: Option<QuorumLoss>,
}

/// Whether the loop recovers from a lost quorum by itself or waits for an approval.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum QuorumLoss {
    Automatic,
    Manual,
}

/// TLS for a cluster's members: `https://` peer and client URLs, `--client-cert-auth` and
/// `--peer-client-cert-auth`, certificates in the Secrets `NAME-peer-tls`, `NAME-server-tls`
/// and `NAME-client-tls` (keys `tls.crt`, `tls.key`, `ca.crt`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tls {
    /// `false` keeps the members on plain HTTP; unset or `true` turns TLS on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Who makes the three Secrets: `CertManager` (unset): the loop makes cert-manager
    /// Certificates for them; `Secrets`: you do, before the cluster starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::certificate_source_schema")]
    pub certificates: Option<CertificateSource>,
    /// The cert-manager issuer that signs the members' certificates. Unset: a CA of the
    /// cluster's own, made with cert-manager (Issuer `NAME-selfsigned`, Certificate `NAME-ca`,
    /// Issuer `NAME-ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// Who makes a TLS cluster's Secrets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CertificateSource {
    CertManager,
    Secrets,
}

/// A cert-manager issuer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `Issuer` (unset, in the cluster's namespace) or `ClusterIssuer`, or an external
    /// issuer's kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub kind: Option<String>,
    /// Unset: `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub group: Option<String>,
}

/// etcd's upkeep: how much it may store, how much history it keeps, when the loop
/// defragments a member.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Maintenance {
    /// etcd's backend quota in bytes (`--quota-backend-bytes`): past it etcd raises the NOSPACE
    /// alarm and refuses writes. Unset: half of `storageSize` after the WAL's 384 MiB (room
    /// for the copy a defragmentation writes), at most 8 GiB, so it grows with the volume.
    /// Set: at least 16 MiB, at most that and 8 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = super::QUOTA_MIN_BYTES, max = super::QUOTA_MAX_BYTES))]
    pub quota_backend_bytes: Option<i64>,
    /// How much history etcd keeps (`--auto-compaction-mode=periodic`,
    /// `--auto-compaction-retention`): a duration such as `30m` or `1h`; `0` keeps every
    /// revision (never compacts). Unset: `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,3}(s|m|h))$"), length(max = 8))]
    pub auto_compaction_retention: Option<String>,
    /// Defragment a member when the space it could give back (`dbSize - dbSizeInUse`) is at
    /// least this percentage of its database (and at least 1 MiB); `0` never defragments
    /// (except to recover from NOSPACE). Unset: 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 99))]
    pub defrag_threshold_percent: Option<i32>,
}

/// The snapshot a new cluster starts from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restore {
    /// The snapshot, e.g. another cluster's `status.backup.last.uri`:
    /// `s3://bucket/prefix/NAME-snapshot-<time>.db`, read with this cluster's Secret
    /// `NAME-backup-credentials` (or the pod's identity), or
    /// `pvc://NAME-backup/NAME-snapshot-<time>.db`, a file on a volume claim of this
    /// namespace (mounted read-only by one restore Job at a time).
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
    /// The member that leads, as etcd last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub leader: Option<String>,
    /// Every member as etcd last reported it (sizes to the MiB, so a database that grows a
    /// little does not rewrite the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub members: Option<Vec<MemberState>>,
}

/// One member, as etcd reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberState {
    /// The member's name (its pod), or its ID when it has never started.
    #[schemars(length(max = 253))]
    pub name: String,
    /// etcd's member ID, hex.
    #[schemars(length(max = 16))]
    pub id: String,
    /// `Leader`, `Follower` or `Learner`.
    #[schemars(length(max = 16))]
    pub role: String,
    /// It answered with a leader known and no error.
    pub healthy: bool,
    /// The etcd release it runs (empty when it did not answer).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32))]
    pub version: String,
    /// Its database on disk, and the part in use, in bytes rounded down to the MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_in_use: Option<i64>,
    /// The alarms it has raised (`NOSPACE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub alarms: Vec<String>,
    /// When the loop last defragmented it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub last_defragmentation: Option<String>,
    /// When the member at this ordinal was last found corrupt (its data not what a majority of
    /// the voters hold) and replaced by the loop (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub corruption_detected_at: Option<String>,
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
    /// The newest snapshot restored in a sandbox and compared with what its backup recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verified: Option<Verification>,
}

/// A snapshot restored in a sandbox (a Job: fetched with its SHA-256 checked, `etcdutl snapshot
/// restore` into a scratch folder, a lone etcd started on it) and its keys compared with what
/// the backup recorded at the snapshot's revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// When the verification ended (RFC 3339).
    pub time: String,
    /// The snapshot verified (`status.backup.last.uri` then).
    pub uri: String,
    /// `Verified`: it restores, with as many keys and the same hash at its revision;
    /// `Failed`: it does not (the message says what differs or which step failed);
    /// `Inconclusive`: the history was compacted between the count and the snapshot, so the
    /// hashes count from different revisions (the next snapshot is verified anew).
    pub outcome: String,
    /// What was compared, or what failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A snapshot a backup run filed, as it reported it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// When the snapshot was taken (RFC 3339).
    pub time: String,
    /// Where it is: `s3://bucket/prefix/NAME-snapshot-<time>.db`, or
    /// `pvc://NAME-backup/NAME-snapshot-<time>.db` on the backup claim (what
    /// `spec.restore.from` takes).
    pub uri: String,
    /// Bytes (the database and etcd's appended hash).
    pub size: i64,
    /// SHA-256 of the file, hex: the object read back had it.
    pub sha256: String,
    /// The snapshot holds every revision up to at least this one.
    pub revision: i64,
    /// How many keys the store held at `revision` (a restored cluster has as many there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// etcd's hash of the keys at `revision` on the member it was taken from
    /// (`maintenance/hashkv`), what a restore must give there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<i64>,
    /// The revision that hash counts from (the member's compaction; -1: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_revision: Option<i64>,
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
