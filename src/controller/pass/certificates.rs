//! A TLS cluster's cert-manager objects (`render::certificates`): applied server-side when
//! what was last applied differs, which the members' ConfigMap records as a digest in
//! [`CERTIFICATES_ANNOTATION`] (so a steady cluster costs no request), and applied again when
//! one is gone: every [`CHECK_EVERY`] each is looked for (a GET), so a Certificate deleted by
//! hand, or cert-manager reinstalled with its CRDs (which deletes every Certificate and Issuer),
//! never leaves the members' certificates unrenewed. cert-manager then makes and renews the
//! Secrets the members mount and the loop reads; a new revision of a client Certificate
//! ([`ClientRevisions`], from the controller's watch) makes the loop read its Secret again at
//! once.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::MANAGER;
use crate::api::v1::EtcdCluster;
use crate::controller::machinery::children::Children;
use crate::controller::machinery::error::Error;
use crate::controller::render;

/// On the members' ConfigMap: the digest of the cert-manager objects last applied.
pub const CERTIFICATES_ANNOTATION: &str = "etcd.example.com/certificates";

/// The grant the loop needs for them (tests/manifests.rs checks the ClusterRole has it);
/// `list` and `watch` on Certificates for [`ClientRevisions`] (objects without key material:
/// the keys are in the Secrets, which the loop only reads by name).
pub const CERTIFICATES_RBAC_RULES: &[(&str, &str, &[&str])] = &[
    ("cert-manager.io", "issuers", &["get", "create", "patch"]),
    (
        "cert-manager.io",
        "certificates",
        &["get", "list", "watch", "create", "patch"],
    ),
];

/// The revision each of the loop's client Certificates was last seen at (the controller's
/// watch of its Certificates), so that a renewal reaches the loop when cert-manager has issued
/// it, not when the Secret read by name is next due ([`CLIENT_SECRET_REFRESH`]).
///
/// [`CLIENT_SECRET_REFRESH`]: crate::controller::machinery::settings::CLIENT_SECRET_REFRESH
#[derive(Default)]
pub struct ClientRevisions(Mutex<HashMap<String, i64>>);

impl ClientRevisions {
    /// The cluster whose client certificate was issued anew: `certificate` is a cluster's
    /// client Certificate (its Secret template carries [`crate::api::CLIENT_TLS_LABEL`], its
    /// controller is an EtcdCluster) and its `status.revision` is not the one last seen. The
    /// first sight of each (the watch's first list, a relist) is only recorded: the pass a
    /// start or a relist brings reads the Secret anyway.
    pub fn renewed(&self, certificate: &DynamicObject) -> Option<ObjectRef<EtcdCluster>> {
        let data = &certificate.data;
        let labels = &data["spec"]["secretTemplate"]["labels"];
        if labels[crate::api::CLIENT_TLS_LABEL].as_str() != Some("true") {
            return None;
        }
        let owner = certificate
            .owner_references()
            .iter()
            .find(|o| o.kind == "EtcdCluster" && o.controller == Some(true))?;
        let ns = certificate.namespace()?;
        let revision = data["status"]["revision"].as_i64()?;
        let before = self
            .0
            .lock()
            .expect("not poisoned")
            .insert(Self::key(certificate), revision);
        if before.is_none_or(|b| b == revision) {
            return None;
        }
        Some(ObjectRef::new(&owner.name).within(&ns))
    }

    /// `certificate` is gone (its cluster deleted): a cluster made again under the same name
    /// starts its client Certificate over at revision 1.
    pub fn forget(&self, certificate: &DynamicObject) {
        self.0
            .lock()
            .expect("not poisoned")
            .remove(&Self::key(certificate));
    }

    /// A Certificate's entry: `namespace/name`.
    fn key(certificate: &DynamicObject) -> String {
        format!(
            "{}/{}",
            certificate.namespace().unwrap_or_default(),
            certificate.name_any()
        )
    }
}

/// How often a steady TLS cluster's cert-manager objects are looked for: 6 GETs per cluster,
/// so 1,000 TLS clusters cost 3.3 requests a second. The first look after a start comes at a
/// point of the period given by the cluster's UID, so the looks are spread out.
pub const CHECK_EVERY: Duration = Duration::from_secs(30 * 60);

/// Whether the look for `ec`'s objects is due (and if so, it is recorded as made now).
fn check_due(ec: &EtcdCluster, kids: &Children<'_>) -> bool {
    let mut checked = kids.ctx.certificates_checked.lock().expect("not poisoned");
    let now = Instant::now();
    let last = *checked
        .entry(crate::controller::machinery::context::key(ec))
        .or_insert_with(|| {
            let uid = ec.uid().unwrap_or_default();
            let spread = uid
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
            let offset = Duration::from_secs(spread % CHECK_EVERY.as_secs());
            now.checked_sub(offset).unwrap_or(now)
        });
    if now.duration_since(last) < CHECK_EVERY {
        return false;
    }
    checked.insert(crate::controller::machinery::context::key(ec), now);
    true
}

