//! The membership pass, the I/O half of [`crate::controller::decide::membership`]: the member
//! list and every started member's status read at once, the plan made from them, and at most
//! one membership call.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::calls::Etcd;
use super::error::EtcdError;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::corruption::{self, Finding};
use crate::controller::decide::exits::Exit;
use crate::controller::decide::members::{Member, MemberStatus};
use crate::controller::decide::membership::{
    Removal, Step, Timeouts, View, client_url, ordinal, plan,
};
use crate::controller::decide::memory::{Memory, joining_of, started_of};
use crate::controller::render;

/// What one pass found and did.
#[derive(Debug)]
pub struct Outcome {
    /// The member list after the pass's call (`None`: no member answered, or the answer came
    /// from another cluster).
    pub members: Option<Vec<Member>>,
    /// The ID of the cluster that answered.
    pub cluster_id: Option<u64>,
    pub health: BTreeMap<u64, MemberStatus>,
    /// What to keep for the next pass (in the members' ConfigMap).
    pub memory: Memory,
    pub step: Step,
    /// The call's error, if the step was a call and it failed.
    pub failed: Option<EtcdError>,
    /// Why the member list could not be read.
    pub unreachable: Option<EtcdError>,
    /// The member list came from a cluster whose ID is not the one recorded: nothing was done.
    pub foreign: Option<String>,
    /// Something is corrupt and the loop will not guess what (the leader differs, or no
    /// majority agrees): why. Nothing is removed or disarmed while it is.
    pub undecided: Option<String>,
    /// When no member answered the member list: the members that answered `status` alone, by
    /// ordinal (what `decide::quorum::diagnose` reads), and those that serve no client but said
    /// how far they got on their metrics port ([`MemberStatus::from_metrics`]).
    pub survey: BTreeMap<i32, MemberStatus>,
}

/// How long the survey after a failed member list waits for each member's `status`.
pub const SURVEY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a pass starts from besides etcd.
pub struct Inputs<'a> {
    pub exits: &'a BTreeMap<i32, Exit>,
    pub before: &'a Memory,
    /// The cluster ID recorded when the loop first read this cluster's member list.
    pub cluster_id: Option<u64>,
    pub now: Timestamp,
    pub timeouts: Timeouts,
}

/// Reads the member list and each started member's status, plans, and makes at most one call.
/// `etcd.endpoints` are the members' client URLs by ordinal (a member of no ordinal is asked
/// at its own client URL). Before a member is removed, `record` must keep the memory with its
/// ordinal in `replacing` (an error there cancels the removal).
pub async fn pass<R>(ec: &EtcdCluster, etcd: &Etcd<'_>, input: Inputs<'_>, record: R) -> Outcome
where
    R: AsyncFnOnce(&Memory) -> Result<(), String>,
{
    let Inputs {
        exits,
        before,
        cluster_id,
        now,
        timeouts,
    } = input;
    let nothing = |step: Step| Outcome {
        members: None,
        cluster_id: None,
        health: BTreeMap::new(),
        memory: before.clone(),
        step,
        failed: None,
        unreachable: None,
        foreign: None,
        undecided: None,
        survey: BTreeMap::new(),
    };
    let listed = match etcd.member_list().await {
        Ok(found) => found,
        Err(e) => {
            // Each member answers `status` alone, quorum or not: who is there, and how far.
            // Asked with a short bound, so a pass that found no member list waits at most
            // SURVEY_TIMEOUT more, not a second call timeout.
            let asks = etcd
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, url)| async move {
                    let status = match etcd.status_within(url, SURVEY_TIMEOUT).await {
                        Ok(s) => Some(s),
                        // A member that restarted while no leader was there serves no client
                        // until one is: its metrics port still says how far it got.
                        Err(_) => match render::metrics_url(url) {
                            Some(m) => etcd.metrics_status(&m, SURVEY_TIMEOUT).await,
                            None => None,
                        },
                    };
                    (i as i32, status)
                });
            let survey = futures_util::future::join_all(asks)
                .await
                .into_iter()
                .filter_map(|(i, s)| Some((i, s?)))
                .collect();
            return Outcome {
                unreachable: Some(e.clone()),
                survey,
                ..nothing(Step::Wait(format!("no member answered member list: {e}")))
            };
        }
    };
    if let Some(want) = cluster_id.filter(|&c| c != 0 && listed.cluster_id != 0)
        && want != listed.cluster_id
    {
        let why = format!(
            "{} answered for etcd cluster {:x}, not {want:x} (the cluster this EtcdCluster formed): a former cluster's volumes? nothing is changed",
            listed.endpoint, listed.cluster_id
        );
        return Outcome {
            foreign: Some(why.clone()),
            cluster_id: Some(listed.cluster_id),
            ..nothing(Step::Wait(why))
        };
    }
    let (endpoint, mut members) = (listed.endpoint, listed.members);
    // Every started member's status, at once.
    let asks = members.iter().filter(|m| m.started()).filter_map(|m| {
        let url = client_url(ec, &etcd.endpoints, m)?;
        Some(async move { (m.id, etcd.status(url).await) })
    });
    let health: BTreeMap<u64, MemberStatus> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter_map(|(id, status)| Some((id, status.ok()?)))
        .collect();
    // The ordinals below the size that have no member, asked too: one that answers runs as a
    // member the list no longer has (removed, and not yet stopped by its peers).
    let taken: BTreeSet<i32> = members.iter().filter_map(|m| ordinal(ec, m)).collect();
    let known: BTreeSet<u64> = members.iter().map(|m| m.id).collect();
    let holes = (0..ec.spec.size)
        .filter(|i| !taken.contains(i))
        .filter_map(|i| Some((i, etcd.endpoints.get(i as usize)?)))
        .map(|(i, url)| async move { (i, etcd.status(url).await) });
    let removed_running: BTreeSet<i32> = futures_util::future::join_all(holes)
        .await
        .into_iter()
        .filter_map(|(i, status)| {
            let id = status.ok()?.header.member_id;
            (id != 0 && !known.contains(&id)).then_some(i)
        })
        .collect();
    let mut memory = Memory {
        joining: joining_of(&members, &before.joining, now),
        started: started_of(&members, &before.started, now),
        replacing: before.replacing.clone(),
        corrupt: before.corrupt.clone(),
    };
    let finding = corruption_finding(ec, etcd, &members, &health, exits).await;
    let mut step = plan(
        ec,
        &View {
            members: &members,
            health: &health,
            exits,
            removed_running: &removed_running,
            memory: &memory,
            now,
            timeouts,
            corruption: finding.as_ref(),
        },
    );
    if let Step::Remove { ordinal, why, .. } = &step {
        let ordinal = *ordinal;
        if matches!(why, Removal::Corrupt(_)) {
            memory.corrupt.insert(ordinal, now);
        }
        memory.replacing.insert(ordinal);
        if let Err(e) = record(&memory).await {
            memory.replacing.remove(&ordinal);
            step = Step::Wait(format!(
                "{}-{ordinal} is not removed: its volume replacement could not be recorded: {e}",
                ec.name_any()
            ));
        }
    }
    let result = match &step {
        Step::AddLearner { ordinal } => etcd
            .add_learner(&endpoint, &render::peer_url(ec, *ordinal))
            .await
            .map(|(_, after)| after),
        Step::Promote { id, .. } => etcd.promote(&endpoint, *id).await,
        Step::Remove { id, .. } => etcd.remove(&endpoint, *id).await,
        Step::Disarm { ids } => disarm(etcd, &endpoint, ids).await.map(|()| members.clone()),
        Step::Steady | Step::Wait(_) | Step::ReplaceVolume { .. } => Ok(members.clone()),
    };
    let failed = match result {
        Ok(after) => {
            members = after;
            memory.joining = joining_of(&members, &memory.joining, now);
            memory.started = started_of(&members, &memory.started, now);
            None
        }
        Err(e) => Some(e),
    };
    Outcome {
        members: Some(members),
        cluster_id: Some(listed.cluster_id),
        health,
        memory,
        step,
        failed,
        unreachable: None,
        foreign: None,
        undecided: match finding {
            Some(Finding::Undecided(why)) => Some(why),
            _ => None,
        },
        survey: BTreeMap::new(),
    }
}

