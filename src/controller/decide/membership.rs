//! Membership, decided from etcd's own member list on every pass, one call at a time, so any
//! pass can be repeated or cut short (the controller killed between two calls) without a
//! duplicate member or a stuck cluster:
//!
//! 1. a volume recorded for replacement whose member is gone is replaced (claim and pod made
//!    anew, empty); so is the volume at an ordinal the member list does not have, when its
//!    pod's etcd still answers as a member ID the list does not have, or stopped by itself
//!    (exit 0: etcd does that when its peers say its member ID was removed, e.g. by `etcdctl
//!    member remove`): that volume names a member that is no more;
//! 2. a started member whose pod reports a lost volume is removed (if the others keep a
//!    quorum);
//! 3. a member added but never started is removed when its pod's etcd stopped by itself after
//!    the add (its volume names another, removed member), or after `--member-join-timeout`;
//! 4. a started learner is promoted when every voter is healthy (etcd refuses until it has
//!    caught up: then we wait), or removed when it has not caught up within
//!    `--member-promote-timeout`;
//! 5. with every voter healthy and fewer members than `spec.size`, the lowest free ordinal is
//!    added **as a learner**; the StatefulSet then runs a pod for it.
//!
//! Every removal replaces the member's volume (recorded before the call, so a loop killed
//! right after it still does): a removed member's data names an ID the cluster no longer has,
//! and etcd refuses it, so the member always comes back on an empty volume.
//!
//! [`plan`] is that decision, a pure function; `etcd::membership::pass` reads, plans, makes
//! the one call and says what the StatefulSet and the members' ConfigMap must be. A member the spec does not run
//! (an ordinal at or above `spec.size`, or a peer URL of no ordinal: added by hand) is never
//! touched: it is reported, counted in the quorum when it votes, and kept in the join list.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::corruption::Finding;
use super::exits::Exit;
use super::memory::Memory;
use crate::api::MAX_SIZE;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::members::{Member, MemberStatus};
use crate::controller::render;

/// The default of `--member-join-timeout`.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);
/// The default of `--member-promote-timeout`.
pub const DEFAULT_PROMOTE_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a member is asked: its pod's client URL among `endpoints` (by ordinal), else (a
/// member the cluster has no ordinal for: added by hand, a former cluster's) the client URL it
/// advertises, so that it is asked, maintained and recovered like the others rather than
/// holding every maintenance as a voter that "does not serve".
pub fn client_url<'a>(ec: &EtcdCluster, endpoints: &'a [String], m: &'a Member) -> Option<&'a str> {
    match ordinal(ec, m) {
        Some(i) => endpoints.get(i as usize).map(String::as_str),
        None => m.client_urls.first().map(String::as_str),
    }
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
    /// Added, but its pod's etcd stopped by itself (exit 0) after the add: the volume names a
    /// member ID that was removed.
    StaleVolume,
    /// Its data is not what the others hold (etcd's corruption checks; the reason).
    Corrupt(String),
    /// A learner that started but did not catch up with its leader within the promote timeout.
    NeverCaughtUp {
        waited: Duration,
        /// Its raft index, and its leader's (0: did not answer).
        index: u64,
        leader_index: u64,
    },
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
    /// Not an etcd call: the volume at `ordinal` names no current member (its member was
    /// removed); its claim and pod are deleted so that the StatefulSet makes both anew, empty.
    /// Only then is a member added there.
    ReplaceVolume {
        ordinal: i32,
    },
    /// Disarm the CORRUPT alarm entries of these member IDs (the corrupt member is gone, or the
    /// voters agree): writes are taken again.
    Disarm {
        ids: Vec<u64>,
    },
}

/// How long a member may take to start, and a started learner to catch up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub join: Duration,
    pub promote: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            join: DEFAULT_JOIN_TIMEOUT,
            promote: DEFAULT_PROMOTE_TIMEOUT,
        }
    }
}

