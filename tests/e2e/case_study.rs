//! The seed's case study, an etcd operator with failover, on a real node (tests/e2e/node.rs):
//! config/default applied as shipped, so the product runs as the two pods of its Deployment
//! (its image assembled here: the static musl binary, non-root), cert-manager issues their
//! serving certificate into the Secret volume, the apiserver calls the webhooks through the
//! Service (kube-proxy), one replica leads the reconcile loop by the Lease and reaches the
//! members through the cluster DNS; member TLS on (the shipped default). An EtcdCluster applied
//! with kubectl becomes three real etcd pods (the rendered StatefulSet as the kubelet runs it:
//! the image's entrypoint, non-root 65532 with a read-only root and seccomp RuntimeDefault,
//! fsGroup on local volumes, cert-manager's Secrets as volumes, the probes with their timing,
//! peers that find each other by their headless Service's DNS names and check each other's
//! certificates by reverse lookups); writes with the client certificate; the leader's pod
//! deleted, then the leader's container killed: a leader in a later term, the member back on
//! its own data, every acknowledged write still there; a write through the client Service; a
//! follower's volume lost under it (the member removed, its claim and pod made anew on another
//! local volume, and it joins again as a learner); two of three members lost with their
//! volumes (the node cordoned, their pods deleted, their folders wiped) and the quorum
//! recovered by the loop from the one left. Then
//! the members' leaf renewed by cert-manager under writes; a scheduled backup made by the real
//! CronJob controller to S3, verified, and restored into a new cluster by real restore Jobs;
//! scale 3 -> 5; a rolling upgrade v3.6.17 -> v3.7.4 under writes; the deletion with its final
//! snapshot before the claims go; and nothing of the node left on the machine.
//!
//! All of it with NetworkPolicy enforced by the node's agent (kube-network-policies): the
//! members' policy lets the loop, the peers and the Jobs through, and a pod without the client
//! label is dropped on the client port while one with it is answered.
//!
//! Then the loop's own client certificate renewed by cert-manager: the loop holds the new one
//! seconds after it is issued (it watches its Certificates; it reads the Secret by name, not
//! through a volume).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, wait_for};
use crate::common;
use crate::install::ok;
use crate::node::{self, Node};
use crate::node_quorum::{available, come_back_empty, event_counts, lose_two, members_config};
use crate::pods::{
    Env, Leader, Members, Writer, client_tls, is_running, kill_etcd, local_volume, ordinal, ready,
    start_on_node, tear_down, wait_running_with,
};

const NS: &str = "case-study";
const NAME: &str = "orders";
const SIZE: usize = 3;
/// The case study's cluster grown to 5, the volume that replaces a lost one, the cluster
/// restored from its backup, and the one upgraded.
const VOLUMES: usize = 5 + 1 + SIZE + SIZE;

