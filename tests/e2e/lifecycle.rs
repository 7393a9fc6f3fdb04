//! What the apiserver does when the webhook is gone, and the chart against the real API.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::wait_for;
use crate::common;
use crate::install::{Env, NAMESPACE, label, ok, yaml_docs};

/// With the webhook process stopped, `failurePolicy: Fail` rejects writes with the apiserver's
/// message and reads in an old version fail (the conversion webhook is unreachable); v1 reads
/// still work. Both recover when a replica returns, without touching the apiserver.
pub fn webhook_down_fails_closed_and_recovers(env: &Env) {
    let ns = "e2e-down";
    ok(
        env.kubectl(&["create", "namespace", ns]),
        "create namespace",
    );
    let cluster = |name: &str| {
        json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"size": 1, "version": "v3.5.10", "storageSize": "1Gi"}
        })
        .to_string()
    };
    ok(
        env.kubectl_in(&["create", "-f", "-"], &cluster("before")),
        "create while up",
    );

    env.stop_webhook();

    let out = env.kubectl_in(&["create", "-f", "-"], &cluster("during"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a write with the webhook down is rejected"
    );
    assert!(
        err.contains(
            "Internal error occurred: failed calling webhook \"metcdcluster.etcd.example.com\""
        ),
        "the apiserver's message: {err}"
    );
    let old = env.kubectl(&[
        "-n",
        ns,
        "get",
        "etcdclusters.v1alpha1.etcd.example.com",
        "before",
    ]);
    let err = String::from_utf8_lossy(&old.stderr);
    assert!(!old.status.success(), "a v1alpha1 read needs /convert");
    assert!(
        err.contains("conversion webhook for etcd.example.com/v1, Kind=EtcdCluster failed"),
        "{err}"
    );
    ok(
        env.kubectl(&[
            "-n",
            ns,
            "get",
            "etcdclusters.v1.etcd.example.com",
            "before",
        ]),
        "a v1 read needs no conversion",
    );

    // A replica comes back (on another port, as a new pod would); the apiserver was not touched.
    env.serve_with("etcd-webhook-e2e-3");
    wait_for(
        "writes to be admitted again",
        Duration::from_secs(30),
        || {
            env.kubectl_in(&["create", "-f", "-"], &cluster("after"))
                .status
                .success()
                .then_some(())
        },
    );
    let read = env.get_json(&["-n", ns, "etcdclusters.v1alpha1.etcd.example.com", "before"]);
    assert_eq!(read["spec"]["replicas"], 1, "{read}");
}

/// `helm template` of the chart with its defaults, every object server-side dry-run applied; the
/// objects of APIs this cluster does not serve are listed, never dropped silently. The chart must
/// go into etcd-system, where the kustomize install's Deployment has another selector (with the
/// release's instance label), which cannot change: that Deployment (it never runs here) is removed
/// first, so the dry run is what a fresh `helm install` would send.
pub fn helm_chart_dry_runs_on_the_real_api(env: &Env) {
    let ns = NAMESPACE;
    ok(
        env.kubectl(&["-n", ns, "delete", "deployment", "etcd-webhook"]),
        "remove the kustomize Deployment",
    );
    let out = std::process::Command::new(common::k8s_tools().join("helm"))
        .args([
            "template",
            "etcd-webhook",
            "charts/etcd-webhook",
            "--namespace",
            ns,
            "--include-crds",
        ])
        .current_dir(common::root())
        .output()
        .unwrap();
    let rendered = ok(out, "helm template");
    let served = ok(env.kubectl(&["api-versions"]), "kubectl api-versions");
    let served: Vec<&str> = served.lines().collect();
    let (known, skipped): (Vec<Value>, Vec<Value>) = yaml_docs(&rendered)
        .into_iter()
        .partition(|d| served.contains(&d["apiVersion"].as_str().unwrap_or("")));
    let skipped: Vec<String> = skipped.iter().map(label).collect();
    eprintln!("    skipped (API not served here): {skipped:?}");
    for s in &skipped {
        assert!(
            s.starts_with("Issuer ") || s.starts_with("Certificate "),
            "only cert-manager's objects may lack an API here: {s}"
        );
    }
    assert!(
        known.len() >= 10,
        "the chart renders the install: {}",
        known.len()
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": known});
    let applied = ok(
        env.kubectl_in(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--force-conflicts",
                "--field-manager=helm-e2e",
                "-n",
                ns,
                "-f",
                "-",
            ],
            &list.to_string(),
        ),
        "server-side dry-run of the chart",
    );
    assert_eq!(
        applied.lines().count(),
        known.len(),
        "one line per object applied:\n{applied}"
    );
}
