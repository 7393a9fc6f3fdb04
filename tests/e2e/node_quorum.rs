//! A lost quorum on the real node (tests/e2e/node.rs), what
//! `quorum_loss_through_the_apiserver_rejoins_the_survivor` played until issue 44 moved it here
//! (issue 47's scenarios 2 and 3 as a user sees them): the product as the two pods of its
//! Deployment, member TLS on as shipped, etcd v3.7.4 from its image.
//!
//! First under `spec.recovery.quorumLoss: Manual`: two of three members lose their node (the
//! node cordoned, their pods deleted) and then their volumes (their folders wiped) while the
//! leader is left; `Available` says `QuorumLost`, the members' ConfigMap is fenced, a write is
//! refused; with the node back, the new pods stop at the fence (the real kubelet restarting
//! them with its back-off) and the loop asks for an approval and changes nothing until it is
//! given, with the command the condition prints; then they rejoin from the one left under
//! their old member IDs. (The default, Automatic, runs in the case study.)
//!
//! Then, back on Automatic with backups on the backup claim: one member cut from its peers
//! (its peer port dropped inside its pod's network namespace) while the other two take
//! writes; the backup Job made from the CronJob (`kubectl create job --from`) files a
//! snapshot with them, the verification Job proves it; the other two lose their node and
//! volumes: the survivor is behind the newest backup, so the loop copies its data (the rescue
//! Job), clears the members and restores every one from the snapshot by restore Jobs, all of
//! them real Jobs run by the node. Running with every acknowledged write and a new cluster ID.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use etcd_webhook::controller::render::{
    FENCED_FROM_ANNOTATION, FENCED_INITIAL_CLUSTER, FENCED_RESTARTS_ANNOTATION,
};

use crate::cluster::{ControlPlane, run, wait_for};
use crate::install::ok;
use crate::node::{self, Node};
use crate::pods::{
    Env, Members, condition, is_running, local_volume, ordinal, ready, start_on_node, tear_down,
    wait_running_with,
};

const NS: &str = "quorum";
const NAME: &str = "real";
const SIZE: usize = 3;
/// The members', the backup claim's, and the three claims the restore in place makes anew.
const VOLUMES: usize = SIZE + 1 + SIZE;

pub fn quorum_loss_on_a_real_node(cp: ControlPlane) {
    let images = [
        node::etcd_image(&cp, etcd_webhook::api::defaults::VERSION),
        node::product_image(&cp),
    ];
    let (node, env) = start_on_node(cp, &images, VOLUMES, NS, &[]);
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"size": SIZE, "storageSize": "1Gi",
                 "recovery": {"quorumLoss": "Manual"}},
    });
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply the cluster, recovery Manual",
    );
    wait_running_with(&env, NAME, SIZE, Duration::from_secs(180));
    let etcd = Members::of_size(&env, NAME, SIZE);
    let mut acked = BTreeMap::new();
    for i in 0..50 {
        let (k, v) = (format!("/orders/before/{i:03}"), format!("v{i}"));
        etcd.put_any(&k, &v).expect("a write before any failure");
        acked.insert(k, v);
    }

    lose_two_and_approve_the_rejoin(&env, &node, &acked);
    restore_in_place_behind_the_newest_backup(&env, &node, &mut acked);

    tear_down(node, env);
}

