//! `etcd.example.com/v1alpha1`: the first, flat shape (`replicas`, versions without `v`).
// clippy mistakes the repeated `type_ = "integer"` of two printcolumns for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Phase, defaults};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.example.com",
    version = "v1alpha1",
    kind = "EtcdCluster",
    plural = "etcdclusters",
    namespaced,
    doc = "An etcd cluster (deprecated version v1alpha1; use v1).",
    status = "EtcdClusterStatus",
    deprecated = "etcd.example.com/v1alpha1 EtcdCluster is deprecated; use etcd.example.com/v1",
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "SIZE", type_ = "integer", json_path = ".spec.replicas"),
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
    pub replicas: i32,
    #[serde(default = "defaults::version_without_v")]
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+\.[0-9]+$"), length(max = 32))]
    pub etcd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = super::STORAGE_CLASS_PATTERN), length(max = super::STORAGE_CLASS_MAX_LENGTH))]
    pub storage_class_name: Option<String>,
    #[serde(default = "defaults::storage_size_gi")]
    #[schemars(range(min = 1))]
    pub storage_size_gi: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_schedule: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::phase_schema")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
}
