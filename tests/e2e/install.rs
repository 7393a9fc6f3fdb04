//! The product installed as shipped on the real control plane: `kubectl kustomize config/default`
//! applied with server-side apply, changed only where no cluster of this kind can follow:
//! - there is no kubelet, so the Deployment's pods never run: the binary runs as a local process
//!   with the Deployment's own arguments (only the listen addresses, the certificate folder and the
//!   log format differ), as the ServiceAccount `etcd-system/etcd-webhook` (a TokenRequest token in a
//!   kubeconfig), so the shipped RBAC is what is tested;
//! - cert-manager (controller and cainjector, built from its Go module) issues the shipped chain,
//!   but no kubelet mounts the Secret: the test copies it into a folder laid out as a Secret
//!   volume (the `..data` symlink), and checks that cainjector's caBundles carry its CA;
//! - nothing runs the final-snapshot Job either, so an attempt is replaced after
//!   `--finalizer-timeout=20s` (the only flag added to the Deployment's) and the scenarios let
//!   a cluster with backups go with the release annotation;
//! - the apiserver resolves the shipped service reference `etcd-webhook.etcd-system.svc:443` to the
//!   local process through the control plane's service map (tests/controlplane/main.go).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{self, ControlPlane, wait_for};
use crate::common::{self, Server};

pub const NAMESPACE: &str = "etcd-system";
pub const SERVICE: &str = "etcd-webhook";
pub const CRD: &str = "etcdclusters.etcd.example.com";

/// Where cainjector writes the CA: (resource, name, JSONPath of the caBundle).
pub const CA_BUNDLES: [(&str, &str, &str); 3] = [
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
];

/// The cluster with the product installed, and the webhook process serving it.
pub struct Env {
    pub cp: ControlPlane,
    /// The Deployment's container arguments as shipped.
    pub deployment_args: Vec<String>,
    pub webhook_certs: PathBuf,
    /// kubeconfig of the ServiceAccount etcd-system/etcd-webhook.
    pub sa_kubeconfig: PathBuf,
    /// The replica the Service routes to.
    pub webhook: Mutex<Option<Server>>,
    /// Flags every replica gets beyond the Deployment's (each replaces the Deployment's own).
    replica_flags: Vec<String>,
    /// Every replica started: (pod name, its log).
    replica_logs: Mutex<Vec<(String, Arc<Mutex<String>>)>>,
}

/// `kubectl kustomize DIR` of the project, as JSON documents.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let rendered = ok(
        Command::new(common::k8s_tools().join("kubectl"))
            .args(["kustomize", dir])
            .current_dir(common::root())
            .output()
            .unwrap(),
        &format!("kubectl kustomize {dir}"),
    );
    yaml_docs(&rendered)
}

/// The first ```sh block of the section `heading` (`## Title` or `### Title`) of the page `path`
/// (relative to the repository root, e.g. `docs/versions.md`), as written.
pub fn doc_block(path: &str, heading: &str) -> String {
    let page = std::fs::read_to_string(common::root().join(path)).unwrap();
    let section = page
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("{path} has a section {heading:?}"));
    let section = section.split("\n## ").next().unwrap();
    let section = section.split("\n### ").next().unwrap();
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .unwrap_or_else(|| panic!("{path}'s {heading:?} has a ```sh block"))
        .to_owned()
}

