//! The CRD's OpenAPI schema applied to an object, as the apiserver applies it after the
//! mutating webhooks and before the validating ones: types, `pattern`, `enum`, string lengths,
//! numeric bounds, list sizes and `required`, with the apiserver's field paths and words.
//! `offline::review` and `render` use it, so a manifest they admit is one the apiserver admits
//! (the CEL rules are the webhook's own, `api::cel`). Pure: no network.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

use super::Version;

/// The schema of `version` in the generated CRD.
pub fn of(version: Version) -> JSONSchemaProps {
    super::crd()
        .spec
        .versions
        .into_iter()
        .find(|v| v.name == version.as_str())
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .expect("every served version has a schema")
}

/// Every way `object` breaks `schema`, one line each in the apiserver's words
/// (`spec.restore.sha256: Invalid value: "x": spec.restore.sha256 in body should match
/// '^[0-9a-fA-F]{64}$'`). `metadata` and `status` are not looked at (the apiserver's own, and
/// dropped from a write of the object); a `null` counts as absent.
pub fn violations(schema: &JSONSchemaProps, object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(map) = object.as_object() else {
        out.push("Invalid value: the object is not a JSON object".to_owned());
        return out;
    };
    let props = schema.properties.as_ref();
    for (key, value) in map {
        // metadata is the apiserver's own; status is dropped from a create or update of the
        // object itself (the status subresource is on).
        if matches!(key.as_str(), "metadata" | "apiVersion" | "kind" | "status") {
            continue;
        }
        if let Some(s) = props.and_then(|p| p.get(key)) {
            walk(s, value, key, &mut out);
        }
    }
    for r in schema.required.iter().flatten() {
        if map.get(r).is_none_or(Value::is_null) {
            out.push(format!("{r}: Required value"));
        }
    }
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn walk(schema: &JSONSchemaProps, value: &Value, path: &str, out: &mut Vec<String>) {
    if value.is_null() {
        return;
    }
    let int_or_string = schema.x_kubernetes_int_or_string == Some(true);
    if let Some(want) = schema.type_.as_deref() {
        let have = type_name(value);
        let fits = have == want
            || (want == "number" && have == "integer")
            || (int_or_string && matches!(have, "integer" | "string"));
        if !fits {
            out.push(format!(
                "{path}: Invalid value: \"{have}\": {path} in body must be of type {want}: \"{have}\""
            ));
            return;
        }
    }
    match value {
        Value::String(s) => string(schema, s, value, path, out),
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            if let Some(min) = schema.minimum
                && x < min
            {
                out.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should be greater than or equal to {min}"
                ));
            }
            if let Some(max) = schema.maximum
                && x > max
            {
                out.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should be less than or equal to {max}"
                ));
            }
            enumerated(schema, value, path, out);
        }
        Value::Array(items) => {
            let len = items.len() as i64;
            if let Some(max) = schema.max_items
                && len > max
            {
                out.push(format!(
                    "{path}: Too many: {len}: must have at most {max} items"
                ));
            }
            if let Some(min) = schema.min_items
                && len < min
            {
                out.push(format!(
                    "{path}: Invalid value: {len}: {path} in body should have at least {min} items"
                ));
            }
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = schema.items.as_ref() {
                for (i, v) in items.iter().enumerate() {
                    walk(item, v, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => object(schema, map, path, out),
        Value::Bool(_) | Value::Null => {}
    }
}

fn string(schema: &JSONSchemaProps, s: &str, value: &Value, path: &str, out: &mut Vec<String>) {
    let chars = s.chars().count() as i64;
    if let Some(max) = schema.max_length
        && chars > max
    {
        out.push(format!(
            "{path}: Too long: may not be more than {max} bytes"
        ));
    }
    if let Some(min) = schema.min_length
        && chars < min
    {
        out.push(format!(
            "{path}: Invalid value: {}: {path} in body should be at least {min} chars long",
            shown(value)
        ));
    }
    if let Some(pattern) = schema.pattern.as_deref() {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => out.push(format!(
                "{path}: Invalid value: {}: {path} in body should match '{pattern}'",
                shown(value)
            )),
            Ok(_) => {}
            Err(e) => out.push(format!(
                "{path}: the schema's pattern {pattern:?} does not compile: {e}"
            )),
        }
    }
    enumerated(schema, value, path, out);
}

fn enumerated(schema: &JSONSchemaProps, value: &Value, path: &str, out: &mut Vec<String>) {
    let Some(allowed) = schema.enum_.as_ref() else {
        return;
    };
    if !allowed.iter().any(|a| a.0 == *value) {
        out.push(format!(
            "{path}: Unsupported value: {}: supported values: {}",
            shown(value),
            allowed
                .iter()
                .map(|a| shown(&a.0))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

fn object(
    schema: &JSONSchemaProps,
    map: &serde_json::Map<String, Value>,
    path: &str,
    out: &mut Vec<String>,
) {
    let props: Option<&BTreeMap<String, JSONSchemaProps>> = schema.properties.as_ref();
    let extra = match schema.additional_properties.as_ref() {
        Some(JSONSchemaPropsOrBool::Schema(s)) => Some(&**s),
        _ => None,
    };
    for (key, v) in map {
        let child = format!("{path}.{key}");
        // A field the schema does not have is pruned by the apiserver; `api::strict` names it.
        if let Some(s) = props.and_then(|p| p.get(key)).or(extra) {
            walk(s, v, &child, out);
        }
    }
    for r in schema.required.iter().flatten() {
        if map.get(r).is_none_or(Value::is_null) {
            out.push(format!("{path}.{r}: Required value"));
        }
    }
    if let Some(max) = schema.max_properties
        && map.len() as i64 > max
    {
        out.push(format!(
            "{path}: Too many: {}: must have at most {max} items",
            map.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_malformed_restore_hash_is_refused_as_the_apiserver_words_it() {
        let object = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "x"},
            "spec": {"size": 3, "version": "v3.6.4", "storageSize": "1Gi",
                "restore": {"from": "s3://b/k.db", "sha256": "abc"}}});
        let v = violations(&of(Version::V1), &object);
        assert_eq!(
            v,
            vec![
                "spec.restore.sha256: Invalid value: \"abc\": spec.restore.sha256 in body should match '^[0-9a-fA-F]{64}$'"
            ]
        );
    }

    #[test]
    fn a_valid_sample_of_every_version_has_none() {
        for (version, spec) in [
            (
                Version::V1,
                json!({"size": 3, "version": "v3.6.4", "storageSize": "10Gi"}),
            ),
            (
                Version::V1Beta1,
                json!({"size": 3, "version": "v3.6.4", "storage": {"size": "10Gi"}}),
            ),
            (
                Version::V1Alpha1,
                json!({"replicas": 3, "etcdVersion": "3.6.4", "storageSizeGi": 10}),
            ),
        ] {
            let object = json!({"apiVersion": version.api_version(), "kind": "EtcdCluster",
                "metadata": {"name": "x"}, "spec": spec});
            assert_eq!(
                violations(&of(version), &object),
                Vec::<String>::new(),
                "{version:?}"
            );
        }
    }

    #[test]
    fn types_bounds_and_lists() {
        let object = json!({"spec": {"size": "three", "version": "v3.6.4", "storageSize": "1Gi",
            "backup": {"enabled": true, "retention": 0}}});
        let v = violations(&of(Version::V1), &object).join("\n");
        assert!(
            v.contains(
                "spec.size: Invalid value: \"string\": spec.size in body must be of type integer"
            ),
            "{v}"
        );
        assert!(v.contains("spec.backup.retention: Invalid value: 0: spec.backup.retention in body should be greater than or equal to"), "{v}");
    }
}
