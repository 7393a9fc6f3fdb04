//! The slim reconcile loop: each v1 EtcdCluster becomes a headless and a client Service, a
//! StatefulSet, a PodDisruptionBudget and (with backups) a CronJob, applied server-side with
//! the field manager `etcd-webhook`, plus a status and Events.
//!
//! The objects come from the pure functions in [`render`], the status from [`status`]. A pass
//! with nothing to change makes no API call: children are read from the caches the
//! controller's watches fill ([`Caches`]), and applied only when they lack something the
//! rendering says.
//!
//! By job: [`run`] wires the watches and the controller; [`reconcile`] (here) decides between
//! deletion and a live pass; `policy` is the live pass, with `membership` (scale-up), `storage`
//! (volume growth) and `backup` (the CronJob and the final snapshot); `children` reads and
//! applies the owned objects; `finalizer` and `status_writer` write the cluster itself;
//! [`rbac`] lists every call as RBAC rules; [`leader`] gates it all behind a Lease.

pub mod decide;
pub mod etcd;
pub mod lookups;
pub mod machinery;
pub mod pass;
pub mod render;
mod run;

pub use machinery::children::{Applied, Cached, Caches, Child, includes, slim_meta};
pub use machinery::rbac::{LEADER_RBAC_RULES, RBAC_RULES};
pub use run::{run, run_with_etcd};

use machinery::finalizer::{add_finalizer, has_finalizer};
use machinery::status_writer::update_status;
use pass::deletion::cleanup;
use pass::live::{apply_children, check_spec};

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::v1::EtcdCluster;
use crate::metrics::{Metrics, ResultLabel};
use decide::status::Observation;
use render::RenderOptions;

pub use crate::api::MANAGER;
pub const FINALIZER: &str = "etcd.example.com/finalizer";
/// On the member claims and the backup claim while backups are on: a claim is never deleted
/// (by the garbage collector after a foreground deletion, by a namespace deletion) before the
/// cluster's final snapshot is taken or the user lets it go ([`RELEASE_ANNOTATION`]).
pub const CLAIM_FINALIZER: &str = "etcd.example.com/final-snapshot";
/// `"true"` on a cluster being deleted: let its claims and the cluster go without a final
/// snapshot (when none can be taken, or the user does not want one).
pub const RELEASE_ANNOTATION: &str = "etcd.example.com/release-volumes";
/// How soon a pass looks again while etcd's membership changes.
const SETTLE: Duration = Duration::from_secs(5);
/// A cluster with no member ready is looked at this many resyncs apart: there is no etcd to
/// ask, and everything that could move it (a member turning ready changes the StatefulSet's
/// status, a Job ending, the spec changing) arrives as a watch event. Thousands of clusters
/// being created (or never scheduled) would otherwise keep the loop busy on passes that can
/// do nothing.
const IDLE_RESYNCS: u32 = 10;
/// Selects the children this loop made (the watches of owned objects use it).
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=etcd-webhook";

/// What a reconcile could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// A spec the webhook would have denied (it was bypassed, e.g. with failurePolicy Ignore):
    /// nothing is changed for it.
    #[error("{0}")]
    InvalidSpec(String),
    #[error("the {0} cache has not finished its first list")]
    CacheNotReady(&'static str),
    /// A cached object that does not decode as its kind (the cache keeps any JSON object the
    /// watch sent; the typed decode happens on read).
    #[error("the cached {kind} {name} does not decode: {reason}")]
    CacheDecode {
        kind: &'static str,
        name: String,
        reason: String,
    },
    /// A TLS cluster's client certificate cannot be used (not issued yet, or broken).
    #[error("{0}")]
    MemberTls(String),
}

