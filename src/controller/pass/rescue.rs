//! A lost quorum, diagnosed and acted on: the diagnosis from what the members said alone
//! ([`crate::controller::decide::quorum`]), told once, and the rebuild's part: a rescue Job for
//! each member whose data is to be copied, and a new volume for each member copied. The fence
//! itself is [`super::members::fence`].

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::v1::EtcdCluster;
use crate::controller::decide::exits::Exit;
use crate::controller::decide::quorum::{self, Diagnosis, Rescue, diagnose};
use crate::controller::decide::status::has_condition;
use crate::controller::etcd::membership::Outcome;
use crate::controller::machinery::children::{Children, job_outcome, report_on_its_way};
use crate::controller::machinery::error::Error;
use crate::controller::render::{self, BackupTarget};

/// Where a rescue's copies go: the backup destination, as the snapshots' URIs name it.
fn destination(ec: &EtcdCluster) -> Option<String> {
    match render::backup_target(ec)? {
        Ok(BackupTarget::Volume) => Some(crate::api::claim_uri(&render::backup_claim_name(ec), "")),
        Ok(BackupTarget::S3(url)) => Some(format!(
            "{}/{}/",
            url.trim_end_matches('/'),
            ec.namespace().unwrap_or_default()
        )),
        Err(_) => None,
    }
}

/// The diagnosis of a pass whose member list failed (`None` otherwise), told once as a
/// Warning with the condition's reason (while `Available` says it, the status carries it),
/// and the plan a recovery would carry out ([`quorum::plan`]). `config`: the members'
/// ConfigMap, which says the plan the fence was last lifted for.
pub(crate) async fn diagnosis(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    outcome: Option<&Outcome>,
    config: Option<&ConfigMap>,
    pods: &[Arc<Pod>],
    exits: &BTreeMap<i32, Exit>,
) -> Result<(Option<Diagnosis>, Option<String>), Error> {
    let Some(o) = outcome.filter(|o| o.unreachable.is_some()) else {
        return Ok((None, None));
    };
    let newest = ec
        .status
        .as_ref()
        .and_then(|s| s.backup.as_ref())
        .and_then(|b| b.last.as_ref());
    let ended = super::members::stopped_exits(ec, pods, exits, config);
    let rescue = Rescue {
        destination: destination(ec),
        lifted: config
            .and_then(|c| c.metadata.annotations.as_ref())
            .and_then(|a| a.get(render::REJOIN_PLAN_ANNOTATION))
            .cloned(),
        rejoining: has_condition(ec, "Available", "RejoiningFromSurvivor"),
        ..crate::controller::decide::backup::rescues(ec, &kids.pods().await?)
    };
    let d = diagnose(ec, &o.survey, &ended, newest, &rescue);
    let ctx = kids.ctx;
    // Told once: not while the status says it, nor when this replica's last diagnosis said it
    // (the status of a pass that started on a stale cached object lags).
    let key = format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any());
    let said = match &d {
        Some(d) => ctx.quorum_said.lock().unwrap().insert(key, d.reason()),
        None => ctx.quorum_said.lock().unwrap().remove(&key),
    };
    if let Some(d) = d.as_ref().filter(|d| d.warns())
        && !has_condition(ec, "Available", d.reason())
        && said != Some(d.reason())
    {
        if matches!(d, Diagnosis::DataLost(_)) {
            tracing::error!(cluster = %ec.name_any(), "{}", d.message());
        } else {
            tracing::warn!(cluster = %ec.name_any(), "{}", d.message());
        }
        ctx.event(ec, EventType::Warning, d.reason(), d.message().to_owned())
            .await;
    }
    // A rejoin that has a leader goes on under the plan its fence was lifted for (the
    // survivor's applied index has moved past that plan's).
    let led = o.survey.values().any(|s| s.leader != 0);
    let plan = match (&d, rescue.lifted) {
        (Some(Diagnosis::Rejoining(_)), Some(lifted)) if led => Some(lifted),
        _ => quorum::plan(ec, &o.survey),
    };
    Ok((d, plan))
}

