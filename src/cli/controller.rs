//! The reconcile loop's flags: the images and pod settings of what it renders, and how it
//! runs (mode, namespace, timeouts, request limits).

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse::{non_negative, parse_domain, parse_labels};
use crate::controller::render::{self, RenderOptions};

/// The images and member requests of the objects the controller renders (`serve` and `render`
/// alike).
#[derive(Clone, Debug, Args)]
pub struct ImageArgs {
    /// Registry of the etcd images: members run `<registry>/etcd:<spec.version>`.
    #[arg(long, env = "ETCD_WEBHOOK_ETCD_IMAGE_REGISTRY", default_value = render::DEFAULT_ETCD_REGISTRY)]
    pub etcd_image_registry: String,
    /// Image whose `/etcd-webhook backup` the backup, restore and final-snapshot Jobs run: this
    /// project's own. Unset, the loop uses the image its own container runs (read from its Pod
    /// at start, so a `kustomize edit set image` reaches the Jobs too); `render` and a loop
    /// outside a pod use the compiled-in default.
    #[arg(long, env = "ETCD_WEBHOOK_BACKUP_IMAGE")]
    pub backup_image: Option<String>,
    /// Image pull Secret (in the cluster's namespace) given to every pod the loop makes: the
    /// members and the backup, restore and final-snapshot Jobs. Repeat or comma-separate.
    #[arg(
        long = "image-pull-secret",
        env = "ETCD_WEBHOOK_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    pub image_pull_secrets: Vec<String>,
    /// ServiceAccount (in the cluster's namespace) the backup, restore and final-snapshot pods
    /// run as: the identity an object store trusts (IRSA: EKS's webhook projects the token it
    /// needs). Unset: the namespace's `default`. The Kubernetes API token is never mounted.
    #[arg(long, env = "ETCD_WEBHOOK_BACKUP_SERVICE_ACCOUNT")]
    pub backup_service_account: Option<String>,
    /// No longer used (snapshots are filed by `--backup-image`); accepted so that an older
    /// install's flags still start the server, with a warning.
    #[arg(long, hide = true)]
    pub backup_helper_image: Option<String>,
    /// No longer used (uploads are done by `--backup-image`); accepted with a warning.
    #[arg(long, hide = true)]
    pub backup_s3_image: Option<String>,
    /// The cluster's DNS domain (the kubelet's clusterDomain): TLS members' certificates name
    /// `*.NAME.NS.svc.<domain>`, the name etcd's peer listener finds for a connecting peer.
    #[arg(long, env = "ETCD_WEBHOOK_CLUSTER_DOMAIN", default_value = render::DEFAULT_CLUSTER_DOMAIN, value_parser = parse_domain)]
    pub cluster_domain: String,
    /// CPU request of each etcd member (no limit: a throttled member misses heartbeats).
    #[arg(long, env = "ETCD_WEBHOOK_MEMBER_CPU_REQUEST", default_value = render::DEFAULT_MEMBER_CPU)]
    pub member_cpu_request: String,
    /// Memory request of each etcd member (no limit: an OOM kill costs a member).
    #[arg(long, env = "ETCD_WEBHOOK_MEMBER_MEMORY_REQUEST", default_value = render::DEFAULT_MEMBER_MEMORY)]
    pub member_memory_request: String,
    /// Which clusters get a NetworkPolicy that lets in only their members, this install's
    /// pods, their backup Jobs and pods labelled `etcd.example.com/client: NAME`.
    #[arg(long, env = "ETCD_WEBHOOK_NETWORK_POLICY", value_enum, default_value_t = NetworkPolicyArg::Tls)]
    pub network_policy: NetworkPolicyArg,
    /// The namespace of this install's pods, let in to the members' client port by their
    /// NetworkPolicy: the pod's own (POD_NAMESPACE), else etcd-system.
    #[arg(long, env = "POD_NAMESPACE", default_value = render::DEFAULT_INSTALL_NAMESPACE)]
    pub install_namespace: String,
    /// The namespaces let in to the members' metrics port by their NetworkPolicy, as labels
    /// (`kubernetes.io/metadata.name=monitoring`, comma-separated); empty: every namespace.
    #[arg(long, env = "ETCD_WEBHOOK_METRICS_NAMESPACE_SELECTOR", default_value = "", value_parser = parse_labels)]
    pub metrics_namespace_selector: std::collections::BTreeMap<String, String>,
}

/// Which clusters get a NetworkPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkPolicyArg {
    /// Clusters with spec.tls (their clients are set up anew anyway; a plain cluster's
    /// existing clients are not cut off).
    Tls,
    /// Every cluster.
    All,
    /// None (a policy made before is deleted).
    None,
}

