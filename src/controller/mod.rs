//! The slim reconcile loop: each v1 EtcdCluster becomes a headless and a client Service, a
//! StatefulSet, a PodDisruptionBudget and (with backups) a CronJob, applied server-side with
//! the field manager `etcd-webhook`, plus a status and Events.
//!
//! The objects come from the pure functions in [`render`], the status from [`status`]; this
//! module only compares, applies and records. A pass with nothing to change makes no API call:
//! children are read from the caches the controller's watches fill ([`Caches`]), and applied
//! only when they lack something the rendering says.

pub mod leader;
pub mod render;
pub mod status;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::v1::EtcdCluster;
use crate::metrics::{Metrics, ResultLabel};
use render::{BackupTarget, RenderOptions};
use status::{Activity, Observation};

/// Field manager of every apply, and the Events' reporting controller.
pub const MANAGER: &str = "etcd-webhook";
pub const FINALIZER: &str = "etcd.example.com/finalizer";
/// Selects the children this loop made (the watches of owned objects use it).
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=etcd-webhook";

/// Every API call the loop makes, as RBAC rules (group, resource, verbs): the install's
/// ClusterRole must grant these (tests/manifests.rs), and the tests check that every call made
/// against the fake API server is covered. Applies that create also need `create`.
pub const RBAC_RULES: &[(&str, &str, &[&str])] = &[
    (
        "etcd.example.com",
        "etcdclusters",
        &["get", "list", "watch", "patch"],
    ),
    ("etcd.example.com", "etcdclusters/status", &["get", "patch"]),
    // The children's ownerReferences block the cluster's deletion (blockOwnerDeletion), which
    // the admission plugin OwnerReferencesPermissionEnforcement allows only with this grant.
    ("etcd.example.com", "etcdclusters/finalizers", &["update"]),
    (
        "apps",
        "statefulsets",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    ("", "services", &["get", "list", "watch", "create", "patch"]),
    (
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "create", "patch"],
    ),
    (
        "policy",
        "poddisruptionbudgets",
        &["get", "list", "watch", "create", "patch"],
    ),
    (
        "batch",
        "cronjobs",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        "batch",
        "jobs",
        &["get", "list", "watch", "create", "patch"],
    ),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// The leader election's calls, granted by a Role in the Lease's namespace.
pub const LEADER_RBAC_RULES: &[(&str, &str, &[&str])] =
    &[("coordination.k8s.io", "leases", &["get", "create", "patch"])];

/// What a reconcile could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "member-add Job {0} failed: the new member could not join; see its pod logs, then delete the Job to retry"
    )]
    MemberAddFailed(String),
    /// A spec the webhook would have denied (it was bypassed, e.g. with failurePolicy Ignore):
    /// nothing is changed for it.
    #[error("{0}")]
    InvalidSpec(String),
    #[error("the {0} cache has not finished its first list")]
    CacheNotReady(&'static str),
}

impl Error {
    fn kube(action: &'static str, kind: &'static str, name: &str, source: kube::Error) -> Self {
        Error::Kube {
            action,
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }
}

/// The controller's settings (flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub render: RenderOptions,
    /// How long the finalizer waits for the final snapshot before giving up.
    pub finalizer_timeout: Duration,
    /// Periodic resync of a healthy cluster.
    pub resync: Duration,
    /// Restrict to one namespace.
    pub namespace: Option<String>,
    /// This replica's name in Events (`reportingInstance`).
    pub instance: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            render: RenderOptions::default(),
            finalizer_timeout: Duration::from_secs(600),
            resync: Duration::from_secs(30),
            namespace: None,
            instance: None,
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    /// Where a pass reads the children: the watches' caches (also in the unit tests).
    caches: Caches,
    /// Consecutive failures per cluster, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The status last written per cluster uid, and when ([`update_status`]).
    written: Mutex<HashMap<String, (std::time::Instant, crate::api::v1::EtcdClusterStatus)>>,
    /// Clusters whose finalizer is waiting (the in-progress gauge).
    finalizing: Mutex<HashSet<String>>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>, caches: Caches) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: settings.instance.clone(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics,
            caches,
            failures: Mutex::default(),
            written: Mutex::default(),
            finalizing: Mutex::default(),
        }
    }

    /// Publishes an Event about `ec`; a failure to publish is logged, never fatal.
    async fn event(&self, ec: &EtcdCluster, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&ev, &ec.object_ref(&())).await {
            tracing::warn!(%error, cluster = %key(ec), reason, "cannot publish event");
        }
    }

    fn finalizing(&self, ec: &EtcdCluster, waiting: bool) {
        let mut set = self.finalizing.lock().expect("not poisoned");
        if waiting {
            set.insert(key(ec));
        } else {
            set.remove(&key(ec));
        }
        self.metrics.finalizers_in_progress.set(set.len() as i64);
    }
}

