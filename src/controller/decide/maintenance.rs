//! etcd's upkeep after the membership pass: a member whose backend has much space it could
//! give back is defragmented, and a cluster that ran out of quota (the `NOSPACE` alarm: every
//! write refused) is brought back: its history compacted, every member defragmented, the alarm
//! disarmed, or, when the data itself needs more than the quota, left read-only with the reason
//! (`QuotaExceeded`). No key is ever deleted.
//!
//! [`plan`] is pure, over the member list and each member's status the membership pass read
//! (no extra call while nothing is to be done); [`run`] makes the calls. A defragmentation
//! blocks its member while it runs, so members go one at a time, followers first and the
//! leader last, each only while every voter serves, never while the membership changes or an
//! upgrade rolls; the order and every gate are re-checked before each member. The pass waits
//! for a defragmentation or a physical compaction outside its turn (`turns::outside`): no other
//! pass of this cluster runs meanwhile (kube-runtime runs one at a time), the other clusters'
//! passes do.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::controller::etcd::{Etcd, EtcdError, Member, MemberStatus};

/// The alarm etcd raises when a member's backend reaches the quota.
pub const NOSPACE: &str = "NOSPACE";
/// The alarm etcd raises when its corruption checks find a member whose data disagrees.
pub const CORRUPT: &str = "CORRUPT";

/// A recovery disarms only when the data in use leaves this share of the quota free, in
/// percent: with less, the data itself needs more than the quota (the alarm would come back
/// after a few writes), and the cluster stays read-only with the reason.
pub const DISARM_HEADROOM_PERCENT: u64 = 20;

/// Where a member is reached (`membership::client_url`), `None` for one with no client URL.
pub type Endpoint<'a> = &'a (dyn Fn(&Member) -> Option<String> + Sync);

/// What the rules are for one cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// `--quota-backend-bytes` the members run with.
    pub quota: u64,
    /// Defragment at this share of free space in a database (0: only to recover).
    pub threshold_percent: u8,
    /// And only when at least this much would be given back.
    pub min_free: u64,
}

impl Rules {
    pub fn of(spec: &crate::api::v1::EtcdClusterSpec) -> Rules {
        let m = spec.maintenance.as_ref();
        Rules {
            quota: u64::try_from(crate::api::quota_backend_bytes(spec)).unwrap_or(0),
            threshold_percent: m
                .and_then(|m| m.defrag_threshold_percent)
                .unwrap_or(crate::api::DEFRAG_THRESHOLD_PERCENT)
                .clamp(0, 99) as u8,
            min_free: crate::api::DEFRAG_MIN_FREE_BYTES as u64,
        }
    }
}

/// A member to defragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub id: u64,
    pub name: String,
    pub endpoint: String,
    pub leader: bool,
    /// `dbSize - dbSizeInUse` when planned.
    pub free: u64,
    /// `dbSize` when planned.
    pub db_size: u64,
}

/// What the upkeep does this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is due.
    Idle,
    /// Something is due but may not start now (the reason).
    Wait(String),
    /// Defragment these, in this order (followers first, the leader last).
    Defragment(Vec<Target>),
    /// NOSPACE: compact below `revision`, defragment every member in this order, then disarm
    /// (or report that the data needs more than the quota).
    Recover { revision: u64, order: Vec<Target> },
}

/// Why nothing may start, if anything stops it: a change under way (`busy`), a member that is
/// not a started voter, or a voter that does not serve (no leader, or an error other than an
/// alarm).
fn gate(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    busy: Option<&str>,
) -> Option<String> {
    if let Some(why) = busy {
        return Some(format!("{why} is under way"));
    }
    if let Some(m) = members
        .iter()
        .find(|m| health.get(&m.id).is_some_and(|s| s.alarm(CORRUPT)))
    {
        return Some(format!(
            "etcd raised the CORRUPT alarm on {}: its data disagrees with the other members'; no compaction or defragmentation runs until a person has compared the members (etcdctl endpoint hashkv) and replaced the outlier",
            if m.name.is_empty() {
                format!("{:x}", m.id)
            } else {
                m.name.clone()
            }
        ));
    }
    if let Some(m) = members.iter().find(|m| m.is_learner || !m.started()) {
        return Some(format!(
            "member {} is not a started voter yet",
            if m.name.is_empty() {
                format!("{:x}", m.id)
            } else {
                m.name.clone()
            }
        ));
    }
    members
        .iter()
        .find(|m| !health.get(&m.id).is_some_and(MemberStatus::serving))
        .map(|m| format!("voter {} does not serve", m.name))
}

