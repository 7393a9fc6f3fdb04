//! Member TLS (`spec.tls`): the URLs' scheme, etcd's certificate flags, the Secret volumes,
//! and the cert-manager objects that make the three Secrets.
//!
//! - `NAME-peer-tls`: each member's peer certificate (server and client, `*.NAME.NS.svc`),
//!   checked against `ca.crt` in both directions (`--peer-client-cert-auth`);
//! - `NAME-server-tls`: each member's client-port certificate (`*.NAME.NS.svc`, the client
//!   Service, `localhost`); also the client certificate of etcd's own gateway, which dials the
//!   member itself, so it carries `client auth` too;
//! - `NAME-client-tls`: the client certificate the loop and the backup Jobs present
//!   (`--client-cert-auth`), and the CA they check the members against.
//!
//! With no `issuerRef`, each cluster gets a CA of its own: a self-signed Issuer, a CA
//! Certificate whose key is never rotated (etcd reads its trusted CA file only at start,
//! etcd-io/etcd#11555, so a renewed CA must verify the leaves it already signed), and a CA
//! Issuer that signs the three leaves.

use k8s_openapi::api::core::v1::{SecretVolumeSource, Volume, VolumeMount};
use serde_json::{Value, json};

use super::*;

/// Where a member finds its peer certificate.
pub const PEER_TLS_MOUNT: &str = "/etc/etcd/tls/peer";
/// Where a member finds its client-port certificate.
pub const SERVER_TLS_MOUNT: &str = "/etc/etcd/tls/server";
/// Where a backup Job finds the client certificate it presents.
pub const CLIENT_TLS_MOUNT: &str = "/etc/etcd/tls/client";

/// The keys of each Secret (what cert-manager writes).
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const TLS_CA: &str = "ca.crt";

/// How long a leaf lives and when it is renewed (cert-manager's own defaults, said here so the
/// rendering and README agree).
pub const LEAF_DURATION: &str = "2160h";
pub const LEAF_RENEW_BEFORE: &str = "720h";
/// The cluster's own CA: ten years, renewed a year ahead with the same key.
pub const CA_DURATION: &str = "87600h";
pub const CA_RENEW_BEFORE: &str = "8760h";

/// The cert-manager API the objects are written in.
pub const CERT_MANAGER_API: &str = "cert-manager.io/v1";

/// `https` when the cluster's members talk TLS, else `http`.
pub fn scheme(ec: &EtcdCluster) -> &'static str {
    if crate::api::tls_on(&ec.spec) {
        "https"
    } else {
        "http"
    }
}

/// etcd's certificate flags for a TLS cluster (none for a plain one).
pub fn member_tls_args(ec: &EtcdCluster) -> Vec<String> {
    if !crate::api::tls_on(&ec.spec) {
        return Vec::new();
    }
    let (peer, server) = (PEER_TLS_MOUNT, SERVER_TLS_MOUNT);
    vec![
        format!("--cert-file={server}/{TLS_CERT}"),
        format!("--key-file={server}/{TLS_KEY}"),
        format!("--trusted-ca-file={server}/{TLS_CA}"),
        "--client-cert-auth=true".to_owned(),
        format!("--peer-cert-file={peer}/{TLS_CERT}"),
        format!("--peer-key-file={peer}/{TLS_KEY}"),
        format!("--peer-trusted-ca-file={peer}/{TLS_CA}"),
        "--peer-client-cert-auth=true".to_owned(),
    ]
    .into_iter()
    // Only the peer certificate opens raft connections: the client and server certificates
    // are signed by the same CA and carry `client auth` too (and the client certificate has
    // no SAN, which etcd's SAN check lets through). Not for Secrets the user makes: their
    // names are theirs.
    .chain(ours(ec).then(|| format!("--peer-cert-allowed-cn={}", Purpose::Peer.certificate(ec))))
    .collect()
}

/// Whether the cluster's certificates are the ones this loop has cert-manager make (their
/// common names are [`Purpose::certificate`]), not Secrets the user provides.
fn ours(ec: &EtcdCluster) -> bool {
    ec.spec.tls.as_ref().and_then(|t| t.certificates.as_ref())
        != Some(&crate::api::v1::CertificateSource::Secrets)
}

