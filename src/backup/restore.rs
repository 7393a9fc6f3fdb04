//! What a restore Job runs: `fetch-snapshot` (the snapshot from its URI, its SHA-256 checked
//! against the one given) and `place-restored` (the data etcdutl wrote, moved into the member's
//! data directory once whole, never over data this restore did not write).

use futures_util::StreamExt;
use object_store::ObjectStoreExt;

use super::destination::locate;
use super::error::Error;
use super::finish;
use super::snapshot;
use crate::cli::{FetchArgs, PlaceArgs};

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
