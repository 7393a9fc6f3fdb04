//! Retiring v1alpha1 and v1beta1 on a cluster of its own: the seed's operator (v1alpha1 only,
//! stored as v1alpha1) with 500 EtcdClusters, this project installed over it, `migrate-storage`
//! (rehearsed, killed halfway, run again under concurrent writes, as a ServiceAccount holding only
//! config/storage-migration's ClusterRole), then docs/versions.md's "Retiring v1alpha1 and
//! v1beta1" run as written. What etcd holds is read from etcd itself, not through the apiserver.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{self, ControlPlane, wait_for};
use crate::common;
use crate::install::{CRD, Env, NAMESPACE, apply_as_installer, ok, wait_established};

const OBJECTS: usize = 500;
const NAMESPACES: [&str; 2] = ["legacy-a", "legacy-b"];
const PREFIX: &str = "/registry/etcd.example.com/etcdclusters/";
/// Added while the migration runs: created in v1beta1, and labels written on old objects.
const CONCURRENT: usize = 30;

/// The seed operator's CRD: this project's v1alpha1 schema as the only version, stored, with no
/// conversion webhook, no cert-manager annotation and no CEL rules (the seed had none: its even
/// sizes got in, and this install's CEL rules, ratcheted, must let the migration rewrite them).
fn seed_crd() -> Value {
    let mut crd = serde_json::to_value(etcd_webhook::api::crd()).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let mut v1alpha1 = versions
        .iter()
        .find(|v| v["name"] == "v1alpha1")
        .unwrap()
        .clone();
    v1alpha1["storage"] = json!(true);
    v1alpha1["served"] = json!(true);
    let obj = v1alpha1.as_object_mut().unwrap();
    obj.remove("deprecated");
    obj.remove("deprecationWarning");
    without_cel(&mut v1alpha1);
    crd["spec"]["versions"] = json!([v1alpha1]);
    crd["spec"].as_object_mut().unwrap().remove("conversion");
    crd["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    crd
}

fn without_cel(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            map.remove("x-kubernetes-validations");
            map.values_mut().for_each(without_cel);
        }
        Value::Array(items) => items.iter_mut().for_each(without_cel),
        _ => {}
    }
}

/// The i-th seed object: every v1alpha1 field, labels, an annotation, and on some a foreign
/// finalizer; every 50th has an even size, which the seed allowed and this project's rules deny.
fn seed_object(i: usize) -> Value {
    let replicas = if i % 50 == 7 { 4 } else { [1, 3, 5][i % 3] };
    let class = ["standard", "ssd", "nvme"][i % 3];
    let mut spec = json!({
        "replicas": replicas,
        "etcdVersion": format!("3.5.{}", i % 12),
        "storageClassName": class,
        "storageSizeGi": 1 + i % 40,
    });
    if i.is_multiple_of(4) {
        spec["backupEnabled"] = json!(i.is_multiple_of(8));
        spec["backupSchedule"] = json!(format!("{} */6 * * *", i % 60));
    }
    let mut metadata = json!({
        "name": format!("seed-{i:03}"),
        "namespace": NAMESPACES[i % 2],
        "labels": {"team": format!("t{}", i % 7), "tier": "legacy"},
        "annotations": {"example.com/owner": format!("owner-{i}")},
    });
    if i.is_multiple_of(25) {
        metadata["finalizers"] = json!(["example.com/keep"]);
    }
    json!({"apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster",
        "metadata": metadata, "spec": spec})
}

/// Every EtcdCluster as etcd stores it: key -> the stored object (JSON, as the apiserver
/// encodes custom resources). Read with etcd's JSON gateway (`/v3/kv/range`).
fn etcd_objects(cp: &ControlPlane) -> BTreeMap<String, Value> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut end = PREFIX.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let body = json!({"key": b64.encode(PREFIX), "range_end": b64.encode(&end)}).to_string();
    let response = http_post(&cp.etcd_url, "/v3/kv/range", &body);
    let response: Value = serde_json::from_str(&response).expect("etcd's range answer");
    response["kvs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            let key = b64.decode(kv["key"].as_str().unwrap()).unwrap();
            let value = b64.decode(kv["value"].as_str().unwrap()).unwrap();
            (
                String::from_utf8(key).unwrap(),
                serde_json::from_slice(&value).expect("a custom resource is stored as JSON"),
            )
        })
        .collect()
}

/// HTTP/1.0 POST (so the answer is not chunked) to a plain-HTTP loopback URL.
fn http_post(base: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let host = base.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(host).expect("connect to etcd");
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        tcp,
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200"), "etcd answered {head}");
    body.to_owned()
}

