//! The benchmark floor: the cost of HTTP + TLS + JSON that no webhook can avoid. The same
//! accept loop, TLS settings (ring, TLS 1.2/1.3, ALPN http/1.1, TCP_NODELAY), allocator and
//! runtime as etcd-webhook, with handlers that only parse and answer:
//!   POST /parse    parse the body into serde_json::Value, answer a fixed small AdmissionReview
//!   POST /convert  parse a ConversionReview, rewrite each object's apiVersion, serialize
//! Built with `--features floor`; started by benches/load.py as
//! `etcd-webhook-floor ADDR CERT_DIR [h2]`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use etcd_webhook::metrics::Metrics;
use etcd_webhook::{server, tls};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FIXED: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true}}"#;

async fn parse(body: Bytes) -> impl IntoResponse {
    match serde_json::from_slice::<Value>(&body) {
        Ok(_) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            FIXED.to_vec(),
        ),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string().into_bytes(),
        ),
    }
}

async fn convert(body: Bytes) -> impl IntoResponse {
    let Ok(mut review) = serde_json::from_slice::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"bad json".to_vec(),
        );
    };
    let mut request = review["request"].take();
    let desired = request["desiredAPIVersion"].clone();
    let mut objects = match request.get_mut("objects").map(Value::take) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    for o in &mut objects {
        o["apiVersion"] = desired.clone();
    }
    let out = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": request["uid"], "result": {"status": "Success"}, "convertedObjects": objects}});
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&out).unwrap_or_default(),
    )
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:0".into())
        .parse()?;
    let cert_dir = PathBuf::from(args.next().unwrap_or_else(|| "certs/dev".into()));
    let http2 = args.next().as_deref() == Some("h2");
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("crypto provider already installed"))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let store = tls::CertStore::new();
            store.store(tls::load_pair(
                &cert_dir,
                &rustls::crypto::ring::default_provider(),
            )?);
            let config = Arc::new(server::tls_config(store, None, http2)?);
            let app = Router::new()
                .route("/parse", post(parse))
                .route("/convert", post(convert))
                .layer(DefaultBodyLimit::max(64 * 1024 * 1024));
            let listener =
                etcd_webhook::listen::Listeners::bind(&etcd_webhook::listen::ListenAddr::Ip(addr))
                    .await?;
            println!("floor listening addr={}", listener.local_addr()?);
            let shutdown = CancellationToken::new();
            let token = shutdown.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                token.cancel();
            });
            let options = server::ServeOptions {
                http2,
                ..Default::default()
            };
            server::serve(
                listener,
                config,
                app,
                options,
                Arc::new(Metrics::new()),
                shutdown,
            )
            .await;
            anyhow::Ok(())
        })
}
