//! One step of a rolling upgrade per pass: the member pods and the StatefulSet's update revision
//! read, `decide::upgrade::plan` asked, and the one pod it names deleted (the StatefulSet,
//! `OnDelete`, makes it again from the new template).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;

use crate::api::v1::EtcdCluster;
use crate::controller::decide::observation::{Activity, Observation};
use crate::controller::decide::upgrade::{Health, MemberPod, Step, member_pod, plan};
use crate::controller::machinery::children::Children;
use crate::controller::machinery::error::Error;

/// One upgrade step for the StatefulSet `set` as it is after this pass's apply.
pub(crate) async fn roll(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    health: Health,
    seen: &mut Observation,
) -> Result<(), Error> {
    let Some(update) = set.status.as_ref().and_then(|s| s.update_revision.clone()) else {
        return Ok(());
    };
    let pods: Vec<MemberPod> = pods.iter().filter_map(|p| member_pod(ec, p)).collect();
    let name = ec.name_any();
    match plan(&name, &pods, &update, health) {
        Step::Done => Ok(()),
        Step::Wait(why) => {
            seen.activity = Some(Activity::Upgrading);
            seen.progress = Some(format!("upgrading to {}: {why}", ec.spec.version));
            Ok(())
        }
        Step::Restart {
            ordinal,
            leader,
            done,
            of,
        } => {
            let pod = format!("{name}-{ordinal}");
            let role = if leader {
                "the leader, last"
            } else {
                "a follower"
            };
            match kids
                .api::<Pod>()
                .delete(&pod, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube("delete", "Pod", &pod, e)),
            }
            tracing::info!(cluster = %name, %pod, leader, "restarting a member on the new version");
            seen.activity = Some(Activity::Upgrading);
            seen.progress = Some(format!(
                "upgrading to {}: restarting {pod} ({role}); {done} of {of} members on it",
                ec.spec.version
            ));
            Ok(())
        }
    }
}
