//! Backups: the CronJob of a cluster with backups on (and its volume), the runs' record in the
//! status, and what the loop forgets about a cluster that is gone (the final snapshot is
//! [`crate::controller::pass::deletion`]'s).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::v1::{BackupFailure, BackupStatus, EtcdCluster, SnapshotRecord};
use crate::controller::decide::status::{Observation, has_condition};
use crate::controller::machinery::children::{Applied, Children};
use crate::controller::{Context, Error, render};
use crate::metrics::ClusterLabels;
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
    let others = ctx
        .destinations
        .lock()
        .expect("not poisoned")
        .record(&crate::controller::key(ec), url.as_deref());
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
    let schedule = cron.spec.as_ref().map(|s| s.schedule.as_str());
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

/// What one finished backup pod (scheduled or final) reported in its termination message.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Run {
    Filed(SnapshotRecord),
    Failed(BackupFailure),
}

/// The runs of `ec`'s backup pods that have ended, with when they ended.
pub(crate) fn runs(ec: &EtcdCluster, pods: &[Arc<Pod>]) -> Vec<(Timestamp, String, Run)> {
    let name = ec.name_any();
    let claim = render::backup_claim(ec).name_any();
    pods.iter()
        .filter(|p| p.namespace() == ec.namespace())
        .filter(|p| {
            let l = p.labels();
            l.get("app.kubernetes.io/instance") == Some(&name)
                && matches!(
                    l.get("app.kubernetes.io/component").map(String::as_str),
                    Some("backup" | "final-snapshot")
                )
        })
        .filter_map(|p| {
            let ended = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == "backup")?
                .state
                .as_ref()?
                .terminated
                .as_ref()?;
            let at = ended.finished_at.as_ref().map(|t| t.0)?;
            Some((at, p.name_any(), run_of(ended, at, &claim)))
        })
        .collect()
}

/// A run from its container's end: the report `etcd-webhook backup` wrote, or the exit.
/// A snapshot filed on the backup claim `claim` is recorded as `pvc://CLAIM/FILE`, the URI
/// `spec.restore.from` takes (the pod's mount path means nothing outside it).
fn run_of(
    ended: &k8s_openapi::api::core::v1::ContainerStateTerminated,
    at: Timestamp,
    claim: &str,
) -> Run {
    let message = ended.message.as_deref().unwrap_or("");
    let report: Option<serde_json::Value> = serde_json::from_str(message).ok();
    let failed = |step: &str, message: String| {
        Run::Failed(BackupFailure {
            time: at.to_string(),
            step: step.to_owned(),
            message,
        })
    };
    match (ended.exit_code, report) {
        (0, Some(r)) if r.get("uri").is_some() => {
            match serde_json::from_value::<render::BackupReport>(r) {
                Ok(r) => Run::Filed(SnapshotRecord {
                    time: r.time,
                    uri: match r
                        .uri
                        .strip_prefix(render::BACKUP_MOUNT)
                        .and_then(|f| f.strip_prefix('/'))
                    {
                        Some(file) if !file.contains('/') => crate::api::claim_uri(claim, file),
                        _ => r.uri,
                    },
                    size: i64::try_from(r.size).unwrap_or(i64::MAX),
                    sha256: r.sha256,
                    revision: i64::try_from(r.revision).unwrap_or(i64::MAX),
                    keys: r.keys.map(|k| i64::try_from(k).unwrap_or(i64::MAX)),
                    member: r.member,
                }),
                Err(e) => failed("run", format!("a report that cannot be read: {e}")),
            }
        }
        (_, Some(r)) if r.get("failed").is_some() => failed(
            r["failed"].as_str().unwrap_or("run"),
            r["error"].as_str().unwrap_or("").to_owned(),
        ),
        (code, _) => failed(
            "run",
            format!(
                "exit code {code} ({}) without a report{}",
                ended.reason.as_deref().unwrap_or("no reason"),
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", message.chars().take(300).collect::<String>())
                }
            ),
        ),
    }
}

