use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use clap::Parser;
use tokio_util::sync::CancellationToken;

use etcd_webhook::cli::{
    CertsArgs, Cli, Command, ControllerArgs, ControllerMode, ConvertArgs, CrdArgs, LogArgs,
    LogFormat, MigrateStorageArgs, OutputFormat, RenderArgs, ReviewArgs, ServeArgs,
};
use etcd_webhook::controller::{self, leader, render::RenderOptions};
use etcd_webhook::{migrate, offline};
use std::time::Duration;

use etcd_webhook::listen::Listeners;
use etcd_webhook::metrics::Metrics;
use etcd_webhook::tls::client_auth::ReloadingVerifier;
use etcd_webhook::tls::watch::{CertSource, Reloader, WatchOptions};
use etcd_webhook::tls::{self, CertStore};
use etcd_webhook::{api, server, webhook};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The offline commands print results, not logs; and they exit 0/1/2 on their own.
    match &cli.command {
        Command::Review(args) => std::process::exit(review(args)),
        Command::Convert(args) => std::process::exit(convert(args)),
        Command::Render(args) => std::process::exit(render(args)),
        _ => {}
    }
    let log_writer = init_tracing(&cli.log)?;
    let outcome = run(cli.command);
    // Every line logged so far reaches stderr before the process ends (the writer thread
    // flushes and stops here); an exit code other than 0 is given only after that.
    drop(log_writer);
    match outcome? {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

/// The commands that log: their exit code, or the error main reports.
fn run(command: Command) -> Result<i32> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
    match command {
        Command::Crd(args) => Ok(crd(&args)),
        Command::MigrateStorage(args) => Ok(migrate_storage(&args)),
        Command::Certs(args) => certs(&args).map(|()| 0),
        Command::Review(_) | Command::Convert(_) | Command::Render(_) => {
            unreachable!("handled above")
        }
        Command::Serve(args) => runtime()?.block_on(serve(*args)).map(|()| 0),
    }
}

/// Logs go to stderr through a writer thread: a request only formats its line and hands it over
/// (no `write` on the request path), and the thread writes whatever has queued up in one
/// `write` per batch. Nothing is dropped: with the queue full, logging waits (lossy off). The
/// returned guard flushes and stops the thread when dropped.
fn init_tracing(args: &LogArgs) -> Result<tracing_appender::non_blocking::WorkerGuard> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("bad --log-level {:?}", args.log_level))?;
    let json = match args.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(512)
        .thread_name("log-writer")
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stderr(),
        ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    Ok(guard)
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `crd`: all versions served, offline; fewer only after checking that the cluster stores none
/// of the others (exit 1 when it may, 2 when it cannot tell).
fn crd(args: &CrdArgs) -> i32 {
    let served: Vec<api::Version> = args.served.iter().map(|&v| v.into()).collect();
    if api::Version::ALL.iter().all(|v| served.contains(v)) {
        print!("{}", api::crd_yaml());
        return 0;
    }
    let crd = match migrate::crd_serving(&served) {
        Ok(crd) => crd,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let names: Vec<&str> = served.iter().map(|v| v.as_str()).collect();
    if !args.offline {
        let check = async {
            let client = kube::Client::try_default().await?;
            Ok::<_, anyhow::Error>(migrate::stored_versions(client).await?)
        };
        let stored = match runtime().and_then(|rt| rt.block_on(check)) {
            Ok(stored) => stored,
            Err(e) => {
                eprintln!(
                    "error: cannot read status.storedVersions of {} from the cluster: {e:#}\n\
                     (--offline prints the CRD without this check)",
                    migrate::CRD_NAME
                );
                return 2;
            }
        };
        match stored {
            None => tracing::info!(
                crd = migrate::CRD_NAME,
                "the CRD is not installed in this cluster: nothing is stored in any version"
            ),
            Some(stored) => {
                let left = migrate::still_stored(&stored, &served);
                if !left.is_empty() {
                    eprintln!(
                        "refusing to stop serving {}: status.storedVersions of {} is [{}], so \
                         objects may still be stored in {}. Run `etcd-webhook migrate-storage` \
                         first (see README, \"Retiring v1alpha1 and v1beta1\").",
                        left.join(", "),
                        migrate::CRD_NAME,
                        stored.join(", "),
                        left.join(", ")
                    );
                    return 1;
                }
            }
        }
    }
    print!(
        "{}",
        api::crd_document(
            &crd,
            &format!("etcd-webhook crd --served {}", names.join(","))
        )
    );
    0
}

/// `migrate-storage`: exit 0 when every object was rewritten, 1 when some could not be
/// (storedVersions left alone), 2 on any other error.
fn migrate_storage(args: &MigrateStorageArgs) -> i32 {
    let options = migrate::Options {
        dry_run: args.dry_run,
        concurrency: usize::from(args.concurrency),
    };
    let run = async {
        let client = kube::Client::try_default()
            .await
            .context("no usable Kubernetes config (KUBECONFIG or in-cluster)")?;
        let report = migrate::run(client, options, |done, total| {
            let step = (total / 20).max(10);
            if done % step == 0 || done == total {
                tracing::info!(done, total, "migrate-storage progress: {done}/{total}");
            }
        })
        .await?;
        Ok::<_, anyhow::Error>(report)
    };
    let report = match runtime().and_then(|rt| rt.block_on(run)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e:#}");
            return 2;
        }
    };
    match args.output {
        None => print!("{}", report.text()),
        Some(OutputFormat::Json) => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        ),
        Some(OutputFormat::Yaml) => print!(
            "{}",
            serde_yaml_ng::to_string(&report).expect("a report serializes")
        ),
    }
    if report.failed.is_empty() { 0 } else { 1 }
}

