//! The rules that hold without the webhook: `x-kubernetes-validations` (CEL) in the generated
//! CRD for the webhook's rules (`admission::validate`) that CEL can say on one field: the size is odd, the size and the
//! storage never shrink, the storage class never changes, the release is one the loop runs,
//! and the next minor only from the patch etcd's upgrade guide asks for (the facts from
//! `api::etcd_version::RELEASES`). The apiserver checks them on every
//! write before any validating webhook is called, so they hold with `failurePolicy: Ignore`, while
//! the webhook is down and before it is installed. They use the webhook's own words, so a user
//! sees the same message whichever of the two refuses; the end-to-end test
//! `cel_rules_agree_with_the_webhook` holds both to the same answers on the real apiserver.
//!
//! Everything else (downgrades and minor skips, cron, destinations, names) stays in `/validate`
//! only.
//! The apiserver ratchets CEL rules the way `admission::validate` ratchets its own (KEP-4008): an
//! unchanged field that breaks a rule does not fail an update.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, ValidationRule,
};

use super::{Field, Version};

/// How the apiserver words a failed rule (the `reason` of its field error).
const INVALID: &str = "FieldValueInvalid";
const FORBIDDEN: &str = "FieldValueForbidden";

/// Messages are built with `format` rather than `+`: the apiserver prices a concatenation of
/// `string(int)` as if the string could be megabytes long and refuses the CRD. The string fields
/// the rules read carry a `maxLength` for the same reason.
fn rule(rule: &str, message_expression: &str, fallback: &str, reason: &str) -> ValidationRule {
    ValidationRule {
        rule: rule.to_owned(),
        message_expression: Some(message_expression.to_owned()),
        // Shown when the message expression cannot be evaluated.
        message: Some(fallback.to_owned()),
        reason: Some(reason.to_owned()),
        ..ValidationRule::default()
    }
}

/// A regular expression for the numbers below `n` (< 100), as CEL's RE2 reads them.
fn below(n: u64) -> String {
    let mut alternatives = Vec::new();
    if n > 0 {
        alternatives.push(format!("[0-{}]", n.min(10) - 1));
    }
    for tens in 1..n / 10 {
        alternatives.push(format!("{tens}[0-9]"));
    }
    if n >= 10 && !n.is_multiple_of(10) {
        alternatives.push(format!("{}[0-{}]", n / 10, n % 10 - 1));
    }
    format!("0*({})", alternatives.join("|"))
}

/// The version rules: a well-formed release the loop does not run (another minor, or a patch
/// below its line's oldest) is refused (a malformed one is the schema pattern's), and so is a
/// step to the next minor from a patch below the one etcd's upgrade guide asks for.
fn version_rules(version: Version) -> Vec<ValidationRule> {
    use super::etcd_version::{EtcdVersion, RELEASES};
    let v = match version {
        Version::V1Alpha1 => "",
        Version::V1Beta1 | Version::V1 => "v",
    };
    let lines: Vec<String> = RELEASES
        .iter()
        .map(|l| {
            format!(
                "(self.matches('^{v}0*3[.]0*{}[.][0-9]+$') && !self.matches('^{v}0*3[.]0*{}[.]{}$'))",
                l.minor,
                l.minor,
                below(l.oldest)
            )
        })
        .collect();
    let mut out = vec![ValidationRule {
        rule: format!(
            "!self.matches('^{v}[0-9]+[.][0-9]+[.][0-9]+$') || {}",
            lines.join(" || ")
        ),
        message: Some(EtcdVersion::unsupported()),
        reason: Some(INVALID.to_owned()),
        ..ValidationRule::default()
    }];
    for line in RELEASES {
        let Some(min) = line.before_next else {
            continue;
        };
        let minor = line.minor;
        // Inside a single-quoted CEL string, a quote is escaped.
        let words =
            EtcdVersion::too_early_for_next_minor("%s", "%s", minor, min).replace('\'', "\\'");
        // The webhook names the releases as v1 spells them.
        let (old, new) = match version {
            Version::V1Alpha1 => ("'v' + oldSelf", "'v' + self"),
            Version::V1Beta1 | Version::V1 => ("oldSelf", "self"),
        };
        out.push(rule(
            &format!(
                "!(oldSelf.matches('^{v}0*3[.]0*{minor}[.]{}$') && self.matches('^{v}0*3[.]0*{}[.][0-9]+$'))",
                below(min),
                minor + 1
            ),
            &format!("'{words}'.format([{old}, {new}, {new}])"),
            &EtcdVersion::too_early_for_next_minor("the current release", "the next minor", minor, min),
            FORBIDDEN,
        ));
    }
    out
}

