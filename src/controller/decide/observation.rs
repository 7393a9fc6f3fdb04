//! What a reconcile pass saw and did, as far as the status is concerned: the input of
//! `status::desired`.

use crate::controller::decide::members::{Member, MemberStatus};

/// What a reconcile pass saw and did, as far as the status is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Ready members according to the StatefulSet.
    pub ready: i32,
    /// A change under way (the Progressing reason), e.g. `Scaling`; `None` when nothing moves
    /// besides members becoming ready.
    pub activity: Option<Activity>,
    /// Why the cluster is Failed: a reason (`ApplyFailed`, `InvalidSpec`) and a message.
    pub failure: Option<(&'static str, String)>,
    /// The cluster is being deleted and the finalizer runs.
    pub deleting: bool,
    /// A problem that does not stop the members (e.g. an unsupported backup destination).
    pub warning: Option<String>,
    /// What etcd's member list said (`None`: not read this pass).
    pub membership: Option<Membership>,
    /// Something moves that no watch reports (etcd's membership): look again soon.
    pub settle: bool,
    /// The voters etcd reported this pass (the disruption budget keeps a quorum of them).
    pub voters: Option<i32>,
    /// The ordinal of the leader etcd reported this pass.
    pub leader: Option<i32>,
    /// What the change under way is doing now (appended to the Progressing message).
    pub progress: Option<String>,
    /// The backups' record after this pass (`None`: not read; the status keeps its own).
    pub backup: Option<crate::api::v1::BackupStatus>,
    /// Where a cluster made from a snapshot is (`None`: not made from one).
    pub restored: Option<Restored>,
    /// The member list and statuses the membership pass read, for the upkeep (`None`: not
    /// read, or a membership step was made this pass).
    pub etcd: Option<EtcdView>,
    /// etcd's space (`None`: not judged this pass; the status keeps its last word).
    pub space: Option<Space>,
    /// A TLS cluster: whether the members trust the key of the CA that signs their
    /// certificates, and the message (`None`: not judged).
    pub trust: Option<(bool, String)>,
}

/// The members as etcd reported them this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdView {
    pub members: Vec<Member>,
    pub health: std::collections::BTreeMap<u64, MemberStatus>,
    /// The membership pass made no call and none failed: the upkeep may plan.
    pub steady: bool,
    /// The members the upkeep defragmented this pass.
    pub defragmented: Vec<String>,
    /// When each member (by name) was last found corrupt and replaced.
    pub corrupt: std::collections::BTreeMap<String, String>,
}

/// Whether etcd takes writes, as far as its quota goes (the `Degraded` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Space {
    Ok,
    /// The NOSPACE alarm is raised and the loop is recovering (what it waits for, or did).
    NoSpace(String),
    /// The data needs more than the quota: writes stay refused until it grows.
    QuotaExceeded(String),
}

/// A restore's progress (the `Restored` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    Restoring {
        done: i32,
        of: i32,
    },
    /// The snapshot's source is not there yet (a claim that does not exist).
    Waiting(String),
    /// A restore in place clearing what the lost cluster left (what it waits for).
    Clearing(String),
    Failed(String),
    Done,
}

/// The members by state, from `member list` and each member's `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// A member answered `member list`; nothing below is known otherwise.
    pub reachable: bool,
    pub voters: i32,
    pub healthy_voters: i32,
    pub learners: i32,
    pub unstarted: i32,
    /// Members at ordinals the cluster does not run (a former cluster's volumes).
    pub strangers: Vec<String>,
    /// What the membership waits for, or why it could not be read or changed.
    pub note: Option<String>,
    /// Something is corrupt and the loop will not guess what (the note says why).
    pub corruption_undecided: bool,
    /// No member list (no quorum): what the members said alone, diagnosed.
    pub quorum: Option<super::quorum::Diagnosis>,
}

impl Membership {
    /// Every member of the spec is a healthy voter and nobody else is a member.
    pub fn settled(&self, size: i32) -> bool {
        self.reachable
            && self.voters == size
            && self.healthy_voters == size
            && self.learners == 0
            && self.unstarted == 0
            && self.strangers.is_empty()
    }

    /// Every member of the spec is a healthy voter; strangers aside (nothing the loop does
    /// changes them, so they bring no quicker look).
    pub fn converged(&self, size: i32) -> bool {
        let strangers = self.strangers.len() as i32;
        self.reachable
            && self.voters >= size
            && self.healthy_voters >= size
            && self.learners + self.unstarted <= strangers
    }

    pub(crate) fn condition(&self, size: i32) -> (bool, &'static str, String) {
        let mut message = format!(
            "{} voters ({} healthy), {} learners, {} not started, of {size}",
            self.voters, self.healthy_voters, self.learners, self.unstarted
        );
        if !self.strangers.is_empty() {
            message.push_str(&format!(
                "; members the spec does not run (a former cluster's volumes?): {}",
                self.strangers.join(", ")
            ));
        }
        if let Some(note) = &self.note {
            message.push_str(&format!("; {note}"));
        }
        if !self.reachable {
            return (
                false,
                "Unreachable",
                format!(
                    "member list not read: {}; readiness is the StatefulSet's",
                    self.note.as_deref().unwrap_or("not formed yet")
                ),
            );
        }
        let reason = if self.corruption_undecided {
            "CorruptionUndecided"
        } else if !self.strangers.is_empty() {
            "StaleMembers"
        } else if self.learners > 0 || self.unstarted > 0 || self.voters < size {
            "Joining"
        } else if self.healthy_voters < self.voters {
            "Unhealthy"
        } else {
            "AllVoting"
        };
        (self.settled(size), reason, message)
    }
}

/// Why the cluster is progressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    Scaling,
    AddingMembers,
    Upgrading,
    ResizingStorage,
}

impl Activity {
    pub fn reason(self) -> &'static str {
        match self {
            Activity::Scaling => "Scaling",
            Activity::AddingMembers => "AddingMembers",
            Activity::Upgrading => "Upgrading",
            Activity::ResizingStorage => "ResizingStorage",
        }
    }
}
