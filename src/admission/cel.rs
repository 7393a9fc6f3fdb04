//! The rules that hold without the webhook: `x-kubernetes-validations` (CEL) in the generated
//! CRD for the webhook's rules that CEL can say on one field: the size is odd, the size and the
//! storage never shrink, the storage class never changes. The apiserver checks them on every
//! write before any validating webhook is called, so they hold with `failurePolicy: Ignore`, while
//! the webhook is down and before it is installed. They use the webhook's own words, so a user
//! sees the same message whichever of the two refuses; the end-to-end test
//! `cel_rules_agree_with_the_webhook` holds both to the same answers on the real apiserver.
//!
//! Everything else (version steps, cron, destinations, names) stays in `/validate` only.
//! The apiserver ratchets CEL rules the way [`super::validate`] ratchets its own (KEP-4008): an
//! unchanged field that breaks a rule does not fail an update.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, ValidationRule,
};

use super::Field;
use crate::api::Version;

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
        }
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
