//! The in-memory API server ([`FakeCore`], shared with the binary's tests) behind a
//! `tower_test` mock service: the pattern of kube-rs/controller-rs `fixtures.rs`, with state
//! instead of a scripted sequence. Every call is recorded, so tests can count writes per verb.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

use super::fake_core::{FakeCore, group_of, parse, patch_type, status};

/// One request the fake answered.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    /// The object (or collection) path, without `/status` and the query.
    pub path: String,
    pub status_subresource: bool,
    pub query: String,
    /// `apply`, `merge`, `strategic`, `json` for PATCH.
    pub patch_type: Option<&'static str>,
    pub body: Option<Value>,
    pub code: u16,
    /// API group (`""` for the core group), resource (`statefulsets`, `events`, ...) and
    /// whether the path names one object, as the fake understood the path.
    pub group: String,
    pub resource: String,
    pub named: bool,
}

impl Call {
    /// Reads are GETs; everything else writes.
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
    /// `statefulsets`, `etcdclusters`, `events`, ...
    pub fn resource(&self) -> &str {
        &self.resource
    }
}

#[derive(Default)]
struct State {
    core: FakeCore,
    calls: Vec<Call>,
    /// Clients (by tag) whose requests fail as if the network were cut.
    partitioned: HashSet<String>,
}

/// The fake server; cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A client that talks to this fake.
    pub fn client(&self) -> Client {
        self.client_as("default")
    }

    /// A client whose requests carry `tag` (see [`FakeApi::partition`]).
    pub fn client_as(&self, tag: &str) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let me = self.clone();
        let tag = tag.to_owned();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let cut = me.state.lock().unwrap().partitioned.contains(&tag);
                let (code, body) = if cut {
                    (
                        503,
                        status(503, "ServiceUnavailable", "partitioned".to_owned()),
                    )
                } else {
                    me.answer(request).await
                };
                let response = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// Cuts (or restores) the clients made with `tag`.
    pub fn partition(&self, tag: &str, cut: bool) {
        let mut st = self.state.lock().unwrap();
        if cut {
            st.partitioned.insert(tag.to_owned());
        } else {
            st.partitioned.remove(tag);
        }
    }

    pub fn insert(&self, path: &str, object: Value) {
        self.state.lock().unwrap().core.insert(path, object);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().core.objects.get(path).cloned()
    }

    pub fn set(&self, path: &str, pointer: &str, value: Value) {
        self.state.lock().unwrap().core.set(path, pointer, value);
    }

    /// Every stored object of `resource` (`statefulsets`, ...) in any namespace that the label
    /// selector selects, as a watch with that selector would list them.
    pub fn list_selected(&self, resource: &str, selector: &str) -> Vec<Value> {
        let query = format!("labelSelector={selector}");
        let st = self.state.lock().unwrap();
        st.core
            .objects
            .iter()
            .filter(|(k, _)| {
                parse(k).is_some_and(|(_, _, r, name)| r == resource && name.is_some())
            })
            .filter(|(_, o)| super::fake_core::selected(&query, o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Runs the garbage collector until it has nothing left to do (bounded).
    pub fn collect_garbage(&self) {
        for _ in 0..10 {
            if self.state.lock().unwrap().core.collect_garbage() == 0 {
                return;
            }
        }
        panic!("the garbage collector did not settle in 10 rounds");
    }

    pub fn fail(&self, method: &str, path_contains: &str, times: usize, code: u16) {
        self.state
            .lock()
            .unwrap()
            .core
            .fail(method, path_contains, times, code);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }

    /// Paths of stored objects under a prefix.
    pub fn paths(&self, prefix: &str) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.core
            .objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    async fn answer(&self, request: Request<Body>) -> (u16, Value) {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let patch_type = patch_type(content_type);
        let raw_path = parts.uri.path();
        let (path, sub) = match raw_path.strip_suffix("/status") {
            Some(p) => (p.to_owned(), true),
            None => (raw_path.to_owned(), false),
        };
        let query = parts.uri.query().unwrap_or("").to_owned();
        let method = parts.method.as_str().to_owned();
        let (group, resource, named) = match parse(&path) {
            Some((prefix, _, resource, name)) => {
                (group_of(&prefix).to_owned(), resource, name.is_some())
            }
            None => (String::new(), String::new(), false),
        };
        let mut st = self.state.lock().unwrap();
        let (code, out) = st
            .core
            .handle(&method, &path, sub, &query, patch_type, body.as_ref());
        st.calls.push(Call {
            method,
            path,
            status_subresource: sub,
            query,
            patch_type,
            body,
            code,
            group,
            resource,
            named,
        });
        (code, out)
    }
}

/// Counts of calls per verb (`GET`, `POST`, `PATCH`, `DELETE`).
pub fn per_verb(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.method.clone()).or_insert(0) += 1;
    }
    m
}

/// What a call needs: its verb on its resource and, for an object whose ownerReference blocks the
/// owner's deletion, `update` on the owner's `finalizers` subresource (the admission plugin
/// OwnerReferencesPermissionEnforcement checks it on create and update; tests/e2e proves it).
pub fn needs(c: &Call) -> Vec<(String, String, &'static str)> {
    let verb = match (c.method.as_str(), c.named) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected {m}"),
    };
    let resource = if c.status_subresource {
        format!("{}/status", c.resource)
    } else {
        c.resource.clone()
    };
    let mut all = vec![(c.group.clone(), resource, verb)];
    let owners = c
        .body
        .as_ref()
        .and_then(|b| b.pointer("/metadata/ownerReferences"))
        .and_then(Value::as_array);
    for owner in owners.into_iter().flatten() {
        if owner["blockOwnerDeletion"] == true {
            assert_eq!(owner["kind"], crate::api::KIND, "{} {}", c.method, c.path);
            all.push((
                crate::api::GROUP.to_owned(),
                "etcdclusters/finalizers".to_owned(),
                "update",
            ));
        }
    }
    all
}

/// Every call was allowed by the rules the install grants.
pub fn assert_granted(calls: &[Call], rules: &[(&str, &str, &[&str])]) {
    for c in calls {
        for (group, resource, verb) in needs(c) {
            assert!(
                rules
                    .iter()
                    .any(|(g, r, vs)| *g == group && *r == resource && vs.contains(&verb)),
                "{} {} needs {verb} on {group}/{resource}, which the RBAC rules do not grant",
                c.method,
                c.path
            );
        }
    }
}
