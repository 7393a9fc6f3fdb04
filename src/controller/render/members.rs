//! The members: the StatefulSet (with its probes and volumes), the members' ConfigMap and the
//! PodDisruptionBudget.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapEnvSource, Container, ContainerPort, EnvFromSource, EnvVar,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSpec,
    PodTemplateSpec, ResourceRequirements, TopologySpreadConstraint, VolumeMount,
    VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::*;

/// What `kubectl exec NAME-0 -- etcdctl ...` needs, set in the member's container (the etcd
/// image ships etcdctl on its PATH, and etcdctl reads `ETCDCTL_*`; etcd itself reads only
/// `ETCD_*`): the member's own client port, and on a TLS cluster the member's client-port
/// certificate, which carries `client auth` and `localhost` (etcd's own gateway dials the
/// member with it too), checked against the cluster's CA.
pub fn etcdctl_env(ec: &EtcdCluster) -> Vec<EnvVar> {
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        ..Default::default()
    };
    let mut env = vec![value(
        "ETCDCTL_ENDPOINTS",
        format!("{}://localhost:{CLIENT_PORT}", scheme(ec)),
    )];
    if crate::api::tls_on(&ec.spec) {
        env.extend([
            value("ETCDCTL_CACERT", format!("{SERVER_TLS_MOUNT}/{TLS_CA}")),
            value("ETCDCTL_CERT", format!("{SERVER_TLS_MOUNT}/{TLS_CERT}")),
            value("ETCDCTL_KEY", format!("{SERVER_TLS_MOUNT}/{TLS_KEY}")),
        ]);
    }
    env
}

/// Each member's requests, no limits.
fn member_resources(opts: &RenderOptions) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(opts.member_cpu.clone())),
            ("memory".to_owned(), Quantity(opts.member_memory.clone())),
        ])),
        ..Default::default()
    }
}

/// Members on different nodes where possible (preferred: a cluster of 3 still starts on one
/// node), and spread over zones (ScheduleAnyway: a single-zone cluster still schedules).
fn member_placement(ec: &EtcdCluster) -> (Affinity, Vec<TopologySpreadConstraint>) {
    placement(member_selector(ec))
}

/// The members' spread rules over the pods `labels` select: preferred one per node, spread
/// over zones. A restore's Jobs get them too (over the restore pods): a member's claim binds
/// where its restore pod runs (WaitForFirstConsumer), so restored members keep the spread of a
/// fresh cluster.
pub(super) fn placement(
    labels: BTreeMap<String, String>,
) -> (Affinity, Vec<TopologySpreadConstraint>) {
    let selector = LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    };
    let affinity = Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(selector.clone()),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let spread = vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "topology.kubernetes.io/zone".to_owned(),
        when_unsatisfiable: "ScheduleAnyway".to_owned(),
        label_selector: Some(selector),
        ..Default::default()
    }];
    (affinity, spread)
}

pub(super) fn etcd_image(ec: &EtcdCluster, opts: &RenderOptions) -> String {
    format!(
        "{}/etcd:{}",
        opts.etcd_registry.trim_end_matches('/'),
        ec.spec.version
    )
}

/// A storage request as the apiserver writes it back (`1024Gi` is stored as `1Ti`), so what the
/// loop renders is what it reads.
pub(super) fn storage(size: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([(
        "storage".to_owned(),
        Quantity(crate::api::quantity::canonical(size)),
    )])
}

/// etcd's own corruption checks, in each release's spelling: a member that restarts compares
/// its data with its peers' before it serves (and stops when they differ), and the leader
/// compares the hashes the members recorded at each compaction (and raises the CORRUPT alarm
/// for the minority). v3.6 and v3.7 take feature gates (v3.7 refuses the old flags), v3.5 its
/// `--experimental-` flags; its compact hash check exists from v3.5.5.
pub fn corruption_check_args(version: &str) -> Vec<String> {
    let at_least = |minor, patch| crate::api::EtcdVersion::at_least(version, 3, minor, patch);
    if at_least(6, 0) {
        vec!["--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true".to_owned()]
    } else if at_least(5, 5) {
        vec![
            "--experimental-initial-corrupt-check=true".to_owned(),
            "--experimental-compact-hash-check-enabled=true".to_owned(),
        ]
    } else {
        vec!["--experimental-initial-corrupt-check=true".to_owned()]
    }
}

/// ConfigMap `NAME-members`: `ETCD_INITIAL_CLUSTER` and `ETCD_INITIAL_CLUSTER_STATE`, read by
/// each member pod (`envFrom`) when its container starts. A pod that joins reads the
/// membership as it is when it starts; a member that has a data directory ignores both. So a
/// scale-up changes this ConfigMap and never the pod template: no member restarts.
/// `memory` is what the loop keeps between passes (the annotations of
/// `decide::memory::Memory`), always written, empty or not, so that a change to any is a
/// change to apply.
pub fn members_config(
    ec: &EtcdCluster,
    initial_cluster: &str,
    state: &str,
    memory: BTreeMap<String, String>,
) -> ConfigMap {
    let mut metadata = meta(ec, members_config_name(ec), "member");
    metadata.annotations = Some(memory);
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([
            (
                "ETCD_INITIAL_CLUSTER".to_owned(),
                initial_cluster.to_owned(),
            ),
            ("ETCD_INITIAL_CLUSTER_STATE".to_owned(), state.to_owned()),
        ])),
        ..Default::default()
    }
}

