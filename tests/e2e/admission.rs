//! The CRD, the admission webhooks and the conversion webhook as the real apiserver uses them.

use std::process::Command;
use std::time::Duration;

use etcd_webhook::api::Version;
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

        // What the webhooks would store, decided offline, with the suite's replica flags
        // (plain clusters: see `Env::install_with`).
        let (code, defaulted, err) = offline(
            &["review", "-f", "-", "--default-member-tls=false"],
            &sample.to_string(),
        );
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
    /// Refused by the CRD's CEL rules (admission::cel) before the webhook is asked.
    cel: bool,
}

/// The field errors of a message, as (path, kind, detail), the value left out: the webhook
/// writes `spec.size: Invalid value: 4: must be odd`, a CEL rule `spec.size: Invalid value:
/// "integer": must be odd`. Takes kubectl's `... is invalid: ` text (one error, or a `* `
/// list) or one webhook violation.
fn field_errors(text: &str) -> std::collections::BTreeSet<(String, String, String)> {
    let body = text
        .split_once("is invalid: ")
        .map_or(text, |(_, rest)| rest)
        .trim();
    let items: Vec<&str> = if body.starts_with("* ") {
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("* "))
            .collect()
    } else {
        vec![body]
    };
    items
        .into_iter()
        .map(|item| {
            field_error(item).unwrap_or_else(|| panic!("not a field error: {item:?} in {text}"))
        })
        .collect()
}

