//! A lost quorum through the real apiserver (issue 47, scenario 2, under Manual recovery): two
//! of three members' nodes go, with their local volumes, and the loop brings the cluster back
//! from the one left once its plan is approved, with what a user reads on the way (the
//! `Available` condition, the Warnings, the approval command, the members' ConfigMap). The
//! same scenario under the default, Automatic, runs on real pods (case_study.rs). The same
//! harness as the membership scenario (members.rs: the real StatefulSet and PVC-protection
//! controllers, real etcd v3.7.4 members, the kubelet played by its rules);
//! the steps each stage of the recovery takes on real etcd alone are in tests/members.rs.
//!
//! In the order it happens to a user: the two nodes stop (the members' processes stop, their
//! pods show not ready), the loop finds no leader and fences the members' ConfigMap; the nodes
//! come back with their disks empty (the claims' folders wiped, the pods kept), their members
//! stop at the fence; the loop sees the survivor alone with data and the others known empty,
//! asks for the approval, and once given lifts the fence, and they rejoin from it under their
//! old IDs. Then scenario 3 on the same cluster: a survivor behind the newest backup, and the
//! cluster restored in place from it
//! (Jobs' pods played by the node: see [`Played::play_job`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_webhook::controller::Settings;
use etcd_webhook::controller::render::{
    FENCED_FROM_ANNOTATION, FENCED_INITIAL_CLUSTER, FENCED_RESTARTS_ANNOTATION,
};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
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

/// A writer through member `i` for 3 s: the keys it wrote, every one acknowledged (`when`
/// says when, for a failure).
fn three_seconds_of_writes(played: &Played, i: usize, when: &str) -> Vec<String> {
    let (ns, addr) = {
        let n = played.net.lock().unwrap();
        (n.pods[i].ns.clone(), n.pods[i].addr.clone())
    };
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(ns, addr, writing.clone());
    std::thread::sleep(Duration::from_secs(3));
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "writes failed {when}");
    assert!(keys.len() > 20, "the writer wrote ({})", keys.len());
    keys
}

/// Every key with its value (`/w/k` holds `k`) through each of the three members.
fn every_key_on_every_member(played: &Played, keys: &[String], when: &str) {
    let n = played.net.lock().unwrap();
    for key in keys {
        for i in 0..3 {
            assert_eq!(
                n.get(i, key).as_deref(),
                Some(key.trim_start_matches("/w/")),
                "{key} through member {i} {when}"
            );
        }
    }
}

pub fn quorum_loss_through_the_apiserver_rejoins_the_survivor(cp: ControlPlane) {
    let played = Played::start(&cp, 3, Release::V3_7_4, Settings::default());
    create_cluster(&cp, 3, "v3.7.4", Duration::from_secs(120));
    // Manual recovery, member 1 left: nothing changes until the approval, given with the
    // command the condition prints. (The default, Automatic, runs on real pods:
    // case_study.rs, `quorum_lost_with_two_volumes`.)
    patch_spec(
        &cp,
        json!({"recovery": {"quorumLoss": "Manual"}}),
        "recovery Manual",
    );
    lose_two_and_approve_the_rejoin(&cp, &played, 1);
    // Back to Automatic, with backups on: member 2 falls behind the newest backup, then the
    // other two lose their volumes; the cluster is restored in place from the backup.
    restore_in_place_behind_the_newest_backup(&cp, &played, 2);
    played.finish(&cp);
}

