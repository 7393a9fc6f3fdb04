//! Storage growth of the members' volumes.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::api::v1::EtcdCluster;
use crate::controller::machinery::children::Children;
use crate::controller::machinery::error::Error;
use crate::controller::render;

/// Storage growth: volume claim templates are immutable, so grow each member's claim, then
/// delete the StatefulSet leaving its pods (orphan); the next pass creates it with the new
/// template and it adopts the running pods.
pub(crate) async fn resize_storage(
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

/// The least `status.capacity` (bytes) of the first `replicas` member claims, when it is
/// below what the spec asks (their volumes have not all grown yet), with the claims below it.
/// A claim not made yet, or without a capacity (not bound), is not counted: a new member's is
/// made from the template at the new size.
pub(crate) async fn not_grown(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    replicas: i32,
) -> Result<Option<(i128, Vec<String>)>, Error> {
    let Some(want) = crate::api::quantity::bytes(&ec.spec.storage_size) else {
        return Ok(None);
    };
    let mut smallest = None::<i128>;
    let mut small = Vec::new();
    for ordinal in 0..replicas {
        let name = render::member_claim(ec, ordinal);
        let Some(claim) = kids.read::<PersistentVolumeClaim>(&name).await? else {
            continue;
        };
        let capacity = claim
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| crate::api::quantity::bytes(&q.0));
        if let Some(c) = capacity.filter(|c| *c < want) {
            smallest = Some(smallest.map_or(c, |s| s.min(c)));
            small.push(name);
        }
    }
    Ok(smallest.map(|s| (s, small)))
}
