//! `etcd-webhook backup`: one snapshot of a cluster, taken from a healthy voter, checked, filed
//! in a bucket or on the backup claim, read back, and the old ones pruned. It runs in the
//! backup Job's pod (the same image as the webhook) and reports what it filed as one JSON
//! line on stdout and in the container's termination message, where the loop reads it.
//!
//! Steps, each with its own exit code and named in the error:
//! 1. `member list` through the given endpoints, then `status` of every voter: the snapshot
//!    comes from a healthy voter, a follower when there is one (the leader is spared), the one
//!    with the highest raft index among those (`--kind=rescue`: the one member at the first
//!    endpoint, asked for its `status` alone, as after a lost quorum no member list answers);
//! 2. `maintenance/snapshot` from it through the v3 JSON gateway, written to the work folder
//!    while [`snapshot::Reader`] checks the hash etcd appends (what `etcdutl snapshot restore`
//!    checks) and hashes the whole file;
//! 3. the file to the destination through `object_store` (S3 or any S3-compatible store,
//!    multipart above 10 MiB; or a folder), then read back and its SHA-256 compared, never
//!    over an object already there and named only once read back (`filing::file`);
//! 4. retention: the scheduled snapshots beyond the newest `--retention` go
//!    ([`snapshot::expired`]: never the one just written, never a final snapshot).

pub mod destination;
pub mod error;
pub mod filing;
pub mod restore;
pub mod snapshot;
pub mod verify;

pub use destination::{Destination, credentials, locate};
pub use error::Error;
pub use filing::{STAGING_SUFFIX, STALE_STAGING, make_room, remove_stale_staging};
use filing::{file, prune};
pub use restore::{Fetched, Placed, RESTORED_BY_FILE, fetch, fetch_command, place, place_command};
pub use verify::{verify, verify_command};

use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use crate::cli::BackupArgs;
use crate::controller::decide::members::MemberStatus;
use crate::controller::etcd::{Etcd, EtcdError, Gateway};
pub use crate::controller::render::BackupReport as Report;
use snapshot::{Kind, Verified};

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
    // 1. A healthy voter; for a rescue, the one member named, without a member list (a
    // member without a quorum answers `status` and serves a snapshot alone).
    let (endpoint, member, revision) = match (args.kind, args.member.as_deref()) {
        (Kind::Rescue, Some(pod)) => {
            let endpoint = args.endpoints[0].clone();
            let status = etcd
                .status(&endpoint)
                .await
                .map_err(|e| Error::NoVoter(format!("{pod}: {e}")))?;
            (endpoint, pod.to_owned(), status.header.revision)
        }
        _ => healthy_voter(&etcd).await?,
    };
    let keys = etcd
        .key_count(&endpoint, revision)
        .await
        .map_err(|e| Error::Snapshot {
            member: member.clone(),
            source: Box::new(e),
        })?;
    // What a restore of it must give at `revision` (verified later in a sandbox); a member
    // that does not answer it costs the verification, not the backup.
    let hashed = match etcd.hash_kv(&endpoint, revision).await {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(%member, "no hash of the keys at revision {revision}: {e}");
            None
        }
    };
    tracing::info!(%member, %endpoint, revision, keys, hash = ?hashed, "taking the snapshot");

    // 2. The snapshot, checked as it arrives.
    let at = time::OffsetDateTime::now_utc();
    let name = match (args.kind, args.member.as_deref()) {
        (Kind::Rescue, Some(pod)) => {
            snapshot::named(&snapshot::rescue_prefix(&args.cluster, pod), at)
        }
        (kind, _) => snapshot::name(&args.cluster, kind, at),
    };
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
        hash: hashed.map(|h| h.hash),
        compact_revision: hashed.map(|h| h.compact_revision),
        member,
        time: at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        seconds: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        pruned,
    })
}

/// The healthy voter to take a snapshot from ([`choose`]): its client URL, name and revision.
async fn healthy_voter(etcd: &Etcd<'_>) -> Result<(String, String, u64), Error> {
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
    choose(&listed.members, &statuses).map_err(Error::NoVoter)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::PlaceArgs;
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
