//! The finalizer protocol: added (with the initial size recorded) before anything is created,
//! removed when deletion's work is done, each in one JSON Patch guarded by `test` operations so
//! a concurrent change to the finalizers fails the patch instead of being lost.

use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch as JsonPatch, PatchOperation, RemoveOperation, TestOperation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::v1::EtcdCluster;
use crate::controller::machinery::error::Error;
use crate::controller::render;

pub const FINALIZER: &str = "etcd.example.com/finalizer";
/// On the member claims and the backup claim while backups are on: a claim is never deleted
/// (by the garbage collector after a foreground deletion, by a namespace deletion) before the
/// cluster's final snapshot is taken or the user lets it go ([`RELEASE_ANNOTATION`]).
pub const CLAIM_FINALIZER: &str = "etcd.example.com/final-snapshot";
/// `"true"` on a cluster being deleted: let its claims and the cluster go without a final
/// snapshot (when none can be taken, or the user does not want one).
pub const RELEASE_ANNOTATION: &str = "etcd.example.com/release-volumes";

pub(crate) fn has_finalizer(ec: &EtcdCluster) -> bool {
    ec.finalizers().iter().any(|f| f == FINALIZER)
}

/// The size the cluster was created with, once recorded.
pub(crate) fn initial_size_recorded(ec: &EtcdCluster) -> Option<i32> {
    ec.annotations()
        .get(render::INITIAL_SIZE_ANNOTATION)?
        .parse()
        .ok()
        .filter(|n| *n >= 1)
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn test(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path, value })
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// The operations that add `finalizer` to an object's metadata as read: a `test` of the list
/// first, so a concurrent change to it fails the patch instead of being lost.
pub(crate) fn add_finalizer_ops(meta: &ObjectMeta, finalizer: &str) -> Vec<PatchOperation> {
    match &meta.finalizers {
        None => vec![add(
            pointer(&["metadata", "finalizers"]),
            json!([finalizer]),
        )],
        Some(list) => vec![
            test(pointer(&["metadata", "finalizers"]), json!(list)),
            add(pointer(&["metadata", "finalizers", "-"]), json!(finalizer)),
        ],
    }
}

/// The operations that remove `finalizer` (and only it) from an object's metadata as read,
/// guarded by a `test` of its position; `None` when it is not there.
pub(crate) fn remove_finalizer_ops(
    meta: &ObjectMeta,
    finalizer: &str,
) -> Option<Vec<PatchOperation>> {
    let i = meta
        .finalizers
        .iter()
        .flatten()
        .position(|f| f == finalizer)?;
    let at = pointer(&["metadata", "finalizers", &i.to_string()]);
    Some(vec![
        test(at.clone(), json!(finalizer)),
        PatchOperation::Remove(RemoveOperation { path: at }),
    ])
}

/// The operations that add the finalizer and record the initial size.
fn add_ops(ec: &EtcdCluster) -> JsonPatch {
    let mut ops = add_finalizer_ops(&ec.metadata, FINALIZER);
    if initial_size_recorded(ec).is_none() {
        let size = ec.spec.size.to_string();
        ops.push(match &ec.metadata.annotations {
            None => add(
                pointer(&["metadata", "annotations"]),
                json!({render::INITIAL_SIZE_ANNOTATION: size}),
            ),
            Some(_) => add(
                pointer(&["metadata", "annotations", render::INITIAL_SIZE_ANNOTATION]),
                json!(size),
            ),
        });
    }
    JsonPatch(ops)
}

/// Adds the finalizer and records the initial size.
pub(crate) async fn add_finalizer(api: &Api<EtcdCluster>, ec: &EtcdCluster) -> Result<(), Error> {
    api.patch(
        &ec.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(add_ops(ec)),
    )
    .await
    .map_err(|e| Error::kube("add finalizer to", "EtcdCluster", &ec.name_any(), e))?;
    Ok(())
}

/// Removes our finalizer (and only it), guarded by a `test` of its position.
pub(crate) async fn remove_finalizer(
    api: &Api<EtcdCluster>,
    ec: &EtcdCluster,
) -> Result<(), Error> {
    let Some(ops) = remove_finalizer_ops(&ec.metadata, FINALIZER) else {
        return Ok(());
    };
    let patch = JsonPatch(ops);
    match api
        .patch(
            &ec.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: nothing to remove.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(
            "remove finalizer from",
            "EtcdCluster",
            &ec.name_any(),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_size_annotation_is_escaped_in_the_pointer() {
        let mut ec = crate::controller::render::tests::cluster("etcd", 3, None);
        ec.metadata.annotations = Some(Default::default());
        ec.metadata.finalizers = Some(vec!["other".to_owned()]);
        let ops = serde_json::to_value(add_ops(&ec)).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
                {"op": "add", "path": format!("/metadata/annotations/{}", render::INITIAL_SIZE_ANNOTATION.replace('/', "~1")), "value": "3"},
            ])
        );
    }
}
