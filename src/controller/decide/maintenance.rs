//! etcd's upkeep, the decision: a member whose backend has much space it could give back is
//! defragmented, and a cluster that ran out of quota (the `NOSPACE` alarm: every write
//! refused) is brought back: its history compacted, every member defragmented, the alarm
//! disarmed, or, when the data itself needs more than the quota, left read-only with the reason
//! (`QuotaExceeded`). No key is ever deleted.
//!
//! [`plan`] is pure, over the member list and each member's status the membership pass read
//! (no extra call while nothing is to be done); `etcd::maintenance::run` makes the calls and
//! `pass::maintenance::tend` is the loop's shell around both. A defragmentation blocks its
//! member while it runs, so members go one at a time, followers first and the leader last,
//! each only while every voter serves, never while the membership changes or an upgrade rolls;
//! the order and every gate are re-checked before each member.

use std::collections::BTreeMap;

use crate::controller::decide::members::{Member, MemberStatus};

/// The alarm etcd raises when a member's backend reaches the quota.
pub const NOSPACE: &str = "NOSPACE";
/// The alarm etcd raises when its corruption checks find a member whose data disagrees.
pub const CORRUPT: &str = "CORRUPT";

/// A recovery disarms only when the data in use leaves this share of the quota free, in
/// percent: with less, the data itself needs more than the quota (the alarm would come back
/// after a few writes), and the cluster stays read-only with the reason.
pub const DISARM_HEADROOM_PERCENT: u64 = 20;

/// Where a member is reached (`membership::client_url`), `None` for one with no client URL.
pub type Endpoint<'a> = &'a (dyn Fn(&Member) -> Option<String> + Sync);

/// What the rules are for one cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// `--quota-backend-bytes` the members run with.
    pub quota: u64,
    /// Defragment at this share of free space in a database (0: only to recover).
    pub threshold_percent: u8,
    /// And only when at least this much would be given back.
    pub min_free: u64,
}

impl Rules {
    pub fn of(spec: &crate::api::v1::EtcdClusterSpec) -> Rules {
        let m = spec.maintenance.as_ref();
        Rules {
            quota: u64::try_from(crate::api::quota_backend_bytes(spec)).unwrap_or(0),
            threshold_percent: m
                .and_then(|m| m.defrag_threshold_percent)
                .unwrap_or(crate::api::DEFRAG_THRESHOLD_PERCENT)
                .clamp(0, 99) as u8,
            min_free: crate::api::DEFRAG_MIN_FREE_BYTES as u64,
        }
    }
}

/// A member to defragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub id: u64,
    pub name: String,
    pub endpoint: String,
    pub leader: bool,
    /// `dbSize - dbSizeInUse` when planned.
    pub free: u64,
    /// `dbSize` when planned.
    pub db_size: u64,
}

/// What the upkeep does this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is due.
    Idle,
    /// Something is due but may not start now (the reason).
    Wait(String),
    /// Defragment these, in this order (followers first, the leader last).
    Defragment(Vec<Target>),
    /// NOSPACE: compact below `revision`, defragment every member in this order, then disarm
    /// (or report that the data needs more than the quota).
    Recover { revision: u64, order: Vec<Target> },
}

/// Why nothing may start, if anything stops it: a change under way (`busy`), a member that is
/// not a started voter, or a voter that does not serve (no leader, or an error other than an
/// alarm).
pub fn gate(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    busy: Option<&str>,
) -> Option<String> {
    if let Some(why) = busy {
        return Some(format!("{why} is under way"));
    }
    if let Some(m) = members
        .iter()
        .find(|m| health.get(&m.id).is_some_and(|s| s.alarm(CORRUPT)))
    {
        return Some(format!(
            "etcd raised the CORRUPT alarm on {}: no compaction or defragmentation runs until the member whose data differs is replaced and the alarm disarmed (the membership pass does both when a majority of the voters agree; the Members condition says what it waits for)",
            if m.name.is_empty() {
                format!("{:x}", m.id)
            } else {
                m.name.clone()
            }
        ));
    }
    if let Some(m) = members.iter().find(|m| m.is_learner || !m.started()) {
        return Some(format!(
            "member {} is not a started voter yet",
            if m.name.is_empty() {
                format!("{:x}", m.id)
            } else {
                m.name.clone()
            }
        ));
    }
    members
        .iter()
        .find(|m| !health.get(&m.id).is_some_and(MemberStatus::serving))
        .map(|m| format!("voter {} does not serve", m.name))
}

