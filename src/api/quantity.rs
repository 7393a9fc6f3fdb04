//! Kubernetes resource quantities, as far as storage sizes need them: parsed exactly (every
//! spelling the apiserver accepts: `1Ti`, `1099511627776`, `1.5Gi`, `2e9`, `500M`), compared as
//! values, and written the way the apiserver writes them back (`1024Gi` comes back as `1Ti`), so
//! what the controller renders is byte-for-byte what it reads.

/// A quantity's exact value in nano-units (`1` = 10^-9), which holds every suffix from `n` to
/// `Ei` without rounding.
type Nanos = i128;

const NANO: Nanos = 1_000_000_000;

/// The exact value of a quantity, in nano-units; `None` when it is not a quantity or does not fit.
fn nanos(q: &str) -> Option<Nanos> {
    let q = q.trim();
    let (sign, rest) = match q.as_bytes().first()? {
        b'-' => (-1, &q[1..]),
        b'+' => (1, &q[1..]),
        _ => (1, q),
    };
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(end);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    // mantissa = digits / 10^frac.len()
    let digits: Nanos = format!("{whole}{frac}").parse().ok()?;
    let scale = i32::try_from(frac.len()).ok()?;
    let (base, exp): (Nanos, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse().ok()?),
        _ => return None,
    };
    // value = digits * base * 10^(exp - scale), in nanos: * 10^9.
    let power = exp - scale + 9;
    let mut v = digits.checked_mul(base)?;
    if power >= 0 {
        v = v.checked_mul(10_i128.checked_pow(u32::try_from(power).ok()?)?)?;
    } else {
        let d = 10_i128.checked_pow(u32::try_from(-power).ok()?)?;
        if v % d != 0 {
            return None; // below a nano-unit: no quantity the apiserver keeps
        }
        v /= d;
    }
    Some(sign * v)
}

/// Whole bytes of a quantity; `None` when it is no quantity or not a whole number of bytes.
pub fn bytes(q: &str) -> Option<i128> {
    let n = nanos(q)?;
    (n % NANO == 0).then_some(n / NANO)
}

/// Whole GiB of a quantity (`10Gi`, `1Ti`, `10737418240`); `None` for anything else.
pub fn gib(q: &str) -> Option<i64> {
    let b = bytes(q)?;
    if b % (1 << 30) != 0 {
        return None;
    }
    i64::try_from(b >> 30).ok()
}

/// Whether two strings are quantities of the same value (`1Ti` and `1024Gi`).
pub fn same(a: &str, b: &str) -> bool {
    matches!((nanos(a), nanos(b)), (Some(x), Some(y)) if x == y)
}

/// `n` GiB as the apiserver writes it back: the largest binary suffix with a whole mantissa
/// (`10Gi`, `1Ti`, `1536Gi`, `1Pi`).
pub fn canonical_gib(n: i64) -> String {
    if n == 0 {
        return "0".to_owned();
    }
    let mut mantissa = n;
    let mut suffixes = ["Gi", "Ti", "Pi", "Ei"].into_iter().peekable();
    let mut suffix = suffixes.next().expect("Gi");
    while mantissa % 1024 == 0 && suffixes.peek().is_some() {
        mantissa /= 1024;
        suffix = suffixes.next().expect("peeked");
    }
    format!("{mantissa}{suffix}")
}

/// A storage size as the apiserver writes it back; a size that is not whole GiB is kept as
/// written (the webhook admits only whole GiB).
pub fn canonical(q: &str) -> String {
    gib(q).map_or_else(|| q.to_owned(), canonical_gib)
}

/// A spec's storage size (v1 `storageSize`, v1beta1 `storage.size`): whole GiB written as
/// digits and `Gi`, like `10Gi` (v1alpha1 holds the number alone, `storageSizeGi: 10`). Not a
/// general quantity: what the apiserver writes back into a claim is read with [`gib`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageSize(i64);

/// Not a storage size written like `10Gi`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a whole number of GiB like 10Gi")]
pub struct NotAStorageSize(pub String);

