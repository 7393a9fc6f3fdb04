//! The member pods and their claims: which pods run, the voter label, a removed member's volume
//! made anew, the ConfigMap a new cluster starts from, and the claims of a former cluster of
//! the same name.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::api::v1::EtcdCluster;
use crate::controller::decide::exits::Exit;
use crate::controller::decide::membership;
use crate::controller::machinery::children::{Applied, Children};
use crate::controller::machinery::error::Error;
use crate::controller::render;

/// The ordinal of a member pod `NAME-i` of `ec`.
pub(crate) fn pod_ordinal(ec: &EtcdCluster, pod: &Pod) -> Option<i32> {
    crate::controller::decide::quorum::member_ordinal(ec, &pod.name_any())
}

/// The member pods of `ec` from the pods cache.
pub(crate) async fn member_pods(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Vec<std::sync::Arc<Pod>>, Error> {
    let selector = render::member_selector(ec);
    Ok(kids
        .pods()
        .await?
        .into_iter()
        .filter(|p| p.namespace() == ec.namespace())
        .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
        .collect())
}

/// Whether some member pod's etcd container is running now (ready or not), as the kubelet
/// reports it.
pub(crate) fn any_running(pods: &[std::sync::Arc<Pod>]) -> bool {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .any(|c| c.name == "etcd" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// The `exits` of member pods whose etcd container is not running now (waiting to restart, or
/// terminated): their last exit is their latest word; a running container's is old news,
/// unless `config` is fenced now and the container runs two restarts past the count recorded
/// when the fence went on, after a last run that ended on an empty volume
/// ([`crate::controller::decide::exits::fenced_run`]): a fenced pod read between two of its
/// restarts.
pub(crate) fn stopped_exits(
    ec: &EtcdCluster,
    pods: &[std::sync::Arc<Pod>],
    exits: &std::collections::BTreeMap<i32, Exit>,
    config: Option<&ConfigMap>,
) -> std::collections::BTreeMap<i32, Exit> {
    let recorded = fenced_restarts(config);
    let running: BTreeSet<i32> = pods
        .iter()
        .filter(|p| any_running(std::slice::from_ref(p)))
        .filter_map(|p| {
            let i = pod_ordinal(ec, p)?;
            let fenced = match (&recorded, exits.get(&i)) {
                (Some(recorded), Some(last)) => {
                    let uid = p.metadata.uid.as_deref();
                    let then = recorded
                        .get(&i)
                        .filter(|(u, _)| Some(u.as_str()) == uid)
                        .map(|(_, r)| *r);
                    crate::controller::decide::exits::fenced_run(etcd_restarts(p), then, last)
                }
                _ => false,
            };
            (!fenced).then_some(i)
        })
        .collect();
    exits
        .iter()
        .filter(|(i, _)| !running.contains(i))
        .map(|(i, e)| (*i, e.clone()))
        .collect()
}

/// A member pod's etcd restart count, as the kubelet reports it.
fn etcd_restarts(p: &Pod) -> i32 {
    p.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .find(|c| c.name == "etcd")
        .map_or(0, |c| c.restart_count)
}

/// The restart counts [`render::FENCED_RESTARTS_ANNOTATION`] recorded (ordinal to pod UID and
/// count), while `config` is fenced; `None` when it is not (a stale record from an earlier
/// fence is never read).
fn fenced_restarts(
    config: Option<&ConfigMap>,
) -> Option<std::collections::BTreeMap<i32, (String, i32)>> {
    let config = config?;
    let fenced = config
        .data
        .as_ref()
        .and_then(|d| d.get("ETCD_INITIAL_CLUSTER"))
        .is_some_and(|l| l == render::FENCED_INITIAL_CLUSTER);
    if !fenced {
        return None;
    }
    let record = config
        .metadata
        .annotations
        .as_ref()?
        .get(render::FENCED_RESTARTS_ANNOTATION)?;
    Some(
        record
            .split(',')
            .filter_map(|e| {
                let (i, rest) = e.split_once('=')?;
                let (uid, n) = rest.rsplit_once('/')?;
                Some((i.parse().ok()?, (uid.to_owned(), n.parse().ok()?)))
            })
            .collect(),
    )
}

/// A member removed for its lost volume starts again on a new, empty one: its claim and pod
/// are deleted and the StatefulSet makes both anew (the old volume holds a data directory that
/// names the removed member, which etcd would refuse).
pub(crate) async fn replace_volume(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    ordinal: i32,
) -> Result<(), Error> {
    let claim = render::member_claim(ec, ordinal);
    let pod = format!("{}-{ordinal}", ec.name_any());
    // The claim goes now, snapshot or not: its data is lost already.
    crate::controller::pass::claims::release_one(kids, &claim).await?;
    let params = kube::api::DeleteParams::background();
    for result in [
        kids.api::<PersistentVolumeClaim>()
            .delete(&claim, &params)
            .await
            .map(|_| ()),
        kids.api::<Pod>().delete(&pod, &params).await.map(|_| ()),
    ] {
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube("delete", "member volume", &claim, e)),
        }
    }
    tracing::info!(cluster = %ec.name_any(), %claim, %pod, "replaced a lost member volume");
    Ok(())
}

/// Sets [`render::VOTER_LABEL`] on the pods of voters and takes it off the others, so the
/// client Service never sends a client to a learner.
pub(crate) async fn label_voters(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    pods: &[std::sync::Arc<Pod>],
    members: &[crate::controller::decide::members::Member],
) -> Result<(), Error> {
    let voters: BTreeSet<i32> = members
        .iter()
        .filter(|m| !m.is_learner && m.started())
        .filter_map(|m| membership::ordinal(ec, m))
        .collect();
    for pod in pods {
        let Some(i) = pod_ordinal(ec, pod) else {
            continue;
        };
        let has = pod.labels().get(render::VOTER_LABEL).map(String::as_str) == Some("true");
        let want = voters.contains(&i);
        if has == want {
            continue;
        }
        let value = if want { json!("true") } else { json!(null) };
        let patch = json!({"metadata": {"labels": {render::VOTER_LABEL: value}}});
        let name = pod.name_any();
        kids.api::<Pod>()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("label", "Pod", &name, e))?;
    }
    Ok(())
}