fn when(time: &str) -> Option<Timestamp> {
    time.parse().ok()
}

/// The backup status after `runs`, from the `previous` one, and the Events for the runs newer
/// than what it recorded (each run is told once: the pods stay for the CronJob's history, and
/// the status remembers the newest it has seen). A snapshot filed after the last failure
/// clears it.
pub(crate) fn record(
    previous: Option<&BackupStatus>,
    runs: &[(Timestamp, String, Run)],
) -> (Option<BackupStatus>, Vec<(EventType, &'static str, String)>) {
    let mut status = previous.cloned().unwrap_or_default();
    let mut events = Vec::new();
    let mut sorted: Vec<&(Timestamp, String, Run)> = runs.iter().collect();
    sorted.sort_by_key(|(at, ..)| *at);
    for (at, pod, run) in sorted {
        match run {
            Run::Filed(r) => {
                let taken = when(&r.time).unwrap_or(*at);
                if status
                    .last
                    .as_ref()
                    .and_then(|l| when(&l.time))
                    .is_some_and(|l| l >= taken)
                {
                    continue;
                }
                events.push((
                    EventType::Normal,
                    "BackupTaken",
                    format!(
                        "{} ({} bytes, revision {}{}, from {}; pod {pod})",
                        r.uri,
                        r.size,
                        r.revision,
                        r.keys.map(|k| format!(", {k} keys")).unwrap_or_default(),
                        r.member
                    ),
                ));
                status.last = Some(r.clone());
            }
            Run::Failed(f) => {
                if status
                    .last_failure
                    .as_ref()
                    .and_then(|l| when(&l.time))
                    .is_some_and(|l| l >= *at)
                {
                    continue;
                }
                events.push((
                    EventType::Warning,
                    "BackupFailed",
                    format!("{pod}: {} failed: {}", f.step, f.message),
                ));
                status.last_failure = Some(f.clone());
            }
        }
    }
    if let (Some(last), Some(failure)) = (&status.last, &status.last_failure)
        && when(&last.time) >= when(&failure.time)
    {
        status.last_failure = None;
    }
    let empty = status.last.is_none() && status.last_failure.is_none();
    (if empty { None } else { Some(status) }, events)
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
    let (status, events) = record(previous, &runs(ec, &pods));
    for (type_, reason, note) in events {
        ctx.event(ec, type_, reason, note).await;
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

pub(crate) fn labels(ec: &EtcdCluster) -> ClusterLabels {
    ClusterLabels {
        namespace: ec.namespace().unwrap_or_default(),
        name: ec.name_any(),
    }
}

/// The cluster's per-cluster metrics go with it.
pub(crate) fn forget(ec: &EtcdCluster, ctx: &Context) {
    let key = crate::controller::key(ec);
    ctx.destinations
        .lock()
        .expect("not poisoned")
        .record(&key, None);
    ctx.certificates_checked
        .lock()
        .expect("not poisoned")
        .remove(&key);
    ctx.defragmenting.lock().expect("not poisoned").remove(&key);
    ctx.forget_client_secret(ec);
    let l = labels(ec);
    ctx.identities
        .lock()
        .unwrap()
        .remove(&format!("{}/{}", l.namespace, l.name));
    ctx.metrics.backup_last_success.remove(&l);
    ctx.metrics.backup_interval.remove(&l);
    ctx.metrics.backup_scheduled_since.remove(&l);
    ctx.metrics.leader_changes.remove(&l);
    ctx.metrics.defragmentations.remove(&l);
    ctx.metrics.defragmentation_freed_bytes.remove(&l);
    ctx.metrics.defragmentation_seconds.remove(&l);
    ctx.metrics.nospace_alarm.remove(&l);
    for state in crate::controller::decide::maintenance::MEMBER_STATES {
        ctx.metrics
            .cluster_members
            .remove(&crate::metrics::MemberStateLabels {
                namespace: l.namespace.clone(),
                name: l.name.clone(),
                state: (*state).to_owned(),
            });
    }
    for m in ec.status.iter().flat_map(|s| s.members.iter().flatten()) {
        let member = crate::metrics::MemberLabels {
            namespace: l.namespace.clone(),
            name: l.name.clone(),
            member: m.name.clone(),
        };
        ctx.metrics.member_db_size.remove(&member);
        ctx.metrics.member_db_size_in_use.remove(&member);
    }
}

/// Which cluster files its snapshots in which bucket prefix (the loop's own record, from the
/// passes), to warn once when two share one.
#[derive(Default)]
pub struct Destinations {
    by_cluster: HashMap<String, String>,
    by_destination: HashMap<String, BTreeSet<String>>,
    warned: HashSet<String>,
}

impl Destinations {
    /// Records that `cluster` (`NAMESPACE/NAME`) files in `destination` (`None`: no bucket);
    /// the other clusters there the first time it shares it (again after it stopped sharing).
    pub fn record(&mut self, cluster: &str, destination: Option<&str>) -> Option<Vec<String>> {
        let destination = destination.map(|d| d.trim_end_matches('/').to_owned());
        if self.by_cluster.get(cluster) != destination.as_ref() {
            if let Some(before) = self.by_cluster.remove(cluster)
                && let Some(set) = self.by_destination.get_mut(&before)
            {
                set.remove(cluster);
                if set.is_empty() {
                    self.by_destination.remove(&before);
                }
            }
            if let Some(d) = &destination {
                self.by_cluster.insert(cluster.to_owned(), d.clone());
                self.by_destination
                    .entry(d.clone())
                    .or_default()
                    .insert(cluster.to_owned());
            }
        }
        let others: Vec<String> = destination
            .and_then(|d| self.by_destination.get(&d))
            .into_iter()
            .flatten()
            .filter(|c| *c != cluster)
            .cloned()
            .collect();
        if others.is_empty() {
            self.warned.remove(cluster);
            return None;
        }
        self.warned.insert(cluster.to_owned()).then_some(others)
    }
}

#[cfg(test)]
mod tests {
    use super::Destinations;

    /// Two clusters filing in one prefix: each is warned once, naming the other (a trailing
    /// slash is the same prefix); moving one away ends the sharing, and sharing again warns
    /// again; a forgotten cluster (deleted) leaves the record.
    #[test]
    fn a_shared_destination_is_said_once_per_cluster() {
        let mut d = Destinations::default();
        assert_eq!(d.record("a/etcd", Some("s3://b/p")), None);
        assert_eq!(d.record("a/etcd", Some("s3://b/p")), None);
        assert_eq!(
            d.record("b/etcd", Some("s3://b/p/")),
            Some(vec!["a/etcd".to_owned()])
        );
        assert_eq!(
            d.record("a/etcd", Some("s3://b/p")),
            Some(vec!["b/etcd".to_owned()])
        );
        assert_eq!(d.record("a/etcd", Some("s3://b/p")), None, "once");
        assert_eq!(d.record("b/etcd", Some("s3://b/p")), None, "once");
        assert_eq!(d.record("b/etcd", Some("s3://b/q")), None, "moved away");
        assert_eq!(d.record("a/etcd", Some("s3://b/p")), None);
        assert_eq!(
            d.record("b/etcd", Some("s3://b/p")),
            Some(vec!["a/etcd".to_owned()]),
            "shared again"
        );
        assert_eq!(d.record("b/etcd", None), None, "forgotten");
        assert_eq!(
            d.record("c/etcd", Some("s3://b/p")),
            Some(vec!["a/etcd".to_owned()])
        );
        assert_eq!(d.record("c/etcd", None), None);
        assert_eq!(d.record("a/etcd", None), None);
        assert!(d.by_destination.is_empty() && d.by_cluster.is_empty());
    }
}
