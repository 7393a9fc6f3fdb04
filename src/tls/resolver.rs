//! The current serving pair behind an atomic swap: every handshake reads it without a lock, a
//! reload replaces it for every handshake after it, and connections already up are untouched.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::{CertInfo, LoadedPair};

/// Holds the pair being served (none until the first good one arrives).
#[derive(Default)]
pub struct CertStore {
    current: ArcSwapOption<LoadedPair>,
}

impl CertStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Serves `pair` from the next handshake on.
    pub fn store(&self, pair: LoadedPair) {
        self.current.store(Some(Arc::new(pair)));
    }

    pub fn current(&self) -> Option<Arc<LoadedPair>> {
        self.current.load_full()
    }

    pub fn info(&self) -> Option<CertInfo> {
        self.current.load().as_ref().map(|p| p.info.clone())
    }

    /// True when `bytes` are exactly what is served now.
    pub fn is_current(&self, cert: &[u8], key: &[u8]) -> bool {
        self.current
            .load()
            .as_ref()
            .is_some_and(|p| p.fingerprint.0 == cert && p.fingerprint.1 == key)
    }
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("serial", &self.info().map(|i| i.serial))
            .finish()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().as_ref().map(|p| p.key.clone())
    }
}
