//! The apiserver-side benchmark of issue 31: not a test (nothing is timed against a target), run
//! only when the e2e runner is given `--bench-apiserver`:
//!
//! ```sh
//! cargo test --release --test e2e -- --bench-apiserver      # E2E_BENCH_CLUSTERS=1000 by default
//! ```
//!
//! On a traced control plane of its own, the product is installed as shipped but with its loop
//! off (`--controller=off`: only the webhooks, as the peer has), and the controller-runtime peer
//! (benches/peer-go) is started beside it with the same serving certificate. The same webhook
//! configurations are pointed at one and then the other (the Service's address and each
//! webhook's `path`), and N EtcdClusters (`E2E_BENCH_CLUSTERS`) are created through the real
//! kube-apiserver with each: four rounds ordered product, peer, peer, product, each creating a
//! quarter of N one at a time, then a quarter from 16 clients at once. Reported per webhook and concurrency, from the apiserver itself: its
//! `apiserver_admission_webhook_admission_duration_seconds` (the exact mean from `_sum`/`_count`;
//! p50/p99 as `histogram_quantile` reads its buckets, whose first bound is 5 ms), the exact p50
//! and p99 of its own `Call mutating/validating webhook` spans (the apiserver's tracing, every
//! request sampled, on for both), and the CREATE latency the clients saw (exact) and the
//! apiserver's mean for it. The peer's request counter proves where each phase went: it rises by
//! exactly the phase's calls when the peer serves, and not at all when the product does.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, free_port, wait_for};
use crate::install::{Env, NAMESPACE, SERVICE, ok};
use crate::scale::samples;

const NS: &str = "e2e-bench";
const MUTATING: (&str, &str) = ("mutatingwebhookconfiguration", "etcd-webhook-mutating");
const VALIDATING: (&str, &str) = ("validatingwebhookconfiguration", "etcd-webhook-validating");
const MUTATE_NAME: &str = "metcdcluster.etcd.example.com";
const VALIDATE_NAME: &str = "vetcdcluster.etcd.example.com";
/// The paths kubebuilder's markers give (benches/peer-go/main.go).
const PEER_PATHS: (&str, &str) = (
    "/mutate-etcd-example-com-v1-etcdcluster",
    "/validate-etcd-example-com-v1-etcdcluster",
);
const PRODUCT_PATHS: (&str, &str) = ("/mutate", "/validate");
const CLIENTS: usize = 16;

