//! Every fixture under tests/fixtures, sent over real HTTPS to the real binary, checked against
//! its expectation and against the apiserver's own rules for a reply (see
//! tests/fixtures/expectations.json for what each fixture must get).

mod common;

use base64::Engine;
use common::*;
use serde_json::{Value, json};

/// `actual` contains `expected`: objects by key (recursively), arrays element by element,
/// scalars equal; strings holding JSON objects compare as JSON.
fn assert_subset(actual: &Value, expected: &Value, at: &str) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, ev) in e {
                let av = a
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k}: missing in {actual}"));
                assert_subset(av, ev, &format!("{at}.{k}"));
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            assert_eq!(a.len(), e.len(), "{at}: array length in {actual}");
            for (i, (av, ev)) in a.iter().zip(e).enumerate() {
                assert_subset(av, ev, &format!("{at}[{i}]"));
            }
        }
        (Value::String(a), Value::String(e)) if e.starts_with('{') => {
            let (pa, pe): (Value, Value) = (
                serde_json::from_str(a).unwrap(),
                serde_json::from_str(e).unwrap(),
            );
            assert_eq!(pa, pe, "{at}");
        }
        _ => assert_eq!(actual, expected, "{at}"),
    }
}

fn message_of(body: &Value) -> String {
    body.pointer("/response/status/message")
        .or_else(|| body.pointer("/response/result/message"))
        .or_else(|| body.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn decode_patch(rsp: &Value) -> Option<Value> {
    let patch = rsp
        .get("patch")?
        .as_str()
        .expect("patch is a base64 string");
    assert_eq!(
        rsp["patchType"], "JSONPatch",
        "patch without patchType JSONPatch"
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("patch is standard padded base64");
    Some(serde_json::from_slice(&bytes).expect("patch is a JSON array"))
}

/// The apiserver's checks on a reply (contract section 5), for any 200 answer.
fn check_contract(endpoint: &str, request: &Value, body: &Value) {
    let rsp = &body["response"];
    assert_eq!(
        body["apiVersion"], request["apiVersion"],
        "reply in the request's version"
    );
    assert_eq!(body["kind"], request["kind"]);
    assert_eq!(rsp["uid"], request["request"]["uid"], "uid echoed");
    if endpoint == "/convert" {
        let status = rsp["result"]["status"].as_str().unwrap();
        assert!(status == "Success" || status == "Failure");
        if status == "Success" {
            let objects = request["request"]["objects"].as_array().unwrap();
            let converted = rsp["convertedObjects"].as_array().unwrap();
            assert_eq!(
                converted.len(),
                objects.len(),
                "one converted object per object, in order"
            );
            for (o, c) in objects.iter().zip(converted) {
                assert_eq!(c["apiVersion"], request["request"]["desiredAPIVersion"]);
                assert_eq!(c["kind"], o["kind"]);
                for k in [
                    "name",
                    "namespace",
                    "uid",
                    "labels",
                    "resourceVersion",
                    "generation",
                ] {
                    assert_eq!(c["metadata"][k], o["metadata"][k], "metadata.{k} kept");
                }
            }
        } else {
            assert!(!message_of(body).is_empty(), "Failure carries a message");
        }
        return;
    }
    assert!(rsp["allowed"].is_boolean(), "allowed is a boolean");
    if endpoint == "/validate" {
        assert!(
            rsp.get("patch").is_none() && rsp.get("patchType").is_none(),
            "validating webhooks never patch"
        );
    }
    if rsp["allowed"] == false {
        assert!(
            rsp["status"]["code"].as_u64().unwrap() >= 400,
            "denial code >= 400"
        );
        assert!(!message_of(body).is_empty(), "denial has a message");
    }
    if let Some(w) = rsp.get("warnings") {
        for w in w.as_array().unwrap() {
            let w = w.as_str().unwrap();
            assert!(
                !w.is_empty() && w.len() <= 120 && !w.chars().any(char::is_control),
                "warning {w:?}"
            );
        }
    }
    if request["request"]["operation"] == "DELETE" {
        assert!(rsp.get("patch").is_none(), "no patch on DELETE");
    }
}

fn review_for(object: &Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "00000000-0000-4000-8000-00000000beef",
        "kind": {"group": "etcd.example.com", "version": "v1", "kind": "EtcdCluster"},
        "resource": {"group": "etcd.example.com", "version": "v1", "resource": "etcdclusters"},
        "name": object["metadata"]["name"], "namespace": "default", "operation": "CREATE",
        "userInfo": {"username": "admin"}, "object": object, "oldObject": null, "dryRun": false}})
}

