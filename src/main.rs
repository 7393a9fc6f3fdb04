use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use clap::Parser;
use tokio_util::sync::CancellationToken;

use etcd_webhook::cli::{CertsArgs, Cli, Command, LogArgs, LogFormat, ServeArgs};
use etcd_webhook::tls::{self, CertStore};
use etcd_webhook::{api, server, webhook};

fn main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing(&cli.log)?;
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
    match cli.command {
        Command::Crd => {
            print!("{}", api::crd_yaml());
            Ok(())
        }
        Command::Certs(args) => certs(&args),
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?
            .block_on(serve(args)),
    }
}

fn init_tracing(args: &LogArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("bad --log-level {:?}", args.log_level))?;
    let json = match args.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    Ok(())
}

fn certs(args: &CertsArgs) -> Result<()> {
    let certs = tls::dev::generate(&args.dns, &args.ip, args.days)?;
    certs.write_plain(&args.out)?;
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
    let (cert_dir, dev) = match &args.cert_dir {
        Some(dir) => (dir.clone(), false),
        None => (dev_cert_dir()?, true),
    };
    let provider = rustls::crypto::ring::default_provider();
    let store = CertStore::new();
    let pair = tls::load_pair(&cert_dir, &provider).with_context(|| {
        format!(
            "cannot load the serving certificate from {}",
            cert_dir.display()
        )
    })?;
    tracing::info!(serial = %pair.info.serial, names = ?pair.info.names, not_after = pair.info.not_after, "serving certificate loaded");
    store.store(pair);

    let state = webhook::AppState::new(args.max_body_bytes);
    let router = webhook::router(state.clone());
    let tls_config = Arc::new(server::tls_config(store.clone(), args.http2)?);
    let listener = server::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let local = listener.local_addr()?;
    state.ready.store(true, Ordering::Relaxed);
    tracing::info!(addr = %local, http2 = args.http2, "etcd-webhook listening");
    if dev {
        print_dev_hint(&cert_dir, local.port());
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone(), state.clone()));
    server::serve(
        listener,
        tls_config,
        router,
        server::ServeOptions {
            http2: args.http2,
            ..Default::default()
        },
        shutdown,
    )
    .await;
    tracing::info!("stopped");
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

async fn shutdown_on_signal(token: CancellationToken, state: Arc<webhook::AppState>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    state.ready.store(false, Ordering::Relaxed);
    token.cancel();
}