/// What a pass knows.
pub struct View<'a> {
    pub members: &'a [Member],
    /// Health of the started members, by ID (a member that did not answer is absent).
    pub health: &'a BTreeMap<u64, MemberStatus>,
    /// How each member pod's etcd last ended, by ordinal (pods being deleted left out).
    pub exits: &'a BTreeMap<i32, Exit>,
    /// Ordinals without a member whose pod still answers as a member ID the list does not
    /// have (a removed member that has not stopped yet).
    pub removed_running: &'a BTreeSet<i32>,
    pub memory: &'a Memory,
    pub now: Timestamp,
    pub timeouts: Timeouts,
    /// What the corruption checks and the members' hashes say (`corruption::judge`).
    pub corruption: Option<&'a Finding>,
}

/// A member that answers with a leader and no alarm but NOSPACE: it has its data and takes
/// part in raft (NOSPACE refuses writes only, and the upkeep recovers it once the membership is
/// steady; counting it unhealthy would hold that recovery behind a membership that waits for
/// healthy voters).
fn healthy(view: &View, m: &Member) -> bool {
    view.health.get(&m.id).is_some_and(MemberStatus::serving)
}

fn waited(view: &View, since: Option<&Timestamp>) -> Duration {
    let since = since.copied().unwrap_or(view.now);
    Duration::try_from(view.now.duration_since(since)).unwrap_or_default()
}

/// Whether voter `m` can be removed: the healthy voters left keep a quorum of the voters left.
fn quorum_without(view: &View, m: &Member) -> Result<(), String> {
    let voters: Vec<&Member> = view.members.iter().filter(|v| !v.is_learner).collect();
    if m.is_learner {
        return Ok(());
    }
    let after = voters.len().saturating_sub(1);
    let others = voters
        .iter()
        .filter(|v| v.id != m.id && healthy(view, v))
        .count();
    if after > 0 && others > after / 2 {
        Ok(())
    } else {
        Err(format!(
            "removing it needs a quorum of the others ({others} of {after} healthy)"
        ))
    }
}

/// Whether voter `m` can be removed while the CORRUPT alarm makes every member unhealthy: the
/// other voters that answer with a leader keep a quorum of the voters left.
fn quorum_without_answering(view: &View, m: &Member) -> Result<(), String> {
    let voters: Vec<&Member> = view.members.iter().filter(|v| !v.is_learner).collect();
    let after = voters.len().saturating_sub(1);
    let others = voters
        .iter()
        .filter(|v| v.id != m.id && view.health.get(&v.id).is_some_and(|s| s.leader != 0))
        .count();
    if after > 0 && others > after / 2 {
        Ok(())
    } else {
        Err(format!(
            "removing it needs a quorum of the others answering ({others} of {after})"
        ))
    }
}

/// The step for what the corruption checks found, if they found anything.
fn corruption_step(view: &View, ours: &[(i32, &Member)]) -> Option<Step> {
    match view.corruption? {
        Finding::Outlier { id, why } => {
            let Some(&(i, m)) = ours.iter().find(|(_, m)| m.id == *id) else {
                return Some(Step::Wait(format!(
                    "{why}; it has no ordinal of this cluster (added by hand?): remove it by hand"
                )));
            };
            Some(match quorum_without_answering(view, m) {
                Ok(()) => Step::Remove {
                    ordinal: i,
                    id: m.id,
                    why: Removal::Corrupt(why.clone()),
                },
                Err(e) => Step::Wait(format!("{why}; {e}")),
            })
        }
        Finding::Disarm(ids) => Some(Step::Disarm { ids: ids.clone() }),
        Finding::Undecided(why) => Some(Step::Wait(why.clone())),
    }
}