/// The members in the order they may be blocked: followers (most free space first), then the
/// leader.
fn order(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    endpoint: Endpoint<'_>,
    keep: &dyn Fn(&MemberStatus) -> bool,
) -> Vec<Target> {
    let mut out: Vec<Target> = members
        .iter()
        .filter_map(|m| {
            let s = health.get(&m.id)?;
            keep(s).then_some(())?;
            Some(Target {
                id: m.id,
                name: m.name.clone(),
                endpoint: endpoint(m)?,
                leader: s.leader == m.id,
                free: s.db_size.saturating_sub(s.db_size_in_use),
                db_size: s.db_size,
            })
        })
        .collect();
    out.sort_by(|a, b| a.leader.cmp(&b.leader).then(b.free.cmp(&a.free)));
    out
}

/// What is due, from the member list and statuses the membership pass read. `endpoint` gives
/// a member's client URL (by ordinal), `busy` names a change under way (a membership step, an
/// upgrade, a storage growth).
pub fn plan(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    rules: &Rules,
    busy: Option<&str>,
    endpoint: Endpoint<'_>,
) -> Plan {
    let nospace = health.values().any(|s| s.alarm(NOSPACE));
    let due = |s: &MemberStatus| {
        let free = s.db_size.saturating_sub(s.db_size_in_use);
        rules.threshold_percent > 0
            && free >= rules.min_free
            && free.saturating_mul(100) >= s.db_size.saturating_mul(rules.threshold_percent as u64)
    };
    if !nospace && !health.values().any(due) {
        return Plan::Idle;
    }
    if let Some(why) = gate(members, health, busy) {
        return Plan::Wait(why);
    }
    if nospace {
        // The lowest revision any member has applied: a revision every member has.
        let revision = health
            .values()
            .map(|s| s.header.revision)
            .min()
            .unwrap_or(0);
        return Plan::Recover {
            revision,
            order: order(members, health, endpoint, &|_| true),
        };
    }
    Plan::Defragment(order(members, health, endpoint, &due))
}

