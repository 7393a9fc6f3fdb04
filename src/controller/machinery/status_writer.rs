//! The status writer: the status [`crate::controller::decide::status::desired`] computes, written through the
//! status subresource only when it differs from what the cluster shows.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::api::MANAGER;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::Observation;
use crate::controller::decide::status::{self};
use crate::controller::machinery::context::Context;
use crate::controller::machinery::context::now;
use crate::controller::machinery::error::Error;

/// Writes the status through the status subresource, only when it differs from what the
/// cluster shows. Right after a write the cached cluster may not show it yet (its watch event
/// is on the way), so for [`STATUS_MEMO`] the status last written is what the cluster shows.
pub(crate) async fn update_status(
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
    count_leader_change(ctx, ec, view.status.as_ref(), &want);
    let mut memo = ctx.written.lock().expect("not poisoned");
    memo.retain(|_, (at, _)| at.elapsed() < STATUS_MEMO);
    memo.insert(uid, (std::time::Instant::now(), want));
    Ok(true)
}

/// A written status naming another leader than the one the cluster showed is one leader change
/// (written once: the memo stands in for a cluster whose cache is behind). The counter starts
/// at 0 when a cluster first shows a leader, so a rate over it is defined.
fn count_leader_change(
    ctx: &Context,
    ec: &EtcdCluster,
    shown: Option<&crate::api::v1::EtcdClusterStatus>,
    want: &crate::api::v1::EtcdClusterStatus,
) {
    let Some(leader) = want.leader.as_ref() else {
        return;
    };
    let counter = ctx
        .metrics
        .leader_changes
        .get_or_create(&crate::controller::machinery::series::labels(ec));
    if shown
        .and_then(|s| s.leader.as_ref())
        .is_some_and(|before| before != leader)
    {
        counter.inc();
    }
}

/// How long the status last written stands in for a cached cluster that does not show it yet.
const STATUS_MEMO: Duration = Duration::from_secs(5);