/// The next membership call of `ec` (see the module's order).
pub fn plan(ec: &EtcdCluster, view: &View) -> Step {
    let want = ec.spec.size;
    let name = ec.name_any();
    let ours: Vec<(i32, &Member)> = view
        .members
        .iter()
        .filter_map(|m| Some((ordinal(ec, m)?, m)))
        .filter(|(i, _)| *i < want)
        .collect();
    // Every voter counts for the quorum, strangers included.
    let voters: Vec<&Member> = view.members.iter().filter(|m| !m.is_learner).collect();
    let healthy_voters = voters.iter().filter(|m| healthy(view, m)).count();
    let unhealthy: Vec<String> = voters
        .iter()
        .filter(|m| !healthy(view, m))
        .map(|m| describe(ec, m))
        .collect();

    let taken: BTreeSet<i32> = ours.iter().map(|(i, _)| *i).collect();
    if let Some(&ordinal) = view.memory.replacing.iter().find(|i| !taken.contains(i)) {
        return Step::ReplaceVolume { ordinal };
    }
    // An ordinal without a member whose pod's etcd stopped by itself: its volume names a
    // removed member and would be refused; it is made anew before a member is added there.
    if let Some(ordinal) = (0..want).find(|i| {
        !taken.contains(i)
            && (view.exits.get(i).is_some_and(Exit::removed) || view.removed_running.contains(i))
    }) {
        return Step::ReplaceVolume { ordinal };
    }
    if let Some(step) = corruption_step(view, &ours) {
        return step;
    }
    for &(i, m) in &ours {
        // A sign read from the container's last termination (`lastState`), which the kubelet
        // keeps until the next one: believed only while the member does not answer healthy
        // (a member that answers has its data, whatever its last run said).
        let answers = healthy(view, m);
        if m.started() && !answers && view.exits.get(&i).is_some_and(Exit::lost_volume) {
            return match quorum_without(view, m) {
                Ok(()) => Step::Remove {
                    ordinal: i,
                    id: m.id,
                    why: Removal::LostVolume,
                },
                Err(why) => Step::Wait(format!("{name}-{i} lost its volume; {why}")),
            };
        }
    }
    for &(i, m) in &ours {
        if m.started() {
            continue;
        }
        let since = view.memory.joining.get(&m.id).copied().unwrap_or(view.now);
        let stale = view
            .exits
            .get(&i)
            .is_some_and(|e| e.removed() && e.after(since));
        let waited = waited(view, Some(&since));
        let why = if stale {
            Removal::StaleVolume
        } else if waited >= view.timeouts.join {
            Removal::NeverStarted(waited)
        } else {
            return Step::Wait(format!(
                "{name}-{i} was added {}s ago and has not started (removed after {}s)",
                waited.as_secs(),
                view.timeouts.join.as_secs()
            ));
        };
        return match quorum_without(view, m) {
            Ok(()) => Step::Remove {
                ordinal: i,
                id: m.id,
                why,
            },
            Err(e) => Step::Wait(format!("{name}-{i} has not started; {e}")),
        };
    }
    if let Some(&(i, m)) = ours.iter().find(|(_, m)| m.is_learner) {
        // The learner's raft index and its leader's, as their `status` said.
        let index = |id: u64| view.health.get(&id).map_or(0, |s| s.raft_index);
        let leader = view.health.values().map(|s| s.leader).find(|&l| l != 0);
        let (own, of_leader) = (index(m.id), leader.map_or(0, index));
        let waited = waited(view, view.memory.started.get(&m.id));
        // etcd promotes a learner whose log is within 90% of the leader's (isLearnerReady,
        // readyPercent 0.9) and refuses before.
        let behind = u128::from(own) * 10 < u128::from(of_leader) * 9;
        let caught_up = of_leader > 0 && !behind;
        // The timeout is for catching up: a learner that has, and waits for a voter to be
        // healthy again, is kept (removing it would throw its copy away for nothing).
        if waited >= view.timeouts.promote && !caught_up {
            return Step::Remove {
                ordinal: i,
                id: m.id,
                why: Removal::NeverCaughtUp {
                    waited,
                    index: own,
                    leader_index: of_leader,
                },
            };
        }
        if healthy_voters < voters.len() {
            return Step::Wait(format!(
                "{name}-{i} is promoted when every voter is healthy ({healthy_voters} of {}; not: {})",
                voters.len(),
                unhealthy.join(", ")
            ));
        }
        // Wait for it rather than be refused.
        if behind {
            return Step::Wait(format!(
                "{name}-{i} is catching up (raft index {own} of the leader's {of_leader}); it is promoted at 90%"
            ));
        }
        return Step::Promote {
            ordinal: i,
            id: m.id,
        };
    }
    if ours.len() < want as usize {
        if healthy_voters < voters.len() {
            return Step::Wait(format!(
                "{healthy_voters} of {} voters healthy (not: {}); a member is added when all are",
                voters.len(),
                unhealthy.join(", ")
            ));
        }
        let ordinal = (0..want)
            .find(|i| !taken.contains(i))
            .expect("fewer than want");
        return Step::AddLearner { ordinal };
    }
    Step::Steady
}

