//! `etcd-webhook review` and `etcd-webhook convert` on every fixture and sample, multi-document
//! input, bad input, and their exit codes.

mod common;
/// The e2e runner's argument parsing, tested here (the e2e target has its own runner).
#[path = "e2e/args.rs"]
mod e2e_args;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn samples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("etcd_")
        })
        .collect();
    v.sort();
    assert_eq!(v.len(), 3, "one sample per version");
    v
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

#[test]
fn review_every_admission_fixture() {
    let expectations: Vec<Value> = serde_json::from_slice(&fixture("expectations.json")).unwrap();
    for e in expectations {
        let file = e["file"].as_str().unwrap();
        let path = fixtures_dir().join(file);
        let out = run(&["review", "-f", path.to_str().unwrap()], None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = if file == "malformed-admission-to-convert.json" {
            0 // a sound AdmissionReview, sent to the wrong endpoint in the HTTP test
        } else if e["status"] != 200 || file.starts_with("convert-") {
            2
        } else if file.starts_with("validate-") {
            if e["allowed"] == true { 0 } else { 1 }
        } else if file == "mutate-v1-create-schema-breaking.json" {
            1
        } else {
            0
        };
        assert_eq!(code(&out), want, "{file}: {stderr}");
        if want == 1 {
            for m in e["message"].as_array().into_iter().flatten() {
                assert!(stderr.contains(m.as_str().unwrap()), "{file}: {stderr}");
            }
        }
        if want == 2 {
            assert!(stderr.starts_with("error: "), "{file}: {stderr}");
        }
    }
}

#[test]
fn review_samples_and_multi_document_input() {
    let mut all = String::new();
    for s in samples() {
        let out = run(&["review", "-f", s.to_str().unwrap(), "--patch"], None);
        assert_eq!(
            code(&out),
            0,
            "{}: {}",
            s.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Complete: nothing to add but member TLS, which `serve` (and `review`) write into a
        // new v1 cluster that says nothing about it (the older versions have no tls field:
        // the apiserver sends their creates to /mutate as v1).
        let want = if s.to_str().unwrap().contains("etcd_v1_") {
            r#"[{"op":"add","path":"/spec/tls","value":{}}]"#
        } else {
            "[]"
        };
        assert_eq!(
            String::from_utf8(out.stdout).unwrap().trim(),
            want,
            "{}: samples are complete: only the TLS default to add",
            s.display()
        );
        all.push_str(&std::fs::read_to_string(&s).unwrap());
        all.push_str("---\n");
    }
    let out = run(&["review"], Some(&all));
    assert_eq!(code(&out), 0);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.matches(": allowed").count(), 3, "{stderr}");
    let bad = format!(
        "{all}apiVersion: etcd.example.com/v1beta1\nkind: EtcdCluster\nmetadata: {{name: even}}\nspec: {{size: 2}}\n"
    );
    let out = run(&["review", "-f", "-"], Some(&bad));
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(
            "even (etcd.example.com/v1beta1): denied: spec.size: Invalid value: 2: must be odd"
        ),
        "{stderr}"
    );
    // The patched objects come out as YAML documents, with defaults filled in.
    let out = run(
        &["review"],
        Some(
            "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: a}\nspec: {size: 3}\n",
        ),
    );
    assert_eq!(code(&out), 0);
    let patched: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(patched["spec"]["version"], "v3.7.4");
    assert_eq!(patched["spec"]["storageSize"], "10Gi");
}

#[test]
fn review_an_update_with_old() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.yaml");
    std::fs::write(&old, "apiVersion: etcd.example.com/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a, namespace: ns}\nspec: {replicas: 5, etcdVersion: 3.5.0}\n").unwrap();
    let new = "apiVersion: etcd.example.com/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a, namespace: ns}\nspec: {replicas: 3, etcdVersion: 3.4.0}\n";
    let out = run(&["review", "--old", old.to_str().unwrap()], Some(new));
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("spec.replicas: Forbidden: cannot shrink from 5 to 3"),
        "{stderr}"
    );
    assert!(
        stderr.contains("spec.etcdVersion: Forbidden: cannot downgrade"),
        "{stderr}"
    );
}

