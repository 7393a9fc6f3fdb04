//! A cluster made from a snapshot: each member's claim made ahead, and the restore Job that
//! fetches the snapshot, checks it and writes the member's data directory with etcdutl.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, SecretEnvSource, Volume, VolumeMount,
};
use kube::ResourceExt;

use super::members::claim_spec;
use super::*;
use crate::api::SnapshotSource;

/// The folder a restore Job mounts the claim of a `pvc://` snapshot at (read-only).
pub const RESTORE_SOURCE_MOUNT: &str = "/source";

/// Member `ordinal`'s claim `data-NAME-<ordinal>` as the StatefulSet's claim template makes it,
/// made ahead by the loop for a restore (the StatefulSet then uses it). The cluster owns it
/// without controlling it: the StatefulSet's retention policy (`whenDeleted: Delete`) makes
/// the StatefulSet its controller once it makes the member's pod, as for a claim it made
/// itself; a claim another controller controls is left out of that policy, with a
/// `ConflictingController` Warning on every pod the StatefulSet makes. Until then (a restore
/// that never finished), the garbage collector deletes it with the cluster.
pub fn member_claim_object(ec: &EtcdCluster, ordinal: i32) -> PersistentVolumeClaim {
    let mut metadata = meta(ec, member_claim(ec, ordinal), "member");
    for o in metadata.owner_references.iter_mut().flatten() {
        o.controller = Some(false);
    }
    PersistentVolumeClaim {
        metadata,
        spec: Some(claim_spec(ec)),
        ..Default::default()
    }
}

/// A restore in place ([`RESTORE_IN_PLACE_ANNOTATION`], then [`RESTORED_FROM_ANNOTATION`]):
/// the snapshot, its SHA-256 (every member's fetch must match it), and the recovery plan it
/// carries out (`quorum::Diagnosis::Restoring`), which makes the restored cluster's ID one no
/// former cluster under this name had.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct InPlace {
    pub from: String,
    pub sha256: String,
    pub plan: String,
    /// The EtcdCluster it was written for (`metadata.uid`): on any other object (a manifest
    /// exported and applied again) it is refused.
    pub uid: String,
    /// The etcd cluster ID (hex) the lost cluster had: the clear runs only while the cluster
    /// still records it.
    pub cluster: String,
    /// Where every member's data was copied first (the rescue copies).
    pub copies: Vec<String>,
}

impl InPlace {
    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("strings serialize")
    }

    /// The annotation `key` on the cluster, read; why not, when it is there and unreadable or
    /// was written for another object.
    pub fn read(ec: &EtcdCluster, key: &str) -> Option<Result<InPlace, String>> {
        let value = ec.annotations().get(key)?;
        let read = serde_json::from_str::<InPlace>(value)
            .map_err(|e| format!("the annotation {key} is not what the loop wrote ({e})"))
            .and_then(|p| {
                let uid = ec.metadata.uid.as_deref().unwrap_or_default();
                if p.uid == uid {
                    Ok(p)
                } else {
                    Err(format!(
                        "the annotation {key} was written for another EtcdCluster (uid {}, this one is {uid})",
                        p.uid
                    ))
                }
            });
        Some(read)
    }
}

/// What the members are (to be) restored from: a restore in place, asked for
/// ([`RESTORE_IN_PLACE_ANNOTATION`]) or under way ([`RESTORED_FROM_ANNOTATION`]), else
/// `spec.restore`. Once the cluster has an etcd cluster ID again it is what it started from.
pub fn restore_source(ec: &EtcdCluster) -> Option<crate::api::v1::Restore> {
    [RESTORE_IN_PLACE_ANNOTATION, RESTORED_FROM_ANNOTATION]
        .into_iter()
        .find_map(|key| InPlace::read(ec, key)?.ok())
        .map(|p| crate::api::v1::Restore {
            from: p.from,
            sha256: Some(p.sha256),
        })
        .or_else(|| ec.spec.restore.clone())
}