/// A member as a person reads it: `NAME-i`, or its name and ID when it has no ordinal.
pub fn describe(ec: &EtcdCluster, m: &Member) -> String {
    match ordinal(ec, m) {
        Some(i) => format!("{}-{i}", ec.name_any()),
        None if m.started() => format!("{} ({:x})", m.name, m.id),
        None => format!("unstarted {:x} ({})", m.id, m.peer_urls.join(" ")),
    }
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

/// Members the spec does not run: at ordinals at or above `spec.size` (the membership of a
/// former, larger cluster whose volumes a re-created cluster found), or with a peer URL of no
/// ordinal (added by hand). In ordinal order (then by ID), so a status naming them is stable.
pub fn strangers<'m>(ec: &EtcdCluster, members: &'m [Member]) -> Vec<&'m Member> {
    let mut out: Vec<&Member> = members
        .iter()
        .filter(|m| ordinal(ec, m).is_none_or(|i| i >= ec.spec.size))
        .collect();
    out.sort_by_key(|m| (ordinal(ec, m).unwrap_or(MAX_SIZE), m.id));
    out
}

/// `ETCD_INITIAL_CLUSTER` for a pod joining `members`: the member list as it is, each member
/// under the name its pod runs with (`NAME-i`), a stranger under its own name (or, unstarted,
/// its ID). etcd refuses a join whose list differs from the cluster's members, so nobody is
/// left out.
pub fn initial_cluster(ec: &EtcdCluster, members: &[Member]) -> String {
    let name = ec.name_any();
    let mut entries: Vec<(Option<i32>, String, &str)> = Vec::new();
    for m in members {
        let i = ordinal(ec, m);
        let label = match i {
            Some(i) => format!("{name}-{i}"),
            None if m.started() => m.name.clone(),
            None => format!("unstarted-{:x}", m.id),
        };
        for url in &m.peer_urls {
            entries.push((i, label.clone(), url));
        }
    }
    entries.sort_by(|a, b| (a.0.unwrap_or(MAX_SIZE), &a.1).cmp(&(b.0.unwrap_or(MAX_SIZE), &b.1)));
    entries.dedup();
    render::cluster_list(entries.into_iter().map(|(_, n, url)| (n, url)))
}

#[cfg(test)]
mod tests {
    use super::super::memory::{joining_of, started_of};
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
                        raft_index: 50,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// Non-voters joined at `since`, started learners started at `since`.
    fn memory_since(members: &[Member], since: i64) -> Memory {
        Memory {
            joining: joining_of(members, &BTreeMap::new(), at(since)),
            started: started_of(members, &BTreeMap::new(), at(since)),
            replacing: BTreeSet::new(),
            corrupt: BTreeMap::new(),
        }
    }

    fn view_plan(
        ec: &EtcdCluster,
        members: &[Member],
        health: &BTreeMap<u64, MemberStatus>,
        exits: &BTreeMap<i32, Exit>,
        since: i64,
        now: i64,
    ) -> Step {
        plan(
            ec,
            &View {
                members,
                health,
                exits,
                removed_running: &BTreeSet::new(),
                memory: &memory_since(members, since),
                now: at(now),
                timeouts: Timeouts::default(),
                corruption: None,
            },
        )
    }

    fn decide(ec: &EtcdCluster, members: &[Member], lost: &[i32], since: i64, now: i64) -> Step {
        let exits = lost
            .iter()
            .map(|&i| {
                (
                    i,
                    Exit {
                        code: 2,
                        message: "panic: tocommit(9) is out of range [lastIndex(0)]".to_owned(),
                        at: Some(at(since)),
                    },
                )
            })
            .collect();
        // A member that lost its volume crash-loops: it does not answer.
        let mut health = healthy_all(members);
        for &i in lost {
            health.retain(|id, _| {
                !members
                    .iter()
                    .any(|m| m.id == *id && ordinal(ec, m) == Some(i))
            });
        }
        view_plan(ec, members, &health, &exits, since, now)
    }