/// What etcd's corruption checks say this pass: the CORRUPT alarm entries in the statuses, the
/// members whose pod's last run was refused by the initial check (while they do not answer),
/// and, only while an alarm is raised, every voter's hash at the revision all of them have.
async fn corruption_finding(
    ec: &EtcdCluster,
    etcd: &Etcd<'_>,
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    exits: &BTreeMap<i32, Exit>,
) -> Option<Finding> {
    let alarms = corruption::alarmed(health);
    let refused_at_start: BTreeSet<u64> = members
        .iter()
        .filter(|m| !health.contains_key(&m.id))
        .filter(|m| {
            ordinal(ec, m)
                .and_then(|i| exits.get(&i))
                .is_some_and(|e| corruption::failed_initial_check(&e.message))
        })
        .map(|m| m.id)
        .collect();
    let revision = health
        .values()
        .map(|s| s.header.revision)
        .min()
        .unwrap_or(0);
    let mut hashes = BTreeMap::new();
    if !alarms.is_empty() {
        let asks = members
            .iter()
            .filter(|m| m.started() && !m.is_learner)
            .filter_map(|m| {
                let url = client_url(ec, &etcd.endpoints, m)?;
                Some(async move { (m.id, etcd.hash_kv(url, revision).await) })
            });
        hashes = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .filter_map(|(id, hash)| match hash {
                Ok(h) => Some((id, h)),
                Err(e) => {
                    tracing::warn!(cluster = %ec.name_any(), member = format!("{id:x}"), error = %e, "no hash of its data");
                    None
                }
            })
            .collect();
    }
    corruption::judge(
        members,
        health,
        &alarms,
        &refused_at_start,
        &hashes,
        revision,
    )
}

/// Disarms the CORRUPT alarm entries of `ids`.
async fn disarm(etcd: &Etcd<'_>, endpoint: &str, ids: &[u64]) -> Result<(), EtcdError> {
    for id in ids {
        etcd.disarm(endpoint, *id, corruption::CORRUPT).await?;
    }
    Ok(())
}

/// The ordinal whose claim and pod are to be deleted after this pass: a member just removed
/// (its volume names a member that is no more), or a volume [`plan`] found to replace.
pub fn volume_to_replace(outcome: &Outcome) -> Option<i32> {
    match (&outcome.step, &outcome.failed) {
        (Step::Remove { ordinal, .. }, None) | (Step::ReplaceVolume { ordinal }, _) => {
            Some(*ordinal)
        }
        _ => None,
    }
}
