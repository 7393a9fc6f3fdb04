//! Shared by the integration tests: start the real binary on a random loopback port with
//! certificates from `etcd-webhook certs`, and talk HTTPS to it.
#![allow(dead_code)]

pub mod members;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_etcd-webhook");

/// Builds (once: cached under target/) the real control plane's multi-call binary from Go
/// modules (tests/controlplane/build.sh) and returns its path; etcd is its `etcd` subcommand.
pub fn control_plane() -> PathBuf {
    build_control_plane("tests/controlplane")
}

/// The same control plane from tests/controlplane/oldest: the oldest Kubernetes and cert-manager
/// the chart claims (no node, S3 server, collector or promtool in it).
pub fn oldest_control_plane() -> PathBuf {
    build_control_plane("tests/controlplane/oldest")
}

/// The Kubernetes release tests/controlplane/oldest is pinned to (its go.mod's
/// k8s.io/kubernetes), e.g. `v1.34.12`.
pub fn oldest_kubernetes() -> String {
    let go_mod = std::fs::read_to_string(root().join("tests/controlplane/oldest/go.mod")).unwrap();
    go_mod
        .lines()
        .find_map(|line| line.trim().strip_prefix("k8s.io/kubernetes "))
        .unwrap_or_else(|| panic!("tests/controlplane/oldest/go.mod requires k8s.io/kubernetes"))
        .trim()
        .to_string()
}

