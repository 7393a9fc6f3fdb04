//! The entry of every pass: a cluster being deleted goes to `deletion::cleanup`, a live one is
//! checked, gets the finalizer and its children (`live::apply_children`), then its status; an
//! error goes to the backoff.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::Observation;
use crate::controller::machinery::context::{Context, key};
use crate::controller::machinery::error::Error;
use crate::controller::machinery::finalizer::{add_finalizer, has_finalizer};
use crate::controller::machinery::status_writer::update_status;
use crate::controller::pass::deletion::cleanup;
use crate::controller::pass::live::{apply_children, check_spec};
use crate::metrics::ResultLabel;

/// How soon a pass looks again while etcd's membership changes.
pub(crate) const SETTLE: Duration = Duration::from_secs(5);
/// A cluster with no member ready is looked at this many resyncs apart: there is no etcd to
/// ask, and everything that could move it (a member turning ready changes the StatefulSet's
/// status, a Job ending, the spec changing) arrives as a watch event. Thousands of clusters
/// being created (or never scheduled) would otherwise keep the loop busy on passes that can
/// do nothing.
const IDLE_RESYNCS: u32 = 10;

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
    // One line per pass, off by default (`--log-level info,etcd_webhook::controller::pass=debug`
    // turns it on): which cluster a pass was for, which the counter above cannot say.
    tracing::debug!(
        target: "etcd_webhook::controller::pass",
        cluster = %key(&ec),
        result = label,
        took_ms = started.elapsed().as_millis() as u64,
        "reconciled"
    );
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
            // owned objects; the periodic resync only catches what a watch missed. etcd's
            // membership sends no events: while it moves, look again soon.
            if seen.settle {
                Ok(Action::requeue(SETTLE.min(ctx.settings.resync)))
            } else if seen.ready == 0 {
                Ok(Action::requeue(ctx.settings.resync * IDLE_RESYNCS))
            } else {
                Ok(Action::requeue(ctx.settings.resync))
            }
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
