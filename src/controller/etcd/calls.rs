//! How the loop talks to etcd: the v3 JSON gateway (`POST /v3/...` on each member's client
//! port, plain HTTP/1.1 as the members serve it), with the hyper client the binary already
//! has. No gRPC stack: the binary stays small, and the four calls membership needs (list, add,
//! promote, remove) and `status` are all on the gateway in every release the webhook accepts.
//!
//! A TLS cluster's members (`spec.tls`) are reached over `https://` with the client
//! certificate of its Secret `NAME-client-tls`, and checked against that Secret's CA only
//! ([`Gateway::with_identity`]).
//!
//! Reads try each endpoint in turn; a write goes to one endpoint only and is never retried
//! within a pass: an add that timed out may have committed, and the next pass decides from
//! the member list (see [`crate::controller::decide::membership`]).

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
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

/// How long one call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection to a member may sit idle in a transport's pool before it is closed:
/// less than the 30 s resync, so a steady cluster holds no connection between its passes. An
/// idle TLS connection holds 37.8 KiB of the loop's heap (`benches/tls_idle.rs`): kept, 1,000
/// TLS clusters of 3 to 5 members would hold 110 to 185 MiB; a new one costs 0.6 ms (TCP and
/// TLS handshake with the client certificate, loopback) against 0.03 ms on a pooled one.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);

/// What a call to etcd could not do.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EtcdError {
    /// No answer (connection refused, timeout, bad HTTP): the member may be down, and a write
    /// may or may not have happened.
    #[error("{endpoint}: no answer: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// etcd answered and refused (e.g. `etcdserver: can only promote a learner member which is
    /// in sync with leader`).
    #[error("{endpoint}: etcd refused: {message}")]
    Refused { endpoint: String, message: String },
    /// An answer that is not what the gateway sends.
    #[error("{endpoint}: unexpected answer: {reason}")]
    Decode { endpoint: String, reason: String },
}

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

    async fn call(
        &self,
        endpoint: &str,
        path: &str,
        body: Value,
        within: Duration,
    ) -> Result<Value, EtcdError> {
        let unreachable = |reason: String| EtcdError::Unreachable {
            endpoint: endpoint.to_owned(),
            reason,
        };
        let request = Self::request(endpoint, path, &body)?;
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
        let (status, bytes) = tokio::time::timeout(within, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {within:?}")))??;
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
}

/// The gateway writes uint64 as a JSON string.
fn id<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| serde::de::Error::custom("not a u64")),
        other => Err(serde::de::Error::custom(format!("an ID, not {other}"))),
    }
}

/// A uint64 the gateway may leave out (a zero) or write as a string.
fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| serde::de::Error::custom("not a u64")),
        _ => Ok(0),
    }
}

/// One entry of `member list`. A member that was added but has never started has no name.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Member {
    #[serde(rename = "ID", deserialize_with = "id")]
    pub id: u64,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl Member {
    /// Whether the member has ever started (etcd learns its name when it first runs).
    pub fn started(&self) -> bool {
        !self.name.is_empty()
    }
}

/// What `status` says about the member that answers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct MemberStatus {
    /// 0 while the member knows no leader.
    #[serde(default, deserialize_with = "id")]
    pub leader: u64,
    /// The raft log index the member has: a learner far below its leader's has not caught up.
    #[serde(rename = "raftIndex", default, deserialize_with = "opt_u64")]
    pub raft_index: u64,
    #[serde(default)]
    pub errors: Vec<String>,
    /// Who answered: the member ID and cluster ID the answering process runs as (from its
    /// data directory).
    #[serde(default)]
    pub header: Header,
    /// The backend's size on disk, and the part of it in use (the rest a defragmentation
    /// gives back).
    #[serde(rename = "dbSize", default, deserialize_with = "opt_u64")]
    pub db_size: u64,
    #[serde(rename = "dbSizeInUse", default, deserialize_with = "opt_u64")]
    pub db_size_in_use: u64,
    /// The etcd release the member runs.
    #[serde(default)]
    pub version: String,
}

impl MemberStatus {
    pub fn healthy(&self) -> bool {
        self.leader != 0 && self.errors.is_empty()
    }

    /// Has a leader, and every error it reports is the NOSPACE alarm (`memberID:..
    /// alarm:NOSPACE`): it serves reads, and the maintenance calls that clear the alarm. A
    /// CORRUPT alarm (its data disagrees with the others') or any other error is not serving.
    pub fn serving(&self) -> bool {
        self.leader != 0 && self.errors.iter().all(|e| e.contains("alarm:NOSPACE"))
    }

