//! The rules `/validate` enforces, judged on the v1 form of the object and reported with the
//! field paths of the version the user wrote.

use std::fmt;

use serde_json::Value;

mod rules;

pub use rules::MAX_NAME;
use rules::{check_name, check_spec, check_update};

use super::Field;
use crate::api::convert::{self, ConvertError, Hub};
use crate::api::{Version, v1};

/// What kind of wrong a field is, as Kubernetes words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Invalid value: <value>`
    Invalid(String),
    /// `Unsupported value: <value>`
    Unsupported(String),
    Required,
    Forbidden,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub kind: Kind,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Invalid(v) => write!(f, "{}: Invalid value: {}: {}", self.path, v, self.detail),
            Kind::Unsupported(v) => {
                write!(
                    f,
                    "{}: Unsupported value: {}: {}",
                    self.path, v, self.detail
                )
            }
            Kind::Required => write!(f, "{}: Required value: {}", self.path, self.detail),
            Kind::Forbidden => write!(f, "{}: Forbidden: {}", self.path, self.detail),
        }
    }
}

impl Violation {
    /// The warning for a violation that ratcheting let through: short (warnings are shown one
    /// per line by kubectl), within the apiserver's [`WARNING_LIMIT`] characters, the value cut
    /// to what fits (40 characters at most).
    fn unchanged_warning(&self) -> String {
        const TAIL: &str = ": still breaks a rule, allowed as it is unchanged";
        let (label, value) = match &self.kind {
            Kind::Invalid(v) => ("Invalid value: ", Some(v)),
            Kind::Unsupported(v) => ("Unsupported value: ", Some(v)),
            Kind::Required => ("Required value", None),
            Kind::Forbidden => ("Forbidden", None),
        };
        let fixed = self.path.chars().count() + 2 + label.chars().count() + TAIL.chars().count();
        let room = WARNING_LIMIT.saturating_sub(fixed).min(43);
        let head = match value {
            Some(v) => format!("{label}{}", cut(v, room)),
            None => label.to_owned(),
        };
        let warning = format!("{}: {head}{TAIL}", self.path);
        cut(&warning, WARNING_LIMIT)
    }
}

/// The longest admission warning the apiserver passes on whole.
pub const WARNING_LIMIT: usize = 120;

/// `s` in at most `max` characters, ending in `...` when cut.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let keep = max.saturating_sub(3);
    let end = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
    format!("{}...", &s[..end])
}