impl Error {
    fn kube(action: &'static str, kind: &'static str, name: &str, source: kube::Error) -> Self {
        Error::Kube {
            action,
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }
}

/// The controller's settings (flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub render: RenderOptions,
    /// How long the finalizer waits for the final snapshot before giving up.
    pub finalizer_timeout: Duration,
    /// Periodic resync of a cluster with a member ready (ten times this with none).
    pub resync: Duration,
    /// Restrict to one namespace.
    pub namespace: Option<String>,
    /// This replica's name in Events (`reportingInstance`).
    pub instance: Option<String>,
    /// How long a member added to etcd may stay unstarted, and a started learner behind its
    /// leader, before it is removed.
    pub member_timeouts: decide::membership::Timeouts,
    /// At most this many passes run at once (0: no bound).
    pub max_concurrent_reconciles: u16,
    /// After the stop signal, passes still running get this long to finish; then they are
    /// abandoned (dropped between two API calls; the next leader's pass starts over).
    pub stop_timeout: Duration,
    /// Keep TLS clusters' client Secrets in a watch cache (needs list and watch on Secrets)
    /// instead of reading each by name every [`CLIENT_SECRET_REFRESH`].
    pub cache_client_secrets: bool,
}

/// How long a TLS cluster's client Secret, read by name, is used before it is read again (and
/// at once after a pass no member answered): a renewed certificate (cert-manager renews 30 days
/// ahead) is picked up within this, at one GET per TLS cluster per period (1,000 TLS clusters:
/// 3.3 a second at most, against 33 a second for one GET per 30 s resync).
pub const CLIENT_SECRET_REFRESH: Duration = Duration::from_secs(300);

