//! Retiring old versions: `migrate-storage` rewrites every EtcdCluster unchanged, so the
//! apiserver re-encodes it in the CRD's storage version, and only when every object was
//! rewritten sets the CRD's `status.storedVersions` to the storage version alone; and the check
//! behind `crd --served`, which refuses to stop serving a version that may still be stored.
//!
//! A rewrite is a PUT of the object as read (in the storage version): the apiserver's storage
//! layer writes it only when its new encoding differs from the bytes in etcd, so objects stored
//! in an old version are rewritten and those already in the storage version are left alone.
//! A conflict (the object changed since it was read) is retried on a fresh read; an object
//! deleted meanwhile is skipped; anything else is a failure, and any failure leaves
//! `storedVersions` as it was.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::api::{GROUP, Version};

/// The CRD this command migrates.
pub const CRD_NAME: &str = "etcdclusters.etcd.example.com";

/// Every API call `migrate-storage` (and the check of `crd --served`) makes, as RBAC rules
/// (group, resource, verbs): `config/storage-migration`'s ClusterRole grants exactly these
/// (tests/manifests.rs), and the unit tests check every call made is covered.
pub const MIGRATOR_RBAC_RULES: &[(&str, &str, &[&str])] = &[
    (
        "etcd.example.com",
        "etcdclusters",
        &["list", "get", "update"],
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get"],
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions/status",
        &["patch"],
    ),
];

/// How often an object changed by someone else is read and rewritten again before it counts
/// as failed.
const CONFLICT_RETRIES: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the CustomResourceDefinition {CRD_NAME}: {0}")]
    ReadCrd(#[source] kube::Error),
    #[error("the CustomResourceDefinition {CRD_NAME} has no storage version")]
    NoStorageVersion,
    #[error("cannot list EtcdClusters: {0}")]
    List(#[source] kube::Error),
    #[error(
        "the storage version of {CRD_NAME} changed during the migration ({before} -> {after}); \
         storedVersions left as they were: run the migration again"
    )]
    StorageChanged { before: String, after: String },
    #[error("cannot set status.storedVersions of {CRD_NAME}: {0}")]
    SetStoredVersions(#[source] kube::Error),
}

/// What to do.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Send every rewrite with `dryRun=All` (conversion and webhooks run, nothing is written)
    /// and leave `storedVersions` alone.
    pub dry_run: bool,
    /// Rewrites in flight at once.
    pub concurrency: usize,
}

/// What happened to one object.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Rewritten,
    /// Deleted between the list and its rewrite.
    Gone,
    Failed(String),
}

/// The final report (also printed as JSON with `-o json`).
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub dry_run: bool,
    pub storage_version: String,
    pub stored_versions_before: Vec<String>,
    pub stored_versions_after: Vec<String>,
    /// EtcdClusters listed (every namespace).
    pub listed: usize,
    /// Rewritten (in a dry run: accepted with dryRun=All).
    pub rewritten: usize,
    /// Deleted between the list and their rewrite.
    pub skipped: usize,
    /// `namespace/name: error`, one per object that could not be rewritten.
    pub failed: Vec<String>,
}

impl Report {
    /// Human-readable, one fact per line.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let verb = if self.dry_run {
            "accepted in a dry run (nothing written)"
        } else {
            "rewritten"
        };
        out.push_str(&format!(
            "storage version:        {}\n",
            self.storage_version
        ));
        out.push_str(&format!(
            "storedVersions before:  [{}]\n",
            self.stored_versions_before.join(", ")
        ));
        out.push_str(&format!("EtcdClusters listed:    {}\n", self.listed));
        out.push_str(&format!("{verb}: {}\n", self.rewritten));
        out.push_str(&format!("skipped (deleted meanwhile): {}\n", self.skipped));
        out.push_str(&format!("failed:                 {}\n", self.failed.len()));
        for f in &self.failed {
            out.push_str(&format!("  {f}\n"));
        }
        out.push_str(&format!(
            "storedVersions now:     [{}]\n",
            self.stored_versions_after.join(", ")
        ));
        if !self.failed.is_empty() {
            out.push_str(
                "storedVersions were left as they were: fix the failures above and run again.\n",
            );
        }
        out
    }
}

/// The version a CRD stores objects in.
fn storage_version(crd: &CustomResourceDefinition) -> Option<String> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
}

