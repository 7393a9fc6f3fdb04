//! Membership on the real node (tests/e2e/node.rs), what `membership_through_the_apiserver`
//! played until issue 44 moved it here: the product as the two pods of its Deployment (its
//! member join timeout set to 20 s through its environment variable, so a member that cannot
//! start is given up in seconds), member TLS on as shipped, etcd v3.5.36 then v3.6.17 from their
//! images. A cluster of one grows 1 -> 3 by learners under writes (member 0 never restarted,
//! the pod template unchanged); 3 -> 5 while member 4's pod cannot be scheduled (no local volume
//! left for its claim): the loop removes it after the join timeout, and it joins once a volume
//! is there; two of five down (the node cordoned, their pods deleted): writes go on, the status
//! names them, no membership call, a drain of a running voter refused by the budget; a member
//! removed by hand with etcd's API: it comes back on a fresh claim under a new member ID, never
//! in a cycle; the upgrade v3.5.36 -> v3.6.17 restarts the members one at a time (followers
//! first, the leader last) under writes. Every acknowledged write on every member at each step.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{ControlPlane, wait_for};
use crate::install::ok;
use crate::node::{self, Node};
use crate::pods::{Env, Members, Writer, condition, start_on_node, tear_down, wait_running_with};

const NS: &str = "members";
const NAME: &str = "real";
const FROM: &str = "v3.5.36";
const TO: &str = "v3.6.17";
/// The product's `--member-join-timeout` here (5 min as shipped): long enough for a pod the
/// node runs (a member started 3-5 s after its add in the case study), short enough to see
/// the removal of one that cannot start.
const JOIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Members 0 to 3 find a local volume; member 4's claim finds none until the scenario makes
/// the fifth, and the sixth is for member 2's fresh claim after its removal by hand.
const FIRST_VOLUMES: usize = 4;

pub fn membership_on_a_real_node(cp: ControlPlane) {
    let images = [
        node::etcd_image(&cp, FROM),
        node::etcd_image(&cp, TO),
        node::product_image(&cp),
    ];
    let join_timeout = format!("{}s", JOIN_TIMEOUT.as_secs());
    let (node, env) = start_on_node(
        cp,
        &images,
        FIRST_VOLUMES,
        NS,
        &[("ETCD_WEBHOOK_MEMBER_JOIN_TIMEOUT", join_timeout.as_str())],
    );
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"size": 1, "storageSize": "1Gi", "version": FROM},
    });
    let applied = Instant::now();
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply a cluster of one",
    );
    wait_running_with(&env, NAME, 1, Duration::from_secs(180));
    println!(
        "{NS}/{NAME}: 1 member on {FROM} Running {:.1} s after the apply",
        applied.elapsed().as_secs_f64()
    );

    let mut acked = grow_to_three(&env);
    grow_to_five_with_one_unschedulable(&env, &node, &mut acked);
    two_of_five_down(&env, &mut acked);
    removed_by_hand(&env, &node, &mut acked);
    upgrade(&env, &acked);

    tear_down(node, env);
}