fn key(ec: &EtcdCluster) -> String {
    format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

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
}

macro_rules! child {
    ($($kind:ty => $field:ident),* $(,)?) => {
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
        })*
    };
}

child! {
    StatefulSet => sets,
    Service => services,
    PodDisruptionBudget => budgets,
    CronJob => crons,
    Job => jobs,
    PersistentVolumeClaim => claims,
}

/// The children of one cluster, in its namespace: reads from the caches, writes to the API.
struct Children<'a> {
    ctx: &'a Context,
    ns: String,
}

impl<'a> Children<'a> {
    fn of(ec: &EtcdCluster, ctx: &'a Context) -> Self {
        Children {
            ctx,
            ns: ec.namespace().unwrap_or_else(|| "default".to_owned()),
        }
    }

    fn api<K: Child>(&self) -> Api<K> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The object as the caches hold it; shared, never copied out of a cache.
    async fn read<K: Child>(&self, name: &str) -> Result<Option<Arc<K>>, Error> {
        let kind = kind_of::<K>();
        let store = K::cache(&self.ctx.caches);
        // The first pass after a start waits for the first full list, so a cold cache is never
        // mistaken for missing objects.
        tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
            .await
            .map_err(|_| Error::CacheNotReady(kind))?
            .map_err(|_| Error::CacheNotReady(kind))?;
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
        Ok(store.get(&key))
    }

    /// Applies `desired` (server-side, forced, field manager [`MANAGER`]) only when what is
    /// there does not already include it. Returns what the cluster now holds.
    async fn ensure<K: Child>(&self, desired: &K) -> Result<(Applied, Arc<K>), Error> {
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
    async fn ensure_created<K: Child>(&self, desired: &K) -> Result<(Applied, Arc<K>), Error> {
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
    async fn remove<K: Child>(&self, name: &str) -> Result<bool, Error> {
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

/// Trailing-edge debounce of reconcile requests.
const DEBOUNCE: Duration = Duration::from_millis(500);

/// How long a pass waits for the caches' first list before it fails (and backs off).
const CACHE_WAIT: Duration = Duration::from_secs(30);

fn has_finalizer(ec: &EtcdCluster) -> bool {
    ec.finalizers().iter().any(|f| f == FINALIZER)
}

/// JSON Pointer escaping of one path segment.
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Adds the finalizer and records the initial size, in one JSON patch guarded by `test`
/// operations (a concurrent change to the finalizers fails the patch instead of being lost).
async fn add_finalizer(api: &Api<EtcdCluster>, ec: &EtcdCluster) -> Result<(), Error> {
    let mut ops = Vec::new();
    match &ec.metadata.finalizers {
        None => {
            ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}))
        }
        Some(list) => {
            ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": list}));
            ops.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}));
        }
    }
    if initial_size_recorded(ec).is_none() {
        let size = ec.spec.size.to_string();
        match &ec.metadata.annotations {
            None => ops.push(json!({"op": "add", "path": "/metadata/annotations",
                "value": {render::INITIAL_SIZE_ANNOTATION: size}})),
            Some(_) => ops.push(json!({"op": "add",
                "path": format!("/metadata/annotations/{}", pointer_segment(render::INITIAL_SIZE_ANNOTATION)),
                "value": size})),
        }
    }
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("valid ops");
    api.patch(
        &ec.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await
    .map_err(|e| Error::kube("add finalizer to", "EtcdCluster", &ec.name_any(), e))?;
    Ok(())
}

/// Removes our finalizer (and only it), guarded by a `test` of its position.
async fn remove_finalizer(api: &Api<EtcdCluster>, ec: &EtcdCluster) -> Result<(), Error> {
    let Some(i) = ec.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .expect("valid ops");
    match api
        .patch(
            &ec.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: nothing to remove.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(
            "remove finalizer from",
            "EtcdCluster",
            &ec.name_any(),
            e,
        )),
    }
}

fn initial_size_recorded(ec: &EtcdCluster) -> Option<i32> {
    ec.annotations()
        .get(render::INITIAL_SIZE_ANNOTATION)?
        .parse()
        .ok()
        .filter(|n| *n >= 1)
}