#[test]
fn bad_input_exits_2_with_where_and_why() {
    let cases: [(&[&str], &str, &str); 6] = [
        (
            &["review"],
            "a: [\n",
            "-: document 1: not valid YAML or JSON",
        ),
        (&["review"], "", "-: no documents"),
        (
            &["review"],
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
            "document 1: kind Pod is neither an EtcdCluster nor an AdmissionReview",
        ),
        (&["review"], "- 1\n- 2\n", "document 1: expected an object"),
        (
            &["convert", "--to", "v1"],
            "apiVersion: etcd.example.com/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a}\nspec: {replicas: 3}\n---\napiVersion: etcd.example.com/v1alpha1\nkind: EtcdCluster\nmetadata: {name: b}\nspec: {replicas: three}\n",
            "-: document 2: b (etcd.example.com/v1alpha1): cannot convert to etcd.example.com/v1: spec.replicas: invalid type: string \"three\"",
        ),
        (
            &["convert", "--to", "v1beta1", "-f", "/nonexistent.yaml"],
            "",
            "/nonexistent.yaml: cannot read",
        ),
    ];
    for (args, input, want) in cases {
        let out = run(args, Some(input));
        let rc = code(&out);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(rc, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn convert_samples_to_every_version_and_back() {
    for s in samples() {
        let original: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&s).unwrap()).unwrap();
        let home = original["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        for to in ["v1", "v1beta1", "v1alpha1"] {
            let there = run(&["convert", "--to", to, "-f", s.to_str().unwrap()], None);
            assert_eq!(
                code(&there),
                0,
                "{}",
                String::from_utf8_lossy(&there.stderr)
            );
            let converted: Value = serde_yaml_ng::from_slice(&there.stdout).unwrap();
            assert_eq!(converted["apiVersion"], format!("etcd.example.com/{to}"));
            let back = run(
                &["convert", "--to", &home, "-o", "json"],
                Some(&String::from_utf8(there.stdout).unwrap()),
            );
            assert_eq!(code(&back), 0);
            let back: Value = serde_json::from_slice(&back.stdout).unwrap();
            assert_eq!(back, original, "{} -> {to} -> {home}", s.display());
        }
    }
}

#[test]
fn convert_multi_document_and_lists() {
    let all: String = samples()
        .iter()
        .map(|s| std::fs::read_to_string(s).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    let out = run(&["convert", "--to", "v1", "-o", "json"], Some(&all));
    assert_eq!(code(&out), 0);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert!(
        items
            .iter()
            .all(|i| i["apiVersion"] == "etcd.example.com/v1")
    );
    // A List comes out a List, in YAML too, whatever its length: what `kubectl get -o yaml`
    // prints (a List, even of one or none) can be piped through and stays one.
    let out = run(
        &["convert", "--to", "v1alpha1"],
        Some(&serde_json::to_string(&list).unwrap()),
    );
    assert_eq!(code(&out), 0);
    let back: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(back["kind"], "List");
    assert_eq!(back["items"].as_array().unwrap().len(), 3);
    assert!(
        back["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["apiVersion"] == "etcd.example.com/v1alpha1")
    );
    for (items, args) in [
        (1, &["convert", "--to", "v1beta1"][..]),
        (1, &["convert", "--to", "v1", "-o", "json"][..]),
        (0, &["convert", "--to", "v1"][..]),
        (0, &["review"][..]),
        (1, &["review", "--strict=false"][..]),
        (0, &["render", "-o", "json"][..]),
    ] {
        let input = serde_json::json!({
            "apiVersion": "v1", "kind": "List",
            "items": list["items"].as_array().unwrap()[..items].to_vec(),
        });
        let out = run(args, Some(&input.to_string()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 0, "{args:?} on a List of {items}: {stderr}");
        let back: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
        assert_eq!(back["kind"], "List", "{args:?} on a List of {items}");
        if args[0] == "convert" || args[0] == "review" {
            assert_eq!(back["items"].as_array().unwrap().len(), items, "{args:?}");
        }
    }
    // The objects of every admission fixture that holds a sound object convert and come back;
    // the rest must be refused with where and why, and stay few.
    let (mut round_tripped, mut refused) = (0, Vec::new());
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        let Ok(review) = serde_json::from_slice::<Value>(&std::fs::read(&path).unwrap()) else {
            continue;
        };
        let Some(obj) = review.pointer("/request/object").filter(|o| o.is_object()) else {
            continue;
        };
        let home = obj["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        let to = if home == "v1" { "v1alpha1" } else { "v1" };
        let there = run(
            &["convert", "--to", to, "-o", "json"],
            Some(&obj.to_string()),
        );
        if code(&there) == 2 {
            let stderr = String::from_utf8_lossy(&there.stderr);
            assert!(
                stderr.contains("document 1"),
                "{}: {stderr}",
                path.display()
            );
            refused.push(path.file_name().unwrap().to_string_lossy().into_owned());
            continue;
        }
        let back = run(
            &["convert", "--to", &home, "-o", "json"],
            Some(&String::from_utf8(there.stdout).unwrap()),
        );
        let back: Value = serde_json::from_slice(&back.stdout).unwrap();
        let mut expected = obj.clone();
        etcd_webhook::admission::defaults::apply(
            &mut expected,
            etcd_webhook::api::Version::from_version(&home).unwrap(),
        );
        // The schema's defaults come back filled in (as the apiserver fills them); the one
        // default /mutate adds by hand, v1alpha1's backupEnabled/backupSchedule pairing, does
        // not: a partial backup pair comes back partial.
        for key in ["backupEnabled", "backupSchedule"] {
            if home == "v1alpha1" && obj["spec"].get(key).is_none() {
                expected["spec"].as_object_mut().unwrap().remove(key);
            }
        }
        assert_eq!(back, expected, "{}", path.display());
        round_tripped += 1;
    }
    assert!(
        round_tripped >= 25,
        "only {round_tripped} fixtures round-tripped"
    );
    assert!(
        refused.len() <= 4,
        "more fixtures than the 4 schema-breaking ones refuse to convert: {refused:?}"
    );
}

#[test]
fn render_prints_what_the_controller_creates_for_every_sample() {
    for sample in samples() {
        let out = run(
            &["render", "-f", sample.to_str().unwrap(), "-o", "json"],
            None,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 0, "{}: {stderr}", sample.display());
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        let all = list["items"].as_array().unwrap();
        // Member TLS by default, for every version's sample: the cluster's own CA chain from
        // cert-manager, the three certificates, and the NetworkPolicy.
        let names: Vec<String> = all
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        for suffix in [
            "Issuer/-selfsigned",
            "Certificate/-ca",
            "Issuer/-ca",
            "Certificate/-peer",
            "Certificate/-server",
            "Certificate/-client",
        ] {
            let (kind, end) = suffix.split_once('/').unwrap();
            assert!(
                names
                    .iter()
                    .any(|n| n.starts_with(&format!("{kind}/")) && n.ends_with(end)),
                "{}: no {suffix} in {names:?}",
                sample.display()
            );
        }
        assert!(
            names.iter().any(|n| n.starts_with("NetworkPolicy/")),
            "{names:?}"
        );
        let sts = all.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
        let args = sts["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        for flag in [
            "--listen-client-urls=https://",
            "--listen-peer-urls=https://",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
        ] {
            assert!(
                args.contains(flag),
                "{}: no {flag} in {args}",
                sample.display()
            );
        }
        let plain = run(
            &[
                "render",
                "-f",
                sample.to_str().unwrap(),
                "-o",
                "json",
                "--default-member-tls=false",
            ],
            None,
        );
        let plain: Value = serde_json::from_slice(&plain.stdout).unwrap();
        assert!(
            plain["items"].as_array().unwrap().iter().all(|o| !matches!(
                o["kind"].as_str(),
                Some("Issuer" | "Certificate" | "NetworkPolicy")
            )),
            "--default-member-tls=false: {plain}"
        );
        let items: Vec<&Value> = all
            .iter()
            .filter(|o| !matches!(o["kind"].as_str(), Some("Issuer" | "Certificate")))
            .collect();
        let kinds: Vec<&str> = items.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            &kinds[..5],
            [
                "Service",
                "Service",
                "ConfigMap",
                "StatefulSet",
                "PodDisruptionBudget"
            ],
            "{}",
            sample.display()
        );
        let name = items[0]["metadata"]["name"].as_str().unwrap();
        // The members' ConfigMap bootstraps every member, state new; the pods read it.
        let config = &items[2]["data"];
        assert_eq!(config["ETCD_INITIAL_CLUSTER_STATE"], "new");
        let sts = &items[3];
        assert_eq!(
            sts["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            items[2]["metadata"]["name"]
        );
        assert_eq!(sts["metadata"]["name"], name);
        // Defaults were applied before rendering: every member has a size and a version.
        assert!(sts["spec"]["replicas"].as_i64().unwrap() >= 1);
        let image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap();
        assert!(image.starts_with("quay.io/coreos/etcd:v3."), "{image}");
        for o in items {
            if o["kind"] != "PersistentVolumeClaim" {
                assert_eq!(
                    o["metadata"]["ownerReferences"][0]["uid"],
                    "00000000-0000-0000-0000-000000000000"
                );
            }
        }
    }
    // The v1 sample backs up to S3: a CronJob and the final-snapshot Job, no volume.
    let v1 = samples()
        .into_iter()
        .find(|p| p.to_str().unwrap().contains("etcd_v1_"))
        .unwrap();
    let out = run(&["render", "-f", v1.to_str().unwrap()], None);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("kind: CronJob") && text.contains("name: etcd-sample-final-snapshot"));
    assert!(text.contains("- --destination=s3://etcd-backups/etcd-sample"));
    assert!(text.contains("- /etcd-webhook"));
    let out = run(&["render", "-f", v1.to_str().unwrap(), "-o", "json"], None);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Issuer",
            "Certificate",
            "Issuer",
            "Certificate",
            "Certificate",
            "Certificate",
            "Service",
            "Service",
            "ConfigMap",
            "StatefulSet",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "CronJob",
            "Job"
        ]
    );
}

#[test]
fn render_refuses_denied_and_foreign_manifests() {
    let even = "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: e}\nspec: {size: 2}\n";
    let out = run(&["render"], Some(even));
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be odd"));
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n";
    let out = run(&["render"], Some(pod));
    assert_eq!(code(&out), 2);
    let out = run(
        &["render", "--etcd-image-registry", "mirror.local/etcd-io"],
        Some(
            "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: e}\nspec: {size: 3}\n",
        ),
    );
    assert_eq!(code(&out), 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("image: mirror.local/etcd-io/etcd:v3.7.4")
    );
}

#[test]
fn review_and_render_fail_on_a_misspelt_field_unless_told_not_to() {
    let typo = "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: a}\n\
                spec: {size: 3, storagClass: gold}\n";
    for command in ["review", "render"] {
        let out = run(&[command], Some(typo));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 1, "{command}: {stderr}");
        assert!(
            stderr.contains("unknown field \"spec.storagClass\"")
                && stderr.contains("--strict=false"),
            "{command}: {stderr}"
        );
        let out = run(&[command, "--strict=false"], Some(typo));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 0, "{command} --strict=false: {stderr}");
        assert!(
            stderr.contains("warning: unknown field \"spec.storagClass\""),
            "{command}: {stderr}"
        );
    }
    // In an older version, by that version's names; inside an AdmissionReview too.
    let old = "apiVersion: etcd.example.com/v1alpha1\nkind: EtcdCluster\nmetadata: {name: a}\n\
               spec: {replicas: 3, size: 3}\n";
    let out = run(&["review"], Some(old));
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"spec.size\""));
}

