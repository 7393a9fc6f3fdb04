//! The upkeep's calls: carries out a [`Plan`] of `decide::maintenance` (compaction,
//! defragmentations one member at a time with every gate checked again before each, the
//! disarm). `pass::maintenance` runs it outside the pass's turn: its calls wait on etcd for
//! seconds to minutes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::calls::Etcd;
use super::error::EtcdError;
use crate::controller::decide::maintenance::{
    Endpoint, NOSPACE, Plan, Rules, Target, gate, may_disarm,
};
use crate::controller::decide::members::{Member, MemberStatus};

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
        match etcd
            .compact(leader, revision, crate::api::defrag_time(largest))
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
        if let Err(e) = etcd.defragment(&target.endpoint, within).await {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::maintenance::plan;
    use crate::controller::decide::maintenance::tests::{MIB, RULES, status, three, url};

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
}
