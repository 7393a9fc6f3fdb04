//! A verified snapshot filed: never over an object already there, named only once read back,
//! the staging files of killed runs removed, room made on a full claim, and retention.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use super::destination::Destination;
use super::error::Error;
use super::snapshot::{self, Verified};

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
pub(crate) async fn file(
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
pub(crate) async fn upload(
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
pub(crate) async fn read_back(
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
pub(crate) async fn prune(
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
