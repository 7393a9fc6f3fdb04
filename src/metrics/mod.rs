//! Prometheus metrics, served on the health port's `/metrics` (OpenMetrics text).

use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod exposition;
mod families;
mod labels;
mod report;

pub use labels::*;

use families::{HistogramFamily, PREFIX, latency_histogram, register, size_histogram};

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    /// Every family registered: its exposition name and type.
    families: Vec<(String, MetricType)>,
    pub admission_requests: Family<AdmissionLabels, Counter>,
    pub request_duration: HistogramFamily<EndpointLabel>,
    pub requests_in_flight: Family<EndpointLabel, Gauge>,
    pub request_body_bytes: HistogramFamily<EndpointLabel>,
    pub conversion_requests: Family<ResultLabel, Counter>,
    pub converted_objects: Family<ConversionLabels, Counter>,
    pub http_errors: Family<StatusLabel, Counter>,
    pub tls_handshake_failures: Counter,
    pub panics: Counter,
    pub cert_not_after: Gauge,
    pub cert_info: Family<CertLabels, Gauge>,
    pub cert_reloads: Family<ResultLabel, Counter>,
    pub cert_last_reload: Gauge,
    pub cert_files_rejected: Gauge,
    pub cert_secret_watch_failing: Gauge,
    pub client_ca_reloads: Family<ResultLabel, Counter>,
    pub cabundle_mismatch: Family<ObjectLabel, Gauge>,
    pub reconciles: Family<ResultLabel, Counter>,
    pub reconcile_duration: Histogram,
    pub reconciles_waiting: Gauge,
    pub reconcile_wait: Histogram,
    pub reconciles_outside_turn: Gauge,
    pub leader: Gauge,
    pub finalizers_in_progress: Gauge,
    pub backup_last_success: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub backup_interval: Family<ClusterLabels, Gauge>,
    pub backup_scheduled_since: Family<ClusterLabels, Gauge>,
    pub backup_last_verified: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub backup_verification_failed: Family<ClusterLabels, Gauge>,
    pub leader_changes: Family<ClusterLabels, Counter>,
    pub defragmentations: Family<ClusterLabels, Counter>,
    pub defragmentation_freed_bytes: Family<ClusterLabels, Counter>,
    pub defragmentation_seconds: Family<ClusterLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    pub nospace_alarm: Family<ClusterLabels, Gauge>,
    pub member_client_cert_not_after: Family<ClusterLabels, Gauge>,
    pub cluster_members: Family<MemberStateLabels, Gauge>,
    pub member_db_size: Family<MemberLabels, Gauge>,
    pub member_db_size_in_use: Family<MemberLabels, Gauge>,
    pub kube_api_requests: Family<KubeRequestLabels, Counter>,
    pub kube_api_rate_limit_wait: Histogram,
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
        let mut registry = Registry::with_prefix(PREFIX);
        let mut families = Vec::new();
        let m = Metrics {
            admission_requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            requests_in_flight: Family::default(),
            request_body_bytes: Family::new_with_constructor(size_histogram),
            conversion_requests: Family::default(),
            converted_objects: Family::default(),
            http_errors: Family::default(),
            tls_handshake_failures: Counter::default(),
            panics: Counter::default(),
            cert_not_after: Gauge::default(),
            cert_info: Family::default(),
            cert_reloads: Family::default(),
            cert_last_reload: Gauge::default(),
            cert_files_rejected: Gauge::default(),
            cert_secret_watch_failing: Gauge::default(),
            client_ca_reloads: Family::default(),
            cabundle_mismatch: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: latency_histogram(),
            reconciles_waiting: Gauge::default(),
            // 1 ms .. 262 s: under overload a pass waits minutes.
            reconcile_wait: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 4.0, 10),
            ),
            reconciles_outside_turn: Gauge::default(),
            leader: Gauge::default(),
            finalizers_in_progress: Gauge::default(),
            backup_last_success: Family::default(),
            backup_last_verified: Family::default(),
            backup_verification_failed: Family::default(),
            backup_interval: Family::default(),
            backup_scheduled_since: Family::default(),
            leader_changes: Family::default(),
            defragmentations: Family::default(),
            defragmentation_freed_bytes: Family::default(),
            defragmentation_seconds: Family::default(),
            nospace_alarm: Family::default(),
            member_client_cert_not_after: Family::default(),
            cluster_members: Family::default(),
            member_db_size: Family::default(),
            member_db_size_in_use: Family::default(),
            kube_api_requests: Family::default(),
            // 1 ms .. 65 s
            kube_api_rate_limit_wait: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 4.0, 9),
            ),
            registry: Registry::default(),
            families: Vec::new(),
        };
        register(
            &mut registry,
            &mut families,
            "admission_requests",
            "Admission reviews answered, by endpoint, operation, object version and result (allowed, denied, error)",
            m.admission_requests.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "request_duration_seconds",
            "Time to answer a webhook request, by endpoint",
            m.request_duration.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "requests_in_flight",
            "Webhook requests being answered, by endpoint",
            m.requests_in_flight.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "request_body_bytes",
            "Size of webhook request bodies, by endpoint",
            m.request_body_bytes.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "conversion_requests",
            "ConversionReviews answered, by result (success, failure)",
            m.conversion_requests.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "converted_objects",
            "Objects converted, by source and target version",
            m.converted_objects.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "http_errors",
            "Webhook requests answered with an HTTP error, by status",
            m.http_errors.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            m.tls_handshake_failures.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "panics",
            "Panics caught while answering a request (answered 500; the server keeps serving)",
            m.panics.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_not_after_timestamp_seconds",
            "notAfter of the serving certificate, Unix seconds",
            m.cert_not_after.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_info",
            "The serving certificate (value 1), by serial and subject",
            m.cert_info.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_reloads",
            "Serving certificate loads, by result (success, failure)",
            m.cert_reloads.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_last_reload_success_timestamp_seconds",
            "When a serving certificate was last loaded, Unix seconds",
            m.cert_last_reload.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_files_rejected",
            "1 while the files on disk are rejected and the previous certificate keeps serving",
            m.cert_files_rejected.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cert_secret_watch_failing",
            "1 while the watch of the --cert-secret Secret fails (retried with backoff; the last certificate keeps serving)",
            m.cert_secret_watch_failing.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cabundle_mismatch",
            "1 while the served certificate does not verify against the object's caBundle for its Service name (the apiserver's calls fail), 0 when it does; by object",
            m.cabundle_mismatch.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "client_ca_reloads",
            "Client CA bundle loads (--client-ca), by result (success, failure)",
            m.client_ca_reloads.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_reconciles",
            "EtcdCluster reconciles, by result (success, error)",
            m.reconciles.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_reconcile_duration_seconds",
            "Time one EtcdCluster reconcile took",
            m.reconcile_duration.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_reconciles_waiting",
            "Passes that fell due and wait for one of the --max-concurrent-reconciles turns (served first come, first served)",
            m.reconciles_waiting.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_reconcile_wait_seconds",
            "How long a pass that fell due waited for its turn",
            m.reconcile_wait.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_reconciles_outside_turn",
            "Passes waiting on a long etcd call (a defragmentation, a physical compaction) without holding a turn",
            m.reconciles_outside_turn.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_leader",
            "1 while this replica holds the etcd-webhook-leader Lease and reconciles",
            m.leader.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "controller_finalizers_in_progress",
            "EtcdClusters being deleted whose finalizer is still waiting (alert when it stays up past --finalizer-timeout)",
            m.finalizers_in_progress.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "backup_last_success_timestamp_seconds",
            "When the newest snapshot filed for each EtcdCluster was taken (Unix seconds; from status.backup.last; removed when the cluster goes)",
            m.backup_last_success.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "backup_interval_seconds",
            "The longest time between two runs of each EtcdCluster's backup schedule (alert when the newest snapshot is older than twice this; removed when backups are turned off or the cluster goes)",
            m.backup_interval.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "backup_last_verified_timestamp_seconds",
            "When the newest verification of each EtcdCluster's snapshots that proved one by restoring it ended (status.backup.lastVerified, outcome Verified; Unix seconds; removed when the cluster goes)",
            m.backup_last_verified.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "backup_verification_failed",
            "1 while the newest verified snapshot of each EtcdCluster failed its verification (it did not restore, or its keys differ from what its backup recorded), else 0",
            m.backup_verification_failed.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "backup_scheduled_since_timestamp_seconds",
            "When each EtcdCluster's backup CronJob was created (Unix seconds): a cluster with no snapshot yet owes one from then",
            m.backup_scheduled_since.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cluster_leader_changes",
            "Leader changes of each EtcdCluster the loop saw: another member leading at one pass than at the one before (an election between two passes that keeps or returns to the same leader is not seen; etcd_server_leader_changes_seen_total on the members' metrics port counts every one)",
            m.leader_changes.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_defragmentations",
            "Defragmentations the loop made of an EtcdCluster's members (removed when the cluster goes)",
            m.defragmentations.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_defragmentation_freed_bytes",
            "Bytes the defragmentations gave back (database size before minus after)",
            m.defragmentation_freed_bytes.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_defragmentation_seconds",
            "Time the members were blocked by defragmentations, summed",
            m.defragmentation_seconds.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "nospace_alarm",
            "1 while a member of the EtcdCluster has etcd's NOSPACE alarm raised (writes refused)",
            m.nospace_alarm.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_client_cert_not_after_timestamp_seconds",
            "notAfter of the client certificate the loop reaches a TLS EtcdCluster's members with (its Secret NAME-client-tls, read at least every 5 minutes), Unix seconds",
            m.member_client_cert_not_after.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "cluster_members",
            "Members of each EtcdCluster by state as etcd last reported them: leader, follower, learner, or unhealthy (no answer, no leader, or an error)",
            m.cluster_members.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_db_size_bytes",
            "Each member's database on disk, as etcd last reported it",
            m.member_db_size.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "member_db_size_in_use_bytes",
            "The part of each member's database in use (the rest a defragmentation gives back)",
            m.member_db_size_in_use.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "kube_api_requests",
            "The reconcile loop's requests to the Kubernetes API by verb (WATCH for a watch) and answer code (error: none came); a 429 or 5xx with Retry-After is waited out and sent again, and counted each time",
            m.kube_api_requests.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "kube_api_rate_limit_wait_seconds",
            "How long each of the loop's requests waited for the client-side limit (--kube-api-qps, --kube-api-burst)",
            m.kube_api_rate_limit_wait.clone(),
        );
        Metrics {
            registry,
            families,
            ..m
        }
    }
}
