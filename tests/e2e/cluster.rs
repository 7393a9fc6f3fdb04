//! A real control plane for the end-to-end tests: etcd, kube-apiserver, kube-controller-manager and
//! cert-manager (controller and cainjector) from `tests/controlplane` (built from Go modules by its
//! build.sh, cached under target/), on random loopback ports, with a PKI made here: a cluster CA,
//! the apiserver's serving pair, an admin client certificate (group system:masters) and
//! service-account signing keys.
//!
//! Every process writes its log into one folder per run (`target/e2e/run-*/logs`) and is killed by
//! PID when the [`ControlPlane`] is dropped: after success, failure, or a panic.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::install::ok;

/// Kubernetes' version, as built by tests/controlplane/build.sh.
pub const KUBERNETES_VERSION: &str = "v1.37.2";

/// Polls `probe` until it returns `Some`, at most `within`; panics with `what` after that.
pub fn wait_for<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A free loopback port (bound, read back, released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// One process of the control plane.
struct Proc {
    name: &'static str,
    child: Child,
}

/// The running control plane; stops every process on drop, and removes its folder under
/// `target/e2e` unless a scenario failed (then it stays for reading: logs, PKI, kubeconfig).
pub struct ControlPlane {
    pub dir: PathBuf,
    /// Keep the folder when dropped: set when a scenario on this control plane failed (a
    /// drop while unwinding keeps it too), or by `E2E_KEEP=1` for every run.
    pub keep: bool,
    pub logs: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    pub ca_pem: String,
    /// etcd's client URL (plain HTTP on loopback), for reading what the apiserver stored.
    pub etcd_url: String,
    /// Where the apiserver resolves service references (see tests/controlplane/main.go).
    pub service_map: PathBuf,
    /// The multi-call binary every component runs from.
    bin: PathBuf,
    procs: Vec<Proc>,
    /// The trace receiver of a traced control plane ([`ControlPlane::start_with`]).
    pub otlp: Option<Otlp>,
    /// A control plane for the real node ([`Kind::ForNode`]): the node's kubeconfig
    /// (`system:node:NAME`); the bridge it listens on is removed on drop.
    pub node_kubeconfig: Option<PathBuf>,
    /// The cluster DNS as a resolv.conf, once a node runs ([`crate::node::Node::start`]): the
    /// product's replicas resolve the members' names through it.
    pub resolv_conf: Option<PathBuf>,
}

/// What a control plane is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Loopback only: the shared suite and most scenarios.
    Plain,
    /// With an OTLP receiver that kube-apiserver sends a span for every request to.
    Traced,
    /// For the real node (tests/e2e/node.rs): the apiserver listens on the node's bridge
    /// address (the kubelet refuses a loopback node IP, and pods reach the apiserver there), a
    /// kube-scheduler runs, the controller manager runs the controllers a node needs, and the
    /// node's credentials are made.
    ForNode,
    /// Loopback only, on the oldest Kubernetes and cert-manager the chart claims
    /// (tests/controlplane/oldest).
    Oldest,
}

/// Where a traced control plane's OTLP receiver listens, and the file it writes the spans to
/// (one JSON object per span: service, name, ids, kind, attributes).
pub struct Otlp {
    /// OTLP/HTTP base URL, for the webhook's `--otlp-endpoint`.
    pub http_url: String,
    pub spans: PathBuf,
}

struct Pki {
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "e2e-cluster-ca");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf: (cert PEM, key PEM).
    fn leaf(
        &self,
        cn: &str,
        org: Option<&str>,
        sans: &[&str],
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, org);
        }
        for san in sans {
            params.subject_alt_names.push(match san.parse() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName((*san).try_into().unwrap()),
            });
        }
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A kubeconfig for `server` with either a client certificate or a bearer token.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: e2e\ncurrent-context: e2e\nusers:\n- name: e2e\n  user:\n{user}\n",
        b64(ca_pem)
    )
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn cert_user(cert_pem: &str, key_pem: &str) -> String {
    format!(
        "    client-certificate-data: {}\n    client-key-data: {}",
        b64(cert_pem),
        b64(key_pem)
    )
}

pub fn token_user(token: &str) -> String {
    format!("    token: {token}")
}

impl ControlPlane {
    /// A kube client with the admin kubeconfig.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Builds (if needed) and starts etcd, kube-apiserver and kube-controller-manager; returns
    /// when the apiserver is ready and the controller manager has created the default
    /// ServiceAccount.
    pub fn start() -> ControlPlane {
        Self::start_kind(Kind::Plain)
    }