fn clusters_wanted() -> usize {
    std::env::var("E2E_BENCH_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The peer's process, killed on drop.
struct Peer {
    child: Child,
    addr: String,
    health: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_peer(env: &Env) -> Peer {
    let built = Command::new("bash")
        .arg(crate::common::root().join("benches/peer-go/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run benches/peer-go/build.sh");
    assert!(built.status.success(), "benches/peer-go/build.sh failed");
    let bin = String::from_utf8(built.stdout).unwrap().trim().to_owned();
    let log = env.cp.logs.join("peer-go.log");
    let port = free_port().to_string();
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(&bin)
        .args([
            "--port",
            &port,
            "--health-addr",
            "127.0.0.1:0",
            "--cert-dir",
        ])
        .arg(&env.webhook_certs)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start the peer");
    let line = wait_for("the peer to listen", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .ok()?
            .lines()
            .find(|l| l.starts_with("peer-go listening"))
            .map(str::to_owned)
    });
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .expect("the peer's address")
            .to_owned()
    };
    Peer {
        addr: field("addr="),
        health: field("health="),
        child,
    }
}

/// The peer's `controller_runtime_webhook_requests_total`, summed over codes, by path.
fn peer_requests(peer: &Peer) -> BTreeMap<String, f64> {
    let out = Command::new("curl")
        .args(["-sf", &format!("http://{}/metrics", peer.health)])
        .output()
        .expect("curl the peer's /metrics");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by_path = BTreeMap::new();
    for (labels, v) in samples(&text, "controller_runtime_webhook_requests_total") {
        if let Some(path) = labels
            .split("webhook=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        {
            *by_path.entry(path.to_owned()).or_default() += v;
        }
    }
    by_path
}

/// Points the Service and both webhooks' paths at `addr` and `paths`, then waits until the
/// apiserver calls them there (dry-run creates answered by `addr`, seen by `served`).
fn route(env: &Env, addr: &str, paths: (&str, &str), served: impl Fn() -> bool) {
    std::fs::write(
        &env.cp.service_map,
        format!("{NAMESPACE}/{SERVICE}:443={addr}\n"),
    )
    .unwrap();
    for ((kind, name), path) in [(MUTATING, paths.0), (VALIDATING, paths.1)] {
        let patch = json!([{"op": "replace", "path": "/webhooks/0/clientConfig/service/path", "value": path}]);
        ok(
            env.kubectl(&["patch", kind, name, "--type=json", "-p", &patch.to_string()]),
            &format!("point {name} at {path}"),
        );
    }
    // The apiserver reads webhook configurations through a watch: wait until its calls arrive.
    wait_for(
        "the apiserver to call the webhooks at their new address",
        Duration::from_secs(30),
        || {
            let probe = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                "metadata": {"generateName": "probe-", "namespace": NS}, "spec": {"size": 1}});
            let out = env.kubectl_in(
                &["create", "--dry-run=server", "-f", "-"],
                &probe.to_string(),
            );
            (out.status.success() && served()).then_some(())
        },
    );
}

/// What one phase (one webhook, one concurrency) measured.
#[derive(Default)]
struct Phase {
    latencies_ms: Vec<f64>,
    window: (u64, u64),
    before: String,
    after: String,
}

/// Creates `n` EtcdClusters named `prefix-i` from `clients` clients at once; each create's
/// latency as the client saw it.
fn create_many(
    env: &Env,
    rt: &tokio::runtime::Runtime,
    prefix: &str,
    n: usize,
    clients: usize,
) -> Phase {
    let client = rt.block_on(env.cp.client());
    let api: Api<DynamicObject> = Api::namespaced_with(
        client,
        NS,
        &ApiResource::erase::<etcd_webhook::api::v1::EtcdCluster>(&()),
    );
    let before = apiserver_metrics(env);
    let start = now_nanos();
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (api, next, prefix) = (api.clone(), next.clone(), prefix.to_owned());
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= n {
                        break mine;
                    }
                    // The version and the storage size left out: the mutating webhook fills
                    // them in (a patch), as it does for a short manifest.
                    let obj: DynamicObject = serde_json::from_value(json!({
                        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                        "metadata": {"name": format!("{prefix}-{i}"), "namespace": NS,
                                     "labels": {"app.kubernetes.io/part-of": "bench"}},
                        "spec": {"size": 3, "backup": {"enabled": true, "destination": "s3://etcd-backups/bench"}}
                    }))
                    .unwrap();
                    let t = Instant::now();
                    api.create(&PostParams::default(), &obj)
                        .await
                        .unwrap_or_else(|e| panic!("create {prefix}-{i}: {e}"));
                    mine.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let end = now_nanos();
    Phase {
        latencies_ms: latencies,
        window: (start, end),
        before,
        after: apiserver_metrics(env),
    }
}

fn apiserver_metrics(env: &Env) -> String {
    ok(
        env.kubectl(&["get", "--raw", "/metrics"]),
        "the apiserver's /metrics",
    )
}

