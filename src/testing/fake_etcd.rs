//! An in-memory etcd membership behind the loop's [`Transport`]: `member list`, `add`
//! (learners), `promote`, `remove` and `status`, with etcd's own answers, and its refusals
//! (v3.5/v3.6 `server.go` with `--strict-reconfig-check`, on by default): an add while a voter
//! is not connected ("unhealthy cluster"), a second learner ("too many learner members"), a
//! promote of a learner behind its leader ("in sync with leader") or one that would leave too
//! few started voters. Pods "start" when the test says so. For the upkeep: each member's
//! database size and the part in use, the cluster's alarms (every member's `status` lists
//! them, as etcd's does), a physical compaction that gives back what the test said was history,
//! a defragmentation that gives back what is free (held until the test lets it go, with
//! [`FakeEtcd::hold_defragmentations`]), and the alarm list and disarm. The real thing is in
//! tests/members.rs; this one lets the reconcile tests run without network namespaces.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::host_name;
use crate::controller::etcd::{EtcdError, Transport};

#[derive(Default)]
struct State {
    /// (ID, name, peer URL, learner, caught up)
    members: Vec<(u64, String, String, bool, bool)>,
    next: u64,
    down: bool,
    /// The ID of the cluster every answer's header names (0: the default, `0x5eed`).
    cluster_id: u64,
    /// Pods whose member does not answer `status` (down, or cut off).
    unhealthy: std::collections::BTreeSet<String>,
    /// Every refusal answered, in order.
    refusals: Vec<String>,
    /// The leader's member ID every `status` names (0: the default, the first member, 4097).
    leader: u64,
    /// Per pod: (dbSize, dbSizeInUse, in use once compacted); a pod not here answers 20480 for
    /// both.
    db: BTreeMap<String, (u64, u64, u64)>,
    /// The alarms raised: (member ID, name).
    alarms: Vec<(u64, String)>,
    /// The store's revision, and the revision compacted below.
    revision: u64,
    compacted: u64,
    /// The pods defragmented, in order, and those whose defragmentation started.
    defragmented: Vec<String>,
    defragmenting: Vec<String>,
    /// While set, a defragmentation waits for a permit of this semaphore before it answers.
    hold: Option<Arc<tokio::sync::Semaphore>>,
    /// Per pod: the hash of its keys (`maintenance/hashkv`) when not the common one.
    hashes: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct FakeEtcd {
    state: Mutex<State>,
}

impl FakeEtcd {
    /// A cluster whose members `peer_urls` all run as voters.
    pub fn running(peer_urls: &[String]) -> Self {
        let fake = Self::default();
        {
            let mut s = fake.state.lock().unwrap();
            for url in peer_urls {
                s.next += 1;
                let id = 0x1000 + s.next;
                s.members
                    .push((id, host_name(url).to_owned(), url.clone(), false, true));
            }
        }
        fake
    }

    /// The pod of the member with this peer URL's host starts: the member gets its name, and
    /// has caught up once `caught_up`.
    pub fn start(&self, pod: &str, caught_up: bool) {
        let mut s = self.state.lock().unwrap();
        for m in s.members.iter_mut().filter(|m| host_name(&m.2) == pod) {
            m.1 = pod.to_owned();
            m.4 = caught_up;
        }
    }

    /// No member answers (all down, or not formed).
    pub fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    /// The member of pod `pod` stops answering `status` (`false`: answers again).
    pub fn set_unhealthy(&self, pod: &str, unhealthy: bool) {
        let mut s = self.state.lock().unwrap();
        if unhealthy {
            s.unhealthy.insert(pod.to_owned());
        } else {
            s.unhealthy.remove(pod);
        }
    }

    /// `etcdctl member remove` by hand: the member of pod `pod` leaves the list (its pod and
    /// volume stay, as they do in a cluster).
    pub fn remove_by_hand(&self, pod: &str) {
        self.state
            .lock()
            .unwrap()
            .members
            .retain(|m| host_name(&m.2) != pod);
    }

    /// The quorum lost: no leader (`status` says 0) and no (linearizable) member list.
    pub fn lose_quorum(&self) {
        self.state.lock().unwrap().leader = u64::MAX;
    }

    /// An election: the member of pod `pod` leads from now on.
    pub fn set_leader(&self, pod: &str) {
        let mut s = self.state.lock().unwrap();
        let id = s.members.iter().find(|m| m.1 == pod).expect("a member").0;
        s.leader = id;
    }