/// Writes the status through the status subresource, only when it differs from what the
/// cluster shows. Right after a write the cached cluster may not show it yet (its watch event
/// is on the way), so for [`STATUS_MEMO`] the status last written is what the cluster shows.
async fn update_status(
    ctx: &Context,
    api: &Api<EtcdCluster>,
    ec: &EtcdCluster,
    seen: &Observation,
) -> Result<bool, Error> {
    let uid = ec.uid().unwrap_or_default();
    let written = ctx
        .written
        .lock()
        .expect("not poisoned")
        .get(&uid)
        .filter(|(at, _)| at.elapsed() < STATUS_MEMO)
        .map(|(_, status)| status.clone());
    // Only when the memo stands in is the cluster copied (to show that status).
    let view = match written {
        Some(status) => std::borrow::Cow::Owned(EtcdCluster {
            status: Some(status),
            ..ec.clone()
        }),
        None => std::borrow::Cow::Borrowed(ec),
    };
    let want = status::desired(&view, seen, now());
    if view.status.as_ref() == Some(&want) {
        return Ok(false);
    }
    let body = json!({
        "apiVersion": crate::api::Version::V1.api_version(),
        "kind": crate::api::KIND,
        "status": want,
    });
    api.patch_status(
        &ec.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| Error::kube("update status of", "EtcdCluster", &ec.name_any(), e))?;
    let mut memo = ctx.written.lock().expect("not poisoned");
    memo.retain(|_, (at, _)| at.elapsed() < STATUS_MEMO);
    memo.insert(uid, (std::time::Instant::now(), want));
    Ok(true)
}

/// How long the status last written stands in for a cached cluster that does not show it yet.
const STATUS_MEMO: Duration = Duration::from_secs(5);

fn job_outcome(job: &Job) -> Option<bool> {
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

fn template_image(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

fn template_storage_gib(sts: &StatefulSet) -> Option<i64> {
    let q = sts
        .spec
        .as_ref()?
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    render::gib(&q.0)
}

/// The webhook's rules, once more: a cluster that got in while the webhook was bypassed
/// (failurePolicy Ignore, or created before it was installed) is not acted on.
fn check_spec(ec: &EtcdCluster) -> Result<(), Error> {
    use crate::admission::validate::{Operation, validate};
    let object = serde_json::to_value(ec).expect("an EtcdCluster serializes");
    let verdict = validate(crate::api::Version::V1, Operation::Create, &object, None);
    if verdict.allowed() {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "the spec breaks the webhook's rules, so nothing is changed: {}",
            verdict.message()
        )))
    }
}

