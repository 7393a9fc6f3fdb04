//! Backups: where snapshots go, the CronJob that takes them on a schedule, the final
//! snapshot Job of a deletion and the volume claim snapshots are filed on.

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, SecretEnvSource, Volume, VolumeMount,
};
use kube::ResourceExt;

use super::members::claim_spec;
use super::*;

/// Where snapshots go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupTarget {
    /// The volume claim `NAME-backup`.
    Volume,
    /// An `s3://bucket/prefix` URL.
    S3(String),
}

/// Why backups cannot be set up for a destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.backup.destination {0:?} {1}")]
pub struct UnsupportedDestination(pub String, pub &'static str);

/// The backup target of a cluster, `None` when backups are off.
pub fn backup_target(ec: &EtcdCluster) -> Option<Result<BackupTarget, UnsupportedDestination>> {
    let backup = ec.spec.backup.as_ref().filter(|b| b.enabled)?;
    Some(match backup.destination.as_deref() {
        None | Some("") => Ok(BackupTarget::Volume),
        Some(d) => match crate::api::backup_destination_error(d) {
            None => Ok(BackupTarget::S3(d.trim_end_matches('/').to_owned())),
            Some(why) => Err(UnsupportedDestination(d.to_owned(), why)),
        },
    })
}

/// The volume claim `NAME-backup` that holds snapshots when no destination is given. It has
/// no ownerReference on purpose: the snapshots (the final one above all) must outlive the
/// cluster. Sized like one member's volume; a snapshot is never larger than the data it copies.
pub fn backup_claim(ec: &EtcdCluster) -> PersistentVolumeClaim {
    let mut metadata = meta(ec, backup_claim_name(ec), "backup");
    metadata.owner_references = None;
    PersistentVolumeClaim {
        metadata,
        spec: Some(claim_spec(ec)),
        ..Default::default()
    }
}

/// The name of the claim `NAME-backup` the backups to a volume go to.
pub fn backup_claim_name(ec: &EtcdCluster) -> String {
    format!("{}-backup", ec.name_any())
}

/// What `etcd-webhook backup` filed: the JSON line it prints and leaves as the Job pod's
/// termination message, where the loop reads it (`status.backup.last`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct BackupReport {
    pub uri: String,
    pub size: u64,
    pub sha256: String,
    /// The snapshot holds every revision up to at least this one (the member's revision when
    /// the snapshot began).
    pub revision: u64,
    /// The keys the store held at `revision` (what a restore has at that revision); absent
    /// from the reports of releases before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// etcd's hash of the keys at `revision` (`maintenance/hashkv`) on the member it was taken
    /// from, and the revision that hash counts from (its compaction; -1: none): what a restore
    /// of the snapshot must give at `revision`. Absent when the member did not answer it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_revision: Option<i64>,
    /// The member it was taken from.
    pub member: String,
    /// When the snapshot was taken (RFC 3339).
    pub time: String,
    pub seconds: f64,
    /// Scheduled snapshots retention deleted.
    pub pruned: Vec<String>,
}

/// The folder the backup claim is mounted at in a snapshot pod.
pub const BACKUP_MOUNT: &str = "/backup";

