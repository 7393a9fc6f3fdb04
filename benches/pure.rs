//! Micro-benchmarks of the pure functions, so regressions show without the network:
//! default+diff, validate, convert (1 and 100 objects).

use criterion::{Criterion, criterion_group, criterion_main};
use etcd_webhook::admission::{defaults, validate};
use etcd_webhook::api::{Version, convert};
use serde_json::{Value, json};
use std::hint::black_box;

fn object(i: usize, version: Version) -> Value {
    let hub = json!({
        "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": format!("etcd-{i}"), "namespace": "default", "uid": "3415a7fc-162b-4300-b5da-fd6083580d66",
                     "resourceVersion": "143", "generation": 3, "labels": {"app": "etcd", "team": "platform"},
                     "creationTimestamp": "2026-09-04T14:03:02Z"},
        "spec": {"size": 3, "version": "v3.5.10", "storageClass": "ssd", "storageSize": "20Gi",
                 "backup": {"enabled": true, "schedule": "0 */6 * * *", "retention": 14, "destination": "s3://b/p"}},
        "status": {"phase": "Running", "readyReplicas": 3, "observedGeneration": 3,
                   "endpoints": ["http://etcd-0.etcd.default.svc:2379", "http://etcd-1.etcd.default.svc:2379", "http://etcd-2.etcd.default.svc:2379"]}
    });
    convert::convert_object(&hub, version).unwrap()
}

fn benches(c: &mut Criterion) {
    let minimal = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
        "metadata": {"name": "a", "namespace": "default"}, "spec": {"size": 3}});
    c.bench_function("defaults::patch (3 defaults)", |b| {
        b.iter(|| defaults::patch(black_box(&minimal), Version::V1))
    });
    let full = object(0, Version::V1);
    c.bench_function("defaults::patch (nothing missing)", |b| {
        b.iter(|| defaults::patch(black_box(&full), Version::V1))
    });
    let old = full.clone();
    c.bench_function("validate update (allowed)", |b| {
        b.iter(|| {
            validate::validate(
                Version::V1,
                validate::Operation::Update,
                black_box(&full),
                Some(black_box(&old)),
            )
        })
    });
    let bad = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster", "metadata": {"name": "a"},
        "spec": {"size": 4, "version": "v2.0.0", "storageClass": "gold", "storageSize": "0Gi"}});
    c.bench_function("validate create (4 violations)", |b| {
        b.iter(|| {
            validate::validate(
                Version::V1,
                validate::Operation::Create,
                black_box(&bad),
                None,
            )
        })
    });
    let alpha = object(0, Version::V1Alpha1);
    c.bench_function("convert 1 object v1alpha1 -> v1", |b| {
        b.iter(|| convert::convert_object(black_box(&alpha), Version::V1))
    });
    c.bench_function("convert 1 object v1 -> v1alpha1", |b| {
        b.iter(|| convert::convert_object(black_box(&full), Version::V1Alpha1))
    });
    let hundred: Vec<Value> = (0..100).map(|i| object(i, Version::ALL[i % 3])).collect();
    c.bench_function("convert 100 mixed objects -> v1", |b| {
        b.iter(|| {
            hundred
                .iter()
                .map(|o| convert::convert_object(o, Version::V1).unwrap())
                .collect::<Vec<_>>()
        })
    });
}

/// The whole decode-decide-encode path of one review, without HTTP and TLS.
fn handler_paths(c: &mut Criterion) {
    use etcd_webhook::admission::{self, Webhook};
    use etcd_webhook::webhook::{self, AdmissionReviewOut};
    let dir = std::env::var("BENCH_PAYLOADS").unwrap_or_else(|_| "target/bench-payloads".into());
    let Ok(review) = std::fs::read(format!("{dir}/admission-v1.json")) else {
        eprintln!("handler paths skipped: run `python3 benches/payloads.py` first");
        return;
    };
    let mutate_review = std::fs::read(format!("{dir}/admission-mutate.json")).unwrap();
    c.bench_function("parse AdmissionReview (2.8 KB)", |b| {
        b.iter(|| webhook::parse_admission(black_box(&review)).unwrap())
    });
    c.bench_function("/validate path (2.8 KB)", |b| {
        b.iter(|| {
            let req = webhook::parse_admission(black_box(&review)).unwrap();
            let rsp = admission::validate(&req, &Default::default());
            serde_json::to_vec(&AdmissionReviewOut::new(&rsp)).unwrap()
        })
    });
    c.bench_function("/mutate path (patch)", |b| {
        b.iter(|| {
            let req = webhook::parse_admission(black_box(&mutate_review)).unwrap();
            let rsp = admission::mutate(&req, &Default::default()).unwrap();
            serde_json::to_vec(&AdmissionReviewOut::new(&rsp)).unwrap()
        })
    });
    c.bench_function("serde_json::Value parse (2.8 KB, the floor)", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&review)).unwrap())
    });
    // The decision line as the server writes it (JSON, info), formatted into a sink: what one
    // line costs on the request thread.
    let req = webhook::parse_admission(&review).unwrap();
    let answer = admission::validate(&req, &Default::default());
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        c.bench_function("decision line (JSON, to a sink)", |b| {
            b.iter(|| {
                webhook::admit::log_decision(
                    Webhook::Validate,
                    black_box(&req),
                    &answer,
                    std::time::Instant::now(),
                )
            })
        });
    });
}

criterion_group!(pure, benches, handler_paths);
criterion_main!(pure);