/// One pass over a live (not deleted) cluster: children, then what the status needs.
async fn apply_children(ec: &EtcdCluster, ctx: &Context) -> Result<Observation, Error> {
    let name = ec.name_any();
    let opts = &ctx.settings.render;
    let kids = Children::of(ec, ctx);
    let mut seen = Observation::default();

    kids.ensure(&render::headless_service(ec)).await?;
    kids.ensure(&render::client_service(ec)).await?;

    let observed = kids.read::<StatefulSet>(&name).await?;
    let initial = initial_size_recorded(ec)
        .or_else(|| observed.as_ref().and_then(|s| s.spec.as_ref()?.replicas))
        .unwrap_or(ec.spec.size);
    let mut apply_set = true;
    // Members the StatefulSet runs after this pass (below spec.size while growing).
    let mut members = ec.spec.size;
    if let Some(current) = &observed {
        seen.ready = current
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let replicas = current.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if replicas > ec.spec.size && current.metadata.deletion_timestamp.is_none() {
            return Err(Error::InvalidSpec(format!(
                "spec.size {} is below the {replicas} members running; members are never removed (set spec.size back to {replicas})",
                ec.spec.size
            )));
        }
        if let (Some(have), Some(want)) = (
            template_storage_gib(current),
            render::gib(&ec.spec.storage_size),
        ) && want < have
        {
            return Err(Error::InvalidSpec(format!(
                "spec.storageSize {want}Gi is below the {have}Gi the members have; volumes never shrink (set it back to {have}Gi)"
            )));
        }
        if current.metadata.deletion_timestamp.is_some() || replicas < ec.spec.size {
            members = replicas.max(1);
        }
        if current.metadata.deletion_timestamp.is_some() {
            // Being replaced (storage growth): wait until it is gone, then create it again.
            seen.activity = Some(Activity::ResizingStorage);
            apply_set = false;
        } else if let (Some(have), Some(want)) = (
            template_storage_gib(current),
            render::gib(&ec.spec.storage_size),
        ) && want > have
        {
            resize_storage(ec, &kids, replicas, have, want).await?;
            seen.activity = Some(Activity::ResizingStorage);
            apply_set = false;
        } else if ec.spec.size > replicas {
            // etcd grows one member at a time: add it to the membership, give the StatefulSet
            // its pod, wait until every member is ready, then the next. (Adding two before
            // either runs can cost the quorum: 1 -> 3 would leave 1 of 3 started.)
            members = replicas;
            seen.activity = Some(Activity::AddingMembers);
            if seen.ready >= replicas {
                let job_name = render::member_job_name(ec, replicas);
                let (applied, job) = kids
                    .ensure_created(&render::member_add_job(ec, replicas, opts))
                    .await?;
                if applied == Applied::Created {
                    ctx.event(
                        ec,
                        EventType::Normal,
                        "AddingMember",
                        format!("etcdctl member add {name}-{replicas} (Job {job_name})"),
                    )
                    .await;
                }
                match job_outcome(&job) {
                    Some(true) => {
                        members = replicas + 1;
                        seen.activity = Some(Activity::Scaling);
                        ctx.event(
                            ec,
                            EventType::Normal,
                            "Scaling",
                            format!("members {replicas} -> {members} (of {})", ec.spec.size),
                        )
                        .await;
                    }
                    Some(false) => return Err(Error::MemberAddFailed(job_name)),
                    None => {}
                }
            }
        }
    }
    if apply_set {
        let desired = render::stateful_set(ec, initial, members, opts);
        let (applied, set) = kids.ensure(&desired).await?;
        let (old_image, new_image) = (
            observed.as_deref().and_then(template_image),
            template_image(&desired),
        );
        match applied {
            Applied::Created if observed.is_none() => {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "Created",
                    format!(
                        "StatefulSet {name} with {} members of etcd {}",
                        ec.spec.size, ec.spec.version
                    ),
                )
                .await;
            }
            Applied::Updated if old_image.is_some() && old_image != new_image => {
                ctx.event(
                    ec,
                    EventType::Normal,
                    "Upgrading",
                    format!(
                        "{} -> {}",
                        old_image.unwrap_or_default(),
                        new_image.unwrap_or_default()
                    ),
                )
                .await;
                seen.activity = Some(Activity::Upgrading);
            }
            _ => {}
        }
        if let Some(s) = set.status.as_ref() {
            seen.ready = s.ready_replicas.unwrap_or(0);
            let rolling = s.update_revision.is_some() && s.update_revision != s.current_revision;
            if rolling && seen.activity.is_none() {
                seen.activity = Some(Activity::Upgrading);
            }
        }
    }

    kids.ensure(&render::pod_disruption_budget(ec, members))
        .await?;

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
    Ok(seen)
}

/// Storage growth: volume claim templates are immutable, so grow each member's claim, then
/// delete the StatefulSet leaving its pods (orphan); the next pass creates it with the new
/// template and it adopts the running pods.
async fn resize_storage(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
    have: i64,
    want: i64,
) -> Result<(), Error> {
    let size = crate::api::quantity::canonical_gib(want);
    for ordinal in 0..replicas {
        let claim = render::member_claim(ec, ordinal);
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        match kids
            .api::<PersistentVolumeClaim>()
            .patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("grow", "PersistentVolumeClaim", &claim, e)),
        }
    }
    let name = ec.name_any();
    let deleted = kids
        .api::<StatefulSet>()
        .delete(
            &name,
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await;
    match deleted {
        Ok(_) => {}
        // Already deleted by an earlier pass (the cache had not seen it go): nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(Error::kube("replace", "StatefulSet", &name, e)),
    }
    kids.ctx
        .event(
            ec,
            EventType::Normal,
            "ResizingStorage",
            format!("member volumes {have}Gi -> {want}Gi; StatefulSet {name} recreated, pods kept"),
        )
        .await;
    Ok(())
}

/// Deletion: the final snapshot (when backups are on) as a Job, waited for by requeueing,
/// then the finalizer goes. It always goes: a failed Job or `--finalizer-timeout` remove it
/// with a Warning event.
async fn cleanup(
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

/// Reconciles one EtcdCluster (the controller calls it; tests call it directly).
pub async fn reconcile(ec: Arc<EtcdCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&ec, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let label = if result.is_ok() { "success" } else { "error" };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabel { result: label })
        .inc();
    if result.is_ok() {
        ctx.failures.lock().expect("not poisoned").remove(&key(&ec));
    }
    result
}

