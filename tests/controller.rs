//! The controller in the real binary: started only after the webhook listener, gated by the
//! Lease, reconciling an EtcdCluster, handed over when the leader dies, stopped on SIGTERM with
//! the Lease released. The cluster is the in-memory API server of the unit tests
//! (`etcd_webhook::testing`) served on a loopback port.

mod common;

use std::time::{Duration, Instant};

use etcd_webhook::testing::FakeApi;
use serde_json::{Value, json};

use common::{Server, Target, apiserver_client, assert_in_order, fixture, post, runtime};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/test/leases/etcd-webhook-leader";
const EC: &str = "/apis/etcd.example.com/v1/namespaces/prod/etcdclusters/etcd";
const STS: &str = "/apis/apps/v1/namespaces/prod/statefulsets/etcd";

/// The in-memory API server of the unit tests, over HTTP; returns its port.
fn serve_fake(rt: &tokio::runtime::Runtime, api: &FakeApi) -> u16 {
    rt.block_on(api.serve_http()).port()
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

/// `/validate` answers a valid CREATE with allowed.
fn assert_validate_allows(rt: &tokio::runtime::Runtime, server: &Server) {
    let (code, _, review) = rt.block_on(post(
        &apiserver_client(&server.ca()),
        &server.url("/validate"),
        fixture("validate-v1-create-valid.json"),
    ));
    assert_eq!(code, 200);
    assert_eq!(review["response"]["allowed"], true);
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
    let api = FakeApi::default();
    let port = serve_fake(&rt, &api);
    let tmp = tempfile::tempdir().unwrap();
    let config = kubeconfig(tmp.path(), port);
    // No --leader-election-namespace and no POD_NAMESPACE: the Lease goes to etcd-system, not
    // to the kubeconfig context's namespace.
    let lease_path =
        "/apis/coordination.k8s.io/v1/namespaces/etcd-system/leases/etcd-webhook-leader";
    let mut server = Server::start_with_env(
        &[
            "--controller",
            "on",
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
    assert_in_order(
        &log,
        &[
            "etcd-webhook listening",
            "became leader",
            "controller starting",
        ],
    );
    assert!(
        wait_until(Duration::from_secs(10), || api
            .requested("GET /apis/etcd.example.com/v1/etcdclusters")),
        "no EtcdCluster list; requests: {:?}",
        api.calls()
    );
    let holder = api.get(lease_path).unwrap()["spec"]["holderIdentity"].clone();
    assert_eq!(holder, "replica-a");
    assert!(
        log.contains(&format!(
            "controller: reconciling EtcdClusters of this API server server=http://127.0.0.1:{port}"
        )),
        "the log names the API server: {log}"
    );
    assert_eq!(server.metric("etcd_webhook_controller_leader", ""), 1.0);
    // The loop's requests go through its client-side limit and are counted by verb and code
    // (a watch is counted once it is answered, which may follow the list by a moment).
    assert!(
        wait_until(Duration::from_secs(10), || server.metric(
            "etcd_webhook_kube_api_requests_total",
            "verb=\"WATCH\",code=\"200\""
        ) >= 1.0),
        "{}",
        server.health_get("/metrics").1
    );
    // The webhooks answer as before.
    assert_validate_allows(&rt, &server);

    server.sigterm();
    assert_eq!(
        server.wait_exit(Duration::from_secs(20)),
        Some(0),
        "log:\n{}",
        server.log()
    );
    let lease = api.get(lease_path).unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "Lease not released: {lease}"
    );
    let log = server.log();
    assert!(log.contains("leader Lease released"), "{log}");
    assert!(log.contains("controller stopped"), "{log}");
    // Stopped because its passes ended, not because the stop timeout gave up on them (that
    // line says "controller stopped" too).
    assert!(!log.contains("were abandoned"), "{log}");
}

#[test]
fn controller_auto_outside_a_pod_serves_webhooks_only() {
    // With KUBECONFIG set too: a laptop never becomes a second reconciler by accident.
    let rt = runtime();
    let api = FakeApi::default();
    let port = serve_fake(&rt, &api);
    let tmp = tempfile::tempdir().unwrap();
    let config = kubeconfig(tmp.path(), port);
    for env in [vec![], vec![("KUBECONFIG", config.to_str().unwrap())]] {
        let server = Server::start_with_env(&[], &env);
        assert!(
            server.wait_log(
                "controller off: not in a pod (--controller auto)",
                Duration::from_secs(5)
            ),
            "{}",
            server.log()
        );
        assert_eq!(server.health_get("/readyz").0, 200);
        assert!(!server.log().contains("controller starting"));
    }
    assert!(
        api.calls().is_empty(),
        "auto outside a pod calls no API server"
    );
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
    assert_ne!(server.wait_exit(Duration::from_secs(20)), Some(0));
    assert!(
        wait_until(Duration::from_secs(2), || server
            .log()
            .contains("--controller on: no usable Kubernetes config")),
        "{}",
        server.log()
    );
}

/// An EtcdCluster as the apiserver would hold it.
fn stored_cluster() -> Value {
    json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "etcd", "namespace": "prod", "uid": "11111111-2222-4333-8444-555555555555"},
        "spec": {"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "10Gi"}})
}

fn replica(config: &std::path::Path, identity: &str) -> Server {
    Server::start_with_env(
        &[
            "--controller",
            "on",
            "--leader-election-namespace",
            "test",
            "--identity",
            identity,
            "--lease-duration",
            "3s",
            "--resync-interval",
            "1s",
            "--shutdown-delay",
            "0s",
        ],
        &[("KUBECONFIG", config.to_str().unwrap())],
    )
}

#[test]
fn two_replicas_one_reconciles_and_the_other_takes_over_when_it_dies() {
    let rt = runtime();
    let api = FakeApi::default();
    api.insert(EC, stored_cluster());
    let port = serve_fake(&rt, &api);
    let tmp = tempfile::tempdir().unwrap();
    let config = kubeconfig(tmp.path(), port);
    let mut replicas = [replica(&config, "replica-a"), replica(&config, "replica-b")];

    // The leader reconciles the cluster: finalizer, StatefulSet, status.
    assert!(
        wait_until(Duration::from_secs(20), || api.get(STS).is_some()),
        "no StatefulSet; logs:\n{}\n{}",
        replicas[0].log(),
        replicas[1].log()
    );
    assert!(wait_until(Duration::from_secs(10), || {
        api.get(EC).unwrap()["status"]["phase"] == "Creating"
    }));
    let cluster = api.get(EC).unwrap();
    assert_eq!(
        cluster["metadata"]["finalizers"],
        json!(["etcd.example.com/finalizer"])
    );
    let holder = api.get(LEASE).unwrap()["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_owned();
    let (l, f) = if holder == "replica-a" {
        (0, 1)
    } else {
        (1, 0)
    };
    assert!(replicas[l].log().contains("controller starting"));
    assert!(
        !replicas[f].log().contains("controller starting"),
        "only the holder reconciles:\n{}",
        replicas[f].log()
    );
    // Events come from the holder alone.
    let reporters: Vec<Value> = api
        .paths("/apis/events.k8s.io/")
        .iter()
        .filter(|k| k.contains("/events/"))
        .map(|k| api.get(k).unwrap()["reportingInstance"].clone())
        .collect();
    assert!(!reporters.is_empty());
    assert!(reporters.iter().all(|r| *r == holder), "{reporters:?}");

    // The holder dies without releasing the Lease: the other takes over once it expires.
    replicas[l].child.kill().unwrap();
    replicas[l].child.wait().unwrap();
    let died = Instant::now();
    // The dead holder's last renewal, read after it can no longer renew.
    let dead = api.get(LEASE).unwrap()["spec"].clone();
    assert!(
        replicas[f].wait_log("controller starting", Duration::from_secs(20)),
        "no takeover:\n{}",
        replicas[f].log()
    );
    let took = died.elapsed();
    let taken = api.get(LEASE).unwrap()["spec"].clone();
    assert_ne!(taken["holderIdentity"], json!(holder));
    // Taken only once the Lease had expired: by the Lease's own times, not the test's clock.
    let time = |v: &Value| {
        v.as_str()
            .unwrap_or_else(|| panic!("a Lease time: {v}"))
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
    };
    let renewed = time(&dead["renewTime"]);
    let acquired = time(&taken["acquireTime"]);
    let duration = dead["leaseDurationSeconds"].as_i64().unwrap();
    let gap = acquired.duration_since(renewed);
    assert!(
        gap.as_secs() >= duration,
        "taken {gap:?} after the last renewal, before the {duration} s Lease expired: {dead} -> {taken}"
    );
    // The new leader reconciles: a StatefulSet deleted behind its back comes back.
    api.remove(STS);
    assert!(
        wait_until(Duration::from_secs(20), || api.get(STS).is_some()),
        "the new leader did not reconcile:\n{}",
        replicas[f].log()
    );
    eprintln!("takeover after the leader died: {took:?}");
    // Steady state (resync every second here): reads come from the watch caches, and nothing
    // is written; the only calls are the watches and the Lease. First the passes after the
    // StatefulSet's return settle (a quiet second, at most 20 s), then a window in which
    // passes are seen to run (the loop's own counter) and call nothing.
    let calls = || -> Vec<String> {
        api.calls()
            .iter()
            .filter(|c| !c.query.contains("watch=true") && !c.path.contains("/leases/"))
            .map(|c| format!("{} {}?{}", c.method, c.path, c.query))
            .collect()
    };
    let quiet = wait_until(Duration::from_secs(20), || {
        api.clear_calls();
        std::thread::sleep(Duration::from_secs(1));
        calls().is_empty()
    });
    assert!(quiet, "never a quiet second: {:?}", calls());
    // A cluster with no member ready (no kubelet here) is looked at every tenth resync: the
    // window lasts until two passes have run (at most 30 s).
    let passes = || replicas[f].metric("etcd_webhook_controller_reconciles_total", "");
    let before = passes();
    api.clear_calls();
    assert!(
        wait_until(Duration::from_secs(30), || passes() >= before + 2.0),
        "no two passes in 30 s with a resync every second"
    );
    let called = calls();
    assert!(called.is_empty(), "steady state called the API: {called:?}");

    replicas[f].sigterm();
    assert_eq!(replicas[f].wait_exit(Duration::from_secs(20)), Some(0));
    assert!(api.get(LEASE).unwrap()["spec"]["holderIdentity"].is_null());
}

/// SIGTERM while a pass waits on a slow API server: the loop stops first (the pass abandoned
/// at --controller-stop-timeout) and releases the Lease while readiness stays on and the
/// webhooks answer; only then does readiness go off and the server drain (issue 30: the loop
/// used to go on reconciling after the listener closed, and its writes needed /convert).
#[test]
fn on_sigterm_the_loop_stops_and_releases_the_lease_before_readiness_goes_off() {
    let rt = runtime();
    let api = FakeApi::default();
    api.insert(EC, stored_cluster());
    api.delay(
        "PATCH /api/v1/namespaces/prod/services/",
        Duration::from_secs(120),
    );
    let port = serve_fake(&rt, &api);
    let tmp = tempfile::tempdir().unwrap();
    let config = kubeconfig(tmp.path(), port);
    let mut server = Server::start_with_env(
        &[
            "--controller",
            "on",
            "--leader-election-namespace",
            "test",
            "--identity",
            "replica-a",
            "--lease-duration",
            "6s",
            "--controller-stop-timeout",
            "2s",
            "--shutdown-delay",
            "1s",
        ],
        &[("KUBECONFIG", config.to_str().unwrap())],
    );
    assert!(
        wait_until(Duration::from_secs(20), || api.delayed() > 0),
        "no pass reached the slow Service apply; log:\n{}",
        server.log()
    );
    let signalled = Instant::now();
    server.sigterm();
    assert!(
        server.wait_log("stopping the reconcile loop first", Duration::from_secs(5)),
        "{}",
        server.log()
    );
    // The loop is stopping: still ready, and the webhooks answer.
    assert_eq!(server.health_get("/readyz").0, 200, "{}", server.log());
    assert_validate_allows(&rt, &server);
    assert_eq!(
        server.wait_exit(Duration::from_secs(20)),
        Some(0),
        "log:\n{}",
        server.log()
    );
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(12),
        "2 s for the pass, 1 s of shutdown delay, then the drain: took {took:?}"
    );
    assert_in_order(
        &server.log(),
        &[
            "stopping the reconcile loop first",
            "were abandoned",
            "leader Lease released",
            "readiness off",
            "no longer accepting connections",
        ],
    );
    let lease = api.get(LEASE).unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "Lease not released: {lease}"
    );
}