/// The members' ConfigMap of a cluster whose StatefulSet is about to be created, and the pods
/// that StatefulSet runs: a new cluster bootstraps with `spec.size` members; one whose
/// StatefulSet is made again (after a storage growth) runs the members its ConfigMap lists,
/// never more (a growth under way goes on one learner at a time).
///
/// A cluster with no recorded cluster ID whose member claims are already there (a former
/// cluster's volumes under the same name) joins too (`existing`): the members with data come
/// back as the former cluster, and a member on an empty volume can only join it, never form a
/// second cluster beside it (with `new`, the empty ones would form one of their own as soon as
/// they are a quorum of `spec.size`: a cluster re-created larger on old claims).
pub(crate) async fn bootstrap(ec: &EtcdCluster, kids: &Children<'_>) -> Result<i32, Error> {
    // A restored cluster's claims are its own (made for the restore): not a former cluster's.
    let former = match recorded_cluster_id(ec) {
        Some(_) => None,
        None if render::restore_source(ec).is_some() => None,
        None => Some(former_claims(ec, kids).await?),
    };
    let joins = former.as_ref().is_none_or(|f| !f.is_empty());
    let (applied, config) = kids
        .ensure_created(&render::bootstrap_config(ec, ec.spec.size, joins))
        .await?;
    if let Some(former) = former.filter(|f| !f.is_empty())
        && applied == Applied::Created
    {
        let why = format!(
            "volumes of a former cluster named {} are here ({}): its members start from them and the others join it; no new cluster is formed while they exist (to start empty, delete this EtcdCluster and the claims {}, then create it again)",
            ec.name_any(),
            former.join(", "),
            former.join(" ")
        );
        tracing::warn!(cluster = %ec.name_any(), "{why}");
        kids.ctx
            .event(ec, EventType::Warning, "FormerVolumes", why)
            .await;
    }
    Ok(listed_replicas(ec, &config).unwrap_or(ec.spec.size))
}

