//! Backups, the decisions: what each ended backup pod reported (its termination message), the
//! record in `status.backup` and the Events it brings, and which cluster files in which bucket
//! prefix (to warn once when two share one).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::v1::{BackupFailure, BackupStatus, EtcdCluster, SnapshotRecord, Verification};
use crate::controller::render;

/// What one finished backup pod (scheduled or final) reported in its termination message.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Run {
    Filed(SnapshotRecord),
    Failed(BackupFailure),
}

/// The runs of `ec`'s backup pods that have ended, with when they ended.
pub(crate) fn runs(ec: &EtcdCluster, pods: &[Arc<Pod>]) -> Vec<(Timestamp, String, Run)> {
    ended(ec, pods, &["backup", "final-snapshot"])
        .into_iter()
        .map(|(p, at, run)| (at, p.name_any(), run))
        .collect()
}

/// `ec`'s pods of these components whose `backup` container has ended: the pod, when it
/// ended, and what it reported.
fn ended<'a>(
    ec: &EtcdCluster,
    pods: &'a [Arc<Pod>],
    components: &[&str],
) -> Vec<(&'a Pod, Timestamp, Run)> {
    let name = ec.name_any();
    let claim = render::backup_claim(ec).name_any();
    pods.iter()
        .filter(|p| p.namespace() == ec.namespace())
        .filter(|p| {
            let l = p.labels();
            l.get("app.kubernetes.io/instance") == Some(&name)
                && l.get("app.kubernetes.io/component")
                    .is_some_and(|c| components.contains(&c.as_str()))
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
            Some((&**p, at, run_of(ended, at, &claim)))
        })
        .collect()
}

/// What the rescue pods of `ec` reported: by member ordinal and the plan each copy was made
/// for, where it is; and why the last attempt failed for members with no copy. A copy of a
/// member wins over a failed attempt for it; of two copies for one plan, the later one.
pub(crate) fn rescues(
    ec: &EtcdCluster,
    pods: &[Arc<Pod>],
) -> crate::controller::decide::quorum::Rescue {
    let mut found = crate::controller::decide::quorum::Rescue::default();
    let mut ended: Vec<(Timestamp, i32, String, Run)> = ended(ec, pods, &["rescue"])
        .into_iter()
        .filter_map(|(p, at, run)| {
            let a = p.annotations();
            let plan = a.get(render::RESCUE_PLAN_ANNOTATION)?.clone();
            let ordinal = a.get(render::RESCUE_MEMBER_ANNOTATION)?.parse().ok()?;
            Some((at, ordinal, plan, run))
        })
        .collect();
    ended.sort_by_key(|(at, ..)| *at);
    for (_, ordinal, plan, run) in ended {
        match run {
            Run::Filed(r) => {
                found.failed.remove(&ordinal);
                found.copied.insert((ordinal, plan), r.uri);
            }
            Run::Failed(f) if !found.copied.keys().any(|(o, _)| *o == ordinal) => {
                found
                    .failed
                    .insert(ordinal, format!("{}: {}", f.step, f.message));
            }
            Run::Failed(_) => {}
        }
    }
    found
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
                    hash: r.hash.map(|h| i64::try_from(h).unwrap_or(i64::MAX)),
                    compact_revision: r.compact_revision,
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

pub(crate) fn when(time: &str) -> Option<Timestamp> {
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

/// What the verification pod of snapshot `last` (its Job's, [`render::verify_job_name`])
/// reported once it ended: `verify-snapshot`'s outcome, or the step that failed before it (the
/// fetch, with the SHA-256 or etcd's integrity hash refused, or etcdutl's restore). `None`
/// while none has ended. Of several attempts, the newest that ended.
pub(crate) fn verification(
    ec: &EtcdCluster,
    pods: &[Arc<Pod>],
    last: &SnapshotRecord,
) -> Option<Verification> {
    let job = render::verify_job_name(ec, last);
    let mut ended: Vec<(Timestamp, Verification)> = pods
        .iter()
        .filter(|p| p.namespace() == ec.namespace())
        .filter(|p| {
            p.labels()
                .get("app.kubernetes.io/component")
                .map(String::as_str)
                == Some(render::VERIFY_COMPONENT)
                && p.name_any().starts_with(&format!("{job}-"))
        })
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let of = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                      name: &str| {
                statuses
                    .as_ref()?
                    .iter()
                    .find(|c| c.name == name)?
                    .state
                    .as_ref()?
                    .terminated
                    .clone()
            };
            let verdict = |outcome: &str, message: String, at: Timestamp| Verification {
                time: at.to_string(),
                uri: last.uri.clone(),
                outcome: outcome.to_owned(),
                message,
            };
            if let Some(t) = of(&status.container_statuses, "verify") {
                let at = t.finished_at.as_ref().map(|f| f.0)?;
                let message = t.message.clone().unwrap_or_default();
                let v = match serde_json::from_str::<render::VerifyReport>(&message) {
                    Ok(r) => verdict(&r.outcome, r.message, at),
                    Err(_) => verdict(
                        render::VERIFY_FAILED,
                        format!(
                            "verify-snapshot: exit code {}: {}",
                            t.exit_code,
                            failed_report(&message)
                        ),
                        at,
                    ),
                };
                return Some((at, v));
            }
            // A step before it failed: the fetch (SHA-256, integrity) or the restore.
            ["fetch", "restore"].iter().find_map(|step| {
                let t = of(&status.init_container_statuses, step)?;
                (t.exit_code != 0).then_some(())?;
                let at = t.finished_at.as_ref().map(|f| f.0)?;
                let message = t.message.clone().unwrap_or_default();
                Some((
                    at,
                    verdict(
                        render::VERIFY_FAILED,
                        format!(
                            "{step}: exit code {}: {}",
                            t.exit_code,
                            failed_report(&message)
                        ),
                        at,
                    ),
                ))
            })
        })
        .collect();
    ended.sort_by_key(|(at, _)| *at);
    ended.pop().map(|(_, v)| v)
}