/// 1 -> 3 with a writer on the client Service: both learners added and promoted, member 0's pod
/// never replaced or restarted, the StatefulSet's template unchanged; the status names every
/// member as etcd reports it (healthy, its database size, one leader) and says the cluster is
/// within its quota.
fn grow_to_three(env: &Env) -> BTreeMap<String, String> {
    let before = template_revision(env);
    let first = env.get_json(&["-n", NS, "pod", &format!("{NAME}-0")]);
    let writer = Writer::start(Members::of_size(env, NAME, 1), "grow");
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    env.patch_cluster(NAME, r#"{"spec":{"size":3}}"#, "scale to 3");
    let status = wait_running_with(env, NAME, 3, Duration::from_secs(180));
    let took = t.elapsed().as_secs_f64();
    let written = writer.stop_with_none_failed("the growth to 3");
    let members = status["members"].as_array().expect("status.members");
    assert!(
        members
            .iter()
            .all(|m| m["healthy"] == true && m["dbSize"].as_i64().is_some()),
        "{status}"
    );
    let leaders: Vec<&Value> = members.iter().filter(|m| m["role"] == "Leader").collect();
    assert_eq!(leaders.len(), 1, "{status}");
    assert_eq!(status["leader"], leaders[0]["name"], "{status}");
    assert!(
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Degraded" && c["reason"] == "WithinQuota"),
        "{status}"
    );
    assert_eq!(template_revision(env), before, "the pod template changed");
    let now = env.get_json(&["-n", NS, "pod", &format!("{NAME}-0")]);
    assert_eq!(
        now["metadata"]["uid"], first["metadata"]["uid"],
        "member 0's pod was replaced"
    );
    assert_eq!(
        now["status"]["containerStatuses"][0]["restartCount"], 0,
        "member 0's etcd restarted"
    );
    let seen = reasons(env);
    for reason in ["AddedLearner", "PromotedMember"] {
        assert!(seen.iter().any(|r| r == reason), "{reason} in {seen:?}");
    }
    // Voters, and only they, carry the label the budget selects.
    assert_eq!(env.member_pods(NAME, true).len(), 3, "voters labelled");
    assert!(
        written.acked.len() > 20,
        "the writer wrote ({})",
        written.acked.len()
    );
    let etcd = Members::of_size(env, NAME, 3);
    for i in 0..3 {
        etcd.assert_has_all(i, &written.acked);
    }
    println!(
        "1 -> 3 in {took:.1} s: {} writes through the client Service, 0 failed ({} on a second try), member 0 never restarted, the template unchanged",
        written.acked.len(),
        written.retried
    );
    written.acked
}

/// 3 -> 5 while no local volume is left for member 4's claim, so the scheduler cannot place its
/// pod (what a lost node or a full zone does): member 3 joins; member 4 is added, never starts,
/// and is removed after the join timeout with a Warning; once the node has a volume for it, it
/// joins. Writes go on throughout.
fn grow_to_five_with_one_unschedulable(
    env: &Env,
    node: &Node,
    acked: &mut BTreeMap<String, String>,
) {
    let before = template_revision(env);
    let writer = Writer::start(Members::of_size(env, NAME, 3), "five");
    let t = Instant::now();
    env.patch_cluster(NAME, r#"{"spec":{"size":5}}"#, "scale to 5");
    // What the pod said while it waited: the loop scales the StatefulSet back when it gives
    // the member up, so the pod is gone once the Warning is there.
    let mut scheduled = Value::Null;
    let mut ran = false;
    let told = wait_for(
        "a Warning MemberNeverStarted about member 4",
        JOIN_TIMEOUT + Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            if let Some(pod) = env
                .cp
                .get_json_opt(&["-n", NS, "pod", &format!("{NAME}-4")])
            {
                ran |= pod["status"]["containerStatuses"].is_array();
                if let Some(c) = pod["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "PodScheduled")
                {
                    scheduled = c.clone();
                }
            }
            events(env)
                .into_iter()
                .find(|e| e["reason"] == "MemberNeverStarted" && e["type"] == "Warning")
        },
    );
    let removed_after = t.elapsed().as_secs_f64();
    assert_eq!(
        told["related"]["name"],
        format!("{NAME}-4"),
        "the member given up: {told}"
    );
    assert!(
        !ran && scheduled["status"] == "False"
            && scheduled["message"]
                .as_str()
                .is_some_and(|m| m.contains("persistent volume")),
        "member 4's pod waited for a volume, never running: {scheduled}"
    );
    let status = env.get_json(&["-n", NS, "etcdcluster", NAME])["status"].clone();
    assert_ne!(status["phase"], "Failed", "{status}");
    // One member at a time: at most one added and not started in etcd's list (an unstarted
    // member has no name yet).
    let list = Members::of_size(env, NAME, 4)
        .call(0, "cluster/member/list", json!({"linearizable": true}))
        .expect("the member list");
    let unstarted = list["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"].as_str().unwrap_or_default().is_empty())
        .count();
    assert!(unstarted <= 1, "one unstarted member at most: {list}");
    // The node gets a volume for it: the scheduler places the pod and the member joins.
    let volume_made = Instant::now();
    node.local_volumes(&env.cp, FIRST_VOLUMES + 1, "2Gi");
    wait_running_with(env, NAME, 5, Duration::from_secs(180));
    let joined = volume_made.elapsed().as_secs_f64();
    let written = writer.stop_with_none_failed("the growth to 5");
    assert_eq!(template_revision(env), before, "the pod template changed");
    acked.extend(written.acked.clone());
    let etcd = Members::of_size(env, NAME, 5);
    for i in 0..5 {
        etcd.assert_has_all(i, acked);
    }
    println!(
        "3 -> 5 with member 4's pod unschedulable: MemberNeverStarted {removed_after:.1} s after the change (join timeout {JOIN_TIMEOUT:?}); Running with 5 voters {joined:.1} s after its volume was made; {} writes, 0 failed ({} on a second try)",
        written.acked.len(),
        written.retried
    );
}

/// Two of five members down (their node gone: the node cordoned and their pods deleted, so
/// the new pods wait unscheduled): writes go on, the status says 3 of 5 healthy, the loop makes
/// no membership call past its join timeout, and the disruption budget refuses to evict a
/// running voter. The node back: both members back.
fn two_of_five_down(env: &Env, acked: &mut BTreeMap<String, String>) {
    let before = membership_events(env);
    let writer = Writer::start(Members::of_size(env, NAME, 5), "down");
    ok(env.kubectl(&["cordon", node::NODE_NAME]), "cordon the node");
    ok(
        env.kubectl(&[
            "-n",
            NS,
            "delete",
            "pod",
            "--wait=false",
            &format!("{NAME}-3"),
            &format!("{NAME}-4"),
        ]),
        "delete members 3 and 4's pods",
    );
    let down = Instant::now();
    let unhealthy = wait_for(
        "the status to name the two down",
        Duration::from_secs(90),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            condition(&ec, "Members")
                .filter(|c| c["reason"] == "Unhealthy")
                .and_then(|c| c["message"].as_str().map(str::to_owned))
                .filter(|m| m.starts_with("5 voters (3 healthy)"))
        },
    );
    let pdb = wait_for(
        "the disruption controller to count 3 healthy voters",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let pdb = env.get_json(&["-n", NS, "pdb", NAME]);
            (pdb["status"]["currentHealthy"] == 3).then_some(pdb)
        },
    );
    assert_eq!(pdb["spec"]["minAvailable"], 3, "{}", pdb["spec"]);
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{}", pdb["status"]);
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": format!("{NAME}-1"), "namespace": NS}});
    let out = env.kubectl_in(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{NS}/pods/{NAME}-1/eviction"),
            "-f",
            "-",
        ],
        &eviction.to_string(),
    );
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && refusal.contains("disruption budget"),
        "the eviction of a voter with two of five down: {refusal}"
    );
    // Past the join timeout: the two are started voters, never given up.
    let quiet_until = down + JOIN_TIMEOUT + Duration::from_secs(5);
    std::thread::sleep(quiet_until.saturating_duration_since(Instant::now()));
    assert_eq!(
        membership_events(env),
        before,
        "a membership call with two of five down"
    );
    ok(
        env.kubectl(&["uncordon", node::NODE_NAME]),
        "uncordon the node",
    );
    let back = Instant::now();
    wait_running_with(env, NAME, 5, Duration::from_secs(180));
    let back_after = back.elapsed().as_secs_f64();
    let written = writer.stop_with_none_failed("two of five down");
    acked.extend(written.acked.clone());
    assert_eq!(
        membership_events(env),
        before,
        "a membership call when the two came back"
    );
    let etcd = Members::of_size(env, NAME, 5);
    for i in 0..5 {
        etcd.assert_has_all(i, acked);
    }
    println!(
        "two of five down: the status said {unhealthy:?}, the budget refused to evict a voter, no membership call in {:.0} s; both back {back_after:.1} s after the uncordon; {} writes meanwhile, 0 failed ({} on a second try)",
        JOIN_TIMEOUT.as_secs_f64() + 5.0,
        written.acked.len(),
        written.retried
    );
}

