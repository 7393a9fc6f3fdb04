//! Command line: `serve`, `crd`, `certs`, `review`, `convert`, `render`, `migrate-storage`. Every serve flag has an environment fallback.

use std::net::IpAddr;

use crate::controller::render::{self, RenderOptions};
use crate::listen::ListenAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "etcd-webhook",
    version,
    about = "Admission and conversion webhooks for EtcdCluster (etcd.example.com)"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve /mutate, /validate and /convert over HTTPS.
    Serve(Box<ServeArgs>),
    /// Print the CustomResourceDefinition (all versions, v1 stored) as YAML.
    Crd(CrdArgs),
    /// Write a development CA (ca.crt) and a serving pair (tls.crt, tls.key) signed by it.
    Certs(CertsArgs),
    /// Decide offline what the webhooks would: defaults, then the rules. Exit 0 allowed,
    /// 1 denied, 2 bad input.
    Review(ReviewArgs),
    /// Convert EtcdCluster manifests between versions, like `kubectl convert`.
    Convert(ConvertArgs),
    /// Print the objects the controller creates for EtcdCluster manifests (after the webhooks'
    /// defaults and rules). Exit 0, 1 when a manifest is denied, 2 on bad input.
    Render(RenderArgs),
    /// Rewrite every EtcdCluster so the apiserver stores it in the CRD's storage version (v1),
    /// then set the CRD's status.storedVersions to that version alone (KUBECONFIG or in-cluster
    /// config; RBAC: config/storage-migration). Exit 0 done, 1 when an object could not be
    /// rewritten (storedVersions left alone), 2 on any other error.
    MigrateStorage(MigrateStorageArgs),
    /// Take one snapshot of an etcd cluster from a healthy voter, check etcd's integrity hash,
    /// file it in S3 (or an S3-compatible store) or a folder, read it back, and prune the old
    /// ones: what the backup Jobs run. Prints what it filed as JSON. Exit 0 filed, 1 etcd,
    /// 2 arguments, 3 a corrupt snapshot, 4 the store.
    Backup(BackupArgs),
    /// Fetch a snapshot (`s3://bucket/key` or a file path) to a file, checking etcd's integrity
    /// hash and, when given, its SHA-256: what a restore Job runs before `etcdutl snapshot
    /// restore`. Prints what it fetched as JSON. Exit 0 fetched, 2 arguments, 3 a corrupt or
    /// unexpected snapshot (nothing is left at --out), 4 the store.
    FetchSnapshot(FetchArgs),
    /// Move a restored data directory to where the member reads it, once: what a restore Job
    /// runs after `etcdutl snapshot restore` wrote it beside. Exit 0 placed (or placed by an
    /// earlier attempt), 5 when the place holds a data directory this restore did not write
    /// (never overwritten) or there is nothing to place.
    PlaceRestored(PlaceArgs),
}

#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// The data directory etcdutl wrote.
    #[arg(long)]
    pub from: std::path::PathBuf,
    /// Where the member reads it; must not exist yet, unless this restore placed it.
    #[arg(long)]
    pub to: std::path::PathBuf,
    /// What names this restore (the loop gives the cluster's UID): written beside `--to`
    /// before the move, so that a retry knows a data directory there is its own.
    #[arg(long)]
    pub restore_id: String,
    /// Also write the JSON report here (the container's termination message path).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// The snapshot: `s3://bucket/prefix/NS/NAME-<UID>-snapshot-<time>.db` (what
    /// `status.backup.last.uri` says) or an absolute file path.
    #[arg(long)]
    pub from: String,
    /// The SHA-256 (hex) the file must have, e.g. from the source cluster's
    /// status.backup.last.sha256.
    #[arg(long)]
    pub sha256: Option<String>,
    /// Where to write it.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Also write the JSON report here (the container's termination message path).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// A directory to delete first if it is there: what a killed attempt of the same restore
    /// left half written (the restore Job's `data.restoring`).
    #[arg(long)]
    pub clear: Option<std::path::PathBuf>,
}