#[test]
fn a_review_of_the_wrong_kind_says_what_to_do() {
    let out = run(
        &["review"],
        Some(
            r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"1","desiredAPIVersion":"etcd.example.com/v1","objects":[]}}"#,
        ),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2);
    assert!(stderr.contains("this is a ConversionReview"), "{stderr}");
    let out = run(
        &["review"],
        Some(r#"{"apiVersion":"apps/v1","kind":"Deployment"}"#),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kind Deployment is neither"), "{stderr}");
    assert!(!stderr.contains("\\\""), "no escaped quotes: {stderr}");
}

#[test]
fn certs_refuses_an_expired_pair_and_never_overwrites_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("certs");
    let dir = out.to_str().unwrap();
    let o = run(&["certs", "--out", dir, "--days", "0"], None);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("0 is not in 1..=36500"));
    assert!(!out.exists(), "nothing written");
    assert_eq!(code(&run(&["certs", "--out", dir], None)), 0);
    let key = std::fs::read(out.join("tls.key")).unwrap();
    let o = run(&["certs", "--out", dir], None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 2, "{stderr}");
    assert!(stderr.contains("already exist: pass --force"), "{stderr}");
    assert_eq!(std::fs::read(out.join("tls.key")).unwrap(), key, "kept");
    assert_eq!(code(&run(&["certs", "--out", dir, "--force"], None)), 0);
    assert_ne!(std::fs::read(out.join("tls.key")).unwrap(), key, "replaced");
}