/// A Secret volume named `name` (mode 0440: the pod's group, `fsGroup`, reads it).
pub(super) fn secret_volume(name: &str, secret: String) -> Volume {
    Volume {
        name: name.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            default_mode: Some(0o440),
            optional: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn read_only_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// The members' Secret volumes and their mounts (none for a plain cluster).
pub fn member_tls_volumes(ec: &EtcdCluster) -> (Vec<Volume>, Vec<VolumeMount>) {
    if !crate::api::tls_on(&ec.spec) {
        return (Vec::new(), Vec::new());
    }
    (
        vec![
            secret_volume("peer-tls", Purpose::Peer.secret(ec)),
            secret_volume("server-tls", Purpose::Server.secret(ec)),
        ],
        vec![
            read_only_mount("peer-tls", PEER_TLS_MOUNT),
            read_only_mount("server-tls", SERVER_TLS_MOUNT),
        ],
    )
}

/// The DNS names a member's certificates cover: every member under the headless Service (in
/// both spellings, with and without the cluster domain `--cluster-domain`: etcd's peer
/// listener reverse-resolves a connecting peer's address, which the cluster DNS answers with
/// the full name, and matches it against these, `checkCertSAN`), and for the client port the
/// client Service too and `localhost` (etcd's gateway dials the member itself).
pub fn dns_names(ec: &EtcdCluster, purpose: Purpose, domain: &str) -> Vec<String> {
    let (name, ns) = (ec.name_any(), namespace(ec));
    let mut names = vec![
        format!("*.{name}.{ns}.svc"),
        format!("*.{name}.{ns}.svc.{domain}"),
    ];
    if purpose == Purpose::Server {
        names.extend([
            format!("{name}-client"),
            format!("{name}-client.{ns}"),
            format!("{name}-client.{ns}.svc"),
            format!("{name}-client.{ns}.svc.{domain}"),
            "localhost".to_owned(),
        ]);
    }
    names
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Peer,
    Server,
    Client,
}

impl Purpose {
    pub const ALL: [Purpose; 3] = [Purpose::Peer, Purpose::Server, Purpose::Client];

    /// The Secret cert-manager writes it to: the Certificate's name with `-tls`.
    pub fn secret(self, ec: &EtcdCluster) -> String {
        format!("{}-tls", self.certificate(ec))
    }

    /// The Certificate's name: the Secret's without `-tls`.
    pub fn certificate(self, ec: &EtcdCluster) -> String {
        let name = ec.name_any();
        match self {
            Purpose::Peer => format!("{name}-peer"),
            Purpose::Server => format!("{name}-server"),
            Purpose::Client => format!("{name}-client"),
        }
    }
}

/// The issuer of the leaves: the user's, or the cluster's own CA Issuer `NAME-ca`.
fn leaf_issuer(ec: &EtcdCluster) -> Value {
    match ec.spec.tls.as_ref().and_then(|t| t.issuer_ref.as_ref()) {
        Some(r) => json!({
            "name": r.name,
            "kind": r.kind.as_deref().unwrap_or("Issuer"),
            "group": r.group.as_deref().unwrap_or("cert-manager.io"),
        }),
        None => {
            json!({"name": format!("{}-ca", ec.name_any()), "kind": "Issuer", "group": "cert-manager.io"})
        }
    }
}

fn cm_object(ec: &EtcdCluster, kind: &str, name: String, spec: Value) -> Value {
    json!({
        "apiVersion": CERT_MANAGER_API,
        "kind": kind,
        "metadata": meta(ec, name, "tls"),
        "spec": spec,
    })
}

/// The leaf Certificate for `purpose`.
pub fn leaf_certificate(ec: &EtcdCluster, purpose: Purpose, opts: &RenderOptions) -> Value {
    let usages: &[&str] = match purpose {
        Purpose::Peer | Purpose::Server => &[
            "server auth",
            "client auth",
            "digital signature",
            "key encipherment",
        ],
        Purpose::Client => &["client auth", "digital signature", "key encipherment"],
    };
    let mut spec = json!({
        "secretName": purpose.secret(ec),
        "commonName": purpose.certificate(ec),
        "duration": LEAF_DURATION,
        "renewBefore": LEAF_RENEW_BEFORE,
        "usages": usages,
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "issuerRef": leaf_issuer(ec),
        "secretTemplate": {"labels": labels(ec, "tls")},
    });
    if purpose == Purpose::Client {
        spec["secretTemplate"]["labels"][crate::api::CLIENT_TLS_LABEL] = json!("true");
    } else {
        spec["dnsNames"] = json!(dns_names(ec, purpose, &opts.cluster_domain));
    }
    cm_object(ec, "Certificate", purpose.certificate(ec), spec)
}

/// Every cert-manager object a TLS cluster needs, in the order they are applied (issuers
/// before what they sign); none for a plain cluster or one whose Secrets the user makes.
pub fn certificates(ec: &EtcdCluster, opts: &RenderOptions) -> Vec<Value> {
    let Some(tls) = ec
        .spec
        .tls
        .as_ref()
        .filter(|_| crate::api::tls_on(&ec.spec))
    else {
        return Vec::new();
    };
    if tls.certificates == Some(crate::api::v1::CertificateSource::Secrets) {
        return Vec::new();
    }
    let name = ec.name_any();
    let mut objects = Vec::new();
    if tls.issuer_ref.is_none() {
        objects.push(cm_object(
            ec,
            "Issuer",
            format!("{name}-selfsigned"),
            json!({"selfSigned": {}}),
        ));
        objects.push(cm_object(
            ec,
            "Certificate",
            format!("{name}-ca"),
            json!({
                "isCA": true,
                "commonName": format!("{name}-ca"),
                "secretName": format!("{name}-ca"),
                "duration": CA_DURATION,
                "renewBefore": CA_RENEW_BEFORE,
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never"},
                "issuerRef": {"name": format!("{name}-selfsigned"), "kind": "Issuer", "group": "cert-manager.io"},
            }),
        ));
        objects.push(cm_object(
            ec,
            "Issuer",
            format!("{name}-ca"),
            json!({"ca": {"secretName": format!("{name}-ca")}}),
        ));
    }
    objects.extend(Purpose::ALL.map(|p| leaf_certificate(ec, p, opts)));
    objects
}