/// A snapshot pod: one container of `--backup-image` running `/etcd-webhook backup`, which
/// takes the snapshot from a healthy voter through the client Service, checks etcd's integrity
/// hash, files it on the backup claim or in the bucket, reads it back, prunes, and writes what
/// it filed (JSON) as its termination message.
fn snapshot_pod(
    ec: &EtcdCluster,
    target: &BackupTarget,
    opts: &RenderOptions,
    taken: Taken,
    component: &str,
) -> PodTemplateSpec {
    let mut volumes = vec![Volume {
        name: "work".to_owned(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "work".to_owned(),
        mount_path: "/work".to_owned(),
        ..Default::default()
    }];
    let (destination, env_from) = match target {
        BackupTarget::Volume => {
            volumes.push(Volume {
                name: "backup".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: backup_claim_name(ec),
                    ..Default::default()
                }),
                ..Default::default()
            });
            mounts.push(VolumeMount {
                name: "backup".to_owned(),
                mount_path: BACKUP_MOUNT.to_owned(),
                ..Default::default()
            });
            (BACKUP_MOUNT.to_owned(), None)
        }
        // Credentials (AWS_ACCESS_KEY_ID, ..., AWS_ENDPOINT_URL) from an optional Secret;
        // without it the pod's own identity (web identity, instance profile) is used.
        // A folder per namespace under the destination: two clusters of one name in two
        // namespaces never share (or prune) each other's snapshots.
        BackupTarget::S3(url) => (
            format!("{}/{}", url.trim_end_matches('/'), namespace(ec)),
            Some(vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: format!("{}-backup-credentials", ec.name_any()),
                    optional: Some(true),
                }),
                ..Default::default()
            }]),
        ),
    };
    let endpoints = match taken {
        Taken::Rescue(i) => endpoints(ec, i + 1).swap_remove(i as usize),
        _ => client_url(ec),
    };
    let mut args = vec![
        "backup".to_owned(),
        format!("--cluster={}", snapshot_stem(ec)),
        format!("--endpoints={endpoints}"),
        format!("--destination={destination}"),
        "--work-dir=/work".to_owned(),
        "--report=/dev/termination-log".to_owned(),
    ];
    match taken {
        Taken::Scheduled(keep) => args.push(format!("--retention={keep}")),
        Taken::Final => args.push("--kind=final".to_owned()),
        Taken::Rescue(i) => args.extend([
            "--kind=rescue".to_owned(),
            format!("--member={}-{i}", ec.name_any()),
        ]),
    }
    // A TLS cluster's members are reached with its client certificate.
    if crate::api::tls_on(&ec.spec) {
        volumes.push(secret_volume("client-tls", Purpose::Client.secret(ec)));
        mounts.push(read_only_mount("client-tls", CLIENT_TLS_MOUNT));
        args.push(format!("--tls-dir={CLIENT_TLS_MOUNT}"));
    }
    let backup = Container {
        env_from,
        volume_mounts: Some(mounts),
        ..own_container("backup", args, opts)
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(ec, component)),
            ..Default::default()
        }),
        spec: Some(job_pod(vec![], vec![backup], volumes, opts)),
    }
}

/// What a snapshot pod takes: a scheduled snapshot (keeping this many), the final one, or the
/// rescue of one member's data (by ordinal), from that member alone.
#[derive(Clone, Copy)]
enum Taken {
    Scheduled(i32),
    Final,
    Rescue(i32),
}

/// The stem of this cluster's snapshot names: `NAME-<first 8 characters of its UID>`, so a
/// cluster made again under the same name (a new UID) never prunes, nor is taken for, its
/// predecessor's snapshots (`NAME-6a3c1f9e-snapshot-<UTC time>.db`); `NAME` alone for an
/// object without a UID (`etcd-webhook render`).
pub fn snapshot_stem(ec: &EtcdCluster) -> String {
    match ec.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => {
            format!(
                "{}-{}",
                ec.name_any(),
                uid.chars().take(8).collect::<String>()
            )
        }
        _ => ec.name_any(),
    }
}

