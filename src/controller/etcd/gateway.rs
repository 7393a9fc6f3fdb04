//! The HTTP transport to the members' v3 JSON gateway (`POST /v3/...` on each member's client
//! port, HTTP/1.1): `https://` with the client certificate of the cluster's Secret
//! `NAME-client-tls` for a TLS cluster (the default), checked against that Secret's CA only
//! ([`Gateway::with_identity`]); plain `http://` for a plain one. The [`Transport`] trait is
//! what the calls go through (an in-memory etcd in the unit tests).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::error::EtcdError;

/// How long one call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection to a member may sit idle in a transport's pool before it is closed:
/// less than the 30 s resync, so a steady cluster holds no connection between its passes. An
/// idle TLS connection holds 37.8 KiB of the loop's heap (`benches/tls_idle.rs`): kept, 1,000
/// TLS clusters of 3 to 5 members would hold 110 to 185 MiB; a new one costs 0.6 ms (TCP and
/// TLS handshake with the client certificate, loopback) against 0.03 ms on a pooled one.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);

/// A TLS cluster's client identity, PEM as cert-manager writes it in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA the members' certificates must chain to (`ca.crt`): the only one trusted.
    pub ca: Vec<u8>,
    /// The certificate presented to the members (`tls.crt`) and its key (`tls.key`).
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls { .. }")
    }
}

/// Why a client identity cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct TlsError(pub String);

impl ClientTls {
    /// The three files of a mounted `NAME-client-tls` Secret in `dir`.
    pub fn read_dir(dir: &std::path::Path) -> Result<ClientTls, TlsError> {
        use crate::controller::render::{TLS_CA, TLS_CERT, TLS_KEY};
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| TlsError(format!("{}: {e}", path.display())))
        };
        Ok(ClientTls {
            ca: read(TLS_CA)?,
            cert: read(TLS_CERT)?,
            key: read(TLS_KEY)?,
        })
    }

    /// The rustls configuration: `ca` as the only root, `cert` and `key` as the identity.
    pub fn config(&self) -> Result<rustls::ClientConfig, TlsError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.ca)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError(format!("ca.crt: {e}")))?;
        if cas.is_empty() {
            return Err(TlsError("ca.crt: no certificate".to_owned()));
        }
        for ca in cas {
            roots
                .add(ca)
                .map_err(|e| TlsError(format!("ca.crt: {e}")))?;
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError(format!("tls.crt: {e}")))?;
        if chain.is_empty() {
            return Err(TlsError("tls.crt: no certificate".to_owned()));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| TlsError(format!("tls.key: {e}")))?;
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError(format!("tls.crt and tls.key: {e}")))
    }
}

/// One POST to the gateway: `path` under `/v3/`, a JSON body, the JSON answer (an error answer
/// is [`EtcdError::Refused`]). The production transport is [`Gateway`]; the unit tests use an
/// in-memory etcd.
pub trait Transport: Send + Sync {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>>;

    /// [`Transport::post`] waiting up to `within` for the answer instead of the transport's
    /// call timeout (a defragmentation or a physical compaction of a large database). A
    /// transport without a timeout of its own waits as it always does.
    fn post_within<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        let _ = within;
        self.post(endpoint, path, body)
    }

    /// The same transport presenting `identity` to a TLS cluster's members.
    fn with_identity(&self, identity: &ClientTls) -> Result<Arc<dyn Transport>, TlsError>;

    /// `GET url` of a member's metrics listener (plain HTTP): the text, within `within`. A
    /// transport without metrics listeners (the unit tests' in-memory etcd) reaches none.
    fn metrics<'a>(
        &'a self,
        url: &'a str,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<String, EtcdError>> + Send + 'a>> {
        let _ = within;
        Box::pin(async move {
            Err(EtcdError::Unreachable {
                endpoint: url.to_owned(),
                reason: "this transport reaches no metrics listener".to_owned(),
            })
        })
    }
}

/// The HTTP transport.
#[derive(Clone)]
pub struct Gateway {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl Default for Gateway {
    fn default() -> Self {
        Self::new(CALL_TIMEOUT)
    }
}

impl Gateway {
    /// Plain HTTP (an `https://` endpoint is refused: no CA is trusted).
    pub fn new(timeout: Duration) -> Self {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Self::with_config(timeout, config)
    }

    /// `https://` with `identity` (and `http://` still).
    pub fn with_tls(timeout: Duration, identity: &ClientTls) -> Result<Self, TlsError> {
        Ok(Self::with_config(timeout, identity.config()?))
    }

    fn with_config(timeout: Duration, config: rustls::ClientConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Self {
            // At most one idle connection per member, closed after IDLE_CONNECTION_TIMEOUT (the
            // pool reaps idle connections only with a timer).
            client: Client::builder(TokioExecutor::new())
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .pool_idle_timeout(IDLE_CONNECTION_TIMEOUT)
                .pool_max_idle_per_host(1)
                .build(connector),
            timeout,
        }
    }