async fn reconcile_inner(ec: &EtcdCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = ec.namespace().unwrap_or_else(|| "default".to_owned());
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &ns);
    if ec.metadata.deletion_timestamp.is_some() {
        return cleanup(ec, ctx, &clusters).await;
    }
    // An invalid spec gets no finalizer either: nothing will be created for it, and the
    // validating webhook would deny the metadata update anyway (it judges the whole object).
    let outcome = match check_spec(ec) {
        Ok(()) if !has_finalizer(ec) => match add_finalizer(&clusters, ec).await {
            Ok(()) => apply_children(ec, ctx).await,
            Err(e) => Err(e),
        },
        Ok(()) => apply_children(ec, ctx).await,
        Err(invalid) => Err(invalid),
    };
    match outcome {
        Ok(seen) => {
            update_status(ctx, &clusters, ec, &seen).await?;
            // Progress (members turning ready, Jobs finishing) arrives as watch events of the
            // owned objects; the periodic resync only catches what a watch missed.
            Ok(Action::requeue(ctx.settings.resync))
        }
        Err(error) => {
            let reason = match error {
                Error::InvalidSpec(_) => "InvalidSpec",
                _ => "ApplyFailed",
            };
            let seen = Observation {
                ready: ec
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0),
                failure: Some((reason, error.to_string())),
                ..Default::default()
            };
            // Best effort: the reason shows in the status; the error itself goes to backoff.
            if update_status(ctx, &clusters, ec, &seen)
                .await
                .unwrap_or(false)
            {
                ctx.event(ec, EventType::Warning, reason, error.to_string())
                    .await;
            }
            match error {
                // Not transient: wait for the spec to change (a watch event), check again at
                // the resync.
                Error::InvalidSpec(_) => Ok(Action::requeue(ctx.settings.resync)),
                _ => Err(error),
            }
        }
    }
}

/// Backoff after an error: 5 s doubling per consecutive failure of the same cluster, at most
/// 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(6));
    Duration::from_secs(secs.min(300))
}

pub fn error_policy(ec: Arc<EtcdCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let n = {
        let mut failures = ctx.failures.lock().expect("not poisoned");
        let n = failures.entry(key(&ec)).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(n);
    tracing::warn!(cluster = %key(&ec), %error, failures = n, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `stop` is cancelled.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let ns = settings.namespace.clone();
    let ns = ns.as_deref();
    let owned = watcher::Config::default().labels(MANAGED_SELECTOR);
    // One watch per owned kind feeds both its cache and the reconcile triggers.
    fn cached<K: Child>(
        client: &Client,
        ns: Option<&str>,
        config: &watcher::Config,
    ) -> (
        Store<K>,
        impl futures_util::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    ) {
        let (reader, writer) = reflector::store();
        let stream = watcher(api_in::<K>(client, ns), config.clone())
            .default_backoff()
            // managedFields are often half an object; nothing here reads them.
            .modify(|o: &mut K| o.meta_mut().managed_fields = None)
            .reflect(writer)
            .touched_objects();
        (reader, stream)
    }
    let (sets, sets_events) = cached::<StatefulSet>(&client, ns, &owned);
    let (services, services_events) = cached::<Service>(&client, ns, &owned);
    let (budgets, budgets_events) = cached::<PodDisruptionBudget>(&client, ns, &owned);
    let (crons, crons_events) = cached::<CronJob>(&client, ns, &owned);
    let (jobs, jobs_events) = cached::<Job>(&client, ns, &owned);
    // Claims trigger nothing (they change only through us); their events just fill the cache.
    let (claims, claims_events) = cached::<PersistentVolumeClaim>(&client, ns, &owned);
    let caches = Caches {
        sets,
        services,
        budgets,
        crons,
        jobs,
        claims,
    };
    let ctx = Arc::new(Context::new(client.clone(), settings, metrics, caches));
    tracing::info!(namespace = ns.unwrap_or("(all)"), "controller starting");
    let claims_stop = stop.clone();
    let claims_task = tokio::spawn(async move {
        tokio::select! {
            () = claims_events.for_each(|_| async {}) => {}
            () = claims_stop.cancelled() => {}
        }
    });
    Controller::new(
        api_in::<EtcdCluster>(&client, ns),
        watcher::Config::default(),
    )
    .owns_stream(sets_events)
    .owns_stream(services_events)
    .owns_stream(budgets_events)
    .owns_stream(crons_events)
    .owns_stream(jobs_events)
    // Coalesce the bursts of events one pass causes (its own writes coming back through the
    // watches), so the next pass sees them all in the caches.
    .with_config(controller::Config::default().debounce(DEBOUNCE))
    .graceful_shutdown_on(stop.cancelled_owned())
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        match result {
            Ok((obj, _)) => tracing::debug!(cluster = %obj, "reconciled"),
            Err(error) => tracing::debug!(%error, "reconcile error (see the warning above)"),
        }
    })
    .await;
    claims_task.abort();
    tracing::info!("controller stopped");
}
