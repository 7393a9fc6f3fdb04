//! The reconcile side of [`crate::controller::decide::membership`]: reads the members' ConfigMap and pods from the
//! caches, runs one membership pass against etcd, and writes back what it decided: the
//! ConfigMap (before the StatefulSet grows), the voters' pod label, Events and what the status
//! says about the members.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::members::{
    any_running, joins_former, label_voters, member_pods, pod_ordinal, recorded_cluster_id,
    replace_volume,
};
use crate::api::v1::EtcdCluster;
use crate::controller::decide::exits::Exit;
use crate::controller::decide::membership::{self, Removal, Step};
use crate::controller::decide::memory::Memory;
use crate::controller::decide::observation::{Activity, Membership, Observation};
use crate::controller::decide::quorum::Diagnosis;
use crate::controller::decide::status::has_condition;
use crate::controller::etcd::membership::{Inputs, Outcome, pass, volume_to_replace};
use crate::controller::etcd::{Etcd, EtcdError};
use crate::controller::machinery::children::Children;
use crate::controller::machinery::error::Error;
use crate::controller::machinery::finalizer::initial_size_recorded;
use crate::controller::render;

/// How each member pod's etcd container last ended (its current state if it is terminated,
/// else its last state), by ordinal. A pod being deleted is left out: what it says is about a
/// volume that is already being replaced.
fn exits(ec: &EtcdCluster, pods: &[std::sync::Arc<Pod>]) -> BTreeMap<i32, Exit> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let c = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == "etcd")?;
            let ended = [c.state.as_ref(), c.last_state.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|s| s.terminated.as_ref())?;
            let exit = Exit {
                code: ended.exit_code,
                message: ended.message.clone().unwrap_or_default(),
                at: ended.finished_at.as_ref().map(|t| t.0),
            };
            Some((pod_ordinal(ec, p)?, exit))
        })
        .collect()
}

