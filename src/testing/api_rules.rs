//! What the apiserver does to objects, as the in-memory API server does it: `Status` bodies,
//! merge patches, canonical quantities, the fields it refuses to change, label selectors, the
//! patch types, and how a path names a resource.

use serde_json::{Value, json};

/// A Kubernetes `Status` body.
pub fn status(code: u16, reason: &str, message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

/// RFC 7386 merge (`null` deletes), also used for strategic merge (close enough for Leases).
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Server-side apply, simplified: the applied fields replace ours, objects merge recursively,
/// lists are replaced whole.
pub fn apply(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if !v.is_null() {
                    apply(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The API group of a path (`""` for the core group), from [`parse`]'s prefix.
pub fn group_of(prefix: &str) -> &str {
    match prefix.split('/').collect::<Vec<_>>()[..] {
        ["apis", group, _] => group,
        _ => "",
    }
}

/// Resource quantities (under `requests`, `limits`, `capacity`) as the apiserver stores them:
/// whole GiB in canonical form (`1024Gi` -> `1Ti`, `010Gi` -> `10Gi`); other spellings are
/// kept (the loop renders only whole GiB).
pub fn canonicalize_quantities(v: &mut Value, quantities: bool) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                match child {
                    Value::String(s) if quantities => {
                        *s = crate::api::quantity::canonical(s);
                    }
                    _ => canonicalize_quantities(
                        child,
                        matches!(k.as_str(), "requests" | "limits" | "capacity"),
                    ),
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|i| canonicalize_quantities(i, false)),
        _ => {}
    }
}

/// Fields of `spec` the apiserver refuses to change, by resource (a 422 with its message).
pub fn immutable_change(path: &str, before: &Value, after: &Value) -> Option<Value> {
    let spec = |o: &Value, keep: &[&str]| -> Value {
        let mut s = o["spec"].clone();
        if let Some(m) = s.as_object_mut() {
            m.retain(|k, _| !keep.contains(&k.as_str()));
        }
        s
    };
    let name = after["metadata"]["name"].as_str().unwrap_or("");
    if path.contains("/statefulsets/") {
        let mutable = [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "revisionHistoryLimit",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ];
        if spec(before, &mutable) != spec(after, &mutable) {
            return Some(status(
                422,
                "Invalid",
                format!(
                    "StatefulSet.apps \"{name}\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
                ),
            ));
        }
    }
    if path.contains("/jobs/") && before["spec"]["template"] != after["spec"]["template"] {
        return Some(status(
            422,
            "Invalid",
            format!(
                "Job.batch \"{name}\" is invalid: spec.template: Invalid value: field is immutable"
            ),
        ));
    }
    None
}

/// Decodes `%XX` escapes (a query parameter's value).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the `labelSelector` of `query` (if any) selects `object`: `k=v`, `k==v`, `k!=v`,
/// `k` and `!k`, comma-separated, all of which must hold (set-based `in`/`notin` panic: nothing
/// here sends them).
pub fn selected(query: &str, object: &Value) -> bool {
    let Some(selector) = query
        .split('&')
        .find_map(|p| p.strip_prefix("labelSelector="))
        .map(percent_decode)
    else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    let label = |k: &str| labels[k.trim()].as_str();
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .all(|req| {
            assert!(
                !req.contains(" in ") && !req.contains(" notin "),
                "set-based selector {req:?} is not modelled"
            );
            if let Some((k, v)) = req.split_once("!=") {
                label(k) != Some(v.trim())
            } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
                label(k) == Some(v.trim())
            } else if let Some(k) = req.strip_prefix('!') {
                label(k).is_none()
            } else {
                label(req).is_some()
            }
        })
}

/// The apiserver's answer to a write whose resourceVersion is not the stored one.
pub fn conflict(path: &str) -> (u16, Value) {
    (
        409,
        status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {path}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        ),
    )
}

/// The PATCH type named by a Content-Type.
pub fn patch_type(content_type: &str) -> Option<&'static str> {
    match content_type {
        "application/apply-patch+yaml" => Some("apply"),
        "application/merge-patch+json" => Some("merge"),
        "application/strategic-merge-patch+json" => Some("strategic"),
        "application/json-patch+json" => Some("json"),
        _ => None,
    }
}

/// Where a path points: `(group/version prefix, namespace, resource, name)`.
pub fn parse(path: &str) -> Option<(String, Option<String>, String, Option<String>)> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (prefix, rest) = match *segs.first()? {
        "api" => (segs.get(..2)?.join("/"), &segs[2..]),
        "apis" => (segs.get(..3)?.join("/"), &segs[3..]),
        _ => return None,
    };
    match rest {
        [res] => Some((prefix, None, (*res).to_owned(), None)),
        // A cluster-scoped object (a CustomResourceDefinition, a Namespace).
        [res, name] => Some((prefix, None, (*res).to_owned(), Some((*name).to_owned()))),
        ["namespaces", ns, res] => Some((prefix, Some((*ns).to_owned()), (*res).to_owned(), None)),
        ["namespaces", ns, res, name] => Some((
            prefix,
            Some((*ns).to_owned()),
            (*res).to_owned(),
            Some((*name).to_owned()),
        )),
        _ => None,
    }
}
