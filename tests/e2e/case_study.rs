//! The seed's case study, an etcd operator with failover, on a real node (tests/e2e/node.rs):
//! config/default installed as shipped, with member TLS on (the shipped default), the product's
//! replica reaching the members through the cluster DNS as its pod would; an EtcdCluster applied
//! with kubectl becomes three real etcd pods (the rendered StatefulSet as the kubelet runs it:
//! the image's entrypoint, non-root 65532 with a read-only root and seccomp RuntimeDefault,
//! fsGroup on local volumes, cert-manager's Secrets as volumes, the probes with their timing,
//! peers that find each other by their headless Service's DNS names and check each other's
//! certificates by reverse lookups); writes with the client certificate; the leader's pod
//! deleted, then a member's container killed: a new leader, the member back on its own data,
//! every acknowledged write still there.
//!
//! Not yet here (issue 44 goes on): the product itself as pods of its Deployment (it needs its
//! image and kube-proxy for the in-cluster apiserver address), scale, upgrade, backups by the
//! real CronJob controller, restore, deletion with a final snapshot, leaf renewal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, wait_for};
use crate::common;
use crate::install::{Env, ok};
use crate::node::{self, Node};

const NS: &str = "case-study";
const NAME: &str = "orders";
const SIZE: usize = 3;

pub fn case_study_on_a_real_node(mut cp: ControlPlane) {
    let started = Instant::now();
    let image = node::etcd_image(&cp, etcd_webhook::api::defaults::VERSION);
    let node = Node::start(&mut cp, &[image]);
    node.local_volumes(&cp, SIZE, "2Gi");
    let env = Env::install_with(
        cp,
        &[
            "--log-level=info,etcd_webhook::controller::pass=debug",
            // The shipped default, said here because the shared suite's installs turn it off.
            "--default-member-tls=true",
        ],
    );
    // The product runs as the test's replica process (above), not yet as pods of its
    // Deployment: there is no image of it on the node yet.
    ok(
        env.kubectl(&[
            "-n",
            "etcd-system",
            "scale",
            "deployment",
            "etcd-webhook",
            "--replicas=0",
        ]),
        "the Deployment's pods wait for the product's image",
    );
    println!(
        "node and install ready {:.1} s after the start",
        started.elapsed().as_secs_f64()
    );

    // The user's apply: nothing but a size and a storage size; the webhook fills in the rest.
    env.create_namespace(NS);
    let applied = Instant::now();
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"size": SIZE, "storageSize": "1Gi"},
    });
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply the EtcdCluster",
    );
    let status = wait_running(&env, Duration::from_secs(180));
    println!(
        "{NS}/{NAME}: Running with {SIZE} members {:.1} s after the apply (leader {})",
        applied.elapsed().as_secs_f64(),
        status["leader"]
    );
    let sts = env.get_json(&["-n", NS, "statefulset", NAME]);
    let args = sts["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--client-cert-auth=true") && args.contains("https://"),
        "the members run TLS by default: {args}"
    );

    // What only a node does: the data directory made by etcd running as 65532, on a volume
    // whose group the kubelet set (fsGroup).
    for pv in 0..SIZE {
        use std::os::unix::fs::MetadataExt;
        let volume = std::fs::metadata(node.volume_path(pv)).unwrap();
        assert_eq!(
            volume.gid(),
            65532,
            "the kubelet applied fsGroup to local-{pv}"
        );
        let data = node.volume_path(pv).join("data");
        let meta = std::fs::metadata(&data)
            .unwrap_or_else(|e| panic!("a member's data directory {}: {e}", data.display()));
        assert_eq!(
            (meta.uid(), meta.gid()),
            (65532, 65532),
            "{} is made by etcd running as the pod's user",
            data.display()
        );
    }

    let etcd = Members::new(&env);
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..50 {
        let (k, v) = (format!("/orders/before/{i:03}"), format!("v{i}"));
        etcd.put_any(&k, &v).expect("a write before any failure");
        acked.insert(k, v);
    }

    // Failover 1: the leader's pod deleted.
    let (leader_pod, leader_id) = etcd.leader();
    assert_eq!(
        status["leader"].as_str(),
        Some(leader_pod.as_str()),
        "status.leader names the member etcd calls leader"
    );
    let old_uid = env.get_json(&["-n", NS, "pod", &leader_pod])["metadata"]["uid"].clone();
    let deleted = Instant::now();
    ok(
        env.kubectl(&["-n", NS, "delete", "pod", &leader_pod, "--wait=false"]),
        "delete the leader's pod",
    );
    let (failures, new_leader) = write_until_new_leader(&etcd, &leader_id, "pod", &mut acked);
    println!(
        "leader pod {leader_pod} deleted: new leader {new_leader} after {:.1} s; {} writes acknowledged meanwhile, {failures} refused (retried elsewhere)",
        deleted.elapsed().as_secs_f64(),
        acked.len() - 50
    );
    wait_for(
        &format!("{leader_pod} back Ready as a new pod"),
        Duration::from_secs(120),
        || {
            let pod = env.get_json(&["-n", NS, "pod", &leader_pod]);
            (pod["metadata"]["uid"] != old_uid && ready(&pod)).then_some(())
        },
    );
    let etcd = Members::new(&env);
    let back = ordinal(&leader_pod);
    assert_eq!(
        etcd.status(back).expect("the returned member answers").0,
        leader_id,
        "{leader_pod} came back as the same member, on its own data"
    );
    etcd.assert_has_all(back, &acked);
    println!(
        "{leader_pod} back {:.1} s after the delete, with all {} acknowledged writes",
        deleted.elapsed().as_secs_f64(),
        acked.len()
    );

    // Failover 2: the leader's etcd container killed (SIGKILL); the kubelet restarts it.
    let (leader_pod, leader_id) = etcd.leader();
    let pod = env.get_json(&["-n", NS, "pod", &leader_pod]);
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .expect("a containerd container ID")
        .to_owned();
    let restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0);
    let killed = Instant::now();
    ok(
        crate::cluster::run(
            node.ctr(&["tasks", "kill", "-s", "SIGKILL", &container]),
            None,
        ),
        "kill the leader's etcd container",
    );
    let (_, new_leader) = write_until_new_leader(&etcd, &leader_id, "container", &mut acked);
    let pod = wait_for(
        &format!("{leader_pod}'s etcd restarted by the kubelet and Ready"),
        Duration::from_secs(120),
        || {
            let pod = env.get_json(&["-n", NS, "pod", &leader_pod]);
            let count = pod["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                .unwrap_or(0);
            (count > restarts && ready(&pod)).then_some(pod)
        },
    );
    let last = &pod["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(
        last["exitCode"].as_i64(),
        Some(137),
        "the kubelet reports the kill: {last}"
    );
    let etcd = Members::new(&env);
    let back = ordinal(&leader_pod);
    assert_eq!(etcd.status(back).expect("answers").0, leader_id);
    etcd.assert_has_all(back, &acked);
    println!(
        "{leader_pod}'s container killed: new leader {new_leader}, the container restarted and the member back with all {} writes {:.1} s after the kill",
        acked.len(),
        killed.elapsed().as_secs_f64()
    );
    for i in 0..SIZE {
        etcd.assert_has_all(i, &acked);
    }
    drop(env);
    drop(node);
}

