//! A real Kubernetes node for the end-to-end tests: the kubelet (a case of the control plane's
//! multi-call binary, tests/controlplane), containerd with runc (seccomp on) and the CNI bridge
//! plugins (tests/node/build.sh), images assembled here without a registry
//! (tests/node/mkimage.py, imported with `ctr`), and a cluster DNS on the apiserver's Services
//! and EndpointSlices (`controlplane dns`). Pods run for real: images and entrypoints,
//! `securityContext`, fsGroup on volumes, Secret volumes and their `..data` swap, probes with
//! their timing, restarts with the kubelet's back-off, termination messages, DNS names of
//! headless Services. NetworkPolicy is enforced by kube-network-policies (`controlplane
//! network-policies`: nftables rules that send each new connection to or from a pod to an
//! nfqueue, where the agent accepts or drops it by the policies; the node's root user, the
//! kubelet's probes and the tests' own clients among it, is never queued).
//!
//! The node's network is a bridge of its own, `e2ebr0` at 10.244.0.1/24 (made before the
//! apiserver, which listens there: the kubelet refuses a loopback node IP and pods reach the
//! apiserver at that address); pods get addresses from the same /24 and reach each other and
//! the host over the bridge, with no masquerading. Everything the node writes lives under the
//! run's folder except the few fixed paths the kubelet and containerd insist on; on drop every
//! process is stopped, every container killed, every mount under the folder undone, the bridge,
//! the kubelet's cgroups and the fixed paths this node made removed, and the sysctls the kubelet
//! and the bridge plugin change restored. One node per machine at a time (port 10250, the
//! `kubepods` cgroups): the e2e runner starts its clusters one after another.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{ControlPlane, run, tail, wait_for};
use crate::common;
use crate::install::ok;

pub const BRIDGE: &str = "e2ebr0";
pub const NODE_IP: &str = "10.244.0.1";
const SUBNET: &str = "10.244.0.0/24";
pub const NODE_NAME: &str = "e2e-node";
/// The nfqueue the NetworkPolicy agent's rules send new connections to.
const NFQUEUE: u16 = 100;
/// The image the CRI runs as each pod's sandbox (containerd's pinned `sandbox` image).
const PAUSE_IMAGE: &str = "localhost/e2e/pause:1";

/// Host sysctls the kubelet (`protectKernelDefaults: false`) and the bridge plugin set.
const SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
];

/// Paths outside the run's folder that the kubelet, containerd's shims and the CNI plugins use
/// whatever they are told; removed on drop when this node made them.
const FIXED_PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
];

