//! The server process as a library: [`start`] brings up the health port, the certificate
//! source, the TLS listener, the reconcile loop and the caBundle self-check, and returns a
//! [`Running`] server; [`serve`] is what `etcd-webhook serve` runs (the same, until a signal).
//! Tests start the server in-process with [`start`] on port 0 and read its addresses from
//! [`Running`].

mod certs;
mod cluster;
pub use cluster::install_namespace;
pub mod logging;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;
use crate::health::{self, Readiness};
use crate::listen::Listeners;
use crate::metrics::Metrics;
use crate::tls::client_auth::ReloadingVerifier;
use crate::tls::source::CertSource;
use crate::tls::watch::{Reloader, WatchOptions};
use crate::tls::{self, CertError, CertStore};
use crate::{server, webhook};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {flag} {addr}: {error}")]
    Listen {
        flag: &'static str,
        addr: String,
        error: std::io::Error,
    },
    #[error("cannot load --client-ca {}: {error}", path.display())]
    ClientCa { path: PathBuf, error: CertError },
    #[error("{what}: no usable Kubernetes config (in a pod, or KUBECONFIG): {error}")]
    KubeConfig {
        what: &'static str,
        error: kube::config::InferConfigError,
    },
    #[error("cannot build the Kubernetes client: {0}")]
    KubeClient(kube::Error),
    /// No usable serving certificate within --cert-wait; the message says what was wrong.
    #[error("{0}")]
    NoCertificate(String),
    #[error("shut down while waiting for a certificate")]
    ShutDownWhileWaiting,
    #[error("development certificate: {0}")]
    DevCert(#[from] CertError),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The multi-threaded runtime every command that talks to a network runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// How a shutdown proceeds: [`Shutdown::stop_controller`] stops the reconcile loop and waits
/// until its passes have finished or been abandoned and its Lease is released, while readiness
/// stays on and the webhooks serve (the loop's own writes need `/convert`, which may be this
/// very process); [`Shutdown::begin`] then turns readiness off, and [`Shutdown::finish`]
/// stops accepting and drains.
#[derive(Clone, Debug)]
pub struct Shutdown {
    readiness: Arc<Readiness>,
    controller: CancellationToken,
    /// Cancelled when the reconcile loop has stopped (at once when there is none).
    controller_stopped: CancellationToken,
    server: CancellationToken,
}

impl Shutdown {
    /// Stops the reconcile loop and waits, at most `within`, until it has stopped; whether it
    /// did.
    pub async fn stop_controller(&self, within: Duration) -> bool {
        self.controller.cancel();
        tokio::time::timeout(within, self.controller_stopped.cancelled())
            .await
            .is_ok()
    }

    pub fn begin(&self) {
        self.readiness.begin_shutdown();
        self.controller.cancel();
    }

    pub fn finish(&self) {
        self.begin();
        self.server.cancel();
    }
}

/// A started server.
pub struct Running {
    /// The TLS listener's first address (port 0 resolved).
    pub addr: SocketAddr,
    /// The health port's first address.
    pub health_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
    pub shutdown: Shutdown,
    server: JoinHandle<()>,
    controller: Option<JoinHandle<()>>,
    health: JoinHandle<()>,
}

impl Running {
    /// Waits until the server has drained (after [`Shutdown::finish`]) and the reconcile loop
    /// and the health port have stopped.
    pub async fn wait(self) {
        let _ = self.server.await;
        self.shutdown.finish();
        if let Some(task) = self.controller
            && tokio::time::timeout(Duration::from_secs(15), task)
                .await
                .is_err()
        {
            tracing::warn!("the controller did not stop within 15s");
        }
        let _ = self.health.await;
        tracing::info!("stopped");
    }
}

/// `etcd-webhook serve`: starts, then runs until SIGTERM/SIGINT and drains.
pub async fn serve(args: ServeArgs) -> Result<(), Error> {
    let delay = args.shutdown_delay;
    // The loop's own bound, plus the Lease's release (at most 5 s) and a margin.
    let controller_stop = args.controller.controller_stop_timeout + Duration::from_secs(10);
    let running = start(args).await?;
    tokio::spawn(shutdown_on_signal(
        running.shutdown.clone(),
        controller_stop,
        delay,
    ));
    running.wait().await;
    Ok(())
}

async fn bind(flag: &'static str, addr: &crate::listen::ListenAddr) -> Result<Listeners, Error> {
    Listeners::bind(addr).await.map_err(|error| Error::Listen {
        flag,
        addr: addr.to_string(),
        error,
    })
}

/// Starts everything `serve` runs and returns once the TLS listener accepts.
pub async fn start(args: ServeArgs) -> Result<Running, Error> {
    let (source, secret_client) = match (&args.cert_dir, &args.cert_secret) {
        (Some(dir), _) => (CertSource::Dir(dir.clone()), None),
        (None, Some(secret)) => {
            let (secret, client) = cluster::cert_secret_client(secret.clone()).await?;
            (CertSource::Secret(secret), Some(client))
        }
        (None, None) => (CertSource::Dir(certs::dev_cert_dir()?), None),
    };
    let dev = args.cert_dir.is_none() && args.cert_secret.is_none();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let metrics = Arc::new(Metrics::new());
    let store = CertStore::new();
    let readiness = Readiness::new(store.clone());
    let storage_classes = Arc::new(crate::controller::lookups::storage_classes::Cache::default());
    let secrets = Arc::new(crate::controller::lookups::credentials::Lookup::default());
    let state = Arc::new(webhook::AppState {
        max_body_bytes: args.max_body_bytes,
        max_convert_body_bytes: args.max_convert_body_bytes,
        request_timeout: args.request_timeout,
        readiness: readiness.clone(),
        metrics: metrics.clone(),
        settings: crate::admission::Settings {
            default_storage_class: args.default_storage_class.clone(),
            default_member_tls: args.default_member_tls,
            storage_classes: Some(storage_classes.clone()),
            secrets: Some(secrets.clone()),
        },
    });
    let server_stop = CancellationToken::new();
    let shutdown = Shutdown {
        readiness: readiness.clone(),
        controller: CancellationToken::new(),
        controller_stopped: CancellationToken::new(),
        server: server_stop.clone(),
    };

    // The health port comes up first: readiness is false until the TLS listener serves.
    let health_listener = bind("--health-addr", &args.health_addr).await?;
    let health_addr = health_listener
        .local_addr()
        .map_err(|error| Error::Listen {
            flag: "--health-addr",
            addr: args.health_addr.to_string(),
            error,
        })?;
    tracing::info!(addr = %health_addr, all = ?health_listener.local_addrs().unwrap_or_default(), "health and metrics listening");
    let health = tokio::spawn(health::serve(
        health_listener,
        readiness.clone(),
        metrics.clone(),
        server_stop.clone(),
    ));
    // From here on a failure stops what has started.
    let started = async {
        let client_ca = match &args.client_ca {
            Some(path) => Some(
                ReloadingVerifier::new(path, provider.clone()).map_err(|error| {
                    Error::ClientCa {
                        path: path.clone(),
                        error,
                    }
                })?,
            ),
            None => None,
        };
        let reloader = Reloader::new(
            WatchOptions {
                source: source.clone(),
                client_ca: args.client_ca.clone(),
                poll_interval: args.cert_poll_interval,
                debounce: Duration::from_millis(200),
                expiry_warning: args.cert_expiry_warning,
            },
            store.clone(),
            client_ca.clone(),
            metrics.clone(),
            provider.clone(),
        );
        if let (CertSource::Secret(secret), Some(client)) = (&source, secret_client) {
            let api =
                kube::Api::namespaced(client, secret.namespace.as_deref().unwrap_or_default());
            tokio::spawn(tls::secret::run(
                api,
                secret.clone(),
                reloader.clone(),
                metrics.clone(),
                server_stop.clone(),
            ));
        }
        reloader.spawn(server_stop.clone());
        certs::wait_for_certificate(&store, &source, args.cert_wait, &server_stop).await?;

        let verifier = client_ca.map(|v| v as Arc<dyn rustls::server::danger::ClientCertVerifier>);
        let tls_config = Arc::new(server::tls_config(store.clone(), verifier, args.http2)?);
        let listener = bind("--addr", &args.addr).await?;
        let addr = listener.local_addr().map_err(|error| Error::Listen {
            flag: "--addr",
            addr: args.addr.to_string(),
            error,
        })?;
        readiness.set_listening();
        tracing::info!(%addr, all = ?listener.local_addrs().unwrap_or_default(), http2 = args.http2, client_auth = args.client_ca.is_some(), "etcd-webhook listening");
        if let (true, CertSource::Dir(dir)) = (dev, &source) {
            certs::print_dev_hint(dir, addr.port());
        }
        // Only now, with /convert answering, may the controller list EtcdClusters (the list
        // itself can need conversion).
        let controller = cluster::start_controller(
            &args.controller,
            metrics.clone(),
            shutdown.controller.clone(),
        )
        .await?;
        cluster::start_cabundle_check(
            &args,
            store.clone(),
            metrics.clone(),
            storage_classes,
            secrets,
            server_stop.clone(),
        )
        .await?;
        let options = server::ServeOptions {
            http2: args.http2,
            header_read_timeout: args.header_read_timeout,
            idle_timeout: args.idle_timeout,
            drain_timeout: args.shutdown_timeout,
            max_connections: args.max_connections,
            ..Default::default()
        };
        let server = tokio::spawn(server::serve(
            listener,
            tls_config,
            webhook::router(state.clone()),
            options,
            metrics.clone(),
            server_stop.clone(),
        ));
        Ok::<_, Error>((addr, server, controller))
    }
    .await;
    let (addr, server, controller) = started.inspect_err(|_| shutdown.finish())?;
    let controller = match controller {
        Some(task) => {
            let stopped = shutdown.controller_stopped.clone();
            Some(tokio::spawn(async move {
                let _ = task.await;
                stopped.cancel();
            }))
        }
        None => {
            shutdown.controller_stopped.cancel();
            None
        }
    };
    Ok(Running {
        addr,
        health_addr,
        metrics,
        readiness,
        shutdown,
        server,
        controller,
        health,
    })
}

/// First signal: the reconcile loop stops (its passes finish or are abandoned, its Lease is
/// released) while everything serves; then readiness goes false, the server keeps accepting for
/// `delay` (endpoints catch up), then stops accepting and drains. A second signal skips the
/// rest of the waits.
async fn shutdown_on_signal(shutdown: Shutdown, controller_stop: Duration, delay: Duration) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping the reconcile loop first (webhooks and /convert still serve; a second signal skips the waits)"),
        _ = int.recv() => tracing::info!("SIGINT: stopping the reconcile loop first (webhooks and /convert still serve; press Ctrl-C again to skip the waits)"),
    }
    let hurried = tokio::select! {
        stopped = shutdown.stop_controller(controller_stop) => {
            if !stopped {
                tracing::warn!(within = ?controller_stop, "the reconcile loop did not stop in time; shutting down the server anyway");
            }
            false
        }
        _ = term.recv() => true,
        _ = int.recv() => true,
    };
    shutdown.begin();
    if hurried {
        tracing::info!(
            "second signal: readiness off, not waiting for the reconcile loop nor --shutdown-delay"
        );
    } else {
        tracing::info!(delay = ?delay, "readiness off; still accepting for --shutdown-delay ({delay:?}) while the Service's endpoints catch up, then draining");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = term.recv() => tracing::info!("second signal: skipping the shutdown delay"),
            _ = int.recv() => tracing::info!("second signal: skipping the shutdown delay"),
        }
    }
    tracing::info!("no longer accepting connections; draining");
    shutdown.finish();
}
