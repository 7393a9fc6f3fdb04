//! The caBundle self-check: does the apiserver trust the certificate this server serves?
//!
//! The apiserver verifies the webhook's certificate against the `caBundle` of each webhook
//! configuration and of the CRD's conversion webhook, for the Service's DNS name. When they
//! disagree (a CA rotation, a typo in `inject-ca-from`, an install in another namespace), every
//! call fails with an x509 error in the apiserver's log, while the pod looks healthy. So the
//! server reads those three objects now and then and verifies its own chain the way the
//! apiserver would; a mismatch sets `etcd_webhook_cabundle_mismatch{object}` to 1, logs the
//! object and the reason, and publishes a Warning Event on the object. Readiness does not
//! depend on it: the pod is fine, the apiserver's trust is what is broken, and restarting or
//! unreadying pods would not repair it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_util::sync::CancellationToken;

use super::CertStore;

/// Why the apiserver would not trust what is served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Mismatch {
    #[error("the caBundle is empty (cainjector has not filled it, or it was cleared)")]
    Empty,
    #[error("the caBundle holds no readable PEM certificate: {0}")]
    Unreadable(String),
    #[error("the served certificate does not verify against the caBundle for {name}: {why}")]
    NotTrusted { name: String, why: String },
}

/// Verifies `chain` (leaf first) against the CAs of `bundle` (PEM) for `server_name`, as the
/// apiserver's client does.
pub fn verify(
    chain: &[CertificateDer<'static>],
    bundle: &[u8],
    server_name: &str,
    provider: Arc<CryptoProvider>,
) -> Result<(), Mismatch> {
    if bundle.iter().all(u8::is_ascii_whitespace) {
        return Err(Mismatch::Empty);
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(bundle) {
        let cert = cert.map_err(|e| Mismatch::Unreadable(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| Mismatch::Unreadable(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(Mismatch::Unreadable("no CERTIFICATE block".to_owned()));
    }
    let not_trusted = |why: String| Mismatch::NotTrusted {
        name: server_name.to_owned(),
        why,
    };
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or_else(|| not_trusted("nothing is served".to_owned()))?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| not_trusted(format!("not a server name: {e}")))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| not_trusted(e.to_string()))?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| not_trusted(e.to_string()))
}

/// The objects whose caBundle the apiserver uses for this server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Mutating(String),
    Validating(String),
    Crd(String),
}

impl Target {
    /// The three objects of the shipped install.
    pub fn shipped() -> Vec<Target> {
        vec![
            Target::Mutating("etcd-webhook-mutating".to_owned()),
            Target::Validating("etcd-webhook-validating".to_owned()),
            Target::Crd(format!("{}.{}", crate::api::PLURAL, crate::api::GROUP)),
        ]
    }

    /// What reading it needs: (API group, resource, name); the check also creates Events.
    pub fn rbac(&self) -> (&'static str, &'static str, &str) {
        match self {
            Target::Mutating(n) => (
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                n,
            ),
            Target::Validating(n) => (
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                n,
            ),
            Target::Crd(n) => ("apiextensions.k8s.io", "customresourcedefinitions", n),
        }
    }

    /// `kind/name`, the metric's `object` label.
    pub fn label(&self) -> String {
        match self {
            Target::Mutating(n) => format!("mutatingwebhookconfiguration/{n}"),
            Target::Validating(n) => format!("validatingwebhookconfiguration/{n}"),
            Target::Crd(n) => format!("customresourcedefinition/{n}"),
        }
    }
}

/// One caBundle the apiserver uses, with the name it verifies.
struct Use {
    what: String,
    bundle: Vec<u8>,
    server_name: String,
}

/// The name the apiserver verifies: the Service's DNS name, or the URL's host.
fn server_name(service: Option<(&str, &str)>, url: Option<&str>) -> String {
    match (service, url) {
        (Some((name, namespace)), _) => format!("{name}.{namespace}.svc"),
        (None, Some(url)) => url_host(url),
        (None, None) => String::new(),
    }
}

/// The caBundles of a webhook configuration's webhooks.
fn webhook_uses<'a>(
    webhooks: impl Iterator<Item = (&'a String, &'a WebhookClientConfig)>,
) -> Vec<Use> {
    webhooks
        .map(|(name, config)| Use {
            what: name.clone(),
            bundle: config.ca_bundle.clone().map(|b| b.0).unwrap_or_default(),
            server_name: server_name(
                config
                    .service
                    .as_ref()
                    .map(|s| (s.name.as_str(), s.namespace.as_str())),
                config.url.as_deref(),
            ),
        })
        .collect()
}

