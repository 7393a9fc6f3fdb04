//! The child objects of a cluster: read from the reflector caches the controller's watches
//! fill (in the unit tests too), compared with what the rendering says, applied server-side
//! only when they lack something.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::Value;

use super::caches::{Cached, Child, kind_of};
use crate::api::MANAGER;
use crate::api::v1::EtcdCluster;
use crate::controller::machinery::context::Context;
use crate::controller::machinery::error::Error;

/// Selects the children this loop made (the watches of owned objects use it).
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=etcd-webhook";

/// How long a pass waits for the caches' first list before it fails (and backs off).
const CACHE_WAIT: Duration = Duration::from_secs(30);

/// Whether `actual` has everything `expected` says: objects by key, lists element by element
/// with the same length, scalars equal. Fields the apiserver adds (defaults, status, uid) do
/// not count; a field we stopped setting does, through the lists and the lengths.
/// `apiVersion`/`kind` are skipped: the typed objects write them into embedded objects (a
/// StatefulSet's claim templates), where the apiserver need not keep them.
/// Resource quantities (the values of `requests` and `limits` maps) compare as values: the
/// apiserver returns them in canonical form.
pub fn includes(actual: &Value, expected: &Value) -> bool {
    includes_in(actual, expected, false)
}

/// `quantities`: `actual` and `expected` are a `requests` or `limits` map.
fn includes_in(actual: &Value, expected: &Value, quantities: bool) -> bool {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => e.iter().all(|(k, v)| {
            k == "apiVersion"
                || k == "kind"
                || a.get(k).is_some_and(|av| match (av, v) {
                    (Value::String(x), Value::String(y)) if quantities => {
                        x == y || crate::api::quantity::same(x, y)
                    }
                    _ => includes_in(av, v, matches!(k.as_str(), "requests" | "limits")),
                })
        }),
        (Value::Array(a), Value::Array(e)) => {
            a.len() == e.len() && a.iter().zip(e).all(|(x, y)| includes_in(x, y, false))
        }
        (a, e) => a == e,
    }
}

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    Unchanged,
}

/// The children of one cluster, in its namespace: reads from the caches, writes to the API.
pub(crate) struct Children<'a> {
    pub(crate) ctx: &'a Context,
    ns: String,
    /// The cluster's name (its children's `app.kubernetes.io/instance` label).
    instance: String,
    /// This cluster's pods, read from the cache once per pass ([`Children::pods`]).
    pods: tokio::sync::OnceCell<Vec<Arc<Pod>>>,
}

impl<'a> Children<'a> {
    pub(crate) fn of(ec: &EtcdCluster, ctx: &'a Context) -> Self {
        Children {
            ctx,
            ns: ec.namespace().unwrap_or_else(|| "default".to_owned()),
            instance: ec.name_any(),
            pods: tokio::sync::OnceCell::new(),
        }
    }

    /// This cluster's pods (members, Job pods) as the cache held them when the pass first
    /// asked: the pods cache holds every cluster's, so each look walks all of them and decodes
    /// this cluster's; a pass looks several times (membership, CA trust, upgrade, backups,
    /// restore) and now pays for one. One view per pass, too: a pod the pass deleted is still
    /// in it, as it would be in the cache until the watch brings the deletion.
    pub(crate) async fn pods(&self) -> Result<Vec<Arc<Pod>>, Error> {
        self.pods
            .get_or_try_init(|| self.cached::<Pod>())
            .await
            .cloned()
    }

    pub(crate) fn api<K: Child>(&self) -> Api<K> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// Sets the annotation `key` to `value` on the cluster itself (a merge patch of its
    /// metadata): what the loop records there (the etcd cluster ID, a restore's digest).
    pub(crate) async fn annotate_cluster(&self, key: &str, value: &str) -> Result<(), Error> {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        Api::<EtcdCluster>::namespaced(self.ctx.client.clone(), &self.ns)
            .patch(
                &self.instance,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::kube("annotate", "EtcdCluster", &self.instance, e))
    }

    /// The cache of `K`, once it has its first full list: the first pass after a start waits
    /// for it, so a cold cache is never mistaken for missing objects.
    async fn store<K: Child>(&self) -> Result<&Store<Cached<K>>, Error> {
        let kind = kind_of::<K>();
        let store = K::cache(&self.ctx.caches);
        tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
            .await
            .map_err(|_| Error::CacheNotReady(kind))?
            .map_err(|_| Error::CacheNotReady(kind))?;
        Ok(store)
    }

    /// This cluster's objects of kind `K` in the cache (its namespace, its instance label):
    /// only these are decoded.
    pub(crate) async fn cached<K: Child>(&self) -> Result<Vec<Arc<K>>, Error> {
        let mine = |c: &Arc<Cached<K>>| {
            c.metadata.namespace.as_deref() == Some(self.ns.as_str())
                && c.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app.kubernetes.io/instance"))
                    == Some(&self.instance)
        };
        let store = self.store::<K>().await?;
        store
            .state()
            .iter()
            .filter(|c| mine(c))
            .map(|c| c.object().map(Arc::new))
            .collect()
    }

