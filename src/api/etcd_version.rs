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

/// The etcd minor releases (3.x) the loop runs members of: the ones its membership is proven
/// against on real etcd in tests/members.rs (v3.5.1 and v3.6.4). v3.4 and older lack what the
/// loop relies on (v3.4 is past its support; v3.3 serves only `/v3beta` and has no learners;
/// v3.2 has no `--listen-metrics-urls`; a linearizable `member list` exists from v3.5.0).
pub const SUPPORTED_MINORS: std::ops::RangeInclusive<u64> = 5..=6;

/// etcd's v3.5 -> v3.6 upgrade guide: every member must run v3.5.26 or later first (earlier
/// patches fail the upgrade, e.g. with "too many learner members").
pub const MIN_PATCH_BEFORE_NEXT_MINOR: [(u64, u64); 1] = [(5, 26)];

impl EtcdVersion {
    /// Whether the loop runs members of this release; the reason if not (a sentence that
    /// completes "spec.version: Invalid value: ...: ").
    pub fn supported(&self) -> Result<(), String> {
        if self.major == 3 && SUPPORTED_MINORS.contains(&self.minor) {
            return Ok(());
        }
        Err(Self::unsupported())
    }

    /// Why a release the loop does not run is refused (the CRD's CEL rule says the same).
    pub fn unsupported() -> String {
        format!(
            "must be a v3.{}.x or v3.{}.x release, the etcd releases this operator runs and tests (older ones lack learners, the v3 member API or the metrics listener it uses)",
            SUPPORTED_MINORS.start(),
            SUPPORTED_MINORS.end()
        )
    }

    /// Why `from` -> `to` is refused when `from` is a patch of v3.`minor` below `min` and `to`
    /// the next minor (the CRD's CEL rule builds the same words around its two values).
    pub fn too_early_for_next_minor(from: &str, to: &str, minor: u64, min: u64) -> String {
        format!(
            "cannot upgrade from {from} to {to}: etcd's v3.{minor} -> v3.{} upgrade needs every member on v3.{minor}.{min} or later first; upgrade to the newest v3.{minor} patch, then to {to}",
            minor.saturating_add(1)
        )
    }

    /// Whether `version` (a spec's spelling, `v3.5.11`) is a release at or after
    /// `major.minor.patch`; a version that does not parse is not.
    pub fn at_least(version: &str, major: u64, minor: u64, patch: u64) -> bool {
        version
            .parse::<EtcdVersion>()
            .is_ok_and(|v| (v.major, v.minor, v.patch) >= (major, minor, patch))
    }

    /// Whether etcd supports going from `self` to `to` in place; the reason if not.
    pub fn upgrade_to(&self, to: &EtcdVersion) -> Result<(), String> {
        if to < self {
            return Err(format!(
                "cannot downgrade from {self} to {to}: etcd does not support downgrades"
            ));
        }
        if to.major == self.major && to.minor > self.minor.saturating_add(1) {
            return Err(format!(
                "cannot upgrade from {self} to {to}: etcd upgrades one minor release at a time; go to v{}.{}.x first",
                self.major,
                self.minor.saturating_add(1)
            ));
        }
        if Some(to.minor) == self.minor.checked_add(1)
            && let Some(&(_, min)) = MIN_PATCH_BEFORE_NEXT_MINOR
                .iter()
                .find(|(minor, _)| self.major == 3 && *minor == self.minor)
            && self.patch < min
        {
            return Err(Self::too_early_for_next_minor(
                &self.to_string(),
                &to.to_string(),
                self.minor,
                min,
            ));
        }
        Ok(())
    }

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

    fn v(s: &str) -> EtcdVersion {
        s.parse().unwrap()
    }

    #[test]
    fn supported_releases_and_the_upgrades_etcd_allows() {
        for ok in ["v3.5.0", "v3.5.1", "v3.5.26", "v3.6.0", "v3.6.4"] {
            assert!(v(ok).supported().is_ok(), "{ok}");
        }
        for bad in ["v3.3.27", "v3.4.30", "v3.7.0", "v2.3.8", "v4.0.0"] {
            let why = v(bad).supported().unwrap_err();
            assert!(why.contains("v3.5.x or v3.6.x"), "{bad}: {why}");
        }
        assert!(v("v3.5.26").upgrade_to(&v("v3.6.4")).is_ok());
        // The largest numbers a version may spell do not overflow.
        let max = format!("v3.{}.0", u64::MAX);
        assert!(v(&max).upgrade_to(&v("v3.5.0")).is_err());
        assert!(v("v3.5.0").upgrade_to(&v(&max)).is_err());
        assert!(v("v3.5.1").upgrade_to(&v("v3.5.26")).is_ok());
        assert!(v("v3.6.0").upgrade_to(&v("v3.6.4")).is_ok());
        let early = v("v3.5.1").upgrade_to(&v("v3.6.4")).unwrap_err();
        assert!(
            early.contains("v3.5.26 or later") && early.contains("newest v3.5 patch"),
            "{early}"
        );
        assert!(
            v("v3.6.4")
                .upgrade_to(&v("v3.5.26"))
                .unwrap_err()
                .contains("downgrade")
        );
        assert!(
            v("v3.4.30")
                .upgrade_to(&v("v3.6.4"))
                .unwrap_err()
                .contains("one minor release at a time")
        );
    }
}
