//! The pure half of a backup: reading etcd's snapshot stream as the v3 JSON gateway sends it,
//! checking the snapshot's own integrity hash, naming snapshots, and which old ones retention
//! deletes. No I/O.

use base64::Engine as _;
use ring::digest::{Context, SHA256};
use serde::Deserialize;

/// The length of the SHA-256 etcd appends to a snapshot (the hash of the database before it).
pub const HASH_LEN: usize = 32;

/// What is wrong with a snapshot stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("etcd ended the snapshot with an error: {0}")]
    Etcd(String),
    #[error("a snapshot message that is not what the gateway sends: {0}")]
    Decode(String),
    #[error("the snapshot stream ended before etcd said it was complete ({0} bytes received)")]
    Truncated(u64),
    #[error(
        "the snapshot is corrupt: the SHA-256 etcd appended ({appended}) is not the hash of the {size} bytes before it ({computed})"
    )]
    HashMismatch {
        size: u64,
        appended: String,
        computed: String,
    },
    #[error("the snapshot's SHA-256 is {got}, not the {want} asked for")]
    Unexpected { want: String, got: String },
    #[error(
        "the snapshot has no integrity hash ({0} bytes: a database and its 32-byte hash are a multiple of 512 bytes plus 32)"
    )]
    NoHash(u64),
}

/// One message of `POST /v3/maintenance/snapshot` (`{"result": {...}}` per line).
#[derive(Debug, Deserialize)]
struct Line {
    result: Option<Chunk>,
    error: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, Default)]
struct Chunk {
    #[serde(default)]
    header: Option<Header>,
    #[serde(default, deserialize_with = "u64_string")]
    remaining_bytes: u64,
    #[serde(default)]
    blob: String,
}

#[derive(Debug, Deserialize, Default)]
struct Header {
    #[serde(default, deserialize_with = "u64_string")]
    revision: u64,
    #[serde(default, deserialize_with = "u64_string")]
    member_id: u64,
}

fn u64_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| serde::de::Error::custom("not a u64")),
        _ => Ok(0),
    }
}

/// Reads the gateway's newline-delimited messages as bytes arrive, and checks the snapshot as
/// it goes: its size, the SHA-256 of the whole file (what the object store holds), and etcd's
/// own hash of the database (the last 32 bytes), without holding the snapshot in memory.
pub struct Reader {
    line: Vec<u8>,
    whole: Context,
    database: Context,
    /// The bytes not yet known to be part of the database (the last up to 32).
    tail: Vec<u8>,
    size: u64,
    revision: u64,
    member: u64,
    done: bool,
}

/// A checked snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Bytes in the file (database and hash).
    pub size: u64,
    /// SHA-256 of the whole file, hex.
    pub sha256: String,
    /// The store revision the snapshot was taken at.
    pub revision: u64,
    /// The member that sent it.
    pub member: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            line: Vec::new(),
            whole: Context::new(&SHA256),
            database: Context::new(&SHA256),
            tail: Vec::new(),
            size: 0,
            revision: 0,
            member: 0,
            done: false,
        }
    }
}

