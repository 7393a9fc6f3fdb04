//! Serving certificates: loading and checking a `tls.crt`/`tls.key` pair, the resolver that
//! hands the current pair to every handshake, and development certificates.

pub mod cabundle;
pub mod client_auth;
pub mod dev;
pub mod resolver;
pub mod secret;
pub mod source;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use resolver::CertStore;

/// File names in a cert-manager Secret (and so in its mounted directory).
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const CA_FILE: &str = "ca.crt";

/// Why a certificate pair could not be used. The last good pair keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: bad PEM certificate: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{path}: no usable private key: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("{cert} and {key} do not belong together: {reason}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{origin} has no {key} (a kubernetes.io/tls Secret has tls.crt and tls.key)")]
    MissingKey { origin: PathBuf, key: &'static str },
    #[error("{origin} was deleted")]
    Deleted { origin: PathBuf },
}

/// What the certificate code tells the rest of the process, as it happens: `tls` owns the
/// interface and the metrics registry implements it, so `tls` never reaches up into `metrics`.
pub trait Report: Send + Sync {
    /// A new serving certificate is in use.
    fn cert_loaded(&self, info: &CertInfo);
    /// A pair was rejected while the previous one keeps serving.
    fn cert_rejected(&self);
    /// The client CA bundle was reloaded (`ok`) or rejected.
    fn client_ca_reloaded(&self, ok: bool);
    /// The watch of the certificate Secret is failing, or works again.
    fn secret_watch_failing(&self, failing: bool);
    /// Whether `object`'s caBundle fails to verify the served certificate.
    fn cabundle_mismatch(&self, object: &str, mismatch: bool);
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What the metrics and logs say about a serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Unix seconds.
    pub not_after: i64,
    pub not_before: i64,
    /// Hex, as openssl prints it.
    pub serial: String,
    pub subject: String,
    /// DNS and IP subject alternative names.
    pub names: Vec<String>,
}

/// A parsed, checked pair: ready to serve.
#[derive(Clone, Debug)]
pub struct LoadedPair {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
    /// The raw bytes read, to tell whether the files changed.
    pub fingerprint: (Vec<u8>, Vec<u8>),
}

/// Reads `tls.crt` and `tls.key` from `dir` (following symlinks, as the kubelet lays them out).
pub fn read_pair_bytes(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| CertError::Read { path, source })
    };
    Ok((read(CERT_FILE)?, read(KEY_FILE)?))
}

/// Parses and checks a pair: the chain parses, the key parses and matches the leaf.
pub fn parse_pair(
    dir: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<LoadedPair, CertError> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    let chain = parse_certs(&cert_path, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError::BadKey {
        path: key_path.clone(),
        reason: pem_reason(&e),
    })?;
    let info = cert_info(&chain[0]).map_err(|reason| CertError::BadCertificate {
        path: cert_path.clone(),
        reason,
    })?;
    let certified =
        CertifiedKey::from_der(chain, key, provider).map_err(|e| CertError::Mismatch {
            cert: cert_path,
            key: key_path,
            reason: e.to_string(),
        })?;
    Ok(LoadedPair {
        key: Arc::new(certified),
        info,
        fingerprint: (cert_pem.to_vec(), key_pem.to_vec()),
    })
}

/// A PEM error in words: rustls-pki-types prints the offending line as a byte array.
fn pem_reason(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { end_marker } => format!(
            "truncated PEM: the {} section has no END line",
            String::from_utf8_lossy(end_marker)
        ),
        E::IllegalSectionStart { line } => format!(
            "malformed PEM start line {:?}",
            String::from_utf8_lossy(line)
        ),
        E::Base64Decode(m) => format!("bad base64 in a PEM section: {m}"),
        E::NoItemsFound => "no PEM section of the expected kind".to_owned(),
        other => other.to_string(),
    }
}

/// Parses every certificate in a PEM bundle (leaf first); at least one.
pub fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::BadCertificate {
            path: path.to_owned(),
            reason: pem_reason(&e),
        })?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate {
            path: path.to_owned(),
        });
    }
    for cert in &chain {
        x509_parser::parse_x509_certificate(cert).map_err(|e| CertError::BadCertificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(chain)
}

/// A digest (16 hex digits) of the public keys of every certificate in a PEM bundle, in any
/// order: the same for a CA certificate renewed with its key, another once the CA is re-keyed.
/// `None` when the bundle holds no certificate that parses.
pub fn public_keys_digest(pem: &[u8]) -> Option<String> {
    let mut keys: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .filter_map(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
            Some(cert.public_key().raw.to_vec())
        })
        .collect();
    if keys.is_empty() {
        return None;
    }
    keys.sort();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for k in &keys {
        ctx.update(k);
    }
    Some(
        ctx.finish().as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Reads expiry, serial and names off a DER certificate.
pub fn cert_info(der: &CertificateDer<'_>) -> Result<CertInfo, String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => names.push((*d).to_owned()),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_after: cert.validity().not_after.timestamp(),
        not_before: cert.validity().not_before.timestamp(),
        serial: cert.raw_serial_as_string().replace(':', ""),
        subject: cert.subject().to_string(),
        names,
    })
}

/// Loads and checks the pair in `dir`.
pub fn load_pair(dir: &Path, provider: &CryptoProvider) -> Result<LoadedPair, CertError> {
    let (cert, key) = read_pair_bytes(dir)?;
    parse_pair(dir, &cert, &key, provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_errors_are_words_not_byte_arrays() {
        let dir = Path::new("/certs");
        let truncated = b"-----BEGIN CERTIFICATE-----\nMIIB\n";
        let e = parse_certs(&dir.join(CERT_FILE), truncated)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("truncated PEM: the CERTIFICATE section has no END line"),
            "{e}"
        );
        assert!(!e.contains("[45, 45"), "{e}");
    }

    /// A CA renewed with its key keeps its digest; a re-keyed one gets another; a bundle's
    /// order does not matter; no certificate, no digest.
    #[test]
    fn the_key_digest_follows_the_key_not_the_certificate() {
        let ca = |key: &rcgen::KeyPair, days: i64| {
            let mut p = rcgen::CertificateParams::default();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.not_after = rcgen::date_time_ymd(2030, 1, 1) + time::Duration::days(days);
            p.self_signed(key).unwrap().pem()
        };
        let (old, new) = (
            rcgen::KeyPair::generate().unwrap(),
            rcgen::KeyPair::generate().unwrap(),
        );
        let first = ca(&old, 0);
        let renewed = ca(&old, 90);
        assert_ne!(first, renewed);
        let digest = |pem: &str| public_keys_digest(pem.as_bytes());
        assert_eq!(digest(&first), digest(&renewed));
        assert!(digest(&first).is_some());
        let rekeyed = ca(&new, 90);
        assert_ne!(digest(&first), digest(&rekeyed));
        assert_eq!(
            digest(&format!("{first}{rekeyed}")),
            digest(&format!("{rekeyed}{first}"))
        );
        assert_eq!(digest("not a certificate"), None);
    }
}
