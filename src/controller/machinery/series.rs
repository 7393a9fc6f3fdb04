//! A cluster's series in the loop's metrics: the labels they carry, the member states they
//! count, and their removal (with everything else the loop keeps about a cluster) when it goes.

use kube::ResourceExt;

use crate::api::v1::EtcdCluster;
use crate::controller::machinery::context::Context;
use crate::metrics::ClusterLabels;

/// The states `etcd_webhook_cluster_members` counts members in.
pub const MEMBER_STATES: &[&str] = &["leader", "follower", "learner", "unhealthy"];

/// A cluster's labels in the per-cluster series.
pub(crate) fn labels(ec: &EtcdCluster) -> ClusterLabels {
    ClusterLabels {
        namespace: ec.namespace().unwrap_or_default(),
        name: ec.name_any(),
    }
}

/// The cluster's per-cluster metrics go with it.
pub(crate) fn forget(ec: &EtcdCluster, ctx: &Context) {
    let key = crate::controller::machinery::context::key(ec);
    ctx.destinations
        .lock()
        .expect("not poisoned")
        .record(&key, None);
    ctx.certificates_checked
        .lock()
        .expect("not poisoned")
        .remove(&key);
    ctx.defragmenting.lock().expect("not poisoned").remove(&key);
    ctx.forget_client_secret(ec);
    let l = labels(ec);
    ctx.identities
        .lock()
        .unwrap()
        .remove(&format!("{}/{}", l.namespace, l.name));
    ctx.metrics.backup_last_success.remove(&l);
    ctx.metrics.backup_last_verified.remove(&l);
    ctx.metrics.backup_verification_failed.remove(&l);
    ctx.metrics.backup_interval.remove(&l);
    ctx.metrics.backup_scheduled_since.remove(&l);
    ctx.metrics.leader_changes.remove(&l);
    ctx.metrics.defragmentations.remove(&l);
    ctx.metrics.defragmentation_freed_bytes.remove(&l);
    ctx.metrics.defragmentation_seconds.remove(&l);
    ctx.metrics.nospace_alarm.remove(&l);
    ctx.metrics.member_client_cert_not_after.remove(&l);
    for state in MEMBER_STATES {
        ctx.metrics
            .cluster_members
            .remove(&crate::metrics::MemberStateLabels {
                namespace: l.namespace.clone(),
                name: l.name.clone(),
                state: (*state).to_owned(),
            });
    }
    for m in ec.status.iter().flat_map(|s| s.members.iter().flatten()) {
        let member = crate::metrics::MemberLabels {
            namespace: l.namespace.clone(),
            name: l.name.clone(),
            member: m.name.clone(),
        };
        ctx.metrics.member_db_size.remove(&member);
        ctx.metrics.member_db_size_in_use.remove(&member);
    }
}