/// Under Manual recovery, the leader left: the other two lose their node and their volumes;
/// the loop fences, waits for the approval of the plan it names (changing nothing for
/// several passes), and once it is given as the condition says, they rejoin under their old
/// IDs with every acknowledged write; no membership call.
fn lose_two_and_approve_the_rejoin(env: &Env, node: &Node, acked: &BTreeMap<String, String>) {
    let etcd = Members::of_size(env, NAME, SIZE);
    let survivor = ordinal(&etcd.leader().pod);
    let ids: Vec<String> = (0..SIZE)
        .map(|i| etcd.status(i).expect("every member answers").0)
        .collect();
    let unfenced = members_config(env, NAME)["data"]["ETCD_INITIAL_CLUSTER"].clone();
    let events_before = event_counts(env);

    let lost = lose_two(env, NAME, survivor);
    assert!(
        lost.message.contains("nothing says their data is gone"),
        "{}",
        lost.message
    );
    let fence = members_config(env, NAME)["metadata"]["annotations"].clone();
    assert_eq!(
        fence[FENCED_FROM_ANNOTATION], unfenced,
        "the list it had is kept aside: {fence}"
    );
    assert!(
        fence[FENCED_RESTARTS_ANNOTATION].is_string(),
        "the members' restart counts recorded: {fence}"
    );
    refused(&etcd, survivor, "a write without a quorum");
    // Several passes with the pods merely gone change nothing: the loop waits for them.
    still_says(env, 12, &["QuorumLost"]);

    let back_at = come_back_empty(env, node, &lost);
    let mut said = vec!["QuorumLost".to_owned()];
    let (_, message) = wait_for(
        "the status to ask for an approval",
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            available(env, NAME)
                .1
                .filter(|(r, _)| r == "RecoveryAwaitingApproval")
        },
    );
    said.push("RecoveryAwaitingApproval".to_owned());
    assert!(
        message.contains(&format!("{NAME}-{survivor} is the only member with data")),
        "{message}"
    );
    // Nothing changes while it waits: still fenced, no rejoin, no write taken, while the
    // kubelet restarts the empty members at the fence with its back-off.
    still_says(env, 12, &["RecoveryAwaitingApproval"]);
    assert_eq!(
        members_config(env, NAME)["data"]["ETCD_INITIAL_CLUSTER"],
        FENCED_INITIAL_CLUSTER,
        "fenced until approved"
    );
    refused(&etcd, survivor, "a write before the approval");
    let restarted: Vec<i64> = lost
        .pods
        .iter()
        .map(|p| {
            env.get_json(&["-n", NS, "pod", p])["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                .unwrap_or(0)
        })
        .collect();
    // The approval, as the condition says to give it.
    let command = message
        .split_once("Approve with: kubectl ")
        .and_then(|(_, c)| c.split_once("--overwrite").map(|(c, _)| c))
        .unwrap_or_else(|| panic!("no approval command in {message}"));
    let mut args: Vec<&str> = command.split_whitespace().collect();
    args.push("--overwrite");
    ok(env.kubectl(&args), "the approval");
    let approved_at = Instant::now();
    wait_for(
        "Running with 3 voters after the approved rejoin",
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let (ec, now) = available(env, NAME);
            if let Some((r, _)) = now
                && said.last() != Some(&r)
            {
                said.push(r);
            }
            is_running(&ec, SIZE).then_some(())
        },
    );
    let healed = back_at.elapsed().as_secs_f64();
    let after_approval = approved_at.elapsed().as_secs_f64();
    // The rejoin as told (the condition may say it between two polls only).
    let rejoin = warning_notes(env, "RejoiningFromSurvivor");
    assert!(
        rejoin
            .iter()
            .any(|m| m.contains(&format!("{NAME}-{survivor} is the only member with data"))),
        "the rejoin names the survivor: {rejoin:?}"
    );
    let events = event_counts(env);
    let new = |key: &str| {
        events.get(key).copied().unwrap_or(0) - events_before.get(key).copied().unwrap_or(0)
    };
    for warning in ["RecoveryAwaitingApproval", "RejoiningFromSurvivor"] {
        assert_eq!(
            new(&format!("Warning {warning}")),
            1,
            "one Warning {warning}: {events:?}"
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
        assert_eq!(
            new(&format!("Normal {reason}")) + new(&format!("Warning {reason}")),
            0,
            "{reason} during the recovery: {events:?}"
        );
    }
    assert_eq!(
        members_config(env, NAME)["data"]["ETCD_INITIAL_CLUSTER"],
        unfenced,
        "the fence lifted, the old list back"
    );
    let etcd = Members::of_size(env, NAME, SIZE);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            &etcd.status(i).expect("every member answers").0,
            id,
            "{NAME}-{i} rejoined under its old member ID"
        );
        etcd.assert_has_all(i, acked);
    }
    let rejoined = (0..SIZE).find(|&i| i != survivor).unwrap();
    wait_for(
        "a write through a rejoined member",
        Duration::from_secs(30),
        || etcd.put(rejoined, "/orders/after-rejoin", "x").ok(),
    );
    println!(
        "Manual: {} gone with their volumes, {NAME}-{survivor} left: QuorumLost said {:.1} s after, fenced, no write taken; back on empty volumes (restarted at the fence {restarted:?} times by the kubelet before the approval): {said:?}, Running with 3 voters {healed:.1} s after they came back, {after_approval:.1} s after `kubectl {} --overwrite`, under their old member IDs with all {} acknowledged writes; no membership call",
        lost.pods.join(" and "),
        lost.said_after,
        command.trim(),
        acked.len()
    );
}