/// `etcdctl member remove` of member 2 by hand, its volume left as it is: the removed member
/// stops, the loop replaces its claim (a new local volume) and adds it back under a new member
/// ID, once (never a cycle of removals and adds).
fn removed_by_hand(env: &Env, node: &Node, acked: &mut BTreeMap<String, String>) {
    let pod = format!("{NAME}-2");
    let claim = format!("data-{NAME}-2");
    node.local_volumes(&env.cp, FIRST_VOLUMES + 2, "2Gi");
    let before = pod_events(env, &pod);
    let old_claim = env.get_json(&["-n", NS, "pvc", &claim])["metadata"]["uid"].clone();
    let etcd = Members::of_size(env, NAME, 5);
    let id_of = |list: &Value| {
        list["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == pod.as_str())
            .and_then(|m| m["ID"].as_str().map(str::to_owned))
    };
    let list = etcd
        .call(0, "cluster/member/list", json!({"linearizable": true}))
        .expect("the member list");
    let removed = id_of(&list).unwrap_or_else(|| panic!("{pod} in {list}"));
    let t = Instant::now();
    // Done once etcd takes it, or once the list no longer names it (a removal that was
    // committed while its answer timed out is refused as "member not found" when tried again).
    wait_for("the removal by hand", Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(300));
        if etcd
            .call(0, "cluster/member/remove", json!({"ID": removed}))
            .is_ok()
        {
            return Some(());
        }
        let list = etcd
            .call(0, "cluster/member/list", json!({"linearizable": true}))
            .ok()?;
        id_of(&list).is_none().then_some(())
    });
    wait_for(
        &format!("{claim} made anew"),
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let now = env.cp.get_json_opt(&["-n", NS, "pvc", &claim])?;
            (now["metadata"]["uid"] != old_claim && now["status"]["phase"] == "Bound").then_some(())
        },
    );
    wait_for(
        &format!("{pod} back as a voter under a new member ID"),
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let etcd = Members::of_size(env, NAME, 5);
            let list = etcd
                .call(0, "cluster/member/list", json!({"linearizable": true}))
                .ok()?;
            let members = list["members"].as_array()?;
            (members.len() == 5
                && members.iter().all(|m| m["ID"] != removed.as_str())
                && members
                    .iter()
                    .any(|m| m["name"] == pod.as_str() && m["isLearner"] != true))
            .then_some(())
        },
    );
    wait_running_with(env, NAME, 5, Duration::from_secs(120));
    let back = t.elapsed().as_secs_f64();
    let after = pod_events(env, &pod);
    let delta = |reason: &str| {
        after.get(reason).copied().unwrap_or(0) - before.get(reason).copied().unwrap_or(0)
    };
    for reason in [
        "MemberVolumeReplaced",
        "MemberVolumeStale",
        "MemberNeverStarted",
        "MemberVolumeLost",
    ] {
        assert!(
            delta(reason) <= 1,
            "{reason} {} times: a cycle ({after:?})",
            delta(reason)
        );
    }
    assert!(
        (1..=2).contains(&delta("AddedLearner")),
        "member 2 added back {} times ({after:?})",
        delta("AddedLearner")
    );
    let how: Vec<&String> = after.keys().filter(|reason| delta(reason) > 0).collect();
    let etcd = Members::of_size(env, NAME, 5);
    etcd.put_any("/orders/after-removal", "r")
        .expect("a write after the removal");
    acked.insert("/orders/after-removal".to_owned(), "r".to_owned());
    for i in 0..5 {
        etcd.assert_has_all(i, acked);
    }
    println!(
        "{pod} removed by hand: back on a fresh claim under a new member ID, Running with 5 voters {back:.1} s after the removal (new Events about it: {how:?})"
    );
}

