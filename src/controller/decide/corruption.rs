//! A member whose data is not the others', decided from what etcd's own checks said and what
//! the members' hashes say.
//!
//! etcd finds corruption two ways (the loop turns both on, [`crate::controller::render`]): a
//! member that restarts compares its data with its peers' first and, when they differ, stops
//! with "found data inconsistency with peers" (the initial check); and the leader compares the
//! hashes every member recorded at each compaction and raises the CORRUPT alarm (the compact
//! hash check), which stops every write of the whole cluster until someone disarms it. The
//! alarm is not enough to act on: v3.5 raises it for member 0 ("some member"), and v3.6 and
//! v3.7 name the minority, which may be the leader itself. So before anything is replaced the
//! loop asks every voter for the hash of its data at one revision all of them have
//! (`maintenance/hashkv`) and replaces a member only when a majority of the voters agree and it
//! is not among them; the leader is never replaced, nor anything when no majority agrees: then
//! the loop stops and says why. After the member is removed (its data can no longer reach the
//! others), the alarm is disarmed, and the member joins again on a fresh volume as a learner.

use std::collections::{BTreeMap, BTreeSet};

pub use super::maintenance::CORRUPT;
use super::members::{Member, MemberStatus};
use super::observation::EtcdView;

/// What a member's log says when etcd's initial check found its data differs from its peers'
/// (v3.5 to v3.7, `server/etcdserver/corrupt.go`): it then exits.
pub const INITIAL_CHECK_SIGNS: &[&str] = &[
    "found data inconsistency with peers",
    "checkInitialHashKV failed",
];

/// Whether an exit's message is etcd's initial corruption check refusing the member's data.
pub fn failed_initial_check(message: &str) -> bool {
    INITIAL_CHECK_SIGNS.iter().any(|s| message.contains(s))
}

/// The member IDs the CORRUPT alarm names in the members' statuses (`memberID:123
/// alarm:CORRUPT`; 0 for the alarm v3.5 raises for no member in particular).
pub fn alarmed(health: &BTreeMap<u64, MemberStatus>) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for error in health.values().flat_map(|s| s.errors.iter()) {
        if !error.contains(&format!("alarm:{CORRUPT}")) {
            continue;
        }
        let id = error
            .split_whitespace()
            .find_map(|w| w.strip_prefix("memberID:"))
            .and_then(|id| id.parse().ok())
            .unwrap_or(0);
        out.insert(id);
    }
    out
}

/// A member's answer to `maintenance/hashkv` at one revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hash {
    pub hash: u64,
    /// -1 when the member has compacted nothing.
    pub compact_revision: i64,
}

/// What the loop does about corruption this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Remove this voter and make it anew: its data is not what a majority of the voters hold.
    Outlier { id: u64, why: String },
    /// CORRUPT is raised but nobody is to be replaced (the outlier is gone, or the voters agree):
    /// disarm these alarm entries.
    Disarm(Vec<u64>),
    /// Something is corrupt and the loop cannot tell what to do without guessing: the reason.
    Undecided(String),
}

/// A member as a person reads it: its name, or its hex ID.
fn named(m: &Member) -> String {
    if m.started() {
        m.name.clone()
    } else {
        format!("{:x}", m.id)
    }
}

