//! What the scenarios on the real node (tests/e2e/node.rs) share: the product installed as
//! pods from `config/default`, the members reached with a cluster's client certificate (each
//! by its DNS name at its pod's address, or through the client Service's cluster IP), a writer
//! under faults, and waits on what the real kubelet and controllers report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, wait_for};
use crate::common;
use crate::install::{self, ok};
use crate::node::Node;

/// etcd's JSON gateway takes keys and values in base64.
fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The body of a `kv/put` of `key` = `value`.
fn put_body(key: &str, value: &str) -> Value {
    json!({"key": b64(key), "value": b64(value)})
}

/// The body of a serializable `kv/range` over every key the scenarios write (`/orders/...`):
/// what the member itself holds.
fn own_keys(count_only: bool) -> Value {
    json!({"key": b64("/orders/"), "range_end": b64("/orders0"), "serializable": true,
        "count_only": count_only})
}

/// What a scenario asks of the cluster: kubectl as the admin, in its namespace.
pub struct Env {
    pub cp: ControlPlane,
    /// The namespace of the scenario's clusters.
    pub ns: &'static str,
}

impl Env {
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        self.cp.kubectl_output(args, None)
    }

    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> std::process::Output {
        self.cp.kubectl_output(args, Some(stdin))
    }

    pub fn get_json(&self, args: &[&str]) -> Value {
        self.cp.get_json(args)
    }

    /// The member pods of cluster `name`, or only its voters (the label the budget and the
    /// client Service select).
    pub fn member_pods(&self, name: &str, voters_only: bool) -> Vec<Value> {
        let selector = if voters_only {
            format!("app.kubernetes.io/instance={name},etcd.example.com/voter=true")
        } else {
            format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=member")
        };
        let pods = self.get_json(&["-n", self.ns, "pods", "-l", &selector]);
        pods["items"].as_array().cloned().unwrap_or_default()
    }

    /// Cluster `name` has `size` member pods, each Ready on `image`.
    pub fn all_ready_on(&self, name: &str, size: usize, image: &str) -> bool {
        let pods = self.member_pods(name, false);
        pods.len() == size
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == image && ready(p))
    }

    /// A merge patch of the EtcdCluster `name` in the scenario's namespace.
    pub fn patch_cluster(&self, name: &str, patch: &str, what: &str) {
        ok(
            self.kubectl(&[
                "-n",
                self.ns,
                "patch",
                "etcdcluster",
                name,
                "--type=merge",
                "-p",
                patch,
            ]),
            what,
        );
    }
}

/// A client writing one key every 50 ms through the client Service (its stable cluster IP, as
/// an application does; pods get new addresses when they are replaced) until stopped. Like
/// etcd's own client on an unavailable endpoint, it tries a write again on a new connection,
/// 300 ms apart, until its 10 s deadline: a write is failed when it is not acknowledged within
/// 10 s. (A Service endpoint whose pod just went stays in kube-proxy's rules until the
/// EndpointSlice update reaches it; a try sent there times out.) How many writes needed a
/// second try is counted and printed.
/// Stops writing when dropped (a scenario that fails mid-step leaves no writer behind).
pub struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Written>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a [`Writer`] did: the acknowledged writes, the failed ones (why), how many were
/// acknowledged only on a later try.
pub struct Written {
    pub acked: BTreeMap<String, String>,
    pub failed: Vec<String>,
    pub retried: usize,
}

impl Writer {
    pub fn start(etcd: Members, what: &'static str) -> Writer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Written {
                acked: BTreeMap::new(),
                failed: Vec::new(),
                retried: 0,
            };
            let mut i = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) && i < 100_000 {
                let (k, v) = (format!("/orders/{what}/{i:05}"), format!("{what}{i}"));
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut outcome = etcd.put_via_service(&k, &v);
                if outcome.is_err() {
                    out.retried += 1;
                }
                while outcome.is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(300));
                    outcome = etcd.put_via_service(&k, &v);
                }
                match outcome {
                    Ok(()) => {
                        out.acked.insert(k, v);
                    }
                    Err(e) => out.failed.push(e),
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            out
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) -> Written {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Stops the writer; none of its writes may have failed `during` what it names.
    pub fn stop_with_none_failed(self, during: &str) -> Written {
        let w = self.stop();
        assert!(
            w.failed.is_empty(),
            "{} of {} writes failed during {during}: {:?}",
            w.failed.len(),
            w.failed.len() + w.acked.len(),
            w.failed
        );
        w
    }
}