/// `review`: exit 0 when every document is allowed, 1 when any is denied, 2 on bad input.
fn review(args: &ReviewArgs) -> i32 {
    let run = || -> Result<bool, offline::OfflineError> {
        let docs = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let old = match &args.old {
            Some(path) => offline::parse_documents(&offline::read_source(path)?, path)?,
            None => Vec::new(),
        };
        let decisions = offline::review(&docs, &old)?;
        let mut outputs = Vec::new();
        for d in &decisions {
            if d.allowed {
                eprintln!("{}: allowed", d.label);
            } else {
                eprintln!("{}: denied: {}", d.label, d.message);
            }
            for w in &d.warnings {
                eprintln!("{}: warning: {w}", d.label);
            }
            outputs.push(if args.patch {
                d.patch.clone()
            } else {
                d.patched.clone()
            });
        }
        if args.patch {
            for p in outputs {
                println!("{p}");
            }
        } else {
            print!("{}", offline::render(&outputs, false));
        }
        Ok(decisions.iter().all(|d| d.allowed))
    };
    match run() {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// `convert`: exit 0 on success, 2 on bad input.
fn convert(args: &ConvertArgs) -> i32 {
    let run = || -> Result<String, offline::OfflineError> {
        let docs = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let converted = offline::convert(&docs, args.to.into())?;
        Ok(offline::render(
            &converted,
            args.output == OutputFormat::Json,
        ))
    };
    // convert never denies: every error is bad input (2).
    print_or_fail(run())
}

/// `render`: exit 0 with the objects, 1 when a manifest is denied, 2 on bad input.
fn render(args: &RenderArgs) -> i32 {
    let opts = RenderOptions {
        etcd_registry: args.etcd_image_registry.clone(),
        helper_image: args.backup_helper_image.clone(),
        s3_image: args.backup_s3_image.clone(),
    };
    let run = || -> Result<String, offline::OfflineError> {
        let docs = offline::parse_documents(&offline::read_source(&args.file)?, &args.file)?;
        let objects = offline::objects(&docs, &opts)?;
        Ok(offline::render(&objects, args.output == OutputFormat::Json))
    };
    print_or_fail(run())
}

/// Prints the output of an offline command (exit 0), or the error (its exit code).
fn print_or_fail(result: Result<String, offline::OfflineError>) -> i32 {
    match result {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

fn certs(args: &CertsArgs) -> Result<()> {
    let certs = tls::dev::generate(&args.dns, &args.ip, args.days)?;
    if args.atomic {
        tls::dev::write_kubelet_layout(&args.out, &certs.files())?;
    } else {
        certs.write_plain(&args.out)?;
    }
    println!(
        "wrote {}, {} and {} to {}",
        tls::CA_FILE,
        tls::CERT_FILE,
        tls::KEY_FILE,
        args.out.display()
    );
    Ok(())
}

/// The embedded default: a development CA and serving pair for localhost under ./certs/dev,
/// made once and re-made when missing, broken or about to expire.
fn dev_cert_dir() -> Result<PathBuf> {
    let dir = PathBuf::from("certs/dev");
    let provider = rustls::crypto::ring::default_provider();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let usable = tls::load_pair(&dir, &provider)
        .map(|p| p.info.not_after > now + 86_400)
        .unwrap_or(false);
    if !usable || !dir.join(tls::CA_FILE).exists() {
        let ips = ["127.0.0.1".parse()?, "::1".parse()?];
        tls::dev::generate(&["localhost".to_owned()], &ips, 365)?.write_plain(&dir)?;
        tracing::info!(dir = %dir.display(), "created a development CA and serving certificate");
    }
    Ok(dir)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let (source, secret_client) = match (&args.cert_dir, &args.cert_secret) {
        (Some(dir), _) => (CertSource::Dir(dir.clone()), None),
        (None, Some(secret)) => {
            let (secret, client) = cert_secret_client(secret.clone()).await?;
            (CertSource::Secret(secret), Some(client))
        }
        (None, None) => (CertSource::Dir(dev_cert_dir()?), None),
    };
    let dev = args.cert_dir.is_none() && args.cert_secret.is_none();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let metrics = Arc::new(Metrics::new());
    let store = CertStore::new();
    let mut state = webhook::AppState::new(args.max_body_bytes, store.clone(), metrics.clone());
    state.request_timeout = args.request_timeout;
    state.max_convert_body_bytes = args.max_convert_body_bytes;
    state.test_panic_uid = args.test_panic_uid.clone();
    let state = Arc::new(state);
    let shutdown = CancellationToken::new();
    // Cancelled at the first signal: the controller stops (and releases its Lease) while the
    // webhooks keep serving through the shutdown delay.
    let controller_stop = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(
        shutdown.clone(),
        controller_stop.clone(),
        state.clone(),
        args.shutdown_delay,
    ));

    // The health port comes up first: readiness is false until the TLS listener serves.
    let health = Listeners::bind(&args.health_addr)
        .await
        .with_context(|| format!("cannot listen on --health-addr {}", args.health_addr))?;
    tracing::info!(addr = %health.local_addr()?, all = ?health.local_addrs()?, "health and metrics listening");
    let health_task = tokio::spawn(etcd_webhook::health::serve(
        health,
        state.clone(),
        shutdown.clone(),
    ));

    let client_ca = match &args.client_ca {
        Some(path) => Some(
            ReloadingVerifier::new(path, provider.clone())
                .with_context(|| format!("cannot load --client-ca {}", path.display()))?,
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
        let api = kube::Api::namespaced(client, secret.namespace.as_deref().unwrap_or_default());
        tokio::spawn(tls::secret::run(
            api,
            secret.clone(),
            reloader.clone(),
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    reloader.spawn(shutdown.clone());
    wait_for_certificate(&store, &source, args.cert_wait, &shutdown).await?;

    let router = webhook::router(state.clone());
    let verifier = client_ca.map(|v| v as Arc<dyn rustls::server::danger::ClientCertVerifier>);
    let tls_config = Arc::new(server::tls_config(store.clone(), verifier, args.http2)?);
    let listener = Listeners::bind(&args.addr)
        .await
        .with_context(|| format!("cannot listen on --addr {}", args.addr))?;
    let local = listener.local_addr()?;
    state.listening.store(true, Ordering::Relaxed);
    tracing::info!(addr = %local, all = ?listener.local_addrs()?, http2 = args.http2, client_auth = args.client_ca.is_some(), "etcd-webhook listening");
    if let (true, CertSource::Dir(dir)) = (dev, &source) {
        print_dev_hint(dir, local.port());
    }
    // Only now, with /convert answering, may the controller list EtcdClusters (the list itself
    // can need conversion).
    let controller_task =
        start_controller(&args.controller, metrics.clone(), controller_stop.clone())
            .await
            .inspect_err(|_| shutdown.cancel())?;
    start_cabundle_check(&args, store.clone(), metrics.clone(), shutdown.clone())
        .await
        .inspect_err(|_| shutdown.cancel())?;

    let options = server::ServeOptions {
        http2: args.http2,
        header_read_timeout: args.header_read_timeout,
        drain_timeout: args.shutdown_timeout,
        max_connections: args.max_connections,
        ..Default::default()
    };
    server::serve(
        listener,
        tls_config,
        router,
        options,
        metrics.clone(),
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    controller_stop.cancel();
    if let Some(task) = controller_task
        && tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .is_err()
    {
        tracing::warn!("the controller did not stop within 15s");
    }
    let _ = health_task.await;
    tracing::info!("stopped");
    Ok(())
}

/// The Kubernetes client `--cert-secret` reads through, and the Secret with its namespace
/// filled in (the pod's, else the kubeconfig context's).
async fn cert_secret_client(
    secret: tls::secret::SecretRef,
) -> Result<(tls::secret::SecretRef, kube::Client)> {
    let config = kube::Config::infer()
        .await
        .context("--cert-secret: no usable Kubernetes config (in a pod, or KUBECONFIG)")?;
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let secret = secret.in_namespace(|| {
        std::env::var("POD_NAMESPACE")
            .ok()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .or_else(|| service_account_namespace(in_pod))
            .unwrap_or_else(|| client.default_namespace().to_owned())
    });
    tracing::info!(%secret, "serving certificate: read from the Secret through the API (--cert-secret)");
    Ok((secret, client))
}

/// Waits until a usable pair is served, at most `limit`.
async fn wait_for_certificate(
    store: &CertStore,
    source: &CertSource,
    limit: Duration,
    shutdown: &CancellationToken,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while store.current().is_none() {
        if tokio::time::Instant::now() >= deadline {
            let waited = humantime::format_duration(limit);
            let dir = match source {
                CertSource::Dir(dir) => dir,
                CertSource::Secret(secret) => anyhow::bail!(
                    "no usable serving certificate in secret {secret} after {waited} (--cert-wait); expected a Secret with tls.crt and tls.key that belong together, readable by this service account (the log above says what was wrong)"
                ),
            };
            // Why the files there are not usable, in the final error itself.
            let cause = match tls::load_pair(dir, &rustls::crypto::ring::default_provider()) {
                Err(e) => format!(": {e}"),
                Ok(_) => String::new(),
            };
            anyhow::bail!(
                "no usable serving certificate in {} after {waited} (--cert-wait){cause}; expected tls.crt and tls.key that belong together, e.g. the mounted cert-manager Secret",
                dir.display(),
            );
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = shutdown.cancelled() => anyhow::bail!("shut down while waiting for a certificate"),
        }
    }
    Ok(())
}

fn print_dev_hint(dir: &Path, port: u16) {
    let ca = dir.join(tls::CA_FILE);
    let ca = ca.canonicalize().unwrap_or(ca);
    tracing::info!(ca = %ca.display(), "development certificate authority");
    tracing::info!(
        "try: curl --cacert {} -H 'Content-Type: application/json' --data @tests/fixtures/validate-v1-create-even-size.json https://localhost:{}/validate",
        ca.display(),
        port
    );
}

/// First signal: readiness false at once; keep accepting for `delay` (endpoints catch up),
/// then stop accepting and drain. A second signal skips the rest of the delay.
async fn shutdown_on_signal(
    token: CancellationToken,
    controller_stop: CancellationToken,
    state: Arc<webhook::AppState>,
    delay: Duration,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: readiness off, shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: readiness off, shutting down"),
    }
    state.shutting_down.store(true, Ordering::Relaxed);
    controller_stop.cancel();
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        _ = term.recv() => tracing::info!("second signal: skipping the shutdown delay"),
        _ = int.recv() => tracing::info!("second signal: skipping the shutdown delay"),
    }
    tracing::info!("no longer accepting connections; draining");
    token.cancel();
}

/// Where a pod's service account namespace is mounted.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The install's namespace, the Lease's home when nothing else says.
const DEFAULT_NAMESPACE: &str = "etcd-system";

/// Starts the caBundle self-check (tls::cabundle) where it applies; `on` without a usable
/// Kubernetes config is an error, `auto` outside a pod or without one is a log line.
async fn start_cabundle_check(
    args: &ServeArgs,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    match args.cabundle_check {
        ControllerMode::Off => return Ok(()),
        ControllerMode::Auto if !in_pod => {
            tracing::info!("caBundle self-check off: not in a pod (--cabundle-check auto)");
            return Ok(());
        }
        _ => {}
    }
    let config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) if args.cabundle_check == ControllerMode::Auto => {
            tracing::warn!(error = %e, "caBundle self-check off: the Kubernetes config cannot be used");
            return Ok(());
        }
        Err(e) => return Err(e).context("--cabundle-check on: no usable Kubernetes config"),
    };
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    let instance = std::env::var("HOSTNAME").ok();
    tokio::spawn(tls::cabundle::run(
        client,
        store,
        tls::cabundle::Target::shipped(),
        args.cabundle_check_interval,
        metrics,
        instance,
        shutdown,
    ));
    Ok(())
}

/// The service account's namespace, read from its mounted file inside a pod.
fn service_account_namespace(in_pod: bool) -> Option<String> {
    in_pod
        .then(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
        .flatten()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// Starts the reconcile loop when `--controller` says so (behind the leader Lease unless
/// `--leader-elect=false`). `None` when it stays off.
async fn start_controller(
    args: &ControllerArgs,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    // Only a pod reconciles on its own: a laptop with KUBECONFIG set must not start a second
    // reconciler against whatever cluster that file points at.
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
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
    let config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) if args.mode == ControllerMode::Auto => {
            tracing::warn!(error = %e, "controller off: the Kubernetes config cannot be used; webhooks only");
            return Ok(None);
        }
        Err(e) => return Err(e).context("--controller on: no usable Kubernetes config"),
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
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("etcd-webhook-{}", std::process::id()));
    let settings = controller::Settings {
        render: RenderOptions {
            etcd_registry: args.etcd_image_registry.clone(),
            helper_image: args.backup_helper_image.clone(),
            s3_image: args.backup_s3_image.clone(),
        },
        finalizer_timeout: args.finalizer_timeout,
        resync: args.resync_interval,
        namespace: args.watch_namespace.clone(),
        instance: Some(identity.clone()),
    };
    if !args.leader_elect {
        tracing::info!("leader election off: this replica reconciles");
        metrics.leader.set(1);
        return Ok(Some(tokio::spawn(controller::run(
            client, settings, metrics, stop,
        ))));
    }
    let duration = args.lease_duration.as_secs().max(2);
    let lease = leader::LeaseSettings {
        duration_secs: duration,
        grace_secs: (duration / 3).max(1),
        ..leader::LeaseSettings::new(lease_namespace, identity)
    };
    let work = {
        let (client, metrics) = (client.clone(), metrics.clone());
        move |token: CancellationToken| {
            controller::run(client.clone(), settings.clone(), metrics.clone(), token)
        }
    };
    Ok(Some(tokio::spawn(leader::run_when_leader(
        client, lease, metrics, stop, work,
    ))))
}