/// The cert-manager API for `kind` in `ns`.
fn api_of(kids: &Children<'_>, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", kind);
    Api::namespaced_with(kids.ctx.client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// The objects of `objects` that are not there (`kind/name`).
async fn missing(
    kids: &Children<'_>,
    ns: &str,
    objects: &[serde_json::Value],
) -> Result<Vec<String>, Error> {
    let mut gone = Vec::new();
    for object in objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        match api_of(kids, ns, kind).get_opt(name).await {
            Ok(Some(_)) => {}
            Ok(None) => gone.push(format!("{kind}/{name}")),
            // cert-manager's API itself is gone (being reinstalled): apply says so below.
            Err(kube::Error::Api(s)) if s.code == 404 => gone.push(format!("{kind}/{name}")),
            Err(e) => return Err(Error::kube("get", "Certificate", name, e)),
        }
    }
    Ok(gone)
}

/// The digest of `objects` (SHA-256 of their JSON, first 16 hex digits).
pub fn digest(objects: &[serde_json::Value]) -> String {
    let text = serde_json::to_string(objects).expect("JSON serializes");
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies `ec`'s cert-manager objects unless the members' ConfigMap says they already are.
pub(crate) async fn ensure(ec: &EtcdCluster, kids: &Children<'_>) -> Result<(), Error> {
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
    let ns = ec.namespace().unwrap_or_default();
    if have.as_deref() == Some(want.as_str()) {
        if !check_due(ec, kids) {
            return Ok(());
        }
        let gone = missing(kids, &ns, &objects).await?;
        if gone.is_empty() {
            return Ok(());
        }
        let message = format!(
            "{} of this cluster were gone (deleted, or cert-manager reinstalled), so nothing renewed the members' certificates: applied again",
            gone.join(", ")
        );
        tracing::warn!(cluster = %ec.name_any(), %message, "cert-manager objects restored");
        kids.ctx
            .event(ec, EventType::Warning, "CertificatesRestored", message)
            .await;
    }
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let api = api_of(kids, &ns, kind);
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
    if config.is_some() && have.as_deref() != Some(want.as_str()) {
        let patch = json!({"metadata": {"annotations": {CERTIFICATES_ANNOTATION: want}}});
        kids.api::<ConfigMap>()
            .patch(&config_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("patch", "ConfigMap", &config_name, e))?;
    }
    Ok(())
}

/// On the members' ConfigMap: the digest of the CA key(s) the members were started trusting
/// (`tls::public_keys_digest` of the client Secret's `ca.crt`).
pub const CA_KEY_ANNOTATION: &str = "etcd.example.com/ca-key";
/// On the members' ConfigMap while the CA's key differs from [`CA_KEY_ANNOTATION`]'s: the new
/// digest and when the loop first saw it (`DIGEST@RFC3339`).
pub const CA_KEY_CHANGED_ANNOTATION: &str = "etcd.example.com/ca-key-changed";

/// Whether the members trust the key that signs their certificates now, for the status
/// (`None`: not a TLS cluster, or nothing to judge yet). etcd reads `--trusted-ca-file` only at
/// start, so when the CA is re-keyed (a user's issuer with cert-manager's `rotationPolicy:
/// Always`, a CA re-issued by hand) every member started before still trusts the old key only,
/// and rejects peers and clients whose certificates come from the new one: said once as a
/// Warning, and in the condition until every member has started since.
pub(crate) async fn trust(
    ec: &EtcdCluster,
    kids: &Children<'_>,
    pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>],
) -> Result<Option<(bool, String)>, Error> {
    if !crate::api::tls_on(&ec.spec) {
        return Ok(None);
    }
    let Some(secret) = kids.ctx.client_secret(ec).await? else {
        return Ok(None);
    };
    let Some(now_key) = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .and_then(|ca| crate::tls::public_keys_digest(&ca.0))
    else {
        return Ok(None);
    };
    let config_name = render::members_config_name(ec);
    let Some(config) = kids.read::<ConfigMap>(&config_name).await? else {
        return Ok(None);
    };
    let annotations = config.annotations();
    let trusted = annotations.get(CA_KEY_ANNOTATION);
    let changed = annotations
        .get(CA_KEY_CHANGED_ANNOTATION)
        .and_then(|v| v.split_once('@'))
        .filter(|(key, _)| *key == now_key)
        .and_then(|(_, at)| at.parse::<k8s_openapi::jiff::Timestamp>().ok());
    let config_name = &config_name;
    let annotate = |patch: serde_json::Value| async move {
        kids.api::<ConfigMap>()
            .patch(config_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("patch", "ConfigMap", config_name, e))
    };
    let ok = (
        true,
        "the members trust the key of the CA that signs their certificates".to_owned(),
    );
    match trusted {
        None => {
            annotate(json!({"metadata": {"annotations": {CA_KEY_ANNOTATION: now_key}}})).await?;
            return Ok(Some(ok));
        }
        Some(t) if *t == now_key => {
            if annotations.contains_key(CA_KEY_CHANGED_ANNOTATION) {
                annotate(json!({"metadata": {"annotations": {CA_KEY_CHANGED_ANNOTATION: null}}}))
                    .await?;
            }
            return Ok(Some(ok));
        }
        Some(_) => {}
    }
    let name = ec.name_any();
    let first_seen = changed.is_none();
    let since = match changed {
        Some(at) => at,
        None => {
            let now = k8s_openapi::jiff::Timestamp::now();
            let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
            annotate(json!({"metadata": {"annotations": {
                CA_KEY_CHANGED_ANNOTATION: format!("{now_key}@{at}")}}}))
            .await?;
            at
        }
    };
    let mut started_before: Vec<String> = pods
        .iter()
        .filter(|p| !started_since(p, since))
        .map(|p| p.name_any())
        .collect();
    started_before.sort();
    if started_before.is_empty() && !pods.is_empty() {
        annotate(json!({"metadata": {"annotations": {
            CA_KEY_ANNOTATION: now_key, CA_KEY_CHANGED_ANNOTATION: null}}}))
        .await?;
        return Ok(Some(ok));
    }
    let message = restart_advice(&name, &since.to_string(), &started_before);
    if first_seen {
        tracing::warn!(cluster = %name, %message, "the CA's key changed under running members");
        kids.ctx
            .event(ec, EventType::Warning, "CAKeyChanged", message.clone())
            .await;
    }
    Ok(Some((false, message)))
}

/// What to do when the CA's key changed at `at` under members started before it.
fn restart_advice(name: &str, at: &str, before: &[String]) -> String {
    format!(
        "the CA in {name}-client-tls has a new key since {at}; etcd reads its trusted CA only at start, so members started before {at}{} reject peers and clients whose certificates come from the new key: renew every leaf (cmctl renew {name}-peer {name}-server {name}-client), then restart the members one at a time (kubectl delete pod {name}-<i>, each Ready before the next)",
        if before.is_empty() {
            String::new()
        } else {
            format!(" ({})", before.join(", "))
        }
    )
}

/// Whether `pod`'s etcd container has been running since `at` (and the pod is not going).
fn started_since(pod: &k8s_openapi::api::core::v1::Pod, at: k8s_openapi::jiff::Timestamp) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter(|c| c.name == "etcd")
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .any(|t| t.0 >= at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(name: &str, client: bool, revision: Option<i64>) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": "prod", "ownerReferences": [{
                "apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster", "name": "main",
                "uid": "6a3c1f9e-0000-4000-8000-000000000001", "controller": true}]},
            "spec": {"secretTemplate": {"labels": {"app.kubernetes.io/managed-by": "etcd-webhook"}}},
        });
        if client {
            object["spec"]["secretTemplate"]["labels"][crate::api::CLIENT_TLS_LABEL] =
                json!("true");
        }
        if let Some(r) = revision {
            object["status"] = json!({"revision": r});
        }
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn a_client_certificate_brings_its_cluster_when_its_revision_moves() {
        let seen = ClientRevisions::default();
        let main = ObjectRef::<EtcdCluster>::new("main").within("prod");
        // Not issued yet, then first seen at revision 1: recorded only.
        assert_eq!(seen.renewed(&certificate("main-client", true, None)), None);
        assert_eq!(
            seen.renewed(&certificate("main-client", true, Some(1))),
            None
        );
        // A status update at the same revision (conditions while issuing, a relist): nothing.
        assert_eq!(
            seen.renewed(&certificate("main-client", true, Some(1))),
            None
        );
        // Renewed.
        assert_eq!(
            seen.renewed(&certificate("main-client", true, Some(2))),
            Some(main.clone())
        );
        assert_eq!(
            seen.renewed(&certificate("main-client", true, Some(2))),
            None
        );
        // The members' own leaves are not the loop's identity.
        assert_eq!(
            seen.renewed(&certificate("main-server", false, Some(1))),
            None
        );
        assert_eq!(
            seen.renewed(&certificate("main-server", false, Some(2))),
            None
        );
        // Not an EtcdCluster's controller reference: not ours to follow.
        let mut foreign = certificate("other-client", true, Some(1));
        foreign.metadata.owner_references = None;
        assert_eq!(seen.renewed(&foreign), None);
        foreign.data["status"]["revision"] = json!(2);
        assert_eq!(seen.renewed(&foreign), None);
    }
}
