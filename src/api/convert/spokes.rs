//! The spokes: v1beta1 and v1alpha1 to and from the v1 hub, with what they cannot express
//! kept in the [`Stash`].

use super::{AlphaGaps, ConvertError, Hub, Stash};
use crate::api::{EtcdVersion, StorageSize, defaults, v1, v1alpha1, v1beta1};

/// The gaps worth keeping: only while there is a backup block they describe.
pub(super) fn kept_gaps(hub: &Hub) -> AlphaGaps {
    if hub.spec.backup.is_some() {
        hub.alpha_gaps
    } else {
        AlphaGaps::default()
    }
}

// === v1beta1 <-> v1 ===

pub(super) fn beta_down(
    hub: Hub,
) -> (
    v1beta1::EtcdClusterSpec,
    Option<v1beta1::EtcdClusterStatus>,
    Stash,
) {
    let mut stash = Stash {
        alpha_gaps: kept_gaps(&hub),
        ..Stash::default()
    };
    let v1::EtcdClusterSpec {
        size,
        version,
        storage_class,
        storage_size,
        backup,
        restore,
        maintenance,
        tls,
        recovery,
    } = hub.spec;
    stash.restore = restore;
    stash.maintenance = maintenance;
    stash.tls = tls;
    stash.recovery = recovery;
    let backup = backup.map(|b| {
        stash_backup_extras(&mut stash, b.retention, b.destination);
        v1beta1::Backup {
            enabled: b.enabled,
            schedule: b.schedule,
        }
    });
    let spec = v1beta1::EtcdClusterSpec {
        size,
        version,
        storage: v1beta1::Storage {
            class_name: storage_class,
            size: storage_size,
        },
        backup,
    };
    let status = hub.status.map(|s| {
        stash.observed_generation = s.observed_generation;
        stash.conditions = s.conditions;
        stash.backup_status = s.backup;
        stash.leader = s.leader;
        stash.members = s.members;
        v1beta1::EtcdClusterStatus {
            phase: s.phase,
            ready_replicas: s.ready_replicas,
            endpoints: s.endpoints,
        }
    });
    (spec, status, stash)
}

pub(super) fn beta_up(
    spec: v1beta1::EtcdClusterSpec,
    status: Option<v1beta1::EtcdClusterStatus>,
    stash: Stash,
) -> Hub {
    let backup = spec.backup.map(|b| v1::Backup {
        enabled: b.enabled,
        schedule: b.schedule,
        retention: stash.backup_retention.unwrap_or(defaults::BACKUP_RETENTION),
        destination: stash.backup_destination.clone(),
    });
    let status = status.map(|s| v1::EtcdClusterStatus {
        phase: s.phase,
        ready_replicas: s.ready_replicas,
        endpoints: s.endpoints,
        observed_generation: stash.observed_generation,
        conditions: stash.conditions.clone(),
        backup: stash.backup_status.clone(),
        leader: stash.leader.clone(),
        members: stash.members.clone(),
    });
    Hub {
        spec: v1::EtcdClusterSpec {
            size: spec.size,
            version: spec.version,
            storage_class: spec.storage.class_name,
            storage_size: spec.storage.size,
            backup,
            restore: stash.restore.clone(),
            maintenance: stash.maintenance.clone(),
            tls: stash.tls.clone(),
            recovery: stash.recovery.clone(),
        },
        status,
        alpha_gaps: stash.alpha_gaps,
    }
}

// === v1alpha1 <-> v1 ===

/// v1 `10Gi` is v1alpha1 `10`.
fn storage_down(v1: &str) -> Result<i64, ConvertError> {
    v1.parse::<StorageSize>()
        .map(StorageSize::gib)
        .map_err(|_| ConvertError::StorageSize(v1.to_owned()))
}

fn storage_up(gi: i64) -> String {
    StorageSize::from_gib(gi).to_string()
}

pub(super) fn alpha_down(
    hub: Hub,
) -> Result<
    (
        v1alpha1::EtcdClusterSpec,
        Option<v1alpha1::EtcdClusterStatus>,
        Stash,
    ),
    ConvertError,
