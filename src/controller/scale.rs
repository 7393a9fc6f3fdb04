//! The reconcile side of [`super::membership`]: reads the members' ConfigMap and pods from the
//! caches, runs one membership pass against etcd, and writes back what it decided: the
//! ConfigMap (before the StatefulSet grows), the voters' pod label, Events and what the status
//! says about the members.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::children::Children;
use super::etcd::{Etcd, EtcdError};
use super::finalizer::initial_size_recorded;
use super::membership::{self, Memory, Outcome, Removal, Step};
use super::status::{Activity, Membership, Observation};
use super::{Error, render};
use crate::api::v1::EtcdCluster;

/// The ordinal of a member pod `NAME-i` of `ec`.
fn pod_ordinal(ec: &EtcdCluster, pod: &Pod) -> Option<i32> {
    pod.name_any()
        .strip_prefix(&format!("{}-", ec.name_any()))?
        .parse()
        .ok()
}

/// The member pods of `ec` from the pods cache.
async fn member_pods(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Vec<std::sync::Arc<Pod>>, Error> {
    let selector = render::member_selector(ec);
    Ok(kids
        .cached::<Pod>()
        .await?
        .into_iter()
        .filter(|p| p.namespace() == ec.namespace())
        .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
        .collect())
}

/// Ordinals whose etcd container last ended saying its data directory is gone.
fn lost_volumes(ec: &EtcdCluster, pods: &[std::sync::Arc<Pod>]) -> BTreeSet<i32> {
    pods.iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.name == "etcd")
                .any(|c| {
                    [c.last_state.as_ref(), c.state.as_ref()]
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.terminated.as_ref()?.message.as_deref())
                        .any(membership::lost_volume)
                })
        })
        .filter_map(|p| pod_ordinal(ec, p))
        .collect()
}

