//! A snapshot proven by restoring it: the verification Job. Its pod fetches the snapshot
//! (etcd's integrity hash and the SHA-256 the backup recorded, checked), restores it with the
//! cluster's own etcdutl into a scratch folder, starts a lone etcd on it as a sidecar on the
//! pod's loopback (never reachable from outside the pod, never a member of anything), and
//! `verify-snapshot` compares the keys and their hash at the snapshot's revision with what the
//! backup recorded on the member. The sidecar is stopped when that ends.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::restore::fetch_step;
use super::*;
use crate::api::SnapshotSource;
use crate::api::v1::SnapshotRecord;

/// The outcomes of a verification (`status.backup.lastVerified.outcome`).
pub const VERIFY_OK: &str = "Verified";
pub const VERIFY_FAILED: &str = "Failed";
pub const VERIFY_INCONCLUSIVE: &str = "Inconclusive";

/// The label value (`app.kubernetes.io/component`) of verification Jobs and their pods.
pub const VERIFY_COMPONENT: &str = "verify";

/// What `verify-snapshot` reports (its termination message).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifyReport {
    /// [`VERIFY_OK`], [`VERIFY_FAILED`] or [`VERIFY_INCONCLUSIVE`].
    pub outcome: String,
    pub message: String,
    pub revision: u64,
    /// What the restored etcd has at `revision`.
    pub keys: u64,
    pub hash: u64,
}

/// The sandbox's loopback URLs: the restored etcd's clients and its own peer URL.
const SANDBOX_CLIENT: &str = "http://127.0.0.1:2379";
const SANDBOX_PEER: &str = "http://127.0.0.1:2380";
const SANDBOX_DIR: &str = "/verify";

/// The verification Job of snapshot `record` is named after its SHA-256, so each snapshot is
/// verified once, whatever passes see it.
pub fn verify_job_name(ec: &EtcdCluster, record: &SnapshotRecord) -> String {
    let short: String = record.sha256.chars().take(10).collect();
    format!("{}-verify-{short}", ec.name_any())
}