/// A TLS client configuration with cluster `name`'s client certificate (its Secret
/// `NAME-client-tls`, which cert-manager issued), trusting the cluster's CA.
pub fn client_tls(env: &Env, name: &str) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let secret = env.get_json(&["-n", env.ns, "secret", &format!("{name}-client-tls")]);
    let field = |k: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(secret["data"][k].as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let cert_pem = field("tls.crt");
    let issued = common::Issued {
        der: CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .unwrap()
            .to_vec(),
        cert_pem,
        key_pem: field("tls.key"),
    };
    common::client_config(&field("ca.crt"), Some(&issued))
}

/// config/default applied as the shipped install is (server-side, as the installer), then:
/// the Deployment's two pods Ready (their readiness needs the serving certificate that
/// cert-manager issued into the Secret volume), one of them holding the loop's Lease, and the
/// apiserver calling /validate through the Service. `settings` are environment variables the
/// scenario adds to the product's container, as a user sets a flag through its variable
/// (`ETCD_WEBHOOK_...`); none for the install as shipped.
pub fn install_as_pods(env: &Env, settings: &[(&str, &str)]) {
    let mut objects = install::kustomize("config/default");
    for object in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
        let container = &mut object["spec"]["template"]["spec"]["containers"][0];
        let vars = container["env"]
            .as_array_mut()
            .expect("the container's env");
        for (name, value) in settings {
            vars.push(json!({"name": name, "value": value}));
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    install::apply_as_installer(&env.cp, &list, "kubectl apply --server-side config/default");
    install::wait_established(&env.cp, "the CRD becomes Established");
    ok(
        env.kubectl(&[
            "-n",
            "etcd-system",
            "rollout",
            "status",
            "deployment/etcd-webhook",
            "--timeout=180s",
        ]),
        "the product's Deployment rolls out on the node",
    );
    let pods = env.get_json(&[
        "-n",
        "etcd-system",
        "pods",
        "-l",
        "app.kubernetes.io/name=etcd-webhook",
    ]);
    let names: Vec<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| ready(p))
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 2, "two Ready replicas: {names:?}");
    let holder = wait_for(
        "a replica holds the loop's Lease",
        Duration::from_secs(60),
        || {
            let lease = env.get_json(&["-n", "etcd-system", "lease", "etcd-webhook-leader"]);
            lease["spec"]["holderIdentity"]
                .as_str()
                .filter(|h| names.iter().any(|n| n == h))
                .map(str::to_owned)
        },
    );
    // A cluster name that is no DNS-1035 label: only the webhook refuses it (the CRD's own
    // rules do not), so a denial proves the apiserver called it through the Service.
    let probe = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "1probe", "namespace": "default"},
        "spec": {"size": 3, "storageSize": "1Gi"}});
    wait_for(
        "the apiserver to call /validate through the Service",
        Duration::from_secs(60),
        || {
            let out = env.kubectl_in(
                &["create", "--dry-run=server", "-f", "-"],
                &probe.to_string(),
            );
            String::from_utf8_lossy(&out.stderr)
                .contains("denied the request")
                .then_some(())
        },
    );
    println!("the product runs as pods {names:?}; {holder} leads the loop");
}

/// SIGKILL to the etcd container of `pod` (as read from the API) through the node's containerd.
pub fn kill_etcd(node: &Node, pod: &Value, whose: &str) {
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| {
            panic!(
                "a containerd container ID for {whose} etcd: {}",
                pod["status"]
            )
        });
    ok(
        crate::cluster::run(
            node.ctr(&["tasks", "kill", "-s", "SIGKILL", container]),
            None,
        ),
        &format!("kill {whose} etcd container"),
    );
}

/// The number of the node's local volume (`local-N`, [`Node::local_volumes`]) that `claim`
/// (as read from the API) is bound to.
pub fn local_volume(claim: &Value) -> usize {
    claim["spec"]["volumeName"]
        .as_str()
        .and_then(|v| v.strip_prefix("local-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the claim is bound to a local volume: {claim}"))
}

