//! The calls the passes make, over a [`Transport`]: the member list, a learner added,
//! promoted or removed, `status`, the key count at a revision, compaction, defragmentation and
//! the alarms. Reads try each endpoint in turn; a write goes to one endpoint only and is never
//! retried within a pass: an add that timed out may have committed, and the next pass decides
//! from the member list (see [`crate::controller::decide::membership`]).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::EtcdError;
use super::gateway::Transport;
use crate::controller::decide::corruption::Hash;
use crate::controller::decide::members::{Header, Member, MemberStatus, opt_i64, opt_u64};

#[derive(Deserialize)]
struct Members {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    members: Vec<Member>,
}

/// A `member list` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The endpoint that answered (writes go there).
    pub endpoint: String,
    /// The ID of the cluster that answered (0 if the answer had none).
    pub cluster_id: u64,
    pub members: Vec<Member>,
}

#[derive(Deserialize)]
struct Added {
    member: Member,
    #[serde(default)]
    members: Vec<Member>,
}

fn decode<T: serde::de::DeserializeOwned>(endpoint: &str, v: Value) -> Result<T, EtcdError> {
    serde_json::from_value(v).map_err(|e| EtcdError::Decode {
        endpoint: endpoint.to_owned(),
        reason: e.to_string(),
    })
}

/// The membership calls over a [`Transport`].
pub struct Etcd<'a> {
    pub transport: &'a dyn Transport,
    /// The members' client URLs, tried in order for reads; writes go to the first that
    /// answered the last read.
    pub endpoints: Vec<String>,
}

