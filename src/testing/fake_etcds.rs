//! Many clusters' in-memory etcds behind the one transport the loop has.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::fake_etcd::FakeEtcd;
use super::host_part;
use crate::controller::etcd::{EtcdError, Transport};

/// Many clusters' etcds behind one transport, as the loop reaches them: a call goes to the
/// [`FakeEtcd`] of the cluster its endpoint names (`https://NAME-0.NAME.NS.svc:2379` -> `NAME`).
/// Unlike a lone `FakeEtcd` it takes any client identity (TLS clusters) and counts them.
#[derive(Default)]
pub struct FakeEtcds {
    clusters: Mutex<BTreeMap<String, Arc<FakeEtcd>>>,
    identities: std::sync::atomic::AtomicUsize,
}

impl FakeEtcds {
    /// The etcd of cluster `name` (the members of `peer_urls`, all running voters).
    pub fn add(&self, name: &str, peer_urls: &[String]) -> Arc<FakeEtcd> {
        let etcd = Arc::new(FakeEtcd::running(peer_urls));
        self.clusters
            .lock()
            .unwrap()
            .insert(name.to_owned(), etcd.clone());
        etcd
    }

    /// How many client identities the loop presented (made transports with).
    pub fn identities(&self) -> usize {
        self.identities.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Transport for FakeEtcds {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        let etcd = self
            .clusters
            .lock()
            .unwrap()
            .get(host_part(endpoint, 1))
            .cloned();
        Box::pin(async move {
            match etcd {
                Some(etcd) => etcd.post(endpoint, path, body).await,
                None => Err(EtcdError::Unreachable {
                    endpoint: endpoint.to_owned(),
                    reason: "no such host".to_owned(),
                }),
            }
        })
    }

    fn with_identity(
        &self,
        _identity: &crate::controller::etcd::ClientTls,
    ) -> Result<std::sync::Arc<dyn Transport>, crate::controller::etcd::TlsError> {
        self.identities
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let routes = Self {
            clusters: Mutex::new(self.clusters.lock().unwrap().clone()),
            identities: Default::default(),
        };
        Ok(Arc::new(routes))
    }
}
