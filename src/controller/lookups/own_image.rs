//! The image the backup, restore and final-snapshot Jobs run when `--backup-image` is not
//! given: the one this replica's own container runs, read once from its Pod at start. So an
//! install that changes only the Deployment's image (`kustomize edit set image`, a mirror, a
//! digest pin) changes the Jobs' image too, and a Job never pulls an image the cluster has
//! never been told about.
//!
//! [`of_pod`] is the choice, a pure function; [`lookup`] is the one GET.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

/// The container this binary runs as in the shipped Deployment and chart.
pub const CONTAINER: &str = "webhook";

/// Why the image could not be read from the Pod.
#[derive(Debug, thiserror::Error)]
pub enum OwnImageError {
    #[error("no POD_NAME or HOSTNAME: the pod's name is not known")]
    NoPodName,
    #[error("reading pod {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "pod {0} has no container named {CONTAINER:?} and more than one container ({1}): set --backup-image"
    )]
    Ambiguous(String, String),
    #[error("pod {0} has a container without an image")]
    NoImage(String),
}

/// The image of this binary's container in `pod`: the container named [`CONTAINER`], else
/// the pod's only container (a sidecar-injected pod keeps its `webhook` container).
pub fn of_pod(pod: &Pod) -> Result<String, OwnImageError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let containers = pod.spec.as_ref().map(|s| &s.containers[..]).unwrap_or(&[]);
    let container = match containers.iter().find(|c| c.name == CONTAINER) {
        Some(c) => c,
        None if containers.len() == 1 => &containers[0],
        None => {
            let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
            return Err(OwnImageError::Ambiguous(name, names.join(", ")));
        }
    };
    container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or(OwnImageError::NoImage(name))
}

/// Reads pod `name` (this replica: `POD_NAME`, else `HOSTNAME`) in `namespace` and returns
/// [`of_pod`]'s answer.
pub async fn lookup(
    client: Client,
    namespace: &str,
    name: Option<String>,
) -> Result<String, OwnImageError> {
    let name = name.ok_or(OwnImageError::NoPodName)?;
    let pod = Api::<Pod>::namespaced(client, namespace)
        .get(&name)
        .await
        .map_err(|e| OwnImageError::Read {
            namespace: namespace.to_owned(),
            name: name.clone(),
            source: Box::new(e),
        })?;
    of_pod(&pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "etcd-webhook-7d9f-abcde", "namespace": "etcd-system"},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    #[test]
    fn the_webhook_container_wins_over_sidecars() {
        let p = pod(json!([
            {"name": "istio-proxy", "image": "istio/proxyv2:1.24"},
            {"name": "webhook", "image": "registry.example.com/etcd-webhook:0.1.0"},
        ]));
        assert_eq!(
            of_pod(&p).unwrap(),
            "registry.example.com/etcd-webhook:0.1.0"
        );
    }

    #[test]
    fn a_single_container_of_another_name_is_this_binary() {
        let p = pod(json!([{"name": "manager", "image": "mirror.local/ew@sha256:abc"}]));
        assert_eq!(of_pod(&p).unwrap(), "mirror.local/ew@sha256:abc");
    }

    #[test]
    fn two_containers_without_webhook_say_which_flag_to_set() {
        let p = pod(json!([{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]));
        let e = of_pod(&p).unwrap_err().to_string();
        assert!(e.contains("a, b") && e.contains("--backup-image"), "{e}");
        let p = pod(json!([{"name": "webhook"}]));
        assert!(matches!(of_pod(&p), Err(OwnImageError::NoImage(_))));
    }
}
