//! A lost quorum, diagnosed: when no member answers the (linearizable) member list, the loop
//! asks every member pod for its `status` (which a member answers alone) and reads how each
//! silent member's pod last ended. Either the silent members' data can still come back (pods
//! down, volumes intact: the cluster heals when they return, and the loop waits), or a
//! majority's data is gone (their pods report a lost volume): then it will not heal by itself,
//! and the diagnosis names the survivor with the most applied data and how it compares with the
//! newest snapshot, the two ways out docs/clusters.md ("When quorum is lost") describes.
//! Meanwhile the members' ConfigMap is fenced (no member on an empty volume rejoins under its
//! old ID), unless one member with data is all there is ([`sole_survivor`]): then the empty
//! members rejoin from it, at once or, with `spec.recovery.quorumLoss: Manual`, once a person
//! approved that plan ([`approved`]). The membership itself is never touched without a member
//! list.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::exits::Exit;
use super::members::MemberStatus;
use crate::api::APPROVE_RECOVERY_ANNOTATION;
use crate::api::v1::{EtcdCluster, QuorumLoss, SnapshotRecord};

/// What a lost quorum is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Diagnosis {
    /// The silent members' data may come back: the loop waits.
    Waiting(String),
    /// A majority's data is gone: it does not heal by itself.
    DataLost(String),
    /// A majority's data is gone and one member with data is all there is: the members on
    /// empty volumes may rejoin under their old IDs and copy its data ([`sole_survivor`]).
    Rejoining(String),
    /// As [`Diagnosis::Rejoining`], but `spec.recovery.quorumLoss` is `Manual` and nobody has
    /// approved the plan yet ([`approved`]): the fence stays.
    AwaitingApproval(String),
}

impl Diagnosis {
    pub fn message(&self) -> &str {
        match self {
            Diagnosis::Waiting(m)
            | Diagnosis::DataLost(m)
            | Diagnosis::Rejoining(m)
            | Diagnosis::AwaitingApproval(m) => m,
        }
    }

    /// The reason of the `Available` condition that says it.
    pub fn reason(&self) -> &'static str {
        match self {
            Diagnosis::Waiting(_) => "QuorumLost",
            Diagnosis::DataLost(_) => "MajorityDataLost",
            Diagnosis::Rejoining(_) => "RejoiningFromSurvivor",
            Diagnosis::AwaitingApproval(_) => "RecoveryAwaitingApproval",
        }
    }

    /// Whether it is told in a Warning (once, with the condition's reason): all but the wait,
    /// which usually heals by itself.
    pub fn warns(&self) -> bool {
        !matches!(self, Diagnosis::Waiting(_))
    }
}

/// The plan a person approves for a rejoin from `pod` at its applied index: a later loss (the
/// same survivor further on, or another one) is another plan, so an old approval approves
/// nothing new.
pub fn rejoin_plan(pod: &str, applied_index: u64) -> String {
    format!("rejoin-from-{pod}-at-{applied_index}")
}

/// Whether `spec.recovery.quorumLoss` is `Manual` (unset is `Automatic`).
fn manual(ec: &EtcdCluster) -> bool {
    ec.spec.recovery.as_ref().and_then(|r| r.quorum_loss) == Some(QuorumLoss::Manual)
}

/// Whether the loop carries out `plan` by itself: with `spec.recovery.quorumLoss` `Automatic`
/// (or unset) always; with `Manual` once the annotation [`APPROVE_RECOVERY_ANNOTATION`] names
/// exactly this plan.
pub fn approved(ec: &EtcdCluster, plan: &str) -> bool {
    !manual(ec) || approval(ec).is_some_and(|v| v == plan)
}

/// The plan the approval annotation names, if any.
fn approval(ec: &EtcdCluster) -> Option<&str> {
    ec.annotations()
        .get(APPROVE_RECOVERY_ANNOTATION)
        .map(|v| v.trim())
}

/// The one member that may lead the cluster again after a lost quorum, by ordinal: exactly
/// one member answers, no other member can hold data (every other member pod's last run
/// reports an empty volume: the fence's refusal, an empty raft log), and the newest snapshot
/// is not newer than it. Then its log is the only one: the empty members may rejoin under
/// their old member IDs (they vote for it, it is elected, they copy its data), as safe as a
/// restart with `--force-new-cluster` and without one. With two members holding data, or one
/// that may (a pod that has not run since), an empty member's vote could make one that lags
/// the leader: none is chosen (issue 47: that needs the rebuild, which is by hand).
pub fn sole_survivor(
    ec: &EtcdCluster,
    answered: &BTreeMap<i32, MemberStatus>,
    exits: &BTreeMap<i32, Exit>,
    newest: Option<&SnapshotRecord>,
) -> Option<i32> {
    let [(&ordinal, status)] = answered.iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    if status.leader != 0 {
        return None;
    }
    let others_empty = (0..ec.spec.size)
        .filter(|&i| i != ordinal)
        .all(|i| exits.get(&i).is_some_and(Exit::empty_volume));
    let revision = i64::try_from(status.header.revision).unwrap_or(i64::MAX);
    let behind_snapshot = newest.is_some_and(|b| b.revision > revision);
    (others_empty && !behind_snapshot).then_some(ordinal)
}

