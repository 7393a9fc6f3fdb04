//! The members' liveness, readiness and startup probes, per release: which endpoint each
//! release answers without counting the NOSPACE alarm, how long liveness waits out a
//! defragmentation of the whole quota, and how long a member may take to start.

use k8s_openapi::api::core::v1::{HTTPGetAction, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// etcd's `/health` with the NOSPACE alarm left out of its verdict (every v3.5 release takes
/// `exclude`).
const HEALTH_WITHOUT_NOSPACE: &str = "/health?exclude=NOSPACE";

/// How often the kubelet asks a member whether it is alive.
const LIVENESS_PERIOD: i32 = 10;

/// How long a member may take to start before the kubelet restarts it: 300 failures of a 1 s
/// period (a member is probed every second while it starts, so it is ready within a second of
/// serving).
pub const STARTUP_FAILURES: i32 = 300;

fn health_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("metrics".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The member's readiness and liveness probes for its etcd release. Ready needs a quorum;
/// alive never does, so losing the quorum restarts no member; and neither fails on a NOSPACE
/// alarm, so a full database leaves every member serving reads and the loop's recovery
/// (compaction, defragmentation, disarm) reachable:
/// - from v3.5.11, `/readyz` (which also fails on a learner, and ignores NOSPACE) and `/livez`;
/// - from v3.5.3, `/health?exclude=NOSPACE` and `/health?exclude=NOSPACE&serializable=true`
///   (`/health` fails on any alarm before v3.5.11; `serializable` is answered locally from
///   v3.5.3 on, etcd-io/etcd#13706), as kubeadm probes those releases;
/// - before v3.5.3 every health endpoint needs a leader, so liveness only checks that the
///   metrics port accepts connections; readiness asks `/health?exclude=NOSPACE` too, but
///   those releases spend the exclusion on the first member's alarm (etcdhttp `checkHealth`
///   deletes it from the set), so with several members' alarms raised they are not ready: the
///   loop asks etcd whenever a member runs, ready or not, so the recovery still happens.
///
/// A defragmentation blocks every endpoint of its member (v3.6: `/livez`, `/readyz` and the
/// status; benches/defrag.py), so liveness tolerates the longest one the loop may start: the
/// whole quota at [`crate::api::DEFRAG_BYTES_PER_SECOND`], in failures of its 10 s period (at
/// least 6). Readiness fails meanwhile, which takes the member out of the client Service.
pub fn probes(version: &str, quota: i64) -> (Probe, Probe) {
    let at_least =
        |minor: u64, patch: u64| crate::api::EtcdVersion::at_least(version, 3, minor, patch);
    let longest = crate::api::defrag_time(u64::try_from(quota).unwrap_or(0));
    let failures = i32::try_from(longest.as_secs().div_ceil(LIVENESS_PERIOD as u64) + 1)
        .unwrap_or(i32::MAX)
        .max(6);
    let alive = |probe: Probe| Probe {
        initial_delay_seconds: Some(15),
        failure_threshold: Some(failures),
        ..probe
    };
    if at_least(5, 11) {
        (
            health_probe("/readyz", 5, 3),
            alive(health_probe("/livez", LIVENESS_PERIOD, 6)),
        )
    } else if at_least(5, 3) {
        (
            health_probe(HEALTH_WITHOUT_NOSPACE, 5, 3),
            alive(health_probe(
                &format!("{HEALTH_WITHOUT_NOSPACE}&serializable=true"),
                LIVENESS_PERIOD,
                6,
            )),
        )
    } else {
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("metrics".to_owned()),
                ..Default::default()
            }),
            period_seconds: Some(LIVENESS_PERIOD),
            timeout_seconds: Some(5),
            failure_threshold: Some(6),
            ..Default::default()
        };
        (health_probe(HEALTH_WITHOUT_NOSPACE, 5, 3), alive(tcp))
    }
}

/// The startup probe for a member whose liveness probe is `liveness`: the same check, every
/// second from the start, given [`STARTUP_FAILURES`] failures (5 minutes). Until it passes the
/// kubelet runs neither liveness nor readiness. A member may take that long to start: it
/// replays its log and opens a large database first, and one that rejoins on an empty volume
/// asks each peer for the cluster's version and downgrade state with a 7 s timeout apiece
/// (etcd's `cluster_util.go`), which a peer that is starting too, or has no leader, never
/// answers: four such peers took about 50 s on v3.7.4 (`tests/members.rs`, the rebuild after
/// three of five volumes were lost), close to the `15 s + 6 x 10 s` liveness allows, which
/// more of them, or a slower network, exceed.
pub fn startup_probe(liveness: &Probe) -> Probe {
    Probe {
        initial_delay_seconds: None,
        period_seconds: Some(1),
        timeout_seconds: Some(5),
        failure_threshold: Some(STARTUP_FAILURES),
        success_threshold: None,
        ..liveness.clone()
    }
}
