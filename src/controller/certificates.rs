//! A TLS cluster's cert-manager objects (`render::certificates`): applied server-side when
//! what was last applied differs, which the members' ConfigMap records as a digest in
//! [`CERTIFICATES_ANNOTATION`] (so a steady cluster costs no request). cert-manager then makes
//! and renews the Secrets the members mount and the loop reads.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::children::Children;
use super::{Error, MANAGER, render};
use crate::api::v1::EtcdCluster;

/// On the members' ConfigMap: the digest of the cert-manager objects last applied.
pub const CERTIFICATES_ANNOTATION: &str = "etcd.example.com/certificates";

/// The grant the loop needs for them (tests/manifests.rs checks the ClusterRole has it).
pub const CERTIFICATES_RBAC_RULES: &[(&str, &str, &[&str])] = &[
    ("cert-manager.io", "issuers", &["get", "create", "patch"]),
    (
        "cert-manager.io",
        "certificates",
        &["get", "create", "patch"],
    ),
];

/// The digest of `objects` (SHA-256 of their JSON, first 16 hex digits).
pub fn digest(objects: &[serde_json::Value]) -> String {
    let text = serde_json::to_string(objects).expect("JSON serializes");
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies `ec`'s cert-manager objects unless the members' ConfigMap says they already are.
pub(super) async fn ensure(ec: &EtcdCluster, kids: &Children<'_>) -> Result<(), Error> {
    let objects = render::certificates(ec, &kids.ctx.settings.render);
    if objects.is_empty() {
        return Ok(());
    }
    let want = digest(&objects);
    let config_name = render::members_config_name(ec);
    let config = kids.read::<ConfigMap>(&config_name).await?;
    let have = config
        .as_ref()
        .and_then(|c| c.annotations().get(CERTIFICATES_ANNOTATION).cloned());
    if have.as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    let ns = ec.namespace().unwrap_or_default();
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", kind);
        let resource = ApiResource::from_gvk(&gvk);
        let api: Api<DynamicObject> = Api::namespaced_with(kids.ctx.client.clone(), &ns, &resource);
        let kind_label = if kind == "Issuer" {
            "Issuer"
        } else {
            "Certificate"
        };
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => Error::MemberTls(format!(
                "cert-manager's {kind} API is not served: spec.tls needs cert-manager installed (or spec.tls.certificates: Secrets, with the Secrets made by you)"
            )),
            e => Error::kube("apply", kind_label, name, e),
        })?;
        tracing::info!(cluster = %ec.name_any(), kind, name, "applied");
    }
    if config.is_some() {
        let patch = json!({"metadata": {"annotations": {CERTIFICATES_ANNOTATION: want}}});
        kids.api::<ConfigMap>()
            .patch(&config_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("patch", "ConfigMap", &config_name, e))?;
    }
    Ok(())
}
