//! Readiness, and the plain-HTTP health port: `/healthz` (the process is alive), `/readyz`
//! (the TLS listener is up with a valid certificate and no shutdown has begun) and `/metrics`.
//! The TLS port answers `/healthz` and `/readyz` with the same handlers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::tls::CertStore;

/// Whether this replica should receive requests. Leadership (of the reconcile loop) plays no
/// part: every replica serves the webhooks.
#[derive(Debug)]
pub struct Readiness {
    listening: AtomicBool,
    shutting_down: AtomicBool,
    certs: Arc<CertStore>,
}

impl Readiness {
    pub fn new(certs: Arc<CertStore>) -> Arc<Self> {
        Arc::new(Self {
            listening: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            certs,
        })
    }

    /// The TLS listener is up.
    pub fn set_listening(&self) {
        self.listening.store(true, Ordering::Relaxed);
    }

    /// A shutdown has begun: not ready from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Whether a shutdown has begun (readiness is off for good).
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Ready: the TLS listener is up, serving a certificate that has not expired, and no
    /// shutdown has begun; else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err("shutting down");
        }
        if !self.listening.load(Ordering::Relaxed) {
            return Err("TLS listener not up yet (waiting for a serving certificate)");
        }
        match self.certs.info() {
            None => Err("no serving certificate"),
            Some(info) if info.not_after <= crate::tls::now() => {
                Err("serving certificate has expired")
            }
            Some(_) => Ok(()),
        }
    }
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(readiness): State<Arc<Readiness>>) -> Response {
    match readiness.check() {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// `/healthz` and `/readyz`, for either port.
pub fn probes(readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

pub fn router(readiness: Arc<Readiness>, metrics: Arc<Metrics>) -> Router {
    probes(readiness).merge(
        Router::new()
            .route("/metrics", get(encode_metrics))
            .with_state(metrics),
    )
}

async fn encode_metrics(State(metrics): State<Arc<Metrics>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        metrics.encode(),
    )
        .into_response()
}

/// Serves the health port until `shutdown`.
pub async fn serve(
    listener: crate::listen::Listeners,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let app = router(readiness, metrics);
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
    {
        tracing::error!(%error, "health server failed");
    }
}
