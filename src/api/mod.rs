//! The EtcdCluster API: one module per version, the CRD assembled from them, and the
//! conversion between them.

pub mod cel;
pub mod convert;
pub mod defaults;
mod definition;
pub mod etcd_version;
mod field;
pub mod quantity;
pub mod schema;
mod space;
pub mod strict;
pub mod v1;
pub mod v1alpha1;
pub mod v1beta1;

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "etcd.example.com";
pub const KIND: &str = "EtcdCluster";
pub const PLURAL: &str = "etcdclusters";
/// The field manager of every apply, the `app.kubernetes.io/managed-by` value of every child
/// object, and the reporting controller of Events.
pub const MANAGER: &str = "etcd-webhook";
/// A storage class name is a DNS-1123 subdomain (every version's schema and the rules): any
/// StorageClass of the cluster. Unset, the members' claims name none and get the cluster's
/// default class.
pub const STORAGE_CLASS_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// The longest DNS-1123 subdomain.
pub const STORAGE_CLASS_MAX_LENGTH: u32 = 253;

/// A DNS-1123 subdomain (at most 253 characters: object names such as StorageClasses and
/// Secrets) or, with `label`, a DNS-1123 label (at most 63: namespaces).
pub fn dns1123(s: &str, label: bool) -> bool {
    let max = if label { 63 } else { 253 };
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    s.len() <= max
        && (if label {
            part_ok(s)
        } else {
            s.split('.').all(part_ok)
        })
}

/// Why `name` cannot name a StorageClass (what [`STORAGE_CLASS_PATTERN`] says, in words).
pub fn storage_class_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty: leave the field out for the cluster's default class");
    }
    if name.len() > STORAGE_CLASS_MAX_LENGTH as usize {
        return Some("must be at most 253 characters (a StorageClass name)");
    }
    (!dns1123(name, false)).then_some(
        "must be a StorageClass name: lower-case letters, digits, '-' and '.', starting and \
         ending with a letter or digit",
    )
}

/// Whether a cluster takes snapshots: backups are on to a destination they can be filed in.
/// Such a cluster's deletion waits for a final snapshot, and its claims are kept until then.
pub fn backups_on(spec: &v1::EtcdClusterSpec) -> bool {
    spec.backup.as_ref().is_some_and(|b| {
        b.enabled
            && b.destination
                .as_deref()
                .is_none_or(|d| d.is_empty() || backup_destination_error(d).is_none())
    })
}

/// Why `destination` cannot take a cluster's snapshots (`/validate` and the loop say the same
/// words): the backups file them in S3 or an S3-compatible store, or on the backup claim when
/// the field is unset.
pub fn backup_destination_error(destination: &str) -> Option<&'static str> {
    let Some(rest) = destination.strip_prefix("s3://") else {
        return Some(
            "is not supported: use s3://bucket/prefix (S3 or an S3-compatible store), or leave it unset to keep snapshots on the volume claim NAME-backup",
        );
    };
    let bucket = rest.split('/').next().unwrap_or("");
    if bucket.is_empty() || destination.chars().any(char::is_whitespace) {
        return Some("must name a bucket, like s3://bucket/prefix, with no spaces");
    }
    None
}

/// Where `spec.restore.from` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotSource<'a> {
    /// `s3://bucket/key`: read with the cluster's Secret `NAME-backup-credentials` or the
    /// pod's own identity.
    S3(&'a str),
    /// `pvc://CLAIM/FILE`: a file at the top of a volume claim in the cluster's namespace,
    /// such as a backup claim `NAME-backup` (which outlives its cluster).
    Claim { claim: &'a str, file: &'a str },
}

/// The scheme of a snapshot on a volume claim (`status.backup.last.uri` of a backup to the
/// claim, and `spec.restore.from`).
pub const CLAIM_SCHEME: &str = "pvc://";

/// The URI of the snapshot `file` at the top of the volume claim `claim`.
pub fn claim_uri(claim: &str, file: &str) -> String {
    format!("{CLAIM_SCHEME}{claim}/{file}")
}

impl<'a> SnapshotSource<'a> {
    /// Reads `from`; the error is what `/validate` and the loop say (the same words).
    pub fn parse(from: &'a str) -> Result<SnapshotSource<'a>, &'static str> {
        if from.chars().any(char::is_whitespace) {
            return Err("must not contain spaces");
        }
        if let Some(rest) = from.strip_prefix("s3://") {
            return match rest.split_once('/') {
                Some((bucket, key))
                    if !bucket.is_empty() && !key.is_empty() && !key.ends_with('/') =>
                {
                    Ok(SnapshotSource::S3(from))
                }
                _ => Err(
                    "must name a bucket and a snapshot file, like s3://bucket/prefix/NAME-snapshot-<time>.db",
                ),
            };
        }
        if let Some(rest) = from.strip_prefix(CLAIM_SCHEME) {
            return match rest.split_once('/') {
                Some((claim, file))
                    if dns1123(claim, false)
                        && !file.is_empty()
                        && !file.contains('/')
                        && file != "."
                        && file != ".." =>
                {
                    Ok(SnapshotSource::Claim { claim, file })
                }
                _ => Err(
                    "must name a volume claim of this namespace and a file at its top, like pvc://NAME-backup/NAME-snapshot-<time>.db",
                ),
            };
        }
        Err(
            "is not supported: use s3://bucket/prefix/NAME-snapshot-<time>.db, or pvc://NAME-backup/NAME-snapshot-<time>.db for a snapshot on a volume claim of this namespace",
        )
    }
}

/// Why `from` cannot name a snapshot to restore (`/validate` and the loop say the same words).
pub fn restore_source_error(from: &str) -> Option<&'static str> {
    SnapshotSource::parse(from).err()
}

