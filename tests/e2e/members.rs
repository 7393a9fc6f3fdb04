//! The membership through the real apiserver: the reconcile loop (`controller::run_with_etcd`,
//! in-process against this control plane) drives a StatefulSet, the real StatefulSet and
//! PVC-protection controllers make its pods and claims, and the pods run as real etcd 3.6.4
//! members (tests/common/members.rs). This control plane has no kubelet, so the scenario plays
//! it: it runs each pod's etcd container as the pod spec says (env from the ConfigMap as it is
//! when the container starts, the claim's own folder as the volume), restarts a container that
//! exits, and reports the pod's status (Ready by the rendered readiness probe, restart counts,
//! the last termination message as `FallbackToLogsOnError` writes it). The loop reaches the
//! members from a network namespace on their bridge (what the pod network gives a controller
//! pod): its production HTTP client runs there, and the members' Service names are resolved
//! to their addresses (what cluster DNS does).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_webhook::controller::etcd::{EtcdError, Gateway, Transport};
use etcd_webhook::controller::{Settings, run_with_etcd};
use etcd_webhook::metrics::Metrics;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cluster::{ControlPlane, wait_for};
use crate::common;
use crate::common::members::{
    Backoff, Exit, Net, Probes, RUN_AS, Release, run, writer, writer_any,
};
use crate::install::ok;

pub const NS: &str = "members";
pub const NAME: &str = "real";
/// `--member-join-timeout` of this loop.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The loop's etcd calls, made by the production [`Gateway`] on a thread inside the
/// controller's network namespace; `NAME-i.NAME.NS.svc` is resolved to member i's address.
/// One call: endpoint, path, body, where the answer goes.
type Call = (
    String,
    String,
    Value,
    tokio::sync::oneshot::Sender<Result<Value, EtcdError>>,
);

struct InNamespace {
    calls: tokio::sync::mpsc::UnboundedSender<Call>,
}

impl InNamespace {
    fn start(netns: &str, hosts: BTreeMap<String, String>) -> InNamespace {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Call>();
        let path = std::path::Path::new("/var/run/netns").join(netns);
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(path).unwrap();
            // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let gateway = Arc::new(Gateway::default());
                while let Some((endpoint, path, body, reply)) = rx.recv().await {
                    let url = hosts
                        .iter()
                        .fold(endpoint, |url, (name, addr)| url.replace(name, addr));
                    let gateway = gateway.clone();
                    tokio::spawn(async move {
                        let _ = reply.send(gateway.post(&url, &path, body).await);
                    });
                }
            });
        });
        InNamespace { calls: tx }
    }
}

impl Transport for InNamespace {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self
            .calls
            .send((endpoint.to_owned(), path.to_owned(), body, tx));
        Box::pin(async move {
            sent.map_err(|_| EtcdError::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: "the namespace thread is gone".to_owned(),
            })?;
            rx.await.map_err(|_| EtcdError::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: "no reply".to_owned(),
            })?
        })
    }

    fn with_identity(
        &self,
        _identity: &etcd_webhook::controller::etcd::ClientTls,
    ) -> Result<Arc<dyn Transport>, etcd_webhook::controller::etcd::TlsError> {
        // The e2e clusters are plain; TLS members run in tests/members.rs.
        Err(etcd_webhook::controller::etcd::TlsError(
            "the e2e members run plain HTTP".to_owned(),
        ))
    }
}

/// Stops the played kubelet and the loop when the scenario ends, passed or failed, so that the
/// last reference to the [`Net`] goes and its processes and namespaces are removed.
struct Stopper {
    kubelet: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    controller: CancellationToken,
}

impl Drop for Stopper {
    fn drop(&mut self) {
        self.kubelet.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.controller.cancel();
    }
}

/// What the played kubelet knows of one pod.
struct Tracked {
    uid: String,
    restarts: i32,
    /// How the container last ended (`lastState.terminated`).
    last: Option<Exit>,
    /// When the container's current run started (`state.running.startedAt`), and when the
    /// run that ended last had (`lastState.terminated.startedAt`).
    started: Option<k8s_openapi::jiff::Timestamp>,
    last_started: Option<k8s_openapi::jiff::Timestamp>,
    backoff: Backoff,
    probes: Probes,
    reported: Value,
}

/// The played kubelet's back-off runs ten times faster than a real one (1 s doubling to 30 s),
/// with the kubelet's rules.
const BACKOFF_SCALE: u32 = 10;

