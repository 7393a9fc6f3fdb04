//! Certificate lifecycle against the real binary: kubelet-style atomic swaps under load,
//! in-place writes, broken files, a missing directory, chains, client certificates, a
//! certificate that arrives late, and expiry.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use etcd_webhook::tls::dev::write_kubelet_layout;

fn kubelet_write(dir: &Path, ca: &TestCa, leaf: &Issued) {
    write_kubelet_layout(
        dir,
        &[
            ("ca.crt", ca.cert_pem.as_bytes()),
            ("tls.crt", leaf.cert_pem.as_bytes()),
            ("tls.key", leaf.key_pem.as_bytes()),
        ],
    )
    .unwrap();
}

/// Polls fresh handshakes (bounded) until the server presents `der`; returns how long it took.
async fn until_served(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    der: &[u8],
    within: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Ok(leaf) = served_leaf(addr, config.clone()).await
            && leaf == der
        {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Reviews sent in the background, alternately on one kept-alive client and on fresh
/// connections, until stopped; every answer is counted.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(server: &Server, config: Arc<rustls::ClientConfig>) -> Traffic {
        let (stop, ok, failed) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let url = server.url("/validate?timeout=10s");
        let body = fixture("validate-v1-create-valid.json");
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let task = tokio::spawn(async move {
            let kept = reqwest_client(config.clone());
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                i += 1;
                let client = if i.is_multiple_of(2) {
                    kept.clone()
                } else {
                    reqwest_client(config.clone())
                };
                let rsp = client
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                match rsp {
                    Ok(r) if r.status() == 200 => {
                        let _ = r.bytes().await;
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => {
                        eprintln!("request failed: HTTP {}", r.status());
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("request failed: {e}");
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Traffic {
            stop,
            ok,
            failed,
            task,
        }
    }

    /// Stops the traffic; asserts nothing failed and something succeeded; returns (ok, failed).
    async fn finish(self, what: &str) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let (ok, failed) = (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        );
        assert_eq!(failed, 0, "requests failed {what}");
        assert!(ok > 0);
        (ok, failed)
    }
}

#[test]
fn kubelet_atomic_swaps_under_load_drop_nothing() {
    const ROTATIONS: usize = 25;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("secret");
    let ca = TestCa::new("rotation CA");
    kubelet_write(&dir, &ca, &ca.issue());
    let server = Server::start_in(&dir, &["--cert-poll-interval", "1h"], None);
    let config = client_config(&ca.cert_pem, None);
    runtime().block_on(async {
        let load = Traffic::start(&server, config.clone());
        let mut latencies = Vec::new();
        for i in 0..ROTATIONS {
            let leaf = ca.issue();
            kubelet_write(&dir, &ca, &leaf);
            let took = until_served(server.addr, config.clone(), &leaf.der, Duration::from_secs(2))
                .await
                .unwrap_or_else(|| panic!("rotation {i}: new certificate not served within 2 s; log:\n{}", server.log()));
            latencies.push(took);
        }
        let (ok, failed) = load.finish("during rotations").await;
        latencies.sort();
        eprintln!(
            "ROTATION RESULT: {ROTATIONS} kubelet swaps, swap->first new handshake median {:?} max {:?}; requests ok {} failed {}",
            latencies[ROTATIONS / 2],
            latencies[ROTATIONS - 1],
            ok,
            failed
        );
        // Only the timestamped folder of the last write is left, as the kubelet leaves it.
        let folders = std::fs::read_dir(&dir).unwrap().filter(|e| {
            let n = e.as_ref().unwrap().file_name().into_string().unwrap();
            n.starts_with("..") && n != "..data"
        }).count();
        assert_eq!(folders, 1);
    });
    assert_eq!(
        server.metric("etcd_webhook_cert_reloads_total", r#"result="success""#),
        (ROTATIONS + 1) as f64
    );
    assert_eq!(
        server.metric("etcd_webhook_cert_reloads_total", r#"result="failure""#),
        0.0
    );
}

#[test]
fn in_place_writes_broken_files_and_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    let ca = TestCa::new("in-place CA");
    let first = ca.issue();
    write_in_place(&dir, &first.cert_pem, &first.key_pem);
    let server = Server::start_in(&dir, &["--cert-poll-interval", "1h"], None);
    let config = client_config(&ca.cert_pem, None);
    let rt = runtime();
    rt.block_on(async {
        let load = Traffic::start(&server, config.clone());
        // A plain in-place rewrite is picked up.
        let second = ca.issue();
        write_in_place(&dir, &second.cert_pem, &second.key_pem);
        until_served(
            server.addr,
            config.clone(),
            &second.der,
            Duration::from_secs(2),
        )
        .await
        .expect("in-place write served");

        // Truncated PEM: rejected, the second pair keeps serving, the log and metric say so.
        let third = ca.issue();
        std::fs::write(
            dir.join("tls.crt"),
            &third.cert_pem[..third.cert_pem.len() / 2],
        )
        .unwrap();
        assert!(
            server.wait_log("certificate files rejected", Duration::from_secs(3)),
            "{}",
            server.log()
        );
        assert_eq!(
            served_leaf(server.addr, config.clone()).await.unwrap(),
            second.der
        );
        assert_eq!(server.metric("etcd_webhook_cert_files_rejected", ""), 1.0);

        // A key that does not match the certificate: rejected too.
        let fourth = ca.issue();
        write_in_place(&dir, &third.cert_pem, &fourth.key_pem);
        assert!(
            server.wait_log("do not belong together", Duration::from_secs(10)),
            "{}",
            server.log()
        );
        assert_eq!(
            served_leaf(server.addr, config.clone()).await.unwrap(),
            second.der
        );
        assert!(server.metric("etcd_webhook_cert_reloads_total", r#"result="failure""#) >= 2.0);

        // Requests keep working throughout.
        let (status, _, _) = post(
            &reqwest_client(config.clone()),
            &server.url("/validate"),
            fixture("validate-v1-create-valid.json"),
        )
        .await;
        assert_eq!(status, 200);

        // A good pair again: served, and the rejection clears.
        write_in_place(&dir, &fourth.cert_pem, &fourth.key_pem);
        until_served(
            server.addr,
            config.clone(),
            &fourth.der,
            Duration::from_secs(2),
        )
        .await
        .expect("recovered");
        load.finish("around broken files").await;
    });
    assert_eq!(server.metric("etcd_webhook_cert_files_rejected", ""), 0.0);
}

#[test]
fn directory_missing_for_a_while() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("secret");
    let ca = TestCa::new("missing-dir CA");
    let first = ca.issue();
    kubelet_write(&dir, &ca, &first);
    let server = Server::start_in(&dir, &["--cert-poll-interval", "1s"], None);
    let config = client_config(&ca.cert_pem, None);
    runtime().block_on(async {
        let load = Traffic::start(&server, config.clone());
        std::fs::remove_dir_all(&dir).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Still serving the last good pair.
        assert_eq!(
            served_leaf(server.addr, config.clone()).await.unwrap(),
            first.der
        );
        let (status, _, _) = post(
            &reqwest_client(config.clone()),
            &server.url("/validate"),
            fixture("validate-v1-create-valid.json"),
        )
        .await;
        assert_eq!(status, 200);
        let second = ca.issue();
        kubelet_write(&dir, &ca, &second);
        until_served(
            server.addr,
            config.clone(),
            &second.der,
            Duration::from_secs(3),
        )
        .await
        .expect("served after the directory came back");
        load.finish("while the directory was missing").await;
    });
}

#[test]
fn chain_with_intermediate_trusted_only_through_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    let root = TestCa::new("root CA");
    let intermediate = root.intermediate("intermediate CA");
    let leaf = intermediate.issue();
    write_in_place(
        &dir,
        &format!("{}{}", leaf.cert_pem, intermediate.cert_pem),
        &leaf.key_pem,
    );
    let server = Server::start_in(&dir, &[], None);
    let config = client_config(&root.cert_pem, None);
    runtime().block_on(async {
        assert_eq!(
            served_leaf(server.addr, config.clone()).await.unwrap(),
            leaf.der
        );
        let (status, _, _) = post(
            &reqwest_client(config),
            &server.url("/convert"),
            fixture("convert-mixed-to-v1.json"),
        )
        .await;
        assert_eq!(status, 200);
    });
}

#[test]
fn client_certificates_when_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    let server_ca = TestCa::new("server CA");
    let leaf = server_ca.issue();
    write_in_place(&dir, &leaf.cert_pem, &leaf.key_pem);
    let clients = TestCa::new("apiserver client CA");
    let other = TestCa::new("some other CA");
    let client_ca_file = tmp.path().join("client-ca").join("ca.crt");
    std::fs::create_dir_all(client_ca_file.parent().unwrap()).unwrap();
    clients.write_ca(&client_ca_file);
    let server = Server::start_in(
        &dir,
        &[
            "--client-ca",
            client_ca_file.to_str().unwrap(),
            "--cert-poll-interval",
            "1h",
        ],
        None,
    );
    let body = fixture("validate-v1-create-valid.json");
    runtime().block_on(async {
        let call = |client: Option<Issued>| {
            let client = reqwest_client(client_config(&server_ca.cert_pem, client.as_ref()));
            let url = server.url("/validate");
            let body = body.clone();
            async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }
        };
        assert!(
            call(None).await.is_err(),
            "no client certificate must be refused"
        );
        assert!(
            call(Some(other.issue_client("intruder"))).await.is_err(),
            "a foreign CA must be refused"
        );
        assert_eq!(
            call(Some(clients.issue_client("kube-apiserver")))
                .await
                .unwrap(),
            200
        );

        // The client CA bundle is reloaded: after a switch, only the new CA's clients get in.
        other.write_ca(&client_ca_file);
        let start = Instant::now();
        while call(Some(other.issue_client("apiserver-2"))).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "client CA not reloaded; log:\n{}",
                server.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            call(Some(clients.issue_client("kube-apiserver")))
                .await
                .is_err()
        );
    });
    // Without --client-ca no client certificate is asked for (every other test runs that way).
    assert!(
        server.metric(
            "etcd_webhook_client_ca_reloads_total",
            r#"result="success""#
        ) >= 1.0
    );
}

#[test]
fn certificate_arriving_after_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("secret");
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = Server::spawn(&dir, &["--cert-poll-interval", "1h"], None);
    assert_eq!(server.health_get("/healthz").0, 200);
    let (status, body) = server.health_get("/readyz");
    assert_eq!(status, 503);
    assert!(body.contains("TLS listener not up yet"), "{body}");
    let ca = TestCa::new("late CA");
    let leaf = ca.issue();
    kubelet_write(&dir, &ca, &leaf);
    server.wait_listening(Duration::from_secs(5));
    assert_eq!(server.health_get("/readyz").0, 200);
    let config = client_config(&ca.cert_pem, None);
    runtime().block_on(async {
        assert_eq!(served_leaf(server.addr, config).await.unwrap(), leaf.der);
    });
    let metrics = server.health_get("/metrics").1;
    assert!(
        metrics.contains("etcd_webhook_cert_not_after_timestamp_seconds"),
        "{metrics}"
    );
    assert!(metrics.ends_with("# EOF\n"), "OpenMetrics text");
}

#[test]
fn no_certificate_within_cert_wait_exits_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("empty");
    std::fs::create_dir_all(&dir).unwrap();
    // The process exits non-zero with one error line naming --cert-wait and the cause.
    let final_error = |dir: &std::path::Path| {
        let mut server = Server::spawn(dir, &["--cert-wait", "1s"], None);
        let code = server.wait_exit(Duration::from_secs(10));
        assert!(code.is_some_and(|c| c != 0), "{}", server.log());
        let log = server.log();
        let line = log
            .lines()
            .find(|l| l.contains("no usable serving certificate"))
            .unwrap_or_else(|| panic!("no final error: {log}"))
            .to_owned();
        assert!(line.contains("--cert-wait"), "{line}");
        line
    };
    let line = final_error(&dir);
    assert!(line.contains("cannot read"), "{line}");

    // A pair whose key belongs to another certificate: the final error says so.
    let ca = TestCa::new("wait CA");
    let (one, two) = (ca.issue(), ca.issue());
    let mismatched = tmp.path().join("mismatched");
    write_in_place(&mismatched, &one.cert_pem, &two.key_pem);
    let line = final_error(&mismatched);
    assert!(line.contains("do not belong together"), "{line}");
}