pub fn case_study_on_a_real_node(cp: ControlPlane) {
    let started = Instant::now();
    let images = [
        node::etcd_image(&cp, etcd_webhook::api::defaults::VERSION),
        node::etcd_image(&cp, "v3.6.17"),
        node::product_image(&cp),
    ];
    let images_ready = started.elapsed();
    let (node, env) = start_on_node(cp, &images, VOLUMES, NS, &[]);
    println!(
        "images in {:.1} s; node Ready, the product installed as pods and the namespace made {:.1} s after the start",
        images_ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // The user's apply: nothing but a size and a storage size; the webhook fills in the rest.
    let applied = Instant::now();
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"size": SIZE, "storageSize": "1Gi"},
    });
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply the EtcdCluster",
    );
    let status = wait_running(&env, NAME, Duration::from_secs(180));
    println!(
        "{NS}/{NAME}: Running with {SIZE} members {:.1} s after the apply (leader {})",
        applied.elapsed().as_secs_f64(),
        status["leader"]
    );
    let sts = env.get_json(&["-n", NS, "statefulset", NAME]);
    let args = sts["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--client-cert-auth=true") && args.contains("https://"),
        "the members run TLS by default: {args}"
    );
    loop_holds_the_client_certificate(&env, Duration::from_secs(30));
    network_policy_enforced(&env);

    // What only a node does: the data directory made by etcd running as 65532, on a volume
    // whose group the kubelet set (fsGroup).
    let mut with_data = 0;
    for pv in 0..VOLUMES {
        use std::os::unix::fs::MetadataExt;
        let data = node.volume_path(pv).join("data");
        let Ok(meta) = std::fs::metadata(&data) else {
            continue;
        };
        with_data += 1;
        let volume = std::fs::metadata(node.volume_path(pv)).unwrap();
        assert_eq!(
            volume.gid(),
            65532,
            "the kubelet applied fsGroup to local-{pv}"
        );
        assert_eq!(
            (meta.uid(), meta.gid()),
            (65532, 65532),
            "{} is made by etcd running as the pod's user",
            data.display()
        );
    }
    assert_eq!(with_data, SIZE, "one data directory per member");

    let etcd = Members::new(&env);
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..50 {
        let (k, v) = (format!("/orders/before/{i:03}"), format!("v{i}"));
        etcd.put_any(&k, &v).expect("a write before any failure");
        acked.insert(k, v);
    }

    // Failover 1: the leader's pod deleted.
    let leader = etcd.leader();
    let (leader_pod, leader_id) = (leader.pod.clone(), leader.id.clone());
    // status.leader is what the loop last read from etcd (a pass at least every resync).
    wait_for(
        "status.leader to name the member etcd calls leader",
        Duration::from_secs(60),
        || {
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            (ec["status"]["leader"].as_str() == Some(leader_pod.as_str())).then_some(())
        },
    );
    let old_uid = env.get_json(&["-n", NS, "pod", &leader_pod])["metadata"]["uid"].clone();
    let deleted = Instant::now();
    ok(
        env.kubectl(&["-n", NS, "delete", "pod", &leader_pod, "--wait=false"]),
        "delete the leader's pod",
    );
    let (failures, new_leader) = write_until_new_leader(&etcd, &leader, "pod", &mut acked);
    let new_leader = format!("{} (term {})", new_leader.pod, new_leader.term);
    println!(
        "leader pod {leader_pod} deleted: new leader {new_leader} after {:.1} s; {} writes acknowledged meanwhile, {failures} refused (retried elsewhere)",
        deleted.elapsed().as_secs_f64(),
        acked.len() - 50
    );
    wait_for(
        &format!("{leader_pod} back Ready as a new pod"),
        Duration::from_secs(120),
        || {
            // NotFound until the StatefulSet has made the new pod.
            let pod = env.cp.get_json_opt(&["-n", NS, "pod", &leader_pod])?;
            (pod["metadata"]["uid"] != old_uid && ready(&pod)).then_some(())
        },
    );
    let etcd = Members::new(&env);
    let back = ordinal(&leader_pod);
    assert_eq!(
        etcd.status(back).expect("the returned member answers").0,
        leader_id,
        "{leader_pod} came back as the same member, on its own data"
    );
    etcd.assert_has_all(back, &acked);
    println!(
        "{leader_pod} back {:.1} s after the delete, with all {} acknowledged writes",
        deleted.elapsed().as_secs_f64(),
        acked.len()
    );

    // Failover 2: the leader's etcd container killed (SIGKILL); the kubelet restarts it.
    let leader = etcd.leader();
    let (leader_pod, leader_id) = (leader.pod.clone(), leader.id.clone());
    let pod = env.get_json(&["-n", NS, "pod", &leader_pod]);
    let restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0);
    let killed = Instant::now();
    kill_etcd(&node, &pod, "the leader's");
    let (_, new_leader) = write_until_new_leader(&etcd, &leader, "container", &mut acked);
    let new_leader = format!("{} (term {})", new_leader.pod, new_leader.term);
    let pod = wait_for(
        &format!("{leader_pod}'s etcd restarted by the kubelet and Ready"),
        Duration::from_secs(120),
        || {
            let pod = env.get_json(&["-n", NS, "pod", &leader_pod]);
            let count = pod["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                .unwrap_or(0);
            (count > restarts && ready(&pod)).then_some(pod)
        },
    );
    let last = &pod["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(
        last["exitCode"].as_i64(),
        Some(137),
        "the kubelet reports the kill: {last}"
    );
    let etcd = Members::new(&env);
    let back = ordinal(&leader_pod);
    assert_eq!(etcd.status(back).expect("answers").0, leader_id);
    etcd.assert_has_all(back, &acked);
    println!(
        "{leader_pod}'s container killed: new leader {new_leader}, the container restarted and the member back with all {} writes {:.1} s after the kill",
        acked.len(),
        killed.elapsed().as_secs_f64()
    );
    for i in 0..SIZE {
        etcd.assert_has_all(i, &acked);
    }
    // The client Service (its cluster IP, through kube-proxy) selects the voters.
    etcd.put_via_service("/orders/via-service", "s")
        .expect("a write through the client Service");
    acked.insert("/orders/via-service".to_owned(), "s".to_owned());

    lost_one_volume(&env, &node, &acked);
    quorum_lost_with_two_volumes(&env, &node, &acked);
    leaf_renewal_under_writes(&env, &mut acked);
    client_certificate_renewal(&env);
    let s3 = backup_and_restore(&env, &acked);
    scale_to_five(&env, &acked);
    rolling_upgrade(&env);
    delete_with_a_final_snapshot(&env);
    drop(s3);

    tear_down(node, env);
}

