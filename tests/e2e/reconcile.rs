//! The reconcile loop against the real apiserver and controller manager, running as the
//! ServiceAccount the install ships (with OwnerReferencesPermissionEnforcement on), and leader
//! election on real Leases.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::wait_for;
use crate::install::{Env, NAMESPACE, ok};

const LEASE: &str = "etcd-webhook-leader";

/// The children the loop makes for a cluster `name` with a backup volume: (resource, name).
fn children(name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("service", name.to_owned()),
        ("service", format!("{name}-client")),
        ("statefulset", name.to_owned()),
        ("poddisruptionbudget", name.to_owned()),
        ("cronjob", format!("{name}-backup")),
        // The members' ConfigMap (ETCD_INITIAL_CLUSTER and the loop's memory).
        ("configmap", format!("{name}-members")),
    ]
}

/// A pod of a Job's `template`, played as a kubelet leaves it once its (last) container ended
/// 0 with `report` as its termination message at `finished`: made from the template as the
/// apiserver took it, then its status patched.
fn play_ended(env: &Env, ns: &str, template: &Value, pod: &str, report: &Value, finished: &str) {
    let made = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": ns, "labels": template["metadata"]["labels"]},
        "spec": template["spec"]});
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &made.to_string()),
        &format!("the pod {pod} from its Job's template"),
    );
    let container = &template["spec"]["containers"][0];
    let status = json!({"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": container["name"], "image": container["image"], "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "message": report.to_string(), "finishedAt": finished}}}]}});
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]),
        &format!("the played kubelet's status of {pod}"),
    );
}