    /// The cluster ID the answers carry (another cluster's volumes answering).
    pub fn set_cluster_id(&self, id: u64) {
        self.state.lock().unwrap().cluster_id = id;
    }

    /// The database of pod `pod`'s member: `size` on disk, `in_use` of it, and what is in use
    /// once the history is compacted (`live`).
    pub fn set_db(&self, pod: &str, size: u64, in_use: u64, live: u64) {
        self.state
            .lock()
            .unwrap()
            .db
            .insert(pod.to_owned(), (size, in_use, live));
    }

    /// `(dbSize, dbSizeInUse)` of pod `pod`'s member.
    pub fn db(&self, pod: &str) -> (u64, u64) {
        let s = self.state.lock().unwrap();
        s.db.get(pod)
            .map_or((20480, 20480), |&(size, in_use, _)| (size, in_use))
    }

    /// etcd raises the alarm `name` (`NOSPACE`, `CORRUPT`) for pod `pod`'s member.
    pub fn raise_alarm(&self, pod: &str, name: &str) {
        let mut s = self.state.lock().unwrap();
        let id = s.members.iter().find(|m| m.1 == pod).expect("a member").0;
        s.alarms.push((id, name.to_owned()));
        s.revision = s.revision.max(1000);
    }

    /// The alarms raised: (pod, name).
    pub fn alarms(&self) -> Vec<(String, String)> {
        let s = self.state.lock().unwrap();
        s.alarms
            .iter()
            .map(|(id, name)| {
                let pod = s.members.iter().find(|m| m.0 == *id).map(|m| m.1.clone());
                (pod.unwrap_or_default(), name.clone())
            })
            .collect()
    }

    /// The hash of pod `pod`'s member's keys from now on (`maintenance/hashkv`; 0xe7cd
    /// otherwise, the same for every member).
    pub fn set_hash(&self, pod: &str, hash: u64) {
        self.state
            .lock()
            .unwrap()
            .hashes
            .insert(pod.to_owned(), hash);
    }

    /// The pods defragmented so far, in order.
    pub fn defragmented(&self) -> Vec<String> {
        self.state.lock().unwrap().defragmented.clone()
    }

    /// The pods whose defragmentation started (answered or not), in order.
    pub fn defragmenting(&self) -> Vec<String> {
        self.state.lock().unwrap().defragmenting.clone()
    }

    /// From now on a defragmentation answers only once the returned semaphore gets a permit
    /// (one per defragmentation).
    pub fn hold_defragmentations(&self) -> Arc<tokio::sync::Semaphore> {
        let hold = Arc::new(tokio::sync::Semaphore::new(0));
        self.state.lock().unwrap().hold = Some(hold.clone());
        hold
    }

    /// Every refusal etcd answered the loop, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.state.lock().unwrap().refusals.clone()
    }

    /// (name or "", learner) per member, in order.
    pub fn members(&self) -> Vec<(String, bool)> {
        let s = self.state.lock().unwrap();
        s.members.iter().map(|m| (m.1.clone(), m.3)).collect()
    }

    fn list(s: &State) -> Value {
        let members: Vec<Value> = s
            .members
            .iter()
            .map(|(id, name, peer, learner, _)| {
                let mut m = json!({"ID": id.to_string(), "peerURLs": [peer], "isLearner": learner});
                if !name.is_empty() {
                    m["name"] = json!(name);
                }
                m
            })
            .collect();
        let cluster = if s.cluster_id == 0 {
            0x5eed
        } else {
            s.cluster_id
        };
        json!({"header": {"cluster_id": cluster.to_string()}, "members": members})
    }

    fn answer(&self, endpoint: &str, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let mut s = self.state.lock().unwrap();
        let out = Self::answer_in(&mut s, endpoint, path, body);
        if let Err(EtcdError::Refused { message, .. }) = &out {
            s.refusals.push(message.clone());
        }
        out
    }

    /// A voter etcd's leader is connected to: started and answering.
    fn connected(s: &State, m: &(u64, String, String, bool, bool)) -> bool {
        !m.1.is_empty() && !s.unhealthy.contains(&m.1)
    }

