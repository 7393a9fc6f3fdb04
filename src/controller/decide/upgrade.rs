//! Rolling upgrades the way etcd wants them: the StatefulSet's `updateStrategy` is `OnDelete`, so
//! a changed template (a new `spec.version`) restarts nobody by itself; the loop restarts one
//! member at a time by deleting its pod, and only when every member pod is ready on its volume
//! and every voter is healthy: the followers first, in ordinal order, the leader last (one
//! leader election per upgrade, not one per member). A member that does not come back ready
//! stops the upgrade where it is: nothing else restarts until it does.
//!
//! [`plan`] is that decision, a pure function; `pass::upgrade::roll` reads the pods and the
//! StatefulSet's update revision, plans, and deletes the one pod.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::v1::EtcdCluster;

/// The label the StatefulSet controller puts on each pod: the revision of the template it was
/// made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// A member pod as the upgrade sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPod {
    pub ordinal: i32,
    /// The template revision it runs.
    pub revision: String,
    pub ready: bool,
    pub deleting: bool,
}

/// What etcd said this pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Every voter healthy and the membership as the spec wants it (no learner joining).
    pub settled: bool,
    /// The ordinal of the leader, if etcd named one.
    pub leader: Option<i32>,
}

/// The next upgrade step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every pod runs the update revision.
    Done,
    /// Some pods are outdated, but none may restart now (the reason).
    Wait(String),
    /// Delete this pod: the StatefulSet makes it again from the new template.
    Restart {
        ordinal: i32,
        leader: bool,
        /// Pods on the update revision already, of all.
        done: usize,
        of: usize,
    },
}

/// The next pod to restart onto `update` (see the module).
pub fn plan(name: &str, pods: &[MemberPod], update: &str, health: Health) -> Step {
    let outdated: Vec<&MemberPod> = pods.iter().filter(|p| p.revision != update).collect();
    if outdated.is_empty() {
        return Step::Done;
    }
    if let Some(p) = pods.iter().find(|p| p.deleting || !p.ready) {
        return Step::Wait(format!(
            "{name}-{} is not ready yet; the next member restarts when it is",
            p.ordinal
        ));
    }
    if !health.settled {
        return Step::Wait(
            "a member restarts only while every voter is healthy and no member is joining"
                .to_owned(),
        );
    }
    let next = outdated
        .iter()
        .filter(|p| Some(p.ordinal) != health.leader)
        .min_by_key(|p| p.ordinal)
        .or_else(|| outdated.first())
        .expect("outdated is not empty");
    Step::Restart {
        ordinal: next.ordinal,
        leader: Some(next.ordinal) == health.leader,
        done: pods.len() - outdated.len(),
        of: pods.len(),
    }
}

/// The release the members are rendered with this pass: `spec.version`, unless going there
/// from what they run now would skip a step etcd needs (etcd-io/etcd#19557: 3.5 learner
/// promotions before 3.5.20 are not persisted, and 3.6 refuses such a cluster). A spec edited
/// on (3.5.10 -> 3.5.32 -> 3.6.4) while the first roll is under way would otherwise restart
/// the members still on 3.5.10 straight onto 3.6. So the next minor is rendered only when
/// every member has reported a release from which etcd goes there (the minimum patch) and is
/// healthy on it; until then the template keeps the release it has (`template`), and the
/// reason is returned. `running` is each member's release as etcd last said (`""`: no answer).
pub fn pace(
    spec: &str,
    template: Option<&str>,
    running: &[(&str, bool)],
) -> (String, Option<String>) {
    use crate::api::EtcdVersion;
    let (Ok(target), Some(Ok(held))) = (
        spec.parse::<EtcdVersion>(),
        template.map(str::parse::<EtcdVersion>),
    ) else {
        return (spec.to_owned(), None);
    };
    // Within a minor (or back to the release the template has) nothing can be skipped.
    if (target.major, target.minor) == (held.major, held.minor) || target <= held {
        return (spec.to_owned(), None);
    }
    let hold = |why: String| (held.to_string(), Some(why));
    if running.is_empty() {
        return hold(format!(
            "{target} waits until every member has reported the release it runs"
        ));
    }
    for (version, healthy) in running {
        // etcd says `3.5.32`; the spec `v3.5.32`.
        let Ok(v) = format!("v{}", version.trim_start_matches('v')).parse::<EtcdVersion>() else {
            return hold(format!(
                "{target} waits until every member has reported the release it runs (one has not answered)"
            ));
        };
        if let Err(why) = v.upgrade_to(&target) {
            return hold(format!("{target} waits for the roll to {held}: {why}"));
        }
        if !healthy {
            return hold(format!(
                "{target} waits until every member is healthy on {v} or later"
            ));
        }
    }
    (spec.to_owned(), None)
}

