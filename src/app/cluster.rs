//! What the server starts against the Kubernetes API, when it has one: the client of
//! `--cert-secret`, the caBundle self-check and the reconcile loop (behind the leader Lease).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Error;
use crate::cli::{ControllerArgs, ControllerMode, ServeArgs};
use crate::controller::{self, machinery::leader};
use crate::metrics::Metrics;
use crate::tls::{self, CertStore};

/// Where a pod's service account namespace is mounted.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The install's namespace, the Lease's home when nothing else says.
const DEFAULT_NAMESPACE: &str = crate::api::WEBHOOK_NAMESPACE;

/// The namespace this process is installed in: POD_NAMESPACE, else the service account's
/// inside a pod, else the default install's.
pub fn install_namespace() -> String {
    pod_namespace().unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

/// The pod's own namespace: POD_NAMESPACE (the downward API), else the service account's.
fn pod_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .or_else(|| service_account_namespace(in_pod()))
}

fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// The service account's namespace, read from its mounted file inside a pod.
fn service_account_namespace(in_pod: bool) -> Option<String> {
    in_pod
        .then(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
        .flatten()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// The inferred config (KUBECONFIG or in-cluster), or None where `mode` is `auto` and it
/// cannot be used (logged as `feature` being off; an error names `flag`).
async fn config(
    mode: ControllerMode,
    feature: &str,
    flag: &'static str,
) -> Result<Option<kube::Config>, Error> {
    match kube::Config::infer().await {
        Ok(c) => Ok(Some(c)),
        Err(e) if mode == ControllerMode::Auto => {
            tracing::warn!(error = %e, "{feature} off: the Kubernetes config cannot be used");
            Ok(None)
        }
        Err(error) => Err(Error::KubeConfig { what: flag, error }),
    }
}

/// The Kubernetes client `--cert-secret` reads through, and the Secret with its namespace
/// filled in (the pod's, else the kubeconfig context's).
pub(super) async fn cert_secret_client(
    secret: tls::source::SecretRef,
) -> Result<(tls::source::SecretRef, kube::Client), Error> {
    let config = config(ControllerMode::On, "--cert-secret", "--cert-secret")
        .await?
        .expect("`on` has a config or an error");
    let client = kube::Client::try_from(config).map_err(Error::KubeClient)?;
    let secret = secret
        .in_namespace(|| pod_namespace().unwrap_or_else(|| client.default_namespace().to_owned()));
    tracing::info!(%secret, "serving certificate: read from the Secret through the API (--cert-secret)");
    Ok((secret, client))
}

/// Starts the webhook's own reads of the cluster where they apply: the caBundle self-check
/// (tls::cabundle), the StorageClasses `/validate` warns about and its look for a credentials
/// Secret. `on` without a usable
/// Kubernetes config is an error, `auto` outside a pod or without one is a log line.
pub(super) async fn start_cabundle_check(
    args: &ServeArgs,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    storage_classes: Arc<crate::controller::lookups::storage_classes::Cache>,
    secrets: Arc<crate::controller::lookups::credentials::Lookup>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    match args.cabundle_check {
        ControllerMode::Off => return Ok(()),
        ControllerMode::Auto if !in_pod() => {
            tracing::info!("caBundle self-check off: not in a pod (--cabundle-check auto)");
            return Ok(());
        }
        _ => {}
    }
    let Some(config) = config(
        args.cabundle_check,
        "caBundle self-check",
        "--cabundle-check on",
    )
    .await?
    else {
        return Ok(());
    };
    let client = kube::Client::try_from(config).map_err(Error::KubeClient)?;
    secrets.set_client(client.clone());
    tokio::spawn(crate::controller::lookups::storage_classes::run(
        client.clone(),
        storage_classes,
        shutdown.clone(),
    ));
    tokio::spawn(tls::cabundle::run(
        client,
        store,
        tls::cabundle::Target::shipped(),
        args.cabundle_check_interval,
        metrics,
        std::env::var("HOSTNAME").ok(),
        shutdown,
    ));
    Ok(())
}

/// Starts the reconcile loop when `--controller` says so (behind the leader Lease unless
/// `--leader-elect=false`). `None` when it stays off.
pub(super) async fn start_controller(
    args: &ControllerArgs,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Result<Option<JoinHandle<()>>, Error> {
    // Only a pod reconciles on its own: a laptop with KUBECONFIG set must not start a second
    // reconciler against whatever cluster that file points at.
    let in_pod = in_pod();
    match args.mode {
        ControllerMode::Off => {
            tracing::info!("controller off (--controller off): webhooks only");
            return Ok(None);
        }
        ControllerMode::Auto if !in_pod => {
            tracing::info!(
                "controller off: not in a pod (--controller auto); webhooks only. --controller on reconciles the cluster of KUBECONFIG"
            );
            return Ok(None);
        }
        _ => {}
    }
    let Some(config) = config(args.mode, "controller", "--controller on").await? else {
        return Ok(None);
    };
    // POD_NAMESPACE (the flag's env), else the pod's service account namespace, else
    // etcd-system: never the kubeconfig context's, which would put a laptop's Lease where the
    // in-cluster replicas never look.
    let lease_namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| service_account_namespace(in_pod))
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    tracing::info!(server = %config.cluster_url, %lease_namespace, "controller: reconciling EtcdClusters of this API server");
    // The loop's requests go through the client-side limit; the Lease has a client of its own
    // (as client-go's leader election does), so a busy loop never delays a renewal.
    let lease_client = kube::Client::try_from(config.clone()).map_err(Error::KubeClient)?;
    let limits = controller::machinery::throttle::Limits {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
    };
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(Error::KubeClient)?
        .with_layer(&controller::machinery::throttle::ThrottleLayer::new(
            limits,
            metrics.clone(),
        ))
        .build();
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("etcd-webhook-{}", std::process::id()));
    for (flag, set) in [
        ("--backup-helper-image", &args.images.backup_helper_image),
        ("--backup-s3-image", &args.images.backup_s3_image),
    ] {
        if set.is_some() {
            tracing::warn!(
                flag,
                backup_image = ?args.images.backup_image,
                "{flag} is no longer used and is ignored: the backup Jobs run --backup-image's `etcd-webhook backup`"
            );
        }
    }
    let settings = controller::Settings {
        render: (&args.images).into(),
        finalizer_timeout: args.finalizer_timeout,
        resync: args.resync_interval,
        namespace: args.watch_namespace.clone(),
        instance: Some(identity.clone()),
        member_timeouts: controller::decide::membership::Timeouts {
            join: args.member_join_timeout,
            promote: args.member_promote_timeout,
        },
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        stop_timeout: args.controller_stop_timeout,
        cache_client_secrets: args.cache_client_secrets,
    };
    // The Jobs' image: --backup-image, else this pod's own (read before the loop starts, in
    // the loop's task: the webhooks are serving already and do not wait for it).
    let own_image = args
        .images
        .backup_image
        .as_deref()
        .is_none_or(|i| i.trim().is_empty())
        .then(|| {
            let pod_name = std::env::var("POD_NAME")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok())
                .filter(|n| !n.trim().is_empty());
            (
                lease_client.clone(),
                pod_namespace().unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
                pod_name.filter(|_| in_pod),
            )
        });
    let mut settings = settings;
    if !args.leader_elect {
        tracing::info!("leader election off: this replica reconciles");
        metrics.leader.set(1);
        return Ok(Some(tokio::spawn(async move {
            if let Some((client, ns, pod)) = own_image {
                settings.render.backup_image = jobs_image(client, &ns, pod).await;
            }
            controller::run(client, settings, metrics, stop).await
        })));
    }
    let duration = args.lease_duration.as_secs().max(2);
    let lease = leader::LeaseSettings {
        duration_secs: duration,
        grace_secs: (duration / 3).max(1),
        ..leader::LeaseSettings::new(lease_namespace, identity)
    };
    Ok(Some(tokio::spawn(async move {
        if let Some((client, ns, pod)) = own_image {
            settings.render.backup_image = jobs_image(client, &ns, pod).await;
        }
        let work = {
            let (client, metrics) = (client.clone(), metrics.clone());
            move |token: CancellationToken| {
                controller::run(client.clone(), settings.clone(), metrics.clone(), token)
            }
        };
        leader::run_when_leader(lease_client, lease, metrics, stop, work).await
    })))
}

