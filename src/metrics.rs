//! Prometheus metrics, served on the health port's `/metrics` (OpenMetrics text).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::tls::CertInfo;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub serial: String,
    pub subject: String,
}

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    pub cert_not_after: Gauge,
    pub cert_info: Family<CertLabels, Gauge>,
    pub cert_reloads: Family<ResultLabel, Counter>,
    pub cert_last_reload: Gauge,
    pub cert_files_rejected: Gauge,
    pub client_ca_reloads: Family<ResultLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("etcd_webhook");
        let m = Metrics {
            cert_not_after: Gauge::default(),
            cert_info: Family::default(),
            cert_reloads: Family::default(),
            cert_last_reload: Gauge::default(),
            cert_files_rejected: Gauge::default(),
            client_ca_reloads: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "cert_not_after_timestamp_seconds",
            "notAfter of the serving certificate, Unix seconds",
            m.cert_not_after.clone(),
        );
        registry.register(
            "cert_info",
            "The serving certificate (value 1), by serial and subject",
            m.cert_info.clone(),
        );
        registry.register(
            "cert_reloads",
            "Serving certificate loads, by result (success, failure)",
            m.cert_reloads.clone(),
        );
        registry.register(
            "cert_last_reload_success_timestamp_seconds",
            "When a serving certificate was last loaded, Unix seconds",
            m.cert_last_reload.clone(),
        );
        registry.register(
            "cert_files_rejected",
            "1 while the files on disk are rejected and the previous certificate keeps serving",
            m.cert_files_rejected.clone(),
        );
        registry.register(
            "client_ca_reloads",
            "Client CA bundle loads (--client-ca), by result (success, failure)",
            m.client_ca_reloads.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Records a newly served certificate.
    pub fn cert_loaded(&self, info: &CertInfo, now: i64) {
        self.cert_not_after.set(info.not_after);
        self.cert_info.clear();
        self.cert_info
            .get_or_create(&CertLabels {
                serial: info.serial.clone(),
                subject: info.subject.clone(),
            })
            .set(1);
        self.cert_reloads
            .get_or_create(&ResultLabel { result: "success" })
            .inc();
        self.cert_last_reload.set(now);
        self.cert_files_rejected.set(0);
    }

    pub fn cert_rejected(&self) {
        self.cert_reloads
            .get_or_create(&ResultLabel { result: "failure" })
            .inc();
        self.cert_files_rejected.set(1);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
