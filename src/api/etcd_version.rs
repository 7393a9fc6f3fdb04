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

/// One minor line of etcd releases the loop runs: the oldest patch it admits and the newest its
/// tests run (the tests run both: tests/members.rs, tests/backups.rs and the e2e suite), and the
/// patch etcd's upgrade guide asks every member to run before the next minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    pub minor: u64,
    pub oldest: u64,
    pub newest_tested: u64,
    pub before_next: Option<u64>,
}

/// The etcd releases the loop admits (every v3 patch of a line from its `oldest` on) and the
/// tests run (`oldest` and `newest_tested` of each line), one row per minor. Older lines lack
/// what the loop relies on (v3.4 is past its support; v3.3 serves only `/v3beta` and has no
/// learners; v3.2 has no `--listen-metrics-urls`; a linearizable `member list` exists from
/// v3.5.0). Within a line:
/// - v3.5 from v3.5.1 (the oldest 3.5 the tests run; v3.5.0 is not run);
/// - v3.6 from v3.6.4 (v3.6.0 to v3.6.3 are not run);
/// - v3.7 from v3.7.4 (v3.7.0 to v3.7.3 are not run; v3.7.4 is also the first 3.7 patch whose
///   start-up reads every WAL entry a member that once ran v3.5 may still hold).
///
/// Before the next minor: v3.5 -> v3.6 from v3.5.32 and v3.6 -> v3.7 from v3.6.11 (etcd's
/// upgrade guides; earlier patches fail the upgrade, e.g. with "too many learner members",
/// etcd-io/etcd#19557).
pub const RELEASES: [Line; 3] = [
    Line {
        minor: 5,
        oldest: 1,
        newest_tested: 36,
        before_next: Some(32),
    },
    Line {
        minor: 6,
        oldest: 4,
        newest_tested: 17,
        before_next: Some(11),
    },
    Line {
        minor: 7,
        oldest: 4,
        newest_tested: 4,
        before_next: None,
    },
];

impl Line {
    /// `v3.<minor>.<patch>`.
    pub fn release(&self, patch: u64) -> EtcdVersion {
        EtcdVersion {
            major: 3,
            minor: self.minor,
            patch,
        }
    }
}

impl EtcdVersion {
    /// The releases the tests run: each line's oldest admitted patch and its newest tested one.
    pub fn tested() -> Vec<EtcdVersion> {
        let mut out: Vec<EtcdVersion> = RELEASES
            .iter()
            .flat_map(|l| [l.release(l.oldest), l.release(l.newest_tested)])
            .collect();
        out.dedup();
        out
    }

    /// The newest release the tests run (the default `spec.version`).
    pub fn newest_tested() -> EtcdVersion {
        let l = RELEASES[RELEASES.len() - 1];
        l.release(l.newest_tested)
    }