    /// The member that answers at `endpoint` (started, not cut off).
    fn answering(
        s: &State,
        endpoint: &str,
    ) -> Result<(u64, String, String, bool, bool), EtcdError> {
        let pod = host_name(endpoint);
        s.members
            .iter()
            .find(|m| m.1 == pod && !s.unhealthy.contains(pod))
            .cloned()
            .ok_or_else(|| EtcdError::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: "connection refused".to_owned(),
            })
    }

    fn answer_in(
        s: &mut State,
        endpoint: &str,
        path: &str,
        body: &Value,
    ) -> Result<Value, EtcdError> {
        let refused = |message: &str| EtcdError::Refused {
            endpoint: endpoint.to_owned(),
            message: message.to_owned(),
        };
        if s.down {
            return Err(EtcdError::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: "connection refused".to_owned(),
            });
        }
        let id_of = |b: &Value| -> u64 {
            b["ID"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or_default()
        };
        match path {
            "cluster/member/list" if s.leader == u64::MAX => Err(refused("context deadline")),
            "cluster/member/list" => Ok(Self::list(s)),
            "cluster/member/add" => {
                let url = body["peerURLs"][0].as_str().unwrap_or_default().to_owned();
                if s.members.iter().any(|m| m.2 == url) {
                    return Err(refused("etcdserver: Peer URLs already exists"));
                }
                let learner = body["isLearner"].as_bool().unwrap_or(false);
                // etcd's default --max-learners is 1.
                if learner && s.members.iter().any(|m| m.3) {
                    return Err(refused("etcdserver: too many learner members in cluster"));
                }
                // mayAddMember: the leader must be connected to every voter (learners too).
                if s.members.iter().any(|m| !m.3 && !Self::connected(s, m)) {
                    return Err(refused("etcdserver: unhealthy cluster"));
                }
                s.next += 1;
                let id = 0x1000 + s.next;
                s.members
                    .push((id, String::new(), url.clone(), learner, false));
                let mut out = Self::list(s);
                out["member"] =
                    json!({"ID": id.to_string(), "peerURLs": [url], "isLearner": learner});
                Ok(out)
            }
            "cluster/member/promote" => {
                let id = id_of(body);
                // IsReadyToPromoteMember: the started voters with it make a quorum of the
                // voters with it.
                let voters = s.members.iter().filter(|m| !m.3).count() + 1;
                let started = s
                    .members
                    .iter()
                    .filter(|m| !m.3 && Self::connected(s, m))
                    .count()
                    + 1;
                if started < voters / 2 + 1 {
                    return Err(refused(
                        "etcdserver: re-configuration failed due to not enough started members",
                    ));
                }
                let m = s
                    .members
                    .iter_mut()
                    .find(|m| m.0 == id)
                    .ok_or_else(|| refused("etcdserver: member not found"))?;
                if !m.3 {
                    return Err(refused("etcdserver: can only promote a learner member"));
                }
                if !m.4 {
                    return Err(refused(
                        "etcdserver: can only promote a learner member which is in sync with leader",
                    ));
                }
                m.3 = false;
                Ok(Self::list(s))
            }
            "cluster/member/remove" => {
                let id = id_of(body);
                let before = s.members.len();
                s.members.retain(|m| m.0 != id);
                if s.members.len() == before {
                    return Err(refused("etcdserver: member not found"));
                }
                Ok(Self::list(s))
            }
            "maintenance/status" => {
                let m = Self::answering(s, endpoint)?;
                let (size, in_use, _) = s.db.get(&m.1).copied().unwrap_or((20480, 20480, 0));
                // etcd's status lists every alarm of the cluster, on every member.
                let errors: Vec<String> = s
                    .alarms
                    .iter()
                    .map(|(id, name)| format!("memberID:{id} alarm:{name} "))
                    .collect();
                Ok(json!({
                    "header": {"member_id": m.0.to_string(), "revision": s.revision.max(1).to_string()},
                    "dbSize": size.to_string(),
                    "dbSizeInUse": in_use.to_string(),
                    "leader": match s.leader { 0 => 4097, u64::MAX => 0, l => l }.to_string(),
                    "isLearner": m.3,
                    "raftIndex": if m.4 { "100" } else { "3" },
                    "raftAppliedIndex": if m.4 { "100" } else { "3" },
                    "errors": errors,
                }))
            }
            "kv/compaction" => {
                Self::answering(s, endpoint)?;
                let revision: u64 = body["revision"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or_default();
                if revision <= s.compacted {
                    return Err(refused(
                        "etcdserver: mvcc: required revision has been compacted",
                    ));
                }
                s.compacted = revision;
                for db in s.db.values_mut() {
                    db.1 = db.1.min(db.2);
                }
                Ok(json!({}))
            }
            "maintenance/defragment" => {
                let pod = Self::answering(s, endpoint)?.1;
                if let Some(db) = s.db.get_mut(&pod) {
                    db.0 = db.1;
                }
                s.defragmented.push(pod);
                Ok(json!({}))
            }
            "maintenance/hashkv" => {
                let m = Self::answering(s, endpoint)?;
                let hash = s.hashes.get(&m.1).copied().unwrap_or(0xe7cd);
                Ok(json!({"hash": hash, "compact_revision": s.compacted.to_string()}))
            }
            "maintenance/alarm" => {
                Self::answering(s, endpoint)?;
                if body["action"] == "DEACTIVATE" {
                    let id = id_of(&json!({"ID": body["memberID"]}));
                    let name = body["alarm"].as_str().unwrap_or_default().to_owned();
                    s.alarms.retain(|a| *a != (id, name.clone()));
                    return Ok(json!({}));
                }
                let alarms: Vec<Value> = s
                    .alarms
                    .iter()
                    .map(|(id, name)| json!({"memberID": id.to_string(), "alarm": name}))
                    .collect();
                Ok(json!({"alarms": alarms}))
            }
            other => Err(refused(&format!("not in the fake: {other}"))),
        }
    }
}

