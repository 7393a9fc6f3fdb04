//! The CRD, the admission webhooks and the conversion webhook as the real apiserver uses them.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{KUBERNETES_VERSION, wait_for};
use crate::common::BIN;
use crate::install::{CRD, Env, ok, yaml_docs};

const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// Runs `etcd-webhook ARGS` with `input` on stdin: (exit code, stdout, stderr).
pub fn offline(args: &[&str], input: &str) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    let out = crate::cluster::run(cmd, Some(input));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `etcd-webhook convert --to VERSION -o json` of one object.
fn convert_offline(obj: &Value, to: &str) -> Value {
    let (code, out, err) = offline(
        &["convert", "--to", to, "-o", "json", "-f", "-"],
        &obj.to_string(),
    );
    assert_eq!(code, 0, "etcd-webhook convert --to {to}: {err}");
    serde_json::from_str(&out).unwrap()
}

fn resource(version: &str) -> String {
    format!("etcdclusters.{version}.etcd.example.com")
}

pub fn crd_is_established_with_the_schema(env: &Env) {
    let version: Value =
        serde_json::from_str(&ok(env.kubectl(&["get", "--raw", "/version"]), "/version")).unwrap();
    assert_eq!(version["gitVersion"], KUBERNETES_VERSION, "{version}");
    let crd = env.get_json(&["crd", CRD]);
    for condition in ["Established", "NamesAccepted"] {
        let found = crd["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == condition)
            .unwrap_or_else(|| panic!("condition {condition} in {}", crd["status"]));
        assert_eq!(found["status"], "True", "{found}");
    }
    assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));
    // The schema as the user sees it.
    let explain = ok(
        env.kubectl(&[
            "explain",
            "etcdclusters.spec",
            "--api-version=etcd.example.com/v1",
        ]),
        "kubectl explain",
    );
    for field in ["size", "version", "storageSize", "storageClass", "backup"] {
        assert!(
            explain.lines().any(|l| l.trim_start().starts_with(field)),
            "kubectl explain lists {field}:\n{explain}"
        );
    }
    let explain = ok(
        env.kubectl(&[
            "explain",
            "etcdclusters.spec",
            "--api-version=etcd.example.com/v1alpha1",
        ]),
        "kubectl explain v1alpha1",
    );
    assert!(explain.contains("replicas"), "{explain}");
}

/// Each sample is applied in its own version; the stored object carries every default the webhook
/// gives (compared with `etcd-webhook review`), and reading it in every version returns what
/// `etcd-webhook convert` prints for the stored object.
pub fn samples_round_trip_through_every_version(env: &Env) {
    for file in [
        "config/samples/etcd_v1_etcdcluster.yaml",
        "config/samples/etcd_v1beta1_etcdcluster.yaml",
        "config/samples/etcd_v1alpha1_etcdcluster.yaml",
    ] {
        let sample =
            &yaml_docs(&std::fs::read_to_string(crate::common::root().join(file)).unwrap())[0];
        let name = sample["metadata"]["name"].as_str().unwrap();
        let ns = sample["metadata"]["namespace"].as_str().unwrap();
        ok(
            env.kubectl(&["apply", "-f", file]),
            &format!("kubectl apply -f {file}"),
        );

        // What the webhooks would store, decided offline.
        let (code, defaulted, err) = offline(&["review", "-f", "-"], &sample.to_string());
        assert_eq!(code, 0, "{file}: etcd-webhook review: {err}");
        let defaulted = &yaml_docs(&defaulted)[0];
        let expected_v1 = convert_offline(defaulted, "v1");

        for version in VERSIONS {
            // Compare two reads taken at the same resourceVersion (the loop writes status).
            let (stored, read) = wait_for(
                &format!("{name} read at one resourceVersion as v1 and {version}"),
                Duration::from_secs(30),
                || {
                    let stored = env.get_json(&[&resource("v1"), name, "-n", ns]);
                    let read = env.get_json(&[&resource(version), name, "-n", ns]);
                    (stored["metadata"]["resourceVersion"] == read["metadata"]["resourceVersion"])
                        .then_some((stored, read))
                },
            );
            assert_eq!(
                stored["spec"], expected_v1["spec"],
                "{file}: the stored spec has exactly the webhook's defaults"
            );
            assert_eq!(read["apiVersion"], format!("etcd.example.com/{version}"));
            assert_eq!(
                read,
                convert_offline(&stored, version),
                "{file}: read as {version} = etcd-webhook convert --to {version} of the stored object"
            );
        }
    }
}