#[test]
fn expiry_is_visible_and_an_expired_certificate_is_not_ready() {
    let ca = TestCa::new("expiry CA");
    // Expires within the warning window: served, ready, warned about.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("soon");
    let soon = ca.issue_valid((-1, 2));
    write_in_place(&dir, &soon.cert_pem, &soon.key_pem);
    let server = Server::start_in(&dir, &["--cert-poll-interval", "1s"], None);
    assert!(
        server.wait_log("serving certificate expires soon", Duration::from_secs(5)),
        "{}",
        server.log()
    );
    assert_eq!(server.health_get("/readyz").0, 200);
    let not_after = server.metric("etcd_webhook_cert_not_after_timestamp_seconds", "");
    let expected =
        (time::OffsetDateTime::now_utc() + time::Duration::days(2)).unix_timestamp() as f64;
    assert!(
        (not_after - expected).abs() < 120.0,
        "{not_after} vs {expected}"
    );
    drop(server);

    // Already expired: the process serves (nothing better to serve) but is not ready.
    let dir = tmp.path().join("expired");
    let expired = ca.issue_valid((-10, -1));
    write_in_place(&dir, &expired.cert_pem, &expired.key_pem);
    let server = Server::start_in(&dir, &["--cert-poll-interval", "1s"], None);
    let (status, body) = server.health_get("/readyz");
    assert_eq!(status, 503);
    assert!(body.contains("expired"), "{body}");
    assert!(server.wait_log("serving certificate has expired", Duration::from_secs(5)));
}

#[test]
fn certs_atomic_writes_the_kubelet_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("secret");
    for _ in 0..2 {
        let status = std::process::Command::new(BIN)
            .args(["certs", "--atomic", "--out"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let data = std::fs::read_link(dir.join("..data")).unwrap();
    assert!(data.to_str().unwrap().starts_with(".."));
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        assert_eq!(
            std::fs::read_link(dir.join(f)).unwrap(),
            Path::new("..data").join(f)
        );
        assert!(dir.join(f).exists());
    }
    let folders: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("..") && n != "..data")
        .collect();
    assert_eq!(folders.len(), 1, "old folder removed: {folders:?}");
}
