//! The rules themselves: the name, the spec, and what an update may change.

use serde_json::Value;

use super::{Ctx, Kind, Verdict, Violation};
use crate::admission::{Field, cron};
use crate::api::{EtcdVersion, MAX_SIZE, StorageSize, Version, storage_class_error, v1};

/// The longest EtcdCluster name: the reconcile loop names its CronJob `NAME-backup`, and a
/// CronJob name may have at most 52 characters.
pub const MAX_NAME: usize = 45;

/// Names are fixed at creation; a name the loop's objects cannot carry is refused up front
/// rather than found out when its CronJob is rejected.
pub(super) fn check_name(obj: &Value, out: &mut Verdict) {
    let meta = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let (path, shown, length, limit) = match (meta("name"), meta("generateName")) {
        (Some(name), _) => ("metadata.name", name, name.len(), MAX_NAME),
        // The apiserver appends 5 random characters.
        (None, Some(prefix)) => ("metadata.generateName", prefix, prefix.len(), MAX_NAME - 5),
        (None, None) => return,
    };
    if length > limit {
        out.violations.push(Violation {
            path: path.to_owned(),
            kind: Kind::Invalid(format!("{shown:?}")),
            detail: format!(
                "must be no more than {limit} characters: the cluster's CronJob <name>-backup may have at most 52"
            ),
        });
    }
    // A generateName prefix is followed by 5 random lower-case alphanumerics, so it may end in '-'.
    let is_prefix = meta("name").is_none();
    if !is_dns1035_label(shown, is_prefix) {
        out.violations.push(Violation {
            path: path.to_owned(),
            kind: Kind::Invalid(format!("{shown:?}")),
            detail: "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character: the cluster's Services are named after it".to_owned(),
        });
    }
}

/// Kubernetes' DNS-1035 label (`[a-z]([-a-z0-9]*[a-z0-9])?`), the rule for Service names; a
/// `prefix` may end in '-'. The length is checked apart (MAX_NAME is below 63).
fn is_dns1035_label(s: &str, prefix: bool) -> bool {
    let bytes = s.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && (prefix || bytes.last() != Some(&b'-'))
}

pub(super) fn check_spec(ctx: &Ctx, spec: &v1::EtcdClusterSpec, out: &mut Verdict) {
    let size = spec.size;
    if !(1..=MAX_SIZE).contains(&size) {
        out.violations.push(ctx.invalid(
            Field::Size,
            size,
            format!("must be between 1 and {MAX_SIZE}"),
        ));
    } else if size % 2 == 0 {
        out.violations.push(ctx.invalid(
            Field::Size,
            size,
            format!(
                "must be odd: etcd needs a majority quorum, and {size} members survive no more failures than {}",
                size - 1
            ),
        ));
    } else if size == 1 {
        out.warnings.push(format!(
            "{} is 1: a single member has no fault tolerance; use 3 or 5 for production",
            ctx.path(Field::Size)
        ));
    }

    let example = match ctx.version {
        Version::V1Alpha1 => "3.5.10",
        _ => "v3.5.10",
    };
    match spec.version.parse::<EtcdVersion>() {
        Err(_) => out.violations.push(ctx.invalid(
            Field::Version,
            spec.version.clone(),
            format!("must be an etcd release like {example}"),
        )),
        Ok(v) => {
            if let Err(why) = v.supported() {
                out.violations
                    .push(ctx.invalid(Field::Version, spec.version.clone(), why));
            } else if let Some(newer) = v.untested() {
                out.warnings
                    .push(format!("{}: {newer}", ctx.path(Field::Version)));
            }
        }
    }

    if let Some(class) = &spec.storage_class
        && let Some(why) = storage_class_error(class)
    {
        out.violations
            .push(ctx.invalid(Field::StorageClass, class.clone(), why));
    }

    match spec
        .storage_size
        .parse::<StorageSize>()
        .map(StorageSize::gib)
    {
        Err(e) => out.violations.push(ctx.invalid(
            Field::StorageSize,
            spec.storage_size.clone(),
            e.why(match ctx.version {
                Version::V1Alpha1 => "",
                _ => ", like 10Gi",
            }),
        )),
        Ok(0) => out.violations.push(ctx.invalid(
            Field::StorageSize,
            spec.storage_size.clone(),
            "must be at least 1Gi",
        )),
        Ok(_) => {}
    }

    if let Some(backup) = &spec.backup {
        if let Err(why) = cron::check(&backup.schedule) {
            out.violations.push(ctx.invalid(
                Field::BackupSchedule,
                backup.schedule.clone(),
                format!("must be a 5-field cron schedule: {why}"),
            ));
        }
        if !(1..=100).contains(&backup.retention) {
            out.violations.push(ctx.invalid(
                Field::BackupRetention,
                backup.retention,
                "must be between 1 and 100 snapshots",
            ));
        }
        if let Some(dest) = &backup.destination
            && let Some(why) = crate::api::backup_destination_error(dest)
        {
            out.violations
                .push(ctx.invalid(Field::BackupDestination, dest.clone(), why));
        }
    }
    if let Some(m) = &spec.maintenance {
        check_maintenance(ctx, spec, m, out);
    }
    if let Some(restore) = &spec.restore
        && let Some(why) = crate::api::restore_source_error(&restore.from)
    {
        out.violations.push(Violation {
            path: format!("{}.from", ctx.path(Field::Restore)),
            kind: Kind::Invalid(format!("{:?}", restore.from)),
            detail: why.to_owned(),
        });
    }
}

