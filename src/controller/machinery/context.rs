//! What every pass shares: the API client, the settings, the metrics, the Event recorder, the
//! caches of owned objects, how etcd is reached (a TLS cluster's client identity included),
//! and the little the loop remembers per cluster between passes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};

use super::caches::{self, Caches, Child};
use super::error::Error;
use super::settings::{CLIENT_SECRET_REFRESH, CLIENT_SECRET_REREAD, Settings};
use crate::api::MANAGER;
use crate::api::v1::EtcdCluster;
use crate::controller::decide::backup::Destinations;
use crate::controller::etcd;
use crate::controller::render;
use crate::metrics::Metrics;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub(crate) recorder: Recorder,
    /// Where a pass reads the children: the watches' caches (also in the unit tests).
    pub(crate) caches: Caches,
    /// Consecutive failures per cluster, for the backoff.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// The status last written per cluster uid, and when ([`update_status`]).
    pub(crate) written:
        Mutex<HashMap<String, (std::time::Instant, crate::api::v1::EtcdClusterStatus)>>,
    /// Clusters whose finalizer is waiting (the in-progress gauge).
    pub(crate) finalizing: Mutex<HashSet<String>>,
    /// Per cluster: a member whose defragmentation gave no answer in time, and until when etcd
    /// may still be at it (no other maintenance of the cluster starts before).
    pub(crate) defragmenting: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// Per TLS cluster: when its cert-manager objects were last looked for
    /// ([`certificates::ensure`]).
    pub(crate) certificates_checked: Mutex<HashMap<String, std::time::Instant>>,
    /// Which cluster files its snapshots in which bucket prefix, to warn when two share one.
    pub(crate) destinations: Mutex<Destinations>,
    /// How membership calls reach etcd ([`etcd::Gateway`]; an in-memory etcd in the tests).
    pub(crate) etcd: Arc<dyn etcd::Transport>,
    /// Per TLS cluster: the client Secret's resourceVersion and the transport made from it
    /// (kept while the Secret is unchanged, so its connections are reused).
    pub(crate) identities: Mutex<HashMap<String, Identity>>,
    /// Per TLS cluster, without `cache_client_secrets`: its client Secret as last read by name.
    client_secrets: Mutex<HashMap<String, ReadSecret>>,
    /// Per cluster whose quorum is lost: the reason of the diagnosis this replica last made.
    /// A pass can start on a cached object that does not show the status the pass before
    /// it wrote yet; this keeps such a pass from telling the same Warning again.
    pub(crate) quorum_said: Mutex<HashMap<String, &'static str>>,
}

/// A TLS cluster's client Secret's resourceVersion and the transport made from it.
type Identity = (String, Arc<dyn etcd::Transport>);

