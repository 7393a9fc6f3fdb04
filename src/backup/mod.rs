//! `etcd-webhook backup`: one snapshot of a cluster, taken from a healthy voter, checked, filed
//! in a bucket or on the backup claim, read back, and the old ones pruned. It runs in the
//! backup Job's pod (the same image as the webhook) and reports what it filed as one JSON
//! line on stdout and in the container's termination message, where the loop reads it.
//!
//! Steps, each with its own exit code and named in the error:
//! 1. `member list` through the given endpoints, then `status` of every voter: the snapshot
//!    comes from a healthy voter, a follower when there is one (the leader is spared), the one
//!    with the highest raft index among those;
//! 2. `maintenance/snapshot` from it through the v3 JSON gateway, written to the work folder
//!    while [`snapshot::Reader`] checks the hash etcd appends (what `etcdutl snapshot restore`
//!    checks) and hashes the whole file;
//! 3. the file to the destination through `object_store` (S3 or any S3-compatible store,
//!    multipart above 10 MiB; or a folder), then read back and its SHA-256 compared, never
//!    over an object already there and named only once read back ([`file`]);
//! 4. retention: the scheduled snapshots beyond the newest `--retention` go
//!    ([`snapshot::expired`]: never the one just written, never a final snapshot).

pub mod snapshot;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http_body_util::BodyExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use crate::cli::{BackupArgs, FetchArgs, PlaceArgs};
use crate::controller::decide::members::MemberStatus;
use crate::controller::etcd::{Etcd, EtcdError, Gateway};
pub use crate::controller::render::BackupReport as Report;
use snapshot::{Kind, Verified};

/// Why a backup failed; [`Error::step`] names the step for the loop's Warning Event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no healthy voter to take the snapshot from: {0}")]
    NoVoter(String),
    #[error("snapshot from {member}: {source}")]
    Snapshot {
        member: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("snapshot from {member} refused: {source}")]
    Corrupt {
        member: String,
        source: snapshot::StreamError,
    },
    #[error("{step} {uri}: {source}")]
    Store {
        step: &'static str,
        uri: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{0}")]
    Usage(String),
    #[error("the client certificate: {0}")]
    Tls(String),
    #[error("place the restored data: {0}")]
    Place(String),
}

impl Error {
    /// The step that failed, as the loop names it.
    pub fn step(&self) -> &'static str {
        match self {
            Error::NoVoter(_) => "choose a member",
            Error::Snapshot { .. } => "snapshot",
            Error::Corrupt { .. } => "verify",
            Error::Store { step, .. } => step,
            Error::Usage(_) => "arguments",
            Error::Tls(_) => "read the client certificate",
            Error::Place(_) => "place",
        }
    }

    /// The process's exit code: 1 etcd, 2 arguments, 3 a corrupt snapshot, 4 the store, 5 the
    /// restored data cannot be placed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::NoVoter(_) | Error::Snapshot { .. } => 1,
            Error::Usage(_) | Error::Tls(_) => 2,
            Error::Corrupt { .. } => 3,
            Error::Store { .. } => 4,
            Error::Place(_) => 5,
        }
    }
}

/// Where snapshots are filed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `s3://bucket/prefix`.
    S3 { bucket: String, prefix: String },
    /// A folder (the backup claim's mount).
    Folder(std::path::PathBuf),
}

impl Destination {
    pub fn parse(s: &str) -> Result<Destination, Error> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::Usage(format!("destination {s:?} names no bucket")));
            }
            return Ok(Destination::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        if s.starts_with('/') {
            return Ok(Destination::Folder(s.into()));
        }
        Err(Error::Usage(format!(
            "destination {s:?}: use s3://bucket/prefix or an absolute folder path"
        )))
    }

    /// The URI of a snapshot named `name` here.
    pub fn uri(&self, name: &str) -> String {
        match self {
            Destination::S3 { bucket, prefix } if prefix.is_empty() => {
                format!("s3://{bucket}/{name}")
            }
            Destination::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}/{name}"),
            Destination::Folder(dir) => dir.join(name).display().to_string(),
        }
    }

    fn prefix(&self) -> &str {
        match self {
            Destination::S3 { prefix, .. } => prefix,
            Destination::Folder(_) => "",
        }
    }

    fn path(&self, name: &str) -> StorePath {
        match self.prefix() {
            "" => StorePath::from(name),
            p => StorePath::from(format!("{p}/{name}")),
        }
    }

    /// The store: S3 from the usual `AWS_*` variables (keys, `AWS_REGION`, `AWS_ENDPOINT_URL`
    /// for an S3-compatible store, web identity or instance credentials when no keys are
    /// given), path-style addressing unless `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`, plain
    /// HTTP allowed for an `http://` endpoint; or the folder.
    pub fn open(&self) -> Result<Arc<dyn ObjectStore>, Error> {
        let fail = |e: object_store::Error| Error::Store {
            step: "open",
            uri: self.uri(""),
            source: Box::new(e),
        };
        match self {
            Destination::S3 { bucket, .. } => {
                let source = credentials(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
                    .map_err(|why| Error::Store {
                        step: "open",
                        uri: self.uri(""),
                        source: why.into(),
                    })?;
                tracing::debug!(credentials = source, "S3 credentials");
                let mut builder =
                    object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                    .iter()
                    .find_map(|k| std::env::var(k).ok());
                if endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"))
                {
                    builder = builder.with_allow_http(true);
                }
                if std::env::var("AWS_REGION").is_err()
                    && std::env::var("AWS_DEFAULT_REGION").is_err()
                {
                    builder = builder.with_region("us-east-1");
                }
                Ok(Arc::new(builder.build().map_err(fail)?))
            }
            Destination::Folder(dir) => Ok(Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(fail)?,
            )),
        }
    }
}