fn get_opt(env: &Env, ns: &str, resource: &str, name: &str) -> Option<Value> {
    let out = env.kubectl(&[
        "-n",
        ns,
        "get",
        resource,
        name,
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// Creates the children with server-side apply as the ServiceAccount, the controllers act on
/// them, status and Events are written, and deletion runs the finalizer, after which the garbage
/// collector removes every owned object and the backup claim stays.
pub fn the_loop_creates_and_deletes_the_children(env: &Env) {
    let ns = "e2e-loop";
    let name = "loop";
    env.create_namespace(ns);
    env.create_cluster(
        ns,
        name,
        json!({"size": 3, "version": "v3.5.10", "storageSize": "1Gi",
               "backup": {"enabled": true, "schedule": "0 * * * *"}}),
    );
    let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
    let uid = ec["metadata"]["uid"].as_str().unwrap().to_owned();

    for (resource, child) in children(name) {
        let obj = wait_for(
            &format!("{resource} {child}"),
            Duration::from_secs(60),
            || get_opt(env, ns, resource, &child),
        );
        let owner = &obj["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], uid.as_str(), "{resource} {child}: {owner}");
        assert_eq!(owner["controller"], true);
        assert_eq!(owner["blockOwnerDeletion"], true);
        let applied = obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["manager"] == "etcd-webhook" && m["operation"] == "Apply");
        assert!(
            applied,
            "{resource} {child} is server-side applied by etcd-webhook: {}",
            obj["metadata"]["managedFields"]
        );
    }
    // The backup claim exists and is deliberately not owned.
    let claim = wait_for("the backup claim", Duration::from_secs(30), || {
        get_opt(env, ns, "persistentvolumeclaim", &format!("{name}-backup"))
    });
    assert!(claim["metadata"]["ownerReferences"].is_null(), "{claim}");

    // The StatefulSet controller creates the member pods (Pending: no kubelet here).
    let pod = wait_for(
        "pod loop-0 from the StatefulSet controller",
        Duration::from_secs(60),
        || get_opt(env, ns, "pod", "loop-0"),
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
    assert_eq!(pod["status"]["phase"], "Pending");
    // Backups on: the member claims the StatefulSet controller made and the backup claim carry
    // the loop's protection, so no deletion around the loop takes them before a final snapshot.
    for claim in [format!("data-{name}-0"), format!("{name}-backup")] {
        wait_for(
            &format!("{CLAIM_FINALIZER} on {claim}"),
            Duration::from_secs(60),
            || protected(env, ns, &claim).then_some(()),
        );
    }
    // The disruption controller computes the budget's status: it covers the voters' pods
    // (none yet: no member answers here), so nothing may be evicted.
    let pdb = wait_for(
        "the PDB's status from the disruption controller",
        Duration::from_secs(60),
        || {
            let pdb = get_opt(env, ns, "poddisruptionbudget", name)?;
            pdb["status"]["observedGeneration"]
                .as_i64()
                .filter(|n| *n >= 1)
                .map(|_| pdb)
        },
    );
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{}", pdb["status"]);

    // Status and Events.
    let status = wait_for("the EtcdCluster's status", Duration::from_secs(30), || {
        let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
        let status = ec["status"].clone();
        (status["phase"].is_string() && status["conditions"].is_array()).then_some(status)
    });
    assert_eq!(status["observedGeneration"], 1, "{status}");
    let events = wait_for(
        "an Event about the cluster",
        Duration::from_secs(30),
        || {
            let events = env.get_json(&["-n", ns, "events.events.k8s.io"]);
            let about: Vec<Value> = events["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["regarding"]["uid"] == uid.as_str())
                .cloned()
                .collect();
            (!about.is_empty()).then_some(about)
        },
    );
    assert!(
        events.iter().all(|e| e["reportingController"]
            .as_str()
            .is_some_and(|c| !c.is_empty())),
        "{events:?}"
    );

    // A backup run, played: the CronJob's pod template as the apiserver took it, as a pod, and
    // its status as a kubelet leaves it (the container ended 0 with the report as its
    // termination message). The loop records it: status.backup.last, BackupReady Succeeded,
    // a BackupTaken Event, and `kubectl get ec` shows LAST BACKUP.
    let cron = env.get_json(&["-n", ns, "cronjob", &format!("{name}-backup")]);
    let template = &cron["spec"]["jobTemplate"]["spec"]["template"];
    let report = json!({"uri": format!("/backup/{name}-snapshot-20261202T010000Z.db"),
        "size": 40992, "sha256": "ab".repeat(32), "revision": 211, "keys": 57,
        "hash": 3417482478u64, "compact_revision": -1, "member": format!("{name}-1"),
        "time": "2026-12-02T01:00:00Z", "seconds": 0.2, "pruned": []});
    play_ended(
        env,
        ns,
        template,
        &format!("{name}-backup-played"),
        &report,
        "2026-12-02T01:00:01Z",
    );
    let recorded = wait_for("status.backup.last", Duration::from_secs(60), || {
        let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
        let last = ec["status"]["backup"]["last"].clone();
        last.is_object().then_some(ec)
    });
    // On the claim, recorded as the URI a restore takes.
    let snapshot_uri = format!("pvc://{name}-backup/{name}-snapshot-20261202T010000Z.db");
    assert_eq!(
        recorded["status"]["backup"]["last"]["uri"],
        snapshot_uri.as_str(),
        "{}",
        recorded["status"]
    );
    let ready = recorded["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "BackupReady")
        .cloned()
        .unwrap();
    assert_eq!(ready["reason"], "Succeeded", "{ready}");
    let table = ok(
        env.kubectl(&["-n", ns, "get", "etcdcluster", name]),
        "kubectl get ec",
    );
    for column in ["LAST BACKUP", "LEADER", "VERSION"] {
        assert!(table.contains(column), "{column}: {table}");
    }
    wait_for("the BackupTaken Event", Duration::from_secs(30), || {
        let events = env.get_json(&["-n", ns, "events.events.k8s.io"]);
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "BackupTaken" && e["regarding"]["uid"] == uid.as_str())
            .then_some(())
    });

    // The snapshot is verified by restoring it: the loop makes its verification Job, which
    // this apiserver takes (a native sidecar among the init containers); its pod, played as
    // a kubelet leaves it, reports Verified, which reaches status.backup.lastVerified and a
    // BackupVerified Event.
    let verify_name = format!("{name}-verify-ababababab");
    let job = wait_for("the verification Job", Duration::from_secs(60), || {
        get_opt(env, ns, "job", &verify_name)
    });
    let template = &job["spec"]["template"];
    let init: Vec<(&str, &str)> = template["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["restartPolicy"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        init,
        [("fetch", ""), ("restore", ""), ("etcd", "Always")],
        "{job}"
    );
    let verdict = json!({"outcome": "Verified", "revision": 211, "keys": 57,
        "hash": 3417482478u64,
        "message": "restored: 57 keys and hash cbb2a4ee at revision 211, as the member had"});
    play_ended(
        env,
        ns,
        template,
        &format!("{verify_name}-played"),
        &verdict,
        "2026-12-02T01:01:00Z",
    );
    let verified = wait_for(
        "status.backup.lastVerified",
        Duration::from_secs(60),
        || {
            let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
            let v = ec["status"]["backup"]["lastVerified"].clone();
            v.is_object().then_some(v)
        },
    );
    assert_eq!(verified["outcome"], "Verified", "{verified}");
    assert_eq!(verified["uri"], snapshot_uri.as_str(), "{verified}");
    wait_for("the BackupVerified Event", Duration::from_secs(30), || {
        let events = env.get_json(&["-n", ns, "events.events.k8s.io"]);
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "BackupVerified" && e["regarding"]["uid"] == uid.as_str())
            .then_some(())
    });

    // Deletion. In the foreground the garbage collector would delete the members beside the
    // finalizer, before the final snapshot: the webhook refuses it and says what to do.
    let finalizers =
        env.get_json(&["-n", ns, "etcdcluster", name])["metadata"]["finalizers"].clone();
    assert_eq!(finalizers, json!(["etcd.example.com/finalizer"]));
    let refused = env.kubectl(&[
        "-n",
        ns,
        "delete",
        "etcdcluster",
        name,
        "--cascade=foreground",
        "--wait=false",
    ]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("kubectl delete --cascade=background"),
        "a foreground deletion with backups on is refused: {said}"
    );
    assert!(
        env.get_json(&["-n", ns, "etcdcluster", name])["metadata"]["deletionTimestamp"].is_null()
    );
    // In the background: the finalizer starts the final snapshot Job. No kubelet runs it, so
    // after --finalizer-timeout (20 s) the attempt is replaced with a Warning, and the cluster
    // and its claims stay until the release annotation lets them go.
    ok(
        env.kubectl(&["-n", ns, "delete", "etcdcluster", name, "--wait=false"]),
        "delete the EtcdCluster",
    );
    let job = wait_for("the final snapshot Job", Duration::from_secs(60), || {
        get_opt(env, ns, "job", &format!("{name}-final-snapshot"))
    });
    let job_seen = std::time::Instant::now();
    assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    // The note of the cluster's Warning `reason`, if there is one.
    let warning = |reason: &str| {
        let events = env.get_json(&["-n", ns, "events.events.k8s.io"]);
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| {
                e["regarding"]["uid"] == uid.as_str()
                    && e["reason"] == reason
                    && e["type"] == "Warning"
            })
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
    };
    let warned = |reason: &str| warning(reason).is_some();
    let note = wait_for(
        "the Warning FinalSnapshotFailed",
        Duration::from_secs(90),
        || warning("FinalSnapshotFailed"),
    );
    // The timeout's doing (no kubelet runs the Job, so it never fails by itself), and not
    // before --finalizer-timeout (20 s) has passed since the Job was made.
    assert!(
        note.contains("did not finish within 20s"),
        "the Warning names the timeout: {note}"
    );
    assert!(
        job_seen.elapsed() >= Duration::from_secs(19),
        "the Warning came {:?} after the Job, before the 20 s timeout",
        job_seen.elapsed()
    );
    wait_for("a new final snapshot Job", Duration::from_secs(60), || {
        get_opt(env, ns, "job", &format!("{name}-final-snapshot"))
            .filter(|j| j["metadata"]["uid"] != job["metadata"]["uid"])
    });
    assert!(
        get_opt(env, ns, "etcdcluster", name).is_some(),
        "the cluster waits for its final snapshot"
    );
    for claim in [format!("data-{name}-0"), format!("{name}-backup")] {
        assert!(protected(env, ns, &claim), "{claim} is kept");
    }
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "annotate",
            "etcdcluster",
            name,
            &format!("{RELEASE_ANNOTATION}=true"),
        ]),
        "let the cluster go without a final snapshot",
    );
    wait_for(
        "the EtcdCluster to be gone",
        Duration::from_secs(120),
        || {
            let out = env.kubectl(&["-n", ns, "get", "etcdcluster", name]);
            (!out.status.success()).then_some(())
        },
    );
    let mut owned = children(name);
    owned.push(("job", format!("{name}-final-snapshot")));
    owned.push(("pod", "loop-0".to_owned()));
    owned.push(("persistentvolumeclaim", format!("data-{name}-0")));
    for (resource, child) in owned {
        wait_for(
            &format!("the garbage collector to delete {resource} {child}"),
            Duration::from_secs(90),
            || get_opt(env, ns, resource, &child).is_none().then_some(()),
        );
    }
    assert!(
        get_opt(env, ns, "persistentvolumeclaim", &format!("{name}-backup")).is_some(),
        "the backup claim outlives the cluster"
    );
    assert!(
        !protected(env, ns, &format!("{name}-backup")),
        "released: a later deletion of the backup claim is not held"
    );
    assert!(
        warned("FinalSnapshotSkipped"),
        "the release is reported as a Warning Event"
    );

    // A new cluster from the snapshot on the claim that outlived it: the apiserver takes the
    // first restore Job as rendered (the claim mounted read-only), and only the first (one at
    // a time on a claim); no StatefulSet while it has not run (no kubelet here).
    let restored = "loop-again";
    env.create_cluster(
        ns,
        restored,
        json!({"size": 3, "version": "v3.5.10", "storageSize": "1Gi",
               "restore": {"from": snapshot_uri}}),
    );
    let job = wait_for("the first restore Job", Duration::from_secs(60), || {
        get_opt(env, ns, "job", &format!("{restored}-restore-0"))
    });
    let pod = &job["spec"]["template"]["spec"];
    let source = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "source")
        .cloned()
        .unwrap_or_else(|| panic!("{pod}"));
    assert_eq!(
        source["persistentVolumeClaim"],
        json!({"claimName": format!("{name}-backup"), "readOnly": true})
    );
    let condition = wait_for("Restored Restoring", Duration::from_secs(30), || {
        let ec = env.get_json(&["-n", ns, "etcdcluster", restored]);
        ec["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Restored" && c["reason"] == "Restoring")
            .cloned()
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .starts_with("0/3 members restored"),
        "{condition}"
    );
    // Held for a while (the loop's passes go on: a resync, the Job's and claims' events), not
    // just once: the second Job and the StatefulSet wait for the first Job's success.
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_secs(8) {
        assert!(
            get_opt(env, ns, "job", &format!("{restored}-restore-1")).is_none(),
            "a second restore Job before the first ran"
        );
        assert!(
            get_opt(env, ns, "statefulset", restored).is_none(),
            "a StatefulSet before the restore Jobs ran"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    ok(
        env.kubectl(&["-n", ns, "delete", "etcdcluster", restored, "--wait=false"]),
        "delete the restoring EtcdCluster",
    );
}

/// blockOwnerDeletion at work: `kubectl delete --cascade=foreground` returns only after the
/// garbage collector has removed the children (a cluster without backups: the finalizer has no
/// snapshot to take); the members' claims follow (the retention policy).
pub fn foreground_deletion_waits_for_the_children(env: &Env) {
    let ns = "e2e-foreground";
    let name = "fg";
    env.create_namespace(ns);
    env.create_cluster(
        ns,
        name,
        json!({"size": 1, "version": "v3.5.10", "storageSize": "1Gi"}),
    );
    let blocking = [
        ("statefulset", name.to_owned()),
        ("service", name.to_owned()),
        ("service", format!("{name}-client")),
        ("poddisruptionbudget", name.to_owned()),
    ];
    for (resource, child) in &blocking {
        wait_for(
            &format!("{resource} {child}"),
            Duration::from_secs(60),
            || get_opt(env, ns, resource, child),
        );
    }
    wait_for("the member's claim", Duration::from_secs(60), || {
        get_opt(env, ns, "persistentvolumeclaim", &format!("data-{name}-0"))
    });
    delete_in_foreground(env, ns, name);
    for (resource, child) in &blocking {
        assert!(
            get_opt(env, ns, resource, child).is_none(),
            "{resource} {child} was gone before the cluster"
        );
    }
    // The member's volume goes with the cluster (persistentVolumeClaimRetentionPolicy
    // whenDeleted: Delete): the StatefulSet controller owns the claim, the garbage collector
    // removes it once the PVC protection controller sees no pod using it.
    let claim = format!("data-{name}-0");
    let start = std::time::Instant::now();
    while get_opt(env, ns, "persistentvolumeclaim", &claim).is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "claim {claim} still there 60 s after its cluster was deleted"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The loop's claim protection (while backups are on).
const CLAIM_FINALIZER: &str = "etcd.example.com/final-snapshot";
/// The annotation that lets a held deletion go without a final snapshot.
const RELEASE_ANNOTATION: &str = "etcd.example.com/release-volumes";

/// Whether claim `name` carries the loop's protection.
fn protected(env: &Env, ns: &str, name: &str) -> bool {
    get_opt(env, ns, "persistentvolumeclaim", name).is_some_and(|c| {
        c["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == CLAIM_FINALIZER))
    })
}

/// A namespace deleted under a cluster with backups: the namespace controller deletes the
/// members and the apiserver creates no Job there, so no final snapshot can be taken. The
/// protected claims stay (Terminating, their data in place), the cluster's Ready condition
/// says what to do, and the release annotation lets the claims, the cluster and the namespace
/// go.
pub fn namespace_deletion_keeps_the_claims_until_released(env: &Env) {
    let ns = "e2e-ns-deletion";
    let name = "nsd";
    env.create_namespace(ns);
    env.create_cluster(
        ns,
        name,
        json!({"size": 1, "version": "v3.5.10", "storageSize": "1Gi",
               "backup": {"enabled": true, "schedule": "0 * * * *"}}),
    );
    let claims = [format!("data-{name}-0"), format!("{name}-backup")];
    for claim in &claims {
        wait_for(
            &format!("{CLAIM_FINALIZER} on {claim}"),
            Duration::from_secs(60),
            || protected(env, ns, claim).then_some(()),
        );
    }
    ok(
        env.kubectl(&["delete", "namespace", ns, "--wait=false"]),
        "delete the namespace",
    );
    let ready = wait_for(
        "the held deletion in the Ready condition",
        Duration::from_secs(90),
        || {
            let ec = get_opt(env, ns, "etcdcluster", name)?;
            ec["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| {
                    c["type"] == "Ready"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("no final snapshot can be taken"))
                })
                .cloned()
        },
    );
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{RELEASE_ANNOTATION}=true")) && message.contains("Retain"),
        "{message}"
    );
    // Kept: the namespace controller has asked for the claims' deletion, and they stay.
    std::thread::sleep(Duration::from_secs(5));
    for claim in &claims {
        let c = get_opt(env, ns, "persistentvolumeclaim", claim)
            .unwrap_or_else(|| panic!("{claim} was deleted before a final snapshot"));
        assert!(
            !c["metadata"]["deletionTimestamp"].is_null() && protected(env, ns, claim),
            "{claim}: {}",
            c["metadata"]
        );
    }
    let namespace = env.get_json(&["namespace", ns]);
    assert_eq!(namespace["status"]["phase"], "Terminating");
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "annotate",
            "etcdcluster",
            name,
            &format!("{RELEASE_ANNOTATION}=true"),
        ]),
        "let the claims go",
    );
    wait_for("the namespace to be gone", Duration::from_secs(180), || {
        (!env.kubectl(&["get", "namespace", ns]).status.success()).then_some(())
    });
}

