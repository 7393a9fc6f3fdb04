//! Command line: `serve`, `crd`, `certs`, `review`, `convert`, `render`, `migrate-storage`. Every serve flag has an environment fallback.

mod controller;
mod jobs;
mod parse;
mod serve;

pub use controller::*;
pub use jobs::*;
pub use serve::*;

use parse::storage_class;

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
    /// Compare a restored snapshot with what its backup recorded: the keys and their hash at
    /// the snapshot's revision, asked of a lone etcd started on the restored data (what a
    /// verification Job runs last). Prints the outcome as JSON. Exit 0 verified, 6 failed or
    /// inconclusive, 1 when the restored etcd does not answer, 2 arguments.
    VerifySnapshot(VerifyArgs),
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

    /// A rescue snapshot names its member (in the file's name); the other kinds need none.
    #[test]
    fn a_rescue_snapshot_needs_its_member() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(
                [
                    "etcd-webhook",
                    "backup",
                    "--cluster=etcd-1a2b3c4d",
                    "--endpoints=http://etcd-1.etcd.prod.svc:2379",
                    "--destination=/backup",
                ]
                .iter()
                .chain(extra),
            )
        };
        let e = parse(&["--kind=rescue"]).unwrap_err().to_string();
        assert!(e.contains("--member"), "{e}");
        match parse(&["--kind=rescue", "--member=etcd-1"])
            .unwrap()
            .command
        {
            Command::Backup(b) => {
                assert_eq!(
                    (b.kind, b.member.as_deref()),
                    (SnapshotKind::Rescue, Some("etcd-1"))
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["--kind=final"]).is_ok());
    }
}
