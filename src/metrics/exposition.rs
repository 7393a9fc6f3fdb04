//! What the metrics expose: the series names, the per-cluster series dropped, the text.

use prometheus_client::metrics::MetricType;

use super::Metrics;

impl Metrics {
    /// The name of every series the exposition can hold, sample or not yet: a gauge's name, a
    /// counter's `_total`, a histogram's `_bucket`, `_sum` and `_count` (what PromQL reads).
    pub fn series_names(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for (name, kind) in &self.families {
            let suffixes: &[&str] = match kind {
                MetricType::Counter => &["_total"],
                MetricType::Histogram => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
        out
    }

    /// Drops every per-cluster series: a replica that stops leading no longer looks at the
    /// clusters, and what it last saw would otherwise stand beside the new leader's view (and
    /// keep an alert firing) for as long as it runs.
    pub fn forget_clusters(&self) {
        self.backup_last_success.clear();
        self.backup_last_verified.clear();
        self.backup_verification_failed.clear();
        self.backup_interval.clear();
        self.backup_scheduled_since.clear();
        self.leader_changes.clear();
        self.defragmentations.clear();
        self.defragmentation_freed_bytes.clear();
        self.defragmentation_seconds.clear();
        self.nospace_alarm.clear();
        self.member_client_cert_not_after.clear();
        self.cluster_members.clear();
        self.member_db_size.clear();
        self.member_db_size_in_use.clear();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
