//! Desired state: what one v1 EtcdCluster turns into. Pure functions, no I/O.
//!
//! Every object carries the labels in [`labels`] and (except the backup volume, which must
//! outlive the cluster) a controller ownerReference to the EtcdCluster, so deleting the
//! cluster cascades.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecretEnvSource, SecurityContext, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::v1::EtcdCluster;

pub const CLIENT_PORT: i32 = 2379;
pub const PEER_PORT: i32 = 2380;
/// etcd's `--listen-metrics-urls` port: `/health` and `/metrics` without touching clients.
pub const METRICS_PORT: i32 = 2381;
/// EtcdCluster annotation the loop writes with its finalizer: the size the cluster was
/// bootstrapped with. Members with an ordinal at or above it joined an existing cluster.
pub const INITIAL_SIZE_ANNOTATION: &str = "etcd.example.com/initial-size";
/// Where a member keeps its data (a subdirectory of the volume, away from `lost+found`).
const DATA_MOUNT: &str = "/var/lib/etcd";
const DATA_DIR: &str = "/var/lib/etcd/data";
/// The non-root user (distroless `nonroot`) every pod runs as.
const RUN_AS: i64 = 65532;

/// The default of `--etcd-image-registry`.
pub const DEFAULT_ETCD_REGISTRY: &str = "quay.io/coreos";
/// The default of `--backup-helper-image`.
pub const DEFAULT_HELPER_IMAGE: &str = "busybox:1.37";
/// The default of `--backup-s3-image`.
pub const DEFAULT_S3_IMAGE: &str = "amazon/aws-cli:2.22.35";

/// Settings that are not in the EtcdCluster but in the controller's flags (`cli::ImageArgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// `--etcd-image-registry`: images are `<registry>/etcd:<spec.version>`.
    pub etcd_registry: String,
    /// `--backup-helper-image`: a shell image that files snapshots on the backup volume.
    pub helper_image: String,
    /// `--backup-s3-image`: an image with the `aws` CLI, for `s3://` destinations.
    pub s3_image: String,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            etcd_registry: DEFAULT_ETCD_REGISTRY.to_owned(),
            helper_image: DEFAULT_HELPER_IMAGE.to_owned(),
            s3_image: DEFAULT_S3_IMAGE.to_owned(),
        }
    }
}

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

/// Labels of every object of a cluster; `component` tells members, backups and jobs apart.
pub fn labels(ec: &EtcdCluster, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "etcd".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), ec.name_any()),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            crate::api::MANAGER.to_owned(),
        ),
    ])
}

/// The member pods' selector (immutable on a StatefulSet, so it never changes).
pub fn member_selector(ec: &EtcdCluster) -> BTreeMap<String, String> {
    let mut l = labels(ec, "member");
    l.remove("app.kubernetes.io/managed-by");
    l
}

/// The controller reference, blocking the owner's deletion as controller-runtime's
/// SetControllerReference does: a foreground deletion of the cluster (`kubectl delete
/// --cascade=foreground`) then returns only after its children are gone. Setting it needs
/// `update` on `etcdclusters/finalizers` where OwnerReferencesPermissionEnforcement is on.
fn owner(ec: &EtcdCluster) -> OwnerReference {
    OwnerReference {
        block_owner_deletion: Some(true),
        ..ec.controller_owner_ref(&())
            .expect("an EtcdCluster read from the API has a name and uid")
    }
}

fn meta(ec: &EtcdCluster, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: ec.namespace(),
        labels: Some(labels(ec, component)),
        owner_references: Some(vec![owner(ec)]),
        ..Default::default()
    }
}

fn namespace(ec: &EtcdCluster) -> String {
    ec.namespace().unwrap_or_else(|| "default".to_owned())
}