/// Back on Automatic, backups on the backup claim: a follower cut from its peers falls behind
/// while the other two take writes and the scheduled backup (run now from the CronJob) files
/// them; the verification Job proves the snapshot; then the other two lose their node and
/// volumes. The survivor is behind the newest backup: the loop copies its data (rescue Job),
/// clears the members and restores each from the snapshot (restore Jobs); Running with every
/// acknowledged write and a cluster ID of its own.
fn restore_in_place_behind_the_newest_backup(
    env: &Env,
    node: &Node,
    acked: &mut BTreeMap<String, String>,
) {
    env.patch_cluster(
        NAME,
        &json!({"spec": {"recovery": {"quorumLoss": "Automatic"},
            "backup": {"enabled": true, "schedule": "0 0 1 1 *", "retention": 7}}})
        .to_string(),
        "Automatic recovery, backups on",
    );
    let backup_claim = format!("{NAME}-backup");
    wait_for("the backup CronJob", Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(300));
        env.cp
            .get_json_opt(&["-n", NS, "cronjob", &backup_claim])
            .map(|_| ())
    });
    let cluster_id = env.get_json(&["-n", NS, "etcdcluster", NAME])["metadata"]["annotations"]
        ["etcd.example.com/cluster-id"]
        .clone();
    let etcd = Members::of_size(env, NAME, SIZE);
    let leader = ordinal(&etcd.leader().pod);
    let survivor = (0..SIZE).find(|&i| i != leader).unwrap();
    let majority: Vec<usize> = (0..SIZE).filter(|&i| i != survivor).collect();

    // The survivor falls behind: its peer port dropped both ways inside its pod's network.
    let survivor_pod = format!("{NAME}-{survivor}");
    cut_peers(env, node, &survivor_pod);
    wait_for(
        &format!("{survivor_pod} not Ready (no leader) and out of the client Service"),
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            (!ready(&env.get_json(&["-n", NS, "pod", &survivor_pod]))).then_some(())
        },
    );
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        let (k, v) = (format!("/orders/majority/{i:04}"), format!("m{i}"));
        wait_for(
            "a write through the majority",
            Duration::from_secs(10),
            || etcd.put(majority[0], &k, &v).ok(),
        );
        acked.insert(k, v);
        i += 1;
    }
    assert!(i > 20, "the majority took writes ({i})");
    // Behind: the survivor answers (a serializable read of its own data) without them.
    etcd.reads_its_own(survivor)
        .unwrap_or_else(|e| panic!("{survivor_pod} answers a read of its own data: {e}"));
    assert!(
        etcd.missing(survivor, acked).len() >= i,
        "{survivor_pod} is behind"
    );
    let events_before = event_counts(env);

    // The scheduled backup, run now: a real Job from the CronJob files the snapshot on the
    // backup claim; the loop's verification Job proves it.
    ok(
        env.kubectl(&[
            "-n",
            NS,
            "create",
            "job",
            &format!("{NAME}-backup-now"),
            &format!("--from=cronjob/{NAME}-backup"),
        ]),
        "a backup Job from the CronJob",
    );
    let last = wait_for("status.backup.last", Duration::from_secs(120), || {
        std::thread::sleep(Duration::from_millis(500));
        let last =
            env.get_json(&["-n", NS, "etcdcluster", NAME])["status"]["backup"]["last"].clone();
        last["uri"]
            .as_str()?
            .starts_with(&format!("pvc://{backup_claim}/"))
            .then_some(last)
    });
    let uri = last["uri"].as_str().unwrap().to_owned();
    let snapshot_revision = last["revision"].as_i64().unwrap();
    let verified = wait_for(
        "the snapshot proven by a verification Job",
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let v =
                env.get_json(&["-n", NS, "etcdcluster", NAME])["status"]["backup"]["lastVerified"]
                    .clone();
            (v["uri"] == uri.as_str() && v["outcome"].is_string()).then_some(v)
        },
    );
    assert_eq!(verified["outcome"], "Verified", "{verified}");

    // The other two lose their node, then their volumes.
    let lost = lose_two(env, NAME, survivor);
    let back_at = come_back_empty(env, node, &lost);
    let (reason, message) = wait_for("RestoringFromSnapshot", Duration::from_secs(120), || {
        std::thread::sleep(Duration::from_millis(500));
        available(env, NAME)
            .1
            .filter(|(r, _)| r == "RestoringFromSnapshot")
    });
    let said_at = back_at.elapsed().as_secs_f64();
    assert!(
        message.contains(&format!(
            "each member is restored from {uri} (revision {snapshot_revision}, verified;"
        )) && message.contains(&format!(
            "the data of {survivor_pod} is copied to pvc://{backup_claim}/ first"
        )),
        "{reason}: {message}"
    );
    let ec = wait_for(
        "Running again with 3 voters, restored",
        Duration::from_secs(300),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            is_running(&ec, SIZE).then_some(ec)
        },
    );
    let healed = back_at.elapsed().as_secs_f64();
    let restored = condition(&ec, "Restored").cloned().unwrap_or(Value::Null);
    assert_eq!(
        (restored["status"].as_str(), restored["message"].as_str()),
        (Some("True"), Some(format!("started from {uri}").as_str())),
        "{restored}"
    );
    assert_ne!(
        ec["metadata"]["annotations"]["etcd.example.com/cluster-id"], cluster_id,
        "a cluster ID of its own"
    );
    let events = event_counts(env);
    let new = |key: &str| {
        events.get(key).copied().unwrap_or(0) - events_before.get(key).copied().unwrap_or(0)
    };
    // Each step told: the request and the swap by the pass that makes them, and at most once
    // more by a pass that read the cluster just before that write landed in its cache.
    for key in ["Warning RestoringInPlace", "Normal ClearedForRestore"] {
        assert!((1..=2).contains(&new(key)), "{key} told: {events:?}");
    }
    assert_eq!(new("Normal Restored"), 1, "one Restored: {events:?}");
    let told = new("Warning RestoringFromSnapshot");
    assert!(told >= 1, "the diagnosis told: {events:?}");
    // Every Job the recovery made ran on the node and succeeded.
    let jobs = env.get_json(&["-n", NS, "jobs"]);
    let mut ran: Vec<String> = Vec::new();
    for job in jobs["items"].as_array().into_iter().flatten() {
        let name = job["metadata"]["name"].as_str().unwrap_or_default();
        if name.contains("-rescue-") || name.contains("-restore-") {
            assert_eq!(job["status"]["succeeded"], 1, "{name}: {}", job["status"]);
            ran.push(name.to_owned());
        }
    }
    ran.sort();
    assert!(
        ran.contains(&format!("{NAME}-rescue-{survivor}"))
            && (0..SIZE).all(|i| ran.contains(&format!("{NAME}-restore-{i}"))),
        "the rescue copy and a restore Job per member: {ran:?}"
    );
    // The survivor's data as it was is in its rescue copy on the backup claim.
    let claim = env.get_json(&["-n", NS, "pvc", &backup_claim]);
    let copies = files_under(&node.volume_path(local_volume(&claim)))
        .into_iter()
        .filter(|f| f.contains(&format!("-rescue-{NAME}-{survivor}-")))
        .collect::<Vec<_>>();
    assert_eq!(copies.len(), 1, "the survivor's copy: {copies:?}");
    let etcd = Members::of_size(env, NAME, SIZE);
    for i in 0..SIZE {
        etcd.assert_has_all(i, acked);
    }
    wait_for(
        "a write through the former survivor after the restore",
        Duration::from_secs(30),
        || etcd.put(survivor, "/orders/after-restore", "x").ok(),
    );
    println!(
        "{survivor_pod} cut from its peers, behind the newest backup (revision {snapshot_revision}, verified), the other two lost: RestoringFromSnapshot {said_at:.1} s after they came back (told {told} time(s)); Jobs {ran:?}; Running with 3 voters {healed:.1} s after, all {} acknowledged writes on every member, a new cluster ID",
        acked.len()
    );
}

