//! Membership, decided from etcd's own member list on every pass, one call at a time, so any
//! pass can be repeated or cut short (the controller killed between two calls) without a
//! duplicate member or a stuck cluster:
//!
//! 1. a member whose pod reports a lost volume is removed (if the others keep a quorum); the
//!    next pass adds it back as a learner and its pod, restarting, joins as `existing`;
//! 2. a member added but never started is removed after `--member-join-timeout`;
//! 3. a started learner is promoted (etcd refuses until it has caught up: then we wait);
//! 4. with every voter healthy and fewer members than `spec.size`, the lowest free ordinal is
//!    added **as a learner**; the StatefulSet then runs a pod for it.
//!
//! [`plan`] is that decision, a pure function; [`pass`] reads, plans, makes the one call and
//! says what the StatefulSet and the members' ConfigMap must be. A member at an ordinal the
//! StatefulSet does not run (a volume of a former, larger cluster) is never touched: it is
//! reported.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::etcd::{Etcd, EtcdError, Member, MemberStatus};
use super::render;
use crate::api::MAX_SIZE;
use crate::api::v1::EtcdCluster;

/// The default of `--member-join-timeout`.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Lines of an etcd log that mean its data directory is gone while the cluster still has the
/// member: bootstrapping anew over a known member, or a raft log that starts from nothing.
pub const LOST_VOLUME_SIGNS: &[&str] = &["has already been bootstrapped", "[lastIndex(0)]"];

/// Whether a container's last termination message (the tail of its log, with
/// `terminationMessagePolicy: FallbackToLogsOnError`) says the member lost its volume.
pub fn lost_volume(message: &str) -> bool {
    LOST_VOLUME_SIGNS.iter().any(|s| message.contains(s))
}

/// The ordinal of the StatefulSet pod a member is, from its peer URL (or, unstarted members
/// aside, its name).
pub fn ordinal(ec: &EtcdCluster, m: &Member) -> Option<i32> {
    let name = ec.name_any();
    (0..MAX_SIZE).find(|&i| {
        m.peer_urls.contains(&render::peer_url(ec, i)) || m.name == format!("{name}-{i}")
    })
}

/// Why a member is removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Added, but no pod started it within the join timeout.
    NeverStarted(Duration),
    /// Its pod lost its data directory.
    LostVolume,
}

/// The one membership call of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Membership matches the spec.
    Steady,
    /// Nothing to call now (a pod starting, a learner catching up, a voter unhealthy).
    Wait(String),
    AddLearner {
        ordinal: i32,
    },
    Promote {
        ordinal: i32,
        id: u64,
    },
    Remove {
        ordinal: i32,
        id: u64,
        why: Removal,
    },
    /// Not an etcd call: the member at `ordinal` was removed for its lost volume; its claim and
    /// pod are deleted so that the StatefulSet makes both anew, empty (the old volume names the
    /// removed member, which etcd refuses). Only then is it added again.
    ReplaceVolume {
        ordinal: i32,
    },
}

/// What the loop keeps between passes (in the members' ConfigMap): when each non-voter was
/// first seen, and the ordinals whose volume is to be replaced (recorded before the member is
/// removed, so a loop killed right after the removal still replaces the volume).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub joining: BTreeMap<u64, Timestamp>,
    pub replacing: BTreeSet<i32>,
}

/// What a pass knows.
pub struct View<'a> {
    pub members: &'a [Member],
    /// Health of the started members, by ID (a member that did not answer is absent).
    pub health: &'a BTreeMap<u64, MemberStatus>,
    /// Ordinals whose pod reports a lost volume ([`lost_volume`]).
    pub lost_volume: &'a BTreeSet<i32>,
    /// When each non-voter was first seen.
    pub joining: &'a BTreeMap<u64, Timestamp>,
    /// Ordinals whose volume is to be replaced ([`Memory::replacing`]).
    pub replacing: &'a BTreeSet<i32>,
    pub now: Timestamp,
    pub join_timeout: Duration,
}

fn healthy(view: &View, m: &Member) -> bool {
    view.health.get(&m.id).is_some_and(MemberStatus::healthy)
}

