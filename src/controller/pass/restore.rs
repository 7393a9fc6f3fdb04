//! A cluster made from a snapshot (`spec.restore`): before its StatefulSet exists, the loop
//! makes each member's claim and runs one restore Job per member (the snapshot fetched and
//! checked, then `etcdutl snapshot restore` into the claim); the StatefulSet is made only when
//! every Job has completed, so a snapshot that fails its check never leaves a half-started
//! cluster. A learner added later joins as any other (it is never restored). A restore in place
//! (a lost quorum whose survivors are older than the newest snapshot, once their data is
//! copied) first clears what the lost cluster left ([`clear`]), then takes the same path.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::SnapshotSource;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::{Observation, Restored};
use crate::controller::decide::status::has_condition;
use crate::controller::machinery::children::{Children, job_outcome, report_on_its_way};
use crate::controller::machinery::error::Error;
use crate::controller::render;

/// Makes the claims and the restore Jobs; whether every member is restored (the StatefulSet
/// may be made). A cluster without `spec.restore`, or one that formed, needs nothing.
pub(crate) async fn prepare(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    seen: &mut Observation,
) -> Result<bool, Error> {
    let Some(restore) = &render::restore_source(ec) else {
        return Ok(true);
    };
    if ec.annotations().contains_key(render::CLUSTER_ID_ANNOTATION) {
        seen.restored = Some(Restored::Done);
        return Ok(true);
    }
    let ctx = kids.ctx;
    let in_place = render::InPlace::read(ec, render::RESTORED_FROM_ANNOTATION).and_then(Result::ok);
    let field = if in_place.is_some() {
        "the snapshot restored in place"
    } else {
        "spec.restore.from"
    };
    let source = match SnapshotSource::parse(&restore.from) {
        Ok(source) => source,
        Err(why) => {
            let message = format!("{field} {:?} {why}", restore.from);
            seen.restored = Some(Restored::Failed(message.clone()));
            seen.failure = Some(("RestoreFailed", message));
            return Ok(false);
        }
    };
    // A claim is read by one Job at a time (ReadWriteOnce attaches to one node), and must be
    // there: until it is, nothing is made and the condition says what is missing.
    let one_at_a_time = matches!(source, SnapshotSource::Claim { .. });
    if let SnapshotSource::Claim { claim, .. } = source {
        let found = kids
            .api::<PersistentVolumeClaim>()
            .get_opt(claim)
            .await
            .map_err(|e| Error::kube("get", "PersistentVolumeClaim", claim, e))?;
        if found.is_none() {
            seen.restored = Some(Restored::Waiting(format!(
                "the volume claim {claim} that spec.restore.from names does not exist in this namespace; no member starts until it does"
            )));
            return Ok(false);
        }
    }
    let pods = kids.pods().await?;
    let mut done = 0;
    let mut failed = Vec::new();
    // The digest every member's snapshot must have: the spec's, else the one the first member
    // was restored from (its Job runs alone first), so that no member holds other data.
    let mut pinned = restore.sha256.clone().or_else(|| {
        ec.annotations()
            .get(render::RESTORE_SHA256_ANNOTATION)
            .cloned()
    });
    for i in 0..ec.spec.size {
        if i > 0 && pinned.is_none() {
            match first_digest(ec, kids).await? {
                Some(Ok(sha)) => {
                    // For the other members' Jobs, and the next passes.
                    kids.annotate_cluster(render::RESTORE_SHA256_ANNOTATION, &sha)
                        .await?;
                    pinned = Some(sha);
                }
                Some(Err(why)) => {
                    tracing::warn!(cluster = %ec.name_any(), %why, "the other members' snapshots are not pinned to the first one's")
                }
                // The first member's restore has not finished: the others wait for its digest.
                None => break,
            }
        }
        kids.ensure_created(&render::member_claim_object(ec, i))
            .await?;
        let (_, job) = kids
            .ensure_created(&render::restore_job(
                ec,
                i,
                source,
                pinned.as_deref(),
                &ctx.settings.render,
            ))
            .await?;
        if !crate::controller::machinery::children::owned_by(&job.metadata, ec) {
            // A former cluster's restore Job of this name, not yet garbage-collected: its
            // outcome is not this cluster's restore.
            seen.restored = Some(Restored::Waiting(format!(
                "the Job {} belongs to a former cluster of this name; waiting for it to be deleted",
                job.name_any()
            )));
            seen.settle = true;
            return Ok(false);
        }
        // A finished Job whose pod's report the cache has not caught up with is still running
        // for this pass: its outcome is read with the report (the digest, why it failed).
        match job_outcome(&job).filter(|_| !report_on_its_way(&job, &pods)) {
            Some(true) => done += 1,
            Some(false) => failed.push(format!(
                "{}: {}",
                job.name_any(),
                why_failed(kids, &job).await?
            )),
            None if one_at_a_time => break,
            None => {}
        }
        if one_at_a_time && !failed.is_empty() {
            break;
        }
    }
    if !failed.is_empty() {
        let what_now = match &in_place {
            Some(p) => format!(
                "the members' former data is in the rescue copies {}: create a new EtcdCluster with spec.restore.from one of them, or with a snapshot that passes",
                p.copies.join(", ")
            ),
            None => {
                "delete this EtcdCluster and create it again with a snapshot that passes".to_owned()
            }
        };
        let message = format!(
            "the restore from {} failed, so no member starts: {} ({what_now})",
            restore.from,
            failed.join("; ")
        );
        if !has_condition(ec, "Restored", "RestoreFailed") {
            ctx.event(ec, EventType::Warning, "RestoreFailed", message.clone())
                .await;
        }
        seen.restored = Some(Restored::Failed(message.clone()));
        seen.failure = Some(("RestoreFailed", message));
        return Ok(false);
    }
    if done < ec.spec.size {
        seen.restored = Some(Restored::Restoring {
            done,
            of: ec.spec.size,
        });
        return Ok(false);
    }
    // Told once: a pass that reads the cluster before the last one's status is in the cache
    // finds the Jobs done again.
    if !has_condition(ec, "Restored", "Restored") {
        ctx.event(
            ec,
            EventType::Normal,
            "Restored",
            format!(
                "{} members restored from {}; starting them",
                ec.spec.size, restore.from
            ),
        )
        .await;
    }
    seen.restored = Some(Restored::Done);
    Ok(true)
}