/// Where the S3 credentials come from, read from the environment as the S3 client reads it:
/// keys, a web identity (IRSA), the container credentials endpoint, or else the instance
/// metadata service; with that turned off (`AWS_EC2_METADATA_DISABLED=true`) and nothing
/// else, "no credentials" in words that say what to set, instead of the metadata service's
/// refusal.
pub fn credentials(env: impl Fn(&str) -> Option<String>) -> Result<&'static str, String> {
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(_), Some(_)) => return Ok("keys"),
        (Some(_), None) => {
            return Err("AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY (the Secret NAME-backup-credentials needs both)".to_owned());
        }
        (None, Some(_)) => {
            return Err("AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID (the Secret NAME-backup-credentials needs both)".to_owned());
        }
        (None, None) => {}
    }
    if env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env("AWS_ROLE_ARN").is_some() {
        return Ok("web identity");
    }
    if env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
    {
        return Ok("container credentials");
    }
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the Secret NAME-backup-credentials), or give the pods a cloud identity (--backup-service-account); the instance metadata service is off (AWS_EC2_METADATA_DISABLED)".to_owned());
    }
    Ok("instance metadata")
}

/// The voter to take the snapshot from: serving (healthy, or whose only alarm is NOSPACE: a
/// full database still serves reads and a snapshot, the copy most worth having then), a
/// healthy one before one with an alarm, a follower before the leader, the highest raft index
/// first; its client URL and name.
pub fn choose(
    members: &[crate::controller::decide::members::Member],
    statuses: &[(u64, Result<MemberStatus, EtcdError>)],
) -> Result<(String, String, u64), String> {
    type Candidate<'a> = (
        bool,
        bool,
        u64,
        &'a crate::controller::decide::members::Member,
        u64,
    );
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    let mut why = Vec::new();
    for m in members.iter().filter(|m| !m.is_learner && m.started()) {
        match statuses.iter().find(|(id, _)| *id == m.id).map(|(_, s)| s) {
            Some(Ok(s)) if s.serving() && !m.client_urls.is_empty() => {
                candidates.push((
                    !s.healthy(),
                    s.leader == m.id,
                    s.raft_index,
                    m,
                    s.header.revision,
                ));
            }
            Some(Ok(s)) => why.push(format!(
                "{} unhealthy (leader {:x}, errors {:?})",
                m.name, s.leader, s.errors
            )),
            Some(Err(e)) => why.push(format!("{}: {e}", m.name)),
            None => why.push(format!("{}: not asked", m.name)),
        }
    }
    candidates
        .sort_by_key(|(alarmed, leader, index, ..)| (*alarmed, *leader, std::cmp::Reverse(*index)));
    candidates
        .first()
        .map(|(_, _, _, m, revision)| (m.client_urls[0].clone(), m.name.clone(), *revision))
        .ok_or_else(|| {
            if why.is_empty() {
                "the member list has no started voter".to_owned()
            } else {
                why.join("; ")
            }
        })
}

