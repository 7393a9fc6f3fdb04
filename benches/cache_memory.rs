//! The loop's memory per cluster, by kind: the heap its reflector caches hold for N clusters,
//! counted by a counting allocator (live bytes asked of the allocator; the allocator's own
//! overhead and fragmentation are what the e2e scale run's RSS adds on top).
//!
//! The objects are one size-1 cluster's as the real kube-apiserver of the e2e suite returned
//! them at phase Creating (`benches/fixtures/one-cluster.json`: the EtcdCluster, its
//! StatefulSet, two Services, budget, ConfigMap, one pod and its claim, managedFields
//! included), copied N times under new names and uids, and cached two ways: as the apiserver
//! sent them, typed (the loop before issue 30), and as the loop's watches cache them now
//! (`controller::Cached`: typed metadata without managedFields, the rest compact JSON).
//!
//! `cargo bench --bench cache_memory` (N = 1,000; `CACHE_MEMORY_CLUSTERS` sets N).

use std::time::{Duration, Instant};

use etcd_webhook::api::v1::EtcdCluster;
use etcd_webhook::controller::{Cached, Child, slim_meta};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;
use serde_json::Value;

#[path = "support/counting.rs"]
mod counting;
use counting::live;

/// The fixture's objects of `kind`, as the apiserver sent them.
fn objects(all: &[Value], kind: &str) -> Vec<Value> {
    all.iter().filter(|o| o["kind"] == kind).cloned().collect()
}

/// Copy `i` of an object: its own name and uid, as another cluster's would be.
fn copy(o: &Value, i: usize) -> Value {
    let mut o = o.clone();
    let name = format!("{}-{i:05}", o["metadata"]["name"].as_str().unwrap_or("x"));
    o["metadata"]["name"] = Value::String(name);
    o["metadata"]["uid"] = Value::String(format!("00000000-0000-4000-8000-{i:012}"));
    o
}

/// What caching `n` copies of `objects` in a reflector cache of `K` costs, per cluster.
struct Cost {
    /// Heap bytes held.
    bytes: f64,
    /// Time to read the objects off the wire (JSON text) into the cache's form.
    cache_us: f64,
    /// Time for a pass to read them back as typed objects.
    read_us: f64,
}

/// [`Cost`] of `n` copies of `objects` in a cache of `K` (deserialized from the wire, then
/// made ready by `prepare`; read back by `read`).
fn cached<K>(objects: &[Value], n: usize, prepare: fn(&mut K), read: fn(&K)) -> Cost
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let mut writer: Writer<K> = Default::default();
    let reader = writer.as_reader();
    let wires: Vec<String> = (0..n)
        .flat_map(|i| objects.iter().map(move |o| copy(o, i)))
        .map(|o| serde_json::to_string(&o).expect("JSON"))
        .collect();
    let before = live();
    let mut caching = Duration::ZERO;
    for wire in &wires {
        let started = Instant::now();
        let mut obj: K = serde_json::from_str(wire).expect("the fixture deserializes");
        prepare(&mut obj);
        caching += started.elapsed();
        writer.apply_watcher_event(&Event::Apply(obj));
    }
    let bytes = live() - before;
    let state = reader.state();
    assert_eq!(state.len(), n * objects.len(), "every copy is cached");
    let started = Instant::now();
    for o in &state {
        read(o);
    }
    let reading = started.elapsed();
    drop((state, reader, writer));
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Cost {
        bytes: bytes as f64 / n as f64,
        cache_us: per(caching),
        read_us: per(reading),
    }
}

/// A typed cache's objects are read as they are.
fn shared<K>(o: &K) {
    std::hint::black_box(o);
}

/// A compact cache's objects are decoded.
fn decoded<K: Child>(o: &Cached<K>) {
    std::hint::black_box(o.object().expect("decodes"));
}

fn nothing<K>(_: &mut K) {}

