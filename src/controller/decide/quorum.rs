//! A lost quorum, diagnosed: when no member answers the (linearizable) member list, the loop
//! asks every member pod for its `status` (which a member answers alone) and reads how each
//! silent member's pod last ended. Either the silent members' data can still come back (pods
//! down, volumes intact: the cluster heals when they return, and the loop waits), or a
//! majority's data is gone (their pods report a lost volume): then it will not heal by itself,
//! and the diagnosis names the survivor with the most applied data and how it compares with the
//! newest snapshot, the two ways out docs/clusters.md ("When quorum is lost") describes.
//! Meanwhile the members' ConfigMap is fenced (no member on an empty volume rejoins under its
//! old ID), unless one member with data is all there is ([`sole_survivor`]): then the empty
//! members rejoin from it (with backups on, once its data is copied), at once or, with
//! `spec.recovery.quorumLoss: Manual`, once a person approved that plan ([`approved`]). The
//! membership itself is never touched without a member list.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::exits::Exit;
use super::members::MemberStatus;
pub use super::recovery::{
    Diagnosis, Rescue, approved, parse_rejoin_plan, plan, rejoin_plan, restore_plan,
};
use super::recovery::{awaiting, best, manual};
use crate::api::v1::{EtcdCluster, SnapshotRecord};