/// After a recovery's compaction and defragmentations: disarm when the data in use leaves
/// [`DISARM_HEADROOM_PERCENT`] of the quota free, else the largest use (the data needs more
/// than the quota).
pub fn may_disarm<'a>(
    statuses: impl IntoIterator<Item = &'a MemberStatus>,
    quota: u64,
) -> Result<(), u64> {
    let in_use = statuses
        .into_iter()
        .map(|s| s.db_size_in_use)
        .max()
        .unwrap_or(0);
    if in_use.saturating_mul(100) <= quota.saturating_mul(100 - DISARM_HEADROOM_PERCENT) {
        Ok(())
    } else {
        Err(in_use)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MIB: u64 = 1 << 20;

    pub(crate) fn member(id: u64, name: &str) -> Member {
        Member {
            id,
            name: name.to_owned(),
            peer_urls: vec![format!("http://{name}:2380")],
            client_urls: vec![format!("http://{name}:2379")],
            is_learner: false,
        }
    }

    pub(crate) fn status(leader: u64, size: u64, in_use: u64, errors: &[&str]) -> MemberStatus {
        MemberStatus {
            leader,
            db_size: size,
            db_size_in_use: in_use,
            errors: errors.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        }
    }

    pub(crate) fn url(m: &Member) -> Option<String> {
        m.client_urls.first().cloned()
    }

    pub(crate) const RULES: Rules = Rules {
        quota: 16 * MIB,
        threshold_percent: 50,
        min_free: MIB,
    };

    pub(crate) fn three() -> Vec<Member> {
        vec![member(1, "e-0"), member(2, "e-1"), member(3, "e-2")]
    }

    fn names(plan: &Plan) -> Vec<String> {
        match plan {
            Plan::Defragment(o) | Plan::Recover { order: o, .. } => {
                o.iter().map(|t| t.name.clone()).collect()
            }
            _ => vec![],
        }
    }

    #[test]
    fn a_fragmented_member_is_due_past_the_threshold_and_a_mebibyte() {
        let members = three();
        let health = |sizes: [(u64, u64); 3]| -> BTreeMap<u64, MemberStatus> {
            (1..=3)
                .map(|id| {
                    (
                        id,
                        status(2, sizes[id as usize - 1].0, sizes[id as usize - 1].1, &[]),
                    )
                })
                .collect()
        };
        // Below the threshold, or above it with less than 1 MiB to give back: nothing.
        let quiet = health([(10 * MIB, 6 * MIB), (MIB, MIB / 4), (8 * MIB, 8 * MIB)]);
        assert_eq!(plan(&members, &quiet, &RULES, None, &url), Plan::Idle);
        // Two due: the follower e-0, then the leader e-1 last although it frees more.
        let due = health([(10 * MIB, 4 * MIB), (20 * MIB, 2 * MIB), (8 * MIB, 7 * MIB)]);
        let p = plan(&members, &due, &RULES, None, &url);
        assert_eq!(names(&p), ["e-0", "e-1"]);
        // A threshold of 0 never defragments.
        let off = Rules {
            threshold_percent: 0,
            ..RULES
        };
        assert_eq!(plan(&members, &due, &off, None, &url), Plan::Idle);
    }

    #[test]
    fn nothing_starts_during_a_change_with_a_voter_down_or_a_learner() {
        let members = three();
        let due: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(2, 10 * MIB, MIB, &[])))
            .collect();
        let wait = |p: Plan| match p {
            Plan::Wait(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(
            wait(plan(&members, &due, &RULES, Some("an upgrade"), &url)).contains("an upgrade")
        );
        let mut down = due.clone();
        down.remove(&3);
        assert_eq!(
            wait(plan(&members, &down, &RULES, None, &url)),
            "voter e-2 does not serve"
        );
        let mut leaderless = due.clone();
        leaderless.insert(3, status(0, 10 * MIB, MIB, &[]));
        assert!(matches!(
            plan(&members, &leaderless, &RULES, None, &url),
            Plan::Wait(_)
        ));
        let mut with_learner = members.clone();
        with_learner[2].is_learner = true;
        assert!(
            wait(plan(&with_learner, &due, &RULES, None, &url))
                .contains("e-2 is not a started voter")
        );
    }

    /// A CORRUPT alarm is no alarm to work around: nothing is compacted or defragmented while
    /// it is raised, NOSPACE beside it or not, and the wait names the member.
    #[test]
    fn a_corrupt_alarm_stops_every_maintenance() {
        let members = three();
        let corrupt = "memberID:2 alarm:CORRUPT ";
        let mut health: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(3, 10 * MIB, MIB, &[])))
            .collect();
        health.insert(2, status(3, 10 * MIB, MIB, &[corrupt]));
        assert!(!health[&2].serving());
        let wait = |p: Plan| match p {
            Plan::Wait(why) => why,
            other => panic!("{other:?}"),
        };
        let why = wait(plan(&members, &health, &RULES, None, &url));
        assert!(why.contains("CORRUPT alarm on e-1"), "{why}");
        health.insert(
            3,
            status(3, 16 * MIB, 15 * MIB, &["memberID:3 alarm:NOSPACE "]),
        );
        assert!(health[&3].serving(), "NOSPACE alone still serves");
        let why = wait(plan(&members, &health, &RULES, None, &url));
        assert!(why.contains("CORRUPT"), "{why}");
    }

    #[test]
    fn nospace_recovers_every_member_leader_last_and_disarms_only_with_room() {
        let members = three();
        let alarm = "memberID:1 alarm:NOSPACE ";
        let mut health: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(3, 16 * MIB, 15 * MIB, &[alarm])))
            .collect();
        for (id, s) in health.iter_mut() {
            s.header.revision = 100 + id;
        }
        // The alarm makes no member unhealthy for the upkeep, and even a threshold of 0 recovers.
        let off = Rules {
            threshold_percent: 0,
            ..RULES
        };
        match plan(&members, &health, &off, None, &url) {
            Plan::Recover { revision, order } => {
                assert_eq!(revision, 101);
                let names: Vec<&str> = order.iter().map(|t| t.name.as_str()).collect();
                assert_eq!(names, ["e-0", "e-1", "e-2"]);
                assert!(order[2].leader);
            }
            other => panic!("{other:?}"),
        }
        // Disarmed only when the data leaves 5% of the quota free.
        let s = |in_use| vec![status(3, in_use, in_use, &[])];
        assert_eq!(may_disarm(&s(4 * MIB), 16 * MIB), Ok(()));
        assert_eq!(
            may_disarm(&s(16 * MIB - MIB / 2), 16 * MIB),
            Err(16 * MIB - MIB / 2)
        );
    }
}