/// The SHA-256 the first member's restore fetched, once its Job succeeded (`None` before):
/// from the fetch container's report in its pod's termination message; why not, when the pod
/// is gone or said none.
async fn first_digest(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Option<Result<String, String>>, Error> {
    let name = format!("{}-restore-0", ec.name_any());
    let Some(job) = kids.read::<Job>(&name).await? else {
        return Ok(None);
    };
    if job_outcome(&job) != Some(true)
        || !crate::controller::machinery::children::owned_by(&job.metadata, ec)
    {
        return Ok(None);
    }
    let pods = kids.pods().await?;
    if report_on_its_way(&job, &pods) {
        return Ok(None);
    }
    let said = pods
        .iter()
        .filter(|p| p.labels().get("batch.kubernetes.io/job-name") == Some(&name))
        .flat_map(|p| p.status.iter())
        .flat_map(|s| s.init_container_statuses.iter().flatten())
        .filter(|c| c.name == "fetch")
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter(|t| t.exit_code == 0)
        .find_map(|t| {
            let report: serde_json::Value = serde_json::from_str(t.message.as_deref()?).ok()?;
            report["sha256"].as_str().map(str::to_owned)
        });
    Ok(Some(said.ok_or_else(|| {
        format!(
            "the Job {name} succeeded but its pod's report (with the snapshot's SHA-256) is gone"
        )
    })))
}

/// Why a restore Job failed: what its newest pod's containers said (the fetch's JSON report,
/// or etcdutl's log tail).
async fn why_failed(kids: &Children<'_>, job: &Job) -> Result<String, Error> {
    let name = job.name_any();
    let pods = kids.pods().await?;
    let newest = pods
        .iter()
        .filter(|p| p.labels().get("batch.kubernetes.io/job-name") == Some(&name))
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let said = newest
        .and_then(|p| p.status.as_ref())
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .filter_map(|c| {
            let ended = c.state.as_ref()?.terminated.as_ref()?;
            (ended.exit_code != 0).then(|| {
                let message = ended.message.as_deref().unwrap_or("").trim();
                let text = serde_json::from_str::<serde_json::Value>(message)
                    .ok()
                    .and_then(|r| r["error"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| {
                        message
                            .chars()
                            .rev()
                            .take(300)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect()
                    });
                format!("{} exited {}: {text}", c.name, ended.exit_code)
            })
        })
        .next();
    Ok(said.unwrap_or_else(|| "the Job failed (its pods are gone; see its Events)".to_owned()))
}

/// A restore in place ([`render::RESTORE_IN_PLACE_ANNOTATION`], written once every member's
/// data is copied): the StatefulSet, the members' ConfigMap (fenced), former restore Jobs and
/// the member claims are deleted (their protection taken off first); once they and the member
/// pods are gone, one patch of the cluster swaps the request for
/// [`render::RESTORED_FROM_ANNOTATION`] and drops the etcd cluster ID, so the next pass restores
/// every member from the snapshot as [`prepare`] does for `spec.restore`. Nothing else is made
/// meanwhile. Whether a restore in place is clearing (the pass stops there).
pub(crate) async fn clear(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    seen: &mut Observation,
) -> Result<bool, Error> {
    let request = match render::InPlace::read(ec, render::RESTORE_IN_PLACE_ANNOTATION) {
        None => return Ok(false),
        Some(Ok(request)) => request,
        Some(Err(why)) => {
            let message = format!(
                "{why}: nothing is deleted and nothing is made until it is removed or set right"
            );
            seen.restored = Some(Restored::Failed(message.clone()));
            seen.failure = Some(("RestoreFailed", message));
            return Ok(true);
        }
    };
    let recorded = ec
        .annotations()
        .get(render::CLUSTER_ID_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default();
    if request.cluster != recorded {
        let message = format!(
            "the annotation {} was written for the etcd cluster {:?} and this one records {recorded:?}: nothing is deleted and nothing is made until it is removed",
            render::RESTORE_IN_PLACE_ANNOTATION,
            request.cluster
        );
        seen.restored = Some(Restored::Failed(message.clone()));
        seen.failure = Some(("RestoreFailed", message));
        return Ok(true);
    }
    let name = ec.name_any();
    let mut left = Vec::new();
    if let Some(set) = kids.read::<StatefulSet>(&name).await? {
        if set.metadata.deletion_timestamp.is_none() {
            kids.remove::<StatefulSet>(&name).await?;
        }
        left.push(format!("StatefulSet {name}"));
    }
    let config = render::members_config_name(ec);
    if kids.remove::<ConfigMap>(&config).await? || kids.read::<ConfigMap>(&config).await?.is_some()
    {
        left.push(format!("ConfigMap {config}"));
    }
    for i in 0..ec.spec.size {
        let job = format!("{name}-restore-{i}");
        if kids.read::<Job>(&job).await?.is_some() {
            kids.remove::<Job>(&job).await?;
            left.push(format!("Job {job}"));
        }
        let claim = render::member_claim(ec, i);
        if let Some(c) = kids.read::<PersistentVolumeClaim>(&claim).await? {
            super::claims::release_one(kids, &claim).await?;
            if c.metadata.deletion_timestamp.is_none() {
                kids.remove::<PersistentVolumeClaim>(&claim).await?;
            }
            left.push(format!("claim {claim}"));
        }
    }
    // The garbage collector deletes them with the StatefulSet; pods it would not (orphaned by
    // an earlier deletion) are deleted here.
    let pods = super::members::member_pods(ec, kids).await?;
    for p in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        kids.remove::<k8s_openapi::api::core::v1::Pod>(&p.name_any())
            .await?;
    }
    let mut names: Vec<String> = pods
        .iter()
        .map(|p| format!("pod {}", p.name_any()))
        .collect();
    names.sort();
    left.extend(names.iter().cloned());
    seen.settle = true;
    let copies = format!(
        "the data of every member that held any was copied first ({}; plan {})",
        request.copies.join(", "),
        request.plan
    );
    if !left.is_empty() {
        let stuck = if names.is_empty() {
            ""
        } else {
            " (a pod left Terminating on a node that is gone needs kubectl delete pod --force)"
        };
        seen.restored = Some(Restored::Clearing(format!(
            "restoring in place from {}: waiting for {} to be deleted{stuck}; {copies}",
            request.from,
            left.join(", ")
        )));
        return Ok(true);
    }
    let patch = json!({"metadata": {"annotations": {
        render::RESTORE_IN_PLACE_ANNOTATION: null,
        render::CLUSTER_ID_ANNOTATION: null,
        render::RESTORED_FROM_ANNOTATION: request.to_annotation(),
        render::RESTORE_SHA256_ANNOTATION: request.sha256,
        render::INITIAL_SIZE_ANNOTATION: ec.spec.size.to_string(),
    }}});
    Api::<EtcdCluster>::namespaced(kids.ctx.client.clone(), &ec.namespace().unwrap_or_default())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("patch", "EtcdCluster", &name, e))?;
    kids.ctx
        .event(
            ec,
            EventType::Normal,
            "ClearedForRestore",
            format!(
                "the lost cluster's StatefulSet, pods, volumes and members' ConfigMap are gone; every member is restored from {} next ({copies})",
                request.from
            ),
        )
        .await;
    seen.restored = Some(Restored::Restoring {
        done: 0,
        of: ec.spec.size,
    });
    Ok(true)
}
