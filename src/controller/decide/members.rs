//! etcd's answers about its members, as values: an entry of the member list and what a
//! member's `status` says. The gateway writes 64-bit numbers as JSON strings.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The gateway writes uint64 as a JSON string.
pub(crate) fn id<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| serde::de::Error::custom("not a u64")),
        other => Err(serde::de::Error::custom(format!("an ID, not {other}"))),
    }
}

/// A uint64 the gateway may leave out (a zero) or write as a string.
pub(crate) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| serde::de::Error::custom("not a u64")),
        _ => Ok(0),
    }
}

/// A signed 64-bit number the gateway may leave out (a zero) or write as a string.
pub(crate) fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| serde::de::Error::custom("not an i64")),
        _ => Ok(0),
    }
}

/// One entry of `member list`. A member that was added but has never started has no name.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Member {
    #[serde(rename = "ID", deserialize_with = "id")]
    pub id: u64,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl Member {
    /// Whether the member has ever started (etcd learns its name when it first runs).
    pub fn started(&self) -> bool {
        !self.name.is_empty()
    }
}

/// What `status` says about the member that answers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct MemberStatus {
    /// 0 while the member knows no leader.
    #[serde(default, deserialize_with = "id")]
    pub leader: u64,
    /// The raft log index the member has: a learner far below its leader's has not caught up.
    #[serde(rename = "raftIndex", default, deserialize_with = "opt_u64")]
    pub raft_index: u64,
    /// The raft index the member has applied to its data (what it would keep as a survivor).
    #[serde(rename = "raftAppliedIndex", default, deserialize_with = "opt_u64")]
    pub raft_applied_index: u64,
    #[serde(default)]
    pub errors: Vec<String>,
    /// Whether the member is a learner (it holds data it was sent, but never voted for it).
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
    /// Who answered: the member ID and cluster ID the answering process runs as (from its
    /// data directory).
    #[serde(default)]
    pub header: Header,
    /// The backend's size on disk, and the part of it in use (the rest a defragmentation
    /// gives back).
    #[serde(rename = "dbSize", default, deserialize_with = "opt_u64")]
    pub db_size: u64,
    #[serde(rename = "dbSizeInUse", default, deserialize_with = "opt_u64")]
    pub db_size_in_use: u64,
    /// The etcd release the member runs.
    #[serde(default)]
    pub version: String,
}

impl MemberStatus {
    pub fn healthy(&self) -> bool {
        self.leader != 0 && self.errors.is_empty()
    }

    /// Has a leader, and every error it reports is the NOSPACE alarm (`memberID:..
    /// alarm:NOSPACE`): it serves reads, and the maintenance calls that clear the alarm. A
    /// CORRUPT alarm (its data disagrees with the others') or any other error is not serving.
    pub fn serving(&self) -> bool {
        self.leader != 0 && self.errors.iter().all(|e| e.contains("alarm:NOSPACE"))
    }

    /// Whether it reports the alarm `name` (e.g. `NOSPACE`).
    pub fn alarm(&self, name: &str) -> bool {
        self.errors
            .iter()
            .any(|e| e.contains(&format!("alarm:{name}")))
    }
}

/// The response header every answer carries: which cluster, and which member, answered.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Header {
    #[serde(default, deserialize_with = "opt_u64")]
    pub cluster_id: u64,
    #[serde(default, deserialize_with = "opt_u64")]
    pub member_id: u64,
    /// The store revision of the member that answered.
    #[serde(default, deserialize_with = "opt_u64")]
    pub revision: u64,
}
