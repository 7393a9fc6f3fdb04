//! The credentials a cluster's S3 backups and restore read: the Secret
//! `NAME-backup-credentials` (through `envFrom`, optional: without it the pods use their own
//! cloud identity). A Secret that is not there when a cluster starts using S3 is a warning on
//! `/validate`, never a denial: the Secret may be made after the cluster, or the pods may have
//! an identity of their own. Which request needs a look is decided here, without a network;
//! the look itself is the server's ([`SecretNames`]), made only for those requests.

use futures_util::future::BoxFuture;
use kube::core::admission::Operation;
use serde_json::Value;

use super::AdmissionRequest;
use crate::api::{CONVERSION_ANNOTATION, Field, SnapshotSource, Version, v1};

/// Whether a Secret exists, as the server can tell.
pub trait SecretNames: Send + Sync {
    /// Whether looks can be made at all (a server with no cluster makes none, and spends
    /// nothing on the requests).
    fn can_look(&self) -> bool;

    /// `Some(found)`, or `None` when it cannot be told (no grant in that namespace, no answer
    /// in time): then nothing is said.
    fn exists<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Option<bool>>;
}

/// The credentials Secret of the cluster `cluster` (the one name the loop's pods read).
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-backup-credentials")
}

/// A look to make for one request: does `secret` exist in `namespace`?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub namespace: String,
    pub secret: String,
    /// The field that reads it, and who would go without.
    field: &'static str,
    who: &'static str,
}

impl Check {
    /// The warning when the Secret is not there (short: the apiserver asks for 120 characters
    /// and cuts at 256).
    pub fn warning(&self) -> String {
        let text = format!(
            "{}: Secret {} not found in {}; {} will use the pods' own cloud identity",
            self.field, self.secret, self.namespace, self.who
        );
        text.chars().take(256).collect()
    }
}

/// The look `/validate` makes for `req`, if any: an EtcdCluster created with backups to S3 or a
/// restore from S3, or updated to start backing up to S3 (a change of `spec.backup` in v1; the
/// older versions cannot set a destination). Every other request needs none, and most return
/// before reading more than a field.
pub fn to_check(req: &AdmissionRequest) -> Option<Check> {
    if req.sub_resource.is_some() {
        return None;
    }
    req.user_version()?;
    let obj = req.object.as_ref()?;
    // A raw look first: no conversion for the many requests that name no S3 URL (the older
    // versions carry a destination and a restore only in the stash).
    let s3 = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .is_some_and(|u| u.contains("s3://"))
    };
    let names_s3 = match req.object_version()? {
        Version::V1 => {
            let at = |f: Field| f.pointer(Version::V1).and_then(|p| obj.pointer(p));
            s3(at(Field::BackupDestination)) || s3(at(Field::Restore).and_then(|r| r.get("from")))
        }
        _ => s3(obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(CONVERSION_ANNOTATION))),
    };
    if !names_s3 {
        return None;
    }
    match req.operation {
        Operation::Create => {}
        Operation::Update => {
            let backup = Field::BackupDestination.pointer(Version::V1)?;
            let section = backup.trim_end_matches("/destination");
            if req.object_version()? != Version::V1
                || req.old_object.as_ref()?.pointer(section) == obj.pointer(section)
            {
                return None;
            }
        }
        Operation::Delete | Operation::Connect => return None,
    }
    let ec = as_v1(obj)?;
    let namespace = req.namespace.clone()?;
    let secret = secret_name(ec.metadata.name.as_deref().unwrap_or(&req.name));
    let restore_s3 =
        req.operation == Operation::Create
            && ec.spec.restore.as_ref().is_some_and(|r| {
                matches!(SnapshotSource::parse(&r.from), Ok(SnapshotSource::S3(_)))
            });
    let backup_s3 = ec.spec.backup.as_ref().is_some_and(|b| {
        b.enabled
            && b.destination
                .as_deref()
                .is_some_and(|d| crate::api::backup_destination_error(d).is_none())
    });
    let (field, who) = if backup_s3 {
        ("spec.backup.destination", "backups")
    } else if restore_s3 {
        ("spec.restore.from", "the restore")
    } else {
        return None;
    };
    Some(Check {
        namespace,
        secret,
        field,
        who,
    })
}