impl Reader {
    /// Feeds bytes of the answer; `write` gets the snapshot's bytes in order.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        write: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), FeedError> {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&bytes[..end]);
            bytes = &bytes[end + 1..];
            let line = std::mem::take(&mut self.line);
            self.message(&line, write)?;
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn message(
        &mut self,
        line: &[u8],
        write: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), FeedError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let message: Line = serde_json::from_slice(line)
            .map_err(|e| StreamError::Decode(format!("{e}: {}", preview(line))))?;
        if let Some(error) = message.error {
            let text = error
                .get("message")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| error.to_string(), str::to_owned);
            return Err(StreamError::Etcd(text).into());
        }
        let chunk = message
            .result
            .ok_or_else(|| StreamError::Decode(format!("no result: {}", preview(line))))?;
        if let Some(h) = &chunk.header
            && self.revision == 0
        {
            self.revision = h.revision;
            self.member = h.member_id;
        }
        let blob = base64::engine::general_purpose::STANDARD
            .decode(chunk.blob.as_bytes())
            .map_err(|e| StreamError::Decode(format!("blob: {e}")))?;
        write(&blob).map_err(FeedError::Write)?;
        self.bytes(&blob);
        if chunk.remaining_bytes == 0 {
            self.done = true;
        }
        Ok(())
    }

    /// Feeds bytes of a snapshot file (not the gateway's messages).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.bytes(bytes);
    }

    /// The file ended: complete and its hash holds, or why not.
    pub fn finish_file(mut self) -> Result<Verified, StreamError> {
        self.done = true;
        self.finish()
    }

    fn bytes(&mut self, blob: &[u8]) {
        self.size += blob.len() as u64;
        self.whole.update(blob);
        self.tail.extend_from_slice(blob);
        if self.tail.len() > HASH_LEN {
            let n = self.tail.len() - HASH_LEN;
            self.database.update(&self.tail[..n]);
            self.tail.drain(..n);
        }
    }

    /// The stream ended: the snapshot is complete and its hash holds, or why not.
    pub fn finish(self) -> Result<Verified, StreamError> {
        // A message cut in half, or no message that said the end had come.
        if !self.done || !self.line.iter().all(u8::is_ascii_whitespace) {
            return Err(StreamError::Truncated(self.size));
        }
        if self.size % 512 != HASH_LEN as u64 || self.tail.len() != HASH_LEN {
            return Err(StreamError::NoHash(self.size));
        }
        let computed = self.database.finish();
        if computed.as_ref() != self.tail.as_slice() {
            return Err(StreamError::HashMismatch {
                size: self.size - HASH_LEN as u64,
                appended: hex(&self.tail),
                computed: hex(computed.as_ref()),
            });
        }
        Ok(Verified {
            size: self.size,
            sha256: hex(self.whole.finish().as_ref()),
            revision: self.revision,
            member: self.member,
        })
    }
}

/// Why feeding the reader stopped: the stream, or writing the bytes out.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("writing the snapshot: {0}")]
    Write(std::io::Error),
}

/// Checks a snapshot file's integrity hash (what `etcdutl snapshot restore` checks): the
/// SHA-256 of the whole file, or why it does not hold.
pub fn check(file: &[u8]) -> Result<Verified, StreamError> {
    let mut r = Reader::default();
    r.raw(file);
    r.finish_file()
}