/// The upgrade FROM -> TO under a writer on the client Service: the loop deletes the members'
/// pods one at a time (the StatefulSet's OnDelete), followers first and the leader last, as the
/// status says; 0 failed writes; every member on the new release with every write.
fn upgrade(env: &Env, acked: &BTreeMap<String, String>) {
    let writer = Writer::start(Members::of_size(env, NAME, 5), "upgrade");
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    env.patch_cluster(
        NAME,
        &json!({"spec": {"version": TO}}).to_string(),
        "upgrade",
    );
    let image = format!("quay.io/coreos/etcd:{TO}");
    let mut said: Vec<String> = Vec::new();
    wait_for(
        &format!("every member Ready on {image}, Running"),
        Duration::from_secs(300),
        || {
            std::thread::sleep(Duration::from_millis(300));
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            if let Some(m) = condition(&ec, "Progressing")
                .and_then(|c| c["message"].as_str())
                .and_then(|m| m.split("; ").find(|p| p.contains("restarting")))
                && said.last().map(String::as_str) != Some(m)
            {
                said.push(m.to_owned());
            }
            (env.all_ready_on(NAME, 5, &image)
                && ec["status"]["phase"] == "Running"
                && ec["status"]["readyReplicas"] == 5)
                .then_some(())
        },
    );
    let took = t.elapsed().as_secs_f64();
    let written = writer.stop_with_none_failed("the upgrade");
    // The order the loop restarted the members in, from its own log: each member once,
    // followers first, the leader last. The status's Progressing message says the same while
    // it lasts (printed: a poll can miss the last one).
    let restarts = loop_restarts(env);
    let pods: std::collections::BTreeSet<&str> = restarts.iter().map(|(p, _)| p.as_str()).collect();
    assert!(
        restarts.len() == 5
            && pods.len() == 5
            && restarts[..4].iter().all(|(_, leader)| !leader)
            && restarts[4].1,
        "each member restarted once, followers first, the leader last: {restarts:?}"
    );
    let mut all = acked.clone();
    all.extend(written.acked.clone());
    Members::of_size(env, NAME, 5).assert_release_and_writes(TO, &all);
    println!(
        "upgrade {FROM} -> {TO} in {took:.1} s, the loop restarted {:?}, the leader last: {} writes through the client Service, 0 failed ({} on a second try); the status said {said:?}",
        restarts.iter().map(|(p, _)| p).collect::<Vec<_>>(),
        written.acked.len(),
        written.retried
    );
}

