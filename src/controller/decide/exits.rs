//! How a member pod's etcd last ended, and what its log's tail says: a lost volume, or a
//! member ID the cluster removed. Pure: read by the membership plan.

use k8s_openapi::jiff::Timestamp;

/// Lines of an etcd log that mean its data directory is gone while the cluster still has the
/// member: bootstrapping anew over a known member, or a raft log that starts from nothing.
pub const LOST_VOLUME_SIGNS: &[&str] = &["has already been bootstrapped", "[lastIndex(0)]"];

/// etcd's refusal of a start whose name the initial cluster list does not have. etcd reads
/// that list only on an empty data directory, so the run started on an empty volume: under
/// the loop's fence (`render::FENCED_INITIAL_CLUSTER`, while no member list answers) or
/// before the loop added the member. Read only for a lost quorum (`quorum::diagnose`): a
/// member about to be added says the same, so it is no sign for the membership plan.
pub const EMPTY_AT_START_SIGN: &str = "in the initial cluster configuration";

/// Words of an etcd log that mean its member ID was removed from the cluster. The run that
/// learns it stops with exit 0 (no termination message; a run started again on that volume
/// does the same, measured on v3.5.35 and v3.6.4); should a run end with an error after
/// saying so, the kubelet keeps the log's tail and this still reads it.
///
/// The second is etcd v3.6.4's race on that stop (seen in tests/members.rs, the restart on the
/// removed volume, 2 runs of 2 on 2026-12-01): the
/// removed member's server stops, its client listener then fails with a fatal
/// `"listener failed","error":"server is stopping"`, and it exits 1 with the removal line out
/// of the kept tail. Read only where the member list has no started member for the pod.
pub const REMOVED_SIGNS: &[&str] = &["permanently removed", "\"error\":\"server is stopping\""];

/// Whether a container's last termination message (the tail of its log, with
/// `terminationMessagePolicy: FallbackToLogsOnError`, kept only after an error exit) says the
/// member lost its volume.
pub fn lost_volume(message: &str) -> bool {
    LOST_VOLUME_SIGNS.iter().any(|s| message.contains(s))
}

/// How a member pod's etcd container last ended, as the kubelet reports it
/// (`state.terminated`, else `lastState.terminated`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// The termination message (the log's tail after an error exit, else empty).
    pub message: String,
    /// When it ended, if the kubelet said.
    pub at: Option<Timestamp>,
}

impl Exit {
    /// The member's data directory is gone while the cluster still has it.
    pub fn lost_volume(&self) -> bool {
        lost_volume(&self.message)
    }

    /// The run started on an empty data directory: a lost volume, or a start refused by the
    /// initial cluster list ([`EMPTY_AT_START_SIGN`]).
    pub fn empty_volume(&self) -> bool {
        self.lost_volume() || self.message.contains(EMPTY_AT_START_SIGN)
    }

    /// etcd stopped by itself: it exits 0 when its peers tell it that its member ID was
    /// removed ("the member has been permanently removed from the cluster"), and, as a
    /// container's PID 1, after a SIGTERM. Read only where the member list has no started
    /// member for the pod, so either way the volume holds nothing the cluster needs.
    pub fn clean(&self) -> bool {
        self.code == 0
    }

    /// The volume names a member ID the cluster removed: a clean exit, or an error exit whose
    /// log says so (the kubelet restarts the first at once, and the run after it fails).
    pub fn removed(&self) -> bool {
        self.clean() || REMOVED_SIGNS.iter().any(|s| self.message.contains(s))
    }

    pub(super) fn after(&self, since: Timestamp) -> bool {
        self.at.is_none_or(|at| at >= since)
    }
}

/// Whether a member container running now, under the fence, is known to run on an empty
/// volume: its last run ended on an empty volume, and its restart count (`restarts`) is at
/// least two past the one the loop recorded for that pod when the fence went on (`recorded`;
/// 0 for a pod it did not see then). One past could be a run that started before the fence
/// (the pods' cache may lag a restart), or one whose container read the membership before the
/// kubelet saw the fence; two past, its previous run began after the fence was written and
/// ended empty, and nothing ran in between to fill the volume. No clock is compared. A pass
/// that reads such a pod between two of its restarts knows what the pass before it knew.
pub fn fenced_run(restarts: i32, recorded: Option<i32>, last: &Exit) -> bool {
    restarts >= recorded.unwrap_or(0).saturating_add(2) && last.empty_volume()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_two_restarts_past_the_fence_after_an_empty_exit_is_known_empty() {
        let refused = Exit {
            code: 1,
            message: format!("member etcd-1 {EMPTY_AT_START_SIGN}"),
            at: None,
        };
        assert!(fenced_run(5, Some(3), &refused));
        assert!(
            !fenced_run(4, Some(3), &refused),
            "one past: maybe begun before the fence, or on the membership before it"
        );
        assert!(!fenced_run(3, Some(3), &refused));
        assert!(
            fenced_run(2, None, &refused),
            "a pod made after the fence: its runs from 0"
        );
        assert!(!fenced_run(1, None, &refused));
        let crashed = Exit {
            code: 2,
            message: "panic: tocommit(105) is out of range [lastIndex(0)]".to_owned(),
            at: None,
        };
        assert!(fenced_run(5, Some(3), &crashed));
        let other = Exit {
            code: 1,
            message: "listener failed".to_owned(),
            at: None,
        };
        assert!(
            !fenced_run(9, Some(3), &other),
            "an exit that says nothing of the volume"
        );
    }

    #[test]
    fn lost_volume_signs() {
        assert!(lost_volume(
            "panic: tocommit(105) is out of range [lastIndex(0)]. Was the raft log corrupted, truncated, or lost?"
        ));
        assert!(lost_volume(
            r#"{"msg":"discovery failed","error":"member 8e9e05c52164694d has already been bootstrapped"}"#
        ));
        assert!(!lost_volume(
            "the member has been permanently removed from the cluster"
        ));
    }
}
