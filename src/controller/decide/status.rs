//! The status a cluster should show, from what the reconcile observed. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::observation::{EtcdView, Observation, Restored, Space};
use crate::api::Phase;
use crate::api::v1::{EtcdCluster, EtcdClusterStatus};
use crate::controller::render;

/// The members' states for the status: role, health, release, sizes to the MiB, alarms, and
/// the time of the last defragmentation (this pass's at `now`, else the one recorded before).
fn member_states(
    view: &EtcdView,
    before: Option<&[crate::api::v1::MemberState]>,
    now: &Time,
) -> (Option<String>, Vec<crate::api::v1::MemberState>) {
    let mib = |b: u64| i64::try_from(b >> 20 << 20).unwrap_or(i64::MAX);
    let leader_id = view.health.values().map(|h| h.leader).find(|&l| l != 0);
    let mut leader = None;
    let states = view
        .members
        .iter()
        .map(|m| {
            let name = if m.started() {
                m.name.clone()
            } else {
                format!("{:x}", m.id)
            };
            let status = view.health.get(&m.id);
            let role = if m.is_learner {
                "Learner"
            } else if leader_id == Some(m.id) {
                leader = Some(name.clone());
                "Leader"
            } else {
                "Follower"
            };
            let last_defragmentation = if view.defragmented.contains(&name) {
                Some(now.0.to_string())
            } else {
                before
                    .into_iter()
                    .flatten()
                    .find(|b| b.name == name)
                    .and_then(|b| b.last_defragmentation.clone())
            };
            crate::api::v1::MemberState {
                id: format!("{:x}", m.id),
                role: role.to_owned(),
                healthy: status.is_some_and(|s| s.healthy()),
                version: status.map(|s| s.version.clone()).unwrap_or_default(),
                db_size: status.map(|s| mib(s.db_size)),
                db_size_in_use: status.map(|s| mib(s.db_size_in_use)),
                alarms: status
                    .map(|s| {
                        s.errors
                            .iter()
                            .filter_map(|e| e.split("alarm:").nth(1))
                            .map(|a| a.trim().to_owned())
                            .collect()
                    })
                    .unwrap_or_default(),
                last_defragmentation,
                corruption_detected_at: view.corrupt.get(&name).cloned(),
                name,
            }
        })
        .collect();
    (leader, states)
}

/// A message the CRD's schema takes: a longer one (an error quoting a large body, say) would
/// get the whole status write refused.
fn within_limit(message: String) -> String {
    const MARK: &str = "... (cut)";
    let max = crate::api::CONDITION_MESSAGE_MAX;
    match message.char_indices().nth(max) {
        None => message,
        Some(_) => {
            let keep = max - MARK.chars().count();
            let end = message
                .char_indices()
                .nth(keep)
                .map_or(message.len(), |(i, _)| i);
            format!("{}{MARK}", &message[..end])
        }
    }
}