    /// Whether it reports the alarm `name` (e.g. `NOSPACE`).
    pub fn alarm(&self, name: &str) -> bool {
        self.errors
            .iter()
            .any(|e| e.contains(&format!("alarm:{name}")))
    }
}

/// The response header every answer carries: which cluster, and which member, answered.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Header {
    #[serde(default, deserialize_with = "opt_u64")]
    pub cluster_id: u64,
    #[serde(default, deserialize_with = "opt_u64")]
    pub member_id: u64,
    /// The store revision of the member that answered.
    #[serde(default, deserialize_with = "opt_u64")]
    pub revision: u64,
}

#[derive(Deserialize)]
struct Members {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    members: Vec<Member>,
}

/// A `member list` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The endpoint that answered (writes go there).
    pub endpoint: String,
    /// The ID of the cluster that answered (0 if the answer had none).
    pub cluster_id: u64,
    pub members: Vec<Member>,
}

#[derive(Deserialize)]
struct Added {
    member: Member,
    #[serde(default)]
    members: Vec<Member>,
}

fn decode<T: serde::de::DeserializeOwned>(endpoint: &str, v: Value) -> Result<T, EtcdError> {
    serde_json::from_value(v).map_err(|e| EtcdError::Decode {
        endpoint: endpoint.to_owned(),
        reason: e.to_string(),
    })
}

/// The membership calls over a [`Transport`].
pub struct Etcd<'a> {
    pub transport: &'a dyn Transport,
    /// The members' client URLs, tried in order for reads; writes go to the first that
    /// answered the last read.
    pub endpoints: Vec<String>,
}