/// The two members other than `survivor` whose node went, as [`lose_two`] left them.
pub struct Lost {
    pub pods: Vec<String>,
    old_uids: Vec<Value>,
    /// Seconds from the deletes to `QuorumLost` with the diagnosis.
    pub said_after: f64,
    /// That diagnosis.
    pub message: String,
}

/// The members of the 3-member cluster `name` other than `survivor` lose their node: the node cordoned, their pods
/// deleted, so the StatefulSet's new pods wait unscheduled. Returns once `Available` says
/// `QuorumLost` naming `survivor` as the one member that answers and the members' ConfigMap is
/// fenced.
pub fn lose_two(env: &Env, name: &str, survivor: usize) -> Lost {
    let pods: Vec<String> = (0..SIZE)
        .filter(|&i| i != survivor)
        .map(|i| format!("{name}-{i}"))
        .collect();
    let old_uids: Vec<Value> = pods
        .iter()
        .map(|p| env.get_json(&["-n", env.ns, "pod", p])["metadata"]["uid"].clone())
        .collect();
    ok(env.kubectl(&["cordon", node::NODE_NAME]), "cordon the node");
    let lost_at = Instant::now();
    let mut delete = vec!["-n", env.ns, "delete", "pod", "--wait=false"];
    delete.extend(pods.iter().map(String::as_str));
    ok(env.kubectl(&delete), "delete two members' pods");
    let (_, message) = wait_for(
        "the status to say the quorum is lost",
        Duration::from_secs(90),
        || {
            std::thread::sleep(Duration::from_millis(500));
            // The pass whose member list still answered says QuorumLost too ("1 of 3 voters
            // healthy, below the quorum"); the diagnosis is the pass after, with no list.
            available(env, name)
                .1
                .filter(|(r, m)| r == "QuorumLost" && m.contains("members answer"))
        },
    );
    let said_after = lost_at.elapsed().as_secs_f64();
    assert!(
        message.contains(&format!(
            "1 of 3 members answer ({name}-{survivor} (applied index"
        )),
        "{message}"
    );
    wait_for(
        "the members' ConfigMap fenced",
        Duration::from_secs(30),
        || {
            std::thread::sleep(Duration::from_millis(300));
            (members_config(env, name)["data"]["ETCD_INITIAL_CLUSTER"] == FENCED_INITIAL_CLUSTER)
                .then_some(())
        },
    );
    Lost {
        pods,
        old_uids,
        said_after,
        message,
    }
}