    /// The line of this release, if the loop runs that minor.
    pub fn line(&self) -> Option<&'static Line> {
        RELEASES
            .iter()
            .find(|l| self.major == 3 && l.minor == self.minor)
    }

    /// Whether the loop runs members of this release; the reason if not (a sentence that
    /// completes "spec.version: Invalid value: ...: ").
    pub fn supported(&self) -> Result<(), String> {
        match self.line() {
            Some(l) if self.patch >= l.oldest => Ok(()),
            _ => Err(Self::unsupported()),
        }
    }

    /// A warning for a release the loop admits but its tests do not run: a patch newer than
    /// the newest tested one of its line.
    pub fn untested(&self) -> Option<String> {
        let l = self.line()?;
        (self.patch > l.newest_tested).then(|| {
            format!(
                "{self} is newer than the newest v3.{} patch this operator's tests run ({}): etcd keeps its API and flags within a minor, but nothing here has run it",
                l.minor,
                l.release(l.newest_tested)
            )
        })
    }

    /// Why a release the loop does not run is refused (the CRD's CEL rule says the same).
    pub fn unsupported() -> String {
        let lines: Vec<String> = RELEASES
            .iter()
            .map(|l| format!("{} or a later v3.{} patch", l.release(l.oldest), l.minor))
            .collect();
        let (last, rest) = lines.split_last().expect("a release line");
        format!(
            "must be {}, or {last}: the etcd releases this operator runs and tests (v3.4 and older lack learners, the v3 member API or the metrics listener it uses)",
            rest.join(", ")
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
            && let Some(min) = self.line().and_then(|l| l.before_next)
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
        for ok in [
            "v3.5.1", "v3.5.32", "v3.5.36", "v3.6.4", "v3.6.17", "v3.6.40", "v3.7.4",
        ] {
            assert!(v(ok).supported().is_ok(), "{ok}");
        }
        for bad in [
            "v3.3.27", "v3.4.30", "v3.5.0", "v3.6.0", "v3.6.3", "v3.7.0", "v3.7.3", "v3.8.0",
            "v2.3.8", "v4.0.0",
        ] {
            let why = v(bad).supported().unwrap_err();
            assert!(
                why.contains("v3.5.1 or a later v3.5 patch, v3.6.4 or a later v3.6 patch, or v3.7.4 or a later v3.7 patch"),
                "{bad}: {why}"
            );
        }
        assert_eq!(v("v3.6.17").untested(), None);
        let newer = v("v3.6.18").untested().unwrap();
        assert!(
            newer.contains("newest v3.6 patch this operator's tests run (v3.6.17)"),
            "{newer}"
        );
        assert!(v("v3.5.32").upgrade_to(&v("v3.6.4")).is_ok());
        assert!(v("v3.6.11").upgrade_to(&v("v3.7.4")).is_ok());
        // The largest numbers a version may spell do not overflow.
        let max = format!("v3.{}.0", u64::MAX);
        assert!(v(&max).upgrade_to(&v("v3.5.0")).is_err());
        assert!(v("v3.5.0").upgrade_to(&v(&max)).is_err());
        assert!(v("v3.5.1").upgrade_to(&v("v3.5.36")).is_ok());
        assert!(v("v3.6.4").upgrade_to(&v("v3.6.17")).is_ok());
        let early = v("v3.5.26").upgrade_to(&v("v3.6.4")).unwrap_err();
        assert!(
            early.contains("v3.5.32 or later") && early.contains("newest v3.5 patch"),
            "{early}"
        );
        let early = v("v3.6.4").upgrade_to(&v("v3.7.4")).unwrap_err();
        assert!(
            early.contains("v3.6.11 or later") && early.contains("newest v3.6 patch"),
            "{early}"
        );
        assert!(
            v("v3.6.4")
                .upgrade_to(&v("v3.5.26"))
                .unwrap_err()
                .contains("downgrade")
        );
        for skip in [("v3.4.30", "v3.6.4"), ("v3.5.36", "v3.7.4")] {
            assert!(
                v(skip.0)
                    .upgrade_to(&v(skip.1))
                    .unwrap_err()
                    .contains("one minor release at a time"),
                "{skip:?}"
            );
        }
    }

    /// The releases the tests run: each line's oldest admitted and newest tested patch; the
    /// newest of all is the default.
    #[test]
    fn the_tested_releases_are_each_lines_ends_and_the_newest_is_the_default() {
        let tested: Vec<String> = EtcdVersion::tested()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(tested, ["v3.5.1", "v3.5.36", "v3.6.4", "v3.6.17", "v3.7.4"]);
        assert_eq!(
            EtcdVersion::newest_tested().to_string(),
            crate::api::defaults::VERSION
        );
        for l in RELEASES {
            assert!(l.oldest <= l.newest_tested, "{l:?}");
            assert!(l.before_next.is_none_or(|b| b <= l.newest_tested), "{l:?}");
        }
    }

    /// docs/versions.md's table "etcd releases" says what this one says.
    #[test]
    fn the_docs_table_is_this_table() {
        let doc = include_str!("../../docs/versions.md");
        let section = doc
            .split("## etcd releases")
            .nth(1)
            .expect("docs/versions.md has a section \"etcd releases\"");
        let rows: Vec<Vec<String>> = section
            .lines()
            .filter(|l| l.starts_with("| v3."))
            .map(|l| {
                l.split('|')
                    .map(|c| c.trim().to_owned())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        let want: Vec<Vec<String>> = RELEASES
            .iter()
            .map(|l| {
                vec![
                    format!("v3.{}", l.minor),
                    l.release(l.oldest).to_string(),
                    l.release(l.newest_tested).to_string(),
                    l.before_next
                        .map_or("—".to_owned(), |b| l.release(b).to_string()),
                ]
            })
            .collect();
        assert_eq!(rows, want);
    }
}