impl Transport for FakeEtcd {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        if path == "maintenance/defragment" {
            let hold = {
                let mut s = self.state.lock().unwrap();
                s.defragmenting.push(host_name(endpoint).to_owned());
                s.hold.clone()
            };
            return Box::pin(async move {
                if let Some(hold) = hold {
                    hold.acquire().await.expect("not closed").forget();
                }
                self.answer(endpoint, path, &body)
            });
        }
        let out = self.answer(endpoint, path, &body);
        Box::pin(async move { out })
    }

    fn with_identity(
        &self,
        _identity: &crate::controller::etcd::ClientTls,
    ) -> Result<std::sync::Arc<dyn Transport>, crate::controller::etcd::TlsError> {
        Err(crate::controller::etcd::TlsError(
            "the in-memory etcd speaks no TLS (tests/members.rs runs TLS members)".to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(f: &FakeEtcd, path: &str, body: Value) -> Result<Value, String> {
        f.answer("http://etcd-0.etcd.ns.svc:2379", path, &body)
            .map_err(|e| e.to_string())
    }

    fn add(f: &FakeEtcd, ordinal: u32) -> Result<Value, String> {
        post(
            f,
            "cluster/member/add",
            json!({"peerURLs": [format!("http://etcd-{ordinal}.etcd.ns.svc:2380")], "isLearner": true}),
        )
    }

    #[test]
    fn it_refuses_what_etcd_refuses() {
        let urls: Vec<String> = (0..3)
            .map(|i| format!("http://etcd-{i}.etcd.ns.svc:2380"))
            .collect();
        let f = FakeEtcd::running(&urls);
        // A voter the leader cannot reach: no add, not even a learner.
        f.set_unhealthy("etcd-1", true);
        assert!(
            add(&f, 3)
                .unwrap_err()
                .contains("etcdserver: unhealthy cluster")
        );
        f.set_unhealthy("etcd-1", false);
        let added = add(&f, 3).unwrap();
        let id = added["member"]["ID"].as_str().unwrap().to_owned();
        // One learner at a time (--max-learners 1).
        assert!(add(&f, 4).unwrap_err().contains("too many learner members"));
        // Not started, so not in sync: no promotion.
        let promote = || post(&f, "cluster/member/promote", json!({"ID": id}));
        assert!(promote().unwrap_err().contains("in sync with leader"));
        // Started and caught up, but two of the three voters gone: the four would lack a quorum.
        f.start("etcd-3", true);
        f.set_unhealthy("etcd-1", true);
        f.set_unhealthy("etcd-2", true);
        assert!(
            promote()
                .unwrap_err()
                .contains("not enough started members")
        );
        f.set_unhealthy("etcd-2", false);
        promote().unwrap();
        assert_eq!(f.members()[3], ("etcd-3".to_owned(), false));
        assert_eq!(f.refusals().len(), 4, "{:?}", f.refusals());
    }
}