/// The members in the order they may be blocked: followers (most free space first), then the
/// leader.
fn order(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    endpoint: Endpoint<'_>,
    keep: &dyn Fn(&MemberStatus) -> bool,
) -> Vec<Target> {
    let mut out: Vec<Target> = members
        .iter()
        .filter_map(|m| {
            let s = health.get(&m.id)?;
            keep(s).then_some(())?;
            Some(Target {
                id: m.id,
                name: m.name.clone(),
                endpoint: endpoint(m)?,
                leader: s.leader == m.id,
                free: s.db_size.saturating_sub(s.db_size_in_use),
                db_size: s.db_size,
            })
        })
        .collect();
    out.sort_by(|a, b| a.leader.cmp(&b.leader).then(b.free.cmp(&a.free)));
    out
}

/// What is due, from the member list and statuses the membership pass read. `endpoint` gives
/// a member's client URL (by ordinal), `busy` names a change under way (a membership step, an
/// upgrade, a storage growth).
pub fn plan(
    members: &[Member],
    health: &BTreeMap<u64, MemberStatus>,
    rules: &Rules,
    busy: Option<&str>,
    endpoint: Endpoint<'_>,
) -> Plan {
    let nospace = health.values().any(|s| s.alarm(NOSPACE));
    let due = |s: &MemberStatus| {
        let free = s.db_size.saturating_sub(s.db_size_in_use);
        rules.threshold_percent > 0
            && free >= rules.min_free
            && free.saturating_mul(100) >= s.db_size.saturating_mul(rules.threshold_percent as u64)
    };
    if !nospace && !health.values().any(due) {
        return Plan::Idle;
    }
    if let Some(why) = gate(members, health, busy) {
        return Plan::Wait(why);
    }
    if nospace {
        // The lowest revision any member has applied: a revision every member has.
        let revision = health
            .values()
            .map(|s| s.header.revision)
            .min()
            .unwrap_or(0);
        return Plan::Recover {
            revision,
            order: order(members, health, endpoint, &|_| true),
        };
    }
    Plan::Defragment(order(members, health, endpoint, &due))
}

/// After a recovery's compaction and defragmentations: disarm when the data in use leaves
/// [`DISARM_HEADROOM_PERCENT`] of the quota free, else the largest use (the data needs more
/// than the quota).
pub fn may_disarm<'a>(
    statuses: impl IntoIterator<Item = &'a MemberStatus>,
    quota: u64,
) -> Result<(), u64> {
    let in_use = statuses
        .into_iter()
        .map(|s| s.db_size_in_use)
        .max()
        .unwrap_or(0);
    if in_use.saturating_mul(100) <= quota.saturating_mul(100 - DISARM_HEADROOM_PERCENT) {
        Ok(())
    } else {
        Err(in_use)
    }
}

/// One defragmentation done.
#[derive(Clone, Debug, PartialEq)]
pub struct Defragmented {
    pub name: String,
    pub took: Duration,
    /// The database before and after.
    pub before: u64,
    pub after: u64,
}

impl Defragmented {
    pub fn freed(&self) -> u64 {
        self.before.saturating_sub(self.after)
    }
}

/// What [`run`] did.
#[derive(Debug, Default)]
pub struct Done {
    pub defragmented: Vec<Defragmented>,
    /// NOSPACE: compacted below this revision.
    pub compacted: Option<u64>,
    /// NOSPACE: the alarms disarmed.
    pub disarmed: bool,
    /// NOSPACE that compaction and defragmentation could not relieve: the largest use.
    pub quota_exceeded: Option<u64>,
    /// Stopped before the end (a gate closed between members).
    pub stopped: Option<String>,
    pub failed: Option<EtcdError>,
    /// A defragmentation that gave no answer within its time: the member, and how much longer
    /// etcd may go on with it (every other maintenance of the cluster waits that long).
    pub unfinished: Option<(String, Duration)>,
}

