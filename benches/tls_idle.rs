//! What the loop's connections to TLS members cost while idle, and what a new one costs to
//! make: the heap each idle TLS connection holds in the loop's process (counted by a counting
//! allocator, client side only: the server is another process), and the time of a call on a
//! new connection (TCP and TLS handshake with a client certificate) against one on a pooled
//! connection.
//!
//! Each of N "clusters" is a [`Gateway`] with its own client identity, as the loop keeps one per
//! TLS cluster; each calls one member once, so its pool keeps one idle connection. The member
//! is this project's own HTTPS server (`etcd-webhook serve` on loopback, rustls, certificates
//! from `etcd-webhook certs`): the call is refused with 404, but the exchange and the kept
//! connection are the same as with etcd's gateway.
//!
//! `cargo bench --bench tls_idle` (N = 1,000; `TLS_IDLE_CLUSTERS` sets N). Linux, loopback.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_webhook::controller::etcd::{ClientTls, Gateway, IDLE_CONNECTION_TIMEOUT, Transport};

#[path = "support/counting.rs"]
mod counting;
use counting::live;

/// The member: `etcd-webhook serve` on loopback, stopped on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let n: usize = std::env::var("TLS_IDLE_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let bin = env!("CARGO_BIN_EXE_etcd-webhook");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let certs = dir.path().join("certs");
    let made = Command::new(bin)
        .args(["certs", "--ip", "127.0.0.1", "--out"])
        .arg(&certs)
        .status()
        .expect("etcd-webhook certs runs");
    assert!(made.success(), "etcd-webhook certs");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let _server = Server(
        Command::new(bin)
            .args([
                "serve",
                "--controller=off",
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--cert-dir",
            ])
            .arg(&certs)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd-webhook serve starts"),
    );
    let up = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "the server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let read = |f: &str| std::fs::read(certs.join(f)).expect("a certificate file");
    let identity = ClientTls {
        ca: read("ca.crt"),
        cert: read("tls.crt"),
        key: read("tls.key"),
    };
    let endpoint = format!("https://127.0.0.1:{port}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let call = |g: &Gateway| {
            let endpoint = endpoint.clone();
            let g = g.clone();
            async move {
                // 404 from the webhook server: answered, the connection kept.
                let _ = g
                    .post(&endpoint, "maintenance/status", serde_json::json!({}))
                    .await;
            }
        };
        // Warm the lazies (rustls, the connector) before counting.
        let warm = Gateway::with_tls(Duration::from_secs(5), &identity).expect("identity");
        call(&warm).await;
        drop(warm);
        tokio::time::sleep(Duration::from_millis(100)).await;

        let before = live();
        let gateways: Vec<Gateway> = (0..n)
            .map(|_| Gateway::with_tls(Duration::from_secs(5), &identity).expect("identity"))
            .collect();
        let made = live();
        let started = Instant::now();
        for g in &gateways {
            call(g).await;
        }
        let fresh = started.elapsed();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let connected = live();
        let started = Instant::now();
        for g in &gateways {
            call(g).await;
        }
        let pooled = started.elapsed();
        // The pool looks for idle connections every IDLE_CONNECTION_TIMEOUT: one idle that long
        // goes at the next look, at most twice that after its last use.
        tokio::time::sleep(2 * IDLE_CONNECTION_TIMEOUT + Duration::from_secs(2)).await;
        let after_idle = live();
        let per = |bytes: isize| bytes as f64 / n as f64 / 1024.0;
        println!("{n} TLS clusters, one member each, loopback:");
        println!(
            "  a client identity (Gateway, no connection): {:.1} KiB each",
            per(made - before)
        );
        println!(
            "  an idle TLS connection kept in its pool:    {:.1} KiB each ({:.1} MiB for {n})",
            per(connected - made),
            (connected - made) as f64 / f64::from(1 << 20)
        );
        println!(
            "  after {} idle: {:.1} KiB each still held",
            humantime::format_duration(2 * IDLE_CONNECTION_TIMEOUT),
            per(after_idle - made)
        );
        println!(
            "  a call on a new connection (TCP + TLS handshake, client certificate): {:.2} ms; on a pooled one: {:.2} ms",
            fresh.as_secs_f64() * 1000.0 / n as f64,
            pooled.as_secs_f64() * 1000.0 / n as f64
        );
    });
}