/// Sends one fixture and checks everything its expectation says.
async fn check_fixture(client: &reqwest::Client, server: &InProcess, e: &Value) {
    let file = e["file"].as_str().unwrap();
    let endpoint = e["endpoint"].as_str().unwrap();
    let raw = fixture(file);
    let query = if endpoint == "/convert" {
        "?timeout=30s"
    } else {
        "?timeout=10s"
    };
    let (status, ct, body) = post(
        client,
        &server.url(&format!("{endpoint}{query}")),
        raw.clone(),
    )
    .await;
    assert_eq!(
        status as u64,
        e["status"].as_u64().unwrap(),
        "{file}: HTTP status; body {body}"
    );
    assert_eq!(ct, "application/json", "{file}: content type");
    for m in e["message"].as_array().into_iter().flatten() {
        let msg = message_of(&body);
        assert!(
            msg.contains(m.as_str().unwrap()),
            "{file}: message {msg:?} lacks {m}"
        );
    }
    if status != 200 {
        assert_eq!(body["kind"], "Status", "{file}: errors are metav1.Status");
        return;
    }
    let request: Value = serde_json::from_slice(&raw).unwrap();
    check_contract(endpoint, &request, &body);
    let rsp = &body["response"];
    if let Some(allowed) = e.get("allowed") {
        assert_eq!(&rsp["allowed"], allowed, "{file}: allowed; {body}");
    }
    if let Some(code) = e.get("code") {
        assert_eq!(&rsp["status"]["code"], code, "{file}: status.code");
    }
    for w in e["warnings"].as_array().into_iter().flatten() {
        let all = rsp["warnings"].to_string();
        assert!(
            all.contains(w.as_str().unwrap()),
            "{file}: warnings {all} lack {w}"
        );
    }
    if e.get("warnings").is_none() && endpoint != "/convert" {
        assert!(
            rsp.get("warnings").is_none(),
            "{file}: unexpected warnings {}",
            rsp["warnings"]
        );
    }
    if let Some(result) = e.get("result") {
        assert_eq!(&rsp["result"]["status"], result, "{file}: result; {body}");
    }
    if let Some(converted) = e.get("converted") {
        assert_subset(&rsp["convertedObjects"], converted, file);
    }
    for path in e["absent_in_converted"].as_array().into_iter().flatten() {
        for obj in rsp["convertedObjects"].as_array().unwrap() {
            let ptr = format!("/{}", path.as_str().unwrap().replace('.', "/"));
            assert!(
                obj.pointer(&ptr).is_none(),
                "{file}: {path} should be absent"
            );
        }
    }
    if endpoint == "/mutate" {
        let patch = decode_patch(rsp);
        match &e["patch"] {
            Value::Null => assert!(patch.is_none(), "{file}: expected no patch, got {patch:?}"),
            expected => assert_eq!(patch.as_ref(), Some(expected), "{file}: patch"),
        }
        if let Some(patch) = patch {
            // Apply it as the apiserver would; identity fields stay; a second round is a no-op.
            let object = &request["request"]["object"];
            let mut patched = object.clone();
            let ops: json_patch::Patch = serde_json::from_value(patch).unwrap();
            json_patch::patch(&mut patched, &ops)
                .unwrap_or_else(|err| panic!("{file}: patch does not apply: {err}"));
            for p in [
                "/apiVersion",
                "/kind",
                "/metadata/name",
                "/metadata/namespace",
            ] {
                assert_eq!(patched.pointer(p), object.pointer(p), "{file}: {p} changed");
            }
            let mut again = request.clone();
            again["request"]["object"] = patched.clone();
            let (code, _, second) = post(
                client,
                &server.url("/mutate"),
                serde_json::to_vec(&again).unwrap(),
            )
            .await;
            assert_eq!(code, 200, "{file}: second round: {second}");
            assert_eq!(
                second["response"]["allowed"], true,
                "{file}: second round: {second}"
            );
            assert!(
                second["response"].get("patch").is_none(),
                "{file}: second round patched again: {second}"
            );
            if e["passes_validate"] == true {
                let mut v = review_for(&patched);
                if let Some(old) = request["request"].get("oldObject").filter(|o| !o.is_null()) {
                    v["request"]["operation"] = json!("UPDATE");
                    v["request"]["oldObject"] = old.clone();
                }
                let (_, _, verdict) = post(
                    client,
                    &server.url("/validate"),
                    serde_json::to_vec(&v).unwrap(),
                )
                .await;
                assert_eq!(
                    verdict["response"]["allowed"], true,
                    "{file}: patched object denied: {verdict}"
                );
            }
        }
    }
}

