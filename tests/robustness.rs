//! The robustness battery: bad bodies, oversized bodies, slow and idle clients, the wrong
//! protocol on the TLS port, and an HTTP/2 rapid-reset burst. Every loop is bounded; the server
//! must answer each abuse clearly and keep serving everyone else.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The most the process has ever held (VmHWM): unlike the current RSS, it does not depend on
/// when the allocator hands freed pages back.
fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

async fn still_serving(server: &impl Target) {
    let (status, _, body) = post(
        &apiserver_client(&server.ca()),
        &server.url("/validate"),
        fixture("validate-v1-create-valid.json"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["allowed"], true);
}

async fn tls(server: &impl Target) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let config = client_config(&std::fs::read_to_string(server.ca()).unwrap(), None);
    let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap()
}

/// Reads until EOF, error or `within`; returns what came.
async fn read_some<R: AsyncReadExt + Unpin>(r: &mut R, within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n")
                    && String::from_utf8_lossy(&out).contains("\"code\"")
                {
                    return out;
                }
            }
            _ => return out,
        }
    }
}

#[test]
fn bad_bodies_get_clear_4xx_and_serving_goes_on() {
    let server = InProcess::start(&[]);
    let client = apiserver_client(&server.ca());
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let mut deep_object: Value =
        serde_json::from_slice(&fixture("validate-v1-create-valid.json")).unwrap();
    let mut nested = json!(1);
    for _ in 0..200 {
        nested = json!([nested]);
    }
    deep_object["request"]["object"]["spec"]["extra"] = nested;
    let deep_object = serde_json::to_vec(&deep_object).unwrap();
    let mut wrong_type: Value =
        serde_json::from_slice(&fixture("validate-v1-create-valid.json")).unwrap();
    wrong_type["request"]["uid"] = json!(5);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/validate",
            b"{\"apiVersion\":".to_vec(),
            400,
            "truncated JSON",
        ),
        (
            "/mutate",
            b"{\"apiVersion\":\"admission.k8s.io/v1\",}".to_vec(),
            400,
            "malformed AdmissionReview",
        ),
        (
            "/validate",
            serde_json::to_vec(&wrong_type).unwrap(),
            400,
            "invalid type: integer `5`, expected a string",
        ),
        (
            "/validate",
            deep.clone().into_bytes(),
            400,
            "malformed AdmissionReview: invalid type: the body must be a JSON object",
        ),
        (
            "/convert",
            deep.into_bytes(),
            400,
            "malformed ConversionReview: invalid type: the body must be a JSON object",
        ),
        ("/mutate", deep_object, 400, "recursion limit exceeded"),
        (
            "/validate",
            vec![0xff, 0xfe, 0x7b, 0x00, 0x80],
            400,
            "malformed AdmissionReview",
        ),
        ("/convert", Vec::new(), 400, "truncated JSON"),
        (
            "/mutate",
            b"[{\"apiVersion\":\"admission.k8s.io/v1\"}]".to_vec(),
            400,
            "must be a JSON object",
        ),
        (
            "/validate",
            b"apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n".to_vec(),
            400,
            "the body is YAML, and this API takes JSON",
        ),
        (
            "/validate",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#
                .to_vec(),
            400,
            "has no request",
        ),
        (
            "/convert",
            br#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":null}"#
                .to_vec(),
            400,
            "has no request",
        ),
        (
            "/convert",
            br#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#.to_vec(),
            400,
            "has no request",
        ),
    ];
    runtime().block_on(async {
        for (path, body, want, msg) in cases {
            let (status, ct, reply) = post(&client, &server.url(path), body).await;
            assert_eq!(status, want, "{path} {msg}: {reply}");
            assert_eq!(ct, "application/json");
            assert!(reply["message"].as_str().unwrap().contains(msg), "{path}: {reply}");
        }
        // 10,000 empty objects: a Failure result (HTTP 200), as the contract wants.
        let objects: Vec<Value> = (0..10_000).map(|_| json!({})).collect();
        let review = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u", "desiredAPIVersion": "etcd.example.com/v1", "objects": objects}});
        let (status, _, reply) = post(&client, &server.url("/convert"), serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, 200);
        assert_eq!(reply["response"]["result"]["status"], "Failure");
        assert!(reply["response"]["result"]["message"].as_str().unwrap().starts_with("objects[0] (/): cannot convert"));
        still_serving(&server).await;
    });
}