    fn clean_exit(secs: i64) -> Exit {
        Exit {
            code: 0,
            message: String::new(),
            at: Some(at(secs)),
        }
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
        let step = view_plan(&ec, &members, &health, &BTreeMap::new(), 0, 0);
        assert!(
            matches!(step, Step::Wait(ref m) if m.contains("2 of 3 voters") && m.contains("etcd-2")),
            "{step:?}"
        );
    }

    #[test]
    fn a_lost_volume_is_removed_then_re_added_at_its_ordinal_only_with_a_quorum() {
        let ec = cluster("etcd", 3, None);
        let mut members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        let mut health = healthy_all(&members);
        health.remove(&101);
        let lost = BTreeMap::from([(
            1,
            Exit {
                code: 1,
                message: "member 65 has already been bootstrapped".to_owned(),
                at: Some(at(0)),
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &lost, 0, 0),
            Step::Remove {
                ordinal: 1,
                id: 101,
                why: Removal::LostVolume
            }
        );
        // Without a quorum of the others (only 1 of the 2 left healthy): wait.
        health.remove(&102);
        assert!(matches!(
            view_plan(&ec, &members, &health, &lost, 0, 0),
            Step::Wait(_)
        ));
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
    fn a_learner_with_a_lost_volume_sign_and_no_healthy_voter_does_not_underflow() {
        let ec = cluster("etcd", 3, None);
        let members = vec![member(&ec, 0, true, false), member(&ec, 1, true, true)];
        let mut health = healthy_all(&members);
        health.remove(&100);
        health.remove(&101);
        let lost = BTreeMap::from([(
            1,
            Exit {
                code: 2,
                message: "[lastIndex(0)]".to_owned(),
                at: None,
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &lost, 0, 0),
            Step::Remove {
                ordinal: 1,
                id: 101,
                why: Removal::LostVolume
            }
        );
    }

    /// The kubelet keeps a container's last termination until the next one: a member whose
    /// last run ended with a lost-volume sign but that answers healthy now (its volume back:
    /// a mount that came late) is left alone, not removed.
    #[test]
    fn a_lost_volume_sign_of_a_member_that_answers_healthy_is_old_news() {
        let ec = cluster("etcd", 3, None);
        let members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        let health = healthy_all(&members);
        let lost = BTreeMap::from([(
            1,
            Exit {
                code: 1,
                message: "member 65 has already been bootstrapped".to_owned(),
                at: Some(at(0)),
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &lost, 0, 3600),
            Step::Steady
        );
    }

    /// NOSPACE refuses writes, nothing else: a member reporting it (alone) is a healthy voter
    /// for the membership. An old lost-volume sign does not get it removed, and a scale-up or a
    /// promotion is not held for it (holding them would keep the membership from being steady,
    /// and the upkeep that recovers NOSPACE runs only then). Any other error or alarm (CORRUPT)
    /// is unhealthy.
    #[test]
    fn a_member_with_only_the_nospace_alarm_is_healthy_for_the_membership() {
        let ec = cluster("etcd", 3, None);
        let members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        let alarmed = |health: &mut BTreeMap<u64, MemberStatus>, alarm: &str| {
            for s in health.values_mut() {
                s.errors = vec![format!("memberID:101 alarm:{alarm} ")];
            }
        };
        let mut health = healthy_all(&members);
        alarmed(&mut health, "NOSPACE");
        let lost = BTreeMap::from([(
            1,
            Exit {
                code: 1,
                message: "member 65 has already been bootstrapped".to_owned(),
                at: Some(at(0)),
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &lost, 0, 3600),
            Step::Steady
        );
        let grown = cluster("etcd", 5, None);
        assert_eq!(
            view_plan(&grown, &members, &health, &BTreeMap::new(), 0, 10),
            Step::AddLearner { ordinal: 3 }
        );
        alarmed(&mut health, "CORRUPT");
        assert!(matches!(
            view_plan(&grown, &members, &health, &BTreeMap::new(), 0, 10),
            Step::Wait(_)
        ));
        // With a CORRUPT alarm the old sign is believed (the member does not serve), but no
        // other voter serves either: no removal without a quorum of the others.
        match view_plan(&ec, &members, &health, &lost, 0, 3600) {
            Step::Wait(why) => assert!(why.contains("lost its volume"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// A member removed by hand (`etcdctl member remove`): its etcd stops with exit 0 and its
    /// volume names the removed ID. The volume is replaced before the member is added back,
    /// and a learner added before the exit was seen is removed once its pod stops that way.
    #[test]
    fn a_volume_that_names_a_removed_member_is_replaced_not_rejoined() {
        let ec = cluster("etcd", 3, None);
        let members = vec![member(&ec, 0, true, false), member(&ec, 2, true, false)];
        let health = healthy_all(&members);
        let exits = BTreeMap::from([(1, clean_exit(5))]);
        assert_eq!(
            view_plan(&ec, &members, &health, &exits, 0, 10),
            Step::ReplaceVolume { ordinal: 1 }
        );
        // The kubelet's immediate restart on that volume failed (an error exit whose log says
        // the member was removed): the same.
        let again = BTreeMap::from([(
            1,
            Exit {
                code: 1,
                message: "etcdserver: the member has been permanently removed from the cluster"
                    .to_owned(),
                at: Some(at(6)),
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &again, 0, 10),
            Step::ReplaceVolume { ordinal: 1 }
        );
        // Still running as the removed member (its peers have not stopped it yet): replaced
        // too, before any add.
        assert_eq!(
            plan(
                &ec,
                &View {
                    members: &members,
                    health: &health,
                    exits: &BTreeMap::new(),
                    removed_running: &BTreeSet::from([1]),
                    memory: &Memory::default(),
                    now: at(10),
                    timeouts: Timeouts::default(),
                    corruption: None,
                },
            ),
            Step::ReplaceVolume { ordinal: 1 }
        );
        // An error exit of a member that is not there (a fresh volume finding no member by
        // its name) is no reason: the member is added.
        let error = BTreeMap::from([(
            1,
            Exit {
                code: 1,
                ..clean_exit(5)
            },
        )]);
        assert_eq!(
            view_plan(&ec, &members, &health, &error, 0, 10),
            Step::AddLearner { ordinal: 1 }
        );
        // Added as a learner at 20; its pod stopped by itself at 25: the volume is stale.
        let mut added = members.clone();
        added.insert(1, member(&ec, 1, false, true));
        let health = healthy_all(&added);
        assert_eq!(
            view_plan(
                &ec,
                &added,
                &health,
                &BTreeMap::from([(1, clean_exit(25))]),
                20,
                30
            ),
            Step::Remove {
                ordinal: 1,
                id: 101,
                why: Removal::StaleVolume
            }
        );
        // The exit came before the add: not this member's doing; wait for the pod.
        assert!(matches!(
            view_plan(&ec, &added, &health, &exits, 20, 30),
            Step::Wait(_)
        ));
        // A started voter's clean exit (a SIGTERM to PID 1) says nothing about its volume.
        let three: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        assert_eq!(
            view_plan(&ec, &three, &healthy_all(&three), &exits, 0, 10),
            Step::Steady
        );
    }

    #[test]
    fn a_started_learner_that_never_catches_up_is_removed_after_the_promote_timeout() {
        let ec = cluster("etcd", 3, None);
        let members = vec![
            member(&ec, 0, true, false),
            member(&ec, 1, true, false),
            member(&ec, 2, true, true),
        ];
        let mut health = healthy_all(&members);
        health.get_mut(&100).unwrap().raft_index = 9000;
        health.get_mut(&102).unwrap().raft_index = 12;
        let none = BTreeMap::new();
        // Behind (12 of 9000): etcd would refuse the promotion, so the plan waits for it.
        assert_eq!(
            view_plan(&ec, &members, &health, &none, 0, 299),
            Step::Wait(
                "etcd-2 is catching up (raft index 12 of the leader's 9000); it is promoted at 90%"
                    .to_owned()
            )
        );
        let mut caught_up = health.clone();
        caught_up.get_mut(&102).unwrap().raft_index = 8100;
        assert_eq!(
            view_plan(&ec, &members, &caught_up, &none, 0, 299),
            Step::Promote {
                ordinal: 2,
                id: 102
            }
        );
        assert_eq!(
            view_plan(&ec, &members, &health, &none, 0, 300),
            Step::Remove {
                ordinal: 2,
                id: 102,
                why: Removal::NeverCaughtUp {
                    waited: Duration::from_secs(300),
                    index: 12,
                    leader_index: 9000
                }
            }
        );
        // Promote waits for every voter to be healthy, and names who is not.
        health.remove(&101);
        let step = view_plan(&ec, &members, &health, &none, 0, 10);
        assert!(
            matches!(step, Step::Wait(ref m) if m.contains("etcd-1") && m.contains("promoted")),
            "{step:?}"
        );
        // Caught up and waiting for that voter past the promote timeout: kept, not removed.
        caught_up.remove(&101);
        let step = view_plan(&ec, &members, &caught_up, &none, 0, 900);
        assert!(
            matches!(step, Step::Wait(ref m) if m.contains("etcd-1") && m.contains("promoted")),
            "{step:?}"
        );
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

    /// A member added by hand (no ordinal): kept in every join list (etcd refuses a join whose
    /// list is not the member list), counted in the quorum, never touched.
    #[test]
    fn a_stranger_is_in_the_join_list_and_in_the_quorum() {
        let ec = cluster("etcd", 5, None);
        let mut members: Vec<Member> = (0..3).map(|i| member(&ec, i, true, false)).collect();
        members.push(Member {
            id: 0xabc,
            name: "stray".to_owned(),
            peer_urls: vec!["http://10.0.0.9:2380".to_owned()],
            client_urls: vec!["http://10.0.0.9:2379".to_owned()],
            is_learner: false,
        });
        members.push(Member {
            id: 0xdef,
            name: String::new(),
            peer_urls: vec!["http://10.0.0.10:2380".to_owned()],
            client_urls: vec![],
            is_learner: true,
        });
        assert_eq!(
            initial_cluster(&ec, &members),
            "etcd-0=http://etcd-0.etcd.prod.svc:2380,etcd-1=http://etcd-1.etcd.prod.svc:2380,etcd-2=http://etcd-2.etcd.prod.svc:2380,stray=http://10.0.0.9:2380,unstarted-def=http://10.0.0.10:2380"
        );
        let mut health = healthy_all(&members);
        assert_eq!(
            view_plan(&ec, &members, &health, &BTreeMap::new(), 0, 0),
            Step::AddLearner { ordinal: 3 }
        );
        health.remove(&0xabc);
        let step = view_plan(&ec, &members, &health, &BTreeMap::new(), 0, 0);
        assert!(
            matches!(step, Step::Wait(ref m) if m.contains("3 of 4 voters") && m.contains("stray (abc)")),
            "{step:?}"
        );
        let named: Vec<String> = strangers(&ec, &members)
            .iter()
            .map(|m| describe(&ec, m))
            .collect();
        assert_eq!(
            named,
            ["stray (abc)", "unstarted def (http://10.0.0.10:2380)"]
        );
    }

    /// A member of no ordinal (added by hand at another address) is reached at the client URL
    /// it advertises, for its status as for maintenance (before, maintenance had no address
    /// for it and its NOSPACE alarm was never cleared); the others at their pods'.
    #[test]
    fn a_stranger_member_is_reached_at_its_own_client_url() {
        let ec = cluster("etcd", 3, None);
        let endpoints = render::endpoints(&ec, 3);
        let ours = member(&ec, 1, true, false);
        assert_eq!(
            client_url(&ec, &endpoints, &ours),
            Some(endpoints[1].as_str())
        );
        let stranger = Member {
            id: 7,
            name: "by-hand".to_owned(),
            peer_urls: vec!["http://10.0.0.9:2380".to_owned()],
            client_urls: vec!["http://10.0.0.9:2379".to_owned()],
            is_learner: false,
        };
        assert_eq!(
            client_url(&ec, &endpoints, &stranger),
            Some("http://10.0.0.9:2379")
        );
        let silent = Member {
            client_urls: vec![],
            ..stranger
        };
        assert_eq!(client_url(&ec, &endpoints, &silent), None);
    }
}