/// The finding, if any: from the alarm entries etcd raised (`alarms`), the voters whose pod's
/// last run ended in the initial check's refusal (`refused_at_start`), and each voter's hash at
/// `revision` (`hashes`; read only while an alarm is raised).
pub fn judge(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    alarms: &BTreeSet<u64>,
    refused_at_start: &BTreeSet<u64>,
    hashes: &BTreeMap<u64, Hash>,
    revision: u64,
) -> Option<Finding> {
    let voters: Vec<&Member> = members.iter().filter(|m| !m.is_learner).collect();
    let leader = health.values().map(|s| s.leader).find(|&l| l != 0);
    if alarms.is_empty() {
        // A member its peers refused at start: it found itself different from them.
        let m = voters.iter().find(|m| refused_at_start.contains(&m.id))?;
        return Some(Finding::Outlier {
            id: m.id,
            why: format!(
                "{} stopped at start: etcd's initial check found its data differs from its peers'",
                named(m)
            ),
        });
    }
    // Group the voters that answered by what they hold at `revision`.
    let mut groups: BTreeMap<Hash, Vec<&Member>> = BTreeMap::new();
    for m in &voters {
        if let Some(h) = hashes.get(&m.id) {
            groups.entry(*h).or_default().push(m);
        }
    }
    let quorum = voters.len() / 2 + 1;
    let Some((agreed, majority)) = groups.iter().find(|(_, ms)| ms.len() >= quorum) else {
        let told: Vec<String> = groups
            .values()
            .map(|ms| ms.iter().map(|m| named(m)).collect::<Vec<_>>().join(" "))
            .collect();
        return Some(Finding::Undecided(format!(
            "etcd raised the CORRUPT alarm and no majority of the {} voters holds the same data at revision {revision} (the groups that agree: [{}]; {} did not answer): nothing is replaced; compare the members (etcdctl endpoint hashkv --cluster) and restore the cluster from a snapshot",
            voters.len(),
            told.join("], ["),
            voters.len() - groups.values().map(Vec::len).sum::<usize>()
        )));
    };
    // etcd compares hashes only between members that compacted at the same revision
    // (`corrupt.go`): one taken across a compaction the others had not applied yet says nothing.
    if groups
        .keys()
        .any(|h| h.compact_revision != agreed.compact_revision)
    {
        return Some(Finding::Undecided(format!(
            "etcd raised the CORRUPT alarm and the voters' hashes at revision {revision} were taken across a compaction: compared again on the next pass"
        )));
    }
    let outliers: Vec<&Member> = groups
        .iter()
        .filter(|(h, _)| *h != agreed)
        .flat_map(|(_, ms)| ms.iter().copied())
        .collect();
    let Some(outlier) = outliers.first() else {
        // Every voter that answered agrees: the alarm names a member that is gone, or is
        // v3.5's member 0 for a difference that no longer is.
        return Some(Finding::Disarm(alarms.iter().copied().collect()));
    };
    if Some(outlier.id) == leader {
        return Some(Finding::Undecided(format!(
            "etcd raised the CORRUPT alarm and the leader, {}, holds other data than the {} voters that agree at revision {revision} ({}): a leader is never replaced (its log is what the others follow); move the leadership to a member that agrees (etcdctl move-leader), then the loop replaces it",
            named(outlier),
            majority.len(),
            majority
                .iter()
                .map(|m| named(m))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Some(Finding::Outlier {
        id: outlier.id,
        why: format!(
            "{}'s data differs from what {} of the {} voters hold at revision {revision} ({}): etcd raised the CORRUPT alarm",
            named(outlier),
            majority.len(),
            voters.len(),
            majority
                .iter()
                .map(|m| named(m))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// The revision every voter that answered has applied (the hashes are compared there).
pub fn common_revision(view: &EtcdView) -> u64 {
    view.health
        .values()
        .map(|s| s.header.revision)
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, learner: bool) -> Member {
        Member {
            id,
            name: format!("e-{id}"),
            peer_urls: vec![],
            client_urls: vec![],
            is_learner: learner,
        }
    }

    fn status(leader: u64, errors: &[String]) -> MemberStatus {
        MemberStatus {
            leader,
            errors: errors.to_vec(),
            ..Default::default()
        }
    }

    fn corrupt(id: u64) -> String {
        format!("memberID:{id} alarm:CORRUPT ")
    }

    fn hashes(of: &[(u64, u64)]) -> BTreeMap<u64, Hash> {
        of.iter()
            .map(|&(id, hash)| {
                (
                    id,
                    Hash {
                        hash,
                        compact_revision: 7,
                    },
                )
            })
            .collect()
    }

    fn three() -> Vec<Member> {
        (1..=3).map(|i| member(i, false)).collect()
    }

    fn health(leader: u64, errors: &[String]) -> BTreeMap<u64, MemberStatus> {
        (1..=3).map(|i| (i, status(leader, errors))).collect()
    }

    #[test]
    fn the_alarm_names_members_or_nobody() {
        let h = health(1, &[corrupt(2), "memberID:3 alarm:NOSPACE ".to_owned()]);
        assert_eq!(alarmed(&h), BTreeSet::from([2]));
        let v35 = health(1, &["alarm:CORRUPT ".to_owned()]);
        assert_eq!(alarmed(&v35), BTreeSet::from([0]));
        assert!(alarmed(&health(1, &[])).is_empty());
    }

    /// A follower whose hash is not the majority's is replaced, whatever member the alarm
    /// names (v3.5 names member 0).
    #[test]
    fn a_follower_that_disagrees_with_the_majority_is_replaced() {
        let members = three();
        for alarm in [2, 0] {
            let found = judge(
                &members,
                &health(1, &[corrupt(alarm)]),
                &BTreeSet::from([alarm]),
                &BTreeSet::new(),
                &hashes(&[(1, 10), (2, 99), (3, 10)]),
                40,
            );
            match found {
                Some(Finding::Outlier { id: 2, why }) => {
                    assert!(
                        why.contains("e-2's data differs from what 2 of the 3 voters"),
                        "{why}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_leader_is_never_replaced_nor_anything_without_a_majority() {
        let members = three();
        let leader_differs = judge(
            &members,
            &health(2, &[corrupt(2)]),
            &BTreeSet::from([2]),
            &BTreeSet::new(),
            &hashes(&[(1, 10), (2, 99), (3, 10)]),
            40,
        );
        match leader_differs {
            Some(Finding::Undecided(why)) => assert!(why.contains("the leader, e-2"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Three different hashes, or two voters that did not answer.
        for h in [hashes(&[(1, 10), (2, 11), (3, 12)]), hashes(&[(1, 10)])] {
            match judge(
                &members,
                &health(1, &["alarm:CORRUPT ".to_owned()]),
                &BTreeSet::from([0]),
                &BTreeSet::new(),
                &h,
                40,
            ) {
                Some(Finding::Undecided(why)) => {
                    assert!(why.contains("no majority of the 3 voters"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// A hash taken after a compaction the others had not applied yet is not a difference.
    #[test]
    fn hashes_across_a_compaction_are_compared_again_not_acted_on() {
        let mut across = hashes(&[(1, 10), (2, 99), (3, 10)]);
        across.get_mut(&2).unwrap().compact_revision = 9;
        match judge(
            &three(),
            &health(1, &[corrupt(2)]),
            &BTreeSet::from([2]),
            &BTreeSet::new(),
            &across,
            40,
        ) {
            Some(Finding::Undecided(why)) => {
                assert!(why.contains("across a compaction"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// The outlier gone (or a difference that no longer is): the alarm entries are disarmed.
    #[test]
    fn an_alarm_the_voters_all_disagree_with_is_disarmed() {
        let members = vec![member(1, false), member(3, false), member(4, true)];
        let found = judge(
            &members,
            &health(1, &[corrupt(2)]),
            &BTreeSet::from([2, 0]),
            &BTreeSet::new(),
            &hashes(&[(1, 10), (3, 10), (4, 55)]),
            40,
        );
        assert_eq!(found, Some(Finding::Disarm(vec![0, 2])));
    }

    #[test]
    fn a_member_refused_at_start_by_the_initial_check_is_replaced() {
        let members = three();
        assert!(failed_initial_check(
            "{\"level\":\"fatal\",\"msg\":\"discovery failed\",\"error\":\"b3a9 found data inconsistency with peers\"}"
        ));
        let found = judge(
            &members,
            &health(1, &[]),
            &BTreeSet::new(),
            &BTreeSet::from([3]),
            &BTreeMap::new(),
            0,
        );
        assert!(
            matches!(found, Some(Finding::Outlier { id: 3, .. })),
            "{found:?}"
        );
        assert_eq!(
            judge(
                &members,
                &health(1, &[]),
                &BTreeSet::new(),
                &BTreeSet::new(),
                &BTreeMap::new(),
                0
            ),
            None
        );
    }
}