/// One sweep of the played kubelet over the cluster's pods.
async fn kubelet_sweep(
    client: &Client,
    net: &Mutex<Net>,
    tracked: &mut BTreeMap<usize, Tracked>,
    claims_dir: &std::path::Path,
    blocked: &Mutex<std::collections::BTreeSet<usize>>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let Ok(list) = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
        .await
    else {
        return;
    };
    let mut seen = Vec::new();
    for pod in list.items {
        let name = pod.name_any();
        let Some(i) = name
            .strip_prefix(&format!("{NAME}-"))
            .and_then(|o| o.parse::<usize>().ok())
        else {
            continue;
        };
        seen.push(i);
        let uid = pod.uid().unwrap_or_default();
        // What a starting container would get: the ConfigMap as it is now, and its claim.
        let config = configs
            .get_opt(&format!("{NAME}-members"))
            .await
            .ok()
            .flatten();
        let claim = claims
            .get_opt(&format!("data-{name}"))
            .await
            .ok()
            .flatten()
            .filter(|c| c.metadata.deletion_timestamp.is_none());
        let played = {
            let mut net = net.lock().unwrap();
            if tracked.get(&i).is_none_or(|t| t.uid != uid) {
                net.stop(i);
                let _ = net.exited(i);
                tracked.insert(
                    i,
                    Tracked {
                        uid: uid.clone(),
                        restarts: 0,
                        last: None,
                        started: None,
                        last_started: None,
                        backoff: Backoff::new(BACKOFF_SCALE),
                        probes: Probes::new(BACKOFF_SCALE),
                        reported: Value::Null,
                    },
                );
            }
            let t = tracked.get_mut(&i).unwrap();
            // A blocked pod's node is gone: its container stops and nothing starts it; the pod
            // shows not ready (what the node lifecycle controller reports for an unreachable
            // node's pods).
            if blocked.lock().unwrap().contains(&i) {
                net.stop(i);
                let _ = net.exited(i);
                let container = pod.spec.as_ref().unwrap().containers[0].clone();
                Some((false, false, false, container))
            } else if pod.metadata.deletion_timestamp.is_some() {
                net.stop(i);
                None
            } else {
                let container = pod.spec.as_ref().unwrap().containers[0].clone();
                // An exited container is restarted after the kubelet's back-off.
                if let Some(exit) = net.exited(i) {
                    t.backoff.exited();
                    t.last = Some(exit);
                    t.last_started = t.started.take();
                }
                if !net.running(i) && t.backoff.may_start() {
                    // The container starts once its ConfigMap and its claim are there (the kubelet
                    // waits for them too).
                    if let (Some(config), Some(claim)) = (config, claim) {
                        let folder = claims_dir.join(claim.uid().unwrap_or_default());
                        if !folder.exists() {
                            std::fs::create_dir_all(&folder).unwrap();
                            run(Command::new("chown")
                                .arg(format!("{RUN_AS}:{RUN_AS}"))
                                .arg(&folder));
                        }
                        net.pods[i].data = folder;
                        net.config = config.data.unwrap_or_default();
                        net.start(i, &container);
                        // A restart when the container ran before: after an exit, or after
                        // its node went with it running (a run that began and never ended,
                        // as the kubelet counts it once the node is back).
                        if t.last.is_some() || t.started.is_some() {
                            t.restarts += 1;
                        }
                        t.started = Some(k8s_openapi::jiff::Timestamp::now());
                        t.backoff.started();
                        t.probes.started();
                    }
                }
                // Readiness and liveness as the kubelet's probe workers time them; a failed
                // liveness kills the container (the next sweep sees the exit).
                let grace = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                let ready = t.probes.look(&mut net, i, &container, grace);
                let running = net.running(i);
                Some((running, ready, t.backoff.backing_off(), container))
            }
        };
        let Some((running, ready, backing_off, container)) = played else {
            continue;
        };
        let t = tracked.get_mut(&i).unwrap();
        let flag = |b: bool| if b { "True" } else { "False" };
        // The kubelet's lastState: the exit code as the process gave it, reason Completed
        // for 0 and Error otherwise, and (FallbackToLogsOnError) the log's tail only after an
        // error exit.
        let last = t.last.as_ref().map_or(json!({}), |e| {
            let mut ended = json!({
                "exitCode": e.code,
                "reason": if e.code == 0 { "Completed" } else { "Error" },
                "startedAt": t.last_started.map(|at| at.to_string()),
                "finishedAt": e.at.map(|at| at.to_string()),
            });
            if !e.message.is_empty() {
                ended["message"] = json!(e.message);
            }
            json!({"terminated": ended})
        });
        let state = if running {
            json!({"running": {"startedAt": t.started.map(|at| at.to_string())}})
        } else if backing_off {
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container etcd"}})
        } else {
            json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let status = json!({"status": {
            "phase": if running { "Running" } else { "Pending" },
            "conditions": [
                {"type": "Ready", "status": flag(ready)},
                {"type": "ContainersReady", "status": flag(ready)},
            ],
            "containerStatuses": [{
                "name": "etcd", "image": container.image, "imageID": "",
                "ready": ready, "started": running, "restartCount": t.restarts,
                "state": state, "lastState": last,
            }],
        }});
        if status != t.reported
            && pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .is_ok()
        {
            t.reported = status;
        }
    }
    // Pods gone from the API: their containers stop.
    let gone: Vec<usize> = tracked
        .keys()
        .copied()
        .filter(|i| !seen.contains(i))
        .collect();
    for i in gone {
        net.lock().unwrap().stop(i);
        tracked.remove(&i);
    }
}

/// The namespace's Events counted by `key` (those it gives a key for): how many times each (the
/// series count of a folded repeat, else 1).
pub fn count_events(
    cp: &ControlPlane,
    key: impl Fn(&Value) -> Option<String>,
) -> BTreeMap<String, i64> {
    let out = ok(
        cp.kubectl_output(
            &["-n", NS, "get", "events.events.k8s.io", "-o", "json"],
            None,
        ),
        "events",
    );
    let mut counts = BTreeMap::new();
    for e in serde_json::from_str::<Value>(&out).unwrap()["items"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(k) = key(e) {
            *counts.entry(k).or_insert(0) += e["series"]["count"].as_i64().unwrap_or(1);
        }
    }
    counts
}

/// The Events whose related object is pod `pod`: reason -> how many times.
fn member_events(cp: &ControlPlane, pod: &str) -> BTreeMap<String, i64> {
    count_events(cp, |e| {
        (e["related"]["name"] == pod).then(|| e["reason"].as_str().unwrap_or_default().to_owned())
    })
}

/// The reasons of the Events in the namespace.
pub fn reasons(cp: &ControlPlane) -> Vec<String> {
    let events = ok(
        cp.kubectl_output(
            &["-n", NS, "get", "events.events.k8s.io", "-o", "json"],
            None,
        ),
        "events",
    );
    serde_json::from_str::<Value>(&events).unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Waits until an Event with `reason` is in the namespace.
fn wait_event(cp: &ControlPlane, reason: &str, within: Duration) {
    wait_for(&format!("an Event {reason}"), within, || {
        std::thread::sleep(Duration::from_millis(500));
        reasons(cp).iter().any(|r| r == reason).then_some(())
    });
}

/// A merge patch of the cluster's spec, as `kubectl patch` sends it.
pub fn patch_spec(cp: &ControlPlane, spec: Value, what: &str) {
    let patch = json!({ "spec": spec }).to_string();
    ok(
        cp.kubectl_output(
            &[
                "-n",
                NS,
                "patch",
                "etcdclusters.v1.etcd.example.com",
                NAME,
                "--type=merge",
                "-p",
                &patch,
            ],
            None,
        ),
        what,
    );
}

fn patch_size(cp: &ControlPlane, size: i32) {
    patch_spec(cp, json!({ "size": size }), "change the size");
}

pub fn cluster_json(cp: &ControlPlane) -> Value {
    let out = ok(
        cp.kubectl_output(
            &[
                "-n",
                NS,
                "get",
                "etcdclusters.v1.etcd.example.com",
                NAME,
                "-o",
                "json",
            ],
            None,
        ),
        "get the EtcdCluster",
    );
    serde_json::from_str(&out).unwrap()
}

/// Waits until the status says Running with `size` healthy voters, every member voting.
pub fn wait_running(cp: &ControlPlane, size: i64, within: Duration) -> Value {
    wait_for(&format!("Running with {size} voters"), within, || {
        std::thread::sleep(Duration::from_millis(500));
        let ec = cluster_json(cp);
        is_running(&ec, size).then_some(ec)
    })
}

/// Whether the cluster's status says Running with `size` healthy voters, every member voting.
pub fn is_running(ec: &Value, size: i64) -> bool {
    let status = &ec["status"];
    let voting = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Members" && c["reason"] == "AllVoting");
    status["phase"] == "Running" && status["readyReplicas"] == size && voting
}

/// Creates the scenario's EtcdCluster (v1, `size` members of `version`) and waits until it is
/// Running with every member voting.
pub fn create_cluster(cp: &ControlPlane, size: i64, version: &str, within: Duration) {
    let ec = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"size": size, "version": version, "storageClass": "standard", "storageSize": "1Gi"},
    });
    ok(
        cp.kubectl_output(&["create", "-f", "-"], Some(&ec.to_string())),
        "create the EtcdCluster",
    );
    let t = Instant::now();
    wait_running(cp, size, within);
    eprintln!(
        "    {size} member(s) Running in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// The loop, the played kubelet and the members of one scenario: the CRD applied (no webhook
/// here: the objects are written in v1, the storage version), the namespace made, the loop
/// running in-process against the control plane with its etcd calls made from the members'
/// network, and the kubelet sweeping the pods every 250 ms.
pub struct Played {
    pub net: Arc<Mutex<Net>>,
    pub rt: tokio::runtime::Runtime,
    pub kube: Client,
    /// Pods whose node is gone (the played kubelet stops their container and starts nothing).
    pub blocked: Arc<Mutex<std::collections::BTreeSet<usize>>>,
    /// Where the played node keeps each claim's volume: a folder named after the claim's UID.
    pub claims_dir: PathBuf,
    controller: Option<tokio::task::JoinHandle<()>>,
    stopper: Option<Stopper>,
}

impl Played {
    /// Up to `pods` members of `release`, the loop with `settings` (its namespace is set here).
    pub fn start(cp: &ControlPlane, pods: usize, release: Release, settings: Settings) -> Played {
        common::install_crypto();
        let crd_path = common::root().join("config/crd/bases/etcd.example.com_etcdclusters.yaml");
        let mut crd: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(crd_path).unwrap()).unwrap();
        crd["spec"]["conversion"] = json!({"strategy": "None"});
        ok(
            cp.kubectl_output(&["apply", "-f", "-"], Some(&crd.to_string())),
            "apply the CRD",
        );
        ok(
            cp.kubectl_output(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd/etcdclusters.etcd.example.com",
                ],
                None,
            ),
            "the CRD is established",
        );
        ok(
            cp.kubectl_output(&["create", "namespace", NS], None),
            "create the namespace",
        );

        let names: Vec<String> = (0..pods).map(|i| format!("{NAME}-{i}")).collect();
        let net = Net::new(NS, NAME, &names, release);
        let hosts: BTreeMap<String, String> = net
            .pods
            .iter()
            .map(|p| (format!("{}.{NAME}.{NS}.svc", p.name), p.addr.clone()))
            .collect();
        let transport = InNamespace::start(&net.controller_ns, hosts);
        let claims_dir: PathBuf = net.tmp.path().join("claims");
        let net = Arc::new(Mutex::new(net));

        let rt = common::runtime();
        let kube = rt.block_on(cp.client());
        let stop = CancellationToken::new();
        let settings = Settings {
            namespace: Some(NS.to_owned()),
            ..settings
        };
        let controller = rt.spawn(run_with_etcd(
            kube.clone(),
            settings,
            Arc::new(Metrics::new()),
            stop.clone(),
            Box::new(transport),
        ));
        let kubelet_stop = Arc::new(AtomicBool::new(false));
        let blocked: Arc<Mutex<std::collections::BTreeSet<usize>>> = Arc::default();
        let thread = {
            let (net, kube, stop, dir, blocked) = (
                net.clone(),
                kube.clone(),
                kubelet_stop.clone(),
                claims_dir.clone(),
                blocked.clone(),
            );
            let handle = rt.handle().clone();
            std::thread::spawn(move || {
                let mut tracked = BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    handle.block_on(kubelet_sweep(&kube, &net, &mut tracked, &dir, &blocked));
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        };
        Played {
            net,
            rt,
            kube,
            blocked,
            claims_dir,
            controller: Some(controller),
            stopper: Some(Stopper {
                kubelet: kubelet_stop,
                thread: Some(thread),
                controller: stop,
            }),
        }
    }

    /// Stops the kubelet and the loop, then removes the namespace.
    pub fn finish(mut self, cp: &ControlPlane) {
        drop(self.stopper.take());
        if let Some(c) = self.controller.take() {
            let _ = self.rt.block_on(c);
        }
        ok(
            cp.kubectl_output(&["delete", "namespace", NS, "--wait=false"], None),
            "clean up",
        );
    }
}

impl Played {
    /// The pod the Job controller made for Job `job` (waited for, at most `within`), run as
    /// the played node runs a Job's pod: its init containers one after another, then its
    /// container, each a process in the controller's network namespace (the pod network), with
    /// a claim volume at the claim's own folder and an emptyDir at a folder of its own, the
    /// members' Service names resolved to their addresses (cluster DNS), `/dev/termination-log`
    /// read back as the termination message; then the pod's status as the kubelet reports it
    /// (Succeeded, or Failed at the first step that failed), from which the Job controller
    /// completes the Job. Whether every step ended 0, and the last step's message.
    pub fn play_job(&self, job: &str, within: Duration) -> (bool, String) {
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), NS);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.kube.clone(), NS);
        let selector = format!("batch.kubernetes.io/job-name={job}");
        let start = Instant::now();
        let pod = loop {
            if let Some(p) = self
                .rt
                .block_on(pods.list(&ListParams::default().labels(&selector)))
                .ok()
                .and_then(|l| l.items.into_iter().next())
            {
                break p;
            }
            assert!(
                start.elapsed() < within,
                "timed out after {within:?} waiting for the pod of Job {job}; the namespace then:\n{}",
                self.namespace_now()
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        let name = pod.name_any();
        let spec = pod.spec.clone().unwrap();
        let (scratch, ns, hosts) = {
            let net = self.net.lock().unwrap();
            let mut hosts: Vec<(String, String)> = net
                .pods
                .iter()
                .map(|p| (format!("{}.{NAME}.{NS}.svc", p.name), p.addr.clone()))
                .collect();
            hosts.push((format!("{NAME}-client.{NS}.svc"), net.pods[0].addr.clone()));
            (
                net.tmp.path().join(format!("pod-{name}")),
                net.controller_ns.clone(),
                hosts,
            )
        };
        let mut folders: BTreeMap<String, PathBuf> = BTreeMap::new();
        for v in spec.volumes.iter().flatten() {
            let folder = if let Some(claim) = &v.persistent_volume_claim {
                let claim = self
                    .rt
                    .block_on(claims.get(&claim.claim_name))
                    .expect("the pod's claim");
                self.claims_dir.join(claim.uid().unwrap_or_default())
            } else if v.empty_dir.is_some() {
                scratch.join(&v.name)
            } else {
                panic!("the played node has no volume {} of {name}", v.name)
            };
            std::fs::create_dir_all(&folder).unwrap();
            folders.insert(v.name.clone(), folder);
        }
        let mut statuses: [Vec<Value>; 2] = Default::default();
        let (mut passed, mut said) = (true, String::new());
        let steps = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (0, c))
            .chain(spec.containers.iter().map(|c| (1, c)));
        for (kind, c) in steps {
            let mut c = c.clone();
            for a in c.args.iter_mut().flatten() {
                for (host, addr) in &hosts {
                    *a = a.replace(host, addr);
                }
            }
            let mounts: Vec<(&str, &std::path::Path)> = c
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| (m.mount_path.as_str(), folders[&m.name].as_path()))
                .collect();
            let report = scratch.join(format!("{}-termination-log", c.name));
            let (code, message, out) =
                common::members::run_job_container(&ns, &c, &mounts, &report, &[]);
            // The volumes as fsGroup leaves them: the members' user owns what a step wrote.
            for folder in folders.values() {
                run(Command::new("chown")
                    .arg("-R")
                    .arg(format!("{RUN_AS}:{RUN_AS}"))
                    .arg(folder));
            }
            let message = if code != 0 && message.is_empty() {
                out.chars()
                    .rev()
                    .take(2000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect()
            } else {
                message
            };
            // What the container saw: its mount paths, not the node's folders.
            let message = mounts.iter().fold(message, |m, (at, folder)| {
                m.replace(&folder.display().to_string(), at)
            });
            statuses[kind].push(json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": message, "startedAt": "2026-12-06T00:00:00Z",
                    "finishedAt": k8s_openapi::jiff::Timestamp::now().to_string()}},
            }));
            said = format!("{}: {message}", c.name);
            if code != 0 {
                passed = false;
                break;
            }
        }
        let status = json!({"status": {
            "phase": if passed { "Succeeded" } else { "Failed" },
            "initContainerStatuses": statuses[0],
            "containerStatuses": statuses[1],
        }});
        self.rt
            .block_on(pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)))
            .expect("the played node's status of a Job's pod");
        (passed, said)
    }
}

