//! `serve` and `certs`: the server's flags (every one with an environment fallback).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::listen::ListenAddr;

use super::controller::{ControllerArgs, ControllerMode};
use super::parse::storage_class;

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
