//! What the apiserver does when the webhook is gone, and the chart against the real API.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::wait_for;
use crate::common;
use crate::install::{CA_BUNDLES, Env, NAMESPACE, SERVICE, label, ok, yaml_docs};
use crate::rotation::Delivery;

/// With the webhook process stopped, `failurePolicy: Fail` rejects writes with the apiserver's
/// message and reads in an old version fail (the conversion webhook is unreachable); v1 reads
/// still work. Both recover when a replica returns, without touching the apiserver.
pub fn webhook_down_fails_closed_and_recovers(env: &Env) {
    let ns = "e2e-down";
    env.create_namespace(ns);
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
    // The chart README's upgrade step, for real: the chart's CRD applied server-side over the
    // installed one keeps cainjector's caBundle.
    let crd_bundle = CA_BUNDLES[2];
    let before = env.ca_bundle(crd_bundle);
    ok(
        env.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            common::root()
                .join("charts/etcd-webhook/crds/")
                .to_str()
                .unwrap(),
        ]),
        "the chart README's CRD upgrade",
    );
    assert!(!before.is_empty());
    assert_eq!(
        env.ca_bundle(crd_bundle),
        before,
        "the caBundle survives the upgrade"
    );
}

/// cert-manager's chain end to end: the certificate the webhook serves is the one in the Secret
/// cert-manager issued, and it verifies, for the Service's DNS name, against the caBundle that
/// cainjector wrote into each webhook configuration and the CRD.
pub fn the_served_certificate_is_what_the_apiserver_trusts(env: &Env) {
    the_served_certificate_is_what_the_apiserver_trusts_now(env, Delivery::Volume);
    let certificate = env.get_json(&["-n", NAMESPACE, "certificate", "etcd-webhook-serving"]);
    assert_eq!(certificate["spec"]["secretName"], "etcd-webhook-tls");
    assert_eq!(
        certificate["status"]["revision"], 1,
        "{}",
        certificate["status"]
    );
}

