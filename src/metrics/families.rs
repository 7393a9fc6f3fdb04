//! How a family is made and registered: the name prefix, the histograms' buckets.

use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets that resolve sub-millisecond answers: 50us .. 10s (the apiserver gives a
/// webhook call 5 s, the `timeoutSeconds` of both configurations, and the alert on p99 needs
/// buckets past it).
const LATENCY_BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

pub(super) fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

pub(super) fn size_histogram() -> Histogram {
    // 256 B .. 16 MiB
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        256.0, 4.0, 9,
    ))
}

pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub(super) const PREFIX: &str = "etcd_webhook";

/// Registers one family and notes its name and type (the exposition leaves a family out until
/// it has a sample, so [`Metrics::series_names`] cannot be read from it).
pub(super) fn register(
    registry: &mut Registry,
    families: &mut Vec<(String, MetricType)>,
    name: &str,
    help: &str,
    metric: impl prometheus_client::registry::Metric,
) {
    families.push((format!("{PREFIX}_{name}"), metric.metric_type()));
    registry.register(name, help, metric);
}
