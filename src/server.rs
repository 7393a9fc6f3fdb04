//! The HTTPS accept loop: TCP_NODELAY on every socket, the TLS handshake in the connection's
//! own task (a slow client never holds up others), HTTP/1.1 with keep-alive (HTTP/2 only when
//! asked for), and a graceful drain on shutdown.

mod timeouts;

use std::sync::Arc;
use std::time::Duration;

use crate::listen::Listeners;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How connections are served.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Offer `h2` in ALPN and serve HTTP/2 (off by default: rapid-reset exposure, and the
    /// apiserver speaks HTTP/1.1 to webhooks).
    pub http2: bool,
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time a client has to send a request's headers (from its first byte, or from the
    /// connection's start).
    pub header_read_timeout: Duration,
    /// How long a kept-alive HTTP/1.1 connection may wait for its next request after the last
    /// response: longer than the apiserver's 90 s, so the client closes first.
    pub idle_timeout: Duration,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub drain_timeout: Duration,
    /// Most connections at once; more wait in the kernel's listen backlog.
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            http2: false,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// The rustls server configuration: ring, TLS 1.2 and 1.3 only, certificates from `resolver`.
/// With `client_auth`, every client must present a certificate it accepts.
pub fn tls_config(
    resolver: Arc<dyn ResolvesServerCert>,
    client_auth: Option<Arc<dyn ClientCertVerifier>>,
    http2: bool,
) -> Result<ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_auth {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains open connections.
pub async fn serve(
    listener: Listeners,
    tls: Arc<ServerConfig>,
    router: Router,
    options: ServeOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Headers and idle time are timed by `timeouts::Timeouts` (hyper's own header timeout
        // also runs while a kept-alive connection is idle).
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(64)
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(64);
    let builder = if options.http2 {
        builder
    } else {
        builder.http1_only()
    };
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(options.max_connections));

    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, %peer, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let builder = builder.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let handshake_timeout = options.handshake_timeout;
        let (header_timeout, idle_timeout) = (options.header_read_timeout, options.idle_timeout);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut tcp = tcp;
            // Plain HTTP on the HTTPS port (`http://` by mistake) gets an answer that says
            // so, as Go's servers give one, instead of a closed connection.
            let mut first = [0u8; 1];
            if let Ok(Ok(1)) = tokio::time::timeout(handshake_timeout, tcp.peek(&mut first)).await
                && first[0].is_ascii_uppercase()
            {
                use tokio::io::AsyncWriteExt as _;
                const PLAIN: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server: this port speaks TLS only, use https://\n";
                tracing::debug!(%peer, "plain HTTP on the HTTPS port");
                metrics.tls_handshake_failures.inc();
                let _ = tcp.write_all(PLAIN).await;
                let _ = tcp.shutdown().await;
                return;
            }
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%error, %peer, "TLS handshake failed");
                    metrics.tls_handshake_failures.inc();
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    metrics.tls_handshake_failures.inc();
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let io = timeouts::Timeouts::new(tls, !h2, header_timeout, idle_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            if let Err(error) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
        });
    }

    drop(listener);
    tracing::info!(connections = graceful.count(), "draining connections");
    if tokio::time::timeout(options.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing remaining connections");
    }
}
