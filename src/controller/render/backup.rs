//! Backups: where snapshots go, the CronJob that takes them on a schedule, the final
//! snapshot Job of a deletion and the volume claim snapshots are filed on.

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, SecretEnvSource, Volume, VolumeMount,
};
use kube::ResourceExt;

use super::members::{claim_spec, etcd_image};
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
#[error(
    "backup destination {0:?} is not supported: use an s3:// URL, or leave it unset for the volume claim"
)]
pub struct UnsupportedDestination(pub String);

/// The backup target of a cluster, `None` when backups are off.
pub fn backup_target(ec: &EtcdCluster) -> Option<Result<BackupTarget, UnsupportedDestination>> {
    let backup = ec.spec.backup.as_ref().filter(|b| b.enabled)?;
    Some(match backup.destination.as_deref() {
        None | Some("") => Ok(BackupTarget::Volume),
        Some(d) if d.starts_with("s3://") && d.len() > "s3://".len() => {
            Ok(BackupTarget::S3(d.trim_end_matches('/').to_owned()))
        }
        Some(d) => Err(UnsupportedDestination(d.to_owned())),
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

/// The shell step that files `/work/snapshot.db` under a timestamped name and keeps the
/// newest `retention` files of this cluster (and, for the final snapshot, never deletes).
fn store_script(
    ec: &EtcdCluster,
    target: &BackupTarget,
    prefix: &str,
    retention: Option<i32>,
) -> String {
    let name = ec.name_any();
    let (put, prune) = match target {
        BackupTarget::Volume => (
            format!("cp /work/snapshot.db \"/backup/{name}-{prefix}$ts.db\""),
            retention.map(|r| {
                format!(
                    "ls -1 /backup/{name}-snapshot-*.db | sort -r | tail -n +{} | xargs -r rm -f --",
                    r + 1
                )
            }),
        ),
        BackupTarget::S3(url) => (
            format!("aws s3 cp /work/snapshot.db \"{url}/{name}-{prefix}$ts.db\""),
            retention.map(|r| {
                format!(
                    "aws s3 ls \"{url}/{name}-snapshot-\" | while read -r _day _time _size f; do echo \"$f\"; done | sort -r | tail -n +{} | while read -r f; do aws s3 rm \"{url}/$f\"; done",
                    r + 1
                )
            }),
        ),
    };
    let mut script = vec![
        "set -eu".to_owned(),
        "ts=$(date -u +%Y%m%dT%H%M%SZ)".to_owned(),
        put,
    ];
    script.extend(prune);
    script.join("\n")
}

/// A snapshot pod: an init container saves the snapshot with `etcdctl` from the etcd image
/// itself (which has no shell since etcd 3.5.7), then a second container files it.
fn snapshot_pod(
    ec: &EtcdCluster,
    target: &BackupTarget,
    opts: &RenderOptions,
    prefix: &str,
    retention: Option<i32>,
    component: &str,
) -> PodTemplateSpec {
    let mut volumes = vec![Volume {
        name: "work".to_owned(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }];
    let work = VolumeMount {
        name: "work".to_owned(),
        mount_path: "/work".to_owned(),
        ..Default::default()
    };
    let mut store_mounts = vec![work.clone()];
    let (image, env_from, env) = match target {
        BackupTarget::Volume => {
            volumes.push(Volume {
                name: "backup".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: format!("{}-backup", ec.name_any()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            store_mounts.push(VolumeMount {
                name: "backup".to_owned(),
                mount_path: "/backup".to_owned(),
                ..Default::default()
            });
            (opts.helper_image.clone(), None, None)
        }
        BackupTarget::S3(_) => {
            // The aws CLI wants a writable home for its cache, and /tmp (the root file
            // system is read-only).
            for (volume, path) in [("home", "/home/aws"), ("tmp", "/tmp")] {
                volumes.push(Volume {
                    name: volume.to_owned(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                });
                store_mounts.push(VolumeMount {
                    name: volume.to_owned(),
                    mount_path: path.to_owned(),
                    ..Default::default()
                });
            }
            (
                opts.s3_image.clone(),
                // Credentials (AWS_ACCESS_KEY_ID, ..., AWS_ENDPOINT_URL) from an optional Secret;
                // without it the pod's own identity (IRSA, instance profile) is used.
                Some(vec![EnvFromSource {
                    secret_ref: Some(SecretEnvSource {
                        name: format!("{}-backup-credentials", ec.name_any()),
                        optional: Some(true),
                    }),
                    ..Default::default()
                }]),
                Some(vec![EnvVar {
                    name: "HOME".to_owned(),
                    value: Some("/home/aws".to_owned()),
                    ..Default::default()
                }]),
            )
        }
    };
    let snapshot = Container {
        name: "snapshot".to_owned(),
        image: Some(etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcdctl".to_owned()]),
        args: Some(vec![
            format!("--endpoints={}", client_url(ec)),
            "--dial-timeout=10s".to_owned(),
            "--command-timeout=5m".to_owned(),
            "snapshot".to_owned(),
            "save".to_owned(),
            "/work/snapshot.db".to_owned(),
        ]),
        volume_mounts: Some(vec![work]),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    let store = Container {
        name: "store".to_owned(),
        image: Some(image),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![store_script(ec, target, prefix, retention)]),
        env_from,
        env,
        volume_mounts: Some(store_mounts),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(ec, component)),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            init_containers: Some(vec![snapshot]),
            containers: vec![store],
            volumes: Some(volumes),
            restart_policy: Some("Never".to_owned()),
            security_context: Some(restricted_pod()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
    }
}

/// CronJob `NAME-backup`: `etcdctl snapshot save` on `spec.backup.schedule`, keeping the newest
/// `retention` snapshots (`NAME-snapshot-<UTC time>.db`).
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
                        "snapshot-",
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
            template: snapshot_pod(ec, target, opts, "final-", None, "final-snapshot"),
            ..Default::default()
        }),
        ..Default::default()
    }
}
