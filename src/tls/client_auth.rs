//! Optional client authentication (`--client-ca`): every connection must present a certificate
//! signed by the CA bundle, which is reloaded like the serving pair.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{CertError, parse_certs};

/// A client certificate verifier whose CA bundle can be swapped while serving.
pub struct ReloadingVerifier {
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
    /// The bundle bytes in use, to tell whether the file changed.
    bundle: ArcSwap<Vec<u8>>,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for ReloadingVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReloadingVerifier")
    }
}

/// Builds a verifier from a PEM bundle of CA certificates.
pub fn verifier_from_pem(
    path: &Path,
    pem: &[u8],
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, CertError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(path, pem)? {
        roots.add(cert).map_err(|e| CertError::BadCertificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| CertError::BadCertificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

impl ReloadingVerifier {
    pub fn new(path: &Path, provider: Arc<CryptoProvider>) -> Result<Arc<Self>, CertError> {
        let pem = std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_owned(),
            source,
        })?;
        let verifier = verifier_from_pem(path, &pem, &provider)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(verifier),
            bundle: ArcSwap::from_pointee(pem),
            provider,
        }))
    }

    /// Re-reads the bundle; Ok(true) when it changed and was swapped in. On error the previous
    /// bundle stays in force.
    pub fn reload(&self, path: &Path) -> Result<bool, CertError> {
        let pem = std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_owned(),
            source,
        })?;
        if **self.bundle.load() == pem {
            return Ok(false);
        }
        let verifier = verifier_from_pem(path, &pem, &self.provider)?;
        self.current.store(Arc::new(verifier));
        self.bundle.store(Arc::new(pem));
        Ok(true)
    }
}

impl ClientCertVerifier for ReloadingVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would have to outlive a reload. Clients then send the certificate they
    /// are configured with, which is what the apiserver does.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current
            .load()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().supported_verify_schemes()
    }
}