fn main() {
    // `cargo bench` passes `--bench` (N = 1,000); `cargo test` runs this too (a debug build,
    // N = 200), and the bounds at the end hold either way: the heap a type takes does not
    // depend on the profile.
    let benching = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("CACHE_MEMORY_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 1000 } else { 200 });
    let fixture: Value = serde_json::from_str(include_str!("fixtures/one-cluster.json"))
        .expect("the fixture is JSON");
    let all = fixture["items"].as_array().expect("a List").clone();
    let _ = reflector::store::<Pod>(); // warm any lazy statics before counting
    let wire = |kind: &str| -> usize {
        objects(&all, kind)
            .iter()
            .map(|o| serde_json::to_vec(o).map(|v| v.len()).unwrap_or(0))
            .sum()
    };

    fn row<K: Child>(all: &[Value], kind: &str, n: usize) -> (Cost, Cost) {
        let objs = objects(all, kind);
        (
            cached::<K>(&objs, n, nothing, shared),
            cached::<Cached<K>>(&objs, n, nothing, decoded),
        )
    }
    let mut rows: Vec<(&str, usize, Cost, Cost)> = Vec::new();
    let ec = objects(&all, "EtcdCluster");
    // The clusters' own cache stays typed (the controller hands its objects to each pass).
    rows.push((
        "EtcdCluster",
        wire("EtcdCluster"),
        cached::<EtcdCluster>(&ec, n, nothing, shared),
        cached::<EtcdCluster>(&ec, n, |ec| slim_meta(&mut ec.metadata), shared),
    ));
    for (kind, (sent, kept)) in [
        ("StatefulSet", row::<StatefulSet>(&all, "StatefulSet", n)),
        ("Service (2)", row::<Service>(&all, "Service", n)),
        (
            "PodDisruptionBudget",
            row::<PodDisruptionBudget>(&all, "PodDisruptionBudget", n),
        ),
        ("ConfigMap", row::<ConfigMap>(&all, "ConfigMap", n)),
        ("Pod", row::<Pod>(&all, "Pod", n)),
        (
            "PersistentVolumeClaim",
            row::<PersistentVolumeClaim>(&all, "PersistentVolumeClaim", n),
        ),
    ] {
        let wire_kind = kind.split(' ').next().unwrap_or(kind);
        rows.push((kind, wire(wire_kind), sent, kept));
    }

    println!(
        "the loop's caches per cluster, N = {n} (size-1 clusters at phase Creating): heap held, \
         time to cache off the wire, time to read back typed"
    );
    println!(
        "{:<22} {:>6} | {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8}",
        "kind", "JSON B", "sent KiB", "cache us", "read us", "kept KiB", "cache us", "read us"
    );
    let line = |kind: &str, w: usize, s: &Cost, k: &Cost| {
        println!(
            "{kind:<22} {w:>6} | {:>9.1} {:>9.1} {:>8.1} | {:>9.1} {:>9.1} {:>8.1}",
            s.bytes / 1024.0,
            s.cache_us,
            s.read_us,
            k.bytes / 1024.0,
            k.cache_us,
            k.read_us
        )
    };
    let zero = || Cost {
        bytes: 0.0,
        cache_us: 0.0,
        read_us: 0.0,
    };
    let (mut json, mut sent, mut kept) = (0, zero(), zero());
    for (kind, w, s, k) in &rows {
        line(kind, *w, s, k);
        json += w;
        for (total, c) in [(&mut sent, s), (&mut kept, k)] {
            total.bytes += c.bytes;
            total.cache_us += c.cache_us;
            total.read_us += c.read_us;
        }
    }
    line("all", json, &sent, &kept);
    // docs/benchmarks.md's figures, held: 20.2 KiB per cluster kept (0.15x of the 135.0 KiB
    // the typed objects as sent take). A cache that keeps managedFields, a pod spec or a typed
    // StatefulSet again fails here.
    let kept_kib = kept.bytes / 1024.0;
    let sent_kib = sent.bytes / 1024.0;
    println!("per cluster: kept {kept_kib:.1} KiB, sent {sent_kib:.1} KiB");
    assert!(
        kept_kib <= 26.0,
        "the caches keep {kept_kib:.1} KiB per cluster (docs/benchmarks.md: 20.2)"
    );
    assert!(
        kept_kib <= 0.25 * sent_kib,
        "the caches keep {kept_kib:.1} of the {sent_kib:.1} KiB the objects take as sent"
    );
}
