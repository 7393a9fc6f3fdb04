//! The caches of the owned objects the controller's watches fill: each kind's reflector store,
//! and the compact form ([`Cached`]) an object is kept in, decoded only when a pass reads it.

use std::borrow::Cow;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::Error;

pub(crate) fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
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
    fn cache(caches: &Caches) -> &Store<Cached<Self>>;

    /// Drops, before the object is cached, the parts of this kind the loop never reads (its
    /// JSON, without `metadata`).
    fn slim_body(_body: &mut Map<String, Value>) {}
}

/// An object as the caches keep it: its metadata typed (the cache's key and the owner
/// references the controller maps to clusters), without managedFields (often half an object)
/// and the last-applied annotation (the other half; the annotations map itself stays, so a
/// patch that adds a key never replaces the map); everything else as one compact JSON
/// string, decoded ([`Cached::object`]) when a pass reads the object. A typed object takes
/// three to four times its JSON in memory (every optional field of a container, a volume, a
/// probe is a slot whether set or not; `benches/cache_memory.rs`), and the caches are what
/// grows with the number of clusters. Per kind, what the loop never reads is dropped too
/// ([`Child::slim_body`]): a pod's spec, a Job's pod template.
#[derive(Clone, Debug)]
pub struct Cached<K> {
    pub metadata: ObjectMeta,
    /// `{"apiVersion": ..., "kind": ..., "spec": ..., "status": ...}`: the object without its
    /// metadata, compact.
    body: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Child> Cached<K> {
    /// `object`, as its watch event would cache it.
    #[cfg(test)]
    pub fn new(object: &K) -> Self {
        let value = serde_json::to_value(object).expect("k8s objects serialize");
        serde_json::from_value(value).expect("a serialized object is one")
    }

    /// The whole object (its slimmed parts left out).
    pub fn object(&self) -> Result<K, Error> {
        let meta = serde_json::to_string(&self.metadata).expect("metadata serializes");
        // The body is a JSON object: splice the metadata in after its opening brace.
        let rest = self.body.strip_prefix('{').unwrap_or("}");
        let sep = if rest.starts_with('}') { "" } else { "," };
        serde_json::from_str(&format!("{{\"metadata\":{meta}{sep}{rest}")).map_err(|e| {
            Error::CacheDecode {
                kind: kind_of::<K>(),
                name: self.metadata.name.clone().unwrap_or_default(),
                reason: e.to_string(),
            }
        })
    }
}

impl<K: Resource> Resource for Cached<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the watch reads off the wire goes straight into the compact form: the typed object is
/// never built.
impl<'de, K: Child> Deserialize<'de> for Cached<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut body = Map::<String, Value>::deserialize(d)?;
        let mut metadata: ObjectMeta = match body.remove("metadata") {
            Some(Value::Object(mut m)) => {
                // Never typed: dropped as read.
                m.remove("managedFields");
                serde_json::from_value(Value::Object(m)).map_err(serde::de::Error::custom)?
            }
            Some(other) => serde_json::from_value(other).map_err(serde::de::Error::custom)?,
            None => ObjectMeta::default(),
        };
        slim_meta(&mut metadata);
        K::slim_body(&mut body);
        let body = serde_json::to_string(&body)
            .map_err(serde::de::Error::custom)?
            .into_boxed_str();
        Ok(Cached {
            metadata,
            body,
            kind: PhantomData,
        })
    }
}

/// The metadata the caches keep (the clusters' own cache too): no managedFields, no
/// last-applied annotation.
pub fn slim_meta(meta: &mut ObjectMeta) {
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
            $(pub $field: Store<Cached<$kind>>,)*
        }
        $(impl Child for $kind {
            fn cache(caches: &Caches) -> &Store<Cached<Self>> {
                &caches.$field
            }
            $(fn slim_body(body: &mut Map<String, Value>) {
                let slim: fn(&mut Map<String, Value>) = $slim;
                slim(body)
            })?
        })*
    };
}