/// What tells this restore's data from any other under this name: the cluster's UID, and for a
/// restore in place its plan (the restore token and `place-restored`'s marker).
fn restore_id(ec: &EtcdCluster) -> String {
    let uid = ec.metadata.uid.as_deref().unwrap_or("restored");
    match InPlace::read(ec, RESTORED_FROM_ANNOTATION) {
        Some(Ok(p)) => format!("{uid}.{}", p.plan),
        _ => uid.to_owned(),
    }
}

/// How far a restore moves the revision on (etcdutl `--bump-revision`, with `--mark-compacted`):
/// past any revision the former cluster's clients can have seen, so a watcher that resumes
/// from one is told its revision is compacted and lists anew (the Kubernetes restore guide's
/// advice), instead of missing events or seeing revisions go back.
pub const RESTORE_REVISION_BUMP: u64 = 1_000_000_000;

/// `--bump-revision` and `--mark-compacted` for an etcdutl that has them (v3.5.10 and later).
fn revision_bump(version: &str) -> Vec<String> {
    if crate::api::EtcdVersion::at_least(version, 3, 5, 10) {
        vec![
            format!("--bump-revision={RESTORE_REVISION_BUMP}"),
            "--mark-compacted".to_owned(),
        ]
    } else {
        Vec::new()
    }
}