> {
    let mut stash = Stash::default();
    let v1::EtcdClusterSpec {
        size,
        version,
        storage_class,
        storage_size,
        backup,
        restore,
        maintenance,
        tls,
        recovery,
    } = hub.spec;
    stash.restore = restore;
    stash.maintenance = maintenance;
    stash.tls = tls;
    stash.recovery = recovery;

    let etcd_version = EtcdVersion::alpha_spelling(&version);
    if EtcdVersion::from_alpha_spelling(&etcd_version) != version {
        stash.version = Some(version);
    }
    let storage_size_gi = storage_down(&storage_size)?;
    if storage_up(storage_size_gi) != storage_size {
        stash.storage_size = Some(storage_size);
    }
    // A field v1alpha1 left out stays out while v1 still holds the value it was filled in with;
    // an edit made since (in any version) shows.
    let gaps = hub.alpha_gaps;
    let (backup_enabled, backup_schedule) = match backup {
        Some(b) => {
            stash_backup_extras(&mut stash, b.retention, b.destination);
            let enabled = (!gaps.no_backup_enabled || b.enabled).then_some(b.enabled);
            let schedule_changed = b.schedule != defaults::backup_schedule();
            let schedule = (!gaps.no_backup_schedule || schedule_changed).then_some(b.schedule);
            (enabled, schedule)
        }
        None => (None, None),
    };
    let spec = v1alpha1::EtcdClusterSpec {
        replicas: size,
        etcd_version,
        storage_class_name: storage_class,
        storage_size_gi,
        backup_enabled,
        backup_schedule,
    };
    let status = hub.status.map(|s| {
        stash.endpoints = s.endpoints;
        stash.observed_generation = s.observed_generation;
        stash.conditions = s.conditions;
        stash.backup_status = s.backup;
        stash.leader = s.leader;
        stash.members = s.members;
        v1alpha1::EtcdClusterStatus {
            phase: s.phase,
            ready_replicas: s.ready_replicas,
        }
    });
    Ok((spec, status, stash))
}

pub(super) fn alpha_up(
    spec: v1alpha1::EtcdClusterSpec,
    status: Option<v1alpha1::EtcdClusterStatus>,
    stash: Stash,
) -> Hub {
    // A stashed spelling is restored only while the spoke still says the same thing; an edit
    // made in the old version wins over the stash.
    let version = match stash.version {
        Some(v) if EtcdVersion::alpha_spelling(&v) == spec.etcd_version => v,
        _ => EtcdVersion::from_alpha_spelling(&spec.etcd_version),
    };
    let storage_size = match stash.storage_size {
        Some(s) if storage_down(&s).ok() == Some(spec.storage_size_gi) => s,
        _ => storage_up(spec.storage_size_gi),
    };
    let alpha_gaps = AlphaGaps {
        no_backup_enabled: spec.backup_enabled.is_none() && spec.backup_schedule.is_some(),
        no_backup_schedule: spec.backup_schedule.is_none() && spec.backup_enabled.is_some(),
    };
    let backup = match (spec.backup_enabled, spec.backup_schedule) {
        (None, None) => None,
        (enabled, schedule) => Some(v1::Backup {
            enabled: enabled.unwrap_or(false),
            schedule: schedule.unwrap_or_else(defaults::backup_schedule),
            retention: stash.backup_retention.unwrap_or(defaults::BACKUP_RETENTION),
            destination: stash.backup_destination,
        }),
    };
    let status = status.map(|s| v1::EtcdClusterStatus {
        phase: s.phase,
        ready_replicas: s.ready_replicas,
        endpoints: stash.endpoints,
        observed_generation: stash.observed_generation,
        conditions: stash.conditions,
        backup: stash.backup_status,
        leader: stash.leader,
        members: stash.members,
    });
    Hub {
        spec: v1::EtcdClusterSpec {
            size: spec.replicas,
            version,
            storage_class: spec.storage_class_name,
            storage_size,
            backup,
            restore: stash.restore,
            maintenance: stash.maintenance,
            tls: stash.tls,
            recovery: stash.recovery,
        },
        status,
        alpha_gaps,
    }
}

/// Retention is stashed only when it differs from the default the way back would fill in.
fn stash_backup_extras(stash: &mut Stash, retention: i32, destination: Option<String>) {
    if retention != defaults::BACKUP_RETENTION {
        stash.backup_retention = Some(retention);
    }
    stash.backup_destination = destination;
}