/// Whether the members' ConfigMap makes them join (`existing`) a cluster the loop never saw
/// answer: one created over a former cluster's volumes.
pub(crate) fn joins_former(config: Option<&ConfigMap>) -> bool {
    config
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get("ETCD_INITIAL_CLUSTER_STATE"))
        .is_some_and(|s| s == "existing")
}

/// The member claims (ordinals below `spec.size`) in the claims cache that are being deleted
/// (a former cluster's, going with it), joined for a message; `None` when there are none.
pub(crate) async fn claims_being_deleted(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Option<String>, Error> {
    let going: Vec<String> = cached_member_claims(ec, kids)
        .await?
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_some())
        .map(|c| c.name_any())
        .collect();
    Ok((!going.is_empty()).then(|| going.join(", ")))
}

/// The member claims (ordinals below `spec.size`) already in the claims cache.
async fn former_claims(ec: &EtcdCluster, kids: &Children<'_>) -> Result<Vec<String>, Error> {
    Ok(cached_member_claims(ec, kids)
        .await?
        .into_iter()
        .map(|c| c.name_any())
        .collect())
}

/// The member claims (ordinals below `spec.size`) in the claims cache, in ordinal order.
async fn cached_member_claims(
    ec: &EtcdCluster,
    kids: &Children<'_>,
) -> Result<Vec<std::sync::Arc<PersistentVolumeClaim>>, Error> {
    let mut found = Vec::new();
    for i in 0..ec.spec.size {
        if let Some(c) = kids
            .read::<PersistentVolumeClaim>(&render::member_claim(ec, i))
            .await?
        {
            found.push(c);
        }
    }
    Ok(found)
}

/// The pods a StatefulSet runs for the members a joined (`existing`) ConfigMap lists: up to the
/// highest ordinal below `spec.size`.
fn listed_replicas(ec: &EtcdCluster, config: &ConfigMap) -> Option<i32> {
    let data = config.data.as_ref()?;
    if data.get("ETCD_INITIAL_CLUSTER_STATE").map(String::as_str) != Some("existing") {
        return None;
    }
    let prefix = format!("{}-", ec.name_any());
    data.get("ETCD_INITIAL_CLUSTER")?
        .split(',')
        .filter_map(|entry| {
            entry
                .split_once('=')?
                .0
                .strip_prefix(&prefix)?
                .parse::<i32>()
                .ok()
        })
        .filter(|&i| i < ec.spec.size)
        .max()
        .map(|i| i + 1)
}