fn preview(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
    if line.len() > 200 {
        format!("{text}…")
    } else {
        text
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub use crate::cli::SnapshotKind as Kind;

impl Kind {
    /// The name part before the time: `NAME-snapshot-`, `NAME-final-` or `NAME-rescue-` (a
    /// rescue's name goes on with the member's pod name: [`rescue_prefix`]).
    pub fn prefix(self, cluster: &str) -> String {
        match self {
            Kind::Scheduled => format!("{cluster}-snapshot-"),
            Kind::Final => format!("{cluster}-final-"),
            Kind::Rescue => format!("{cluster}-rescue-"),
        }
    }
}

/// The name part before the time of the rescue of `member`'s data: `NAME-rescue-MEMBER-`.
pub fn rescue_prefix(cluster: &str, member: &str) -> String {
    format!("{}{member}-", Kind::Rescue.prefix(cluster))
}

/// The file name of a snapshot of `cluster` taken at `at` (UTC, to the second; names sort by
/// time): `NAME-snapshot-20261201T235959Z.db`.
pub fn name(cluster: &str, kind: Kind, at: time::OffsetDateTime) -> String {
    named(&kind.prefix(cluster), at)
}

/// The file name of a snapshot whose name starts with `prefix`, taken at `at`.
pub fn named(prefix: &str, at: time::OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{}{:04}{:02}{:02}T{:02}{:02}{:02}Z.db",
        prefix,
        at.year(),
        at.month() as u8,
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// The scheduled snapshots of `cluster` retention deletes: all but the newest `keep` of the
/// names that are scheduled snapshots of this cluster (`NAME-snapshot-<time>.db`). It never
/// names the snapshot just `written`, a final snapshot, another cluster's, or anything else;
/// with `keep` below 1 it keeps 1.
pub fn expired(names: &[String], cluster: &str, keep: usize, written: &str) -> Vec<String> {
    let prefix = Kind::Scheduled.prefix(cluster);
    let mut ours: Vec<&String> = names
        .iter()
        .filter(|n| {
            n.strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".db"))
                .is_some_and(|t| t.len() == 16 && t.ends_with('Z') && t.as_bytes()[8] == b'T')
        })
        .collect();
    ours.sort_unstable_by(|a, b| b.cmp(a));
    ours.dedup();
    ours.into_iter()
        .skip(keep.max(1))
        .filter(|n| n.as_str() != written)
        .cloned()
        .collect()
}

/// Whether `name` is a file a run of `cluster` writes before it names a snapshot: the
/// snapshot's name with `.staging`, or `#N` (object_store's own staging) after either.
pub fn is_staging(name: &str, cluster: &str) -> bool {
    let ours = [Kind::Scheduled, Kind::Final, Kind::Rescue]
        .iter()
        .any(|k| name.starts_with(&k.prefix(cluster)));
    let stem = name.split_once('#').map_or(name, |(stem, _)| stem);
    ours && (stem.ends_with(".db.staging") || (stem != name && stem.ends_with(".db")))
}

/// This cluster's scheduled snapshots among `names` that may go to make room, oldest first:
/// every one but the newest (the last good snapshot is always kept); never a final snapshot,
/// another cluster's, or anything else.
pub fn oldest_first(names: &[String], cluster: &str) -> Vec<String> {
    // What a retention of 1 would delete (newest first), in the other order.
    let mut gone = expired(names, cluster, 1, "");
    gone.reverse();
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database of `pages` 512-byte pages and its appended hash, as etcd sends it.
    fn snapshot(pages: usize) -> Vec<u8> {
        let db: Vec<u8> = (0..pages * 512).map(|i| (i * 7 % 251) as u8).collect();
        let hash = ring::digest::digest(&SHA256, &db);
        [db.as_slice(), hash.as_ref()].concat()
    }

    /// The gateway's lines for `file`, in chunks of `chunk` bytes.
    fn lines(file: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut sent = 0;
        for (i, part) in file.chunks(chunk).enumerate() {
            sent += part.len();
            let header = if i == 0 {
                r#""header":{"cluster_id":"1","member_id":"42","revision":"1234","raft_term":"2"},"#
            } else {
                ""
            };
            out.extend_from_slice(
                format!(
                    "{{\"result\":{{{header}\"remaining_bytes\":\"{}\",\"blob\":\"{}\"}}}}\n",
                    file.len() - sent,
                    base64::engine::general_purpose::STANDARD.encode(part)
                )
                .as_bytes(),
            );
        }
        out
    }

    fn read(stream: &[u8], split: usize) -> (Result<Verified, String>, Vec<u8>) {
        let mut r = Reader::default();
        let mut file = Vec::new();
        let mut write = |b: &[u8]| {
            file.extend_from_slice(b);
            Ok(())
        };
        for piece in stream.chunks(split) {
            if let Err(e) = r.feed(piece, &mut write) {
                return (Err(e.to_string()), file);
            }
        }
        (r.finish().map_err(|e| e.to_string()), file)
    }

    #[test]
    fn a_snapshot_read_in_any_pieces_is_the_file_with_its_hash_checked() {
        let file = snapshot(40);
        let stream = lines(&file, 4096);
        for split in [1, 7, 1000, stream.len()] {
            let (verified, written) = read(&stream, split);
            let verified = verified.unwrap();
            assert_eq!(written, file, "split {split}");
            assert_eq!(verified.size, file.len() as u64);
            assert_eq!(verified.revision, 1234);
            assert_eq!(verified.member, 42);
            assert_eq!(
                verified.sha256,
                hex(ring::digest::digest(&SHA256, &file).as_ref())
            );
        }
        assert_eq!(
            check(&file).unwrap().sha256,
            read(&stream, 99).0.unwrap().sha256
        );
    }

    #[test]
    fn a_flipped_byte_a_cut_stream_and_an_etcd_error_are_refused() {
        let mut file = snapshot(8);
        file[100] ^= 1;
        let err = read(&lines(&file, 1024), 512).0.unwrap_err();
        assert!(err.contains("is corrupt"), "{err}");
        assert!(check(&file).is_err());

        let file = snapshot(8);
        let stream = lines(&file, 1024);
        let cut = stream.len() / 2;
        let err = read(&stream[..cut], 512).0.unwrap_err();
        assert!(
            err.contains("ended before etcd said it was complete"),
            "{err}"
        );

        let mut stream = lines(&file, 1024)[..].to_vec();
        stream.truncate(stream.len() / 2);
        let at = stream.iter().rposition(|&b| b == b'\n').unwrap() + 1;
        stream.truncate(at);
        stream.extend_from_slice(
            br#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: server stopped","http_status":"Service Unavailable"}}"#,
        );
        stream.push(b'\n');
        let err = read(&stream, 4096).0.unwrap_err();
        assert!(err.contains("etcdserver: server stopped"), "{err}");

        let err = check(&file[..file.len() - 1]).unwrap_err().to_string();
        assert!(err.contains("no integrity hash"), "{err}");
        let err = read(b"not json\n", 10).0.unwrap_err();
        assert!(err.contains("not what the gateway sends"), "{err}");
    }

    #[test]
    fn names_sort_by_time() {
        let at = time::OffsetDateTime::from_unix_timestamp(1_796_169_598).unwrap();
        assert_eq!(
            name("etcd", Kind::Scheduled, at),
            "etcd-snapshot-20261201T235958Z.db"
        );
        assert_eq!(
            name("etcd", Kind::Final, at),
            "etcd-final-20261201T235958Z.db"
        );
        let later = name("etcd", Kind::Scheduled, at + time::Duration::seconds(3));
        assert!(later > name("etcd", Kind::Scheduled, at));
    }

    #[test]
    fn retention_keeps_the_newest_and_never_a_final_another_clusters_or_the_one_written() {
        let names: Vec<String> = [
            "etcd-snapshot-20261201T000000Z.db",
            "etcd-snapshot-20261203T000000Z.db",
            "etcd-snapshot-20261202T000000Z.db",
            "etcd-final-20261130T000000Z.db",
            "etcd-2-snapshot-20261101T000000Z.db",
            "etcd-snapshot-notes.txt",
            "etcd-snapshot-20261204T000000Z.db",
        ]
        .map(str::to_owned)
        .to_vec();
        let written = "etcd-snapshot-20261204T000000Z.db";
        assert_eq!(
            expired(&names, "etcd", 2, written),
            [
                "etcd-snapshot-20261202T000000Z.db",
                "etcd-snapshot-20261201T000000Z.db"
            ]
        );
        assert_eq!(expired(&names, "etcd", 0, written).len(), 3, "keeps one");
        assert!(expired(&names, "etcd", 10, written).is_empty());
        // A clock set back: the snapshot just written sorts below older ones; still kept.
        let back = "etcd-snapshot-20261101T000000Z.db".to_owned();
        let mut with_back = names.clone();
        with_back.push(back.clone());
        let gone = expired(&with_back, "etcd", 1, &back);
        assert!(!gone.contains(&back), "{gone:?}");
        assert!(gone.iter().all(|n| n.starts_with("etcd-snapshot-2026")));
    }
}