/// `http://NAME-i.NAME.NS.svc:2379` for each member.
pub fn endpoints(ec: &EtcdCluster, size: i32) -> Vec<String> {
    let (name, ns) = (ec.name_any(), namespace(ec));
    (0..size)
        .map(|i| format!("http://{name}-{i}.{name}.{ns}.svc:{CLIENT_PORT}"))
        .collect()
}

/// The client Service URL that snapshots and membership changes talk to.
pub fn client_url(ec: &EtcdCluster) -> String {
    format!(
        "http://{}-client.{}.svc:{CLIENT_PORT}",
        ec.name_any(),
        namespace(ec)
    )
}

fn peer_url(ec: &EtcdCluster, ordinal: i32) -> String {
    let (name, ns) = (ec.name_any(), namespace(ec));
    format!("http://{name}-{ordinal}.{name}.{ns}.svc:{PEER_PORT}")
}

/// `--initial-cluster`: every member of a cluster of `size`.
pub fn initial_cluster(ec: &EtcdCluster, size: i32) -> String {
    let name = ec.name_any();
    (0..size)
        .map(|i| format!("{name}-{i}={}", peer_url(ec, i)))
        .collect::<Vec<_>>()
        .join(",")
}

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(name.to_owned())),
        ..Default::default()
    }
}

