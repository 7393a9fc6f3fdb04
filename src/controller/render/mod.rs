//! Desired state: what one v1 EtcdCluster turns into. Pure functions, no I/O.
//!
//! Every object carries the labels in [`labels`] and (except the backup volume, which must
//! outlive the cluster) a controller ownerReference to the EtcdCluster, so deleting the
//! cluster cascades.

mod backup;
mod members;
mod network;
mod probes;
mod quota;
mod restore;
mod tls;
mod verify;

pub use backup::*;
pub use members::*;
pub use network::*;
pub use probes::*;
pub use quota::*;
pub use restore::*;
pub use tls::*;
pub use verify::*;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, EnvVarSource, LocalObjectReference, ObjectFieldSelector,
    PodSecurityContext, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
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
/// On the members' ConfigMap: when each non-voter was first seen (`ID=RFC3339,...`), for the
/// join timeout.
pub const JOINING_ANNOTATION: &str = "etcd.example.com/joining-since";
/// On the members' ConfigMap: when each started learner was first seen started
/// (`ID=RFC3339,...`), for the promote timeout.
pub const STARTED_ANNOTATION: &str = "etcd.example.com/learner-started";
/// EtcdCluster annotation the loop writes the first time it reads the cluster's member list:
/// the etcd cluster ID (hex). A member list from another cluster is never acted on.
pub const CLUSTER_ID_ANNOTATION: &str = "etcd.example.com/cluster-id";
/// EtcdCluster annotation of a restore whose `spec.restore.sha256` is unset: the SHA-256 of the
/// snapshot the first member was restored from, which every other member's fetch must match
/// (so all members hold the same data even if the object changed meanwhile).
pub const RESTORE_SHA256_ANNOTATION: &str = "etcd.example.com/restore-sha256";
/// EtcdCluster annotation of a recovery that restores the newest snapshot in place (a lost
/// quorum whose survivors are all older than it, `quorum::Diagnosis::Restoring`), written once
/// every member's data is copied: [`InPlace`] as JSON. While it is there the loop deletes the
/// StatefulSet, the member pods, their claims, the members' ConfigMap and old restore Jobs;
/// once they are gone it is replaced by [`RESTORED_FROM_ANNOTATION`] and the cluster ID goes.
pub const RESTORE_IN_PLACE_ANNOTATION: &str = "etcd.example.com/restore-in-place";
/// EtcdCluster annotation of a cluster restored in place: [`InPlace`] as JSON. Until the
/// cluster has an ID again, its members are restored from it as `spec.restore` would
/// ([`restore_source`]); afterwards it records where the data came from.
pub const RESTORED_FROM_ANNOTATION: &str = "etcd.example.com/restored-from";
/// On the members' ConfigMap: ordinals whose lost volume is to be replaced (`1,3`), written
/// before the member is removed.
pub const REPLACING_ANNOTATION: &str = "etcd.example.com/replacing";
/// On the members' ConfigMap: `ORDINAL=RFC3339,...`, when the member at each ordinal was last
/// found corrupt and replaced.
pub const CORRUPT_ANNOTATION: &str = "etcd.example.com/corrupt-detected";
/// On the members' ConfigMap while it is fenced: the `ETCD_INITIAL_CLUSTER` it had (the
/// membership the members' IDs belong to), written back when the empty members may rejoin.
pub const FENCED_FROM_ANNOTATION: &str = "etcd.example.com/fenced-initial-cluster";
/// On the members' ConfigMap, written when the fence goes on: `ORDINAL=POD_UID/RESTARTS,...`,
/// each member pod's etcd restart count as the loop saw it then. Read only while the ConfigMap
/// is fenced (`decide::exits::fenced_run`).
pub const FENCED_RESTARTS_ANNOTATION: &str = "etcd.example.com/fenced-restarts";

/// On the members' ConfigMap: the recovery plan the fence was last lifted for
/// (`quorum::rejoin_plan`): while that member answers at that applied index with no leader,
/// every other member that answers having applied nothing, or leads them, the fence stays
/// lifted (the empty members are rejoining, and their pods no longer report empty). Dropped
/// once a member list answers again (`pass::rescue::rejoined`).
pub const REJOIN_PLAN_ANNOTATION: &str = "etcd.example.com/rejoin-plan";

/// On a rescue Job's pod: the recovery plan its copy was made for
/// (`quorum::rejoin_plan`), and the ordinal of the member it copies.
pub const RESCUE_PLAN_ANNOTATION: &str = "etcd.example.com/rescue-plan";
pub const RESCUE_MEMBER_ANNOTATION: &str = "etcd.example.com/rescue-member";
/// On the member pods that are voters (the loop sets it from `member list`): the client
/// Service selects it, so learners never get client traffic.
pub const VOTER_LABEL: &str = "etcd.example.com/voter";
/// Where a member keeps its data (a subdirectory of the volume, away from `lost+found`).
const DATA_MOUNT: &str = "/var/lib/etcd";
const DATA_DIR: &str = "/var/lib/etcd/data";
/// A restore Job's etcdutl writes the data directory here (`DATA_DIR` with this suffix, on the
/// member's claim) before it is moved to `DATA_DIR`.
pub const RESTORING_SUFFIX: &str = ".restoring";
/// The non-root user (distroless `nonroot`) every pod runs as.
const RUN_AS: i64 = 65532;

/// The default of `--etcd-image-registry`.
pub const DEFAULT_ETCD_REGISTRY: &str = "quay.io/coreos";
/// The default of `--backup-image`: this project's own image, whose `backup` subcommand takes,
/// checks and files each snapshot.
pub const DEFAULT_BACKUP_IMAGE: &str =
    concat!("ghcr.io/example/etcd-webhook:", env!("CARGO_PKG_VERSION"));

/// The default of `--cluster-domain` (the kubelet's `clusterDomain` on most clusters).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The default of `--member-cpu-request`.
pub const DEFAULT_MEMBER_CPU: &str = "100m";
/// The default of `--member-memory-request`.
pub const DEFAULT_MEMBER_MEMORY: &str = "256Mi";