/// What a snapshot is taken for: the schedule (`STEM-snapshot-<time>.db`, pruned by
/// retention), or the cluster's deletion (`STEM-final-<time>.db`, never pruned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SnapshotKind {
    Scheduled,
    Final,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The stem of the snapshot names (`STEM-snapshot-<time>.db`; retention prunes only names
    /// with it): the loop gives `NAME-<first 8 characters of the cluster's UID>`.
    #[arg(long)]
    pub cluster: String,
    /// Client URLs to ask for the member list (comma-separated), e.g. the client Service's:
    /// `http://HOST:2379`, or `https://` for a TLS cluster (with `--tls-dir`).
    #[arg(long, value_delimiter = ',', required = true, value_parser = parse_endpoint)]
    pub endpoints: Vec<String>,
    /// `s3://bucket/prefix` (credentials and endpoint from the AWS_* variables) or a folder.
    #[arg(long)]
    pub destination: String,
    /// `scheduled` (named STEM-snapshot-<UTC time>.db, counted in --retention) or `final`
    /// (STEM-final-<UTC time>.db, the deletion's snapshot, never pruned); STEM is --cluster.
    #[arg(long, value_enum, default_value_t = SnapshotKind::Scheduled)]
    pub kind: SnapshotKind,
    /// Scheduled snapshots kept (the newest; the one just taken always is).
    #[arg(long, default_value_t = 7)]
    pub retention: u32,
    /// Where the snapshot is written before it is filed.
    #[arg(long, default_value = "/work")]
    pub work_dir: std::path::PathBuf,
    /// Also write the JSON report here (the container's termination message path).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Seconds for each etcd call (the snapshot stream itself has no limit).
    #[arg(long, default_value_t = 10)]
    pub timeout_seconds: u64,
    /// A TLS cluster's client certificate: a folder with `ca.crt`, `tls.crt` and `tls.key`
    /// (the Secret `NAME-client-tls` mounted); the members are checked against `ca.crt` only.
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Versions to serve (comma-separated); the others are left out of the CRD.
    /// Anything but all three is checked against the cluster of KUBECONFIG first: refused
    /// while the CRD's status.storedVersions lists an unserved version (run `migrate-storage`).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [TargetVersion::V1alpha1, TargetVersion::V1beta1, TargetVersion::V1])]
    pub served: Vec<TargetVersion>,
    /// Print without the check against a cluster.
    #[arg(long)]
    pub offline: bool,
    /// The namespace the webhook is installed in: the conversion webhook's Service and
    /// cert-manager's `inject-ca-from` point there. By default the install's own (POD_NAMESPACE,
    /// else the service account's inside a pod), else etcd-system.
    #[arg(long)]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct MigrateStorageArgs {
    /// Send every rewrite with dryRun=All (conversion and webhooks run, nothing is written) and
    /// leave storedVersions alone.
    #[arg(long)]
    pub dry_run: bool,
    /// Rewrites in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// The final report as YAML or JSON instead of text.
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// EtcdCluster manifests, any version (YAML or JSON, several documents allowed); `-` for
    /// stdin.
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub file: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub images: ImageArgs,
    /// The class a cluster that names none gets, as `serve --default-storage-class` fills it in.
    #[arg(long, value_parser = storage_class)]
    pub default_storage_class: Option<String>,
    /// Whether a new EtcdCluster that says nothing about TLS gets member TLS (`spec.tls: {}`:
    /// certificates from cert-manager), as `serve --default-member-tls` writes it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub default_member_tls: bool,
    /// Fail (exit 1) on a field the EtcdCluster's version does not have, as
    /// `kubectl apply --validate=strict` does; `--strict=false` only warns.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub strict: bool,
}

