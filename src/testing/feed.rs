//! The loop's caches fed from the in-memory API server: what its watches would hold after a
//! relist (the managed label selector, managedFields dropped), so a test runs whole passes
//! (`controller::reconcile`) as the controller does, reading the children from the caches.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::{reflector, watcher};

use super::FakeApi;
use crate::controller::{Cached, Caches, Child, MANAGED_SELECTOR};

/// The writing ends of a [`Caches`].
pub struct Feed {
    pub sets: reflector::store::Writer<Cached<StatefulSet>>,
    pub services: reflector::store::Writer<Cached<Service>>,
    pub budgets: reflector::store::Writer<Cached<PodDisruptionBudget>>,
    pub crons: reflector::store::Writer<Cached<CronJob>>,
    pub jobs: reflector::store::Writer<Cached<Job>>,
    pub claims: reflector::store::Writer<Cached<PersistentVolumeClaim>>,
    pub configs: reflector::store::Writer<Cached<ConfigMap>>,
    pub pods: reflector::store::Writer<Cached<Pod>>,
    pub policies: reflector::store::Writer<Cached<NetworkPolicy>>,
    pub secrets: reflector::store::Writer<Cached<Secret>>,
}

/// Empty caches and the feed that fills them.
pub fn caches() -> (Caches, Feed) {
    let (sets, sets_w) = reflector::store();
    let (services, services_w) = reflector::store();
    let (budgets, budgets_w) = reflector::store();
    let (crons, crons_w) = reflector::store();
    let (jobs, jobs_w) = reflector::store();
    let (claims, claims_w) = reflector::store();
    let (configs, configs_w) = reflector::store();
    let (pods, pods_w) = reflector::store();
    let (policies, policies_w) = reflector::store();
    let (secrets, secrets_w) = reflector::store();
    (
        Caches {
            sets,
            services,
            budgets,
            crons,
            jobs,
            claims,
            configs,
            pods,
            policies,
            secrets,
        },
        Feed {
            sets: sets_w,
            services: services_w,
            budgets: budgets_w,
            crons: crons_w,
            jobs: jobs_w,
            claims: claims_w,
            configs: configs_w,
            pods: pods_w,
            policies: policies_w,
            secrets: secrets_w,
        },
    )
}

/// Refills one cache from the fake as the controller's watch (label selector
/// [`MANAGED_SELECTOR`], managedFields dropped) would after a relist.
pub fn refill<K: Child>(
    writer: &mut reflector::store::Writer<Cached<K>>,
    api: &FakeApi,
    resource: &str,
) {
    refill_selected(writer, api, resource, MANAGED_SELECTOR);
}

/// [`refill`] with another label selector.
pub fn refill_selected<K: Child>(
    writer: &mut reflector::store::Writer<Cached<K>>,
    api: &FakeApi,
    resource: &str,
    selector: &str,
) {
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in api.list_selected(resource, selector) {
        // As the watches cache it: compact and slimmed.
        let obj: Cached<K> = serde_json::from_value(o).expect("a stored object deserializes");
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

impl Feed {
    /// Brings every cache up to date with the fake, as the watches would between passes
    /// (the client Secrets by their label, as `--cache-client-secrets` watches them).
    pub fn sync(&mut self, api: &FakeApi) {
        self.sync_children(api);
        let client_tls = format!("{}=true", crate::api::CLIENT_TLS_LABEL);
        refill_selected(&mut self.secrets, api, "secrets", &client_tls);
    }

    /// [`Feed::sync`] without the Secrets.
    pub fn sync_children(&mut self, api: &FakeApi) {
        refill::<StatefulSet>(&mut self.sets, api, "statefulsets");
        refill(&mut self.services, api, "services");
        refill(&mut self.budgets, api, "poddisruptionbudgets");
        refill(&mut self.crons, api, "cronjobs");
        refill(&mut self.jobs, api, "jobs");
        refill(&mut self.claims, api, "persistentvolumeclaims");
        refill(&mut self.configs, api, "configmaps");
        refill(&mut self.pods, api, "pods");
        refill(&mut self.policies, api, "networkpolicies");
    }
}