    pub fn start_with(traced: bool) -> ControlPlane {
        Self::start_kind(if traced { Kind::Traced } else { Kind::Plain })
    }

    /// With [`Kind::Traced`], an OTLP receiver (`controlplane otlp`) starts first and
    /// kube-apiserver sends it a span for every request (`--tracing-config-file`, every request
    /// sampled); [`ControlPlane::otlp`] says where it listens and where the spans go.
    pub fn start_kind(kind: Kind) -> ControlPlane {
        let traced = kind == Kind::Traced;
        let for_node = kind == Kind::ForNode;
        if for_node {
            crate::node::bridge_up();
        }
        let bin = if kind == Kind::Oldest {
            common::oldest_control_plane()
        } else {
            common::control_plane()
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let dir = common::root()
            .join("target/e2e")
            .join(format!("run-{stamp}-{}", std::process::id()));
        let logs = dir.join("logs");
        let pki = dir.join("pki");
        for d in [&logs, &pki] {
            std::fs::create_dir_all(d).unwrap();
        }
        let mut cp = ControlPlane {
            kubeconfig: dir.join("admin.kubeconfig"),
            service_map: dir.join("service-map"),
            server: String::new(),
            ca_pem: String::new(),
            etcd_url: String::new(),
            logs,
            dir,
            keep: std::env::var_os("E2E_KEEP").is_some_and(|v| v == "1"),
            bin: bin.clone(),
            procs: Vec::new(),
            otlp: None,
            node_kubeconfig: None,
            resolv_conf: None,
        };
        std::fs::write(
            &cp.service_map,
            "# namespace/name:port=host:port (tests/controlplane/main.go)\n",
        )
        .unwrap();

        let ca = Pki::new();
        cp.ca_pem = ca.ca_pem.clone();
        let write = |name: &str, body: &str| {
            let path = pki.join(name);
            std::fs::write(&path, body).unwrap();
            path
        };
        let ca_file = write("ca.crt", &ca.ca_pem);
        let (serving_crt, serving_key) = ca.leaf(
            "kube-apiserver",
            None,
            &[
                crate::node::NODE_IP,
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        let serving_crt = write("apiserver.crt", &serving_crt);
        let serving_key = write("apiserver.key", &serving_key);
        let (admin_crt, admin_key) = ca.leaf(
            "e2e-admin",
            Some("system:masters"),
            &[],
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        );
        // The node's client pair; its kubeconfig is written once the apiserver's address is
        // known (below).
        let node_pair = for_node.then(|| {
            ca.leaf(
                &format!("system:node:{}", crate::node::NODE_NAME),
                Some("system:nodes"),
                &[],
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            )
        });
        let sa = rcgen::KeyPair::generate().unwrap();
        let sa_key = write("sa.key", &sa.serialize_pem());
        let sa_pub = write("sa.pub", &sa.public_key_pem());

        // etcd
        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        cp.etcd_url = client_url.clone();
        cp.spawn(
            &bin,
            "etcd",
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", cp.dir.join("etcd").display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        wait_for("etcd /health", Duration::from_secs(60), || {
            cp.check_alive();
            http_get_plain(etcd_client, "/health").filter(|body| body.contains("\"true\""))
        });

        // The trace receiver, before the apiserver that sends to it.
        let mut tracing_args = Vec::new();
        if traced {
            let (grpc, http) = (free_port(), free_port());
            let spans = cp.dir.join("spans.jsonl");
            cp.spawn(
                &bin,
                "otlp",
                &[
                    format!("--grpc=127.0.0.1:{grpc}"),
                    format!("--http=127.0.0.1:{http}"),
                    format!("--out={}", spans.display()),
                ],
            );
            let config = cp.dir.join("tracing.yaml");
            std::fs::write(
                &config,
                format!(
                    "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n\
                     endpoint: 127.0.0.1:{grpc}\nsamplingRatePerMillion: 1000000\n"
                ),
            )
            .unwrap();
            tracing_args.push(format!("--tracing-config-file={}", config.display()));
            cp.otlp = Some(Otlp {
                http_url: format!("http://127.0.0.1:{http}"),
                spans,
            });
        }

        // kube-apiserver
        let port = free_port();
        let address = if for_node {
            crate::node::NODE_IP
        } else {
            "127.0.0.1"
        };
        cp.server = format!("https://{address}:{port}");
        if let Some((crt, key)) = &node_pair {
            cp.node_kubeconfig = Some(write(
                "node.kubeconfig",
                &kubeconfig(&cp.server, &ca.ca_pem, &cert_user(crt, key)),
            ));
        }
        let node_args: Vec<String> = if for_node {
            vec![
                // The node's address: `logs` and `exec` reach the kubelet there, not through
                // the node's host name (which nothing resolves).
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]
        } else {
            // From v1.37 the `kubernetes` Service's endpoint reconciler refuses a loopback
            // address; nothing here reaches the apiserver through that Service.
            vec!["--endpoint-reconciler-type=none".into()]
        };
        std::fs::write(
            &cp.kubeconfig,
            kubeconfig(&cp.server, &ca.ca_pem, &cert_user(&admin_crt, &admin_key)),
        )
        .unwrap();
        let service_map = cp.service_map.clone();
        let service_env = [("CONTROLPLANE_SERVICE_MAP", service_map.as_os_str())];
        cp.spawn_env(
            &bin,
            "kube-apiserver",
            &[
                format!("--etcd-servers={client_url}"),
                format!("--secure-port={port}"),
                format!("--bind-address={address}"),
                format!("--advertise-address={address}"),
                format!("--cert-dir={}", cp.dir.join("apiserver").display()),
                format!("--tls-cert-file={}", serving_crt.display()),
                format!("--tls-private-key-file={}", serving_key.display()),
                format!("--client-ca-file={}", ca_file.display()),
                // Room for the scale scenario's client Services (1,000 and more; a /24 ran out at 254).
                "--service-cluster-ip-range=10.0.0.0/16".into(),
                "--allow-privileged=true".into(),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", sa_pub.display()),
                format!("--service-account-signing-key-file={}", sa_key.display()),
                // The defaults stay on (MutatingAdmissionWebhook, ValidatingAdmissionWebhook,
                // NamespaceLifecycle, ServiceAccount, ...); this one is on in hardened clusters.
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into(),
                "--v=1".into(),
            ]
            .into_iter()
            .chain(tracing_args)
            .chain(node_args)
            .collect::<Vec<String>>(),
            // On a node the apiserver reaches webhooks as upstream does: through the Service's
            // cluster IP (kube-proxy); elsewhere through the test's service map.
            &service_env[..usize::from(!for_node)],
        );
        wait_for("kube-apiserver /readyz", Duration::from_secs(120), || {
            cp.check_alive();
            let out = cp.kubectl_output(&["get", "--raw", "/readyz"], None);
            (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
                .then_some(())
        });

        // kube-controller-manager
        cp.spawn(
            &bin,
            "kube-controller-manager",
            &[
                format!("--kubeconfig={}", cp.kubeconfig.display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                format!("--controllers={}", controllers(for_node)),
                format!("--service-account-private-key-file={}", sa_key.display()),
                format!("--root-ca-file={}", ca_file.display()),
                "--use-service-account-credentials=true".into(),
                "--v=1".into(),
            ],
        );
        wait_for(
            "the default ServiceAccount (kube-controller-manager is up)",
            Duration::from_secs(120),
            || {
                cp.check_alive();
                cp.kubectl_output(&["-n", "default", "get", "serviceaccount", "default"], None)
                    .status
                    .success()
                    .then_some(())
            },
        );
        if for_node {
            cp.spawn(
                &bin,
                "kube-scheduler",
                &[
                    format!("--kubeconfig={}", cp.kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    "--v=1".into(),
                ],
            );
            // RBAC only (no Node authorizer here): the node's credentials get the node role.
            ok(
                cp.kubectl_output(
                    &[
                        "create",
                        "clusterrolebinding",
                        "e2e-nodes",
                        "--clusterrole=system:node",
                        "--group=system:nodes",
                    ],
                    None,
                ),
                "bind system:node to the group system:nodes",
            );
        }
        // cert-manager: its CRDs from the same module as its controllers, then the controller
        // and cainjector.
        let crds = bin.parent().unwrap().join("cert-manager-crds");
        ok(
            cp.kubectl_output(
                &["apply", "--server-side", "-f", crds.to_str().unwrap()],
                None,
            ),
            "install cert-manager's CRDs",
        );
        ok(
            cp.kubectl_output(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd/certificates.cert-manager.io",
                    "crd/issuers.cert-manager.io",
                    "crd/certificaterequests.cert-manager.io",
                ],
                None,
            ),
            "cert-manager's CRDs established",
        );
        let kubeconfig_flag = format!("--kubeconfig={}", cp.kubeconfig.display());
        cp.spawn(
            &bin,
            "cert-manager-controller",
            std::slice::from_ref(&kubeconfig_flag),
        );
        cp.spawn(&bin, "cainjector", &[kubeconfig_flag]);
        cp
    }

    fn spawn(&mut self, bin: &Path, name: &'static str, args: &[String]) {
        self.spawn_env(bin, name, args, &[]);
    }

    fn spawn_env(
        &mut self,
        bin: &Path,
        name: &'static str,
        args: &[String],
        env: &[(&str, &std::ffi::OsStr)],
    ) {
        let log = File::create(self.logs.join(format!("{name}.log"))).unwrap();
        let child = Command::new(bin)
            .arg(name)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.procs.push(Proc { name, child });
    }

    /// Starts one more component process (`cainjector` with other flags, say) as the admin,
    /// logging to `logs/LOG.log`; it stops when the guard is dropped.
    pub fn start_extra(&self, component: &str, log: &str, args: &[&str]) -> Extra {
        let file = File::create(self.logs.join(format!("{log}.log"))).unwrap();
        let child = Command::new(&self.bin)
            .arg(component)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {component}: {e}"));
        Extra(child)
    }

    /// The process ID of a component (`cainjector`, ...).
    pub fn pid(&self, name: &str) -> u32 {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no component {name}"))
            .child
            .id()
    }

    /// Panics (with the log's tail) when a component has exited.
    /// The multi-call binary; promtool and the CRDs it was built with lie beside it.
    pub fn bin(&self) -> &std::path::Path {
        &self.bin
    }

    pub fn check_alive(&mut self) {
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "{} exited ({status}); its log ends:\n{}",
                    p.name,
                    tail(&self.logs.join(format!("{}.log", p.name)), 40)
                );
            }
        }
    }

    /// `kubectl --kubeconfig admin ARGS` with optional stdin.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl_as(&self.kubeconfig, args, stdin)
    }