/// Job `NAME-restore-<ordinal>`: member `ordinal`'s data directory made from a snapshot, on the
/// member's own claim (`data-NAME-<ordinal>`, which the StatefulSet then adopts), before the
/// member first starts. An init container of `--backup-image` fetches the snapshot and checks
/// it (etcd's integrity hash, and `sha256` when given: a corrupt snapshot fails the Job and no
/// data directory is made); then `etcdutl snapshot restore` from the member's own etcd image
/// writes the data directory with the member's name, the cluster's initial members and a
/// token of its own (`NAME.NS.<uid>`: new member and cluster IDs, unlike any former cluster
/// under this name; every key and the snapshot's revision) beside the member's
/// (`data.restoring`), and `place-restored` moves it in once whole: a killed attempt's copy is
/// cleared by the next one's fetch, never taken for data. Both commands run unconditionally
/// (the etcd image has no shell): the loop runs these Jobs once, for the members a cluster
/// starts with, never for a learner added later. A `pvc://` snapshot's claim is mounted
/// read-only at [`RESTORE_SOURCE_MOUNT`]; the loop runs those Jobs one at a time, since a
/// ReadWriteOnce claim attaches to one node at a time.
pub fn restore_job(
    ec: &EtcdCluster,
    ordinal: i32,
    source: SnapshotSource<'_>,
    sha256: Option<&str>,
    opts: &RenderOptions,
) -> Job {
    let name = ec.name_any();
    let member = format!("{name}-{ordinal}");
    let restore_dir = "/restore";
    let snapshot = format!("{restore_dir}/snapshot.db");
    // etcdutl writes beside the data directory; `place-restored` moves it in once whole, so a
    // killed attempt leaves nothing the next one (or the member) would take for data.
    let restoring = format!("{DATA_DIR}{RESTORING_SUFFIX}");
    let scratch = VolumeMount {
        name: "restore".to_owned(),
        mount_path: restore_dir.to_owned(),
        ..Default::default()
    };
    let data = VolumeMount {
        name: "data".to_owned(),
        mount_path: DATA_MOUNT.to_owned(),
        ..Default::default()
    };
    let (fetch, source_volume) = fetch_step(
        ec,
        source,
        &snapshot,
        sha256,
        vec![scratch.clone(), data.clone()],
        Some(&restoring),
        opts,
    );
    let restore = Container {
        name: "restore".to_owned(),
        image: Some(super::members::etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcdutl".to_owned()]),
        args: Some(
            vec![
                "snapshot".to_owned(),
                "restore".to_owned(),
                snapshot,
                format!("--name={member}"),
                format!("--initial-cluster={}", initial_cluster(ec, ec.spec.size)),
                // Its own token: a cluster ID no former cluster under this name had.
                format!(
                    "--initial-cluster-token={}.{}",
                    cluster_token(ec),
                    restore_id(ec)
                ),
                format!("--initial-advertise-peer-urls={}", peer_url(ec, ordinal)),
                format!("--data-dir={restoring}"),
            ]
            .into_iter()
            .chain(revision_bump(&ec.spec.version))
            .collect(),
        ),
        volume_mounts: Some(vec![scratch, data.clone()]),
        security_context: Some(restricted_container()),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    };
    let place = Container {
        volume_mounts: Some(vec![data]),
        ..own_container(
            "place",
            vec![
                "place-restored".to_owned(),
                format!("--from={restoring}"),
                format!("--to={DATA_DIR}"),
                format!("--restore-id={}", restore_id(ec)),
                "--report=/dev/termination-log".to_owned(),
            ],
            opts,
        )
    };
    let mut restore_pods = labels(ec, "restore");
    restore_pods.remove("app.kubernetes.io/managed-by");
    let (restore_affinity, restore_spread) = super::members::placement(restore_pods);
    Job {
        metadata: meta(ec, format!("{name}-restore-{ordinal}"), "restore"),
        spec: Some(JobSpec {
            backoff_limit: Some(2),
            active_deadline_seconds: Some(3600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(ec, "restore")),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    affinity: Some(restore_affinity),
                    topology_spread_constraints: Some(restore_spread),
                    ..job_pod(
                        vec![fetch, restore],
                        vec![place],
                        [
                            Volume {
                                name: "restore".to_owned(),
                                empty_dir: Some(Default::default()),
                                ..Default::default()
                            },
                            Volume {
                                name: "data".to_owned(),
                                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                    claim_name: member_claim(ec, ordinal),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                        ]
                        .into_iter()
                        .chain(source_volume)
                        .collect(),
                        opts,
                    )
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The init container that fetches a snapshot to `out` with `--backup-image`'s
/// `fetch-snapshot` (etcd's integrity hash checked, and `sha256` when given), with `mounts`
/// and, for a `pvc://` source, its claim mounted read-only at [`RESTORE_SOURCE_MOUNT`] (the
/// volume returned); `clear` is what a killed attempt may have left half written.
pub(super) fn fetch_step(
    ec: &EtcdCluster,
    source: SnapshotSource<'_>,
    out: &str,
    sha256: Option<&str>,
    mounts: Vec<VolumeMount>,
    clear: Option<&str>,
    opts: &RenderOptions,
) -> (Container, Option<Volume>) {
    // A claim is mounted read-only and its file read like any other (the same checks).
    let (from, source_volume) = match source {
        SnapshotSource::S3(uri) => (uri.to_owned(), None),
        SnapshotSource::Claim { claim, file } => (
            format!("{RESTORE_SOURCE_MOUNT}/{file}"),
            Some(Volume {
                name: "source".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_owned(),
                    read_only: Some(true),
                }),
                ..Default::default()
            }),
        ),
    };
    let mut fetch_mounts = vec![];
    if source_volume.is_some() {
        fetch_mounts.push(VolumeMount {
            name: "source".to_owned(),
            mount_path: RESTORE_SOURCE_MOUNT.to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let mut args = vec![
        "fetch-snapshot".to_owned(),
        format!("--from={from}"),
        format!("--out={out}"),
        "--report=/dev/termination-log".to_owned(),
    ];
    if let Some(dir) = clear {
        args.push(format!("--clear={dir}"));
    }
    if let Some(sum) = sha256 {
        args.push(format!("--sha256={sum}"));
    }
    let fetch = Container {
        env_from: matches!(source, SnapshotSource::S3(_)).then(|| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: format!("{}-backup-credentials", ec.name_any()),
                    optional: Some(true),
                }),
                ..Default::default()
            }]
        }),
        volume_mounts: Some(fetch_mounts.into_iter().chain(mounts).collect()),
        ..own_container("fetch", args, opts)
    };
    (fetch, source_volume)
}