#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// AdmissionReviews or EtcdCluster manifests (YAML or JSON, several documents allowed);
    /// `-` for stdin.
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub file: String,
    /// The stored objects, to review the input as an UPDATE of them.
    #[arg(long)]
    pub old: Option<String>,
    /// Print the JSON Patch instead of the patched objects.
    #[arg(long)]
    pub patch: bool,
    /// The class a cluster that names none gets, as `serve --default-storage-class` fills it in.
    #[arg(long, value_parser = storage_class)]
    pub default_storage_class: Option<String>,
    /// Whether a new EtcdCluster that says nothing about TLS gets member TLS (`spec.tls: {}`:
    /// certificates from cert-manager), as `serve --default-member-tls` writes it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub default_member_tls: bool,
    /// Fail (exit 1) on a field the EtcdCluster's version does not have, as
    /// `kubectl apply --validate=strict` does; `--strict=false` only warns.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub strict: bool,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Target version.
    #[arg(long, value_enum)]
    pub to: TargetVersion,
    /// EtcdCluster manifests (YAML or JSON, several documents or a List allowed); `-` for stdin.
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub file: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetVersion {
    V1,
    V1beta1,
    V1alpha1,
}

impl From<TargetVersion> for crate::api::Version {
    fn from(t: TargetVersion) -> Self {
        match t {
            TargetVersion::V1 => crate::api::Version::V1,
            TargetVersion::V1beta1 => crate::api::Version::V1Beta1,
            TargetVersion::V1alpha1 => crate::api::Version::V1Alpha1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format: text, json, or auto (text on a terminal, json otherwise).
    #[arg(long, global = true, env = "ETCD_WEBHOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `etcd_webhook=debug,info`.
    #[arg(
        long,
        global = true,
        env = "ETCD_WEBHOOK_LOG_LEVEL",
        default_value = "info"
    )]
    pub log_level: String,
    /// `serve` only (the other commands make no spans): export traces over OTLP/HTTP
    /// (protobuf) to this collector's base URL, e.g.
    /// `http://otel-collector.monitoring:4318` (spans go to `URL/v1/traces`): one span per
    /// webhook request, continuing the apiserver's `traceparent`, and one per reconcile pass.
    /// Off when unset; `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turn
    /// it on too, and the other standard `OTEL_*` variables apply (`OTEL_SERVICE_NAME`,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_HEADERS`,
    /// `OTEL_SDK_DISABLED`, ...).
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS listener: `:8443` is every address, IPv6 and IPv4 (IPv4 alone
    /// where the kernel has no IPv6); `0.0.0.0:8443`, `[::1]:8443` or `localhost:8443` only those.
    #[arg(long, env = "ETCD_WEBHOOK_ADDR", default_value = ":8443")]
    pub addr: ListenAddr,
    /// Directory holding tls.crt and tls.key (the mounted cert-manager Secret). Without it a
    /// development CA and certificate for localhost are created under ./certs/dev.
    #[arg(long, env = "ETCD_WEBHOOK_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Read tls.crt and tls.key from this Secret through the API instead of a directory:
    /// `NAMESPACE/NAME`, or `NAME` in the pod's namespace (POD_NAMESPACE, else the service
    /// account's, else the kubeconfig context's). A renewal is served as soon as the apiserver
    /// has it, not after the kubelet's next sync of a mounted Secret. Needs get, list and watch
    /// on that Secret (the Role etcd-webhook-cert-secret).
    #[arg(long, env = "ETCD_WEBHOOK_CERT_SECRET", conflicts_with = "cert_dir")]
    pub cert_secret: Option<crate::tls::source::SecretRef>,
    /// Largest AdmissionReview body accepted (/mutate, /validate); larger ones get 413.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_BODY_BYTES", default_value_t = crate::webhook::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Largest ConversionReview body accepted (/convert): a LIST in an old version converts
    /// every object in one review.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_CONVERT_BODY_BYTES", default_value_t = crate::webhook::DEFAULT_MAX_CONVERT_BODY_BYTES)]
    pub max_convert_body_bytes: usize,
    /// Also offer HTTP/2 (off by default: the apiserver uses HTTP/1.1, and HTTP/2 brings
    /// rapid-reset exposure).
    #[arg(long, env = "ETCD_WEBHOOK_HTTP2")]
    pub http2: bool,
    /// Plain-HTTP port for /healthz, /readyz and /metrics.
    #[arg(long, env = "ETCD_WEBHOOK_HEALTH_ADDR", default_value = ":8081")]
    pub health_addr: ListenAddr,
    /// Re-read the certificate files this often, in case a file event was missed.
    #[arg(long, env = "ETCD_WEBHOOK_CERT_POLL_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub cert_poll_interval: Duration,
    /// How long to wait at start for a usable certificate (cert-manager may not have issued it
    /// yet) before exiting with an error. Readiness stays false meanwhile.
    #[arg(long, env = "ETCD_WEBHOOK_CERT_WAIT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub cert_wait: Duration,
    /// Warn when the serving certificate expires within this long.
    #[arg(long, env = "ETCD_WEBHOOK_CERT_EXPIRY_WARNING", default_value = "7d", value_parser = humantime::parse_duration)]
    pub cert_expiry_warning: Duration,
    /// Require client certificates signed by this CA bundle (PEM); reloaded like the serving
    /// pair. Without it no client certificate is asked for.
    #[arg(long, env = "ETCD_WEBHOOK_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Longest a request may take (kept below the apiserver's default 10 s webhook timeout).
    #[arg(long, env = "ETCD_WEBHOOK_REQUEST_TIMEOUT", default_value = "9s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Time a client has to send a request's headers, from the request's first byte (or the
    /// connection's start): slow clients cannot pile up.
    #[arg(long, env = "ETCD_WEBHOOK_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a kept-alive HTTP/1.1 connection may wait for its next request after the last
    /// response. Keep it above the apiserver's idle-connection timeout (90 s): a server that
    /// closes first races the apiserver's next POST on that connection, which is not retried.
    #[arg(long, env = "ETCD_WEBHOOK_IDLE_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Most connections served at once; further ones wait in the listen backlog.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT readiness turns false at once; new connections are still accepted
    /// for this long, so endpoints can drop the pod first.
    #[arg(long, env = "ETCD_WEBHOOK_SHUTDOWN_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,
    /// After the delay, how long in-flight requests may take to finish.
    #[arg(long, env = "ETCD_WEBHOOK_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
    /// Check that the apiserver trusts the served certificate: read the caBundle of the
    /// MutatingWebhookConfiguration, the ValidatingWebhookConfiguration and the CRD and verify
    /// the served chain against each (metric etcd_webhook_cabundle_mismatch, a Warning Event).
    /// auto: inside a pod; on: always (KUBECONFIG outside a pod); off: never.
    #[arg(
        long,
        env = "ETCD_WEBHOOK_CABUNDLE_CHECK",
        value_enum,
        default_value = "auto"
    )]
    pub cabundle_check: ControllerMode,
    /// How often the caBundle self-check runs.
    #[arg(long, env = "ETCD_WEBHOOK_CABUNDLE_CHECK_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub cabundle_check_interval: Duration,
    /// The StorageClass a new EtcdCluster that names none gets (`/mutate` writes it into the
    /// object at creation, so it never changes). Unset, such a cluster's claims name no class
    /// and get the cluster's default StorageClass.
    #[arg(long, env = "ETCD_WEBHOOK_DEFAULT_STORAGE_CLASS", value_parser = storage_class)]
    pub default_storage_class: Option<String>,
    /// Member TLS for new EtcdClusters: `/mutate` writes `spec.tls: {}` into a new v1 cluster
    /// that says nothing about TLS (its members then get certificates from cert-manager and
    /// require client certificates). On by default; `--default-member-tls=false` leaves such
    /// clusters on plain HTTP (a cluster can still ask for either with `spec.tls.enabled`).
    /// Given twice (a chart's `server.extraArgs` on top of `webhook.defaultMemberTls`), the last
    /// one counts.
    #[arg(long, env = "ETCD_WEBHOOK_DEFAULT_MEMBER_TLS", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, default_missing_value = "true", overrides_with = "default_member_tls")]
    pub default_member_tls: bool,
    #[command(flatten)]
    pub controller: ControllerArgs,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into.
    #[arg(long)]
    pub out: PathBuf,
    /// DNS names of the serving certificate (repeatable).
    #[arg(long = "dns", default_values_t = [String::from("localhost")])]
    pub dns: Vec<String>,
    /// IP addresses of the serving certificate (repeatable).
    #[arg(long = "ip", default_values_t = [IpAddr::from([127, 0, 0, 1]), IpAddr::from(std::net::Ipv6Addr::LOCALHOST)])]
    pub ip: Vec<IpAddr>,
    /// Validity in days (1 to 36500).
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(i64).range(1..=36_500))]
    pub days: i64,
    /// Replace ca.crt, tls.crt and tls.key when `--out` already holds them (without it, an
    /// existing pair is never overwritten; `--atomic` always swaps).
    #[arg(long)]
    pub force: bool,
    /// Write the kubelet's layout for a Secret volume (a timestamped folder, a `..data` symlink
    /// and `tls.crt`/`tls.key`/`ca.crt` links), swapping atomically if it is already there: a
    /// rehearsal of a cert-manager rotation.
    #[arg(long)]
    pub atomic: bool,
}

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