/// What [`plan`] reads of a member pod: its ordinal, revision, readiness, and whether it is
/// being deleted (`None` for a pod of no ordinal).
pub fn member_pod(ec: &EtcdCluster, pod: &Pod) -> Option<MemberPod> {
    let ordinal = pod
        .name_any()
        .strip_prefix(&format!("{}-", ec.name_any()))?
        .parse()
        .ok()?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    Some(MemberPod {
        ordinal,
        revision: pod
            .labels()
            .get(REVISION_LABEL)
            .cloned()
            .unwrap_or_default(),
        ready,
        deleting: pod.metadata.deletion_timestamp.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3.5.10 -> 3.5.32 -> 3.6.4 edited in quick succession: the template stays on 3.5.32
    /// until every member reports 3.5.32 and is healthy there; then 3.6.4 is rendered. Within
    /// a minor, and for a new cluster, the spec is rendered as written.
    #[test]
    fn the_next_minor_waits_for_every_member_on_the_minimum_patch() {
        let spec = "v3.6.4";
        let held = Some("v3.5.32");
        let (v, why) = pace(
            spec,
            held,
            &[("3.5.32", true), ("3.5.10", true), ("3.5.32", true)],
        );
        assert_eq!(v, "v3.5.32");
        assert!(why.unwrap().contains("v3.5.10"), "names the reason");
        let (v, why) = pace(
            spec,
            held,
            &[("v3.5.32", true), ("", false), ("v3.5.32", true)],
        );
        assert_eq!((v.as_str(), why.is_some()), ("v3.5.32", true));
        let (v, why) = pace(spec, held, &[("v3.5.32", true), ("v3.5.32", false)]);
        assert_eq!((v.as_str(), why.is_some()), ("v3.5.32", true));
        assert_eq!(pace(spec, held, &[]).0, "v3.5.32");
        let all = [("v3.5.32", true), ("v3.5.32", true), ("v3.5.32", true)];
        assert_eq!(pace(spec, held, &all), (spec.to_owned(), None));
        // Within a minor, a new cluster, a spec back on the template's release.
        assert_eq!(
            pace("v3.5.32", Some("v3.5.10"), &[("v3.5.10", true)]).1,
            None
        );
        assert_eq!(pace(spec, None, &[]), (spec.to_owned(), None));
        assert_eq!(pace("v3.5.32", Some("v3.6.4"), &[]).1, None);
    }

    fn pods(revisions: &[&str]) -> Vec<MemberPod> {
        revisions
            .iter()
            .enumerate()
            .map(|(i, r)| MemberPod {
                ordinal: i as i32,
                revision: (*r).to_owned(),
                ready: true,
                deleting: false,
            })
            .collect()
    }

    const OK: Health = Health {
        settled: true,
        leader: Some(0),
    };

    #[test]
    fn followers_first_in_order_then_the_leader() {
        let step = |revs: &[&str], h| plan("e", &pods(revs), "new", h);
        assert_eq!(
            step(&["old", "old", "old"], OK),
            Step::Restart {
                ordinal: 1,
                leader: false,
                done: 0,
                of: 3
            }
        );
        assert_eq!(
            step(&["old", "new", "old"], OK),
            Step::Restart {
                ordinal: 2,
                leader: false,
                done: 1,
                of: 3
            }
        );
        assert_eq!(
            step(&["old", "new", "new"], OK),
            Step::Restart {
                ordinal: 0,
                leader: true,
                done: 2,
                of: 3
            }
        );
        assert_eq!(step(&["new", "new", "new"], OK), Step::Done);
    }

    #[test]
    fn nothing_restarts_while_a_member_is_down_or_the_cluster_unsettled() {
        let mut p = pods(&["new", "old", "old"]);
        p[0].ready = false;
        assert!(matches!(
            plan("e", &p, "new", OK),
            Step::Wait(ref w) if w.contains("e-0 is not ready")
        ));
        p[0].ready = true;
        p[0].deleting = true;
        assert!(matches!(plan("e", &p, "new", OK), Step::Wait(_)));
        let p = pods(&["old", "old", "old"]);
        assert!(matches!(
            plan(
                "e",
                &p,
                "new",
                Health {
                    settled: false,
                    leader: Some(0)
                }
            ),
            Step::Wait(_)
        ));
        // No leader known (it is being elected): any follower order still holds.
        assert!(matches!(
            plan(
                "e",
                &p,
                "new",
                Health {
                    settled: true,
                    leader: None
                }
            ),
            Step::Restart { ordinal: 0, .. }
        ));
    }
}
