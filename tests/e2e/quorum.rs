//! A lost quorum through the real apiserver (issue 47, scenario 2): two of three members' nodes
//! go, with their local volumes, and the loop brings the cluster back from the one left, with
//! what a user reads on the way (the `Available` condition, the Warning, the members'
//! ConfigMap). The same harness as the membership scenario (members.rs: the real StatefulSet
//! and PVC-protection controllers, real etcd v3.7.4 members, the kubelet played by its rules);
//! the steps each stage of the recovery takes on real etcd alone are in tests/members.rs.
//!
//! In the order it happens to a user: the two nodes stop (the members' processes stop, their
//! pods show not ready), the loop finds no leader and fences the members' ConfigMap; the nodes
//! come back with their disks empty (the claims' folders wiped, the pods kept), their members
//! stop at the fence; the loop sees the survivor alone with data and the others known empty,
//! lifts the fence, and they rejoin from it under their old IDs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_webhook::controller::Settings;
use etcd_webhook::controller::render::{FENCED_FROM_ANNOTATION, FENCED_INITIAL_CLUSTER};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, wait_for};
use crate::common::members::{Release, writer};
use crate::install::ok;
use crate::members::{
    NAME, NS, Played, cluster_json, count_events, create_cluster, is_running, patch_spec,
};

/// The namespace's Events: "TYPE REASON" -> how many.
fn event_counts(cp: &ControlPlane) -> BTreeMap<String, i64> {
    count_events(cp, |e| {
        Some(format!(
            "{} {}",
            e["type"].as_str().unwrap_or_default(),
            e["reason"].as_str().unwrap_or_default()
        ))
    })
}

/// For `secs` (several passes), `Available` has one of `reasons` whenever it is read.
fn still_says(cp: &ControlPlane, secs: u64, reasons: &[&str]) {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        let now = available(&cluster_json(cp));
        assert!(
            now.as_ref()
                .is_some_and(|(r, _)| reasons.contains(&r.as_str())),
            "{now:?}, expected one of {reasons:?}"
        );
    }
}