fn ordinal(pod: &str) -> usize {
    pod.rsplit('-').next().unwrap().parse().unwrap()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Waits for Running with every member Ready and named in the status, and a leader.
fn wait_running(env: &Env, within: Duration) -> Value {
    wait_for(&format!("{NS}/{NAME} Running"), within, || {
        let ec = env.get_json(&["-n", NS, "etcdcluster", NAME]);
        let s = &ec["status"];
        (s["phase"] == "Running"
            && s["readyReplicas"].as_u64() == Some(SIZE as u64)
            && s["members"].as_array().map(Vec::len) == Some(SIZE)
            && s["leader"].is_string())
        .then(|| s.clone())
    })
}

/// Writes (one key a round, to any member that takes it) until a member other than
/// `old_leader` leads; returns the refused writes and the new leader's pod.
fn write_until_new_leader(
    etcd: &Members,
    old_leader: &str,
    what: &str,
    acked: &mut BTreeMap<String, String>,
) -> (usize, String) {
    let start = Instant::now();
    let mut failures = 0;
    let mut i = 0;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new leader within 60 s of the leader's {what} going"
        );
        let (k, v) = (format!("/orders/{what}/{i:04}"), format!("w{i}"));
        i += 1;
        match etcd.put_any(&k, &v) {
            Ok(()) => {
                acked.insert(k, v);
            }
            Err(_) => failures += 1,
        }
        if let Some((pod, id)) = etcd.try_leader()
            && id != old_leader
        {
            return (failures, pod);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The members through etcd's JSON gateway with the cluster's client certificate, each by its
/// DNS name (checked against the server certificate) at its pod's current address.
struct Members {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Members {
    fn new(env: &Env) -> Members {
        let secret = env.get_json(&["-n", NS, "secret", &format!("{NAME}-client-tls")]);
        let field = |k: &str| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(secret["data"][k].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let cert_pem = field("tls.crt");
        let issued = common::Issued {
            der: CertificateDer::from_pem_slice(cert_pem.as_bytes())
                .unwrap()
                .to_vec(),
            cert_pem,
            key_pem: field("tls.key"),
        };
        let config = common::client_config(&field("ca.crt"), Some(&issued));
        let mut builder = reqwest::Client::builder()
            .use_preconfigured_tls((*config).clone())
            .http1_only()
            .timeout(Duration::from_secs(3));
        let pods = env.get_json(&[
            "-n",
            NS,
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={NAME},app.kubernetes.io/component=member"),
        ]);
        for pod in pods["items"].as_array().unwrap() {
            let (Some(name), Some(ip)) = (
                pod["metadata"]["name"].as_str(),
                pod["status"]["podIP"].as_str(),
            ) else {
                continue;
            };
            let addr: SocketAddr = format!("{ip}:2379").parse().unwrap();
            builder = builder.resolve(&host(ordinal(name)), addr);
        }
        Members {
            rt: common::runtime(),
            client: builder.build().unwrap(),
        }
    }

    fn call(&self, member: usize, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("https://{}:2379/v3/{path}", host(member));
        self.rt.block_on(async {
            let resp = self
                .client
                .post(&url)
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let code = resp.status();
            let body: Value = resp.json().await.map_err(|e| format!("{url}: {e}"))?;
            if code.is_success() {
                Ok(body)
            } else {
                Err(format!("{url}: {code} {body}"))
            }
        })
    }

    /// (member ID, leader ID) as the member sees them.
    fn status(&self, member: usize) -> Result<(String, String), String> {
        let s = self.call(member, "maintenance/status", json!({}))?;
        let id = s["header"]["member_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let leader = s["leader"].as_str().unwrap_or_default().to_owned();
        Ok((id, leader))
    }

    /// The leader's pod and member ID, when some member answers and knows a leader.
    fn try_leader(&self) -> Option<(String, String)> {
        let ids: Vec<Option<(String, String)>> = (0..SIZE).map(|m| self.status(m).ok()).collect();
        let leader = ids.iter().flatten().map(|(_, l)| l).find(|l| *l != "0")?;
        let at = ids
            .iter()
            .position(|s| s.as_ref().is_some_and(|(id, _)| id == leader))?;
        Some((format!("{NAME}-{at}"), leader.clone()))
    }

    fn leader(&self) -> (String, String) {
        wait_for("a leader", Duration::from_secs(30), || self.try_leader())
    }

    fn put_any(&self, key: &str, value: &str) -> Result<(), String> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let body = json!({"key": b64(key), "value": b64(value)});
        let mut last = String::new();
        for m in 0..SIZE {
            match self.call(m, "kv/put", body.clone()) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Every acknowledged key, read from `member` alone (serializable: its own data).
    fn assert_has_all(&self, member: usize, acked: &BTreeMap<String, String>) {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // The member may still be catching up right after it came back.
        let last = acked.keys().next_back().unwrap();
        wait_for(
            &format!("{NAME}-{member} to have applied the last write"),
            Duration::from_secs(30),
            || {
                self.call(
                    member,
                    "kv/range",
                    json!({"key": b64(last), "serializable": true}),
                )
                .ok()
                .filter(|r| r["kvs"].as_array().is_some_and(|k| !k.is_empty()))
            },
        );
        let all = self
            .call(
                member,
                "kv/range",
                json!({"key": b64("/orders/"), "range_end": b64("/orders0"), "serializable": true}),
            )
            .expect("a range read");
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
        let lost: Vec<&String> = acked
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            lost.is_empty(),
            "{NAME}-{member} lost {} acknowledged writes: {lost:?}",
            lost.len()
        );
    }
}

fn host(member: usize) -> String {
    format!("{NAME}-{member}.{NAME}.{NS}.svc")
}
