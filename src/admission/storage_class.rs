//! Storage classes: the one default the server adds from its own settings
//! (`--default-storage-class`, filled in at creation so that the class a cluster's claims were
//! made with is written in the object, for good), and the warnings about the class a cluster
//! names, from what the server knows of the cluster's StorageClasses. Warnings, not denials: a
//! class may be created after the cluster, and a cluster without a reader (no API access, or
//! its first list not in) gets none.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::api::{Field, StorageSize, Version, v1};

/// What the decisions read besides the request.
#[derive(Clone, Default)]
pub struct Settings {
    /// `--default-storage-class`: written into a new cluster that names no class.
    pub default_storage_class: Option<String>,
    /// The cluster's StorageClasses as last seen; `None` when the server cannot read them.
    pub storage_classes: Option<Arc<dyn StorageClasses>>,
    /// Whether a credentials Secret exists (`/validate`'s warning); `None`: never looked at.
    pub secrets: Option<Arc<dyn super::credentials::SecretNames>>,
    /// `--default-member-tls`: a new cluster that says nothing about TLS gets `spec.tls: {}`.
    pub default_member_tls: bool,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("default_storage_class", &self.default_storage_class)
            .field("storage_classes", &self.storage_classes.is_some())
            .field("secrets", &self.secrets.is_some())
            .field("default_member_tls", &self.default_member_tls)
            .finish()
    }
}

/// A StorageClass as the rules need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    pub allows_expansion: bool,
}

/// What is known of the cluster's StorageClasses.
pub trait StorageClasses: Send + Sync {
    /// `None` until the first list is in (then nothing is said).
    fn known(&self) -> Option<Known>;
}

/// A snapshot of the cluster's StorageClasses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub classes: Vec<Class>,
    /// The class marked `storageclass.kubernetes.io/is-default-class: "true"` (the newest one
    /// when several are, as the apiserver picks).
    pub default: Option<String>,
}

impl Known {
    fn get(&self, name: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.name == name)
    }
}

/// The class a spec names (None: the cluster's default).
fn class_of(spec: &Value, version: Version) -> Option<&str> {
    Field::StorageClass
        .pointer(version)
        .and_then(|p| spec.pointer(p.trim_start_matches("/spec")))
        .and_then(Value::as_str)
}

/// The JSON pointer op that writes `--default-storage-class` into a new object that names no
/// class (in the object's own version), if it should.
pub fn default_class(
    obj: &Value,
    version: Version,
    settings: &Settings,
) -> Option<(String, Value)> {
    let class = settings.default_storage_class.as_ref()?;
    let spec = obj.get("spec")?.as_object()?;
    if class_of(&Value::Object(spec.clone()), version).is_some() {
        return None;
    }
    let pointer = Field::StorageClass.pointer(version)?;
    Some((pointer.to_owned(), Value::String(class.clone())))
}