/// Whether `ec`'s status has the condition `type_` with `reason` (what the loop said before:
/// a Warning it already gave is not given again).
pub(crate) fn has_condition(ec: &EtcdCluster, type_: &str, reason: &str) -> bool {
    ec.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.reason == reason))
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: Option<&Vec<Condition>>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status flips, as the API conventions say.
    let since = previous
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: within_limit(message),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status for `ec` given what was observed; equal to the current one when nothing changed
/// (so the caller can skip the write).
pub fn desired(ec: &EtcdCluster, seen: &Observation, now: Time) -> EtcdClusterStatus {
    let size = ec.spec.size;
    let generation = ec.metadata.generation;
    let previous = ec.status.as_ref().and_then(|s| s.conditions.as_ref());
    // Without an answer from etcd (not formed yet, or the loop cannot reach the members) the
    // StatefulSet's readiness stands alone; with one, the member list must match the spec.
    let all_ready = seen.ready >= size
        && seen
            .membership
            .as_ref()
            .is_none_or(|m| !m.reachable || m.settled(size));
    let phase = if seen.deleting {
        Phase::Deleting
    } else if seen.failure.is_some() {
        Phase::Failed
    } else if all_ready && seen.activity.is_none() {
        Phase::Running
    } else {
        Phase::Creating
    };
    // Every condition carries the generation it judged and keeps its transition time.
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(type_, ok, reason, message, generation, previous, &now)
    };
    let ready = match (&seen.failure, seen.deleting) {
        (_, true) => cond(
            "Ready",
            false,
            "Deleting",
            match &seen.progress {
                Some(p) => format!("the cluster is being deleted: {p}"),
                None => "the cluster is being deleted".to_owned(),
            },
        ),
        (Some((reason, err)), false) => cond("Ready", false, reason, err.clone()),
        (None, false) if all_ready => cond(
            "Ready",
            true,
            "AllMembersReady",
            format!("{}/{size} members ready", seen.ready),
        ),
        (None, false) => cond(
            "Ready",
            false,
            "MembersNotReady",
            format!("{}/{size} members ready", seen.ready),
        ),
    };
    let progressing = match (seen.activity, all_ready) {
        _ if seen.failure.is_some() => cond(
            "Progressing",
            false,
            seen.failure.as_ref().map_or("", |f| f.0),
            "nothing changes until the reason in the Ready condition is fixed".to_owned(),
        ),
        (Some(a), _) => cond(
            "Progressing",
            true,
            a.reason(),
            match &seen.progress {
                Some(p) => format!("{}: {}/{size} members ready; {p}", a.reason(), seen.ready),
                None => format!("{}: {}/{size} members ready", a.reason(), seen.ready),
            },
        ),
        (None, false) => cond(
            "Progressing",
            true,
            "WaitingForMembers",
            format!("{}/{size} members ready", seen.ready),
        ),
        (None, true) => cond(
            "Progressing",
            false,
            "Stable",
            "every member runs the desired spec".to_owned(),
        ),
    };
    let mut conditions = vec![ready, progressing];
    if let Some(m) = &seen.membership {
        let (ok, reason, message) = m.condition(size);
        conditions.push(cond("Members", ok, reason, message));
        // Available: the cluster serves (a quorum of its voters is healthy), even while a
        // member is down or being replaced; Ready asks for every member.
        let quorum = m.voters / 2 + 1;
        conditions.push(match (m.reachable, m.healthy_voters >= quorum) {
            (true, true) => cond(
                "Available",
                true,
                "QuorumHealthy",
                format!(
                    "{} of {} voters healthy (quorum {quorum})",
                    m.healthy_voters, m.voters
                ),
            ),
            (true, false) => cond(
                "Available",
                false,
                "QuorumLost",
                format!(
                    "{} of {} voters healthy, below the quorum of {quorum}: etcd takes no writes",
                    m.healthy_voters, m.voters
                ),
            ),
            (false, _) => match &m.quorum {
                Some(d) => cond("Available", false, d.reason(), d.message().to_owned()),
                None => cond(
                    "Available",
                    false,
                    "NoAnswer",
                    "no member answered the loop".to_owned(),
                ),
            },
        });
    } else {
        // Not read this pass (an error path): the last word stays.
        conditions.extend(
            previous
                .into_iter()
                .flatten()
                .filter(|c| c.type_ == "Members" || c.type_ == "Available")
                .cloned(),
        );
    }
    // A restore's source; a restore in place whose annotation the loop refuses has none, and
    // still says why.
    let source = render::restore_source(ec).map(|r| r.from).or_else(|| {
        seen.restored
            .as_ref()
            .map(|_| "a restore in place".to_owned())
    });
    if let Some(from) = &source {
        let last = || previous.and_then(|cs| cs.iter().find(|c| c.type_ == "Restored"));
        conditions.extend(match seen.restored.clone() {
            // Not judged this pass (an error path before the restore step): the last word stays.
            None => last().cloned(),
            Some(Restored::Done) => Some(cond(
                "Restored",
                true,
                "Restored",
                format!("started from {}", from),
            )),
            Some(Restored::Restoring { done, of }) => Some(cond(
                "Restored",
                false,
                "Restoring",
                format!(
                    "{done}/{of} members restored from {} (Jobs {}-restore-<i>); the members start when all are",
                    from,
                    ec.metadata.name.as_deref().unwrap_or("")
                ),
            )),
            Some(Restored::Waiting(message)) => {
                Some(cond("Restored", false, "WaitingForSource", message))
            }
            Some(Restored::Clearing(message)) => {
                Some(cond("Restored", false, "ClearingForRestore", message))
            }
            Some(Restored::Failed(message)) => {
                Some(cond("Restored", false, "RestoreFailed", message))
            }
        });
    }
    match &seen.space {
        None => conditions.extend(
            previous
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Degraded"))
                .cloned(),
        ),
        Some(Space::Ok) => conditions.push(cond(
            "Degraded",
            false,
            "WithinQuota",
            "every member takes writes: no NOSPACE alarm".to_owned(),
        )),
        Some(Space::NoSpace(m)) => conditions.push(cond("Degraded", true, "NoSpace", m.clone())),
        Some(Space::QuotaExceeded(m)) => {
            conditions.push(cond("Degraded", true, "QuotaExceeded", m.clone()))
        }
    }
    if let Some((trusted, message)) = &seen.trust {
        conditions.push(cond(
            "CATrusted",
            *trusted,
            if *trusted {
                "MembersTrustTheCA"
            } else {
                "CAKeyChanged"
            },
            message.clone(),
        ));
    }
    let backup = seen
        .backup
        .clone()
        .or_else(|| ec.status.as_ref().and_then(|s| s.backup.clone()));
    let schedule = ec
        .spec
        .backup
        .as_ref()
        .map(|b| b.schedule.as_str())
        .unwrap_or("");
    if let Some(w) = &seen.warning {
        conditions.push(cond(
            "BackupReady",
            false,
            "UnsupportedDestination",
            w.clone(),
        ));
    } else if render::backup_target(ec).is_some() {
        let (last, failure) = backup
            .as_ref()
            .map_or((None, None), |b| (b.last.as_ref(), b.last_failure.as_ref()));
        conditions.push(match (failure, last) {
            (Some(f), _) => cond(
                "BackupReady",
                false,
                // A full backup volume is its own reason: it does not heal by retrying.
                if f.step == "space" {
                    "StoreFull"
                } else {
                    "BackupFailed"
                },
                format!(
                    "the backup at {} failed at step {}: {}{}",
                    f.time,
                    f.step,
                    f.message,
                    last.map_or_else(
                        || "; no snapshot has been filed yet".to_owned(),
                        |l| format!("; the newest snapshot is {} ({})", l.uri, l.time)
                    )
                ),
            ),
            (None, Some(l)) => cond(
                "BackupReady",
                true,
                "Succeeded",
                format!(
                    "{} taken {} from {} ({} bytes, revision {}); snapshots on {schedule:?}",
                    l.uri, l.time, l.member, l.size, l.revision
                ),
            ),
            (None, None) => cond(
                "BackupReady",
                true,
                "Scheduled",
                format!("snapshots on {schedule:?}; none taken yet"),
            ),
        });
    }
    let last = ec.status.as_ref();
    let (leader, members) = match &seen.etcd {
        Some(view) => {
            let (leader, states) =
                member_states(view, last.and_then(|s| s.members.as_deref()), &now);
            (leader, Some(states))
        }
        // Not read this pass: the last word stays.
        None => (
            last.and_then(|s| s.leader.clone()),
            last.and_then(|s| s.members.clone()),
        ),
    };
    EtcdClusterStatus {
        leader,
        members,
        phase: Some(phase),
        ready_replicas: Some(seen.ready),
        endpoints: Some(render::endpoints(ec, size)),
        observed_generation: generation,
        conditions: Some(conditions),
        backup,
    }
}