/// Makes the node's bridge (before the apiserver, which listens on its address); one left by
/// a run that was killed is removed first.
pub fn bridge_up() {
    assert!(
        is_root(),
        "the real node needs root (bridges, mounts, containers)"
    );
    bridge_down();
    for args in [
        vec!["link", "add", BRIDGE, "type", "bridge"],
        vec!["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
        vec!["link", "set", BRIDGE, "up"],
    ] {
        let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
        ok(run(ip(&args), None), &format!("ip {}", args.join(" ")));
    }
}

/// Removes the bridge (pods' veths went with their network namespaces).
pub fn bridge_down() {
    let _ = run(ip(&["link", "del", BRIDGE]), None);
}

fn ip(args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    cmd
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// An image for the node: its name as pods refer to it, and the folder that is its one layer.
pub struct Image {
    pub name: String,
    pub rootfs: PathBuf,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid:gid`, or empty for root.
    pub user: String,
}

/// The running node; torn down on drop.
pub struct Node {
    dir: PathBuf,
    logs: PathBuf,
    runtime: PathBuf,
    socket: PathBuf,
    procs: Vec<(&'static str, Child)>,
    sysctls: Vec<(String, String)>,
    made: Vec<&'static str>,
    pub resolv_conf: PathBuf,
    kubeconfig: PathBuf,
}

impl Node {
    /// Starts containerd, imports `images` (and the sandbox's pause), starts the cluster DNS
    /// and the kubelet, and returns once the node is Ready with no taint; `cp` must have been
    /// started with [`crate::cluster::Kind::ForNode`]. Sets `cp.resolv_conf`.
    pub fn start(cp: &mut ControlPlane, images: &[Image]) -> Node {
        let started = Instant::now();
        let node_kubeconfig = cp
            .node_kubeconfig
            .clone()
            .expect("a control plane started for a node (Kind::ForNode)");
        let runtime = node_runtime();
        let dir = cp.dir.join("node");
        for sub in [
            "containerd",
            "cni/bin",
            "cni/net.d",
            "cni/ipam",
            "kubelet",
            "images",
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let made = FIXED_PATHS
            .iter()
            .copied()
            .filter(|p| !Path::new(p).exists())
            .collect();
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|k| {
                let out = run(
                    {
                        let mut c = Command::new("sysctl");
                        c.args(["-n", k]);
                        c
                    },
                    None,
                );
                out.status.success().then(|| {
                    (
                        (*k).to_owned(),
                        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                    )
                })
            })
            .collect();
        let mut node = Node {
            socket: dir.join("containerd/containerd.sock"),
            resolv_conf: dir.join("resolv.conf"),
            kubeconfig: cp.kubeconfig.clone(),
            logs: cp.logs.clone(),
            runtime: runtime.clone(),
            dir,
            procs: Vec::new(),
            sysctls,
            made,
        };
        node.write_configs(&runtime);

        // containerd, then the images.
        let path = format!(
            "{}:{}",
            runtime.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let config = node.dir.join("containerd.toml");
        node.spawn(
            "containerd",
            Command::new(runtime.join("containerd"))
                .arg("--config")
                .arg(&config)
                .env("PATH", &path),
        );
        wait_for("containerd's socket", Duration::from_secs(30), || {
            node.check_alive();
            node.socket.exists().then_some(())
        });
        let mut all = vec![Image {
            name: PAUSE_IMAGE.to_owned(),
            rootfs: {
                let root = node.dir.join("images/pause-rootfs");
                std::fs::create_dir_all(&root).unwrap();
                std::fs::copy(runtime.join("pause"), root.join("pause")).unwrap();
                root
            },
            entrypoint: vec!["/pause".to_owned()],
            cmd: Vec::new(),
            user: String::new(),
        }];
        all.extend(images.iter().map(|i| Image {
            name: i.name.clone(),
            rootfs: i.rootfs.clone(),
            entrypoint: i.entrypoint.clone(),
            cmd: i.cmd.clone(),
            user: i.user.clone(),
        }));
        for image in &all {
            let tar = image_archive(image);
            ok(
                run(node.ctr(&["images", "import", tar.to_str().unwrap()]), None),
                &format!("import {}", image.name),
            );
        }

        // The cluster DNS, then the kubelet.
        node.spawn(
            "dns",
            Command::new(cp.bin())
                .arg("dns")
                .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                .arg(format!("--listen={NODE_IP}:53")),
        );
        wait_for("the cluster DNS", Duration::from_secs(60), || {
            node.check_alive();
            std::fs::read_to_string(node.logs.join("dns.log"))
                .unwrap_or_default()
                .contains("listening")
                .then_some(())
        });
        node.spawn(
            "kubelet",
            Command::new(cp.bin())
                .arg("kubelet")
                .arg(format!(
                    "--config={}",
                    node.dir.join("kubelet.yaml").display()
                ))
                .arg(format!("--kubeconfig={}", node_kubeconfig.display()))
                .arg(format!("--root-dir={}", node.dir.join("kubelet").display()))
                .arg(format!(
                    "--cert-dir={}",
                    node.dir.join("kubelet/pki").display()
                ))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg(format!("--node-ip={NODE_IP}"))
                .arg("--v=2")
                .env("PATH", &path),
        );
        wait_for(
            "the node Ready with no taint",
            Duration::from_secs(120),
            || {
                node.check_alive();
                let out = cp.kubectl_output(
                    &[
                        "get",
                        "node",
                        NODE_NAME,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type=='Ready')].status} {.spec.taints}",
                    ],
                    None,
                );
                (String::from_utf8_lossy(&out.stdout).trim() == "True").then_some(())
            },
        );
        // kube-proxy (iptables): Service cluster IPs for pods (the apiserver at 10.0.0.1, a
        // client Service) and for the host (the apiserver calls the webhook's Service).
        let (metrics, health) = (crate::cluster::free_port(), crate::cluster::free_port());
        node.spawn(
            "kube-proxy",
            Command::new(cp.bin())
                .arg("kube-proxy")
                .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--cluster-cidr={SUBNET}"))
                // This machine does not let the conntrack table be resized.
                .arg("--conntrack-max-per-core=0")
                .arg("--conntrack-tcp-timeout-established=0")
                .arg("--conntrack-tcp-timeout-close-wait=0")
                .arg("--iptables-localhost-nodeports=false")
                .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
                .arg(format!("--healthz-bind-address=127.0.0.1:{health}"))
                .arg("--v=1"),
        );
        wait_for("kube-proxy's rules", Duration::from_secs(60), || {
            node.check_alive();
            let out = Command::new("iptables")
                .args(["-t", "nat", "-S", "KUBE-SERVICES"])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .contains("default/kubernetes:https")
                .then_some(())
        });
        // NetworkPolicy enforced: kube-network-policies for this node, its nfqueue fed by the
        // iptables diversion once it has synced (divert_to_policy_agent says why not its own
        // nftables rules).
        node.spawn(
            "network-policies",
            Command::new(cp.bin())
                .arg("network-policies")
                .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg(format!("--nfqueue-id={NFQUEUE}")),
        );
        wait_for(
            "the NetworkPolicy agent synced",
            Duration::from_secs(60),
            || {
                node.check_alive();
                let log = std::fs::read_to_string(node.logs.join("network-policies.log"))
                    .unwrap_or_default();
                log.contains("enforcing").then_some(())
            },
        );
        divert_to_policy_agent();
        cp.resolv_conf = Some(node.resolv_conf.clone());
        println!(
            "real node {NODE_NAME} Ready in {:.1} s (kubelet, containerd, runc; images: {})",
            started.elapsed().as_secs_f64(),
            all.iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        node
    }

    /// A default StorageClass `local` (no provisioner, bound when a pod is scheduled) and
    /// `count` local PersistentVolumes of `size` on this node, each a folder of the run.
    pub fn local_volumes(&self, cp: &ControlPlane, count: usize, size: &str) {
        let mut items = vec![serde_json::json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "local", "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        })];
        for i in 0..count {
            let path = self.volume_path(i);
            std::fs::create_dir_all(&path).unwrap();
            items.push(serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("local-{i}")},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "local",
                    "local": {"path": path},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                    ]}]}},
                },
            }));
        }
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        ok(
            cp.kubectl_output(&["apply", "-f", "-"], Some(&list.to_string())),
            "the local StorageClass and volumes",
        );
    }

    /// The node's folder, and the fixed paths outside it that it made: what [`leftovers`]
    /// checks after the teardown.
    pub fn footprint(&self) -> (PathBuf, Vec<&'static str>) {
        (self.dir.clone(), self.made.clone())
    }

    /// The folder of local volume `i` ([`Node::local_volumes`]).
    pub fn volume_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("volumes/pv-{i}"))
    }

    /// `ctr -n k8s.io ARGS` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.runtime.join("ctr"));
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args);
        cmd
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = File::create(self.logs.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.procs.push((name, child));
    }

    fn check_alive(&mut self) {
        for (name, child) in &mut self.procs {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{name} exited ({status}); its log ends:\n{}",
                    tail(&self.logs.join(format!("{name}.log")), 40)
                );
            }
        }
    }

    fn write_configs(&self, runtime: &Path) {
        let d = self.dir.display();
        let r = runtime.display();
        for bin in ["bridge", "host-local", "loopback"] {
            std::fs::copy(runtime.join(bin), self.dir.join("cni/bin").join(bin)).unwrap();
        }
        std::fs::write(
            self.dir.join("cni/net.d/10-e2e.conflist"),
            serde_json::json!({
                "cniVersion": "1.0.0", "name": "e2e-pods",
                "plugins": [{
                    "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {"type": "host-local",
                             "ranges": [[{"subnet": SUBNET, "gateway": NODE_IP}]],
                             "routes": [{"dst": "0.0.0.0/0"}],
                             "dataDir": self.dir.join("cni/ipam")},
                }],
            })
            .to_string(),
        )
        .unwrap();
        // containerd v2 (config version 3). This machine withholds CAP_SYS_RESOURCE, so runc
        // cannot lower a sandbox's oom_score_adj below containerd's own: clamp it.
        std::fs::write(
            self.dir.join("containerd.toml"),
            format!(
                r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd/containerd.sock"
[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{d}/registries"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{r}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{d}/cni/bin"]
    conf_dir = "{d}/cni/net.d"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
            ),
        )
        .unwrap();
        // No pull leaves the machine: every registry is a closed loopback port, so an image
        // that was not imported fails at once (ErrImagePull) instead of asking the internet.
        let registries = self.dir.join("registries/_default");
        std::fs::create_dir_all(&registries).unwrap();
        std::fs::write(
            registries.join("hosts.toml"),
            "server = \"http://127.0.0.1:9\"\n[host.\"http://127.0.0.1:9\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        )
        .unwrap();
        // Pods with dnsPolicy Default, and the kubelet's own view: the cluster DNS.
        std::fs::write(
            &self.resolv_conf,
            format!(
                "nameserver {NODE_IP}\nsearch svc.cluster.local cluster.local\noptions ndots:5\n"
            ),
        )
        .unwrap();
        let ca = self.kubeconfig.parent().unwrap().join("pki/ca.crt");
        std::fs::write(
            self.dir.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd/containerd.sock
podLogsDir: {d}/pod-logs
resolvConf: {resolv}
clusterDomain: cluster.local
clusterDNS: ["{NODE_IP}"]
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: AlwaysAllow
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
rotateCertificates: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 10s
runtimeRequestTimeout: 2m
"#,
                resolv = self.resolv_conf.display(),
                ca = ca.display(),
            ),
        )
        .unwrap();
    }

    fn stop(&mut self, name: &str, grace: Duration) {
        for (n, child) in &mut self.procs {
            if *n != name {
                continue;
            }
            // SAFETY: kill on a child's PID that has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < grace {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let start = Instant::now();
        // 1. The kubelet first, so nothing restarts; then every container and sandbox is
        //    killed through containerd, and containerd stops (its shims with it).
        self.stop("network-policies", Duration::from_secs(15));
        self.stop("kube-proxy", Duration::from_secs(5));
        self.stop("kubelet", Duration::from_secs(10));
        self.stop("dns", Duration::from_secs(2));
        let tasks = run(self.ctr(&["tasks", "ls", "-q"]), None);
        for task in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = run(self.ctr(&["tasks", "rm", "-f", task]), None);
        }
        self.stop("containerd", Duration::from_secs(30));
        // Shims of this containerd that outlived it (its socket is in their arguments).
        let socket = self.socket.display().to_string();
        for pid in processes_with_argument(&socket) {
            // SAFETY: kill on a PID found in /proc.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // 2. Mounts under the node's folder (rootfs overlays, volumes, network namespaces),
        //    deepest first.
        let prefix = format!("{}/", self.dir.display());
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(unescape_mount))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_by(|a, b| b.cmp(a));
        for m in mounts {
            let c = std::ffi::CString::new(m).unwrap();
            // SAFETY: umount2 on a path string; failure is tolerated (then detached).
            unsafe {
                if libc::umount2(c.as_ptr(), 0) != 0 {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
        // 3. The kubelet's cgroups, leaves first.
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in controllers.flatten() {
                remove_cgroups(&c.path().join("kubepods"));
                remove_cgroups(&c.path().join("k8s.io"));
            }
        }
        // 4. The kubelet's iptables chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY), when the
        //    machine has iptables: the jumps to them, then the chains.
        for ipt in ["iptables", "ip6tables"] {
            for table in ["filter", "nat", "mangle"] {
                remove_kube_chains(ipt, table);
            }
        }
        // 5. The fixed paths this node made, and the sysctls it changed.
        for p in &self.made {
            let _ = std::fs::remove_dir_all(p);
        }
        for (k, v) in &self.sysctls {
            let _ = Command::new("sysctl")
                .args(["-q", "-w", &format!("{k}={v}")])
                .status();
        }
        // 6. The pods' state, volumes and unpacked images (about 1.3 GB; the pods' logs stay
        //    with a failed run's folder). The bridge goes with the control plane.
        for sub in ["containerd", "kubelet", "volumes", "images"] {
            let _ = std::fs::remove_dir_all(self.dir.join(sub));
        }
        println!(
            "real node torn down in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
}

/// What a node could leave behind on this machine: its bridge, mounts under `dir`, processes
/// whose arguments name `dir`, KUBE- iptables chains, the kubelet's cgroups, and the fixed
/// paths in `made` (the ones it created). Empty after a clean teardown.
pub fn leftovers(dir: &Path, made: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    if Command::new("ip")
        .args(["link", "show", BRIDGE])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        found.push(format!("the bridge {BRIDGE}"));
    }
    let prefix = format!("{}/", dir.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mount))
        .filter(|m| m.starts_with(&prefix))
        .count();
    if mounts > 0 {
        found.push(format!("{mounts} mounts under {}", dir.display()));
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for pid in entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if pid != std::process::id()
                && String::from_utf8_lossy(&cmdline).contains(prefix.as_str())
            {
                found.push(format!(
                    "process {pid}: {}",
                    String::from_utf8_lossy(&cmdline).replace('\0', " ")
                ));
            }
        }
    }
    for ipt in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            if let Ok(out) = Command::new(ipt).args(["-t", table, "-S"]).output() {
                let chains = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.starts_with("-N KUBE-"))
                    .count();
                if chains > 0 {
                    found.push(format!("{chains} KUBE- chains in {ipt} {table}"));
                }
            }
        }
    }
    if let Some(table) = policy_table() {
        found.push(format!("the nftables table {table}"));
    }
    if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
        for c in controllers.flatten() {
            if c.path().join("kubepods").exists() {
                found.push(format!("{}", c.path().join("kubepods").display()));
            }
        }
    }
    found.extend(
        made.iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| (*p).to_owned()),
    );
    found
}

/// The agent's own nftables rules cannot go in on this machine: its kernel has no nftables
/// `queue` expression (nft_queue; "No such file or directory" for any rule that queues), while
/// the nfqueue itself and iptables' NFQUEUE target are there. So the same diversion is made
/// with iptables, rule for rule as the agent's postrouting chain (v0.8.0,
/// `syncNFTablesRules`): the node's root user, established connections and DNS are let go,
/// every other packet from or to a pod address goes to the agent's queue, which accepts or
/// drops it by the policies (bypassed, so accepted, while no agent listens). The chain is
/// `KUBE-`, so the teardown removes it and [`leftovers`] looks for it.
fn divert_to_policy_agent() {
    let queue = NFQUEUE.to_string();
    let rules: Vec<Vec<&str>> = vec![
        vec!["-N", "KUBE-E2E-NETPOL"],
        vec![
            "-A",
            "KUBE-E2E-NETPOL",
            "-m",
            "owner",
            "--uid-owner",
            "0",
            "-j",
            "RETURN",
        ],
        vec![
            "-A",
            "KUBE-E2E-NETPOL",
            "-m",
            "conntrack",
            "--ctstate",
            "ESTABLISHED,RELATED",
            "-j",
            "RETURN",
        ],
        vec![
            "-A",
            "KUBE-E2E-NETPOL",
            "-p",
            "udp",
            "--dport",
            "53",
            "-j",
            "RETURN",
        ],
        vec![
            "-A",
            "KUBE-E2E-NETPOL",
            "-s",
            SUBNET,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
            "--queue-bypass",
        ],
        vec![
            "-A",
            "KUBE-E2E-NETPOL",
            "-d",
            SUBNET,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
            "--queue-bypass",
        ],
        vec!["-I", "POSTROUTING", "-j", "KUBE-E2E-NETPOL"],
    ];
    for rule in rules {
        let out = Command::new("iptables")
            .args(["-t", "mangle"])
            .args(&rule)
            .output()
            .expect("run iptables");
        assert!(
            out.status.success(),
            "iptables -t mangle {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The NetworkPolicy agent's nftables table (`inet kube-network-policies`), while it exists:
/// made once the agent has synced, deleted when it stops.
fn policy_table() -> Option<String> {
    let out = Command::new("nft").args(["list", "tables"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim() == "table inet kube-network-policies")
        .map(|l| l.trim().trim_start_matches("table ").to_owned())
}

fn remove_kube_chains(ipt: &str, table: &str) {
    let Ok(out) = Command::new(ipt).args(["-t", table, "-S"]).output() else {
        return;
    };
    let rules = String::from_utf8_lossy(&out.stdout).into_owned();
    for rule in rules.lines() {
        let words: Vec<&str> = rule.split_whitespace().collect();
        if words.first() == Some(&"-A")
            && !words[1].starts_with("KUBE-")
            && words
                .windows(2)
                .any(|w| w[0] == "-j" && w[1].starts_with("KUBE-"))
        {
            // Through the shell: the rules' comments are quoted.
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("{ipt} -t {table} -D {}", &rule[3..]))
                .output();
        }
    }
    let chains: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .filter(|c| c.starts_with("KUBE-"))
        .collect();
    for flag in ["-F", "-X"] {
        for chain in &chains {
            let _ = Command::new(ipt).args(["-t", table, flag, chain]).output();
        }
    }
}

fn remove_cgroups(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                remove_cgroups(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// /proc/self/mountinfo escapes spaces and the like as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(n) = u8::from_str_radix(&code, 8) {
                out.push(n as char);
                continue;
            }
            out.push(c);
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    out
}

fn processes_with_argument(arg: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// The node's runtime (tests/node/build.sh, cached).
fn node_runtime() -> PathBuf {
    let out = Command::new("bash")
        .arg(common::root().join("tests/node/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/node/build.sh");
    assert!(out.status.success(), "tests/node/build.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The OCI archive of `image` (tests/node/mkimage.py), cached under target/node-images by a
/// hash of the script, the name, the entrypoint and the files' names, sizes and times.
fn image_archive(image: &Image) -> PathBuf {
    let script = common::root().join("tests/node/mkimage.py");
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    hash.update(&std::fs::read(&script).unwrap());
    hash.update(image.name.as_bytes());
    hash.update(format!("{:?} {:?} {}", image.entrypoint, image.cmd, image.user).as_bytes());
    let mut files = Vec::new();
    collect_files(&image.rootfs, &mut files);
    files.sort();
    for f in files {
        let meta = std::fs::symlink_metadata(&f).unwrap();
        let name = f.strip_prefix(&image.rootfs).unwrap().display().to_string();
        hash.update(format!("{name} {} {:o}\n", meta.len(), meta.mode()).as_bytes());
        if meta.is_file() && meta.len() < 1 << 20 {
            hash.update(&std::fs::read(&f).unwrap());
        } else if meta.is_file() {
            hash.update(format!("{:?}", meta.modified().ok()).as_bytes());
        }
    }
    let key = hex(&hash.finish().as_ref()[..8]);
    let dir = common::root().join("target/node-images");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{key}.tar"));
    if !out.exists() {
        let status = Command::new("python3")
            .arg(&script)
            .args(["--name", &image.name])
            .arg("--dir")
            .arg(&image.rootfs)
            .arg("--out")
            .arg(&out)
            .args(["--entrypoint", &image.entrypoint.join(",")])
            .args(["--cmd", &image.cmd.join(",")])
            .args(["--user", &image.user])
            .stdout(Stdio::null())
            .status()
            .expect("run tests/node/mkimage.py");
        assert!(status.success(), "mkimage.py for {}", image.name);
    }
    out
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            collect_files(&p, out);
        }
        out.push(p);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The etcd image the rendered members and restore Jobs run, `quay.io/coreos/etcd:VERSION`:
/// `/usr/local/bin/etcd` and `/usr/local/bin/etcdutl` (the control plane's multi-call binary,
/// which is etcd v3.7.4 and its etcdutl when called by those names), `/etc/passwd` with the
/// non-root user 65532, a `/tmp`, nothing else (no shell, as the real image). Another release
/// is `tests/etcd/`'s build of it, with no etcdutl (that binary takes etcdutl as its first
/// argument, not by its name): enough for members, not for restore Jobs.
pub fn etcd_image(cp: &ControlPlane, version: &str) -> Image {
    let source = if version == crate::common::members::Release::V3_7_4.version() {
        cp.bin().to_owned()
    } else {
        let out = Command::new("bash")
            .arg(common::root().join("tests/etcd/build.sh"))
            .arg(version)
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/etcd/build.sh");
        assert!(out.status.success(), "tests/etcd/build.sh {version}");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    };
    let root = cp.dir.join(format!("node/images/etcd-{version}"));
    let bin = root.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::set_permissions(
        root.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    copy_keeping_time(&source, &bin.join("etcd"));
    // The binary links glibc dynamically (cgo): its loader and libraries go in at their paths,
    // as in a distroless base image.
    for lib in shared_libraries(&source) {
        let to = root.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        copy_keeping_time(&std::fs::canonicalize(&lib).unwrap(), &to);
    }
    for tool in ["etcdutl", "etcdctl"] {
        let _ = std::fs::remove_file(bin.join(tool));
        if source == cp.bin() {
            std::os::unix::fs::symlink("etcd", bin.join(tool)).unwrap();
        }
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    Image {
        name: format!("quay.io/coreos/etcd:{version}"),
        rootfs: root,
        entrypoint: vec!["/usr/local/bin/etcd".to_owned()],
        cmd: Vec::new(),
        user: String::new(),
    }
}

/// The product's image as the Dockerfile lays it out, under the name the install and the
/// rendered Jobs use (`ghcr.io/example/etcd-webhook:VERSION`): a static musl binary at
/// `/etcd-webhook` (built here with cargo for x86_64-unknown-linux-musl, the dev profile,
/// stripped), the CA certificates, the non-root user 65532, `serve` as the default command.
pub fn product_image(cp: &ControlPlane) -> Image {
    const TARGET: &str = "x86_64-unknown-linux-musl";
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // A target folder of its own (target/image): cargo locks its folders while it builds, so
    // `.ci/run` can build this binary in the background while `cargo test` runs from target/
    // (the host's build scripts and macros are built once more here, for that).
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| common::root().join("target"))
        .join("image");
    let mut build = Command::new(&cargo);
    // Without what `cargo test` sets for this test's own package (CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR, ...): build scripts that watch those (ring's) would otherwise run
    // again and rebuild ring and all above it, 44 s of a CI run, though `.ci/run` built this
    // binary already.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || key == "CARGO_TARGET_TMPDIR"
        {
            build.env_remove(&*key);
        }
    }
    let status = build
        .args([
            "build",
            "--locked",
            "--target",
            TARGET,
            "--bin",
            "etcd-webhook",
        ])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(common::root())
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "the product's static binary for the node's image did not build: it needs the target \
         (rustup target add {TARGET}) and musl's C compiler for ring (Debian: musl-tools); \
         .ci/run installs both"
    );
    let built = target.join(TARGET).join("debug/etcd-webhook");
    let root = cp.dir.join("node/images/etcd-webhook");
    for d in ["etc/ssl/certs", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::set_permissions(
        root.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let bin = root.join("etcd-webhook");
    ok(
        run(
            {
                let mut c = Command::new("strip");
                c.arg("-o").arg(&bin).arg(&built);
                c
            },
            None,
        ),
        "strip the product's binary",
    );
    keep_time(&built, &bin);
    std::fs::copy(
        "/etc/ssl/certs/ca-certificates.crt",
        root.join("etc/ssl/certs/ca-certificates.crt"),
    )
    .expect("the host's CA certificates (Debian: ca-certificates)");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    Image {
        name: etcd_webhook::controller::render::DEFAULT_BACKUP_IMAGE.to_owned(),
        rootfs: root,
        entrypoint: vec!["/etcd-webhook".to_owned()],
        cmd: vec!["serve".to_owned()],
        user: "65532:65532".to_owned(),
    }
}

/// The shared libraries and loader `ldd` lists for a binary (none for a static one).
fn shared_libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("run ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// Copies a file and gives the copy the source's modification time: images are cached by
/// their files' sizes and times ([`image_archive`]), so the same source keeps the same key.
fn copy_keeping_time(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    keep_time(from, to);
}

fn keep_time(from: &Path, to: &Path) {
    let time = std::fs::metadata(from).unwrap().modified().unwrap();
    File::options()
        .write(true)
        .open(to)
        .unwrap()
        .set_modified(time)
        .unwrap();
}