#[test]
fn a_100_mb_body_is_refused_without_being_read() {
    // A limit far below what is sent, so that what the process holds afterwards tells "read up
    // to the limit" from "read it all" whatever the allocator keeps.
    let server = Server::start(&["--max-convert-body-bytes", "8388608"]);
    let pid = server.child.id();
    let before = peak_kib(pid);
    runtime().block_on(async {
        // Declared: refused on the header alone.
        let mut s = tls(&server).await;
        s.write_all(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n").await.unwrap();
        let reply = String::from_utf8_lossy(&read_some(&mut s, Duration::from_secs(5)).await).into_owned();
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
        assert!(reply.to_ascii_lowercase().contains("connection: close"));

        // Chunked, no length: cut off at --max-body-bytes while the client keeps sending.
        let s = tls(&server).await;
        let (mut rd, mut wr) = tokio::io::split(s);
        let writer = tokio::spawn(async move {
            wr.write_all(b"POST /convert HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").await?;
            let chunk = vec![b' '; 65536];
            let framed = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
            for _ in 0..1600 {
                // 100 MiB in 64 KiB chunks
                wr.write_all(&framed).await?;
            }
            Ok::<_, std::io::Error>(())
        });
        let reply = String::from_utf8_lossy(&read_some(&mut rd, Duration::from_secs(20)).await).into_owned();
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
        assert!(reply.contains("exceeds 8388608 bytes"), "{reply}");
        let _ = tokio::time::timeout(Duration::from_secs(20), writer).await;
        still_serving(&server).await;
    });
    // What is read is bounded by --max-convert-body-bytes (8 MiB), never by the 100 MB sent.
    // The peak, not the RSS after: the current RSS depends on when mimalloc hands pages back
    // (a fresh-clone run saw it 33 MiB up 2 s later, past the 32 MiB this allowed). Reading
    // it all would have raised the peak by at least the 95 MiB sent; up to the limit, by the
    // buffers of that (twice, as a Vec grows) and TLS.
    let after = peak_kib(pid);
    assert!(
        after < before + 48 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    assert_eq!(
        server.metric("etcd_webhook_http_errors_total", r#"status="413""#),
        2.0
    );
}

#[test]
fn slow_headers_are_cut_off() {
    let server = InProcess::start(&["--header-read-timeout", "2s"]);
    runtime().block_on(async {
        let mut s = tls(&server).await;
        let start = Instant::now();
        let mut cut = false;
        for b in b"POST /validate HTTP/1.1\r\nHost: localhost\r\n"
            .iter()
            .take(10)
        {
            if s.write_all(&[*b]).await.is_err() || s.flush().await.is_err() {
                cut = true;
                break;
            }
            let mut buf = [0u8; 512];
            match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    cut = true;
                    break;
                }
                Ok(Ok(_)) => {
                    cut = true; // a 408-style answer also ends it
                    break;
                }
                Err(_) => {}
            }
        }
        assert!(cut, "a client sending one byte a second was not cut off");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(6), "cut off only after {took:?}");
        still_serving(&server).await;
    });
}

/// Sends one request on `s` and reads its whole answer (head and Content-Length body); `None`
/// when the connection is closed or nothing came within 5 s.
async fn exchange<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    s: &mut S,
    path: &str,
) -> Option<String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    s.flush().await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return Some(head.lines().next().unwrap_or_default().to_owned());
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

/// A kept-alive connection is not closed while it waits for its next request past the header
/// timeout (the apiserver keeps idle connections up to 90 s and reuses them; the server used to
/// close them at the header timeout, racing the next POST); it is closed once the idle timeout
/// has passed since the last answer, as an end of stream.
#[test]
fn a_kept_alive_connection_outlives_the_header_timeout_and_ends_at_the_idle_timeout() {
    let server = InProcess::start(&["--header-read-timeout", "1s", "--idle-timeout", "3s"]);
    runtime().block_on(async {
        let mut s = tls(&server).await;
        let first = exchange(&mut s, "/no-such-path").await.expect("an answer");
        assert!(first.starts_with("HTTP/1.1 "), "{first}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let second = exchange(&mut s, "/no-such-path")
            .await
            .expect("the kept-alive connection answers after 2 s idle (header timeout 1 s)");
        assert_eq!(first, second);
        let answered = Instant::now();
        let mut buf = [0u8; 64];
        let end = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        let idle = answered.elapsed();
        assert!(
            matches!(end, Ok(Ok(0)) | Ok(Err(_))),
            "the idle connection was not closed: {end:?}"
        );
        assert!(
            idle >= Duration::from_millis(2900) && idle < Duration::from_secs(5),
            "closed after {idle:?} idle (idle timeout 3 s)"
        );
        still_serving(&server).await;
    });
}

#[test]
fn a_thousand_idle_connections_do_not_stop_others() {
    // The binary: its RSS is measured.
    let server = Server::start(&[]);
    let pid = server.child.id();
    let before = rss_kib(pid);
    runtime().block_on(async {
        let mut idle = Vec::new();
        // 900 TCP connections that never start TLS, and 100 TLS connections that never send a request.
        for _ in 0..900 {
            idle.push(tokio::net::TcpStream::connect(server.addr()).await.unwrap());
        }
        let mut idle_tls = Vec::new();
        for _ in 0..100 {
            idle_tls.push(tls(&server).await);
        }
        // Served at all, and well before the 10 s handshake timeout would free the idle ones.
        let start = Instant::now();
        still_serving(&server).await;
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "others waited {:?}",
            start.elapsed()
        );
        let during = rss_kib(pid);
        assert!(
            during < before + 64 * 1024,
            "RSS grew from {before} KiB to {during} KiB with 1,000 idle connections"
        );
        drop(idle);
        drop(idle_tls);
    });
}