/// The members' ConfigMap of a formed cluster without a member list: fenced, or (`rejoin`:
/// the recovery plan it is lifted for, kept in [`render::REJOIN_PLAN_ANNOTATION`]) the kept
/// membership back ([`render::without_member_list`]); patched only when it changes. Whether
/// it was lifted now for a plan it was not lifted for before.
pub(crate) async fn fence(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    config: Option<&ConfigMap>,
    config_name: &str,
    rejoin: Option<&str>,
    pods: &[std::sync::Arc<Pod>],
) -> Result<bool, Error> {
    let data = config.and_then(|c| c.data.as_ref());
    let current = data
        .and_then(|d| d.get("ETCD_INITIAL_CLUSTER"))
        .map(String::as_str);
    let saved = config
        .and_then(|c| c.metadata.annotations.as_ref())
        .and_then(|a| a.get(render::FENCED_FROM_ANNOTATION))
        .map(String::as_str);
    let lifted = config
        .and_then(|c| c.metadata.annotations.as_ref())
        .and_then(|a| a.get(render::REJOIN_PLAN_ANNOTATION))
        .map(String::as_str);
    let (list, keep) = render::without_member_list(ec, current, saved, rejoin.is_some());
    if current == Some(list.as_str())
        && joins_former(config)
        && (rejoin.is_none() || rejoin == lifted)
    {
        return Ok(false);
    }
    let mut patch = json!({"data": {
        "ETCD_INITIAL_CLUSTER": list,
        "ETCD_INITIAL_CLUSTER_STATE": "existing",
    }});
    // Each member pod's restart count as the fence goes on (a run two past it runs fenced);
    // none once lifted.
    let mut annotations = serde_json::Map::new();
    if let Some(plan) = rejoin {
        annotations.insert(render::REJOIN_PLAN_ANNOTATION.into(), json!(plan));
        annotations.insert(render::FENCED_RESTARTS_ANNOTATION.into(), json!(null));
    } else {
        if let Some(keep) = keep {
            annotations.insert(render::FENCED_FROM_ANNOTATION.into(), json!(keep));
        }
        let record: Vec<String> = pods
            .iter()
            .filter_map(|p| {
                let i = pod_ordinal(ec, p)?;
                let uid = p.metadata.uid.as_deref()?;
                Some(format!("{i}={uid}/{}", etcd_restarts(p)))
            })
            .collect();
        annotations.insert(
            render::FENCED_RESTARTS_ANNOTATION.into(),
            json!(record.join(",")),
        );
    }
    patch["metadata"] = json!({ "annotations": annotations });
    kids.api::<ConfigMap>()
        .patch(config_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube("patch", "ConfigMap", config_name, e))?;
    if let Some(plan) = rejoin {
        tracing::warn!(cluster = %ec.name_any(), %plan, "no member list: one member with data is all there is; the members on empty volumes may rejoin under their old IDs");
    } else {
        tracing::warn!(cluster = %ec.name_any(), "no member list: members on empty volumes are kept from rejoining under their old IDs until a leader answers");
    }
    Ok(rejoin.is_some() && rejoin != lifted)
}

/// The etcd cluster ID the loop recorded on the EtcdCluster.
pub(crate) fn recorded_cluster_id(ec: &EtcdCluster) -> Option<u64> {
    ec.annotations()
        .get(render::CLUSTER_ID_ANNOTATION)
        .and_then(|id| u64::from_str_radix(id, 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::render::tests::cluster;

    /// The restart counts recorded at the fence are read only while the ConfigMap is fenced: a
    /// record left from an earlier fence, after the list came back, says nothing of the runs
    /// since.
    #[test]
    fn the_fences_restart_counts_are_read_only_while_fenced() {
        let config = |list: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": "etcd-members", "annotations": {
                    render::FENCED_RESTARTS_ANNOTATION: "0=a/3,2=c/0,junk"}},
                "data": {"ETCD_INITIAL_CLUSTER": list}}))
            .unwrap()
        };
        let fenced = fenced_restarts(Some(&config(render::FENCED_INITIAL_CLUSTER))).unwrap();
        assert_eq!(
            fenced,
            std::collections::BTreeMap::from([(0, ("a".to_owned(), 3)), (2, ("c".to_owned(), 0))])
        );
        assert_eq!(
            fenced_restarts(Some(&config("etcd-0=http://etcd-0.etcd.prod.svc:2380"))),
            None
        );
    }

    /// A StatefulSet made again after a storage growth runs the members the ConfigMap lists,
    /// never `spec.size` (a growth under way goes on one learner at a time); a new cluster's
    /// ConfigMap (`new`) says nothing of the kind.
    #[test]
    fn a_remade_stateful_set_runs_the_listed_members_only() {
        let ec = cluster("etcd", 5, None);
        let listed = render::members_config(
            &ec,
            "etcd-0=http://etcd-0.etcd.prod.svc:2380,etcd-1=http://etcd-1.etcd.prod.svc:2380,etcd-2=http://etcd-2.etcd.prod.svc:2380,stray=http://10.0.0.9:2380",
            "existing",
            render::no_memory(),
        );
        assert_eq!(listed_replicas(&ec, &listed), Some(3));
        let fresh = render::bootstrap_config(&ec, 5, false);
        assert_eq!(listed_replicas(&ec, &fresh), None);
    }
}