/// `spec.maintenance`: a quota that fits the volume, a retention etcd reads, a percentage.
fn check_maintenance(
    ctx: &Ctx,
    spec: &v1::EtcdClusterSpec,
    m: &v1::Maintenance,
    out: &mut Verdict,
) {
    use crate::api::{QUOTA_MAX_BYTES, QUOTA_MIN_BYTES, WAL_BUDGET_BYTES, quota_of_volume};
    let at = |name: &str, value: String, detail: String| Violation {
        path: format!("{}.{name}", ctx.path(Field::Maintenance)),
        kind: Kind::Invalid(value),
        detail,
    };
    if let Some(q) = m.quota_backend_bytes {
        let most = quota_of_volume(&spec.storage_size);
        if !(QUOTA_MIN_BYTES..=most).contains(&q) {
            out.violations.push(at(
                "quotaBackendBytes",
                q.to_string(),
                format!(
                    "must be between {QUOTA_MIN_BYTES} (16 MiB) and {most}: half of storageSize {} after the WAL's {} MiB, at most {QUOTA_MAX_BYTES} (8 GiB), so the copy a defragmentation writes fits beside the database",
                    spec.storage_size,
                    WAL_BUDGET_BYTES >> 20
                ),
            ));
        }
    }
    if let Some(r) = &m.auto_compaction_retention {
        let ok = r == "0"
            || r.len() <= 5
                && r.ends_with(['s', 'm', 'h'])
                && r[..r.len() - 1].parse::<u16>().is_ok_and(|n| n > 0)
                && !r.starts_with('0');
        if !ok {
            out.violations.push(at(
                "autoCompactionRetention",
                format!("{r:?}"),
                "must be 0 (keep every revision) or a duration of up to 4 digits in s, m or h, like 30m or 1h".to_owned(),
            ));
        }
    }
    if let Some(p) = m.defrag_threshold_percent
        && !(0..=99).contains(&p)
    {
        out.violations.push(at(
            "defragThresholdPercent",
            p.to_string(),
            "must be between 0 (only to recover from NOSPACE) and 99".to_owned(),
        ));
    }
}

pub(super) fn check_update(
    ctx: &Ctx,
    old: &v1::EtcdClusterSpec,
    status: Option<&v1::EtcdClusterStatus>,
    new: &v1::EtcdClusterSpec,
    out: &mut Verdict,
) {
    if new.size < old.size {
        out.violations.push(ctx.forbidden(
            Field::Size,
            format!(
                "cannot shrink from {} to {}: removing members can lose quorum; size may only stay or grow",
                old.size, new.size
            ),
        ));
    }

    if let (Ok(o), Ok(n)) = (
        old.storage_size.parse::<StorageSize>(),
        new.storage_size.parse::<StorageSize>(),
    ) && n < o
    {
        // As written (the CRD's CEL rule says it the same way).
        out.violations.push(ctx.forbidden(
            Field::StorageSize,
            format!(
                "cannot shrink from {} to {}: volumes can grow but never shrink",
                old.storage_size, new.storage_size
            ),
        ));
    }

    match (&old.storage_class, &new.storage_class) {
        (Some(o), Some(n)) if o != n => out.violations.push(ctx.forbidden(
            Field::StorageClass,
            format!("cannot change from {o:?} to {n:?}: volume claims cannot change class"),
        )),
        // The CRD's rule on the spec says the same.
        (Some(o), None) => out.violations.push(ctx.forbidden(
            Field::StorageClass,
            format!(
                "cannot be removed (it was {o:?}): volume claims cannot change class"
            ),
        )),
        (None, Some(n)) => out.violations.push(ctx.forbidden(
            Field::StorageClass,
            format!(
                "cannot be set to {n:?} after creation: the claims were made with the cluster's default class, and volume claims cannot change class"
            ),
        )),
        _ => {}
    }

    if old.restore != new.restore {
        out.violations
            .push(ctx.forbidden(Field::Restore, crate::api::RESTORE_IMMUTABLE));
    }
    if old.tls != new.tls {
        out.violations
            .push(ctx.forbidden(Field::Tls, crate::api::TLS_IMMUTABLE));
    }

    if let (Ok(o), Ok(n)) = (
        old.version.parse::<EtcdVersion>(),
        new.version.parse::<EtcdVersion>(),
    ) && o != n
    {
        let lowest = lowest_running(status).filter(|(_, v)| *v < o);
        match &lowest {
            // Back to a release the members still run: no member goes down a release.
            Some((_, low)) if n < o && n >= *low => {}
            // An upgrade while the roll to `o` has not finished: judged from what runs, so
            // v3.5.10 -> v3.5.26 then at once -> v3.6.4 never restarts a v3.5.10 member
            // straight onto v3.6 (etcd-io/etcd#19557).
            Some((member, low)) if n > o => {
                if let Err(why) = low.upgrade_to(&n) {
                    out.violations.push(ctx.forbidden(
                        Field::Version,
                        format!(
                            "{why} (member {member} still runs {low}: the roll to {o} has not finished)"
                        ),
                    ));
                }
            }
            _ => {
                if let Err(why) = o.upgrade_to(&n) {
                    out.violations.push(ctx.forbidden(Field::Version, why));
                }
            }
        }
    }
}

/// The lowest etcd release a member reports in `status.members` (with that member's name), if
/// any reports one.
fn lowest_running(status: Option<&v1::EtcdClusterStatus>) -> Option<(String, EtcdVersion)> {
    status
        .and_then(|s| s.members.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let v = format!("v{}", m.version.trim_start_matches('v'));
            Some((m.name.clone(), v.parse::<EtcdVersion>().ok()?))
        })
        .min_by_key(|(_, v)| *v)
}