/// `kubectl delete --cascade=foreground` of cluster `name`: returns once the garbage collector
/// has removed its owned children (at most 120 s).
fn delete_in_foreground(env: &Env, ns: &str, name: &str) {
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "delete",
            "etcdcluster",
            name,
            "--cascade=foreground",
            "--timeout=120s",
        ]),
        &format!("foreground deletion of {ns}/{name}"),
    );
}

fn lease(env: &Env) -> Value {
    env.get_json(&["-n", NAMESPACE, "lease", LEASE])
}

pub fn holder(env: &Env) -> Option<String> {
    lease(env)["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

/// Two replicas on a real Lease: one reconciles; killing it hands over within the lease
/// duration; SIGTERM releases the Lease.
pub fn leader_election_on_real_leases(env: &Env) {
    // The serving replica holds the Lease (it is the only one running).
    let first = wait_for("a Lease holder", Duration::from_secs(30), || holder(env));
    wait_for(
        "the serving replica to report leadership",
        Duration::from_secs(10),
        || {
            let leader = env
                .webhook
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .metric("etcd_webhook_controller_leader", "");
            (leader == 1.0).then_some(())
        },
    );
    let duration = lease(env)["spec"]["leaseDurationSeconds"].as_u64().unwrap();

    let second = env.start_replica("etcd-webhook-e2e-1", &[]);
    // The second competes (its elector runs), and the holder renews meanwhile: it keeps it.
    assert!(
        second.wait_log("waiting for leadership", Duration::from_secs(30)),
        "{}",
        second.log()
    );
    let renewed = lease(env)["spec"]["renewTime"].clone();
    wait_for(
        "the holder's next renewal",
        Duration::from_secs(duration + 5),
        || (lease(env)["spec"]["renewTime"] != renewed).then_some(()),
    );
    assert_eq!(holder(env), Some(first), "the holder keeps it");
    assert_eq!(second.metric("etcd_webhook_controller_leader", ""), 0.0);

    // Kill the holder (no chance to release), route the Service to the survivor.
    let mut old = env.webhook.lock().unwrap().take().unwrap();
    env.route_to(&second);
    let killed = Instant::now();
    old.child.kill().unwrap();
    let _ = old.child.wait();
    wait_for(
        "the second replica to take the Lease",
        Duration::from_secs(duration * 2 + 10),
        || (holder(env).as_deref() == Some("etcd-webhook-e2e-1")).then_some(()),
    );
    let takeover = killed.elapsed();
    eprintln!(
        "    takeover after SIGKILL: {:.1} s (lease {duration} s)",
        takeover.as_secs_f64()
    );
    assert!(
        takeover <= Duration::from_secs(duration + 5),
        "took over within the lease duration: {takeover:?}"
    );
    wait_for(
        "the survivor to report leadership",
        Duration::from_secs(10),
        || (second.metric("etcd_webhook_controller_leader", "") == 1.0).then_some(()),
    );
    // The survivor reconciles: a cluster created now gets its StatefulSet.
    let ns = "e2e-leader";
    env.create_namespace(ns);
    env.create_cluster(
        ns,
        "led",
        json!({"size": 1, "version": "v3.5.10", "storageSize": "1Gi"}),
    );
    wait_for(
        "the survivor's StatefulSet",
        Duration::from_secs(60),
        || get_opt(env, ns, "statefulset", "led"),
    );

    // SIGTERM: the Lease is released and the process exits 0.
    let mut second = second;
    second.sigterm();
    assert_eq!(
        second.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        second.log()
    );
    let released = holder(env);
    assert_eq!(released, None, "SIGTERM released the Lease: {}", lease(env));

    // A new replica serves and leads again (it does not wait out the released Lease).
    env.serve_with("etcd-webhook-e2e-2");
    wait_for(
        "the new replica to take the released Lease",
        Duration::from_secs(15),
        || (holder(env).as_deref() == Some("etcd-webhook-e2e-2")).then_some(()),
    );
    env.wait_webhook_called();
}

/// Server-side applies of StatefulSets the apiserver has answered (its own counter).
fn statefulset_applies(env: &Env) -> f64 {
    let metrics = ok(
        env.kubectl(&["get", "--raw", "/metrics"]),
        "the apiserver's /metrics",
    );
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("resource=\"statefulsets\"")
                && l.contains("verb=\"APPLY\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// 1024Gi comes back from the apiserver as 1Ti: the loop must neither re-apply an unchanged
/// cluster nor miss the growth to 2048Gi (which must take the resize path: a changed
/// volumeClaimTemplates is refused).
pub fn storage_in_tebibytes_settles_and_grows(env: &Env) {
    let ns = "e2e-tebibytes";
    let name = "tb";
    env.create_namespace(ns);
    // Claims of a class that allows expansion can grow (admission plugin
    // PersistentVolumeClaimResize); nothing provisions them here.
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "nvme"}, "provisioner": "example.com/none",
        "allowVolumeExpansion": true});
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &class.to_string()),
        "StorageClass",
    );
    env.create_cluster(
        ns,
        name,
        json!({"size": 1, "version": "v3.5.10", "storageClass": "nvme", "storageSize": "1024Gi"}),
    );
    let template = |env: &Env| {
        get_opt(env, ns, "statefulset", name).map(|s| {
            s["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
    };
    assert_eq!(
        wait_for("the StatefulSet", Duration::from_secs(60), || template(env)),
        "1Ti",
        "the apiserver stores 1024Gi as 1Ti"
    );
    // Each annotation is a change the loop reconciles; none may re-apply the StatefulSet.
    let reconciles = || {
        env.webhook
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .metric("etcd_webhook_controller_reconciles_total", "")
    };
    // Let the first passes (finalizer, status) settle: the counter is the loop's, for every
    // cluster (the 200 of an earlier scenario too), so on a busy machine this takes a while.
    let mut last = reconciles();
    wait_for(
        "the loop's passes to settle (no reconcile for 2 s)",
        Duration::from_secs(180),
        || {
            std::thread::sleep(Duration::from_secs(2));
            let now = reconciles();
            (std::mem::replace(&mut last, now) == now).then_some(())
        },
    );
    let applies = statefulset_applies(env);
    // This cluster's own passes (the counter above is every cluster's).
    let passes = || {
        env.serving_log()
            .lines()
            .filter(|l| l.contains("reconciled") && l.contains(&format!("{ns}/{name} ")))
            .count()
    };
    assert!(passes() > 0, "the loop logs each pass of the cluster");
    for i in 0..3 {
        let before = passes();
        ok(
            env.kubectl(&[
                "-n",
                ns,
                "annotate",
                "--overwrite",
                "etcdcluster",
                name,
                &format!("e2e/touch={i}"),
            ]),
            "annotate",
        );
        wait_for(
            "a reconcile of this cluster",
            Duration::from_secs(30),
            || (passes() > before).then_some(()),
        );
    }
    assert_eq!(
        statefulset_applies(env),
        applies,
        "an unchanged 1024Gi cluster was re-applied"
    );
    // The StatefulSet controller made the member's claim; bind it as a provisioner would.
    let claim = format!("data-{name}-0");
    wait_for("the member claim", Duration::from_secs(60), || {
        get_opt(env, ns, "persistentvolumeclaim", &claim)
    });
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "patch",
            "persistentvolumeclaim",
            &claim,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Bound","capacity":{"storage":"1Ti"}}}"#,
        ]),
        "bind the claim",
    );
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "patch",
            "etcdcluster",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"storageSize":"2048Gi"}}"#,
        ]),
        "grow to 2048Gi",
    );
    wait_for(
        "the StatefulSet recreated with 2Ti claims",
        Duration::from_secs(60),
        || (template(env).as_deref() == Some("2Ti")).then_some(()),
    );
    let pvc = get_opt(env, ns, "persistentvolumeclaim", &claim).unwrap();
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "2Ti");
    let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
    assert_ne!(ec["status"]["phase"], "Failed", "{}", ec["status"]);
    ok(
        env.kubectl(&["delete", "namespace", ns, "--wait=false"]),
        "delete the namespace",
    );
}