/// After a pass no member answered, a TLS cluster's client Secret is read again once it is this
/// old: a renewed certificate or a new CA is picked up within a minute, and a cluster whose
/// members stay out of reach costs one GET a minute (1,000 such clusters: 16.7 a second), not
/// one a pass.
pub const CLIENT_SECRET_REREAD: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Self {
        Self {
            render: RenderOptions::default(),
            finalizer_timeout: Duration::from_secs(600),
            resync: Duration::from_secs(30),
            namespace: None,
            instance: None,
            member_timeouts: decide::membership::Timeouts::default(),
            max_concurrent_reconciles: 16,
            stop_timeout: Duration::from_secs(10),
            cache_client_secrets: false,
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    /// Where a pass reads the children: the watches' caches (also in the unit tests).
    caches: Caches,
    /// Consecutive failures per cluster, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The status last written per cluster uid, and when ([`update_status`]).
    written: Mutex<HashMap<String, (std::time::Instant, crate::api::v1::EtcdClusterStatus)>>,
    /// Clusters whose finalizer is waiting (the in-progress gauge).
    finalizing: Mutex<HashSet<String>>,
    /// Per cluster: a member whose defragmentation gave no answer in time, and until when etcd
    /// may still be at it (no other maintenance of the cluster starts before).
    defragmenting: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// Per TLS cluster: when its cert-manager objects were last looked for
    /// ([`certificates::ensure`]).
    certificates_checked: Mutex<HashMap<String, std::time::Instant>>,
    /// Which cluster files its snapshots in which bucket prefix, to warn when two share one.
    destinations: Mutex<pass::backup::Destinations>,
    /// How membership calls reach etcd ([`etcd::Gateway`]; an in-memory etcd in the tests).
    etcd: Arc<dyn etcd::Transport>,
    /// Per TLS cluster: the client Secret's resourceVersion and the transport made from it
    /// (kept while the Secret is unchanged, so its connections are reused).
    identities: Mutex<HashMap<String, Identity>>,
    /// Per TLS cluster, without `cache_client_secrets`: its client Secret as last read by name.
    client_secrets: Mutex<HashMap<String, ReadSecret>>,
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
        }
    }

    /// The same context with membership calls going through `transport`.
    pub fn with_etcd(mut self, transport: Box<dyn etcd::Transport>) -> Self {
        self.etcd = Arc::from(transport);
        self
    }

    /// How this pass reaches `ec`'s members: the shared transport for a plain cluster; for a
    /// TLS one, the client certificate of its Secret `NAME-client-tls`, read through the API
    /// on every pass (a renewed certificate is used on the next one).
    async fn etcd_for(&self, ec: &EtcdCluster) -> Result<Arc<dyn etcd::Transport>, Error> {
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
    async fn client_secret(
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
            if listed
                && let Some(s) = machinery::children::Children::of(ec, self)
                    .read::<Secret>(&name)
                    .await?
            {
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
    fn reread_client_secret(&self, ec: &EtcdCluster) {
        let key = format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any());
        if let Some(read) = self.client_secrets.lock().unwrap().get_mut(&key) {
            read.until = read.until.min(read.at + CLIENT_SECRET_REREAD);
        }
    }

    /// Forgets the client Secret read for `ec` (the cluster is gone).
    fn forget_client_secret(&self, ec: &EtcdCluster) {
        let key = format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any());
        self.client_secrets.lock().unwrap().remove(&key);
    }

    /// Publishes an Event about `ec`; a failure to publish is logged, never fatal.
    async fn event(&self, ec: &EtcdCluster, type_: EventType, reason: &str, note: String) {
        self.event_about(ec, None, type_, reason, note).await;
    }

    /// Publishes an Event about `ec` and, as its `related` object, the member pod `member`: the
    /// recorder folds a repeat into an existing Event only for the same related object, so the
    /// same reason for another member is an Event of its own. The note is cut to the 1 KiB the
    /// apiserver accepts.
    async fn event_about(
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

    fn finalizing(&self, ec: &EtcdCluster, waiting: bool) {
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
const CUT_MARKER: &str = " ... (cut)";

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

fn key(ec: &EtcdCluster) -> String {
    format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one EtcdCluster (the controller calls it; tests call it directly).
pub async fn reconcile(ec: Arc<EtcdCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&ec, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let label = if result.is_ok() { "success" } else { "error" };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabel { result: label })
        .inc();
    if result.is_ok() {
        ctx.failures.lock().expect("not poisoned").remove(&key(&ec));
    }
    // One line per pass, off by default (`--log-level info,etcd_webhook::controller::pass=debug`
    // turns it on): which cluster a pass was for, which the counter above cannot say.
    tracing::debug!(
        target: "etcd_webhook::controller::pass",
        cluster = %key(&ec),
        result = label,
        took_ms = started.elapsed().as_millis() as u64,
        "reconciled"
    );
    result
}

async fn reconcile_inner(ec: &EtcdCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = ec.namespace().unwrap_or_else(|| "default".to_owned());
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &ns);
    if ec.metadata.deletion_timestamp.is_some() {
        return cleanup(ec, ctx, &clusters).await;
    }
    // An invalid spec gets no finalizer either: nothing will be created for it, and the
    // validating webhook would deny the metadata update anyway (it judges the whole object).
    let outcome = match check_spec(ec) {
        Ok(()) if !has_finalizer(ec) => match add_finalizer(&clusters, ec).await {
            Ok(()) => apply_children(ec, ctx).await,
            Err(e) => Err(e),
        },
        Ok(()) => apply_children(ec, ctx).await,
        Err(invalid) => Err(invalid),
    };
    match outcome {
        Ok(seen) => {
            update_status(ctx, &clusters, ec, &seen).await?;
            // Progress (members turning ready, Jobs finishing) arrives as watch events of the
            // owned objects; the periodic resync only catches what a watch missed. etcd's
            // membership sends no events: while it moves, look again soon.
            if seen.settle {
                Ok(Action::requeue(SETTLE.min(ctx.settings.resync)))
            } else if seen.ready == 0 {
                Ok(Action::requeue(ctx.settings.resync * IDLE_RESYNCS))
            } else {
                Ok(Action::requeue(ctx.settings.resync))
            }
        }
        Err(error) => {
            let reason = match error {
                Error::InvalidSpec(_) => "InvalidSpec",
                _ => "ApplyFailed",
            };
            let seen = Observation {
                ready: ec
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0),
                failure: Some((reason, error.to_string())),
                ..Default::default()
            };
            // Best effort: the reason shows in the status; the error itself goes to backoff.
            if update_status(ctx, &clusters, ec, &seen)
                .await
                .unwrap_or(false)
            {
                ctx.event(ec, EventType::Warning, reason, error.to_string())
                    .await;
            }
            match error {
                // Not transient: wait for the spec to change (a watch event), check again at
                // the resync.
                Error::InvalidSpec(_) => Ok(Action::requeue(ctx.settings.resync)),
                _ => Err(error),
            }
        }
    }
}

/// Backoff after an error: 5 s doubling per consecutive failure of the same cluster, at most
/// 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(6));
    Duration::from_secs(secs.min(300))
}

pub fn error_policy(ec: Arc<EtcdCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let n = {
        let mut failures = ctx.failures.lock().expect("not poisoned");
        let n = failures.entry(key(&ec)).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(n);
    tracing::warn!(cluster = %key(&ec), %error, failures = n, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