/// The storage version and `status.storedVersions` of the CRD.
fn versions(crd: &CustomResourceDefinition) -> Result<(String, Vec<String>), Error> {
    let storage = storage_version(crd).ok_or(Error::NoStorageVersion)?;
    let stored = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    Ok((storage, stored))
}

/// Versions that `storedVersions` lists but `served` does not: objects may still be encoded in
/// them, so they must stay served until `migrate-storage` has run.
pub fn still_stored(stored_versions: &[String], served: &[Version]) -> Vec<String> {
    stored_versions
        .iter()
        .filter(|v| !served.iter().any(|s| s.as_str() == v.as_str()))
        .cloned()
        .collect()
}

/// The live CRD's `status.storedVersions`, or `None` when the CRD is not installed.
pub async fn stored_versions(client: Client) -> Result<Option<Vec<String>>, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    match crds.get_opt(CRD_NAME).await.map_err(Error::ReadCrd)? {
        Some(crd) => Ok(Some(versions(&crd)?.1)),
        None => Ok(None),
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Rewrites one object as read; on a conflict reads it again and retries.
async fn rewrite(
    client: Client,
    resource: &ApiResource,
    mut obj: DynamicObject,
    params: &PostParams,
) -> Outcome {
    let name = obj.name_any();
    let api: Api<DynamicObject> = match obj.namespace() {
        Some(ns) => Api::namespaced_with(client, &ns, resource),
        None => Api::all_with(client, resource),
    };
    for _ in 0..CONFLICT_RETRIES {
        match api.replace(&name, params, &obj).await {
            Ok(_) => return Outcome::Rewritten,
            Err(e) if is_code(&e, 404) => return Outcome::Gone,
            Err(e) if is_code(&e, 409) => match api.get_opt(&name).await {
                Ok(Some(fresh)) => obj = fresh,
                Ok(None) => return Outcome::Gone,
                Err(e) => return Outcome::Failed(format!("read again after a conflict: {e}")),
            },
            Err(e) => return Outcome::Failed(e.to_string()),
        }
    }
    Outcome::Failed(format!("still changing after {CONFLICT_RETRIES} conflicts"))
}

/// Lists every EtcdCluster in the storage version, page by page.
async fn list_all(api: &Api<DynamicObject>) -> Result<Vec<DynamicObject>, Error> {
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(Error::List)?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// Runs the migration; `progress(done, total)` is called after every object.
pub async fn run(
    client: Client,
    options: Options,
    progress: impl Fn(usize, usize),
) -> Result<Report, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(CRD_NAME).await.map_err(Error::ReadCrd)?;
    let (storage, stored_before) = versions(&crd)?;
    let mut report = Report {
        dry_run: options.dry_run,
        storage_version: storage.clone(),
        stored_versions_before: stored_before.clone(),
        stored_versions_after: stored_before.clone(),
        ..Report::default()
    };
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, &storage, "EtcdCluster"),
        "etcdclusters",
    );
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let items = list_all(&all).await?;
    report.listed = items.len();
    let total = items.len();
    let params = PostParams {
        dry_run: options.dry_run,
        field_manager: Some("etcd-webhook-migrate-storage".to_owned()),
    };
    let done = AtomicUsize::new(0);
    let outcomes: Vec<(String, Outcome)> = futures_util::stream::iter(items)
        .map(|obj| {
            let (client, resource, params, done, progress) =
                (client.clone(), &resource, &params, &done, &progress);
            async move {
                let id = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
                let outcome = rewrite(client, resource, obj, params).await;
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                (id, outcome)
            }
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    for (id, outcome) in outcomes {
        match outcome {
            Outcome::Rewritten => report.rewritten += 1,
            Outcome::Gone => report.skipped += 1,
            Outcome::Failed(e) => report.failed.push(format!("{id}: {e}")),
        }
    }
    report.failed.sort();
    if options.dry_run || !report.failed.is_empty() || stored_before == [storage.clone()] {
        return Ok(report);
    }
    report.stored_versions_after = set_stored_versions(&crds, &storage).await?;
    Ok(report)
}

/// Sets `status.storedVersions` to `[storage]`, on the condition (resourceVersion) that the
/// CRD read just before still has that storage version; retried when the CRD changed meanwhile
/// (cainjector rewrites its caBundle, for one).
async fn set_stored_versions(
    crds: &Api<CustomResourceDefinition>,
    storage: &str,
) -> Result<Vec<String>, Error> {
    let mut last = None;
    for _ in 0..CONFLICT_RETRIES {
        let crd = crds.get(CRD_NAME).await.map_err(Error::ReadCrd)?;
        let (now, _) = versions(&crd)?;
        if now != storage {
            return Err(Error::StorageChanged {
                before: storage.to_owned(),
                after: now,
            });
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": crd.resource_version()},
            "status": {"storedVersions": [storage]},
        });
        match crds
            .patch_status(CRD_NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(crd) => return Ok(versions(&crd)?.1),
            Err(e) if is_code(&e, 409) => last = Some(e),
            Err(e) => return Err(Error::SetStoredVersions(e)),
        }
    }
    Err(Error::SetStoredVersions(
        last.expect("the loop ran at least once"),
    ))
}

