//! What a verification Job's last container runs: `verify-snapshot`. The Job has fetched the
//! snapshot (its SHA-256 checked), restored it with etcdutl into a scratch folder and started a
//! lone etcd on it (a sidecar on the pod's loopback); this asks that etcd for the number of keys
//! and the hash of the keys at the snapshot's revision and compares them with what the backup
//! recorded on the member it was taken from. [`judge`] is the comparison, a pure function.

use std::time::Duration;

use super::error::Error;
use super::finish;
use crate::cli::VerifyArgs;
use crate::controller::decide::corruption::Hash;
use crate::controller::etcd::{Etcd, Gateway};
use crate::controller::render::{VERIFY_FAILED, VERIFY_INCONCLUSIVE, VERIFY_OK, VerifyReport};

/// What the backup recorded at `revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub revision: u64,
    pub keys: Option<u64>,
    pub hash: Hash,
}

/// What the restored etcd answered at the same revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub keys: u64,
    pub hash: Hash,
}

/// The outcome and what was compared. Hashes that count from different compactions say
/// nothing (etcd's own checks compare only those with the same compact revision).
pub fn judge(recorded: &Recorded, found: &Found) -> (&'static str, String) {
    let rev = recorded.revision;
    if recorded.hash.compact_revision != found.hash.compact_revision {
        return (
            VERIFY_INCONCLUSIVE,
            format!(
                "the hashes at revision {rev} count from different compactions (recorded from {}, restored from {}): the history was compacted between the count and the snapshot",
                recorded.hash.compact_revision, found.hash.compact_revision
            ),
        );
    }
    let mut differs = Vec::new();
    if let Some(keys) = recorded.keys
        && keys != found.keys
    {
        differs.push(format!("{} keys, the backup counted {keys}", found.keys));
    }
    if recorded.hash.hash != found.hash.hash {
        differs.push(format!(
            "hash {:x}, the member had {:x}",
            found.hash.hash, recorded.hash.hash
        ));
    }
    if differs.is_empty() {
        (
            VERIFY_OK,
            format!(
                "restored: {} keys and hash {:x} at revision {rev}, as the member had",
                found.keys, found.hash.hash
            ),
        )
    } else {
        (
            VERIFY_FAILED,
            format!(
                "restored, but at revision {rev} it has {}",
                differs.join(" and ")
            ),
        )
    }
}

/// Waits (at most `args.wait_seconds`) for the restored etcd to answer, then compares.
pub async fn verify(args: &VerifyArgs) -> Result<VerifyReport, Error> {
    let gateway = Gateway::new(Duration::from_secs(args.timeout_seconds));
    let etcd = Etcd {
        transport: &gateway,
        endpoints: vec![args.endpoint.clone()],
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_seconds);
    loop {
        match etcd.status(&args.endpoint).await {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::Sandbox(format!(
                    "did not answer within {} s: {e}",
                    args.wait_seconds
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let asked = |e: crate::controller::etcd::EtcdError| Error::Sandbox(e.to_string());
    let keys = etcd
        .key_count(&args.endpoint, args.revision)
        .await
        .map_err(asked)?;
    let hash = etcd
        .hash_kv(&args.endpoint, args.revision)
        .await
        .map_err(asked)?;
    let recorded = Recorded {
        revision: args.revision,
        keys: args.keys,
        hash: Hash {
            hash: args.hash,
            compact_revision: args.compact_revision,
        },
    };
    let found = Found { keys, hash };
    let (outcome, message) = judge(&recorded, &found);
    tracing::info!(outcome, "{message}");
    Ok(VerifyReport {
        outcome: outcome.to_owned(),
        message,
        revision: args.revision,
        keys,
        hash: hash.hash,
    })
}

/// The `verify-snapshot` subcommand: the report on stdout and in the termination message;
/// exit 0 verified, 6 failed or inconclusive, 1 when the restored etcd did not answer.
pub async fn verify_command(args: &VerifyArgs) -> u8 {
    let outcome = verify(args).await;
    let code = match &outcome {
        Ok(r) if r.outcome != VERIFY_OK => 6,
        _ => 0,
    };
    match finish("verify-snapshot", outcome, args.report.as_deref()) {
        0 => code,
        failed => failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(hash: u64, compact_revision: i64) -> Hash {
        Hash {
            hash,
            compact_revision,
        }
    }

    #[test]
    fn the_same_keys_and_hash_verify_and_any_difference_fails() {
        let recorded = Recorded {
            revision: 40,
            keys: Some(12),
            hash: hash(0xabc, 7),
        };
        let same = Found {
            keys: 12,
            hash: hash(0xabc, 7),
        };
        let (outcome, message) = judge(&recorded, &same);
        assert_eq!(outcome, VERIFY_OK, "{message}");
        assert!(
            message.contains("12 keys and hash abc at revision 40"),
            "{message}"
        );

        let fewer = Found {
            keys: 11,
            hash: hash(0xdef, 7),
        };
        let (outcome, message) = judge(&recorded, &fewer);
        assert_eq!(outcome, VERIFY_FAILED);
        assert_eq!(
            message,
            "restored, but at revision 40 it has 11 keys, the backup counted 12 and hash def, the member had abc"
        );
        // A backup that counted no keys (an older report) is judged by the hash alone.
        let unknown = Recorded {
            keys: None,
            ..recorded
        };
        assert_eq!(judge(&unknown, &Found { keys: 3, ..same }).0, VERIFY_OK);
    }

    #[test]
    fn hashes_from_different_compactions_are_inconclusive() {
        let recorded = Recorded {
            revision: 40,
            keys: Some(12),
            hash: hash(0xabc, 7),
        };
        let (outcome, message) = judge(
            &recorded,
            &Found {
                keys: 12,
                hash: hash(0x123, 30),
            },
        );
        assert_eq!(outcome, VERIFY_INCONCLUSIVE);
        assert!(
            message.contains("recorded from 7, restored from 30"),
            "{message}"
        );
    }
}
