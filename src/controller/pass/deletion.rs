//! Deletion: with backups on, the final snapshot as a Job, waited for by requeueing, and the
//! claims kept ([`crate::controller::pass::claims`]) until it is taken; then the finalizer goes.
//!
//! The data is never lost on the way: a failed Job, or one that runs past its deadline
//! (`--finalizer-timeout` plus the time the largest database takes to copy), is started again
//! with a Warning; a deletion that takes the members away before the snapshot (a foreground
//! deletion, a namespace deletion, a StatefulSet deleted by hand) holds the claims and says what
//! to do. Only the user lets a cluster go without its final snapshot: by turning backups off, or
//! with [`RELEASE_ANNOTATION`]`=true`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::Observation;
use crate::controller::machinery::children::{Children, job_outcome, owned_by};
use crate::controller::machinery::context::Context;
use crate::controller::machinery::error::Error;
use crate::controller::machinery::finalizer::CLAIM_FINALIZER;
use crate::controller::machinery::finalizer::RELEASE_ANNOTATION;
use crate::controller::machinery::finalizer::{has_finalizer, remove_finalizer};
use crate::controller::machinery::status_writer::update_status;
use crate::controller::{pass::claims, render};

/// How long a failed final-snapshot Job stays before a new one is started (its pods' logs stay
/// readable meanwhile).
const RETRY: Duration = Duration::from_secs(60);
/// How often a held deletion looks again (the annotation that releases it arrives as a watch
/// event at once).
const HELD: Duration = Duration::from_secs(300);
/// The pace a final snapshot is given on top of `--finalizer-timeout`: the member streams its
/// whole database, the Job writes it and reads it back.
const COPY_BYTES_PER_SECOND: u64 = 8 << 20;

/// The finalizer given by the GC to an object deleted with `propagationPolicy: Foreground`.
const FOREGROUND: &str = "foregroundDeletion";

/// How long one final-snapshot Job may run before it counts as failed: `--finalizer-timeout`
/// plus the largest member database (as the status last recorded it) at 8 MiB/s.
pub(crate) fn attempt_deadline(ec: &EtcdCluster, timeout: Duration) -> Duration {
    let largest = ec
        .status
        .iter()
        .flat_map(|s| s.members.iter().flatten())
        .filter_map(|m| u64::try_from(m.db_size.unwrap_or(0)).ok())
        .max()
        .unwrap_or(0);
    timeout + Duration::from_secs(largest / COPY_BYTES_PER_SECOND)
}

/// Why no final snapshot can be taken from this cluster's members any more, if so.
pub(crate) fn members_going(ec: &EtcdCluster, set: Option<&StatefulSet>) -> Option<&'static str> {
    if ec.finalizers().iter().any(|f| f == FOREGROUND) {
        return Some(
            "it is deleted in the foreground (propagationPolicy Foreground, kubectl delete --cascade=foreground), so the garbage collector deletes its members beside the finalizer",
        );
    }
    match set {
        None => Some("its StatefulSet is gone"),
        Some(s) if s.metadata.deletion_timestamp.is_some() => {
            Some("its StatefulSet is being deleted")
        }
        Some(_) => None,
    }
}

fn release_asked(ec: &EtcdCluster) -> bool {
    ec.annotations().get(RELEASE_ANNOTATION).map(String::as_str) == Some("true")
}

/// Whether an apiserver refusal is the namespace lifecycle's: nothing new may be created in a
/// namespace being deleted.
fn namespace_terminating(e: &Error) -> bool {
    match e {
        Error::Kube { source, .. } => match source.as_ref() {
            kube::Error::Api(s) => s.code == 403 && s.message.contains("being terminated"),
            _ => false,
        },
        _ => false,
    }
}

