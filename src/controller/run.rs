//! The runtime wiring: one watch per owned kind feeds both its cache and the reconcile
//! triggers; the controller runs [`crate::controller::pass::reconcile::reconcile`] until stopped.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio_util::sync::CancellationToken;

use crate::api::v1::EtcdCluster;
use crate::controller::etcd::{Gateway, Transport};
use crate::controller::machinery::caches::{Cached, Caches, Child, slim_meta};
use crate::controller::machinery::children::MANAGED_SELECTOR;
use crate::controller::machinery::context::Context;
use crate::controller::machinery::settings::Settings;
use crate::controller::machinery::turns::Turns;
use crate::controller::pass::reconcile::error_policy;
use crate::controller::pass::reconcile::reconcile;
use crate::metrics::Metrics;

/// Trailing-edge debounce of reconcile requests.
const DEBOUNCE: Duration = Duration::from_millis(500);

fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `stop` is cancelled.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    run_with_etcd(
        client,
        settings,
        metrics,
        stop,
        Box::new(Gateway::default()),
    )
    .await;
}

/// [`run`], with etcd reached through `etcd` (the members' network, as a test harness has it).
pub async fn run_with_etcd(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    etcd: Box<dyn Transport>,
) {
    let ns = settings.namespace.clone();
    let ns = ns.as_deref();
    let owned = watcher::Config::default().labels(MANAGED_SELECTOR);
    // One watch per owned kind feeds both its cache and the reconcile triggers.
    fn cached<K: Child>(
        client: &Client,
        ns: Option<&str>,
        config: &watcher::Config,
    ) -> (
        Store<Cached<K>>,
        impl futures_util::Stream<Item = Result<Cached<K>, watcher::Error>> + Send + 'static,
    ) {
        let (reader, writer) = reflector::store();
        // Read off the wire straight into the caches' compact form (slimmed on the way).
        let stream = watcher(api_in::<Cached<K>>(client, ns), config.clone())
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        (reader, stream)
    }
    let (sets, sets_events) = cached::<StatefulSet>(&client, ns, &owned);
    let (services, services_events) = cached::<Service>(&client, ns, &owned);
    let (budgets, budgets_events) = cached::<PodDisruptionBudget>(&client, ns, &owned);
    let (crons, crons_events) = cached::<CronJob>(&client, ns, &owned);
    let (jobs, jobs_events) = cached::<Job>(&client, ns, &owned);
    // Claims trigger nothing (they change only through us); their events just fill the cache.
    let (claims, claims_events) = cached::<PersistentVolumeClaim>(&client, ns, &owned);
    let (configs, configs_events) = cached::<ConfigMap>(&client, ns, &owned);
    // Member pods fill a cache (lost volumes, the voter label); their readiness reaches the loop
    // through the StatefulSet's status.
    let (pods, pods_events) = cached::<Pod>(&client, ns, &owned);
    let (policies, policies_events) = cached::<NetworkPolicy>(&client, ns, &owned);
    // TLS clusters' client certificates, with --cache-client-secrets only (it needs list and
    // watch on Secrets): cached here instead of a GET every `CLIENT_SECRET_REFRESH`. They
    // trigger nothing (a renewed certificate is used on the next pass). Without the flag the
    // store stays empty and unread.
    let client_tls =
        watcher::Config::default().labels(&format!("{}=true", crate::api::CLIENT_TLS_LABEL));
    let (secrets, secrets_events) = cached::<Secret>(&client, ns, &client_tls);
    let secrets_events = if settings.cache_client_secrets {
        secrets_events.boxed()
    } else {
        futures_util::stream::empty().boxed()
    };
    let caches = Caches {
        sets,
        services,
        budgets,
        crons,
        jobs,
        claims,
        configs,
        pods,
        policies,
        secrets,
    };
    let turns = Arc::new(Turns::new(
        settings.max_concurrent_reconciles,
        metrics.clone(),
    ));
    let stop_timeout = settings.stop_timeout;
    let ctx = Arc::new(Context::new(client.clone(), settings, metrics, caches).with_etcd(etcd));
    tracing::info!(namespace = ns.unwrap_or("(all)"), "controller starting");
    let claims_stop = stop.clone();
    let claims_task = tokio::spawn(async move {
        let quiet =
            futures_util::stream::select(claims_events.map(|_| ()), secrets_events.map(|_| ()));
        tokio::select! {
            () = quiet.for_each(|()| async {}) => {}
            () = claims_stop.cancelled() => {}
        }
    });
    // The clusters' own cache, as slim as the children's: their managedFields (kubectl's, the
    // status writer's, the finalizer's) and last-applied annotation are never read.
    let (clusters, clusters_writer) = reflector::store();
    let clusters_events = watcher(
        api_in::<EtcdCluster>(&client, ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|ec: &mut EtcdCluster| slim_meta(&mut ec.metadata))
    .reflect(clusters_writer)
    .applied_objects();
    // The clusters' Certificates (cert-manager's; labelled as the loop's children): a client
    // Certificate's new revision (a renewal, a re-issue) has the client Secret read again and
    // brings the cluster's pass, so the loop holds the renewed certificate seconds after
    // cert-manager issued it. Without cert-manager (clusters with `certificates: Secrets`) or
    // without `list`/`watch` on Certificates, the list is refused and tried again with the
    // watcher's backoff (at most every 30 s), and the Secret is read by name every
    // `CLIENT_SECRET_REFRESH`, as before. The errors stop here: in a trigger stream of the
    // controller, each would pause every trigger for the controller's own backoff.
    let certificate_resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "cert-manager.io",
        "v1",
        "Certificate",
    ));
    let certificates_api = match ns {
        Some(ns) => Api::<kube::api::DynamicObject>::namespaced_with(
            client.clone(),
            ns,
            &certificate_resource,
        ),
        None => Api::all_with(client.clone(), &certificate_resource),
    };
    let revisions = crate::controller::pass::certificates::ClientRevisions::default();
    let renewals = ctx.clone();
    let refused = std::sync::atomic::AtomicBool::new(false);
    let renewed_clusters = watcher(certificates_api, owned.clone())
        .default_backoff()
        .filter_map(move |event| {
            use std::sync::atomic::Ordering::Relaxed;
            let renewed = match event {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                    refused.store(false, Relaxed);
                    revisions.renewed(&c).inspect(|cluster| {
                        tracing::info!(
                            %cluster,
                            certificate = %kube::ResourceExt::name_any(&c),
                            "the client certificate was issued anew: its Secret is read again"
                        );
                        renewals.client_certificate_renewed(cluster);
                    })
                }
                Ok(watcher::Event::Delete(c)) => {
                    revisions.forget(&c);
                    None
                }
                Ok(_) => None,
                Err(error) if !refused.swap(true, Relaxed) => {
                    tracing::info!(
                        %error,
                        "the clusters' Certificates cannot be watched (cert-manager not installed, or the ClusterRole without list and watch on certificates.cert-manager.io): a renewed client certificate is read within 5 minutes instead"
                    );
                    None
                }
                Err(error) => {
                    tracing::debug!(%error, "the clusters' Certificates cannot be watched");
                    None
                }
            };
            std::future::ready(renewed)
        });
    let pass = in_turn(clusters.clone(), stop.clone(), turns);
    let controller = Controller::for_stream(clusters_events, clusters)
        .owns_stream(sets_events)
        .owns_stream(services_events)
        .owns_stream(budgets_events)
        .owns_stream(crons_events)
        .owns_stream(jobs_events)
        .owns_stream(configs_events)
        .owns_stream(policies_events)
        // A backup pod that ends brings its cluster's pass (the loop records its report); member
        // pods fill the cache only (their readiness comes through the StatefulSet's status).
        .watches_stream(pods_events, backup_pod_owner)
        .reconcile_on(renewed_clusters)
        // Coalesce the bursts of events one pass causes (its own writes coming back through the
        // watches), so the next pass sees them all in the caches. No bound here: the turns
        // bound the passes (kube-runtime's own bound picks waiting clusters in hash order).
        .with_config(
            controller::Config::default()
                .debounce(DEBOUNCE)
                .concurrency(0),
        )
        // On stop: no new passes; the running ones may finish...
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(pass, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(cluster = %obj, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile error (see the warning above)"),
            }
        });
    // ...within the stop timeout; then they are dropped (between two API calls: each write is
    // one request, and the next pass starts from what the API server holds).
    let deadline = async {
        stop.cancelled().await;
        tokio::time::sleep(stop_timeout).await;
    };
    tokio::select! {
        () = controller => tracing::info!("controller stopped"),
        () = deadline => tracing::warn!(
            timeout = ?stop_timeout,
            "controller stopped: passes still running after --controller-stop-timeout were abandoned"
        ),
    }
    claims_task.abort();
}