impl NotAStorageSize {
    /// What is wrong with it, in words a person can act on (`2048Mi` is `2Gi`, `1Ti` is
    /// `1024Gi`, digits too many for a size, anything else not a size at all); `like` ends the
    /// generic case with an example in the version's spelling.
    pub fn why(&self, like: &str) -> String {
        let s = self.0.trim();
        if let Some(digits) = s.strip_suffix("Gi")
            && !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
        {
            return format!("is too large: at most {}Gi", i64::MAX);
        }
        match (gib(s), bytes(s)) {
            (Some(n), _) => format!("must be written in Gi: {n}Gi"),
            (None, Some(b)) if b > 0 => format!(
                "must be a whole number of GiB ({s} is {:.2}Gi){like}",
                b as f64 / (1u64 << 30) as f64
            ),
            _ => format!("must be a whole number of GiB{like}"),
        }
    }
}

impl StorageSize {
    pub fn from_gib(gib: i64) -> Self {
        StorageSize(gib)
    }

    pub fn gib(self) -> i64 {
        self.0
    }
}

impl std::str::FromStr for StorageSize {
    type Err = NotAStorageSize;

    fn from_str(s: &str) -> Result<Self, NotAStorageSize> {
        s.strip_suffix("Gi")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
            .map(StorageSize)
            .ok_or_else(|| NotAStorageSize(s.to_owned()))
    }
}

impl std::fmt::Display for StorageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}Gi", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_sizes_are_digits_and_gi() {
        assert_eq!("10Gi".parse::<StorageSize>().unwrap().gib(), 10);
        assert_eq!("010Gi".parse::<StorageSize>().unwrap().gib(), 10);
        for bad in ["+1Gi", "Gi", "1Ti", "10", "1.5Gi", "-1Gi"] {
            assert!(bad.parse::<StorageSize>().is_err(), "{bad}");
        }
        assert_eq!(StorageSize::from_gib(20).to_string(), "20Gi");
    }
    use proptest::prelude::*;

    #[test]
    fn every_spelling_of_the_same_size() {
        for q in [
            "1Ti",
            "1024Gi",
            "1099511627776",
            "1.0Ti",
            "0.0009765625Pi",
            "1048576Mi",
            "+1Ti",
            "1099511627776000m",
        ] {
            assert_eq!(gib(q), Some(1024), "{q}");
            assert!(same(q, "1Ti"), "{q}");
        }
        assert_eq!(gib("010Gi"), Some(10));
        assert_eq!(gib("1.5Gi"), None, "not whole GiB");
        assert_eq!(bytes("1.5Gi"), Some(1_610_612_736));
        assert_eq!(bytes("2e9"), Some(2_000_000_000));
        assert_eq!(bytes("500M"), Some(500_000_000));
        assert_eq!(bytes("1E"), Some(1_000_000_000_000_000_000));
        assert_eq!(bytes("-1Ki"), Some(-1024));
        for bad in ["", "Gi", "1GiB", "1.2.3Gi", "abc", "1 Gi", ".", "1e", "1x"] {
            assert_eq!(nanos(bad), None, "{bad:?}");
        }
        assert!(!same("1Ti", "1000Gi"));
        assert!(!same("v3", "3"));
    }

    #[test]
    fn canonical_as_the_apiserver_writes_it() {
        // Kubernetes' Quantity.String() for these (BinarySI, CanonicalizeBytes).
        for (n, want) in [
            (1, "1Gi"),
            (10, "10Gi"),
            (1023, "1023Gi"),
            (1024, "1Ti"),
            (1536, "1536Gi"),
            (2048, "2Ti"),
            (1 << 20, "1Pi"),
            (1 << 30, "1Ei"),
            (1 << 31, "2Ei"),
        ] {
            assert_eq!(canonical_gib(n), want, "{n}");
        }
        assert_eq!(canonical("010Gi"), "10Gi");
        assert_eq!(canonical("1024Gi"), "1Ti");
        assert_eq!(canonical("1.5Gi"), "1.5Gi");
    }

    proptest! {
        #[test]
        fn canonical_keeps_the_value(n in 1_i64..(1 << 33)) {
            let c = canonical_gib(n);
            prop_assert_eq!(gib(&c), Some(n));
            let plain = format!("{}Gi", n);
            prop_assert!(same(&c, &plain));
            prop_assert_eq!(canonical(&c), c.clone());
        }
    }
}
