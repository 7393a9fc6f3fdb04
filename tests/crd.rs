//! The CRD in config/ is exactly what `etcd-webhook crd` prints, and says what it must.

mod common;

use std::path::Path;

const CRD_FILE: &str = "config/crd/bases/etcd.example.com_etcdclusters.yaml";

fn generated() -> String {
    let out = std::process::Command::new(common::BIN)
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn config_crd_matches_the_generator() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CRD_FILE);
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert!(
        on_disk == generated(),
        "{CRD_FILE} drifted from the Rust types: run `cargo run -- crd > {CRD_FILE}`"
    );
}

#[test]
fn crd_has_storage_v1_deprecations_and_webhook_conversion() {
    let crd: serde_json::Value = serde_yaml_ng::from_str(&generated()).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let names: Vec<&str> = versions
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v1alpha1", "v1beta1", "v1"]);
    for v in versions {
        let is_v1 = v["name"] == "v1";
        assert_eq!(v["storage"], is_v1);
        assert_eq!(v["served"], true);
        assert_eq!(v["deprecated"].as_bool().unwrap_or(false), !is_v1);
        if !is_v1 {
            assert!(
                v["deprecationWarning"]
                    .as_str()
                    .unwrap()
                    .contains("use etcd.example.com/v1")
            );
        }
        assert_eq!(v["subresources"]["status"], serde_json::json!({}));
        let cols: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        // v1 alone has status.backup and status.leader (the older versions keep them in the
        // stash annotation).
        if is_v1 {
            assert_eq!(
                cols,
                [
                    "PHASE",
                    "SIZE",
                    "READY",
                    "LEADER",
                    "VERSION",
                    "LAST BACKUP",
                    "AGE"
                ]
            );
        } else {
            assert_eq!(cols, ["PHASE", "SIZE", "READY", "AGE"]);
        }
    }
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        serde_json::json!(["ec"])
    );
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let conv = &crd["spec"]["conversion"];
    assert_eq!(conv["strategy"], "Webhook");
    assert_eq!(
        conv["webhook"]["conversionReviewVersions"],
        serde_json::json!(["v1"])
    );
    let svc = &conv["webhook"]["clientConfig"]["service"];
    assert_eq!(
        (
            svc["name"].as_str(),
            svc["namespace"].as_str(),
            svc["path"].as_str()
        ),
        (Some("etcd-webhook"), Some("etcd-system"), Some("/convert"))
    );
    assert!(
        conv["webhook"]["clientConfig"].get("caBundle").is_none(),
        "caBundle is injected, never written"
    );
    let v1 = &versions[2]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(v1["size"]["minimum"], 1.0);
    assert_eq!(v1["size"]["maximum"], 7.0);
    assert_eq!(v1["version"]["pattern"], r"^v[0-9]+\.[0-9]+\.[0-9]+$");
    // Any StorageClass name, no default: unset means the cluster's default class.
    assert_eq!(
        v1["storageClass"]["pattern"],
        etcd_webhook::api::STORAGE_CLASS_PATTERN
    );
    assert_eq!(v1["storageClass"]["maxLength"], 253);
    assert!(v1["storageClass"].get("enum").is_none());
    assert!(v1["storageClass"].get("default").is_none());
}

/// No `enum` of the schema lists `null`: kubectl's client-side schema check refuses the whole
/// CRD for it ("unknown object type \"nil\""), as the e2e install once found.
#[test]
fn no_enum_lists_null() {
    fn walk(v: &serde_json::Value, path: &str, bad: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(values) = m.get("enum").and_then(|e| e.as_array())
                    && values.iter().any(serde_json::Value::is_null)
                {
                    bad.push(path.to_owned());
                }
                for (k, x) in m {
                    walk(x, &format!("{path}.{k}"), bad);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{path}[{i}]"), bad);
                }
            }
            _ => {}
        }
    }
    let crd: serde_json::Value = serde_yaml_ng::from_str(&generated()).unwrap();
    let mut bad = Vec::new();
    walk(&crd, "", &mut bad);
    assert!(bad.is_empty(), "enums with null: {bad:?}");
}