/// The one member that may lead the cluster again after a lost quorum, by ordinal: exactly
/// one member answers, no other member can hold data (every other member pod's last run
/// reports an empty volume: the fence's refusal, an empty raft log), and the newest snapshot
/// is not newer than it. Then its log is the only one: the empty members may rejoin under
/// their old member IDs (they vote for it, it is elected, they copy its data), as safe as a
/// restart with `--force-new-cluster` and without one. With two members holding data, or one
/// that may (a pod that has not run since), an empty member's vote could make one that lags
/// the leader: none is chosen (with every member that may hold data answering, the rebuild in
/// [`diagnose`] copies and empties the others first, and then this one is the sole survivor).
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
/// container is old news, unless that container runs fenced, [`super::exits::fenced_run`]),
/// the newest snapshot, and the copies a rebuild made (`rescue`).
/// `None` when no member answers or one knows a leader (the member list failed for another
/// reason: the loop's own network, say). A recovery that `Manual` recovery has not approved
/// yet is [`Diagnosis::AwaitingApproval`].
pub fn diagnose(
    ec: &EtcdCluster,
    answered: &BTreeMap<i32, MemberStatus>,
    exits: &BTreeMap<i32, Exit>,
    newest: Option<&SnapshotRecord>,
    rescue: &Rescue,
) -> Option<Diagnosis> {
    // The rejoin of the plan the fence is lifted for has elected a leader: the member list
    // answers once that leader has committed in its term, and until then the rejoin goes on
    // with the fence lifted. Only while the status says the rejoin and the plan is still
    // recorded (the loop drops it once a member list answers), only with the plan approved,
    // and only when the leader is the plan's survivor: it answers as a voter at or past the
    // plan's index, and every voter that knows a leader names it (a learner's is ignored).
    if let Some(p) = rescue.lifted.as_ref()
        && rescue.rejoining
        && approved(ec, p)
        && answered.values().any(|s| s.leader != 0)
        && let Some((pod, index)) = parse_rejoin_plan(p)
        && let Some(survivor) = member_ordinal(ec, pod).and_then(|i| answered.get(&i))
        && !survivor.is_learner
        && survivor.raft_applied_index >= index
        && answered
            .values()
            .filter(|s| !s.is_learner && s.leader != 0)
            .all(|s| s.leader == survivor.header.member_id)
    {
        return Some(Diagnosis::Rejoining(format!(
            "quorum lost: the members on empty volumes are rejoining under their old IDs from {pod}, the only member with data (the fence is lifted for {p}), and it leads them; the member list answers once it has committed"
        )));
    }
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
    // What a recovery keeps: the voter with the most applied data.
    let best = best(answered);
    let plan = plan(ec, answered);
    // The fence was lifted for this very plan, and that member still answers at that index
    // with no leader since: the empty members are rejoining (running now, their pods no
    // longer say they are empty), and the fence stays lifted. An empty member that has
    // started answers too, behind it, until the survivor's leadership reaches it (measured on
    // the real node under NetworkPolicy: its first packets are dropped until the agent knows
    // its pod's new address); that is the rejoin going on, not a new loss. The fence keeps
    // only members on empty volumes from starting, so it stays lifted for them while every
    // other member that answers has applied nothing (read from its metrics port it has data:
    // that port is read only for a member that has applied something).
    if let (Some((i, s)), Some(p)) = (best, plan.as_ref())
        && rescue.lifted.as_ref() == Some(p)
        && approved(ec, p)
        && answered
            .iter()
            .all(|(o, a)| o == i || (a.raft_applied_index == 0 && !a.metrics_only))
    {
        let others: Vec<String> = (0..size).filter(|o| o != i).map(pod).collect();
        return Some(Diagnosis::Rejoining(format!(
            "quorum lost: the data of {} is gone and {} is the only member with data (applied index {}, revision {}); the empty members are rejoining under their old IDs and copy its data (the fence is lifted for {p}): what it had applied is kept, writes acknowledged after it are gone",
            others.join(", "),
            pod(*i),
            s.raft_applied_index,
            s.header.revision
        )));
    }
    // Copies made for this plan: those members' data is kept elsewhere, and they are (being)
    // made anew.
    let copied: BTreeMap<i32, &str> = rescue
        .copied
        .iter()
        .filter(|((_, p), _)| Some(p) == plan.as_ref())
        .map(|((i, _), uri)| (*i, uri.as_str()))
        .collect();
    let silent: Vec<i32> = (0..size).filter(|i| !answered.contains_key(i)).collect();
    let (lost, down): (Vec<i32>, Vec<i32>) = silent
        .iter()
        .partition(|i| exits.get(i).is_some_and(Exit::empty_volume) || copied.contains_key(i));
    let names = |is: &[i32]| is.iter().map(|&i| pod(i)).collect::<Vec<_>>().join(", ");
    let answering = answered.len() as i32;
    let survivors = answered
        .iter()
        .map(|(i, s)| {
            format!(
                "{}{}{} (applied index {}, revision {})",
                pod(*i),
                match (s.is_learner, s.metrics_only) {
                    (true, true) if !MemberStatus::says_if_learner(&s.version) => {
                        ", perhaps a learner (etcd before 3.6 says so on its metrics port only once a membership change is applied, so it is never the one kept),"
                    }
                    (true, _) => ", a learner,",
                    (false, _) => "",
                },
                if s.metrics_only {
                    ", restarted with no leader there and read from its metrics port,"
                } else {
                    ""
                },
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
    let lost_data = || {
        format!(
            "quorum lost and it will not heal: the data of {} is gone (their pods say their volumes were lost), {answering} of {size} members answer{}{}",
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
        )
    };
    let by_hand = "members on empty volumes are kept from rejoining under their old IDs, and nothing else is changed by the loop (see When quorum is lost in docs/clusters.md)";
    let (Some((&i, s)), Some(plan)) = (best, plan) else {
        return Some(Diagnosis::DataLost(format!(
            "{}; no voter answers (a learner never voted for what it holds, so it is never the one kept); {by_hand}",
            lost_data()
        )));
    };
    let revision = i64::try_from(s.header.revision).unwrap_or(i64::MAX);
    let behind = newest.filter(|b| b.revision > revision);
    let against = match newest {
        Some(b) if behind.is_some() => format!(
            "; the newest snapshot ({}, revision {}) is newer than {}'s revision {}",
            b.uri,
            b.revision,
            pod(i),
            s.header.revision
        ),
        Some(b) => format!(
            "; the newest snapshot ({}, revision {}) is older: rebuilding from {} keeps {} more revisions",
            b.uri,
            b.revision,
            pod(i),
            revision - b.revision
        ),
        None => "; there is no snapshot".to_owned(),
    };
    let chosen = format!(
        "the member with the most applied data is {} (applied index {}, revision {}){against}",
        pod(i),
        s.raft_applied_index,
        s.header.revision
    );
    // Said where the loop leaves it to a person.
    let choice = if behind.is_some() {
        format!("{chosen}: restore it instead")
    } else {
        chosen.clone()
    };
    let keeps = "what it had applied is kept, writes acknowledged after it are gone";
    let approved_note = if manual(ec) {
        format!("approved ({plan}): ")
    } else {
        String::new()
    };
    // The member kept is copied first too, where it can be (backups on, and it serves clients:
    // one that restarted without a leader does not): nothing of it is deleted, but its copy is
    // what is left should the rebuild go wrong. The rebuild waits for it.
    let copy_kept = !s.metrics_only && !copied.contains_key(&i);
    let copying = |o: i32| match rescue.failed.get(&o) {
        Some(why) => format!("the copy of {} failed ({why}) and is tried again", pod(o)),
        None => format!("{} being copied", pod(o)),
    };
    if sole_survivor(ec, answered, exits, newest).is_some() {
        let found = format!(
            "quorum lost: the data of {} is gone (their pods started on empty volumes) and {} is the only member with data (applied index {}, revision {}{})",
            names(&lost),
            pod(i),
            s.raft_applied_index,
            s.header.revision,
            match newest {
                Some(b) => format!(", the newest snapshot is at revision {}", b.revision),
                None => String::new(),
            }
        );
        let copy_to = rescue.destination.as_deref().filter(|_| copy_kept);
        let first = copy_to
            .map(|d| format!("copy its data to {d} first, then "))
            .unwrap_or_default();
        if !approved(ec, &plan) {
            return Some(awaiting(
                ec,
                format!(
                    "{found}; spec.recovery.quorumLoss is Manual: the loop would {first}let the empty members rejoin under their old IDs and copy its data ({keeps})"
                ),
                &plan,
            ));
        }
        if copy_to.is_some() {
            return Some(Diagnosis::Rebuilding {
                message: format!(
                    "{found}; {approved_note}the loop will {first}let the empty members rejoin under their old IDs and copy its data ({keeps}); {}",
                    copying(i)
                ),
                plan,
                copy: vec![i],
                wipe: Vec::new(),
            });
        }
        return Some(Diagnosis::Rejoining(format!(
            "{found}; {approved_note}the empty members rejoin under their old IDs and copy its data: {keeps}"
        )));
    }
    // A rebuild: every member that may hold data answers (none is down), and the others with
    // data, or copied already, are made anew from the one kept.
    let others: Vec<i32> = answered.keys().copied().filter(|&o| o != i).collect();
    let remade: Vec<i32> = lost
        .iter()
        .copied()
        .filter(|o| copied.contains_key(o))
        .collect();
    if down.is_empty() && behind.is_none() && !(others.is_empty() && remade.is_empty()) {
        let found = format!(
            "quorum lost: the data of {} is gone (their pods say their volumes were lost), {answering} of {size} members answer ({survivors}); {choice}",
            names(&lost)
        );
        let mut anew = [others.clone(), remade.clone()].concat();
        anew.sort_unstable();
        let Some(destination) = rescue.destination.as_deref() else {
            return Some(Diagnosis::DataLost(format!(
                "{found}; rebuilding from {} would make the volumes of {} anew, and backups are off (spec.backup), so their data cannot be copied first: the loop deletes nothing it has not copied; {by_hand}",
                pod(i),
                names(&anew)
            )));
        };
        // etcd serves clients only once a leader is there: a member that restarted without one
        // takes no snapshot request, so its data cannot be copied.
        let unserved: Vec<i32> = others
            .iter()
            .copied()
            .filter(|o| !copied.contains_key(o) && answered[o].metrics_only)
            .collect();
        if !unserved.is_empty() {
            return Some(Diagnosis::DataLost(format!(
                "{found}; rebuilding from {} would first copy the data of {}, and {} restarted with no leader there: etcd serves no client, snapshots included, until a leader is, so nothing can be copied from it; the loop deletes nothing it has not copied; {by_hand}",
                pod(i),
                names(&others),
                names(&unserved)
            )));
        }
        let would = format!(
            "the data of {}{} is copied to {destination} first, then their volumes are made anew and every empty member rejoins under its old ID and copies {}'s data ({keeps})",
            names(&anew),
            if copy_kept || copied.contains_key(&i) {
                format!(" (and of {}, kept)", pod(i))
            } else {
                String::new()
            },
            pod(i)
        );
        if !approved(ec, &plan) {
            return Some(awaiting(
                ec,
                format!("{found}; spec.recovery.quorumLoss is Manual: with the rebuild {would}"),
                &plan,
            ));
        }
        let (wipe, mut copy): (Vec<i32>, Vec<i32>) =
            others.iter().partition(|o| copied.contains_key(o));
        if copy_kept {
            copy.push(i);
            copy.sort_unstable();
        }
        let mut progress: Vec<String> = copied
            .iter()
            .map(|(o, uri)| format!("{} copied to {uri}", pod(*o)))
            .collect();
        progress.extend(copy.iter().map(|&o| copying(o)));
        progress.extend(
            remade
                .iter()
                .filter(|o| !exits.get(o).is_some_and(Exit::empty_volume))
                .map(|o| format!("{} starting on its new volume", pod(*o))),
        );
        return Some(Diagnosis::Rebuilding {
            message: format!(
                "{found}; {approved_note}the rebuild keeps {}: {would}; {}",
                pod(i),
                progress.join(", ")
            ),
            plan,
            copy,
            wipe,
        });
    }
    // A restore in place: every member that may hold data answers, and the newest snapshot is
    // newer than the member with the most applied data.
    if let (true, Some(b)) = (down.is_empty(), behind) {
        let found = format!(
            "quorum lost: the data of {} is gone (their pods say their volumes were lost), {answering} of {size} members answer ({survivors}); {chosen}",
            names(&lost)
        );
        return Some(super::restoring::decide(
            ec, answered, b, rescue, &found, by_hand,
        ));
    }
    Some(Diagnosis::DataLost(format!(
        "{}; {choice}; {by_hand}",
        lost_data()
    )))
}

/// The ordinal of the member pod named `pod` (`NAME-<i>`) of `ec`.
pub(crate) fn member_ordinal(ec: &EtcdCluster, pod: &str) -> Option<i32> {
    pod.strip_prefix(&format!("{}-", ec.name_any()))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::APPROVE_RECOVERY_ANNOTATION;
    use crate::api::v1::QuorumLoss;
    use crate::controller::render::InPlace;

    /// The diagnosis without a rebuild's copies.
    fn diag(
        ec: &EtcdCluster,
        answered: &BTreeMap<i32, MemberStatus>,
        exits: &BTreeMap<i32, Exit>,
        newest: Option<&SnapshotRecord>,
    ) -> Option<Diagnosis> {
        diagnose(ec, answered, exits, newest, &Rescue::default())
    }

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

    /// Once the fence is lifted for a plan, the empty members that start answer too, with no
    /// leader and nothing applied, until the survivor leads them: still the rejoin of that
    /// plan. A member that answers at or past the survivor's index is not one of them.
    #[test]
    fn an_empty_member_answering_mid_rejoin_keeps_the_fence_lifted() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let alone = BTreeMap::from([(1, status(67, 55))]);
        let plan = plan(&ec, &alone).unwrap();
        let rescue = Rescue {
            lifted: Some(plan.clone()),
            ..Default::default()
        };
        let rejoining = |answered: &BTreeMap<i32, MemberStatus>| {
            matches!(
                diagnose(&ec, answered, &BTreeMap::new(), None, &rescue),
                Some(Diagnosis::Rejoining(m)) if m.contains("etcd-1 is the only member with data")
            )
        };
        assert!(rejoining(&alone));
        let started = BTreeMap::from([(0, status(0, 0)), (1, status(67, 55))]);
        assert!(
            rejoining(&started),
            "an empty member started, no leader yet"
        );
        let both = BTreeMap::from([(0, status(0, 0)), (1, status(67, 55)), (2, status(0, 0))]);
        assert!(rejoining(&both));
        let behind = BTreeMap::from([(0, status(30, 20)), (1, status(67, 55))]);
        assert!(!rejoining(&behind), "another member with data, behind it");
        let mut from_metrics = status(0, 0);
        from_metrics.metrics_only = true;
        let metrics = BTreeMap::from([(0, from_metrics), (1, status(67, 55))]);
        assert!(
            !rejoining(&metrics),
            "read from its metrics port: it has data"
        );
        let level = BTreeMap::from([(0, status(67, 55)), (1, status(67, 55))]);
        assert!(!rejoining(&level), "another member at the kept index");
        let ahead = BTreeMap::from([(0, status(70, 58)), (1, status(67, 55))]);
        assert!(!rejoining(&ahead), "another member ahead of it");

        // The rejoin elected a leader (etcd-1, now one entry further) before the member list
        // answers: still the rejoin while the status says it, never for a later loss.
        let mut led = BTreeMap::from([(0, status(0, 0)), (1, status(68, 55))]);
        for s in led.values_mut() {
            s.leader = 7;
        }
        led.get_mut(&1).unwrap().header.member_id = 7;
        assert_eq!(diagnose(&ec, &led, &BTreeMap::new(), None, &rescue), None);
        let saying = Rescue {
            rejoining: true,
            ..rescue.clone()
        };
        match diagnose(&ec, &led, &BTreeMap::new(), None, &saying) {
            Some(Diagnosis::Rejoining(m)) => assert!(m.contains(&plan), "{m}"),
            other => panic!("{other:?}"),
        }
        // Another leader than the plan's survivor, or the survivor behind the plan's index:
        // not this rejoin.
        let mut other = led.clone();
        other.get_mut(&0).unwrap().leader = 9;
        assert_eq!(diagnose(&ec, &other, &BTreeMap::new(), None, &saying), None);
        let mut behind = led.clone();
        behind.get_mut(&1).unwrap().raft_applied_index = 60;
        assert_eq!(
            diagnose(&ec, &behind, &BTreeMap::new(), None, &saying),
            None
        );
        // A learner's stale leader is not asked.
        let mut learner = led.clone();
        learner.get_mut(&0).unwrap().is_learner = true;
        learner.get_mut(&0).unwrap().leader = 9;
        assert!(matches!(
            diagnose(&ec, &learner, &BTreeMap::new(), None, &saying),
            Some(Diagnosis::Rejoining(_))
        ));
        let unplanned = Rescue {
            rejoining: true,
            ..Rescue::default()
        };
        assert_eq!(
            diagnose(&ec, &led, &BTreeMap::new(), None, &unplanned),
            None,
            "no plan lifted"
        );
    }

    #[test]
    fn pods_down_with_their_volumes_wait_and_lost_volumes_name_the_survivor() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let one = BTreeMap::from([(0, status(120, 57))]);
        // Two pods down, nothing says their data is gone: wait.
        match diag(&ec, &one, &BTreeMap::new(), None) {
            Some(Diagnosis::Waiting(m)) => {
                assert!(m.contains("1 of 3 members answer (etcd-0 (applied index 120, revision 57)); etcd-1, etcd-2 do not answer"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // One of them lost its volume: still a quorum's worth of data may come back.
        let one_lost = BTreeMap::from([(1, lost())]);
        assert!(matches!(
            diag(&ec, &one, &one_lost, None),
            Some(Diagnosis::Waiting(_))
        ));
        // Of five, three lost and one down that has not run since (it may hold data): it
        // does not heal; etcd-0 is the survivor; the snapshot is older.
        let ec5 = crate::controller::render::tests::cluster("etcd", 5, None);
        let three = BTreeMap::from([(1, lost()), (2, lost()), (3, lost())]);
        match diag(&ec5, &one, &three, Some(&snapshot(50))) {
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
        let m = diag(&ec, &one, &both, Some(&snapshot(80))).unwrap();
        assert!(
            m.message().contains("is newer than etcd-0's revision 57")
                && m.message()
                    .contains("so the loop does not restore it by itself; members on empty volumes are kept from rejoining"),
            "{m:?}"
        );
    }

    #[test]
    fn a_member_that_knows_a_leader_is_no_lost_quorum() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let mut led = status(120, 57);
        led.leader = 7;
        assert_eq!(
            diag(&ec, &BTreeMap::from([(0, led)]), &BTreeMap::new(), None),
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
        match diag(&ec, &one, &both, Some(&snapshot(50))) {
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
            diag(&ec, &one, &both, Some(&snapshot(80))),
            Some(Diagnosis::DataLost(_))
        ));
        // Two answer (five members, three empty): either could be voted in; none is chosen.
        let ec5 = crate::controller::render::tests::cluster("etcd", 5, None);
        let two = BTreeMap::from([(0, status(90, 40)), (3, status(130, 61))]);
        let lost3 = BTreeMap::from([(1, lost()), (2, fenced), (4, lost())]);
        assert_eq!(sole_survivor(&ec5, &two, &lost3, None), None);
    }

    /// With backups on, the sole survivor's data is copied before the empty members rejoin
    /// (nothing of it is deleted: the copy is what is left should the rejoin go wrong); a
    /// failed copy is said and tried again, and the rejoin waits for it. A survivor that
    /// restarted without a leader serves no snapshot: the rejoin goes on without its copy.
    #[test]
    fn a_sole_survivor_is_copied_before_the_empty_members_rejoin_where_backups_are_on() {
        let mut ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let one = BTreeMap::from([(0, status(120, 57))]);
        let both = BTreeMap::from([(1, lost()), (2, lost())]);
        let plan = rejoin_plan("etcd-0", 120);
        let mut rescue = Rescue {
            destination: Some("s3://b/p/prod/".to_owned()),
            ..Default::default()
        };
        match diagnose(&ec, &one, &both, None, &rescue) {
            Some(Diagnosis::Rebuilding {
                message,
                plan: p,
                copy,
                wipe,
            }) => {
                assert_eq!((p.as_str(), copy, wipe), (plan.as_str(), vec![0], vec![]));
                assert!(
                    message.contains("the loop will copy its data to s3://b/p/prod/ first, then let the empty members rejoin")
                        && message.ends_with("; etcd-0 being copied"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        rescue.failed.insert(0, "store down".to_owned());
        let m = diagnose(&ec, &one, &both, None, &rescue).unwrap();
        assert!(
            m.message()
                .ends_with("the copy of etcd-0 failed (store down) and is tried again"),
            "{m:?}"
        );
        // Copied for another plan: no copy of this data.
        rescue
            .copied
            .insert((0, rejoin_plan("etcd-0", 96)), "s3://old".to_owned());
        assert!(matches!(
            diagnose(&ec, &one, &both, None, &rescue),
            Some(Diagnosis::Rebuilding { .. })
        ));
        rescue
            .copied
            .insert((0, plan.clone()), "s3://b/p/prod/x.db".to_owned());
        assert!(matches!(
            diagnose(&ec, &one, &both, None, &rescue),
            Some(Diagnosis::Rejoining(_))
        ));
        // Restarted without a leader: nothing to copy from, the rejoin goes on.
        rescue.copied.clear();
        let restarted = BTreeMap::from([(
            0,
            MemberStatus {
                metrics_only: true,
                ..status(120, 57)
            },
        )]);
        assert!(matches!(
            diagnose(&ec, &restarted, &both, None, &rescue),
            Some(Diagnosis::Rejoining(_))
        ));
        // Manual: the approval names the same plan, and the message says the copy comes first.
        ec.spec.recovery = Some(crate::api::v1::Recovery {
            quorum_loss: Some(QuorumLoss::Manual),
        });
        match diagnose(&ec, &one, &both, None, &rescue) {
            Some(Diagnosis::AwaitingApproval(m)) => assert!(
                m.contains("the loop would copy its data to s3://b/p/prod/ first, then let the empty members rejoin")
                    && m.contains(&format!("approve-recovery={plan} --overwrite")),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// Survivors all older than the newest snapshot, and every member that may hold data
    /// answering: every member's data is copied first, then the snapshot is restored in place
    /// (the plan names it); never without copies, from a snapshot that failed its
    /// verification, with a member that may hold data down, or without an approval in Manual.
    #[test]
    fn survivors_older_than_the_newest_snapshot_are_copied_then_it_is_restored_in_place() {
        let mut ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let uri = "s3://b/p/prod/etcd-6a3c1f9e-snapshot-20261206T030000Z.db";
        let verified = |ec: &mut EtcdCluster, outcome: &str| {
            ec.status = Some(crate::api::v1::EtcdClusterStatus {
                backup: Some(crate::api::v1::BackupStatus {
                    last_verified: Some(crate::api::v1::Verification {
                        uri: uri.to_owned(),
                        outcome: outcome.to_owned(),
                        message: "3 keys, the backup recorded 4".to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        };
        verified(&mut ec, "Verified");
        ec.metadata.annotations = Some(
            [(
                crate::controller::render::CLUSTER_ID_ANNOTATION.to_owned(),
                "8e9e05c52164694d".to_owned(),
            )]
            .into_iter()
            .collect(),
        );
        let one = BTreeMap::from([(0, status(120, 57))]);
        let both = BTreeMap::from([(1, lost()), (2, lost())]);
        let newer = SnapshotRecord {
            sha256: "ab".repeat(32),
            uri: uri.to_owned(),
            ..snapshot(80)
        };
        let plan = restore_plan(&newer);
        assert_eq!(plan, "restore-revision-80-sha256-abababababab");
        let mut rescue = Rescue {
            destination: Some("s3://b/p/prod/".to_owned()),
            ..Default::default()
        };
        let restoring = |d: Option<Diagnosis>| match d {
            Some(Diagnosis::Restoring {
                message,
                plan,
                copy,
                restore,
            }) => (message, plan, copy, restore),
            other => panic!("{other:?}"),
        };
        let (m, p, copy, restore) = restoring(diagnose(&ec, &one, &both, Some(&newer), &rescue));
        assert_eq!((p.as_str(), copy), (plan.as_str(), vec![0]));
        assert_eq!(
            restore,
            InPlace {
                from: uri.to_owned(),
                sha256: "ab".repeat(32),
                plan: plan.clone(),
                uid: "6a3c1f9e-0000-4000-8000-000000000001".to_owned(),
                cluster: "8e9e05c52164694d".to_owned(),
                copies: Vec::new(),
            }
        );
        assert!(
            m.contains(&format!("the newest snapshot ({uri}, revision 80) is newer than etcd-0's revision 57; the loop restores the newest snapshot in place: the data of etcd-0 is copied to s3://b/p/prod/ first, then the StatefulSet, the member pods and every member's volume are deleted and each member is restored from {uri} (revision 80, verified;"))
                && !m.contains("restore it instead")
                && m.ends_with("; etcd-0 being copied"),
            "{m}"
        );
        // A copy for another plan is no copy for this one; this plan's is.
        rescue
            .copied
            .insert((0, rejoin_plan("etcd-0", 120)), "s3://old".to_owned());
        let (_, _, copy, _) = restoring(diagnose(&ec, &one, &both, Some(&newer), &rescue));
        assert_eq!(copy, vec![0]);
        rescue
            .copied
            .insert((0, plan.clone()), "s3://b/p/prod/c.db".to_owned());
        let (m, _, copy, restore) = restoring(diagnose(&ec, &one, &both, Some(&newer), &rescue));
        assert!(copy.is_empty());
        assert_eq!(restore.copies, ["s3://b/p/prod/c.db"]);
        assert!(
            m.ends_with("etcd-0 copied to s3://b/p/prod/c.db, every copy filed: restoring"),
            "{m}"
        );
        // Two members with data (of five), both copied first.
        let mut ec5 = crate::controller::render::tests::cluster("etcd", 5, None);
        verified(&mut ec5, "Verified");
        let two = BTreeMap::from([(0, status(90, 40)), (3, status(130, 61))]);
        let lost3 = BTreeMap::from([(1, lost()), (2, lost()), (4, lost())]);
        let (_, _, copy, _) = restoring(diagnose(&ec5, &two, &lost3, Some(&newer), &rescue));
        assert_eq!(copy, vec![3], "etcd-0's copy for this plan is filed");
        // Never: with a member down that may hold data (etcd-4 has not run since) ...
        let three_lost = BTreeMap::from([(1, lost()), (2, lost()), (3, lost())]);
        assert!(matches!(
            diagnose(&ec5, &one, &three_lost, Some(&newer), &rescue),
            Some(Diagnosis::DataLost(_))
        ));
        // ... without a destination for the copies ...
        match diagnose(&ec, &one, &both, Some(&newer), &Rescue::default()) {
            Some(Diagnosis::DataLost(m)) => assert!(
                m.contains(
                    "restoring it in place would delete the volumes of etcd-0, and backups are off"
                ),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // ... from a member that restarted without a leader (it serves no snapshot) ...
        let restarted = BTreeMap::from([(
            0,
            MemberStatus {
                metrics_only: true,
                ..status(120, 57)
            },
        )]);
        rescue.copied.clear();
        match diagnose(&ec, &restarted, &both, Some(&newer), &rescue) {
            Some(Diagnosis::DataLost(m)) => {
                assert!(m.contains("etcd-0 restarted with no leader there"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // ... from a snapshot whose verification failed, was inconclusive or has not run ...
        let why = |ec: &EtcdCluster, newest: &SnapshotRecord| match diagnose(
            ec,
            &one,
            &both,
            Some(newest),
            &rescue,
        ) {
            Some(Diagnosis::DataLost(m)) => m,
            other => panic!("{other:?}"),
        };
        let mut other = ec.clone();
        verified(&mut other, "Failed");
        assert!(why(&other, &newer).contains("but its verification said Failed (3 keys, the backup recorded 4), so the loop does not restore it by itself; members on empty volumes"));
        verified(&mut other, "Inconclusive");
        assert!(why(&other, &newer).contains("but its verification said Inconclusive"));
        other.status = None;
        assert!(why(&other, &newer).contains("but it is not verified yet"));
        // ... from another cluster's snapshot (not named with this one's stem) ...
        let foreign = SnapshotRecord {
            uri: "s3://b/p/prod/etcd-0ld0ld00-snapshot-20261206T030000Z.db".to_owned(),
            ..newer.clone()
        };
        assert!(
            why(&ec, &foreign).contains(
                "but its name is not one of this cluster's snapshots (etcd-6a3c1f9e-...)"
            )
        );
        // ... or on a release whose restore cannot move the revision on.
        let mut old = ec.clone();
        old.spec.version = "v3.5.9".to_owned();
        assert!(why(&old, &newer).contains("but etcd v3.5.9 cannot move a restored cluster's revision past what its clients have seen"));
        // Manual: the restore plan is approved before anything is copied.
        ec.spec.recovery = Some(crate::api::v1::Recovery {
            quorum_loss: Some(QuorumLoss::Manual),
        });
        match diagnose(&ec, &one, &both, Some(&newer), &rescue) {
            Some(Diagnosis::AwaitingApproval(m)) => assert!(
                m.contains("spec.recovery.quorumLoss is Manual: with a restore the data of etcd-0 is copied")
                    && m.contains(&format!("approve-recovery={plan} --overwrite")),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        ec.metadata.annotations = Some(
            [(APPROVE_RECOVERY_ANNOTATION.to_owned(), plan.clone())]
                .into_iter()
                .collect(),
        );
        let (m, _, copy, _) = restoring(diagnose(&ec, &one, &both, Some(&newer), &rescue));
        assert_eq!(copy, vec![0]);
        assert!(
            m.contains(&format!("approved ({plan}): the loop restores")),
            "{m}"
        );
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
        match diag(&ec, &one, &both, None) {
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
        match diag(&ec, &one, &both, None) {
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
            diag(&ec, &one, &one_lost, None),
            Some(Diagnosis::Waiting(_))
        ));
        approve(&mut ec, &plan);
        match diag(&ec, &one, &both, None) {
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
            match diag(&ec, &one, &both, None) {
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
        let m = diag(&ec, &two, &lost3, None).unwrap();
        assert!(
            m.message().contains("the most applied data is etcd-3 (applied index 130, revision 61); there is no snapshot"),
            "{m:?}"
        );
    }

    /// Of five, two answer and three are known empty: the rebuild keeps the voter with the
    /// most applied data, copies the other's data first, then makes its volume anew; once it
    /// is known empty, the one kept is the sole survivor. Never without a destination to copy
    /// to, never from a learner, never with a member down that may hold data, never behind the
    /// newest snapshot; `Manual` waits for the same plan.
    #[test]
    fn a_rebuild_copies_the_other_survivors_before_their_volumes_are_made_anew() {
        let mut ec = crate::controller::render::tests::cluster("etcd", 5, None);
        let two = BTreeMap::from([(0, status(90, 40)), (3, status(130, 61))]);
        let lost3 = BTreeMap::from([(1, lost()), (2, lost()), (4, lost())]);
        let plan = "rejoin-from-etcd-3-at-130".to_owned();
        let mut rescue = Rescue {
            destination: Some("s3://b/p/prod/".to_owned()),
            ..Default::default()
        };
        let rebuilding = |d: Option<Diagnosis>| match d {
            Some(Diagnosis::Rebuilding {
                message,
                plan,
                copy,
                wipe,
            }) => (message, plan, copy, wipe),
            other => panic!("{other:?}"),
        };
        // 1. Copy etcd-0 first, and etcd-3, the one kept, too.
        let (m, p, copy, wipe) = rebuilding(diagnose(&ec, &two, &lost3, None, &rescue));
        assert_eq!(
            (p.as_str(), copy, wipe),
            (plan.as_str(), vec![0, 3], vec![])
        );
        assert!(
            m.contains("the rebuild keeps etcd-3: the data of etcd-0 (and of etcd-3, kept) is copied to s3://b/p/prod/ first, then their volumes are made anew")
                && m.contains("etcd-0 being copied, etcd-3 being copied"),
            "{m}"
        );
        // A failed copy is said, and tried again.
        rescue.failed.insert(0, "snapshot: refused".to_owned());
        let (m, _, copy, _) = rebuilding(diagnose(&ec, &two, &lost3, None, &rescue));
        assert_eq!(copy, vec![0, 3]);
        assert!(
            m.contains("the copy of etcd-0 failed (snapshot: refused) and is tried again"),
            "{m}"
        );
        // A copy for another plan (an earlier loss) is no copy of this data.
        rescue.failed.clear();
        rescue.copied.insert(
            (0, "rejoin-from-etcd-3-at-100".to_owned()),
            "s3://old".to_owned(),
        );
        assert_eq!(
            rebuilding(diagnose(&ec, &two, &lost3, None, &rescue)).2,
            vec![0, 3]
        );
        // 2. Copied: its volume is made anew (whether or not the one kept is copied yet).
        rescue.copied.insert(
            (0, plan.clone()),
            "s3://b/p/prod/etcd-rescue-etcd-0-x.db".to_owned(),
        );
        let (m, _, copy, wipe) = rebuilding(diagnose(&ec, &two, &lost3, None, &rescue));
        assert_eq!((copy, wipe), (vec![3], vec![0]));
        assert!(
            m.contains("etcd-0 copied to s3://b/p/prod/etcd-rescue-etcd-0-x.db")
                && m.contains("etcd-3 being copied"),
            "{m}"
        );
        // 3. Its new pod has not stopped at the fence yet: nothing to do, no lift.
        rescue.copied.insert(
            (3, plan.clone()),
            "s3://b/p/prod/etcd-rescue-etcd-3-x.db".to_owned(),
        );
        let one = BTreeMap::from([(3, status(130, 61))]);
        let (m, _, copy, wipe) = rebuilding(diagnose(&ec, &one, &lost3, None, &rescue));
        assert_eq!((copy, wipe), (vec![], vec![]));
        assert!(m.contains("etcd-0 starting on its new volume"), "{m}");
        // 4. Known empty: etcd-3 is the sole survivor, the empty members rejoin from it.
        let mut all_lost = lost3.clone();
        all_lost.insert(0, lost());
        assert!(matches!(
            diagnose(&ec, &one, &all_lost, None, &rescue),
            Some(Diagnosis::Rejoining(_))
        ));
        // Never: without a destination (nothing is deleted that was not copied) ...
        let none = Rescue::default();
        match diagnose(&ec, &two, &lost3, None, &none) {
            Some(Diagnosis::DataLost(m)) => assert!(
                m.contains("rebuilding from etcd-3 would make the volumes of etcd-0 anew, and backups are off (spec.backup), so their data cannot be copied first"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // ... with a member down that may hold data (of seven, etcd-6 has not run since) ...
        let ec7 = crate::controller::render::tests::cluster("etcd", 7, None);
        let four_lost = BTreeMap::from([(1, lost()), (2, lost()), (4, lost()), (5, lost())]);
        match diagnose(&ec7, &two, &four_lost, None, &rescue) {
            Some(Diagnosis::DataLost(m)) => assert!(m.contains(", etcd-6 are down"), "{m}"),
            other => panic!("{other:?}"),
        }
        // ... behind the newest snapshot (a restore in place instead, of one of this cluster's
        // verified snapshots: below) ...
        assert!(matches!(
            diagnose(&ec, &two, &lost3, Some(&snapshot(80)), &rescue),
            Some(Diagnosis::DataLost(_))
        ));
        // ... nor keeping a learner: what it holds was never voted for.
        let mut learner = two.clone();
        learner.get_mut(&3).unwrap().is_learner = true;
        rescue.copied.clear();
        let (_, p, copy, _) = rebuilding(diagnose(&ec, &learner, &lost3, None, &rescue));
        assert_eq!((p.as_str(), copy), ("rejoin-from-etcd-0-at-90", vec![0, 3]));
        // Manual: the same plan, approved before anything is copied.
        ec.spec.recovery = Some(crate::api::v1::Recovery {
            quorum_loss: Some(QuorumLoss::Manual),
        });
        match diagnose(&ec, &two, &lost3, None, &rescue) {
            Some(Diagnosis::AwaitingApproval(m)) => assert!(
                m.contains("with the rebuild the data of etcd-0 (and of etcd-3, kept) is copied to s3://b/p/prod/ first")
                    && m.contains("approve-recovery=rejoin-from-etcd-3-at-130 --overwrite"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        ec.metadata.annotations = Some(BTreeMap::from([(
            APPROVE_RECOVERY_ANNOTATION.to_owned(),
            plan.clone(),
        )]));
        let (m, _, copy, _) = rebuilding(diagnose(&ec, &two, &lost3, None, &rescue));
        assert_eq!(copy, vec![0, 3]);
        assert!(m.contains("approved (rejoin-from-etcd-3-at-130)"), "{m}");
    }

    /// A member that restarted while no leader was there serves no client, and the survey
    /// reads it from its metrics port (`MemberStatus::from_metrics`). As the sole survivor it is
    /// rejoined from like any other; in a rebuild it may be the one kept, but a copy of its
    /// data cannot be taken (etcd serves snapshots only with a leader): nothing is made anew.
    #[test]
    fn a_member_that_restarted_without_a_leader_is_seen_through_its_metrics() {
        let ec = crate::controller::render::tests::cluster("etcd", 5, None);
        let restarted = |applied, revision| MemberStatus {
            metrics_only: true,
            ..status(applied, revision)
        };
        let lost4 = BTreeMap::from([(1, lost()), (2, lost()), (3, lost()), (4, lost())]);
        let alone = BTreeMap::from([(0, restarted(90, 40))]);
        match diag(&ec, &alone, &lost4, None) {
            Some(Diagnosis::Rejoining(m)) => {
                assert!(
                    m.contains("etcd-0 is the only member with data (applied index 90"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        let rescue = Rescue {
            destination: Some("s3://b/p/prod/".to_owned()),
            ..Default::default()
        };
        let lost3 = BTreeMap::from([(1, lost()), (2, lost()), (4, lost())]);
        // Kept: the one that answers is copied, the restarted one is kept as it is.
        let kept = BTreeMap::from([(0, restarted(130, 61)), (3, status(90, 40))]);
        match diagnose(&ec, &kept, &lost3, None, &rescue) {
            Some(Diagnosis::Rebuilding { copy, message, .. }) => {
                assert_eq!(copy, vec![3]);
                assert!(
                    message.contains("etcd-0, restarted with no leader there and read from its metrics port, (applied index 130"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // On etcd 3.5 a reading may be a learner's (the gauge is not set at start there): never
        // the one kept, so here it would have to be copied, and nothing is.
        let mut old = restarted(130, 61);
        old.version = "3.5.36".to_owned();
        old.is_learner = true;
        let kept35 = BTreeMap::from([(0, old), (3, status(90, 40))]);
        match diagnose(&ec, &kept35, &lost3, None, &rescue) {
            Some(Diagnosis::DataLost(m)) => assert!(
                m.contains("etcd-0, perhaps a learner (etcd before 3.6")
                    && m.contains("rebuilding from etcd-3 would first copy the data of etcd-0"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // To be copied: it cannot be, so nothing is.
        let copied = BTreeMap::from([(0, restarted(90, 40)), (3, status(130, 61))]);
        match diagnose(&ec, &copied, &lost3, None, &rescue) {
            Some(Diagnosis::DataLost(m)) => assert!(
                m.contains(
                    "would first copy the data of etcd-0, and etcd-0 restarted with no leader there"
                ) && m.contains("the loop deletes nothing it has not copied"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