/// CronJob `NAME-backup`: a snapshot on `spec.backup.schedule`, keeping the newest `retention`
/// scheduled snapshots (`NAME-snapshot-<UTC time>.db`).
pub fn backup_cron_job(ec: &EtcdCluster, target: &BackupTarget, opts: &RenderOptions) -> CronJob {
    let backup = ec
        .spec
        .backup
        .clone()
        .unwrap_or_else(|| crate::api::v1::Backup {
            enabled: true,
            schedule: crate::api::defaults::backup_schedule(),
            retention: crate::api::defaults::BACKUP_RETENTION,
            destination: None,
        });
    CronJob {
        metadata: meta(ec, format!("{}-backup", ec.name_any()), "backup"),
        spec: CronJobSpec {
            schedule: backup.schedule,
            concurrency_policy: Some("Forbid".to_owned()),
            successful_jobs_history_limit: Some(3),
            failed_jobs_history_limit: Some(3),
            job_template: JobTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(ec, "backup")),
                    ..Default::default()
                }),
                spec: Some(JobSpec {
                    backoff_limit: Some(2),
                    active_deadline_seconds: Some(3600),
                    template: snapshot_pod(
                        ec,
                        target,
                        opts,
                        Taken::Scheduled(backup.retention.max(1)),
                        "backup",
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Job `NAME-final-snapshot`, run by the finalizer before the cluster goes away.
pub fn final_snapshot_job(ec: &EtcdCluster, target: &BackupTarget, opts: &RenderOptions) -> Job {
    Job {
        metadata: meta(
            ec,
            format!("{}-final-snapshot", ec.name_any()),
            "final-snapshot",
        ),
        spec: Some(JobSpec {
            backoff_limit: Some(2),
            template: snapshot_pod(ec, target, opts, Taken::Final, "final-snapshot"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The name of the Job `NAME-rescue-<ordinal>` that copies member `ordinal`'s data.
pub fn rescue_job_name(ec: &EtcdCluster, ordinal: i32) -> String {
    format!("{}-rescue-{ordinal}", ec.name_any())
}

/// How long a finished rescue Job (and its pod's report) stays.
pub const RESCUE_JOB_TTL_SECONDS: i32 = 86400;

/// Job `NAME-rescue-<ordinal>`: a snapshot of member `ordinal` alone (no quorum needed), filed
/// as `STEM-rescue-NAME-<ordinal>-<time>.db` and never pruned, before a rebuild after a lost
/// quorum makes that member's volume anew (`quorum::Diagnosis::Rebuilding`). Its pod carries
/// the plan the copy is for and the member's ordinal, which the loop reads with its report.
pub fn rescue_job(
    ec: &EtcdCluster,
    target: &BackupTarget,
    opts: &RenderOptions,
    ordinal: i32,
    plan: &str,
) -> Job {
    let mut template = snapshot_pod(ec, target, opts, Taken::Rescue(ordinal), "rescue");
    let annotations = BTreeMap::from([
        (RESCUE_PLAN_ANNOTATION.to_owned(), plan.to_owned()),
        (RESCUE_MEMBER_ANNOTATION.to_owned(), ordinal.to_string()),
    ]);
    if let Some(m) = template.metadata.as_mut() {
        m.annotations = Some(annotations.clone());
    }
    let mut metadata = meta(ec, rescue_job_name(ec, ordinal), "rescue");
    metadata.annotations = Some(annotations);
    Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(2),
            active_deadline_seconds: Some(3600),
            // A day to read its log, then the TTL controller removes it. The copy is in the
            // destination, and should a rebuild still wait for it then (the loop down all
            // day), the next pass makes the Job again and files one more copy.
            ttl_seconds_after_finished: Some(RESCUE_JOB_TTL_SECONDS),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of this project's own binary (`--backup-image`, `/etcd-webhook` with `args`),
/// restricted, reporting through its termination message file: what every Job step the loop
/// runs with it starts from.
pub(super) fn own_container(name: &str, args: Vec<String>, opts: &RenderOptions) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(opts.backup_image.clone()),
        command: Some(vec!["/etcd-webhook".to_owned()]),
        args: Some(args),
        security_context: Some(restricted_container()),
        termination_message_policy: Some("File".to_owned()),
        ..Default::default()
    }
}

/// The pod of a Job the loop runs with the cluster's data (a snapshot, a restore, a
/// verification): its containers and volumes, never restarted in place, restricted, as
/// `--backup-service-account` with no API token and no Service links.
pub(super) fn job_pod(
    init_containers: Vec<Container>,
    containers: Vec<Container>,
    volumes: Vec<Volume>,
    opts: &RenderOptions,
) -> PodSpec {
    PodSpec {
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        containers,
        volumes: Some(volumes),
        restart_policy: Some("Never".to_owned()),
        security_context: Some(restricted_pod()),
        service_account_name: opts.backup_service_account.clone(),
        image_pull_secrets: pull_secrets(opts),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        ..Default::default()
    }
}