/// A follower's volume lost under it (its disk replaced while it ran): its data folder wiped,
/// then its container killed. The kubelet restarts etcd on the empty folder; etcd stops at the
/// leader's first heartbeat (`[lastIndex(0)]`, which the kubelet keeps as the termination
/// message); the loop says `MemberVolumeLost`, removes the member, and deletes its claim and
/// pod. The claim waits for the pod to go (kube-controller-manager's pvc-protection), the
/// StatefulSet controller makes the pod and a new claim once the old claim is gone, the new
/// claim binds another local volume, and the member joins as a learner under a new member ID
/// and is promoted, with every acknowledged write.
fn lost_one_volume(env: &Env, node: &Node, acked: &BTreeMap<String, String>) {
    let etcd = Members::new(env);
    let leader = ordinal(&etcd.leader().pod);
    let lost = (leader + 1) % SIZE;
    let pod = format!("{NAME}-{lost}");
    let claim_name = format!("data-{pod}");
    let old_id = etcd.status(lost).expect("the member answers").0;
    let claim = env.get_json(&["-n", NS, "pvc", &claim_name]);
    let old_claim = claim["metadata"]["uid"].clone();
    let pv = local_volume(&claim);
    let old_pv = format!("local-{pv}");
    let old_pod = env.get_json(&["-n", NS, "pod", &pod]);

    std::fs::remove_dir_all(node.volume_path(pv).join("data")).unwrap();
    let lost_at = Instant::now();
    kill_etcd(node, &old_pod, "the wiped member's");
    let event = wait_for(
        &format!("a MemberVolumeLost Warning about {pod}"),
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let events = env.get_json(&["-n", NS, "events.events.k8s.io"]);
            events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["reason"] == "MemberVolumeLost" && e["related"]["name"] == pod.as_str())
                .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        },
    );
    let said = lost_at.elapsed().as_secs_f64();
    assert!(event.contains("lost its data"), "{event}");
    let new_claim = wait_for(
        &format!("{claim_name} made anew and bound"),
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(300));
            let c = env.cp.get_json_opt(&["-n", NS, "pvc", &claim_name])?;
            (c["metadata"]["uid"] != old_claim && c["status"]["phase"] == "Bound").then_some(c)
        },
    );
    let new_pv = new_claim["spec"]["volumeName"].as_str().unwrap_or_default();
    assert_ne!(new_pv, old_pv, "the new claim binds another volume");
    let status = wait_running(env, NAME, Duration::from_secs(180));
    let healed = lost_at.elapsed().as_secs_f64();
    assert!(
        status["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["role"] != "Learner"),
        "every member a voter again: {status}"
    );
    let etcd = Members::new(env);
    let new_id = etcd.status(lost).expect("the new member answers").0;
    assert_ne!(new_id, old_id, "{pod} joined as a new member");
    etcd.assert_has_all(lost, acked);
    assert_eq!(
        env.member_pods(NAME, true).len(),
        SIZE,
        "every voter carries the label the budget and the client Service select"
    );
    let old = env.get_json(&["pv", &old_pv]);
    assert_eq!(
        old["status"]["phase"], "Released",
        "the lost volume is kept (Retain) for its owner to look at: {}",
        old["status"]
    );
    let events = env.get_json(&["-n", NS, "events.events.k8s.io"]);
    // In the order they were first told (an Event told again keeps its first time).
    let mut told: Vec<(String, String)> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["related"]["name"] == pod.as_str())
        .map(|e| {
            let at = e["eventTime"]
                .as_str()
                .or(e["metadata"]["creationTimestamp"].as_str());
            let reason = e["reason"].as_str().unwrap_or_default();
            (at.unwrap_or_default().to_owned(), reason.to_owned())
        })
        .collect();
    told.sort();
    let mut reasons: Vec<String> = told.into_iter().map(|(_, r)| r).collect();
    reasons.dedup();
    println!(
        "lost volume of {pod}: MemberVolumeLost said {said:.1} s after the kill, the claim made anew on {new_pv} (was {old_pv}), Running with {SIZE} voters {healed:.1} s after, under a new member ID, with all {} acknowledged writes (the loop's Events about it: {reasons:?})",
        acked.len()
    );
}

