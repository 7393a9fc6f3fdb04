//! The child objects of a cluster: read from the reflector caches the controller's watches
//! fill (in the unit tests too), compared with what the rendering says, applied server-side
//! only when they lack something.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Context, Error, MANAGER};
use crate::api::v1::EtcdCluster;

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

fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    // Resource::kind returns a Cow of a 'static str for the k8s-openapi types.
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(k) => k,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// A kind of object the loop owns, read from its reflector cache.
pub trait Child:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    fn cache(caches: &Caches) -> &Store<Self>;

    /// Drops, before the object is cached, the parts of this kind the loop never reads (see
    /// [`slim`]).
    fn slim_kind(&mut self) {}
}

/// The object as the caches keep it: no managedFields (often half an object) and no
/// last-applied annotation (the other half; the annotations map itself stays, so a patch that
/// adds a key never replaces the map), and per kind what the loop never reads: a pod's spec
/// (the loop reads pods' labels and container statuses) and a Job's pod template (a Job is
/// created once and then only its status is read). Memory per cluster is what this saves.
pub fn slim<K: Child>(o: &mut K) {
    slim_meta(o.meta_mut());
    o.slim_kind();
}

/// The metadata part of [`slim`], for any kind (the clusters' own cache too).
pub fn slim_meta(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(crate::admission::request::LAST_APPLIED);
    }
}

macro_rules! child {
    ($($kind:ty => $field:ident $(, slim: $slim:expr)?);* $(;)?) => {
        /// The reflector caches of the owned kinds, filled by the controller's watches (the same
        /// watches that trigger reconciles), so a pass reads nothing from the API.
        #[derive(Clone)]
        pub struct Caches {
            $(pub $field: Store<$kind>,)*
        }
        $(impl Child for $kind {
            fn cache(caches: &Caches) -> &Store<Self> {
                &caches.$field
            }
            $(fn slim_kind(&mut self) {
                let slim: fn(&mut Self) = $slim;
                slim(self)
            })?
        })*
    };
}

child! {
    StatefulSet => sets;
    Service => services;
    PodDisruptionBudget => budgets;
    CronJob => crons;
    Job => jobs, slim: |job| {
        if let Some(spec) = job.spec.as_mut() {
            spec.template = Default::default();
        }
    };
    PersistentVolumeClaim => claims;
    ConfigMap => configs;
    Pod => pods, slim: |pod| pod.spec = None;
    NetworkPolicy => policies;
}

/// The children of one cluster, in its namespace: reads from the caches, writes to the API.
pub(super) struct Children<'a> {
    pub(super) ctx: &'a Context,
    ns: String,
}

impl<'a> Children<'a> {
    pub(super) fn of(ec: &EtcdCluster, ctx: &'a Context) -> Self {
        Children {
            ctx,
            ns: ec.namespace().unwrap_or_else(|| "default".to_owned()),
        }
    }

    pub(super) fn api<K: Child>(&self) -> Api<K> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The cache of `K`, once it has its first full list: the first pass after a start waits
    /// for it, so a cold cache is never mistaken for missing objects.
    async fn store<K: Child>(&self) -> Result<&Store<K>, Error> {
        let kind = kind_of::<K>();
        let store = K::cache(&self.ctx.caches);
        tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
            .await
            .map_err(|_| Error::CacheNotReady(kind))?
            .map_err(|_| Error::CacheNotReady(kind))?;
        Ok(store)
    }

    /// Everything the cache of `K` holds (every namespace the controller watches).
    pub(super) async fn cached<K: Child>(&self) -> Result<Vec<Arc<K>>, Error> {
        Ok(self.store::<K>().await?.state())
    }

    /// The object as the caches hold it; shared, never copied out of a cache.
    pub(super) async fn read<K: Child>(&self, name: &str) -> Result<Option<Arc<K>>, Error> {
        let store = self.store::<K>().await?;
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
        Ok(store.get(&key))
    }

    /// Applies `desired` (server-side, forced, field manager [`MANAGER`]) only when what is
    /// there does not already include it. Returns what the cluster now holds.
    pub(super) async fn ensure<K: Child>(&self, desired: &K) -> Result<(Applied, Arc<K>), Error> {
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
    pub(super) async fn ensure_created<K: Child>(
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
    pub(super) async fn remove<K: Child>(&self, name: &str) -> Result<bool, Error> {
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
pub(super) fn job_outcome(job: &Job) -> Option<bool> {
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
