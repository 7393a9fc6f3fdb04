//! The claims' protection while backups are on: the member claims `data-NAME-<i>` and the
//! backup claim `NAME-backup` carry [`CLAIM_FINALIZER`], so no deletion the loop does not
//! control (the garbage collector after a foreground deletion of the cluster, a namespace
//! deletion) removes a volume before the final snapshot is taken. The finalizer comes off when
//! the snapshot is taken, when backups are turned off, before the loop itself replaces a lost
//! member's volume, and when the user lets the claims go ([`crate::controller::machinery::finalizer::RELEASE_ANNOTATION`]).

use std::sync::Arc;

use json_patch::Patch as JsonPatch;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};

use crate::api::v1::EtcdCluster;
use crate::controller::machinery::children::Children;
use crate::controller::machinery::error::Error;
use crate::controller::machinery::finalizer::CLAIM_FINALIZER;
use crate::controller::machinery::finalizer::{add_finalizer_ops, remove_finalizer_ops};
use crate::controller::render;

/// Whether the cluster's claims are protected: backups are on to a destination the loop can
/// serve (a final snapshot can be taken).
pub(crate) fn wanted(ec: &EtcdCluster) -> bool {
    crate::api::backups_on(&ec.spec)
}

/// Whether `claim` carries the protection.
pub(crate) fn protected(claim: &PersistentVolumeClaim) -> bool {
    claim.finalizers().iter().any(|f| f == CLAIM_FINALIZER)
}

/// The cluster's claims in the claims cache: the members' (ordinals below `spec.size`; the size
/// never shrinks) and the backup claim.
pub(crate) async fn cached(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Vec<Arc<PersistentVolumeClaim>>, Error> {
    let mut names: Vec<String> = (0..ec.spec.size)
        .map(|i| render::member_claim(ec, i))
        .collect();
    names.push(render::backup_claim_name(ec));
    let mut found = Vec::new();
    for name in names {
        if let Some(c) = kids.read::<PersistentVolumeClaim>(&name).await? {
            found.push(c);
        }
    }
    Ok(found)
}

/// A live pass: every claim of the cluster carries the protection while backups are on, and
/// none does once they are off. A claim being deleted gets none (the apiserver refuses a new
/// finalizer on it), and one a former cluster of this name left is not touched (its member
/// claims are waited out before this cluster makes its own).
pub(crate) async fn tend(ec: &EtcdCluster, kids: &Children<'_>) -> Result<(), Error> {
    let want = wanted(ec);
    for claim in cached(ec, kids).await? {
        if protected(&claim) == want || (want && claim.metadata.deletion_timestamp.is_some()) {
            continue;
        }
        set(kids, &claim, want).await?;
    }
    Ok(())
}

/// Takes the protection off every claim of the cluster (the final snapshot is taken, backups
/// are off, or the user lets them go); the names of the claims it was on.
pub(crate) async fn release(ec: &EtcdCluster, kids: &Children<'_>) -> Result<Vec<String>, Error> {
    let mut released = Vec::new();
    for claim in cached(ec, kids).await? {
        if protected(&claim) {
            set(kids, &claim, false).await?;
            released.push(claim.name_any());
        }
    }
    Ok(released)
}

/// Takes the protection off the claim `name` (before the loop deletes it itself).
pub(crate) async fn release_one(kids: &Children<'_>, name: &str) -> Result<(), Error> {
    match kids.read::<PersistentVolumeClaim>(name).await? {
        Some(claim) if protected(&claim) => set(kids, &claim, false).await,
        _ => Ok(()),
    }
}

/// Adds (`on`) or removes the protection on one claim, in a JSON Patch guarded by a `test` of
/// the finalizers as cached: a concurrent change fails the patch (the pass retries) instead of
/// being lost. A claim already gone is nothing to do.
async fn set(kids: &Children<'_>, claim: &PersistentVolumeClaim, on: bool) -> Result<(), Error> {
    let ops = if on {
        add_finalizer_ops(&claim.metadata, CLAIM_FINALIZER)
    } else {
        match remove_finalizer_ops(&claim.metadata, CLAIM_FINALIZER) {
            Some(ops) => ops,
            None => return Ok(()),
        }
    };
    let name = claim.name_any();
    match kids
        .api::<PersistentVolumeClaim>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::<()>::Json(JsonPatch(ops)),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(claim = %name, protected = on, "claim protection {}", if on { "added" } else { "removed" });
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(
            if on { "protect" } else { "release" },
            "PersistentVolumeClaim",
            &name,
            e,
        )),
    }
}