/// The rules of `version`, each on the field it checks.
pub fn rules(version: Version) -> Vec<(Field, ValidationRule)> {
    let storage_shrink = match version {
        // v1alpha1 spells the size as whole GiB.
        Version::V1Alpha1 => rule(
            "self >= oldSelf",
            "'cannot shrink from %dGi to %dGi: volumes can grow but never shrink'.format([oldSelf, self])",
            "cannot shrink: volumes can grow but never shrink",
            FORBIDDEN,
        ),
        Version::V1Beta1 | Version::V1 => rule(
            "quantity(self).compareTo(quantity(oldSelf)) >= 0",
            "'cannot shrink from %s to %s: volumes can grow but never shrink'.format([oldSelf, self])",
            "cannot shrink: volumes can grow but never shrink",
            FORBIDDEN,
        ),
    };
    vec![
        (
            Field::Size,
            rule(
                "self % 2 == 1",
                "'must be odd: etcd needs a majority quorum, and %d members survive no more failures than %d'.format([self, self - 1])",
                "must be odd: etcd needs a majority quorum",
                INVALID,
            ),
        ),
        (
            Field::Size,
            rule(
                "self >= oldSelf",
                "'cannot shrink from %d to %d: removing members can lose quorum; size may only stay or grow'.format([oldSelf, self])",
                "cannot shrink: removing members can lose quorum; size may only stay or grow",
                FORBIDDEN,
            ),
        ),
        (Field::StorageSize, storage_shrink),
        (
            Field::StorageClass,
            rule(
                "self == oldSelf",
                "'cannot change from \"%s\" to \"%s\": volume claims cannot change class'.format([oldSelf, self])",
                "cannot change: volume claims cannot change class",
                FORBIDDEN,
            ),
        ),
    ]
    .into_iter()
    .chain(version_rules(version).into_iter().map(|r| (Field::Version, r)))
    .chain([(Field::Spec, class_presence_rule(version))])
    .chain(restore_rule(version).map(|r| (Field::Spec, r)))
    .chain(tls_rule(version).map(|r| (Field::Spec, r)))
    .collect()
}

/// `spec.restore` is set at creation only (v1; the older versions keep it in the
/// conversion-data annotation): a rule on the spec, so that setting or removing it is caught.
fn restore_rule(version: Version) -> Option<ValidationRule> {
    (version == Version::V1).then(|| ValidationRule {
        field_path: Some(".restore".to_owned()),
        rule: "has(self.restore) == has(oldSelf.restore) && (!has(self.restore) || self.restore == oldSelf.restore)".to_owned(),
        message: Some(crate::api::RESTORE_IMMUTABLE.to_owned()),
        reason: Some(FORBIDDEN.to_owned()),
        ..ValidationRule::default()
    })
}

/// `spec.tls` likewise (v1; the older versions keep it in the conversion-data annotation).
fn tls_rule(version: Version) -> Option<ValidationRule> {
    (version == Version::V1).then(|| ValidationRule {
        field_path: Some(".tls".to_owned()),
        rule: "has(self.tls) == has(oldSelf.tls) && (!has(self.tls) || self.tls == oldSelf.tls)"
            .to_owned(),
        message: Some(crate::api::TLS_IMMUTABLE.to_owned()),
        reason: Some(FORBIDDEN.to_owned()),
        ..ValidationRule::default()
    })
}

/// The storage class is set or left out at creation, for good: a rule on the spec, since a
/// rule on the field runs only while the field is there (old and new).
fn class_presence_rule(version: Version) -> ValidationRule {
    let (has, at, field) = match version {
        Version::V1Alpha1 => (
            "has(%s.storageClassName)".to_owned(),
            "%s.storageClassName",
            ".storageClassName",
        ),
        Version::V1Beta1 => (
            "(has(%s.storage) && has(%s.storage.className))".to_owned(),
            "%s.storage.className",
            ".storage.className",
        ),
        Version::V1 => (
            "has(%s.storageClass)".to_owned(),
            "%s.storageClass",
            ".storageClass",
        ),
    };
    let has = |who: &str| has.replace("%s", who);
    let value = |who: &str| at.replace("%s", who);
    ValidationRule {
        field_path: Some(field.to_owned()),
        ..rule(
            &format!("{} == {}", has("self"), has("oldSelf")),
            &format!(
                "{} ? 'cannot be removed (it was \"%s\"): volume claims cannot change class'.format([{}]) : 'cannot be set to \"%s\" after creation: the claims were made with the cluster\\'s default class, and volume claims cannot change class'.format([{}])",
                has("oldSelf"),
                value("oldSelf"),
                value("self")
            ),
            "cannot be set or removed after creation: volume claims cannot change class",
            FORBIDDEN,
        )
    }
}

