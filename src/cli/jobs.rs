//! What the backup, restore, final-snapshot and verification Jobs run: `backup`,
//! `fetch-snapshot`, `place-restored`, `verify-snapshot`.

use clap::{Args, ValueEnum};

use super::parse::parse_endpoint;

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

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The restored etcd's client URL (the verification Job's sidecar, on the pod's loopback).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_parser = parse_endpoint)]
    pub endpoint: String,
    /// The snapshot's revision, where the backup counted the keys and hashed them.
    #[arg(long)]
    pub revision: u64,
    /// The keys the backup counted there (status.backup.last.keys); without it, the hash alone.
    #[arg(long)]
    pub keys: Option<u64>,
    /// The hash of the keys the member had there (status.backup.last.hash).
    #[arg(long)]
    pub hash: u64,
    /// The revision that hash counts from (status.backup.last.compactRevision; -1: none).
    #[arg(long, allow_hyphen_values = true)]
    pub compact_revision: i64,
    /// How long to wait for the restored etcd to answer.
    #[arg(long, default_value_t = 300)]
    pub wait_seconds: u64,
    /// Seconds for each etcd call.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
    /// Also write the JSON report here (the container's termination message path).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// What a snapshot is taken for: the schedule (`STEM-snapshot-<time>.db`, pruned by
/// retention), the cluster's deletion (`STEM-final-<time>.db`, never pruned), or the rescue of
/// one member's data before a rebuild after a lost quorum (`STEM-rescue-POD-<time>.db`, never
/// pruned; taken from that member alone, which needs no quorum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SnapshotKind {
    Scheduled,
    Final,
    Rescue,
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
    /// `scheduled` (named STEM-snapshot-<UTC time>.db, counted in --retention), `final`
    /// (STEM-final-<UTC time>.db, the deletion's snapshot, never pruned) or `rescue`
    /// (STEM-rescue-MEMBER-<UTC time>.db, never pruned: the snapshot of the one member at the
    /// first of --endpoints, taken without a member list, as a member without a quorum still
    /// serves it); STEM is --cluster.
    #[arg(long, value_enum, default_value_t = SnapshotKind::Scheduled)]
    pub kind: SnapshotKind,
    /// With `--kind=rescue`: the member's pod name, in the snapshot's name.
    #[arg(long, required_if_eq("kind", "rescue"))]
    pub member: Option<String>,
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
