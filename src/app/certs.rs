//! The serving certificate at start: the embedded development default, and the wait for a
//! usable pair (cert-manager may not have issued it yet).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Error;
use crate::tls::source::CertSource;
use crate::tls::{self, CertStore};

/// The embedded default: a development CA and serving pair for localhost under ./certs/dev,
/// made once and re-made when missing, broken or about to expire.
pub(super) fn dev_cert_dir() -> Result<PathBuf, Error> {
    let dir = PathBuf::from("certs/dev");
    let provider = rustls::crypto::ring::default_provider();
    let usable = tls::load_pair(&dir, &provider)
        .map(|p| p.info.not_after > crate::tls::now() + 86_400)
        .unwrap_or(false);
    if !usable || !dir.join(tls::CA_FILE).exists() {
        let ips = [
            std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::Ipv6Addr::LOCALHOST.into(),
        ];
        tls::dev::generate(&["localhost".to_owned()], &ips, 365)?.write_plain(&dir)?;
        tracing::info!(dir = %dir.display(), "created a development CA and serving certificate");
    }
    Ok(dir)
}

/// Waits until a usable pair is served, at most `limit`.
pub(super) async fn wait_for_certificate(
    store: &CertStore,
    source: &CertSource,
    limit: Duration,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + limit;
    while store.current().is_none() {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::NoCertificate(why_none(source, limit)));
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = shutdown.cancelled() => return Err(Error::ShutDownWhileWaiting),
        }
    }
    Ok(())
}

/// The final error of [`wait_for_certificate`], with why the files are not usable.
fn why_none(source: &CertSource, limit: Duration) -> String {
    let waited = humantime::format_duration(limit);
    match source {
        CertSource::Secret(secret) => format!(
            "no usable serving certificate in secret {secret} after {waited} (--cert-wait); expected a Secret with tls.crt and tls.key that belong together, readable by this service account (the log above says what was wrong)"
        ),
        CertSource::Dir(dir) => {
            let cause = match tls::load_pair(dir, &rustls::crypto::ring::default_provider()) {
                Err(e) => format!(": {e}"),
                Ok(_) => String::new(),
            };
            format!(
                "no usable serving certificate in {} after {waited} (--cert-wait){cause}; expected tls.crt and tls.key that belong together, e.g. the mounted cert-manager Secret",
                dir.display(),
            )
        }
    }
}

pub(super) fn print_dev_hint(dir: &Path, port: u16) {
    let ca = dir.join(tls::CA_FILE);
    let ca = ca.canonicalize().unwrap_or(ca);
    tracing::info!(ca = %ca.display(), "development certificate authority");
    tracing::info!(
        "try: curl --cacert {} -H 'Content-Type: application/json' --data @tests/fixtures/validate-v1-create-even-size.json https://localhost:{}/validate",
        ca.display(),
        port
    );
}