    /// `POST {endpoint}/v3/{path}` with a JSON body.
    fn request(
        endpoint: &str,
        path: &str,
        body: &Value,
    ) -> Result<hyper::Request<Full<Bytes>>, EtcdError> {
        hyper::Request::post(format!("{endpoint}/v3/{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| EtcdError::Unreachable {
                endpoint: endpoint.to_owned(),
                reason: e.to_string(),
            })
    }

    /// Sends `request` to `endpoint` and reads the whole answer, within `within`.
    async fn exchange(
        &self,
        endpoint: &str,
        request: hyper::Request<Full<Bytes>>,
        within: Duration,
    ) -> Result<(hyper::StatusCode, Bytes), EtcdError> {
        let unreachable = |reason: String| EtcdError::Unreachable {
            endpoint: endpoint.to_owned(),
            reason,
        };
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                use std::error::Error as _;
                let mut reason = e.to_string();
                if let Some(cause) = e.source() {
                    reason = format!("{reason}: {cause}");
                }
                unreachable(reason)
            })?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, EtcdError>((status, bytes))
        };
        tokio::time::timeout(within, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {within:?}")))?
    }

    async fn call(
        &self,
        endpoint: &str,
        path: &str,
        body: Value,
        within: Duration,
    ) -> Result<Value, EtcdError> {
        let request = Self::request(endpoint, path, &body)?;
        let (status, bytes) = self.exchange(endpoint, request, within).await?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
            endpoint: endpoint.to_owned(),
            reason: format!("HTTP {status}: {e}"),
        })?;
        // 3.5's gateway puts the gRPC error in `error`, 3.6's in `message`; both set `code`.
        if !status.is_success() || value.get("code").is_some_and(|c| c.as_i64() != Some(0)) {
            let message = value
                .get("message")
                .or_else(|| value.get("error"))
                .and_then(Value::as_str)
                .map_or_else(|| format!("HTTP {status}: {value}"), str::to_owned);
            return Err(EtcdError::Refused {
                endpoint: endpoint.to_owned(),
                message,
            });
        }
        Ok(value)
    }
}

impl Gateway {
    /// A streaming call (`maintenance/snapshot`): the answer's body as it arrives, with no
    /// time limit on the whole (a snapshot takes as long as its size needs); only the
    /// connection and the answer's head must come within the call timeout.
    pub async fn stream(
        &self,
        endpoint: &str,
        path: &str,
        body: Value,
    ) -> Result<hyper::body::Incoming, EtcdError> {
        let unreachable = |reason: String| EtcdError::Unreachable {
            endpoint: endpoint.to_owned(),
            reason,
        };
        let request = Self::request(endpoint, path, &body)?;
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| unreachable(e.to_string()))?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            return Err(EtcdError::Refused {
                endpoint: endpoint.to_owned(),
                message: format!("HTTP {status}: {}", text.trim()),
            });
        }
        Ok(response.into_body())
    }
}

impl Transport for Gateway {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        Box::pin(self.call(endpoint, path, body, self.timeout))
    }

    fn post_within<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        Box::pin(self.call(endpoint, path, body, within))
    }

    fn with_identity(&self, identity: &ClientTls) -> Result<Arc<dyn Transport>, TlsError> {
        Ok(Arc::new(Gateway::with_tls(self.timeout, identity)?))
    }

    fn metrics<'a>(
        &'a self,
        url: &'a str,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<String, EtcdError>> + Send + 'a>> {
        Box::pin(async move {
            let request = hyper::Request::get(url)
                .body(Full::new(Bytes::new()))
                .map_err(|e| EtcdError::Unreachable {
                    endpoint: url.to_owned(),
                    reason: e.to_string(),
                })?;
            let (status, body) = self.exchange(url, request, within).await?;
            if !status.is_success() {
                return Err(EtcdError::Refused {
                    endpoint: url.to_owned(),
                    message: format!("HTTP {status}"),
                });
            }
            String::from_utf8(body.to_vec()).map_err(|e| EtcdError::Decode {
                endpoint: url.to_owned(),
                reason: e.to_string(),
            })
        })
    }
}

impl<T: Transport + ?Sized> Transport for std::sync::Arc<T> {
    fn post<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        (**self).post(endpoint, path, body)
    }

    fn post_within<'a>(
        &'a self,
        endpoint: &'a str,
        path: &'a str,
        body: Value,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Value, EtcdError>> + Send + 'a>> {
        (**self).post_within(endpoint, path, body, within)
    }

    fn with_identity(&self, identity: &ClientTls) -> Result<Arc<dyn Transport>, TlsError> {
        (**self).with_identity(identity)
    }

    fn metrics<'a>(
        &'a self,
        url: &'a str,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<String, EtcdError>> + Send + 'a>> {
        (**self).metrics(url, within)
    }
}