    /// The object as the caches hold it.
    pub(crate) async fn read<K: Child>(&self, name: &str) -> Result<Option<Arc<K>>, Error> {
        let store = self.store::<K>().await?;
        super::caches::get(store, &self.ns, name)
    }

    /// Applies `desired` (server-side, forced, field manager [`MANAGER`]) only when what is
    /// there does not already include it. Returns what the cluster now holds.
    pub(crate) async fn ensure<K: Child>(&self, desired: &K) -> Result<(Applied, Arc<K>), Error> {
        let name = desired.meta().name.clone().unwrap_or_default();
        let observed = self.read::<K>(&name).await?;
        if let Some(o) = &observed {
            let want = serde_json::to_value(desired).expect("k8s objects serialize");
            let have = serde_json::to_value(&**o).expect("k8s objects serialize");
            if includes(&have, &want) {
                return Ok((Applied::Unchanged, o.clone()));
            }
        }
        let applied = self.apply(desired).await?;
        let what = if observed.is_some() {
            Applied::Updated
        } else {
            Applied::Created
        };
        tracing::info!(kind = kind_of::<K>(), %name, action = ?what, "applied");
        Ok((what, applied))
    }

    /// Creates the object when it is missing, and otherwise leaves it alone (a Job's pod
    /// template is immutable, and a Job that ran is a record, not something to converge).
    pub(crate) async fn ensure_created<K: Child>(
        &self,
        desired: &K,
    ) -> Result<(Applied, Arc<K>), Error> {
        let name = desired.meta().name.clone().unwrap_or_default();
        if let Some(o) = self.read::<K>(&name).await? {
            return Ok((Applied::Unchanged, o));
        }
        let created = self.apply(desired).await?;
        tracing::info!(kind = kind_of::<K>(), %name, "created");
        Ok((Applied::Created, created))
    }

    async fn apply<K: Child>(&self, desired: &K) -> Result<Arc<K>, Error> {
        let name = desired.meta().name.clone().unwrap_or_default();
        self.api::<K>()
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(desired),
            )
            .await
            .map(Arc::new)
            .map_err(|e| Error::kube("apply", kind_of::<K>(), &name, e))
    }

    /// Deletes the object if it is there; true when it was.
    pub(crate) async fn remove<K: Child>(&self, name: &str) -> Result<bool, Error> {
        if self.read::<K>(name).await?.is_none() {
            return Ok(false);
        }
        match self
            .api::<K>()
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(Error::kube("delete", kind_of::<K>(), name, e)),
        }
    }
}

/// Whether a Job has succeeded (`Some(true)`), failed (`Some(false)`) or not finished.
pub(crate) fn job_outcome(job: &Job) -> Option<bool> {
    let status = job.status.as_ref()?;
    let flagged = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if flagged("Complete") || status.succeeded.unwrap_or(0) > 0 {
        Some(true)
    } else if flagged("Failed") {
        Some(false)
    } else {
        None
    }
}

/// Whether a pod of `job` (owned by it: a former Job's pods of the same name are not) is in
/// `pods` (the cache) neither ended nor being deleted: the Job controller saw it end, the
/// pods' cache has not yet (the two caches are fed by separate watches), and the pod's
/// report comes with its next event. A finished Job is read with its pod's report only
/// once this is false.
pub(crate) fn report_on_its_way(job: &Job, pods: &[Arc<Pod>]) -> bool {
    let Some(uid) = job.metadata.uid.as_deref() else {
        return false;
    };
    pods.iter().any(|p| {
        p.owner_references().iter().any(|o| o.uid == uid)
            && p.metadata.deletion_timestamp.is_none()
            && !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
    })
}

/// Whether `meta`'s controller is `ec` itself (the same UID), not a former cluster of its name
/// whose children the garbage collector has not removed yet.
pub(crate) fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ec: &crate::api::v1::EtcdCluster,
) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .any(|o| Some(&o.uid) == ec.metadata.uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(owner: &str, phase: &str, deleting: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "ownerReferences": [{"apiVersion": "batch/v1",
                    "kind": "Job", "name": "j", "uid": owner, "controller": true}],
                    "deletionTimestamp": if deleting { Some("2026-12-06T00:00:00Z") } else { None }},
                "status": {"phase": phase}}))
            .unwrap(),
        )
    }

    #[test]
    fn a_finished_jobs_report_is_on_its_way_while_its_own_pod_is_cached_unended() {
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j", "uid": "u1"},
            "status": {"succeeded": 1}}))
        .unwrap();
        assert!(report_on_its_way(&job, &[pod("u1", "Pending", false)]));
        assert!(report_on_its_way(&job, &[pod("u1", "Running", false)]));
        assert!(!report_on_its_way(&job, &[pod("u1", "Succeeded", false)]));
        assert!(!report_on_its_way(&job, &[pod("u1", "Failed", false)]));
        assert!(
            !report_on_its_way(&job, &[pod("u0", "Running", false)]),
            "a former Job's pod of the same name"
        );
        assert!(
            !report_on_its_way(&job, &[pod("u1", "Running", true)]),
            "a pod being deleted reports nothing"
        );
        assert!(!report_on_its_way(&job, &[]), "its pod gone");
    }
}