/// What `/validate` and the CRD say to a change of `spec.restore`.
pub const RESTORE_IMMUTABLE: &str =
    "is set at creation only: a cluster starts from a snapshot once, before its first member runs";

/// What `/validate` and the CRD say to a change of `spec.tls`.
pub const TLS_IMMUTABLE: &str = "is set at creation only: members cannot move between plain HTTP and TLS in place; take a backup, create a cluster with the TLS you want and restore it from that snapshot (README: Member TLS)";

/// The label (value `"true"`) on a TLS cluster's client certificate Secret that puts it in the
/// loop's cache (cert-manager sets it from the Certificate's `secretTemplate`; a Secret the
/// user makes may carry it too). The loop presents that certificate to the members on every
/// pass; without the label it reads the Secret through the API each time.
pub const CLIENT_TLS_LABEL: &str = "etcd.example.com/client-tls";

/// Whether the members of a cluster with `spec` talk TLS.
pub fn tls_on(spec: &v1::EtcdClusterSpec) -> bool {
    spec.tls.as_ref().is_some_and(|t| t.enabled != Some(false))
}

/// The most members a cluster may have (every version's schema and the rules).
pub const MAX_SIZE: i32 = 7;

pub use definition::{crd, crd_document, crd_in_namespace, crd_yaml};
pub use etcd_version::EtcdVersion;
pub use field::Field;
pub use quantity::StorageSize;
pub use space::*;

/// Annotation that carries, on an older version, the v1 fields that version cannot express.
pub const CONVERSION_ANNOTATION: &str = "etcd.example.com/conversion-data";

/// Where the apiserver finds the conversion webhook; matches `config/` and the chart.
pub const WEBHOOK_SERVICE: &str = "etcd-webhook";
pub const WEBHOOK_NAMESPACE: &str = "etcd-system";
pub const CONVERT_PATH: &str = "/convert";
/// The cert-manager Certificate whose CA cainjector writes into the conversion webhook's
/// caBundle (and the admission webhooks'); the caBundle itself is never written in a file.
pub const SERVING_CERTIFICATE: &str = "etcd-webhook-serving";

/// A served version of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    V1Alpha1,
    V1Beta1,
    V1,
}

impl Version {
    pub const ALL: [Version; 3] = [Version::V1Alpha1, Version::V1Beta1, Version::V1];

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1Alpha1 => "v1alpha1",
            Version::V1Beta1 => "v1beta1",
            Version::V1 => "v1",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Version::V1Alpha1 => "etcd.example.com/v1alpha1",
            Version::V1Beta1 => "etcd.example.com/v1beta1",
            Version::V1 => "etcd.example.com/v1",
        }
    }

    /// Parses a bare version (`v1beta1`).
    pub fn from_version(v: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|x| x.as_str() == v)
    }

    /// Parses a full apiVersion (`etcd.example.com/v1beta1`).
    pub fn from_api_version(api_version: &str) -> Option<Version> {
        Version::ALL
            .into_iter()
            .find(|x| x.api_version() == api_version)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle phase, the same in every version.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Creating,
    Running,
    Failed,
    Deleting,
}

/// Schema of `status.phase`: a plain string enum (schemars would list `null` among the values).
pub(crate) fn phase_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Lifecycle phase: Creating until every member is ready, then Running.",
        "type": "string",
        "enum": ["Creating", "Running", "Failed", "Deleting"]
    })
}

/// Schema of `spec.tls.certificates`: a string of the two values (no `null` among them, which
/// kubectl's schema check refuses).
pub(crate) fn certificate_source_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Who makes the three Secrets: `CertManager` (unset): the loop makes cert-manager Certificates for them; `Secrets`: you do, before the cluster starts.",
        "type": "string",
        "enum": ["CertManager", "Secrets"]
    })
}

/// Schema of `spec.recovery.quorumLoss`: a string of the two values (no `null` among them).
pub(crate) fn quorum_loss_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "`Automatic` (unset): when one member with data is all that is left (every other member's pod reports an empty volume), the empty members rejoin from it at once. `Manual`: the `Available` condition says what the loop would do, what it keeps and the plan to approve, and the loop waits for `kubectl annotate ec NAME -n NS etcd.example.com/approve-recovery=PLAN --overwrite` naming that plan.",
        "type": "string",
        "enum": ["Automatic", "Manual"]
    })
}

/// The annotation a person approves a recovery plan with, when `spec.recovery.quorumLoss` is
/// `Manual`: its value must be the plan the `Available` condition names (a plan names the
/// survivor and its applied index, so an approval of an earlier loss approves nothing new).
pub const APPROVE_RECOVERY_ANNOTATION: &str = "etcd.example.com/approve-recovery";

/// The longest condition message the apiserver takes (metav1.Condition's limit), in characters.
pub const CONDITION_MESSAGE_MAX: usize = 32768;

/// Schema of `status.conditions`: metav1.Condition with the constraints the apiserver's own
/// types carry (kubebuilder's markers on metav1.Condition), a list keyed by `type`.
pub(crate) fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Ready, Progressing and (with backups) BackupReady: one entry per type.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "maxItems": 16,
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "type": {
                    "description": "Type of condition in CamelCase or in foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was set from.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "lastTransitionTime": {
                    "description": "When the status last changed.",
                    "type": "string",
                    "format": "date-time"
                },
                "reason": {
                    "description": "Why, in CamelCase.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "message": {
                    "description": "Details for a person.",
                    "type": "string",
                    "maxLength": CONDITION_MESSAGE_MAX
                }
            }
        }
    })
}
