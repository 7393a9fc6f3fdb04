//! Membership: etcd grows one member at a time. The member is added to the membership by a
//! Job (`etcdctl member add`), then the StatefulSet gets its pod, and the next waits until
//! every member is ready. (Adding two before either runs can cost the quorum: 1 -> 3 would
//! leave 1 of 3 started.)

use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::children::{Applied, Children, job_outcome};
use super::status::{Activity, Observation};
use super::{Error, render};
use crate::api::v1::EtcdCluster;

/// One step of a scale-up from `replicas` members: the members the StatefulSet runs after
/// this pass (`replicas + 1` once the member-add Job has succeeded).
pub(super) async fn grow(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
    seen: &mut Observation,
) -> Result<i32, Error> {
    let ctx = kids.ctx;
    let name = ec.name_any();
    seen.activity = Some(Activity::AddingMembers);
    if seen.ready < replicas {
        return Ok(replicas);
    }
    let job_name = render::member_job_name(ec, replicas);
    let (applied, job) = kids
        .ensure_created(&render::member_add_job(ec, replicas, &ctx.settings.render))
        .await?;
    if applied == Applied::Created {
        ctx.event(
            ec,
            EventType::Normal,
            "AddingMember",
            format!("etcdctl member add {name}-{replicas} (Job {job_name})"),
        )
        .await;
    }
    match job_outcome(&job) {
        Some(true) => {
            let members = replicas + 1;
            seen.activity = Some(Activity::Scaling);
            ctx.event(
                ec,
                EventType::Normal,
                "Scaling",
                format!("members {replicas} -> {members} (of {})", ec.spec.size),
            )
            .await;
            Ok(members)
        }
        Some(false) => Err(Error::MemberAddFailed(job_name)),
        None => Ok(replicas),
    }
}
