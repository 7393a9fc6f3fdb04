//! Keeping the served certificate in step with the files: a watch on the *directory* (the
//! kubelet swaps a `..data` symlink and never writes `tls.crt` in place, so a watch on the file
//! dies after the first rotation), a debounce for bursts of events, and a periodic re-read in
//! case events are missed. A pair is swapped in only when its bytes changed and it checks out;
//! otherwise the last good pair keeps serving and the reason is logged and counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use rustls::crypto::CryptoProvider;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client_auth::ReloadingVerifier;
use super::source::CertSource;
use super::{CertError, CertStore, parse_pair, read_pair_bytes};

/// How the pair and the client CA are followed.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    pub source: CertSource,
    pub client_ca: Option<PathBuf>,
    pub poll_interval: Duration,
    pub debounce: Duration,
    pub expiry_warning: Duration,
}

/// What one look at the files found.
#[derive(Debug)]
pub enum Outcome {
    Unchanged,
    Loaded,
    Rejected(CertError),
}

/// Reloads the serving pair (and the client CA) from disk into the stores.
pub struct Reloader {
    options: WatchOptions,
    store: Arc<CertStore>,
    client_ca: Option<Arc<ReloadingVerifier>>,
    report: Arc<dyn super::Report>,
    provider: Arc<CryptoProvider>,
    /// The bytes last rejected (or, for a pair that could not be read, the error), so a broken
    /// file is reported once, not at every poll.
    rejected: std::sync::Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// The CA bundle read error last reported.
    ca_error: std::sync::Mutex<Option<String>>,
    warned_expiry_of: std::sync::Mutex<Option<String>>,
}

impl Reloader {
    pub fn new(
        options: WatchOptions,
        store: Arc<CertStore>,
        client_ca: Option<Arc<ReloadingVerifier>>,
        report: Arc<dyn super::Report>,
        provider: Arc<CryptoProvider>,
    ) -> Arc<Self> {
        Arc::new(Self {
            options,
            store,
            client_ca,
            report,
            provider,
            rejected: Default::default(),
            ca_error: Default::default(),
            warned_expiry_of: Default::default(),
        })
    }

    /// Reads the pair from the directory; swaps it in when it changed and checks out. A
    /// Secret source is not read here (its watch offers what it sees).
    pub fn reload_once(&self) -> Outcome {
        let CertSource::Dir(dir) = &self.options.source else {
            return Outcome::Unchanged;
        };
        match read_pair_bytes(dir) {
            Ok((cert, key)) => self.offer(&cert, &key),
            Err(e) => self.reject(None, e),
        }
    }

    /// Swaps in the pair `cert`/`key` (as read from the source) when it differs from the one
    /// served and checks out; otherwise the served pair stays and the reason is logged once.
    pub fn offer(&self, cert: &[u8], key: &[u8]) -> Outcome {
        if self.store.is_current(cert, key) {
            return Outcome::Unchanged;
        }
        let origin = self.options.source.origin();
        let dir = origin.as_path();
        let pair = match parse_pair(dir, cert, key, &self.provider) {
            Ok(pair) => pair,
            Err(e) => return self.reject(Some((cert.to_vec(), key.to_vec())), e),
        };
        let previous = self.store.info();
        tracing::info!(
            serial = %pair.info.serial,
            previous = previous.as_ref().map(|i| i.serial.as_str()).unwrap_or("none"),
            not_after = pair.info.not_after,
            names = ?pair.info.names,
            from = %dir.display(),
            "serving certificate loaded"
        );
        self.report.cert_loaded(&pair.info);
        self.store.store(pair);
        *self.rejected.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Outcome::Loaded
    }

    /// Reports a pair that cannot be used (`bytes` None: it could not even be read).
    pub fn reject(&self, bytes: Option<(Vec<u8>, Vec<u8>)>, error: CertError) -> Outcome {
        let serving = self.store.current().is_some();
        let mut last = self.rejected.lock().unwrap_or_else(|e| e.into_inner());
        // A pair that could not be read is remembered by its error, so the directory's polling
        // reports the same missing file once, and a different reason (a deleted Secret, then one
        // without tls.key) is reported again.
        let key = bytes.unwrap_or_else(|| (Vec::new(), error.to_string().into_bytes()));
        if last.as_ref() != Some(&key) {
            if serving {
                if let CertSource::Secret(_) = self.options.source {
                    tracing::error!(%error, "certificate in the Secret rejected; the previous certificate keeps serving");
                } else {
                    tracing::error!(%error, "certificate files rejected; the previous certificate keeps serving");
                }
                self.report.cert_rejected();
            } else {
                tracing::warn!(%error, "waiting for a usable serving certificate");
            }
            *last = Some(key);
        }
        Outcome::Rejected(error)
    }