/// Runs one backup; the report, or why it failed.
pub async fn run(args: &BackupArgs) -> Result<Report, Error> {
    let started = Instant::now();
    let destination = Destination::parse(&args.destination)?;
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    let gateway = match &args.tls_dir {
        None => Gateway::new(timeout),
        Some(dir) => crate::controller::etcd::ClientTls::read_dir(dir)
            .and_then(|identity| Gateway::with_tls(timeout, &identity))
            .map_err(|e| Error::Tls(e.to_string()))?,
    };
    let etcd = Etcd {
        transport: &gateway,
        endpoints: args.endpoints.clone(),
    };
    // 1. A healthy voter.
    let listed = etcd
        .member_list()
        .await
        .map_err(|e| Error::NoVoter(e.to_string()))?;
    let voters: Vec<_> = listed
        .members
        .iter()
        .filter(|m| !m.is_learner && m.started() && !m.client_urls.is_empty())
        .collect();
    let statuses = futures_util::future::join_all(voters.iter().map(|m| async {
        let status = etcd.status(&m.client_urls[0]).await;
        (m.id, status)
    }))
    .await;
    let (endpoint, member, revision) =
        choose(&listed.members, &statuses).map_err(Error::NoVoter)?;
    let keys = etcd
        .key_count(&endpoint, revision)
        .await
        .map_err(|e| Error::Snapshot {
            member: member.clone(),
            source: Box::new(e),
        })?;
    tracing::info!(%member, %endpoint, revision, keys, "taking the snapshot");

    // 2. The snapshot, checked as it arrives.
    let at = time::OffsetDateTime::now_utc();
    let name = snapshot::name(&args.cluster, args.kind, at);
    let work = args.work_dir.join(format!("{name}.part"));
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| Error::Snapshot {
        member: member.clone(),
        source: e,
    };
    let verified = take(&gateway, &endpoint, &work)
        .await
        .map_err(|e| match e {
            Taken::Stream(source) => Error::Corrupt {
                member: member.clone(),
                source,
            },
            Taken::Other(e) => failed(e),
        })?;
    tracing::info!(%member, size = verified.size, revision = verified.revision, sha256 = %verified.sha256, "snapshot verified");

    // 3. Room for it on a volume: this cluster's oldest scheduled snapshots go first when the
    // file would not fit (never the newest one, never a final one), else the run stops at the
    // step "space" and says how much is missing.
    let uri = destination.uri(&name);
    let store = destination.open()?;
    let mut pruned = Vec::new();
    if let Destination::Folder(dir) = &destination {
        remove_stale_staging(dir, &args.cluster, STALE_STAGING);
        pruned = make_room(dir, &args.cluster, verified.size, &uri)
            .await
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&work);
            })?;
    }
    // 4. Filed, then read back.
    let result = file(&store, &destination, &name, &work, &verified, &uri).await;
    let _ = tokio::fs::remove_file(&work).await;
    result?;

    // 5. Retention.
    if args.kind == Kind::Scheduled {
        pruned.extend(prune(&store, &destination, &args.cluster, args.retention, &name).await?);
    }
    Ok(Report {
        uri,
        size: verified.size,
        sha256: verified.sha256,
        // The member's revision just before the snapshot began, which it holds at least, and
        // the one the keys were counted at (the stream's own header, which 3.6 does not send,
        // is never lower).
        revision,
        keys: Some(keys),
        member,
        time: at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        seconds: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        pruned,
    })
}

enum Taken {
    Stream(snapshot::StreamError),
    Other(Box<dyn std::error::Error + Send + Sync>),
}

async fn take(
    gateway: &Gateway,
    endpoint: &str,
    work: &std::path::Path,
) -> Result<Verified, Taken> {
    use std::io::Write;
    let other = |e: Box<dyn std::error::Error + Send + Sync>| Taken::Other(e);
    let mut body = gateway
        .stream(endpoint, "maintenance/snapshot", serde_json::json!({}))
        .await
        .map_err(|e| other(Box::new(e)))?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(work)
            .map_err(|e| other(format!("{}: {e}", work.display()).into()))?,
    );
    let mut reader = snapshot::Reader::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| other(Box::new(e)))?;
        if let Ok(data) = frame.into_data() {
            reader
                .feed(&data, &mut |b| out.write_all(b))
                .map_err(|e| match e {
                    snapshot::FeedError::Stream(s) => Taken::Stream(s),
                    snapshot::FeedError::Write(w) => {
                        other(format!("{}: {w}", work.display()).into())
                    }
                })?;
        }
    }
    out.flush()
        .and_then(|()| out.get_ref().sync_all())
        .map_err(|e| other(format!("{}: {e}", work.display()).into()))?;
    reader.finish().map_err(Taken::Stream)
}

/// The suffix of a snapshot on a folder while it is written and read back.
pub const STAGING_SUFFIX: &str = ".staging";
/// A staging file of this age is a killed run's (a run's upload and read-back take minutes):
/// removed by the next run, so that it does not fill the backup claim.
pub const STALE_STAGING: Duration = Duration::from_secs(3600);
/// Below this size a snapshot is sent in one request (a conditional create); above it, in
/// parts of this size.
const PART_SIZE: usize = 10 << 20;