/// One membership pass for a cluster whose StatefulSet exists; returns the pods the
/// StatefulSet must run. Without an answer from etcd the StatefulSet keeps `replicas`.
/// `ready` is the StatefulSet's count of ready pods.
pub(super) async fn converge(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
    ready: i32,
    seen: &mut Observation,
) -> Result<i32, Error> {
    let ctx = kids.ctx;
    let config_name = render::members_config_name(ec);
    let config = kids.read::<ConfigMap>(&config_name).await?;
    let note = |key: &str| {
        config
            .as_ref()
            .and_then(|c| c.annotations().get(key).cloned())
            .unwrap_or_default()
    };
    let before = Memory {
        joining: membership::parse_joining(&note(render::JOINING_ANNOTATION)),
        replacing: membership::parse_replacing(&note(render::REPLACING_ANNOTATION)),
    };
    let pods = member_pods(ec, kids).await?;
    let lost = lost_volumes(ec, &pods);
    // No member ready: nothing answers `member list` with a leader (a cluster being created,
    // or one without a quorum), and no membership change could be made. Not asked.
    let outcome = if ready == 0 {
        None
    } else {
        let etcd = Etcd {
            transport: ctx.etcd.as_ref(),
            endpoints: render::endpoints(ec, ec.spec.size.max(replicas)),
        };
        // Recorded before a member is removed for its lost volume.
        let record = async |memory: &Memory| {
            let patch = json!({"metadata": {"annotations": {
                render::REPLACING_ANNOTATION: membership::replacing_annotation(&memory.replacing),
            }}});
            kids.api::<ConfigMap>()
                .patch(&config_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let outcome = membership::pass(
            ec,
            &etcd,
            &lost,
            &before,
            k8s_openapi::jiff::Timestamp::now(),
            ctx.settings.join_timeout,
            record,
        )
        .await;
        if let Some(e) = &outcome.unreachable {
            tracing::warn!(cluster = %ec.name_any(), error = %e, "no member answered member list");
        }
        Some(outcome).filter(|o| o.members.is_some())
    };
    let Some(outcome) = outcome else {
        if config.is_none() {
            let size = initial_size_recorded(ec).unwrap_or(replicas);
            kids.ensure_created(&render::bootstrap_config(ec, size))
                .await?;
        }
        if replicas < ec.spec.size {
            // A scale-up waits for the list. No quicker requeue: members turning ready change
            // the StatefulSet's status, which brings the next pass.
            seen.activity = Some(Activity::Scaling);
        }
        // The reason stays out of the status (it would flap between a refused connection and a
        // timeout); the log has it.
        let note = if ready == 0 {
            "no member is ready"
        } else {
            "no member answered (the loop's log has the error; can it reach port 2379?)"
        };
        seen.membership = Some(Membership {
            note: Some(note.to_owned()),
            ..Default::default()
        });
        return Ok(replicas);
    };
    let members = outcome.members.as_ref().expect("filtered on members");
    report(ec, kids, &outcome).await;
    let mut memory = outcome.memory.clone();
    if let Some(ordinal) = membership::volume_to_replace(&outcome) {
        replace_volume(ec, kids, ordinal).await?;
        memory.replacing.remove(&ordinal);
    }
    kids.ensure(&render::members_config(
        ec,
        &membership::initial_cluster(ec, members),
        "existing",
        &memory,
    ))
    .await?;
    label_voters(ec, kids, &pods, members).await?;
    let state = Membership {
        reachable: true,
        voters: count(members, |m| !m.is_learner && m.started()),
        healthy_voters: count(members, |m| {
            !m.is_learner && outcome.health.get(&m.id).is_some_and(|h| h.healthy())
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
                None => format!("{} {:x}", m.name, m.id),
            })
            .collect(),
        note: match (&outcome.step, &outcome.failed) {
            (_, Some(e)) => Some(e.to_string()),
            (Step::Wait(why), None) => Some(why.clone()),
            _ => None,
        },
    };
    seen.ready = state.healthy_voters;
    if !state.settled(ec.spec.size) {
        seen.activity = Some(Activity::AddingMembers);
        seen.settle = true;
    }
    seen.membership = Some(state);
    Ok(membership::replicas(ec, members))
}

fn count(members: &[super::etcd::Member], f: impl Fn(&super::etcd::Member) -> bool) -> i32 {
    members.iter().filter(|m| f(m)).count() as i32
}

/// The Events of a pass's call.
async fn report(ec: &EtcdCluster, kids: &Children<'_>, outcome: &Outcome) {
    let ctx = kids.ctx;
    let member = |i: &i32| format!("{}-{i}", ec.name_any());
    let (type_, reason, note) = match (&outcome.step, &outcome.failed) {
        // Refused until the learner has caught up: the next pass tries again.
        (Step::Promote { .. }, Some(EtcdError::Refused { .. })) => return,
        // etcd refuses an add for a few seconds after a membership change, until the member
        // that answers is connected to every peer: the next pass tries again.
        (Step::AddLearner { .. }, Some(EtcdError::Refused { message, .. }))
            if message.contains("unhealthy cluster") =>
        {
            return;
        }
        (step, Some(e)) => (
            EventType::Warning,
            "MembershipCallFailed",
            format!("{step:?}: {e}; the next pass decides again from the member list"),
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
        (
            Step::Remove {
                ordinal,
                why: Removal::NeverStarted(after),
                ..
            },
            None,
        ) => (
            EventType::Warning,
            "MemberNeverStarted",
            format!(
                "{} was added {}s ago and never started (see its pod's events); removed from the membership, it is added again next",
                member(ordinal),
                after.as_secs()
            ),
        ),
        (
            Step::Remove {
                ordinal,
                why: Removal::LostVolume,
                ..
            },
            None,
        ) => (
            EventType::Warning,
            "MemberVolumeLost",
            format!(
                "{} lost its data (volume {}); removed from the membership, its claim and pod are made anew and it joins again as a learner",
                member(ordinal),
                render::member_claim(ec, *ordinal)
            ),
        ),
        (Step::Steady | Step::Wait(_) | Step::ReplaceVolume { .. }, None) => return,
    };
    ctx.event(ec, type_, reason, note).await;
}

/// A member removed for its lost volume starts again on a new, empty one: its claim and pod
/// are deleted and the StatefulSet makes both anew (the old volume holds a data directory that
/// names the removed member, which etcd would refuse).
async fn replace_volume(ec: &EtcdCluster, kids: &Children<'_>, ordinal: i32) -> Result<(), Error> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let claim = render::member_claim(ec, ordinal);
    let pod = format!("{}-{ordinal}", ec.name_any());
    let params = kube::api::DeleteParams::background();
    for result in [
        kids.api::<PersistentVolumeClaim>()
            .delete(&claim, &params)
            .await
            .map(|_| ()),
        kids.api::<Pod>().delete(&pod, &params).await.map(|_| ()),
    ] {
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("delete", "member volume", &claim, e)),
        }
    }
    tracing::info!(cluster = %ec.name_any(), %claim, %pod, "replaced a lost member volume");
    Ok(())
}

/// Sets [`render::VOTER_LABEL`] on the pods of voters and takes it off the others, so the
/// client Service never sends a client to a learner.
async fn label_voters(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    pods: &[std::sync::Arc<Pod>],
    members: &[super::etcd::Member],
) -> Result<(), Error> {
    let voters: BTreeSet<i32> = members
        .iter()
        .filter(|m| !m.is_learner && m.started())
        .filter_map(|m| membership::ordinal(ec, m))
        .collect();
    for pod in pods {
        let Some(i) = pod_ordinal(ec, pod) else {
            continue;
        };
        let has = pod.labels().get(render::VOTER_LABEL).map(String::as_str) == Some("true");
        let want = voters.contains(&i);
        if has == want {
            continue;
        }
        let value = if want { json!("true") } else { json!(null) };
        let patch = json!({"metadata": {"labels": {render::VOTER_LABEL: value}}});
        let name = pod.name_any();
        kids.api::<Pod>()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("label", "Pod", &name, e))?;
    }
    Ok(())
}

/// The members' ConfigMap of a cluster about to be created: the members it bootstraps with.
pub(super) async fn bootstrap(ec: &EtcdCluster, kids: &Children<'_>) -> Result<(), Error> {
    kids.ensure_created(&render::bootstrap_config(ec, ec.spec.size))
        .await
        .map(|_| ())
}