/// A command that reads a cluster names the server it could not reach, or the kubeconfig it
/// could not use, in one line (issue 26: Rust debug dumps, no server named).
#[test]
fn cluster_commands_name_what_they_could_not_reach() {
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    // Port 1 on loopback: nothing listens there.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n\
         users: [{name: u, user: {token: x}}]\n",
    )
    .unwrap();
    let with = |kubeconfig: &std::path::Path, args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap()
    };
    for args in [&["migrate-storage"][..], &["crd", "--served", "v1"][..]] {
        let o = with(&kubeconfig, args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        let error = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{args:?}: {stderr}"));
        assert_eq!(code(&o), 2, "{args:?}: {stderr}");
        assert!(
            error.contains("API server https://127.0.0.1:1/"),
            "{args:?}: {error}"
        );
        assert!(error.contains("Connection refused"), "{args:?}: {error}");
    }
    let o = with(&tmp.path().join("missing"), &["migrate-storage"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot use the kubeconfig {} (from KUBECONFIG): No such file or directory",
            tmp.path().join("missing").display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("'\""), "no debug-quoted paths: {stderr}");
}

/// Every rule of the CRD's schema (each `pattern`, `enum`, string length, numeric bound and
/// list size of each version, found by walking the generated CRD) refuses a manifest offline
/// as the apiserver would: a value breaking just that rule, put into a valid manifest of that
/// version, makes `review` deny it with that field's path in the message. Before, offline
/// review applied only the webhook's rules (a malformed `spec.restore.sha256` was admitted).
#[test]
fn every_schema_rule_of_the_crd_is_enforced_offline() {
    use etcd_webhook::api::{Version, schema};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        JSONSchemaProps, JSONSchemaPropsOrArray,
    };
    use serde_json::json;

    /// (path as written, JSON pointer steps, the breaking value, the rule).
    fn leaves(
        s: &JSONSchemaProps,
        path: String,
        steps: Vec<String>,
        out: &mut Vec<(String, Vec<String>, Value, String)>,
    ) {
        let mut add = |value: Value, rule: String| {
            out.push((path.clone(), steps.clone(), value, rule));
        };
        if let Some(p) = &s.pattern {
            add(json!("Does Not Match!"), format!("pattern {p}"));
        }
        if let Some(e) = &s.enum_ {
            add(json!("NotInTheEnum"), format!("enum {:?}", e.len()));
        }
        if let Some(max) = s.max_length {
            add(
                json!("a".repeat(max as usize + 1)),
                format!("maxLength {max}"),
            );
        }
        if let Some(min) = s.min_length.filter(|&m| m > 0) {
            add(json!(""), format!("minLength {min}"));
        }
        if let Some(min) = s.minimum {
            add(json!(min as i64 - 1), format!("minimum {min}"));
        }
        if let Some(max) = s.maximum {
            add(json!(max as i64 + 1), format!("maximum {max}"));
        }
        if let Some(max) = s.max_items {
            let item = match s.items.as_ref() {
                Some(JSONSchemaPropsOrArray::Schema(i)) if i.type_.as_deref() == Some("string") => {
                    json!("a")
                }
                _ => json!({}),
            };
            add(
                json!(vec![item; max as usize + 1]),
                format!("maxItems {max}"),
            );
        }
        for (k, child) in s.properties.iter().flatten() {
            let mut st = steps.clone();
            st.push(k.clone());
            leaves(child, format!("{path}.{k}"), st, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(item)) = s.items.as_ref() {
            let mut st = steps.clone();
            st.push("0".to_owned());
            leaves(item, format!("{path}[0]"), st, out);
        }
    }

    fn put(object: &mut Value, steps: &[String], value: Value) {
        let (last, parents) = steps.split_last().unwrap();
        let mut at = object;
        for (i, step) in parents.iter().enumerate() {
            let next_is_index = steps[i + 1].parse::<usize>().is_ok();
            at = match step.parse::<usize>() {
                Ok(_) => {
                    if !at.is_array() {
                        *at = json!([]);
                    }
                    let list = at.as_array_mut().unwrap();
                    if list.is_empty() {
                        list.push(if next_is_index { json!([]) } else { json!({}) });
                    }
                    &mut list[0]
                }
                Err(_) => {
                    let map = at.as_object_mut().unwrap();
                    map.entry(step.clone())
                        .or_insert_with(|| if next_is_index { json!([]) } else { json!({}) })
                }
            };
        }
        match last.parse::<usize>() {
            Ok(_) => *at = json!([value]),
            Err(_) => {
                at.as_object_mut().unwrap().insert(last.clone(), value);
            }
        }
    }

    let settings = etcd_webhook::admission::Settings {
        default_storage_class: None,
        default_member_tls: true,
        storage_classes: None,
        secrets: None,
    };
    let mut checked = 0;
    for version in Version::ALL {
        let base = match version {
            Version::V1 => json!({"size": 3, "version": "v3.6.4", "storageSize": "10Gi"}),
            Version::V1Beta1 => {
                json!({"size": 3, "version": "v3.6.4", "storage": {"size": "10Gi"}})
            }
            Version::V1Alpha1 => {
                json!({"replicas": 3, "etcdVersion": "3.6.4", "storageSizeGi": 10})
            }
        };
        let root = schema::of(version);
        let spec = &root.properties.as_ref().unwrap()["spec"];
        let mut rules = Vec::new();
        leaves(spec, "spec".to_owned(), vec![], &mut rules);
        assert!(rules.len() >= 5, "{version:?}: {} rules found", rules.len());
        eprintln!("{version:?}: {} rules", rules.len());
        for (path, steps, value, rule) in rules {
            let mut object = json!({"apiVersion": version.api_version(), "kind": "EtcdCluster",
                "metadata": {"name": "probe", "namespace": "default"}, "spec": base.clone()});
            put(&mut object["spec"], &steps, value.clone());
            let input =
                etcd_webhook::offline::parse_documents(&object.to_string(), "generated").unwrap();
            let decision = etcd_webhook::offline::review(&input.documents, &[], false, &settings);
            match decision {
                Ok(d) => {
                    assert!(
                        !d[0].allowed,
                        "{version:?} {path} ({rule}) = {value}: admitted"
                    );
                    assert!(
                        d[0].message.contains(&path),
                        "{version:?} {path} ({rule}) = {value}: denied without naming it: {}",
                        d[0].message
                    );
                }
                // Refused before any decision (a value the types cannot hold): refused too.
                Err(e) => assert!(
                    e.to_string().contains(steps.last().unwrap()),
                    "{version:?} {path} ({rule}): {e}"
                ),
            }
            checked += 1;
        }
    }
    eprintln!("{checked} schema rules refused offline");
}

/// `render` shows what a restore makes before any member starts: each member's claim and its
/// restore Job (the snapshot fetched and checked against `sha256`, then `etcdutl snapshot
/// restore`); a malformed `sha256` is refused by the CRD's pattern, offline as on the
/// apiserver.
#[test]
fn render_shows_a_restores_claims_and_jobs() {
    let sum = "ab".repeat(32);
    let manifest = format!(
        "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {{name: r, namespace: prod}}\nspec: {{size: 3, restore: {{from: \"s3://b/r.db\", sha256: \"{sum}\"}}}}\n"
    );
    let out = run(&["render", "-o", "json"], Some(&manifest));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    for i in 0..3 {
        assert!(
            names.contains(&format!("PersistentVolumeClaim data-r-{i}")),
            "{names:?}"
        );
        assert!(names.contains(&format!("Job r-restore-{i}")), "{names:?}");
    }
    let job = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "r-restore-0")
        .unwrap();
    let fetch = &job["spec"]["template"]["spec"]["initContainers"][0]["args"];
    assert!(
        fetch
            .as_array()
            .unwrap()
            .contains(&Value::from(format!("--sha256={sum}"))),
        "{fetch}"
    );
    let bad = manifest.replace(&sum, "abc");
    let out = run(&["render"], Some(&bad));
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "spec.restore.sha256: Invalid value: \"abc\": spec.restore.sha256 in body should match"
        ),
        "{stderr}"
    );
}

