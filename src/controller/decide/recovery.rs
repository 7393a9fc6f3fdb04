//! What a recovery from a lost quorum is made of, for the diagnosis ([`super::quorum`]) and
//! the restore in place ([`super::restoring`]): the diagnosis itself, the copies a rescue made,
//! the plans a person approves (the survivor kept and its applied index, or the snapshot
//! restored) and whether `spec.recovery.quorumLoss` lets the loop carry one out.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::members::MemberStatus;
use crate::api::APPROVE_RECOVERY_ANNOTATION;
use crate::api::v1::{EtcdCluster, QuorumLoss, SnapshotRecord};
use crate::controller::render::InPlace;

/// What a lost quorum is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Diagnosis {
    /// The silent members' data may come back: the loop waits.
    Waiting(String),
    /// A majority's data is gone: it does not heal by itself.
    DataLost(String),
    /// A majority's data is gone and one member with data is all there is: the members on
    /// empty volumes may rejoin under their old IDs and copy its data ([`sole_survivor`]).
    Rejoining(String),
    /// As [`Diagnosis::Rejoining`], but `spec.recovery.quorumLoss` is `Manual` and nobody has
    /// approved the plan yet ([`approved`]): the fence stays.
    AwaitingApproval(String),
    /// A majority's data is gone and every member with data answers: the rebuild keeps the one
    /// with the most applied data (`plan`); every member's data, that one's included where it
    /// serves clients, is copied to the backup destination (`copy`: the rescue Jobs to run),
    /// then the others' volumes are made anew (`wipe`: copied, still holding it). Once they are
    /// empty and the one kept is copied, the rebuild is a [`Diagnosis::Rejoining`] from it (a
    /// sole survivor is copied the same way first). The fence stays meanwhile.
    Rebuilding {
        message: String,
        plan: String,
        copy: Vec<i32>,
        wipe: Vec<i32>,
    },
    /// A majority's data is gone, every member that may hold data answers, and the newest
    /// snapshot is newer than all of them: every member's data is copied to the backup
    /// destination (`copy`: the rescue Jobs still to run), then the cluster is restored in
    /// place from the snapshot (`restore`: what the loop writes once `copy` is empty). The
    /// fence stays meanwhile.
    Restoring {
        message: String,
        plan: String,
        copy: Vec<i32>,
        restore: InPlace,
    },
}

/// The copies of members' data a rebuild has made, as the loop found them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rescue {
    /// Where copies go (the backup destination); `None` when backups are off: nothing can be
    /// copied, so nothing is made anew.
    pub destination: Option<String>,
    /// By ordinal and the plan a copy was made for: where it is.
    pub copied: BTreeMap<(i32, String), String>,
    /// By ordinal: why the last copy failed (it is tried again).
    pub failed: BTreeMap<i32, String>,
    /// The plan the fence was last lifted for (the members' ConfigMap says it).
    pub lifted: Option<String>,
    /// The status says the rejoin (`Available` is `RejoiningFromSurvivor`): a lifted plan is
    /// one under way, not one an earlier recovery left recorded.
    pub rejoining: bool,
}

/// The plan of a recovery from the members that answered: the voter with the most applied data
/// (of equals, the lowest ordinal) at its applied index ([`rejoin_plan`]). A learner never voted
/// for what it holds, so it is never the one kept.
pub fn plan(ec: &EtcdCluster, answered: &BTreeMap<i32, MemberStatus>) -> Option<String> {
    best(answered)
        .map(|(i, s)| rejoin_plan(&format!("{}-{i}", ec.name_any()), s.raft_applied_index))
}

pub(super) fn best(answered: &BTreeMap<i32, MemberStatus>) -> Option<(&i32, &MemberStatus)> {
    answered
        .iter()
        .filter(|(_, s)| !s.is_learner)
        .max_by_key(|(i, s)| (s.raft_applied_index, std::cmp::Reverse(**i)))
}