pub fn ordinal(pod: &str) -> usize {
    pod.rsplit('-').next().unwrap().parse().unwrap()
}

pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The cluster's (as read from the API) condition of `kind`, if its status has one.
pub fn condition<'a>(ec: &'a Value, kind: &str) -> Option<&'a Value> {
    ec["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The real node on `cp` with `images` and `volumes` local volumes, the product installed as
/// pods (with `settings`, [`install_as_pods`]) and the scenario's namespace `ns` made.
pub fn start_on_node(
    mut cp: ControlPlane,
    images: &[crate::node::Image],
    volumes: usize,
    ns: &'static str,
    settings: &[(&str, &str)],
) -> (Node, Env) {
    let node = Node::start(&mut cp, images);
    node.local_volumes(&cp, volumes, "2Gi");
    let env = Env { cp, ns };
    install_as_pods(&env, settings);
    ok(
        env.kubectl(&["create", "namespace", ns]),
        "create the namespace",
    );
    (node, env)
}

/// The node first (its teardown needs no apiserver), then the control plane; nothing of
/// either may stay on the machine.
pub fn tear_down(node: Node, env: Env) {
    let (dir, made) = node.footprint();
    drop(node);
    drop(env);
    let left = crate::node::leftovers(&dir, &made);
    assert!(left.is_empty(), "the node left behind: {left:#?}");
}

/// Running, with `size` members Ready and every member voting.
pub fn is_running(ec: &Value, size: usize) -> bool {
    let status = &ec["status"];
    let voting = condition(ec, "Members").is_some_and(|c| c["reason"] == "AllVoting");
    status["phase"] == "Running" && status["readyReplicas"] == size && voting
}

pub fn wait_running_with(env: &Env, name: &str, size: usize, within: Duration) -> Value {
    wait_for(&format!("{}/{name} Running", env.ns), within, || {
        let ec = env.get_json(&["-n", env.ns, "etcdcluster", name]);
        let s = &ec["status"];
        (s["phase"] == "Running"
            && s["readyReplicas"].as_u64() == Some(size as u64)
            && s["members"].as_array().map(Vec::len) == Some(size)
            && s["leader"].is_string())
        .then(|| s.clone())
    })
}

/// The member that leads, and the raft term it leads in.
pub struct Leader {
    pub pod: String,
    pub id: String,
    pub term: u64,
}

/// The members through etcd's JSON gateway with the cluster's client certificate, each by its
/// DNS name (checked against the server certificate) at its pod's current address.
pub struct Members {
    pub name: String,
    ns: &'static str,
    size: usize,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Members {
    pub fn of_size(env: &Env, name: &str, size: usize) -> Members {
        let config = client_tls(env, name);
        let mut builder = reqwest::Client::builder()
            .use_preconfigured_tls((*config).clone())
            .http1_only()
            .timeout(Duration::from_secs(3));
        for pod in &env.member_pods(name, false) {
            let (Some(pod_name), Some(ip)) = (
                pod["metadata"]["name"].as_str(),
                pod["status"]["podIP"].as_str(),
            ) else {
                continue;
            };
            let addr: SocketAddr = format!("{ip}:2379").parse().unwrap();
            builder = builder.resolve(&host(env.ns, name, ordinal(pod_name)), addr);
        }
        let service = env.get_json(&["-n", env.ns, "service", &format!("{name}-client")]);
        let service: SocketAddr =
            format!("{}:2379", service["spec"]["clusterIP"].as_str().unwrap())
                .parse()
                .unwrap();
        builder = builder.resolve(&format!("{name}-client.{}.svc", env.ns), service);
        Members {
            name: name.to_owned(),
            ns: env.ns,
            size,
            rt: common::runtime(),
            client: builder.build().unwrap(),
        }
    }

    pub fn call(&self, member: usize, path: &str, body: Value) -> Result<Value, String> {
        self.call_host(&host(self.ns, &self.name, member), path, body)
    }

    /// A write through the client Service (`NAME-client.NS.svc`, its cluster IP).
    pub fn put_via_service(&self, key: &str, value: &str) -> Result<(), String> {
        let host = format!("{}-client.{}.svc", self.name, self.ns);
        self.call_host(&host, "kv/put", put_body(key, value))
            .map(|_| ())
    }

    /// A write through `member` alone.
    pub fn put(&self, member: usize, key: &str, value: &str) -> Result<(), String> {
        self.call(member, "kv/put", put_body(key, value))
            .map(|_| ())
    }

    /// `member` answers a serializable read of its own data (no leader needed).
    pub fn reads_its_own(&self, member: usize) -> Result<(), String> {
        self.call(member, "kv/range", own_keys(true)).map(|_| ())
    }

    pub fn call_host(&self, host: &str, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("https://{host}:2379/v3/{path}");
        self.rt.block_on(async {
            let resp = self
                .client
                .post(&url)
                .json(&body)
                .send()
                .await
                .map_err(|e| {
                    let mut why = format!("{url}: {e}");
                    let mut source = std::error::Error::source(&e);
                    while let Some(cause) = source {
                        why.push_str(&format!(": {cause}"));
                        source = cause.source();
                    }
                    why
                })?;
            let code = resp.status();
            let body: Value = resp.json().await.map_err(|e| format!("{url}: {e}"))?;
            if code.is_success() {
                Ok(body)
            } else {
                Err(format!("{url}: {code} {body}"))
            }
        })
    }

    /// (member ID, leader ID, raft term) as the member sees them.
    pub fn status(&self, member: usize) -> Result<(String, String, u64), String> {
        let s = self.call(member, "maintenance/status", json!({}))?;
        let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let term = field(&s["raftTerm"]).parse().unwrap_or(0);
        Ok((field(&s["header"]["member_id"]), field(&s["leader"]), term))
    }

    /// The member that answers as its own leader, with its term.
    pub fn try_leader(&self) -> Option<Leader> {
        (0..self.size).find_map(|m| {
            let (id, leader, term) = self.status(m).ok()?;
            (id == leader).then(|| Leader {
                pod: format!("{}-{m}", self.name),
                id,
                term,
            })
        })
    }

    pub fn leader(&self) -> Leader {
        wait_for("a leader", Duration::from_secs(30), || self.try_leader())
    }

    pub fn put_any(&self, key: &str, value: &str) -> Result<(), String> {
        let mut last = String::new();
        for m in 0..self.size {
            match self.put(m, key, value) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Every member reports `version` (`vX.Y.Z`) and holds every acknowledged write.
    pub fn assert_release_and_writes(&self, version: &str, acked: &BTreeMap<String, String>) {
        for i in 0..self.size {
            let status = self
                .call(i, "maintenance/status", json!({}))
                .expect("a member's status");
            assert_eq!(
                status["version"].as_str(),
                Some(version.trim_start_matches('v')),
                "{}-{i} runs the new release",
                self.name
            );
            self.assert_has_all(i, acked);
        }
    }

    /// Every acknowledged key, read from `member` alone (serializable: its own data).
    pub fn assert_has_all(&self, member: usize, acked: &BTreeMap<String, String>) {
        // A follower applies what the leader committed a moment later, and a member that just
        // came back catches up: what it lacks must be gone within 30 s, else it is lost.
        let start = Instant::now();
        loop {
            let lost = self.missing(member, acked);
            if lost.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{}-{member} lost {} acknowledged writes: {lost:?}",
                self.name,
                lost.len()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The acknowledged writes `member`'s own data (a serializable read) lacks.
    pub fn missing(&self, member: usize, acked: &BTreeMap<String, String>) -> Vec<String> {
        let Ok(all) = self.call(member, "kv/range", own_keys(false)) else {
            return acked.keys().cloned().collect();
        };
        let got: BTreeMap<String, String> = all["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|kv| {
                let d = |f: &str| {
                    String::from_utf8(
                        base64::engine::general_purpose::STANDARD
                            .decode(kv[f].as_str().unwrap_or_default())
                            .unwrap(),
                    )
                    .unwrap()
                };
                (d("key"), d("value"))
            })
            .collect();
        acked
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

pub fn host(ns: &str, name: &str, member: usize) -> String {
    format!("{name}-{member}.{name}.{ns}.svc")
}