child! {
    StatefulSet => sets;
    Service => services;
    PodDisruptionBudget => budgets;
    CronJob => crons;
    // A Job is created once and then only its status is read (its template is required, so
    // it stays, empty).
    Job => jobs, slim: |job| {
        if let Some(Value::Object(spec)) = job.get_mut("spec") {
            spec.insert("template".to_owned(), Value::Object(Map::new()));
        }
    };
    PersistentVolumeClaim => claims;
    ConfigMap => configs;
    // The loop reads pods' labels and container statuses.
    Pod => pods, slim: |pod| {
        pod.remove("spec");
    };
    NetworkPolicy => policies;
    // TLS clusters' client certificates (only those: the watch selects their label).
    Secret => secrets;
}

/// The object `name` in namespace `ns` as the cache of `K` holds it (`None`: not there).
pub(crate) fn get<K: Child>(
    store: &Store<Cached<K>>,
    ns: &str,
    name: &str,
) -> Result<Option<Arc<K>>, Error> {
    let key = kube::runtime::reflector::ObjectRef::new(name).within(ns);
    store
        .get(&key)
        .map(|c| c.object().map(Arc::new))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::request::LAST_APPLIED;
    use crate::api::MANAGER;
    use crate::controller::machinery::children::job_outcome;
    use serde_json::json;

    #[test]
    fn a_cached_object_decodes_to_what_was_sent_without_managed_fields_and_last_applied() {
        let sent = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "etcd", "namespace": "prod", "uid": "u1", "resourceVersion": "7",
                "labels": {"app.kubernetes.io/instance": "etcd"},
                "annotations": {LAST_APPLIED: "{\"spec\":{}}", "team": "db"},
                "managedFields": [{"manager": MANAGER, "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]},
            "spec": {"replicas": 3, "serviceName": "etcd",
                "selector": {"matchLabels": {"app.kubernetes.io/instance": "etcd"}},
                "template": {"metadata": {"labels": {"app.kubernetes.io/instance": "etcd"}},
                    "spec": {"containers": [{"name": "etcd", "image": "etcd:v3.6",
                        "resources": {"requests": {"storage": "1Gi"}}}]}}},
            "status": {"replicas": 3, "readyReplicas": 2, "availableReplicas": 2}
        });
        let cached: Cached<StatefulSet> = serde_json::from_value(sent.clone()).unwrap();
        assert!(cached.metadata.managed_fields.is_none());
        let decoded = serde_json::to_value(cached.object().unwrap()).unwrap();
        let mut want = sent;
        let meta = want["metadata"].as_object_mut().unwrap();
        meta.remove("managedFields");
        meta["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(LAST_APPLIED);
        assert_eq!(decoded, want);
        // The typed way in (a test's fixture) is the same as the wire's.
        let typed: StatefulSet = serde_json::from_value(want.clone()).unwrap();
        assert_eq!(
            serde_json::to_value(Cached::new(&typed).object().unwrap()).unwrap(),
            want
        );
    }

    #[test]
    fn pods_are_cached_without_their_spec_and_jobs_without_their_pod_template() {
        let pod: Cached<Pod> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etcd-0"},
            "spec": {"containers": [{"name": "etcd", "image": "etcd:v3.6"}]},
            "status": {"phase": "Running",
                "containerStatuses": [{"name": "etcd", "image": "etcd:v3.6", "imageID": "",
                    "ready": true, "restartCount": 2}]}
        }))
        .unwrap();
        let pod = pod.object().unwrap();
        assert!(pod.spec.is_none());
        assert_eq!(
            pod.status.unwrap().container_statuses.unwrap()[0].restart_count,
            2
        );

        let job: Cached<Job> = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "backup"},
            "spec": {"backoffLimit": 2, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "backup", "image": "etcd-webhook"}]}}},
            "status": {"succeeded": 1}
        }))
        .unwrap();
        let job = job.object().unwrap();
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(2));
        assert_eq!(spec.template, Default::default());
        assert_eq!(job_outcome(&job), Some(true));
    }

    #[test]
    fn a_cached_object_that_does_not_decode_is_an_error_that_names_it() {
        // Any JSON object is cached as it came; the typed decode is what can fail.
        let cached: Cached<StatefulSet> = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "etcd"},
            "spec": {"replicas": "three"}
        }))
        .unwrap();
        let err = cached.object().unwrap_err().to_string();
        assert!(
            err.starts_with("the cached StatefulSet etcd does not decode: invalid type"),
            "{err}"
        );
    }
}
