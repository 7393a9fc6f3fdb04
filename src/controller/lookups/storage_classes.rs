//! The cluster's StorageClasses as the webhook's rules see them: one watch (list once, then
//! changes) kept in memory on every replica, so that `/validate` can warn about a class that
//! does not exist or cannot grow without an API call per request. Until the first list is in,
//! or while the watch is refused (no RBAC), nothing is said.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::admission::storage_class::{Class, Known, StorageClasses};

/// What the watch reads: StorageClasses are cluster-scoped, so this is granted cluster-wide in
/// every install (its own ClusterRole, `etcd-webhook-storage-classes`).
pub const STORAGE_CLASS_RBAC_RULES: &[(&str, &str, &[&str])] =
    &[("storage.k8s.io", "storageclasses", &["list", "watch"])];

/// The annotation that marks the default class.
const DEFAULT_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// The StorageClasses last seen; empty until [`run`] has listed them once.
#[derive(Default)]
pub struct Cache {
    store: std::sync::OnceLock<Store<StorageClass>>,
    listed: AtomicBool,
}

impl StorageClasses for Cache {
    fn known(&self) -> Option<Known> {
        if !self.listed.load(Ordering::Acquire) {
            return None;
        }
        Some(known(&self.store.get()?.state()))
    }
}

/// The snapshot the rules read: every class, and the default one (the newest of several
/// marked default, as the apiserver's DefaultStorageClass admission picks it).
pub fn known(classes: &[Arc<StorageClass>]) -> Known {
    let mut default: Option<&StorageClass> = None;
    for c in classes {
        let marked = c
            .annotations()
            .get(DEFAULT_ANNOTATION)
            .is_some_and(|v| v == "true");
        if marked
            && default.is_none_or(|d| c.metadata.creation_timestamp > d.metadata.creation_timestamp)
        {
            default = Some(c);
        }
    }
    let mut classes: Vec<Class> = classes
        .iter()
        .map(|c| Class {
            name: c.name_any(),
            allows_expansion: c.allow_volume_expansion == Some(true),
        })
        .collect();
    classes.sort_by(|a, b| a.name.cmp(&b.name));
    Known {
        classes,
        default: default.map(|d| d.name_any()),
    }
}

/// Follows the StorageClasses until `shutdown`; errors back off and are logged once each.
pub async fn run(client: Client, cache: Arc<Cache>, shutdown: CancellationToken) {
    let (reader, writer) = reflector::store();
    if cache.store.set(reader).is_err() {
        return;
    }
    let stream = reflector::reflector(
        writer,
        watcher(Api::<StorageClass>::all(client), watcher::Config::default()),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut last_error: Option<String> = None;
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = shutdown.cancelled() => return,
        };
        match event {
            None => return,
            Some(Ok(watcher::Event::InitDone)) => {
                if !cache.listed.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        "StorageClasses listed: /validate warns about a class that does not exist or cannot grow"
                    );
                }
                last_error = None;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "cannot watch StorageClasses (the ClusterRole etcd-webhook-storage-classes grants list and watch); /validate says nothing about storage classes until it can");
                    last_error = Some(text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn class(name: &str, default: bool, expands: bool, created: i64) -> Arc<StorageClass> {
        Arc::new(StorageClass {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations: default
                    .then(|| [(DEFAULT_ANNOTATION.to_owned(), "true".to_owned())].into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
                )),
                ..Default::default()
            },
            allow_volume_expansion: Some(expands),
            provisioner: "x".to_owned(),
            ..Default::default()
        })
    }

    #[test]
    fn the_newest_class_marked_default_is_the_default() {
        let k = known(&[
            class("old-default", true, false, 100),
            class("gp3", true, true, 200),
            class("local", false, false, 300),
        ]);
        assert_eq!(k.default.as_deref(), Some("gp3"));
        assert_eq!(
            k.classes
                .iter()
                .map(|c| (c.name.as_str(), c.allows_expansion))
                .collect::<Vec<_>>(),
            [("gp3", true), ("local", false), ("old-default", false)]
        );
        assert_eq!(known(&[class("a", false, true, 1)]).default, None);
    }

    #[test]
    fn nothing_is_known_before_the_first_list() {
        assert_eq!(Cache::default().known(), None);
    }
}
