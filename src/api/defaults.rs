//! Every default value of every EtcdCluster version, in one place.
//!
//! The serde `default` attributes of the three API versions point here, so the same values end
//! up in the generated CRD schema (`default:`) and in what `/mutate` fills in.

/// etcd release used when `spec.version` is missing (v1, v1beta1): the newest release the
/// tests run (`api::etcd_version::RELEASES`; a unit test holds the two equal).
pub const VERSION: &str = "v3.7.4";
/// Volume size used when none is given.
pub const STORAGE_SIZE: &str = "10Gi";
/// The same size in whole GiB (v1alpha1 `storageSizeGi`).
pub const STORAGE_SIZE_GI: i64 = 10;
/// Backup schedule: every six hours.
pub const BACKUP_SCHEDULE: &str = "0 */6 * * *";
/// Snapshots kept when `backup.retention` is missing.
pub const BACKUP_RETENTION: i32 = 7;

pub fn version() -> String {
    VERSION.to_owned()
}

/// v1alpha1 spells versions without the leading `v`.
pub fn version_without_v() -> String {
    VERSION.trim_start_matches('v').to_owned()
}

pub fn storage_size() -> String {
    STORAGE_SIZE.to_owned()
}

pub fn storage_size_gi() -> i64 {
    STORAGE_SIZE_GI
}

pub fn backup_schedule() -> String {
    BACKUP_SCHEDULE.to_owned()
}

pub fn backup_retention() -> i32 {
    BACKUP_RETENTION
}