/// The CRD with only the `served` versions. The others are removed from `spec.versions`, not
/// kept with `served: false`: the apiserver keeps a watch cache for every version the CRD lists,
/// served or not, and each converts every write (tests/e2e measured the same two
/// ConversionReviews per write either way). The apiserver refuses the removal while
/// `status.storedVersions` lists a removed version; serving them again is one apply of the full
/// CRD.
pub fn crd_serving(served: &[Version]) -> Result<CustomResourceDefinition, String> {
    let mut crd = crate::api::crd();
    let storage = storage_version(&crd).expect("the generated CRD has a storage version");
    if !served.iter().any(|v| v.as_str() == storage) {
        return Err(format!(
            "{storage} is the storage version: it must stay served"
        ));
    }
    crd.spec
        .versions
        .retain(|v| served.iter().any(|s| s.as_str() == v.name));
    Ok(crd)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::testing::{FakeApi, assert_granted};

    const CRD_PATH: &str =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/etcdclusters.etcd.example.com";
    const CLUSTERS: usize = 30;

    fn path(i: usize) -> String {
        format!(
            "/apis/etcd.example.com/v1/namespaces/ns-{}/etcdclusters/c-{i:02}",
            i % 2
        )
    }

    /// The CRD with `storedVersions`, and 30 clusters in two namespaces.
    fn cluster_api(stored: &[&str]) -> FakeApi {
        let api = FakeApi::default();
        let mut crd = serde_json::to_value(crate::api::crd()).unwrap();
        crd["status"] = json!({"storedVersions": stored});
        api.insert(CRD_PATH, crd);
        for i in 0..CLUSTERS {
            api.insert(
                &path(i),
                json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                    "metadata": {"name": format!("c-{i:02}"), "namespace": format!("ns-{}", i % 2),
                        "labels": {"i": i.to_string()}},
                    "spec": {"size": 3}, "status": {"phase": "Running"}}),
            );
        }
        api
    }

    fn stored(api: &FakeApi) -> Value {
        api.get(CRD_PATH).unwrap()["status"]["storedVersions"].clone()
    }

    async fn migrate(api: &FakeApi, dry_run: bool) -> Report {
        let options = Options {
            dry_run,
            concurrency: 4,
        };
        let progress = std::sync::Mutex::new(Vec::new());
        let report = run(api.client(), options, |done, total| {
            progress.lock().unwrap().push((done, total))
        })
        .await
        .unwrap();
        let progress = progress.into_inner().unwrap();
        assert_eq!(progress.len(), CLUSTERS, "progress after every object");
        assert_eq!(progress.last(), Some(&(CLUSTERS, CLUSTERS)));
        report
    }

    #[tokio::test]
    async fn rewrites_every_object_retrying_conflicts_then_sets_stored_versions() {
        let api = cluster_api(&["v1alpha1", "v1"]);
        api.fail("PUT", "/etcdclusters/c-03", 2, 409);
        // Deleted between the list and its rewrite.
        api.fail("PUT", "/etcdclusters/c-05", 1, 404);
        // The CRD changed between its read and the status write (cainjector, say).
        api.fail("PATCH", "/customresourcedefinitions/", 1, 409);
        let report = migrate(&api, false).await;
        assert_eq!(
            (report.listed, report.rewritten, report.skipped),
            (CLUSTERS, CLUSTERS - 1, 1)
        );
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(report.stored_versions_after, ["v1"]);
        assert_eq!(stored(&api), json!(["v1"]));
        let calls = api.calls();
        let puts = |name: &str| {
            calls
                .iter()
                .filter(|c| c.method == "PUT" && c.path.ends_with(name))
                .count()
        };
        assert_eq!(puts("/c-03"), 3, "two conflicts, then the rewrite");
        assert_eq!(puts("/c-00"), 1);
        // Each PUT sends the object as read, resourceVersion included (the precondition).
        let put = calls.iter().find(|c| c.method == "PUT").unwrap();
        assert!(put.body.as_ref().unwrap()["metadata"]["resourceVersion"].is_string());
        // storedVersions is written last, once every object is done, on its resourceVersion.
        let last = calls.last().unwrap();
        assert!(
            last.method == "PATCH" && last.status_subresource,
            "{last:?}"
        );
        assert!(last.body.as_ref().unwrap()["metadata"]["resourceVersion"].is_string());
        assert_granted(&calls, MIGRATOR_RBAC_RULES);
        // Nothing but the encoding changed: the spec, labels and status are as they were.
        let c = api.get(&path(7)).unwrap();
        assert_eq!(c["spec"], json!({"size": 3}));
        assert_eq!(c["metadata"]["labels"], json!({"i": "7"}));
        assert_eq!(c["status"], json!({"phase": "Running"}));
    }

    #[tokio::test]
    async fn a_failed_object_leaves_stored_versions_alone() {
        let api = cluster_api(&["v1alpha1", "v1"]);
        api.fail("PUT", "/etcdclusters/c-02", 1, 500);
        let report = migrate(&api, false).await;
        assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
        assert!(
            report.failed[0].starts_with("ns-0/c-02: "),
            "{:?}",
            report.failed
        );
        assert_eq!(report.rewritten, CLUSTERS - 1);
        assert_eq!(report.stored_versions_after, ["v1alpha1", "v1"]);
        assert_eq!(stored(&api), json!(["v1alpha1", "v1"]));
        assert!(
            !api.calls().iter().any(|c| c.status_subresource),
            "no write to the CRD"
        );
    }

    #[tokio::test]
    async fn a_dry_run_sends_every_rewrite_with_dry_run_and_writes_nothing() {
        let api = cluster_api(&["v1alpha1", "v1"]);
        let before = api.get(&path(4)).unwrap();
        let report = migrate(&api, true).await;
        assert_eq!((report.rewritten, report.dry_run), (CLUSTERS, true));
        assert!(report.text().contains("accepted in a dry run"));
        let calls = api.calls();
        let puts: Vec<_> = calls.iter().filter(|c| c.method == "PUT").collect();
        assert_eq!(puts.len(), CLUSTERS);
        assert!(puts.iter().all(|c| c.query.contains("dryRun=All")));
        assert!(!calls.iter().any(|c| c.method == "PATCH"));
        assert_eq!(api.get(&path(4)).unwrap(), before);
        assert_eq!(stored(&api), json!(["v1alpha1", "v1"]));
    }

    #[test]
    fn unserved_versions_still_stored_are_named() {
        let stored = vec!["v1alpha1".to_owned(), "v1".to_owned()];
        assert_eq!(still_stored(&stored, &[Version::V1]), ["v1alpha1"]);
        assert!(still_stored(&stored, &[Version::V1Alpha1, Version::V1]).is_empty());
        assert!(still_stored(&["v1".to_owned()], &[Version::V1]).is_empty());
    }

    #[test]
    fn crd_serving_only_v1_lists_only_v1() {
        let crd = crd_serving(&[Version::V1]).unwrap();
        let served: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(served, [("v1", true, true)]);
        assert_eq!(crd.spec.versions[0], crate::api::crd().spec.versions[2]);
        assert!(crd.spec.conversion.is_some());
        let two = crd_serving(&[Version::V1Beta1, Version::V1]).unwrap();
        assert_eq!(two.spec.versions.len(), 2);
        assert!(crd_serving(&[Version::V1Beta1]).is_err());
    }

    #[test]
    fn report_text_names_failures_and_what_was_left() {
        let report = Report {
            storage_version: "v1".into(),
            stored_versions_before: vec!["v1alpha1".into(), "v1".into()],
            stored_versions_after: vec!["v1alpha1".into(), "v1".into()],
            listed: 3,
            rewritten: 1,
            skipped: 1,
            failed: vec!["ns/a: boom".into()],
            dry_run: false,
        };
        let text = report.text();
        assert!(text.contains("rewritten: 1"), "{text}");
        assert!(text.contains("  ns/a: boom"), "{text}");
        assert!(text.contains("left as they were"), "{text}");
    }
}
