//! Backups: the CronJob of a cluster with backups on (and its volume), the runs' record in the
//! status, and what the loop forgets about a cluster that is gone (the final snapshot is
//! [`crate::controller::pass::deletion`]'s).

use k8s_openapi::api::batch::v1::CronJob;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::v1::BackupStatus;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::backup::{record, runs, verification, when};
use crate::controller::decide::observation::Observation;
use crate::controller::decide::status::has_condition;
use crate::controller::machinery::children::{Applied, Children};
use crate::controller::machinery::context::Context;
use crate::controller::machinery::error::Error;
use crate::controller::machinery::series::labels;
use crate::controller::render;
use render::BackupTarget;

/// The backup CronJob as the spec says: created, replaced or deleted (with a Warning once when
/// the destination is not supported).
pub(crate) async fn schedule(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    seen: &mut Observation,
) -> Result<(), Error> {
    let ctx = kids.ctx;
    let opts = &ctx.settings.render;
    let name = ec.name_any();
    let cron_name = format!("{name}-backup");
    let target = render::backup_target(ec);
    if !matches!(target, Some(Ok(_))) {
        unexport_schedule(ec, ctx);
    }
    // Which bucket prefix this cluster files in now (none: off, the claim, unsupported), and
    // the other clusters there the first time it shares one.
    let url = match &target {
        Some(Ok(BackupTarget::S3(url))) => Some(url.clone()),
        _ => None,
    };
    let others = ctx.destinations.lock().expect("not poisoned").record(
        &crate::controller::machinery::context::key(ec),
        url.as_deref(),
    );
    match target {
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
            let was_warned = has_condition(ec, "BackupReady", "UnsupportedDestination");
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
            if let (Some(others), Some(url)) = (others, url) {
                let message = format!(
                    "spec.backup.destination {url} is also where {} file their snapshots: each cluster's names carry its namespace and UID, so none prunes or overwrites another's, but a bucket's lifecycle rule or a restore that picks the newest object in the prefix sees them all; give each cluster a prefix of its own",
                    others.join(", ")
                );
                tracing::warn!(cluster = %name, %message, "a shared backup destination");
                ctx.event(ec, EventType::Warning, "SharedDestination", message)
                    .await;
            }
            let (applied, cron) = kids
                .ensure(&render::backup_cron_job(ec, &target, opts))
                .await?;
            export_schedule(ec, ctx, &cron);
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

/// The schedule's gauges the overdue-backup alert reads: the longest gap between two runs and
/// since when the CronJob exists. A schedule that never runs (`0 0 30 2 *`) has no gap to
/// export, so the overdue-backup alert cannot fire for it.
fn export_schedule(ec: &EtcdCluster, ctx: &Context, cron: &CronJob) {
    let labels = labels(ec);
    let schedule = Some(cron.spec.schedule.as_str());
    match schedule.map(crate::admission::cron::longest_gap) {
        Some(Ok(gap)) => {
            let gap = i64::try_from(gap).unwrap_or(i64::MAX);
            ctx.metrics.backup_interval.get_or_create(&labels).set(gap);
        }
        _ => {
            ctx.metrics.backup_interval.remove(&labels);
        }
    }
    if let Some(created) = cron.metadata.creation_timestamp.as_ref() {
        ctx.metrics
            .backup_scheduled_since
            .get_or_create(&labels)
            .set(created.0.as_second());
    }
}

fn unexport_schedule(ec: &EtcdCluster, ctx: &Context) {
    let labels = labels(ec);
    ctx.metrics.backup_interval.remove(&labels);
    ctx.metrics.backup_scheduled_since.remove(&labels);
}

/// Reads the backup pods' reports into `seen.backup`, tells each new one as an Event and sets
/// the last-success metric.
pub(crate) async fn observe(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    seen: &mut Observation,
) -> Result<(), Error> {
    let ctx = kids.ctx;
    let pods = kids.pods().await?;
    let previous = ec.status.as_ref().and_then(|s| s.backup.as_ref());
    let (mut status, events) = record(previous, &runs(ec, &pods));
    for (type_, reason, note) in events {
        ctx.event(ec, type_, reason, note).await;
    }
    if let Some(status) = status.as_mut() {
        verify(ec, kids, &pods, status).await?;
    }
    if let Some(at) = status
        .as_ref()
        .and_then(|s| s.last.as_ref())
        .and_then(|l| when(&l.time))
    {
        ctx.metrics
            .backup_last_success
            .get_or_create(&labels(ec))
            .set(at.as_millisecond() as f64 / 1000.0);
    }
    seen.backup = status;
    Ok(())
}

/// The newest snapshot proven by restoring it: its verification Job made once (for a snapshot
/// whose backup recorded a hash), its outcome recorded in `status.lastVerified` with an Event,
/// and the gauges the verification alerts read.
async fn verify(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>],
    status: &mut BackupStatus,
) -> Result<(), Error> {
    let ctx = kids.ctx;
    let Some(last) = status.last.clone() else {
        return Ok(());
    };
    let told = status
        .last_verified
        .as_ref()
        .is_some_and(|v| v.uri == last.uri);
    if !told {
        if let Some(v) = verification(ec, pods, &last) {
            let (type_, reason) = match v.outcome.as_str() {
                render::VERIFY_OK => (EventType::Normal, "BackupVerified"),
                render::VERIFY_INCONCLUSIVE => {
                    (EventType::Normal, "BackupVerificationInconclusive")
                }
                _ => (EventType::Warning, "BackupVerificationFailed"),
            };
            ctx.event(ec, type_, reason, format!("{}: {}", v.uri, v.message))
                .await;
            status.last_verified = Some(v);
        } else if let Some(job) = render::verify_job(ec, &last, &ctx.settings.render) {
            kids.ensure_created(&job).await?;
        }
    }
    let labels = labels(ec);
    match &status.last_verified {
        Some(v) if v.outcome == render::VERIFY_FAILED => {
            ctx.metrics
                .backup_verification_failed
                .get_or_create(&labels)
                .set(1);
        }
        Some(v) => {
            ctx.metrics
                .backup_verification_failed
                .get_or_create(&labels)
                .set(0);
            if v.outcome == render::VERIFY_OK
                && let Some(at) = when(&v.time)
            {
                ctx.metrics
                    .backup_last_verified
                    .get_or_create(&labels)
                    .set(at.as_millisecond() as f64 / 1000.0);
            }
        }
        None => {}
    }
    Ok(())
}