/// The lost members' volumes go too (their folders wiped once their old pods, and their etcd,
/// are gone), and the node is uncordoned: their new pods start on empty volumes. Returns when.
pub fn come_back_empty(env: &Env, node: &Node, lost: &Lost) -> Instant {
    for (pod, uid) in lost.pods.iter().zip(&lost.old_uids) {
        wait_for(
            &format!("{pod}'s old pod gone"),
            Duration::from_secs(60),
            || {
                let now = env.cp.get_json_opt(&["-n", env.ns, "pod", pod]);
                now.is_none_or(|p| p["metadata"]["uid"] != *uid)
                    .then_some(())
            },
        );
        let claim = env.get_json(&["-n", env.ns, "pvc", &format!("data-{pod}")]);
        std::fs::remove_dir_all(node.volume_path(local_volume(&claim)).join("data")).unwrap();
    }
    ok(
        env.kubectl(&["uncordon", node::NODE_NAME]),
        "uncordon the node",
    );
    Instant::now()
}

/// The cluster as read now, and its `Available` condition's reason and message.
pub fn available(env: &Env, name: &str) -> (Value, Option<(String, String)>) {
    let ec = env.get_json(&["-n", env.ns, "etcdcluster", name]);
    let found = condition(&ec, "Available").map(|c| {
        (
            c["reason"].as_str().unwrap_or_default().to_owned(),
            c["message"].as_str().unwrap_or_default().to_owned(),
        )
    });
    (ec, found)
}