/// `ETCD_INITIAL_CLUSTER` while a formed cluster's member list does not answer (a lost quorum,
/// or all members down): a list that names no member. etcd reads it only on an empty data
/// directory, so a member with its data starts as always, and one on an empty volume stops
/// ("couldn't find local name ... in the initial cluster configuration") instead of rejoining
/// under its old member ID with an empty log: without a leader such a member votes for any
/// candidate, and two empty members and one that lags elect a leader that lacks writes a
/// majority acknowledged (tests/members.rs
/// `quorum_loss_with_empty_volumes_never_elects_a_lagging_member`). The list comes back with
/// the next pass that reads the member list.
pub const FENCED_INITIAL_CLUSTER: &str = "quorum-lost-fenced=http://quorum-lost.invalid:2380";

/// The members' `ETCD_INITIAL_CLUSTER` of a formed cluster whose member list does not answer,
/// and what [`FENCED_FROM_ANNOTATION`] keeps: fenced, the list it had kept aside (`current`,
/// unless fenced already, else what was `saved`); or, when the members on empty volumes may
/// rejoin (`rejoin`: one member with data is all there is, `decide::quorum::sole_survivor`,
/// and with `Manual` recovery the plan is approved, `decide::quorum::approved`),
/// the kept list back (the full `spec.size` list if none was kept).
pub fn without_member_list(
    ec: &EtcdCluster,
    current: Option<&str>,
    saved: Option<&str>,
    rejoin: bool,
) -> (String, Option<String>) {
    let kept = current
        .filter(|c| *c != FENCED_INITIAL_CLUSTER && !c.is_empty())
        .or(saved)
        .map(str::to_owned);
    if rejoin {
        let list = kept.unwrap_or_else(|| initial_cluster(ec, ec.spec.size));
        (list, None)
    } else {
        (FENCED_INITIAL_CLUSTER.to_owned(), kept)
    }
}

/// The ConfigMap of a cluster whose member list the loop has not read: the `size` members it
/// bootstraps with, state `new`, or, for a cluster that has formed (its ID is recorded) and
/// lost the ConfigMap, `existing`: a pod with an empty volume then asks the members instead of
/// forming a cluster of its own.
pub fn bootstrap_config(ec: &EtcdCluster, size: i32, formed: bool) -> ConfigMap {
    let state = if formed { "existing" } else { "new" };
    members_config(ec, &initial_cluster(ec, size), state, no_memory())
}

/// The annotations of a loop that remembers nothing yet: each of them, empty.
pub fn no_memory() -> BTreeMap<String, String> {
    [
        JOINING_ANNOTATION,
        STARTED_ANNOTATION,
        REPLACING_ANNOTATION,
        CORRUPT_ANNOTATION,
    ]
    .into_iter()
    .map(|k| (k.to_owned(), String::new()))
    .collect()
}

pub fn members_config_name(ec: &EtcdCluster) -> String {
    format!("{}-members", ec.name_any())
}

