//! An etcd release as the spec names it: `v3.5.10` in v1 and v1beta1, `3.5.10` in v1alpha1.

use std::fmt;
use std::str::FromStr;

/// `v<major>.<minor>.<patch>`, ordered by release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

/// Not an etcd release written `v3.5.10`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an etcd release like v3.5.10")]
pub struct NotAVersion(pub String);

impl FromStr for EtcdVersion {
    type Err = NotAVersion;

    fn from_str(v: &str) -> Result<Self, NotAVersion> {
        let bad = || NotAVersion(v.to_owned());
        let mut parts = v.strip_prefix('v').ok_or_else(bad)?.split('.');
        let mut next = || -> Result<u64, NotAVersion> {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let version = EtcdVersion {
            major: next()?,
            minor: next()?,
            patch: next()?,
        };
        match parts.next() {
            None => Ok(version),
            Some(_) => Err(bad()),
        }
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl EtcdVersion {
    /// The v1alpha1 spelling of a v1 version string: without the `v` (any string maps, so a
    /// conversion never fails on it).
    pub fn alpha_spelling(v1: &str) -> String {
        v1.strip_prefix('v').unwrap_or(v1).to_owned()
    }

    /// The v1 spelling of a v1alpha1 version string.
    pub fn from_alpha_spelling(alpha: &str) -> String {
        format!("v{alpha}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_orders_and_spells() {
        let v: EtcdVersion = "v03.05.010".parse().unwrap();
        assert_eq!((v.major, v.minor, v.patch), (3, 5, 10));
        assert_eq!(v.to_string(), "v3.5.10");
        for bad in ["3.5.10", "v3.5.+1", "v3.5", "v3.5.1.2", "v3..1", ""] {
            assert!(bad.parse::<EtcdVersion>().is_err(), "{bad}");
        }
        let older: EtcdVersion = "v3.4.30".parse().unwrap();
        assert!(older < v);
        assert_eq!(EtcdVersion::alpha_spelling("v3.5.10"), "3.5.10");
        assert_eq!(EtcdVersion::from_alpha_spelling("3.5.10"), "v3.5.10");
    }
}
