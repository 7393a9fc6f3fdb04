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

    fn apply(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (name, (default, child)) in &self.properties {
                    if let Some(default) = default
                        && matches!(map.get(name), None | Some(Value::Null))
                    {
                        map.insert(name.clone(), default.clone());
                    }
                    if let Some(v) = map.get_mut(name) {
                        child.apply(v);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(child) = &self.items {
                    items.iter_mut().for_each(|v| child.apply(v));
                }
            }
            _ => {}
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

/// Fills in the defaults of `version` into `obj` (a whole object: apiVersion, metadata, spec...).
pub fn apply(obj: &mut Value, version: Version) {
    if let Some(tree) = TREES.get(&version) {
        tree.apply(obj);
    }
    if version == Version::V1Alpha1
        && let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
    {
        alpha_backup_pair(spec);
    }
}

fn alpha_backup_pair(spec: &mut Map<String, Value>) {
    let set = |v: Option<&Value>| !matches!(v, None | Some(Value::Null));
    let enabled = set(spec.get("backupEnabled"));
    let schedule = set(spec.get("backupSchedule"));
    if enabled && !schedule {
        spec.insert(
            "backupSchedule".into(),
            Value::String(defaults::backup_schedule()),
        );
    } else if schedule && !enabled {
        spec.insert("backupEnabled".into(), Value::Bool(false));
    }
}

/// The JSON Patch (RFC 6902) that takes `obj` to its defaulted form; empty when nothing is
/// missing. Only adds and replaces of null values under `/spec`: never metadata.
pub fn patch(obj: &Value, version: Version) -> json_patch::Patch {
    let mut defaulted = obj.clone();
    apply(&mut defaulted, version);
    json_patch::diff(obj, &defaulted)
}
