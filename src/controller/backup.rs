//! Backups: the CronJob of a cluster with backups on (and its volume), and the final snapshot
//! deletion waits for before the finalizer goes.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::children::{Applied, Children, job_outcome};
use super::finalizer::{has_finalizer, remove_finalizer};
use super::status::Observation;
use super::status_writer::update_status;
use super::{Context, Error, render};
use crate::api::v1::EtcdCluster;
use render::BackupTarget;

/// The backup CronJob as the spec says: created, replaced or deleted (with a Warning once when
/// the destination is not supported).
pub(super) async fn schedule(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    seen: &mut Observation,
) -> Result<(), Error> {
    let ctx = kids.ctx;
    let opts = &ctx.settings.render;
    let name = ec.name_any();
    let cron_name = format!("{name}-backup");
    match render::backup_target(ec) {
        None => {
            if kids.remove::<CronJob>(&cron_name).await? {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "BackupDisabled",
                    format!("deleted CronJob {cron_name}"),
                )
                .await;
            }
        }
        Some(Err(unsupported)) => {
            let was_warned = ec
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "BackupReady" && c.status == "False")
                });
            kids.remove::<CronJob>(&cron_name).await?;
            if !was_warned {
                ctx.event(
                    ec,
                    EventType::Warning,
                    "BackupUnsupported",
                    unsupported.to_string(),
                )
                .await;
            }
            seen.warning = Some(unsupported.to_string());
        }
        Some(Ok(target)) => {
            if target == BackupTarget::Volume {
                kids.ensure(&render::backup_claim(ec)).await?;
            }
            let (applied, _) = kids
                .ensure(&render::backup_cron_job(ec, &target, opts))
                .await?;
            if applied == Applied::Created {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "BackupScheduled",
                    format!("CronJob {cron_name}"),
                )
                .await;
            }
        }
    }
    Ok(())
}

/// Deletion: the final snapshot (when backups are on) as a Job, waited for by requeueing,
/// then the finalizer goes. It always goes: a failed Job or `--finalizer-timeout` remove it
/// with a Warning event.
pub(super) async fn cleanup(
    ec: &EtcdCluster,
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
) -> Result<Action, Error> {
    if !has_finalizer(ec) {
        ctx.finalizing(ec, false);
        return Ok(Action::await_change());
    }
    let ready = ec
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let seen = Observation {
        ready,
        deleting: true,
        ..Default::default()
    };
    update_status(ctx, clusters, ec, &seen).await?;
    let since = ec
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let elapsed = k8s_openapi::jiff::Timestamp::now()
        .duration_since(since)
        .unsigned_abs();
    let timeout = ctx.settings.finalizer_timeout;
    let Some(Ok(target)) = render::backup_target(ec) else {
        return finalized(ctx, clusters, ec).await;
    };
    let kids = Children::of(ec, ctx);
    let job_name = format!("{}-final-snapshot", ec.name_any());
    // No members, nothing to snapshot (e.g. a cluster whose spec was never acted on).
    if matches!(kids.read::<StatefulSet>(&ec.name_any()).await, Ok(None)) {
        return finalized(ctx, clusters, ec).await;
    }
    let give_up = |why: String| async move {
        ctx.event(ec, EventType::Warning, "FinalSnapshotSkipped", why)
            .await;
        finalized(ctx, clusters, ec).await
    };
    let job = match kids.read::<Job>(&job_name).await {
        Ok(job) => job,
        Err(e) if elapsed >= timeout => {
            return give_up(format!(
                "cannot read Job {job_name} ({e}) and --finalizer-timeout ({}) has passed; finalizer removed without a final snapshot",
                humantime::format_duration(timeout)
            ))
            .await;
        }
        Err(e) => return Err(e),
    };
    match job.as_deref().and_then(job_outcome) {
        Some(true) => {
            ctx.event(
                ec,
                EventType::Normal,
                "FinalSnapshotTaken",
                format!("Job {job_name} completed; removing the finalizer"),
            )
            .await;
            return finalized(ctx, clusters, ec).await;
        }
        Some(false) => {
            return give_up(format!(
                "Job {job_name} failed; finalizer removed without a final snapshot"
            ))
            .await;
        }
        None if elapsed >= timeout => {
            return give_up(format!(
                "Job {job_name} did not finish within --finalizer-timeout ({}); finalizer removed without a final snapshot",
                humantime::format_duration(timeout)
            ))
            .await;
        }
        None => {}
    }
    ctx.finalizing(ec, true);
    if job.is_none() {
        let desired = render::final_snapshot_job(ec, &target, &ctx.settings.render);
        kids.ensure_created(&desired).await?;
        ctx.event(
            ec,
            EventType::Normal,
            "FinalSnapshot",
            format!("Job {job_name} started; the cluster is removed when it finishes"),
        )
        .await;
    }
    let left = timeout.saturating_sub(elapsed);
    Ok(Action::requeue(
        Duration::from_secs(10)
            .min(left)
            .max(Duration::from_secs(1)),
    ))
}

/// The finalizer goes; nothing more to wait for.
async fn finalized(
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
    ec: &EtcdCluster,
) -> Result<Action, Error> {
    remove_finalizer(clusters, ec).await?;
    ctx.finalizing(ec, false);
    Ok(Action::await_change())
}