/// The verification Job of `record`, or `None` when the backup recorded no hash to compare
/// with (a report of a release before it did) or its URI is not one a Job can read.
pub fn verify_job(ec: &EtcdCluster, record: &SnapshotRecord, opts: &RenderOptions) -> Option<Job> {
    let hash = u64::try_from(record.hash?).ok()?;
    let compact_revision = record.compact_revision?;
    let source = SnapshotSource::parse(&record.uri).ok()?;
    let snapshot = format!("{SANDBOX_DIR}/snapshot.db");
    let data_dir = format!("{SANDBOX_DIR}/data");
    let scratch = VolumeMount {
        name: "sandbox".to_owned(),
        mount_path: SANDBOX_DIR.to_owned(),
        ..Default::default()
    };
    let (fetch, source_volume) = fetch_step(
        ec,
        source,
        &snapshot,
        Some(&record.sha256),
        vec![scratch.clone()],
        None,
        opts,
    );
    let initial_cluster = format!("--initial-cluster=sandbox={SANDBOX_PEER}");
    let restore = Container {
        name: "restore".to_owned(),
        image: Some(members::etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcdutl".to_owned()]),
        args: Some(vec![
            "snapshot".to_owned(),
            "restore".to_owned(),
            snapshot,
            "--name=sandbox".to_owned(),
            initial_cluster.clone(),
            format!("--initial-advertise-peer-urls={SANDBOX_PEER}"),
            format!("--data-dir={data_dir}"),
        ]),
        volume_mounts: Some(vec![scratch.clone()]),
        security_context: Some(restricted_container()),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    };
    // A native sidecar: started after the restore, kept running while `verify` asks it,
    // stopped by the kubelet when `verify` ends.
    let sandbox = Container {
        name: "etcd".to_owned(),
        image: Some(members::etcd_image(ec, opts)),
        command: Some(vec!["/usr/local/bin/etcd".to_owned()]),
        args: Some(vec![
            "--name=sandbox".to_owned(),
            format!("--data-dir={data_dir}"),
            format!("--listen-client-urls={SANDBOX_CLIENT}"),
            format!("--advertise-client-urls={SANDBOX_CLIENT}"),
            format!("--listen-peer-urls={SANDBOX_PEER}"),
            format!("--initial-advertise-peer-urls={SANDBOX_PEER}"),
            initial_cluster,
            // The restored database may be as large as the cluster's quota allows.
            format!("{QUOTA_FLAG}{}", crate::api::quota_backend_bytes(&ec.spec)),
            "--log-level=warn".to_owned(),
        ]),
        restart_policy: Some("Always".to_owned()),
        volume_mounts: Some(vec![scratch.clone()]),
        security_context: Some(restricted_container()),
        ..Default::default()
    };
    let mut verify_args = vec![
        "verify-snapshot".to_owned(),
        format!("--endpoint={SANDBOX_CLIENT}"),
        format!("--revision={}", record.revision),
        format!("--hash={hash}"),
        format!("--compact-revision={compact_revision}"),
        "--report=/dev/termination-log".to_owned(),
    ];
    if let Some(keys) = record.keys {
        verify_args.push(format!("--keys={keys}"));
    }
    let verify = own_container("verify", verify_args, opts);
    // The snapshot, the restored copy of it and etcd's first preallocated WAL file.
    let room_mib = (u64::try_from(record.size).unwrap_or(0) * 2).div_ceil(1 << 20) + 256;
    let name = verify_job_name(ec, record);
    Some(Job {
        metadata: meta(ec, name, VERIFY_COMPONENT),
        spec: Some(JobSpec {
            // One attempt a snapshot: a failure is reported as it is (the next snapshot is
            // verified anew), never hidden behind a retry that passed.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(3600),
            ttl_seconds_after_finished: Some(86400),
            template: PodTemplateSpec {
                metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    labels: Some(labels(ec, VERIFY_COMPONENT)),
                    ..Default::default()
                }),
                spec: Some(job_pod(
                    vec![fetch, restore, sandbox],
                    vec![verify],
                    [Volume {
                        name: "sandbox".to_owned(),
                        empty_dir: Some(EmptyDirVolumeSource {
                            size_limit: Some(Quantity(format!("{room_mib}Mi"))),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]
                    .into_iter()
                    .chain(source_volume)
                    .collect(),
                    opts,
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uri: &str) -> SnapshotRecord {
        SnapshotRecord {
            time: "2026-12-05T14:00:00Z".to_owned(),
            uri: uri.to_owned(),
            size: 3 << 20,
            sha256: "0123456789abcdef".repeat(4),
            revision: 812,
            keys: Some(200),
            hash: Some(0x3c1f_9e01),
            compact_revision: Some(-1),
            member: "etcd-2".to_owned(),
        }
    }

    fn args(c: &Container) -> Vec<String> {
        c.args.clone().unwrap()
    }

    /// fetch (the recorded SHA-256), etcdutl restore, the lone etcd as a native sidecar on the
    /// loopback, then verify-snapshot with what the backup recorded.
    #[test]
    fn the_verification_job_restores_into_a_sandbox_and_compares() {
        let ec = super::super::tests::cluster("etcd", 3, None);
        let rec = record("s3://backups/prod/etcd-6a3c1f9e-snapshot-20261205T140000Z.db");
        let job = verify_job(&ec, &rec, &RenderOptions::default()).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("etcd-verify-0123456789"));
        let pod = job.spec.unwrap().template.spec.unwrap();
        let init = pod.init_containers.unwrap();
        let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["fetch", "restore", "etcd"]);
        assert!(args(&init[0]).contains(&format!("--sha256={}", rec.sha256)));
        assert!(args(&init[0]).contains(&format!("--from={}", rec.uri)));
        assert_eq!(
            init[2].restart_policy.as_deref(),
            Some("Always"),
            "a native sidecar"
        );
        assert!(
            args(&init[2])
                .iter()
                .filter(|a| a.contains("://"))
                .all(|a| a.contains("127.0.0.1")),
            "loopback only: {:?}",
            args(&init[2])
        );
        assert!(
            !args(&init[1]).iter().any(|a| a.contains("bump-revision")),
            "the revision kept"
        );
        let verify = args(&pod.containers[0]);
        for want in [
            "verify-snapshot",
            "--revision=812",
            "--keys=200",
            "--hash=1008705025",
            "--compact-revision=-1",
        ] {
            assert!(verify.contains(&want.to_owned()), "{want}: {verify:?}");
        }
        let room = pod.volumes.unwrap()[0]
            .empty_dir
            .clone()
            .unwrap()
            .size_limit;
        assert_eq!(room, Some(Quantity("262Mi".to_owned())));
    }

    /// A snapshot on the backup claim is read from the claim, mounted read-only.
    #[test]
    fn a_claim_snapshot_is_read_from_the_claim_and_an_unhashed_one_is_not_verified() {
        let ec = super::super::tests::cluster("etcd", 3, None);
        let rec = record("pvc://etcd-backup/etcd-6a3c1f9e-snapshot-20261205T140000Z.db");
        let job = verify_job(&ec, &rec, &RenderOptions::default()).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let claim = pod.volumes.unwrap()[1]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("etcd-backup", Some(true))
        );
        let old = SnapshotRecord {
            hash: None,
            ..record("s3://b/k.db")
        };
        assert!(verify_job(&ec, &old, &RenderOptions::default()).is_none());
    }
}