/// The next membership call of `ec` (see the module's order).
pub fn plan(ec: &EtcdCluster, view: &View) -> Step {
    let want = ec.spec.size;
    let ours: Vec<(i32, &Member)> = view
        .members
        .iter()
        .filter_map(|m| Some((ordinal(ec, m)?, m)))
        .filter(|(i, _)| *i < want)
        .collect();
    let voters: Vec<&Member> = ours
        .iter()
        .map(|(_, m)| *m)
        .filter(|m| !m.is_learner)
        .collect();
    let healthy_voters = voters.iter().filter(|m| healthy(view, m)).count();

    let taken: BTreeSet<i32> = ours.iter().map(|(i, _)| *i).collect();
    if let Some(&ordinal) = view.replacing.iter().find(|i| !taken.contains(i)) {
        return Step::ReplaceVolume { ordinal };
    }
    for &(i, m) in &ours {
        if view.lost_volume.contains(&i) && m.started() {
            // Removing a voter leaves `voters - 1`, whose quorum the healthy others must hold.
            let others = healthy_voters - usize::from(healthy(view, m));
            let after = voters.len() - usize::from(!m.is_learner);
            if m.is_learner || (after > 0 && others > after / 2) {
                return Step::Remove {
                    ordinal: i,
                    id: m.id,
                    why: Removal::LostVolume,
                };
            }
            return Step::Wait(format!(
                "{} lost its volume; removing it needs a quorum of the others ({others} of {after} healthy)",
                m.name
            ));
        }
    }
    for &(i, m) in &ours {
        if m.started() {
            continue;
        }
        let since = view.joining.get(&m.id).copied().unwrap_or(view.now);
        let waited = view.now.duration_since(since);
        let waited = Duration::try_from(waited).unwrap_or_default();
        if waited >= view.join_timeout {
            return Step::Remove {
                ordinal: i,
                id: m.id,
                why: Removal::NeverStarted(waited),
            };
        }
        return Step::Wait(format!(
            "{}-{i} was added {}s ago and has not started (removed after {}s)",
            ec.name_any(),
            waited.as_secs(),
            view.join_timeout.as_secs()
        ));
    }
    if let Some(&(i, m)) = ours.iter().find(|(_, m)| m.is_learner) {
        return Step::Promote {
            ordinal: i,
            id: m.id,
        };
    }
    if ours.len() < want as usize {
        if healthy_voters < voters.len() {
            return Step::Wait(format!(
                "{healthy_voters} of {} voters healthy; a member is added when all are",
                voters.len()
            ));
        }
        let taken: BTreeSet<i32> = ours.iter().map(|(i, _)| *i).collect();
        let ordinal = (0..want)
            .find(|i| !taken.contains(i))
            .expect("fewer than want");
        return Step::AddLearner { ordinal };
    }
    Step::Steady
}

/// Pods the StatefulSet runs for `members`: up to the highest ordinal with a member.
pub fn replicas(ec: &EtcdCluster, members: &[Member]) -> i32 {
    members
        .iter()
        .filter_map(|m| ordinal(ec, m))
        .filter(|&i| i < ec.spec.size)
        .max()
        .map_or(1, |i| i + 1)
}

/// Members at ordinals at or above `spec.size`: the membership of a former, larger cluster
/// whose volumes a re-created cluster found (or members added by hand).
/// In ordinal order (then by ID), so a status naming them is stable.
pub fn strangers<'m>(ec: &EtcdCluster, members: &'m [Member]) -> Vec<&'m Member> {
    let mut out: Vec<&Member> = members
        .iter()
        .filter(|m| ordinal(ec, m).is_none_or(|i| i >= ec.spec.size))
        .collect();
    out.sort_by_key(|m| (ordinal(ec, m).unwrap_or(MAX_SIZE), m.id));
    out
}