/// Files the verified snapshot `work` as `name`, never over an object already there, and so
/// that the name holds only what was read back whole:
/// - on a folder, written as `NAME.staging` (object_store's own staging file below that),
///   read back, then linked to its name only if nothing is there (`rename_if_not_exists`);
/// - in a bucket (where a rename is a copy, limited to 5 GiB), refused when the name is taken,
///   sent as a conditional create (`If-None-Match: *`) in one request up to 10 MiB and in
///   parts above (an upload's parts are invisible until it completes, so a killed run leaves
///   no object), read back, and deleted when what is read back differs from what was sent.
async fn file(
    store: &Arc<dyn ObjectStore>,
    destination: &Destination,
    name: &str,
    work: &std::path::Path,
    verified: &Verified,
    uri: &str,
) -> Result<(), Error> {
    let fail = |step: &'static str, e: Box<dyn std::error::Error + Send + Sync>| Error::Store {
        step,
        uri: uri.to_owned(),
        source: e,
    };
    let taken = || {
        fail(
            "upload",
            "an object is already stored under this name; it is not overwritten (two runs of one cluster in the same second, or another writer under this cluster's names)".into(),
        )
    };
    let path = destination.path(name);
    match store.head(&path).await {
        Ok(_) => return Err(taken()),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(fail("upload", Box::new(e))),
    }
    let staging = match destination {
        Destination::Folder(_) => destination.path(&format!("{name}{STAGING_SUFFIX}")),
        Destination::S3 { .. } => path.clone(),
    };
    let sent = upload(store, &staging, work, verified.size).await;
    let sent = match sent {
        Err(object_store::Error::AlreadyExists { .. }) => return Err(taken()),
        other => other.map_err(|e| fail("upload", Box::new(e))),
    };
    let checked = match sent {
        Ok(()) => read_back(store, &staging, verified)
            .await
            .map_err(|e| fail("read back", e)),
        Err(e) => Err(e),
    };
    if let Err(e) = checked {
        // Nothing unverified stays under a snapshot's name (nor a staging file on the claim).
        if let Err(d) = store.delete(&staging).await
            && !matches!(d, object_store::Error::NotFound { .. })
        {
            tracing::warn!(object = %staging, error = %d, "could not delete what failed its read-back");
        }
        return Err(e);
    }
    if staging != path {
        let moved = store.rename_if_not_exists(&staging, &path).await;
        if let Err(e) = moved {
            let _ = store.delete(&staging).await;
            return Err(match e {
                object_store::Error::AlreadyExists { .. } => taken(),
                e => fail("upload", Box::new(e)),
            });
        }
    }
    Ok(())
}

/// Sends the file at `work` (`size` bytes) to `path`: one conditional create up to
/// [`PART_SIZE`], a multipart upload above (aborted when it fails).
async fn upload(
    store: &Arc<dyn ObjectStore>,
    path: &StorePath,
    work: &std::path::Path,
    size: u64,
) -> Result<(), object_store::Error> {
    let io = |e: std::io::Error| object_store::Error::Generic {
        store: "snapshot file",
        source: format!("{}: {e}", work.display()).into(),
    };
    if size <= PART_SIZE as u64 {
        let bytes = tokio::fs::read(work).await.map_err(io)?;
        let opts = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        return store.put_opts(path, bytes.into(), opts).await.map(|_| ());
    }
    let mut src = tokio::fs::File::open(work).await.map_err(io)?;
    let mut writer =
        object_store::buffered::BufWriter::with_capacity(store.clone(), path.clone(), PART_SIZE);
    if let Err(e) = tokio::io::copy(&mut src, &mut writer).await {
        let _ = writer.abort().await;
        return Err(io(e));
    }
    writer.shutdown().await.map_err(io)
}

/// Reads the object at `path` back and compares its size and SHA-256 with the snapshot's.
async fn read_back(
    store: &Arc<dyn ObjectStore>,
    path: &StorePath,
    verified: &Verified,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let got = store.get(path).await?;
    let mut stream = got.into_stream();
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        hash.update(&chunk);
    }
    let sha256 = snapshot::hex(hash.finish().as_ref());
    if size != verified.size || sha256 != verified.sha256 {
        return Err(format!(
            "the stored object is {size} bytes with SHA-256 {sha256}, not the {} bytes with {} that were sent",
            verified.size, verified.sha256
        )
        .into());
    }
    Ok(())
}

/// Removes `cluster`'s staging files in `dir` (a snapshot's `.staging` file and
/// object_store's `#N` files below it) older than `age`: what a killed run left on the claim.
pub fn remove_stale_staging(dir: &std::path::Path, cluster: &str, age: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !snapshot::is_staging(&name, cluster) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed >= age);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            tracing::warn!(file = %name, "removed what a killed backup run left on the volume");
        }
    }
}