/// Settings that are not in the EtcdCluster but in the controller's flags (`cli::ImageArgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// `--etcd-image-registry`: images are `<registry>/etcd:<spec.version>`.
    pub etcd_registry: String,
    /// `--backup-image` (or the loop's own image): the image whose `/etcd-webhook backup` the
    /// backup Jobs run.
    pub backup_image: String,
    /// `--image-pull-secret`: the pull Secrets of every pod the loop makes.
    pub image_pull_secrets: Vec<String>,
    /// `--backup-service-account`: the ServiceAccount of the backup, restore and
    /// final-snapshot pods (`None`: the namespace's default, no token mounted).
    pub backup_service_account: Option<String>,
    /// `--cluster-domain`: the cluster's DNS domain, in the members' certificate names.
    pub cluster_domain: String,
    /// `--member-cpu-request`: each member's CPU request.
    pub member_cpu: String,
    /// `--member-memory-request`: each member's memory request.
    pub member_memory: String,
    /// `--network-policy`: which clusters get a NetworkPolicy.
    pub network_policy: NetworkPolicies,
    /// `--install-namespace`: where this install's pods run (let in to the client port).
    pub install_namespace: String,
    /// `--metrics-namespace-selector`: the namespaces let in to the members' metrics port
    /// (labels to match; empty: every namespace).
    pub metrics_namespaces: BTreeMap<String, String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            etcd_registry: DEFAULT_ETCD_REGISTRY.to_owned(),
            backup_image: DEFAULT_BACKUP_IMAGE.to_owned(),
            image_pull_secrets: Vec::new(),
            backup_service_account: None,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            member_cpu: DEFAULT_MEMBER_CPU.to_owned(),
            member_memory: DEFAULT_MEMBER_MEMORY.to_owned(),
            network_policy: NetworkPolicies::Tls,
            install_namespace: DEFAULT_INSTALL_NAMESPACE.to_owned(),
            metrics_namespaces: BTreeMap::new(),
        }
    }
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

/// `http://NAME-i.NAME.NS.svc:2379` for each member (`https://` with TLS).
pub fn endpoints(ec: &EtcdCluster, size: i32) -> Vec<String> {
    let (name, ns, scheme) = (ec.name_any(), namespace(ec), scheme(ec));
    (0..size)
        .map(|i| format!("{scheme}://{name}-{i}.{name}.{ns}.svc:{CLIENT_PORT}"))
        .collect()
}

/// A member's metrics URL (plain HTTP, [`METRICS_PORT`]) from its client URL: the same host.
/// `None` for a URL with no host.
pub fn metrics_url(client_url: &str) -> Option<String> {
    let uri: hyper::Uri = client_url.parse().ok()?;
    uri.scheme()?;
    // An IPv6 host keeps its brackets.
    let host = uri.host().filter(|h| !h.is_empty())?;
    Some(format!("http://{host}:{METRICS_PORT}/metrics"))
}

/// The client Service URL that snapshots and membership changes talk to.
pub fn client_url(ec: &EtcdCluster) -> String {
    format!(
        "{}://{}-client.{}.svc:{CLIENT_PORT}",
        scheme(ec),
        ec.name_any(),
        namespace(ec)
    )
}

/// Member `i`'s peer URL, as it is in etcd's member list.
pub fn peer_url(ec: &EtcdCluster, ordinal: i32) -> String {
    let (name, ns, scheme) = (ec.name_any(), namespace(ec), scheme(ec));
    format!("{scheme}://{name}-{ordinal}.{name}.{ns}.svc:{PEER_PORT}")
}

/// `--initial-cluster`: every member of a cluster of `size`.
pub fn initial_cluster(ec: &EtcdCluster, size: i32) -> String {
    let name = ec.name_any();
    cluster_list((0..size).map(|i| (format!("{name}-{i}"), peer_url(ec, i))))
}