/// A rebuild's step ([`Diagnosis::Rebuilding`]) or a restore's ([`Diagnosis::Restoring`]): a
/// rescue Job for each member to copy (one left from another plan, or failed, goes first, and
/// the next pass starts it again), a new volume for each member whose copy for this plan is
/// filed, and, for a restore whose copies are all filed, the request to restore in place.
/// Nothing else.
pub(crate) async fn rebuild(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    d: &Diagnosis,
) -> Result<(), Error> {
    let (plan, copy, wipe, restore) = match d {
        Diagnosis::Rebuilding {
            plan, copy, wipe, ..
        } => (plan, copy, &wipe[..], None),
        Diagnosis::Restoring {
            plan,
            copy,
            restore,
            ..
        } => (plan, copy, &[][..], Some(restore)),
        _ => return Ok(()),
    };
    let Some(Ok(target)) = render::backup_target(ec) else {
        return Ok(());
    };
    let ctx = kids.ctx;
    let pods = kids.pods().await?;
    for &ordinal in copy {
        let name = render::rescue_job_name(ec, ordinal);
        match kids.read::<Job>(&name).await? {
            None => {
                let job = render::rescue_job(ec, &target, &ctx.settings.render, ordinal, plan);
                kids.ensure_created(&job).await?;
                tracing::warn!(cluster = %ec.name_any(), member = ordinal, %plan, "copying the member's data before its volume is made anew");
            }
            // From another plan, failed, or done without a report of its copy (its pod gone,
            // or its report unreadable): made again on the next pass. A Job seen finished
            // while the pods' cache still shows its pod running is waited for: the report
            // is on its way (the two caches are fed by separate watches), and deleting the
            // Job would delete the pod that carries it.
            Some(job)
                if job.annotations().get(render::RESCUE_PLAN_ANNOTATION) != Some(plan)
                    || (job_outcome(&job).is_some() && !report_on_its_way(&job, &pods)) =>
            {
                kids.remove::<Job>(&name).await?;
            }
            // Running, or its report on its way.
            Some(_) => {}
        }
    }
    for &ordinal in wipe {
        super::members::replace_volume(ec, kids, ordinal).await?;
        ctx.event(
            ec,
            EventType::Normal,
            "MemberDataCopied",
            format!(
                "{}-{ordinal}'s data is copied (rescue Job {}); its volume is made anew for the rebuild ({plan})",
                ec.name_any(),
                render::rescue_job_name(ec, ordinal)
            ),
        )
        .await;
    }
    // A restore in place once every member's data is copied: asked for on the cluster
    // itself, where the next passes find it ([`super::restore::clear`]).
    if let Some(restore) = restore.filter(|_| copy.is_empty()) {
        kids.annotate_cluster(
            render::RESTORE_IN_PLACE_ANNOTATION,
            &restore.to_annotation(),
        )
        .await?;
        ctx.event(
            ec,
            EventType::Warning,
            "RestoringInPlace",
            format!(
                "the data of every member that held any is copied ({}); the StatefulSet, the member pods, their volumes and the members' ConfigMap are deleted, then every member is restored from {} ({plan})",
                restore.copies.join(", "),
                restore.from
            ),
        )
        .await;
        tracing::warn!(cluster = %ec.name_any(), %plan, from = %restore.from, "restoring the newest snapshot in place");
    }
    Ok(())
}

/// The fence lifted for `plan` ([`super::members::fence`]); the first time for this plan, the
/// pods of the members known empty (stopped at the fence, their volumes lost) are deleted, so
/// that the StatefulSet makes them anew at once: a new pod starts without the crash-loop
/// back-off the fence's refusals built up (up to five minutes on a kubelet), and its volume
/// is empty anyway.
pub(crate) async fn lift(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    config: Option<&ConfigMap>,
    plan: &str,
    pods: &[Arc<Pod>],
    exits: &BTreeMap<i32, Exit>,
) -> Result<(), Error> {
    let name = render::members_config_name(ec);
    if !super::members::fence(ec, kids, config, &name, Some(plan), pods).await? {
        return Ok(());
    }
    let empty: Vec<i32> = super::members::stopped_exits(ec, pods, exits, config)
        .into_iter()
        .filter(|(_, e)| e.empty_volume())
        .map(|(i, _)| i)
        .collect();
    for i in empty {
        let pod = format!("{}-{i}", ec.name_any());
        match kids
            .api::<Pod>()
            .delete(&pod, &kube::api::DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("delete", "Pod", &pod, e)),
        }
        tracing::info!(cluster = %ec.name_any(), %pod, %plan, "the empty member's pod is made anew to rejoin at once");
    }
    Ok(())
}

/// A member list answers again: a rejoin the fence was lifted for is over, so its plan is
/// dropped from the members' ConfigMap (the loop's apply of that ConfigMap leaves an
/// annotation it did not apply). A plan still recorded means a rejoin under way
/// ([`quorum::diagnose`]), never one an earlier recovery finished.
pub(crate) async fn rejoined(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    config: Option<&ConfigMap>,
) -> Result<(), Error> {
    let Some(plan) = config
        .and_then(|c| c.metadata.annotations.as_ref())
        .and_then(|a| a.get(render::REJOIN_PLAN_ANNOTATION))
    else {
        return Ok(());
    };
    let name = render::members_config_name(ec);
    let patch =
        serde_json::json!({"metadata": {"annotations": {render::REJOIN_PLAN_ANNOTATION: null}}});
    kids.api::<ConfigMap>()
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube("patch", "ConfigMap", &name, e))?;
    tracing::info!(cluster = %ec.name_any(), %plan, "the member list answers: the rejoin is over");
    Ok(())
}