/// `ETCD_INITIAL_CLUSTER` for a pod joining `members`: every member of ours, by ordinal.
pub fn initial_cluster(ec: &EtcdCluster, members: &[Member]) -> String {
    let name = ec.name_any();
    let mut ours: Vec<i32> = members
        .iter()
        .filter_map(|m| ordinal(ec, m))
        .filter(|&i| i < ec.spec.size)
        .collect();
    ours.sort_unstable();
    ours.dedup();
    ours.iter()
        .map(|&i| format!("{name}-{i}={}", render::peer_url(ec, i)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What one pass found and did.
#[derive(Debug)]
pub struct Outcome {
    /// The member list after the pass's call (`None`: no member answered).
    pub members: Option<Vec<Member>>,
    pub health: BTreeMap<u64, MemberStatus>,
    /// What to keep for the next pass (in the members' ConfigMap).
    pub memory: Memory,
    pub step: Step,
    /// The call's error, if the step was a call and it failed.
    pub failed: Option<EtcdError>,
    /// Why the member list could not be read.
    pub unreachable: Option<EtcdError>,
}

/// Reads the member list and each started member's status, plans, and makes at most one call.
/// `etcd.endpoints` are the members' client URLs by ordinal. Before a member is removed for its
/// lost volume, `record` must keep the memory with that ordinal in `replacing` (an error there
/// cancels the removal).
pub async fn pass<R>(
    ec: &EtcdCluster,
    etcd: &Etcd<'_>,
    lost: &BTreeSet<i32>,
    before: &Memory,
    now: Timestamp,
    join_timeout: Duration,
    record: R,
) -> Outcome
where
    R: AsyncFnOnce(&Memory) -> Result<(), String>,
{
    let (endpoint, mut members) = match etcd.member_list().await {
        Ok(found) => found,
        Err(e) => {
            return Outcome {
                members: None,
                health: BTreeMap::new(),
                memory: before.clone(),
                step: Step::Wait(format!("no member answered member list: {e}")),
                failed: None,
                unreachable: Some(e),
            };
        }
    };
    // Every started member's status, at once.
    let asks = members.iter().filter(|m| m.started()).filter_map(|m| {
        let url = ordinal(ec, m).and_then(|i| etcd.endpoints.get(i as usize))?;
        Some(async move { (m.id, etcd.status(url).await) })
    });
    let health: BTreeMap<u64, MemberStatus> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter_map(|(id, status)| Some((id, status.ok()?)))
        .collect();
    let mut memory = Memory {
        joining: joining_of(&members, &before.joining, now),
        replacing: before.replacing.clone(),
    };
    let mut step = plan(
        ec,
        &View {
            members: &members,
            health: &health,
            lost_volume: lost,
            joining: &memory.joining,
            replacing: &memory.replacing,
            now,
            join_timeout,
        },
    );
    if let Step::Remove {
        ordinal,
        why: Removal::LostVolume,
        ..
    } = step
    {
        memory.replacing.insert(ordinal);
        if let Err(e) = record(&memory).await {
            memory.replacing.remove(&ordinal);
            step = Step::Wait(format!(
                "{}-{ordinal} is not removed: its volume replacement could not be recorded: {e}",
                ec.name_any()
            ));
        }
    }
    let result = match &step {
        Step::AddLearner { ordinal } => etcd
            .add_learner(&endpoint, &render::peer_url(ec, *ordinal))
            .await
            .map(|(_, after)| after),
        Step::Promote { id, .. } => etcd.promote(&endpoint, *id).await,
        Step::Remove { id, .. } => etcd.remove(&endpoint, *id).await,
        Step::Steady | Step::Wait(_) | Step::ReplaceVolume { .. } => Ok(members.clone()),
    };
    let failed = match result {
        Ok(after) => {
            members = after;
            memory.joining = joining_of(&members, &memory.joining, now);
            None
        }
        Err(e) => Some(e),
    };
    Outcome {
        members: Some(members),
        health,
        memory,
        step,
        failed,
        unreachable: None,
    }
}

/// The ordinal whose claim and pod are to be deleted after this pass: a member just removed
/// for its lost volume, or one recorded as such by a pass that did not get that far.
pub fn volume_to_replace(outcome: &Outcome) -> Option<i32> {
    match (&outcome.step, &outcome.failed) {
        (
            Step::Remove {
                ordinal,
                why: Removal::LostVolume,
                ..
            },
            None,
        )
        | (Step::ReplaceVolume { ordinal }, _) => Some(*ordinal),
        _ => None,
    }
}

/// When each current non-voter was first seen: as before, or now.
fn joining_of(
    members: &[Member],
    before: &BTreeMap<u64, Timestamp>,
    now: Timestamp,
) -> BTreeMap<u64, Timestamp> {
    members
        .iter()
        .filter(|m| m.is_learner || !m.started())
        .map(|m| (m.id, before.get(&m.id).copied().unwrap_or(now)))
        .collect()
}

/// The ConfigMap annotation that keeps [`Outcome::joining`]: `ID=RFC3339,...`.
pub fn joining_annotation(joining: &BTreeMap<u64, Timestamp>) -> String {
    joining
        .iter()
        .map(|(id, at)| format!("{id:x}={at}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The ConfigMap annotation that keeps [`Memory::replacing`]: `1,3`.
pub fn replacing_annotation(replacing: &BTreeSet<i32>) -> String {
    replacing
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub fn parse_replacing(text: &str) -> BTreeSet<i32> {
    text.split(',').filter_map(|i| i.parse().ok()).collect()
}

pub fn parse_joining(text: &str) -> BTreeMap<u64, Timestamp> {
    text.split(',')
        .filter_map(|kv| {
            let (id, at) = kv.split_once('=')?;
            Some((u64::from_str_radix(id, 16).ok()?, at.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::render::tests::cluster;

    fn member(ec: &EtcdCluster, i: i32, started: bool, learner: bool) -> Member {
        Member {
            id: 100 + i as u64,
            name: if started {
                format!("{}-{i}", ec.name_any())
            } else {
                String::new()
            },
            peer_urls: vec![render::peer_url(ec, i)],
            client_urls: vec![],
            is_learner: learner,
        }
    }

    fn healthy_all(members: &[Member]) -> BTreeMap<u64, MemberStatus> {
        members
            .iter()
            .filter(|m| m.started())
            .map(|m| {
                (
                    m.id,
                    MemberStatus {
                        leader: 100,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn decide(ec: &EtcdCluster, members: &[Member], lost: &[i32], since: i64, now: i64) -> Step {
        let health = healthy_all(members);
        let joining = members
            .iter()
            .filter(|m| m.is_learner || !m.started())
            .map(|m| (m.id, at(since)))
            .collect();
        plan(
            ec,
            &View {
                members,
                health: &health,
                lost_volume: &lost.iter().copied().collect(),
                joining: &joining,
                replacing: &BTreeSet::new(),
                now: at(now),
                join_timeout: Duration::from_secs(300),
            },
        )
    }

    #[test]
    fn grows_one_learner_at_a_time_and_promotes_it_once_started() {
        let ec = cluster("etcd", 3, None);
        let one = vec![member(&ec, 0, true, false)];
        assert_eq!(
            decide(&ec, &one, &[], 0, 0),
            Step::AddLearner { ordinal: 1 }
        );
        let mut two = one.clone();
        two.push(member(&ec, 1, false, true));
        // Added, pod not started: wait (never a second add).
        assert!(matches!(decide(&ec, &two, &[], 0, 10), Step::Wait(_)));
        assert_eq!(replicas(&ec, &two), 2);
        two[1].name = "etcd-1".to_owned();
        assert_eq!(
            decide(&ec, &two, &[], 0, 10),
            Step::Promote {
                ordinal: 1,
                id: 101
            }
        );
        two[1].is_learner = false;
        assert_eq!(
            decide(&ec, &two, &[], 0, 10),
            Step::AddLearner { ordinal: 2 }
        );
        let three: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        assert_eq!(decide(&ec, &three, &[], 0, 10), Step::Steady);
        assert_eq!(
            initial_cluster(&ec, &three),
            "etcd-0=http://etcd-0.etcd.prod.svc:2380,etcd-1=http://etcd-1.etcd.prod.svc:2380,etcd-2=http://etcd-2.etcd.prod.svc:2380"
        );
    }

    #[test]
    fn a_member_that_never_starts_is_removed_after_the_timeout() {
        let ec = cluster("etcd", 3, None);
        let members = vec![member(&ec, 0, true, false), member(&ec, 1, false, true)];
        assert!(matches!(decide(&ec, &members, &[], 0, 299), Step::Wait(_)));
        assert_eq!(
            decide(&ec, &members, &[], 0, 300),
            Step::Remove {
                ordinal: 1,
                id: 101,
                why: Removal::NeverStarted(Duration::from_secs(300))
            }
        );
    }

    #[test]
    fn no_add_while_a_voter_is_unhealthy() {
        let ec = cluster("etcd", 5, None);
        let members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        let mut health = healthy_all(&members);
        health.remove(&102);
        let step = plan(
            &ec,
            &View {
                members: &members,
                health: &health,
                lost_volume: &BTreeSet::new(),
                joining: &BTreeMap::new(),
                replacing: &BTreeSet::new(),
                now: at(0),
                join_timeout: DEFAULT_JOIN_TIMEOUT,
            },
        );
        assert!(
            matches!(step, Step::Wait(ref m) if m.contains("2 of 3 voters")),
            "{step:?}"
        );
    }

    #[test]
    fn a_lost_volume_is_removed_then_re_added_at_its_ordinal_only_with_a_quorum() {
        let ec = cluster("etcd", 3, None);
        let mut members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        let mut health = healthy_all(&members);
        health.remove(&101);
        let view = |members: &[Member], health: &BTreeMap<u64, MemberStatus>| {
            plan(
                &ec,
                &View {
                    members,
                    health,
                    lost_volume: &BTreeSet::from([1]),
                    joining: &BTreeMap::new(),
                    replacing: &BTreeSet::new(),
                    now: at(0),
                    join_timeout: DEFAULT_JOIN_TIMEOUT,
                },
            )
        };
        assert_eq!(
            view(&members, &health),
            Step::Remove {
                ordinal: 1,
                id: 101,
                why: Removal::LostVolume
            }
        );
        // Without a quorum of the others (only 1 of the 2 left healthy): wait.
        health.remove(&102);
        assert!(matches!(view(&members, &health), Step::Wait(_)));
        // Removed: the hole is filled first, at the same ordinal; the pod keeps its place.
        members.remove(1);
        assert_eq!(replicas(&ec, &members), 3);
        assert_eq!(
            decide(&ec, &members, &[], 0, 0),
            Step::AddLearner { ordinal: 1 }
        );
        // A single member that lost its volume cannot be saved by membership.
        let one = cluster("solo", 1, None);
        let m = vec![member(&one, 0, true, false)];
        assert!(matches!(decide(&one, &m, &[0], 0, 0), Step::Wait(_)));
    }

    #[test]
    fn members_of_a_former_larger_cluster_are_strangers_and_never_touched() {
        let ec = cluster("etcd", 3, None);
        let members: Vec<Member> = (0..5).map(|i| member(&ec, i, true, false)).collect();
        assert_eq!(decide(&ec, &members, &[], 0, 0), Step::Steady);
        let names: Vec<&str> = strangers(&ec, &members)
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, ["etcd-3", "etcd-4"]);
        assert_eq!(replicas(&ec, &members), 3);
    }

    #[test]
    fn lost_volume_signs_and_the_joining_annotation() {
        assert!(lost_volume(
            "panic: tocommit(105) is out of range [lastIndex(0)]. Was the raft log corrupted, truncated, or lost?"
        ));
        assert!(lost_volume(
            r#"{"msg":"discovery failed","error":"member 8e9e05c52164694d has already been bootstrapped"}"#
        ));
        assert!(!lost_volume(
            "the member has been permanently removed from the cluster"
        ));
        let joining = BTreeMap::from([(0xabcu64, at(5)), (7, at(9))]);
        assert_eq!(parse_joining(&joining_annotation(&joining)), joining);
        assert!(parse_joining("").is_empty());
        let replacing = BTreeSet::from([1, 3]);
        assert_eq!(
            parse_replacing(&replacing_annotation(&replacing)),
            replacing
        );
        assert!(parse_replacing("").is_empty());
    }
}