/// Carries out `plan`. Before each member, every voter's status is read again and the gate
/// checked: a member that stopped serving ends the run (the next pass plans again).
pub async fn run(
    etcd: &Etcd<'_>,
    members: &[Member],
    plan: Plan,
    rules: &Rules,
    endpoint: Endpoint<'_>,
) -> Done {
    let mut done = Done::default();
    let (order, recover) = match plan {
        Plan::Idle | Plan::Wait(_) => return done,
        Plan::Defragment(order) => (order, None),
        Plan::Recover { revision, order } => (order, Some(revision)),
    };
    let Some(first) = order.first().map(|t| t.endpoint.clone()) else {
        return done;
    };
    let read = async || {
        let asks = members.iter().filter_map(|m| {
            let url = endpoint(m)?;
            Some(async move { (m.id, etcd.status(&url).await) })
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .filter_map(|(id, s)| Some((id, s.ok()?)))
            .collect::<BTreeMap<u64, MemberStatus>>()
    };
    let mut fresh_compaction = false;
    if let Some(revision) = recover {
        let leader = order
            .iter()
            .find(|t| t.leader)
            .map_or(first.as_str(), |t| t.endpoint.as_str());
        let largest = order.iter().map(|t| t.db_size).max().unwrap_or_default();
        // Long waits on etcd leave the pass's turn to other clusters (`turns::outside`).
        match crate::controller::machinery::turns::outside(etcd.compact(
            leader,
            revision,
            crate::api::defrag_time(largest),
        ))
        .await
        {
            Ok(fresh) => fresh_compaction = fresh,
            Err(e) => {
                done.failed = Some(e);
                return done;
            }
        }
        done.compacted = Some(revision);
    }
    // A recovery whose compaction freed history defragments every member: right after it, a
    // member's in-use size still counts the pages it freed (bbolt frees them only as later
    // transactions commit, and NOSPACE stops the writes), so the sizes cannot tell which have
    // space to give back. A repeat that compacted nothing new (a cluster that stays over its
    // quota) defragments only members that show free space: a no-op compaction per pass, not
    // a defragmentation.
    let order: Vec<Target> = match recover {
        None => order,
        Some(_) if fresh_compaction => order,
        Some(_) => {
            let health = read().await;
            order
                .into_iter()
                .filter(|t| {
                    health.get(&t.id).is_some_and(|s| {
                        s.db_size.saturating_sub(s.db_size_in_use) >= rules.min_free
                    })
                })
                .collect()
        }
    };
    for target in &order {
        let health = read().await;
        if let Some(why) = gate(members, &health, None) {
            done.stopped = Some(why);
            return done;
        }
        let before = health.get(&target.id).map_or(0, |s| s.db_size);
        let in_use = health.get(&target.id).map_or(before, |s| s.db_size_in_use);
        let within = crate::api::defrag_time(in_use.max(before / 2));
        let started = Instant::now();
        if let Err(e) =
            crate::controller::machinery::turns::outside(etcd.defragment(&target.endpoint, within))
                .await
        {
            if matches!(e, EtcdError::Unreachable { .. }) {
                // etcd goes on with it without us: nothing else starts until it may be done.
                done.unfinished = Some((target.name.clone(), within));
            }
            done.failed = Some(e);
            return done;
        }
        let took = started.elapsed();
        let after = etcd
            .status(&target.endpoint)
            .await
            .map_or(before, |s| s.db_size);
        done.defragmented.push(Defragmented {
            name: target.name.clone(),
            took,
            before,
            after,
        });
    }
    if recover.is_none() {
        return done;
    }
    if let Err(in_use) = may_disarm(read().await.values(), rules.quota) {
        done.quota_exceeded = Some(in_use);
        return done;
    }
    let alarms = match etcd.alarms(&first).await {
        Ok(a) => a,
        Err(e) => {
            done.failed = Some(e);
            return done;
        }
    };
    for (member, name) in alarms.iter().filter(|(_, n)| n == NOSPACE) {
        if let Err(e) = etcd.disarm(&first, *member, name).await {
            done.failed = Some(e);
            return done;
        }
    }
    done.disarmed = true;
    done
}

/// The states `etcd_webhook_cluster_members` counts members in.
pub const MEMBER_STATES: &[&str] = &["leader", "follower", "learner", "unhealthy"];

/// The per-cluster and per-member gauges from what the membership pass read.
fn export(
    ec: &crate::api::v1::EtcdCluster,
    ctx: &crate::controller::Context,
    view: &crate::controller::decide::status::EtcdView,
) {
    use kube::ResourceExt;
    let (namespace, name) = (ec.namespace().unwrap_or_default(), ec.name_any());
    let mut counts: BTreeMap<&str, i64> = MEMBER_STATES.iter().map(|s| (*s, 0)).collect();
    for m in &view.members {
        let status = view.health.get(&m.id);
        let state = match status {
            Some(s) if s.serving() && m.is_learner => "learner",
            Some(s) if s.serving() && s.leader == m.id => "leader",
            Some(s) if s.serving() => "follower",
            _ => "unhealthy",
        };
        *counts.entry(state).or_default() += 1;
        if let Some(s) = status.filter(|_| m.started()) {
            let labels = crate::metrics::MemberLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                member: m.name.clone(),
            };
            let gauge = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            ctx.metrics
                .member_db_size
                .get_or_create(&labels)
                .set(gauge(s.db_size));
            ctx.metrics
                .member_db_size_in_use
                .get_or_create(&labels)
                .set(gauge(s.db_size_in_use));
        }
    }
    for (state, n) in counts {
        ctx.metrics
            .cluster_members
            .get_or_create(&crate::metrics::MemberStateLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                state: state.to_owned(),
            })
            .set(n);
    }
}

