//! Member TLS for new clusters (`--default-member-tls`): `/mutate` writes `spec.tls: {}` into a
//! new v1 cluster that says nothing about TLS, so the choice is in the stored object for good
//! (the members cannot move between plain HTTP and TLS in place). On UPDATE, a v1 object that
//! leaves `spec.tls` out keeps the stored object's (as the apiserver keeps a Service's
//! `clusterIP`): a whole-object update written without the field is not refused for removing
//! it. The older versions carry `tls` only in the conversion-data annotation, which the
//! apiserver's conversion keeps; the webhooks are registered for v1 (`matchPolicy:
//! Equivalent`), so every write reaches this as v1.

use kube::core::admission::Operation;
use serde_json::{Value, json};

use super::AdmissionRequest;
use crate::api::Version;

/// The `spec.tls` to add to `obj` (the request's object in `version`), if any.
pub fn default_tls(
    req: &AdmissionRequest,
    obj: &Value,
    version: Version,
    on_by_default: bool,
) -> Option<Value> {
    if version != Version::V1 {
        return None;
    }
    if !lacks_tls(obj) {
        return None;
    }
    match req.operation {
        Operation::Create => on_by_default.then(|| json!({})),
        Operation::Update => req
            .old_object
            .as_ref()?
            .pointer("/spec/tls")
            .filter(|t| !t.is_null())
            .cloned(),
        _ => None,
    }
}

/// Whether `obj` (any version's layout with a `spec` object) says nothing about TLS: the
/// cluster a CREATE default applies to (`offline::objects` asks this of a converted v1 object).
pub fn lacks_tls(obj: &Value) -> bool {
    obj.get("spec")
        .and_then(Value::as_object)
        .is_some_and(|spec| spec.get("tls").is_none_or(Value::is_null))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: &str, object: Value, old: Option<Value>) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "u", "kind": {"group": "etcd.example.com", "version": "v1", "kind": "EtcdCluster"},
            "resource": {"group": "etcd.example.com", "version": "v1", "resource": "etcdclusters"},
            "operation": op, "userInfo": {}, "object": object, "oldObject": old,
        }))
        .unwrap()
    }

    fn cluster(spec: Value) -> Value {
        json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "prod"}, "spec": spec})
    }

    #[test]
    fn a_new_cluster_gets_tls_unless_it_says_or_the_server_is_told_otherwise() {
        let plain = cluster(json!({"size": 3}));
        let create = request("CREATE", plain.clone(), None);
        assert_eq!(
            default_tls(&create, &plain, Version::V1, true),
            Some(json!({}))
        );
        assert_eq!(default_tls(&create, &plain, Version::V1, false), None);
        let off = cluster(json!({"size": 3, "tls": {"enabled": false}}));
        let create_off = request("CREATE", off.clone(), None);
        assert_eq!(default_tls(&create_off, &off, Version::V1, true), None);
        assert_eq!(default_tls(&create, &plain, Version::V1Beta1, true), None);
    }

    #[test]
    fn an_update_that_leaves_tls_out_keeps_the_stored_one() {
        let stored = cluster(json!({"size": 3, "tls": {"issuerRef": {"name": "corp"}}}));
        let new = cluster(json!({"size": 5}));
        let update = request("UPDATE", new.clone(), Some(stored));
        assert_eq!(
            default_tls(&update, &new, Version::V1, false),
            Some(json!({"issuerRef": {"name": "corp"}}))
        );
        // A stored plain cluster stays plain, whatever the server's default.
        let plain = cluster(json!({"size": 3}));
        let update = request("UPDATE", new.clone(), Some(plain));
        assert_eq!(default_tls(&update, &new, Version::V1, true), None);
    }
}