/// The format of `--initial-cluster`: `name=peerURL` entries, comma-separated, in the order
/// given (the one place that spells it).
pub fn cluster_list<N: AsRef<str>, U: AsRef<str>>(
    entries: impl IntoIterator<Item = (N, U)>,
) -> String {
    entries
        .into_iter()
        .map(|(n, url)| format!("{}={}", n.as_ref(), url.as_ref()))
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

/// Service `NAME-client`: the members' client port, ready members only. From v3.5.11 a learner
/// is never ready (`/readyz` refuses it the linearizable read), so readiness alone keeps
/// clients off learners, and a member pod made again while the loop is down (an operator
/// upgrade, a drain) gets clients as soon as it is ready; before v3.5.11 `/health` passes on a
/// learner, so the Service also selects the voter label the loop sets from `member list`.
pub fn client_service(ec: &EtcdCluster) -> Service {
    let mut selector = member_selector(ec);
    if !readiness_excludes_learners(&ec.spec.version) {
        selector.insert(VOTER_LABEL.to_owned(), "true".to_owned());
    }
    Service {
        metadata: meta(ec, format!("{}-client", ec.name_any()), "client"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(selector),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether the release's readiness probe fails on a learner (`/readyz`, from v3.5.11).
pub fn readiness_excludes_learners(version: &str) -> bool {
    crate::api::EtcdVersion::at_least(version, 3, 5, 11)
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

/// `--image-pull-secret`, as a pod spec names them (none: the field is left out).
fn pull_secrets(opts: &RenderOptions) -> Option<Vec<LocalObjectReference>> {
    (!opts.image_pull_secrets.is_empty()).then(|| {
        opts.image_pull_secrets
            .iter()
            .map(|name| LocalObjectReference { name: name.clone() })
            .collect()
    })
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

/// Every object a new cluster gets: the cert-manager objects of a TLS cluster, the Services,
/// the members' ConfigMap, the StatefulSet and PodDisruptionBudget, the NetworkPolicy, (with
/// `spec.restore`) each member's claim and restore Job, then (with backups) the backup volume,
/// the CronJob, and the Job the finalizer would run on deletion. What `etcd-webhook render`
/// prints.
pub fn all(ec: &EtcdCluster, opts: &RenderOptions) -> Vec<serde_json::Value> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.expect("k8s objects serialize");
    let mut out = certificates(ec, opts);
    out.extend([
        json(serde_json::to_value(headless_service(ec))),
        json(serde_json::to_value(client_service(ec))),
        json(serde_json::to_value(bootstrap_config(
            ec,
            ec.spec.size,
            false,
        ))),
        json(serde_json::to_value(stateful_set(ec, ec.spec.size, opts))),
        json(serde_json::to_value(pod_disruption_budget(ec, None))),
    ]);
    if let Some(policy) = network_policy(ec, opts) {
        out.push(json(serde_json::to_value(policy)));
    }
    // A restore: each member's claim and its restore Job, made before the StatefulSet.
    if let Some(restore) = &ec.spec.restore
        && let Ok(source) = crate::api::SnapshotSource::parse(&restore.from)
    {
        for i in 0..ec.spec.size {
            out.push(json(serde_json::to_value(member_claim_object(ec, i))));
            out.push(json(serde_json::to_value(restore_job(
                ec,
                i,
                source,
                restore.sha256.as_deref(),
                opts,
            ))));
        }
    }
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
    #[test]
    fn a_members_metrics_url_is_its_client_host_on_the_metrics_port() {
        for (client, metrics) in [
            (
                "https://etcd-0.etcd.prod.svc:2379",
                Some("http://etcd-0.etcd.prod.svc:2381/metrics"),
            ),
            (
                "http://10.1.2.3:2379/",
                Some("http://10.1.2.3:2381/metrics"),
            ),
            (
                "http://[fd00::3]:2379",
                Some("http://[fd00::3]:2381/metrics"),
            ),
            ("http://[fd00::3]", Some("http://[fd00::3]:2381/metrics")),
            ("etcd-0:2379", None),
            ("http://:2379", None),
        ] {
            assert_eq!(metrics_url(client).as_deref(), metrics, "{client}");
        }
    }

    /// Without a member list: the ConfigMap is fenced and keeps the list it had; fenced again
    /// it keeps what was kept; the list comes back for a rejoining (the full list if none was
    /// kept).
    #[test]
    fn without_a_member_list_the_config_is_fenced_and_the_list_kept_for_a_rejoin() {
        let ec = cluster("etcd", 3, None);
        let full = initial_cluster(&ec, 3);
        let (list, keep) = without_member_list(&ec, Some(&full), None, false);
        assert_eq!(list, FENCED_INITIAL_CLUSTER);
        assert_eq!(keep.as_deref(), Some(full.as_str()));
        let (list, keep) =
            without_member_list(&ec, Some(FENCED_INITIAL_CLUSTER), Some("etcd-0=x"), false);
        assert_eq!(
            (list.as_str(), keep.as_deref()),
            (FENCED_INITIAL_CLUSTER, Some("etcd-0=x"))
        );
        let (list, keep) =
            without_member_list(&ec, Some(FENCED_INITIAL_CLUSTER), Some("etcd-0=x"), true);
        assert_eq!((list.as_str(), keep), ("etcd-0=x", None));
        let (list, _) = without_member_list(&ec, Some(FENCED_INITIAL_CLUSTER), None, true);
        assert_eq!(list, full);
    }

    use super::*;
    use crate::api::v1::{Backup, EtcdClusterSpec};

    /// A v1 EtcdCluster as the API returns it (name, namespace, uid, generation).
    pub(crate) fn cluster(name: &str, size: i32, backup: Option<Backup>) -> EtcdCluster {
        let mut ec = EtcdCluster::new(
            name,
            EtcdClusterSpec {
                size,
                version: "v3.5.10".to_owned(),
                storage_class: Some("ssd".to_owned()),
                storage_size: "10Gi".to_owned(),
                backup,
                restore: None,
                maintenance: None,
                tls: None,
                recovery: None,
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
        let mut tls = cluster("etcd-3", 3, Some(backup(None)));
        tls.spec.tls = Some(crate::api::v1::Tls::default());
        golden("etcd-3-tls.yaml", &render_all(&tls));
    }

    /// The NetworkPolicy: by default for TLS clusters only (a plain cluster's clients are never
    /// cut off by an upgrade), for every cluster or none with the flag; the peer port from the
    /// members only, the client port from the members, this install's pods, the cluster's
    /// backup Jobs and the labelled applications, the metrics port from the chosen namespaces
    /// and this install's pods.
    #[test]
    fn the_network_policy_lets_in_members_the_loop_backups_and_labelled_clients() {
        use crate::api::v1::Tls;
        let plain = cluster("etcd", 3, Some(backup(None)));
        let mut tls = plain.clone();
        tls.spec.tls = Some(Tls::default());
        let mut opts = RenderOptions::default();
        assert!(network_policy(&plain, &opts).is_none());
        let policy = network_policy(&tls, &opts).expect("a TLS cluster's policy");
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap(),
            member_selector(&tls)
        );
        let rules = spec.ingress.unwrap();
        let port = |i: usize| rules[i].ports.as_ref().unwrap()[0].port.clone().unwrap();
        let names: Vec<IntOrString> = (0..3).map(port).collect();
        assert_eq!(
            names,
            ["peer", "client", "metrics"].map(|p| IntOrString::String(p.to_owned()))
        );
        let from = |i: usize| serde_json::to_value(rules[i].from.as_ref().unwrap()).unwrap();
        assert_eq!(
            from(0),
            serde_json::json!([{"podSelector": {"matchLabels": member_selector(&tls)}}])
        );
        let client = from(1);
        assert_eq!(client.as_array().unwrap().len(), 4, "{client}");
        assert_eq!(
            client[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "etcd-system"
        );
        assert_eq!(
            client[1]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
            "etcd-webhook"
        );
        assert_eq!(
            client[2]["podSelector"]["matchExpressions"][0]["values"],
            serde_json::json!(["backup", "final-snapshot", "rescue"])
        );
        assert_eq!(
            client[3]["podSelector"]["matchLabels"][CLIENT_LABEL],
            "etcd"
        );
        // The backup Jobs' pods carry what the rule selects.
        let job = final_snapshot_job(&tls, &BackupTarget::Volume, &opts);
        let job_labels = job.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert_eq!(job_labels["app.kubernetes.io/component"], "final-snapshot");
        assert_eq!(job_labels["app.kubernetes.io/instance"], "etcd");
        assert_eq!(job_labels["app.kubernetes.io/managed-by"], "etcd-webhook");
        // The metrics port: every namespace, and the loop (it reads a member that serves no
        // client there). Every namespace is an empty selector with no `matchLabels`, as the
        // apiserver stores it: an empty map would never read back, and the loop applied the
        // policy again on every pass (seen on the real node: 68 applies in one case study).
        let metrics = from(2);
        assert_eq!(metrics[0], serde_json::json!({"namespaceSelector": {}}));
        assert_eq!(metrics[1], client[1], "{metrics}");

        opts.network_policy = NetworkPolicies::All;
        opts.metrics_namespaces = BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            "monitoring".to_owned(),
        )]);
        let policy = network_policy(&plain, &opts).expect("every cluster's policy");
        let rules = policy.spec.unwrap().ingress.unwrap();
        assert_eq!(
            serde_json::to_value(&rules[2].from).unwrap()[0],
            serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
        );
        opts.network_policy = NetworkPolicies::None;
        assert!(network_policy(&tls, &opts).is_none());
    }

    /// A TLS cluster: every URL `https://` but the metrics port's (the probes stay plain),
    /// etcd's certificate flags on the mounted Secrets, client certificates required on both
    /// ports; the backup Job presents the client certificate; the user's issuer signs the
    /// leaves when named (no CA of the cluster's own then), and no cert-manager object at all
    /// when the user makes the Secrets.
    #[test]
    fn a_tls_cluster_talks_https_with_client_certificates_from_mounted_secrets() {
        use crate::api::v1::{CertificateSource, IssuerRef, Tls};
        let mut ec = cluster("etcd", 3, Some(backup(None)));
        ec.spec.tls = Some(Tls::default());
        let sts = stateful_set(&ec, 3, &RenderOptions::default());
        let pod = sts.spec.template.spec.unwrap();
        let args = pod.containers[0].args.clone().unwrap();
        let urls: Vec<&String> = args.iter().filter(|a| a.contains("://")).collect();
        assert_eq!(urls.len(), 5, "{urls:?}");
        for url in &urls {
            assert_eq!(
                url.contains("https://"),
                !url.starts_with("--listen-metrics-urls="),
                "{url}"
            );
        }
        for flag in [
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
            "--trusted-ca-file=/etc/etcd/tls/server/ca.crt",
            "--peer-trusted-ca-file=/etc/etcd/tls/peer/ca.crt",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        let secrets: Vec<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect();
        assert_eq!(secrets, ["etcd-peer-tls", "etcd-server-tls"]);
        assert_eq!(endpoints(&ec, 1), ["https://etcd-0.etcd.prod.svc:2379"]);
        assert_eq!(client_url(&ec), "https://etcd-client.prod.svc:2379");
        assert!(initial_cluster(&ec, 3).contains("etcd-2=https://etcd-2.etcd.prod.svc:2380"));
        let job = final_snapshot_job(&ec, &BackupTarget::Volume, &RenderOptions::default());
        let job_pod = job.spec.unwrap().template.spec.unwrap();
        assert!(
            job_pod.containers[0]
                .args
                .iter()
                .flatten()
                .any(|a| a == "--tls-dir=/etc/etcd/tls/client")
        );
        assert!(job_pod.volumes.iter().flatten().any(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("etcd-client-tls"))
        }));

        let kinds = |ec: &EtcdCluster| -> Vec<String> {
            certificates(ec, &RenderOptions::default())
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["kind"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect()
        };
        assert_eq!(
            kinds(&ec),
            [
                "Issuer/etcd-selfsigned",
                "Certificate/etcd-ca",
                "Issuer/etcd-ca",
                "Certificate/etcd-peer",
                "Certificate/etcd-server",
                "Certificate/etcd-client"
            ]
        );
        let server = leaf_certificate(&ec, Purpose::Server, &RenderOptions::default());
        let names = server["spec"]["dnsNames"].as_array().unwrap();
        for name in ["*.etcd.prod.svc", "etcd-client.prod.svc", "localhost"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert!(
            server["spec"]["usages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u == "client auth"),
            "etcd's gateway dials the member with the server certificate"
        );

        ec.spec.tls = Some(Tls {
            issuer_ref: Some(IssuerRef {
                name: "corp-ca".to_owned(),
                kind: Some("ClusterIssuer".to_owned()),
                group: None,
            }),
            ..Tls::default()
        });
        assert_eq!(
            kinds(&ec),
            [
                "Certificate/etcd-peer",
                "Certificate/etcd-server",
                "Certificate/etcd-client"
            ]
        );
        assert_eq!(
            leaf_certificate(&ec, Purpose::Peer, &RenderOptions::default())["spec"]["issuerRef"],
            serde_json::json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
        ec.spec.tls = Some(Tls {
            certificates: Some(CertificateSource::Secrets),
            ..Tls::default()
        });
        assert!(certificates(&ec, &RenderOptions::default()).is_empty());
        ec.spec.tls = Some(Tls {
            enabled: Some(false),
            ..Tls::default()
        });
        assert!(certificates(&ec, &RenderOptions::default()).is_empty());
        assert_eq!(client_url(&ec), "http://etcd-client.prod.svc:2379");
    }

    #[test]
    fn quorum_safe_disruption_budget_from_the_voters_etcd_reports() {
        for (size, min) in [(1, 1), (3, 2), (5, 3), (7, 4)] {
            let pdb = pod_disruption_budget(&cluster("e", size, None), None);
            let spec = pdb.spec.unwrap();
            assert_eq!(
                spec.min_available,
                Some(IntOrString::Int(min)),
                "size {size}"
            );
            assert_eq!(spec.max_unavailable, None);
            let selector = spec.selector.unwrap().match_labels.unwrap();
            assert_eq!(selector[VOTER_LABEL], "true", "voters' pods only");
        }
        // 5 voters, of which 3 run: the budget keeps all 3 (3 healthy - 3 = 0 disruptions).
        let pdb = pod_disruption_budget(&cluster("e", 7, None), Some(5));
        assert_eq!(pdb.spec.unwrap().min_available, Some(IntOrString::Int(3)));
    }

    #[test]
    fn the_template_is_the_same_at_every_size_and_the_membership_comes_from_the_config_map() {
        let ec = cluster("etcd", 5, None);
        let opts = RenderOptions::default();
        let template = |n| stateful_set(&ec, n, &opts).spec.template;
        assert_eq!(
            template(3),
            template(5),
            "a scale-up must not roll the members"
        );
        assert_eq!(stateful_set(&ec, 4, &opts).spec.replicas, Some(4));
        let pod = template(3).spec.unwrap();
        let etcd = &pod.containers[0];
        assert!(
            etcd.args
                .iter()
                .flatten()
                .all(|a| !a.starts_with("--initial-cluster=")
                    && !a.starts_with("--initial-cluster-state")),
            "{:?}",
            etcd.args
        );
        let from = etcd.env_from.as_ref().unwrap()[0]
            .config_map_ref
            .as_ref()
            .unwrap();
        assert_eq!(from.name, members_config_name(&ec));
        assert_eq!(
            etcd.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let boot = bootstrap_config(&ec, 5, false).data.unwrap();
        assert_eq!(boot["ETCD_INITIAL_CLUSTER_STATE"], "new");
        // Rebuilt for a cluster that formed: never `new` (a pod with an empty volume would
        // form a cluster of its own).
        let rebuilt = bootstrap_config(&ec, 5, true).data.unwrap();
        assert_eq!(rebuilt["ETCD_INITIAL_CLUSTER_STATE"], "existing");
        assert_eq!(boot["ETCD_INITIAL_CLUSTER"].split(',').count(), 5);
        assert!(boot["ETCD_INITIAL_CLUSTER"].contains("etcd-4=http://etcd-4.etcd.prod.svc:2380"));
        let memory = crate::controller::decide::memory::Memory {
            joining: BTreeMap::from([(0x65, "2026-12-01T00:00:00Z".parse().unwrap())]),
            replacing: [1].into(),
            ..Default::default()
        };
        let joined = members_config(
            &ec,
            "etcd-0=http://x:2380",
            "existing",
            memory.annotations(),
        );
        let notes = joined.metadata.annotations.unwrap();
        assert_eq!(notes[JOINING_ANNOTATION], "65=2026-12-01T00:00:00Z");
        assert_eq!(notes[REPLACING_ANNOTATION], "1");
        // Learners get no client traffic: the client Service selects voters.
        let selector = client_service(&ec).spec.unwrap().selector.unwrap();
        assert_eq!(selector[VOTER_LABEL], "true");
    }

    /// A defragmentation blocks its member's `/livez` for its whole length (v3.6.4: 11 s for
    /// 2 GiB in use, benches/defrag.py): liveness outlasts the longest one the loop may start,
    /// the whole quota at the pace it counts on; a small quota keeps the usual six failures.
    #[test]
    fn liveness_outlasts_a_defragmentation_of_the_whole_quota() {
        for (storage, quota) in [
            ("1Gi", 320i64 << 20),
            ("10Gi", 4928 << 20),
            ("100Gi", 8 << 30),
        ] {
            assert_eq!(crate::api::quota_of_volume(storage), quota);
            for version in ["v3.6.4", "v3.5.35", "v3.5.3", "v3.5.1"] {
                let (_, alive) = probes(version, quota);
                let budget =
                    i64::from(alive.period_seconds.unwrap() * alive.failure_threshold.unwrap());
                let longest = crate::api::defrag_time(quota as u64).as_secs() as i64;
                assert!(
                    budget >= longest,
                    "{storage} {version}: {budget} s < {longest} s"
                );
                assert!(alive.failure_threshold.unwrap() >= 6);
                if storage == "1Gi" {
                    assert_eq!(alive.failure_threshold, Some(6), "{version}");
                }
            }
        }
        let (_, alive) = probes("v3.6.4", 4928 << 20);
        assert_eq!(
            alive.failure_threshold,
            Some(17),
            "154 s + 5 s at 10 s a failure, and one more"
        );
    }

    /// A rescue Job copies member 2 alone (its own URL, no member list), files under the
    /// namespace's folder as a rescue (never pruned: no retention), and its pod says the plan
    /// and the member, which the loop reads back.
    #[test]
    fn a_rescue_job_copies_one_member_alone_and_says_for_which_plan() {
        let ec = cluster("etcd", 5, None);
        let job = rescue_job(
            &ec,
            &BackupTarget::S3("s3://b/p/".to_owned()),
            &RenderOptions::default(),
            2,
            "rejoin-from-etcd-0-at-9",
        );
        assert_eq!(job.metadata.name.as_deref(), Some("etcd-rescue-2"));
        let spec = job.spec.unwrap();
        assert_eq!(
            spec.ttl_seconds_after_finished,
            Some(86400),
            "gone after a day"
        );
        let template = spec.template;
        let meta = template.metadata.unwrap();
        assert_eq!(
            meta.labels.unwrap()["app.kubernetes.io/component"],
            "rescue"
        );
        let annotations = meta.annotations.unwrap();
        assert_eq!(
            annotations[RESCUE_PLAN_ANNOTATION],
            "rejoin-from-etcd-0-at-9"
        );
        assert_eq!(annotations[RESCUE_MEMBER_ANNOTATION], "2");
        let args = template.spec.unwrap().containers[0].args.clone().unwrap();
        for arg in [
            "--kind=rescue",
            "--member=etcd-2",
            "--endpoints=http://etcd-2.etcd.prod.svc:2379",
            "--destination=s3://b/p/prod",
        ] {
            assert!(args.contains(&arg.to_owned()), "{arg} in {args:?}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--retention")),
            "{args:?}"
        );
    }

    #[test]
    fn probes_never_need_a_quorum_to_stay_alive_on_any_release() {
        let path = |p: &k8s_openapi::api::core::v1::Probe| {
            p.http_get.as_ref().and_then(|g| g.path.clone())
        };
        for (version, ready, alive) in [
            ("v3.6.4", "/readyz", Some("/livez")),
            ("v3.5.11", "/readyz", Some("/livez")),
            (
                "v3.5.10",
                "/health?exclude=NOSPACE",
                Some("/health?exclude=NOSPACE&serializable=true"),
            ),
            (
                "v3.5.3",
                "/health?exclude=NOSPACE",
                Some("/health?exclude=NOSPACE&serializable=true"),
            ),
            ("v3.5.2", "/health?exclude=NOSPACE", None),
            ("v3.4.30", "/health?exclude=NOSPACE", None),
        ] {
            let (r, l) = probes(version, 320 << 20);
            assert_eq!(path(&r).as_deref(), Some(ready), "{version}");
            assert_eq!(path(&l).as_deref(), alive, "{version}");
            if alive.is_none() {
                let tcp = l.tcp_socket.expect("a TCP liveness check before v3.5.3");
                assert_eq!(tcp.port, IntOrString::String("metrics".into()));
            }
        }
    }

    #[test]
    fn members_are_requested_spread_and_their_volumes_go_with_the_cluster() {
        let ec = cluster("etcd", 3, None);
        let opts = RenderOptions {
            member_cpu: "500m".to_owned(),
            ..Default::default()
        };
        let spec = stateful_set(&ec, 3, &opts).spec;
        let retention = spec.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
        let pod = spec.template.spec.unwrap();
        let requests = pod.containers[0]
            .resources
            .clone()
            .unwrap()
            .requests
            .unwrap();
        assert_eq!(requests["cpu"].0, "500m");
        assert_eq!(requests["memory"].0, DEFAULT_MEMBER_MEMORY);
        let preferred = pod
            .affinity
            .unwrap()
            .pod_anti_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(
            preferred[0].pod_affinity_term.topology_key,
            "kubernetes.io/hostname"
        );
        assert_eq!(
            preferred[0]
                .pod_affinity_term
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels,
            Some(member_selector(&ec))
        );
        let spread = pod.topology_spread_constraints.unwrap();
        assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
    }

    #[test]
    fn every_pod_the_loop_makes_gets_the_pull_secrets_and_jobs_the_service_account() {
        let ec = cluster("etcd", 3, Some(backup(Some("s3://b/p"))));
        let opts = RenderOptions {
            image_pull_secrets: vec!["regcred".to_owned(), "mirror".to_owned()],
            backup_service_account: Some("etcd-backup".to_owned()),
            ..Default::default()
        };
        let target = backup_target(&ec).unwrap().unwrap();
        let want = Some(vec![
            LocalObjectReference {
                name: "regcred".to_owned(),
            },
            LocalObjectReference {
                name: "mirror".to_owned(),
            },
        ]);
        let members = stateful_set(&ec, 3, &opts).spec.template.spec.unwrap();
        assert_eq!(members.image_pull_secrets, want);
        assert_eq!(
            members.service_account_name, None,
            "members need no identity"
        );
        let jobs = [
            backup_cron_job(&ec, &target, &opts)
                .spec
                .job_template
                .spec
                .unwrap()
                .template,
            final_snapshot_job(&ec, &target, &opts)
                .spec
                .unwrap()
                .template,
            restore_job(
                &ec,
                1,
                crate::api::SnapshotSource::S3("s3://b/p/x.db"),
                None,
                &opts,
            )
            .spec
            .unwrap()
            .template,
        ];
        for t in jobs {
            let pod = t.spec.unwrap();
            assert_eq!(pod.image_pull_secrets, want);
            assert_eq!(pod.service_account_name.as_deref(), Some("etcd-backup"));
            assert_eq!(pod.automount_service_account_token, Some(false));
        }
        // Unset: the fields are left out (the namespace's default account, no pull Secret).
        let plain = final_snapshot_job(&ec, &target, &RenderOptions::default());
        let pod = plain.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            (pod.image_pull_secrets, pod.service_account_name),
            (None, None)
        );
    }

    #[test]
    fn etcdctl_in_a_member_talks_to_that_member() {
        let env = |ec: &EtcdCluster| -> BTreeMap<String, String> {
            stateful_set(ec, 3, &RenderOptions::default())
                .spec
                .template
                .spec
                .unwrap()
                .containers[0]
                .env
                .clone()
                .unwrap()
                .into_iter()
                .filter(|e| e.name.starts_with("ETCDCTL_"))
                .map(|e| (e.name, e.value.unwrap()))
                .collect()
        };
        let plain = cluster("etcd", 3, None);
        assert_eq!(
            env(&plain),
            BTreeMap::from([(
                "ETCDCTL_ENDPOINTS".to_owned(),
                "http://localhost:2379".to_owned()
            )])
        );
        let mut tls = cluster("etcd", 3, None);
        tls.spec.tls = Some(Default::default());
        let e = env(&tls);
        assert_eq!(e["ETCDCTL_ENDPOINTS"], "https://localhost:2379");
        assert_eq!(e["ETCDCTL_CACERT"], "/etc/etcd/tls/server/ca.crt");
        assert_eq!(e["ETCDCTL_CERT"], "/etc/etcd/tls/server/tls.crt");
        assert_eq!(e["ETCDCTL_KEY"], "/etc/etcd/tls/server/tls.key");
        // The certificate it presents is for the client port and can authenticate a client.
        assert!(
            dns_names(&tls, Purpose::Server, "cluster.local").contains(&"localhost".to_owned())
        );
        let usages =
            leaf_certificate(&tls, Purpose::Server, &RenderOptions::default())["spec"]["usages"]
                .clone();
        assert!(usages.as_array().unwrap().contains(&"client auth".into()));
    }

    #[test]
    fn certificates_name_the_cluster_domain_and_only_the_peer_certificate_opens_raft() {
        let mut tls = cluster("etcd", 3, None);
        tls.spec.tls = Some(Default::default());
        let opts = RenderOptions {
            cluster_domain: "corp.internal".to_owned(),
            ..Default::default()
        };
        let peer = leaf_certificate(&tls, Purpose::Peer, &opts);
        let names = peer["spec"]["dnsNames"].as_array().unwrap();
        assert!(
            names.contains(&"*.etcd.prod.svc.corp.internal".into()),
            "{names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.as_str().unwrap().ends_with("cluster.local"))
        );
        let server = dns_names(&tls, Purpose::Server, "corp.internal");
        assert!(server.contains(&"etcd-client.prod.svc.corp.internal".to_owned()));
        let args = member_tls_args(&tls);
        assert!(
            args.contains(&"--peer-cert-allowed-cn=etcd-peer".to_owned()),
            "{args:?}"
        );
        assert_eq!(peer["spec"]["commonName"], "etcd-peer");
        // Secrets the user makes: their common names are theirs, none is pinned.
        tls.spec.tls.as_mut().unwrap().certificates =
            Some(crate::api::v1::CertificateSource::Secrets);
        assert!(
            !member_tls_args(&tls)
                .iter()
                .any(|a| a.starts_with("--peer-cert-allowed-cn"))
        );
    }

    /// Two clusters of one name in two namespaces, sharing a bucket, and a cluster made again
    /// under the same name (a new UID): each files its snapshots under names and a folder of
    /// its own, so none prunes (or is restored from) another's.
    #[test]
    fn snapshots_are_filed_per_namespace_and_per_cluster_uid() {
        let args = |ec: &EtcdCluster| -> Vec<String> {
            let target = backup_target(ec).unwrap().unwrap();
            backup_cron_job(ec, &target, &RenderOptions::default())
                .spec
                .job_template
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .containers[0]
                .args
                .clone()
                .unwrap()
        };
        let prod = cluster("etcd", 3, Some(backup(Some("s3://shared/etcd/"))));
        let mut staging = prod.clone();
        staging.metadata.namespace = Some("staging".to_owned());
        let mut again = prod.clone();
        again.metadata.uid = Some("9f000000-0000-4000-8000-000000000002".to_owned());
        let (a, b, c) = (args(&prod), args(&staging), args(&again));
        assert!(
            a.contains(&"--destination=s3://shared/etcd/prod".to_owned()),
            "{a:?}"
        );
        assert!(
            b.contains(&"--destination=s3://shared/etcd/staging".to_owned()),
            "{b:?}"
        );
        assert!(a.contains(&"--cluster=etcd-6a3c1f9e".to_owned()), "{a:?}");
        assert!(c.contains(&"--cluster=etcd-9f000000".to_owned()), "{c:?}");
    }

    /// A restored member's claim, made ahead by the loop, is the cluster's (the garbage
    /// collector deletes it with the cluster) but not under its control: the StatefulSet's
    /// retention policy takes control of it as of a claim it made (Kubernetes' StatefulSet
    /// controller leaves a claim another controller controls out of the policy and warns
    /// `ConflictingController` on every pod it makes).
    #[test]
    fn a_restored_members_claim_is_owned_by_the_cluster_not_controlled() {
        let ec = cluster("etcd", 3, None);
        let claim = member_claim_object(&ec, 2);
        assert_eq!(claim.metadata.name.as_deref(), Some("data-etcd-2"));
        let owners = claim.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].name.as_str()),
            ("EtcdCluster", "etcd")
        );
        assert_eq!(owners[0].uid, ec.metadata.uid.clone().unwrap());
        assert_eq!(owners[0].controller, Some(false));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
    }

    /// A restore's pods are spread as the members are (one per node preferred, over zones),
    /// each over the other restore pods: a member's claim binds where its restore pod runs.
    #[test]
    fn restore_pods_keep_the_members_spread() {
        let ec = cluster("etcd", 3, None);
        let job = restore_job(
            &ec,
            1,
            crate::api::SnapshotSource::S3("s3://b/k.db"),
            None,
            &RenderOptions::default(),
        );
        let pod = job.spec.unwrap().template;
        let labels = pod.metadata.unwrap().labels.unwrap();
        let spec = pod.spec.unwrap();
        let term = &spec
            .affinity
            .unwrap()
            .pod_anti_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap()[0]
            .pod_affinity_term;
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        let selects = term.label_selector.clone().unwrap().match_labels.unwrap();
        assert!(
            selects.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{selects:?}"
        );
        assert_eq!(selects["app.kubernetes.io/component"], "restore");
        let spread = spec.topology_spread_constraints.unwrap();
        assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
    }

    #[test]
    fn a_crash_looping_voter_never_blocks_a_drain() {
        let pdb = pod_disruption_budget(&cluster("etcd", 3, None), Some(3));
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow")
        );
    }

    #[test]
    fn images_come_from_the_registry_flag() {
        let ec = cluster("etcd", 3, None);
        let opts = RenderOptions {
            etcd_registry: "registry.local:5000/mirror/".to_owned(),
            ..Default::default()
        };
        let sts = stateful_set(&ec, 3, &opts);
        assert_eq!(
            sts.spec.template.spec.unwrap().containers[0]
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
            Some(Err(UnsupportedDestination(..)))
        ));
    }

    #[test]
    fn every_owned_object_points_at_its_cluster_as_controller() {
        let ec = cluster("etcd", 3, Some(backup(None)));
        let opts = RenderOptions::default();
        let metas = [
            headless_service(&ec).metadata,
            client_service(&ec).metadata,
            stateful_set(&ec, 3, &opts).metadata,
            pod_disruption_budget(&ec, Some(3)).metadata,
            backup_cron_job(&ec, &BackupTarget::Volume, &opts).metadata,
            final_snapshot_job(&ec, &BackupTarget::Volume, &opts).metadata,
            members_config(&ec, "", "new", no_memory()).metadata,
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

    /// The quota leaves room for the copy a defragmentation writes and the WAL: half of the
    /// volume after the WAL's budget; 3.5 members are told the WAL settings 3.6 defaults to.
    #[test]
    fn the_quota_leaves_room_for_a_defragmentation_and_the_wal() {
        use crate::api::{WAL_BUDGET_BYTES, quota_of_volume};
        assert_eq!(quota_of_volume("1Gi"), 320 << 20);
        assert_eq!(quota_of_volume("2Gi"), 832 << 20);
        assert_eq!(quota_of_volume("10Gi"), 4928 << 20);
        assert_eq!(quota_of_volume("100Gi"), 8 << 30);
        for gib in 1..=40_i64 {
            let q = quota_of_volume(&format!("{gib}Gi"));
            assert!(2 * q + WAL_BUDGET_BYTES <= gib << 30, "{gib}Gi: {q}");
        }
        let mut ec = cluster("etcd", 3, None);
        ec.spec.storage_size = "1Gi".to_owned();
        let args = |ec: &EtcdCluster| {
            stateful_set(ec, 3, &RenderOptions::default())
                .spec
                .template
                .spec
                .unwrap()
                .containers[0]
                .args
                .clone()
                .unwrap()
        };
        let on_35 = args(&ec);
        for flag in [
            "--quota-backend-bytes=335544320",
            "--max-wals=5",
            "--snapshot-count=10000",
            "--max-snapshots=5",
        ] {
            assert!(on_35.contains(&flag.to_owned()), "{flag} in {on_35:?}");
        }
        ec.spec.version = "v3.6.4".to_owned();
        let on_36 = args(&ec);
        assert!(on_36.contains(&"--max-wals=5".to_owned()));
        assert!(
            !on_36
                .iter()
                .any(|a| a.starts_with("--snapshot-count") || a.starts_with("--max-snapshots")),
            "3.6 deprecates them: {on_36:?}"
        );
    }

    /// Every release the tests run is rendered only flags it takes: no `--experimental-*` flag
    /// but v3.5's corruption checks (v3.7 removed them all and exits with code 2 on one; v3.6
    /// deprecated them), no v2 flag (gone in v3.6), `--snapshot-count` and `--max-snapshots` on
    /// v3.5 only (deprecated since v3.6), the corruption checks on, and the same TLS and
    /// listener flags on every release (tests/members.rs runs each).
    #[test]
    fn every_tested_release_is_rendered_only_flags_it_takes() {
        for release in crate::api::EtcdVersion::tested() {
            for tls in [false, true] {
                let mut ec = cluster("etcd", 3, None);
                ec.spec.version = release.to_string();
                if tls {
                    ec.spec.tls = Some(crate::api::v1::Tls::default());
                }
                let set = stateful_set(&ec, 3, &RenderOptions::default());
                let args = template_member(&set).unwrap().args.clone().unwrap();
                for a in &args {
                    // v3.5 has no other spelling of its corruption checks.
                    let v35_corruption_check = release.minor == 5
                        && (a.starts_with("--experimental-initial-corrupt-check")
                            || a.starts_with("--experimental-compact-hash-check-enabled"));
                    assert!(
                        (!a.starts_with("--experimental-") || v35_corruption_check)
                            && !a.contains("enable-v2"),
                        "{release}: {a}"
                    );
                }
                // etcd's corruption checks are on, in the release's spelling.
                let checks: Vec<&String> = args
                    .iter()
                    .filter(|a| {
                        a.contains("orrupt")
                            || a.contains("compact-hash")
                            || a.contains("CompactHash")
                    })
                    .collect();
                match (release.minor, release.patch) {
                    (5, 1) => assert_eq!(checks, ["--experimental-initial-corrupt-check=true"]),
                    (5, _) => assert_eq!(checks.len(), 2, "{checks:?}"),
                    _ => assert_eq!(
                        checks,
                        ["--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true"]
                    ),
                }
                let on_35 = release.minor == 5;
                for flag in ["--snapshot-count=", "--max-snapshots="] {
                    assert_eq!(
                        args.iter().any(|a| a.starts_with(flag)),
                        on_35,
                        "{release}: {flag} in {args:?}"
                    );
                }
                assert!(args.contains(&"--max-wals=5".to_owned()), "{release}");
            }
        }
    }

    /// A cluster whose database is already near the new, smaller quota keeps the quota it runs
    /// with (lowering it would raise NOSPACE at once); one with a small database takes the
    /// new one, and a kept quota is never raised.
    #[test]
    fn a_running_quota_is_never_lowered_under_the_database() {
        let mut ec = cluster("etcd", 3, None);
        ec.spec.storage_size = "1Gi".to_owned();
        let want = crate::api::quota_of_volume("1Gi");
        let old = 858_993_459;
        let with_db = |ec: &mut EtcdCluster, mib: i64| {
            ec.status = Some(crate::api::v1::EtcdClusterStatus {
                members: Some(vec![crate::api::v1::MemberState {
                    name: "etcd-0".into(),
                    db_size: Some(mib << 20),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        };
        let opts = RenderOptions::default();
        with_db(&mut ec, 300);
        let mut set = stateful_set(&ec, 3, &opts);
        assert_eq!(keep_running_quota(&ec, Some(old), &mut set), Some(old));
        assert_eq!(template_quota(&set), Some(old));
        with_db(&mut ec, 100);
        let mut set = stateful_set(&ec, 3, &opts);
        assert_eq!(keep_running_quota(&ec, Some(old), &mut set), None);
        assert_eq!(template_quota(&set), Some(want));
        with_db(&mut ec, 300);
        let mut set = stateful_set(&ec, 3, &opts);
        assert_eq!(keep_running_quota(&ec, Some(want), &mut set), None);
        assert_eq!(keep_running_quota(&ec, None, &mut set), None);
        assert_eq!(template_quota(&set), Some(want));
    }
}