/// Bytes free for an unprivileged writer on the filesystem of `dir`.
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Room for a snapshot of `size` bytes in `dir` (plus 1 MiB): the oldest scheduled snapshots of
/// `cluster` are deleted, one at a time, while it does not fit, but never the newest of them
/// (the last good one) and never a final snapshot ([`snapshot::oldest_first`]). What was
/// deleted; a [`Error::Store`] at the step `space` when even that is not enough.
pub async fn make_room(
    dir: &std::path::Path,
    cluster: &str,
    size: u64,
    uri: &str,
) -> Result<Vec<String>, Error> {
    let need = size.saturating_add(1 << 20);
    let fail = |e: std::io::Error| Error::Store {
        step: "space",
        uri: uri.to_owned(),
        source: Box::new(e),
    };
    let mut free = free_bytes(dir).map_err(fail)?;
    let mut deleted = Vec::new();
    if free >= need {
        return Ok(deleted);
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .map_err(fail)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    for name in snapshot::oldest_first(&names, cluster) {
        if free >= need {
            break;
        }
        let path = dir.join(&name);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&path).map_err(fail)?;
        tracing::warn!(snapshot = %name, bytes = len, "the backup volume is short of space: the oldest scheduled snapshot deleted first");
        deleted.push(name);
        free = free_bytes(dir).map_err(fail)?;
    }
    if free < need {
        return Err(Error::Store {
            step: "space",
            uri: uri.to_owned(),
            source: format!(
                "the backup volume is full: the snapshot needs {} MiB and {} MiB are free after deleting every scheduled snapshot but the newest; grow the claim (or keep snapshots in a bucket: spec.backup.destination)",
                need >> 20,
                free >> 20
            )
            .into(),
        });
    }
    Ok(deleted)
}

/// Deletes the scheduled snapshots of `cluster` beyond the newest `keep`.
async fn prune(
    store: &Arc<dyn ObjectStore>,
    destination: &Destination,
    cluster: &str,
    keep: u32,
    written: &str,
) -> Result<Vec<String>, Error> {
    let fail = |e: object_store::Error| Error::Store {
        step: "retention",
        uri: destination.uri(""),
        source: Box::new(e),
    };
    let prefix = match destination.prefix() {
        "" => None,
        p => Some(StorePath::from(p)),
    };
    let listed: Vec<_> = store
        .list_with_delimiter(prefix.as_ref())
        .await
        .map_err(fail)?
        .objects;
    let names: Vec<String> = listed
        .iter()
        .filter_map(|o| o.location.filename().map(str::to_owned))
        .collect();
    let gone = snapshot::expired(&names, cluster, keep as usize, written);
    for name in &gone {
        store.delete(&destination.path(name)).await.map_err(fail)?;
    }
    Ok(gone)
}

/// The `backup` subcommand: the report on stdout and in the termination message; the exit
/// code of the failed step otherwise.
pub async fn command(args: &BackupArgs) -> u8 {
    finish("backup", run(args).await, args.report.as_deref())
}

/// A subcommand's end: what it did as one JSON line on stdout, or the failed step logged; the
/// same line (at most the 4 KiB the kubelet keeps) at `report`, the termination message path;
/// the exit code.
fn finish(
    what: &str,
    outcome: Result<impl serde::Serialize, Error>,
    report: Option<&std::path::Path>,
) -> u8 {
    let (line, code) = match &outcome {
        Ok(done) => (serde_json::to_string(done).expect("a report serializes"), 0),
        Err(e) => {
            tracing::error!(step = e.step(), "{what} failed: {e}");
            (
                serde_json::json!({"failed": e.step(), "error": e.to_string()}).to_string(),
                e.exit_code(),
            )
        }
    };
    if outcome.is_ok() {
        println!("{line}");
    }
    if let Some(path) = report {
        let mut text = line;
        text.truncate(4096);
        if let Err(e) = std::fs::write(path, text) {
            tracing::warn!(path = %path.display(), "cannot write the report: {e}");
        }
    }
    code
}

/// Where a snapshot named by a URI is: its store, its path there.
pub fn locate(from: &str) -> Result<(Destination, StorePath), Error> {
    let (dir, name) = from
        .rsplit_once('/')
        .filter(|(_, name)| !name.is_empty())
        .ok_or_else(|| Error::Usage(format!("snapshot {from:?} names no file")))?;
    let destination = if dir == "s3:/" {
        return Err(Error::Usage(format!("snapshot {from:?} names no bucket")));
    } else if dir.is_empty() {
        Destination::Folder("/".into())
    } else {
        Destination::parse(dir)?
    };
    let path = destination.path(name);
    Ok((destination, path))
}

/// What `fetch-snapshot` wrote.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct Fetched {
    pub from: String,
    pub out: String,
    pub size: u64,
    pub sha256: String,
}