/// Failover 3, issue 47's scenario 2 on real pods: two of three members lost with their
/// volumes. The node is cordoned and the two followers' pods deleted, so the StatefulSet's new
/// pods wait unscheduled (their "nodes" are gone); the leader is left alone, the loop says
/// `QuorumLost` and fences the members' ConfigMap. Then the two volumes' folders are wiped and
/// the node uncordoned: the new pods start on empty volumes, stop at the fence (the kubelet
/// keeps etcd's refusal as their termination message, and backs off), the loop knows them
/// empty, lifts the fence, makes their pods anew, and they rejoin from the survivor under
/// their old member IDs. Every acknowledged write is on every member afterwards.
fn quorum_lost_with_two_volumes(env: &Env, node: &Node, acked: &BTreeMap<String, String>) {
    let etcd = Members::new(env);
    let survivor = ordinal(&etcd.leader().pod);
    let ids: Vec<String> = (0..SIZE)
        .map(|i| etcd.status(i).expect("every member answers").0)
        .collect();
    let unfenced = members_config(env, NAME)["data"]["ETCD_INITIAL_CLUSTER"].clone();
    let warnings = |reason: &str| {
        event_counts(env)
            .get(&format!("Warning {reason}"))
            .copied()
            .unwrap_or(0)
    };
    let rejoins_before = warnings("RejoiningFromSurvivor");

    // Their nodes go: nothing can run them again until the node is uncordoned.
    let lost = lose_two(env, NAME, survivor);
    assert!(
        etcd.put(survivor, "/orders/refused", "x").is_err(),
        "a write without a quorum"
    );

    // The volumes go too: their folders wiped once the old pods (and their etcd) are gone.
    let back_at = come_back_empty(env, node, &lost);
    let mut said = vec!["QuorumLost".to_owned()];
    let mut rejoin = String::new();
    wait_for(
        "Running with 3 voters after the rejoin",
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let (ec, now) = available(env, NAME);
            if let Some((r, m)) = now {
                // The first: it names the survivor (a later one may say a leader is elected).
                if r == "RejoiningFromSurvivor" && rejoin.is_empty() {
                    rejoin = m;
                }
                if said.last() != Some(&r) {
                    said.push(r);
                }
            }
            (!rejoin.is_empty() && is_running(&ec, SIZE)).then_some(())
        },
    );
    let healed = back_at.elapsed().as_secs_f64();
    assert!(
        rejoin.contains(&format!("{NAME}-{survivor} is the only member with data")),
        "the rejoin names the survivor: {rejoin}"
    );
    assert_eq!(
        warnings("RejoiningFromSurvivor") - rejoins_before,
        1,
        "one Warning RejoiningFromSurvivor"
    );
    assert_eq!(
        members_config(env, NAME)["data"]["ETCD_INITIAL_CLUSTER"],
        unfenced,
        "the fence lifted, the old list back"
    );
    let etcd = Members::new(env);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            &etcd.status(i).expect("every member answers").0,
            id,
            "{NAME}-{i} rejoined under its old member ID"
        );
        etcd.assert_has_all(i, acked);
    }
    println!(
        "quorum lost: {} gone with their volumes, {NAME}-{survivor} left: QuorumLost said {:.1} s after, fenced, no write taken; back on empty volumes: {said:?}, Running with 3 voters {healed:.1} s after, under their old member IDs, with all {} acknowledged writes on every member",
        lost.pods.join(" and "),
        lost.said_after,
        acked.len()
    );
}

/// The S3 server of the tests (`controlplane s3`, SigV4 checked) on the node's address, so
/// the pods reach it; stopped on drop.
struct S3 {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ACCESS_KEY: &str = "case-study-key";
const SECRET_KEY: &str = "case-study-secret";
const BUCKET: &str = "backups";

fn start_s3(env: &Env) -> S3 {
    let port = crate::cluster::free_port();
    let listen = format!("{}:{port}", node::NODE_IP);
    let log = std::fs::File::create(env.cp.logs.join("s3.log")).unwrap();
    let child = std::process::Command::new(env.cp.bin())
        .args(["s3", "--listen", &listen, "--bucket", BUCKET])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg("--data")
        .arg(env.cp.dir.join("s3.bolt"))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the S3 server");
    wait_for("the S3 server", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&listen).ok()
    });
    S3 {
        child,
        endpoint: format!("http://{listen}"),
    }
}

/// The credentials Secret a cluster's backup and restore Jobs read.
fn credentials(env: &Env, s3: &S3, cluster: &str) {
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{cluster}-backup-credentials"), "namespace": NS},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_ENDPOINT_URL": s3.endpoint}});
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &secret.to_string()),
        "the backup credentials",
    );
}