fn field_error(item: &str) -> Option<(String, String, String)> {
    let (path, rest) = item.split_once(": ")?;
    let (kind, detail) = if let Some(d) = rest.strip_prefix("Forbidden: ") {
        ("Forbidden", d)
    } else {
        let value_and_detail = rest.strip_prefix("Invalid value: ")?;
        let detail = match value_and_detail.strip_prefix('"') {
            Some(quoted) => quoted.split_once("\": ")?.1,
            None => value_and_detail.split_once(": ")?.1,
        };
        ("Invalid value", detail)
    };
    Some((path.to_owned(), kind.to_owned(), detail.trim().to_owned()))
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
            cel: true,
        },
        Denial {
            name: "even replicas in v1alpha1",
            old: None,
            new: cluster(
                "v1alpha1",
                "even-alpha",
                json!({"replicas": 2, "etcdVersion": "3.5.10", "storageSizeGi": 10}),
            ),
            cel: true,
        },
        Denial {
            name: "shrink",
            old: Some(v1("shrink", base.clone())),
            new: v1("shrink", with(json!({"size": 1}))),
            cel: true,
        },
        Denial {
            name: "storage shrink",
            old: Some(v1("storage", base.clone())),
            new: v1("storage", with(json!({"storageSize": "10Gi"}))),
            cel: true,
        },
        Denial {
            name: "storage class change",
            old: Some(v1("class", base.clone())),
            new: v1("class", with(json!({"storageClass": "standard"}))),
            cel: true,
        },
        Denial {
            name: "a downgrade",
            old: Some(v1("downgrade", with(json!({"version": "v3.6.4"})))),
            new: v1("downgrade", with(json!({"version": "v3.5.36"}))),
            cel: false,
        },
        Denial {
            name: "a release the loop does not run",
            old: None,
            new: v1("old-release", with(json!({"version": "v3.4.30"}))),
            cel: true,
        },
        Denial {
            name: "v3.5 -> v3.6 from before v3.5.32",
            old: Some(v1("early", with(json!({"version": "v3.5.1"})))),
            new: v1("early", with(json!({"version": "v3.6.4"}))),
            cel: true,
        },
        Denial {
            name: "v3.6 -> v3.7 from before v3.6.11",
            old: Some(v1("early37", with(json!({"version": "v3.6.4"})))),
            new: v1("early37", with(json!({"version": "v3.7.4"}))),
            cel: true,
        },
        Denial {
            name: "a v3.7 patch the loop does not run",
            old: None,
            new: v1("early-patch", with(json!({"version": "v3.7.1"}))),
            cel: true,
        },
        Denial {
            name: "v3.5 -> v3.6 from before v3.5.32 in v1alpha1",
            old: Some(cluster(
                "v1alpha1",
                "early-alpha",
                json!({"replicas": 3, "etcdVersion": "3.5.9", "storageSizeGi": 10}),
            )),
            new: cluster(
                "v1alpha1",
                "early-alpha",
                json!({"replicas": 3, "etcdVersion": "3.6.4", "storageSizeGi": 10}),
            ),
            cel: true,
        },
        Denial {
            name: "a name that is no Service name",
            old: None,
            new: v1("1etcd", base.clone()),
            cel: false,
        },
        Denial {
            name: "a restore changed after creation",
            old: Some(v1(
                "restored",
                with(json!({"restore": {"from": "s3://b/p/a-snapshot-20261202T010000Z.db"}})),
            )),
            new: v1(
                "restored",
                with(json!({"restore": {"from": "s3://b/p/b-snapshot-20261202T010000Z.db"}})),
            ),
            cel: true,
        },
        Denial {
            name: "TLS turned on for a running plain cluster",
            old: Some(v1("plain", base.clone())),
            new: v1("plain", with(json!({"tls": {}}))),
            cel: true,
        },
        Denial {
            name: "TLS turned from off to on",
            old: Some(v1("tls-off", with(json!({"tls": {"enabled": false}})))),
            new: v1("tls-off", with(json!({"tls": {"enabled": true}}))),
            cel: true,
        },
        Denial {
            name: "a restore from a file on a claim",
            old: None,
            new: v1(
                "restore-file",
                with(json!({"restore": {"from": "/backup/a-snapshot-20261202T010000Z.db"}})),
            ),
            cel: false,
        },
        Denial {
            name: "a backup destination the loop cannot serve",
            old: None,
            new: v1(
                "gcs",
                with(json!({"backup": {"enabled": true, "destination": "gs://bucket/etcd"}})),
            ),
            cel: false,
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
            cel: false,
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
            if case.cel {
                // The CRD's own rule refuses it before any webhook is called, in the webhook's
                // words (only the value is shown as its type, as CEL errors do).
                assert!(
                    stderr.contains("is invalid: ") && !stderr.contains("admission webhook"),
                    "{}: refused by the CRD's CEL rule: {stderr}",
                    case.name
                );
                assert_eq!(
                    field_errors(&stderr),
                    field_errors(&message),
                    "{}: the CEL rule says what the webhook says; kubectl: {stderr}",
                    case.name
                );
            } else {
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
    }
    // The webhook's own namespace is checked like any other (with a rule only the webhook has).
    let mut own = v1("1own", base.clone());
    own["metadata"]["namespace"] = json!(crate::install::NAMESPACE);
    let out = env.kubectl_in(&["create", "-f", "-"], &own.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad name in etcd-system is denied");
    assert!(
        stderr.contains("denied the request")
            && stderr.contains("metadata.name: Invalid value: \"1own\""),
        "{stderr}"
    );

    // Why the name rule exists: before Kubernetes 1.36 (RelaxedServiceNameValidation: beta and on
    // in 1.36, GA in 1.37) the apiserver refuses a Service of that name, so the loop could never
    // create the cluster's Services there. This apiserver (1.37) takes it: the rule is for the
    // older ones the chart installs on.
    let service = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"1etcd","namespace":"e2e-deny"},
        "spec":{"ports":[{"port":2379}]}}"#;
    let out = env.kubectl_in(&["create", "--dry-run=server", "-f", "-"], service);
    assert!(
        out.status.success(),
        "Kubernetes 1.37 takes a Service named 1etcd: {}",
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

    // A rule only the webhook has (the CRD's CEL rules would refuse an even size even with the
    // webhook bypassed): a backup schedule that is no cron schedule.
    let merge_patch = |patch: Value| {
        let patch = patch.to_string();
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
    let set_schedule = |schedule: &str| {
        merge_patch(json!({"spec": {"backup": {"enabled": false, "schedule": schedule}}}))
    };
    // Bypass the webhooks: failurePolicy Ignore, and the webhook down.
    env.set_failure_policy("Ignore");
    env.stop_webhook();
    wait_for(
        "a bad schedule to get past the bypassed webhook",
        Duration::from_secs(30),
        || set_schedule("61 * * * *").status.success().then_some(()),
    );
    // With the webhook bypassed, the CRD's CEL rules still hold.
    let out = merge_patch(json!({"spec": {"size": 4}}));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && (stderr.contains("spec.size: Invalid value: 4: must be odd")
                || stderr.contains("spec.size: Invalid value: \"integer\": must be odd")),
        "an even size is refused by CEL while the webhook is bypassed: {stderr}"
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
        stderr
            .contains(r#"spec.backup.schedule: Invalid value: "61 * * * *": still breaks a rule"#),
        "kubectl shows the warning: {stderr}"
    );
    // A changed field is still judged in full.
    let out = set_schedule("62 * * * *");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            r#"spec.backup.schedule: Invalid value: "62 * * * *": must be a 5-field cron schedule"#
        ),
        "{stderr}"
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

/// A small deterministic generator (xorshift64*), seeded per run and printed, so that a
/// failing run can be repeated with E2E_CEL_SEED.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// The spec fields the CEL rules read, written in `version`.
fn cel_object(
    version: Version,
    ns: &str,
    name: &str,
    (size, class, gib): (i32, Option<&str>, u32),
) -> Value {
    let mut spec = match version {
        Version::V1Alpha1 => json!({"replicas": size, "etcdVersion": "3.5.10",
                                    "storageSizeGi": gib}),
        Version::V1Beta1 => json!({"size": size, "version": "v3.5.10",
                                   "storage": {"size": format!("{gib}Gi")}}),
        Version::V1 => json!({"size": size, "version": "v3.5.10",
                              "storageSize": format!("{gib}Gi")}),
    };
    // No class: the cluster's default StorageClass (the field is left out).
    if let Some(class) = class {
        match version {
            Version::V1Alpha1 => spec["storageClassName"] = json!(class),
            Version::V1Beta1 => spec["storage"]["className"] = json!(class),
            Version::V1 => spec["storageClass"] = json!(class),
        }
    }
    json!({"apiVersion": version.api_version(), "kind": "EtcdCluster",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The CRD's CEL rules (admission::cel) and `/validate` give the same answer, with the same
/// field errors, on random updates in every version: each case creates a valid cluster, then
/// sends a server-side dry-run update (the whole object, so a class left out is a class removed)
/// of a random change of size, class and storage. Where
/// `/validate` (called in-process on the same pair) finds violations, the apiserver must refuse
/// with exactly those from CEL alone (the webhook is never reached); where it finds none, the
/// apiserver must admit.
pub fn cel_rules_agree_with_the_webhook(env: &Env) {
    use etcd_webhook::admission::validate::{Operation, validate};
    const CASES: usize = 60;
    let ns = "e2e-cel";
    env.create_namespace(ns);
    let seed = std::env::var("E2E_CEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("    CEL agreement: seed {seed} (E2E_CEL_SEED={seed} repeats this run)");
    let mut rng = Rng(seed);
    let classes = [Some("standard"), Some("gp3"), None];
    let sizes_gib = [1, 2, 5, 10, 20, 100, 1024];
    let (mut admitted, mut refused) = (0, 0);
    for i in 0..CASES {
        let version = Version::ALL[i % 3];
        let old_spec = (
            rng.pick(&[1, 3, 5, 7]),
            rng.pick(&classes),
            rng.pick(&sizes_gib),
        );
        let new_spec = (
            rng.pick(&[1, 2, 3, 4, 5, 6, 7]),
            if rng.next().is_multiple_of(3) {
                rng.pick(&classes)
            } else {
                old_spec.1
            },
            rng.pick(&sizes_gib),
        );
        let name = format!("cel-{i}");
        let old = cel_object(version, ns, &name, old_spec);
        let new = cel_object(version, ns, &name, new_spec);
        ok(
            env.kubectl_in(&["create", "-f", "-"], &old.to_string()),
            "create the stored cluster",
        );
        let webhook = validate(version, Operation::Update, &new, Some(&old));
        let want: std::collections::BTreeSet<_> = webhook
            .violations
            .iter()
            .map(|v| field_error(&v.to_string()).expect("a field error"))
            .collect();
        // The stored object as it is now (the loop adds its finalizer meanwhile) with the new
        // spec; a write between the read and the replace is a conflict: read again (bounded).
        let resource = format!("etcdclusters.{}.etcd.example.com", version.as_str());
        let mut out = None;
        for _ in 0..10 {
            let mut current = env.get_json(&["-n", ns, &resource, &name]);
            current["spec"] = new["spec"].clone();
            let o = env.kubectl_in(
                &["replace", "--dry-run=server", "-f", "-"],
                &current.to_string(),
            );
            if !String::from_utf8_lossy(&o.stderr).contains("(Conflict)") {
                out = Some(o);
                break;
            }
        }
        let out = out.expect("a replace without a conflict within 10 tries");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let case = format!("{version} {old_spec:?} -> {new_spec:?} (seed {seed})");
        if want.is_empty() {
            assert!(
                out.status.success(),
                "{case}: /validate admits, the apiserver refused: {stderr}"
            );
            admitted += 1;
        } else {
            assert!(
                !out.status.success(),
                "{case}: /validate refuses ({want:?}), the apiserver admitted"
            );
            assert!(
                !stderr.contains("admission webhook"),
                "{case}: refused by the webhook, not by the CRD's CEL rules: {stderr}"
            );
            assert_eq!(
                field_errors(&stderr),
                want,
                "{case}: kubectl said: {stderr}"
            );
            refused += 1;
        }
    }
    println!(
        "    CEL agreement: {CASES} random updates, {admitted} admitted and {refused} refused by both"
    );
    assert!(admitted > 0 && refused > 0, "both outcomes were exercised");
}

/// Issue 26, item 1: any StorageClass, as the cluster has them. A replica that reads the
/// StorageClasses (its own ClusterRole, as the install's ServiceAccount) and has
/// `--default-storage-class`: a new cluster naming no class gets that one written in; one naming
/// a class the cluster lacks, or one that cannot grow, is admitted with a warning kubectl shows;
/// a class added later is seen without a restart; a growth of a class that cannot grow warns.
/// The same replica warns about a missing credentials Secret of backups or a restore to S3.
pub fn storage_classes_are_filled_in_and_warned_about(env: &Env) {
    let ns = "e2e-classes";
    env.create_namespace(ns);
    let cluster = |version: &str, name: &str, spec: Value| {
        let mut c = cluster(version, name, spec);
        c["metadata"]["namespace"] = json!(ns);
        c
    };
    // The serving replica is replaced (the apiserver keeps its connections to the one before
    // until that one closes them), and put back as it was at the end.
    let replace = |pod: &str, extra: &[&str]| {
        let server = env.start_replica(pod, extra);
        env.route_to(&server);
        env.stop_webhook();
        *env.webhook.lock().unwrap() = Some(server);
    };
    replace(
        "etcd-webhook-classes",
        &["--cabundle-check=on", "--default-storage-class=e2e-default"],
    );
    let log = || env.serving_log();
    let class = |name: &str, expands: bool| {
        let c = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name}, "provisioner": "example.com/none",
            "allowVolumeExpansion": expands});
        ok(env.kubectl_in(&["apply", "-f", "-"], &c.to_string()), name);
    };
    class("e2e-fixed", false);
    wait_for(
        "the replica to list the StorageClasses",
        Duration::from_secs(30),
        || log().contains("StorageClasses listed").then_some(()),
    );
    let dry_run = |spec: Value| {
        let c = cluster("v1", "c", spec);
        let out = env.kubectl_in(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            &c.to_string(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let created: Value = serde_json::from_slice(&out.stdout).unwrap();
        (created, stderr)
    };
    // No class named: --default-storage-class is written in, and it does not exist (yet).
    let (created, stderr) = dry_run(json!({"size": 3}));
    assert_eq!(created["spec"]["storageClass"], "e2e-default", "{created}");
    assert!(
        stderr.contains(r#"Warning: spec.storageClass: StorageClass "e2e-default" does not exist in this cluster"#),
        "{stderr}"
    );
    // A class that cannot grow.
    let (_, stderr) = dry_run(json!({"size": 3, "storageClass": "e2e-fixed"}));
    assert!(
        stderr.contains(r#"Warning: spec.storageClass: StorageClass "e2e-fixed" does not allow volume expansion: growing spec.storageSize later will not work"#),
        "{stderr}"
    );
    // Created later: seen through the watch, no restart, no warning.
    class("e2e-default", true);
    wait_for("the new class to be seen", Duration::from_secs(20), || {
        let (_, stderr) = dry_run(json!({"size": 3}));
        (!stderr.contains("Warning")).then_some(())
    });
    // Backups to S3 and a restore from S3 with no Secret c-backup-credentials: a warning (the
    // look is the install's grant, get on secrets); none from a claim; none once it exists.
    let to_s3 = json!({"size": 3, "backup": {"enabled": true, "schedule": "0 * * * *",
        "destination": "s3://e2e-bucket/etcd"}});
    let (_, stderr) = dry_run(to_s3.clone());
    assert!(
        stderr.contains("Warning: spec.backup.destination: Secret c-backup-credentials not found in e2e-classes; backups will use the pods' own cloud identity"),
        "{stderr}"
    );
    let (_, stderr) = dry_run(json!({"size": 3, "restore": {"from": "s3://e2e-bucket/etcd/x.db"}}));
    assert!(
        stderr.contains("Warning: spec.restore.from: Secret c-backup-credentials not found"),
        "{stderr}"
    );
    let (_, stderr) = dry_run(json!({"size": 3, "restore": {"from": "pvc://src-backup/x.db"}}));
    assert!(!stderr.contains("Warning"), "{stderr}");
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "create",
            "secret",
            "generic",
            "c-backup-credentials",
            "--from-literal=AWS_ACCESS_KEY_ID=e2e",
        ]),
        "the credentials Secret",
    );
    let (_, stderr) = dry_run(to_s3);
    assert!(!stderr.contains("Warning"), "{stderr}");
    // A stored cluster, then a patch of it (kubectl's exit status and stderr).
    let create = |name: &str, spec: Value, what: &str| {
        ok(
            env.kubectl_in(
                &["create", "-f", "-"],
                &cluster("v1", name, spec).to_string(),
            ),
            what,
        );
    };
    let patch = |name: &str, how: &[&str]| {
        let mut args = vec!["-n", ns, "patch", "etcdcluster", name];
        args.extend_from_slice(how);
        let out = env.kubectl(&args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A growth on a class that cannot grow warns (the claims will not follow).
    create(
        "fixed",
        json!({"size": 3, "storageClass": "e2e-fixed", "storageSize": "1Gi"}),
        "a cluster on a class that cannot grow",
    );
    let (success, stderr) = patch(
        "fixed",
        &[
            "--type=merge",
            "--dry-run=server",
            "-p",
            r#"{"spec":{"storageSize":"2Gi"}}"#,
        ],
    );
    assert!(success, "{stderr}");
    assert!(
        stderr.contains(r#"Warning: spec.storageSize: StorageClass "e2e-fixed" does not allow volume expansion: the members' claims cannot grow"#),
        "{stderr}"
    );
    // Set at creation, for good: removing the class written in at creation is refused by the
    // CRD's rule before any webhook.
    create(
        "nameless",
        json!({"size": 3}),
        "a cluster created with the default class written in",
    );
    let (success, stderr) = patch(
        "nameless",
        &[
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/storageClass"}]"#,
        ],
    );
    assert!(!success);
    assert!(
        stderr.contains(
            r#"spec.storageClass: Forbidden: cannot be removed (it was \"e2e-default\")"#
        ) || stderr
            .contains(r#"spec.storageClass: Forbidden: cannot be removed (it was "e2e-default")"#),
        "{stderr}"
    );
    assert!(
        !stderr.contains("admission webhook"),
        "the CRD's rule answers: {stderr}"
    );
    for name in ["fixed", "nameless"] {
        ok(
            env.kubectl(&["-n", ns, "delete", "etcdcluster", name, "--wait=false"]),
            "delete",
        );
    }
    replace("etcd-webhook-e2e-0", &[]);
}