/// The outcome: every violation found, and warnings for what is allowed but unwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub warnings: Vec<String>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// All violations in one message, Kubernetes style (`[a, b]` when there are several).
    pub fn message(&self) -> String {
        match self.violations.as_slice() {
            [] => String::new(),
            [one] => one.to_string(),
            many => format!(
                "[{}]",
                many.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The operations that carry an object to judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

/// Judges `obj` (written in `version`) for a CREATE, or an UPDATE from `old`.
pub fn validate(version: Version, op: Operation, obj: &Value, old: Option<&Value>) -> Verdict {
    let mut out = Verdict::default();
    let hub = match convert::to_hub(obj) {
        Ok(hub) => hub,
        Err(e) => {
            out.violations.push(decode_violation(e));
            return out;
        }
    };
    let ctx = Ctx { version, obj };
    check_spec(&ctx, &hub.spec, &mut out);
    if op == Operation::Create {
        check_name(obj, &mut out);
    }
    if op == Operation::Update
        && let Some(old) = old
    {
        match convert::to_hub(old) {
            Ok(Hub {
                spec: old_spec,
                status: old_status,
                ..
            }) => {
                ratchet(&Ctx { version, obj: old }, &old_spec, &mut out);
                check_update(&ctx, &old_spec, old_status.as_ref(), &hub.spec, &mut out);
            }
            Err(e) => out.warnings.push(format!(
                "the stored object could not be read ({e}); update rules were not checked"
            )),
        }
    }
    out
}

/// Like [`validate`] for an object that may have been converted on its way here: with
/// matchPolicy Equivalent the apiserver sends a v1alpha1 or v1beta1 write converted to v1. The
/// objects are converted back to `written`, the version the user wrote, so every message names
/// the user's fields and values. Conversion is lossless; if it fails, `validate` reports why.
pub fn validate_as_written(
    written: Version,
    op: Operation,
    obj: &Value,
    old: Option<&Value>,
) -> Verdict {
    let back = |o: &Value| match convert::version_of(o) {
        Ok(v) if v == written => None,
        _ => convert::convert_object(o, written).ok(),
    };
    match (back(obj), old.and_then(back)) {
        (None, None) => validate(written, op, obj, old),
        (obj_written, old_written) => validate(
            written,
            op,
            obj_written.as_ref().unwrap_or(obj),
            old_written.as_ref().or(old),
        ),
    }
}

/// Validation ratcheting, the rule the apiserver applies to CRD schemas since 1.30 (KEP-4008): on
/// UPDATE, a broken rule that the stored object already broke the same way (same field, same
/// value) does not deny; it becomes a warning. Otherwise an object stored before a rule existed,
/// or while the webhook was bypassed, could never change a label or lose its finalizer, and its
/// deletion would hang. A changed field is judged in full.
fn ratchet(stored: &Ctx, stored_spec: &v1::EtcdClusterSpec, out: &mut Verdict) {
    let mut before = Verdict::default();
    check_spec(stored, stored_spec, &mut before);
    let (unchanged, changed): (Vec<Violation>, Vec<Violation>) =
        std::mem::take(&mut out.violations)
            .into_iter()
            .partition(|v| before.violations.contains(v));
    out.violations = changed;
    out.warnings
        .extend(unchanged.iter().map(Violation::unchanged_warning));
}

struct Ctx<'a> {
    version: Version,
    obj: &'a Value,
}

impl Ctx<'_> {
    fn path(&self, field: Field) -> String {
        field.path(self.version)
    }

    /// The value as the user wrote it, or as the hub holds it when the user's version has no
    /// such field.
    fn shown(&self, field: Field, hub_value: impl Into<Value>) -> String {
        field
            .pointer(self.version)
            .and_then(|p| self.obj.pointer(p))
            .cloned()
            .unwrap_or_else(|| hub_value.into())
            .to_string()
    }

    fn invalid(
        &self,
        field: Field,
        hub_value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Violation {
        Violation {
            path: self.path(field),
            kind: Kind::Invalid(self.shown(field, hub_value)),
            detail: detail.into(),
        }
    }

    fn forbidden(&self, field: Field, detail: impl Into<String>) -> Violation {
        Violation {
            path: self.path(field),
            kind: Kind::Forbidden,
            detail: detail.into(),
        }
    }
}

/// A decoder's `invalid type: string "three", expected i32` in the API's words: the value as
/// JSON (`"three"`) and what the field holds (`an integer`), never a Rust type name.
fn wrong_type(message: &str) -> Option<(String, &'static str)> {
    let rest = message.strip_prefix("invalid type: ")?;
    let (got, expected) = rest.rsplit_once(", expected ")?;
    let value = match got.split_once(' ') {
        Some(("string", v)) => v.to_owned(),
        Some((_, v)) => v.trim_matches('`').to_owned(),
        None => format!("({got})"),
    };
    let value = match got {
        "map" => "(an object)".to_owned(),
        "sequence" => "(a list)".to_owned(),
        _ => value,
    };
    let want = match expected.trim() {
        e if e.starts_with('i') || e.starts_with('u') => "an integer",
        e if e.starts_with("struct") || e.starts_with("a map") => "an object",
        e if e.contains("sequence") => "a list",
        e if e.contains("string") => "a string",
        e if e.contains("bool") => "true or false",
        e if e.starts_with('f') => "a number",
        _ => return None,
    };
    Some((value, want))
}

fn decode_violation(e: ConvertError) -> Violation {
    match e {
        ConvertError::Decode { path, message } => {
            if let Some(rest) = message.strip_prefix("missing field `") {
                let name = rest.split('`').next().unwrap_or_default();
                Violation {
                    path: format!("{path}.{name}"),
                    kind: Kind::Required,
                    detail: "must be set".to_owned(),
                }
            } else if message.starts_with("invalid type: null") {
                Violation {
                    path,
                    kind: Kind::Required,
                    detail: "must be set".to_owned(),
                }
            } else if let Some((value, want)) = wrong_type(&message) {
                Violation {
                    path,
                    kind: Kind::Invalid(value),
                    detail: format!("must be {want}"),
                }
            } else {
                Violation {
                    path,
                    kind: Kind::Invalid(String::from("(not decodable)")),
                    detail: message,
                }
            }
        }
        other => Violation {
            path: "apiVersion".to_owned(),
            kind: Kind::Invalid(String::from("(unexpected)")),
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1(spec: Value) -> Value {
        json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster", "metadata": {"name": "a"}, "spec": spec})
    }
    fn alpha(spec: Value) -> Value {
        json!({"apiVersion": "etcd.example.com/v1alpha1", "kind": "EtcdCluster", "metadata": {"name": "a"}, "spec": spec})
    }
    fn beta(spec: Value) -> Value {
        json!({"apiVersion": "etcd.example.com/v1beta1", "kind": "EtcdCluster", "metadata": {"name": "a"}, "spec": spec})
    }

    /// The loop names Services after the cluster, so the name must be a DNS-1035 label.
    #[test]
    fn names_must_be_dns1035_labels() {
        let spec = json!({"size": 3, "version": "v3.5.10", "storageClass": "standard", "storageSize": "10Gi"});
        let with_meta = |meta: Value| {
            let mut o = v1(spec.clone());
            o["metadata"] = meta;
            o
        };
        for bad in ["1etcd", "etcd.v2", "Etcd", "etcd-", "-etcd", "et_cd"] {
            let verdict = validate(
                Version::V1,
                Operation::Create,
                &with_meta(json!({"name": bad})),
                None,
            );
            assert_eq!(
                verdict.message(),
                format!(
                    "metadata.name: Invalid value: \"{bad}\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character: the cluster's Services are named after it"
                )
            );
        }
        for good in ["e", "etcd", "etcd-2", "a1-b2"] {
            assert!(
                validate(
                    Version::V1,
                    Operation::Create,
                    &with_meta(json!({"name": good})),
                    None
                )
                .allowed(),
                "{good}"
            );
        }
        assert!(
            validate(
                Version::V1,
                Operation::Create,
                &with_meta(json!({"generateName": "etcd-"})),
                None
            )
            .allowed()
        );
        let verdict = validate(
            Version::V1,
            Operation::Create,
            &with_meta(json!({"generateName": "2etcd-"})),
            None,
        );
        assert!(
            verdict
                .message()
                .starts_with("metadata.generateName: Invalid value: \"2etcd-\": a DNS-1035 label"),
            "{}",
            verdict.message()
        );
    }

    /// Ratcheting: an invalid stored spec does not block an update that leaves it as it is
    /// (labels, the finalizer's removal during deletion), and is named in a warning; a changed
    /// field is judged in full, and the update rules still apply.
    /// Upgrade rules judged from what the members run (`status.members[].version`): a spec
    /// moved v3.5.10 -> v3.5.32 whose members still run v3.5.10 cannot go on to v3.6.4 yet
    /// (etcd-io/etcd#19557), may go back to v3.5.10, and goes on once every member runs
    /// v3.5.32.
    #[test]
    fn upgrades_are_judged_from_the_lowest_release_the_members_run() {
        let stored = |running: &[&str]| {
            let mut o = v1(
                json!({"size": 3, "version": "v3.5.32", "storageClass": "standard", "storageSize": "10Gi"}),
            );
            o["status"] = json!({"members": running.iter().enumerate().map(|(i, v)| json!({
                "name": format!("etcd-{i}"), "id": format!("{i:x}"), "role": "Follower",
                "healthy": true, "version": v})).collect::<Vec<_>>()});
            o
        };
        let to = |version: &str| {
            v1(
                json!({"size": 3, "version": version, "storageClass": "standard", "storageSize": "10Gi"}),
            )
        };
        let mid_roll = stored(&["3.5.32", "3.5.10", "3.5.32"]);
        let verdict = validate(
            Version::V1,
            Operation::Update,
            &to("v3.6.4"),
            Some(&mid_roll),
        );
        assert_eq!(
            messages(&verdict),
            [
                "spec.version: Forbidden: cannot upgrade from v3.5.10 to v3.6.4: etcd's v3.5 -> v3.6 upgrade needs every member on v3.5.32 or later first; upgrade to the newest v3.5 patch, then to v3.6.4 (member etcd-1 still runs v3.5.10: the roll to v3.5.32 has not finished)"
            ]
        );
        let back = validate(
            Version::V1,
            Operation::Update,
            &to("v3.5.10"),
            Some(&mid_roll),
        );
        assert!(
            back.allowed(),
            "back to what a member runs: {}",
            back.message()
        );
        let below = validate(
            Version::V1,
            Operation::Update,
            &to("v3.5.9"),
            Some(&mid_roll),
        );
        assert!(
            !below.allowed(),
            "below what any member runs is a downgrade"
        );
        let patch = validate(
            Version::V1,
            Operation::Update,
            &to("v3.5.35"),
            Some(&mid_roll),
        );
        assert!(patch.allowed(), "{}", patch.message());
        let done = stored(&["3.5.32", "3.5.32", "3.5.32"]);
        let verdict = validate(Version::V1, Operation::Update, &to("v3.6.4"), Some(&done));
        assert!(verdict.allowed(), "{}", verdict.message());
    }

    /// A stored long invalid schedule, unchanged by an update: its warning stays within the
    /// apiserver's 120 characters (it was 129).
    #[test]
    fn an_unchanged_long_value_warns_within_the_warning_limit() {
        let spec = json!({"size": 3, "version": "v3.6.4", "storageSize": "10Gi",
            "backup": {"enabled": true, "schedule": "0,5,10,15,20,25,30,35,40,45,50,55 */6 * * MON-FRI,SAT,SUN,XYZ", "retention": 7}});
        let stored = v1(spec.clone());
        let mut updated = v1(spec);
        updated["metadata"]["labels"] = json!({"touched": "yes"});
        let verdict = validate(Version::V1, Operation::Update, &updated, Some(&stored));
        assert!(verdict.allowed(), "{}", verdict.message());
        assert_eq!(verdict.warnings.len(), 1, "{:?}", verdict.warnings);
        let w = &verdict.warnings[0];
        assert!(
            w.chars().count() <= WARNING_LIMIT,
            "{} chars: {w}",
            w.chars().count()
        );
        assert!(
            w.starts_with("spec.backup.schedule: Invalid value: \"0,5,10,")
                && w.ends_with("...: still breaks a rule, allowed as it is unchanged"),
            "{w}"
        );
    }

    #[test]
    fn an_unchanged_invalid_field_does_not_deny_an_update() {
        let spec = json!({"size": 4, "version": "v3.5.10", "storageClass": "standard", "storageSize": "10Gi"});
        let stored = v1(spec.clone());
        let mut deleting = v1(spec.clone());
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T00:00:00Z");
        let verdict = validate(Version::V1, Operation::Update, &deleting, Some(&stored));
        assert!(verdict.allowed(), "{}", verdict.message());
        assert_eq!(
            verdict.warnings,
            ["spec.size: Invalid value: 4: still breaks a rule, allowed as it is unchanged"]
        );
        // As a CREATE the same object is denied.
        assert!(!validate(Version::V1, Operation::Create, &stored, None).allowed());
        // A changed invalid value is judged: 4 -> 6 is still even.
        let six = v1(
            json!({"size": 6, "version": "v3.5.10", "storageClass": "standard", "storageSize": "10Gi"}),
        );
        let verdict = validate(Version::V1, Operation::Update, &six, Some(&stored));
        assert!(
            verdict
                .message()
                .starts_with("spec.size: Invalid value: 6: must be odd"),
            "{}",
            verdict.message()
        );
        // Another field changed: the unchanged one still only warns, the new one denies.
        let both = v1(
            json!({"size": 4, "version": "v3.5.10", "storageClass": "standard", "storageSize": "5Gi"}),
        );
        let verdict = validate(Version::V1, Operation::Update, &both, Some(&stored));
        assert!(!verdict.allowed());
        assert!(
            verdict.message().starts_with("spec.storageSize"),
            "{}",
            verdict.message()
        );
        assert!(
            verdict.warnings.iter().any(|w| w.starts_with("spec.size")),
            "{:?}",
            verdict.warnings
        );
        // Reported in the version written, through the converted path too.
        let verdict = validate_as_written(
            Version::V1Alpha1,
            Operation::Update,
            &deleting,
            Some(&stored),
        );
        assert!(verdict.allowed());
        assert!(
            verdict.warnings[0].starts_with("spec.replicas: Invalid value: 4"),
            "{:?}",
            verdict.warnings
        );
    }

    /// matchPolicy Equivalent: the apiserver sends a v1alpha1 write converted to v1; the
    /// messages name the v1alpha1 fields and values the user wrote, for CREATE and UPDATE.
    #[test]
    fn a_converted_object_is_reported_in_the_version_the_user_wrote() {
        let spec = json!({"size": 4, "version": "v3.5.10", "storageClass": "standard", "storageSize": "10Gi"});
        let verdict = validate_as_written(
            Version::V1Alpha1,
            Operation::Create,
            &v1(spec.clone()),
            None,
        );
        assert_eq!(
            verdict.message(),
            validate(
                Version::V1Alpha1,
                Operation::Create,
                &convert::convert_object(&v1(spec.clone()), Version::V1Alpha1).unwrap(),
                None
            )
            .message()
        );
        assert!(
            verdict
                .message()
                .starts_with("spec.replicas: Invalid value: 4: must be odd"),
            "{}",
            verdict.message()
        );
        let old = json!({"size": 5, "version": "v3.5.10", "storageClass": "standard", "storageSize": "20Gi"});
        let shrunk = json!({"size": 3, "version": "v3.5.10", "storageClass": "standard", "storageSize": "10Gi"});
        let verdict = validate_as_written(
            Version::V1Alpha1,
            Operation::Update,
            &v1(shrunk),
            Some(&v1(old)),
        );
        let message = verdict.message();
        assert!(
            message.contains("spec.replicas") && message.contains("spec.storageSizeGi"),
            "{message}"
        );
        assert!(
            !message.contains("spec.size") && !message.contains("storageSize:"),
            "{message}"
        );
        // Already in the written version: the same verdict as validate.
        let even = alpha(json!({"replicas": 2, "etcdVersion": "3.5.10", "storageSizeGi": 10}));
        assert_eq!(
            validate_as_written(Version::V1Alpha1, Operation::Create, &even, None),
            validate(Version::V1Alpha1, Operation::Create, &even, None)
        );
    }
    fn create(version: Version, o: &Value) -> Verdict {
        validate(version, Operation::Create, o, None)
    }
    fn update(version: Version, old: &Value, new: &Value) -> Verdict {
        validate(version, Operation::Update, new, Some(old))
    }
    fn messages(v: &Verdict) -> Vec<String> {
        v.violations.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_sound_cluster_is_allowed_in_every_version() {
        assert_eq!(
            create(Version::V1, &v1(json!({"size": 3}))),
            Verdict::default()
        );
        assert_eq!(
            create(
                Version::V1Beta1,
                &beta(json!({"size": 5, "storage": {"size": "1Gi"}}))
            ),
            Verdict::default()
        );
        assert_eq!(
            create(
                Version::V1Alpha1,
                &alpha(json!({"replicas": 7, "storageSizeGi": 1}))
            ),
            Verdict::default()
        );
    }

    #[test]
    fn names_must_leave_room_for_the_clusters_objects() {
        let named = |name: &str| {
            json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
                "metadata": {"name": name}, "spec": {"size": 3}})
        };
        assert!(create(Version::V1, &named(&"a".repeat(45))).allowed());
        let long = "a".repeat(46);
        assert_eq!(
            messages(&create(Version::V1, &named(&long))),
            [format!(
                "metadata.name: Invalid value: \"{long}\": must be no more than 45 characters: the cluster's CronJob <name>-backup may have at most 52"
            )]
        );
        let generated = json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster",
            "metadata": {"generateName": "b".repeat(41)}, "spec": {"size": 3}});
        assert!(
            messages(&create(Version::V1, &generated))[0]
                .starts_with("metadata.generateName: Invalid value")
        );
        // Names are immutable: an UPDATE is not judged on it again.
        assert!(update(Version::V1, &named(&long), &named(&long)).allowed());
    }

    #[test]
    fn size_must_be_odd_and_in_range_named_per_version() {
        assert_eq!(
            messages(&create(Version::V1, &v1(json!({"size": 4})))),
            [
                "spec.size: Invalid value: 4: must be odd: etcd needs a majority quorum, and 4 members survive no more failures than 3"
            ]
        );
        let m = messages(&create(Version::V1Alpha1, &alpha(json!({"replicas": 2}))));
        assert!(
            m[0].starts_with("spec.replicas: Invalid value: 2: must be odd"),
            "{m:?}"
        );
        for size in [0, 8, 9, -1] {
            let m = messages(&create(Version::V1Beta1, &beta(json!({"size": size}))));
            assert_eq!(
                m,
                [format!(
                    "spec.size: Invalid value: {size}: must be between 1 and 7"
                )]
            );
        }
    }

    #[test]
    fn size_one_is_allowed_with_a_warning() {
        let v = create(Version::V1Alpha1, &alpha(json!({"replicas": 1})));
        assert!(v.allowed());
        assert_eq!(v.warnings.len(), 1);
        assert!(
            v.warnings[0].starts_with("spec.replicas is 1: a single member has no fault tolerance")
        );
        assert!(v.warnings[0].len() <= 120);
    }

    #[test]
    fn version_pattern_and_major() {
        let m = messages(&create(
            Version::V1,
            &v1(json!({"size": 3, "version": "3.5.10"})),
        ));
        assert_eq!(
            m,
            [r#"spec.version: Invalid value: "3.5.10": must be an etcd release like v3.5.10"#]
        );
        let m = messages(&create(
            Version::V1,
            &v1(json!({"size": 3, "version": "v4.0.0"})),
        ));
        assert_eq!(
            m,
            [
                r#"spec.version: Invalid value: "v4.0.0": must be v3.5.1 or a later v3.5 patch, v3.6.4 or a later v3.6 patch, or v3.7.4 or a later v3.7 patch: the etcd releases this operator runs and tests (v3.4 and older lack learners, the v3 member API or the metrics listener it uses)"#
            ]
        );
        let m = messages(&create(
            Version::V1Alpha1,
            &alpha(json!({"replicas": 3, "etcdVersion": "v3.5.10"})),
        ));
        assert_eq!(
            m,
            [r#"spec.etcdVersion: Invalid value: "v3.5.10": must be an etcd release like 3.5.10"#]
        );
        for bad in [
            "v3.5",
            "v3.5.10.1",
            "v3..1",
            "v3.5.x",
            "v3.5.99999999999999999999999",
        ] {
            assert!(
                !create(Version::V1, &v1(json!({"size": 3, "version": bad}))).allowed(),
                "{bad}"
            );
        }
    }

    #[test]
    fn storage_class_and_size() {
        let m = messages(&create(
            Version::V1Beta1,
            &beta(json!({"size": 3, "storage": {"className": "Gold_1", "size": "0Gi"}})),
        ));
        assert_eq!(
            m,
            [
                r#"spec.storage.className: Invalid value: "Gold_1": must be a StorageClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"#,
                r#"spec.storage.size: Invalid value: "0Gi": must be at least 1Gi"#,
            ]
        );
        let m = messages(&create(
            Version::V1,
            &v1(json!({"size": 3, "storageSize": "10G"})),
        ));
        assert_eq!(
            m,
            [
                r#"spec.storageSize: Invalid value: "10G": must be a whole number of GiB (10G is 9.31Gi), like 10Gi"#
            ]
        );
        // Each way a size goes wrong gets its own words.
        for (size, why) in [
            ("2048Mi", "must be written in Gi: 2Gi"),
            ("1Ti", "must be written in Gi: 1024Gi"),
            (
                "99999999999999999999Gi",
                "is too large: at most 9223372036854775807Gi",
            ),
            ("ten", "must be a whole number of GiB, like 10Gi"),
        ] {
            let m = messages(&create(
                Version::V1,
                &v1(json!({"size": 3, "storageSize": size})),
            ));
            assert_eq!(
                m,
                [format!(
                    r#"spec.storageSize: Invalid value: "{size}": {why}"#
                )]
            );
        }
        let m = messages(&create(
            Version::V1Alpha1,
            &alpha(json!({"replicas": 3, "storageSizeGi": 0, "storageClassName": "hdd_"})),
        ));
        assert_eq!(
            m,
            [
                r#"spec.storageClassName: Invalid value: "hdd_": must be a StorageClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"#,
                "spec.storageSizeGi: Invalid value: 0: must be at least 1Gi",
            ]
        );
    }

    #[test]
    fn backup_schedule_retention_destination() {
        let m = messages(&create(
            Version::V1,
            &v1(
                json!({"size": 3, "backup": {"schedule": "0 25 * * *", "retention": 0, "destination": "bucket"}}),
            ),
        ));
        assert_eq!(
            m,
            [
                r#"spec.backup.schedule: Invalid value: "0 25 * * *": must be a 5-field cron schedule: hour field "25": 25 is outside 0-23"#,
                "spec.backup.retention: Invalid value: 0: must be between 1 and 100 snapshots",
                r#"spec.backup.destination: Invalid value: "bucket": is not supported: use s3://bucket/prefix (S3 or an S3-compatible store), or leave it unset to keep snapshots on the volume claim NAME-backup"#,
            ]
        );
        let m = messages(&create(
            Version::V1Alpha1,
            &alpha(json!({"replicas": 3, "backupSchedule": "daily"})),
        ));
        assert!(
            m[0].starts_with(
                r#"spec.backupSchedule: Invalid value: "daily": must be a 5-field cron schedule"#
            ),
            "{m:?}"
        );
        assert!(
            create(
                Version::V1,
                &v1(json!({"size": 3, "backup": {"destination": "s3://b/p"}}))
            )
            .allowed()
        );
    }

    /// `spec.restore`: a snapshot in a bucket or on a claim, at creation; never changed, set or
    /// removed after.
    #[test]
    fn restore_names_a_snapshot_and_is_set_at_creation_only() {
        let from = "s3://b/p/src-snapshot-20261202T010000Z.db";
        let with = v1(json!({"size": 3, "restore": {"from": from}}));
        assert!(create(Version::V1, &with).allowed());
        let claim = "pvc://src-backup/src-snapshot-20261202T010000Z.db";
        assert!(
            create(
                Version::V1,
                &v1(json!({"size": 3, "restore": {"from": claim}}))
            )
            .allowed()
        );
        let on_claim = "must name a volume claim of this namespace and a file at its top";
        for (bad, why) in [
            (
                "/backup/x.db",
                "is not supported: use s3://bucket/prefix/NAME-snapshot-<time>.db, or pvc://",
            ),
            ("s3://b/", "must name a bucket and a snapshot file"),
            ("s3://b/a b.db", "must not contain spaces"),
            ("pvc://src-backup/", on_claim),
            ("pvc://src-backup/dir/x.db", on_claim),
            ("pvc://src-backup/..", on_claim),
            ("pvc://Src_Backup/x.db", on_claim),
        ] {
            let m = messages(&create(
                Version::V1,
                &v1(json!({"size": 3, "restore": {"from": bad}})),
            ));
            assert!(
                m.len() == 1
                    && m[0]
                        .starts_with(&format!("spec.restore.from: Invalid value: {bad:?}: {why}")),
                "{m:?}"
            );
        }
        let without = v1(json!({"size": 3}));
        let other = v1(json!({"size": 3, "restore": {"from": "s3://b/p/other.db"}}));
        for (old, new) in [(&with, &without), (&without, &with), (&with, &other)] {
            assert_eq!(
                messages(&update(Version::V1, old, new)),
                [format!(
                    "spec.restore: Forbidden: {}",
                    crate::api::RESTORE_IMMUTABLE
                )]
            );
        }
        assert!(update(Version::V1, &with, &with).allowed());
    }

    /// `spec.tls`: chosen at creation (on, off, its issuer), never changed, set or removed
    /// after, in the same words the CRD's rule says.
    #[test]
    fn tls_is_chosen_at_creation_only() {
        let on = v1(json!({"size": 3, "tls": {}}));
        let off = v1(json!({"size": 3, "tls": {"enabled": false}}));
        let issuer =
            v1(json!({"size": 3, "tls": {"issuerRef": {"name": "corp", "kind": "ClusterIssuer"}}}));
        let plain = v1(json!({"size": 3}));
        for ec in [&on, &off, &issuer, &plain] {
            assert!(create(Version::V1, ec).allowed());
            assert!(update(Version::V1, ec, ec).allowed());
        }
        for (old, new) in [(&plain, &on), (&on, &plain), (&off, &on), (&on, &issuer)] {
            assert_eq!(
                messages(&update(Version::V1, old, new)),
                [format!(
                    "spec.tls: Forbidden: {}",
                    crate::api::TLS_IMMUTABLE
                )]
            );
        }
    }

    /// `spec.maintenance`: a quota within 16 MiB and the volume's rule, a retention etcd
    /// reads, a percentage; the older versions' stash is judged the same way.
    #[test]
    fn maintenance_fits_the_volume() {
        let ok = v1(json!({"size": 3, "storageSize": "1Gi", "maintenance": {
            "quotaBackendBytes": 16777216, "autoCompactionRetention": "30m",
            "defragThresholdPercent": 0}}));
        assert!(create(Version::V1, &ok).allowed());
        for (m, starts) in [
            (
                json!({"quotaBackendBytes": 900_000_000}),
                "spec.maintenance.quotaBackendBytes: Invalid value: 900000000: must be between 16777216 (16 MiB) and 335544320: half of storageSize 1Gi after the WAL's 384 MiB",
            ),
            (
                json!({"quotaBackendBytes": 1024}),
                "spec.maintenance.quotaBackendBytes: Invalid value: 1024:",
            ),
            (
                json!({"autoCompactionRetention": "1d"}),
                "spec.maintenance.autoCompactionRetention: Invalid value: \"1d\": must be 0",
            ),
            (
                json!({"autoCompactionRetention": "05m"}),
                "spec.maintenance.autoCompactionRetention",
            ),
            (
                json!({"defragThresholdPercent": 100}),
                "spec.maintenance.defragThresholdPercent: Invalid value: 100:",
            ),
        ] {
            let obj = v1(json!({"size": 3, "storageSize": "1Gi", "maintenance": m}));
            let got = messages(&create(Version::V1, &obj));
            assert!(got.len() == 1 && got[0].starts_with(starts), "{got:?}");
        }
    }

    #[test]
    fn every_violation_in_one_message() {
        let v = create(
            Version::V1,
            &v1(
                json!({"size": 4, "version": "v2.0.0", "storageClass": "-x", "storageSize": "0Gi"}),
            ),
        );
        assert_eq!(v.violations.len(), 4);
        let msg = v.message();
        assert!(
            msg.starts_with("[spec.size: Invalid value: 4") && msg.ends_with(']'),
            "{msg}"
        );
    }

    #[test]
    fn schema_breaking_objects_are_denied_with_the_path() {
        let m = messages(&create(
            Version::V1Alpha1,
            &alpha(json!({"replicas": "three"})),
        ));
        assert_eq!(m.len(), 1);
        assert_eq!(
            m,
            ["spec.replicas: Invalid value: \"three\": must be an integer"],
            "no Rust type name"
        );
        let m = messages(&create(
            Version::V1,
            &v1(json!({"size": 3, "version": "v3.6.4", "backup": 5})),
        ));
        assert_eq!(m, ["spec.backup: Invalid value: 5: must be an object"]);
        let m = messages(&create(Version::V1, &v1(json!({"version": "v3.5.10"}))));
        assert_eq!(m, ["spec.size: Required value: must be set"]);
        let m = messages(&create(
            Version::V1,
            &json!({"apiVersion": "etcd.example.com/v1", "kind": "EtcdCluster"}),
        ));
        assert_eq!(m, ["spec: Required value: must be set"]);
        let m = messages(&create(
            Version::V1Beta1,
            &beta(json!({"size": 3, "storage": "big"})),
        ));
        assert!(m[0].starts_with("spec.storage: Invalid value"), "{m:?}");
    }

    #[test]
    fn size_only_grows() {
        let v = update(
            Version::V1,
            &v1(json!({"size": 5})),
            &v1(json!({"size": 3})),
        );
        assert_eq!(
            messages(&v),
            [
                "spec.size: Forbidden: cannot shrink from 5 to 3: removing members can lose quorum; size may only stay or grow"
            ]
        );
        assert!(
            update(
                Version::V1,
                &v1(json!({"size": 3})),
                &v1(json!({"size": 3}))
            )
            .allowed()
        );
        assert!(
            update(
                Version::V1,
                &v1(json!({"size": 3})),
                &v1(json!({"size": 5}))
            )
            .allowed()
        );
        let v = update(
            Version::V1Alpha1,
            &alpha(json!({"replicas": 5})),
            &alpha(json!({"replicas": 1})),
        );
        assert!(messages(&v)[0].starts_with("spec.replicas: Forbidden: cannot shrink from 5 to 1"));
    }

    #[test]
    fn storage_never_shrinks_nor_changes_class() {
        let old = beta(json!({"size": 3, "storage": {"className": "ssd", "size": "20Gi"}}));
        let new = beta(json!({"size": 3, "storage": {"className": "nvme", "size": "10Gi"}}));
        assert_eq!(
            messages(&update(Version::V1Beta1, &old, &new)),
            [
                "spec.storage.size: Forbidden: cannot shrink from 20Gi to 10Gi: volumes can grow but never shrink",
                r#"spec.storage.className: Forbidden: cannot change from "ssd" to "nvme": volume claims cannot change class"#,
            ]
        );
        let grown = beta(json!({"size": 3, "storage": {"className": "ssd", "size": "30Gi"}}));
        assert!(update(Version::V1Beta1, &old, &grown).allowed());
        // Set or left out at creation, for good: the claims were made with it (or with the
        // cluster's default), in the words of the CRD's rule on the spec.
        let default = v1(json!({"size": 3}));
        let gp3 = v1(json!({"size": 3, "storageClass": "gp3"}));
        assert_eq!(
            messages(&update(Version::V1, &default, &gp3)),
            [
                r#"spec.storageClass: Forbidden: cannot be set to "gp3" after creation: the claims were made with the cluster's default class, and volume claims cannot change class"#
            ]
        );
        assert_eq!(
            messages(&update(Version::V1, &gp3, &default)),
            [
                r#"spec.storageClass: Forbidden: cannot be removed (it was "gp3"): volume claims cannot change class"#
            ]
        );
        // Any StorageClass name; the three of old are names like any other.
        for class in ["gp3", "standard", "premium-rwo", "managed-csi.v2", "ssd"] {
            let c = v1(json!({"size": 3, "storageClass": class}));
            assert!(create(Version::V1, &c).allowed(), "{class}");
        }
        for bad in ["", "GP3", "gp3-", "a..b", &"a".repeat(254)] {
            let c = v1(json!({"size": 3, "storageClass": bad}));
            assert!(!create(Version::V1, &c).allowed(), "{bad}");
        }
    }

    #[test]
    fn version_goes_up_one_minor_at_a_time() {
        let at = |v: &str| v1(json!({"size": 3, "version": v}));
        assert!(update(Version::V1, &at("v3.5.1"), &at("v3.5.10")).allowed());
        assert!(update(Version::V1, &at("v3.5.10"), &at("v3.5.10")).allowed());
        assert!(update(Version::V1, &at("v3.5.32"), &at("v3.6.4")).allowed());
        // A cluster admitted on v3.4 before the range narrowed may move up: the range is
        // ratcheted like every rule (the old value is not judged again), the step is checked.
        assert!(update(Version::V1, &at("v3.4.9"), &at("v3.5.1")).allowed());
        // The same for a patch below its line's oldest: it may move to an admitted one.
        assert!(update(Version::V1, &at("v3.6.2"), &at("v3.6.4")).allowed());
        assert!(!update(Version::V1, &at("v3.6.2"), &at("v3.6.3")).allowed());
        // A patch newer than the newest tested: admitted, with a warning.
        let newer = update(Version::V1, &at("v3.6.17"), &at("v3.6.30"));
        assert!(newer.allowed());
        assert!(
            newer.warnings.iter().any(|w| w.starts_with("spec.version: v3.6.30 is newer than the newest v3.6 patch")),
            "{:?}",
            newer.warnings
        );
        assert_eq!(
            messages(&update(Version::V1, &at("v3.6.4"), &at("v3.7.4"))),
            [
                "spec.version: Forbidden: cannot upgrade from v3.6.4 to v3.7.4: etcd's v3.6 -> v3.7 upgrade needs every member on v3.6.11 or later first; upgrade to the newest v3.6 patch, then to v3.7.4"
            ]
        );
        assert!(update(Version::V1, &at("v3.6.11"), &at("v3.7.4")).allowed());
        assert_eq!(
            messages(&update(Version::V1, &at("v3.4.1"), &at("v3.6.4"))),
            [
                "spec.version: Forbidden: cannot upgrade from v3.4.1 to v3.6.4: etcd upgrades one minor release at a time; go to v3.5.x first"
            ]
        );
        assert_eq!(
            messages(&update(Version::V1, &at("v3.5.1"), &at("v3.6.4"))),
            [
                "spec.version: Forbidden: cannot upgrade from v3.5.1 to v3.6.4: etcd's v3.5 -> v3.6 upgrade needs every member on v3.5.32 or later first; upgrade to the newest v3.5 patch, then to v3.6.4"
            ]
        );
        assert_eq!(
            messages(&create(Version::V1, &at("v3.3.27"))),
            [
                r#"spec.version: Invalid value: "v3.3.27": must be v3.5.1 or a later v3.5 patch, v3.6.4 or a later v3.6 patch, or v3.7.4 or a later v3.7 patch: the etcd releases this operator runs and tests (v3.4 and older lack learners, the v3 member API or the metrics listener it uses)"#
            ]
        );
        assert_eq!(
            messages(&update(Version::V1, &at("v3.5.10"), &at("v3.5.9"))),
            [
                "spec.version: Forbidden: cannot downgrade from v3.5.10 to v3.5.9: etcd does not support downgrades"
            ]
        );
        let a = |v: &str| alpha(json!({"replicas": 3, "etcdVersion": v}));
        assert!(
            messages(&update(Version::V1Alpha1, &a("3.6.0"), &a("3.5.30")))[0]
                .starts_with("spec.etcdVersion: Forbidden: cannot downgrade")
        );
    }

    #[test]
    fn unreadable_old_object_skips_update_rules_with_a_warning() {
        let v = update(Version::V1, &json!({"spec": 1}), &v1(json!({"size": 3})));
        assert!(v.allowed());
        assert_eq!(v.warnings.len(), 1);
    }
}