/// One histogram's buckets (upper bound, count), summed over the series whose labels hold
/// every one of `labels`, observed between two /metrics texts; with its sum and count.
fn histogram(
    before: &str,
    after: &str,
    name: &str,
    labels: &[&str],
) -> (Vec<(f64, f64)>, f64, f64) {
    let pick = |text: &str, suffix: &str| -> BTreeMap<String, f64> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (l, v) in samples(text, &format!("{name}{suffix}")) {
            if labels.iter().all(|want| l.contains(want)) {
                let le = l
                    .split("le=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("")
                    .to_owned();
                *out.entry(le).or_default() += v;
            }
        }
        out
    };
    let delta = |suffix: &str| {
        let (b, a) = (pick(before, suffix), pick(after, suffix));
        a.into_iter()
            .map(|(k, v)| (k.clone(), v - b.get(&k).copied().unwrap_or(0.0)))
            .collect::<BTreeMap<_, _>>()
    };
    let mut buckets: Vec<(f64, f64)> = delta("_bucket")
        .into_iter()
        .map(|(le, v)| {
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                v,
            )
        })
        .collect();
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let sum = delta("_sum").values().sum();
    let count = delta("_count").values().sum();
    (buckets, sum, count)
}

/// Prometheus' `histogram_quantile`: linear within the bucket the rank falls in.
fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(upper, count) in buckets {
        if count >= rank {
            if upper.is_infinite() {
                return Some(lower);
            }
            return Some(lower + (upper - lower) * (rank - below) / (count - below).max(1e-9));
        }
        (lower, below) = (upper, count);
    }
    None
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)]
}