fn url_host(url: &str) -> String {
    url.parse::<axum::http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .unwrap_or_default()
}

/// Reads the object and returns each caBundle in it, and a reference for Events.
async fn read(
    client: &Client,
    target: &Target,
) -> Result<(Vec<Use>, ObjectReference), kube::Error> {
    match target {
        Target::Mutating(name) => {
            fetch(client, name, |o: &MutatingWebhookConfiguration| {
                webhook_uses(
                    o.webhooks
                        .iter()
                        .flatten()
                        .map(|w| (&w.name, &w.client_config)),
                )
            })
            .await
        }
        Target::Validating(name) => {
            fetch(client, name, |o: &ValidatingWebhookConfiguration| {
                webhook_uses(
                    o.webhooks
                        .iter()
                        .flatten()
                        .map(|w| (&w.name, &w.client_config)),
                )
            })
            .await
        }
        Target::Crd(name) => {
            fetch(client, name, |o: &CustomResourceDefinition| {
                o.spec
                    .conversion
                    .as_ref()
                    .and_then(|c| c.webhook.as_ref())
                    .and_then(|w| w.client_config.as_ref())
                    .map(|c| Use {
                        what: "conversion".to_owned(),
                        bundle: c.ca_bundle.clone().map(|b| b.0).unwrap_or_default(),
                        server_name: server_name(
                            c.service
                                .as_ref()
                                .map(|s| (s.name.as_str(), s.namespace.as_str())),
                            c.url.as_deref(),
                        ),
                    })
                    .into_iter()
                    .collect()
            })
            .await
        }
    }
}

/// Gets the cluster-scoped object `name` and the caBundles `uses` finds in it.
async fn fetch<K>(
    client: &Client,
    name: &str,
    uses: impl FnOnce(&K) -> Vec<Use>,
) -> Result<(Vec<Use>, ObjectReference), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let object = Api::<K>::all(client.clone()).get(name).await?;
    Ok((uses(&object), object.object_ref(&())))
}

/// The Event's note: the apiserver refuses notes over 1 KiB, and a name mismatch lists every
/// name of the certificate, so the reason is cut to fit.
fn event_note(why: &str) -> String {
    const HEAD: &str =
        "the certificate served by etcd-webhook does not verify against this object's caBundle (";
    const TAIL: &str = "); the apiserver's calls fail until cert-manager's cainjector (or you) put the serving CA here";
    let room = 1000 - HEAD.len() - TAIL.len();
    let why = if why.len() <= room {
        why.to_owned()
    } else {
        // The last character boundary that leaves room for the ellipsis.
        let end = why
            .char_indices()
            .map(|(i, _)| i)
            .take_while(|i| *i <= room - 3)
            .last()
            .unwrap_or(0);
        format!("{}...", &why[..end])
    };
    format!("{HEAD}{why}{TAIL}")
}