/// Fetches the snapshot `args.from` to `args.out`, checking it as it arrives; a snapshot that
/// fails a check leaves no file.
pub async fn fetch(args: &FetchArgs) -> Result<Fetched, Error> {
    use std::io::Write;
    if let Some(dir) = &args.clear {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {
                tracing::warn!(dir = %dir.display(), "removed what an earlier attempt of this restore left half written")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Place(format!(
                    "{}: {e} (a half-written restore of an earlier attempt)",
                    dir.display()
                )));
            }
        }
    }
    let (destination, path) = locate(&args.from)?;
    let store = destination.open()?;
    let fail = |step: &'static str, e: Box<dyn std::error::Error + Send + Sync>| Error::Store {
        step,
        uri: args.from.clone(),
        source: e,
    };
    let got = store
        .get(&path)
        .await
        .map_err(|e| fail("download", Box::new(e)))?;
    let part = args.out.with_extension("part");
    let write_err = |e: std::io::Error| fail("download", format!("{}: {e}", part.display()).into());
    let mut out = std::io::BufWriter::new(std::fs::File::create(&part).map_err(write_err)?);
    let mut reader = snapshot::Reader::default();
    let mut stream = got.into_stream();
    let result = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| fail("download", Box::new(e)))?;
            out.write_all(&chunk).map_err(write_err)?;
            reader.raw(&chunk);
        }
        out.flush()
            .and_then(|()| out.get_ref().sync_all())
            .map_err(write_err)?;
        let verified = reader.finish_file().map_err(|source| Error::Corrupt {
            member: args.from.clone(),
            source,
        })?;
        if let Some(want) = &args.sha256
            && !want.eq_ignore_ascii_case(&verified.sha256)
        {
            return Err(Error::Corrupt {
                member: args.from.clone(),
                source: snapshot::StreamError::Unexpected {
                    want: want.to_ascii_lowercase(),
                    got: verified.sha256.clone(),
                },
            });
        }
        Ok(verified)
    }
    .await;
    match result {
        Ok(verified) => {
            std::fs::rename(&part, &args.out)
                .map_err(|e| fail("download", format!("{}: {e}", args.out.display()).into()))?;
            Ok(Fetched {
                from: args.from.clone(),
                out: args.out.display().to_string(),
                size: verified.size,
                sha256: verified.sha256,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

/// What `place-restored` did.
#[derive(Debug, serde::Serialize)]
pub struct Placed {
    pub to: String,
    /// The data directory was placed by an earlier attempt of this restore (killed after).
    pub already: bool,
}

/// The file beside a placed data directory naming the restore that placed it.
pub const RESTORED_BY_FILE: &str = "restored-by";

/// Moves the data directory `args.from` (what etcdutl wrote) to `args.to`, once and never over
/// another: `args.restore_id` is written to [`RESTORED_BY_FILE`] beside `args.to` first, then the
/// directory renamed (one filesystem: atomic). A retry finds `args.to` with its own id (done
/// before it was killed: nothing to do but drop a leftover `from`); a data directory there
/// without it is not this restore's, and is never replaced.
pub fn place(args: &PlaceArgs) -> Result<Placed, Error> {
    let io = |what: &std::path::Path, e: std::io::Error| {
        Error::Place(format!("{}: {e}", what.display()))
    };
    let parent = args
        .to
        .parent()
        .ok_or_else(|| Error::Usage(format!("--to {} has no parent", args.to.display())))?;
    let marker = parent.join(RESTORED_BY_FILE);
    let to = args.to.display().to_string();
    if args.to.exists() {
        let by = std::fs::read_to_string(&marker).unwrap_or_default();
        if by.trim() != args.restore_id {
            return Err(Error::Place(format!(
                "{to} already holds a data directory this restore did not write; it is not replaced (delete the claim to restore into it)"
            )));
        }
        match std::fs::remove_dir_all(&args.from) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&args.from, e)),
        }
        return Ok(Placed { to, already: true });
    }
    if !args.from.join("member").is_dir() {
        return Err(Error::Place(format!(
            "{} holds no restored data directory (no member/ in it)",
            args.from.display()
        )));
    }
    let sync = |path: &std::path::Path| {
        std::fs::File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(|e| io(path, e))
    };
    std::fs::write(&marker, &args.restore_id).map_err(|e| io(&marker, e))?;
    sync(&marker)?;
    std::fs::rename(&args.from, &args.to).map_err(|e| io(&args.to, e))?;
    sync(parent)?;
    Ok(Placed { to, already: false })
}

/// The `place-restored` subcommand: the report on stdout and in the termination message.
pub fn place_command(args: &PlaceArgs) -> u8 {
    finish("place", place(args), args.report.as_deref())
}

/// The `fetch-snapshot` subcommand: the report on stdout and in the termination message.
pub async fn fetch_command(args: &FetchArgs) -> u8 {
    finish("fetch", fetch(args).await, args.report.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::members::Member;

    /// A snapshot on a folder: filed under its name only once read back whole, never over a
    /// file already there; one whose read-back differs leaves nothing (no staging file either);
    /// a multipart one (above 10 MiB) the same.
    #[tokio::test]
    async fn a_snapshot_is_named_only_once_verified_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let destination = Destination::Folder(dir.path().to_owned());
        let store = destination.open().unwrap();
        let work = dir.path().join("work.part");
        let listing = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "work.part")
                .collect();
            names.sort();
            names
        };
        for (name, size) in [
            ("etcd-1-snapshot-20261201T000000Z.db", 4096),
            ("etcd-1-snapshot-20261201T000100Z.db", (10 << 20) + 7),
        ] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            std::fs::write(&work, &bytes).unwrap();
            let verified = Verified {
                size: size as u64,
                sha256: snapshot::hex(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref()),
                revision: 0,
                member: 0,
            };
            // What was sent is not what the read-back sees: nothing is left.
            let mut wrong = verified.clone();
            wrong.sha256 = "0".repeat(64);
            let e = file(&store, &destination, name, &work, &wrong, "u")
                .await
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("read back u: the stored object is"), "{e}");
            assert!(
                !listing().iter().any(|n| n.starts_with(name)),
                "{:?}",
                listing()
            );
            file(&store, &destination, name, &work, &verified, "u")
                .await
                .unwrap();
            assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), bytes);
            // Another run under the same name: refused, the first kept.
            std::fs::write(&work, b"other").unwrap();
            let other = Verified {
                size: 5,
                sha256: snapshot::hex(
                    ring::digest::digest(&ring::digest::SHA256, b"other").as_ref(),
                ),
                revision: 0,
                member: 0,
            };
            let e = file(&store, &destination, name, &work, &other, "u")
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("not overwritten"), "{e}");
            assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), bytes);
        }
        assert_eq!(
            listing(),
            [
                "etcd-1-snapshot-20261201T000000Z.db",
                "etcd-1-snapshot-20261201T000100Z.db"
            ]
        );
    }

    /// What a killed run leaves on the claim (its `.staging` file, object_store's `#N` file) is
    /// removed by a later run once old; a young one (a run going on beside), another cluster's,
    /// and snapshots are not.
    #[test]
    fn a_killed_runs_staging_files_are_removed_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "etcd-1-snapshot-20261201T000000Z.db.staging",
            "etcd-1-final-20261201T000000Z.db.staging#3",
            "etcd-1-snapshot-20261201T000000Z.db#1",
            "etcd-1-snapshot-20261201T000100Z.db",
            "etcd-2-snapshot-20261201T000000Z.db.staging",
            "notes.txt",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        remove_stale_staging(dir.path(), "etcd-1", Duration::from_secs(3600));
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            6,
            "young: kept"
        );
        remove_stale_staging(dir.path(), "etcd-1", Duration::ZERO);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "etcd-1-snapshot-20261201T000100Z.db",
                "etcd-2-snapshot-20261201T000000Z.db.staging",
                "notes.txt"
            ]
        );
    }

    /// The restored data directory is moved in once whole; a retry after the move (the pod
    /// killed before it exited) finds it its own and is done; a data directory this restore
    /// did not write is never replaced; nothing to place is an error.
    #[test]
    fn restored_data_is_placed_once_and_never_over_other_data() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("data.restoring"), dir.path().join("data"));
        let args = |id: &str| PlaceArgs {
            from: from.clone(),
            to: to.clone(),
            restore_id: id.to_owned(),
            report: None,
        };
        let e = place(&args("uid-1")).unwrap_err();
        assert_eq!(e.exit_code(), 5);
        assert!(e.to_string().contains("no member/"), "{e}");
        std::fs::create_dir_all(from.join("member/snap")).unwrap();
        std::fs::write(from.join("member/snap/db"), b"db").unwrap();
        let placed = place(&args("uid-1")).unwrap();
        assert!(!placed.already);
        assert_eq!(std::fs::read(to.join("member/snap/db")).unwrap(), b"db");
        assert!(!from.exists());
        // A retry that wrote it beside again: done, the leftover dropped, the data untouched.
        std::fs::create_dir_all(from.join("member")).unwrap();
        assert!(place(&args("uid-1")).unwrap().already);
        assert!(!from.exists());
        assert_eq!(std::fs::read(to.join("member/snap/db")).unwrap(), b"db");
        // Another restore (another cluster's UID) finds data it did not write: refused.
        std::fs::create_dir_all(from.join("member")).unwrap();
        let e = place(&args("uid-2")).unwrap_err().to_string();
        assert!(e.contains("did not write; it is not replaced"), "{e}");
        assert_eq!(std::fs::read(to.join("member/snap/db")).unwrap(), b"db");
    }

    #[test]
    fn s3_credentials_say_where_they_come_from_or_that_there_are_none() {
        let env = |pairs: &[(&str, &str)]| {
            let map: std::collections::HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |k: &str| map.get(k).cloned()
        };
        assert_eq!(
            credentials(env(&[
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "b")
            ])),
            Ok("keys")
        );
        assert!(
            credentials(env(&[("AWS_ACCESS_KEY_ID", "a")]))
                .unwrap_err()
                .contains("without AWS_SECRET_ACCESS_KEY")
        );
        assert_eq!(
            credentials(env(&[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
                ("AWS_ROLE_ARN", "arn")
            ])),
            Ok("web identity")
        );
        assert_eq!(credentials(env(&[])), Ok("instance metadata"));
        let none = credentials(env(&[("AWS_EC2_METADATA_DISABLED", "true")])).unwrap_err();
        assert!(
            none.starts_with("no credentials: set AWS_ACCESS_KEY_ID"),
            "{none}"
        );
    }

    fn member(id: u64, name: &str, learner: bool) -> Member {
        Member {
            id,
            name: name.to_owned(),
            peer_urls: vec![format!("http://{name}:2380")],
            client_urls: vec![format!("http://{name}:2379")],
            is_learner: learner,
        }
    }

    fn status(leader: u64, index: u64) -> Result<MemberStatus, EtcdError> {
        Ok(MemberStatus {
            leader,
            raft_index: index,
            ..Default::default()
        })
    }

    #[test]
    fn the_snapshot_comes_from_a_healthy_follower_else_the_leader() {
        let members = [
            member(1, "etcd-0", false),
            member(2, "etcd-1", false),
            member(3, "etcd-2", false),
            member(4, "etcd-3", true),
        ];
        let down = Err(EtcdError::Unreachable {
            endpoint: "http://etcd-1:2379".to_owned(),
            reason: "connection refused".to_owned(),
        });
        let statuses = vec![(1, status(1, 90)), (2, down), (3, status(1, 80))];
        assert_eq!(choose(&members, &statuses).unwrap().1, "etcd-2");
        let only_leader = vec![(1, status(1, 90)), (3, status(0, 80))];
        assert_eq!(choose(&members, &only_leader).unwrap().1, "etcd-0");
        let none = vec![(1, status(0, 90)), (3, status(0, 80))];
        let why = choose(&members, &none).unwrap_err();
        assert!(
            why.contains("etcd-0 unhealthy") && why.contains("etcd-1: not asked"),
            "{why}"
        );
        // NOSPACE: every member serves reads, so the snapshot is taken (from a healthy one
        // first); a CORRUPT member never gives it.
        let alarmed = |leader: u64, index: u64, alarm: &str| {
            let mut s = status(leader, index).unwrap();
            s.errors = vec![format!("memberID:1 alarm:{alarm} ")];
            Ok(s)
        };
        let full = vec![
            (1, alarmed(1, 90, "NOSPACE")),
            (3, alarmed(1, 95, "NOSPACE")),
        ];
        assert_eq!(choose(&members, &full).unwrap().1, "etcd-2");
        let one_clear = vec![(1, status(1, 90)), (3, alarmed(1, 95, "NOSPACE"))];
        assert_eq!(choose(&members, &one_clear).unwrap().1, "etcd-0");
        let corrupt = vec![
            (1, alarmed(1, 90, "CORRUPT")),
            (3, alarmed(1, 95, "CORRUPT")),
        ];
        assert!(choose(&members, &corrupt).is_err());
    }

    #[test]
    fn destinations() {
        assert_eq!(
            Destination::parse("s3://b/a/b/").unwrap(),
            Destination::S3 {
                bucket: "b".to_owned(),
                prefix: "a/b".to_owned()
            }
        );
        let d = Destination::parse("s3://b").unwrap();
        assert_eq!(d.uri("x.db"), "s3://b/x.db");
        assert_eq!(
            Destination::parse("s3://b/p").unwrap().uri("x.db"),
            "s3://b/p/x.db"
        );
        assert_eq!(
            Destination::parse("/backup").unwrap().uri("x.db"),
            "/backup/x.db"
        );
        for bad in ["s3://", "gs://b", "backup"] {
            let e = Destination::parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
        }
        let (d, p) = locate("s3://b/p/q/x.db").unwrap();
        assert_eq!(d.uri("x.db"), "s3://b/p/q/x.db");
        assert_eq!(p.as_ref(), "p/q/x.db");
        let (d, p) = locate("/backup/x.db").unwrap();
        assert_eq!(
            (d, p.as_ref()),
            (Destination::Folder("/backup".into()), "x.db")
        );
        for bad in ["s3://b/", "s3:///x.db", "x.db"] {
            assert!(locate(bad).is_err(), "{bad}");
        }
    }
}