/// A client Secret read by name: when, until when it is used, and the Secret. (tokio's clock: a
/// test runs periods of it in paused time.)
struct ReadSecret {
    at: tokio::time::Instant,
    until: tokio::time::Instant,
    secret: Arc<k8s_openapi::api::core::v1::Secret>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>, caches: Caches) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: settings.instance.clone(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics,
            caches,
            failures: Mutex::default(),
            written: Mutex::default(),
            finalizing: Mutex::default(),
            defragmenting: Mutex::default(),
            certificates_checked: Mutex::default(),
            destinations: Mutex::default(),
            etcd: Arc::new(etcd::Gateway::default()),
            identities: Mutex::default(),
            client_secrets: Mutex::default(),
            quorum_said: Mutex::default(),
        }
    }

    /// The same context with membership calls going through `transport`.
    pub fn with_etcd(mut self, transport: Box<dyn etcd::Transport>) -> Self {
        self.etcd = Arc::from(transport);
        self
    }

    /// How this pass reaches `ec`'s members: the shared transport for a plain cluster; for a
    /// TLS one, the client certificate of its Secret `NAME-client-tls` ([`Self::client_secret`]:
    /// read by name at most every [`CLIENT_SECRET_REFRESH`]), with a transport made anew
    /// whenever the Secret's resourceVersion is not the one it was made from.
    pub async fn etcd_for(&self, ec: &EtcdCluster) -> Result<Arc<dyn etcd::Transport>, Error> {
        if !crate::api::tls_on(&ec.spec) {
            return Ok(self.etcd.clone());
        }
        let ns = ec.namespace().unwrap_or_default();
        let name = render::Purpose::Client.secret(ec);
        let secret = self.client_secret(ec).await?.ok_or_else(|| {
            let maker = if ec.spec.tls.as_ref().and_then(|t| t.certificates)
                == Some(crate::api::v1::CertificateSource::Secrets)
            {
                "spec.tls.certificates is Secrets: make it, with tls.crt, tls.key and ca.crt"
                    .to_owned()
            } else {
                format!(
                    "cert-manager issues it from Certificate {}",
                    render::Purpose::Client.certificate(ec)
                )
            };
            Error::MemberTls(format!(
                "the client certificate Secret {name} is not there yet ({maker})"
            ))
        })?;
        let key = format!("{ns}/{}", ec.name_any());
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Some((v, t)) = self.identities.lock().unwrap().get(&key)
            && *v == version
        {
            return Ok(t.clone());
        }
        let data = secret.data.clone().unwrap_or_default();
        let field = |k: &str| {
            data.get(k)
                .map(|b| b.0.clone())
                .ok_or_else(|| Error::MemberTls(format!("the Secret {name} has no {k}")))
        };
        let identity = etcd::ClientTls {
            ca: field(render::TLS_CA)?,
            cert: field(render::TLS_CERT)?,
            key: field(render::TLS_KEY)?,
        };
        let transport = self
            .etcd
            .with_identity(&identity)
            .map_err(|e| Error::MemberTls(format!("the Secret {name}: {e}")))?;
        // Said once per Secret version, so a renewal is seen to reach the loop, and kept in
        // the metrics, so that a certificate the loop holds to its end is alerted on.
        let info = first_cert(&identity.cert);
        if let Some(Ok(i)) = &info {
            self.metrics
                .member_client_cert_not_after
                .get_or_create(&crate::metrics::ClusterLabels {
                    namespace: ns.clone(),
                    name: ec.name_any(),
                })
                .set(i.not_after);
        }
        tracing::info!(
            cluster = %key,
            secret = %name,
            resource_version = %version,
            certificate = %describe(&info),
            "the members' client certificate loaded"
        );
        self.identities
            .lock()
            .unwrap()
            .insert(key, (version, transport.clone()));
        Ok(transport)
    }

    /// A TLS cluster's client Secret `NAME-client-tls`: with `cache_client_secrets`, from the
    /// watch cache when it carries the label (cert-manager's do); else (and while the cache has
    /// not listed yet) read by name at most every [`CLIENT_SECRET_REFRESH`] (a missing one on
    /// every pass, until it is there).
    pub(crate) async fn client_secret(
        &self,
        ec: &EtcdCluster,
    ) -> Result<Option<Arc<k8s_openapi::api::core::v1::Secret>>, Error> {
        use k8s_openapi::api::core::v1::Secret;
        let ns = ec.namespace().unwrap_or_default();
        let name = render::Purpose::Client.secret(ec);
        let key = format!("{ns}/{}", ec.name_any());
        if self.settings.cache_client_secrets {
            let listed = futures_util::FutureExt::now_or_never(
                <Secret as Child>::cache(&self.caches).wait_until_ready(),
            )
            .is_some_and(|r| r.is_ok());
            if listed && let Some(s) = caches::get(Secret::cache(&self.caches), &ns, &name)? {
                return Ok(Some(s));
            }
        }
        if let Some(read) = self.client_secrets.lock().unwrap().get(&key)
            && tokio::time::Instant::now() < read.until
        {
            return Ok(Some(read.secret.clone()));
        }
        let read = Api::<Secret>::namespaced(self.client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube("get", "Secret", &name, e))?
            .map(Arc::new);
        let mut memo = self.client_secrets.lock().unwrap();
        match &read {
            Some(s) => {
                let at = tokio::time::Instant::now();
                let until = at + CLIENT_SECRET_REFRESH;
                let secret = s.clone();
                memo.insert(key, ReadSecret { at, until, secret });
            }
            _ => {
                memo.remove(&key);
            }
        }
        Ok(read)
    }

    /// No member answered with the client Secret read by name for `ec` (a renewed certificate,
    /// a new CA?): it is read again once it is [`CLIENT_SECRET_REREAD`] old rather than
    /// [`CLIENT_SECRET_REFRESH`].
    pub(crate) fn reread_client_secret(&self, ec: &EtcdCluster) {
        let key = key(ec);
        if let Some(read) = self.client_secrets.lock().unwrap().get_mut(&key) {
            read.until = read.until.min(read.at + CLIENT_SECRET_REREAD);
        }
    }

    /// The client Certificate of `cluster` was issued anew: its Secret is read again on the
    /// next pass (it holds the new certificate by then: cert-manager writes the Secret before
    /// it moves the Certificate's revision).
    pub(crate) fn client_certificate_renewed(
        &self,
        cluster: &kube::runtime::reflector::ObjectRef<EtcdCluster>,
    ) {
        let key = cluster_key(
            cluster.namespace.as_deref().unwrap_or_default(),
            &cluster.name,
        );
        self.client_secrets.lock().unwrap().remove(&key);
    }

    /// Forgets the client Secret read for `ec` (the cluster is gone).
    pub(crate) fn forget_client_secret(&self, ec: &EtcdCluster) {
        self.client_secrets.lock().unwrap().remove(&key(ec));
    }

    /// Publishes an Event about `ec`; a failure to publish is logged, never fatal.
    pub(crate) async fn event(
        &self,
        ec: &EtcdCluster,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.event_about(ec, None, type_, reason, note).await;
    }

    /// Publishes an Event about `ec` and, as its `related` object, the member pod `member`: the
    /// recorder folds a repeat into an existing Event only for the same related object, so the
    /// same reason for another member is an Event of its own. The note is cut to the 1 KiB the
    /// apiserver accepts.
    pub(crate) async fn event_about(
        &self,
        ec: &EtcdCluster,
        member: Option<&str>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note = cut_note(note);
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: member.map(|pod| k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(pod.to_owned()),
                namespace: ec.namespace(),
                ..Default::default()
            }),
        };
        if let Err(error) = self.recorder.publish(&ev, &ec.object_ref(&())).await {
            tracing::warn!(%error, cluster = %key(ec), reason, "cannot publish event");
        }
    }

    pub(crate) fn finalizing(&self, ec: &EtcdCluster, waiting: bool) {
        let mut set = self.finalizing.lock().expect("not poisoned");
        if waiting {
            set.insert(key(ec));
        } else {
            set.remove(&key(ec));
        }
        self.metrics.finalizers_in_progress.set(set.len() as i64);
    }
}

