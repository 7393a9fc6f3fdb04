//! A field of the spec, named once, with its spelling in each version.

use super::Version as V;

/// A field of the spec, named once and spelled per version in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Spec,
    Size,
    Version,
    StorageClass,
    StorageSize,
    BackupSchedule,
    BackupRetention,
    BackupDestination,
    Restore,
    Maintenance,
    Tls,
}

impl Field {
    /// The JSON pointer of the field in `version`, used to quote the value the user sent.
    pub fn pointer(self, version: V) -> Option<&'static str> {
        Some(match (self, version) {
            (Field::Spec, _) => "/spec",
            (Field::Size, V::V1Alpha1) => "/spec/replicas",
            (Field::Size, _) => "/spec/size",
            (Field::Version, V::V1Alpha1) => "/spec/etcdVersion",
            (Field::Version, _) => "/spec/version",
            (Field::StorageClass, V::V1Alpha1) => "/spec/storageClassName",
            (Field::StorageClass, V::V1Beta1) => "/spec/storage/className",
            (Field::StorageClass, V::V1) => "/spec/storageClass",
            (Field::StorageSize, V::V1Alpha1) => "/spec/storageSizeGi",
            (Field::StorageSize, V::V1Beta1) => "/spec/storage/size",
            (Field::StorageSize, V::V1) => "/spec/storageSize",
            (Field::BackupSchedule, V::V1Alpha1) => "/spec/backupSchedule",
            (Field::BackupSchedule, _) => "/spec/backup/schedule",
            (Field::BackupRetention, V::V1) => "/spec/backup/retention",
            (Field::BackupDestination, V::V1) => "/spec/backup/destination",
            (Field::Restore, V::V1) => "/spec/restore",
            (Field::Maintenance, V::V1) => "/spec/maintenance",
            (Field::Tls, V::V1) => "/spec/tls",
            // Older versions hold these only in the conversion-data annotation.
            (
                Field::BackupRetention
                | Field::BackupDestination
                | Field::Restore
                | Field::Maintenance
                | Field::Tls,
                _,
            ) => {
                return None;
            }
        })
    }

    /// The field path as written in `version` (`spec.storage.size`).
    pub fn path(self, version: V) -> String {
        match self.pointer(version) {
            Some(p) => p.trim_start_matches('/').replace('/', "."),
            None => format!(
                "metadata.annotations[{}].{}",
                super::CONVERSION_ANNOTATION,
                match self {
                    Field::BackupRetention => "backupRetention",
                    Field::Restore => "restore",
                    Field::Maintenance => "maintenance",
                    Field::Tls => "tls",
                    _ => "backupDestination",
                }
            ),
        }
    }
}