/// Writes through `survivor`, then the other two members' nodes go (the loop finds no leader
/// and fences) and come back with empty disks; under Manual recovery the loop waits for the
/// approval of the plan it names, which is given as the condition says; then the cluster is
/// back with 3 voters, every acknowledged write on every member, and no membership call.
fn lose_two_and_approve_the_rejoin(cp: &ControlPlane, played: &Played, survivor: usize) {
    let (net, rt) = (&played.net, &played.rt);
    let configs: Api<ConfigMap> = Api::namespaced(played.kube.clone(), NS);
    let members_config = || {
        rt.block_on(configs.get(&format!("{NAME}-members")))
            .unwrap()
    };
    let unfenced = members_config().data.unwrap()["ETCD_INITIAL_CLUSTER"].clone();
    let others: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();

    // Acknowledged writes through the member that will be left.
    let keys = three_seconds_of_writes(played, survivor, "before the loss");
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
    let fence = fenced.metadata.annotations.unwrap();
    assert_eq!(
        fence[FENCED_FROM_ANNOTATION], unfenced,
        "the list it had is kept aside"
    );
    assert!(
        fence.contains_key(FENCED_RESTARTS_ANNOTATION),
        "the members' restart counts recorded: {fence:?}"
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
    let approval = {
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
        // Nothing changes while it waits: still fenced, no rejoin, no write taken; a pass that
        // reads a fenced pod between two of its restarts knows it empty still (two restarts
        // past the count recorded at the fence, its last run refused on an empty volume).
        still_says(cp, 12, &["RecoveryAwaitingApproval"]);
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
        command.trim().to_owned()
    };
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
    assert_eq!(
        warned("RecoveryAwaitingApproval"),
        1,
        "one Warning RecoveryAwaitingApproval: {events:?}"
    );
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
    every_key_on_every_member(played, &keys, "after the recovery");
    {
        let n = net.lock().unwrap();
        assert!(
            n.put(others[0], "/after", "x"),
            "a write after the recovery"
        );
    }
    eprintln!(
        "    2 of 3 members' nodes gone, {NAME}-{survivor} left: QuorumLost said {lost_said:.1} s after, fenced, no write taken; back on empty disks: {said:?}, Running with 3 voters {healed:.1} s after (approved with `kubectl {approval} --overwrite`, Running {after_approval:.1} s after the approval), all {} acknowledged writes on every member, no membership call",
        keys.len()
    );
}

/// Scenario 3 through the apiserver: `survivor` is cut from its peers while the other two take
/// writes, the scheduled backup (a Job made from the CronJob, as `kubectl create job --from`
/// does, its pod played by the node) files a snapshot with all of them on the backup claim, and
/// its verification is given as passed (the verification Job runs a sidecar etcd the played
/// node does not; it runs on real etcd in tests/backups.rs). Then the other two members' nodes
/// go and come back with empty disks: the loop says RestoringFromSnapshot, copies the
/// survivor's data (its rescue Job's pod played), asks for the restore in place, clears the
/// StatefulSet, pods, claims and members' ConfigMap through the real garbage collector and
/// PVC protection, and restores every member from the snapshot by restore Jobs (their pods
/// played: the fetch from the claim with its SHA-256 checked, etcdutl, the placement); the
/// StatefulSet controller makes the members again, Running with every acknowledged write.
fn restore_in_place_behind_the_newest_backup(cp: &ControlPlane, played: &Played, survivor: usize) {
    let (net, rt) = (&played.net, &played.rt);
    let others: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();
    assert_ne!(
        survivor, 0,
        "the client Service resolves to member 0, which must stay with the majority"
    );
    patch_spec(
        cp,
        json!({"recovery": {"quorumLoss": "Automatic"},
            "backup": {"enabled": true, "schedule": "0 0 1 1 *", "retention": 7}}),
        "Automatic recovery, backups on",
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(played.kube.clone(), NS);
    let backup_claim = wait_for("the backup claim", Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(300));
        rt.block_on(claims.get_opt(&format!("{NAME}-backup")))
            .ok()
            .flatten()
    });
    let backups = played.claims_dir.join(backup_claim.uid().unwrap());
    wait_for("the backup CronJob", Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(300));
        cp.kubectl_output(
            &["-n", NS, "get", "cronjob", &format!("{NAME}-backup")],
            None,
        )
        .status
        .success()
        .then_some(())
    });
    let ec = cluster_json(cp);
    let cluster_id = ec["metadata"]["annotations"]["etcd.example.com/cluster-id"].clone();

    // The survivor falls behind: its peer port cut both ways while the other two take writes.
    let survivor_ns = net.lock().unwrap().pods[survivor].ns.clone();
    let cut = |op: &str| crate::common::members::cut_peers(&survivor_ns, op);
    cut("-A");
    // Should the survivor have led, the other two elect a leader of their own first.
    wait_for(
        "a write through the majority",
        Duration::from_secs(30),
        || {
            net.lock()
                .unwrap()
                .put(others[0], "/majority", "x")
                .then_some(())
        },
    );
    let keys = three_seconds_of_writes(played, others[0], "with the survivor cut");
    let events_before = event_counts(cp);

    // The scheduled backup, run now: its pod files the snapshot on the backup claim.
    ok(
        cp.kubectl_output(
            &[
                "-n",
                NS,
                "create",
                "job",
                &format!("{NAME}-backup-now"),
                &format!("--from=cronjob/{NAME}-backup"),
            ],
            None,
        ),
        "a backup Job from the CronJob",
    );
    let (filed, report) = played.play_job(&format!("{NAME}-backup-now"), Duration::from_secs(60));
    assert!(filed, "the backup: {report}");
    let last = wait_for("status.backup.last", Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let ec = cluster_json(cp);
        let last = ec["status"]["backup"]["last"].clone();
        last["uri"]
            .as_str()?
            .starts_with(&format!("pvc://{NAME}-backup/"))
            .then_some(last)
    });
    let uri = last["uri"].as_str().unwrap().to_owned();
    // Its verification, given as passed (kept by every pass from then on).
    let verified = json!({"status": {"backup": {"lastVerified": {
        "time": last["time"], "uri": uri, "outcome": "Verified",
        "message": "given by the test: the verification Job runs on real etcd in tests/backups.rs"}}}});
    let clusters: Api<etcd_webhook::api::v1::EtcdCluster> =
        Api::namespaced(played.kube.clone(), NS);
    wait_for("the verification kept", Duration::from_secs(30), || {
        let ec = cluster_json(cp);
        if ec["status"]["backup"]["lastVerified"]["uri"] == json!(uri) {
            std::thread::sleep(Duration::from_secs(2));
            return (cluster_json(cp)["status"]["backup"]["lastVerified"]["uri"] == json!(uri))
                .then_some(());
        }
        let _ = rt.block_on(clusters.patch_status(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&verified),
        ));
        None
    });
    let snapshot_revision = last["revision"].as_i64().unwrap();

    // The other two members' nodes go: no leader, fenced; they come back with empty disks.
    let lost_at = Instant::now();
    played
        .blocked
        .lock()
        .unwrap()
        .extend(others.iter().copied());
    wait_for(
        "the members' ConfigMap fenced",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(300));
            let configs: Api<ConfigMap> = Api::namespaced(played.kube.clone(), NS);
            let config = rt.block_on(configs.get(&format!("{NAME}-members"))).ok()?;
            (config.data.as_ref()?.get("ETCD_INITIAL_CLUSTER")? == FENCED_INITIAL_CLUSTER)
                .then_some(())
        },
    );
    {
        let n = net.lock().unwrap();
        for &i in &others {
            std::fs::remove_dir_all(n.pods[i].data.join("data")).unwrap();
        }
    }
    let back_at = Instant::now();
    played.blocked.lock().unwrap().clear();

    // The loop copies the survivor first: its rescue Job's pod, played.
    let (reason, message) = wait_for("RestoringFromSnapshot", Duration::from_secs(90), || {
        std::thread::sleep(Duration::from_millis(500));
        available(&cluster_json(cp)).filter(|(r, _)| r == "RestoringFromSnapshot")
    });
    let said_at = back_at.elapsed().as_secs_f64();
    assert!(
        message.contains(&format!(
            "each member is restored from {uri} (revision {snapshot_revision}, verified;"
        )) && message.contains(&format!(
            "the data of {NAME}-{survivor} is copied to pvc://{NAME}-backup/ first"
        )),
        "{reason}: {message}"
    );
    let (copied, report) = played.play_job(
        &format!("{NAME}-rescue-{survivor}"),
        Duration::from_secs(60),
    );
    assert!(copied, "the rescue copy: {report}");
    // Then the clear and the restore: one restore Job at a time (the claim attaches to one
    // node), each played once its pod is there.
    let mut opened = false;
    for i in 0..3 {
        let job = format!("{NAME}-restore-{i}");
        let (restored, report) = played.play_job(&job, Duration::from_secs(120));
        assert!(restored, "{job}: {report}");
        if !opened {
            // The survivor's old pod is gone with the clear: its peer port opens for the
            // restored members.
            cut("-D");
            opened = true;
        }
    }
    let restored_at = back_at.elapsed().as_secs_f64();
    let ec = wait_for(
        "Running again with 3 voters",
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let ec = cluster_json(cp);
            is_running(&ec, 3).then_some(ec)
        },
    );
    let healed = back_at.elapsed().as_secs_f64();
    let restored = ec["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Restored")
        .cloned()
        .unwrap();
    assert_eq!(
        (restored["status"].as_str(), restored["message"].as_str()),
        (Some("True"), Some(format!("started from {uri}").as_str())),
        "{restored}"
    );
    assert_ne!(
        ec["metadata"]["annotations"]["etcd.example.com/cluster-id"], cluster_id,
        "a cluster ID of its own"
    );
    let events = event_counts(cp);
    let new = |key: &str| {
        events.get(key).copied().unwrap_or(0) - events_before.get(key).copied().unwrap_or(0)
    };
    // Each step told. The request and the swap are told by the pass that makes them; a pass
    // that read the cluster just before that write landed in its cache may tell it once more
    // (the write itself is the same). The diagnosis is told again when `Available` said
    // something else between (a pass that reads an empty member between two of its restarts
    // says QuorumLost while that run is less than two restarts past the count recorded at
    // the fence).
    for key in ["Warning RestoringInPlace", "Normal ClearedForRestore"] {
        assert!((1..=2).contains(&new(key)), "{key} told: {events:?}");
    }
    assert_eq!(new("Normal Restored"), 1, "one Restored: {events:?}");
    let told = new("Warning RestoringFromSnapshot");
    assert!(told >= 1, "the diagnosis told: {events:?}");
    // The survivor's data as it was is in its rescue copy on the backup claim.
    let copies: Vec<String> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.contains(&format!("-rescue-{NAME}-{survivor}-")))
        .collect();
    assert_eq!(copies.len(), 1, "the survivor's copy: {copies:?}");
    every_key_on_every_member(played, &keys, "after the restore");
    {
        let n = net.lock().unwrap();
        assert!(n.put(survivor, "/after", "x"), "a write after the restore");
    }
    eprintln!(
        "    {NAME}-{survivor} behind the newest backup (revision {snapshot_revision}), the other two lost: RestoringFromSnapshot {said_at:.1} s after they came back ({:.1} s after the loss; told {told} time(s)), copied, cleared and restored by {restored_at:.1} s, Running with 3 voters {healed:.1} s after, all {} writes acknowledged before the backup on every member, a new cluster ID",
        back_at.duration_since(lost_at).as_secs_f64() + said_at,
        keys.len()
    );
}
