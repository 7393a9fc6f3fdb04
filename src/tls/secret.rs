//! `--cert-secret`: the serving pair read from its Secret through the API instead of a mounted
//! directory. A watch on that one Secret (`fieldSelector=metadata.name=NAME`, so RBAC can grant
//! `get`, `list` and `watch` by `resourceNames`) hands every new version to the
//! [`Reloader`](super::watch::Reloader) the moment the apiserver has it: a renewal is served
//! within a second, where a Secret volume waits for the kubelet's next sync (up to about a
//! minute and a half). A deleted Secret, a broken pair or a failing watch leave the last good
//! pair serving, and say so in the log and the metrics.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::source::SecretRef;
use super::watch::Reloader;
use super::{CERT_FILE, CertError, KEY_FILE};

/// `tls.crt` and `tls.key` of a Secret, or why they cannot be had.
pub fn pair_of(secret: &Secret, origin: &SecretRef) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let get = |key: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.0.clone())
            .ok_or_else(|| CertError::MissingKey {
                origin: format!("secret {origin}").into(),
                key,
            })
    };
    Ok((get(CERT_FILE)?, get(KEY_FILE)?))
}

/// Follows the Secret until `shutdown`: each version seen is offered to `reloader`. The watch
/// backs off on errors (a 403 says which grant is missing) and resumes by itself.
pub async fn run(
    api: Api<Secret>,
    secret: SecretRef,
    reloader: Arc<Reloader>,
    report: Arc<dyn super::Report>,
    shutdown: CancellationToken,
) {
    let fields = format!("metadata.name={}", secret.name);
    let events =
        watcher::watcher(api, watcher::Config::default().fields(&fields)).default_backoff();
    let mut events = std::pin::pin!(events);
    // Whether the initial list (or a relist) contained the Secret.
    let mut seen_in_list = false;
    let mut last_error: Option<String> = None;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = shutdown.cancelled() => return,
        };
        let Some(event) = event else { return };
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                let text = error.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    let forbidden = matches!(&error, watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
                        | watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 403);
                    if forbidden {
                        tracing::error!(error = %text, %secret, "cannot watch the certificate Secret: the service account needs get, list and watch on it (the Role etcd-webhook-cert-secret); the last certificate keeps serving");
                    } else {
                        tracing::warn!(error = %text, %secret, "watch of the certificate Secret failed; retrying, the last certificate keeps serving");
                    }
                    last_error = Some(text);
                }
                report.secret_watch_failing(true);
                continue;
            }
        };
        if last_error.take().is_some() {
            tracing::info!(%secret, "watch of the certificate Secret resumed");
        }
        report.secret_watch_failing(false);
        match event {
            Event::Init => seen_in_list = false,
            Event::InitApply(s) | Event::Apply(s) => {
                seen_in_list = true;
                offer(&reloader, &s, &secret);
            }
            Event::InitDone if !seen_in_list => gone(&reloader, &secret),
            Event::InitDone => {}
            Event::Delete(_) => gone(&reloader, &secret),
        }
    }
}

fn offer(reloader: &Reloader, s: &Secret, secret: &SecretRef) {
    match pair_of(s, secret) {
        Ok((cert, key)) => {
            reloader.offer(&cert, &key);
        }
        Err(e) => {
            reloader.reject(None, e);
        }
    }
}

fn gone(reloader: &Reloader, secret: &SecretRef) {
    reloader.reject(
        None,
        CertError::Deleted {
            origin: format!("secret {secret}").into(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn references_with_and_without_a_namespace() {
        let r: SecretRef = "etcd-system/etcd-webhook-tls".parse().unwrap();
        assert_eq!(r.namespace.as_deref(), Some("etcd-system"));
        assert_eq!(r.name, "etcd-webhook-tls");
        let r: SecretRef = "etcd-webhook-tls".parse().unwrap();
        assert_eq!(r.namespace, None);
        let r = r.in_namespace(|| "mine".to_owned());
        assert_eq!(r.to_string(), "mine/etcd-webhook-tls");
        let r: SecretRef = "a/b.c".parse().unwrap();
        assert_eq!(r.to_string(), "a/b.c");
        for bad in [
            "", "a/", "/b", "a/b/c", "A/b", "a/B", "a.b/c", "a/-b", "a/b_c",
        ] {
            let e = bad.parse::<SecretRef>().unwrap_err();
            assert!(e.contains("write NAMESPACE/NAME or NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_secret_without_its_pair_says_which_key_is_missing() {
        let r: SecretRef = "ns/tls".parse().unwrap();
        let mut s = Secret::default();
        let e = pair_of(&s, &r).unwrap_err().to_string();
        assert_eq!(
            e,
            "secret ns/tls has no tls.crt (a kubernetes.io/tls Secret has tls.crt and tls.key)"
        );
        s.data = Some(
            [("tls.crt".to_owned(), ByteString(b"c".to_vec()))]
                .into_iter()
                .collect(),
        );
        assert!(
            pair_of(&s, &r)
                .unwrap_err()
                .to_string()
                .contains("no tls.key")
        );
        s.data
            .as_mut()
            .unwrap()
            .insert("tls.key".to_owned(), ByteString(b"k".to_vec()));
        assert_eq!(pair_of(&s, &r).unwrap(), (b"c".to_vec(), b"k".to_vec()));
    }
}