#[cfg(test)]
mod tests {
    use super::super::observation::{Activity, Membership};
    use super::*;
    use crate::controller::render::tests::cluster;

    #[test]
    fn condition_messages_fit_the_schema() {
        let max = crate::api::CONDITION_MESSAGE_MAX;
        let short = "é".repeat(max);
        assert_eq!(within_limit(short.clone()), short);
        let long = within_limit("é".repeat(max + 1));
        assert_eq!(long.chars().count(), max);
        assert!(long.ends_with("... (cut)"));
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn creating_until_every_member_is_ready_then_running() {
        let ec = cluster("etcd", 3, None);
        let seen = Observation {
            ready: 2,
            ..Default::default()
        };
        let s = desired(&ec, &seen, at(100));
        assert_eq!(s.phase, Some(Phase::Creating));
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(s.observed_generation, Some(1));
        assert_eq!(
            s.endpoints.as_deref().unwrap()[2],
            "http://etcd-2.etcd.prod.svc:2379"
        );
        let ready = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "MembersNotReady")
        );
        let s = desired(
            &ec,
            &Observation {
                ready: 3,
                ..Default::default()
            },
            at(200),
        );
        assert_eq!(s.phase, Some(Phase::Running));
        let c = s.conditions.unwrap();
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("True", "AllMembersReady")
        );
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("False", "Stable")
        );
    }

    #[test]
    fn unchanged_observation_gives_the_identical_status() {
        let mut ec = cluster("etcd", 3, None);
        let seen = Observation {
            ready: 3,
            ..Default::default()
        };
        ec.status = Some(desired(&ec, &seen, at(100)));
        // Later, same facts: the same status, transition times included, so no write.
        assert_eq!(ec.status, Some(desired(&ec, &seen, at(500))));
        // A flip moves only the flipped condition's time.
        let s = desired(
            &ec,
            &Observation {
                ready: 2,
                ..Default::default()
            },
            at(600),
        );
        let c = s.conditions.unwrap();
        assert_eq!(c[0].last_transition_time, at(600));
        assert_eq!(c[0].status, "False");
    }

    #[test]
    fn a_pass_that_never_reached_the_restore_keeps_its_last_word() {
        let mut ec = cluster("etcd", 3, None);
        ec.spec.restore = Some(crate::api::v1::Restore {
            from: "s3://b/etcd-snapshot-1.db".to_owned(),
            sha256: None,
        });
        let restoring = Observation {
            restored: Some(Restored::Restoring { done: 1, of: 3 }),
            ..Default::default()
        };
        ec.status = Some(desired(&ec, &restoring, at(100)));
        let restored = |s: &EtcdClusterStatus| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Restored")
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        // An apply failed before the restore step: not "Restored True".
        let failed = Observation {
            failure: Some(("ApplyFailed", "forbidden".to_owned())),
            ..Default::default()
        };
        let s = desired(&ec, &failed, at(200));
        assert_eq!(
            restored(&s),
            Some(("False".to_owned(), "Restoring".to_owned()))
        );
        // A new cluster's first pass that failed early says nothing yet.
        ec.status = None;
        assert_eq!(restored(&desired(&ec, &failed, at(300))), None);
    }

    #[test]
    fn available_while_a_quorum_serves_ready_only_with_every_member() {
        let ec = cluster("etcd", 3, None);
        let seen = |healthy| Observation {
            ready: healthy,
            membership: Some(Membership {
                reachable: true,
                voters: 3,
                healthy_voters: healthy,
                ..Default::default()
            }),
            ..Default::default()
        };
        let of = |s: &EtcdClusterStatus, t: &str| {
            let c = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let two = desired(&ec, &seen(2), at(1));
        assert_eq!(
            of(&two, "Available"),
            ("True".to_owned(), "QuorumHealthy".to_owned())
        );
        assert_eq!(of(&two, "Ready").0, "False");
        let one = desired(&ec, &seen(1), at(2));
        assert_eq!(
            of(&one, "Available"),
            ("False".to_owned(), "QuorumLost".to_owned())
        );
    }

    #[test]
    fn failure_and_deletion_win() {
        let ec = cluster("etcd", 3, None);
        let failed = desired(
            &ec,
            &Observation {
                ready: 3,
                failure: Some(("ApplyFailed", "StatefulSet etcd: forbidden".to_owned())),
                ..Default::default()
            },
            at(1),
        );
        assert_eq!(failed.phase, Some(Phase::Failed));
        let c = failed.conditions.unwrap();
        assert_eq!(c[0].reason, "ApplyFailed");
        assert_eq!(c[0].message, "StatefulSet etcd: forbidden");
        let deleting = desired(
            &ec,
            &Observation {
                ready: 3,
                deleting: true,
                ..Default::default()
            },
            at(1),
        );
        assert_eq!(deleting.phase, Some(Phase::Deleting));
    }

    #[test]
    fn progressing_names_the_change() {
        let ec = cluster("etcd", 5, None);
        let s = desired(
            &ec,
            &Observation {
                ready: 3,
                activity: Some(Activity::AddingMembers),
                ..Default::default()
            },
            at(1),
        );
        let c = s.conditions.unwrap();
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("True", "AddingMembers")
        );
        assert_eq!(s.phase, Some(Phase::Creating));
    }
}