/// Headless Service `NAME`: stable DNS names for the members, published before they are ready
/// (members must find each other to become ready at all).
pub fn headless_service(ec: &EtcdCluster) -> Service {
    Service {
        metadata: meta(ec, ec.name_any(), "member"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(member_selector(ec)),
            ports: Some(vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Client Service `NAME-client`: ready members only.
pub fn client_service(ec: &EtcdCluster) -> Service {
    Service {
        metadata: meta(ec, format!("{}-client", ec.name_any()), "client"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(member_selector(ec)),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Default::default()
        }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..Default::default()
    }
}

fn restricted_pod() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn health_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("metrics".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn etcd_image(ec: &EtcdCluster, opts: &RenderOptions) -> String {
    format!(
        "{}/etcd:{}",
        opts.etcd_registry.trim_end_matches('/'),
        ec.spec.version
    )
}

/// A storage request as the apiserver writes it back (`1024Gi` is stored as `1Ti`), so what the
/// loop renders is what it reads.
fn storage(size: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([(
        "storage".to_owned(),
        Quantity(crate::api::quantity::canonical(size)),
    )])
}

/// StatefulSet `NAME`.
///
/// `members` is how many members it runs: `spec.size`, or fewer while the cluster grows one
/// member at a time; `--initial-cluster` lists exactly those (a joining member must name the
/// membership as it is). `initial_size` is the size the cluster was bootstrapped with
/// ([`INITIAL_SIZE_ANNOTATION`]). While the cluster has its initial members every pod starts
/// with `--initial-cluster-state=new`; once it has grown the template says `existing`, which the
/// new members need (they were added with `etcdctl member add` first, see [`member_add_job`])
/// and which members that already have a data directory ignore. Pods start in parallel: a member only becomes ready with a quorum, so
/// ordered start would wait forever for the second pod.
pub fn stateful_set(
    ec: &EtcdCluster,
    initial_size: i32,
    members: i32,
    opts: &RenderOptions,
) -> StatefulSet {
    let name = ec.name_any();
    let size = members;
    let state = if size > initial_size {
        "existing"
    } else {
        "new"
    };
    let args = vec![
        "--name=$(POD_NAME)".to_owned(),
        format!("--data-dir={DATA_DIR}"),
        format!("--listen-peer-urls=http://0.0.0.0:{PEER_PORT}"),
        format!("--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}"),
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
        format!(
            "--initial-advertise-peer-urls=http://$(POD_NAME).{name}.$(POD_NAMESPACE).svc:{PEER_PORT}"
        ),
        format!(
            "--advertise-client-urls=http://$(POD_NAME).{name}.$(POD_NAMESPACE).svc:{CLIENT_PORT}"
        ),
        format!("--initial-cluster={}", initial_cluster(ec, size)),
        format!("--initial-cluster-state={state}"),
        format!("--initial-cluster-token={name}.{}", namespace(ec)),
    ];
    let container = Container {
        name: "etcd".to_owned(),
        image: Some(etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcd".to_owned()]),
        args: Some(args),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            container_port("client", CLIENT_PORT),
            container_port("peer", PEER_PORT),
            container_port("metrics", METRICS_PORT),
        ]),
        // Ready: this member is in a cluster with a quorum. Alive: the process answers, judged
        // locally (serializable), so losing quorum does not restart every member.
        readiness_probe: Some(health_probe("/health", 5, 3)),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(15),
            ..health_probe("/health?serializable=true", 10, 6)
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "data".to_owned(),
            mount_path: DATA_MOUNT.to_owned(),
            ..Default::default()
        }]),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    StatefulSet {
        metadata: meta(ec, name.clone(), "member"),
        spec: Some(StatefulSetSpec {
            replicas: Some(size),
            service_name: Some(name),
            pod_management_policy: Some("Parallel".to_owned()),
            selector: LabelSelector {
                match_labels: Some(member_selector(ec)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(ec, "member")),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    security_context: Some(restricted_pod()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(30),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".to_owned()),
                    labels: Some(labels(ec, "member")),
                    ..Default::default()
                },
                spec: Some(claim_spec(ec)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        ..Default::default()
    }
}

/// The claim names the StatefulSet gives its members' volumes.
pub fn member_claim(ec: &EtcdCluster, ordinal: i32) -> String {
    format!("data-{}-{ordinal}", ec.name_any())
}

/// PodDisruptionBudget `NAME`: voluntary disruptions may take at most (members-1)/2 members,
/// so a quorum always stays. A single member gets 0: it cannot be evicted without losing the
/// cluster. `members` is what the StatefulSet runs (it lags `spec.size` while new members are
/// being added).
pub fn pod_disruption_budget(ec: &EtcdCluster, members: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(ec, ec.name_any(), "member"),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int((members.max(1) - 1) / 2)),
            selector: Some(LabelSelector {
                match_labels: Some(member_selector(ec)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
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

/// One volume of `spec.storageClass` and `spec.storageSize`.
fn claim_spec(ec: &EtcdCluster) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
        storage_class_name: Some(ec.spec.storage_class.clone()),
        resources: Some(VolumeResourceRequirements {
            requests: Some(storage(&ec.spec.storage_size)),
            ..Default::default()
        }),
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

/// Job `NAME-member-<i>`: `etcdctl member add` for a member that joins a running cluster, run
/// before the StatefulSet gets the pod. The etcd image has etcdctl and no shell, which is all
/// this needs.
pub fn member_add_job(ec: &EtcdCluster, ordinal: i32, opts: &RenderOptions) -> Job {
    let name = ec.name_any();
    let container = Container {
        name: "member-add".to_owned(),
        image: Some(etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcdctl".to_owned()]),
        args: Some(vec![
            format!("--endpoints={}", client_url(ec)),
            "--dial-timeout=10s".to_owned(),
            "member".to_owned(),
            "add".to_owned(),
            format!("{name}-{ordinal}"),
            format!("--peer-urls={}", peer_url(ec, ordinal)),
        ]),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    Job {
        metadata: meta(ec, member_job_name(ec, ordinal), "member-add"),
        spec: Some(JobSpec {
            backoff_limit: Some(6),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(ec, "member-add")),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    restart_policy: Some("Never".to_owned()),
                    security_context: Some(restricted_pod()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn member_job_name(ec: &EtcdCluster, ordinal: i32) -> String {
    format!("{}-member-{ordinal}", ec.name_any())
}

/// Every object a new cluster gets, in apply order: the Services, StatefulSet and
/// PodDisruptionBudget, then (with backups) the backup volume, the CronJob, and the Job the
/// finalizer would run on deletion. What `etcd-webhook render` prints.
pub fn all(ec: &EtcdCluster, opts: &RenderOptions) -> Vec<serde_json::Value> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.expect("k8s objects serialize");
    let mut out = vec![
        json(serde_json::to_value(headless_service(ec))),
        json(serde_json::to_value(client_service(ec))),
        json(serde_json::to_value(stateful_set(
            ec,
            ec.spec.size,
            ec.spec.size,
            opts,
        ))),
        json(serde_json::to_value(pod_disruption_budget(
            ec,
            ec.spec.size,
        ))),
    ];
    if let Some(Ok(target)) = backup_target(ec) {
        if target == BackupTarget::Volume {
            out.push(json(serde_json::to_value(backup_claim(ec))));
        }
        out.push(json(serde_json::to_value(backup_cron_job(
            ec, &target, opts,
        ))));
        out.push(json(serde_json::to_value(final_snapshot_job(
            ec, &target, opts,
        ))));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::v1::{Backup, EtcdClusterSpec};

    /// A v1 EtcdCluster as the API returns it (name, namespace, uid, generation).
    pub(crate) fn cluster(name: &str, size: i32, backup: Option<Backup>) -> EtcdCluster {
        let mut ec = EtcdCluster::new(
            name,
            EtcdClusterSpec {
                size,
                version: "v3.5.10".to_owned(),
                storage_class: "ssd".to_owned(),
                storage_size: "10Gi".to_owned(),
                backup,
            },
        );
        ec.metadata.namespace = Some("prod".to_owned());
        ec.metadata.uid = Some("6a3c1f9e-0000-4000-8000-000000000001".to_owned());
        ec.metadata.generation = Some(1);
        ec
    }

    pub(crate) fn backup(destination: Option<&str>) -> Backup {
        Backup {
            enabled: true,
            schedule: "0 */6 * * *".to_owned(),
            retention: 7,
            destination: destination.map(str::to_owned),
        }
    }

    /// Every object of a cluster, as YAML documents in a fixed order.
    fn render_all(ec: &EtcdCluster) -> String {
        all(ec, &RenderOptions::default())
            .iter()
            .map(|o| serde_yaml_ng::to_string(o).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// Golden files under tests/golden/; `UPDATE_GOLDEN=1 cargo test` rewrites them.
    fn golden(file: &str, actual: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(file);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert!(
            expected == actual,
            "{} differs from the rendering (UPDATE_GOLDEN=1 rewrites it after review):\n{}",
            path.display(),
            line_diff(&expected, actual)
        );
    }

    fn line_diff(expected: &str, actual: &str) -> String {
        let (e, a): (Vec<_>, Vec<_>) = (expected.lines().collect(), actual.lines().collect());
        let mut out = String::new();
        for i in 0..e.len().max(a.len()) {
            let (x, y) = (e.get(i), a.get(i));
            if x != y {
                out += &format!("line {}: golden {:?}\n        rendered {:?}\n", i + 1, x, y);
            }
        }
        out
    }

    #[test]
    fn golden_one_three_five_members_with_and_without_backup() {
        for size in [1, 3, 5] {
            golden(
                &format!("etcd-{size}.yaml"),
                &render_all(&cluster(&format!("etcd-{size}"), size, None)),
            );
            golden(
                &format!("etcd-{size}-backup.yaml"),
                &render_all(&cluster(&format!("etcd-{size}"), size, Some(backup(None)))),
            );
        }
        golden(
            "etcd-3-backup-s3.yaml",
            &render_all(&cluster(
                "etcd-3",
                3,
                Some(backup(Some("s3://snapshots/prod/"))),
            )),
        );
    }

    #[test]
    fn quorum_safe_disruption_budget() {
        for (size, max) in [(1, 0), (3, 1), (5, 2), (7, 3)] {
            let pdb = pod_disruption_budget(&cluster("e", size, None), size);
            assert_eq!(
                pdb.spec.unwrap().max_unavailable,
                Some(IntOrString::Int(max)),
                "size {size}"
            );
        }
    }

    #[test]
    fn grown_cluster_starts_new_members_as_existing_with_every_member_listed() {
        let ec = cluster("etcd", 5, None);
        let sts = stateful_set(&ec, 3, 5, &RenderOptions::default());
        let args = sts.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.contains(&"--initial-cluster-state=existing".to_owned()));
        let members = args
            .iter()
            .find_map(|a| a.strip_prefix("--initial-cluster="))
            .unwrap();
        assert_eq!(members.split(',').count(), 5);
        assert!(members.contains("etcd-4=http://etcd-4.etcd.prod.svc:2380"));
        let fresh = stateful_set(&ec, 5, 5, &RenderOptions::default());
        let args = fresh.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.contains(&"--initial-cluster-state=new".to_owned()));
    }

    #[test]
    fn a_growing_cluster_lists_the_members_it_has_so_far() {
        let ec = cluster("etcd", 5, None);
        let sts = stateful_set(&ec, 3, 4, &RenderOptions::default());
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(4));
        let args = spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        let listed = args
            .iter()
            .find_map(|a| a.strip_prefix("--initial-cluster="))
            .unwrap();
        assert_eq!(listed.split(',').count(), 4);
        assert!(!listed.contains("etcd-4="));
    }

    #[test]
    fn images_come_from_the_registry_flag() {
        let ec = cluster("etcd", 3, None);
        let opts = RenderOptions {
            etcd_registry: "registry.local:5000/mirror/".to_owned(),
            ..Default::default()
        };
        let sts = stateful_set(&ec, 3, 3, &opts);
        assert_eq!(
            sts.spec.unwrap().template.spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("registry.local:5000/mirror/etcd:v3.5.10")
        );
    }

    #[test]
    fn backup_targets() {
        assert_eq!(backup_target(&cluster("e", 3, None)), None);
        let mut off = backup(None);
        off.enabled = false;
        assert_eq!(backup_target(&cluster("e", 3, Some(off))), None);
        assert_eq!(
            backup_target(&cluster("e", 3, Some(backup(None)))),
            Some(Ok(BackupTarget::Volume))
        );
        assert_eq!(
            backup_target(&cluster("e", 3, Some(backup(Some("s3://b/p/"))))),
            Some(Ok(BackupTarget::S3("s3://b/p".to_owned())))
        );
        assert!(matches!(
            backup_target(&cluster("e", 3, Some(backup(Some("gs://b/p"))))),
            Some(Err(UnsupportedDestination(_)))
        ));
    }

    #[test]
    fn every_owned_object_points_at_its_cluster_as_controller() {
        let ec = cluster("etcd", 3, Some(backup(None)));
        let opts = RenderOptions::default();
        let metas = [
            headless_service(&ec).metadata,
            client_service(&ec).metadata,
            stateful_set(&ec, 3, 3, &opts).metadata,
            pod_disruption_budget(&ec, 3).metadata,
            backup_cron_job(&ec, &BackupTarget::Volume, &opts).metadata,
            final_snapshot_job(&ec, &BackupTarget::Volume, &opts).metadata,
            member_add_job(&ec, 3, &opts).metadata,
        ];
        for m in metas {
            let refs = m.owner_references.unwrap();
            assert_eq!(refs.len(), 1);
            assert_eq!(refs[0].controller, Some(true));
            assert_eq!(refs[0].block_owner_deletion, Some(true));
            assert_eq!(refs[0].kind, "EtcdCluster");
            assert_eq!(refs[0].uid, ec.metadata.uid.clone().unwrap());
            assert_eq!(m.namespace.as_deref(), Some("prod"));
        }
        assert_eq!(backup_claim(&ec).metadata.owner_references, None);
    }
}
