//! A lost quorum, diagnosed: when no member answers the (linearizable) member list, the loop
//! asks every member pod for its `status` (which a member answers alone) and reads how each
//! silent member's pod last ended. Either the silent members' data can still come back (pods
//! down, volumes intact: the cluster heals when they return, and the loop waits), or a
//! majority's data is gone (their pods report a lost volume): then it will not heal by itself,
//! and the diagnosis names the survivor with the most applied data and how it compares with the
//! newest snapshot, the two ways out docs/clusters.md ("When quorum is lost") describes.
//! Meanwhile the members' ConfigMap is fenced (no member on an empty volume rejoins under its
//! old ID), unless one member with data is all there is ([`sole_survivor`]): then the empty
//! members rejoin from it. The membership itself is never touched without a member list.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::exits::Exit;
use super::members::MemberStatus;
use crate::api::v1::{EtcdCluster, SnapshotRecord};

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
}

impl Diagnosis {
    pub fn message(&self) -> &str {
        match self {
            Diagnosis::Waiting(m) | Diagnosis::DataLost(m) | Diagnosis::Rejoining(m) => m,
        }
    }
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
        return Some(Diagnosis::Rejoining(format!(
            "quorum lost: the data of {} is gone (their pods started on empty volumes) and {} is the only member with data (applied index {}, revision {}{}); the empty members rejoin under their old IDs and copy its data: what it had applied is kept, writes acknowledged after it are gone",
            names(&lost),
            pod(*i),
            s.raft_applied_index,
            s.header.revision,
            match newest {
                Some(b) => format!(", the newest snapshot is at revision {}", b.revision),
                None => String::new(),
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