/// Backups on, every minute, to S3: the real CronJob controller makes the Job, the Job's pod
/// files the snapshot, `status.backup.last` and the LAST BACKUP column show it, and the
/// verification Job proves it by restoring it. Then a new cluster restored from it (real
/// restore Jobs, then members) has every acknowledged write.
fn backup_and_restore(env: &Env, acked: &BTreeMap<String, String>) -> S3 {
    let s3 = start_s3(env);
    credentials(env, &s3, NAME);
    let enabled = Instant::now();
    let patch = json!({"spec": {"backup": {"enabled": true, "schedule": "* * * * *",
        "destination": format!("s3://{BUCKET}/{NS}")}}});
    env.patch_cluster(NAME, &patch.to_string(), "turn backups on");
    let last = wait_for(
        "a scheduled backup filed by a CronJob-made Job",
        Duration::from_secs(150),
        || {
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            let last = &ec["status"]["backup"]["last"];
            last["uri"].is_string().then(|| last.clone())
        },
    );
    let uri = last["uri"].as_str().unwrap().to_owned();
    let sha256 = last["sha256"]
        .as_str()
        .expect("the snapshot's sha256")
        .to_owned();
    assert!(
        uri.starts_with(&format!("s3://{BUCKET}/{NS}/")),
        "filed in the bucket: {uri}"
    );
    // The loop reads the report from the pod as it ends; the Job's own status follows.
    wait_for(
        "the CronJob-made backup Job Complete",
        Duration::from_secs(60),
        || {
            let jobs =
                env.get_json(&["-n", NS, "jobs", "-l", "app.kubernetes.io/component=backup"]);
            jobs["items"]
                .as_array()?
                .iter()
                .any(|j| {
                    j["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
                        && j["status"]["succeeded"].as_i64() == Some(1)
                })
                .then_some(())
        },
    );
    let column = ok(
        env.kubectl(&["-n", NS, "get", "etcdcluster", NAME]),
        "kubectl get etcdcluster",
    );
    let header = column.lines().next().unwrap_or_default();
    let row = column.lines().nth(1).unwrap_or_default();
    let at = header.find("LAST BACKUP").expect("a LAST BACKUP column");
    assert!(
        row.get(at..)
            .is_some_and(|v| !v.trim().is_empty() && !v.trim().starts_with("<none>")),
        "the LAST BACKUP column shows the snapshot:\n{column}"
    );
    println!(
        "backup filed {:.1} s after backups were turned on: {uri}",
        enabled.elapsed().as_secs_f64()
    );
    let verified = wait_for(
        "the snapshot proven by a verification Job",
        Duration::from_secs(120),
        || {
            let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
            let v = &ec["status"]["backup"]["lastVerified"];
            v["outcome"].is_string().then(|| v.clone())
        },
    );
    assert_eq!(verified["outcome"], "Verified", "{verified}");
    println!(
        "snapshot verified by restoring it {:.1} s after backups were turned on",
        enabled.elapsed().as_secs_f64()
    );

    // Restore into a new cluster from the snapshot, with its hash.
    let restored = "restored";
    credentials(env, &s3, restored);
    let started = Instant::now();
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": restored, "namespace": NS},
        "spec": {"size": SIZE, "storageSize": "1Gi",
                 "restore": {"from": uri, "sha256": sha256}},
    });
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply the restored EtcdCluster",
    );
    wait_running(env, restored, Duration::from_secs(240));
    let jobs = env.get_json(&[
        "-n",
        NS,
        "jobs",
        "-l",
        "app.kubernetes.io/component=restore",
    ]);
    let done = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| {
            j["metadata"]["labels"]["app.kubernetes.io/instance"] == restored
                && j["status"]["succeeded"].as_i64() == Some(1)
        })
        .count();
    assert_eq!(done, SIZE, "one real restore Job per member: {jobs}");
    // The claims the loop made ahead are the StatefulSet's to control (its retention policy
    // deletes them with it), the cluster an owner beside it: no conflicting controller.
    for i in 0..SIZE {
        let claim = env.get_json(&["-n", NS, "pvc", &format!("data-{restored}-{i}")]);
        let owners = claim["metadata"]["ownerReferences"].as_array().cloned();
        let owners = owners.unwrap_or_default();
        let controls = |kind: &str| {
            owners
                .iter()
                .filter(|o| o["kind"] == kind && o["name"] == restored)
                .map(|o| o["controller"].as_bool() == Some(true))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (controls("StatefulSet"), controls("EtcdCluster")),
            (vec![true], vec![false]),
            "data-{restored}-{i}'s owners: {owners:?}"
        );
    }
    let conflicts = env.get_json(&[
        "-n",
        NS,
        "events",
        "--field-selector",
        "reason=ConflictingController",
    ]);
    assert_eq!(
        conflicts["items"].as_array().map(Vec::len),
        Some(0),
        "no claim under another controller: {conflicts}"
    );
    let etcd = Members::of(env, restored);
    for i in 0..SIZE {
        etcd.assert_has_all(i, acked);
    }
    println!(
        "{restored}: Running from the snapshot with all {} acknowledged writes {:.1} s after the apply",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
    s3
}

/// Has cert-manager issue `certificate` anew, as `cmctl renew` does (the Issuing condition
/// set on its status), and waits for the next revision.
fn renew(env: &Env, certificate: &str) {
    let revision = || {
        env.get_json(&["-n", NS, "certificate", certificate])["status"]["revision"]
            .as_i64()
            .unwrap_or(0)
    };
    let before = revision();
    let condition = json!([{"op": "add", "path": "/status/conditions/-", "value": {
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "renewal triggered by the case study"}}]);
    ok(
        env.kubectl(&[
            "-n",
            NS,
            "patch",
            "certificate",
            certificate,
            "--subresource=status",
            "--type=json",
            "-p",
            &condition.to_string(),
        ]),
        "trigger the renewal (as cmctl renew does)",
    );
    wait_for(
        &format!("cert-manager to issue {certificate}'s next revision"),
        Duration::from_secs(60),
        || (revision() > before).then_some(()),
    );
}