/// The deletion pass.
pub(crate) async fn cleanup(
    ec: &EtcdCluster,
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
) -> Result<Action, Error> {
    if !has_finalizer(ec) {
        ctx.finalizing(ec, false);
        return Ok(Action::await_change());
    }
    let kids = Children::of(ec, ctx);
    let name = ec.name_any();
    let Some(Ok(target)) = render::backup_target(ec) else {
        // Backups off (or to a destination no Job can write): nothing to take, nothing kept.
        note(ctx, clusters, ec, None).await?;
        claims::release(ec, &kids).await?;
        return finalized(ctx, clusters, ec).await;
    };
    if release_asked(ec) {
        let released = claims::release(ec, &kids).await?;
        let kept = if released.is_empty() {
            String::new()
        } else {
            format!("; the claims {} are no longer kept", released.join(", "))
        };
        ctx.event(
            ec,
            EventType::Warning,
            "FinalSnapshotSkipped",
            format!("{RELEASE_ANNOTATION}=true: the cluster goes without a final snapshot{kept}"),
        )
        .await;
        return finalized(ctx, clusters, ec).await;
    }
    let set = kids.read::<StatefulSet>(&name).await?;
    if let Some(why) = members_going(ec, set.as_deref()) {
        return hold(ec, ctx, clusters, &kids, why).await;
    }
    let job_name = format!("{name}-final-snapshot");
    let job = kids.read::<Job>(&job_name).await?;
    if let Some(j) = &job
        && (!owned_by(&j.metadata, ec) || j.metadata.deletion_timestamp.is_some())
    {
        // A former cluster's Job of this name (its owner is gone, so the garbage collector
        // removes it), or this cluster's failed attempt on its way out: never this cluster's
        // snapshot; wait for it to go.
        tracing::info!(cluster = %name, job = %job_name, "a final-snapshot Job of a former cluster, or a failed attempt, is still there; waiting for it to go");
        ctx.finalizing(ec, true);
        let why = format!("waiting for the Job {job_name} of a former cluster or attempt to go");
        note(ctx, clusters, ec, Some(why)).await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let deadline = attempt_deadline(ec, ctx.settings.finalizer_timeout);
    match job.as_deref().and_then(job_outcome) {
        Some(true) => {
            let released = claims::release(ec, &kids).await?;
            ctx.event(
                ec,
                EventType::Normal,
                "FinalSnapshotTaken",
                format!(
                    "Job {job_name} completed; {}removing the finalizer",
                    if released.is_empty() {
                        String::new()
                    } else {
                        format!("the claims {} are released; ", released.join(", "))
                    }
                ),
            )
            .await;
            return finalized(ctx, clusters, ec).await;
        }
        Some(false) => {
            let since = job
                .as_deref()
                .and_then(failed_at)
                .map_or_else(|| job_age(job.as_deref()), elapsed_since);
            if since < RETRY {
                ctx.finalizing(ec, true);
                let why = format!(
                    "the final snapshot's Job {job_name} failed; a new one starts {} after it (kubectl logs job/{job_name})",
                    humantime::format_duration(RETRY)
                );
                note(ctx, clusters, ec, Some(why)).await?;
                return Ok(Action::requeue(RETRY - since + Duration::from_secs(1)));
            }
            return retry(ec, ctx, &kids, &job_name, "failed".to_owned()).await;
        }
        None if job.is_some() && job_age(job.as_deref()) >= deadline => {
            let what = format!(
                "did not finish within {} of its start",
                humantime::format_duration(deadline)
            );
            return retry(ec, ctx, &kids, &job_name, what).await;
        }
        None => {}
    }
    ctx.finalizing(ec, true);
    if job.is_none() {
        let desired = render::final_snapshot_job(ec, &target, &ctx.settings.render);
        match kids.ensure_created(&desired).await {
            Ok(_) => {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "FinalSnapshot",
                    format!("Job {job_name} started; the cluster is removed when it finishes"),
                )
                .await;
            }
            Err(e) if namespace_terminating(&e) => {
                let why = "its namespace is being deleted, where the apiserver creates no Job";
                return hold(ec, ctx, clusters, &kids, why).await;
            }
            Err(e) => return Err(e),
        }
    }
    let why = format!("waiting for the final snapshot (Job {job_name})");
    note(ctx, clusters, ec, Some(why)).await?;
    let left = deadline.saturating_sub(job_age(job.as_deref()));
    Ok(Action::requeue(
        Duration::from_secs(10)
            .min(left)
            .max(Duration::from_secs(1)),
    ))
}

/// A final-snapshot attempt failed or ran out of time: said once (as the Job goes), and the Job
/// deleted so the next pass starts a new one; the members and their claims stay.
async fn retry(
    ec: &EtcdCluster,
    ctx: &Context,
    kids: &Children<'_>,
    job_name: &str,
    what: String,
) -> Result<Action, Error> {
    ctx.finalizing(ec, true);
    kids.remove::<Job>(job_name).await?;
    ctx.event(
        ec,
        EventType::Warning,
        "FinalSnapshotFailed",
        format!(
            "Job {job_name} {what}; the cluster, its members and their claims are kept and a new Job starts (kubectl logs job/{job_name}: fix the destination or its credentials); to delete without a final snapshot: kubectl annotate ec {} {RELEASE_ANNOTATION}=true",
            ec.name_any()
        ),
    )
    .await;
    tracing::warn!(cluster = %ec.name_any(), job = %job_name, %what, "final snapshot attempt failed; starting another");
    Ok(Action::requeue(Duration::from_secs(5)))
}

