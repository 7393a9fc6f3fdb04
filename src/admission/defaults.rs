//! Defaulting: fill in every missing field that has a default, in the object's own version.
//!
//! The values come from the `default:` entries of the generated CRD schema (which come from
//! [`crate::api::defaults`]), walked the way the apiserver's structural defaulting walks them:
//! a missing (or null) field with a default gets it; a missing parent without a default is not
//! created. So the webhook and the schema cannot disagree. The one default the schema cannot
//! express is applied by hand: in v1alpha1 the flat `backupEnabled`/`backupSchedule` pair behaves
//! like v1's `backup` object, so either one being set brings in the other's default.
//!
//! Objects that break the schema (a string where an object belongs, say) are left alone where
//! they break it: defaulting never fails, it only does what is safe.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::{Map, Value};

use crate::api::{self, Version, defaults};

/// The defaults found under one schema node.
#[derive(Debug, Default)]
struct Node {
    /// Defaults of this object's properties, with their own nested defaults.
    properties: BTreeMap<String, (Option<Value>, Node)>,
    /// Defaults inside the items of an array.
    items: Option<Box<Node>>,
}

impl Node {
    fn from_schema(schema: &JSONSchemaProps) -> Node {
        let mut node = Node::default();
        for (name, prop) in schema.properties.iter().flatten() {
            let child = Node::from_schema(prop);
            let default = prop.default.as_ref().map(|d| d.0.clone());
            if default.is_some() || !child.is_empty() {
                node.properties.insert(name.clone(), (default, child));
            }
        }
        if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
            let child = Node::from_schema(items);
            if !child.is_empty() {
                node.items = Some(Box::new(child));
            }
        }
        node
    }

    fn is_empty(&self) -> bool {
        self.properties.is_empty() && self.items.is_none()
    }

    /// Fills this node's defaults into `value` (used on a default before it is emitted, so
    /// nested defaults come with it).
    fn apply(&self, value: &mut Value) {
        let mut fills = Vec::new();
        self.collect(value, &mut Vec::new(), &mut fills);
        for fill in fills {
            fill.set(value);
        }
    }

    /// Walks `value` and lists every default it lacks, without copying anything else.
    fn collect(&self, value: &Value, path: &mut Vec<String>, out: &mut Vec<Fill>) {
        match value {
            Value::Object(map) => {
                for (name, (default, child)) in &self.properties {
                    match map.get(name) {
                        None | Some(Value::Null) => {
                            if let Some(default) = default {
                                let mut value = default.clone();
                                child.apply(&mut value);
                                let mut at = path.clone();
                                at.push(name.clone());
                                out.push(Fill {
                                    path: at,
                                    value,
                                    replace: map.contains_key(name),
                                });
                            }
                        }
                        Some(v) => {
                            path.push(name.clone());
                            child.collect(v, path, out);
                            path.pop();
                        }
                    }
                }
            }
            Value::Array(items) => {
                if let Some(child) = &self.items {
                    for (i, v) in items.iter().enumerate() {
                        path.push(i.to_string());
                        child.collect(v, path, out);
                        path.pop();
                    }
                }
            }
            _ => {}
        }
    }
}

/// One missing default: where it goes, its value, and whether it replaces a `null`.
#[derive(Debug)]
struct Fill {
    path: Vec<String>,
    value: Value,
    replace: bool,
}

impl Fill {
    fn set(self, root: &mut Value) {
        let Some((last, parents)) = self.path.split_last() else {
            return;
        };
        let mut at = root;
        for p in parents {
            at = match at {
                Value::Object(m) => match m.get_mut(p) {
                    Some(v) => v,
                    None => return,
                },
                Value::Array(a) => match p.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                    Some(v) => v,
                    None => return,
                },
                _ => return,
            };
        }
        if let Value::Object(m) = at {
            m.insert(last.clone(), self.value);
        }
    }

    fn into_op(self) -> json_patch::PatchOperation {
        let path =
            json_patch::jsonptr::PointerBuf::from_tokens(self.path.iter().map(String::as_str));
        if self.replace {
            json_patch::PatchOperation::Replace(json_patch::ReplaceOperation {
                path,
                value: self.value,
            })
        } else {
            json_patch::PatchOperation::Add(json_patch::AddOperation {
                path,
                value: self.value,
            })
        }
    }
}