/// The loop's own client certificate renewed by cert-manager: the loop (the Lease holder's
/// pod) holds the new one seconds after it is issued (its watch of the Certificates; the Secret
/// read by name would be due only up to 5 minutes later), and says so in its metrics.
fn client_certificate_renewal(env: &Env) {
    let before = loop_holds_the_client_certificate(env, Duration::from_secs(30));
    let started = Instant::now();
    let certificate = format!("{NAME}-client");
    renew(env, &certificate);
    let issued = started.elapsed();
    let after = loop_holds_the_client_certificate(env, Duration::from_secs(10));
    assert_ne!(
        before, after,
        "the renewed certificate has another notAfter"
    );
    // Brought by the watch, not by a read that happened to be due (the loop also reads the
    // Secret again a minute after a pass no member answered): the Lease holder said so.
    let holder = env.get_json(&["-n", "etcd-system", "lease", "etcd-webhook-leader"])["spec"]
        ["holderIdentity"]
        .as_str()
        .unwrap()
        .to_owned();
    let logs = ok(
        env.kubectl(&["-n", "etcd-system", "logs", &holder]),
        "the Lease holder's log (kubectl logs, from the kubelet)",
    );
    let said = format!("\"certificate\":\"{certificate}\"");
    assert!(
        logs.lines()
            .any(|l| l.contains("the client certificate was issued anew") && l.contains(&said)),
        "{holder} did not log the renewal of {certificate} it watched"
    );
    println!(
        "the loop's client certificate renewed: issued {:.1} s after the trigger, held by the loop {:.1} s after the trigger (notAfter {before} -> {after})",
        issued.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// The members' serving certificate renewed by cert-manager while a writer runs: the kubelet
/// refreshes the Secret volume (its `..data` swap), etcd serves the new leaf on new
/// connections, and no write fails.
fn leaf_renewal_under_writes(env: &Env, acked: &mut BTreeMap<String, String>) {
    let certificate = format!("{NAME}-server");
    let served = |member: usize| served_serial(env, member);
    let before: Vec<String> = (0..SIZE).map(served).collect();
    let writer = Writer::start(Members::new(env), "renewal");
    let started = Instant::now();
    renew(env, &certificate);
    let issued = started.elapsed();
    for (member, old) in before.iter().enumerate() {
        wait_for(
            &format!("{NAME}-{member} to serve the renewed leaf"),
            Duration::from_secs(120),
            || {
                let now = served(member);
                (now != *old && !now.is_empty()).then_some(())
            },
        );
    }
    let everywhere = started.elapsed();
    let w = writer.stop_with_none_failed("the renewal");
    println!(
        "leaf renewed: issued in {:.1} s, served by every member {:.1} s after the trigger (the kubelet's Secret refresh); {} writes through the client Service meanwhile, 0 failed, {} on a second try",
        issued.as_secs_f64(),
        everywhere.as_secs_f64(),
        w.acked.len(),
        w.retried
    );
    acked.extend(w.acked);
    let etcd = Members::new(env);
    for i in 0..SIZE {
        etcd.assert_has_all(i, acked);
    }
}

/// A rolling upgrade v3.6.17 -> v3.7.4 (the default) of a 3-member cluster under a writer: the
/// members restarted one at a time on the new image, 0 failed writes, every write on every
/// member, each member reporting the new release.
fn rolling_upgrade(env: &Env) {
    let name = "upgrade";
    let from = "v3.6.17";
    let to = etcd_webhook::api::defaults::VERSION;
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"size": SIZE, "storageSize": "1Gi", "version": from},
    });
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply the cluster to upgrade",
    );
    wait_running(env, name, Duration::from_secs(180));
    let writer = Writer::start(Members::of(env, name), "upgrade");
    let started = Instant::now();
    env.patch_cluster(
        name,
        &json!({"spec": {"version": to}}).to_string(),
        "upgrade",
    );
    let image = format!("quay.io/coreos/etcd:{to}");
    wait_for(
        &format!("every member of {name} Ready on {image}"),
        Duration::from_secs(300),
        || env.all_ready_on(name, SIZE, &image).then_some(()),
    );
    wait_running(env, name, Duration::from_secs(120));
    let took = started.elapsed();
    let w = writer.stop_with_none_failed("the upgrade");
    let written = w.acked;
    Members::of(env, name).assert_release_and_writes(to, &written);
    println!(
        "{name}: {from} -> {to} in {:.1} s, members one at a time; {} writes through the client Service meanwhile, 0 failed, {} on a second try",
        took.as_secs_f64(),
        written.len(),
        w.retried
    );
}