/// How many stored objects are encoded in each apiVersion.
fn encodings(cp: &ControlPlane) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for obj in etcd_objects(cp).values() {
        *out.entry(obj["apiVersion"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    out
}

fn stored_versions(env: &Env) -> Vec<String> {
    serde_json::from_value(env.get_json(&["crd", CRD])["status"]["storedVersions"].clone()).unwrap()
}

/// Every EtcdCluster read in v1: `namespace/name` -> the object.
fn read_all_v1(env: &Env) -> BTreeMap<String, Value> {
    let list = env.get_json(&["etcdclusters.v1.etcd.example.com", "-A"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            assert_eq!(o["apiVersion"], "etcd.example.com/v1");
            (
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                ),
                o.clone(),
            )
        })
        .collect()
}

/// What the migration must keep: spec, status, labels, annotations, finalizers.
fn kept(o: &Value) -> Value {
    let m = &o["metadata"];
    json!({"spec": o["spec"], "status": o["status"], "labels": m["labels"],
        "annotations": m["annotations"], "finalizers": m["finalizers"]})
}

/// The `-o json` report of a `migrate-storage` run that must have succeeded.
fn json_report(out: &std::process::Output, what: &str) -> Value {
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "{what}: {report}");
    report
}

/// `etcd-webhook ARGS` with `kubeconfig`.
fn command(kubeconfig: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::BIN);
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("ETCD_WEBHOOK_LOG_FORMAT", "text")
        .current_dir(common::root());
    cmd
}

/// A ServiceAccount bound to config/storage-migration's ClusterRole and nothing else, and its
/// kubeconfig.
fn migrator_kubeconfig(env: &Env) -> PathBuf {
    let rendered = ok(
        Command::new(common::k8s_tools().join("kubectl"))
            .args(["kustomize", "config/storage-migration"])
            .current_dir(common::root())
            .output()
            .unwrap(),
        "kubectl kustomize config/storage-migration",
    );
    ok(
        env.kubectl_in(&["apply", "--server-side", "-f", "-"], &rendered),
        "apply config/storage-migration",
    );
    ok(
        env.kubectl(&[
            "-n",
            NAMESPACE,
            "create",
            "serviceaccount",
            "storage-migrator",
        ]),
        "create the migrator's ServiceAccount",
    );
    ok(
        env.kubectl(&[
            "create",
            "clusterrolebinding",
            "etcd-webhook-storage-migrator",
            "--clusterrole=etcd-webhook-storage-migrator",
            &format!("--serviceaccount={NAMESPACE}:storage-migrator"),
        ]),
        "bind the migrator's ClusterRole",
    );
    let token = ok(
        env.kubectl(&["-n", NAMESPACE, "create", "token", "storage-migrator"]),
        "a token of the migrator",
    );
    let path = env.cp.dir.join("storage-migrator.kubeconfig");
    std::fs::write(
        &path,
        cluster::kubeconfig(
            &env.cp.server,
            &env.cp.ca_pem,
            &cluster::token_user(token.trim()),
        ),
    )
    .unwrap();
    path
}