#[test]
fn plain_http_and_old_tls_are_refused() {
    let server = InProcess::start(&[]);
    runtime().block_on(async {
        // Plain HTTP on the TLS port.
        let mut tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        tcp.write_all(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let reply = read_some(&mut tcp, Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(&reply);
        // Told what went wrong (as Go's servers tell it), never served: no review is decided.
        assert!(
            text.starts_with("HTTP/1.0 400 Bad Request\r\n")
                && text.contains("Client sent an HTTP request to an HTTPS server")
                && text.contains("use https://")
                && !text.contains("AdmissionReview"),
            "plain HTTP gets a 400 that says to use https: {text:?}"
        );

        // A TLS 1.0 ClientHello (and 1.1: same shape, version 0x0302) gets no ServerHello.
        for version in [[3u8, 1u8], [3, 2]] {
            let mut hello = vec![1, 0, 0, 0, version[0], version[1]];
            hello.extend([7u8; 32]); // random
            hello.extend([0, 0, 2, 0, 0x2f, 1, 0]); // no session id; TLS_RSA_WITH_AES_128_CBC_SHA; no compression
            let len = hello.len() - 4;
            hello[1..4].copy_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
            let mut record = vec![
                0x16,
                version[0],
                version[1],
                (hello.len() >> 8) as u8,
                hello.len() as u8,
            ];
            record.extend(hello);
            let mut tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
            tcp.write_all(&record).await.unwrap();
            let reply = read_some(&mut tcp, Duration::from_secs(5)).await;
            assert!(
                reply.first() != Some(&0x16),
                "TLS {version:?} must not get a ServerHello: {reply:?}"
            );
        }
        still_serving(&server).await;
    });
    assert!(server.metric("etcd_webhook_tls_handshake_failures_total", "") >= 3.0);
}

#[test]
fn http2_rapid_reset_is_contained() {
    let server = InProcess::start(&["--http2"]);
    runtime().block_on(async {
        let config = {
            let mut c =
                (*client_config(&std::fs::read_to_string(server.ca()).unwrap(), None)).clone();
            c.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(c)
        };
        let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(
                rustls_pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap();
        let (mut h2, conn) = h2::client::handshake(stream).await.unwrap();
        let conn = tokio::spawn(conn);
        // Another client sends requests one after another on its own connection for as long as
        // the burst lasts (and once after): each must be answered 200.
        let burst_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (started, first_sent) = tokio::sync::oneshot::channel();
        let other = {
            let burst_over = burst_over.clone();
            let (url, ca) = (server.url("/validate"), server.ca());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .use_preconfigured_tls(client_tls(&ca, &[b"h2"]))
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let mut started = Some(started);
                let mut answers = Vec::new();
                for _ in 0..1_000 {
                    let during = !burst_over.load(std::sync::atomic::Ordering::SeqCst);
                    if let Some(s) = started.take() {
                        let _ = s.send(());
                    }
                    let rsp = client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .body(fixture("validate-v1-create-valid.json"))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .map_err(|e| e.to_string());
                    answers.push((during, rsp));
                    if !during {
                        break;
                    }
                }
                answers
            })
        };
        first_sent.await.unwrap();
        let start = Instant::now();
        let mut opened = 0;
        for _ in 0..5_000 {
            if start.elapsed() > Duration::from_secs(10) {
                break;
            }
            let req = http::Request::post(server.url("/validate"))
                .header("content-type", "application/json")
                .body(())
                .unwrap();
            let Ok(ready) = tokio::time::timeout(Duration::from_secs(2), h2.clone().ready()).await
            else {
                break;
            };
            let Ok(mut ready) = ready else { break };
            match ready.send_request(req, false) {
                Ok((_, mut body)) => {
                    body.send_reset(h2::Reason::CANCEL);
                    opened += 1;
                }
                Err(_) => break,
            }
            h2 = ready;
        }
        // The server either keeps the abuser within its stream limits or drops the connection;
        // either way everyone else is served, during the burst and after it.
        burst_over.store(true, std::sync::atomic::Ordering::SeqCst);
        let answers = other.await.unwrap();
        assert!(
            answers.iter().all(|(_, rsp)| *rsp == Ok(200)),
            "the other client: {answers:?}"
        );
        assert!(
            answers.iter().any(|(during, _)| *during) && answers.iter().any(|(during, _)| !during),
            "requests during and after the burst: {answers:?}"
        );
        eprintln!(
            "rapid reset: {opened} streams opened and reset in {:?}; the other client got {} answers meanwhile",
            start.elapsed(),
            answers.len()
        );
        assert!(opened > 0);
        conn.abort();
    });
}
