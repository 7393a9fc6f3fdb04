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
    let mut metadata = meta(ec, format!("{}-backup", ec.name_any()), "backup");
    metadata.owner_references = None;
    PersistentVolumeClaim {
        metadata,
        spec: Some(claim_spec(ec)),
        ..Default::default()
    }
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
/// it filed (JSON) as its termination message. `retention` is `None` for the final snapshot.
fn snapshot_pod(
    ec: &EtcdCluster,
    target: &BackupTarget,
    opts: &RenderOptions,
    retention: Option<i32>,
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
                    claim_name: format!("{}-backup", ec.name_any()),
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
        BackupTarget::S3(url) => (
            url.clone(),
            Some(vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: format!("{}-backup-credentials", ec.name_any()),
                    optional: Some(true),
                }),
                ..Default::default()
            }]),
        ),
    };
    let mut args = vec![
        "backup".to_owned(),
        format!("--cluster={}", ec.name_any()),
        format!("--endpoints={}", client_url(ec)),
        format!("--destination={destination}"),
        "--work-dir=/work".to_owned(),
        "--report=/dev/termination-log".to_owned(),
    ];
    args.push(match retention {
        Some(keep) => format!("--retention={keep}"),
        None => "--kind=final".to_owned(),
    });
    let backup = Container {
        name: "backup".to_owned(),
        image: Some(opts.backup_image.clone()),
        command: Some(vec!["/etcd-webhook".to_owned()]),
        args: Some(args),
        env_from,
        volume_mounts: Some(mounts),
        security_context: Some(restricted_container()),
        termination_message_policy: Some("File".to_owned()),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(ec, component)),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![backup],
            volumes: Some(volumes),
            restart_policy: Some("Never".to_owned()),
            security_context: Some(restricted_pod()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
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
        spec: Some(CronJobSpec {
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
                        Some(backup.retention.max(1)),
                        "backup",
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
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
            template: snapshot_pod(ec, target, opts, None, "final-snapshot"),
            ..Default::default()
        }),
        ..Default::default()
    }
}