/// Checks every target every `interval` until `shutdown`.
pub async fn run(
    client: Client,
    store: Arc<CertStore>,
    targets: Vec<Target>,
    interval: Duration,
    report: Arc<dyn super::Report>,
    instance: Option<String>,
    shutdown: CancellationToken,
) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::api::MANAGER.to_owned(),
            instance,
        },
    );
    // The last outcome per target: Events and log lines only when it changes.
    let mut last: Vec<Option<Result<(), String>>> = vec![None; targets.len()];
    tracing::info!(every = %humantime::format_duration(interval), objects = ?targets.iter().map(Target::label).collect::<Vec<_>>(), "caBundle self-check on");
    loop {
        if let Some(served) = store.current() {
            for (target, last) in targets.iter().zip(last.iter_mut()) {
                let object = target.label();
                let (uses, reference) = match read(&client, target).await {
                    Ok(x) => x,
                    Err(error) => {
                        // Not a verdict: the metric keeps its last value.
                        let why = format!("cannot read it: {error}");
                        if last.as_ref().and_then(|l| l.as_ref().err()) != Some(&why) {
                            tracing::warn!(%object, %error, "caBundle self-check: cannot read the object");
                        }
                        *last = Some(Err(why));
                        continue;
                    }
                };
                let outcome = uses
                    .iter()
                    .map(|u| {
                        verify(
                            &served.key.cert,
                            &u.bundle,
                            &u.server_name,
                            provider.clone(),
                        )
                        .map_err(|e| format!("{}: {e}", u.what))
                    })
                    .find(Result::is_err)
                    .unwrap_or(Ok(()));
                report.cabundle_mismatch(&object, outcome.is_err());
                if last.as_ref() != Some(&outcome) {
                    match &outcome {
                        Ok(()) => {
                            tracing::info!(%object, "caBundle self-check: the apiserver trusts the served certificate")
                        }
                        Err(why) => {
                            tracing::warn!(%object, reason = %why, "caBundle self-check: the apiserver will not trust the served certificate; its calls to this webhook fail");
                            let ev = Event {
                                type_: EventType::Warning,
                                reason: "CABundleMismatch".to_owned(),
                                note: Some(event_note(why)),
                                action: "CheckCABundle".to_owned(),
                                secondary: None,
                            };
                            if let Err(error) = recorder.publish(&ev, &reference).await {
                                tracing::warn!(%object, %error, "cannot publish event");
                            }
                        }
                    }
                }
                *last = Some(outcome);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A fresh CA and a leaf for `dns` signed by it: (CA PEM, served chain).
    fn issued(dns: &str) -> (String, Vec<CertificateDer<'static>>) {
        let certs = crate::tls::dev::generate(&[dns.to_owned()], &[], 30).unwrap();
        let chain = CertificateDer::pem_slice_iter(certs.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        (certs.ca_cert, chain)
    }

    const NAME: &str = "etcd-webhook.etcd-system.svc";

    #[test]
    fn the_issuing_ca_is_trusted_for_the_service_name() {
        let (ca, chain) = issued(NAME);
        assert_eq!(verify(&chain, ca.as_bytes(), NAME, provider()), Ok(()));
        // A bundle with another CA beside it (as during a CA rotation) is fine too.
        let (other, _) = issued(NAME);
        let both = format!("{other}{ca}");
        assert_eq!(verify(&chain, both.as_bytes(), NAME, provider()), Ok(()));
    }

    #[test]
    fn each_way_the_apiserver_would_refuse_is_named() {
        let (ca, chain) = issued(NAME);
        let (other_ca, _) = issued(NAME);
        assert_eq!(verify(&chain, b"", NAME, provider()), Err(Mismatch::Empty));
        assert!(matches!(
            verify(&chain, b"not pem", NAME, provider()),
            Err(Mismatch::Unreadable(_))
        ));
        // Another CA of the same name (a re-issued CA: BadSignature) or of another name
        // (UnknownIssuer) both fail.
        let wrong_ca = verify(&chain, other_ca.as_bytes(), NAME, provider()).unwrap_err();
        assert!(
            matches!(&wrong_ca, Mismatch::NotTrusted { why, .. } if why.contains("BadSignature") || why.contains("UnknownIssuer")),
            "{wrong_ca}"
        );
        // Installed in another namespace: the Service name is not in the certificate.
        let elsewhere = "etcd-webhook.other.svc";
        let wrong_name = verify(&chain, ca.as_bytes(), elsewhere, provider()).unwrap_err();
        assert!(
            wrong_name
                .to_string()
                .contains("for etcd-webhook.other.svc")
                && wrong_name.to_string().contains("not valid for name"),
            "{wrong_name}"
        );
    }

    #[test]
    fn event_notes_fit_the_apis_limit() {
        let short = event_note("UnknownIssuer");
        assert!(short.contains("(UnknownIssuer)"), "{short}");
        let long = event_note(&"DnsName(\"a-long-name.example\"), ".repeat(100));
        assert!(long.len() <= 1000, "{}", long.len());
        assert!(long.ends_with("put the serving CA here"), "{long}");
    }

    #[test]
    fn url_hosts_are_what_is_verified() {
        assert_eq!(
            url_host("https://webhook.example:8443/validate"),
            "webhook.example"
        );
        assert_eq!(url_host("https://[::1]:8443/convert"), "::1");
        assert_eq!(url_host("https://127.0.0.1:9443"), "127.0.0.1");
    }

    #[test]
    fn labels_name_kind_and_object() {
        let labels: Vec<String> = Target::shipped().iter().map(Target::label).collect();
        assert_eq!(
            labels,
            [
                "mutatingwebhookconfiguration/etcd-webhook-mutating",
                "validatingwebhookconfiguration/etcd-webhook-validating",
                "customresourcedefinition/etcdclusters.etcd.example.com"
            ]
        );
    }
}
