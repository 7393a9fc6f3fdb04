//! What the apiserver does when the webhook is gone, and the chart against the real API.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::wait_for;
use crate::common;
use crate::install::{CRD, Env, NAMESPACE, SERVICE, label, ok, yaml_docs};

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

/// `helm template` of the chart with its defaults, every object (cert-manager's included)
/// server-side dry-run applied; an object of an API this cluster does not serve fails the test,
/// never dropped silently. The chart must
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
    // cert-manager runs here, so every object of the defaults has its API.
    assert!(
        skipped.is_empty(),
        "objects without an API here: {skipped:?}"
    );
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

/// cert-manager's chain end to end: the certificate the webhook serves is the one in the Secret
/// cert-manager issued, and it verifies, for the Service's DNS name, against the caBundle that
/// cainjector wrote into each webhook configuration and the CRD.
pub fn the_served_certificate_is_what_the_apiserver_trusts(env: &Env) {
    use base64::Engine;
    let port = env.webhook.lock().unwrap().as_ref().unwrap().addr.port();
    let host = format!("{SERVICE}.{NAMESPACE}.svc");
    for (kind, name, path) in [
        (
            "mutatingwebhookconfiguration",
            "etcd-webhook-mutating",
            "{.webhooks[0].clientConfig.caBundle}",
        ),
        (
            "validatingwebhookconfiguration",
            "etcd-webhook-validating",
            "{.webhooks[0].clientConfig.caBundle}",
        ),
        (
            "crd",
            CRD,
            "{.spec.conversion.webhook.clientConfig.caBundle}",
        ),
    ] {
        let bundle = ok(
            env.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]),
            "read the caBundle",
        );
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle.trim())
            .unwrap_or_else(|e| panic!("{kind} {name}: caBundle is not base64: {e}"));
        let file = env.cp.dir.join(format!("{kind}.ca.crt"));
        std::fs::write(&file, pem).unwrap();
        // curl checks the chain and the name, as the apiserver does.
        let out = std::process::Command::new("curl")
            .args(["--silent", "--show-error", "--fail", "--cacert"])
            .arg(&file)
            .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
            .arg(format!("https://{host}:{port}/healthz"))
            .output()
            .expect("run curl");
        assert!(
            out.status.success(),
            "{kind} {name}: the served certificate does not verify against its caBundle: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The served leaf is the Secret's.
    let secret = env.get_json(&["-n", NAMESPACE, "secret", "etcd-webhook-tls"]);
    let issued = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["tls.crt"].as_str().unwrap())
        .unwrap();
    let served = std::fs::read(env.webhook_certs.join("tls.crt")).unwrap();
    assert_eq!(served, issued, "the mounted pair is the issued one");
    let certificate = env.get_json(&["-n", NAMESPACE, "certificate", "etcd-webhook-serving"]);
    assert_eq!(certificate["spec"]["secretName"], "etcd-webhook-tls");
    assert_eq!(
        certificate["status"]["revision"], 1,
        "{}",
        certificate["status"]
    );
}
