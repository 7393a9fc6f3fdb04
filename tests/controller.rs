//! The controller in the real binary: started only after the webhook listener, gated by the
//! Lease, stopped on SIGTERM with the Lease released. The cluster is a small fake API server
//! on a loopback port (empty lists, watches that stay open, one Lease).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use common::{Server, apiserver_client, fixture, post, runtime};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/test/leases/etcd-webhook-leader";

#[derive(Default)]
struct FakeApi {
    requests: Mutex<Vec<String>>,
    lease: Mutex<Option<Value>>,
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn json_response(code: StatusCode, v: Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

async fn answer(
    State(api): State<Arc<FakeApi>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    api.requests.lock().unwrap().push(format!("{method} {uri}"));
    let query = uri.query().unwrap_or("");
    let path = uri.path();
    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404, "message": format!("{path} not found")});
    if path == LEASE {
        let mut lease = api.lease.lock().unwrap();
        return match (method.as_str(), lease.as_mut()) {
            ("GET", Some(l)) => json_response(StatusCode::OK, l.clone()),
            ("PATCH", Some(l)) => {
                let patch: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
                merge(l, &patch);
                json_response(StatusCode::OK, l.clone())
            }
            _ => json_response(StatusCode::NOT_FOUND, not_found),
        };
    }
    if method == Method::POST && path == LEASE.rsplit_once('/').unwrap().0 {
        let mut lease: Value = serde_json::from_slice(&body).unwrap();
        lease["metadata"]["resourceVersion"] = json!("1");
        lease["metadata"]["namespace"] = json!("test");
        *api.lease.lock().unwrap() = Some(lease.clone());
        return json_response(StatusCode::CREATED, lease);
    }
    if method == Method::GET && query.contains("watch=true") {
        // A watch that never sends an event.
        let stream = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        return (StatusCode::OK, Body::from_stream(stream)).into_response();
    }
    if method == Method::GET {
        return json_response(
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
        );
    }
    json_response(StatusCode::NOT_FOUND, not_found)
}

fn kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: fake\n  user:\n    token: test\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: test\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    path
}

fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn controller_starts_after_the_listener_and_releases_the_lease_on_sigterm() {
    let rt = runtime();
    let api = Arc::new(FakeApi::default());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(answer).with_state(api.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    let tmp = tempfile::tempdir().unwrap();
    let config = kubeconfig(tmp.path(), port);
    let mut server = Server::start_with_env(
        &[
            "--leader-election-namespace",
            "test",
            "--identity",
            "replica-a",
            "--lease-duration",
            "6s",
            "--shutdown-delay",
            "0s",
        ],
        &[("KUBECONFIG", config.to_str().unwrap())],
    );
    assert!(
        server.wait_log("controller starting", Duration::from_secs(20)),
        "controller did not start; log:\n{}",
        server.log()
    );
    let log = server.log();
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in log:\n{log}"))
    };
    assert!(at("etcd-webhook listening") < at("became leader"));
    assert!(at("became leader") < at("controller starting"));
    assert!(
        wait_until(Duration::from_secs(10), || {
            api.requests
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.starts_with("GET /apis/etcd.example.com/v1/etcdclusters"))
        }),
        "no EtcdCluster list; requests: {:?}",
        api.requests.lock().unwrap()
    );
    let holder = api.lease.lock().unwrap().as_ref().unwrap()["spec"]["holderIdentity"].clone();
    assert_eq!(holder, "replica-a");
    assert_eq!(server.metric("etcd_webhook_controller_leader", ""), 1.0);
    // The webhooks answer as before.
    let (code, _, review) = rt.block_on(post(
        &apiserver_client(&server.ca()),
        &server.url("/validate"),
        fixture("validate-v1-create-valid.json"),
    ));
    assert_eq!(code, 200);
    assert_eq!(review["response"]["allowed"], true);

    let pid = server.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut exit = None;
    assert!(wait_until(Duration::from_secs(20), || {
        exit = server.child.try_wait().unwrap();
        exit.is_some()
    }));
    assert_eq!(exit.unwrap().code(), Some(0), "log:\n{}", server.log());
    let lease = api.lease.lock().unwrap().clone().unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "Lease not released: {lease}"
    );
    let log = server.log();
    assert!(log.contains("leader Lease released"), "{log}");
    assert!(log.contains("controller stopped"), "{log}");
}

#[test]
fn controller_auto_without_a_cluster_serves_webhooks_only() {
    let server = Server::start(&[]);
    assert!(
        server.wait_log(
            "controller off: no Kubernetes config",
            Duration::from_secs(5)
        ),
        "{}",
        server.log()
    );
    assert_eq!(server.health_get("/readyz").0, 200);
}

#[test]
fn controller_on_without_a_cluster_config_exits_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("certs");
    common::make_certs(&dir, &[]);
    // HOME without a .kube/config, so nothing is found.
    let home = tmp.path().to_str().unwrap().to_owned();
    let mut server = Server::spawn_with(
        &dir,
        &["--controller", "on"],
        Some(tmp.path()),
        &[("HOME", home.as_str())],
    );
    let mut exit = None;
    assert!(wait_until(Duration::from_secs(20), || {
        exit = server.child.try_wait().unwrap();
        exit.is_some()
    }));
    assert_ne!(exit.unwrap().code(), Some(0));
    assert!(
        wait_until(Duration::from_secs(2), || server
            .log()
            .contains("--controller on: no usable Kubernetes config")),
        "{}",
        server.log()
    );
}