/// The loop's upkeep of one cluster after its membership pass: plans from what that pass read
/// (nothing at all when it read nothing or made a membership call), runs the plan, and says
/// what happened in Events, metrics and the `Degraded` condition. Never fails the reconcile:
/// an error is a Warning Event, and the next pass plans again.
pub(crate) async fn tend(
    ec: &crate::api::v1::EtcdCluster,
    kids: &crate::controller::machinery::children::Children<'_>,
    seen: &mut crate::controller::decide::status::Observation,
) {
    // Taken out while the upkeep reads it and records its defragmentations, then put back for
    // the status.
    if let Some(mut view) = seen.etcd.take() {
        tend_view(ec, kids, seen, &mut view).await;
        seen.etcd = Some(view);
    }
}

async fn tend_view(
    ec: &crate::api::v1::EtcdCluster,
    kids: &crate::controller::machinery::children::Children<'_>,
    seen: &mut crate::controller::decide::status::Observation,
    view: &mut crate::controller::decide::status::EtcdView,
) {
    use kube::ResourceExt;
    use kube::runtime::events::EventType;

    use crate::controller::decide::status::{Space, has_condition};

    let ctx = kids.ctx;
    export(ec, ctx, view);
    if !view.steady {
        return;
    }
    let mut rules = Rules::of(&ec.spec);
    // The quota the members run with: a kept one (render::keep_running_quota) is above the rule.
    if let Ok(Some(set)) = kids
        .read::<k8s_openapi::api::apps::v1::StatefulSet>(&ec.name_any())
        .await
        && let Some(q) =
            crate::controller::render::template_quota(&set).and_then(|q| u64::try_from(q).ok())
    {
        rules.quota = q;
    }
    let endpoints = crate::controller::render::endpoints(ec, ec.spec.size);
    let endpoint = |m: &Member| {
        crate::controller::decide::membership::client_url(ec, &endpoints, m).map(str::to_owned)
    };
    let key = crate::controller::key(ec);
    let unfinished = {
        let mut records = ctx.defragmenting.lock().expect("not poisoned");
        match records.get(&key) {
            Some((member, until)) if Instant::now() < *until => Some(format!(
                "a defragmentation of {member} that gave no answer in time (etcd may go on with it for {} more)",
                humantime::format_duration(Duration::from_secs(
                    until.saturating_duration_since(Instant::now()).as_secs()
                ))
            )),
            Some(_) => {
                records.remove(&key);
                None
            }
            None => None,
        }
    };
    let busy = seen.activity.map(|a| a.reason().to_owned()).or(unfinished);
    let busy = busy.as_deref();
    let nospace = view.health.values().any(|s| s.alarm(NOSPACE));
    let labels = crate::controller::pass::backup::labels(ec);
    ctx.metrics
        .nospace_alarm
        .get_or_create(&labels)
        .set(i64::from(nospace));
    let planned = plan(&view.members, &view.health, &rules, busy, &endpoint);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
    if let Plan::Wait(why) = &planned {
        tracing::info!(cluster = %ec.name_any(), %why, "upkeep waits");
        if nospace {
            seen.space = Some(Space::NoSpace(format!(
                "etcd raised the NOSPACE alarm (quota {} bytes) and refuses writes; the recovery waits: {why}",
                rules.quota
            )));
            seen.settle = true;
        }
        return;
    }
    if planned == Plan::Idle {
        seen.space = Some(Space::Ok);
        return;
    }
    let transport = match ctx.etcd_for(ec).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(cluster = %ec.name_any(), error = %e, "upkeep waits");
            return;
        }
    };
    let etcd = Etcd {
        transport: transport.as_ref(),
        endpoints: endpoints.clone(),
    };
    let done = run(&etcd, &view.members, planned, &rules, &endpoint).await;
    if let Some((member, within)) = &done.unfinished {
        tracing::warn!(cluster = %ec.name_any(), %member, within = ?within, "a defragmentation gave no answer in time; no other maintenance starts while etcd may go on with it");
        ctx.defragmenting
            .lock()
            .expect("not poisoned")
            .insert(key, (member.clone(), Instant::now() + *within));
    }
    view.defragmented = done.defragmented.iter().map(|d| d.name.clone()).collect();
    for d in &done.defragmented {
        ctx.metrics.defragmentations.get_or_create(&labels).inc();
        ctx.metrics
            .defragmentation_freed_bytes
            .get_or_create(&labels)
            .inc_by(d.freed());
        ctx.metrics
            .defragmentation_seconds
            .get_or_create(&labels)
            .inc_by(d.took.as_secs_f64());
        ctx.event(
            ec,
            EventType::Normal,
            "Defragmented",
            format!(
                "{}: {} given back in {:.2} s (database {} -> {})",
                d.name,
                mib(d.freed()),
                d.took.as_secs_f64(),
                mib(d.before),
                mib(d.after)
            ),
        )
        .await;
    }
    if let Some(e) = &done.failed {
        ctx.event(
            ec,
            EventType::Warning,
            "MaintenanceFailed",
            format!("{e}; the next pass plans again"),
        )
        .await;
    }
    seen.space = Some(match (nospace, &done) {
        (false, _) => Space::Ok,
        (true, Done { disarmed: true, .. }) => {
            ctx.metrics.nospace_alarm.get_or_create(&labels).set(0);
            ctx.event(
                ec,
                EventType::Normal,
                "NoSpaceRecovered",
                format!(
                    "compacted below revision {}, defragmented {} members, NOSPACE disarmed: writes are taken again",
                    done.compacted.unwrap_or(0),
                    done.defragmented.len()
                ),
            )
            .await;
            Space::Ok
        }
        (
            true,
            Done {
                quota_exceeded: Some(in_use),
                ..
            },
        ) => {
            let message = format!(
                "the data needs {in_use} bytes of the {} byte quota after compaction and defragmentation: writes stay refused (reads and deletes work); grow spec.storageSize (the quota is half of it after the WAL's {} MiB, at most 8 GiB) or raise spec.maintenance.quotaBackendBytes within that",
                rules.quota,
                crate::api::WAL_BUDGET_BYTES >> 20
            );
            if !has_condition(ec, "Degraded", "QuotaExceeded") {
                ctx.event(ec, EventType::Warning, "QuotaExceeded", message.clone())
                    .await;
            }
            Space::QuotaExceeded(message)
        }
        (true, _) => {
            seen.settle = true;
            Space::NoSpace(format!(
                "etcd raised the NOSPACE alarm (quota {} bytes) and refuses writes; the recovery did not finish this pass: {}",
                rules.quota,
                done.stopped
                    .clone()
                    .or_else(|| done.failed.as_ref().map(ToString::to_string))
                    .unwrap_or_default()
            ))
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn member(id: u64, name: &str) -> Member {
        Member {
            id,
            name: name.to_owned(),
            peer_urls: vec![format!("http://{name}:2380")],
            client_urls: vec![format!("http://{name}:2379")],
            is_learner: false,
        }
    }

    fn status(leader: u64, size: u64, in_use: u64, errors: &[&str]) -> MemberStatus {
        MemberStatus {
            leader,
            db_size: size,
            db_size_in_use: in_use,
            errors: errors.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn url(m: &Member) -> Option<String> {
        m.client_urls.first().cloned()
    }

    const RULES: Rules = Rules {
        quota: 16 * MIB,
        threshold_percent: 50,
        min_free: MIB,
    };

    fn three() -> Vec<Member> {
        vec![member(1, "e-0"), member(2, "e-1"), member(3, "e-2")]
    }

    fn names(plan: &Plan) -> Vec<String> {
        match plan {
            Plan::Defragment(o) | Plan::Recover { order: o, .. } => {
                o.iter().map(|t| t.name.clone()).collect()
            }
            _ => vec![],
        }
    }

    #[test]
    fn a_fragmented_member_is_due_past_the_threshold_and_a_mebibyte() {
        let members = three();
        let health = |sizes: [(u64, u64); 3]| -> BTreeMap<u64, MemberStatus> {
            (1..=3)
                .map(|id| {
                    (
                        id,
                        status(2, sizes[id as usize - 1].0, sizes[id as usize - 1].1, &[]),
                    )
                })
                .collect()
        };
        // Below the threshold, or above it with less than 1 MiB to give back: nothing.
        let quiet = health([(10 * MIB, 6 * MIB), (MIB, MIB / 4), (8 * MIB, 8 * MIB)]);
        assert_eq!(plan(&members, &quiet, &RULES, None, &url), Plan::Idle);
        // Two due: the follower e-0, then the leader e-1 last although it frees more.
        let due = health([(10 * MIB, 4 * MIB), (20 * MIB, 2 * MIB), (8 * MIB, 7 * MIB)]);
        let p = plan(&members, &due, &RULES, None, &url);
        assert_eq!(names(&p), ["e-0", "e-1"]);
        // A threshold of 0 never defragments.
        let off = Rules {
            threshold_percent: 0,
            ..RULES
        };
        assert_eq!(plan(&members, &due, &off, None, &url), Plan::Idle);
    }

    #[test]
    fn nothing_starts_during_a_change_with_a_voter_down_or_a_learner() {
        let members = three();
        let due: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(2, 10 * MIB, MIB, &[])))
            .collect();
        let wait = |p: Plan| match p {
            Plan::Wait(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(
            wait(plan(&members, &due, &RULES, Some("an upgrade"), &url)).contains("an upgrade")
        );
        let mut down = due.clone();
        down.remove(&3);
        assert_eq!(
            wait(plan(&members, &down, &RULES, None, &url)),
            "voter e-2 does not serve"
        );
        let mut leaderless = due.clone();
        leaderless.insert(3, status(0, 10 * MIB, MIB, &[]));
        assert!(matches!(
            plan(&members, &leaderless, &RULES, None, &url),
            Plan::Wait(_)
        ));
        let mut with_learner = members.clone();
        with_learner[2].is_learner = true;
        assert!(
            wait(plan(&with_learner, &due, &RULES, None, &url))
                .contains("e-2 is not a started voter")
        );
    }

    /// Members that answer their status (leader 3, half their database free) and never answer
    /// a defragmentation within the time given: each call is recorded with that time.
    struct SlowDefrag(std::sync::Mutex<Vec<(String, Duration)>>);

    impl crate::controller::etcd::Transport for SlowDefrag {
        fn post<'a>(
            &'a self,
            endpoint: &'a str,
            path: &'a str,
            body: serde_json::Value,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<serde_json::Value, EtcdError>> + Send + 'a>,
        > {
            self.post_within(endpoint, path, body, Duration::from_secs(5))
        }

        fn post_within<'a>(
            &'a self,
            endpoint: &'a str,
            path: &'a str,
            _body: serde_json::Value,
            within: Duration,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<serde_json::Value, EtcdError>> + Send + 'a>,
        > {
            Box::pin(async move {
                match path {
                    "maintenance/status" => Ok(serde_json::json!({
                        "leader": "3", "dbSize": (2048 * MIB).to_string(),
                        "dbSizeInUse": (1024 * MIB).to_string(),
                    })),
                    _ => {
                        self.0.lock().unwrap().push((endpoint.to_owned(), within));
                        Err(EtcdError::Unreachable {
                            endpoint: endpoint.to_owned(),
                            reason: format!("no answer within {within:?}"),
                        })
                    }
                }
            })
        }

        fn with_identity(
            &self,
            _: &crate::controller::etcd::ClientTls,
        ) -> Result<
            std::sync::Arc<dyn crate::controller::etcd::Transport>,
            crate::controller::etcd::TlsError,
        > {
            unreachable!("plain members")
        }
    }

    /// A defragmentation is given the time its data needs (1 GiB in use: 5 s + 32 s), and one
    /// that gives no answer in that time is reported as unfinished, with that time, so no
    /// other maintenance starts while etcd may still be at it.
    #[tokio::test]
    async fn a_defragmentation_gets_the_time_its_data_needs_and_an_unanswered_one_holds() {
        let members = three();
        let transport = SlowDefrag(Default::default());
        let etcd = Etcd {
            transport: &transport,
            endpoints: members.iter().filter_map(url).collect(),
        };
        let health: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(3, 2048 * MIB, 1024 * MIB, &[])))
            .collect();
        let rules = Rules {
            quota: 4096 * MIB,
            ..RULES
        };
        let planned = plan(&members, &health, &rules, None, &url);
        let done = run(&etcd, &members, planned, &rules, &url).await;
        let want = Duration::from_secs(5 + 32);
        assert_eq!(
            *transport.0.lock().unwrap(),
            [("http://e-0:2379".to_owned(), want)],
            "one call, given the time; nothing after it"
        );
        assert_eq!(done.unfinished, Some(("e-0".to_owned(), want)));
        assert!(done.defragmented.is_empty() && done.failed.is_some());
        // The next pass, while the record stands: the gate names it and nothing is planned.
        let why = "a defragmentation of e-0 that gave no answer in time";
        assert!(matches!(
            plan(&members, &health, &rules, Some(why), &url),
            Plan::Wait(w) if w.contains(why)
        ));
    }

    /// A CORRUPT alarm is no alarm to work around: nothing is compacted or defragmented while
    /// it is raised, NOSPACE beside it or not, and the wait names the member.
    #[test]
    fn a_corrupt_alarm_stops_every_maintenance() {
        let members = three();
        let corrupt = "memberID:2 alarm:CORRUPT ";
        let mut health: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(3, 10 * MIB, MIB, &[])))
            .collect();
        health.insert(2, status(3, 10 * MIB, MIB, &[corrupt]));
        assert!(!health[&2].serving());
        let wait = |p: Plan| match p {
            Plan::Wait(why) => why,
            other => panic!("{other:?}"),
        };
        let why = wait(plan(&members, &health, &RULES, None, &url));
        assert!(why.contains("CORRUPT alarm on e-1"), "{why}");
        health.insert(
            3,
            status(3, 16 * MIB, 15 * MIB, &["memberID:3 alarm:NOSPACE "]),
        );
        assert!(health[&3].serving(), "NOSPACE alone still serves");
        let why = wait(plan(&members, &health, &RULES, None, &url));
        assert!(why.contains("CORRUPT"), "{why}");
    }

    #[test]
    fn nospace_recovers_every_member_leader_last_and_disarms_only_with_room() {
        let members = three();
        let alarm = "memberID:1 alarm:NOSPACE ";
        let mut health: BTreeMap<u64, MemberStatus> = (1..=3)
            .map(|id| (id, status(3, 16 * MIB, 15 * MIB, &[alarm])))
            .collect();
        for (id, s) in health.iter_mut() {
            s.header.revision = 100 + id;
        }
        // The alarm makes no member unhealthy for the upkeep, and even a threshold of 0 recovers.
        let off = Rules {
            threshold_percent: 0,
            ..RULES
        };
        match plan(&members, &health, &off, None, &url) {
            Plan::Recover { revision, order } => {
                assert_eq!(revision, 101);
                let names: Vec<&str> = order.iter().map(|t| t.name.as_str()).collect();
                assert_eq!(names, ["e-0", "e-1", "e-2"]);
                assert!(order[2].leader);
            }
            other => panic!("{other:?}"),
        }
        // Disarmed only when the data leaves 5% of the quota free.
        let s = |in_use| vec![status(3, in_use, in_use, &[])];
        assert_eq!(may_disarm(&s(4 * MIB), 16 * MIB), Ok(()));
        assert_eq!(
            may_disarm(&s(16 * MIB - MIB / 2), 16 * MIB),
            Err(16 * MIB - MIB / 2)
        );
    }
}
