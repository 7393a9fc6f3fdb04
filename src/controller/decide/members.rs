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
    /// Read from its metrics port ([`MemberStatus::from_metrics`]): it runs but serves no
    /// client, having restarted while no leader was there.
    #[serde(skip)]
    pub metrics_only: bool,
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

    /// What a member's metrics port says while its client port serves nothing. etcd serves
    /// clients only once it has published itself through a leader, so a member that restarted
    /// while the quorum was lost never answers `status`; its metrics listener
    /// (`--listen-metrics-urls`) waits for no leader (it serves once the backend and the WAL
    /// are open). Its gauges say who it is
    /// (`etcd_server_id`), whether it is a learner, its release, how far it got
    /// (`etcd_server_proposals_applied_total`, a gauge despite its name: the raft applied index,
    /// set as entries apply, its own log's committed entries replayed at start) and the store's
    /// revision (`etcd_debugging_mvcc_current_revision`). `None` unless it says it knows no
    /// leader and has applied something: before its log is replayed the gauge reads 0, which
    /// says nothing (never "empty").
    pub fn from_metrics(text: &str) -> Option<MemberStatus> {
        // `name{labels} value` (etcd writes no timestamps; Go writes large values as 1.2e+06).
        let sample = |name: &str| {
            text.lines().find_map(|line| {
                let (series, value) = line.trim().rsplit_once(' ')?;
                let (series_name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, l.strip_suffix('}')?),
                    None => (series, ""),
                };
                (series_name == name).then(|| (labels, value.parse::<f64>().ok()))
            })
        };
        let gauge = |name: &str| sample(name).and_then(|(_, v)| v);
        let label = |name: &str, key: &str| {
            let (labels, _) = sample(name)?;
            let value = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
            Some(value.trim_matches('"').to_owned())
        };
        let whole = |v: f64| (v >= 0.0 && v.fract() == 0.0).then_some(v as u64);
        if gauge("etcd_server_has_leader")? != 0.0 {
            return None;
        }
        let applied = gauge("etcd_server_proposals_applied_total").and_then(whole)?;
        let member_id = u64::from_str_radix(&label("etcd_server_id", "server_id")?, 16).ok()?;
        if applied == 0 {
            return None;
        }
        let version = label("etcd_server_version", "server_version").unwrap_or_default();
        Some(MemberStatus {
            raft_index: applied,
            raft_applied_index: applied,
            // Before 3.6 the gauge is set only when a membership change is applied, so a
            // learner restarted with its addition inside its snapshot reads 0: there a reading
            // counts as a learner (never the member a recovery keeps).
            is_learner: gauge("etcd_server_is_learner") == Some(1.0)
                || !MemberStatus::says_if_learner(&version),
            header: Header {
                member_id,
                revision: gauge("etcd_debugging_mvcc_current_revision").and_then(whole)?,
                ..Header::default()
            },
            version,
            metrics_only: true,
            ..MemberStatus::default()
        })
    }

    /// Whether `etcd_server_is_learner` is right after a restart on this release (from 3.6 it
    /// is set from the stored membership at start; before, only when a membership change is
    /// applied). An unknown release is not trusted.
    pub fn says_if_learner(version: &str) -> bool {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        matches!(
            (parts.next().flatten(), parts.next().flatten()),
            (Some(major), Some(minor)) if (major, minor) >= (3, 6)
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// As etcd v3.6.17's metrics port answered, restarted alone after its two peers stopped
    /// (its client port timed out; the status before the stop said applied index 15, revision
    /// 8), with the help and type lines and other series between.
    const RESTARTED: &str = r#"# HELP etcd_debugging_mvcc_current_revision The current revision of store.
# TYPE etcd_debugging_mvcc_current_revision gauge
etcd_debugging_mvcc_current_revision 8
etcd_server_has_leader 0
etcd_server_heartbeat_send_failures_total 0
# HELP etcd_server_id Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.
etcd_server_id{server_id="a87a472412f1f7e6"} 1
etcd_server_is_leader 0
etcd_server_is_learner 0
etcd_server_proposals_applied_total 15
etcd_server_proposals_committed_total 0
etcd_server_version{server_version="3.6.17"} 1
"#;

    #[test]
    fn a_member_that_serves_no_client_is_read_from_its_metrics() {
        let s = MemberStatus::from_metrics(RESTARTED).expect("read");
        assert_eq!(s.raft_applied_index, 15);
        assert_eq!(s.header.revision, 8);
        assert_eq!(s.header.member_id, 0xa87a472412f1f7e6);
        assert_eq!(s.version, "3.6.17");
        assert_eq!((s.leader, s.is_learner, s.metrics_only), (0, false, true));
        // Go writes large values in exponent form.
        let big = RESTARTED.replace("applied_total 15", "applied_total 1.234567e+06");
        assert_eq!(
            MemberStatus::from_metrics(&big).unwrap().raft_applied_index,
            1_234_567
        );
        let learner = RESTARTED.replace("is_learner 0", "is_learner 1");
        assert!(MemberStatus::from_metrics(&learner).unwrap().is_learner);
        // etcd 3.5 sets the learner gauge only when a membership change is applied: a reading
        // there counts as a learner, whatever it says (also with no release said).
        for text in [
            RESTARTED.replace("3.6.17", "3.5.36"),
            RESTARTED.replace(r#"etcd_server_version{server_version="3.6.17"} 1"#, ""),
        ] {
            assert!(
                MemberStatus::from_metrics(&text).unwrap().is_learner,
                "{text}"
            );
        }
        assert!(
            !MemberStatus::from_metrics(&RESTARTED.replace("3.6.17", "3.7.4"))
                .unwrap()
                .is_learner
        );
    }

    #[test]
    fn metrics_that_say_nothing_certain_are_no_reading() {
        for (what, text) in [
            (
                "it knows a leader",
                RESTARTED.replace("has_leader 0", "has_leader 1"),
            ),
            (
                "its log not replayed yet",
                RESTARTED.replace("applied_total 15", "applied_total 0"),
            ),
            (
                "no ID",
                RESTARTED.replace(r#"etcd_server_id{server_id="a87a472412f1f7e6"} 1"#, ""),
            ),
            (
                "no revision",
                RESTARTED.replace("etcd_debugging_mvcc_current_revision 8", ""),
            ),
            ("not etcd", "go_goroutines 12\n".to_owned()),
            ("garbage", "{{{ 1 2 3".to_owned()),
        ] {
            assert_eq!(MemberStatus::from_metrics(&text), None, "{what}");
        }
    }
}