impl Etcd<'_> {
    /// `member list` (linearizable: a member cut off from the leader does not answer with a
    /// stale list) from the first endpoint that answers, and which one it was. All endpoints are
    /// asked at once, so a pass waits at most one call's timeout for the list.
    pub async fn member_list(&self) -> Result<Listed, EtcdError> {
        let asks = self.endpoints.iter().map(|endpoint| {
            Box::pin(async move {
                let v = self
                    .transport
                    .post(
                        endpoint,
                        "cluster/member/list",
                        json!({"linearizable": true}),
                    )
                    .await?;
                let list: Members = decode(endpoint, v)?;
                Ok::<_, EtcdError>(Listed {
                    endpoint: endpoint.clone(),
                    cluster_id: list.header.cluster_id,
                    members: list.members,
                })
            })
        });
        if self.endpoints.is_empty() {
            return Err(EtcdError::Unreachable {
                endpoint: "(none)".to_owned(),
                reason: "no endpoints".to_owned(),
            });
        }
        futures_util::future::select_ok(asks)
            .await
            .map(|(found, _)| found)
    }

    /// `member add --learner`: the new member and the member list after the add.
    pub async fn add_learner(
        &self,
        endpoint: &str,
        peer_url: &str,
    ) -> Result<(Member, Vec<Member>), EtcdError> {
        let v = self
            .transport
            .post(
                endpoint,
                "cluster/member/add",
                json!({"peerURLs": [peer_url], "isLearner": true}),
            )
            .await?;
        let added: Added = decode(endpoint, v)?;
        Ok((added.member, added.members))
    }

    /// `member promote`: the member list after it.
    pub async fn promote(&self, endpoint: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        self.change(endpoint, "cluster/member/promote", id).await
    }

    /// `member remove`: the member list after it.
    pub async fn remove(&self, endpoint: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        self.change(endpoint, "cluster/member/remove", id).await
    }

    /// A membership change of member `id`: the member list after it.
    async fn change(&self, endpoint: &str, path: &str, id: u64) -> Result<Vec<Member>, EtcdError> {
        let v = self
            .transport
            .post(endpoint, path, json!({"ID": id.to_string()}))
            .await?;
        Ok(decode::<Members>(endpoint, v)?.members)
    }

    /// How many keys the store held at `revision`, as the member `endpoint` reads it locally
    /// (serializable: no quorum needed); a snapshot taken at or after `revision` holds that
    /// revision with exactly these keys.
    pub async fn key_count(&self, endpoint: &str, revision: u64) -> Result<u64, EtcdError> {
        #[derive(Deserialize)]
        struct Counted {
            #[serde(default, deserialize_with = "opt_u64")]
            count: u64,
        }
        let v = self
            .transport
            .post(
                endpoint,
                "kv/range",
                // Every key: from "\0" with range_end "\0" (base64 "AA==").
                json!({"key": "AA==", "range_end": "AA==", "count_only": true,
                    "serializable": true, "revision": revision.to_string()}),
            )
            .await?;
        Ok(decode::<Counted>(endpoint, v)?.count)
    }

    /// Compacts the history below `revision` and waits until it is physically gone (the
    /// space is then free for a defragmentation to give back). Whether this call compacted
    /// anything: a revision compacted already is no error, and `false`.
    /// `within`: a physical compaction answers once the backend has dropped the history, which
    /// takes longer the larger the database.
    pub async fn compact(
        &self,
        endpoint: &str,
        revision: u64,
        within: Duration,
    ) -> Result<bool, EtcdError> {
        let asked = self
            .transport
            .post_within(
                endpoint,
                "kv/compaction",
                json!({"revision": revision.to_string(), "physical": true}),
                within,
            )
            .await;
        match asked {
            Err(EtcdError::Refused { message, .. })
                if message.contains("required revision has been compacted") =>
            {
                Ok(false)
            }
            other => other.map(|_| true),
        }
    }

    /// Defragments the member `endpoint` (it serves nothing until it is done: on v3.6 not even
    /// `/livez` or its status), waiting up to `within` ([`crate::api::defrag_time`]).
    pub async fn defragment(&self, endpoint: &str, within: Duration) -> Result<(), EtcdError> {
        self.transport
            .post_within(endpoint, "maintenance/defragment", json!({}), within)
            .await
            .map(|_| ())
    }

    /// The alarms raised in the cluster: (member ID, alarm name).
    pub async fn alarms(&self, endpoint: &str) -> Result<Vec<(u64, String)>, EtcdError> {
        #[derive(Deserialize)]
        struct Alarm {
            #[serde(rename = "memberID", default, deserialize_with = "opt_u64")]
            member: u64,
            #[serde(default)]
            alarm: Value,
        }
        #[derive(Deserialize)]
        struct Alarms {
            #[serde(default)]
            alarms: Vec<Alarm>,
        }
        let v = self
            .transport
            .post(endpoint, "maintenance/alarm", json!({"action": "GET"}))
            .await?;
        Ok(decode::<Alarms>(endpoint, v)?
            .alarms
            .into_iter()
            .map(|a| {
                // The gateway names the enum ("NOSPACE"); an older one may send its number.
                let name = match a.alarm {
                    Value::String(s) => s,
                    Value::Number(n) if n.as_u64() == Some(1) => "NOSPACE".to_owned(),
                    Value::Number(n) if n.as_u64() == Some(2) => "CORRUPT".to_owned(),
                    other => other.to_string(),
                };
                (a.member, name)
            })
            .collect())
    }

    /// Disarms the alarm `name` of member `member`.
    pub async fn disarm(&self, endpoint: &str, member: u64, name: &str) -> Result<(), EtcdError> {
        self.transport
            .post(
                endpoint,
                "maintenance/alarm",
                json!({"action": "DEACTIVATE", "memberID": member.to_string(), "alarm": name}),
            )
            .await
            .map(|_| ())
    }

    /// `endpoint status` of one member.
    pub async fn status(&self, endpoint: &str) -> Result<MemberStatus, EtcdError> {
        let v = self
            .transport
            .post(endpoint, "maintenance/status", json!({}))
            .await?;
        decode(endpoint, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_answers_of_3_5_and_3_6_decode() {
        // As etcd 3.5.1 and 3.6.4 answer `cluster/member/list` (IDs as strings, an unstarted
        // member without name and client URLs).
        let list: Members = serde_json::from_value(json!({
            "header": {"cluster_id": "1", "member_id": "2", "raft_term": "2"},
            "members": [
                {"ID": "10276657743932975437", "name": "a-0", "peerURLs": ["http://a-0:2380"], "clientURLs": ["http://a-0:2379"]},
                {"ID": "42", "peerURLs": ["http://a-1:2380"], "isLearner": true}
            ]
        }))
        .unwrap();
        assert_eq!(list.members[0].id, 10276657743932975437);
        assert_eq!(list.header.cluster_id, 1);
        assert!(list.members[0].started() && !list.members[0].is_learner);
        assert!(!list.members[1].started() && list.members[1].is_learner);
        let status: MemberStatus = serde_json::from_value(json!({
            "header": {"cluster_id": "7", "member_id": "42"},
            "dbSize": "20480", "leader": "10276657743932975437", "raftIndex": "9"
        }))
        .unwrap();
        assert!(status.healthy());
        assert_eq!(status.raft_index, 9);
        assert_eq!((status.header.cluster_id, status.header.member_id), (7, 42));
        assert!(!MemberStatus::default().healthy());
    }
}