/// 200 objects listed in v1alpha1: every item converted, in one ConversionReview.
pub fn list_of_200_in_an_old_version(env: &Env) {
    let ns = "e2e-list";
    env.create_namespace(ns);
    let items: Vec<Value> = (0..200)
        .map(|i| {
            json!({
                "apiVersion": "etcd.example.com/v1alpha1",
                "kind": "EtcdCluster",
                "metadata": {"name": format!("list-{i:03}"), "namespace": ns},
                "spec": {"replicas": 1, "etcdVersion": "3.5.10", "storageSizeGi": 1}
            })
        })
        .collect();
    let metric = |name: &str, labels: &str| {
        env.webhook
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .metric(name, labels)
    };
    let conversions = || metric("etcd_webhook_conversion_requests_total", "success");
    let created_before = conversions();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    ok(
        env.kubectl_in(&["create", "-f", "-"], &list.to_string()),
        "create 200 EtcdClusters",
    );

    let objects = || metric("etcd_webhook_converted_objects_total", "");
    // The watch caches of v1alpha1 and v1beta1 convert every write (the loop's too) as it
    // arrives; measure the list once they are done.
    let mut last = (conversions(), objects());
    wait_for(
        "the conversions of the writes to settle",
        Duration::from_secs(90),
        || {
            std::thread::sleep(Duration::from_secs(3));
            let now = (conversions(), objects());
            std::mem::replace(&mut last, now).eq(&now).then_some(())
        },
    );
    let (before, objects_before) = last;
    // Each write is converted for the watch cache of every served non-storage version.
    eprintln!(
        "    200 creates in v1alpha1 and the loop's writes for them: {} ConversionReviews",
        before - created_before
    );
    let listed = env.get_json(&[&resource("v1alpha1"), "-n", ns]);
    let (after, objects_after) = (conversions(), objects());
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 200);
    for item in items {
        assert_eq!(item["apiVersion"], "etcd.example.com/v1alpha1");
        assert_eq!(item["spec"]["replicas"], 1, "{item}");
        assert_eq!(item["spec"]["storageSizeGi"], 1, "{item}");
    }
    eprintln!(
        "    list of 200 in v1alpha1: {} ConversionReviews, {} objects converted",
        after - before,
        objects_after - objects_before
    );
    assert!(
        after - before <= 1.0,
        "at most one ConversionReview for the list of 200 (before {before}, after {after})"
    );
    // Leave nothing for the loop to keep reconciling.
    ok(
        env.kubectl(&["delete", "namespace", ns, "--wait=false"]),
        "delete namespace",
    );
}

/// One denial case: an optional stored object, then the object the user sends.
struct Denial {
    name: &'static str,
    old: Option<Value>,
    new: Value,
}

fn cluster(version: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("etcd.example.com/{version}"),
        "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": "e2e-deny"},
        "spec": spec,
    })
}

/// Every rule, sent through kubectl: the user sees exactly the message `/validate` wrote (as
/// `etcd-webhook review` prints it), in the field paths of the version the user wrote.
pub fn denials_reach_the_user(env: &Env) {
    env.create_namespace("e2e-deny");
    let v1 = |name, spec| cluster("v1", name, spec);
    let base =
        json!({"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "20Gi"});
    let with = |patch: Value| {
        let mut spec = base.clone();
        json_patch::merge(&mut spec, &patch);
        spec
    };
    let cases = [
        Denial {
            name: "even size",
            old: None,
            new: v1("even", with(json!({"size": 4}))),
        },
        Denial {
            name: "even replicas in v1alpha1",
            old: None,
            new: cluster(
                "v1alpha1",
                "even-alpha",
                json!({"replicas": 2, "etcdVersion": "3.5.10", "storageSizeGi": 10}),
            ),
        },
        Denial {
            name: "shrink",
            old: Some(v1("shrink", base.clone())),
            new: v1("shrink", with(json!({"size": 1}))),
        },
        Denial {
            name: "storage shrink",
            old: Some(v1("storage", base.clone())),
            new: v1("storage", with(json!({"storageSize": "10Gi"}))),
        },
        Denial {
            name: "storage class change",
            old: Some(v1("class", base.clone())),
            new: v1("class", with(json!({"storageClass": "standard"}))),
        },
        Denial {
            name: "upgrade over two minors",
            old: Some(v1("upgrade", with(json!({"version": "v3.4.30"})))),
            new: v1("upgrade", with(json!({"version": "v3.6.4"}))),
        },
        Denial {
            name: "a name that is no Service name",
            old: None,
            new: v1("1etcd", base.clone()),
        },
        Denial {
            name: "bad cron in v1beta1",
            old: None,
            new: cluster(
                "v1beta1",
                "cron-beta",
                json!({"size": 3, "version": "v3.5.10", "storage": {"size": "10Gi"},
                       "backup": {"enabled": true, "schedule": "61 * * * *"}}),
            ),
        },
    ];
    for case in &cases {
        let new = case.new.to_string();
        let (code, _, err) = match &case.old {
            None => offline(&["review", "-f", "-"], &new),
            Some(old) => {
                let old_file = env.cp.dir.join("old.json");
                std::fs::write(&old_file, old.to_string()).unwrap();
                offline(
                    &["review", "--old", old_file.to_str().unwrap(), "-f", "-"],
                    &new,
                )
            }
        };
        assert_eq!(code, 1, "{}: review denies offline: {err}", case.name);
        let message = err
            .lines()
            .find_map(|l| l.split_once(": denied: ").map(|(_, m)| m.to_owned()))
            .unwrap_or_else(|| panic!("{}: no denial in {err}", case.name));
        if let Some(old) = &case.old {
            ok(
                env.kubectl_in(&["create", "-f", "-"], &old.to_string()),
                case.name,
            );
        }
        // The same denial with and without --dry-run=server.
        for dry in [true, false] {
            let mut args = vec!["apply", "-f", "-"];
            if dry {
                args.push("--dry-run=server");
            }
            let out = env.kubectl_in(&args, &new);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{}: kubectl apply was accepted",
                case.name
            );
            assert!(
                stderr.contains(
                    "admission webhook \"vetcdcluster.etcd.example.com\" denied the request"
                ),
                "{}: {stderr}",
                case.name
            );
            assert!(
                stderr.contains(&message),
                "{}: kubectl shows the webhook's message {message:?}; it said: {stderr}",
                case.name
            );
        }
    }
    // The webhook's own namespace is checked like any other.
    let mut own = cases[0].new.clone();
    own["metadata"]["namespace"] = json!(crate::install::NAMESPACE);
    let out = env.kubectl_in(&["create", "-f", "-"], &own.to_string());
    assert!(
        !out.status.success(),
        "an even size in etcd-system is denied"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.size: Invalid value: 4: must be odd")
    );

    // Why the name rule exists: the apiserver refuses a Service of that name, so the loop could
    // never create the cluster's Services.
    let service = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"1etcd","namespace":"e2e-deny"},
        "spec":{"ports":[{"port":2379}]}}"#;
    let out = env.kubectl_in(&["create", "--dry-run=server", "-f", "-"], service);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a DNS-1035 label must consist of"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The v1alpha1 denial names the v1alpha1 field.
    let (_, _, err) = offline(&["review", "-f", "-"], &cases[1].new.to_string());
    assert!(err.contains("spec.replicas"), "{err}");

    // A server-side dry run of a valid object is admitted (the webhooks are called with
    // dryRun: true; they have no side effects) and stores nothing.
    let valid = v1("dry", base.clone()).to_string();
    let out = ok(
        env.kubectl_in(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            &valid,
        ),
        "dry-run create",
    );
    let dry: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(dry["spec"]["size"], 3);
    let got = env.kubectl(&["-n", "e2e-deny", "get", &resource("v1"), "dry"]);
    assert!(!got.status.success(), "a dry run stored nothing");
    assert!(String::from_utf8_lossy(&got.stderr).contains("NotFound"));
}

