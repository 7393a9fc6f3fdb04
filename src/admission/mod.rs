//! The decisions, as plain functions: defaulting (`/mutate`) and the rules (`/validate`), with
//! [`review`] the one entry point from a request to an answer (the operation and subresource
//! policy included). The webhook layer decodes, calls it and encodes; `offline` calls it
//! directly.

pub mod credentials;
pub mod cron;
pub mod defaults;
pub mod request;
pub mod storage_class;
pub mod tls;
pub mod validate;

use kube::core::admission::Operation;

pub use crate::api::Field;
pub use request::{AdmissionRequest, Answer, PatchError};
pub use storage_class::Settings;

/// Which of the two admission webhooks answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    /// The endpoint's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Webhook::Mutate => "mutate",
            Webhook::Validate => "validate",
        }
    }
}

/// What `webhook` answers to `req`, under the server's `settings`.
pub fn review(
    webhook: Webhook,
    req: &AdmissionRequest,
    settings: &Settings,
) -> Result<Answer, PatchError> {
    match webhook {
        Webhook::Mutate => mutate(req, settings),
        Webhook::Validate => Ok(validate(req, settings)),
    }
}

/// The mutating decision: always allowed; a patch when defaults are missing. DELETE, CONNECT
/// and subresource requests (status) get no patch: the apiserver would discard spec changes on
/// a status update, and a patch on DELETE fails the request. A CREATE that names no storage
/// class gets `--default-storage-class`, when set; member TLS as [`tls`] says.
pub fn mutate(req: &AdmissionRequest, settings: &Settings) -> Result<Answer, PatchError> {
    let answer = Answer::allow(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) || req.sub_resource.is_some()
    {
        return Ok(answer);
    }
    let (Some(obj), Some(version)) = (req.object.as_ref(), req.object_version()) else {
        return Ok(answer);
    };
    let mut patch = defaults::patch(obj, version);
    if req.operation == Operation::Create
        && let Some((path, value)) = storage_class::default_class(obj, version, settings)
    {
        patch
            .0
            .push(json_patch::PatchOperation::Add(json_patch::AddOperation {
                path: path.parse().expect("a field's pointer is a JSON pointer"),
                value,
            }));
    }
    if let Some(value) = tls::default_tls(req, obj, version, settings.default_member_tls) {
        patch
            .0
            .push(json_patch::PatchOperation::Add(json_patch::AddOperation {
                path: "/spec/tls".parse().expect("a JSON pointer"),
                value,
            }));
    }
    if patch.0.is_empty() {
        return Ok(answer);
    }
    answer.with_patch(&patch)
}

/// A foreground deletion (`propagationPolicy: Foreground`: `kubectl delete --cascade=foreground`,
/// Argo CD's default prune) lets the garbage collector delete the members beside the
/// finalizer, so the final snapshot finds no member to read: refused for a cluster with
/// backups, with what to do instead. Any other DELETE is allowed.
fn refuse_foreground_deletion(req: &AdmissionRequest, answer: Answer) -> Answer {
    let foreground = req
        .options
        .as_ref()
        .and_then(|o| o.propagation_policy.as_deref())
        == Some("Foreground");
    if !foreground || req.sub_resource.is_some() || req.user_version().is_none() {
        return answer;
    }
    let backups = req
        .old_object
        .as_ref()
        .and_then(|o| crate::api::convert::convert_object(o, crate::api::Version::V1).ok())
        .and_then(|v| serde_json::from_value::<crate::api::v1::EtcdCluster>(v).ok())
        .is_some_and(|ec| crate::api::backups_on(&ec.spec));
    if !backups {
        return answer;
    }
    answer.deny(
        403,
        "Forbidden",
        format!(
            "a foreground deletion of EtcdCluster {name} would delete its members before its final snapshot is taken: delete it in the background (kubectl delete --cascade=background; Argo CD: the sync option PrunePropagationPolicy=background), which waits for the snapshot and then deletes the rest",
            name = req.name
        ),
    )
}

/// The validating decision. CONNECT is always allowed, and so is a DELETE but a foreground
/// one of a cluster with backups ([`refuse_foreground_deletion`]); so are status updates,
/// which cannot change the spec. With what the server knows of the cluster's StorageClasses,
/// a class that does not exist or cannot grow is a warning.
pub fn validate(req: &AdmissionRequest, settings: &Settings) -> Answer {
    use validate::Operation as Op;
    let mut answer = Answer::allow(req);
    let op = match req.operation {
        Operation::Create => Op::Create,
        Operation::Update => Op::Update,
        Operation::Delete => return refuse_foreground_deletion(req, answer),
        Operation::Connect => return answer,
    };
    if req.sub_resource.is_some() {
        return answer;
    }
    let Some(version) = req.user_version() else {
        answer.warnings.push(format!(
            "etcd-webhook judges only etcd.example.com EtcdCluster; {}/{} {} was not checked",
            req.kind.group, req.kind.version, req.kind.kind
        ));
        return answer;
    };
    let Some(obj) = req.object.as_ref() else {
        return answer.deny(
            400,
            "BadRequest",
            format!("{op:?} request carries no object"),
        );
    };
    let verdict = validate::validate_as_written(version, op, obj, req.old_object.as_ref());
    answer.warnings = verdict.warnings.clone();
    // The class is judged on a CREATE and on a storage growth only: every other UPDATE skips
    // the snapshot and the conversions (a raw look at the size field, in each object's version).
    let size = |o: &serde_json::Value| {
        crate::api::convert::version_of(o)
            .ok()
            .and_then(|v| Field::StorageSize.pointer(v))
            .and_then(|p| o.pointer(p))
            .cloned()
    };
    let judged = match (op, req.old_object.as_ref()) {
        (Op::Update, Some(old)) => size(obj) != size(old),
        _ => true,
    };
    if let Some(known) = settings
        .storage_classes
        .as_ref()
        .filter(|_| judged)
        .and_then(|c| c.known())
    {
        let spec = |o: &serde_json::Value| {
            crate::api::convert::convert_object(o, crate::api::Version::V1)
                .ok()
                .and_then(|v| serde_json::from_value::<crate::api::v1::EtcdCluster>(v).ok())
                .map(|ec| ec.spec)
        };
        if let Some(new) = spec(obj) {
            let old = req.old_object.as_ref().and_then(spec);
            answer
                .warnings
                .extend(storage_class::warnings(&new, old.as_ref(), version, &known));
        }
    }
    if verdict.allowed() {
        return answer;
    }
    answer.deny(422, "Invalid", verdict.message())
}