/// The image of this pod's own container (`controller::lookups::own_image`), tried a few times (the
/// apiserver may not answer at once); outside a pod, or when it cannot be read, the
/// compiled-in default, with an error in the log that says which flag to set.
async fn jobs_image(client: kube::Client, namespace: &str, pod: Option<String>) -> String {
    let fallback = crate::controller::render::DEFAULT_BACKUP_IMAGE;
    if pod.is_none() {
        tracing::info!(
            image = fallback,
            "not in a pod: the backup, restore and final-snapshot Jobs run the compiled-in image (--backup-image sets another)"
        );
        return fallback.to_owned();
    }
    let mut delay = std::time::Duration::from_millis(500);
    for attempt in 1..=5 {
        match crate::controller::lookups::own_image::lookup(client.clone(), namespace, pod.clone())
            .await
        {
            Ok(image) => {
                tracing::info!(%image, "the backup, restore and final-snapshot Jobs run this pod's own image (--backup-image sets another)");
                return image;
            }
            Err(e @ crate::controller::lookups::own_image::OwnImageError::Read { .. })
                if attempt < 5 =>
            {
                tracing::debug!(error = %e, attempt, "reading this pod's image; trying again");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => {
                tracing::error!(error = %e, image = fallback, "cannot read this pod's own image: the backup, restore and final-snapshot Jobs run the compiled-in image, which may not exist in your registry; set --backup-image (or grant get on this pod)");
                break;
            }
        }
    }
    fallback.to_owned()
}
