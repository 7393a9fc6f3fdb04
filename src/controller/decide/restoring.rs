//! A lost quorum whose survivors are all older than the newest snapshot
//! ([`super::quorum::diagnose`] asks when every member that may hold data answers): the
//! snapshot is restored in place, after every member with data is copied, or the loop says
//! why it will not restore it by itself. Only a snapshot that is this cluster's, proven by its
//! verification (restored in a sandbox: fetched, its SHA-256 checked, its keys and hash
//! compared), on a release whose restore moves the revision past what clients saw, is ever
//! restored in place: once the volumes are gone, that snapshot is all the cluster has.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::members::MemberStatus;
use super::recovery::{Diagnosis, Rescue, approved, awaiting, manual, restore_plan};
use crate::api::v1::{EtcdCluster, SnapshotRecord};
use crate::controller::render::{self, InPlace};

/// The diagnosis: [`Diagnosis::Restoring`], its approval awaited, or [`Diagnosis::DataLost`]
/// with why not. `found`: what the diagnosis found (lost members, survivors, the snapshot);
/// `by_hand`: what the loop leaves to a person then.
pub(super) fn decide(
    ec: &EtcdCluster,
    answered: &BTreeMap<i32, MemberStatus>,
    newest: &SnapshotRecord,
    rescue: &Rescue,
    found: &str,
    by_hand: &str,
) -> Diagnosis {
    let pod = |i: i32| format!("{}-{i}", ec.name_any());
    let names = |is: &[i32]| is.iter().map(|&i| pod(i)).collect::<Vec<_>>().join(", ");
    let not_by_itself = |why: String| Diagnosis::DataLost(format!("{found}; {why}; {by_hand}"));
    let stem = format!("{}-", render::snapshot_stem(ec));
    let file = newest.uri.rsplit('/').next().unwrap_or_default();
    if !file.starts_with(&stem) {
        return not_by_itself(format!(
            "but its name is not one of this cluster's snapshots ({stem}...), so the loop does not restore it by itself"
        ));
    }
    if !crate::api::EtcdVersion::at_least(&ec.spec.version, 3, 5, 10) {
        return not_by_itself(format!(
            "but etcd {} cannot move a restored cluster's revision past what its clients have seen (etcdutl --bump-revision, from v3.5.10), so the loop does not restore it in place by itself",
            ec.spec.version
        ));
    }
    let verified = ec
        .status
        .as_ref()
        .and_then(|s| s.backup.as_ref())
        .and_then(|b| b.last_verified.as_ref())
        .filter(|v| v.uri == newest.uri);
    match verified {
        Some(v) if v.outcome == render::VERIFY_OK => {}
        Some(v) => {
            return not_by_itself(format!(
                "but its verification said {} ({}), so the loop does not restore it by itself",
                v.outcome, v.message
            ));
        }
        None => {
            return not_by_itself(
                "but it is not verified yet (its verification Job restores it in a sandbox first; a backup that recorded no hash is never verified), and the loop restores in place only a snapshot proven that way: it looks again on every pass".to_owned(),
            );
        }
    }
    let holders: Vec<i32> = answered.keys().copied().collect();
    let Some(destination) = rescue.destination.as_deref() else {
        return not_by_itself(format!(
            "restoring it in place would delete the volumes of {}, and backups are off (spec.backup), so their data cannot be copied first: the loop deletes nothing it has not copied",
            names(&holders)
        ));
    };
    let plan = restore_plan(newest);
    let copied: BTreeMap<i32, &str> = rescue
        .copied
        .iter()
        .filter(|((_, p), _)| *p == plan)
        .map(|((i, _), uri)| (*i, uri.as_str()))
        .collect();
    let unserved: Vec<i32> = holders
        .iter()
        .copied()
        .filter(|o| !copied.contains_key(o) && answered[o].metrics_only)
        .collect();
    if !unserved.is_empty() {
        return not_by_itself(format!(
            "restoring it in place would first copy the data of {}, and {} restarted with no leader there: etcd serves no client, snapshots included, until a leader is, so nothing can be copied from it; the loop deletes nothing it has not copied",
            names(&holders),
            names(&unserved)
        ));
    }
    let would = format!(
        "the data of {} is copied to {destination} first, then the StatefulSet, the member pods and every member's volume are deleted and each member is restored from {} (revision {}, verified; the snapshot's data is kept, writes after it are gone from the cluster and stay in the copies)",
        names(&holders),
        newest.uri,
        newest.revision
    );
    if !approved(ec, &plan) {
        return awaiting(
            ec,
            format!("{found}; spec.recovery.quorumLoss is Manual: with a restore {would}"),
            &plan,
        );
    }
    let copy: Vec<i32> = holders
        .iter()
        .copied()
        .filter(|o| !copied.contains_key(o))
        .collect();
    let mut progress: Vec<String> = copied
        .iter()
        .map(|(o, uri)| format!("{} copied to {uri}", pod(*o)))
        .collect();
    progress.extend(copy.iter().map(|&o| match rescue.failed.get(&o) {
        Some(why) => format!("the copy of {} failed ({why}) and is tried again", pod(o)),
        None => format!("{} being copied", pod(o)),
    }));
    if copy.is_empty() {
        progress.push("every copy filed: restoring".to_owned());
    }
    let approved_note = if manual(ec) {
        format!("approved ({plan}): ")
    } else {
        String::new()
    };
    Diagnosis::Restoring {
        message: format!(
            "{found}; {approved_note}the loop restores the newest snapshot in place: {would}; {}",
            progress.join(", ")
        ),
        restore: InPlace {
            from: newest.uri.clone(),
            sha256: newest.sha256.clone(),
            plan: plan.clone(),
            uid: ec.metadata.uid.clone().unwrap_or_default(),
            cluster: ec
                .annotations()
                .get(render::CLUSTER_ID_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            copies: copied.values().map(|u| (*u).to_owned()).collect(),
        },
        plan,
        copy,
    }
}