/// A member's client URL: `http://` or `https://`, then a host.
fn parse_endpoint(s: &str) -> Result<String, String> {
    let s = s.trim();
    match s.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(s.to_owned()),
        Some((scheme, _)) => Err(format!(
            "{s:?}: the scheme must be http or https, not {scheme:?}"
        )),
        None => Err(format!(
            "{s:?} has no scheme: write http://{s} (or https://{s} for a TLS cluster, with --tls-dir)"
        )),
    }
}

/// A DNS domain: dot-separated labels of letters, digits and `-` (a trailing dot is dropped).
fn parse_domain(s: &str) -> Result<String, String> {
    let d = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if d.len() <= 253 && d.split('.').all(label_ok) {
        Ok(d)
    } else {
        Err(format!(
            "{s:?} is not a DNS domain like cluster.local (labels of letters, digits and '-', separated by dots)"
        ))
    }
}

/// `key=value,...` as labels to match.
fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!("{p:?} is not key=value")),
        })
        .collect()
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

/// A finite number, 0 or more.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of 0 or more")),
    }
}

/// A StorageClass name, checked as the rules check `spec.storageClass`.
fn storage_class(name: &str) -> Result<String, String> {
    match crate::api::storage_class_error(name) {
        Some(why) => Err(why.to_owned()),
        None => Ok(name.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--default-member-tls` given twice (the chart's `server.extraArgs` on top of
    /// `webhook.defaultMemberTls`): the last one counts, in either order, and a bare flag is true.
    #[test]
    fn default_member_tls_given_twice_takes_the_last() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(["etcd-webhook", "serve"].iter().chain(args))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            match cli.command {
                Command::Serve(s) => s.default_member_tls,
                other => panic!("{other:?}"),
            }
        };
        assert!(parse(&[]));
        assert!(!parse(&["--default-member-tls=false"]));
        assert!(parse(&[
            "--default-member-tls=false",
            "--default-member-tls=true"
        ]));
        assert!(!parse(&[
            "--default-member-tls=true",
            "--default-member-tls=false"
        ]));
        assert!(parse(&[
            "--default-member-tls=false",
            "--default-member-tls"
        ]));
    }
}