/// `review --old` pairs documents by namespace and name, never by position: `y` is no update
/// of `x`; and a denied document prints nothing on stdout (only what would be stored does).
#[test]
fn review_old_pairs_by_name_and_prints_only_what_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.yaml");
    std::fs::write(
        &old,
        "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: x}\nspec: {size: 5, version: v3.6.4, storageSize: 10Gi}\n",
    )
    .unwrap();
    let y = "apiVersion: etcd.example.com/v1\nkind: EtcdCluster\nmetadata: {name: y}\nspec: {size: 3}\n";
    let out = run(&["review", "--old", old.to_str().unwrap()], Some(y));
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no object default/y in --old"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same name: an UPDATE that shrinks, denied, and nothing on stdout.
    let x = y.replace("name: y", "name: x");
    let out = run(&["review", "--old", old.to_str().unwrap()], Some(&x));
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.size"));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The e2e runner's arguments (tests/e2e/args.rs).
fn args(a: &[&str]) -> Result<e2e_args::Args, String> {
    e2e_args::parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

#[test]
fn the_runner_takes_libtests_arguments_and_refuses_the_rest() {
    // `cargo test -- --test-threads 1` used to run nothing (its value taken for a filter).
    let a = args(&["--test-threads", "1"]).unwrap();
    assert!(a.filters.is_empty() && a.wanted("any_scenario"));
    let a = args(&["--test-threads=2", "--nocapture", "tls"]).unwrap();
    assert_eq!(a.filters, ["tls"]);
    assert!(a.wanted("a_tls_cluster") && !a.wanted("backups"));
    // `--skip X` leaves X out (it used to run only X).
    let a = args(&["--skip", "tls"]).unwrap();
    assert!(!a.wanted("a_tls_cluster") && a.wanted("backups"));
    let a = args(&["--exact", "backups"]).unwrap();
    assert!(a.wanted("backups") && !a.wanted("backups_to_s3"));
    let e = args(&["--bogus"]).unwrap_err();
    assert!(e.contains("unknown argument --bogus"), "{e}");
    assert!(args(&["--skip"]).is_err());
    assert!(args(&["--list"]).unwrap().list);
}