impl Played {
    /// What a stuck scenario needs read: the cluster's conditions and annotations, its Jobs,
    /// pods and claims, and the namespace's last Events.
    pub fn namespace_now(&self) -> String {
        let list = |what: &str| -> Vec<Value> {
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                self.kube.clone(),
                NS,
                &kube::discovery::ApiResource::from_gvk(&match what {
                    "jobs" => kube::api::GroupVersionKind::gvk("batch", "v1", "Job"),
                    "pods" => kube::api::GroupVersionKind::gvk("", "v1", "Pod"),
                    "claims" => kube::api::GroupVersionKind::gvk("", "v1", "PersistentVolumeClaim"),
                    "events" => kube::api::GroupVersionKind::gvk("", "v1", "Event"),
                    _ => kube::api::GroupVersionKind::gvk("etcd.example.com", "v1", "EtcdCluster"),
                }),
            );
            self.rt
                .block_on(api.list(&ListParams::default()))
                .map(|l| {
                    l.items
                        .into_iter()
                        .map(|o| serde_json::to_value(o).unwrap())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for ec in list("clusters") {
            out.push(format!(
                "EtcdCluster {}: annotations {}; conditions {}",
                ec["metadata"]["name"], ec["metadata"]["annotations"], ec["status"]["conditions"]
            ));
        }
        // Each object's name, UID, owner, deletion and what says its state.
        for (kinds, kind, state) in [
            ("jobs", "Job", "/status/conditions"),
            ("pods", "pod", "/status/phase"),
            ("claims", "claim", "/metadata/finalizers"),
        ] {
            for o in list(kinds) {
                let m = &o["metadata"];
                out.push(format!(
                    "{kind} {} (uid {}, owner {}, deleting {}): {}",
                    m["name"],
                    m["uid"],
                    m["ownerReferences"][0]["uid"],
                    m["deletionTimestamp"],
                    o.pointer(state).unwrap_or(&Value::Null)
                ));
            }
        }
        let mut events = list("events");
        events.sort_by_key(|e| {
            e["lastTimestamp"]
                .as_str()
                .or(e["eventTime"].as_str())
                .unwrap_or_default()
                .to_owned()
        });
        for e in events.iter().rev().take(20).rev() {
            out.push(format!(
                "Event {} {} {}: {}",
                e["lastTimestamp"], e["type"], e["reason"], e["message"]
            ));
        }
        out.join("\n")
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        // A failed scenario: the kubelet and the loop stop before the members go.
        drop(self.stopper.take());
    }
}

pub fn membership_through_the_apiserver(cp: ControlPlane) {
    let played = Played::start(
        &cp,
        5,
        Release::V3_6_4,
        Settings {
            member_timeouts: etcd_webhook::controller::decide::membership::Timeouts {
                join: JOIN_TIMEOUT,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let (net, rt, kube, blocked) = (
        played.net.clone(),
        &played.rt,
        played.kube.clone(),
        played.blocked.clone(),
    );

    create_cluster(&cp, 1, "v3.5.36", Duration::from_secs(90));
    let sts: Api<StatefulSet> = Api::namespaced(kube.clone(), NS);
    let revision = |rt: &tokio::runtime::Runtime| {
        let s = rt.block_on(sts.get(NAME)).unwrap();
        let st = s.status.unwrap();
        (st.current_revision, st.update_revision)
    };
    let before = revision(rt);
    let pods: Api<Pod> = Api::namespaced(kube.clone(), NS);
    let first_uid = rt.block_on(pods.get(&format!("{NAME}-0"))).unwrap().uid();

    // 1 -> 3 with a write every 20 ms through member 0.
    let (ns0, addr0) = {
        let n = net.lock().unwrap();
        (n.pods[0].ns.clone(), n.pods[0].addr.clone())
    };
    let writing = Arc::new(AtomicBool::new(true));
    let scale_writes = writer(ns0.clone(), addr0.clone(), writing.clone());
    std::thread::sleep(Duration::from_millis(500));
    patch_size(&cp, 3);
    let t = Instant::now();
    let running = wait_running(&cp, 3, Duration::from_secs(120));
    let grow_secs = t.elapsed().as_secs_f64();
    // Every member in the status as etcd reports it, the leader named, written through the
    // real apiserver (the schema took them), and within its quota.
    let status = &running["status"];
    let members = status["members"].as_array().expect("status.members");
    assert_eq!(members.len(), 3, "{status}");
    assert!(
        members
            .iter()
            .all(|m| m["healthy"] == true && m["dbSize"].as_i64().is_some()),
        "{status}"
    );
    let leader: Vec<&Value> = members.iter().filter(|m| m["role"] == "Leader").collect();
    assert_eq!(leader.len(), 1, "{status}");
    assert_eq!(status["leader"], leader[0]["name"], "{status}");
    assert!(
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Degraded" && c["reason"] == "WithinQuota"),
        "{status}"
    );
    writing.store(false, Ordering::Relaxed);
    let (keys, failed) = scale_writes.join().unwrap();
    assert_eq!(failed, 0, "writes failed during the scale-up");
    assert!(keys.len() > 20, "the writer wrote ({})", keys.len());
    assert_eq!(revision(rt), before, "the pod template changed");
    let first = rt.block_on(pods.get(&format!("{NAME}-0"))).unwrap();
    assert_eq!(first.uid(), first_uid, "member 0 was replaced");
    let restarts = first.status.unwrap().container_statuses.unwrap()[0].restart_count;
    assert_eq!(restarts, 0, "member 0 restarted");
    {
        let n = net.lock().unwrap();
        assert_eq!(n.pods[0].starts, 1, "member 0's process started once");
        for key in keys.iter().step_by(7) {
            for i in 0..3 {
                assert_eq!(
                    n.get(i, key).as_deref(),
                    Some(key.trim_start_matches("/w/")),
                    "{key} through member {i}"
                );
            }
        }
    }
    let seen = reasons(&cp);
    for reason in ["AddedLearner", "PromotedMember"] {
        assert!(seen.iter().any(|r| r == reason), "{reason} in {seen:?}");
    }
    eprintln!(
        "    1 -> 3 through the apiserver in {grow_secs:.1} s: {} writes, 0 failed, member 0 never restarted, template revision unchanged",
        keys.len()
    );

    // (A member's lost volume runs on real pods: case_study.rs, `lost_one_volume`.)
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(kube.clone(), NS);
    // Voters, and only they, carry the label the budget selects (and the client Service, before
    // v3.5.11).
    let voters = rt
        .block_on(pods.list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={NAME},etcd.example.com/voter=true"
        ))))
        .unwrap();
    assert_eq!(voters.items.len(), 3, "every voter labelled");

    // 3 -> 5 while member 4's node is gone: member 3 joins; member 4 is added, never starts,
    // is removed after the join timeout (Warning), added again; once its pod can run, it joins.
    blocked.lock().unwrap().insert(4);
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer(ns0.clone(), addr0.clone(), writing.clone());
    patch_size(&cp, 5);
    let t = Instant::now();
    wait_event(&cp, "MemberNeverStarted", Duration::from_secs(90));
    let removed_after = t.elapsed().as_secs_f64();
    let list = net.lock().unwrap().members(0);
    assert!(
        list.iter().filter(|(name, _)| name.is_empty()).count() <= 1,
        "one unstarted member at most: {list:?}"
    );
    blocked.lock().unwrap().clear();
    wait_running(&cp, 5, Duration::from_secs(120));
    writing.store(false, Ordering::Relaxed);
    let (more, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "writes failed while member 4 could not start");
    assert_eq!(revision(rt), before, "the pod template changed");
    eprintln!(
        "    3 -> 5 with member 4's pod unable to start: removed {removed_after:.1} s after the change (join timeout {JOIN_TIMEOUT:?}), joined once it could run; {} writes, 0 failed",
        more.len()
    );

    // Two of five down: the other three keep the quorum; no membership call is made.
    let membership_events = |cp: &ControlPlane| {
        reasons(cp)
            .iter()
            .filter(|r| r.contains("Learner") || r.contains("Member"))
            .count()
    };
    let calls_before = membership_events(&cp);
    blocked.lock().unwrap().extend([3, 4]);
    std::thread::sleep(Duration::from_secs(3));
    {
        let n = net.lock().unwrap();
        for k in 0..20 {
            assert!(
                n.put(0, &format!("/down/{k}"), "x"),
                "write {k} with two down"
            );
        }
    }
    let unhealthy = wait_for(
        "the status names the two down",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let ec = cluster_json(&cp);
            ec["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Members" && c["reason"] == "Unhealthy")
                .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
                .filter(|m| m.starts_with("5 voters (3 healthy)"))
        },
    );
    assert!(unhealthy.starts_with("5 voters (3 healthy)"), "{unhealthy}");
    std::thread::sleep(JOIN_TIMEOUT * 2);
    assert_eq!(
        membership_events(&cp),
        calls_before,
        "a membership call with two down"
    );
    // A drain of a running voter is refused: the budget keeps a quorum of the 5 voters.
    let pdb = wait_for(
        "the disruption controller counts 3 healthy voters",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let out = cp.kubectl_output(&["-n", NS, "get", "pdb", NAME, "-o", "json"], None);
            let pdb: Value = serde_json::from_slice(&out.stdout).ok()?;
            (pdb["status"]["currentHealthy"] == 3).then_some(pdb)
        },
    );
    assert_eq!(pdb["spec"]["minAvailable"], 3, "{}", pdb["spec"]);
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{}", pdb["status"]);
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": format!("{NAME}-1"), "namespace": NS}});
    let out = cp.kubectl_output(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{NS}/pods/{NAME}-1/eviction"),
            "-f",
            "-",
        ],
        Some(&eviction.to_string()),
    );
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && refusal.contains("disruption budget"),
        "the eviction of a voter with two of five down: {refusal}"
    );
    blocked.lock().unwrap().clear();
    wait_running(&cp, 5, Duration::from_secs(90));
    eprintln!(
        "    two of five down: writes went on, status said {unhealthy:?}, no membership call, a drain of a running voter refused by the budget (minAvailable 3); both back"
    );

    // `etcdctl member remove` of member 2 by hand, its volume left as it is: etcd stops it with
    // exit 0 (no termination message); the loop replaces the volume and adds it back once.
    let before = member_events(&cp, &format!("{NAME}-2"));
    let old_claim = rt
        .block_on(claims.get(&format!("data-{NAME}-2")))
        .unwrap()
        .uid();
    let removed = {
        let n = net.lock().unwrap();
        let list = n
            .v3(0, "cluster/member/list", json!({"linearizable": true}))
            .unwrap();
        let id = list["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == format!("{NAME}-2"))
            .and_then(|m| m["ID"].as_str().map(str::to_owned))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while n
            .v3(0, "cluster/member/remove", json!({"ID": id}))
            .is_none()
        {
            assert!(Instant::now() < deadline, "the removal by hand");
            std::thread::sleep(Duration::from_millis(500));
        }
        id
    };
    let t = Instant::now();
    // What the loop could see of member 2 in the seconds after the removal (printed: how the
    // pod's last state and the member list move).
    let mut trace: Vec<String> = Vec::new();
    for _ in 0..30 {
        let pod = rt.block_on(pods.get(&format!("{NAME}-2"))).ok();
        let seen = pod
            .and_then(|p| p.status?.container_statuses?.into_iter().next())
            .map(|c| {
                let last = c.last_state.and_then(|s| s.terminated);
                format!(
                    "restarts {} last exit {:?} at {:?}",
                    c.restart_count,
                    last.as_ref().map(|t| t.exit_code),
                    last.and_then(|t| t.finished_at).map(|f| f.0.to_string())
                )
            })
            .unwrap_or_default();
        let list = net.lock().unwrap().v3(0, "cluster/member/list", json!({}));
        let two = list
            .and_then(|l| {
                l["members"]
                    .as_array()?
                    .iter()
                    .find(|m| {
                        m["peerURLs"][0]
                            .as_str()
                            .is_some_and(|u| u.contains(&format!("{NAME}-2.")))
                    })
                    .map(|m| format!("member 2: name {:?} learner {}", m["name"], m["isLearner"]))
            })
            .unwrap_or_else(|| "member 2: not listed".to_owned());
        let line = format!("{seen}; {two}");
        if trace
            .last()
            .map(|l| l.split_once(" @ ").map_or("", |x| x.1))
            != Some(line.as_str())
        {
            trace.push(format!("{:.1}s @ {line}", t.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!(
        "    after the removal by hand:\n      {}",
        trace.join("\n      ")
    );
    // Member 2 comes back on a fresh volume: its volume replaced before the add (the loop saw
    // the removed member answer as its old ID, or its clean exit), removed again as stale, or,
    // failing both, removed through the join timeout with its volume replaced; never a cycle.
    wait_for("member 2's claim replaced", Duration::from_secs(90), || {
        std::thread::sleep(Duration::from_millis(500));
        let uid = rt
            .block_on(claims.get_opt(&format!("data-{NAME}-2")))
            .ok()
            .flatten()?
            .uid();
        (uid != old_claim).then_some(())
    });
    wait_for(
        "member 2 back as a voter under a new ID",
        Duration::from_secs(120),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let n = net.lock().unwrap();
            let list = n.v3(0, "cluster/member/list", json!({"linearizable": true}))?;
            list["members"]
                .as_array()?
                .iter()
                .any(|m| {
                    m["name"] == format!("{NAME}-2")
                        && m["ID"] != removed.as_str()
                        && m["isLearner"] != true
                })
                .then_some(())
        },
    );
    wait_running(&cp, 5, Duration::from_secs(120));
    let back = t.elapsed().as_secs_f64();
    assert_ne!(
        rt.block_on(claims.get(&format!("data-{NAME}-2")))
            .unwrap()
            .uid(),
        old_claim,
        "a new claim for member 2"
    );
    {
        let n = net.lock().unwrap();
        let list = n
            .v3(0, "cluster/member/list", json!({"linearizable": true}))
            .unwrap();
        let members = list["members"].as_array().unwrap();
        assert_eq!(members.len(), 5, "{list}");
        assert!(
            members.iter().all(|m| m["ID"] != removed.as_str()),
            "{list}"
        );
    }
    let after = member_events(&cp, &format!("{NAME}-2"));
    let how: Vec<&String> = after
        .iter()
        .filter(|(reason, n)| before.get(*reason).is_none_or(|b| b < *n))
        .map(|(reason, _)| reason)
        .collect();
    // Never a cycle: each way of taking the old volume out happened at most once, and the
    // member was added back at most twice (once, or once more after a stale removal).
    let delta = |reason: &str| {
        after.get(reason).copied().unwrap_or(0) - before.get(reason).copied().unwrap_or(0)
    };
    for reason in [
        "MemberVolumeReplaced",
        "MemberVolumeStale",
        "MemberNeverStarted",
        "MemberVolumeLost",
    ] {
        assert!(
            delta(reason) <= 1,
            "{reason} {} times: a cycle ({after:?})",
            delta(reason)
        );
    }
    assert!(
        (1..=2).contains(&delta("AddedLearner")),
        "member 2 added back {} times ({after:?})",
        delta("AddedLearner")
    );
    eprintln!(
        "    member 2 removed by hand: back on a fresh volume, Running with 5 voters after {back:.1} s (new Events about it: {how:?})"
    );

    // The upgrade v3.5.36 -> v3.6.4 (OnDelete, the loop restarts the members: followers
    // first, the leader last), with a client writing through any member.
    let addrs: Vec<String> = net
        .lock()
        .unwrap()
        .pods
        .iter()
        .map(|p| p.addr.clone())
        .collect();
    let writing = Arc::new(AtomicBool::new(true));
    let writes = writer_any(ns0.clone(), addrs, writing.clone());
    std::thread::sleep(Duration::from_millis(500));
    patch_spec(&cp, json!({ "version": "v3.6.4" }), "upgrade to v3.6.4");
    let t = Instant::now();
    let mut said: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut check = || {
        std::thread::sleep(Duration::from_millis(300));
        let ec = cluster_json(&cp);
        if let Some(m) = ec["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Progressing")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.split("; ").find(|p| p.contains("restarting")))
            && said.last().map(String::as_str) != Some(m)
        {
            said.push(m.to_owned());
        }
        let n = net.lock().unwrap();
        let all_new = (0..5).all(|i| {
            n.v3(i, "maintenance/status", json!({}))
                .is_some_and(|s| s["version"] == "3.6.4")
        });
        (all_new && ec["status"]["phase"] == "Running" && ec["status"]["readyReplicas"] == 5)
            .then_some(())
    };
    while check().is_none() {
        if Instant::now() > deadline {
            let pods = cp.kubectl_output(&["-n", NS, "get", "pods", "-o", "custom-columns=NAME:.metadata.name,REV:.metadata.labels.controller-revision-hash,IMAGE:.spec.containers[0].image,READY:.status.conditions[0].status,DELETING:.metadata.deletionTimestamp"], None);
            let set = rt.block_on(sts.get(NAME)).unwrap();
            panic!(
                "not upgraded within 240 s\ncluster: {}\npods:\n{}\nStatefulSet status: {:?} strategy {:?}",
                cluster_json(&cp)["status"],
                String::from_utf8_lossy(&pods.stdout),
                set.status,
                set.spec.update_strategy
            );
        }
    }
    let upgraded = t.elapsed().as_secs_f64();
    writing.store(false, Ordering::Relaxed);
    let (written, failed) = writes.join().unwrap();
    assert_eq!(failed, 0, "writes failed during the upgrade");
    assert!(said.len() >= 2, "the status named the restarts: {said:?}");
    assert!(
        said.last().unwrap().contains("the leader, last")
            && said[..said.len() - 1]
                .iter()
                .all(|m| m.contains("a follower")),
        "followers first, the leader last: {said:?}"
    );
    {
        let n = net.lock().unwrap();
        for key in written.iter().step_by(11) {
            for i in 0..5 {
                assert_eq!(
                    n.get(i, key).as_deref(),
                    Some(key.trim_start_matches("/w/")),
                    "{key} through member {i} after the upgrade"
                );
            }
        }
    }
    eprintln!(
        "    upgrade v3.5.36 -> v3.6.4 through the apiserver in {upgraded:.1} s: {} writes through any member, 0 failed; the status said {said:?}",
        written.len()
    );

    played.finish(&cp);
}
