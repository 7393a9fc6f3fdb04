//! The HTTP layer: decode a review, call the pure decision code, encode the answer. Nothing is
//! decided here. The reviews' codec (`review`, `convert::parse` and `respond`, the checks
//! below) builds without the `server` feature; the endpoints, their guard and the router
//! (`endpoints`) need it.

#[cfg(feature = "server")]
pub mod admit;
pub mod convert;
#[cfg(feature = "server")]
mod endpoints;
mod error;
pub mod review;

#[cfg(feature = "server")]
pub use endpoints::*;
pub use error::ApiError;
#[cfg(feature = "server")]
pub use error::json_response;

pub use review::{
    ADMISSION_V1, ADMISSION_V1BETA1, AdmissionRequest, AdmissionReviewOut, Answer, parse_admission,
};

/// Refuses a body that is not a JSON object before decoding it (a struct decoder would also
/// take an array, with a confusing message).
pub fn expect_object(what: &str, bytes: &[u8]) -> Result<(), ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        None => Err(ApiError::BadRequest(format!(
            "malformed {what}: empty body (truncated JSON)"
        ))),
        Some(_) if looks_like_yaml(bytes) => Err(ApiError::BadRequest(format!(
            "malformed {what}: the body is YAML, and this API takes JSON (as the apiserver sends it): convert it first, e.g. `yq -o json`"
        ))),
        Some(_) => Err(ApiError::BadRequest(format!(
            "malformed {what}: invalid type: the body must be a JSON object, not a sequence or a scalar"
        ))),
    }
}

/// A body that starts like a YAML document: `---`, or a first line `key: value` (a JSON body
/// starts with `{`, `[`, a digit, a quote or a literal).
fn looks_like_yaml(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    first.starts_with("---")
        || first.split_once(':').is_some_and(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

/// The reviews the endpoints take, and where each belongs.
const REVIEWS: [(&str, &str); 2] = [
    ("AdmissionReview", "/mutate or /validate"),
    ("ConversionReview", "/convert"),
];

/// Why a body that is not a `want` (or not one this endpoint takes) was refused, from its
/// apiVersion and kind alone: a review sent to the wrong endpoint is named as such. Read only
/// on the error path, so a good review is decoded once.
pub fn wrong_review(want: &str, versions: &[&str], bytes: &[u8]) -> Option<ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        #[serde(default)]
        api_version: Option<serde_json::Value>,
        #[serde(default)]
        kind: Option<serde_json::Value>,
    }
    let head: Head = serde_json::from_slice(bytes).ok()?;
    let text = |v: &Option<serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let (kind, api_version) = (text(&head.kind), text(&head.api_version));
    if kind == want && versions.contains(&api_version.as_str()) {
        return None;
    }
    let article = if want.starts_with('A') { "an" } else { "a" };
    let expected = format!("expected {article} {want} of {}", versions.join(" or "));
    Some(ApiError::BadRequest(
        match REVIEWS.iter().find(|(k, _)| *k == kind) {
            Some((_, endpoint)) if kind != want => {
                let article = if kind.starts_with('A') { "an" } else { "a" };
                format!("this is {article} {kind}: send it to {endpoint} ({expected})")
            }
            _ if kind.is_empty() => format!("{expected}: the body has no kind"),
            _ if api_version.is_empty() => {
                format!("{expected}: got kind {kind} with no apiVersion")
            }
            _ => format!("{expected}: got kind {kind}, apiVersion {api_version}"),
        },
    ))
}

/// Describes a JSON decode error with where it happened.
pub fn decode_error(what: &str, e: &serde_json::Error) -> ApiError {
    if e.is_eof() {
        ApiError::BadRequest(format!("{what}: truncated JSON: {e}"))
    } else {
        ApiError::BadRequest(format!("{what}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str) -> String {
        match expect_object("AdmissionReview", body.as_bytes()) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_yaml_body_is_told_the_api_takes_json() {
        for yaml in [
            "apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n",
            "---\napiVersion: v1\n",
            "# a review\nrequest:\n  uid: x\n",
        ] {
            assert!(
                message(yaml).contains("the body is YAML, and this API takes JSON"),
                "{yaml}"
            );
        }
        assert!(message("[1, 2]").contains("must be a JSON object"));
        assert!(message("\"review\"").contains("must be a JSON object"));
        assert!(expect_object("AdmissionReview", b" {}").is_ok());
    }
}