/// One membership pass for a cluster whose StatefulSet exists; returns the pods the
/// StatefulSet must run. Without an answer from etcd the StatefulSet keeps `replicas`.
/// `ready` is the StatefulSet's count of ready pods.
pub(crate) async fn converge(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
    ready: i32,
    seen: &mut Observation,
) -> Result<i32, Error> {
    let ctx = kids.ctx;
    let config_name = render::members_config_name(ec);
    let config = kids.read::<ConfigMap>(&config_name).await?;
    let (before, bad) = Memory::parse(
        config
            .as_ref()
            .and_then(|c| c.metadata.annotations.as_ref())
            .unwrap_or(&BTreeMap::new()),
    );
    for e in &bad {
        tracing::error!(cluster = %ec.name_any(), configmap = %config_name, error = %e, "the loop's memory has an entry it cannot read");
    }
    let bad_note = (!bad.is_empty()).then(|| {
        bad.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    });
    let pods = member_pods(ec, kids).await?;
    let exits = exits(ec, &pods);
    let recorded = recorded_cluster_id(ec);
    // No member ready and none running: nothing could answer (a cluster being created, or
    // every member down). Not asked. A member that runs but is not ready is asked: not ready
    // may mean an alarm, a member still replaying its log, or a readiness probe that fails
    // while etcd serves (NOSPACE on v3.5.0-v3.5.10's `/health`), and the upkeep that clears
    // an alarm needs this pass's answer.
    let outcome = if ready == 0 && !any_running(&pods) {
        None
    } else {
        let transport = ctx.etcd_for(ec).await?;
        let etcd = Etcd {
            transport: transport.as_ref(),
            endpoints: render::endpoints(ec, ec.spec.size.max(replicas)),
        };
        // Recorded before a member is removed (its volume is replaced after).
        let record = async |memory: &Memory| {
            let patch = json!({"metadata": {"annotations": memory.annotations()}});
            kids.api::<ConfigMap>()
                .patch(&config_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let input = Inputs {
            exits: &exits,
            before: &before,
            cluster_id: recorded,
            now: k8s_openapi::jiff::Timestamp::now(),
            timeouts: ctx.settings.member_timeouts,
        };
        let outcome = pass(ec, &etcd, input, record).await;
        if let Some(e) = &outcome.unreachable {
            tracing::warn!(cluster = %ec.name_any(), error = %e, "no member answered member list");
            // With a client certificate the members may no longer take (renewed, a new CA):
            // read it again on the next pass rather than in up to CLIENT_SECRET_REFRESH.
            ctx.reread_client_secret(ec);
        }
        if let Some(why) = &outcome.foreign {
            tracing::error!(cluster = %ec.name_any(), "{why}");
            ctx.event(ec, EventType::Warning, "ForeignMembers", why.clone())
                .await;
        }
        // Told once: while the Members condition already says it, the status carries it.
        if let Some(why) = &outcome.undecided
            && !has_condition(ec, "Members", "CorruptionUndecided")
        {
            tracing::error!(cluster = %ec.name_any(), "{why}");
            ctx.event(ec, EventType::Warning, "CorruptionUndecided", why.clone())
                .await;
        }
        Some(outcome)
    };
    // No member list: a lost quorum, diagnosed from what the members said alone.
    let (quorum, plan) =
        super::rescue::diagnosis(ec, kids, outcome.as_ref(), config.as_deref(), &pods, &exits)
            .await?;
    let (outcome, foreign) = match outcome {
        Some(o) if o.members.is_some() => (Some(o), None),
        Some(o) => (None, o.foreign),
        None => (None, None),
    };
    let Some(outcome) = outcome else {
        if config.is_none() {
            let size = initial_size_recorded(ec).unwrap_or(replicas);
            kids.ensure_created(&render::bootstrap_config(ec, size, recorded.is_some()))
                .await?;
        }
        if recorded.is_some() {
            // No member on an empty volume rejoins under its old ID without a member list,
            // unless one member with data is all there is (quorum::sole_survivor; with Manual
            // recovery, once the plan is approved: quorum::approved).
            match plan.filter(|_| matches!(quorum, Some(Diagnosis::Rejoining(_)))) {
                Some(plan) => {
                    super::rescue::lift(ec, kids, config.as_deref(), &plan, &pods, &exits).await?
                }
                None => {
                    super::members::fence(ec, kids, config.as_deref(), &config_name, None, &pods)
                        .await?;
                }
            }
            // A rebuild copies the other members' data, then makes their volumes anew.
            if let Some(d) = &quorum {
                super::rescue::rebuild(ec, kids, d).await?;
            }
        } else if ready > 0 && !joins_former(config.as_deref()) {
            // A member has been ready, so the cluster has formed, even if the loop never got
            // an answer from it: from now on a pod that starts on an empty volume must join it
            // (`existing`), never bootstrap a cluster of its own (`new`).
            let patch = json!({"data": {"ETCD_INITIAL_CLUSTER_STATE": "existing"}});
            kids.api::<ConfigMap>()
                .patch(&config_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube("patch", "ConfigMap", &config_name, e))?;
        }
        // A lost quorum moves where no watch looks: a member pod's container stopping at the
        // fence, or failing its start on an empty volume, changes no object that brings a pass
        // (and with no member ready the next look would be minutes away).
        seen.settle |= quorum.is_some();
        if replicas < ec.spec.size {
            // A scale-up waits for the list. No quicker requeue: members turning ready change
            // the StatefulSet's status, which brings the next pass.
            seen.activity = Some(Activity::Scaling);
        }
        // The reason stays out of the status (it would flap between a refused connection and a
        // timeout); the log has it.
        let note = match foreign {
            Some(why) => why,
            None if ready == 0 && recorded.is_none() && joins_former(config.as_deref()) => {
                "no member is ready: created over a former cluster's volumes, the members wait for the former members to come back (the FormerVolumes Event names the claims)".to_owned()
            }
            None if ready == 0 => "no member is ready".to_owned(),
            None => "no member answered (the loop's log has the error; can it reach port 2379?)"
                .to_owned(),
        };
        seen.membership = Some(Membership {
            note: Some(note),
            quorum,
            ..Default::default()
        });
        return Ok(replicas);
    };
    let members = outcome.members.as_ref().expect("filtered on members");
    if recorded.is_none()
        && let Some(id) = outcome.cluster_id.filter(|&id| id != 0)
    {
        // The etcd cluster ID, on its first answer: every later member list must come from
        // the same cluster.
        kids.annotate_cluster(render::CLUSTER_ID_ANNOTATION, &format!("{id:x}"))
            .await?;
    }
    report(ec, kids, &outcome).await;
    super::rescue::rejoined(ec, kids, config.as_deref()).await?;
    let mut memory = outcome.memory.clone();
    if let Some(ordinal) = volume_to_replace(&outcome) {
        replace_volume(ec, kids, ordinal).await?;
        memory.replacing.remove(&ordinal);
    }
    kids.ensure(&render::members_config(
        ec,
        &membership::initial_cluster(ec, members),
        "existing",
        memory.annotations(),
    ))
    .await?;
    label_voters(ec, kids, &pods, members).await?;
    let state = Membership {
        reachable: true,
        voters: count(members, |m| !m.is_learner && m.started()),
        healthy_voters: count(members, |m| {
            // NOSPACE alone still serves (see membership::plan): the cluster runs, Degraded
            // says its writes are refused.
            !m.is_learner && outcome.health.get(&m.id).is_some_and(|h| h.serving())
        }),
        learners: count(members, |m| m.is_learner && m.started()),
        unstarted: count(members, |m| !m.started()),
        strangers: membership::strangers(ec, members)
            .iter()
            .map(|m| match membership::ordinal(ec, m) {
                Some(i) => format!(
                    "{}-{i} (volume {})",
                    ec.name_any(),
                    render::member_claim(ec, i)
                ),
                None => membership::describe(ec, m),
            })
            .collect(),
        note: [
            match (&outcome.step, &outcome.failed) {
                (_, Some(e)) => Some(e.to_string()),
                (Step::Wait(why), None) => Some(why.clone()),
                _ => None,
            },
            bad_note,
        ]
        .into_iter()
        .flatten()
        .reduce(|a, b| format!("{a}; {b}")),
        corruption_undecided: outcome.undecided.is_some(),
        quorum: None,
    };
    seen.ready = state.healthy_voters;
    seen.voters = Some(state.voters);
    seen.leader = outcome
        .health
        .values()
        .map(|h| h.leader)
        .find(|&l| l != 0)
        .and_then(|id| members.iter().find(|m| m.id == id))
        .and_then(|m| membership::ordinal(ec, m));
    // Strangers alone bring no quicker look: nothing the loop does changes them.
    if !state.converged(ec.spec.size) {
        seen.activity = Some(Activity::AddingMembers);
        seen.settle = true;
    }
    seen.membership = Some(state);
    seen.etcd = Some(crate::controller::decide::observation::EtcdView {
        members: members.clone(),
        health: outcome.health.clone(),
        steady: outcome.step == Step::Steady && outcome.failed.is_none(),
        defragmented: Vec::new(),
        corrupt: outcome
            .memory
            .corrupt
            .iter()
            .map(|(i, at)| (format!("{}-{i}", ec.name_any()), at.to_string()))
            .collect(),
    });
    Ok(membership::replicas(ec, members))
}

fn count(
    members: &[crate::controller::decide::members::Member],
    f: impl Fn(&crate::controller::decide::members::Member) -> bool,
) -> i32 {
    members.iter().filter(|m| f(m)).count() as i32
}

/// The Events of a pass's call; each names its member, so a repeat for another member is a
/// new Event, not a count on the last one.
async fn report(ec: &EtcdCluster, kids: &Children<'_>, outcome: &Outcome) {
    let ctx = kids.ctx;
    let member = |i: &i32| format!("{}-{i}", ec.name_any());
    let (type_, reason, note) = match (&outcome.step, &outcome.failed) {
        // Refused until the learner has caught up: the next pass tries again (the promote
        // timeout removes a learner that never does).
        (Step::Promote { ordinal, .. }, Some(EtcdError::Refused { message, .. })) => {
            tracing::info!(cluster = %ec.name_any(), member = %member(ordinal), reason = %message, "etcd refused the promote; trying again next pass");
            return;
        }
        // etcd refuses an add for a few seconds after a membership change, until the member
        // that answers is connected to every peer: the next pass tries again.
        (Step::AddLearner { ordinal }, Some(EtcdError::Refused { message, .. }))
            if message.contains("unhealthy cluster") =>
        {
            tracing::info!(cluster = %ec.name_any(), member = %member(ordinal), reason = %message, "etcd refused the add; trying again next pass");
            return;
        }
        (step, Some(e)) => (
            EventType::Warning,
            "MembershipCallFailed",
            format!(
                "{} of {}: {e}; the next pass decides again from the member list",
                step_name(step),
                step_member(ec, step)
            ),
        ),
        (Step::AddLearner { ordinal }, None) => (
            EventType::Normal,
            "AddedLearner",
            format!(
                "{} added as a learner; its pod starts next",
                member(ordinal)
            ),
        ),
        (Step::Promote { ordinal, .. }, None) => (
            EventType::Normal,
            "PromotedMember",
            format!("{} caught up and is a voter", member(ordinal)),
        ),
        (Step::Remove { ordinal, why, .. }, None) => {
            let claim = render::member_claim(ec, *ordinal);
            let (reason, why) = match why {
                Removal::NeverStarted(after) => (
                    "MemberNeverStarted",
                    format!(
                        "was added {}s ago and never started (see its pod's events)",
                        after.as_secs()
                    ),
                ),
                Removal::LostVolume => ("MemberVolumeLost", "lost its data".to_owned()),
                Removal::Corrupt(why) => (
                    "MemberCorrupt",
                    format!("is corrupt: {why}; the CORRUPT alarm is disarmed once it is gone"),
                ),
                Removal::StaleVolume => (
                    "MemberVolumeStale",
                    "stopped by itself after it was added: its volume names a member ID the cluster removed".to_owned(),
                ),
                Removal::NeverCaughtUp {
                    waited,
                    index,
                    leader_index,
                } => (
                    "MemberNeverCaughtUp",
                    match index {
                        0 => format!(
                            "started as a learner {}s ago and has not caught up with its leader (it does not answer; the leader is at raft index {leader_index})",
                            waited.as_secs()
                        ),
                        _ => format!(
                            "started as a learner {}s ago and has not caught up with its leader (raft index {index} of {leader_index})",
                            waited.as_secs()
                        ),
                    },
                ),
            };
            (
                EventType::Warning,
                reason,
                format!(
                    "{} {why}; removed from the membership, its volume {claim} and pod are made anew and it joins again as a learner",
                    member(ordinal)
                ),
            )
        }
        (Step::ReplaceVolume { ordinal }, None) => (
            EventType::Warning,
            "MemberVolumeReplaced",
            format!(
                "{}: volume {} named a member that is no longer in the cluster; claim and pod are made anew, empty, and the member joins again as a learner",
                member(ordinal),
                render::member_claim(ec, *ordinal)
            ),
        ),
        (Step::Disarm { ids }, None) => (
            EventType::Normal,
            "CorruptAlarmDisarmed",
            format!(
                "the CORRUPT alarm of {} disarmed: the voters hold the same data, writes are taken again",
                ids.iter()
                    .map(|id| match id {
                        0 => "no member in particular".to_owned(),
                        id => format!("member {id:x}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        (Step::Steady | Step::Wait(_), None) => return,
    };
    let pod = step_member(ec, &outcome.step);
    ctx.event_about(ec, Some(&pod), type_, reason, note).await;
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::Steady => "nothing",
        Step::Wait(_) => "a wait",
        Step::AddLearner { .. } => "the add",
        Step::Promote { .. } => "the promote",
        Step::Remove { .. } => "the removal",
        Step::ReplaceVolume { .. } => "the volume replacement",
        Step::Disarm { .. } => "the disarm",
    }
}

fn step_member(ec: &EtcdCluster, step: &Step) -> String {
    match step {
        Step::AddLearner { ordinal }
        | Step::Promote { ordinal, .. }
        | Step::Remove { ordinal, .. }
        | Step::ReplaceVolume { ordinal } => format!("{}-{ordinal}", ec.name_any()),
        Step::Steady | Step::Wait(_) | Step::Disarm { .. } => ec.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, statuses: serde_json::Value, deleting: bool) -> std::sync::Arc<Pod> {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "prod"},
            "status": {"containerStatuses": statuses}});
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2026-12-05T10:00:00Z");
        }
        std::sync::Arc::new(serde_json::from_value(p).unwrap())
    }

    fn etcd(state: serde_json::Value, last: serde_json::Value) -> serde_json::Value {
        json!([{"name": "etcd", "image": "x", "imageID": "", "ready": false,
            "restartCount": 1, "state": state, "lastState": last}])
    }

    /// As a real kubelet reports it: a container that has just ended is in `state.terminated`
    /// (its earlier run, if any, in `lastState`), so the run that ended now is the one read;
    /// a running container's last end is its `lastState`. A pod being deleted says nothing
    /// (issue 45 item 9: the played kubelet sets only `lastState`, so reading `lastState`
    /// first stayed green there).
    #[test]
    fn the_run_that_ended_now_is_read_before_the_one_before_it() {
        let ec = crate::controller::render::tests::cluster("etcd", 3, None);
        let ended = |code: i32, message: &str, at: &str| json!({"terminated": {"exitCode": code, "message": message, "finishedAt": at}});
        let pods = vec![
            // Ended now with a lost volume; the run before it stopped cleanly.
            pod(
                "etcd-0",
                etcd(
                    ended(1, "[lastIndex(0)]", "2026-12-05T10:05:00Z"),
                    ended(0, "", "2026-12-05T10:00:00Z"),
                ),
                false,
            ),
            // Running again after an error exit.
            pod(
                "etcd-1",
                etcd(
                    json!({"running": {"startedAt": "2026-12-05T10:06:00Z"}}),
                    ended(1, "has already been bootstrapped", "2026-12-05T10:05:30Z"),
                ),
                false,
            ),
            pod(
                "etcd-2",
                etcd(ended(0, "", "2026-12-05T10:07:00Z"), json!({})),
                true,
            ),
        ];
        let exits = exits(&ec, &pods);
        assert_eq!(
            exits.len(),
            2,
            "the pod being deleted is left out: {exits:?}"
        );
        assert_eq!((exits[&0].code, exits[&0].lost_volume()), (1, true));
        assert_eq!(
            exits[&0].at,
            Some("2026-12-05T10:05:00Z".parse().unwrap()),
            "the run that ended now"
        );
        assert_eq!((exits[&1].code, exits[&1].lost_volume()), (1, true));
    }
}
