//! The loop's upkeep of a cluster after its membership pass: plans from what that pass read
//! (`decide::maintenance::plan`), runs the plan (`etcd::maintenance::run`), and says what
//! happened in Events, metrics and the `Degraded` condition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::controller::decide::maintenance::{NOSPACE, Plan, Rules, plan};
use crate::controller::decide::members::Member;
use crate::controller::etcd::Etcd;
use crate::controller::etcd::maintenance::{Done, run};
use crate::controller::machinery::series::{MEMBER_STATES, labels};
use crate::controller::machinery::turns::outside;

/// The per-cluster and per-member gauges from what the membership pass read.
fn export(
    ec: &crate::api::v1::EtcdCluster,
    ctx: &crate::controller::machinery::context::Context,
    view: &crate::controller::decide::observation::EtcdView,
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
    seen: &mut crate::controller::decide::observation::Observation,
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
    seen: &mut crate::controller::decide::observation::Observation,
    view: &mut crate::controller::decide::observation::EtcdView,
) {
    use kube::ResourceExt;
    use kube::runtime::events::EventType;

    use crate::controller::decide::observation::Space;
    use crate::controller::decide::status::has_condition;

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
    let key = crate::controller::machinery::context::key(ec);
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
    let labels = labels(ec);
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
    // A defragmentation or a physical compaction waits on etcd for seconds to minutes: the
    // pass leaves its turn to other clusters meanwhile (no other pass of this cluster runs:
    // kube-runtime runs one at a time).
    let done = outside(run(&etcd, &view.members, planned, &rules, &endpoint)).await;
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