/// The cluster of a backup pod (scheduled or final snapshot, or a rebuild's rescue) that has
/// ended.
fn backup_pod_owner(
    cached: Cached<Pod>,
) -> Option<kube::runtime::reflector::ObjectRef<EtcdCluster>> {
    use kube::ResourceExt;
    let labels = cached.labels();
    let component = labels.get("app.kubernetes.io/component")?;
    if !matches!(component.as_str(), "backup" | "final-snapshot" | "rescue") {
        return None;
    }
    let pod = cached.object().ok()?;
    let ended = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()));
    if !ended {
        return None;
    }
    Some(
        kube::runtime::reflector::ObjectRef::new(labels.get("app.kubernetes.io/instance")?)
            .within(&pod.namespace()?),
    )
}

/// One pass of the loop as kube-runtime runs it.
type Pass = std::pin::Pin<
    Box<dyn Future<Output = Result<Action, crate::controller::machinery::error::Error>> + Send>,
>;

/// The reconciler kube-runtime runs: each pass waits for its turn (first come, first served;
/// see `turns`), then reads the cluster again: the object kube-runtime handed over may have
/// waited a while. Thousands may wait at once, so a waiting pass holds only the cluster's name
/// (not the object, which may have been replaced in the cache since) and the pass itself is
/// boxed when it starts (unboxed, every waiting future would be as large as a running pass).
pub(crate) fn in_turn(
    clusters: Store<EtcdCluster>,
    stop: CancellationToken,
    turns: Arc<Turns>,
) -> impl FnMut(Arc<EtcdCluster>, Arc<Context>) -> Pass {
    move |ec: Arc<EtcdCluster>, ctx: Arc<Context>| {
        let (clusters, stop, turns) = (clusters.clone(), stop.clone(), turns.clone());
        let key = ObjectRef::from_obj(&*ec);
        drop(ec);
        Box::pin(async move {
            let Some(turn) = turns.wait(&stop).await else {
                // Stopping: the pass is not run (the next leader starts over).
                return Ok(Action::await_change());
            };
            let pass = async move {
                match clusters.get(&key) {
                    Some(now) => {
                        let span = crate::otel::pass_span(
                            key.namespace.as_deref().unwrap_or_default(),
                            &key.name,
                        );
                        let result = tracing::Instrument::instrument(
                            Box::pin(reconcile(now, ctx)),
                            span.clone(),
                        )
                        .await;
                        span.record("result", if result.is_ok() { "success" } else { "error" });
                        result
                    }
                    // Deleted while it waited: nothing left to do.
                    None => Ok(Action::await_change()),
                }
            };
            // In its turn, which it may leave while it waits on etcd (`turns::outside`).
            turns.run(turn, &stop, pass).await
        })
    }
}