impl Diagnosis {
    pub fn message(&self) -> &str {
        match self {
            Diagnosis::Waiting(m)
            | Diagnosis::DataLost(m)
            | Diagnosis::Rejoining(m)
            | Diagnosis::AwaitingApproval(m)
            | Diagnosis::Rebuilding { message: m, .. }
            | Diagnosis::Restoring { message: m, .. } => m,
        }
    }

    /// The reason of the `Available` condition that says it.
    pub fn reason(&self) -> &'static str {
        match self {
            Diagnosis::Waiting(_) => "QuorumLost",
            Diagnosis::DataLost(_) => "MajorityDataLost",
            Diagnosis::Rejoining(_) => "RejoiningFromSurvivor",
            Diagnosis::AwaitingApproval(_) => "RecoveryAwaitingApproval",
            Diagnosis::Rebuilding { .. } => "RebuildingFromSurvivor",
            Diagnosis::Restoring { .. } => "RestoringFromSnapshot",
        }
    }

    /// Whether it is told in a Warning (once, with the condition's reason): all but the wait,
    /// which usually heals by itself.
    pub fn warns(&self) -> bool {
        !matches!(self, Diagnosis::Waiting(_))
    }
}

/// The plan a person approves for a rejoin from `pod` at its applied index: a later loss (the
/// same survivor further on, or another one) is another plan, so an old approval approves
/// nothing new.
pub fn rejoin_plan(pod: &str, applied_index: u64) -> String {
    format!("rejoin-from-{pod}-at-{applied_index}")
}

/// The member pod and applied index a [`rejoin_plan`] names.
pub fn parse_rejoin_plan(plan: &str) -> Option<(&str, u64)> {
    let (pod, index) = plan.strip_prefix("rejoin-from-")?.rsplit_once("-at-")?;
    Some((pod, index.parse().ok()?))
}

/// The plan a person approves for a restore in place from `snapshot`: the snapshot's revision
/// and the start of its SHA-256 (another snapshot is another plan).
pub fn restore_plan(snapshot: &SnapshotRecord) -> String {
    let sha: String = snapshot.sha256.chars().take(12).collect();
    format!("restore-revision-{}-sha256-{sha}", snapshot.revision)
}

/// Whether `spec.recovery.quorumLoss` is `Manual` (unset is `Automatic`).
pub(super) fn manual(ec: &EtcdCluster) -> bool {
    ec.spec.recovery.as_ref().and_then(|r| r.quorum_loss) == Some(QuorumLoss::Manual)
}

/// Whether the loop carries out `plan` by itself: with `spec.recovery.quorumLoss` `Automatic`
/// (or unset) always; with `Manual` once the annotation [`APPROVE_RECOVERY_ANNOTATION`] names
/// exactly this plan.
pub fn approved(ec: &EtcdCluster, plan: &str) -> bool {
    !manual(ec) || approval(ec).is_some_and(|v| v == plan)
}

/// The plan the approval annotation names, if any.
pub(super) fn approval(ec: &EtcdCluster) -> Option<&str> {
    ec.annotations()
        .get(APPROVE_RECOVERY_ANNOTATION)
        .map(|v| v.trim())
}

/// A plan that `Manual` recovery has not approved yet: what the loop `would` do, and the
/// command that approves `plan`.
pub(super) fn awaiting(ec: &EtcdCluster, would: String, plan: &str) -> Diagnosis {
    let other = match approval(ec) {
        Some(v) => format!(" ({APPROVE_RECOVERY_ANNOTATION} names another plan: {v})"),
        None => String::new(),
    };
    Diagnosis::AwaitingApproval(format!(
        "{would}; until then members on empty volumes are kept from rejoining{other}. Approve with: kubectl annotate ec {} -n {} {APPROVE_RECOVERY_ANNOTATION}={plan} --overwrite",
        ec.name_any(),
        ec.namespace().unwrap_or_default()
    ))
}