fn expectations() -> Vec<Value> {
    let all: Vec<Value> = serde_json::from_slice(&fixture("expectations.json")).unwrap();
    // Every fixture has an expectation and every expectation a fixture.
    let mut files: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json") && n != "expectations.json")
        .collect();
    files.sort();
    let mut named: Vec<String> = all
        .iter()
        .map(|e| e["file"].as_str().unwrap().to_owned())
        .collect();
    named.sort();
    assert_eq!(files, named, "fixtures and expectations.json disagree");
    assert!(all.len() >= 25);
    all
}

#[test]
fn every_fixture_gets_its_expected_answer_over_https() {
    let server = InProcess::start(&[]);
    let client = apiserver_client(&server.ca());
    runtime().block_on(async {
        for e in expectations() {
            check_fixture(&client, &server, &e).await;
        }
    });
}

/// The same fixtures through curl, the way users try a webhook.
#[test]
fn every_fixture_answers_through_curl() {
    let server = InProcess::start(&[]);
    for e in expectations() {
        let file = e["file"].as_str().unwrap();
        let out = std::process::Command::new("curl")
            .args(["-sS", "--http1.1", "--cacert"])
            .arg(server.ca())
            .args([
                "-H",
                "Content-Type: application/json",
                "-w",
                "\n%{http_code}",
                "--data-binary",
            ])
            .arg(format!("@{}", fixtures_dir().join(file).display()))
            .arg(server.url(&format!("{}?timeout=10s", e["endpoint"].as_str().unwrap())))
            .output()
            .expect("curl must be installed (.ci/run installs it)");
        assert!(
            out.status.success(),
            "{file}: curl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let (body, code) = text.rsplit_once('\n').unwrap();
        assert_eq!(
            code.parse::<u64>().unwrap(),
            e["status"].as_u64().unwrap(),
            "{file}"
        );
        let body: Value = serde_json::from_str(body).unwrap();
        if let Some(allowed) = e.get("allowed") {
            assert_eq!(&body["response"]["allowed"], allowed, "{file}");
        }
        if let Some(result) = e.get("result") {
            assert_eq!(&body["response"]["result"]["status"], result, "{file}");
        }
    }
}

#[test]
fn http_errors_are_clear() {
    let server = InProcess::start(&[
        "--max-body-bytes",
        "4096",
        "--max-convert-body-bytes",
        "4096",
    ]);
    let client = apiserver_client(&server.ca());
    runtime().block_on(async {
        let valid = fixture("validate-v1-create-valid.json");
        // Wrong content type.
        let rsp = client
            .post(server.url("/validate"))
            .header("Content-Type", "text/plain")
            .body(valid.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.status(), 415);
        let body: Value = rsp.json().await.unwrap();
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("Content-Type must be application/json, got text/plain")
        );
        // A charset parameter is fine.
        let rsp = client
            .post(server.url("/validate"))
            .header("Content-Type", "application/json; charset=utf-8")
            .body(valid.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.status(), 200);
        // Too large, declared and streamed.
        let big = vec![b' '; 10_000];
        let (status, _, body) = post(&client, &server.url("/convert"), big.clone()).await;
        assert_eq!(status, 413);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("exceeds 4096 bytes")
        );
        let stream = futures_stream(big);
        let rsp = client
            .post(server.url("/mutate"))
            .header("Content-Type", "application/json")
            .body(stream)
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.status(), 413);
        // Unknown path and wrong method.
        let (status, _, _) = post(&client, &server.url("/admit"), valid.clone()).await;
        assert_eq!(status, 404);
        let rsp = client.get(server.url("/validate")).send().await.unwrap();
        assert_eq!(rsp.status(), 405);
        // Empty body.
        let (status, _, body) = post(&client, &server.url("/mutate"), Vec::new()).await;
        assert_eq!(status, 400);
        assert!(
            body["message"].as_str().unwrap().contains("truncated JSON"),
            "{body}"
        );
        // Health.
        assert_eq!(
            client
                .get(server.url("/healthz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        assert_eq!(
            client
                .get(server.url("/readyz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        // Still serving after all that.
        let (status, _, _) = post(&client, &server.url("/validate?timeout=10s"), valid).await;
        assert_eq!(status, 200);
    });
}

fn futures_stream(bytes: Vec<u8>) -> reqwest::Body {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(1000).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[test]
fn http11_keep_alive_and_parallel_connections() {
    let server = InProcess::start(&[]);
    runtime().block_on(async {
        let body = fixture("mutate-v1-create-minimal.json");
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let client = apiserver_client(&server.ca());
            let url = server.url("/mutate?timeout=10s");
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let rsp = client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(rsp.version(), reqwest::Version::HTTP_11);
                    assert_eq!(rsp.status(), 200);
                    rsp.bytes().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// ALPN: http/1.1 only by default (an h2-only client is refused); `--http2` adds h2.
#[test]
fn http2_only_when_asked() {
    use std::sync::Arc;
    async fn negotiate(
        server: &InProcess,
        alpn: &[&[u8]],
    ) -> Result<Option<Vec<u8>>, std::io::Error> {
        let config = Arc::new(client_tls(&server.ca(), alpn));
        let tcp = tokio::net::TcpStream::connect(server.addr).await?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(
                rustls_pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await?;
        Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    }
    let plain = InProcess::start(&[]);
    let h2 = InProcess::start(&["--http2"]);
    runtime().block_on(async {
        assert_eq!(
            negotiate(&plain, &[b"h2", b"http/1.1"]).await.unwrap(),
            Some(b"http/1.1".to_vec())
        );
        assert!(
            negotiate(&plain, &[b"h2"]).await.is_err(),
            "h2-only client must be refused"
        );
        assert_eq!(
            negotiate(&h2, &[b"h2", b"http/1.1"]).await.unwrap(),
            Some(b"h2".to_vec())
        );
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(client_tls(&h2.ca(), &[b"h2"]))
            .build()
            .unwrap();
        let rsp = client
            .post(h2.url("/validate"))
            .header("Content-Type", "application/json")
            .body(fixture("validate-v1-create-valid.json"))
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.version(), reqwest::Version::HTTP_2);
        assert_eq!(rsp.status(), 200);
    });
}

/// `serve` with no --cert-dir: a development CA and certificate under ./certs/dev, made once,
/// logged with a ready-to-paste curl command, and the README's example answers.
#[test]
fn embedded_default_certificate() {
    let cwd = tempfile::tempdir().unwrap();
    let dev = cwd.path().join("certs/dev");
    let first_ca;
    {
        let server = Server::start_in(&dev, &["--no-cert-dir"], Some(cwd.path()));
        assert!(
            dev.join("ca.crt").exists()
                && dev.join("tls.crt").exists()
                && dev.join("tls.key").exists()
        );
        let log = server.log();
        assert!(log.contains("created a development CA"), "{log}");
        assert!(log.contains("try: curl --cacert"), "{log}");
        first_ca = std::fs::read(dev.join("ca.crt")).unwrap();
        let out = std::process::Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(dev.join("ca.crt"))
            .args(["-H", "Content-Type: application/json", "--data"])
            .arg(format!(
                "@{}",
                fixtures_dir()
                    .join("validate-v1-create-even-size.json")
                    .display()
            ))
            .arg(server.url("/validate"))
            .output()
            .unwrap();
        let body: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(body["response"]["allowed"], false);
        assert!(
            body["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("spec.size: Invalid value: 4: must be odd")
        );
    }
    let server = Server::start_in(&dev, &["--no-cert-dir"], Some(cwd.path()));
    assert!(
        !server.log().contains("created a development CA"),
        "reused, not re-made"
    );
    assert_eq!(std::fs::read(dev.join("ca.crt")).unwrap(), first_ca);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dev.join("tls.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the private key is readable by its owner only"
    );
}