/// Splits a YAML stream into JSON values (empty documents dropped).
pub fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kind namespace/name` of an object.
pub fn label(obj: &Value) -> String {
    format!(
        "{} {}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Server-side apply with the install's field manager (`e2e-install`), so a later install over
/// the same objects owns the same fields.
pub fn apply_as_installer(cp: &ControlPlane, objects: &Value, what: &str) {
    ok(
        cp.kubectl_output(
            &[
                "apply",
                "--server-side",
                "--field-manager=e2e-install",
                "-f",
                "-",
            ],
            Some(&objects.to_string()),
        ),
        what,
    );
}

/// Waits (60 s at most) until the EtcdCluster CRD is Established.
pub fn wait_established(cp: &ControlPlane, what: &str) {
    ok(
        cp.kubectl_output(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{CRD}"),
            ],
            None,
        ),
        what,
    );
}

/// Stdout of a successful command; panics with its stderr otherwise.
pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl Env {
    pub fn install(cp: ControlPlane) -> Env {
        Env::install_with(
            cp,
            &[
                // One log line per reconcile pass, naming its cluster (what a scenario waits on).
                "--log-level=info,etcd_webhook::controller::pass=debug",
                // The shared suite makes hundreds of clusters in one scenario
                // (list_of_200_in_an_old_version) and expects the loop's work for them done
                // before the next; at the shipped 20/s that takes 100 s. The shipped limits are
                // what the scale scenario (tests/e2e/scale.rs) measures, on a cluster of its own.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
    }

    /// The install, with `replica_flags` added to every replica's arguments (replacing the
    /// Deployment's value of the same flag), e.g. `--controller=off` for webhooks only.
    /// Clusters are plain HTTP unless a scenario sets `spec.tls` (`--default-member-tls=false`,
    /// unless `replica_flags` say otherwise): no member runs in these scenarios (no kubelet), and
    /// scenarios that make hundreds of clusters would otherwise have cert-manager issue four
    /// certificates for each. The shipped default (TLS) is what the chart scenario installs.
    pub fn install_with(cp: ControlPlane, replica_flags: &[&str]) -> Env {
        let objects = kustomize("config/default");
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        apply_as_installer(&cp, &list, "kubectl apply --server-side config/default");
        let mut flags = replica_flags.to_vec();
        if !flags.iter().any(|f| f.starts_with("--default-member-tls")) {
            flags.push("--default-member-tls=false");
        }
        Env::adopt(cp, &objects, &flags)
    }

    /// The rest of an install once its `objects` are in the cluster (by kubectl or helm): the
    /// CRD Established, cert-manager's chain issued and injected, the Secret laid out as a
    /// volume, a replica serving with the Deployment's arguments, and the apiserver calling it.
    pub fn adopt(cp: ControlPlane, objects: &[Value], replica_flags: &[&str]) -> Env {
        let deployment = objects
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the install has the Deployment");
        let deployment_args: Vec<String> = serde_json::from_value(
            deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
        )
        .expect("the Deployment's args");
        wait_established(&cp, "the CRD becomes Established");
        let env = Env {
            sa_kubeconfig: cp.dir.join("etcd-webhook-sa.kubeconfig"),
            webhook_certs: cp.dir.join("webhook-certs"),
            cp,
            deployment_args,
            webhook: Mutex::new(None),
            replica_flags: replica_flags.iter().map(|f| (*f).to_owned()).collect(),
            replica_logs: Mutex::new(Vec::new()),
        };
        env.mount_serving_secret();
        env.write_sa_kubeconfig();
        env.serve_with("etcd-webhook-e2e-0");
        env.wait_webhook_called();
        env
    }

    /// cert-manager issues the shipped chain (SelfSigned issuer -> CA Certificate -> CA issuer ->
    /// serving Certificate); its Secret is laid out as the kubelet mounts a Secret volume (files
    /// behind the `..data` symlink), and cainjector's caBundles must match the Secret's CA.
    fn mount_serving_secret(&self) {
        ok(
            self.kubectl(&[
                "-n",
                NAMESPACE,
                "wait",
                "--for=condition=Ready",
                "--timeout=120s",
                "certificate/etcd-webhook-ca",
                "certificate/etcd-webhook-serving",
            ]),
            "cert-manager issues the shipped Certificates",
        );
        let ca_pem = self.sync_secret_volume()["ca.crt"].clone();
        // cainjector writes the CA of the serving Certificate into all three.
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        for target in CA_BUNDLES {
            wait_for(
                &format!(
                    "cainjector to fill the caBundle of {} {}",
                    target.0, target.1
                ),
                Duration::from_secs(60),
                || (self.ca_bundle(target) == ca).then_some(()),
            );
        }
    }

    /// The caBundle (base64, as stored) at one of [`CA_BUNDLES`].
    pub fn ca_bundle(&self, (kind, name, path): (&str, &str, &str)) -> String {
        let out = self.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Does what the kubelet does for a Secret volume: see [`write_secret_volume`].
    pub fn sync_secret_volume(&self) -> std::collections::BTreeMap<String, Vec<u8>> {
        write_secret_volume(&self.cp.kubeconfig, &self.webhook_certs)
    }

    /// [`Env::sync_secret_volume`] as a function another thread can call.
    pub fn volume_writer(&self) -> impl Fn() + Send + 'static {
        let (kubeconfig, dir) = (self.cp.kubeconfig.clone(), self.webhook_certs.clone());
        move || {
            write_secret_volume(&kubeconfig, &dir);
        }
    }

    /// A kubeconfig with a TokenRequest token of the ServiceAccount the Deployment runs as.
    fn write_sa_kubeconfig(&self) {
        let token = ok(
            self.kubectl(&["-n", NAMESPACE, "create", "token", SERVICE, "--duration=2h"]),
            "a token of the ServiceAccount etcd-system/etcd-webhook",
        );
        std::fs::write(
            &self.sa_kubeconfig,
            cluster::kubeconfig(
                &self.cp.server,
                &self.cp.ca_pem,
                &cluster::token_user(token.trim()),
            ),
        )
        .unwrap();
    }

    /// Starts one replica: the Deployment's arguments with loopback listeners, the serving pair of
    /// this install, and the pod's environment (POD_NAME, POD_NAMESPACE, the ServiceAccount).
    pub fn start_replica(&self, pod_name: &str, extra: &[&str]) -> Server {
        let flag = |a: &str| a.split('=').next().unwrap_or_default().to_owned();
        let mut added: Vec<&str> = vec!["--finalizer-timeout=20s"];
        added.extend(self.replica_flags.iter().map(String::as_str));
        added.extend_from_slice(extra);
        let mut replaced = vec!["--addr", "--health-addr", "--cert-dir", "--log-format"]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        replaced.extend(added.iter().map(|a| flag(a)));
        let mut args: Vec<&str> = self
            .deployment_args
            .iter()
            .map(String::as_str)
            .filter(|a| *a != "serve")
            .filter(|a| !replaced.contains(&flag(a)))
            .collect();
        args.extend(added);
        let kubeconfig = self.sa_kubeconfig.to_str().unwrap();
        let env = [
            ("KUBECONFIG", kubeconfig),
            ("POD_NAME", pod_name),
            ("POD_NAMESPACE", NAMESPACE),
        ];
        // On a real node, the replica resolves names through its cluster DNS, as its pod would.
        let mut server = match &self.cp.resolv_conf {
            Some(resolv) => Server::spawn_resolving(&self.webhook_certs, &args, &env, resolv),
            None => Server::spawn_with(&self.webhook_certs, &args, None, &env),
        };
        self.replica_logs
            .lock()
            .unwrap()
            .push((pod_name.to_owned(), server.log.clone()));
        server.wait_listening(Duration::from_secs(30));
        server
    }

    /// Points the Service etcd-system/etcd-webhook:443 at a replica.
    pub fn route_to(&self, server: &Server) {
        std::fs::write(
            &self.cp.service_map,
            format!("{NAMESPACE}/{SERVICE}:443={}\n", server.addr),
        )
        .unwrap();
    }

    /// Stops the serving replica with SIGTERM (it must exit 0). The apiserver's connections to it
    /// break, so it dials (and resolves the Service) anew.
    pub fn stop_webhook(&self) {
        let mut server = self
            .webhook
            .lock()
            .unwrap()
            .take()
            .expect("a serving replica");
        server.sigterm();
        assert_eq!(
            server.wait_exit(Duration::from_secs(30)),
            Some(0),
            "{}",
            server.log()
        );
    }

    /// The serving replica's log so far.
    pub fn serving_log(&self) -> String {
        self.webhook
            .lock()
            .unwrap()
            .as_ref()
            .expect("a serving replica")
            .log()
    }

    /// Starts a replica as pod `pod_name` and routes the Service to it.
    pub fn serve_with(&self, pod_name: &str) {
        let server = self.start_replica(pod_name, &[]);
        self.route_to(&server);
        *self.webhook.lock().unwrap() = Some(server);
    }

    /// Sets `failurePolicy` on both webhook configurations.
    pub fn set_failure_policy(&self, policy: &str) {
        for (kind, name) in [
            ("mutatingwebhookconfiguration", "etcd-webhook-mutating"),
            ("validatingwebhookconfiguration", "etcd-webhook-validating"),
        ] {
            let body = serde_json::json!([
                {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}
            ])
            .to_string();
            ok(
                self.kubectl(&["patch", kind, name, "--type=json", "-p", &body]),
                &format!("failurePolicy {policy} on {name}"),
            );
        }
    }

    /// Waits until the apiserver calls the webhook (configurations take effect asynchronously):
    /// a server-side dry run of a cluster whose name is no DNS-1035 label is denied by /validate
    /// (a rule the CRD's own CEL rules do not have, so only the webhook can deny it).
    pub fn wait_webhook_called(&self) {
        let probe = r#"{"apiVersion":"etcd.example.com/v1","kind":"EtcdCluster",
            "metadata":{"name":"1probe","namespace":"default"},
            "spec":{"size":3,"version":"v3.5.10","storageSize":"1Gi"}}"#;
        wait_for(
            "the apiserver to call /validate",
            Duration::from_secs(60),
            || {
                let out = self.kubectl_in(&["create", "--dry-run=server", "-f", "-"], probe);
                let err = String::from_utf8_lossy(&out.stderr);
                err.contains("denied the request").then_some(())
            },
        );
    }

    pub fn create_namespace(&self, ns: &str) {
        ok(
            self.kubectl(&["create", "namespace", ns]),
            &format!("create namespace {ns}"),
        );
    }

    /// Creates the v1 EtcdCluster `ns/name` with `spec`.
    pub fn create_cluster(&self, ns: &str, name: &str, spec: Value) {
        let cluster = serde_json::json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        ok(
            self.kubectl_in(&["create", "-f", "-"], &cluster.to_string()),
            &format!("create EtcdCluster {ns}/{name}"),
        );
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.cp.kubectl_output(args, None)
    }

    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> Output {
        self.cp.kubectl_output(args, Some(stdin))
    }

    /// `kubectl get -o json` as admin.
    pub fn get_json(&self, args: &[&str]) -> Value {
        self.cp.get_json(args)
    }

    /// Writes every replica's log into the run's log folder.
    pub fn save_webhook_logs(&self) {
        for (pod, log) in self.replica_logs.lock().unwrap().iter() {
            let _ = std::fs::write(
                self.cp.logs.join(format!("{pod}.log")),
                log.lock().unwrap().as_str(),
            );
        }
    }
}

/// Does what the kubelet does for a Secret volume: the Secret's data is written into a new
/// timestamped folder, then the `..data` symlink is swapped to it in one rename, and the old
/// folder removed; `tls.crt` and friends are symlinks through `..data`. Returns the data.
pub fn write_secret_volume(
    kubeconfig: &Path,
    dir: &Path,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    use base64::Engine;
    let out = ok(
        cluster::kubectl_as(
            kubeconfig,
            &[
                "-n",
                NAMESPACE,
                "get",
                "secret",
                "etcd-webhook-tls",
                "-o",
                "json",
            ],
            None,
        ),
        "read the serving Secret",
    );
    let secret: Value = serde_json::from_str(&out).unwrap();
    let data: std::collections::BTreeMap<String, Vec<u8>> = ["tls.crt", "tls.key", "ca.crt"]
        .into_iter()
        .map(|key| {
            let b64 = secret["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("the Secret has {key}"));
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            (key.to_owned(), bytes)
        })
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let version = format!("..{stamp}");
    std::fs::create_dir(dir.join(&version)).unwrap();
    for (key, bytes) in &data {
        std::fs::write(dir.join(&version).join(key), bytes).unwrap();
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for key in data.keys() {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(key), link).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
    data
}
