//! The `render` subcommand: the objects the loop would apply for the EtcdClusters given, as YAML
//! or JSON, without a cluster.

use serde_json::{Value, json};

use super::{Document, OfflineError, review};
use crate::admission;
use crate::api::{self, Version};

/// The uid `render` gives a cluster that has none yet (the apiserver assigns the real one);
/// the ownerReferences carry it.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// What the controller would create for each EtcdCluster: the webhooks' defaults applied, the
/// rules checked (a denied document is an error), converted to v1, then rendered.
pub fn objects(
    docs: &[Document],
    opts: &crate::controller::render::RenderOptions,
    strict: bool,
    settings: &admission::Settings,
) -> Result<(Vec<Value>, Vec<String>), OfflineError> {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for (doc, decision) in docs.iter().zip(review(docs, &[], strict, settings)?) {
        warnings.extend(
            decision
                .warnings
                .iter()
                .map(|w| format!("{}: warning: {w}", decision.label)),
        );
        if doc.value.get("kind").and_then(Value::as_str) != Some(api::KIND) {
            return Err(doc.error("render takes EtcdCluster manifests"));
        }
        if !decision.allowed {
            return Err(OfflineError::Denied {
                source_name: doc.source_name.clone(),
                doc: doc.index,
                label: decision.label,
                message: decision.message,
            });
        }
        let mut v1 = api::convert::convert_object(&decision.patched, Version::V1)
            .map_err(|e| doc.error(e.to_string()))?;
        // The apiserver converts a v1alpha1 or v1beta1 create to v1 before `/mutate` sees it
        // (`matchPolicy: Equivalent`), so such a cluster gets the TLS default too.
        if settings.default_member_tls && admission::tls::lacks_tls(&v1) {
            v1["spec"]["tls"] = json!({});
        }
        let meta = v1
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| doc.error("metadata missing"))?;
        meta.entry("namespace").or_insert(json!("default"));
        meta.entry("uid").or_insert(json!(PLACEHOLDER_UID));
        let cluster: api::v1::EtcdCluster =
            serde_json::from_value(v1).map_err(|e| doc.error(e.to_string()))?;
        if cluster.metadata.name.as_deref().unwrap_or("").is_empty() {
            return Err(doc.error("metadata.name is required to render (generateName is not)"));
        }
        out.extend(crate::controller::render::all(&cluster, opts));
    }
    Ok((out, warnings))
}

/// Renders objects as multi-document YAML, or JSON (one object, or a List of several); as one
/// List, whatever the count, when `list` (the input was a List).
pub fn render(objects: &[Value], json_output: bool, list: bool) -> String {
    let as_list = || json!({"apiVersion": "v1", "kind": "List", "items": objects});
    if list {
        let value = as_list();
        return if json_output {
            let mut s = serde_json::to_string_pretty(&value).expect("JSON values serialize");
            s.push('\n');
            s
        } else {
            serde_yaml_ng::to_string(&value).expect("JSON values serialize as YAML")
        };
    }
    if json_output {
        let value = match objects {
            [one] => one.clone(),
            _ => as_list(),
        };
        let mut s = serde_json::to_string_pretty(&value).expect("JSON values serialize");
        s.push('\n');
        s
    } else {
        objects
            .iter()
            .map(|o| serde_yaml_ng::to_string(o).expect("JSON values serialize as YAML"))
            .collect::<Vec<_>>()
            .join("---\n")
    }
}