impl Etcd<'_> {
    /// `member list` (linearizable: a member cut off from the leader does not answer with a
    /// stale list) from the first endpoint that answers, and which one it was. All endpoints are
    /// asked at once, so a pass waits at most one call's timeout for the list.
    pub async fn member_list(&self) -> Result<Listed, EtcdError> {
        let asks = self.endpoints.iter().map(|endpoint| {
            Box::pin(async move {
                let v = self
                    .transport
                    .post(
                        endpoint,
                        "cluster/member/list",
                        json!({"linearizable": true}),
                    )
                    .await?;
                let list: Members = decode(endpoint, v)?;
                Ok::<_, EtcdError>(Listed {
                    endpoint: endpoint.clone(),
                    cluster_id: list.header.cluster_id,
                    members: list.members,
                })
            })
        });
        if self.endpoints.is_empty() {
            return Err(EtcdError::Unreachable {
                endpoint: "(none)".to_owned(),
                reason: "no endpoints".to_owned(),
            });
        }
        futures_util::future::select_ok(asks)
            .await
            .map(|(found, _)| found)
    }

    /// `member add --learner`: the new member and the member list after the add.
    pub async fn add_learner(
        &self,
        endpoint: &str,
        peer_url: &str,
    ) -> Result<(Member, Vec<Member>), EtcdError> {
        let v = self
            .transport
            .post(
                endpoint,
                "cluster/member/add",
                json!({"peerURLs": [peer_url], "isLearner": true}),
            )
            .await?;
        let added: Added = decode(endpoint, v)?;
        Ok((added.member, added.members))
    }

    /// `member promote`: the member list after it.
    pub async fn promote(&self, endpoint: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        self.change(endpoint, "cluster/member/promote", id).await
    }

    /// `member remove`: the member list after it.
    pub async fn remove(&self, endpoint: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        self.change(endpoint, "cluster/member/remove", id).await
    }

    /// A membership change of member `id`: the member list after it.
    async fn change(&self, endpoint: &str, path: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        let v = self
            .transport
            .post(endpoint, path, json!({"ID": id.to_string()}))
            .await?;
        Ok(decode::<Members>(endpoint, v)?.members)
    }

    /// How many keys the store held at `revision`, as the member `endpoint` reads it locally
    /// (serializable: no quorum needed); a snapshot taken at or after `revision` holds that
    /// revision with exactly these keys.
    pub async fn key_count(&self, endpoint: &str, revision: u64) -> Result<u64, EtcdError> {
        #[derive(Deserialize)]
        struct Counted {
            #[serde(default, deserialize_with = "opt_u64")]
            count: u64,
        }
        let v = self
            .transport
            .post(
                endpoint,
                "kv/range",
                // Every key: from "\0" with range_end "\0" (base64 "AA==").
                json!({"key": "AA==", "range_end": "AA==", "count_only": true,
                    "serializable": true, "revision": revision.to_string()}),
            )
            .await?;
        Ok(decode::<Counted>(endpoint, v)?.count)
    }

    /// Compacts the history below `revision` and waits until it is physically gone (the
    /// space is then free for a defragmentation to give back). Whether this call compacted
    /// anything: a revision compacted already is no error, and `false`.
    /// `within`: a physical compaction answers once the backend has dropped the history, which
    /// takes longer the larger the database.
    pub async fn compact(
        &self,
        endpoint: &str,
        revision: u64,
        within: Duration,
    ) -> Result<bool, EtcdError> {
        let asked = self
            .transport
            .post_within(
                endpoint,
                "kv/compaction",
                json!({"revision": revision.to_string(), "physical": true}),
                within,
            )
            .await;
        match asked {
            Err(EtcdError::Refused { message, .. })
                if message.contains("required revision has been compacted") =>
            {
                Ok(false)
            }
            other => other.map(|_| true),
        }
    }

    /// Defragments the member `endpoint` (it serves nothing until it is done: on v3.6 not even
    /// `/livez` or its status), waiting up to `within` ([`crate::api::defrag_time`]).
    pub async fn defragment(&self, endpoint: &str, within: Duration) -> Result<(), EtcdError> {
        self.transport
            .post_within(endpoint, "maintenance/defragment", json!({}), within)
            .await
            .map(|_| ())
    }

    /// The alarms raised in the cluster: (member ID, alarm name).
    pub async fn alarms(&self, endpoint: &str) -> Result<Vec<(u64, String)>, EtcdError> {
        #[derive(Deserialize)]
        struct Alarm {
            #[serde(rename = "memberID", default, deserialize_with = "opt_u64")]
            member: u64,
            #[serde(default)]
            alarm: Value,
        }
        #[derive(Deserialize)]
        struct Alarms {
            #[serde(default)]
            alarms: Vec<Alarm>,
        }
        let v = self
            .transport
            .post(endpoint, "maintenance/alarm", json!({"action": "GET"}))
            .await?;
        Ok(decode::<Alarms>(endpoint, v)?
            .alarms
            .into_iter()
            .map(|a| {
                // The gateway names the enum ("NOSPACE"); an older one may send its number.
                let name = match a.alarm {
                    Value::String(s) => s,
                    Value::Number(n) if n.as_u64() == Some(1) => "NOSPACE".to_owned(),
                    Value::Number(n) if n.as_u64() == Some(2) => "CORRUPT".to_owned(),
                    other => other.to_string(),
                };
                (a.member, name)
            })
            .collect())
    }

    /// Disarms the alarm `name` of member `member`.
    pub async fn disarm(&self, endpoint: &str, member: u64, name: &str) -> Result<(), EtcdError> {
        self.transport
            .post(
                endpoint,
                "maintenance/alarm",
                json!({"action": "DEACTIVATE", "memberID": member.to_string(), "alarm": name}),
            )
            .await
            .map(|_| ())
    }

    /// The hash of the member's keys up to `revision` (`maintenance/hashkv`), and the revision it
    /// had compacted below: two members hold the same data there when both are the same.
    pub async fn hash_kv(&self, endpoint: &str, revision: u64) -> Result<Hash, EtcdError> {
        #[derive(Deserialize)]
        struct Hashed {
            #[serde(default, deserialize_with = "opt_u64")]
            hash: u64,
            /// -1 when the member has compacted nothing.
            #[serde(default, deserialize_with = "opt_i64")]
            compact_revision: i64,
        }
        let v = self
            .transport
            .post(
                endpoint,
                "maintenance/hashkv",
                json!({"revision": revision.to_string()}),
            )
            .await?;
        let h: Hashed = decode(endpoint, v)?;
        Ok(Hash {
            hash: h.hash,
            compact_revision: h.compact_revision,
        })
    }

    /// `endpoint status` of one member.
    pub async fn status(&self, endpoint: &str) -> Result<MemberStatus, EtcdError> {
        let v = self
            .transport
            .post(endpoint, "maintenance/status", json!({}))
            .await?;
        decode(endpoint, v)
    }

    /// What a member that answers no `status` says on its metrics port (`metrics_url`), read
    /// within `within` ([`MemberStatus::from_metrics`]): `None` when it does not answer there
    /// either, or says nothing certain.
    pub async fn metrics_status(
        &self,
        metrics_url: &str,
        within: Duration,
    ) -> Option<MemberStatus> {
        let text = self.transport.metrics(metrics_url, within).await.ok()?;
        MemberStatus::from_metrics(&text)
    }

    /// [`Etcd::status`] waiting at most `within` (a member answers it from its own state, in
    /// milliseconds, leader or not).
    pub async fn status_within(
        &self,
        endpoint: &str,
        within: Duration,
    ) -> Result<MemberStatus, EtcdError> {
        let v = self
            .transport
            .post_within(endpoint, "maintenance/status", json!({}), within)
            .await?;
        decode(endpoint, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_answers_of_3_5_and_3_6_decode() {
        // As etcd 3.5.1 and 3.6.4 answer `cluster/member/list` (IDs as strings, an unstarted
        // member without name and client URLs).
        let list: Members = serde_json::from_value(json!({
            "header": {"cluster_id": "1", "member_id": "2", "raft_term": "2"},
            "members": [
                {"ID": "10276657743932975437", "name": "a-0", "peerURLs": ["http://a-0:2380"], "clientURLs": ["http://a-0:2379"]},
                {"ID": "42", "peerURLs": ["http://a-1:2380"], "isLearner": true}
            ]
        }))
        .unwrap();
        assert_eq!(list.members[0].id, 10276657743932975437);
        assert_eq!(list.header.cluster_id, 1);
        assert!(list.members[0].started() && !list.members[0].is_learner);
        assert!(!list.members[1].started() && list.members[1].is_learner);
        let status: MemberStatus = serde_json::from_value(json!({
            "header": {"cluster_id": "7", "member_id": "42"},
            "dbSize": "20480", "leader": "10276657743932975437", "raftIndex": "9"
        }))
        .unwrap();
        assert!(status.healthy());
        assert_eq!(status.raft_index, 9);
        assert_eq!((status.header.cluster_id, status.header.member_id), (7, 42));
        assert!(!MemberStatus::default().healthy());
    }
}
