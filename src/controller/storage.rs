//! Storage growth of the members' volumes.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::events::EventType;
use serde_json::json;

use super::children::Children;
use super::{Error, render};
use crate::api::v1::EtcdCluster;

/// Storage growth: volume claim templates are immutable, so grow each member's claim, then
/// delete the StatefulSet leaving its pods (orphan); the next pass creates it with the new
/// template and it adopts the running pods.
pub(super) async fn resize_storage(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
    have: i64,
    want: i64,
) -> Result<(), Error> {
    let size = crate::api::quantity::canonical_gib(want);
    for ordinal in 0..replicas {
        let claim = render::member_claim(ec, ordinal);
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        match kids
            .api::<PersistentVolumeClaim>()
            .patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("grow", "PersistentVolumeClaim", &claim, e)),
        }
    }
    let name = ec.name_any();
    let deleted = kids
        .api::<StatefulSet>()
        .delete(
            &name,
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await;
    match deleted {
        Ok(_) => {}
        // Already deleted by an earlier pass (the cache had not seen it go): nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(Error::kube("replace", "StatefulSet", &name, e)),
    }
    kids.ctx
        .event(
            ec,
            EventType::Normal,
            "ResizingStorage",
            format!("member volumes {have}Gi -> {want}Gi; StatefulSet {name} recreated, pods kept"),
        )
        .await;
    Ok(())
}