/// Warnings about the class of `new` (a CREATE when `old` is None; on an UPDATE only when the
/// storage grows, since the class never changes).
pub fn warnings(
    new: &v1::EtcdClusterSpec,
    old: Option<&v1::EtcdClusterSpec>,
    version: Version,
    known: &Known,
) -> Vec<String> {
    let path = Field::StorageClass.path(version);
    let grows = old.is_some_and(|o| {
        matches!(
            (o.storage_size.parse::<StorageSize>(), new.storage_size.parse::<StorageSize>()),
            (Ok(a), Ok(b)) if b.gib() > a.gib()
        )
    });
    if old.is_some() && !grows {
        return Vec::new();
    }
    let size = Field::StorageSize.path(version);
    let mut out = Vec::new();
    let (named, class) = match &new.storage_class {
        Some(name) => (format!("StorageClass {name:?}"), known.get(name)),
        None => match &known.default {
            Some(d) => (format!("the default StorageClass {d:?}"), known.get(d)),
            None => {
                if old.is_none() {
                    out.push(format!(
                        "{path}: not set, and no StorageClass of this cluster is marked default: the members' volume claims stay Pending until one is (or set {path} to a class from `kubectl get storageclass`)"
                    ));
                }
                return out;
            }
        },
    };
    match class {
        None => {
            if old.is_none() {
                out.push(format!(
                    "{path}: {named} does not exist in this cluster: the members' volume claims stay Pending until it does (`kubectl get storageclass` lists the classes)"
                ));
            }
        }
        Some(c) if !c.allows_expansion => out.push(if grows {
            format!(
                "{size}: {named} does not allow volume expansion: the members' claims cannot grow, so the new size will not be reached"
            )
        } else {
            format!(
                "{path}: {named} does not allow volume expansion: growing {size} later will not work"
            )
        }),
        Some(_) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> v1::EtcdClusterSpec {
        serde_json::from_value(v).unwrap()
    }

    fn known() -> Known {
        Known {
            classes: vec![
                Class {
                    name: "gp3".into(),
                    allows_expansion: true,
                },
                Class {
                    name: "local".into(),
                    allows_expansion: false,
                },
            ],
            default: Some("gp3".into()),
        }
    }

    #[test]
    fn a_missing_class_or_one_that_cannot_grow_is_a_warning() {
        let w = |s: Value| warnings(&spec(s), None, Version::V1, &known());
        assert!(w(json!({"size": 3, "storageClass": "gp3"})).is_empty());
        assert!(w(json!({"size": 3})).is_empty(), "the default gp3 grows");
        assert_eq!(
            w(json!({"size": 3, "storageClass": "standard"})),
            [
                "spec.storageClass: StorageClass \"standard\" does not exist in this cluster: the members' volume claims stay Pending until it does (`kubectl get storageclass` lists the classes)"
            ]
        );
        assert_eq!(
            w(json!({"size": 3, "storageClass": "local"})),
            [
                "spec.storageClass: StorageClass \"local\" does not allow volume expansion: growing spec.storageSize later will not work"
            ]
        );
        let none = Known {
            default: None,
            ..known()
        };
        assert!(warnings(&spec(json!({"size": 3})), None, Version::V1Beta1, &none)[0]
            .starts_with("spec.storage.className: not set, and no StorageClass of this cluster is marked default"));
    }

    #[test]
    fn an_update_warns_only_when_it_grows_a_class_that_cannot() {
        let old = spec(json!({"size": 3, "storageClass": "local", "storageSize": "10Gi"}));
        let same = spec(json!({"size": 5, "storageClass": "local", "storageSize": "10Gi"}));
        let grown = spec(json!({"size": 3, "storageClass": "local", "storageSize": "20Gi"}));
        assert!(warnings(&same, Some(&old), Version::V1, &known()).is_empty());
        assert_eq!(
            warnings(&grown, Some(&old), Version::V1Alpha1, &known()),
            [
                "spec.storageSizeGi: StorageClass \"local\" does not allow volume expansion: the members' claims cannot grow, so the new size will not be reached"
            ]
        );
    }

    #[test]
    fn the_default_class_is_written_only_where_none_is_named() {
        let settings = Settings {
            default_storage_class: Some("gp3".into()),
            ..Settings::default()
        };
        let o = |v: Value| json!({"spec": v});
        assert_eq!(
            default_class(&o(json!({"size": 3})), Version::V1, &settings),
            Some(("/spec/storageClass".to_owned(), json!("gp3")))
        );
        assert_eq!(
            default_class(
                &o(json!({"size": 3, "storage": {}})),
                Version::V1Beta1,
                &settings
            ),
            Some(("/spec/storage/className".to_owned(), json!("gp3")))
        );
        assert_eq!(
            default_class(
                &o(json!({"size": 3, "storageClass": "x"})),
                Version::V1,
                &settings
            ),
            None
        );
        assert_eq!(
            default_class(&o(json!({"size": 3})), Version::V1, &Settings::default()),
            None
        );
    }
}