/// The `Available` condition's reason and message, if the status has one.
fn available(ec: &Value) -> Option<(String, String)> {
    ec["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

pub fn quorum_loss_through_the_apiserver_rejoins_the_survivor(cp: ControlPlane) {
    let played = Played::start(&cp, 3, Release::V3_7_4, Settings::default());
    create_cluster(&cp, 3, "v3.7.4", Duration::from_secs(120));
    // The default, Automatic: member 0 is left.
    lose_two_and_recover(&cp, &played, 0, false);
    // The same cluster with Manual recovery, member 1 left this time: nothing changes until
    // the approval, given with the command the condition prints.
    patch_spec(
        &cp,
        json!({"recovery": {"quorumLoss": "Manual"}}),
        "recovery Manual",
    );
    lose_two_and_recover(&cp, &played, 1, true);
    played.finish(&cp);
}

/// Writes through `survivor`, then the other two members' nodes go (the loop finds no leader
/// and fences) and come back with empty disks; the cluster is back with 3 voters, every
/// acknowledged write on every member, and no membership call. With `manual`, the loop waits
/// for the approval of the plan it names, which is given as the condition says.
fn lose_two_and_recover(cp: &ControlPlane, played: &Played, survivor: usize, manual: bool) {
    let (net, rt) = (&played.net, &played.rt);
    let configs: Api<ConfigMap> = Api::namespaced(played.kube.clone(), NS);
    let members_config = || {
        rt.block_on(configs.get(&format!("{NAME}-members")))
            .unwrap()
    };
    let unfenced = members_config().data.unwrap()["ETCD_INITIAL_CLUSTER"].clone();
    let others: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();

    // Acknowledged writes through the member that will be left.
    let (ns, addr) = {
        let n = net.lock().unwrap();
        (n.pods[survivor].ns.clone(), n.pods[survivor].addr.clone())
    };
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(ns, addr, writing.clone());
    std::thread::sleep(Duration::from_secs(3));
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "writes failed before the loss");
    assert!(keys.len() > 20, "the writer wrote ({})", keys.len());
    let events_before = event_counts(cp);

    // The other two members' nodes go: no leader, and the loop fences.
    let lost_at = Instant::now();
    played
        .blocked
        .lock()
        .unwrap()
        .extend(others.iter().copied());
    let (reason, message) = wait_for(
        "the status says the quorum is lost",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(500));
            // The pass whose member list still answered says QuorumLost too ("1 of 3 voters
            // healthy, below the quorum"); the diagnosis is the pass after, with no list.
            available(&cluster_json(cp))
                .filter(|(r, m)| r == "QuorumLost" && m.contains("members answer"))
        },
    );
    let lost_said = lost_at.elapsed().as_secs_f64();
    assert!(
        message.contains(&format!(
            "1 of 3 members answer ({NAME}-{survivor} (applied index"
        )) && message.contains("nothing says their data is gone"),
        "{reason}: {message}"
    );
    let fenced = wait_for(
        "the members' ConfigMap fenced",
        Duration::from_secs(30),
        || {
            std::thread::sleep(Duration::from_millis(300));
            let config = members_config();
            (config.data.as_ref()?.get("ETCD_INITIAL_CLUSTER")? == FENCED_INITIAL_CLUSTER)
                .then_some(config)
        },
    );
    assert_eq!(
        fenced.metadata.annotations.unwrap()[FENCED_FROM_ANNOTATION],
        unfenced,
        "the list it had is kept aside"
    );
    assert!(
        !net.lock().unwrap().put(survivor, "/refused", "x"),
        "a write without a quorum"
    );
    // Several passes with the pods merely down change nothing: the loop waits for them.
    still_says(cp, 12, &["QuorumLost"]);

    // They come back on empty disks: the played node wipes the claims' folders.
    {
        let n = net.lock().unwrap();
        for &i in &others {
            std::fs::remove_dir_all(n.pods[i].data.join("data")).unwrap();
        }
    }
    let back_at = Instant::now();
    played.blocked.lock().unwrap().clear();
    let mut said: Vec<String> = vec![reason];
    let mut approval = None;
    if manual {
        let (_, message) = wait_for(
            "the status asks for an approval",
            Duration::from_secs(60),
            || {
                std::thread::sleep(Duration::from_millis(500));
                available(&cluster_json(cp)).filter(|(r, _)| r == "RecoveryAwaitingApproval")
            },
        );
        said.push("RecoveryAwaitingApproval".to_owned());
        assert!(
            message.contains(&format!("{NAME}-{survivor} is the only member with data")),
            "{message}"
        );
        // Nothing changes while it waits: still fenced, no rejoin, no write taken. (A pass that
        // reads a fenced pod between two of its restarts says QuorumLost instead: a running
        // container's last exit is not read, so that member is not known empty for that pass.)
        still_says(cp, 12, &["RecoveryAwaitingApproval", "QuorumLost"]);
        assert_eq!(
            members_config().data.unwrap()["ETCD_INITIAL_CLUSTER"],
            FENCED_INITIAL_CLUSTER,
            "fenced until approved"
        );
        assert!(
            !net.lock().unwrap().put(survivor, "/refused", "x"),
            "a write before the approval"
        );
        // The approval, as the condition says to give it.
        let command = message
            .split_once("Approve with: kubectl ")
            .and_then(|(_, c)| c.split_once("--overwrite").map(|(c, _)| c))
            .unwrap_or_else(|| panic!("no approval command in {message}"));
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--overwrite");
        ok(cp.kubectl_output(&args, None), "the approval");
        approval = Some(command.trim().to_owned());
    }
    let approved_at = Instant::now();
    let mut rejoin_message = String::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let ec = cluster_json(cp);
        if let Some((r, m)) = available(&ec) {
            if r == "RejoiningFromSurvivor" {
                rejoin_message = m;
            }
            if said.last() != Some(&r) {
                said.push(r);
            }
        }
        if is_running(&ec, 3) {
            break;
        }
        if Instant::now() > deadline {
            let pods = cp.kubectl_output(
                &["-n", NS, "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].state} last {.status.containerStatuses[0].lastState}{\"\\n\"}{end}"],
                None,
            );
            panic!(
                "not Running 180 s after the nodes came back: the status said {said:?}; now {}\npods:\n{}\nmembers:\n{}",
                ec["status"],
                String::from_utf8_lossy(&pods.stdout),
                net.lock().unwrap().logs()
            );
        }
    }
    let healed = back_at.elapsed().as_secs_f64();
    let after_approval = approved_at.elapsed().as_secs_f64();
    assert!(
        said.iter().any(|r| r == "RejoiningFromSurvivor"),
        "the status said the rejoin: {said:?}"
    );
    assert!(
        rejoin_message.contains(&format!("{NAME}-{survivor}")),
        "the rejoin names the survivor: {rejoin_message}"
    );
    let events = event_counts(cp);
    let warned = |reason: &str| {
        events
            .get(&format!("Warning {reason}"))
            .copied()
            .unwrap_or(0)
            - events_before
                .get(&format!("Warning {reason}"))
                .copied()
                .unwrap_or(0)
    };
    assert_eq!(
        warned("RejoiningFromSurvivor"),
        1,
        "one Warning RejoiningFromSurvivor: {events:?}"
    );
    if manual {
        assert_eq!(
            warned("RecoveryAwaitingApproval"),
            1,
            "one Warning RecoveryAwaitingApproval: {events:?}"
        );
    }
    // No membership call: the empty members rejoined under their old IDs.
    for reason in [
        "AddedLearner",
        "PromotedMember",
        "MemberVolumeLost",
        "MemberVolumeStale",
        "MemberVolumeReplaced",
        "MemberNeverStarted",
    ] {
        let n = |counts: &BTreeMap<String, i64>| {
            counts
                .iter()
                .filter(|(k, _)| k.ends_with(&format!(" {reason}")))
                .map(|(_, n)| n)
                .sum::<i64>()
        };
        assert_eq!(
            n(&events),
            n(&events_before),
            "{reason} during the recovery: {events:?}"
        );
    }
    assert_eq!(
        members_config().data.unwrap()["ETCD_INITIAL_CLUSTER"],
        unfenced,
        "the fence lifted"
    );
    {
        let n = net.lock().unwrap();
        for key in &keys {
            for i in 0..3 {
                assert_eq!(
                    n.get(i, key).as_deref(),
                    Some(key.trim_start_matches("/w/")),
                    "{key} through member {i} after the recovery"
                );
            }
        }
        assert!(
            n.put(others[0], "/after", "x"),
            "a write after the recovery"
        );
    }
    let how = match &approval {
        Some(command) => format!(
            "approved with `kubectl {command} --overwrite`, Running {after_approval:.1} s after the approval"
        ),
        None => "Automatic".to_owned(),
    };
    eprintln!(
        "    2 of 3 members' nodes gone, {NAME}-{survivor} left: QuorumLost said {lost_said:.1} s after, fenced, no write taken; back on empty disks: {said:?}, Running with 3 voters {healed:.1} s after ({how}), all {} acknowledged writes on every member, no membership call",
        keys.len()
    );
}
