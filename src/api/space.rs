//! A member's space: the backend quota (set, or derived from the volume), the WAL's budget,
//! compaction and defragmentation settings, and the pace a defragmentation is counted on.

use super::StorageSize;
use super::v1;

/// The pace the loop counts on for a defragmentation (etcd copies the data in use into a new
/// file): well under the slowest measured (benches/defrag.py, docs/benchmarks.md: 77 to 175
/// MiB/s here). It sizes the defragmentation's call timeout, the hold of every other
/// maintenance while one may still run, and the members' liveness probes, which a
/// defragmentation blocks for its whole length on v3.6.
pub const DEFRAG_BYTES_PER_SECOND: u64 = 32 << 20;
/// The call timeout every defragmentation gets on top of its size.
pub const DEFRAG_BASE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a defragmentation of `bytes` in use may take: [`DEFRAG_BASE`] plus the bytes at
/// [`DEFRAG_BYTES_PER_SECOND`].
pub fn defrag_time(bytes: u64) -> std::time::Duration {
    DEFRAG_BASE + std::time::Duration::from_secs(bytes.div_ceil(DEFRAG_BYTES_PER_SECOND))
}

/// The smallest backend quota `spec.maintenance.quotaBackendBytes` may set (16 MiB).
pub const QUOTA_MIN_BYTES: i64 = 16 << 20;
/// The largest backend quota, set or derived: etcd's recommended maximum (8 GiB).
pub const QUOTA_MAX_BYTES: i64 = 8 << 30;
/// etcd's WAL segment size: the unit of a member's WAL budget.
pub const WAL_SEGMENT_BYTES: i64 = 64 << 20;
/// `--max-wals`, rendered on every release (etcd's default, said explicitly so the budget
/// below holds whatever a release's default becomes).
pub const MAX_WALS: i64 = 5;
/// `--max-snapshots` and `--snapshot-count` on 3.5 (3.6's defaults, where the flags are
/// deprecated; 3.5 kept 100,000 entries between snapshots): how many entries the WAL holds
/// before a snapshot lets older segments go.
pub const MAX_SNAPSHOTS: i64 = 5;
pub const SNAPSHOT_COUNT: i64 = 10_000;
/// The room a member's volume keeps for the WAL: the segments kept plus the one written.
pub const WAL_BUDGET_BYTES: i64 = (MAX_WALS + 1) * WAL_SEGMENT_BYTES;
/// History kept by auto compaction when `autoCompactionRetention` is unset.
pub const AUTO_COMPACTION_RETENTION: &str = "1h";
/// `defragThresholdPercent` when unset.
pub const DEFRAG_THRESHOLD_PERCENT: i32 = 50;
/// The least space a defragmentation must give back to be worth blocking a member for.
pub const DEFRAG_MIN_FREE_BYTES: i64 = 1 << 20;

/// The most a member's backend may hold: `quotaBackendBytes`, or [`quota_of_volume`].
pub fn quota_backend_bytes(spec: &v1::EtcdClusterSpec) -> i64 {
    if let Some(q) = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.quota_backend_bytes)
    {
        return q;
    }
    quota_of_volume(&spec.storage_size)
}

/// The largest quota a volume of `storage_size` (whole GiB) holds safely: half of what the
/// WAL budget leaves, so the copy a defragmentation writes beside the database fits too
/// (without it, NOSPACE on a database of live data can never be recovered), at most 8 GiB
/// and at least 16 MiB, rounded down to the MiB. 1Gi: 320 MiB, 2Gi: 832 MiB, 10Gi: 4.8 GiB.
pub fn quota_of_volume(storage_size: &str) -> i64 {
    let volume = storage_size
        .parse::<StorageSize>()
        .map(|s| s.gib().saturating_mul(1 << 30))
        .unwrap_or(i64::MAX);
    let half = volume.saturating_sub(WAL_BUDGET_BYTES) / 2;
    (half & !((1 << 20) - 1)).clamp(QUOTA_MIN_BYTES, QUOTA_MAX_BYTES)
}