/// The served certificate verifies against each caBundle, and it is the Secret's.
pub fn the_served_certificate_is_what_the_apiserver_trusts_now(env: &Env, delivery: Delivery) {
    use base64::Engine;
    let port = env.webhook.lock().unwrap().as_ref().unwrap().addr.port();
    let host = format!("{SERVICE}.{NAMESPACE}.svc");
    for target @ (kind, name, _) in CA_BUNDLES {
        let bundle = env.ca_bundle(target);
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
    if delivery == Delivery::Volume {
        let mounted = std::fs::read(env.webhook_certs.join("tls.crt")).unwrap();
        assert_eq!(mounted, issued, "the mounted pair is the issued one");
    }
    let (_, pem) = x509_parser::pem::parse_x509_pem(&issued).unwrap();
    let leaf = pem.parse_x509().unwrap();
    let serial: String = leaf
        .tbs_certificate
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let log = env.webhook.lock().unwrap().as_ref().unwrap().log();
    let last_loaded = log
        .lines()
        .rfind(|l| l.contains("serving certificate loaded"))
        .and_then(|l| l.split("serial=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned);
    assert_eq!(
        last_loaded.as_deref(),
        Some(serial.trim_start_matches("00")),
        "the server serves the Secret's leaf"
    );
}

/// Pauses a component with SIGSTOP until dropped (SIGCONT), so a test can act while it sleeps.
pub struct Paused(u32);

impl Paused {
    pub fn new(pid: u32) -> Paused {
        signal(pid, "STOP");
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Issue 15, item 5: the caBundle self-check. A replica with `--cabundle-check on` (every 1 s)
/// reports all three objects trusted; with cainjector paused, a caBundle replaced by another
/// CA's turns `etcd_webhook_cabundle_mismatch` to 1 for that object (and only that one) within
/// the period, with a Warning Event on it; once cainjector runs again it adds the CA back and the
/// metric returns to 0. `/readyz` stays 200 throughout.
pub fn a_cabundle_mismatch_is_reported_until_cainjector_repairs_it(env: &Env) {
    let server = env.start_replica(
        "etcd-webhook-cabundle",
        &[
            "--controller=off",
            "--cabundle-check=on",
            "--cabundle-check-interval=1s",
        ],
    );
    let objects = [
        "mutatingwebhookconfiguration/etcd-webhook-mutating",
        "validatingwebhookconfiguration/etcd-webhook-validating",
        "customresourcedefinition/etcdclusters.etcd.example.com",
    ];
    let gauge = |object: &str| {
        let (_, body) = server.health_get("/metrics");
        body.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "etcd_webhook_cabundle_mismatch{{object=\"{object}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.to_owned())
    };
    wait_for(
        "every caBundle checked and trusted",
        Duration::from_secs(30),
        || {
            objects
                .iter()
                .all(|o| gauge(o).as_deref() == Some("0"))
                .then_some(())
        },
    );

    let (kind, name, path) = CA_BUNDLES[1];
    let original = env.ca_bundle(CA_BUNDLES[1]);
    let other = tempfile::tempdir().unwrap();
    common::make_certs(other.path(), &[]);
    let other_ca = std::fs::read(other.path().join("ca.crt")).unwrap();
    use base64::Engine as _;
    let other_ca = base64::engine::general_purpose::STANDARD.encode(other_ca);
    {
        let _cainjector = Paused::new(env.cp.pid("cainjector"));
        let patch = json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other_ca}]);
        ok(
            env.kubectl(&["patch", kind, name, "--type=json", "-p", &patch.to_string()]),
            "replace the caBundle with another CA's",
        );
        let start = std::time::Instant::now();
        wait_for(
            "the mismatch to be reported",
            Duration::from_secs(10),
            || (gauge(objects[1]).as_deref() == Some("1")).then_some(()),
        );
        println!(
            "    caBundle mismatch reported {:.1} s after the patch (check every 1 s)",
            start.elapsed().as_secs_f64()
        );
        assert_eq!(gauge(objects[0]).as_deref(), Some("0"));
        assert_eq!(gauge(objects[2]).as_deref(), Some("0"));
        assert_eq!(
            server.health_get("/readyz").0,
            200,
            "readiness does not depend on it"
        );
        assert!(
            server.wait_log(
                "caBundle self-check: the apiserver will not trust",
                Duration::from_secs(5)
            ),
            "{}",
            server.log()
        );
        let event = wait_for("the Warning Event", Duration::from_secs(10), || {
            let events = env.get_json(&["-n", "default", "events.events.k8s.io"]);
            events["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["reason"] == "CABundleMismatch" && e["regarding"]["name"] == name)
                .cloned()
        });
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["regarding"]["kind"], "ValidatingWebhookConfiguration");
        assert!(
            event["note"]
                .as_str()
                .unwrap()
                .contains("does not verify against"),
            "{event}"
        );
    }
    // cainjector runs again and acts on the change it missed: cert-manager v1.19.4 appends the
    // Secret's CA to the bundle (CAInjectorMerging, on by default) rather than replacing it, so
    // trust is back while the foreign CA stays beside it.
    let start = std::time::Instant::now();
    let ca_certs = |b64: &str| -> Vec<Vec<u8>> {
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default();
        x509_parser::pem::Pem::iter_from_buffer(&pem)
            .filter_map(|p| p.ok().map(|p| p.contents))
            .collect()
    };
    let ours = ca_certs(&original);
    let repaired = wait_for(
        "cainjector to put the Secret's CA back into the caBundle",
        Duration::from_secs(30),
        || {
            let now = ca_certs(&env.ca_bundle((kind, name, path)));
            now.contains(&ours[0]).then_some(now)
        },
    );
    wait_for("the mismatch to clear", Duration::from_secs(10), || {
        (gauge(objects[1]).as_deref() == Some("0")).then_some(())
    });
    println!(
        "    cainjector put the CA back and the metric returned to 0 {:.1} s after cainjector resumed; the bundle holds {} CAs (the foreign one kept beside it)",
        start.elapsed().as_secs_f64(),
        repaired.len()
    );
    // Leave the bundle as the install had it.
    let patch =
        json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": original}]);
    ok(
        env.kubectl(&["patch", kind, name, "--type=json", "-p", &patch.to_string()]),
        "remove the foreign CA",
    );
}