/// The apiserver's `Call mutating webhook` / `Call validating webhook` spans of our webhooks
/// that started inside `window`, durations in ms, sorted.
fn span_durations(spans: &[Value], window: (u64, u64), name: &str) -> Vec<f64> {
    let mut out: Vec<f64> = spans
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| {
            s["attributes"].as_object().is_some_and(|a| {
                a.values().any(|v| {
                    v.as_str()
                        .is_some_and(|v| v.contains("etcdcluster.etcd.example.com"))
                })
            })
        })
        .filter_map(|s| {
            let (start, end) = (
                s["startTimeUnixNano"].as_u64()?,
                s["endTimeUnixNano"].as_u64()?,
            );
            (window.0..=window.1)
                .contains(&start)
                .then(|| (end - start) as f64 / 1e6)
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

pub fn apiserver_side(cp: ControlPlane) {
    let spans_path = cp
        .otlp
        .as_ref()
        .expect("a traced control plane")
        .spans
        .clone();
    // The shipped TLS default, as the peer has it (the suite's installs turn it off).
    let env = Env::install_with(cp, &["--controller=off", "--default-member-tls=true"]);
    env.create_namespace(NS);
    let peer = start_peer(&env);
    let product_addr = env
        .webhook
        .lock()
        .unwrap()
        .as_ref()
        .expect("the product's replica")
        .addr
        .to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n = clusters_wanted();
    let per_phase = n.div_ceil(4).max(1);
    let mut phases: BTreeMap<(&str, usize), Vec<Phase>> = BTreeMap::new();
    for (round, who) in ["product", "peer", "peer", "product"]
        .into_iter()
        .enumerate()
    {
        let before = peer_requests(&peer);
        let seen = || peer_requests(&peer) != before;
        if who == "peer" {
            route(&env, &peer.addr, PEER_PATHS, seen);
        } else {
            // The product: the peer's counter must stay still (checked below).
            route(&env, &product_addr, PRODUCT_PATHS, || true);
        }
        for clients in [1, CLIENTS] {
            let counted = peer_requests(&peer);
            let prefix = format!("{}-r{round}-c{clients}", &who[..2]);
            let phase = create_many(&env, &rt, &prefix, per_phase, clients);
            let grown: f64 = peer_requests(&peer)
                .iter()
                .map(|(k, v)| v - counted.get(k).copied().unwrap_or(0.0))
                .sum();
            let expected = if who == "peer" {
                2.0 * phase.latencies_ms.len() as f64
            } else {
                0.0
            };
            assert_eq!(
                grown, expected,
                "{who} phase: the peer answered {grown} calls, {expected} expected (routing)"
            );
            phases.entry((who, clients)).or_default().push(phase);
        }
    }
    // The apiserver sends spans in batches every 5 s.
    let expected_spans = 2 * phases
        .values()
        .flatten()
        .map(|p| p.latencies_ms.len())
        .sum::<usize>();
    let spans = wait_for(
        "the apiserver's webhook spans",
        Duration::from_secs(60),
        || {
            let spans = crate::traces::spans(&spans_path);
            let found: usize = phases
                .values()
                .flatten()
                .map(|p| {
                    span_durations(&spans, p.window, "Call mutating webhook").len()
                        + span_durations(&spans, p.window, "Call validating webhook").len()
                })
                .sum();
            (found >= expected_spans).then_some(spans)
        },
    );
    report(&phases, &spans);
}

fn report(phases: &BTreeMap<(&str, usize), Vec<Phase>>, spans: &[Value]) {
    println!(
        "\napiserver-side benchmark: kube-apiserver {}, every request traced; per webhook and \
         number of clients, over both rounds; ms",
        crate::cluster::KUBERNETES_VERSION
    );
    println!(
        "| webhook | clients | creates | mutating: mean, p50/p99 (histogram) | mutating: p50/p99 (spans) \
         | validating: mean, p50/p99 (histogram) | validating: p50/p99 (spans) | CREATE p50/p99 (client) \
         | POST mean (apiserver) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.2}", v * 1000.0));
    for ((who, clients), runs) in phases {
        let mut latencies: Vec<f64> = runs.iter().flat_map(|p| p.latencies_ms.clone()).collect();
        latencies.sort_by(f64::total_cmp);
        let mut cells = Vec::new();
        for (name, span) in [
            (MUTATE_NAME, "Call mutating webhook"),
            (VALIDATE_NAME, "Call validating webhook"),
        ] {
            let (mut buckets, mut sum, mut count) = (BTreeMap::<u64, (f64, f64)>::new(), 0.0, 0.0);
            for p in runs {
                let (b, s, c) = histogram(
                    &p.before,
                    &p.after,
                    "apiserver_admission_webhook_admission_duration_seconds",
                    &[&format!("name=\"{name}\""), "operation=\"CREATE\""],
                );
                for (le, v) in b {
                    buckets.entry(le.to_bits()).or_insert((le, 0.0)).1 += v;
                }
                (sum, count) = (sum + s, count + c);
            }
            let mut b: Vec<(f64, f64)> = buckets.into_values().collect();
            b.sort_by(|x, y| x.0.total_cmp(&y.0));
            cells.push(format!(
                "{}, {}/{}",
                ms((count > 0.0).then(|| sum / count)),
                ms(histogram_quantile(0.5, &b)),
                ms(histogram_quantile(0.99, &b))
            ));
            let mut d: Vec<f64> = runs
                .iter()
                .flat_map(|p| span_durations(spans, p.window, span))
                .collect();
            d.sort_by(f64::total_cmp);
            cells.push(if d.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.2}/{:.2}", quantile(&d, 0.5), quantile(&d, 0.99))
            });
        }
        let (mut post_sum, mut post_count) = (0.0, 0.0);
        for p in runs {
            let (_, s, c) = histogram(
                &p.before,
                &p.after,
                "apiserver_request_duration_seconds",
                &["verb=\"POST\"", "resource=\"etcdclusters\""],
            );
            (post_sum, post_count) = (post_sum + s, post_count + c);
        }
        println!(
            "| {who} | {clients} | {} | {} | {:.2}/{:.2} | {} |",
            latencies.len(),
            cells.join(" | "),
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
            ms((post_count > 0.0).then(|| post_sum / post_count)),
        );
    }
    println!(
        "(the histogram's mean is exact (_sum/_count); its p50/p99 are histogram_quantile's \
         interpolation in buckets whose first bound is 5 ms; the spans are the apiserver's own \
         timing of each call)"
    );
}