/// A TLS cluster (`spec.tls: {}`) with the real cert-manager: the loop, as the install's
/// ServiceAccount, applies the cluster's own CA chain and the three leaf Certificates (owned by
/// the EtcdCluster); cert-manager issues them; each Secret holds a leaf that chains to the
/// `ca.crt` beside it (openssl verify), with the names the members are reached by and the
/// usages etcd needs; the product's own client parses the client Secret; the StatefulSet runs
/// the members with client-certificate auth on those Secrets; the digest of what was applied
/// is recorded, and deleting the cluster removes the Certificates and Issuers with it.
pub fn a_tls_cluster_gets_its_certificates_from_cert_manager(env: &Env) {
    use base64::Engine as _;
    let ns = "e2e-tls";
    let name = "sec";
    env.create_namespace(ns);
    let started = Instant::now();
    env.create_cluster(
        ns,
        name,
        json!({"size": 3, "version": "v3.6.4", "storageSize": "1Gi", "tls": {}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut files = std::collections::BTreeMap::new();
    for purpose in ["peer", "server", "client"] {
        let secret = format!("{name}-{purpose}-tls");
        let data = wait_for(
            &format!("cert-manager's Secret {secret}"),
            Duration::from_secs(90),
            || {
                let s = get_opt(env, ns, "secret", &secret)?;
                let d = s["data"].clone();
                ["ca.crt", "tls.crt", "tls.key"]
                    .iter()
                    .all(|k| d[*k].as_str().is_some_and(|v| !v.is_empty()))
                    .then_some(d)
            },
        );
        let folder = dir.path().join(purpose);
        std::fs::create_dir_all(&folder).unwrap();
        for k in ["ca.crt", "tls.crt", "tls.key"] {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data[k].as_str().unwrap())
                .unwrap();
            std::fs::write(folder.join(k), &bytes).unwrap();
            files.insert(format!("{purpose}/{k}"), bytes);
        }
        let verify = std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(folder.join("ca.crt"))
            .arg(folder.join("tls.crt"))
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{secret}: {}",
            String::from_utf8_lossy(&verify.stderr)
        );
        let text = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(folder.join("tls.crt"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        let wants: &[&str] = match purpose {
            "server" => &[
                "DNS:*.sec.e2e-tls.svc",
                "DNS:sec-client.e2e-tls.svc",
                "DNS:localhost",
                "TLS Web Server Authentication",
                "TLS Web Client Authentication",
            ],
            "peer" => &[
                "DNS:*.sec.e2e-tls.svc",
                "TLS Web Server Authentication",
                "TLS Web Client Authentication",
            ],
            _ => &["TLS Web Client Authentication"],
        };
        for want in wants {
            assert!(text.contains(want), "{secret} lacks {want}:\n{text}");
        }
    }
    let issued = started.elapsed();
    // cert-manager labels the client Secret from the Certificate's secretTemplate: the loop's
    // watch cache selects it by that label (and only it).
    for purpose in ["peer", "server", "client"] {
        let secret = get_opt(env, ns, "secret", &format!("{name}-{purpose}-tls")).unwrap();
        let label = &secret["metadata"]["labels"][etcd_webhook::api::CLIENT_TLS_LABEL];
        if purpose == "client" {
            assert_eq!(label, "true", "{}", secret["metadata"]);
        } else {
            assert!(label.is_null(), "{purpose}: {}", secret["metadata"]);
        }
    }
    // One CA for all three.
    assert_eq!(files["peer/ca.crt"], files["client/ca.crt"]);
    assert_eq!(files["server/ca.crt"], files["client/ca.crt"]);
    // What the loop builds its client from.
    etcd_webhook::controller::etcd::ClientTls {
        ca: files["client/ca.crt"].clone(),
        cert: files["client/tls.crt"].clone(),
        key: files["client/tls.key"].clone(),
    }
    .config()
    .expect("the client Secret makes a client configuration");

    let owned = |resource: &str, child: &str| {
        let obj = get_opt(env, ns, resource, child)
            .unwrap_or_else(|| panic!("{resource} {child} is missing"));
        assert_eq!(
            obj["metadata"]["ownerReferences"][0]["kind"], "EtcdCluster",
            "{resource} {child}"
        );
        obj
    };
    for child in ["sec-ca", "sec-peer", "sec-server", "sec-client"] {
        let cert = owned("certificates.cert-manager.io", child);
        let ready = cert["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "Certificate {child}: {}", cert["status"]);
    }
    for child in ["sec-selfsigned", "sec-ca"] {
        owned("issuers.cert-manager.io", child);
    }
    let sts = wait_for("the StatefulSet", Duration::from_secs(30), || {
        get_opt(env, ns, "statefulset", name)
    });
    let args = sts["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for want in [
        "--client-cert-auth=true",
        "--peer-client-cert-auth=true",
        "--listen-client-urls=https://0.0.0.0:2379",
    ] {
        assert!(args.contains(want), "{want} in {args}");
    }
    let volumes = sts["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains("sec-peer-tls") && volumes.contains("sec-server-tls"),
        "{volumes}"
    );
    // The NetworkPolicy (the install's default `--network-policy=tls`), as the apiserver took it.
    let policy = wait_for(
        "the members' NetworkPolicy",
        Duration::from_secs(30),
        || get_opt(env, ns, "networkpolicy", name),
    );
    assert_eq!(
        policy["metadata"]["ownerReferences"][0]["kind"],
        "EtcdCluster"
    );
    let ingress = &policy["spec"]["ingress"];
    assert_eq!(ingress[0]["ports"][0]["port"], "peer", "{ingress}");
    assert_eq!(
        ingress[1]["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        NAMESPACE,
        "the install's namespace is let in: {ingress}"
    );
    assert_eq!(
        ingress[1]["from"][3]["podSelector"]["matchLabels"]["etcd.example.com/client"], name,
        "{ingress}"
    );
    let digest = wait_for(
        "the digest of the applied certificates on the members' ConfigMap",
        Duration::from_secs(60),
        || {
            let cm = get_opt(env, ns, "configmap", "sec-members")?;
            cm["metadata"]["annotations"]["etcd.example.com/certificates"]
                .as_str()
                .map(str::to_owned)
        },
    );
    assert_eq!(digest.len(), 16, "{digest}");
    // A whole-object update written without spec.tls (kubectl replace): /mutate keeps the
    // stored one before the CRD's rule judges it, so it is admitted and TLS stays.
    let mut replaced = env.get_json(&["-n", ns, "etcdcluster", name]);
    replaced["spec"].as_object_mut().unwrap().remove("tls");
    replaced["spec"]["size"] = json!(5);
    replaced.as_object_mut().unwrap().remove("status");
    ok(
        env.kubectl_in(&["replace", "-f", "-"], &replaced.to_string()),
        "replace the TLS cluster without spec.tls",
    );
    let after = env.get_json(&["-n", ns, "etcdcluster", name]);
    assert_eq!(after["spec"]["tls"], json!({}), "{}", after["spec"]);
    assert_eq!(after["spec"]["size"], 5);
    println!(
        "    TLS cluster: cert-manager issued the CA and the three leaves {:.1} s after the create",
        issued.as_secs_f64()
    );
    delete_in_foreground(env, ns, name);
    for (resource, child) in [
        ("certificates.cert-manager.io", "sec-server"),
        ("issuers.cert-manager.io", "sec-ca"),
        ("networkpolicy", "sec"),
    ] {
        wait_for(
            &format!("{resource} {child} gone with its cluster"),
            Duration::from_secs(60),
            || get_opt(env, ns, resource, child).is_none().then_some(()),
        );
    }
}