impl From<&ImageArgs> for RenderOptions {
    fn from(args: &ImageArgs) -> Self {
        RenderOptions {
            etcd_registry: args.etcd_image_registry.clone(),
            backup_image: args
                .backup_image
                .clone()
                .filter(|i| !i.trim().is_empty())
                .unwrap_or_else(|| render::DEFAULT_BACKUP_IMAGE.to_owned()),
            image_pull_secrets: args
                .image_pull_secrets
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            backup_service_account: args
                .backup_service_account
                .clone()
                .filter(|s| !s.is_empty()),
            cluster_domain: args.cluster_domain.clone(),
            member_cpu: args.member_cpu_request.clone(),
            member_memory: args.member_memory_request.clone(),
            network_policy: match args.network_policy {
                NetworkPolicyArg::Tls => render::NetworkPolicies::Tls,
                NetworkPolicyArg::All => render::NetworkPolicies::All,
                NetworkPolicyArg::None => render::NetworkPolicies::None,
            },
            install_namespace: args.install_namespace.clone(),
            metrics_namespaces: args.metrics_namespace_selector.clone(),
        }
    }
}

/// When the reconcile loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControllerMode {
    /// On inside a pod (in-cluster config); elsewhere off with a log line, KUBECONFIG or not
    /// (webhooks only, e.g. on a laptop).
    Auto,
    /// Always; no usable Kubernetes config is an error.
    On,
    /// Never: webhooks only.
    Off,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Controller")]
pub struct ControllerArgs {
    /// Run the EtcdCluster reconcile loop in this process.
    #[arg(long = "controller", env = "ETCD_WEBHOOK_CONTROLLER", value_enum, default_value_t = ControllerMode::Auto)]
    pub mode: ControllerMode,
    /// Reconcile only while holding the Lease `etcd-webhook-leader` (webhooks serve on every
    /// replica regardless). Turn off only with a single replica.
    #[arg(long, env = "ETCD_WEBHOOK_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Namespace of the leader Lease; by default the pod's own (POD_NAMESPACE, else the
    /// service account's), outside a pod etcd-system (never the kubeconfig context's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// A holder that stops renewing loses the Lease after this long.
    #[arg(long, env = "ETCD_WEBHOOK_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// This replica's identity in the Lease and in Events; by default the pod name
    /// (POD_NAME), else the host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconcile EtcdClusters of this namespace only (pair it with namespaced RBAC).
    #[arg(long, env = "ETCD_WEBHOOK_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    #[command(flatten)]
    pub images: ImageArgs,
    /// How long one final-snapshot Job may run (plus the largest database at 8 MiB/s) before it
    /// counts as failed and a new one starts; deletion never goes without the snapshot unless
    /// the cluster is annotated etcd.example.com/release-volumes=true or backups are off.
    #[arg(long, env = "ETCD_WEBHOOK_FINALIZER_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    pub finalizer_timeout: Duration,
    /// Periodic resync of a cluster with a member ready; a cluster with none is looked at ten
    /// times less often (nothing to ask etcd; watch events bring its progress).
    #[arg(long, env = "ETCD_WEBHOOK_RESYNC_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub resync_interval: Duration,
    /// How long a member added to etcd may stay unstarted (its pod never running) before the
    /// loop removes it again, with a Warning Event.
    #[arg(long, env = "ETCD_WEBHOOK_MEMBER_JOIN_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub member_join_timeout: Duration,
    /// A learner that has started but not caught up with its leader (so etcd refuses to promote
    /// it) within this is removed, its volume replaced, and added again (Warning Event
    /// MemberNeverCaughtUp).
    #[arg(long, env = "ETCD_WEBHOOK_MEMBER_PROMOTE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub member_promote_timeout: Duration,
    /// The loop's requests to the Kubernetes API per second, on average (client-go's QPS;
    /// controller-runtime's default); 0: no client-side limit. The Lease has its own client.
    #[arg(long, env = "ETCD_WEBHOOK_KUBE_API_QPS", default_value_t = 20.0, value_parser = non_negative)]
    pub kube_api_qps: f64,
    /// Requests the loop may send at once above --kube-api-qps before it waits (client-go's
    /// Burst).
    #[arg(long, env = "ETCD_WEBHOOK_KUBE_API_BURST", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_api_burst: u32,
    /// At most this many EtcdClusters are reconciled at once (0: no bound).
    #[arg(
        long,
        env = "ETCD_WEBHOOK_MAX_CONCURRENT_RECONCILES",
        default_value_t = 16
    )]
    pub max_concurrent_reconciles: u16,
    /// On shutdown the loop stops taking work and its running passes get this long to finish
    /// (then they are abandoned); then the Lease is released, and only then does readiness go
    /// off and the server drain.
    #[arg(long, env = "ETCD_WEBHOOK_CONTROLLER_STOP_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub controller_stop_timeout: Duration,
    /// Keep TLS clusters' client Secrets (labelled etcd.example.com/client-tls=true) in a watch
    /// cache: no GET per cluster, but it needs list and watch on Secrets in every namespace the
    /// loop watches (chart controller.cacheClientSecrets). Without it each is read by name
    /// every 5 minutes (and after a pass no member answered).
    #[arg(long, env = "ETCD_WEBHOOK_CACHE_CLIENT_SECRETS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cache_client_secrets: bool,
}