/// Ratcheting through the real apiserver: a cluster whose stored spec became invalid while the
/// webhook was bypassed (failurePolicy Ignore, webhook down) still takes label edits, with a
/// warning, and its deletion completes: the loop's finalizer removal is admitted.
pub fn an_invalid_stored_cluster_can_still_be_edited_and_deleted(env: &Env) {
    let ns = "e2e-ratchet";
    let name = "ratchet";
    env.create_namespace(ns);
    env.create_cluster(
        ns,
        name,
        json!({"size": 3, "version": "v3.5.10", "storageSize": "1Gi"}),
    );
    wait_for("the loop's finalizer", Duration::from_secs(60), || {
        let ec = env.get_json(&["-n", ns, "etcdcluster", name]);
        ec["metadata"]["finalizers"].is_array().then_some(())
    });

    let set_size = |size: u32| {
        let patch = json!({"spec": {"size": size}}).to_string();
        env.kubectl(&[
            "-n",
            ns,
            "patch",
            "etcdcluster",
            name,
            "--type=merge",
            "-p",
            &patch,
        ])
    };
    // Bypass the webhooks: failurePolicy Ignore, and the webhook down.
    env.set_failure_policy("Ignore");
    env.stop_webhook();
    wait_for(
        "an even size to get past the bypassed webhook",
        Duration::from_secs(30),
        || set_size(4).status.success().then_some(()),
    );
    env.set_failure_policy("Fail");
    env.serve_with("etcd-webhook-e2e-ratchet");
    env.wait_webhook_called();

    // A label edit leaves the spec as it is: admitted, with a warning naming the field.
    let out = env.kubectl(&["-n", ns, "label", "etcdcluster", name, "team=storage"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "label edit on an invalid stored cluster: {stderr}"
    );
    assert!(
        stderr.contains("spec.size: Invalid value: 4: still breaks a rule"),
        "kubectl shows the warning: {stderr}"
    );
    // A spec change is still judged in full.
    let out = set_size(6);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.size: Invalid value: 6: must be odd")
    );

    // Deletion: the finalizer's removal is an UPDATE of the invalid object; it is admitted.
    ok(
        env.kubectl(&["-n", ns, "delete", "etcdcluster", name, "--wait=false"]),
        "delete",
    );
    wait_for(
        "the invalid cluster's deletion to complete",
        Duration::from_secs(90),
        || {
            (!env
                .kubectl(&["-n", ns, "get", "etcdcluster", name])
                .status
                .success())
            .then_some(())
        },
    );
}