/// One defaults tree per version, built once from the generated CRD.
static TREES: LazyLock<BTreeMap<Version, Node>> = LazyLock::new(|| {
    api::crd()
        .spec
        .versions
        .iter()
        .filter_map(|v| {
            let version = Version::from_version(&v.name)?;
            let schema = v.schema.as_ref()?.open_api_v3_schema.as_ref()?;
            Some((version, Node::from_schema(schema)))
        })
        .collect()
});

/// Every default `obj` (a whole object of `version`) lacks, in path order.
fn fills(obj: &Value, version: Version) -> Vec<Fill> {
    let mut out = Vec::new();
    if let Some(tree) = TREES.get(&version) {
        tree.collect(obj, &mut Vec::new(), &mut out);
    }
    if version == Version::V1Alpha1
        && let Some(spec) = obj.get("spec").and_then(Value::as_object)
    {
        out.extend(alpha_backup_pair(spec));
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Fills in the defaults of `version` into `obj` (a whole object: apiVersion, metadata, spec...).
pub fn apply(obj: &mut Value, version: Version) {
    for fill in fills(obj, version) {
        fill.set(obj);
    }
}

/// The flat v1alpha1 pair behaves like v1's `backup` object: either one set brings in the
/// other's default.
fn alpha_backup_pair(spec: &Map<String, Value>) -> Option<Fill> {
    let set = |v: Option<&Value>| !matches!(v, None | Some(Value::Null));
    let (enabled, schedule) = (spec.get("backupEnabled"), spec.get("backupSchedule"));
    let (name, value, present) = match (set(enabled), set(schedule)) {
        (true, false) => (
            "backupSchedule",
            Value::String(defaults::backup_schedule()),
            schedule.is_some(),
        ),
        (false, true) => ("backupEnabled", Value::Bool(false), enabled.is_some()),
        _ => return None,
    };
    Some(Fill {
        path: vec!["spec".to_owned(), name.to_owned()],
        value,
        replace: present,
    })
}

/// The JSON Patch (RFC 6902) that takes `obj` to its defaulted form; empty when nothing is
/// missing. Only adds (and replaces of `null`) where a default belongs: never metadata. Built
/// while walking, so nothing but the defaults is copied.
pub fn patch(obj: &Value, version: Version) -> json_patch::Patch {
    json_patch::Patch(fills(obj, version).into_iter().map(Fill::into_op).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{v1, v1alpha1, v1beta1};
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(version: Version, spec: Value) -> Value {
        json!({"apiVersion": version.api_version(), "kind": "EtcdCluster",
               "metadata": {"name": "a", "namespace": "default"}, "spec": spec})
    }

    fn defaulted(version: Version, spec: Value) -> Value {
        let mut o = obj(version, spec);
        apply(&mut o, version);
        o["spec"].take()
    }

    /// The schema's defaults, the serde defaults of the Rust types, and what /mutate adds are
    /// the same values: default a minimal object and compare it with the typed decode.
    #[test]
    fn webhook_defaults_equal_schema_and_type_defaults() {
        let spec = defaulted(Version::V1, json!({"size": 3, "backup": {}}));
        let typed: v1::EtcdClusterSpec =
            serde_json::from_value(json!({"size": 3, "backup": {}})).unwrap();
        assert_eq!(spec, serde_json::to_value(typed).unwrap());
        assert_eq!(
            spec,
            json!({"size": 3, "version": "v3.7.4", "storageSize": "10Gi",
                   "backup": {"enabled": false, "schedule": "0 */6 * * *", "retention": 7}})
        );

        let spec = defaulted(Version::V1Beta1, json!({"size": 3, "backup": {}}));
        let typed: v1beta1::EtcdClusterSpec =
            serde_json::from_value(json!({"size": 3, "backup": {}})).unwrap();
        assert_eq!(spec, serde_json::to_value(typed).unwrap());
        // No class: the claims get the cluster's default StorageClass.
        assert_eq!(spec["storage"], json!({"size": "10Gi"}));

        let spec = defaulted(
            Version::V1Alpha1,
            json!({"replicas": 3, "backupEnabled": true}),
        );
        let typed: v1alpha1::EtcdClusterSpec = serde_json::from_value(
            json!({"replicas": 3, "backupEnabled": true, "backupSchedule": "0 */6 * * *"}),
        )
        .unwrap();
        assert_eq!(spec, serde_json::to_value(typed).unwrap());
        assert_eq!(spec["etcdVersion"], "3.7.4");
        assert_eq!(spec["storageSizeGi"], 10);
    }

    #[test]
    fn defaults_go_only_where_a_parent_exists() {
        // v1 backup has no default of its own: a missing backup stays missing.
        assert!(
            defaulted(Version::V1, json!({"size": 3}))
                .get("backup")
                .is_none()
        );
        // v1beta1 storage has one: it is added whole, and a partial one is completed.
        assert_eq!(
            defaulted(
                Version::V1Beta1,
                json!({"size": 3, "storage": {"size": "20Gi"}})
            )["storage"],
            json!({"size": "20Gi"})
        );
        // No spec: nothing to default under.
        let mut o = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster", "metadata": {"name": "a"}});
        assert!(patch(&o, Version::V1).0.is_empty());
        apply(&mut o, Version::V1);
        assert!(o.get("spec").is_none());
    }

    #[test]
    fn schema_breaking_objects_get_only_safe_defaults() {
        // A string where an object belongs is left for validation to report.
        let p = patch(
            &obj(Version::V1Beta1, json!({"size": 3, "storage": "big"})),
            Version::V1Beta1,
        );
        let ops = serde_json::to_value(&p).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/spec/version", "value": "v3.7.4"}])
        );
        // A spec that is not an object gets nothing.
        assert!(
            patch(&obj(Version::V1, json!("three")), Version::V1)
                .0
                .is_empty()
        );
        // Wrong types and unknown enum values are kept as sent.
        let spec = defaulted(
            Version::V1,
            json!({"size": "three", "storageClass": "gold"}),
        );
        assert_eq!(spec["size"], "three");
        assert_eq!(spec["storageClass"], "gold");
        assert_eq!(spec["version"], "v3.7.4");
    }

    #[test]
    fn null_counts_as_missing() {
        let p = patch(
            &obj(
                Version::V1,
                json!({"size": 3, "version": null, "storageClass": "ssd", "storageSize": "1Gi"}),
            ),
            Version::V1,
        );
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!([{"op": "replace", "path": "/spec/version", "value": "v3.7.4"}])
        );
    }

    #[test]
    fn v1alpha1_backup_pair_completes_itself() {
        assert_eq!(
            defaulted(
                Version::V1Alpha1,
                json!({"replicas": 3, "backupSchedule": "@daily"})
            )["backupEnabled"],
            false
        );
        let none = defaulted(Version::V1Alpha1, json!({"replicas": 3}));
        assert!(none.get("backupEnabled").is_none() && none.get("backupSchedule").is_none());
    }

    #[test]
    fn metadata_is_never_patched() {
        let mut o = obj(Version::V1Alpha1, json!({"replicas": 3}));
        o["metadata"]["annotations"] = json!({"etcd.example.com/conversion-data": "{}"});
        let p = patch(&o, Version::V1Alpha1);
        assert!(p.0.iter().all(|op| {
            serde_json::to_value(op).unwrap()["path"]
                .as_str()
                .unwrap()
                .starts_with("/spec/")
        }));
    }

    fn partial_spec() -> impl Strategy<Value = (Version, Value)> {
        (
            crate::api::convert::tests::v1_object(),
            0usize..3,
            proptest::collection::vec(any::<bool>(), 8),
        )
            .prop_map(|(hub, v, drops)| {
                let version = Version::ALL[v];
                let mut o = crate::api::convert::convert_object(&hub, version).unwrap();
                let spec = o["spec"].as_object_mut().unwrap();
                let keys: Vec<String> = spec
                    .keys()
                    .filter(|k| !matches!(k.as_str(), "size" | "replicas"))
                    .cloned()
                    .collect();
                for (k, drop) in keys.iter().zip(drops.iter()) {
                    if *drop {
                        spec.remove(k);
                    }
                }
                if let Some(b) = spec.get_mut("backup").and_then(Value::as_object_mut) {
                    if drops[6] {
                        b.remove("schedule");
                    }
                    if drops[7] {
                        b.remove("enabled");
                    }
                }
                (version, o)
            })
    }

    proptest! {
        /// The patch applies with RFC 6902 semantics, touches only /spec, and a second round
        /// yields no patch.
        #[test]
        fn patch_applies_and_is_idempotent((version, o) in partial_spec()) {
            let p = patch(&o, version);
            let mut patched = o.clone();
            json_patch::patch(&mut patched, &p).unwrap();
            for key in ["apiVersion", "kind", "metadata"] {
                prop_assert_eq!(&patched[key], &o[key]);
            }
            prop_assert!(patch(&patched, version).0.is_empty());
            let mut expected = o.clone();
            apply(&mut expected, version);
            prop_assert_eq!(patched, expected);
        }
    }
}