pub fn members_config(env: &Env, name: &str) -> Value {
    env.get_json(&["-n", env.ns, "configmap", &format!("{name}-members")])
}

/// The namespace's Events: "TYPE REASON" -> how many times (a series by its count).
pub fn event_counts(env: &Env) -> BTreeMap<String, i64> {
    let events = env.get_json(&["-n", env.ns, "events.events.k8s.io"]);
    let mut counts = BTreeMap::new();
    for e in events["items"].as_array().into_iter().flatten() {
        let key = format!(
            "{} {}",
            e["type"].as_str().unwrap_or_default(),
            e["reason"].as_str().unwrap_or_default()
        );
        *counts.entry(key).or_insert(0) += e["series"]["count"].as_i64().unwrap_or(1);
    }
    counts
}

/// The notes of the namespace's Warning Events with `reason`.
pub fn warning_notes(env: &Env, reason: &str) -> Vec<String> {
    let events = env.get_json(&["-n", env.ns, "events.events.k8s.io"]);
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "Warning" && e["reason"] == reason)
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// For `secs` (several passes), `Available` has one of `reasons` whenever it is read.
fn still_says(env: &Env, secs: u64, reasons: &[&str]) {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        let now = available(env, NAME).1;
        assert!(
            now.as_ref()
                .is_some_and(|(r, _)| reasons.contains(&r.as_str())),
            "{now:?}, expected one of {reasons:?}"
        );
    }
}

/// A write to `member` is refused while it answers a serializable read of its own data (so
/// the refusal is the lost quorum's, not an unreachable member's).
fn refused(etcd: &Members, member: usize, what: &str) {
    etcd.reads_its_own(member)
        .unwrap_or_else(|e| panic!("{what}: the member does not answer a read either: {e}"));
    assert!(etcd.put(member, "/orders/refused", "x").is_err(), "{what}");
}

/// Drops `pod`'s peer traffic (port 2380, both ways) inside its own network namespace, found
/// through its etcd container's process in the node's containerd. Its client port stays open
/// (the kubelet's probes, the loop, the rescue copy), as when a member's peer links break.
fn cut_peers(env: &Env, node: &Node, pod: &str) {
    let status = env.get_json(&["-n", env.ns, "pod", pod]);
    let container = status["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("a containerd container ID for {pod}: {}", status["status"]))
        .to_owned();
    let tasks = ok(run(node.ctr(&["tasks", "ls"]), None), "ctr tasks ls");
    let pid = tasks
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(container.as_str())).then(|| f.next().map(str::to_owned))?
        })
        .unwrap_or_else(|| panic!("{pod}'s etcd task in:\n{tasks}"));
    for chain in ["INPUT", "OUTPUT"] {
        for port in ["--dport", "--sport"] {
            let mut cmd = std::process::Command::new("nsenter");
            cmd.args(["-t", &pid, "-n", "iptables", "-A", chain, "-p", "tcp", port])
                .args(["2380", "-j", "DROP"]);
            ok(run(cmd, None), &format!("cut {pod}'s peer port"));
        }
    }
}

/// The names of the files under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}