/// A step's report (`{"failed": STEP, "error": ...}`) in words, or its message as it is
/// (etcdutl's log tail), cut short.
fn failed_report(message: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(message) {
        Ok(r) if r.get("error").is_some() => format!(
            "{} failed: {}",
            r["failed"].as_str().unwrap_or("run"),
            r["error"].as_str().unwrap_or("")
        ),
        _ => message.chars().take(300).collect(),
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

    /// The rescue pods' reports: by member, the copy and the plan it was made for (a later
    /// failure does not undo a copy; a copy clears an earlier failure), the last failure of a
    /// member without a copy; other clusters' pods and pods without the annotations are not
    /// read.
    #[test]
    fn rescue_pods_say_which_member_was_copied_for_which_plan() {
        use super::*;
        let ec = crate::controller::render::tests::cluster("etcd", 5, None);
        let pod = |name: &str, member: &str, code: i32, message: &str, at: &str, instance: &str| {
            let mut labels = render::labels(&ec, "rescue");
            labels.insert("app.kubernetes.io/instance".to_owned(), instance.to_owned());
            Arc::new(
                serde_json::from_value::<Pod>(serde_json::json!({
                    "metadata": {"name": name, "namespace": "prod", "labels": labels,
                        "annotations": {render::RESCUE_PLAN_ANNOTATION: "rejoin-from-etcd-0-at-9",
                            render::RESCUE_MEMBER_ANNOTATION: member}},
                    "status": {"containerStatuses": [{"name": "backup", "image": "x",
                        "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": code, "message": message,
                            "finishedAt": at}}}]}}))
                .unwrap(),
            )
        };
        let filed = |uri: &str| {
            serde_json::json!({"uri": uri, "size": 1, "sha256": "ab", "revision": 3,
                "member": "etcd-1", "time": "2026-12-06T03:00:00Z", "seconds": 0.1,
                "pruned": []})
            .to_string()
        };
        let failed = r#"{"failed": "snapshot", "error": "refused"}"#;
        let pods = vec![
            pod("a", "1", 1, failed, "2026-12-06T03:00:00Z", "etcd"),
            pod(
                "b",
                "1",
                0,
                &filed("s3://b/one.db"),
                "2026-12-06T03:01:00Z",
                "etcd",
            ),
            pod("c", "1", 1, failed, "2026-12-06T03:02:00Z", "etcd"),
            pod("d", "2", 1, failed, "2026-12-06T03:00:00Z", "etcd"),
            pod(
                "e",
                "3",
                0,
                &filed("s3://b/other.db"),
                "2026-12-06T03:00:00Z",
                "other",
            ),
        ];
        let found = rescues(&ec, &pods);
        assert_eq!(
            found.copied,
            std::collections::BTreeMap::from([(
                (1, "rejoin-from-etcd-0-at-9".to_owned()),
                "s3://b/one.db".to_owned()
            )])
        );
        assert_eq!(
            found.failed,
            std::collections::BTreeMap::from([(2, "snapshot: refused".to_owned())])
        );
    }
}
