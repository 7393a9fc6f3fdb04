//! `etcd.example.com/v1beta1`: storage grouped in one object, no retention or destination.
// clippy mistakes the repeated `type_ = "integer"` of two printcolumns for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Phase, defaults};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.example.com",
    version = "v1beta1",
    kind = "EtcdCluster",
    plural = "etcdclusters",
    namespaced,
    doc = "An etcd cluster (deprecated version v1beta1; use v1).",
    status = "EtcdClusterStatus",
    deprecated = "etcd.example.com/v1beta1 EtcdCluster is deprecated; use etcd.example.com/v1",
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "SIZE", type_ = "integer", json_path = ".spec.size"),
    printcolumn(name = "READY", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    #[schemars(range(min = 1, max = super::MAX_SIZE))]
    pub size: i32,
    #[serde(default = "defaults::version")]
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$"), length(max = 32))]
    pub version: String,
    #[serde(default)]
    pub storage: Storage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Backup>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = super::STORAGE_CLASS_PATTERN), length(max = super::STORAGE_CLASS_MAX_LENGTH))]
    pub class_name: Option<String>,
    #[serde(default = "defaults::storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+Gi$"), length(max = 32))]
    pub size: String,
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            class_name: None,
            size: defaults::storage_size(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default = "defaults::backup_schedule")]
    pub schedule: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::phase_schema")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
}
