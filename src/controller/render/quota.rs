//! The backend quota the members run with, as the StatefulSet's template says it: read back,
//! kept while the databases are near a lower new one, held while the volumes grow.

use k8s_openapi::api::apps::v1::StatefulSet;

use super::*;

/// StatefulSet `NAME` running `replicas` members (fewer than `spec.size` while the cluster
/// grows one learner at a time). The membership reaches the pods through
/// [`members_config`], so the template is the same at every size. Pods start in parallel: a
/// member only becomes ready with a quorum, so ordered start would wait forever for the
/// second pod. The container's termination message is the tail of its log
/// (`FallbackToLogsOnError`): that is how the loop sees a member that lost its volume.
/// The members' quota flag, up to its value.
pub(super) const QUOTA_FLAG: &str = "--quota-backend-bytes=";

/// The quota `set`'s members run with, from its template.
pub fn template_quota(set: &StatefulSet) -> Option<i64> {
    template_member(set)?
        .args
        .as_ref()?
        .iter()
        .find_map(|a| a.strip_prefix(QUOTA_FLAG)?.parse().ok())
}

/// The etcd container of `set`'s pod template.
pub fn template_member(set: &StatefulSet) -> Option<&k8s_openapi::api::core::v1::Container> {
    set.spec.template.spec.as_ref()?.containers.first()
}

/// A quota is never lowered under a database already near it: a cluster made when the quota
/// was a larger share of the volume keeps the quota it runs with (`running`) while its largest
/// member's database (from `status.members`) is above 3/4 of the new one, which it would fill
/// at once (NOSPACE, every write refused). Returns the quota kept, if any; `desired` has it.
pub fn keep_running_quota(
    ec: &EtcdCluster,
    running: Option<i64>,
    desired: &mut StatefulSet,
) -> Option<i64> {
    let running = running?;
    let want = template_quota(desired)?;
    let largest = ec
        .status
        .as_ref()?
        .members
        .as_ref()?
        .iter()
        .filter_map(|m| m.db_size)
        .max()?;
    if running <= want || largest <= want / 4 * 3 {
        return None;
    }
    set_quota(desired, running)
}

/// A quota is never raised before the volumes have grown: while a member's claim reports less
/// capacity than the spec asks (an expansion still under way, one waiting for the pod's
/// restart, or refused by the storage), `desired`'s quota is at most what a volume of the
/// smallest capacity holds ([`crate::api::quota_of_volume`]; an explicit `quotaBackendBytes`
/// too). `smallest`: the least `status.capacity` of the member claims, in bytes. Returns the
/// quota set, if lowered.
pub fn hold_quota_until_grown(smallest: Option<i128>, desired: &mut StatefulSet) -> Option<i64> {
    let gib = i64::try_from(smallest? >> 30).ok()?;
    let ceiling = crate::api::quota_of_volume(&crate::api::quantity::canonical_gib(gib));
    if ceiling >= template_quota(desired)? {
        return None;
    }
    set_quota(desired, ceiling)
}

/// Sets the quota flag of `desired`'s etcd container to `quota`.
fn set_quota(desired: &mut StatefulSet, quota: i64) -> Option<i64> {
    let args = desired
        .spec
        .template
        .spec
        .as_mut()?
        .containers
        .first_mut()?
        .args
        .as_mut()?;
    let arg = args.iter_mut().find(|a| a.starts_with(QUOTA_FLAG))?;
    *arg = format!("{QUOTA_FLAG}{quota}");
    Some(quota)
}
