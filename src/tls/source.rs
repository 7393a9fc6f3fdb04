//! Where the serving pair comes from: a mounted directory, or a Secret read through the API
//! (`--cert-secret NAMESPACE/NAME`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::api::dns1123;

/// Where the serving pair comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// A directory holding `tls.crt` and `tls.key` (the mounted Secret), followed here.
    Dir(PathBuf),
    /// A Secret read through the API (`--cert-secret`), followed by `secret::run`;
    /// this module then follows only the client CA and the expiry.
    Secret(SecretRef),
}

impl CertSource {
    /// Where the pair is, as errors and logs name it (`/etc/certs`, `secret etcd-system/tls`).
    pub fn origin(&self) -> PathBuf {
        match self {
            CertSource::Dir(dir) => dir.clone(),
            CertSource::Secret(s) => PathBuf::from(format!("secret {s}")),
        }
    }
}

/// `NAMESPACE/NAME`, or `NAME` in the pod's own namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// None: the pod's namespace, filled in by [`SecretRef::in_namespace`].
    pub namespace: Option<String>,
    pub name: String,
}

impl SecretRef {
    /// This reference with `default` as its namespace when it names none.
    pub fn in_namespace(self, default: impl FnOnce() -> String) -> SecretRef {
        let namespace = Some(self.namespace.unwrap_or_else(default));
        SecretRef { namespace, ..self }
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl FromStr for SecretRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, name) = match s.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, s),
        };
        if let Some(ns) = namespace
            && !dns1123(ns, true)
        {
            return Err(format!(
                "{s:?}: {ns:?} is not a namespace name (lowercase letters, digits and '-'); write NAMESPACE/NAME or NAME"
            ));
        }
        if !dns1123(name, false) {
            return Err(format!(
                "{s:?}: {name:?} is not a Secret name (lowercase letters, digits, '-' and '.'); write NAMESPACE/NAME or NAME"
            ));
        }
        Ok(SecretRef {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        })
    }
}