fn as_v1(obj: &Value) -> Option<v1::EtcdCluster> {
    let v1 = crate::api::convert::convert_object(obj, Version::V1).ok()?;
    serde_json::from_value(v1).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(op: &str, version: &str, obj: Value, old: Option<Value>) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "u", "kind": {"group": "etcd.example.com", "version": version, "kind": "EtcdCluster"},
            "resource": {"group": "etcd.example.com", "version": version, "resource": "etcdclusters"},
            "name": "etcd", "namespace": "prod", "operation": op,
            "userInfo": {"username": "alice"},
            "object": obj, "oldObject": old,
        }))
        .unwrap()
    }

    fn cluster(version: &str, spec: Value) -> Value {
        json!({"apiVersion": format!("etcd.example.com/{version}"), "kind": "EtcdCluster",
            "metadata": {"name": "etcd", "namespace": "prod"}, "spec": spec})
    }

    #[test]
    fn a_look_only_where_s3_starts_being_used() {
        let s3 = cluster(
            "v1",
            json!({"size": 3, "backup": {"enabled": true, "schedule": "0 * * * *", "destination": "s3://b/p"}}),
        );
        let check = to_check(&request("CREATE", "v1", s3.clone(), None)).unwrap();
        assert_eq!(
            (check.namespace.as_str(), check.secret.as_str()),
            ("prod", "etcd-backup-credentials")
        );
        let w = check.warning();
        assert_eq!(
            w,
            "spec.backup.destination: Secret etcd-backup-credentials not found in prod; backups will use the pods' own cloud identity"
        );
        assert!(w.chars().count() <= 120, "{}", w.len());

        let restore = cluster(
            "v1",
            json!({"size": 3, "restore": {"from": "s3://b/p/x.db"}}),
        );
        let check = to_check(&request("CREATE", "v1", restore.clone(), None)).unwrap();
        assert!(check.warning().starts_with("spec.restore.from: "));

        let none = [
            // On the claim, or off, or from a claim: no credentials.
            cluster(
                "v1",
                json!({"size": 3, "backup": {"enabled": true, "schedule": "0 * * * *"}}),
            ),
            cluster(
                "v1",
                json!({"size": 3, "backup": {"enabled": false, "schedule": "0 * * * *", "destination": "s3://b/p"}}),
            ),
            cluster(
                "v1",
                json!({"size": 3, "restore": {"from": "pvc://src-backup/x.db"}}),
            ),
            // An older version with no stash cannot name a destination.
            cluster(
                "v1beta1",
                json!({"size": 3, "backup": {"enabled": true, "schedule": "0 * * * *"}}),
            ),
        ];
        for obj in none {
            let version = obj["apiVersion"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned();
            assert_eq!(
                to_check(&request("CREATE", &version, obj.clone(), None)),
                None,
                "{obj}"
            );
        }
        // Updates: only a change of spec.backup that ends on S3.
        assert_eq!(
            to_check(&request("UPDATE", "v1", s3.clone(), Some(s3.clone()))),
            None
        );
        let mut resized = s3.clone();
        resized["spec"]["size"] = json!(5);
        assert_eq!(
            to_check(&request("UPDATE", "v1", resized, Some(s3.clone()))),
            None
        );
        let off = cluster("v1", json!({"size": 3}));
        assert!(to_check(&request("UPDATE", "v1", s3.clone(), Some(off))).is_some());
        assert_eq!(
            to_check(&request("UPDATE", "v1", restore.clone(), Some(restore))),
            None
        );
        assert_eq!(to_check(&request("DELETE", "v1", s3.clone(), None)), None);
        let mut status = request(
            "UPDATE",
            "v1",
            s3.clone(),
            Some(cluster("v1", json!({"size": 3}))),
        );
        status.sub_resource = Some("status".to_owned());
        assert_eq!(to_check(&status), None);
    }
}
