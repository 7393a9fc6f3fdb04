//! Command line: `serve`, `crd`, `certs`. Every serve flag has an environment fallback.

use std::net::{IpAddr, SocketAddr};
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
    Serve(ServeArgs),
    /// Print the CustomResourceDefinition (all versions, v1 stored) as YAML.
    Crd,
    /// Write a development CA (ca.crt) and a serving pair (tls.crt, tls.key) signed by it.
    Certs(CertsArgs),
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS listener.
    #[arg(long, env = "ETCD_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Directory holding tls.crt and tls.key (the mounted cert-manager Secret). Without it a
    /// development CA and certificate for localhost are created under ./certs/dev.
    #[arg(long, env = "ETCD_WEBHOOK_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Largest request body accepted; larger ones get 413.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_BODY_BYTES", default_value_t = crate::webhook::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Also offer HTTP/2 (off by default: the apiserver uses HTTP/1.1, and HTTP/2 brings
    /// rapid-reset exposure).
    #[arg(long, env = "ETCD_WEBHOOK_HTTP2")]
    pub http2: bool,
    /// Plain-HTTP port for /healthz, /readyz and /metrics.
    #[arg(long, env = "ETCD_WEBHOOK_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,
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
    #[arg(long = "ip", default_values_t = [IpAddr::from([127, 0, 0, 1])])]
    pub ip: Vec<IpAddr>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    pub days: i64,
    /// Write the kubelet's layout for a Secret volume (a timestamped folder, a `..data` symlink
    /// and `tls.crt`/`tls.key`/`ca.crt` links), swapping atomically if it is already there: a
    /// rehearsal of a cert-manager rotation.
    #[arg(long)]
    pub atomic: bool,
}
