//! Leader election: a coordination.k8s.io Lease gates the controller, and only it. Webhooks and
//! certificate reload run on every replica whatever the Lease says.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

pub const LEASE_NAME: &str = "etcd-webhook-leader";

/// Who competes for which Lease, and for how long a holder keeps it without renewing.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// A holder that stops renewing loses the Lease after this many seconds.
    pub duration_secs: u64,
    /// The holder renews this many seconds before the Lease would expire.
    pub grace_secs: u64,
}

impl LeaseSettings {
    pub fn new(namespace: String, identity: String) -> Self {
        Self {
            name: LEASE_NAME.to_owned(),
            namespace,
            identity,
            duration_secs: 15,
            grace_secs: 5,
        }
    }
}

/// What to look at for a Lease error: RBAC only when the API said Forbidden, the address when
/// the API server could not be reached.
fn hint(error: &LeaseManagerError) -> &'static str {
    match error {
        LeaseManagerError::KubeError(kube::Error::Api(status)) if status.code == 403 => {
            " (RBAC: this identity needs get, create and patch on coordination.k8s.io/leases in that namespace)"
        }
        LeaseManagerError::KubeError(
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_),
        ) => " (the API server cannot be reached: check its address and the network)",
        _ => "",
    }
}

async fn manager(
    client: Client,
    s: &LeaseSettings,
) -> Result<kube_lease_manager::LeaseManager, LeaseManagerError> {
    LeaseManagerBuilder::new(client, &s.name)
        .with_namespace(&s.namespace)
        .with_identity(&s.identity)
        .with_duration(s.duration_secs)
        .with_grace(s.grace_secs)
        .with_field_manager(format!("{}-lease/{}", crate::api::MANAGER, s.identity))
        .build()
        .await
}

/// Competes for the Lease until `stop`; while it is held, runs `work` with a token that is
/// cancelled when the Lease is lost or at `stop`. On `stop` the Lease is released, so another
/// replica takes over at once instead of after the Lease duration.
pub async fn run_when_leader<F, Fut>(
    client: Client,
    settings: LeaseSettings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    work: F,
) where
    F: Fn(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut retry = Duration::from_secs(1);
    let lease = loop {
        match manager(client.clone(), &settings).await {
            Ok(m) => break m,
            Err(error) => {
                tracing::error!(%error, lease = %settings.name, namespace = %settings.namespace,
                    "cannot use the leader Lease; retrying{}", hint(&error));
                tokio::select! {
                    () = tokio::time::sleep(retry) => retry = (retry * 2).min(Duration::from_secs(30)),
                    () = stop.cancelled() => return,
                }
            }
        }
    };
    let (mut leading, watcher) = lease.watch().await;
    tracing::info!(identity = %settings.identity, lease = %settings.name, "waiting for leadership");
    'outer: loop {
        // Wait until this replica holds the Lease.
        while !*leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { break 'outer },
                () = stop.cancelled() => break 'outer,
            }
        }
        tracing::info!(identity = %settings.identity, "became leader; controller starts");
        metrics.leader.set(1);
        let token = stop.child_token();
        let task = tokio::spawn(work(token.clone()));
        let mut lost = false;
        while *leading.borrow_and_update() {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { lost = true; break },
                () = stop.cancelled() => break,
            }
        }
        token.cancel();
        let _ = task.await;
        metrics.leader.set(0);
        metrics.forget_clusters();
        if stop.is_cancelled() {
            break;
        }
        tracing::warn!(identity = %settings.identity, "lost the leader Lease; controller stopped");
        if lost {
            break;
        }
    }
    // Dropping the receiver makes the watcher release the Lease and return.
    drop(leading);
    match tokio::time::timeout(Duration::from_secs(5), watcher).await {
        Ok(Ok(Ok(_))) => tracing::info!(identity = %settings.identity, "leader Lease released"),
        Ok(Ok(Err(error))) => tracing::warn!(%error, "could not release the leader Lease"),
        Ok(Err(error)) => tracing::warn!(%error, "leader Lease task failed"),
        Err(_) => tracing::warn!("releasing the leader Lease timed out"),
    }
}