pub fn retiring_old_versions(cp: ControlPlane) {
    // 1. The seed's world: its CRD, 500 objects in v1alpha1, some with a status.
    apply_as_installer(&cp, &seed_crd(), "apply the seed's CRD");
    wait_established(&cp, "the seed's CRD becomes Established");
    for ns in NAMESPACES {
        ok(
            cp.kubectl_output(&["create", "namespace", ns], None),
            "create a namespace",
        );
    }
    let items: Vec<Value> = (0..OBJECTS).map(seed_object).collect();
    let t = Instant::now();
    ok(
        cp.kubectl_output(
            &["create", "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()),
        ),
        "create the seed's EtcdClusters",
    );
    eprintln!(
        "    {OBJECTS} EtcdClusters created in v1alpha1 in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for i in (0..OBJECTS).step_by(37) {
        let status = json!({"status": {"phase": "Running", "readyReplicas": 1 + i % 3}});
        ok(
            cp.kubectl_output(
                &[
                    "-n",
                    NAMESPACES[i % 2],
                    "patch",
                    "etcdcluster",
                    &format!("seed-{i:03}"),
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status.to_string(),
                ],
                None,
            ),
            "write a seed status",
        );
    }
    assert_eq!(
        encodings(&cp),
        BTreeMap::from([("etcd.example.com/v1alpha1".to_owned(), OBJECTS)]),
        "the seed's objects are stored as v1alpha1"
    );

    // 2. This project over it (webhooks only: no loop writing statuses, which would re-encode).
    let env = Env::install_with(cp, &["--controller=off"]);
    assert_eq!(stored_versions(&env), ["v1alpha1", "v1"]);
    let webhook_metric = |name: &str| {
        env.webhook
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .metric(name, "")
    };
    let converted = webhook_metric("etcd_webhook_converted_objects_total");
    let before = read_all_v1(&env);
    assert_eq!(before.len(), OBJECTS, "every seed object reads in v1");
    assert!(
        webhook_metric("etcd_webhook_converted_objects_total") > converted,
        "the v1 reads went through /convert"
    );
    let sample = &before["legacy-a/seed-000"];
    assert_eq!(sample["spec"]["size"], 1, "{sample}");
    assert_eq!(sample["spec"]["version"], "v3.5.0", "{sample}");
    assert_eq!(sample["spec"]["storageSize"], "1Gi", "{sample}");
    assert_eq!(
        encodings(&env.cp),
        BTreeMap::from([("etcd.example.com/v1alpha1".to_owned(), OBJECTS)]),
        "reading in v1 rewrites nothing"
    );

    // Stopping to serve v1alpha1 is refused while it is stored.
    let admin = env.cp.kubeconfig.clone();
    let out = command(&admin, &["crd", "--served", "v1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refusing to stop serving v1alpha1")
            && stderr.contains("migrate-storage")
            && out.stdout.is_empty(),
        "{stderr}"
    );

    // And the apiserver itself refuses the CRD without v1alpha1.
    let offline = ok(
        command(&admin, &["crd", "--served", "v1", "--offline"])
            .output()
            .unwrap(),
        "crd --served v1 --offline",
    );
    let out = env.kubectl_in(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &offline,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("must remain in spec.versions until a storage migration"),
        "{stderr}"
    );

    // 3. The migration, as a ServiceAccount with only the migrator's ClusterRole.
    let migrator = migrator_kubeconfig(&env);
    // A dry run goes through conversion and the webhooks and writes nothing.
    let out = command(&migrator, &["migrate-storage", "--dry-run", "-o", "json"])
        .output()
        .unwrap();
    let report = json_report(&out, "dry run");
    assert_eq!(report["listed"], OBJECTS, "{report}");
    assert_eq!(report["rewritten"], OBJECTS, "{report}");
    assert_eq!(report["storedVersionsAfter"], json!(["v1alpha1", "v1"]));
    assert_eq!(
        encodings(&env.cp)["etcd.example.com/v1alpha1"],
        OBJECTS,
        "a dry run writes nothing"
    );

    // Killed halfway: some objects are rewritten, storedVersions untouched.
    let mut child = command(&migrator, &["migrate-storage", "--concurrency=1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines
        .by_ref()
        .take(200)
        .map_while(Result::ok)
        .find(|l| l.contains("migrate-storage progress"))
        .expect("a progress line");
    child.kill().unwrap();
    child.wait().unwrap();
    let halfway = encodings(&env.cp);
    eprintln!("    killed after {first:?}: stored {halfway:?}");
    assert!(
        halfway.get("etcd.example.com/v1").copied().unwrap_or(0) >= 25
            && halfway["etcd.example.com/v1alpha1"] > 0,
        "killed halfway: {halfway:?}"
    );
    assert_eq!(stored_versions(&env), ["v1alpha1", "v1"]);

    // Run again to the end, while others create and update EtcdClusters.
    let writer = {
        let kubeconfig = admin.clone();
        std::thread::spawn(move || {
            let kubectl = |args: &[&str], stdin: Option<&str>| {
                ok(
                    cluster::kubectl_as(&kubeconfig, args, stdin),
                    &format!("kubectl {}", args.join(" ")),
                )
            };
            for i in 0..CONCURRENT {
                let new = json!({"apiVersion": "etcd.example.com/v1beta1", "kind": "EtcdCluster",
                    "metadata": {"name": format!("new-{i:02}"), "namespace": NAMESPACES[i % 2]},
                    "spec": {"size": 3, "version": "v3.5.10", "storage": {"size": "2Gi"}}});
                kubectl(&["create", "-f", "-"], Some(&new.to_string()));
                let old = i * 16 + 1;
                kubectl(
                    &[
                        "-n",
                        NAMESPACES[old % 2],
                        "label",
                        "etcdcluster",
                        &format!("seed-{old:03}"),
                        "touched=yes",
                    ],
                    None,
                );
            }
        })
    };
    let t = Instant::now();
    let out = command(&migrator, &["migrate-storage", "-o", "json"])
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    writer.join().expect("the concurrent writer");
    eprintln!(
        "    the concurrent writes ended {:.1} s after the migration started",
        t.elapsed().as_secs_f64()
    );
    let report = json_report(&out, "migration");
    eprintln!(
        "    migration of {} objects in {secs:.1} s: {report}",
        report["listed"]
    );
    assert_eq!(report["failed"], json!([]), "{report}");
    assert_eq!(
        report["rewritten"].as_u64().unwrap() + report["skipped"].as_u64().unwrap(),
        report["listed"].as_u64().unwrap(),
        "{report}"
    );
    assert_eq!(report["storedVersionsAfter"], json!(["v1"]), "{report}");
    assert_eq!(stored_versions(&env), ["v1"]);
    assert_eq!(
        encodings(&env.cp),
        BTreeMap::from([("etcd.example.com/v1".to_owned(), OBJECTS + CONCURRENT)]),
        "every object is stored as v1"
    );

    // Nothing lost: each object is what it read as in v1 before, plus the concurrent labels.
    let after = read_all_v1(&env);
    assert_eq!(after.len(), OBJECTS + CONCURRENT);
    for (id, old) in &before {
        let mut want = kept(old);
        let name = id.split('/').nth(1).unwrap();
        let n: usize = name.trim_start_matches("seed-").parse().unwrap();
        if n % 16 == 1 && n / 16 < CONCURRENT {
            want["labels"]["touched"] = json!("yes");
        }
        assert_eq!(kept(&after[id]), want, "{id}");
    }

    // 4. docs/versions.md's commands as written, as a cluster admin.
    let block = crate::install::doc_block("docs/versions.md", "## Retiring v1alpha1 and v1beta1");
    let bin_dir = Path::new(common::BIN).parent().unwrap();
    let path = format!(
        "{}:{}:{}",
        bin_dir.display(),
        common::k8s_tools().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .env("PATH", path)
        .env("KUBECONFIG", &admin)
        .env("ETCD_WEBHOOK_LOG_FORMAT", "text")
        .current_dir(&env.cp.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docs/versions.md's block failed:\n{block}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let get_in = |version: &str| {
        env.kubectl(&[
            "get",
            &format!("etcdclusters.{version}.etcd.example.com"),
            "-A",
            "-o",
            "name",
        ])
    };
    for old in ["v1alpha1", "v1beta1"] {
        let out = wait_for(
            &format!("{old} to stop being served"),
            Duration::from_secs(30),
            || {
                let out = get_in(old);
                (!out.status.success()).then_some(out)
            },
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("the server could not find the requested resource"),
            "{old}: {stderr}"
        );
    }
    // Its second migration PUT every object again, and the apiserver wrote none of them: the
    // encoding in etcd was already v1.
    let again = read_all_v1(&env);
    assert_eq!(again.len(), OBJECTS + CONCURRENT);
    let rv = |o: &Value| o["metadata"]["resourceVersion"].clone();
    for (id, o) in &after {
        assert_eq!(rv(&again[id]), rv(o), "{id} was not written again");
    }
    let v1_only = conversions_for_creates(&env, "v1-only");

    // Serving them again is one apply of the full CRD.
    let full = ok(
        command(&admin, &["crd"]).output().unwrap(),
        "etcd-webhook crd",
    );
    ok(
        env.kubectl_in(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            &full,
        ),
        "apply the full CRD again",
    );
    let listed = wait_for(
        "v1alpha1 to be served again",
        Duration::from_secs(30),
        || {
            let out = get_in("v1alpha1");
            out.status.success().then_some(out)
        },
    );
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).lines().count(),
        OBJECTS + CONCURRENT + WRITES
    );
    let all_served = conversions_for_creates(&env, "all-served");
    eprintln!(
        "    ConversionReviews for {WRITES} creates in v1: {v1_only} with only v1 served, {all_served} with all three"
    );
    assert!(
        v1_only < all_served,
        "serving fewer versions costs fewer conversions ({v1_only} vs {all_served})"
    );
    env.save_webhook_logs();
}

const WRITES: usize = 20;

/// ConversionReviews the webhook answers for WRITES creates in v1 (the watch caches of the
/// other served versions convert each write as it arrives), once they stop coming.
fn conversions_for_creates(env: &Env, prefix: &str) -> f64 {
    let conversions = || {
        env.webhook
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .metric("etcd_webhook_conversion_requests_total", "success")
    };
    let settle = |what: &str| {
        let mut last = conversions();
        wait_for(what, Duration::from_secs(60), || {
            std::thread::sleep(Duration::from_secs(2));
            let now = conversions();
            (std::mem::replace(&mut last, now) == now).then_some(now)
        })
    };
    let start = settle("conversions to settle before the creates");
    let items: Vec<Value> = (0..WRITES)
        .map(|i| {
            json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                "metadata": {"name": format!("{prefix}-{i:02}"), "namespace": NAMESPACES[0]},
                "spec": {"size": 1, "version": "v3.5.10", "storageSize": "1Gi"}})
        })
        .collect();
    ok(
        env.kubectl_in(
            &["create", "-f", "-"],
            &json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
        ),
        "create EtcdClusters in v1",
    );
    settle("conversions of the creates to settle") - start
}
