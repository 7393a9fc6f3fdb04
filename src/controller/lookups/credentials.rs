//! Whether a cluster's credentials Secret exists, for `/validate`'s warning
//! (`admission::credentials`): one GET of the Secret's metadata (its data is never asked for),
//! with a short deadline, only for requests that start using S3. Granted with the loop's own
//! ClusterRole and bound the same way, so a single-namespace install looks only in its
//! namespace; a refused or slow look says nothing.

use std::sync::OnceLock;
use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::admission::credentials::SecretNames;

/// The look's grant: part of the loop's ClusterRole (tests/manifests.rs checks it is there).
pub const CREDENTIALS_RBAC_RULES: &[(&str, &str, &[&str])] = &[("", "secrets", &["get"])];

/// How long a look may add to a `/validate` answer.
pub const LOOK_DEADLINE: Duration = Duration::from_secs(1);

/// Looks through the API once a client is set (at start, when the server has a cluster).
#[derive(Default)]
pub struct Lookup {
    client: OnceLock<Client>,
}

impl Lookup {
    pub fn set_client(&self, client: Client) {
        let _ = self.client.set(client);
    }
}

impl SecretNames for Lookup {
    fn can_look(&self) -> bool {
        self.client.get().is_some()
    }

    fn exists<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Option<bool>> {
        Box::pin(async move {
            let client = self.client.get()?.clone();
            let api = Api::<Secret>::namespaced(client, namespace);
            match tokio::time::timeout(LOOK_DEADLINE, api.get_metadata_opt(name)).await {
                Ok(Ok(found)) => Some(found.is_some()),
                Ok(Err(e)) => {
                    tracing::debug!(%namespace, secret = %name, error = %e, "credentials Secret: cannot tell");
                    None
                }
                Err(_) => {
                    tracing::debug!(%namespace, secret = %name, "credentials Secret: no answer in time");
                    None
                }
            }
        })
    }
}
