//! What a reconcile could not do.

/// What a reconcile could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// A spec the webhook would have denied (it was bypassed, e.g. with failurePolicy Ignore):
    /// nothing is changed for it.
    #[error("{0}")]
    InvalidSpec(String),
    #[error("the {0} cache has not finished its first list")]
    CacheNotReady(&'static str),
    /// A cached object that does not decode as its kind (the cache keeps any JSON object the
    /// watch sent; the typed decode happens on read).
    #[error("the cached {kind} {name} does not decode: {reason}")]
    CacheDecode {
        kind: &'static str,
        name: String,
        reason: String,
    },
    /// A TLS cluster's client certificate cannot be used (not issued yet, or broken).
    #[error("{0}")]
    MemberTls(String),
}

impl Error {
    pub(crate) fn kube(
        action: &'static str,
        kind: &'static str,
        name: &str,
        source: kube::Error,
    ) -> Self {
        Error::Kube {
            action,
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }
}