/// No final snapshot can be taken any more (`why`): the protected claims are kept and the
/// finalizer holds until the user says what to do (the Warning and the Ready condition say
/// it); with no claim kept there is nothing to hold for, and the finalizer goes with a Warning.
async fn hold(
    ec: &EtcdCluster,
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
    kids: &Children<'_>,
    why: &str,
) -> Result<Action, Error> {
    let name = ec.name_any();
    let kept: Vec<String> = claims::cached(ec, kids)
        .await?
        .iter()
        .filter(|c| claims::protected(c))
        .map(|c| c.name_any())
        .collect();
    if kept.is_empty() {
        ctx.event(
            ec,
            EventType::Warning,
            "FinalSnapshotSkipped",
            format!("no final snapshot: {why}, and none of its claims is kept"),
        )
        .await;
        return finalized(ctx, clusters, ec).await;
    }
    let message = format!(
        "no final snapshot can be taken: {why}. The claims {} are kept (finalizer {CLAIM_FINALIZER}) and the cluster waits: to keep the data after it goes, set their volumes' persistentVolumeReclaimPolicy to Retain; then kubectl annotate ec {name} {RELEASE_ANNOTATION}=true lets the claims and the cluster go",
        kept.join(", ")
    );
    let said = ec
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.message.contains(&message));
    if !said {
        // In a namespace being deleted the apiserver takes no new Event either: the Ready
        // condition says it too.
        ctx.event(ec, EventType::Warning, "VolumesKept", message.clone())
            .await;
        tracing::warn!(cluster = %name, %message, "deletion held: the claims are kept");
    }
    ctx.finalizing(ec, true);
    note(ctx, clusters, ec, Some(message)).await?;
    Ok(Action::requeue(HELD))
}

/// The status of a cluster being deleted: Ready False Deleting, with what the deletion waits
/// for.
async fn note(
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
    ec: &EtcdCluster,
    waiting_for: Option<String>,
) -> Result<(), Error> {
    let ready = ec
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let seen = Observation {
        ready,
        deleting: true,
        progress: waiting_for,
        ..Default::default()
    };
    update_status(ctx, clusters, ec, &seen).await?;
    Ok(())
}

fn elapsed_since(t: Timestamp) -> Duration {
    Timestamp::now().duration_since(t).unsigned_abs()
}

/// How long ago `job` was created (zero for none yet, or one without a creation time).
fn job_age(job: Option<&Job>) -> Duration {
    job.and_then(|j| j.metadata.creation_timestamp.as_ref())
        .map(|t| elapsed_since(t.0))
        .unwrap_or_default()
}

/// When a failed Job was marked failed (its `Failed` condition), if it says.
fn failed_at(job: &Job) -> Option<Timestamp> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Failed" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// The finalizer goes; nothing more to wait for.
async fn finalized(
    ctx: &Context,
    clusters: &Api<EtcdCluster>,
    ec: &EtcdCluster,
) -> Result<Action, Error> {
    remove_finalizer(clusters, ec).await?;
    ctx.finalizing(ec, false);
    crate::controller::machinery::series::forget(ec, ctx);
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::render::tests::cluster;

    #[test]
    fn a_large_database_gets_the_time_to_copy_it() {
        let mut ec = cluster("etcd", 3, None);
        let timeout = Duration::from_secs(600);
        assert_eq!(attempt_deadline(&ec, timeout), timeout);
        ec.status = Some(serde_json::from_value(serde_json::json!({
            "members": [
                {"name": "etcd-0", "id": "1", "role": "Leader", "healthy": true, "dbSize": 1i64 << 30},
                {"name": "etcd-1", "id": "2", "role": "Follower", "healthy": true, "dbSize": 8i64 << 30},
            ]
        })).unwrap());
        assert_eq!(
            attempt_deadline(&ec, timeout),
            timeout + Duration::from_secs(1024)
        );
    }

    #[test]
    fn members_are_going_in_a_foreground_deletion_or_without_their_set() {
        let mut ec = cluster("etcd", 3, None);
        let set = StatefulSet::default();
        assert_eq!(members_going(&ec, Some(&set)), None);
        assert!(members_going(&ec, None).unwrap().contains("gone"));
        let mut deleting = set.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(
            members_going(&ec, Some(&deleting))
                .unwrap()
                .contains("being deleted")
        );
        ec.metadata.finalizers = Some(vec![
            FOREGROUND.to_owned(),
            crate::controller::machinery::finalizer::FINALIZER.to_owned(),
        ]);
        assert!(
            members_going(&ec, Some(&set))
                .unwrap()
                .contains("--cascade=foreground")
        );
    }
}