    fn reload_client_ca(&self) {
        let (Some(verifier), Some(path)) = (&self.client_ca, &self.options.client_ca) else {
            return;
        };
        let mut last = self.ca_error.lock().unwrap_or_else(|e| e.into_inner());
        match verifier.reload(path) {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(path = %path.display(), "client CA bundle reloaded");
                self.report.client_ca_reloaded(true);
                *last = None;
            }
            Err(e) => {
                let text = e.to_string();
                if last.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, "client CA bundle rejected; the previous one stays in force");
                    self.report.client_ca_reloaded(false);
                    *last = Some(text);
                }
            }
        }
    }

    /// Warns (once per certificate) when the served certificate expires soon.
    fn check_expiry(&self) {
        let Some(info) = self.store.info() else {
            return;
        };
        let left = info.not_after - super::now();
        if left > self.options.expiry_warning.as_secs() as i64 {
            return;
        }
        let mut warned = self
            .warned_expiry_of
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if warned.as_deref() == Some(info.serial.as_str()) {
            return;
        }
        if left <= 0 {
            tracing::error!(serial = %info.serial, not_after = info.not_after, "serving certificate has expired; readiness is false");
        } else {
            tracing::warn!(serial = %info.serial, not_after = info.not_after, hours_left = left / 3600, "serving certificate expires soon");
        }
        *warned = Some(info.serial);
    }

    /// One full pass: pair (retrying once after the debounce if a half-written pair was seen),
    /// client CA, expiry.
    async fn pass(&self) {
        if let Outcome::Rejected(_) = self.reload_once() {
            tokio::time::sleep(self.options.debounce).await;
            let _ = self.reload_once();
        }
        self.reload_client_ca();
        self.check_expiry();
    }

    /// Starts following the files: the watches are in place before the first read, so no
    /// change can slip between the two. Runs until `shutdown`.
    pub fn spawn(self: Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let wake = Arc::new(Notify::new());
        let mut watches = DirWatches::new(wake.clone());
        // The parent too, so a directory that is removed and comes back is seen at once.
        let mut dirs = Vec::new();
        if let CertSource::Dir(dir) = &self.options.source {
            dirs.push(dir.clone());
            dirs.extend(
                dir.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(Path::to_owned),
            );
        }
        if let Some(ca) = &self.options.client_ca {
            dirs.extend(
                ca.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(Path::to_owned),
            );
        }
        dirs.dedup();
        watches.ensure(&dirs);
        self.reload_once();
        self.check_expiry();
        tokio::spawn(async move {
            let mut poll = tokio::time::interval(self.options.poll_interval);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            poll.tick().await;
            loop {
                tokio::select! {
                    () = wake.notified() => tokio::time::sleep(self.options.debounce).await,
                    _ = poll.tick() => {}
                    () = shutdown.cancelled() => return,
                }
                watches.ensure(&dirs);
                self.pass().await;
            }
        })
    }
}

/// inotify watches on directories, re-established when a directory appears, disappears or is
/// replaced (checked at every wake-up).
struct DirWatches {
    wake: Arc<Notify>,
    watcher: Option<RecommendedWatcher>,
    /// (dir, identity of the watched inode)
    watched: Vec<(PathBuf, Option<(u64, u64)>)>,
}

fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

impl DirWatches {
    fn new(wake: Arc<Notify>) -> Self {
        Self {
            wake,
            watcher: None,
            watched: Vec::new(),
        }
    }

    fn ensure(&mut self, dirs: &[PathBuf]) {
        let now: Vec<(PathBuf, Option<(u64, u64)>)> =
            dirs.iter().map(|d| (d.clone(), identity(d))).collect();
        if self.watcher.is_some() && now == self.watched {
            return;
        }
        let wake = self.wake.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                wake.notify_one();
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(error) => {
                tracing::warn!(%error, "cannot watch for certificate changes; relying on polling");
                return;
            }
        };
        for (dir, id) in &now {
            if id.is_none() {
                tracing::debug!(dir = %dir.display(), "directory missing; polling until it appears");
                continue;
            }
            if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(%error, dir = %dir.display(), "cannot watch directory; relying on polling");
            }
        }
        self.watcher = Some(watcher);
        self.watched = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::dev;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts rejections, as the metrics registry does.
    #[derive(Default)]
    struct Rejections(AtomicU64);

    impl crate::tls::Report for Rejections {
        fn cert_loaded(&self, _: &crate::tls::CertInfo) {}
        fn cert_rejected(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn client_ca_reloaded(&self, _: bool) {}
        fn secret_watch_failing(&self, _: bool) {}
        fn cabundle_mismatch(&self, _: &str, _: bool) {}
    }

    #[test]
    fn each_new_reason_a_pair_cannot_be_used_is_reported_once() {
        let metrics = Arc::new(Rejections::default());
        let store = CertStore::new();
        let reloader = Reloader::new(
            WatchOptions {
                source: CertSource::Secret("ns/tls".parse().unwrap()),
                client_ca: None,
                poll_interval: Duration::from_secs(10),
                debounce: Duration::from_millis(200),
                expiry_warning: Duration::from_secs(86_400),
            },
            store.clone(),
            None,
            metrics.clone(),
            Arc::new(rustls::crypto::ring::default_provider()),
        );
        let pair = dev::generate(&["localhost".to_owned()], &[], 1).unwrap();
        assert!(matches!(
            reloader.offer(pair.cert.as_bytes(), pair.key.as_bytes()),
            Outcome::Loaded
        ));
        let failures = || metrics.0.load(Ordering::SeqCst);
        let deleted = || CertError::Deleted {
            origin: "secret ns/tls".into(),
        };
        reloader.reject(None, deleted());
        reloader.reject(None, deleted());
        assert_eq!(failures(), 1, "the same reason twice counts once");
        reloader.reject(
            None,
            CertError::MissingKey {
                origin: "secret ns/tls".into(),
                key: "tls.key",
            },
        );
        assert_eq!(failures(), 2, "a new reason counts again");
        reloader.offer(b"junk", b"junk");
        reloader.offer(b"junk", b"junk");
        assert_eq!(failures(), 3, "the same broken bytes count once");
        assert!(
            matches!(
                reloader.offer(pair.cert.as_bytes(), pair.key.as_bytes()),
                Outcome::Unchanged
            ),
            "the first pair kept serving throughout"
        );
    }
}