/// The diagnosis from the members that answered `status` (`answered`, by ordinal), how each
/// member pod whose etcd is not running now last ended (`exits`: the last run of a running
/// container is old news), and the newest snapshot. `None` when no member answers or
/// one knows a leader (the member list failed for another reason: the loop's own network, say).
/// A rejoin from a sole survivor that `Manual` recovery has not approved yet is
/// [`Diagnosis::AwaitingApproval`].
pub fn diagnose(
    ec: &EtcdCluster,
    answered: &BTreeMap<i32, MemberStatus>,
    exits: &BTreeMap<i32, Exit>,
    newest: Option<&SnapshotRecord>,
) -> Option<Diagnosis> {
    // No member answers at all: the loop cannot tell a lost quorum from its own way to the
    // members being cut (a NetworkPolicy, DNS); a member that knows a leader: the member list
    // failed for another reason.
    if answered.is_empty() || answered.values().any(|s| s.leader != 0) {
        return None;
    }
    let name = ec.name_any();
    let size = ec.spec.size;
    let quorum = size / 2 + 1;
    let pod = |i: i32| format!("{name}-{i}");
    let silent: Vec<i32> = (0..size).filter(|i| !answered.contains_key(i)).collect();
    let (lost, down): (Vec<i32>, Vec<i32>) = silent
        .iter()
        .partition(|i| exits.get(i).is_some_and(Exit::empty_volume));
    let names = |is: &[i32]| is.iter().map(|&i| pod(i)).collect::<Vec<_>>().join(", ");
    let answering = answered.len() as i32;
    let survivors = answered
        .iter()
        .map(|(i, s)| {
            format!(
                "{} (applied index {}, revision {})",
                pod(*i),
                s.raft_applied_index,
                s.header.revision
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    if answering + down.len() as i32 >= quorum {
        return Some(Diagnosis::Waiting(format!(
            "no leader: {answering} of {size} members answer{}; {} do not answer and nothing says their data is gone: the cluster heals when they run again, and the loop waits (it removes nothing without a quorum)",
            if survivors.is_empty() {
                String::new()
            } else {
                format!(" ({survivors})")
            },
            names(&down)
        )));
    }
    // The survivor with the most applied data (of equals, the lowest ordinal).
    let (i, s) = answered
        .iter()
        .max_by_key(|(i, s)| (s.raft_applied_index, std::cmp::Reverse(**i)))?;
    let revision = i64::try_from(s.header.revision).unwrap_or(i64::MAX);
    let against = match newest {
        Some(b) if b.revision > revision => format!(
            "; the newest snapshot ({}, revision {}) is newer than {}'s revision {}: restore it instead",
            b.uri,
            b.revision,
            pod(*i),
            s.header.revision
        ),
        Some(b) => format!(
            "; the newest snapshot ({}, revision {}) is older: rebuilding from {} keeps {} more revisions",
            b.uri,
            b.revision,
            pod(*i),
            revision - b.revision
        ),
        None => "; there is no snapshot".to_owned(),
    };
    let choice = format!(
        "the member with the most applied data is {} (applied index {}, revision {}){against}",
        pod(*i),
        s.raft_applied_index,
        s.header.revision
    );
    if sole_survivor(ec, answered, exits, newest).is_some() {
        let found = format!(
            "quorum lost: the data of {} is gone (their pods started on empty volumes) and {} is the only member with data (applied index {}, revision {}{})",
            names(&lost),
            pod(*i),
            s.raft_applied_index,
            s.header.revision,
            match newest {
                Some(b) => format!(", the newest snapshot is at revision {}", b.revision),
                None => String::new(),
            }
        );
        let keeps = "what it had applied is kept, writes acknowledged after it are gone";
        let plan = rejoin_plan(&pod(*i), s.raft_applied_index);
        if !approved(ec, &plan) {
            let other = match approval(ec) {
                Some(v) => format!(" ({APPROVE_RECOVERY_ANNOTATION} names another plan: {v})"),
                None => String::new(),
            };
            let namespace = ec.namespace().unwrap_or_default();
            return Some(Diagnosis::AwaitingApproval(format!(
                "{found}; spec.recovery.quorumLoss is Manual: the loop would let the empty members rejoin under their old IDs and copy its data ({keeps}); until then members on empty volumes are kept from rejoining{other}. Approve with: kubectl annotate ec {name} -n {namespace} {APPROVE_RECOVERY_ANNOTATION}={plan} --overwrite"
            )));
        }
        return Some(Diagnosis::Rejoining(format!(
            "{found}; {}the empty members rejoin under their old IDs and copy its data: {keeps}",
            if manual(ec) {
                format!("approved ({plan}): ")
            } else {
                String::new()
            }
        )));
    }
    Some(Diagnosis::DataLost(format!(
        "quorum lost and it will not heal: the data of {} is gone (their pods say their volumes were lost), {answering} of {size} members answer{}{}; {choice}; members on empty volumes are kept from rejoining under their old IDs, and nothing else is changed by the loop (see When quorum is lost in docs/clusters.md)",
        names(&lost),
        if survivors.is_empty() {
            String::new()
        } else {
            format!(" ({survivors})")
        },
        if down.is_empty() {
            String::new()
        } else {
            format!(", {} are down", names(&down))
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(applied: u64, revision: u64) -> MemberStatus {
        let mut s = MemberStatus {
            raft_applied_index: applied,
            ..Default::default()
        };
        s.header.revision = revision;
        s
    }

    fn lost() -> Exit {
        Exit {
            code: 1,
            message: "panic: tocommit(105) is out of range [lastIndex(0)]".to_owned(),
            at: None,
        }
    }

    fn snapshot(revision: i64) -> SnapshotRecord {
        SnapshotRecord {
            uri: "s3://b/etcd-snapshot.db".to_owned(),
            revision,
            ..Default::default()
        }
    }

    #[test]
    fn pods_down_with_their_volumes_wait_and_lost_volumes_name_the_survivor() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let one = BTreeMap::from([(0, status(120, 57))]);
        // Two pods down, nothing says their data is gone: wait.
        match diagnose(&ec, &one, &BTreeMap::new(), None) {
            Some(Diagnosis::Waiting(m)) => {
                assert!(m.contains("1 of 3 members answer (etcd-0 (applied index 120, revision 57)); etcd-1, etcd-2 do not answer"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // One of them lost its volume: still a quorum's worth of data may come back.
        let one_lost = BTreeMap::from([(1, lost())]);
        assert!(matches!(
            diagnose(&ec, &one, &one_lost, None),
            Some(Diagnosis::Waiting(_))
        ));
        // Of five, three lost and one down that has not run since (it may hold data): it
        // does not heal; etcd-0 is the survivor; the snapshot is older.
        let ec5 = crate::controller::render::tests::cluster("etcd", 5, None);
        let three = BTreeMap::from([(1, lost()), (2, lost()), (3, lost())]);
        match diagnose(&ec5, &one, &three, Some(&snapshot(50))) {
            Some(Diagnosis::DataLost(m)) => {
                assert!(
                    m.contains("the data of etcd-1, etcd-2, etcd-3 is gone"),
                    "{m}"
                );
                assert!(
                    m.contains("the member with the most applied data is etcd-0 (applied index 120, revision 57); the newest snapshot (s3://b/etcd-snapshot.db, revision 50) is older: rebuilding from etcd-0 keeps 7 more revisions"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Both others lost: etcd-0 is the only member with data (a_sole_survivor_... below);
        // with a snapshot newer than it, not: restore it instead.
        let both = BTreeMap::from([(1, lost()), (2, lost())]);
        let m = diagnose(&ec, &one, &both, Some(&snapshot(80))).unwrap();
        assert!(
            m.message()
                .contains("is newer than etcd-0's revision 57: restore it instead"),
            "{m:?}"
        );
    }

    #[test]
    fn a_member_that_knows_a_leader_is_no_lost_quorum() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let mut led = status(120, 57);
        led.leader = 7;
        assert_eq!(
            diagnose(&ec, &BTreeMap::from([(0, led)]), &BTreeMap::new(), None),
            None
        );
    }

    /// One member answers and every other one is known empty: it is the only log, and the
    /// empty members may rejoin from it; not with another member that may hold data, nor when
    /// the newest snapshot is newer than it, nor with two members answering.
    #[test]
    fn a_sole_survivor_is_one_answering_with_every_other_member_known_empty() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let one = BTreeMap::from([(0, status(120, 57))]);
        let fenced = Exit {
            code: 1,
            message: "couldn't find local name \"etcd-1\" in the initial cluster configuration"
                .to_owned(),
            at: None,
        };
        let both = BTreeMap::from([(1, fenced.clone()), (2, lost())]);
        assert_eq!(sole_survivor(&ec, &one, &both, None), Some(0));
        match diagnose(&ec, &one, &both, Some(&snapshot(50))) {
            Some(Diagnosis::Rejoining(m)) => assert!(
                m.contains("etcd-0 is the only member with data (applied index 120, revision 57, the newest snapshot is at revision 50)"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // etcd-2 has not run since (no exit): it may hold data.
        let unknown = BTreeMap::from([(1, fenced.clone())]);
        assert_eq!(sole_survivor(&ec, &one, &unknown, None), None);
        // The newest snapshot is newer than the survivor: no rejoining from it.
        assert_eq!(sole_survivor(&ec, &one, &both, Some(&snapshot(80))), None);
        assert!(matches!(
            diagnose(&ec, &one, &both, Some(&snapshot(80))),
            Some(Diagnosis::DataLost(_))
        ));
        // Two answer (five members, three empty): either could be voted in; none is chosen.
        let ec5 = crate::controller::render::tests::cluster("etcd", 5, None);
        let two = BTreeMap::from([(0, status(90, 40)), (3, status(130, 61))]);
        let lost3 = BTreeMap::from([(1, lost()), (2, fenced), (4, lost())]);
        assert_eq!(sole_survivor(&ec5, &two, &lost3, None), None);
    }

    /// With `spec.recovery.quorumLoss: Manual` the rejoin waits for an approval of the plan the
    /// message names; an approval of another plan (an earlier loss) approves nothing.
    #[test]
    fn a_manual_recovery_waits_for_the_approval_of_its_own_plan() {
        let mut ec = crate::controller::render::tests::cluster("etcd", 3, None);
        ec.spec.recovery = Some(crate::api::v1::Recovery {
            quorum_loss: Some(QuorumLoss::Manual),
        });
        let one = BTreeMap::from([(0, status(120, 57))]);
        let both = BTreeMap::from([(1, lost()), (2, lost())]);
        let plan = rejoin_plan("etcd-0", 120);
        assert_eq!(plan, "rejoin-from-etcd-0-at-120");
        match diagnose(&ec, &one, &both, None) {
            Some(Diagnosis::AwaitingApproval(m)) => assert!(
                m.contains("etcd-0 is the only member with data (applied index 120, revision 57)")
                    && m.contains("kubectl annotate ec etcd -n prod etcd.example.com/approve-recovery=rejoin-from-etcd-0-at-120 --overwrite"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        let approve = |ec: &mut EtcdCluster, v: &str| {
            ec.metadata.annotations = Some(
                [(APPROVE_RECOVERY_ANNOTATION.to_owned(), v.to_owned())]
                    .into_iter()
                    .collect(),
            );
        };
        approve(&mut ec, "rejoin-from-etcd-0-at-96");
        match diagnose(&ec, &one, &both, None) {
            Some(Diagnosis::AwaitingApproval(m)) => assert!(
                m.contains("names another plan: rejoin-from-etcd-0-at-96"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // Spaces around the plan (a paste) are no other plan.
        approve(&mut ec, &format!(" {plan}\n"));
        assert!(approved(&ec, &plan));
        // Not a rejoin (etcd-2 may still hold data): waiting, never awaiting approval.
        let one_lost = BTreeMap::from([(1, lost())]);
        assert!(matches!(
            diagnose(&ec, &one, &one_lost, None),
            Some(Diagnosis::Waiting(_))
        ));
        approve(&mut ec, &plan);
        match diagnose(&ec, &one, &both, None) {
            Some(Diagnosis::Rejoining(m)) => {
                assert!(m.contains("approved (rejoin-from-etcd-0-at-120)"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // Automatic and unset need no approval.
        ec.metadata.annotations = None;
        for recovery in [
            Some(crate::api::v1::Recovery {
                quorum_loss: Some(QuorumLoss::Automatic),
            }),
            Some(crate::api::v1::Recovery { quorum_loss: None }),
            None,
        ] {
            ec.spec.recovery = recovery;
            assert!(approved(&ec, &plan));
            match diagnose(&ec, &one, &both, None) {
                Some(Diagnosis::Rejoining(m)) => assert!(!m.contains("approved"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
    }

    /// Of five, two answer and three lost their volumes: the one with the most applied data.
    #[test]
    fn the_survivor_is_the_one_with_the_most_applied_data() {
        let ec = crate::controller::render::tests::cluster("etcd", 5, None);
        let two = BTreeMap::from([(0, status(90, 40)), (3, status(130, 61))]);
        let lost3 = BTreeMap::from([(1, lost()), (2, lost()), (4, lost())]);
        let m = diagnose(&ec, &two, &lost3, None).unwrap();
        assert!(
            m.message().contains("the most applied data is etcd-3 (applied index 130, revision 61); there is no snapshot"),
            "{m:?}"
        );
    }
}