pub fn stateful_set(ec: &EtcdCluster, replicas: i32, opts: &RenderOptions) -> StatefulSet {
    let name = ec.name_any();
    let scheme = scheme(ec);
    let mut args = vec![
        "--name=$(POD_NAME)".to_owned(),
        format!("--data-dir={DATA_DIR}"),
        format!("--listen-peer-urls={scheme}://0.0.0.0:{PEER_PORT}"),
        format!("--listen-client-urls={scheme}://0.0.0.0:{CLIENT_PORT}"),
        // Plain HTTP on its own port whatever the cluster's TLS: the kubelet's probes and the
        // metrics scrapers read `/readyz`, `/livez`, `/health` and `/metrics` there.
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
        format!(
            "--initial-advertise-peer-urls={scheme}://$(POD_NAME).{name}.$(POD_NAMESPACE).svc:{PEER_PORT}"
        ),
        format!(
            "--advertise-client-urls={scheme}://$(POD_NAME).{name}.$(POD_NAMESPACE).svc:{CLIENT_PORT}"
        ),
        format!("--initial-cluster-token={}", cluster_token(ec)),
        // The quota follows the volume (a growth raises it, through a restart one member at a
        // time); history is compacted on a period so the database never grows without end.
        format!("{QUOTA_FLAG}{}", crate::api::quota_backend_bytes(&ec.spec)),
        format!("--max-wals={}", crate::api::MAX_WALS),
        "--auto-compaction-mode=periodic".to_owned(),
        format!(
            "--auto-compaction-retention={}",
            ec.spec
                .maintenance
                .as_ref()
                .and_then(|m| m.auto_compaction_retention.as_deref())
                .unwrap_or(crate::api::AUTO_COMPACTION_RETENTION)
        ),
    ];
    // The WAL's budget (the quota's rule counts on it): 3.5 keeps 100,000 entries between
    // snapshots by default, 3.6 has 3.5's settings below as its defaults (and deprecates the
    // flags), so they are said on 3.5 only.
    if !crate::api::EtcdVersion::at_least(&ec.spec.version, 3, 6, 0) {
        args.push(format!("--snapshot-count={}", crate::api::SNAPSHOT_COUNT));
        args.push(format!("--max-snapshots={}", crate::api::MAX_SNAPSHOTS));
    }
    args.extend(corruption_check_args(&ec.spec.version));
    args.extend(member_tls_args(ec));
    let (tls_volumes, tls_mounts) = member_tls_volumes(ec);
    let (readiness, liveness) = probes(&ec.spec.version, crate::api::quota_backend_bytes(&ec.spec));
    let (affinity, spread) = member_placement(ec);
    let container = Container {
        name: "etcd".to_owned(),
        image: Some(etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcd".to_owned()]),
        args: Some(args),
        env: Some(
            [
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]
            .into_iter()
            .chain(etcdctl_env(ec))
            .collect(),
        ),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: members_config_name(ec),
                optional: Some(false),
            }),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ports: Some(vec![
            container_port("client", CLIENT_PORT),
            container_port("peer", PEER_PORT),
            container_port("metrics", METRICS_PORT),
        ]),
        readiness_probe: Some(readiness),
        startup_probe: Some(startup_probe(&liveness)),
        liveness_probe: Some(liveness),
        resources: Some(member_resources(opts)),
        volume_mounts: Some(
            std::iter::once(VolumeMount {
                name: "data".to_owned(),
                mount_path: DATA_MOUNT.to_owned(),
                ..Default::default()
            })
            .chain(tls_mounts)
            .collect(),
        ),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    StatefulSet {
        metadata: meta(ec, name.clone(), "member"),
        spec: StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name),
            pod_management_policy: Some("Parallel".to_owned()),
            // The loop restarts members itself, one at a time, followers first and the leader
            // last, each only while every voter is healthy (`controller::decide::upgrade`).
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                ..Default::default()
            }),
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
                    volumes: (!tls_volumes.is_empty()).then_some(tls_volumes),
                    affinity: Some(affinity),
                    topology_spread_constraints: Some(spread),
                    security_context: Some(restricted_pod()),
                    image_pull_secrets: pull_secrets(opts),
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
            // The members' volumes go with the cluster (a re-created cluster never starts on
            // a former cluster's data and membership); the backup claim and the final snapshot
            // stay. Scaling never removes members, so nothing is said about scale-down.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".to_owned()),
                    when_scaled: Some("Retain".to_owned()),
                },
            ),
            ..Default::default()
        },
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
/// The members' `--initial-cluster-token` (and a restore's: a restored cluster is a new
/// cluster under the same name).
pub fn cluster_token(ec: &EtcdCluster) -> String {
    format!("{}.{}", ec.name_any(), namespace(ec))
}

pub fn member_claim(ec: &EtcdCluster, ordinal: i32) -> String {
    format!("data-{}-{ordinal}", ec.name_any())
}

/// PodDisruptionBudget `NAME` over the voters' pods (the loop labels them from `member list`):
/// at least a quorum of the `voters` etcd reports stays available, so an eviction never leaves
/// fewer (with 5 voters of which 3 run, none may go). Before etcd has answered, `voters` is
/// `spec.size`. A single voter gets 1: it cannot be evicted without losing the cluster.
/// Unhealthy pods may always be evicted (`AlwaysAllow`).
pub fn pod_disruption_budget(ec: &EtcdCluster, voters: Option<i32>) -> PodDisruptionBudget {
    let voters = voters.unwrap_or(ec.spec.size).max(1);
    let mut selector = member_selector(ec);
    selector.insert(VOTER_LABEL.to_owned(), "true".to_owned());
    PodDisruptionBudget {
        metadata: meta(ec, ec.name_any(), "member"),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(voters / 2 + 1)),
            // A member pod that is running but not ready (crash-looping, or never ready) may
            // always be evicted: it serves nobody, and keeping it would block every drain of
            // its node while the healthy quorum is what the budget protects.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One volume of `spec.storageClass` and `spec.storageSize`.
pub(super) fn claim_spec(ec: &EtcdCluster) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
        storage_class_name: ec.spec.storage_class.clone(),
        resources: Some(VolumeResourceRequirements {
            requests: Some(storage(&ec.spec.storage_size)),
            ..Default::default()
        }),
        ..Default::default()
    }
}