/// Adds every version's rules to the CRD's schemas.
pub fn apply(crd: &mut CustomResourceDefinition) {
    for served in &mut crd.spec.versions {
        let Some(version) = Version::from_version(&served.name) else {
            continue;
        };
        let Some(root) = served
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        for (field, rule) in rules(version) {
            let pointer = field
                .pointer(version)
                .expect("CEL rules are on fields every version has");
            let schema = property(root, pointer)
                .unwrap_or_else(|| panic!("{version} schema has no {pointer}"));
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(rule);
        }
    }
}

/// The schema of the field at a JSON pointer (`/spec/storage/size`).
fn property<'a>(root: &'a mut JSONSchemaProps, pointer: &str) -> Option<&'a mut JSONSchemaProps> {
    pointer
        .trim_start_matches('/')
        .split('/')
        .try_fold(root, |schema, name| {
            schema.properties.as_mut()?.get_mut(name)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_carries_the_four_rules_on_its_own_fields() {
        let crd = crate::api::crd();
        for served in &crd.spec.versions {
            let version = Version::from_version(&served.name).unwrap();
            let root = serde_json::to_value(served.schema.as_ref().unwrap()).unwrap();
            let at = |field: Field| {
                let path = field
                    .pointer(version)
                    .unwrap()
                    .trim_start_matches('/')
                    .split('/')
                    .map(|p| format!("/properties/{p}"))
                    .collect::<String>();
                root.pointer(&format!("/openAPIV3Schema{path}/x-kubernetes-validations"))
                    .and_then(|v| v.as_array())
                    .map(|rules| rules.len())
                    .unwrap_or(0)
            };
            assert_eq!(at(Field::Size), 2, "{version}");
            assert_eq!(at(Field::StorageSize), 1, "{version}");
            assert_eq!(at(Field::StorageClass), 1, "{version}");
            // The release is admitted, and a rule per line with a next minor.
            assert_eq!(at(Field::Version), 3, "{version}");
            // The storage class's presence; in v1 also spec.restore and spec.tls, set at
            // creation only.
            let spec_rules = if version == Version::V1 { 3 } else { 1 };
            assert_eq!(at(Field::Spec), spec_rules, "{version}");
        }
    }

    #[test]
    fn below_matches_exactly_the_smaller_numbers() {
        for n in [1, 5, 10, 26, 30, 99] {
            let re = format!("^{}$", below(n));
            // A tiny RE2 subset check by hand: expand the alternatives we emit.
            for k in 0..100u64 {
                let s = k.to_string();
                let inner = re.trim_start_matches("^0*(").trim_end_matches(")$");
                let hit = inner.split('|').any(|alt| {
                    let (head, class) = alt.split_once('[').unwrap();
                    let (lo, hi) = class.trim_end_matches(']').split_once('-').unwrap();
                    let (lo, hi) = (lo.as_bytes()[0], hi.as_bytes()[0]);
                    s.len() == head.len() + 1
                        && s.starts_with(head)
                        && (lo..=hi).contains(&s.as_bytes()[head.len()])
                });
                assert_eq!(hit, k < n, "{re} on {k}");
            }
        }
        assert_eq!(below(26), "0*([0-9]|1[0-9]|2[0-5])");
    }

    #[test]
    fn transition_rules_name_the_webhooks_reason() {
        for version in Version::ALL {
            for (_, r) in rules(version) {
                let reason = r.reason.as_deref().unwrap();
                if r.rule.contains("oldSelf") {
                    assert_eq!(reason, FORBIDDEN, "{}", r.rule);
                } else {
                    assert_eq!(reason, INVALID, "{}", r.rule);
                }
            }
        }
    }
}