/// The StatefulSet's current and update revisions: the pod template as the controller has it.
fn template_revision(env: &Env) -> (Value, Value) {
    let sts = env.get_json(&["-n", NS, "statefulset", NAME]);
    (
        sts["status"]["currentRevision"].clone(),
        sts["status"]["updateRevision"].clone(),
    )
}

/// The members the loop restarted for the upgrade, in order, with whether each led, from its
/// own log: both replicas' (the Lease may have moved between them), their previous runs'
/// included, as the kubelet serves them (`kubectl logs`). A pass working from a cache that
/// had not yet seen its own delete may log the same restart twice in a row: counted once.
fn loop_restarts(env: &Env) -> Vec<(String, bool)> {
    let mut lines: Vec<(String, String, bool)> = Vec::new();
    for pod in env.get_json(&[
        "-n",
        "etcd-system",
        "pods",
        "-l",
        "app.kubernetes.io/name=etcd-webhook",
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let mut logs = ok(
            env.kubectl(&["-n", "etcd-system", "logs", name]),
            "a replica's log (kubectl logs, from the kubelet)",
        );
        if pod["status"]["containerStatuses"][0]["restartCount"].as_i64() > Some(0) {
            logs.push_str(&ok(
                env.kubectl(&["-n", "etcd-system", "logs", "--previous", name]),
                "a replica's previous log",
            ));
        }
        for l in logs
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        {
            if l["message"] == "restarting a member on the new version" && l["cluster"] == NAME {
                lines.push((
                    l["timestamp"].as_str().unwrap_or_default().to_owned(),
                    l["pod"].as_str().unwrap_or_default().to_owned(),
                    l["leader"] == true,
                ));
            }
        }
    }
    lines.sort();
    let mut restarts: Vec<(String, bool)> = lines.into_iter().map(|(_, p, l)| (p, l)).collect();
    restarts.dedup_by(|a, b| a.0 == b.0);
    restarts
}

fn events(env: &Env) -> Vec<Value> {
    let list = env.get_json(&["-n", NS, "events.events.k8s.io"]);
    list["items"].as_array().cloned().unwrap_or_default()
}

fn reasons(env: &Env) -> Vec<String> {
    events(env)
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The Events whose related object is `pod`: reason -> how many times (a series counts its
/// occurrences).
fn pod_events(env: &Env, pod: &str) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for e in events(env).iter().filter(|e| e["related"]["name"] == pod) {
        *counts
            .entry(e["reason"].as_str().unwrap_or_default().to_owned())
            .or_insert(0) += e["series"]["count"].as_i64().unwrap_or(1);
    }
    counts
}

/// How many times an Event said a membership call (a learner added, promoted, a member
/// removed), a series counted by its occurrences.
fn membership_events(env: &Env) -> i64 {
    events(env)
        .iter()
        .filter(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("Learner") || r.contains("Member"))
        })
        .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
        .sum()
}
