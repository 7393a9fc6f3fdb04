//! Strict field checks for manifests read offline: the fields an EtcdCluster has in its version,
//! from the CRD's own schema, so that a misspelt field fails a CI gate the way
//! `kubectl apply --validate=strict` fails it (the apiserver itself drops unknown fields).

use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::Version;

/// The paths (`spec.storagClass`, `metadata.labes`) of the fields `obj` has that its version's
/// schema does not. `metadata` is checked one level deep, against `ObjectMeta`.
pub fn unknown_fields(obj: &Value, version: Version) -> Vec<String> {
    let mut out = Vec::new();
    let Some(schema) = schema(version) else {
        return out;
    };
    let Some(fields) = obj.as_object() else {
        return out;
    };
    for (key, value) in fields {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                if let Some(meta) = value.as_object() {
                    for k in meta.keys().filter(|k| !metadata_fields().contains(k)) {
                        out.push(format!("metadata.{k}"));
                    }
                }
            }
            _ => match schema.properties.as_ref().and_then(|p| p.get(key)) {
                Some(s) => walk(s, value, key, &mut out),
                None => out.push(key.clone()),
            },
        }
    }
    out
}

fn walk(schema: &JSONSchemaProps, value: &Value, path: &str, out: &mut Vec<String>) {
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
        return;
    }
    match value {
        Value::Object(fields) => {
            let additional = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(s)) => Some(Some(s.as_ref())),
                Some(JSONSchemaPropsOrBool::Bool(true)) => Some(None),
                _ => None,
            };
            for (key, value) in fields {
                let at = format!("{path}.{key}");
                match (schema.properties.as_ref().and_then(|p| p.get(key)), additional) {
                    (Some(s), _) | (None, Some(Some(s))) => walk(s, value, &at, out),
                    (None, Some(None)) => {}
                    (None, None) => out.push(at),
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.items.as_ref().and_then(|i| match i {
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(s) => Some(s.as_ref()),
                _ => None,
            }) {
                for (i, item) in items.iter().enumerate() {
                    walk(s, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The served schema of `version`, from the CRD this binary generates.
fn schema(version: Version) -> Option<&'static JSONSchemaProps> {
    static CRD: OnceLock<Vec<(String, JSONSchemaProps)>> = OnceLock::new();
    CRD.get_or_init(|| {
        super::crd()
            .spec
            .versions
            .into_iter()
            .filter_map(|v| Some((v.name, v.schema?.open_api_v3_schema?)))
            .collect()
    })
    .iter()
    .find(|(name, _)| name == version.as_str())
    .map(|(_, s)| s)
}

/// The field names of `ObjectMeta`.
fn metadata_fields() -> &'static [String] {
    static FIELDS: OnceLock<Vec<String>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let schema = schemars::schema_for!(ObjectMeta);
        schema
            .as_value()
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelt_field_is_named_by_its_path_in_every_version() {
        let v1 = json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "labes": {"x": "y"}, "labels": {"any-key": "ok"}},
            "spec": {"size": 3, "storagClass": "gold", "backup": {"schedul": "x"}},
            "status": {"conditions": [{"type": "Ready", "typo": 1}]}
        });
        assert_eq!(
            unknown_fields(&v1, Version::V1),
            [
                "metadata.labes",
                "spec.backup.schedul",
                "spec.storagClass",
                "status.conditions[0].typo"
            ]
        );
        let old = json!({"metadata": {"name": "a"}, "spec": {"replicas": 3, "size": 3}});
        assert_eq!(unknown_fields(&old, Version::V1Alpha1), ["spec.size"]);
        let beta = json!({"spec": {"size": 3, "storage": {"size": "1Gi", "clas": "x"}}});
        assert_eq!(
            unknown_fields(&beta, Version::V1Beta1),
            ["spec.storage.clas"]
        );
    }

    #[test]
    fn a_manifest_as_written_has_no_unknown_fields() {
        let v1 = json!({
            "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "n", "annotations": {"k": "v"},
                         "finalizers": ["f"], "generation": 1},
            "spec": {"size": 3, "version": "v3.6.4", "storageSize": "1Gi"}
        });
        assert!(unknown_fields(&v1, Version::V1).is_empty());
    }
}