/// The most an Event's note may hold: the apiserver refuses a longer one (bytes, as Go's `len`).
pub const EVENT_NOTE_MAX: usize = 1024;
/// What ends a note [`cut_note`] shortened.
pub(crate) const CUT_MARKER: &str = " ... (cut)";

/// `note` as the apiserver accepts it: at most [`EVENT_NOTE_MAX`] bytes, cut on a character
/// boundary and ending in [`CUT_MARKER`] when it was longer.
pub fn cut_note(mut note: String) -> String {
    if note.len() <= EVENT_NOTE_MAX {
        return note;
    }
    let mut cut = EVENT_NOTE_MAX - CUT_MARKER.len();
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    note.truncate(cut);
    note.push_str(CUT_MARKER);
    note
}

pub(crate) fn key(ec: &EtcdCluster) -> String {
    cluster_key(&ec.namespace().unwrap_or_default(), &ec.name_any())
}

/// [`key`] of the cluster `name` in `ns`.
fn cluster_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The first certificate of a PEM bundle, read: `None` when there is none.
fn first_cert(pem: &[u8]) -> Option<Result<crate::tls::CertInfo, String>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .next()
        .and_then(Result::ok)
        .map(|der| crate::tls::cert_info(&der))
}

/// The first certificate of a PEM bundle as the log says it: its serial (hex, as openssl
/// prints it) and when it expires.
fn describe(info: &Option<Result<crate::tls::CertInfo, String>>) -> String {
    match info {
        Some(Ok(i)) => {
            let until = k8s_openapi::jiff::Timestamp::from_second(i.not_after)
                .map_or_else(|_| i.not_after.to_string(), |t| t.to_string());
            format!("serial {}, not after {until}", i.serial)
        }
        Some(Err(e)) => format!("unreadable: {e}"),
        None => "no certificate".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_log_names_a_client_certificate_by_serial_and_expiry() {
        let pem = rcgen::generate_simple_self_signed(vec!["etcd-client".to_owned()])
            .unwrap()
            .cert
            .pem();
        let said = super::describe(&super::first_cert(pem.as_bytes()));
        assert!(
            said.starts_with("serial ") && said.contains(", not after 4096-01-01T00:00:00Z"),
            "{said}"
        );
        assert_eq!(
            super::describe(&super::first_cert(b"not PEM")),
            "no certificate"
        );
    }
}