    /// `kubectl get -o json ARGS` as admin; panics with kubectl's error otherwise.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        serde_json::from_str(&ok(
            self.kubectl_output(&all, None),
            &format!("kubectl {}", all.join(" ")),
        ))
        .unwrap()
    }

    /// [`Self::get_json`] of an object that may be gone for a while (a pod between its delete
    /// and its controller's new one): `None` while kubectl says NotFound.
    pub fn get_json_opt(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        let out = self.kubectl_output(&all, None);
        if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("(NotFound)") {
            return None;
        }
        Some(serde_json::from_str(&ok(out, &format!("kubectl {}", all.join(" ")))).unwrap())
    }

    /// Prints the tail of every component's log (for a failure).
    pub fn print_logs(&self, lines: usize) {
        print_logs(&self.logs, lines);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The controller manager first, etcd last.
        for p in self.procs.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
        if self.node_kubeconfig.is_some() {
            crate::node::bridge_down();
        }
        // A run's folder was 1.3 GB with a node (volumes, images): a suite that kept every
        // one filled the disk. Only a failed run's stays.
        if self.keep || std::thread::panicking() {
            println!("control plane folder kept: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The controllers kube-controller-manager runs: what the scenarios use, and for a node also
/// what a node needs (its lifecycle: else it keeps the not-ready taint; endpoints for Service
/// DNS; the volume binder and protection for claims; Deployments for the product's own pods;
/// pod garbage collection).
fn controllers(for_node: bool) -> String {
    let mut list = vec![
        "garbage-collector-controller",
        "namespace-controller",
        "serviceaccount-controller",
        "serviceaccount-token-controller",
        "statefulset-controller",
        "persistentvolumeclaim-protection-controller",
        "job-controller",
        "cronjob-controller",
        "disruption-controller",
        "root-ca-certificate-publisher-controller",
    ];
    if for_node {
        list.extend([
            "node-lifecycle-controller",
            "endpointslice-controller",
            "endpoints-controller",
            "persistentvolume-binder-controller",
            "persistentvolume-protection-controller",
            "replicaset-controller",
            "deployment-controller",
            "ttl-after-finished-controller",
            "pod-garbage-collector-controller",
            "clusterrole-aggregation-controller",
        ]);
    }
    list.join(",")
}

/// Runs kubectl (tests/tools/k8s-cli.sh) with a kubeconfig.
pub fn kubectl_as(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(common::k8s_tools().join("kubectl"));
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(common::root());
    run(cmd, stdin)
}

/// Runs a command with `stdin` (or none) and collects its output.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {:?}: {e}", cmd.get_program()));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Prints the tail of every log in `dir`.
pub fn print_logs(dir: &Path, lines: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        eprintln!("----- {} (last {lines} lines)", path.display());
        eprintln!("{}", tail(&path, lines));
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A plain-HTTP GET on a loopback port; the body on a 200.
fn http_get_plain(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// A component started by [`ControlPlane::start_extra`]; killed when dropped.
pub struct Extra(std::process::Child);

impl Drop for Extra {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