fn build_control_plane(module: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg(root().join("tests/controlplane/build.sh"))
        .arg(root().join(module))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/controlplane/build.sh");
    assert!(
        out.status.success(),
        "tests/controlplane/build.sh {module} failed (see above): these tests need the control plane's binaries"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

pub fn install_crypto() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Runs `etcd-webhook certs` into a fresh directory.
pub fn make_certs(dir: &Path, extra: &[&str]) {
    let status = Command::new(BIN)
        .args(["certs", "--out"])
        .arg(dir)
        .args(["--dns", "localhost", "--ip", "127.0.0.1", "--ip", "::1"])
        .args(extra)
        .status()
        .expect("run etcd-webhook certs");
    assert!(status.success(), "etcd-webhook certs failed");
}

/// What a test talks to: the binary ([`Server`]) or the library in-process ([`InProcess`]).
pub trait Target {
    /// The TLS listener's address.
    fn addr(&self) -> SocketAddr;
    /// The CA that signed the serving certificate.
    fn ca(&self) -> PathBuf;
    /// `https://localhost:PORT/path`.
    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{}", self.addr().port(), path)
    }
}

impl Target for Server {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn ca(&self) -> PathBuf {
        self.cert_dir.join("ca.crt")
    }
}

impl Target for InProcess {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn ca(&self) -> PathBuf {
        self.cert_dir.join("ca.crt")
    }
}

/// A server started in this process (`etcd_webhook::app::start`) on 127.0.0.1:0, with its own
/// runtime and certificates in a temp dir; shut down on drop. For tests of what the library
/// does; [`Server`] runs the binary where the binary is what is tested (signals, exit codes,
/// logs, the embedded default).
pub struct InProcess {
    pub addr: SocketAddr,
    pub health: SocketAddr,
    pub cert_dir: PathBuf,
    pub metrics: Arc<etcd_webhook::metrics::Metrics>,
    shutdown: etcd_webhook::app::Shutdown,
    runtime: Option<tokio::runtime::Runtime>,
    _tmp: tempfile::TempDir,
}

impl InProcess {
    /// `serve` with `extra` flags (the controller and the caBundle check off).
    pub fn start(extra: &[&str]) -> InProcess {
        use clap::Parser;
        use etcd_webhook::cli::{Cli, Command};
        install_crypto();
        let tmp = tempfile::tempdir().unwrap();
        let cert_dir = tmp.path().join("certs");
        let ips = ["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        etcd_webhook::tls::dev::generate(&["localhost".to_owned()], &ips, 30)
            .and_then(|c| c.write_plain(&cert_dir))
            .expect("development certificates");
        let mut argv = vec!["etcd-webhook", "serve", "--addr", "127.0.0.1:0"];
        argv.extend(["--health-addr", "127.0.0.1:0", "--controller", "off"]);
        argv.extend(["--cabundle-check", "off", "--cert-dir"]);
        argv.push(cert_dir.to_str().unwrap());
        argv.extend(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("serve flags").command else {
            unreachable!("serve parses as serve")
        };
        let runtime = runtime();
        let running = runtime
            .block_on(etcd_webhook::app::start(*args))
            .expect("the server starts");
        let (addr, health) = (running.addr, running.health_addr);
        let (metrics, shutdown) = (running.metrics.clone(), running.shutdown.clone());
        runtime.spawn(running.wait());
        InProcess {
            addr,
            health,
            cert_dir,
            metrics,
            shutdown,
            runtime: Some(runtime),
            _tmp: tmp,
        }
    }

    /// The value of one metric, summed over label sets that contain `labels`.
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        metric_in(&self.metrics.encode(), name, labels)
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.finish();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The value of one metric sample line (`name{labels} value`) in an exposition, summed over
/// label sets that contain `labels`.
pub fn metric_in(body: &str, name: &str, labels: &str) -> f64 {
    assert_exposed(body, name);
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let key = l.split_whitespace().next().unwrap_or("");
            (key == name || key.starts_with(&format!("{name}{{"))) && key.contains(labels)
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// A running server; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub health: SocketAddr,
    pub cert_dir: PathBuf,
    pub log: Arc<Mutex<String>>,
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Certificates in a temp dir, then `serve` on 127.0.0.1:0 with `extra` flags.
    pub fn start(extra: &[&str]) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        make_certs(&dir, &[]);
        let mut s = Server::start_in(&dir, extra, None);
        s._tmp = Some(tmp);
        s
    }

    /// `serve --cert-dir dir` with `extra` flags; `--no-cert-dir` leaves the flag out (the
    /// embedded default). Waits for the TLS listener.
    pub fn start_in(cert_dir: &Path, extra: &[&str], cwd: Option<&Path>) -> Server {
        let mut s = Server::spawn(cert_dir, extra, cwd);
        s.wait_listening(Duration::from_secs(30));
        s
    }

    /// Like [`Server::start`], with environment variables set for the process (e.g.
    /// KUBECONFIG, which otherwise is removed so the controller stays off).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        make_certs(&dir, &[]);
        let mut s = Server::spawn_with(&dir, extra, None, env);
        s.wait_listening(Duration::from_secs(30));
        s._tmp = Some(tmp);
        s
    }

    /// Starts the process and waits only for the health port.
    pub fn spawn(cert_dir: &Path, extra: &[&str], cwd: Option<&Path>) -> Server {
        Server::spawn_with(cert_dir, extra, cwd, &[])
    }

    pub fn spawn_with(
        cert_dir: &Path,
        extra: &[&str],
        cwd: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Server {
        Server::spawn_reading(cert_dir, extra, cwd, env, None, None)
    }

    /// Like [`Server::spawn_with`], in a mount namespace of its own where `resolv_conf` is
    /// /etc/resolv.conf: the process resolves names through the real node's cluster DNS, as a
    /// pod does (tests/e2e/node.rs). Needs root.
    pub fn spawn_resolving(
        cert_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        resolv_conf: &Path,
    ) -> Server {
        Server::spawn_reading(cert_dir, extra, None, env, None, Some(resolv_conf))
    }

    /// Like [`Server::start`], with the server's stderr read at most `bytes_per_sec`: a slow
    /// log reader, so that log lines queue up in the server.
    pub fn start_with_slow_stderr(extra: &[&str], bytes_per_sec: usize) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        make_certs(&dir, &[]);
        let mut s = Server::spawn_reading(&dir, extra, None, &[], Some(bytes_per_sec), None);
        s.wait_listening(Duration::from_secs(30));
        s._tmp = Some(tmp);
        s
    }

    fn spawn_reading(
        cert_dir: &Path,
        extra: &[&str],
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        bytes_per_sec: Option<usize>,
        resolv_conf: Option<&Path>,
    ) -> Server {
        let mut cmd = Command::new(BIN);
        if let Some(resolv) = resolv_conf {
            use std::os::unix::process::CommandExt;
            let source = std::ffi::CString::new(resolv.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: between fork and exec only async-signal-safe calls (unshare, mount) on
            // strings made before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let none = c"none";
                    let root = c"/";
                    let target = c"/etc/resolv.conf";
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(
                            none.as_ptr(),
                            root.as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        ) != 0
                        || libc::mount(
                            source.as_ptr(),
                            target.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND,
                            std::ptr::null(),
                        ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // No cluster unless a test brings one: the controller's auto mode stays off.
        for var in [
            "KUBECONFIG",
            "KUBERNETES_SERVICE_HOST",
            "POD_NAME",
            "POD_NAMESPACE",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        cmd.args(["--log-format", "text", "serve"]);
        // Loopback and a free port unless the test chooses.
        for flag in ["--addr", "--health-addr"] {
            if !extra.contains(&flag) {
                cmd.args([flag, "127.0.0.1:0"]);
            }
        }
        if !extra.contains(&"--no-cert-dir") {
            cmd.arg("--cert-dir").arg(cert_dir);
        }
        cmd.args(extra.iter().filter(|a| **a != "--no-cert-dir"));
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcd-webhook serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            let stderr: Box<dyn std::io::Read + Send> = match bytes_per_sec {
                None => Box::new(stderr),
                Some(rate) => Box::new(Throttled {
                    inner: stderr,
                    rate,
                }),
            };
            for line in BufReader::with_capacity(4096, stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut s = Server {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            health: "0.0.0.0:0".parse().unwrap(),
            cert_dir: cert_dir.to_owned(),
            log,
            _tmp: None,
        };
        s.health = s
            .addr_from_log("health and metrics listening", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("health port did not come up; log:\n{}", s.log()));
        s
    }

    /// Waits (bounded) for the TLS listener and records its address.
    pub fn wait_listening(&mut self, within: Duration) {
        self.addr = self
            .addr_from_log("etcd-webhook listening", within)
            .unwrap_or_else(|| panic!("TLS listener did not come up; log:\n{}", self.log()));
    }

    fn addr_from_log(&self, marker: &str, within: Duration) -> Option<SocketAddr> {
        let start = Instant::now();
        while start.elapsed() < within {
            for line in self.log().lines() {
                if line.contains(marker)
                    && let Some(rest) = line.split("addr=").nth(1)
                {
                    return rest.split_whitespace().next()?.parse().ok();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// GET on the health port: (status, body).
    pub fn health_get(&self, path: &str) -> (u16, String) {
        health_get_at(self.health, path)
    }

    /// The value of one metric sample line (`name{labels} value`), summed over label sets
    /// that contain `labels`.
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        metric_in(&self.health_get("/metrics").1, name, labels)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
    }

    /// Waits (bounded) for the process to exit; its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("did not exit within {within:?}; log:\n{}", self.log());
    }

    /// Waits (bounded) until the log contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics unless `/metrics` declares the family of `name` (`# TYPE`): a metric that vanished must
/// not read as 0, which is what a label set without samples yet reads as.
pub fn assert_exposed(body: &str, name: &str) {
    let family = ["_total", "_bucket", "_count", "_sum"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    assert!(
        body.lines()
            .any(|l| l.starts_with(&format!("# TYPE {family} "))),
        "metric {name} is not exposed at all:\n{body}"
    );
}

/// A rustls client config trusting `ca` and offering `alpn`.
pub fn client_tls(ca: &Path, alpn: &[&[u8]]) -> rustls::ClientConfig {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    install_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// An HTTP/1.1 client the way the apiserver is one: keep-alive, ALPN http/1.1 only.
pub fn apiserver_client(ca: &Path) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(client_tls(ca, &[b"http/1.1"]))
        .http1_only()
        .user_agent("kube-apiserver-admission")
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POSTs a review as the apiserver does; returns status, content type and body.
pub async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String, Value) {
    let rsp = client
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, */*")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = rsp.status().as_u16();
    assert!(
        rsp.headers().get("retry-after").is_none(),
        "Retry-After must never be sent"
    );
    let ct = rsp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = rsp.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{url}: body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, ct, body)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A test CA that issues leaves (and intermediates) with rcgen.
pub struct TestCa {
    pub cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// One issued certificate.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    fn ca_params(name: &str) -> rcgen::CertificateParams {
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        params
    }

    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = Self::ca_params(name);
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = Self::ca_params(name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        TestCa {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for `name` (and 127.0.0.1) valid from `days.0` to `days.1` days from now.
    fn leaf(&self, name: &str, days: (i64, i64), usage: rcgen::ExtendedKeyUsagePurpose) -> Issued {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days.0);
        params.not_after = now + time::Duration::days(days.1);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A serving certificate for localhost valid from `days.0` to `days.1` days from now.
    pub fn issue_valid(&self, days: (i64, i64)) -> Issued {
        self.leaf(
            "localhost",
            days,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub fn issue(&self) -> Issued {
        self.issue_valid((-1, 30))
    }

    /// A client certificate.
    pub fn issue_client(&self, name: &str) -> Issued {
        self.leaf(name, (-1, 30), rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    pub fn write_ca(&self, path: &Path) {
        std::fs::write(path, &self.cert_pem).unwrap();
    }
}

/// Writes a pair in place (plain files, no symlinks).
pub fn write_in_place(dir: &Path, cert_pem: &str, key_pem: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tls.crt"), cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), key_pem).unwrap();
}

/// A client config (ALPN http/1.1) trusting the CA in `ca_pem`, and optionally presenting a
/// client certificate.
pub fn client_config(ca_pem: &str, client: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    install_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some(c) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(c.der.clone())],
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Full handshakes only: a resumed session would report the certificate of the session it
    // resumes, not the one served now (the apiserver's Go client keeps no session cache either).
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// Opens a fresh TLS connection and returns the leaf certificate the server presented.
pub async fn served_leaf(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<Vec<u8>, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

/// A reqwest client (HTTP/1.1) on a given TLS config.
pub fn reqwest_client(config: Arc<rustls::ClientConfig>) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .http1_only()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The project's root folder.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The folder with helm and kubectl (tests/tools/k8s-cli.sh: PATH first, else installed once
/// into a cache folder).
pub fn k8s_tools() -> &'static PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("tests/tools/k8s-cli.sh"))
            .output()
            .expect("run tests/tools/k8s-cli.sh");
        assert!(
            out.status.success(),
            "k8s-cli.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// GET on a health port at `addr`: (status, body).
pub fn health_get_at(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A reader that delivers at most `rate` bytes per second (in 4 KiB reads).
struct Throttled<R> {
    inner: R,
    rate: usize,
}

impl<R: std::io::Read> std::io::Read for Throttled<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = buf.len().min(4096);
        let n = self.inner.read(&mut buf[..len])?;
        std::thread::sleep(Duration::from_secs_f64(n as f64 / self.rate as f64));
        Ok(n)
    }
}

/// Asserts that `log` holds each of `needles`, each (first seen) after the one before it;
/// returns where the first one is.
pub fn assert_in_order(log: &str, needles: &[&str]) -> usize {
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in log:\n{log}"))
    };
    for pair in needles.windows(2) {
        assert!(
            at(pair[0]) < at(pair[1]),
            "{:?} is not before {:?} in log:\n{log}",
            pair[0],
            pair[1]
        );
    }
    at(needles[0])
}
