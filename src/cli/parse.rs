//! The value parsers the flags share.

/// A member's client URL: `http://` or `https://`, then a host.
pub(super) fn parse_endpoint(s: &str) -> Result<String, String> {
    let s = s.trim();
    match s.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(s.to_owned()),
        Some((scheme, _)) => Err(format!(
            "{s:?}: the scheme must be http or https, not {scheme:?}"
        )),
        None => Err(format!(
            "{s:?} has no scheme: write http://{s} (or https://{s} for a TLS cluster, with --tls-dir)"
        )),
    }
}

/// A DNS domain: dot-separated labels of letters, digits and `-` (a trailing dot is dropped).
pub(super) fn parse_domain(s: &str) -> Result<String, String> {
    let d = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if d.len() <= 253 && d.split('.').all(label_ok) {
        Ok(d)
    } else {
        Err(format!(
            "{s:?} is not a DNS domain like cluster.local (labels of letters, digits and '-', separated by dots)"
        ))
    }
}

/// `key=value,...` as labels to match.
pub(super) fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!("{p:?} is not key=value")),
        })
        .collect()
}

/// A finite number, 0 or more.
pub(super) fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of 0 or more")),
    }
}

/// A StorageClass name, checked as the rules check `spec.storageClass`.
pub(super) fn storage_class(name: &str) -> Result<String, String> {
    match crate::api::storage_class_error(name) {
        Some(why) => Err(why.to_owned()),
        None => Ok(name.to_owned()),
    }
}