/// The loop (the Lease holder's pod) reaches the members with the certificate of the Secret
/// `NAME-client-tls` cert-manager issued, and says its notAfter in its metrics (what the alert
/// `EtcdClusterClientCertificateExpiresSoon` reads).
fn loop_holds_the_client_certificate(env: &Env, within: Duration) -> i64 {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let secret = env.get_json(&["-n", NS, "secret", &format!("{NAME}-client-tls")]);
    let pem = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["tls.crt"].as_str().unwrap())
        .unwrap();
    let der = CertificateDer::from_pem_slice(&pem).unwrap();
    let not_after = etcd_webhook::tls::cert_info(&der).unwrap().not_after;
    let series = format!(
        "etcd_webhook_member_client_cert_not_after_timestamp_seconds{{namespace=\"{NS}\",name=\"{NAME}\"}} {not_after}"
    );
    let lease = env.get_json(&["-n", "etcd-system", "lease", "etcd-webhook-leader"]);
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
    let pod = env.get_json(&["-n", "etcd-system", "pod", &holder]);
    let url = format!(
        "http://{}:8081/metrics",
        pod["status"]["podIP"].as_str().unwrap()
    );
    let start = Instant::now();
    loop {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "3", &url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().any(|l| l == series) {
            break;
        }
        assert!(
            start.elapsed() < within,
            "{url} did not say {series} within {within:?}; it said: {:?} {}",
            text.lines()
                .filter(|l| l.contains("member_client_cert"))
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("the loop's metrics name the client certificate it holds: {series}");
    not_after
}

/// The members' NetworkPolicy, enforced by the node's agent (kube-network-policies, running
/// since the node started, so the loop, the members' peers and the backup Jobs have been let
/// through all along): etcdctl with the cluster's client certificate, in a pod of the
/// namespace, is answered through the client Service with the client label
/// (`etcd.example.com/client: NAME`) and dropped without it. Both dial for up to 15 s: the
/// agent learns a new pod's address from the apiserver once the kubelet has reported it, and
/// drops what that pod sends before (seen: a labelled pod's 3 s dial timed out), so each gets
/// the same time to be let through.
fn network_policy_enforced(env: &Env) {
    let policy = env.get_json(&["-n", NS, "networkpolicy", NAME]);
    assert_eq!(
        policy["spec"]["policyTypes"],
        json!(["Ingress"]),
        "the loop made the members' policy: {policy}"
    );
    let started = Instant::now();
    let run = |pod: &str, labels: Value| {
        let spec = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NS, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "etcdctl",
                    "image": format!("quay.io/coreos/etcd:{}", etcd_webhook::api::defaults::VERSION),
                    "command": ["/usr/local/bin/etcdctl"],
                    "args": [
                        format!("--endpoints=https://{NAME}-client.{NS}.svc:2379"),
                        "--cacert=/tls/ca.crt", "--cert=/tls/tls.crt", "--key=/tls/tls.key",
                        "--dial-timeout=15s", "--command-timeout=20s", "endpoint", "health",
                    ],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                }],
                "volumes": [{"name": "tls", "secret": {"secretName": format!("{NAME}-client-tls")}}],
            },
        });
        ok(
            env.kubectl_in(&["apply", "-f", "-"], &spec.to_string()),
            &format!("create the pod {pod}"),
        );
        pod.to_owned()
    };
    let labelled = run(
        "etcdctl-with-client-label",
        json!({etcd_webhook::controller::render::CLIENT_LABEL: NAME}),
    );
    let unlabelled = run("etcdctl-without-client-label", json!({"app": "etcdctl"}));
    let ended = |pod: &str| {
        wait_for(
            &format!("the pod {pod} to end"),
            Duration::from_secs(90),
            || {
                std::thread::sleep(Duration::from_millis(500));
                let p = env.get_json(&["-n", NS, "pod", pod]);
                let phase = p["status"]["phase"].as_str().unwrap_or_default().to_owned();
                let state = &p["status"]["containerStatuses"][0]["state"]["terminated"];
                matches!(phase.as_str(), "Succeeded" | "Failed").then(|| {
                    (
                        phase,
                        state["exitCode"].as_i64(),
                        state["message"].as_str().unwrap_or_default().to_owned(),
                    )
                })
            },
        )
    };
    let (phase, code, message) = ended(&labelled);
    assert_eq!(
        (phase.as_str(), code),
        ("Succeeded", Some(0)),
        "etcdctl with the client label is let through: {message}"
    );
    let (phase, code, message) = ended(&unlabelled);
    assert_eq!(
        (phase.as_str(), code),
        ("Failed", Some(1)),
        "etcdctl without the client label is dropped: {message}"
    );
    assert!(
        message.contains("unhealthy") && message.contains("deadline exceeded"),
        "dropped, not refused by TLS: {message}"
    );
    ok(
        env.kubectl(&[
            "-n",
            NS,
            "delete",
            "pod",
            &labelled,
            &unlabelled,
            "--wait=false",
        ]),
        "delete the etcdctl pods",
    );
    println!(
        "NetworkPolicy enforced (kube-network-policies): etcdctl with the client label answered, without it dropped ({:.1} s for both)",
        started.elapsed().as_secs_f64()
    );
}

