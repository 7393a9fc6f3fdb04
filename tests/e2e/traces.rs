//! Issue 31, tracing: the real kube-apiserver with its tracing on (every request sampled) and the
//! webhook replica started with `--otlp-endpoint`, both sending to one OTLP receiver
//! (`controlplane otlp`, tests/controlplane/otlp.go). One `kubectl apply` of an EtcdCluster is one
//! trace: the apiserver's spans from its root (kube-apiserver 1.34 starts a request's trace with
//! an `authentication` span, the `POST` server span under it), and the webhook's `/mutate` and
//! `/validate` spans under the apiserver's client calls to them, connected by the `traceparent`
//! the apiserver sends. (The loop's own write of the finalizer is another trace, with the
//! webhooks in it too; it is not the apply's.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::ControlPlane;
use crate::install::{Env, ok};

const NS: &str = "e2e-trace";
const WEBHOOK: &str = "etcd-webhook";

/// Every span the receiver wrote to `path` so far.
pub fn spans(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn str_of<'a>(span: &'a Value, key: &str) -> &'a str {
    span[key].as_str().unwrap_or_default()
}

/// The apiserver's server span of a create (`kubectl apply` of a new object) in `NS`.
fn is_the_create(s: &Value) -> bool {
    str_of(s, "service") != WEBHOOK
        && str_of(s, "kind") == "SPAN_KIND_SERVER"
        && str_of(s, "name").starts_with("POST /apis/etcd.example.com/")
        && s["attributes"]["http.target"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("/namespaces/{NS}/etcdclusters")))
}

/// The traces holding the create's server span and a webhook span, by trace ID.
fn apply_traces(all: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut by_trace: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for s in all {
        by_trace
            .entry(str_of(s, "traceId").to_owned())
            .or_default()
            .push(s.clone());
    }
    by_trace.retain(|_, spans| {
        spans.iter().any(|s| str_of(s, "service") == WEBHOOK) && spans.iter().any(is_the_create)
    });
    by_trace
}

pub fn one_apply_is_one_trace_through_the_webhook(cp: ControlPlane) {
    let otlp = cp.otlp.as_ref().expect("a traced control plane");
    let (url, path) = (otlp.http_url.clone(), otlp.spans.clone());
    let env = Env::install_with(cp, &[&format!("--otlp-endpoint={url}")]);
    env.create_namespace(NS);
    let cluster = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "traced", "namespace": NS},
        "spec": {"size": 1, "version": "v3.6.4", "storageSize": "1Gi"}
    });
    let applied = Instant::now();
    ok(
        env.kubectl_in(&["apply", "-f", "-"], &cluster.to_string()),
        "kubectl apply an EtcdCluster",
    );
    // Both sides send in batches (every 5 s by default): wait, bounded, for the trace.
    let deadline = Instant::now() + Duration::from_secs(60);
    let traces = loop {
        let traces = apply_traces(&spans(&path));
        let complete = traces.values().any(|t| {
            let names: BTreeSet<&str> = t
                .iter()
                .filter(|s| str_of(s, "service") == WEBHOOK)
                .map(|s| str_of(s, "name"))
                .collect();
            names.contains("POST /mutate") && names.contains("POST /validate")
        });
        if complete {
            break traces;
        }
        assert!(
            Instant::now() < deadline,
            "no trace of the apply with both webhook spans within 60 s; spans received: {}",
            spans(&path).len()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let waited = applied.elapsed();
    assert_eq!(
        traces.len(),
        1,
        "the apply is one trace with webhook spans: {:?}",
        traces.keys().collect::<Vec<_>>()
    );
    let (trace_id, trace) = traces.into_iter().next().unwrap();
    let by_id: BTreeMap<&str, &Value> = trace.iter().map(|s| (str_of(s, "spanId"), s)).collect();
    let roots: Vec<&Value> = trace
        .iter()
        .filter(|s| str_of(s, "parentSpanId").is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root in trace {trace_id}: {trace:#?}");
    let root = roots[0];
    assert_ne!(
        str_of(root, "service"),
        WEBHOOK,
        "the apiserver's span is the root: {root}"
    );
    let create = trace.iter().find(|s| is_the_create(s)).unwrap();
    // Every span reaches the root through spans of the trace: nothing hangs loose.
    for s in &trace {
        let mut at: &Value = s;
        for _ in 0..trace.len() {
            match by_id.get(str_of(at, "parentSpanId")) {
                Some(parent) => at = *parent,
                None => break,
            }
        }
        assert_eq!(
            str_of(at, "spanId"),
            str_of(root, "spanId"),
            "span {} does not reach the root: {trace:#?}",
            str_of(s, "name")
        );
    }
    // The webhook's spans are servers, each under an apiserver span (its call to the webhook).
    let webhook: Vec<&Value> = trace
        .iter()
        .filter(|s| str_of(s, "service") == WEBHOOK)
        .collect();
    for s in &webhook {
        assert_eq!(str_of(s, "kind"), "SPAN_KIND_SERVER", "{s}");
        let parent = by_id
            .get(str_of(s, "parentSpanId"))
            .unwrap_or_else(|| panic!("the webhook span's parent is in the trace: {s}"));
        assert_ne!(str_of(parent, "service"), WEBHOOK, "{parent}");
        assert_eq!(
            str_of(parent, "kind"),
            "SPAN_KIND_CLIENT",
            "the apiserver's call: {parent}"
        );
        assert_eq!(s["attributes"]["http.response.status_code"], "200", "{s}");
        assert_eq!(s["attributes"]["admission.result"], "allowed", "{s}");
        // Inside the apiserver's request, in time.
        let (start, end) = (
            s["startTimeUnixNano"].as_u64(),
            s["endTimeUnixNano"].as_u64(),
        );
        assert!(
            start >= create["startTimeUnixNano"].as_u64()
                && end <= create["endTimeUnixNano"].as_u64(),
            "{s} within {create}"
        );
    }
    let services: BTreeSet<&str> = trace.iter().map(|s| str_of(s, "service")).collect();
    let ms = |s: &Value| {
        (s["endTimeUnixNano"].as_u64().unwrap() - s["startTimeUnixNano"].as_u64().unwrap()) as f64
            / 1e6
    };
    eprintln!(
        "    one trace ({} spans from {services:?}), complete {:.1} s after the apply: {} {:.1} ms; {}",
        trace.len(),
        waited.as_secs_f64(),
        str_of(create, "name"),
        ms(create),
        webhook
            .iter()
            .map(|s| format!("{} {:.2} ms", str_of(s, "name"), ms(s)))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