/// The serial number of the leaf `member` serves on a new connection (hex), or empty when it
/// does not answer.
fn served_serial(env: &Env, member: usize) -> String {
    let config = client_tls(env, NAME);
    let pod = env.get_json(&["-n", NS, "pod", &format!("{NAME}-{member}")]);
    let Some(ip) = pod["status"]["podIP"].as_str() else {
        return String::new();
    };
    let addr: SocketAddr = format!("{ip}:2379").parse().unwrap();
    // The server certificate names `localhost` too (etcd's gateway dials itself).
    let leaf = common::runtime().block_on(common::served_leaf(addr, config));
    let Ok(der) = leaf else {
        return String::new();
    };
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-inform", "DER", "-noout", "-serial"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&der).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Scale 3 -> 5: two members added one at a time (learner, then promoted), all Running.
fn scale_to_five(env: &Env, acked: &BTreeMap<String, String>) {
    let started = Instant::now();
    env.patch_cluster(NAME, r#"{"spec":{"size":5}}"#, "scale to 5");
    wait_running_with(env, NAME, 5, Duration::from_secs(240));
    let etcd = Members::of_size(env, NAME, 5);
    for i in 0..5 {
        etcd.assert_has_all(i, acked);
    }
    println!(
        "{NAME}: 5 voters Running {:.1} s after the scale, every member with all {} writes",
        started.elapsed().as_secs_f64(),
        acked.len()
    );
}

/// Deleted with backups on: the final snapshot Job completes while every member claim is still
/// there, then the cluster and its claims go.
fn delete_with_a_final_snapshot(env: &Env) {
    let started = Instant::now();
    let claims = |env: &Env| {
        env.get_json(&[
            "-n",
            NS,
            "pvc",
            "-l",
            &format!("app.kubernetes.io/instance={NAME}"),
        ])["items"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0)
    };
    let before = claims(env);
    assert_eq!(before, 5, "the members' claims before the deletion");
    ok(
        env.kubectl(&["-n", NS, "delete", "etcdcluster", NAME, "--wait=false"]),
        "delete the cluster",
    );
    wait_for(
        "the final snapshot Job to complete, every claim still there",
        Duration::from_secs(180),
        || {
            let job = env.kubectl(&[
                "-n",
                NS,
                "get",
                "job",
                &format!("{NAME}-final-snapshot"),
                "-o",
                "jsonpath={.status.succeeded}",
            ]);
            let done = String::from_utf8_lossy(&job.stdout).trim() == "1";
            if !done {
                assert_eq!(
                    claims(env),
                    before,
                    "a member claim went before the final snapshot"
                );
            }
            done.then_some(())
        },
    );
    let snapshot = started.elapsed();
    wait_for(
        "the cluster and its member claims gone",
        Duration::from_secs(120),
        || {
            let gone = !env
                .kubectl(&["-n", NS, "get", "etcdcluster", NAME])
                .status
                .success();
            (gone && claims(env) == 0).then_some(())
        },
    );
    let events = ok(
        env.kubectl(&[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector=reason=FinalSnapshotTaken",
            "-o",
            "name",
        ]),
        "the FinalSnapshotTaken Event",
    );
    assert!(!events.trim().is_empty(), "Event FinalSnapshotTaken");
    println!(
        "{NAME} deleted: final snapshot {:.1} s after the delete, the cluster and its claims gone {:.1} s after it",
        snapshot.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// Waits for Running with every member Ready and named in the status, and a leader.
fn wait_running(env: &Env, name: &str, within: Duration) -> Value {
    wait_running_with(env, name, SIZE, within)
}

/// Writes (one key a round, to any member that takes it) until a leader is elected in a later
/// term than `old`'s (another member, or the old leader again when it was back first);
/// returns the refused writes and the new leader.
fn write_until_new_leader(
    etcd: &Members,
    old: &Leader,
    what: &str,
    acked: &mut BTreeMap<String, String>,
) -> (usize, Leader) {
    let start = Instant::now();
    let mut failures = 0;
    let mut i = 0;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new leader within 60 s of the leader's {what} going"
        );
        let (k, v) = (format!("/orders/{what}/{i:04}"), format!("w{i}"));
        i += 1;
        match etcd.put_any(&k, &v) {
            Ok(()) => {
                acked.insert(k, v);
            }
            Err(_) => failures += 1,
        }
        if let Some(leader) = etcd.try_leader()
            && leader.term > old.term
        {
            return (failures, leader);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Members {
    /// The case study's cluster.
    fn new(env: &Env) -> Members {
        Members::of(env, NAME)
    }

    /// Another cluster of the case study, at the case study's size.
    fn of(env: &Env, name: &str) -> Members {
        Members::of_size(env, name, SIZE)
    }
}
